//! What the preload library adds per request, measured apart from any
//! protocol engine: the same 64-byte echo served by the same logic (read
//! what arrives, write it back; a thread per connection) once on Ginza's
//! native Rust API (`ginza_apps::echo_server::serve_tcp` on
//! `ginza_runtime::net::TcpStream`) and once as a C program under `ginza
//! run` (`bench/c/echo_server.c`: glibc's `read`/`write` on a pthread, which
//! the library turns into Ginza socket calls on a uthread). A third server,
//! the same C program in its epoll mode (one thread, level-triggered
//! `epoll_wait` before each read: memcached's pattern), adds the library's
//! readiness multiplexer. Each runs alone under the same iokerneld on the
//! same veth with one kthread; a Linux client in the namespace measures
//! round trips on one connection, the servers interleaved round by round.
//! The difference of the p50s is the library's cost per request (one read
//! and one write through it; and one `epoll_wait`).
//!
//! With a direct-path system in the sweep (memcached-ginza-direct), the same
//! three servers are measured again on the direct path (each its own AF_XDP
//! socket, `harness::direct`), interleaved with the others: what the library
//! adds where iokerneld is off the request's path. A direct series fails
//! unless the server's frames went around iokerneld (the native server's
//! own-socket counts cover every round trip; for the C servers iokerneld's
//! NIC saw under a tenth as many frames as there were round trips).

use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_apps::echo_server::{self, EchoStats};
use ginza_iokernel::netns::tcp::{self as linux, ClientWait};
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::{Config as IokConfig, InProcess, PolicyKind};
use ginza_net::MacAddr;
use serde::Serialize;

use super::ginza_run::{self, GinzaRun};
use super::START_TIMEOUT;
use crate::harness::app::App;
use crate::harness::direct::{self, DirectFrames};
use crate::harness::figures::median;
use crate::harness::iokerneld::{with_iokerneld_on_veth, Cpus};
use crate::harness::rtt::{IO_TIMEOUT, PAYLOAD, WARMUP};

const PORT: u16 = 7;
/// Both servers' MAC: kv-server's, as everything at the namespace's
/// peer address in this bench (see `ginza_run::start`).
const MAC: MacAddr = super::KV_MAC;
/// The C server, compiled at run time (`ginza` may run far from the
/// repository).
const C_SOURCE: &str = include_str!("../../../../bench/c/echo_server.c");

/// The two servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum EchoServer {
    /// `serve_tcp` on the native API, a runtime application of the bench.
    NativeApi,
    /// `echo_server.c` under `ginza run`.
    CUnderGinzaRun,
    /// `echo_server.c PORT epoll` under `ginza run`.
    CEpollUnderGinzaRun,
}

impl EchoServer {
    fn name(self) -> &'static str {
        match self {
            EchoServer::NativeApi => "native-api",
            EchoServer::CUnderGinzaRun => "c-under-ginza-run",
            EchoServer::CEpollUnderGinzaRun => "c-epoll-under-ginza-run",
        }
    }
}

/// One server's series in one round.
#[derive(Clone, Debug, Serialize)]
pub(super) struct EchoRound {
    pub(super) server: EchoServer,
    /// On the direct path (the server's own socket).
    pub(super) direct: bool,
    pub(super) round: u32,
    pub(super) round_trips: u64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    /// iokerneld's NIC backend.
    pub(super) backend: String,
}

/// The figures: medians over the rounds.
#[derive(Clone, Debug, Serialize)]
pub(super) struct LibraryCost {
    pub(super) payload_bytes: usize,
    /// On the switch path (the JSON keeps its fields at the top level).
    #[serde(flatten)]
    pub(super) switch_path: PathCost,
    /// The same three servers on the direct path, when measured.
    pub(super) direct_path: Option<PathCost>,
    pub(super) rounds: Vec<EchoRound>,
}

/// The library's cost on one path: medians over the rounds, µs.
#[derive(Clone, Debug, Serialize)]
pub(super) struct PathCost {
    pub(super) native_api_p50_us: f64,
    pub(super) native_api_p99_us: f64,
    pub(super) c_under_ginza_run_p50_us: f64,
    pub(super) c_under_ginza_run_p99_us: f64,
    /// c-under-ginza-run p50 − native-api p50: what the preload library
    /// adds to one request and its response.
    pub(super) added_p50_us: f64,
    pub(super) c_epoll_under_ginza_run_p50_us: f64,
    pub(super) c_epoll_under_ginza_run_p99_us: f64,
    /// c-epoll-under-ginza-run p50 − native-api p50: the same with an
    /// `epoll_wait` through the library before each read.
    pub(super) added_with_epoll_p50_us: f64,
}

