//! `ginza bench forward`: iokerneld's dataplane (docs/results.md,
//! "Dataplane").
//!
//! * `forward_mpps`: packets per second that iokerneld, spinning on one
//!   CPU, moves from one application's egress ring to another's ingress
//!   ring through the software switch: 64-byte frames (a 22-byte UDP
//!   payload), egress ring → a scratch copy → the receiver's switch port →
//!   an ingress-pool buffer and an ingress ring. The two applications are
//!   [`RawApp`]s driven by one thread on the other CPU, which only fills
//!   egress slots with a prebuilt frame and gives ingress buffers straight
//!   back, so that iokerneld is the bottleneck. iokerneld runs with the
//!   recording actuator (grants are bookkeeping: no thread is pinned or
//!   woken) and manages both CPUs, so both applications hold a core and
//!   iokerneld polls their rings. A window's figure is the receiver's
//!   delivered packets (iokerneld's own count) per second of iokerneld's
//!   own window.
//! * `copy_floor_mpps`: the same frames, the same kind of rings and pool,
//!   the same driver, moved by a bare loop on the same CPU
//!   ([`CopyFloor`]: one copy per frame, no switch, no steering, no daemon
//!   loop). Rounds alternate floor, forwarding, floor, forwarding … (a
//!   fresh iokerneld per forwarding round, after a warm-up), and
//!   `forward_per_floor` is the median of the rounds' ratios. Shenango's
//!   IOKernel forwards 6.5 M packets/s from a NIC to runtimes (its paper,
//!   §6) on a dedicated physical core: a neighbour, not a ratio.
//! * `rtt_us`: UDP round trips (32-byte payload, one at a time, 2000 after
//!   200 of warm-up per round and server) from an ordinary Linux socket in
//!   a network namespace, over a veth pair, to an echo server at the root
//!   namespace's end; rounds alternate `ginza` (the UDP echo on a Ginza
//!   runtime behind iokerneld driving the veth end with AF_XDP, copy mode;
//!   AF_PACKET if AF_XDP cannot be opened), `linux_blocking` (a thread
//!   blocked in `recv_from` on the veth end, given an address for the run)
//!   and `linux_busy_poll` (a non-blocking socket spinning on `recv_from`,
//!   pinned to the CPU Ginza's server uses) and `ginza_spin` (the Ginza
//!   server with a spin window before parking of `--rtt-spin-us`, 100 µs
//!   by default: its kthread polls between requests instead of parking);
//!   each figure is the median of the rounds'; `ginza_direct` (after
//!   `ginza` in each round, unless `--rtt-no-direct`): the first Ginza
//!   server on the direct path, its own AF_XDP socket on a queue of its own
//!   of a 64-queue veth ([`direct`], docs/direct-path.md), and
//!   `ginza_direct_blocked` (after it): the same with its idle kthread
//!   blocked on that socket at once instead of polling or parking
//!   (`block_while_idle`, docs/idle-poll.md). The client is pinned as
//!   `--rtt-client-cpu` says ([`ClientCpu`]; by default a third CPU for
//!   every server, and on two CPUs beside the thread that sends the
//!   replies: iokerneld for Ginza, the server thread for Linux and for
//!   `ginza_direct`). Ginza's rounds also give where the
//!   time went, hop by hop (`rtt_us.ginza_spans`: TSC stamps taken by
//!   iokerneld, the runtime and the client, [`super::rtt_spans`]), from a
//!   second, stamped series on the same server: the figures come from
//!   round trips with stamping off, since a stamp costs each party a
//!   shared cache line that the Linux rounds do not pay. Needs
//!   root, `ip` and `ethtool`; without them `rtt_us` is null and
//!   `rtt_skipped` says why.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use std::net::SocketAddrV4;

use ginza_apps::echo_server::{self, EchoStats};
use ginza_iokernel::dataplane::copy_floor::CopyFloor;
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::raw_app::{self, RawApp};
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::{tx, Endpoint, Interface, Ipv4Addr, MacAddr};
use ginza_proto::{client, StatsReport};
use ginza_runtime::Config as RtConfig;
use ginza_shm::{Region, RegionConfig, RuntimeEnd};
use ginza_sys::clock;
use ginza_sys::hops::{self, Hop, Stamps};
use serde::Serialize;

use super::rtt_spans::Spans;
use crate::harness::app::App;
use crate::harness::build_kind;
use crate::harness::client_cpu::ClientCpu;
use crate::harness::direct::{self, DirectFrames};
use crate::harness::figures::{allowed_cpus, emit, median, percentile};
use crate::harness::iokerneld::{socket_dir, with_iokerneld_on_veth, Cpus, Recording};

