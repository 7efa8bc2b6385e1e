//! `ginza bench idle`: what iokerneld costs while nothing happens, and what
//! its sleep and the server's idle state cost the first request after a
//! quiet spell (docs/iokernel-idle.md, docs/idle-poll.md), beside Linux's.
//!
//! Each round runs seven setups, in an order that turns from round to
//! round: six start iokerneld on a veth's host end (AF_XDP, else
//! AF_PACKET) with a UDP echo server on a Ginza runtime registered, the
//! seventh runs the kernel's echo on the same veth end (a 16-queue veth,
//! [`direct::namespace`], transmitting on queue 0 but in the direct-path
//! setups):
//!
//! * `sleeping`: iokerneld sleeps while idle, and the server's kthread
//!   polls while idle (`poll_while_idle` = `POLL_WHILE_IDLE`);
//! * `sleeping_parked`: the same with the server's kthread parking when
//!   idle (`poll_while_idle` = 0: the behaviour before idle polling);
//! * `spinning`: iokerneld with `--spin`, the server polling while idle;
//! * `direct_parked`, `direct_polling`, `direct_blocked`: iokerneld sleeps
//!   while idle, on `af_xdp:IF,direct`, and the server receives and sends
//!   on an AF_XDP socket of its own (docs/direct-path.md); its idle kthread
//!   parks, polls (`POLL_WHILE_IDLE`), or keeps its core blocked in `poll`
//!   on that socket (`block_while_idle`, docs/idle-poll.md): a frame wakes
//!   it through the kernel, iokerneld off the way. Each checks that the
//!   round trips crossed the own socket;
//! * `linux_blocking`: no iokerneld; a Linux UDP echo server, one thread
//!   blocked in `recvfrom` on a socket bound to an address of the veth's
//!   host end, pinned to the CPU the Ginza server gets.
//!
//! `default` repeats `sleeping` or `sleeping_parked`, whichever a user
//! gets without options (`IokernelConfig::new`'s `poll_while_idle`).
//!
//! Measured in each:
//!
//! * `loop_cpu_pct` (Ginza only): CPU time of iokerneld's loop thread
//!   (`utime + stime` of that thread, the stats' `loop_cpu_ns`) over
//!   `--idle` of wall time with no traffic, in % of one core;
//! * `server_cpu_pct`: the rest of this process's CPU time over the same
//!   window (`/proc/self/stat`, in ticks of 10 ms: the echo server's
//!   kthread or thread, and this thread, asleep), in % of one core;
//! * `first_rtt_us`: the UDP round trip (32-byte payload) from an ordinary
//!   Linux socket in the namespace to the echo server, each sent after
//!   `--gap` with no traffic: a sleeping iokerneld is asleep, the Ginza
//!   server's kthread polls (if `--gap` is under its bound, 2 s) or has
//!   parked, Linux's thread is blocked; the median of `--probes`.
//!
//! Each measured round trip is stamped hop by hop (`Hop::FIRST_REQUEST`,
//! [`crate::hop_spans`]): where its time went. The probe client is
//! `--client` (polling by default) on `--client-cpu`.
//!
//! A figure is the median over rounds. Needs root, `ip` and `ethtool`.

use std::fmt::Write as _;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use ginza_apps::echo_server::{self, EchoStats};
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::InProcess;
use ginza_net::MacAddr;
use ginza_proto::parse_duration;
use ginza_sys::hops::{self, Hop, Stamps};

use crate::harness::app::App;
use crate::harness::direct::{self, DirectFrames};
use crate::harness::figures::{allowed_cpus, emit, median, round3};
use crate::harness::iokerneld::{with_iokerneld_on_veth, Cpus};
use crate::hop_spans::{self, HopSpan};

const ECHO_PORT: u16 = 7;
const ECHO_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x1d, 0x02]);
const PAYLOAD: usize = 32;
/// Round trips before the measured ones (the namespace's ARP entry).
const WARMUP: usize = 20;

