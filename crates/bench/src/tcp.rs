//! `ginza bench tcp`: Ginza's TCP next to Linux's, in one run.
//!
//! Over a veth pair whose far end is in a network namespace (as
//! `ginza bench forward`), with a Linux client in the namespace:
//!
//! * `rtt_us`: 64-byte requests answered by their echo, one at a time on
//!   one persistent connection (`TCP_NODELAY`), for `--duration` after a
//!   warm-up, to three servers at the veth's host end: `echo-server` on a
//!   Ginza runtime behind iokerneld (AF_XDP, else AF_PACKET; iokerneld on
//!   the first CPU, the application's kthread on the second); a Linux echo
//!   server (a thread per connection blocked in `read`); and a Linux echo
//!   server busy-polling non-blocking sockets, pinned to the second CPU
//!   (the strongest kernel peer). The Linux servers listen on an address
//!   given to the host end for their turn (iokerneld is not attached then).
//! * `stream_mbps`: `--stream-mb` MiB sent one way from the namespace to a
//!   sink at the host end (Ginza's or a Linux thread's), which answers with
//!   the count and content hash of what it got; Mbit/s from connect to
//!   receipt.
//! * `switch_rtt_us`: the same round trips between two Ginza runtimes
//!   through iokerneld's software switch (no NIC).
//! * `lossy`: `--lossy-mb` MiB from the namespace to Ginza's sink while
//!   iokerneld drops 5 % of the frames on the veth port and reorders 5 %:
//!   bytes, whether they arrived intact (count and hash), seconds, and
//!   Ginza's TCP counters (SACK blocks sent and taken, retransmissions).
//!   `lossy_reverse`: the same from a Ginza client to a Linux sink in the
//!   namespace (Ginza is the sender). `--no-sack` turns SACK off in
//!   Ginza's TCP, for the comparison; `--no-burst-answer` makes it answer
//!   every segment as it comes instead of once per receive burst.
//! * `rtt_us.ginza_direct`, `stream_mbps.ginza_direct`: the same to
//!   Ginza's servers on the direct path (unless `--no-direct`): their own
//!   AF_XDP socket on a queue (1 to 63) of a 64-queue veth, iokerneld on
//!   `af_xdp:IF,direct` (`harness::direct`, docs/direct-path.md); each
//!   round checks that their own socket carried the round trips.
//!
//! * The Ginza servers over veth poll while idle (`poll_while_idle` =
//!   `POLL_WHILE_IDLE`, docs/idle-poll.md: out of work, the kthread keeps
//!   its core while nobody else wants it), as `ginza bench forward`'s;
//!   `--park` makes them park at once (each request then waits for a
//!   grant and the kthread's wake).
//! * `phases`: where each server's round trip goes, hop by hop
//!   ([`Hop::TCP_ECHO`], [`crate::hop_spans`]): after each measured series
//!   a second one of half its length with hop stamps on (the client's send
//!   and receive, the runtime taking the frame, the server's read and
//!   write, the runtime's segment out, the transmit kick; a Linux server
//!   stamps its read and write only), medians over every round's stamped
//!   round trips.
//!
//! * The round-trip client is pinned as `--client-cpu` says (the choice
//!   of `ginza bench forward --rtt-client-cpu`): on two CPUs by default
//!   beside the thread that puts the replies on the link, iokerneld for
//!   Ginza, the server thread for Linux and for Ginza's direct path. Left
//!   to the kernel, the client of the busy-polling Linux server ran on the
//!   other CPU and every reply woke it there (p50 36 against 22 µs,
//!   docs/results.md, "Session 25").
//!
//! Rounds are interleaved (Ginza, Ginza direct, Linux, Linux busy-poll,
//! switch; again…) so that drifts of the machine hit every server alike;
//! each figure is the median over `--rounds` rounds of that round's value (p50 and p99 are
//! medians of per-round percentiles). Without root, `ip` or `ethtool` the
//! veth figures are null and `veth_skipped` says why.

use std::fmt::Write as _;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use ginza_apps::echo_client;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::netns::tcp::{self as linux, ClientWait, EchoMode, LinuxServer};
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::{Ipv4Addr, MacAddr};
use ginza_proto::content::Transfer;
use ginza_proto::parse_duration;
use ginza_runtime::net::NetStats;
use ginza_sys::hops::{self, Hop, Stamps};
use serde::Serialize;

use crate::harness::app::App;
use crate::harness::build_kind;
use crate::harness::client_cpu::ClientCpu;
use crate::harness::direct::{self, DirectFrames};
use crate::harness::figures::{allowed_cpus, emit, median};
use crate::harness::iokerneld::{set_faults, start_on, with_iokerneld_on_veth, Cpus};
use crate::harness::rtt::{quantiles, retry_refused, Quantiles, IO_TIMEOUT, PAYLOAD, WARMUP};
use crate::hop_spans::{self, HopSpan};