/// Arguments of `ginza bench forward`.
#[derive(clap::Args, Debug)]
pub struct ForwardArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Rounds of (copy floor, forwarding) windows for `forward_mpps` and
    /// `copy_floor_mpps`.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    windows: u32,
    /// Length of one window, in ms.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..))]
    window_ms: u64,
    /// Rounds of UDP round trips (Ginza, Linux blocking, Linux
    /// busy-polling, Ginza spinning in each), 2000 per server and round;
    /// 0: no round trips.
    #[arg(long, default_value_t = 5)]
    rtt_rounds: u32,
    /// How the round-trip client waits for an answer (the same for every
    /// server).
    #[arg(long, value_enum, default_value_t = Client::Blocking)]
    rtt_client: Client,
    /// Where the round-trip client runs (the same rule for every server;
    /// the JSON says which CPUs it got).
    #[arg(long, value_enum, default_value_t = ClientCpu::Auto)]
    rtt_client_cpu: ClientCpu,
    /// The spin window (`spin_before_park`) of the second Ginza echo
    /// server, `rtt_us.ginza_spin`, in µs: longer than the gap between two
    /// requests, its kthread never parks (Ginza's answer to the busy-polling
    /// Linux server; `rtt_us.ginza` keeps the runtime's default).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    rtt_spin_us: u64,
    /// Append every measured round trip (server, round, µs or null, the
    /// hop stamps) to this file as JSON lines, with the stamps' rate and
    /// one (stamp, CLOCK_MONOTONIC ns) pair to line them up with a
    /// kernel trace (`perf record -k mono`).
    #[arg(long)]
    rtt_dump: Option<std::path::PathBuf>,
    /// iokerneld keeps spinning after a NIC transmit instead of yielding
    /// its CPU once at the next idle turn (`yield_after_nic_tx = false`,
    /// for comparison).
    #[arg(long)]
    rtt_no_yield: bool,
    /// iokerneld of the Ginza round trips may sleep while idle (its
    /// default). Without it the bench runs iokerneld with `--spin`: it is
    /// compared with a busy-polling Linux server (docs/iokernel-idle.md).
    /// The forwarding windows never let it sleep (both applications hold
    /// a core and register no bell).
    #[arg(long)]
    rtt_iokernel_sleep: bool,
    /// The Ginza echo servers' kthread parks when idle instead of polling
    /// (`poll_while_idle` = 0: the behaviour before idle polling,
    /// docs/idle-poll.md), for a before/after comparison.
    #[arg(long)]
    rtt_park: bool,
    /// No round trips to the Ginza echo server on the direct path (its own
    /// AF_XDP socket, `rtt_us.ginza_direct`; docs/direct-path.md).
    #[arg(long)]
    rtt_no_direct: bool,
    /// iokerneld's `self_wake` (`--self-wake`): a parked direct-path echo
    /// server (with `--rtt-park`) wakes itself for a frame on its own
    /// socket (docs/direct-path.md, "The self-woken kthread") [default:
    /// iokerneld's].
    #[arg(long)]
    self_wake: Option<bool>,
    /// iokerneld's `yield_while_idle` (docs/iokernel-idle.md, "Yielding
    /// at idle turns") for the round trips [default: iokerneld's].
    #[arg(long)]
    idle_yield: Option<bool>,
}

#[derive(Serialize)]
struct Report {
    forward_mpps: f64,
    /// Each round's forwarding rate, M packets/s.
    forward_windows_mpps: Vec<f64>,
    /// The copy floor (`ginza_iokernel::dataplane::copy_floor`): the same
    /// frames moved egress ring → ingress ring on the same core, one copy,
    /// no switch or steering; median of the rounds, interleaved with the
    /// forwarding ones.
    copy_floor_mpps: f64,
    copy_floor_windows_mpps: Vec<f64>,
    /// Median over the rounds of forward / floor (each round's pair measured
    /// back to back).
    forward_per_floor: f64,
    /// iokerneld's loop CPU time per forwarded packet, ns (median round).
    iokernel_ns_per_packet: f64,
    /// The floor loop's CPU time per frame, ns (median round).
    copy_floor_ns_per_packet: f64,
    /// Bursts of 64 the sender could not queue whole because its egress
    /// ring was full (the driver outran the loop), over all rounds.
    sender_ring_full: u64,
    copy_floor_sender_ring_full: u64,
    frame_bytes: usize,
    /// UDP round trips over the veth, µs, medians of the rounds; null when
    /// skipped.
    rtt_us: Option<RttSet>,
    /// Rounds of round trips (Ginza, Linux blocking, Linux busy-polling
    /// each once per round).
    rtt_rounds: usize,
    /// `blocking` or `polling` (`--rtt-client`).
    rtt_client: String,
    /// Where the client ran (`--rtt-client-cpu`); the CPUs themselves are
    /// in `rtt_us.client_cpu_*`.
    rtt_client_cpu: String,
    /// The NIC backend the Ginza round trips went through.
    rtt_backend: Option<String>,
    /// Why `rtt_us` is null.
    rtt_skipped: Option<String>,
    /// The spin window of `rtt_us.ginza_spin`'s server, µs.
    rtt_spin_us: u64,
    /// How this binary was built ([`build_kind`]).
    build: &'static str,
}

const SENDER: u8 = 1;
const RECEIVER: u8 = 2;

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x47, 0x5a, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 47, 0, last),
    }
}

pub fn run(args: ForwardArgs) -> anyhow::Result<()> {
    let cpus = allowed_cpus()?;
    anyhow::ensure!(
        cpus.len() >= 2,
        "ginza bench forward needs two CPUs (iokerneld and the applications), this process may use {cpus:?}"
    );
    let (iok_cpu, app_cpu) = (cpus[0], cpus[1]);
    let mut report = measure(&args, iok_cpu, app_cpu)?;
    if args.rtt_rounds == 0 {
        report.rtt_skipped = Some("--rtt-rounds 0".into());
        return emit(args.json, &render(&report), &report);
    }
    let ns = if args.rtt_no_direct {
        NetNs::create()
    } else {
        direct::namespace()
    };
    match ns {
        Err(e) => report.rtt_skipped = Some(e.to_string()),
        Ok(ns) => {
            let (backend, set) = rtt_rounds(&ns, &args, &cpus, iok_cpu, app_cpu)?;
            report.rtt_us = Some(set);
            report.rtt_rounds = args.rtt_rounds as usize;
            report.rtt_backend = Some(backend);
        }
    }
    emit(args.json, &render(&report), &report)
}

/// One round's figures of one loop.
struct Window {
    mpps: f64,
    ns_per_packet: Option<f64>,
    ring_full: u64,
}

/// The 64-byte frame both loops move: sender → receiver, UDP, 22 bytes of
/// payload.
fn test_frame() -> anyhow::Result<Vec<u8>> {
    let mut frame = vec![0u8; 2048];
    let to = Endpoint {
        ip: iface(RECEIVER).ip,
        port: 9,
    };
    let len = tx::udp_datagram(
        &mut frame,
        &iface(SENDER),
        iface(RECEIVER).mac,
        9,
        to,
        &[0u8; 22],
    )?;
    frame.truncate(len);
    Ok(frame)
}