/// Arguments of `ginza bench idle`.
#[derive(clap::Args, Debug)]
pub struct IdleArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Rounds (each runs every setup).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Wall time over which the idle loop's CPU time is measured.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    idle: Duration,
    /// Round trips measured per round and mode, each after `--gap`.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..=1000))]
    probes: u64,
    /// Quiet time before each measured round trip.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    gap: Duration,
    /// How the probe client waits for its answer: `polling` (a
    /// non-blocking socket read in a loop that yields its CPU between
    /// reads: its CPU never halts, so the figure leaves out the client's
    /// own wake) or `blocking` (blocked in `recv`: the figure includes the
    /// client's own wake, as before Session 19).
    #[arg(long, value_enum, default_value_t = ClientWait::Polling)]
    client: ClientWait,
    /// The CPU the probe client is pinned to, the same for every setup:
    /// `iokernel` (iokerneld's CPU; Linux's server and the Ginza server
    /// get the other one, so each server wakes on a CPU the client does
    /// not keep awake), `server` (the server's CPU: then iokerneld's CPU
    /// halts while idle) or `any` (not pinned).
    #[arg(long, value_enum, default_value_t = ClientCpu::Iokernel)]
    client_cpu: ClientCpu,
}

/// How the probe client waits for its answer.
#[derive(clap::ValueEnum, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ClientWait {
    Polling,
    Blocking,
}

/// Where the probe client runs.
#[derive(clap::ValueEnum, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ClientCpu {
    Iokernel,
    Server,
    Any,
}

/// The probe client: how it waits, and its CPU (None: not pinned).
#[derive(Clone, Copy, Debug)]
struct Client {
    wait: ClientWait,
    cpu: Option<usize>,
}

/// Who serves, and how iokerneld and the server spend an idle spell.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Setup {
    Sleeping,
    SleepingParked,
    Spinning,
    DirectParked,
    DirectPolling,
    DirectBlocked,
    LinuxBlocking,
}

impl Setup {
    const ALL: [Setup; 7] = [
        Setup::Sleeping,
        Setup::SleepingParked,
        Setup::Spinning,
        Setup::DirectParked,
        Setup::DirectPolling,
        Setup::DirectBlocked,
        Setup::LinuxBlocking,
    ];

    /// The server's own AF_XDP socket (docs/direct-path.md).
    fn direct(self) -> bool {
        matches!(
            self,
            Setup::DirectParked | Setup::DirectPolling | Setup::DirectBlocked
        )
    }

    /// The server's `block_while_idle`.
    fn block_while_idle(self) -> bool {
        self == Setup::DirectBlocked
    }

    fn spin(self) -> bool {
        self == Setup::Spinning
    }

    /// The server's `poll_while_idle`.
    fn poll_while_idle(self) -> Duration {
        if matches!(
            self,
            Setup::SleepingParked | Setup::DirectParked | Setup::DirectBlocked
        ) {
            Duration::ZERO
        } else {
            ginza_runtime::POLL_WHILE_IDLE
        }
    }

    fn name(self) -> &'static str {
        match self {
            Setup::Sleeping => "sleeping, server polls",
            Setup::SleepingParked => "sleeping, server parks",
            Setup::Spinning => "spinning, server polls",
            Setup::DirectParked => "direct, server parks",
            Setup::DirectPolling => "direct, server polls",
            Setup::DirectBlocked => "direct, server blocked",
            Setup::LinuxBlocking => "Linux, blocking",
        }
    }

    /// The Ginza setup a user gets without options: iokerneld sleeps while
    /// idle, and the server polls or parks by `IokernelConfig::new`.
    fn default_ginza() -> Setup {
        let io = ginza_runtime::IokernelConfig::new("x", ginza_runtime::Class::LatencyCritical);
        if io.poll_while_idle.is_zero() {
            Setup::SleepingParked
        } else {
            Setup::Sleeping
        }
    }
}