/// Arguments of `ginza bench tcp`.
#[derive(clap::Args, Debug)]
pub struct TcpArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Interleaved rounds; each figure is the median over them.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Length of one round-trip series (after its warm-up), e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    duration: Duration,
    /// MiB sent one way per round for `stream_mbps`.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    stream_mb: u64,
    /// MiB sent through 5 % loss for `lossy` (once each way).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    lossy_mb: u64,
    /// Ginza's TCP without SACK (RFC 2018; on by default), to compare.
    #[arg(long)]
    no_sack: bool,
    /// Ginza's TCP answering every segment as it comes, not once per
    /// receive burst (on by default), to compare.
    #[arg(long)]
    no_burst_answer: bool,
    /// The Ginza servers' kthread parks when idle instead of polling
    /// (`poll_while_idle` = 0: the behaviour before idle polling,
    /// docs/idle-poll.md), as `ginza bench forward --rtt-park`.
    #[arg(long)]
    park: bool,
    /// Where the round-trip client (in the namespace) runs, as `ginza
    /// bench forward --rtt-client-cpu`: by default, on two CPUs, beside
    /// the thread that puts the replies on the link (iokerneld for Ginza,
    /// the server thread for Linux and for Ginza's direct path).
    #[arg(long, value_enum, default_value_t = ClientCpu::Auto)]
    client_cpu: ClientCpu,
    /// No round trips and stream to Ginza's servers on the direct path
    /// (their own AF_XDP socket; `rtt_us.ginza_direct`,
    /// `stream_mbps.ginza_direct`; docs/direct-path.md).
    #[arg(long)]
    no_direct: bool,
}

/// The same through loss: retransmission timeouts back off (200 ms,
/// 400 ms, …) when a segment is lost again and again.
const LOSSY_IO_TIMEOUT: Duration = Duration::from_secs(60);
const ECHO_PORT: u16 = 7;
const SINK_PORT: u16 = 9;
/// The host end's address for the Linux servers' turns (`.3`).
const LINUX_HOST_OCTET: u8 = 3;
/// Frames iokerneld drops on the veth port in the lossy run.
const LOSS_PCT: u32 = 5;
const GINZA_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x12]);
const SWITCH_SERVER: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x12, 0x01]),
    Ipv4Addr::new(10, 47, 12, 1),
);
const SWITCH_CLIENT: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x12, 0x02]),
    Ipv4Addr::new(10, 47, 12, 2),
);

#[derive(Serialize, Debug)]
struct RttSet {
    ginza: Quantiles,
    /// Ginza's servers on the direct path; null with `--no-direct`.
    ginza_direct: Option<Quantiles>,
    linux: Quantiles,
    linux_busy_poll: Quantiles,
}

#[derive(Serialize, Debug)]
struct StreamSet {
    ginza: f64,
    ginza_direct: Option<f64>,
    linux: f64,
}

#[derive(Serialize, Debug)]
struct Lossy {
    /// `linux_to_ginza` or `ginza_to_linux`.
    direction: &'static str,
    loss_pct: u32,
    bytes: u64,
    intact: bool,
    seconds: f64,
    /// Frames iokerneld dropped and reordered on the veth port (both
    /// directions).
    frames_dropped: u64,
    frames_reordered: u64,
    /// Ginza's TCP counters at the end of the run.
    ginza_tcp: Option<GinzaTcp>,
}

/// Ginza's TCP counters that tell how loss was recovered.
#[derive(Serialize, Debug)]
struct GinzaTcp {
    sack: bool,
    retransmissions: u64,
    sack_blocks_sent: u64,
    sack_blocks_received: u64,
    sack_retransmissions: u64,
    paws_drops: u64,
}

impl GinzaTcp {
    fn of(sack: bool, s: &ginza_runtime::net::TcpStats) -> GinzaTcp {
        GinzaTcp {
            sack,
            retransmissions: s.retransmissions,
            sack_blocks_sent: s.sack_blocks_sent,
            sack_blocks_received: s.sack_blocks_received,
            sack_retransmissions: s.sack_retransmissions,
            paws_drops: s.paws_drops,
        }
    }
}

/// One round's values, for the record.
#[derive(Serialize, Debug, Default)]
struct Round {
    ginza: Option<Quantiles>,
    ginza_direct: Option<Quantiles>,
    linux: Option<Quantiles>,
    linux_busy_poll: Option<Quantiles>,
    switch: Option<Quantiles>,
    stream_ginza_mbps: Option<f64>,
    stream_ginza_direct_mbps: Option<f64>,
    stream_linux_mbps: Option<f64>,
    /// Frames the direct-path servers received and sent on their own
    /// socket, and iokerneld's NIC meanwhile.
    ginza_direct_frames: Option<DirectFrames>,
    /// The stamped round trips of each server (for `phases`).
    #[serde(skip)]
    stamps: Stamped,
}