/// Rounds of (copy floor, forwarding), each loop on `iok_cpu` fed by one
/// driver thread on `app_cpu`.
fn measure(args: &ForwardArgs, iok_cpu: usize, app_cpu: usize) -> anyhow::Result<Report> {
    let frame = test_frame()?;
    let mut floors = Vec::new();
    let mut forwards = Vec::new();
    for _ in 0..args.windows {
        floors.push(floor_window(args, &frame, iok_cpu, app_cpu).context("the copy floor")?);
        forwards.push(forward_window(args, &frame, iok_cpu, app_cpu).context("forwarding")?);
    }
    let rates = |w: &[Window]| w.iter().map(|w| w.mpps).collect::<Vec<_>>();
    let ns = |w: &[Window]| w.iter().filter_map(|w| w.ns_per_packet).collect::<Vec<_>>();
    let ratios: Vec<f64> = forwards
        .iter()
        .zip(&floors)
        .filter(|(_, f)| f.mpps > 0.0)
        .map(|(w, f)| w.mpps / f.mpps)
        .collect();
    let forward_mpps = median(&rates(&forwards)).unwrap_or(0.0);
    anyhow::ensure!(forward_mpps > 0.0, "no packet was forwarded");
    Ok(Report {
        forward_mpps,
        forward_windows_mpps: rates(&forwards),
        copy_floor_mpps: median(&rates(&floors)).unwrap_or(0.0),
        copy_floor_windows_mpps: rates(&floors),
        forward_per_floor: median(&ratios).unwrap_or(0.0),
        iokernel_ns_per_packet: median(&ns(&forwards)).unwrap_or(0.0),
        copy_floor_ns_per_packet: median(&ns(&floors)).unwrap_or(0.0),
        sender_ring_full: forwards.iter().map(|w| w.ring_full).sum(),
        copy_floor_sender_ring_full: floors.iter().map(|w| w.ring_full).sum(),
        frame_bytes: frame.len(),
        rtt_us: None,
        rtt_rounds: 0,
        rtt_client: format!("{:?}", args.rtt_client).to_lowercase(),
        rtt_client_cpu: format!("{:?}", args.rtt_client_cpu),
        rtt_backend: None,
        rtt_skipped: None,
        rtt_spin_us: args.rtt_spin_us,
        build: build_kind(),
    })
}

/// A thread named for profiles (`perf report --comm fwd-iokerneld`).
fn named<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .expect("a thread can be spawned")
}

/// Warm-up before each measured window.
fn warm_up(args: &ForwardArgs) -> Duration {
    Duration::from_millis(args.window_ms.min(100))
}

/// The driver on `cpu`: fills the sender's egress ring with copies of
/// `frame` and gives the receiver's buffers straight back, until `stop`;
/// returns the bursts of 64 that did not fit whole.
fn drive(
    cpu: usize,
    sender: &mut RuntimeEnd,
    receiver: &mut RuntimeEnd,
    frame: &[u8],
    stop: &AtomicBool,
) -> u64 {
    let _ = ginza_sys::affinity::pin_current_thread(cpu);
    let mut ring_full = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if raw_app::send_copies(sender, frame, 64) < 64 {
            ring_full += 1;
        }
        raw_app::drop_received(receiver, 256);
    }
    ring_full
}

/// One round of the copy floor: two regions like two applications', the
/// floor loop on `iok_cpu` timing its own window after a warm-up.
fn floor_window(
    args: &ForwardArgs,
    frame: &[u8],
    iok_cpu: usize,
    app_cpu: usize,
) -> anyhow::Result<Window> {
    let a = Region::create("fwd-floor-sender", &RegionConfig::new(1))?;
    let b = Region::create("fwd-floor-receiver", &RegionConfig::new(1))?;
    let (mut from, mut to) = (a.iokernel_end(0)?, b.iokernel_end(0)?);
    let (mut sender, mut receiver) = (a.runtime_end(0)?, b.runtime_end(0)?);
    let mut floor =
        CopyFloor::new("bench", b.layout().done.capacity).map_err(|e| anyhow::anyhow!(e))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (warm, window) = (warm_up(args).as_nanos() as u64, args.window_ms * 1_000_000);
    let stop2 = stop.clone();
    let looped = named("fwd-floor", move || -> Result<(u64, u64, u64), String> {
        let _ = ginza_sys::affinity::pin_current_thread(iok_cpu);
        let start = clock::monotonic_ns();
        let mut mark = None;
        let mut passes = 0u32;
        let result = loop {
            if let Err(e) = floor.pass(&mut from, &mut to) {
                break Err(e);
            }
            // The clock only every 64 passes: a clock read in this VM
            // costs more than a pass (seen in `perf record`), and the
            // floor is the loop without overheads.
            passes = passes.wrapping_add(1);
            if !passes.is_multiple_of(64) {
                continue;
            }
            let now = clock::monotonic_ns();
            match mark {
                None if now >= start + warm => {
                    mark = Some((now, clock::thread_cpu_ns(), floor.moved()));
                }
                Some((t0, cpu0, moved0)) if now >= t0 + window => {
                    let cpu = clock::thread_cpu_ns() - cpu0;
                    break Ok((now - t0, cpu, floor.moved() - moved0));
                }
                _ => {}
            }
        };
        stop2.store(true, Ordering::Relaxed);
        result
    });
    // On a thread of its own: `drive` pins it.
    let frame = frame.to_vec();
    let driver = named("fwd-driver", move || {
        drive(app_cpu, &mut sender, &mut receiver, &frame, &stop)
    });
    let ring_full = driver
        .join()
        .map_err(|_| anyhow::anyhow!("the driver thread panicked"))?;
    let (ns, cpu, moved) = looped
        .join()
        .map_err(|_| anyhow::anyhow!("the floor thread panicked"))?
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok(Window {
        mpps: moved as f64 / ns.max(1) as f64 * 1e3,
        ns_per_packet: (moved > 0).then(|| cpu as f64 / moved as f64),
        ring_full,
    })
}

/// One round of forwarding: a fresh iokerneld on `iok_cpu` (with the
/// recording actuator, so its CPU may be a managed one), the sender and
/// the receiver registered as [`RawApp`]s; the window is iokerneld's own
/// (two stats resets).
fn forward_window(
    args: &ForwardArgs,
    frame: &[u8],
    iok_cpu: usize,
    app_cpu: usize,
) -> anyhow::Result<Window> {
    let dir = socket_dir("forward");
    let mut cfg = IokConfig::new(vec![iok_cpu, app_cpu]);
    cfg.socket = dir.join("iokerneld.sock");
    cfg.validate(&[iok_cpu, app_cpu])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let socket = cfg.socket.clone();
    // Pinned by the harness rather than by `own_core`: iokerneld's CPU is
    // also a managed core, which only the recording actuator makes harmless.
    let iokerneld = Recording::start(cfg, iok_cpu, dir)?;
    let result = forward_measured(args, frame, &socket, app_cpu);
    drop(iokerneld);
    result
}