/// One setup's figures in one round.
#[derive(Serialize, Clone, Debug)]
struct Round {
    setup: Setup,
    /// iokerneld's NIC backend; `kernel` for Linux's server.
    backend: String,
    /// None: no iokerneld (Linux's server).
    loop_cpu_pct: Option<f64>,
    server_cpu_pct: f64,
    /// iokerneld's sleeps during the idle window, and its wakes by cause
    /// (NIC, application bell, control socket, timer, in-process handle);
    /// none without iokerneld.
    sleeps: Option<u64>,
    wakes: Option<[u64; 5]>,
    /// During the measured round trips: iokerneld's wakes by cause (as
    /// `wakes`), and the grants to the server; none without iokerneld.
    probe_wakes: Option<[u64; 5]>,
    probe_grants: Option<u64>,
    /// The direct-path setups: the frames on the server's own socket and
    /// on iokerneld's NIC over the server's life.
    direct_frames: Option<DirectFrames>,
    /// Each measured round trip, µs (null: unanswered within 1 s).
    first_rtt_us: Vec<Option<f64>>,
    /// Each measured round trip's hop stamps (TSC ticks, 0: not passed;
    /// `ginza_sys::hops::Hop` order).
    stamps: Vec<Stamps>,
}

#[derive(Serialize, Clone, Debug)]
struct Mode {
    loop_cpu_pct: Option<f64>,
    server_cpu_pct: f64,
    first_rtt_us_p50: f64,
    /// Where the time went: each hop's span over every measured round
    /// trip of the setup, all rounds pooled (medians).
    spans: Vec<HopSpan>,
    /// Measured round trips that found iokerneld asleep (it stamped its
    /// wake), and that woke a parked kthread (it stamped its run).
    iokernel_woke: usize,
    kthread_woke: usize,
}

#[derive(Serialize, Debug)]
struct Report {
    sleeping: Mode,
    sleeping_parked: Mode,
    spinning: Mode,
    direct_parked: Mode,
    direct_polling: Mode,
    direct_blocked: Mode,
    linux_blocking: Mode,
    /// Which of `sleeping` and `sleeping_parked` a user gets by default,
    /// and its figures again.
    default_setup: Setup,
    default: Mode,
    idle_s: f64,
    gap_ms: f64,
    client: ClientWait,
    /// The CPU the probe client was pinned to (null: not pinned), and
    /// iokerneld's and the server's.
    client_cpu: Option<usize>,
    iokernel_cpu: usize,
    server_cpu: usize,
    /// The stamps' rate.
    ticks_per_us: f64,
    rounds: Vec<Round>,
}