/// The stamped series' round trips, per server.
#[derive(Debug, Default)]
struct Stamped {
    ginza: Vec<Stamps>,
    ginza_direct: Vec<Stamps>,
    linux: Vec<Stamps>,
    linux_busy_poll: Vec<Stamps>,
}

/// Where each server's round trip goes, over every round's stamped
/// series.
#[derive(Serialize, Debug)]
struct Phases {
    ginza: ServerPhases,
    ginza_direct: ServerPhases,
    linux: ServerPhases,
    linux_busy_poll: ServerPhases,
}

/// One server's phases: each hop's span from the hop before it that the
/// round trips passed ([`Hop::TCP_ECHO`]), medians, µs; over all the
/// stamped round trips and over their slower half (the spans' medians
/// need not add up to the round trip's when its times have two modes).
#[derive(Serialize, Debug, Default)]
struct ServerPhases {
    /// The stamped round trips' median, µs.
    round_trip_p50: Option<f64>,
    /// The transmit kick's call (`kick` → `kicked`), median µs, over the
    /// round trips where it returned before the client had the answer
    /// (on a veth the call runs the peer's receive and the client's
    /// wake-up); `None` where no kick was stamped (Linux).
    kick_call: Option<f64>,
    all: Vec<HopSpan>,
    slower_half: Vec<HopSpan>,
}

impl ServerPhases {
    fn of(trips: &[Stamps], ticks_per_us: f64) -> ServerPhases {
        let total = |s: &Stamps| {
            let (a, b) = (s[Hop::ClientSend as usize], s[Hop::ClientRecv as usize]);
            (a != 0 && b >= a).then(|| b - a)
        };
        let mut answered: Vec<Stamps> = trips
            .iter()
            .filter(|s| total(s).is_some())
            .copied()
            .collect();
        answered.sort_by_key(total);
        let totals: Vec<f64> = answered
            .iter()
            .filter_map(|s| Some(total(s)? as f64 / ticks_per_us))
            .collect();
        let calls: Vec<f64> = trips
            .iter()
            .filter_map(|s| {
                let (k, kd, r) = (
                    s[Hop::Kick as usize],
                    s[Hop::Kicked as usize],
                    s[Hop::ClientRecv as usize],
                );
                (k != 0 && kd >= k && kd <= r).then(|| (kd - k) as f64 / ticks_per_us)
            })
            .collect();
        ServerPhases {
            round_trip_p50: median(&totals),
            kick_call: median(&calls),
            all: hop_spans::median_spans(&Hop::TCP_ECHO, trips, ticks_per_us),
            slower_half: hop_spans::median_spans(
                &Hop::TCP_ECHO,
                &answered[answered.len() / 2..],
                ticks_per_us,
            ),
        }
    }
}

#[derive(Serialize, Debug)]
struct Report {
    rtt_us: Option<RttSet>,
    stream_mbps: Option<StreamSet>,
    switch_rtt_us: Option<Quantiles>,
    /// Null without the veth.
    phases: Option<Phases>,
    lossy: Option<Lossy>,
    lossy_reverse: Option<Lossy>,
    /// `--client-cpu`, and the CPUs the round-trip client got against
    /// Ginza's switch path and against the kernel's servers and Ginza's
    /// direct path.
    client_cpu: String,
    client_cpu_ginza: usize,
    client_cpu_linux: usize,
    /// The NIC backend Ginza's veth figures went through.
    backend: Option<String>,
    payload_bytes: usize,
    rounds: Vec<Round>,
    /// Why the veth figures are null.
    veth_skipped: Option<String>,
    /// Why `lossy` is null (its transfer failed).
    lossy_error: Option<String>,
    lossy_reverse_error: Option<String>,
    /// How this binary was built ([`build_kind`]).
    build: &'static str,
}