fn forward_measured(
    args: &ForwardArgs,
    frame: &[u8],
    socket: &std::path::Path,
    app_cpu: usize,
) -> anyhow::Result<Window> {
    let mut sender = RawApp::register(socket, "fwd-sender", iface(SENDER), 1)
        .context("registering the sender")?;
    let mut receiver = RawApp::register(socket, "fwd-receiver", iface(RECEIVER), 1)
        .context("registering the receiver")?;
    sender.stay_busy(0);
    receiver.stay_busy(0);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let frame = frame.to_vec();
    let driver = named("fwd-driver", move || {
        drive(
            app_cpu,
            &mut sender.ends[0],
            &mut receiver.ends[0],
            &frame,
            &stop2,
        )
    });
    let received = |s: &StatsReport| {
        s.apps
            .iter()
            .find(|a| a.name == "fwd-receiver")
            .and_then(|a| a.net)
            .map_or(0, |n| n.rx)
    };
    std::thread::sleep(warm_up(args));
    // Each reset ends iokerneld's window: its length and loop CPU time are
    // iokerneld's own.
    let measured = client::reset_stats(socket).and_then(|before| {
        std::thread::sleep(Duration::from_millis(args.window_ms));
        client::reset_stats(socket).map(|after| (before, after))
    });
    stop.store(true, Ordering::Relaxed);
    let ring_full = driver
        .join()
        .map_err(|_| anyhow::anyhow!("the driver thread panicked"))?;
    let (before, after) = measured?;
    let packets = received(&after).saturating_sub(received(&before));
    Ok(Window {
        mpps: packets as f64 / after.alloc.window_ns.max(1) as f64 * 1e3,
        ns_per_packet: (packets > 0).then(|| after.alloc.window_cpu_ns as f64 / packets as f64),
        ring_full,
    })
}

