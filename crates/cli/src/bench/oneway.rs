//! `ginza bench oneway`: one-way latency of 64-byte messages, DLibOS's
//! Figs. 5–7 on this machine (issue #15; docs/protected.md, "Benchmark").
//!
//! NetPIPE-style: a client sends 64 bytes on one persistent TCP connection
//! and waits for their echo before the next; the one-way latency is half of
//! each round trip. Three servers, each answering over its own path, no
//! root needed:
//!
//! * `rtc`: `echo-server` on a Ginza runtime with the in-process stack
//!   (run to completion), a Ginza client (in-process stack), both under
//!   one iokerneld, frames through its software switch;
//! * `protected`: the same `echo-server` protected (its runtime's
//!   protected backend, registered with iokerneld for cores only), the
//!   TCP/IP stack in `netstackd` (the netstack daemon, an application
//!   under the same iokerneld), the same Ginza client through the same
//!   switch;
//! * `linux`: a Linux echo server (a thread per connection blocked in
//!   `read`) and a Linux client, kernel sockets over loopback (`127.0.0.1`):
//!   no NIC, as for the two others (the switch is a memory copy too).
//!
//! Each round starts its own iokerneld (no NIC; its loop on the first CPU,
//! the applications on the second) and ends it. Rounds are interleaved
//! (rtc, protected, linux, rtc, …); p50 and p99 are the medians over rounds
//! of each round's percentiles. `throughput_krps` is not measured yet: it
//! is null, and `notes` says so.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use ginza_apps::echo_client;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::netns::tcp::{self as linux, EchoMode};
use ginza_iokernel::InProcess;
use ginza_net::{Interface, MacAddr};
use ginza_netstack::daemon::{Daemon, DaemonConfig};
use ginza_proto::parse_duration;
use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::{Class, Config as RtConfig, IokernelConfig};
use serde::Serialize;

use super::common::{allowed_cpus, emit, median};
use super::tcp::{quantiles, start_iokerneld, App, Cpus, Quantiles, IO_TIMEOUT, PAYLOAD, WARMUP};

/// Arguments of `ginza bench oneway`.
#[derive(clap::Args, Debug)]
pub struct OnewayArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Interleaved rounds; each figure is the median over them.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Length of one ping-pong series (after its warm-up), e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    duration: Duration,
}

const ECHO_PORT: u16 = 7;
const SERVER: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x15, 0x01]),
    Ipv4Addr::new(10, 47, 15, 1),
);
const CLIENT: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x15, 0x02]),
    Ipv4Addr::new(10, 47, 15, 2),
);
/// The netstack's own address in the protected rounds; the echo-server
/// asks for `SERVER` (iokerneld steers it to the netstack).
const NETSTACK: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x15, 0x03]),
    Ipv4Addr::new(10, 47, 15, 3),
);

#[derive(Serialize, Debug)]
struct OnewaySet {
    rtc: Quantiles,
    protected: Quantiles,
    linux: Quantiles,
}

#[derive(Serialize, Debug)]
struct Throughput {
    rtc: Option<f64>,
    protected: Option<f64>,
}

/// One round's one-way latencies (µs), for the record.
#[derive(Serialize, Debug)]
struct Round {
    rtc: Option<Quantiles>,
    protected: Option<Quantiles>,
    linux: Option<Quantiles>,
}

#[derive(Serialize, Debug)]
struct Report {
    /// Half of each 64-byte round trip, µs: medians over rounds of each
    /// round's p50 and p99.
    oneway_us: OnewaySet,
    throughput_krps: Throughput,
    payload_bytes: usize,
    /// The path each figure took.
    paths: Paths,
    rounds: Vec<Round>,
    notes: Vec<String>,
}

#[derive(Serialize, Debug)]
struct Paths {
    rtc: &'static str,
    protected: &'static str,
    linux: &'static str,
}

const PATHS: Paths = Paths {
    rtc: "Ginza client (in-process stack) -> iokerneld software switch -> echo-server (in-process stack, run to completion); no NIC",
    protected: "Ginza client (in-process stack) -> iokerneld software switch -> netstackd -> rings -> echo-server --protected; no NIC",
    linux: "Linux client -> kernel TCP over loopback 127.0.0.1 -> Linux echo server (thread blocked in read)",
};