pub(crate) fn run(args: IdleArgs) -> anyhow::Result<()> {
    let cpus = allowed_cpus()?;
    anyhow::ensure!(cpus.len() >= 2, "needs two CPUs, has {cpus:?}");
    let cpus = Cpus {
        iokernel: cpus[0],
        app: cpus[1],
    };
    let client = Client {
        wait: args.client,
        cpu: match args.client_cpu {
            ClientCpu::Iokernel => Some(cpus.iokernel),
            ClientCpu::Server => Some(cpus.app),
            ClientCpu::Any => None,
        },
    };
    let ns = direct::namespace().context("the round trips run over a veth pair")?;
    // Every party stamps its hops (a relaxed load and a store on a shared
    // line each: tens of nanoseconds against the 100 µs measured).
    hops::enable(true);
    let ticks_per_us = hops::ticks_per_us(Duration::from_millis(20));
    let mut rounds = Vec::new();
    for r in 0..args.rounds {
        // Turn which mode goes first.
        for i in 0..Setup::ALL.len() {
            let setup = Setup::ALL[(i + r as usize) % Setup::ALL.len()];
            let round = measure(&ns, cpus, setup, client, &args)?;
            let iokerneld = match (round.loop_cpu_pct, round.sleeps, round.wakes) {
                (Some(cpu), Some(sleeps), Some(wakes)) => format!(
                    "loop {cpu:.2} % of a core, {sleeps} sleeps, wakes (nic, app, control, timer, handle) {wakes:?}; during the probes wakes {:?}, grants {:?}{}, ",
                    round.probe_wakes.unwrap_or_default(),
                    round.probe_grants.unwrap_or(0),
                    round.direct_frames.map_or(String::new(), |f| format!(
                        ", own socket {} in / {} out, iokerneld's NIC {} in / {} out",
                        f.own_rx, f.own_tx, f.iokernel_nic_rx, f.iokernel_nic_tx
                    ))
                ),
                _ => "no iokerneld, ".to_string(),
            };
            eprintln!(
                "round {r} {}: {iokerneld}server {:.2} %; first round trips {:?} µs\n  spans µs: {}",
                setup.name(),
                round.server_cpu_pct,
                round.first_rtt_us,
                hop_spans::line(&hop_spans::median_spans(&Hop::FIRST_REQUEST, &round.stamps, ticks_per_us))
            );
            rounds.push(round);
        }
    }
    let mode = |setup: Setup| -> anyhow::Result<Mode> {
        let of: Vec<&Round> = rounds.iter().filter(|r| r.setup == setup).collect();
        let cpu: Vec<f64> = of.iter().filter_map(|r| r.loop_cpu_pct).collect();
        let server: Vec<f64> = of.iter().map(|r| r.server_cpu_pct).collect();
        let rtt: Vec<f64> = of
            .iter()
            .map(|r| {
                let answered: Vec<f64> = r.first_rtt_us.iter().flatten().copied().collect();
                median(&answered).unwrap_or(f64::NAN)
            })
            .collect();
        let stamps: Vec<Stamps> = of.iter().flat_map(|r| r.stamps.iter().copied()).collect();
        let passed = |h: Hop| stamps.iter().filter(|s| s[h as usize] != 0).count();
        Ok(Mode {
            loop_cpu_pct: median(&cpu).map(round3),
            server_cpu_pct: round3(median(&server).context("no round")?),
            first_rtt_us_p50: round3(median(&rtt).context("no round")?),
            spans: hop_spans::median_spans(&Hop::FIRST_REQUEST, &stamps, ticks_per_us),
            iokernel_woke: passed(Hop::IokernelWoke),
            kthread_woke: passed(Hop::KthreadRuns),
        })
    };
    let default_setup = Setup::default_ginza();
    let report = Report {
        sleeping: mode(Setup::Sleeping)?,
        sleeping_parked: mode(Setup::SleepingParked)?,
        spinning: mode(Setup::Spinning)?,
        direct_parked: mode(Setup::DirectParked)?,
        direct_polling: mode(Setup::DirectPolling)?,
        direct_blocked: mode(Setup::DirectBlocked)?,
        linux_blocking: mode(Setup::LinuxBlocking)?,
        default_setup,
        default: mode(default_setup)?,
        idle_s: args.idle.as_secs_f64(),
        gap_ms: args.gap.as_secs_f64() * 1e3,
        client: args.client,
        client_cpu: client.cpu,
        iokernel_cpu: cpus.iokernel,
        server_cpu: cpus.app,
        ticks_per_us,
        rounds,
    };
    let mut table = String::new();
    writeln!(
        table,
        "idle ({} rounds; CPU over {:?} idle; round trip after {:?} quiet, median of {}; client {:?} on CPU {:?}, iokerneld on {}, server on {})",
        args.rounds, args.idle, args.gap, args.probes, args.client, client.cpu, cpus.iokernel, cpus.app
    )?;
    for (setup, m) in [
        (Setup::Sleeping, &report.sleeping),
        (Setup::SleepingParked, &report.sleeping_parked),
        (Setup::Spinning, &report.spinning),
        (Setup::DirectParked, &report.direct_parked),
        (Setup::DirectPolling, &report.direct_polling),
        (Setup::DirectBlocked, &report.direct_blocked),
        (Setup::LinuxBlocking, &report.linux_blocking),
    ] {
        let loop_cpu = m
            .loop_cpu_pct
            .map_or("      -".to_string(), |c| format!("{c:7.3}"));
        writeln!(
            table,
            "  {:23} loop CPU {loop_cpu} % of a core   server {:7.2} %   first round trip p50 {:8.1} µs{}",
            setup.name(),
            m.server_cpu_pct,
            m.first_rtt_us_p50,
            if setup == default_setup { "   (the default)" } else { "" }
        )?;
        writeln!(
            table,
            "    iokerneld woke in {}, a parked kthread in {}; spans µs (trips): {}",
            m.iokernel_woke,
            m.kthread_woke,
            hop_spans::line(&m.spans)
        )?;
    }
    emit(args.json, &table, &report)
}