fn render(r: &Report) -> String {
    let mut s = String::new();
    let list = |xs: &[f64]| {
        xs.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(
        s,
        "iokerneld forwarding, app → software switch → app, {}-byte frames, one spinning CPU,",
        r.frame_bytes
    );
    let _ = writeln!(
        s,
        "{} rounds of (copy floor, forwarding), medians:",
        r.forward_windows_mpps.len()
    );
    let _ = writeln!(
        s,
        "  copy_floor_mpps       {:>8.2}  ({})",
        r.copy_floor_mpps,
        list(&r.copy_floor_windows_mpps)
    );
    let _ = writeln!(
        s,
        "  forward_mpps          {:>8.2}  ({})",
        r.forward_mpps,
        list(&r.forward_windows_mpps)
    );
    let _ = writeln!(
        s,
        "  forward / floor       {:>8.2}  (median of the rounds' ratios)",
        r.forward_per_floor
    );
    let _ = writeln!(
        s,
        "  ns/packet             {:>8.0}  floor, {:.0} iokerneld (loop CPU time / packets)",
        r.copy_floor_ns_per_packet, r.iokernel_ns_per_packet
    );
    let _ = writeln!(
        s,
        "  Shenango's IOKernel (paper): 6.50 M packets/s NIC → runtimes"
    );
    match (&r.rtt_us, &r.rtt_backend) {
        (Some(p), Some(backend)) => {
            let _ = writeln!(
                s,
                "UDP round trip, Linux socket in a namespace → veth → echo server, \
                 {RTT_PAYLOAD}-byte payload, µs, medians of {} rounds:",
                r.rtt_rounds
            );
            let rows = [
                (format!("ginza ({backend})"), p.ginza, &p.ginza_p50s),
                (
                    format!("ginza spin {} µs", r.rtt_spin_us),
                    p.ginza_spin,
                    &p.ginza_spin_p50s,
                ),
                (
                    "ginza direct path".to_string(),
                    p.ginza_direct.unwrap_or(Rtt::NONE),
                    &p.ginza_direct_p50s,
                ),
                (
                    "ginza direct blocked".to_string(),
                    p.ginza_direct_blocked.unwrap_or(Rtt::NONE),
                    &p.ginza_direct_blocked_p50s,
                ),
                (
                    "linux blocking".to_string(),
                    p.linux_blocking,
                    &p.linux_blocking_p50s,
                ),
                (
                    "linux busy-poll".to_string(),
                    p.linux_busy_poll,
                    &p.linux_busy_poll_p50s,
                ),
            ];
            for (name, x, p50s) in rows {
                if p50s.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "  {name:<18} p50 {:>7.1}  p99 {:>7.1}  p99.9 {:>8.1}  over 1 ms {}  lost {}  (p50s {})",
                    x.p50,
                    x.p99,
                    x.p999,
                    x.over_1ms,
                    x.lost,
                    p50s.iter()
                        .map(|x| format!("{x:.1}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
            let _ = writeln!(
                s,
                "  p50 ratio ginza/linux {:.2} blocking, {:.2} busy-poll; ginza p99/p50 {:.2} \
                 (DLibOS: 6 µs one way vs 31 µs for Linux)",
                p.ginza.p50 / p.linux_blocking.p50,
                p.ginza.p50 / p.linux_busy_poll.p50,
                p.ginza.p99 / p.ginza.p50
            );
            if let (Some(d), Some(f)) = (p.ginza_direct, p.ginza_direct_frames) {
                let _ = writeln!(
                    s,
                    "  direct path: p50 {:.2}× busy-poll's; own sockets {} frames in, {} out; \
                     iokerneld's NIC {} in, {} out meanwhile",
                    d.p50 / p.linux_busy_poll.p50,
                    f.own_rx,
                    f.own_tx,
                    f.iokernel_nic_rx,
                    f.iokernel_nic_tx
                );
            }
            let _ = writeln!(
                s,
                "  client on CPU {} (Ginza) / {} (Linux); iokerneld on {}, servers on {}",
                p.client_cpu_ginza, p.client_cpu_linux, p.iokernel_cpu, p.server_cpu
            );
            for (name, spans) in [
                ("ginza", &p.ginza_spans),
                ("ginza spin", &p.ginza_spin_spans),
                ("ginza slowest 1 %", &p.ginza_tail_spans),
                ("ginza spin slowest 1 %", &p.ginza_spin_tail_spans),
            ] {
                if let Some(spans) = spans {
                    let _ = writeln!(s, "  {name:<22} spans µs: {}", spans.line());
                }
            }
        }
        _ => {
            let _ = writeln!(
                s,
                "UDP round trips skipped: {}",
                r.rtt_skipped.as_deref().unwrap_or("unknown reason")
            );
        }
    }
    let _ = writeln!(s, "build: {}", r.build);
    s
}

/// Round trips measured per round and server, after a warm-up.
const RTT_PINGS: usize = 2000;
const RTT_WARMUP: usize = 200;
const RTT_PAYLOAD: usize = 32;
const RTT_TIMEOUT: Duration = Duration::from_millis(100);
const ECHO_PORT: u16 = 7;
const GINZA_ECHO_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x02]);

#[derive(Serialize, Clone, Copy)]
struct Rtt {
    p50: f64,
    p99: f64,
    p999: f64,
    /// Answered round trips that took over 1 ms (all rounds).
    over_1ms: usize,
    /// Round trips without an answer within 100 ms (all rounds).
    lost: usize,
}

#[derive(Serialize)]
struct RttSet {
    /// The UDP echo on a Ginza runtime behind iokerneld (AF_XDP), the
    /// runtime's default spin window before parking.
    ginza: Rtt,
    /// The same with a spin window of `rtt_spin_us`: the kthread keeps
    /// its core and polls between requests instead of parking.
    ginza_spin: Rtt,
    /// The first as configured, on the direct path (docs/direct-path.md):
    /// its own AF_XDP socket on a queue (1 to 63) of the veth's host end, which
    /// iokerneld opens with `,direct`; null with `--rtt-no-direct`.
    ginza_direct: Option<Rtt>,
    /// Frames `ginza_direct`'s servers received and sent on their own
    /// sockets, and iokerneld's NIC meanwhile, over all rounds.
    ginza_direct_frames: Option<DirectFrames>,
    /// `ginza_direct` with `poll_while_idle` zero and `block_while_idle`:
    /// out of work, the kthread blocks in `poll` on its own socket at once,
    /// keeping its core; null with `--rtt-no-direct`.
    ginza_direct_blocked: Option<Rtt>,
    ginza_direct_blocked_frames: Option<DirectFrames>,
    /// The kernel's UDP echo: a thread blocked in `recv_from`, unpinned.
    linux_blocking: Rtt,
    /// The kernel's UDP echo, busy-polling: a non-blocking socket spinning
    /// on `recv_from` on a thread pinned to the CPU Ginza's server uses.
    linux_busy_poll: Rtt,
    /// Each round's p50, µs, in the order measured.
    ginza_p50s: Vec<f64>,
    ginza_spin_p50s: Vec<f64>,
    ginza_direct_p50s: Vec<f64>,
    ginza_direct_blocked_p50s: Vec<f64>,
    linux_blocking_p50s: Vec<f64>,
    linux_busy_poll_p50s: Vec<f64>,
    /// Where `ginza`'s round trips spent their time, hop by hop (TSC
    /// stamps, `rtt_spans`, in a stamped series after each round's
    /// unstamped one): the medians of the rounds'; null where the TSC
    /// cannot be compared across CPUs.
    ginza_spans: Option<Spans>,
    ginza_spin_spans: Option<Spans>,
    /// Each round's spans, in the order measured.
    ginza_spans_rounds: Vec<Spans>,
    ginza_spin_spans_rounds: Vec<Spans>,
    /// The same over each round's slowest 1 % of round trips (where the
    /// p99's time went), medians of the rounds'.
    ginza_tail_spans: Option<Spans>,
    ginza_spin_tail_spans: Option<Spans>,
    /// The CPU the client ran on against Ginza's servers and against the
    /// kernel's (`--rtt-client-cpu`; against `ginza_direct` as against the
    /// kernel's, whose server thread also sends its own replies), and the
    /// CPUs of iokerneld and of the servers (Ginza's kthread; the
    /// busy-polling Linux thread).
    client_cpu_ginza: usize,
    client_cpu_linux: usize,
    iokernel_cpu: usize,
    server_cpu: usize,
}

impl Rtt {
    /// No figures (a series not measured).
    const NONE: Rtt = Rtt {
        p50: f64::NAN,
        p99: f64::NAN,
        p999: f64::NAN,
        over_1ms: 0,
        lost: 0,
    };
}

/// How the kernel's echo server waits.
#[derive(Clone, Copy, PartialEq)]
enum LinuxServer {
    Blocking,
    BusyPoll { cpu: usize },
}

/// Rounds of (Ginza, Linux blocking, Linux busy-polling, Ginza spinning),
/// medians of the rounds' p50 and p99, and Ginza's spans.
fn rtt_rounds(
    ns: &NetNs,
    args: &ForwardArgs,
    cpus: &[usize],
    iok_cpu: usize,
    app_cpu: usize,
) -> anyhow::Result<(String, RttSet)> {
    // While iokerneld's XDP program is attached the kernel sees none of
    // the frames, so the address can stay for the whole run.
    let host = ns
        .add_host_address(3)
        .with_context(|| format!("a Linux address on {}", ns.host_if))?;
    let linux_ip = host.ip;
    let (ginza_client, linux_client) = args.rtt_client_cpu.of(cpus, iok_cpu, app_cpu);
    let ticks_per_us = hops::ticks_per_us(Duration::from_millis(20));
    hops::enable(true);
    let spans = |stamps: &[Stamps]| Spans::of_round(stamps, ticks_per_us);
    let tail = |stamps: &[Stamps]| Spans::of_slowest(stamps, ticks_per_us, 1.0);
    let (mut ginza_tail, mut ginza_spin_tail) = (Vec::new(), Vec::new());
    let mut backend = String::new();
    let (mut ginza, mut blocking, mut busy) = (Vec::new(), Vec::new(), Vec::new());
    let mut ginza_spin = Vec::new();
    let (mut direct, mut direct_frames) = (Vec::new(), DirectFrames::default());
    let (mut blocked, mut blocked_frames) = (Vec::new(), DirectFrames::default());
    let server_cpus = Cpus {
        iokernel: iok_cpu,
        app: app_cpu,
    };
    let (mut ginza_spans, mut ginza_spin_spans) = (Vec::new(), Vec::new());
    let spin = Duration::from_micros(args.rtt_spin_us);
    let mut dump = Dump::open(args.rtt_dump.as_deref(), ticks_per_us)?;
    let result = (|| -> anyhow::Result<()> {
        for round in 0..args.rtt_rounds {
            let (b, (rtt, trips)) = ginza_rtt(ns, args, server_cpus, ginza_client, None)
                .context("the Ginza UDP echo over veth")?;
            dump.round("ginza", round, &trips)?;
            let stamps = stamps_of(&trips);
            backend = b;
            ginza.push(rtt);
            ginza_spans.extend(spans(&stamps));
            ginza_tail.extend(tail(&stamps));
            if !args.rtt_no_direct {
                // Placed as Linux's client: on the direct path the server's
                // kthread puts its replies on the link itself, as Linux's
                // server thread does (`ClientCpu`).
                let ((rtt, trips), frames) =
                    ginza_direct_rtt(ns, args, server_cpus, linux_client, false)
                        .context("the Ginza UDP echo on the direct path over veth")?;
                dump.round("ginza_direct", round, &trips)?;
                direct.push(rtt);
                direct_frames = direct_frames.add(frames);
                let ((rtt, trips), frames) =
                    ginza_direct_rtt(ns, args, server_cpus, linux_client, true).context(
                        "the Ginza UDP echo on the direct path over veth, blocked while idle",
                    )?;
                dump.round("ginza_direct_blocked", round, &trips)?;
                blocked.push(rtt);
                blocked_frames = blocked_frames.add(frames);
            }
            let (rtt, trips) = linux_rtt(
                ns,
                linux_ip,
                LinuxServer::Blocking,
                linux_client,
                args.rtt_client,
            )
            .context("the Linux UDP echo (blocking) over veth")?;
            dump.round("linux_blocking", round, &trips)?;
            blocking.push(rtt);
            let (rtt, trips) = linux_rtt(
                ns,
                linux_ip,
                LinuxServer::BusyPoll { cpu: app_cpu },
                linux_client,
                args.rtt_client,
            )
            .context("the Linux UDP echo (busy-polling) over veth")?;
            dump.round("linux_busy_poll", round, &trips)?;
            busy.push(rtt);
            let (_, (rtt, trips)) = ginza_rtt(ns, args, server_cpus, ginza_client, Some(spin))
                .context("the Ginza UDP echo (spinning) over veth")?;
            dump.round("ginza_spin", round, &trips)?;
            let stamps = stamps_of(&trips);
            ginza_spin.push(rtt);
            ginza_spin_spans.extend(spans(&stamps));
            ginza_spin_tail.extend(tail(&stamps));
        }
        Ok(())
    })();
    hops::enable(false);
    drop(host);
    result?;
    let combine = |rounds: &[Rtt]| {
        let m = |f: fn(&Rtt) -> f64| {
            median(&rounds.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
        };
        Rtt {
            p50: m(|r| r.p50),
            p99: m(|r| r.p99),
            p999: m(|r| r.p999),
            over_1ms: rounds.iter().map(|r| r.over_1ms).sum(),
            lost: rounds.iter().map(|r| r.lost).sum(),
        }
    };
    let p50s = |rounds: &[Rtt]| rounds.iter().map(|r| r.p50).collect::<Vec<_>>();
    Ok((
        backend,
        RttSet {
            ginza: combine(&ginza),
            ginza_spin: combine(&ginza_spin),
            ginza_direct: (!direct.is_empty()).then(|| combine(&direct)),
            ginza_direct_frames: (!direct.is_empty()).then_some(direct_frames),
            ginza_direct_blocked: (!blocked.is_empty()).then(|| combine(&blocked)),
            ginza_direct_blocked_frames: (!blocked.is_empty()).then_some(blocked_frames),
            linux_blocking: combine(&blocking),
            linux_busy_poll: combine(&busy),
            ginza_p50s: p50s(&ginza),
            ginza_spin_p50s: p50s(&ginza_spin),
            ginza_direct_p50s: p50s(&direct),
            ginza_direct_blocked_p50s: p50s(&blocked),
            linux_blocking_p50s: p50s(&blocking),
            linux_busy_poll_p50s: p50s(&busy),
            ginza_spans: Spans::median_of(&ginza_spans),
            ginza_spin_spans: Spans::median_of(&ginza_spin_spans),
            ginza_spans_rounds: ginza_spans,
            ginza_spin_spans_rounds: ginza_spin_spans,
            ginza_tail_spans: Spans::median_of(&ginza_tail),
            ginza_spin_tail_spans: Spans::median_of(&ginza_spin_tail),
            client_cpu_ginza: ginza_client,
            client_cpu_linux: linux_client,
            iokernel_cpu: iok_cpu,
            server_cpu: app_cpu,
        },
    ))
}

/// How the client waits for each answer.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Client {
    /// Blocked in `recv` (its CPU may halt between datagrams).
    Blocking,
    /// Polling a non-blocking socket, yielding its CPU between polls:
    /// its CPU never halts, and a server thread woken there runs at once.
    Polling,
}

/// A probe's figures and each measured round trip.
type Probed = (Rtt, Vec<Trip>);

/// One round trip's outcome: its time if answered, and the hops' TSC
/// stamps ([`hops`], all 0 while stamping is off).
type Trip = (Option<Duration>, Stamps);

/// Round trips of `count` datagrams from a fresh socket on `bind` to
/// `target`, one at a time, waiting as `client` says; a datagram
/// unanswered within [`RTT_TIMEOUT`] counts as lost. Late replies to
/// earlier datagrams are skipped.
fn ping_pong(
    bind: SocketAddrV4,
    target: SocketAddrV4,
    count: usize,
    client: Client,
) -> std::io::Result<Vec<Trip>> {
    let socket = std::net::UdpSocket::bind(bind)?;
    socket.connect(target)?;
    match client {
        Client::Blocking => socket.set_read_timeout(Some(RTT_TIMEOUT))?,
        Client::Polling => socket.set_nonblocking(true)?,
    }
    let mut payload = [0u8; RTT_PAYLOAD];
    let mut reply = [0u8; 2048];
    let mut trips = Vec::with_capacity(count);
    for sequence in 0..count as u64 {
        payload[..8].copy_from_slice(&sequence.to_le_bytes());
        hops::begin();
        let start = Instant::now();
        socket.send(&payload)?;
        let mut rtt = None;
        while start.elapsed() < RTT_TIMEOUT {
            match socket.recv(&mut reply) {
                Ok(len) if len >= 8 && reply[..8] == sequence.to_le_bytes() => {
                    rtt = Some(start.elapsed());
                    hops::stamp(Hop::ClientRecv);
                    break;
                }
                Ok(_) => {}
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock && client == Client::Polling =>
                {
                    std::thread::yield_now()
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                Err(e) => return Err(e),
            }
        }
        trips.push((rtt, hops::current()));
    }
    Ok(trips)
}

/// p50/p99 in µs of the answered round trips.
fn summarize(trips: &[Trip]) -> Rtt {
    let mut ns: Vec<u64> = trips
        .iter()
        .filter_map(|t| t.0)
        .map(|d| d.as_nanos() as u64)
        .collect();
    ns.sort_unstable();
    let us = |q| percentile(&ns, q).map_or(f64::NAN, |v| v as f64 / 1e3);
    Rtt {
        p50: us(50.0),
        p99: us(99.0),
        p999: us(99.9),
        over_1ms: ns.iter().filter(|&&t| t > 1_000_000).count(),
        lost: trips.len() - ns.len(),
    }
}

/// Ping-pongs from a Linux UDP socket in the namespace, on a thread
/// pinned to `client_cpu`, to `target`: warm-up, then the measured ones,
/// and each measured one's hop stamps.
fn probe(
    ns: &NetNs,
    target: Ipv4Addr,
    client_cpu: usize,
    client: Client,
) -> anyhow::Result<Probed> {
    let bind = SocketAddrV4::new(ns.ns_ip, 0);
    let target = SocketAddrV4::new(target, ECHO_PORT);
    let trips = ns.run_in(move || -> std::io::Result<Vec<Trip>> {
        ginza_sys::affinity::pin_current_thread(client_cpu)?;
        ping_pong(bind, target, RTT_WARMUP, client)?;
        ping_pong(bind, target, RTT_PINGS, client)
    })??;
    let rtt = summarize(&trips);
    anyhow::ensure!(
        rtt.lost < RTT_PINGS / 2,
        "{} of {RTT_PINGS} round trips to {target} unanswered",
        rtt.lost
    );
    Ok((rtt, trips))
}

/// The trips' hop stamps.
fn stamps_of(trips: &[Trip]) -> Vec<Stamps> {
    trips.iter().map(|t| t.1).collect()
}

/// `--rtt-dump`: every measured round trip as a JSON line, after a first
/// line with the stamps' rate; a (stamp, CLOCK_MONOTONIC) pair before
/// each round.
struct Dump(Option<std::io::BufWriter<std::fs::File>>);

impl Dump {
    fn open(path: Option<&std::path::Path>, ticks_per_us: f64) -> anyhow::Result<Dump> {
        let Some(path) = path else {
            return Ok(Dump(None));
        };
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        let (stamp, monotonic_ns) = (hops::now(), clock::monotonic_ns());
        let header = serde_json::json!({
            "ticks_per_us": ticks_per_us,
            "stamp": stamp,
            "monotonic_ns": monotonic_ns,
            "hops": (0..hops::HOPS).map(hop_name).collect::<Vec<_>>(),
        });
        std::io::Write::write_all(&mut out, format!("{header}\n").as_bytes())?;
        Ok(Dump(Some(out)))
    }

    fn round(&mut self, server: &str, round: u32, trips: &[Trip]) -> anyhow::Result<()> {
        let Some(out) = &mut self.0 else {
            return Ok(());
        };
        let anchor =
            serde_json::json!({"stamp": hops::now(), "monotonic_ns": clock::monotonic_ns()});
        std::io::Write::write_all(out, format!("{anchor}\n").as_bytes())?;
        for (rtt, stamps) in trips {
            let line = serde_json::json!({
                "server": server,
                "round": round,
                "us": rtt.map(|d| d.as_nanos() as f64 / 1e3),
                "stamps": stamps,
            });
            std::io::Write::write_all(out, format!("{line}\n").as_bytes())?;
        }
        std::io::Write::flush(out)?;
        Ok(())
    }
}

/// The name of hop number `i` ([`Hop`]'s order).
fn hop_name(i: usize) -> &'static str {
    Hop::UDP_ECHO
        .iter()
        .chain(Hop::PROTECTED.iter())
        .chain(Hop::FIRST_REQUEST.iter())
        .chain(Hop::TCP_ECHO.iter())
        .find(|h| **h as usize == i)
        .map_or("?", |h| h.name())
}

/// The kernel's UDP echo on the root namespace's end of the veth, which
/// has `ip` for the run.
fn linux_rtt(
    ns: &NetNs,
    ip: Ipv4Addr,
    server: LinuxServer,
    client_cpu: usize,
    client: Client,
) -> anyhow::Result<Probed> {
    let socket = std::net::UdpSocket::bind(SocketAddrV4::new(ip, ECHO_PORT))?;
    match server {
        LinuxServer::Blocking => socket.set_read_timeout(Some(Duration::from_millis(20)))?,
        LinuxServer::BusyPoll { .. } => socket.set_nonblocking(true)?,
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = named("linux-echo", move || -> std::io::Result<()> {
        if let LinuxServer::BusyPoll { cpu } = server {
            ginza_sys::affinity::pin_current_thread(cpu)?;
        }
        let mut buf = [0u8; 2048];
        while !stop2.load(Ordering::Relaxed) {
            match socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let _ = socket.send_to(&buf[..n], from);
                }
                Err(_) if server != LinuxServer::Blocking => std::hint::spin_loop(),
                Err(_) => {}
            }
        }
        Ok(())
    });
    let rtt = probe(ns, ip, client_cpu, client);
    stop.store(true, Ordering::Relaxed);
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    rtt
}

/// iokerneld's configuration for the Ginza round trips (`--rtt-no-yield`,
/// `--rtt-iokernel-sleep`), on either path.
fn configure_iokerneld(args: &ForwardArgs, cfg: &mut IokConfig) -> anyhow::Result<()> {
    cfg.yield_after_nic_tx = !args.rtt_no_yield;
    cfg.spin = !args.rtt_iokernel_sleep;
    if let Some(w) = args.self_wake {
        cfg.self_wake = w;
    }
    if let Some(y) = args.idle_yield {
        cfg.yield_while_idle = y;
    }
    Ok(())
}

/// The UDP echo server on a Ginza runtime behind iokerneld driving the same veth
/// end (AF_XDP, else AF_PACKET), with the runtime's spin window before
/// parking or `spin`: returns the backend used, the RTT figures of
/// unstamped round trips and the trips of a stamped series after them.
fn ginza_rtt(
    ns: &NetNs,
    args: &ForwardArgs,
    cpus: Cpus,
    client_cpu: usize,
    spin: Option<Duration>,
) -> anyhow::Result<(String, Probed)> {
    let configure = |cfg: &mut IokConfig| configure_iokerneld(args, cfg);
    with_iokerneld_on_veth(ns, cpus, configure, |iokerneld, _| {
        serve_and_probe(iokerneld, ns, args, client_cpu, spin, None).map(|(probed, _)| probed)
    })
}

/// The same server as configured by default, on the direct path: its own
/// AF_XDP socket on a queue of its own, iokerneld on `af_xdp:IF,direct`. An error
/// unless its own socket carried the measured round trips. No stamped
/// series: iokerneld sees none of the frames, so most hops have no stamp.
/// `blocked`: its idle kthread blocks on its own socket at once
/// (`block_while_idle`, `poll_while_idle` zero).
fn ginza_direct_rtt(
    ns: &NetNs,
    args: &ForwardArgs,
    cpus: Cpus,
    client_cpu: usize,
    blocked: bool,
) -> anyhow::Result<(Probed, DirectFrames)> {
    let configure = |cfg: &mut IokConfig| configure_iokerneld(args, cfg);
    direct::with_iokerneld_direct(ns, cpus, configure, |iokerneld, queue| {
        let direct = Some(DirectServer { queue, blocked });
        let (probed, frames) = serve_and_probe(iokerneld, ns, args, client_cpu, None, direct)?;
        let frames = frames.context("the direct-path server's counts")?;
        frames.check(RTT_PINGS as u64)?;
        Ok((probed, frames))
    })
}

/// A server on the direct path: its own socket's queue, and whether its
/// idle kthread blocks on it at once.
#[derive(Clone, Copy)]
struct DirectServer {
    queue: u32,
    blocked: bool,
}

/// The echo server on `iokerneld` (on its own socket, if `direct`),
/// probed from the namespace; with `direct`, where its frames went.
fn serve_and_probe(
    iokerneld: &InProcess,
    ns: &NetNs,
    args: &ForwardArgs,
    client_cpu: usize,
    spin: Option<Duration>,
    direct: Option<DirectServer>,
) -> anyhow::Result<(Probed, Option<DirectFrames>)> {
    let client = args.rtt_client;
    let tune = |config: &mut RtConfig| {
        if let Some(spin) = spin {
            config.spin_before_park = spin;
        }
        if let Some(io) = config.iokernel.as_mut() {
            io.poll_while_idle = if args.rtt_park {
                Duration::ZERO
            } else {
                ginza_runtime::POLL_WHILE_IDLE
            };
        }
        if let Some(d) = direct {
            direct::enable(config, ns, d.queue, false);
            if let (true, Some(io)) = (d.blocked, config.iokernel.as_mut()) {
                io.poll_while_idle = Duration::ZERO;
                io.block_while_idle = true;
            }
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    // The echo answers in the uthread that received, as the kernel's
    // echo threads do (a uthread per request would not be like with
    // like).
    let (s2, stats) = (stop.clone(), Arc::new(EchoStats::default()));
    let mut server = App::start_tuned(
        iokerneld,
        "rtt-echo",
        (GINZA_ECHO_MAC, ns.peer_ip),
        tune,
        move || {
            let served = echo_server::serve_udp(ECHO_PORT, s2, stats);
            (served, ginza_runtime::net::stats())
        },
    )?;
    // Where its frames went (the direct path): iokerneld's NIC counts
    // before and after.
    let before = if direct.is_some() {
        Some(iokerneld.stats()?)
    } else {
        None
    };
    // The server's kthread runs on `app_cpu` and iokerneld spins on
    // `iok_cpu`: on two CPUs the client shares one of them
    // (`ClientCpu`).
    // The figure comes from round trips with stamping off: each stamp
    // moves a cache line shared by the parties, a cost the Linux rounds
    // (stamped by their client alone, outside the timed span) do not
    // pay. The spans come from a stamped series next, on the same server.
    let stamping = hops::enabled();
    hops::enable(false);
    let unstamped = probe(ns, ns.peer_ip, client_cpu, client);
    hops::enable(stamping);
    let rtt = match unstamped {
        Ok((figure, _)) if stamping && direct.is_none() => {
            probe(ns, ns.peer_ip, client_cpu, client).map(|(_, stamped)| (figure, stamped))
        }
        other => other,
    };
    let after = before.as_ref().map(|_| iokerneld.stats());
    stop.store(true, Ordering::Relaxed);
    let (served, net) = server.join()?;
    let rtt = rtt?;
    served.context("the Ginza echo server")?;
    let frames = match (before, after) {
        (Some(before), Some(after)) => Some(DirectFrames::of(net.as_ref(), &before, &after?)?),
        _ => None,
    };
    Ok((rtt, frames))
}