impl PathCost {
    /// The medians of `series`' rounds on the direct path or not.
    fn of(series: &[EchoRound], direct: bool) -> anyhow::Result<PathCost> {
        let med = |server: EchoServer, f: fn(&EchoRound) -> f64| {
            let v: Vec<f64> = series
                .iter()
                .filter(|r| r.server == server && r.direct == direct)
                .map(f)
                .collect();
            median(&v).context("no round measured")
        };
        let native_p50 = med(EchoServer::NativeApi, |r| r.p50_us)?;
        let c_p50 = med(EchoServer::CUnderGinzaRun, |r| r.p50_us)?;
        let epoll_p50 = med(EchoServer::CEpollUnderGinzaRun, |r| r.p50_us)?;
        Ok(PathCost {
            native_api_p50_us: native_p50,
            native_api_p99_us: med(EchoServer::NativeApi, |r| r.p99_us)?,
            c_under_ginza_run_p50_us: c_p50,
            c_under_ginza_run_p99_us: med(EchoServer::CUnderGinzaRun, |r| r.p99_us)?,
            added_p50_us: c_p50 - native_p50,
            c_epoll_under_ginza_run_p50_us: epoll_p50,
            c_epoll_under_ginza_run_p99_us: med(EchoServer::CEpollUnderGinzaRun, |r| r.p99_us)?,
            added_with_epoll_p50_us: epoll_p50 - native_p50,
        })
    }
}