pub fn run(args: OnewayArgs) -> anyhow::Result<()> {
    let cpus = allowed_cpus()?;
    anyhow::ensure!(
        cpus.len() >= 2,
        "ginza bench oneway needs two CPUs (iokerneld and the applications), this process may use {cpus:?}"
    );
    let cpus = Cpus {
        iokernel: cpus[0],
        app: cpus[1],
    };
    let mut rounds = Vec::new();
    for r in 0..args.rounds {
        let rtc = rtc_round(cpus, &args).with_context(|| format!("round {r}, rtc"))?;
        let protected =
            protected_round(cpus, &args).with_context(|| format!("round {r}, protected"))?;
        let linux = linux_round(&args).with_context(|| format!("round {r}, linux"))?;
        rounds.push(Round {
            rtc: Some(half(rtc)),
            protected: Some(half(protected)),
            linux: Some(half(linux)),
        });
    }
    let med = |pick: fn(&Round) -> Option<Quantiles>| -> anyhow::Result<Quantiles> {
        let qs: Vec<Quantiles> = rounds.iter().filter_map(pick).collect();
        let p50: Vec<f64> = qs.iter().map(|q| q.p50).collect();
        let p99: Vec<f64> = qs.iter().map(|q| q.p99).collect();
        Ok(Quantiles {
            p50: median(&p50).ok_or_else(|| anyhow!("no round measured"))?,
            p99: median(&p99).ok_or_else(|| anyhow!("no round measured"))?,
        })
    };
    let report = Report {
        oneway_us: OnewaySet {
            rtc: med(|r| r.rtc)?,
            protected: med(|r| r.protected)?,
            linux: med(|r| r.linux)?,
        },
        throughput_krps: Throughput {
            rtc: None,
            protected: None,
        },
        payload_bytes: PAYLOAD,
        paths: PATHS,
        rounds,
        notes: vec![
            "throughput_krps: not_measured (the throughput of http-server at the same p99 in both modes is not implemented yet)".into(),
            format!(
                "one way = half of each round trip; {} interleaved rounds of {:?} each after {WARMUP} warm-up round trips; iokerneld's loop on CPU {}, every application on CPU {}",
                args.rounds, args.duration, cpus.iokernel, cpus.app
            ),
        ],
    };
    emit(args.json, &render(&report), &report)
}

/// One way = half the round trip.
fn half(q: Quantiles) -> Quantiles {
    Quantiles {
        p50: q.p50 / 2.0,
        p99: q.p99 / 2.0,
    }
}

/// The Ginza client's round trips to `target` on `iokerneld`; retries a
/// refused connection (the server may still be setting up its listener)
/// for up to `IO_TIMEOUT`.
fn ginza_client(
    iokerneld: &InProcess,
    target: SocketAddrV4,
    duration: Duration,
) -> anyhow::Result<Vec<u64>> {
    let mut client = App::start(iokerneld, "oneway-client", CLIENT, move || {
        let t0 = Instant::now();
        loop {
            match echo_client::rtt_for(target, WARMUP, duration, PAYLOAD, IO_TIMEOUT) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && t0.elapsed() < IO_TIMEOUT =>
                {
                    ginza_runtime::sleep(Duration::from_millis(10));
                }
                other => return other,
            }
        }
    })?;
    client.join()?.context("the Ginza client's round trips")
}

fn tcp_only() -> Protocols {
    Protocols {
        udp: false,
        tcp: true,
    }
}

