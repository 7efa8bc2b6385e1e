//! Shinjuku mode under iokerneld with the dispatch step on iokerneld's core
//! (docs/colocate.md): an in-process iokerneld, its traffic generator
//! sending UDP requests that carry their service time, and a dispatched
//! server whose handler spins at preemption points.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::{LoadRun, GENERATOR_IP, GENERATOR_MAC};
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_proto::messages::{DispatchSpec, DispatchStats};
use ginza_proto::RequestHeader;
use ginza_runtime::net::NetConfig;
use ginza_runtime::shinjuku::dispatched::{self, DispatchedConfig, DispatchedReport};
use ginza_runtime::{Class, IokernelConfig};

#[allow(dead_code)] // the shared test helpers: not all are used here
mod common;
use common::{lock, Daemon};

const PORT: u16 = 7100;

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x48, 0x00, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 9, 1, last),
    }
}

/// Poisson load at `rate` per second for `dur`. The generator ends a run
/// once every reply is in, so its drain can be long: on a loaded machine
/// the server is held off its CPUs for a while and answers late, which is
/// not what these tests look at.
fn poisson(me: Interface, rate: f64, service: ServiceTime, dur: Duration) -> LoadRun {
    let mut load = LoadRun::poisson(me, PORT, rate, service, dur);
    load.drain = Duration::from_secs(10);
    load
}

/// Spins for the request's service time, at preemption points.
fn spin_handler(request: &[u8]) -> Vec<u8> {
    if let Some(h) = RequestHeader::decode(request) {
        let t = Instant::now();
        let d = Duration::from_nanos(h.service_ns.min(10_000_000));
        while t.elapsed() < d {
            ginza_runtime::preempt_point();
        }
    }
    request.to_vec()
}

fn config(d: &Daemon, name: &str, me: Interface, policy: &str) -> DispatchedConfig {
    let mut io = IokernelConfig::new(name, Class::LatencyCritical);
    io.socket = Some(d.socket.clone());
    io.net = Some(NetConfig::new(me.mac, me.ip).with_static_arp(GENERATOR_IP, GENERATOR_MAC));
    let spec = DispatchSpec {
        policy: policy.into(),
        quantum_ns: 5_000,
        head: false,
        classes: Vec::new(),
        class_offset: 0,
        backstop_ns: None,
        pre_assign: None,
    };
    let mut cfg = DispatchedConfig::new(io, spec, PORT);
    cfg.workers = 2;
    cfg
}

/// Runs the server until `load` is done; the generator's report and the
/// server's.
fn serve_during(
    d: &Daemon,
    cfg: DispatchedConfig,
    load: LoadRun,
) -> (ginza_iokernel::LoadReport, DispatchedReport) {
    let (report, served, _) = serve_with(d, cfg, load, spin_handler);
    (report, served)
}

/// As [`serve_during`] with `handler`; also iokerneld's dispatch counters
/// of the application once every request it took in was done.
fn serve_with(
    d: &Daemon,
    cfg: DispatchedConfig,
    load: LoadRun,
    handler: fn(&[u8]) -> Vec<u8>,
) -> (
    ginza_iokernel::LoadReport,
    DispatchedReport,
    Option<DispatchStats>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&stop);
    let name = cfg.iokernel.name.clone();
    let server = std::thread::spawn(move || dispatched::serve(cfg, handler, &s2).unwrap());
    let t0 = Instant::now();
    while !d.stats().apps.iter().any(|a| a.name == name) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{name} never registered"
        );
        std::thread::yield_now();
    }
    let report =
        d.io.as_ref()
            .unwrap()
            .generator()
            .run(load, Duration::from_secs(10))
            .unwrap();
    // iokerneld's counters once it has read the last hand-back.
    let t0 = Instant::now();
    let counters = loop {
        let c = d
            .stats()
            .apps
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.dispatch);
        if c.is_none_or(|c| c.ar == c.co) || t0.elapsed() > Duration::from_secs(60) {
            break c;
        }
        std::thread::yield_now();
    };
    // Where the requests' time went: one entry per completed request (read
    // after the counters: both must have settled, or they differ by the
    // completions in between).
    if let Some(c) = counters {
        assert_eq!(c.ar, c.co, "requests still in flight after 60 s: {c:?}");
        let bands = ginza_proto::client::dispatch_breakdown(&d.socket, &name).unwrap();
        assert_eq!(
            bands.iter().map(|b| b.count).sum::<u64>(),
            c.co,
            "{bands:?}"
        );
        assert!(bands.iter().all(|b| b.runs >= b.count), "{bands:?}");
    }
    stop.store(true, Ordering::Release);
    (report, server.join().unwrap(), counters)
}