pub fn run(args: TcpArgs) -> anyhow::Result<()> {
    let allowed = allowed_cpus()?;
    anyhow::ensure!(
        allowed.len() >= 2,
        "ginza bench tcp needs two CPUs (iokerneld and the applications), this process may use {allowed:?}"
    );
    let cpus = Cpus {
        iokernel: allowed[0],
        app: allowed[1],
    };
    let (ginza_client, linux_client) = args.client_cpu.of(&allowed, cpus.iokernel, cpus.app);
    let ns = if args.no_direct {
        NetNs::create()
    } else {
        direct::namespace()
    };
    let veth_skipped = ns.as_ref().err().map(|e| e.to_string());
    let ticks_per_us = hops::ticks_per_us(Duration::from_millis(20));
    let mut rounds = Vec::new();
    let mut backend = None;
    for round in 0..args.rounds {
        let mut r = Round::default();
        if let Ok(ns) = &ns {
            let g = ginza_round(ns, cpus, &args, false, ginza_client)
                .with_context(|| format!("round {round}: Ginza over veth"))?;
            backend = Some(g.backend);
            r.ginza = Some(g.rtt);
            r.stream_ginza_mbps = g.mbps;
            r.stamps.ginza = g.stamps;
            if !args.no_direct {
                let g = ginza_round(ns, cpus, &args, true, linux_client).with_context(|| {
                    format!("round {round}: Ginza on the direct path over veth")
                })?;
                r.ginza_direct = Some(g.rtt);
                r.stream_ginza_direct_mbps = g.mbps;
                r.ginza_direct_frames = g.frames;
                r.stamps.ginza_direct = g.stamps;
            }
            let (rtt, mbps, stamps) = linux_round(ns, &args, EchoMode::Blocking, linux_client)
                .with_context(|| format!("round {round}: Linux over veth"))?;
            r.linux = Some(rtt);
            r.stream_linux_mbps = mbps;
            r.stamps.linux = stamps;
            let (rtt, _, stamps) = linux_round(
                ns,
                &args,
                EchoMode::BusyPoll {
                    cpu: Some(cpus.app),
                },
                linux_client,
            )
            .with_context(|| format!("round {round}: Linux busy-polling over veth"))?;
            r.linux_busy_poll = Some(rtt);
            r.stamps.linux_busy_poll = stamps;
        }
        r.switch = Some(
            switch_round(cpus, &args)
                .with_context(|| format!("round {round}: Ginza ⇄ Ginza through the switch"))?,
        );
        rounds.push(r);
    }
    let (lossy, lossy_error) = match &ns {
        Err(_) => (None, None),
        Ok(ns) => split(lossy_run(ns, cpus, &args)),
    };
    let (lossy_reverse, lossy_reverse_error) = match &ns {
        Err(_) => (None, None),
        Ok(ns) => split(lossy_reverse_run(ns, cpus, &args)),
    };
    let med = |f: &dyn Fn(&Round) -> Option<Quantiles>| -> Option<Quantiles> {
        let v: Vec<Quantiles> = rounds.iter().filter_map(f).collect();
        Some(Quantiles {
            p50: median(&v.iter().map(|q| q.p50).collect::<Vec<_>>())?,
            p99: median(&v.iter().map(|q| q.p99).collect::<Vec<_>>())?,
        })
    };
    let med_f = |f: &dyn Fn(&Round) -> Option<f64>| -> Option<f64> {
        median(&rounds.iter().filter_map(f).collect::<Vec<_>>())
    };
    let rtt_us = match (
        med(&|r| r.ginza),
        med(&|r| r.linux),
        med(&|r| r.linux_busy_poll),
    ) {
        (Some(ginza), Some(linux), Some(linux_busy_poll)) => Some(RttSet {
            ginza,
            ginza_direct: med(&|r| r.ginza_direct),
            linux,
            linux_busy_poll,
        }),
        _ => None,
    };
    let stream_mbps = match (
        med_f(&|r| r.stream_ginza_mbps),
        med_f(&|r| r.stream_linux_mbps),
    ) {
        (Some(ginza), Some(linux)) => Some(StreamSet {
            ginza,
            ginza_direct: med_f(&|r| r.stream_ginza_direct_mbps),
            linux,
        }),
        _ => None,
    };
    let phases = ns.is_ok().then(|| {
        let spans = |f: fn(&Stamped) -> &Vec<Stamps>| {
            let all: Vec<Stamps> = rounds.iter().flat_map(|r| f(&r.stamps)).copied().collect();
            ServerPhases::of(&all, ticks_per_us)
        };
        Phases {
            ginza: spans(|s| &s.ginza),
            ginza_direct: spans(|s| &s.ginza_direct),
            linux: spans(|s| &s.linux),
            linux_busy_poll: spans(|s| &s.linux_busy_poll),
        }
    });
    let report = Report {
        rtt_us,
        stream_mbps,
        switch_rtt_us: med(&|r| r.switch),
        phases,
        lossy,
        lossy_reverse,
        client_cpu: format!("{:?}", args.client_cpu),
        client_cpu_ginza: ginza_client,
        client_cpu_linux: linux_client,
        backend,
        payload_bytes: PAYLOAD,
        rounds,
        veth_skipped,
        lossy_error,
        lossy_reverse_error,
        build: build_kind(),
    };
    emit(args.json, &render(&report, &args), &report)
}