/// One setup: the server, the idle window, the probes.
fn measure(
    ns: &NetNs,
    cpus: Cpus,
    setup: Setup,
    client: Client,
    args: &IdleArgs,
) -> anyhow::Result<Round> {
    if setup == Setup::LinuxBlocking {
        let (server_cpu_pct, first) = linux_blocking(ns, cpus.app, client, args)?;
        let (first_rtt_us, stamps) = first.into_iter().unzip();
        return Ok(Round {
            setup,
            backend: "kernel".to_string(),
            loop_cpu_pct: None,
            server_cpu_pct: round3(server_cpu_pct),
            sleeps: None,
            wakes: None,
            probe_wakes: None,
            probe_grants: None,
            direct_frames: None,
            first_rtt_us,
            stamps,
        });
    }
    let configure = |cfg: &mut ginza_iokernel::Config| {
        cfg.spin = setup.spin();
        cfg.idle_sleep = None;
        Ok(())
    };
    let (backend, (measured, probed, direct_frames)) = if setup.direct() {
        let served = direct::with_iokerneld_direct(ns, cpus, configure, |iokerneld, queue| {
            serve(ns, iokerneld, setup, client, args, Some(queue))
        })?;
        ("af_xdp,direct".to_string(), served)
    } else {
        with_iokerneld_on_veth(ns, cpus, configure, |iokerneld, _| {
            serve(ns, iokerneld, setup, client, args, None)
        })?
    };
    let ((loop_cpu_pct, server_cpu_pct), (sleeps, wakes), first) = measured;
    let (probe_wakes, probe_grants) = probed;
    if let Some(f) = &direct_frames {
        f.check(args.probes)?;
    }
    let (first_rtt_us, stamps) = first.into_iter().unzip();
    Ok(Round {
        setup,
        backend,
        loop_cpu_pct: Some(round3(loop_cpu_pct)),
        server_cpu_pct: round3(server_cpu_pct),
        sleeps: Some(sleeps),
        wakes: Some(wakes),
        probe_wakes: Some(probe_wakes),
        probe_grants: Some(probe_grants),
        direct_frames,
        first_rtt_us,
        stamps,
    })
}

/// (loop, rest of the process) CPU %, sleeps and wakes, the companion's
/// wakes and spin (ns) during the round trips, and the round trips.
type Measured = ((f64, f64), (u64, [u64; 5]), Vec<Trip>);

/// One round trip: µs if answered within 1 s, and its hop stamps.
type Trip = (Option<f64>, Stamps);

/// Linux's `USER_HZ`: the unit of `/proc/self/stat`'s CPU times.
const NS_PER_TICK: f64 = 10_000_000.0;

/// iokerneld's wakes by cause during the probes, and the grants to the
/// server then.
type Probed = ([u64; 5], u64);

/// The server (on its own socket on queue `direct`, if given) and its
/// measurements; with `direct`, where its frames went.
fn serve(
    ns: &NetNs,
    iokerneld: &InProcess,
    setup: Setup,
    client: Client,
    args: &IdleArgs,
    direct: Option<u32>,
) -> anyhow::Result<(Measured, Probed, Option<DirectFrames>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let (s2, stats) = (stop.clone(), Arc::new(EchoStats::default()));
    let tune = |config: &mut ginza_runtime::Config| {
        if let Some(io) = config.iokernel.as_mut() {
            io.poll_while_idle = setup.poll_while_idle();
            io.block_while_idle = setup.block_while_idle();
        }
        if let Some(queue) = direct {
            direct::enable(config, ns, queue, false);
        }
    };
    let mut server = App::start_tuned(
        iokerneld,
        "idle-echo",
        (ECHO_MAC, ns.peer_ip),
        tune,
        move || {
            let served = echo_server::serve_udp(ECHO_PORT, s2, stats);
            (served, ginza_runtime::net::stats())
        },
    )?;
    let before = iokerneld.stats();
    let result = probe_idle(ns, iokerneld, client, args);
    let after = iokerneld.stats();
    stop.store(true, Ordering::Relaxed);
    // The server returns at its next request or timer.
    let _ = trips(ns, ns.peer_ip, 1, client);
    let joined = server.join();
    let (measured, probe_start) = result?;
    let (before, after) = (before?, after?);
    let grants = |s: &ginza_proto::StatsReport| {
        s.apps
            .iter()
            .filter(|a| a.name == "idle-echo")
            .map(|a| a.grants)
            .sum::<u64>()
    };
    let (a, b) = (&probe_start.idle, &after.idle);
    let probed = (
        [
            b.wakes_nic.saturating_sub(a.wakes_nic),
            b.wakes_app.saturating_sub(a.wakes_app),
            b.wakes_control.saturating_sub(a.wakes_control),
            b.wakes_timer.saturating_sub(a.wakes_timer),
            b.wakes_handle.saturating_sub(a.wakes_handle),
        ],
        grants(&after).saturating_sub(grants(&probe_start)),
    );
    let frames = match direct {
        Some(_) => {
            let (served, net) = joined?;
            served.context("the Ginza echo server")?;
            Some(DirectFrames::of(net.as_ref(), &before, &after)?)
        }
        None => None,
    };
    Ok((measured, probed, frames))
}