#[test]
fn requests_are_served_and_long_ones_preempted_under_iokerneld() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let me = iface(1);
    // 90 % 2 µs, 10 % 100 µs at 2,000/s: long requests share the workers
    // with short ones, and are preempted when short ones wait.
    let service = ServiceTime::Bimodal {
        p: 0.9,
        a_ns: 2_000,
        b_ns: 100_000,
    };
    let load = poisson(me, 2_000.0, service, Duration::from_millis(400));
    let (report, served) = serve_during(&d, config(&d, "dispatched", me, "c-pre-sq"), load);
    eprintln!("generator: {:?}\nserver: {served:?}", report.stats);
    let s = report.stats;
    assert!(s.sent > 400, "{s:?}");
    assert!(
        s.replies as f64 >= 0.95 * s.sent as f64,
        "replies {} of {} sent; server {served:?}",
        s.replies,
        s.sent
    );
    assert_eq!(s.unmatched_replies, 0, "a request answered twice: {s:?}");
    assert!(served.served >= s.replies, "{served:?}");
    assert_eq!(served.unknown_resumes, 0, "{served:?}");
    assert_eq!(served.rejected, 0, "{served:?}");
}

/// With pre-assignment (docs/colocate.md, "Pre-assignment"): busy
/// workers get their next request ahead and start it as they complete
/// theirs; every request is answered once, and every request iokerneld
/// queued completes once (pre-assigned ones taken back included).
#[test]
fn pre_assigned_requests_are_served_once_under_iokerneld() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let me = iface(1);
    let service = ServiceTime::Bimodal {
        p: 0.9,
        a_ns: 2_000,
        b_ns: 100_000,
    };
    let load = poisson(me, 10_000.0, service, Duration::from_millis(400));
    let mut cfg = config(&d, "pre-assigned", me, "c-pre-sq");
    cfg.dispatch.pre_assign = Some(true);
    let (report, served, counters) = serve_with(&d, cfg, load, spin_handler);
    eprintln!(
        "generator: {:?}\nserver: {served:?}\niokerneld: {counters:?}",
        report.stats
    );
    let s = report.stats;
    let c = counters.expect("iokerneld's dispatch counters");
    assert!(c.pa > 0, "nothing was pre-assigned: {c:?}");
    assert_eq!(c.ar, c.co, "every queued request completed once: {c:?}");
    assert_eq!(c.li, 0, "no hand-back refused: {c:?}");
    assert_eq!(s.unmatched_replies, 0, "a request answered twice: {s:?}");
    assert!(served.served >= s.replies, "{served:?}");
    assert_eq!(served.unknown_resumes, 0, "{served:?}");
    assert_eq!(served.rejected, 0, "{served:?}");
}

/// Spins for the request's service time at no preemption point: only a
/// signal can stop it before its end.
fn spin_without_preemption_points(request: &[u8]) -> Vec<u8> {
    if let Some(h) = RequestHeader::decode(request) {
        let t = Instant::now();
        let d = Duration::from_nanos(h.service_ns.min(10_000_000));
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }
    request.to_vec()
}

/// iokerneld's backstop (docs/colocate.md): long requests that never reach
/// a preemption point are interrupted by a signal once they overstay the
/// yield flag, then resumed to completion; none is lost or run twice.
#[test]
fn requests_without_preemption_points_are_preempted_by_the_backstop() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let me = iface(3);
    // 80 % 2 µs, 20 % 2 ms at 300/s: short requests wait behind long ones
    // far longer than the quantum (5 µs) plus the backstop (50 µs).
    let service = ServiceTime::Bimodal {
        p: 0.8,
        a_ns: 2_000,
        b_ns: 2_000_000,
    };
    let load = poisson(me, 300.0, service, Duration::from_millis(500));
    let mut cfg = config(&d, "backstop", me, "c-pre-sq");
    cfg.dispatch.backstop_ns = Some(50_000);
    let (report, served, counters) = serve_with(&d, cfg, load, spin_without_preemption_points);
    eprintln!(
        "generator: {:?}\nserver: {served:?}\niokerneld: {counters:?}",
        report.stats
    );
    let s = report.stats;
    let c = counters.expect("iokerneld reports the application's dispatch counters");
    assert!(s.sent > 50, "{s:?}");
    // None lost: every request iokerneld queued completed, once.
    assert_eq!(c.ar, c.co, "requests queued vs completed: {c:?}");
    assert_eq!(c.co, served.served, "{c:?} {served:?}");
    assert_eq!(s.unmatched_replies, 0, "a request answered twice: {s:?}");
    assert!(
        s.replies as f64 >= 0.95 * s.sent as f64,
        "replies {} of {} sent; server {served:?}",
        s.replies,
        s.sent
    );
    // Preempted with no preemption point: by the backstop's signal, not by
    // revocations (there is no rival for the cores).
    assert!(c.bs > 0, "no backstop signal sent: {c:?}");
    assert!(
        served.preempted > served.revoked_mid_request,
        "no request yielded to the backstop: {served:?}"
    );
    assert_eq!(c.pe, served.preempted, "{c:?} {served:?}");
    assert_eq!(served.unknown_resumes, 0, "{served:?}");
    assert_eq!((served.rejected, c.rf, c.li), (0, 0, 0), "{c:?} {served:?}");
}

#[test]
fn a_dispatched_server_needs_a_network_interface() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let mut cfg = config(&d, "no-net", iface(2), "c-fcfs");
    cfg.iokernel.net = None;
    let stop = AtomicBool::new(true);
    let e = dispatched::serve(cfg, spin_handler, &stop).unwrap_err();
    assert!(e.to_string().contains("network interface"), "{e}");
}