/// The Ginza server side of a veth round: echo on 7 and a sink on 9.
/// A lossy run's figures, or why it failed (the report keeps both).
fn split(r: anyhow::Result<Lossy>) -> (Option<Lossy>, Option<String>) {
    match r {
        Ok(l) => (Some(l), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    }
}

/// The options of Ginza's TCP that the bench can turn off to compare.
#[derive(Clone, Copy)]
struct GinzaTcpOptions {
    sack: bool,
    answer_after_burst: bool,
    poll_while_idle: bool,
}

impl GinzaTcpOptions {
    fn of(args: &TcpArgs) -> GinzaTcpOptions {
        GinzaTcpOptions {
            sack: !args.no_sack,
            answer_after_burst: !args.no_burst_answer,
            poll_while_idle: !args.park,
        }
    }

    /// These options, in an application's configuration.
    fn apply(self) -> impl FnOnce(&mut ginza_runtime::Config) {
        move |config| {
            if let Some(io) = config.iokernel.as_mut() {
                io.poll_while_idle = if self.poll_while_idle {
                    ginza_runtime::POLL_WHILE_IDLE
                } else {
                    Duration::ZERO
                };
            }
            if let Some(net) = config.iokernel.as_mut().and_then(|io| io.net.as_mut()) {
                net.tcp.sack = self.sack;
                net.tcp.answer_after_burst = self.answer_after_burst;
            }
        }
    }
}

/// Serves until `stop`; returns the stack's counters then.
fn ginza_servers(stop: Arc<AtomicBool>) -> std::io::Result<Option<NetStats>> {
    let stats = Arc::new(EchoStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let sink = ginza_runtime::spawn(move || echo_server::serve_sink(SINK_PORT, s2, st2));
    let echo = echo_server::serve(
        ECHO_PORT,
        Protocols {
            udp: false,
            tcp: true,
        },
        stop.clone(),
        stats,
    );
    stop.store(true, Ordering::Relaxed);
    let sink = sink
        .join()
        .map_err(|e| std::io::Error::other(format!("the sink uthread: {e}")))?;
    echo.and(sink)?;
    Ok(ginza_runtime::net::stats())
}

/// iokerneld and Ginza's servers on the veth (AF_XDP, else AF_PACKET),
/// with `faults` on its port; `measure` runs while they serve. With
/// `direct`, the servers are on the direct path ([`direct`]: their own
/// AF_XDP socket, iokerneld on `af_xdp:IF,direct`), and the backend is
/// `af_xdp,direct`.
fn with_ginza_on_veth<R>(
    ns: &NetNs,
    cpus: Cpus,
    faults: Option<&str>,
    options: GinzaTcpOptions,
    direct: bool,
    measure: impl FnOnce(&InProcess) -> anyhow::Result<R>,
) -> anyhow::Result<(String, (R, Option<NetStats>))> {
    let configure = |cfg: &mut IokConfig| match faults {
        Some(f) => set_faults(cfg, f),
        None => Ok(()),
    };
    if direct {
        let run = |iokerneld: &InProcess, queue| {
            serve_ginza(ns, iokerneld, options, Some(queue), measure)
        };
        let served = direct::with_iokerneld_direct(ns, cpus, configure, run)?;
        return Ok(("af_xdp,direct".to_string(), served));
    }
    with_iokerneld_on_veth(ns, cpus, configure, |iokerneld, _| {
        serve_ginza(ns, iokerneld, options, None, measure)
    })
}

/// Ginza's servers on `iokerneld` (on their own socket on queue `direct`,
/// if given) while `measure` runs.
fn serve_ginza<R>(
    ns: &NetNs,
    iokerneld: &InProcess,
    options: GinzaTcpOptions,
    direct: Option<u32>,
    measure: impl FnOnce(&InProcess) -> anyhow::Result<R>,
) -> anyhow::Result<(R, Option<NetStats>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let tune = |config: &mut ginza_runtime::Config| {
        options.apply()(config);
        if let Some(queue) = direct {
            direct::enable(config, ns, queue, false);
        }
    };
    App::start_tuned(
        iokerneld,
        "tcp-echo",
        (GINZA_MAC, ns.peer_ip),
        tune,
        move || ginza_servers(s2),
    )
    .and_then(|mut app| {
        let measured = measure(iokerneld);
        stop.store(true, Ordering::Relaxed);
        // A server that failed explains a failed measurement.
        let served = app
            .join()
            .and_then(|r| r.context("Ginza's echo server and sink"));
        match (measured, served) {
            (Ok(m), Ok(tcp)) => Ok((m, tcp)),
            (Err(m), Err(s)) => Err(s.context(format!("(the client: {m:#})"))),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        }
    })
}

/// How long a client retries a refused connection: the Ginza application
/// registers with iokerneld before its servers listen.
const REFUSED_FOR: Duration = Duration::from_secs(5);

/// Round trips from the namespace to `target` for `--duration`: their
/// quantiles and how many were measured.
fn probe(
    ns: &NetNs,
    target: SocketAddrV4,
    duration: Duration,
    client_cpu: usize,
) -> anyhow::Result<(Quantiles, u64)> {
    let report = ns.run_in(move || {
        ginza_sys::affinity::pin_current_thread(client_cpu)?;
        retry_refused(REFUSED_FOR, std::thread::sleep, || {
            linux::rtt_probe_for(
                target,
                WARMUP,
                duration,
                PAYLOAD,
                IO_TIMEOUT,
                ClientWait::Blocking,
            )
        })
    })??;
    let h = &report.histogram;
    anyhow::ensure!(
        !h.is_empty(),
        "no round trip to {target} within {duration:?}"
    );
    let quantiles = Quantiles {
        p50: report.quantile_us(0.5),
        p99: report.quantile_us(0.99),
    };
    Ok((quantiles, h.len()))
}

/// A series of half `duration` to `target` with hop stamps on: its round
/// trips' stamps (for `phases`; its times are not the measured ones).
fn stamped_probe(
    ns: &NetNs,
    target: SocketAddrV4,
    duration: Duration,
    client_cpu: usize,
) -> anyhow::Result<Vec<Stamps>> {
    hops::enable(true);
    let probed = probe(ns, target, duration / 2, client_cpu);
    hops::enable(false);
    let stamps = hops::take();
    probed?;
    Ok(stamps)
}

/// One way from the namespace to the sink at `target`; checks the receipt.
fn stream(ns: &NetNs, target: SocketAddrV4, mib: u64) -> anyhow::Result<Transfer> {
    let bytes = mib << 20;
    let t = ns.run_in(move || {
        retry_refused(REFUSED_FOR, std::thread::sleep, || {
            linux::sink_transfer(target, bytes, 0x5eed, IO_TIMEOUT)
        })
    })??;
    anyhow::ensure!(
        t.intact(),
        "the sink at {target} received {} bytes (hash {:#x}), {} were sent (hash {:#x})",
        t.received,
        t.received_hash,
        t.sent,
        t.sent_hash
    );
    Ok(t)
}

/// One round of Ginza's servers.
struct GinzaRound {
    backend: String,
    rtt: Quantiles,
    mbps: Option<f64>,
    /// On the direct path: where the frames went.
    frames: Option<DirectFrames>,
    stamps: Vec<Stamps>,
}

/// Round trips, a stamped series and a stream to Ginza's servers (on the
/// direct path if `direct`: then also where their frames went, an error
/// unless their own socket carried the round trips), the round-trip client
/// on `client_cpu`.
fn ginza_round(
    ns: &NetNs,
    cpus: Cpus,
    args: &TcpArgs,
    direct: bool,
    client_cpu: usize,
) -> anyhow::Result<GinzaRound> {
    let (echo, sink) = (
        SocketAddrV4::new(ns.peer_ip, ECHO_PORT),
        SocketAddrV4::new(ns.peer_ip, SINK_PORT),
    );
    let options = GinzaTcpOptions::of(args);
    let (backend, ((rtt, trips, stamps, mbps, nic), net)) =
        with_ginza_on_veth(ns, cpus, None, options, direct, |iokerneld| {
            let before = iokerneld.stats()?;
            let (rtt, trips) = probe(ns, echo, args.duration, client_cpu)?;
            let stamps = stamped_probe(ns, echo, args.duration, client_cpu)?;
            let t = stream(ns, sink, args.stream_mb)?;
            let nic = (before, iokerneld.stats()?);
            Ok((rtt, trips, stamps, Some(t.mbps()), nic))
        })?;
    let frames = if direct {
        let frames = DirectFrames::of(net.as_ref(), &nic.0, &nic.1)?;
        frames.check(trips)?;
        Some(frames)
    } else {
        None
    };
    Ok(GinzaRound {
        backend,
        rtt,
        mbps,
        frames,
        stamps,
    })
}

/// Round trips to a kernel echo server waiting as `mode` says, the client
/// on `client_cpu`, and (for the blocking one) a stream to a kernel sink.
fn linux_round(
    ns: &NetNs,
    args: &TcpArgs,
    mode: EchoMode,
    client_cpu: usize,
) -> anyhow::Result<(Quantiles, Option<f64>, Vec<Stamps>)> {
    let host = ns.add_host_address(LINUX_HOST_OCTET)?;
    let echo: LinuxServer = linux::echo_server(SocketAddrV4::new(host.ip, ECHO_PORT), mode)?;
    let (addr, cpu) = (echo.addr(), client_cpu);
    let rtt = probe(ns, addr, args.duration, cpu)
        .and_then(|(rtt, _)| Ok((rtt, stamped_probe(ns, addr, args.duration, cpu)?)));
    echo.stop()?;
    let (rtt, stamps) = rtt?;
    if mode != EchoMode::Blocking {
        return Ok((rtt, None, stamps));
    }
    let sink = linux::sink_server(SocketAddrV4::new(host.ip, SINK_PORT))?;
    let t = stream(ns, sink.addr(), args.stream_mb);
    sink.stop()?;
    Ok((rtt, Some(t?.mbps()), stamps))
}

/// Two Ginza runtimes on an iokerneld without a NIC: echo-server and a
/// client measuring round trips through the software switch.
fn switch_round(cpus: Cpus, args: &TcpArgs) -> anyhow::Result<Quantiles> {
    let iokerneld = start_on("", cpus, |_| Ok(()))?;
    let result = (|| {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let mut server = App::start(&iokerneld, "switch-echo", SWITCH_SERVER, move || {
            echo_server::serve(
                ECHO_PORT,
                Protocols {
                    udp: false,
                    tcp: true,
                },
                s2,
                Arc::new(EchoStats::default()),
            )
        })?;
        let target = SocketAddrV4::new(SWITCH_SERVER.1, ECHO_PORT);
        let duration = args.duration;
        let client = App::start(&iokerneld, "switch-client", SWITCH_CLIENT, move || {
            echo_client::rtt_for(target, WARMUP, duration, PAYLOAD, IO_TIMEOUT)
        });
        let rtts = client.and_then(|mut c| c.join());
        // What the switch saw, for an error's sake.
        let seen = iokerneld.stats().map(|s| {
            s.apps
                .iter()
                .map(|a| format!("{}: {:?}", a.name, a.net))
                .collect::<Vec<_>>()
                .join("; ")
        });
        stop.store(true, Ordering::Relaxed);
        let served = server.join();
        let rtts = rtts?.with_context(|| {
            format!("the Ginza client's round trips (iokerneld's counts: {seen:?})")
        })?;
        served?.context("the Ginza echo server")?;
        quantiles(rtts)
    })();
    drop(iokerneld);
    result
}

/// `--lossy-mb` from the namespace to Ginza's sink through 5 % loss and
/// reordering on iokerneld's veth port.
fn lossy_run(ns: &NetNs, cpus: Cpus, args: &TcpArgs) -> anyhow::Result<Lossy> {
    let faults = format!("drop={LOSS_PCT}%,reorder=5%,port=trunk,seed=12");
    let sink = SocketAddrV4::new(ns.peer_ip, SINK_PORT);
    let bytes = args.lossy_mb << 20;
    let options = GinzaTcpOptions::of(args);
    let sack = options.sack;
    let (_, ((t, dropped, reordered), tcp)) =
        with_ginza_on_veth(ns, cpus, Some(&faults), options, false, |iokerneld| {
            let t = ns
                .run_in(move || {
                    retry_refused(REFUSED_FOR, std::thread::sleep, || {
                        linux::sink_transfer(sink, bytes, 0x1055, LOSSY_IO_TIMEOUT)
                    })
                })?
                .map_err(|e| {
                    // What the Linux sender's socket and the switch saw, to
                    // tell a stall from slowness.
                    let socket = ns
                        .exec(&["ss", "-tni", "dst", &sink.to_string()])
                        .map(|o| {
                            let text = String::from_utf8_lossy(&o.stdout).into_owned();
                            text.split_whitespace().collect::<Vec<_>>().join(" ")
                        })
                        .unwrap_or_default();
                    let seen = iokerneld.stats().map(|s| {
                        let apps: Vec<String> = s
                            .apps
                            .iter()
                            .map(|a| {
                                format!(
                                    "{}: cores {} parked kthreads {} grants {} net {:?}",
                                    a.name, a.cores_now, a.parked_kthreads, a.grants, a.net
                                )
                            })
                            .collect();
                        format!("faults {:?}; apps {}", s.dataplane.faults, apps.join(", "))
                    });
                    anyhow!("{e}; the sender's socket: {socket}; iokerneld: {seen:?}")
                })?;
            let stats = iokerneld.stats()?;
            let rule = stats
                .dataplane
                .faults
                .first()
                .ok_or_else(|| anyhow!("iokerneld reports no fault rule"))?;
            Ok((t, rule.dropped, rule.reordered))
        })?;
    Ok(Lossy {
        direction: "linux_to_ginza",
        loss_pct: LOSS_PCT,
        bytes: t.sent,
        intact: t.intact(),
        seconds: t.elapsed.as_secs_f64(),
        frames_dropped: dropped,
        frames_reordered: reordered,
        ginza_tcp: tcp.map(|s| GinzaTcp::of(sack, &s.tcp)),
    })
}

/// `--lossy-mb` from a Ginza client to a Linux sink in the namespace
/// through the same faults: Ginza is the sender, so its loss recovery
/// (SACK's, or NewReno's with `--no-sack`) is what is measured.
fn lossy_reverse_run(ns: &NetNs, cpus: Cpus, args: &TcpArgs) -> anyhow::Result<Lossy> {
    let faults = format!("drop={LOSS_PCT}%,reorder=5%,port=trunk,seed=12");
    let sink = ns.tcp_sink_server(SINK_PORT)?;
    let target = sink.addr();
    let bytes = args.lossy_mb << 20;
    let options = GinzaTcpOptions::of(args);
    let sack = options.sack;
    let configure = |cfg: &mut IokConfig| set_faults(cfg, &faults);
    let ran = with_iokerneld_on_veth(ns, cpus, configure, |iokerneld, _| {
        let mut app = App::start_tuned(
            iokerneld,
            "tcp-lossy-writer",
            (GINZA_MAC, ns.peer_ip),
            options.apply(),
            move || {
                let t = echo_client::sink_transfer(target, bytes, 0x1056, LOSSY_IO_TIMEOUT)?;
                Ok::<_, std::io::Error>((t, ginza_runtime::net::stats().map(|s| s.tcp)))
            },
        )?;
        let (t, tcp) = app.join()?.with_context(|| {
            let socket = ns
                .exec(&["ss", "-tni", "src", &target.to_string()])
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            format!("the Ginza writer to the Linux sink (the sink's socket: {socket})")
        })?;
        let stats = iokerneld.stats()?;
        let rule = stats
            .dataplane
            .faults
            .first()
            .ok_or_else(|| anyhow!("iokerneld reports no fault rule"))?;
        Ok((t, tcp, rule.dropped, rule.reordered))
    });
    let received = sink.stop();
    let (_, (t, tcp, dropped, reordered)) = ran?;
    received?;
    Ok(Lossy {
        direction: "ginza_to_linux",
        loss_pct: LOSS_PCT,
        bytes: t.sent,
        intact: t.intact(),
        seconds: t.elapsed.as_secs_f64(),
        frames_dropped: dropped,
        frames_reordered: reordered,
        ginza_tcp: tcp.map(|s| GinzaTcp::of(sack, &s)),
    })
}

fn render(r: &Report, args: &TcpArgs) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "TCP, median of {} interleaved rounds, {PAYLOAD}-byte round trips for {:?} each:",
        r.rounds.len(),
        args.duration
    );
    let row = |s: &mut String, name: &str, q: &Quantiles| {
        let _ = writeln!(s, "  {name:<34} p50 {:>8.1}  p99 {:>8.1}", q.p50, q.p99);
    };
    match &r.rtt_us {
        Some(rtt) => {
            let _ = writeln!(
                s,
                "round trip, Linux client in a namespace → veth → echo server, µs:"
            );
            let backend = r.backend.as_deref().unwrap_or("?");
            row(
                &mut s,
                &format!("ginza echo-server ({backend})"),
                &rtt.ginza,
            );
            if let Some(direct) = &rtt.ginza_direct {
                row(&mut s, "ginza echo-server, direct path", direct);
            }
            row(&mut s, "linux, blocking thread", &rtt.linux);
            row(&mut s, "linux, busy-polling (pinned)", &rtt.linux_busy_poll);
            let _ = writeln!(
                s,
                "  client on CPU {} (Ginza) / {} (Linux, Ginza's direct path): --client-cpu {}",
                r.client_cpu_ginza, r.client_cpu_linux, r.client_cpu
            );
        }
        None => {
            let _ = writeln!(
                s,
                "veth figures skipped: {}",
                r.veth_skipped.as_deref().unwrap_or("unknown reason")
            );
        }
    }
    if let Some(st) = &r.stream_mbps {
        let direct = st
            .ginza_direct
            .map_or(String::new(), |d| format!("  ginza direct path {d:.0}"));
        let _ = writeln!(
            s,
            "one-way stream, {} MiB from the namespace to a sink, Mbit/s:  ginza {:.0}{direct}  linux {:.0}",
            args.stream_mb, st.ginza, st.linux
        );
    }
    if let Some(p) = &r.phases {
        let _ = writeln!(
            s,
            "where the round trip goes, each hop from the last one passed, medians, µs:"
        );
        for (name, spans) in [
            ("ginza", &p.ginza),
            ("ginza direct path", &p.ginza_direct),
            ("linux, blocking", &p.linux),
            ("linux, busy-polling", &p.linux_busy_poll),
        ] {
            if let Some(p50) = spans.round_trip_p50 {
                let kick = spans
                    .kick_call
                    .map_or(String::new(), |k| format!(" (the kick call {k:.1})"));
                let _ = writeln!(
                    s,
                    "  {name:<20} (p50 {p50:.1}) {}{kick}",
                    hop_spans::line(&spans.all)
                );
                let _ = writeln!(
                    s,
                    "  {:<20} slower half: {}",
                    "",
                    hop_spans::line(&spans.slower_half)
                );
            }
        }
    }
    if let Some(q) = &r.switch_rtt_us {
        let _ = writeln!(
            s,
            "round trip, Ginza ⇄ Ginza through the software switch, µs:"
        );
        row(&mut s, "ginza client → ginza echo-server", q);
    }
    for (lossy, error) in [
        (&r.lossy, &r.lossy_error),
        (&r.lossy_reverse, &r.lossy_reverse_error),
    ] {
        match (lossy, error) {
            (Some(l), _) => {
                let _ = writeln!(
                    s,
                    "{} MiB {} through {}% loss and 5% reordering: intact {}, {:.2} s ({} frames dropped, {} reordered); Ginza's TCP: {:?}",
                    l.bytes >> 20,
                    l.direction,
                    l.loss_pct,
                    l.intact,
                    l.seconds,
                    l.frames_dropped,
                    l.frames_reordered,
                    l.ginza_tcp
                );
            }
            (None, Some(why)) => {
                let _ = writeln!(s, "lossy transfer failed: {why}");
            }
            (None, None) => {}
        }
    }
    let _ = writeln!(s, "build: {}", r.build);
    s
}