/// The measurements, and iokerneld's stats as the probes began.
fn probe_idle(
    ns: &NetNs,
    iokerneld: &InProcess,
    client: Client,
    args: &IdleArgs,
) -> anyhow::Result<(Measured, ginza_proto::StatsReport)> {
    let target = ns.peer_ip;
    warm_up(ns, target, client)?;
    let s0 = iokerneld.stats()?;
    let p0 = process_ticks()?;
    std::thread::sleep(args.idle);
    let p1 = process_ticks()?;
    let s1 = iokerneld.stats()?;
    let cpu = s1.loop_cpu_ns.saturating_sub(s0.loop_cpu_ns) as f64;
    let wall = s1.uptime_ns.saturating_sub(s0.uptime_ns).max(1) as f64;
    let rest = (p1.saturating_sub(p0) as f64 * NS_PER_TICK - cpu).max(0.0);
    let (a, b) = (&s0.idle, &s1.idle);
    let sleeps = b.sleeps.saturating_sub(a.sleeps);
    let wakes = [
        b.wakes_nic.saturating_sub(a.wakes_nic),
        b.wakes_app.saturating_sub(a.wakes_app),
        b.wakes_control.saturating_sub(a.wakes_control),
        b.wakes_timer.saturating_sub(a.wakes_timer),
        b.wakes_handle.saturating_sub(a.wakes_handle),
    ];
    let first = first_trips(ns, target, client, args)?;
    Ok((
        (
            (cpu / wall * 100.0, rest / wall * 100.0),
            (sleeps, wakes),
            first,
        ),
        s1,
    ))
}

/// Round trips before the measured ones; at least one answered.
fn warm_up(ns: &NetNs, target: Ipv4Addr, client: Client) -> anyhow::Result<()> {
    let warm = trips(ns, target, WARMUP, client)?;
    anyhow::ensure!(
        warm.iter().any(|t| t.0.is_some()),
        "the echo server at {target} answered none of {WARMUP} round trips"
    );
    Ok(())
}

/// `--probes` round trips, each after `--gap` of quiet.
fn first_trips(
    ns: &NetNs,
    target: Ipv4Addr,
    client: Client,
    args: &IdleArgs,
) -> anyhow::Result<Vec<Trip>> {
    let mut first = Vec::new();
    for _ in 0..args.probes {
        std::thread::sleep(args.gap);
        first.extend(trips(ns, target, 1, client)?);
    }
    Ok(first)
}

/// Linux's peer: the kernel's UDP echo on the veth's host end, which has
/// an address of the namespace's subnet (`.3`, Ginza's server is
/// `peer_ip`) for the measurement; a thread blocked in `recvfrom`, pinned
/// to `cpu`. Returns the process's CPU over the idle window, % of a core,
/// and the round trips after a quiet gap.
fn linux_blocking(
    ns: &NetNs,
    cpu: usize,
    client: Client,
    args: &IdleArgs,
) -> anyhow::Result<(f64, Vec<Trip>)> {
    let host = ns
        .add_host_address(3)
        .with_context(|| format!("a Linux address on {}", ns.host_if))?;
    linux_echo_measured(ns, host.ip, cpu, client, args)
}