/// `rounds` interleaved rounds (native, C, native, …) of `duration` each;
/// with `direct`, each round measures the three on the direct path too (the
/// namespace's veth then has the direct path's queues).
pub(super) fn measure(
    ns: &NetNs,
    cpus: Cpus,
    run: &GinzaRun,
    (rounds, direct): (u32, bool),
    duration: Duration,
) -> anyhow::Result<LibraryCost> {
    let dir = tempdir_for_c()?;
    let program = compile(&dir)?;
    let paths: &[bool] = if direct { &[false, true] } else { &[false] };
    let mut series = Vec::new();
    for round in 0..rounds {
        for &direct in paths {
            for server in [
                EchoServer::NativeApi,
                EchoServer::CUnderGinzaRun,
                EchoServer::CEpollUnderGinzaRun,
            ] {
                let path = if direct { ", direct path" } else { "" };
                let r = one_series(ns, cpus, run, &program, (server, direct), duration)
                    .with_context(|| {
                        format!("library cost, round {round}: {}{path}", server.name())
                    })?;
                eprintln!(
                    "library cost, round {round}: {:<24} p50 {:>7.1} µs  p99 {:>7.1} µs  ({} round trips)",
                    format!("{}{path}", server.name()),
                    r.0,
                    r.1,
                    r.2
                );
                series.push(EchoRound {
                    server,
                    direct,
                    round,
                    p50_us: r.0,
                    p99_us: r.1,
                    round_trips: r.2,
                    backend: r.3,
                });
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let direct_path = if direct {
        Some(PathCost::of(&series, true)?)
    } else {
        None
    };
    Ok(LibraryCost {
        payload_bytes: PAYLOAD,
        switch_path: PathCost::of(&series, false)?,
        direct_path,
        rounds: series,
    })
}

/// A fresh directory for the C program.
fn tempdir_for_c() -> anyhow::Result<PathBuf> {
    let dir = crate::harness::iokerneld::socket_dir("bench-echo-c");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// `cc -O2 -pthread echo_server.c` in `dir`.
fn compile(dir: &Path) -> anyhow::Result<PathBuf> {
    let source = dir.join("echo_server.c");
    std::fs::write(&source, C_SOURCE).with_context(|| format!("writing {}", source.display()))?;
    let bin = dir.join("echo_server");
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&bin)
        .arg(&source)
        .output()
        .context("running `cc` for the library's cost (Debian package gcc)")?;
    anyhow::ensure!(
        out.status.success(),
        "cc {} failed ({}): {}",
        source.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(bin)
}

/// One series against `server` under a fresh iokerneld, on the direct path
/// if `direct`: (p50 µs, p99 µs, round trips, backend).
fn one_series(
    ns: &NetNs,
    cpus: Cpus,
    run: &GinzaRun,
    program: &Path,
    (server, direct): (EchoServer, bool),
    duration: Duration,
) -> anyhow::Result<(f64, f64, u64, String)> {
    let configure = |cfg: &mut IokConfig| {
        cfg.policy = PolicyKind::Shenango;
        Ok(())
    };
    let serve = |iokerneld: &InProcess, queue: Option<u32>| {
        let target = SocketAddrV4::new(ns.peer_ip, PORT);
        match server {
            EchoServer::NativeApi => native(ns, iokerneld, (target, queue), duration),
            EchoServer::CUnderGinzaRun | EchoServer::CEpollUnderGinzaRun => {
                let mut args = vec![PORT.to_string()];
                if server == EchoServer::CEpollUnderGinzaRun {
                    args.push("epoll".into());
                }
                let own = queue.map(|q| format!("{}:{q}", ns.host_if));
                let at = ginza_run::Placement {
                    mac: MAC,
                    ip: ns.peer_ip,
                    direct: own.as_deref(),
                    net_stats: None,
                };
                let before = iokerneld.stats()?;
                let mut child =
                    ginza_run::start(run, iokerneld, at, server.name(), (program, &args))?;
                let r = probe(ns, target, duration);
                let alive = child.0.try_wait()?.is_none();
                child.stop();
                anyhow::ensure!(alive, "the C echo server exited: {}", child.stderr());
                let r = r?;
                if queue.is_some() {
                    // Its own socket's counts stay in the child (it is
                    // killed): iokerneld's NIC tells whether the round trips
                    // went around it.
                    let nic_rx =
                        iokerneld.stats()?.dataplane.nic_rx_frames - before.dataplane.nic_rx_frames;
                    anyhow::ensure!(
                        nic_rx < r.2 / 10,
                        "the C echo server on the direct path: iokerneld's NIC received \
                         {nic_rx} frames for {} round trips",
                        r.2
                    );
                }
                Ok(r)
            }
        }
    };
    if direct {
        let r = direct::with_iokerneld_direct(ns, cpus, configure, |iokerneld, queue| {
            serve(iokerneld, Some(queue))
        })?;
        return Ok((r.0, r.1, r.2, "af_xdp,direct".into()));
    }
    let (backend, r) =
        with_iokerneld_on_veth(ns, cpus, configure, |iokerneld, _| serve(iokerneld, None))?;
    Ok((r.0, r.1, r.2, backend))
}

/// The native server as a runtime application of this process; on the
/// direct path with its own socket on `queue`, if given.
fn native(
    ns: &NetNs,
    iokerneld: &InProcess,
    (target, queue): (SocketAddrV4, Option<u32>),
    duration: Duration,
) -> anyhow::Result<(f64, f64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let tune = |cfg: &mut ginza_runtime::Config| {
        if let Some(q) = queue {
            direct::enable(cfg, ns, q, false);
        }
    };
    let nic_before = iokerneld.stats()?;
    let mut app = App::start_tuned(
        iokerneld,
        "echo-native",
        (MAC, ns.peer_ip),
        tune,
        move || {
            let served = echo_server::serve_tcp(PORT, s2, Arc::new(EchoStats::default()));
            (served, ginza_runtime::net::stats())
        },
    )?;
    let r = probe(ns, target, duration);
    stop.store(true, Relaxed);
    let served = app
        .join()
        .and_then(|(r, net)| r.context("the native echo server").map(|()| net));
    let (r, net) = match (r, served) {
        (Ok(r), Ok(net)) => (r, net),
        (Err(e), _) | (Ok(_), Err(e)) => return Err(e),
    };
    if queue.is_some() {
        let frames = DirectFrames::of(net.as_ref(), &nic_before, &iokerneld.stats()?)?;
        frames.check(r.2)?;
    }
    Ok(r)
}

/// Waits (from the namespace) until `target` accepts, then one
/// connection's round trips for `duration` after the warm-up.
fn probe(ns: &NetNs, target: SocketAddrV4, duration: Duration) -> anyhow::Result<(f64, f64, u64)> {
    let report = ns.run_in(move || -> anyhow::Result<linux::RttReport> {
        let t0 = Instant::now();
        while TcpStream::connect_timeout(&SocketAddr::V4(target), Duration::from_millis(200))
            .is_err()
        {
            anyhow::ensure!(
                t0.elapsed() < START_TIMEOUT,
                "{target} did not accept within {START_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        linux::rtt_probe_for(
            target,
            WARMUP,
            duration,
            PAYLOAD,
            IO_TIMEOUT,
            ClientWait::Blocking,
        )
        .with_context(|| format!("round trips to {target}"))
    })??;
    let n = report.histogram.len();
    anyhow::ensure!(n > 0, "no round trip to {target} within {duration:?}");
    Ok((report.quantile_us(0.5), report.quantile_us(0.99), n))
}