/// Round trips (µs) to echo-server with the in-process stack.
pub(super) fn rtc_round(cpus: Cpus, args: &OnewayArgs) -> anyhow::Result<Quantiles> {
    let (iokerneld, dir) = start_iokerneld("", cpus, None)?;
    let result = (|| {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let mut server = App::start(&iokerneld, "echo-server", SERVER, move || {
            echo_server::serve(ECHO_PORT, tcp_only(), s2, Arc::new(EchoStats::default()))
        })?;
        let rtts = ginza_client(
            &iokerneld,
            SocketAddrV4::new(SERVER.1, ECHO_PORT),
            args.duration,
        );
        stop.store(true, Ordering::Relaxed);
        let served = server.join();
        let rtts = rtts?;
        served?.context("the echo-server")?;
        quantiles(rtts)
    })();
    drop(iokerneld);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Round trips (µs) to echo-server run protected, the netstack daemon
/// under the same iokerneld.
pub(super) fn protected_round(cpus: Cpus, args: &OnewayArgs) -> anyhow::Result<Quantiles> {
    let (iokerneld, dir) = start_iokerneld("", cpus, None)?;
    let result = (|| {
        let mut ns_cfg = DaemonConfig::new(Interface {
            mac: NETSTACK.0,
            ip: NETSTACK.1,
        });
        ns_cfg.iokernel_socket = iokerneld.socket().to_path_buf();
        ns_cfg.attach_socket = dir.join("netstack.sock");
        ns_cfg.kthreads = 1;
        let netstack = Daemon::start(ns_cfg.clone()).context("the netstack daemon")?;
        // The echo-server as `--protected` configures it
        // (`AppArgs::runtime_config`): cores from iokerneld, no `net`.
        let mut io = IokernelConfig::new("echo-server", Class::LatencyCritical);
        io.socket = Some(iokerneld.socket().to_path_buf());
        let me = Interface {
            mac: SERVER.0,
            ip: SERVER.1,
        };
        let config = RtConfig {
            iokernel: Some(io),
            protected: Some(ProtectedConfig::new(
                ns_cfg.attach_socket.clone(),
                "echo-server",
                me,
            )),
            ..RtConfig::with_kthreads(1)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let server = std::thread::spawn(move || {
            ginza_runtime::run(config, move || {
                echo_server::serve(ECHO_PORT, tcp_only(), s2, Arc::new(EchoStats::default()))
            })
        });
        // Its `listen` went through: the netstack answered it.
        let t0 = Instant::now();
        let listening = loop {
            if netstack.stats().events >= 1 {
                break Ok(());
            }
            if server.is_finished() || t0.elapsed() > IO_TIMEOUT {
                break Err(anyhow!(
                    "the protected echo-server did not listen within {IO_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let rtts = listening.and_then(|()| {
            ginza_client(
                &iokerneld,
                SocketAddrV4::new(SERVER.1, ECHO_PORT),
                args.duration,
            )
        });
        stop.store(true, Ordering::Relaxed);
        let served = server
            .join()
            .map_err(|_| anyhow!("the protected echo-server's thread panicked"))?;
        let rtts = rtts?;
        served
            .context("the protected echo-server's runtime")?
            .context("the protected echo-server")?;
        drop(netstack);
        quantiles(rtts)
    })();
    drop(iokerneld);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Round trips (µs) between Linux sockets over loopback.
pub(super) fn linux_round(args: &OnewayArgs) -> anyhow::Result<Quantiles> {
    let server = linux::echo_server(
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        EchoMode::Blocking,
    )?;
    let report = linux::rtt_probe_for(server.addr(), WARMUP, args.duration, PAYLOAD, IO_TIMEOUT);
    server.stop()?;
    let report = report.context("the Linux client's round trips")?;
    anyhow::ensure!(!report.histogram.is_empty(), "no Linux round trip");
    Ok(Quantiles {
        p50: report.quantile_us(0.5),
        p99: report.quantile_us(0.99),
    })
}

fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "one-way latency of {}-byte messages (half the round trip), median of {} interleaved rounds, µs:",
        r.payload_bytes,
        r.rounds.len()
    );
    for (name, q, path) in [
        ("rtc", r.oneway_us.rtc, r.paths.rtc),
        ("protected", r.oneway_us.protected, r.paths.protected),
        ("linux", r.oneway_us.linux, r.paths.linux),
    ] {
        let _ = writeln!(
            s,
            "  {name:<10} p50 {:>8.2}  p99 {:>8.2}   ({path})",
            q.p50, q.p99
        );
    }
    let _ = writeln!(s, "throughput_krps: not measured");
    s
}