fn linux_echo_measured(
    ns: &NetNs,
    ip: Ipv4Addr,
    cpu: usize,
    client: Client,
    args: &IdleArgs,
) -> anyhow::Result<(f64, Vec<Trip>)> {
    let addr = SocketAddrV4::new(ip, ECHO_PORT);
    let socket = UdpSocket::bind(addr).with_context(|| format!("binding {addr}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = std::thread::Builder::new()
        .name("linux-echo".into())
        .spawn(move || -> std::io::Result<()> {
            ginza_sys::affinity::pin_current_thread(cpu)?;
            let mut buf = [0u8; 2048];
            // Blocks with no time-out: nothing wakes it but a datagram.
            while !stop2.load(Ordering::Relaxed) {
                let (n, from) = socket.recv_from(&mut buf)?;
                let _ = socket.send_to(&buf[..n], from);
            }
            Ok(())
        })?;
    let measured = (|| -> anyhow::Result<(f64, Vec<Trip>)> {
        warm_up(ns, ip, client)?;
        let t0 = std::time::Instant::now();
        let p0 = process_ticks()?;
        std::thread::sleep(args.idle);
        let p1 = process_ticks()?;
        let wall = t0.elapsed().as_nanos().max(1) as f64;
        let cpu_pct = p1.saturating_sub(p0) as f64 * NS_PER_TICK / wall * 100.0;
        Ok((cpu_pct, first_trips(ns, ip, client, args)?))
    })();
    stop.store(true, Ordering::Relaxed);
    // The thread returns after one more datagram.
    UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?.send_to(&[0u8; 8], addr)?;
    server
        .join()
        .map_err(|_| anyhow::anyhow!("the Linux echo thread panicked"))??;
    measured
}

/// This process's CPU time so far, in ticks.
fn process_ticks() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    crate::demo::quiet::parse_process_ticks(&text).context("parsing /proc/self/stat")
}

/// `n` round trips from a fresh socket in the namespace to the echo server
/// at `ip`, one at a time, each waited for as `client` says (a reply
/// unanswered within [`REPLY_TIMEOUT`] is lost), on `client`'s CPU.
fn trips(ns: &NetNs, ip: Ipv4Addr, n: usize, client: Client) -> anyhow::Result<Vec<Trip>> {
    let bind = SocketAddrV4::new(ns.ns_ip, 0);
    let target = SocketAddrV4::new(ip, ECHO_PORT);
    Ok(ns.run_in(move || ping(bind, target, n, client))??)
}

/// The longest wait for one reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

fn ping(
    bind: SocketAddrV4,
    target: SocketAddrV4,
    n: usize,
    client: Client,
) -> std::io::Result<Vec<Trip>> {
    if let Some(cpu) = client.cpu {
        ginza_sys::affinity::pin_current_thread(cpu)?;
    }
    let socket = UdpSocket::bind(bind)?;
    socket.connect(target)?;
    match client.wait {
        ClientWait::Polling => socket.set_nonblocking(true)?,
        ClientWait::Blocking => socket.set_read_timeout(Some(REPLY_TIMEOUT))?,
    }
    let mut payload = [0u8; PAYLOAD];
    let mut reply = [0u8; 2048];
    let mut out = Vec::with_capacity(n);
    for sequence in 0..n as u64 {
        payload[..8].copy_from_slice(&sequence.to_le_bytes());
        hops::begin();
        let start = Instant::now();
        socket.send(&payload)?;
        let mut rtt = None;
        while start.elapsed() < REPLY_TIMEOUT {
            match socket.recv(&mut reply) {
                Ok(len) if len >= 8 && reply[..8] == sequence.to_le_bytes() => {
                    rtt = Some(start.elapsed().as_secs_f64() * 1e6);
                    hops::stamp(Hop::ClientRecv);
                    break;
                }
                // A late reply to an earlier datagram.
                Ok(_) => {}
                // Yields between reads: a thread woken on its CPU gets it.
                // (Under `SCHED_IDLE` instead, tried in Session 19, a
                // loaded machine starved the client for milliseconds.)
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock && client.wait == ClientWait::Polling =>
                {
                    std::thread::yield_now()
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(e) => return Err(e),
            }
        }
        out.push((rtt, hops::current()));
    }
    Ok(out)
}
