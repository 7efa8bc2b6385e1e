//! The kernel-socket backend against Linux servers on 127.0.0.1 (no root
//! needed): the self-check against a separately measured ping-pong, UDP
//! and TCP; thousands of TCP connections; timeouts when the server drops
//! requests; memcached with preloaded keys; the saturation flag.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::{TcpServer, UdpEcho};
use ginza_loadgen::protocol::echo::Echo;
use ginza_loadgen::protocol::http::Http;
use ginza_loadgen::protocol::memcached::{Memcached, Mix};
use ginza_loadgen::protocol::{Transport, Workload};
use ginza_loadgen::report::Report;
use ginza_loadgen::schedule::{Arrivals, Process};
use ginza_loadgen::{kernel, RunConfig};

/// Keeps every CPU this process may use from halting while a latency
/// check runs: one spinning `SCHED_IDLE` thread per CPU, which runs only
/// when nothing else there wants to. On a VM a wake onto a halted vCPU
/// took up to milliseconds (docs/results.md, "Session 24"; a CI run saw a
/// median send lag of 655 µs in all five tries), which these checks would
/// read as a generator late on its schedule. A CPU whose thread cannot be
/// pinned or put at `SCHED_IDLE` is left as it is.
struct CpusAwake {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpusAwake {
    fn start() -> CpusAwake {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cpus = ginza_sys::affinity::allowed_cpus().unwrap_or_default();
        let threads = cpus
            .into_iter()
            .map(|cpu| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    if ginza_sys::affinity::pin_current_thread(cpu).is_err()
                        || ginza_sys::sched_class::set_current_idle().is_err()
                    {
                        return;
                    }
                    while !stop.load(Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        CpusAwake { stop, threads }
    }
}

impl Drop for CpusAwake {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The tests measure latency and the generator's lag: one at a time.
fn lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn config(target: SocketAddr, transport: Transport, rate: f64, duration: Duration) -> RunConfig {
    RunConfig {
        target,
        transport,
        workload: Workload::Echo(Echo { size: 32 }),
        arrivals: Arrivals::steady(Process::Poisson, rate, duration),
        warmup: Duration::from_millis(100),
        connections: 1,
        threads: 1,
        // A deadline for the answer, not a measurement: on a loaded 2-CPU
        // machine the server thread can be held off its CPU for longer
        // than half a second. Tests of timeouts set their own.
        timeout: Duration::from_secs(5),
        max_lag: Duration::from_micros(200),
        spin: Duration::from_micros(50),
        seed: 5,
        cpus: vec![],
        connect_timeout: Duration::from_secs(5),
    }
}

fn run(cfg: &RunConfig) -> Report {
    let r = kernel::run(cfg).unwrap();
    eprintln!("{}", r.summary());
    r
}

/// As [`run`], again (up to four more times) while the generator says it
/// could not keep its schedule (the VM stalled it for milliseconds: seen
/// once in a CI run on an otherwise idle machine, p99 send lag 10 ms, and
/// in most runs while other builds loaded both CPUs). The last run's
/// figures are asserted whatever its flag says.
fn run_on_schedule(cfg: &RunConfig) -> Report {
    let mut r = run(cfg);
    for _ in 0..4 {
        if !r.generator_saturated {
            break;
        }
        eprintln!("the generator fell behind its schedule; measuring once more");
        r = run(cfg);
    }
    r
}

/// The self-check: at low load the generator's median latency agrees with
/// a closed-loop ping-pong on the same socket type and the same server,
/// paced at the same mean gap. Tolerance: within 3× or 100 µs of it,
/// whichever is looser. Both measure the same kernel path (loopback, a
/// server thread woken per request); what differs is only how the client
/// waits (epoll and a timerfd against a blocking `recv`), and on this
/// 2-vCPU VM a wake-up alone costs 6–28 µs (docs/design.md, "Numbers to
/// beat"): on a quiet machine the generator's median is 50–70 µs against
/// the ping-pong's 30 (docs/loadgen.md), and 83 against 31 was seen while
/// other builds loaded both CPUs. What the check exists to catch —
/// latency measured from the wrong send time, or a generator that falls
/// behind its schedule — shows as milliseconds, not tens of µs.
fn agrees(generator_p50_us: f64, ping_pong: Duration) {
    let pp = ping_pong.as_secs_f64() * 1e6;
    let bound = (3.0 * pp).max(pp + 100.0);
    assert!(
        generator_p50_us <= bound && generator_p50_us >= pp / 2.0 - 50.0,
        "generator p50 {generator_p50_us:.1} µs vs ping-pong {pp:.1} µs (bound {bound:.1})"
    );
}

/// The median request went out on time, so the median latency is the
/// server's and the network's. (The p99 send lag, and with it the
/// `generator_saturated` flag, is not asserted here: on this shared 2-vCPU
/// machine, builds running beside the tests deschedule the generator for
/// milliseconds now and then, which it rightly reports; the flag has its
/// own test below.) Bound: 100 µs, the latency check's own slack — the
/// worker wakes from its timerfd 50 µs before a send and a wake-up on this
/// VM can take longer than that (a median lag of 45 µs was seen once in a
/// full test run); falling behind the schedule shows as milliseconds.
fn on_time(r: &Report) {
    assert!(
        r.send_lag.p50_us < 100.0,
        "median send lag {} µs",
        r.send_lag.p50_us
    );
}

#[test]
fn udp_latency_at_low_load_agrees_with_a_ping_pong() {
    let _serial = lock();
    let _awake = CpusAwake::start();
    let server = UdpEcho::start(false);
    let pp = common::udp_ping_pong_p50(server.addr, 32, 1000, Duration::from_micros(500));
    eprintln!("ping-pong p50 {pp:?}");
    let r = run_on_schedule(&config(
        server.addr,
        Transport::Udp,
        2000.0,
        Duration::from_millis(700),
    ));
    on_time(&r);
    assert_eq!(r.timeouts + r.errors + r.error_answers + r.unsent, 0);
    assert_eq!(r.completed, r.sent);
    assert!(
        (r.achieved_rps - r.offered_rps).abs() < 0.1 * r.offered_rps,
        "achieved {} of {} offered",
        r.achieved_rps,
        r.offered_rps
    );
    agrees(r.latency.p50_us, pp);
}

#[test]
fn tcp_latency_at_low_load_agrees_with_a_ping_pong() {
    let _serial = lock();
    let _awake = CpusAwake::start();
    let server = TcpServer::echo();
    let pp = common::tcp_ping_pong_p50(server.addr, 32, 1000, Duration::from_micros(500));
    // One connection, as the ping-pong's (a thread per connection on the
    // server side: more connections would wake more server threads).
    let cfg = config(
        server.addr,
        Transport::Tcp,
        2000.0,
        Duration::from_millis(700),
    );
    eprintln!("ping-pong p50 {pp:?}");
    let r = run_on_schedule(&cfg);
    on_time(&r);
    assert_eq!(r.timeouts + r.errors + r.error_answers + r.unsent, 0);
    assert_eq!(r.completed, r.sent);
    agrees(r.latency.p50_us, pp);
}

#[test]
fn thousands_of_tcp_connections_are_all_used() {
    let _serial = lock();
    let server = TcpServer::echo();
    let mut cfg = config(
        server.addr,
        Transport::Tcp,
        8000.0,
        Duration::from_millis(600),
    );
    cfg.arrivals = Arrivals::steady(Process::Constant, 8000.0, Duration::from_millis(600));
    cfg.warmup = Duration::ZERO;
    cfg.connections = 2000;
    cfg.threads = 2;
    cfg.timeout = Duration::from_secs(2);
    let r = run(&cfg);
    // 4,800 requests round-robin over 2,000 connections: each carries two
    // or three.
    assert_eq!(r.sent, 4800);
    assert_eq!(r.completed, 4800, "{:?}", r.error_kinds);
    assert_eq!(r.timeouts + r.errors + r.error_answers, 0);
    assert_eq!(r.connections, 2000);
    assert_eq!(server.accepted.load(Relaxed), 2000);
    assert_eq!(server.used.load(Relaxed), 2000);
}

#[test]
fn requests_the_server_drops_time_out() {
    let _serial = lock();
    let server = UdpEcho::start(true);
    let mut cfg = config(
        server.addr,
        Transport::Udp,
        1000.0,
        Duration::from_millis(500),
    );
    cfg.warmup = Duration::ZERO;
    cfg.timeout = Duration::from_millis(100);
    let r = run(&cfg);
    // Request ids are 1, 2, 3, …: the server drops the even half.
    assert!(r.sent > 300, "{} sent", r.sent);
    assert_eq!(
        r.timeouts,
        r.sent / 2,
        "{} timeouts of {} sent",
        r.timeouts,
        r.sent
    );
    assert_eq!(r.completed, r.sent - r.sent / 2);
    assert_eq!(r.errors + r.error_answers, 0);
    assert_eq!(server.echoed.load(Relaxed), r.completed);
}

#[test]
fn memcached_usr_over_tcp_preloads_keys_and_hits() {
    let _serial = lock();
    let server = TcpServer::start(common::memcached_connection);
    let mut cfg = config(
        server.addr,
        Transport::Tcp,
        2000.0,
        Duration::from_millis(500),
    );
    cfg.workload = Workload::Memcached(Memcached {
        mix: Mix::Usr,
        keys: 500,
        preload: true,
    });
    cfg.connections = 8;
    let r = run(&cfg);
    assert_eq!(r.protocol, "memcached-usr");
    assert!(r.sent > 500);
    assert_eq!(r.completed, r.sent, "{:?}", r.error_kinds);
    assert_eq!(r.timeouts + r.errors + r.error_answers + r.unmatched, 0);
    assert!(r.classes["get"].count > 0);
    // One connection for the preload, eight for the load.
    assert_eq!(server.accepted.load(Relaxed), 9);
}

#[test]
fn a_schedule_the_generator_cannot_keep_is_reported_saturated() {
    let _serial = lock();
    let server = UdpEcho::start(false);
    // Far beyond one debug-build worker on this machine.
    let mut cfg = config(server.addr, Transport::Udp, 2e6, Duration::from_millis(200));
    cfg.arrivals = Arrivals::steady(Process::Constant, 2e6, Duration::from_millis(200));
    cfg.warmup = Duration::ZERO;
    cfg.timeout = Duration::from_millis(100);
    let r = run(&cfg);
    assert!(r.generator_saturated);
    assert!(r.saturation_reason.is_some());
    assert!(r.summary().contains("GENERATOR SATURATED"));
    assert!(r.json().contains("\"generator_saturated\": true"));
}

#[test]
fn load_steps_are_reported_step_by_step() {
    let _serial = lock();
    let server = UdpEcho::start(false);
    let mut cfg = config(server.addr, Transport::Udp, 0.0, Duration::ZERO);
    cfg.arrivals = Arrivals {
        process: Process::Constant,
        steps: ginza_loadgen::schedule::parse_steps("1k:300ms,3k:300ms").unwrap(),
    };
    cfg.warmup = Duration::from_millis(100);
    let r = run(&cfg);
    assert_eq!(r.steps.len(), 2);
    let (a, b) = (&r.steps[0], &r.steps[1]);
    // The warm-up takes the first 100 ms of the first step.
    assert_eq!((a.sent, a.completed), (200, 200));
    assert_eq!((b.sent, b.completed), (900, 900));
    assert!((a.offered_rps - 1000.0).abs() < 1.0 && (b.offered_rps - 3000.0).abs() < 1.0);
    assert!((a.achieved_rps - 1000.0).abs() < 1.0 && (b.achieved_rps - 3000.0).abs() < 1.0);
    assert!((a.start_s - 0.1).abs() < 1e-9 && (b.start_s - 0.3).abs() < 1e-9);
    assert!(a.p50_us > 0.0 && b.p99_us >= b.p50_us);
    assert_eq!(r.sent, 1100);
}

#[test]
fn http_over_tcp_counts_error_statuses() {
    let _serial = lock();
    let server = TcpServer::start(common::http_connection);
    let mut cfg = config(
        server.addr,
        Transport::Tcp,
        1000.0,
        Duration::from_millis(400),
    );
    cfg.workload = Workload::Http(Http::new("/", "localhost").unwrap());
    cfg.connections = 3;
    let r = run(&cfg);
    assert!(r.sent > 150);
    assert_eq!(r.completed, r.sent, "{:?}", r.error_kinds);
    assert_eq!(r.timeouts + r.errors + r.error_answers + r.unmatched, 0);
    assert_eq!(server.used.load(Relaxed), 3);
    // A path the server does not have: every answer a 404, counted as an
    // error answer, none as a good one.
    cfg.workload = Workload::Http(Http::new("/missing", "localhost").unwrap());
    let r = run(&cfg);
    assert_eq!(r.error_answers, r.sent);
    assert_eq!(r.completed, 0);
}

#[test]
fn memcached_over_udp_matches_answers_by_request_id() {
    let _serial = lock();
    let server = common::MemcachedUdp::start();
    let mut cfg = config(
        server.addr,
        Transport::Udp,
        2000.0,
        Duration::from_millis(400),
    );
    cfg.workload = Workload::Memcached(Memcached {
        mix: Mix::Etc,
        keys: 100,
        preload: false,
    });
    cfg.connections = 2;
    let r = run(&cfg);
    assert_eq!(r.protocol, "memcached-etc");
    assert!(r.sent > 300);
    assert_eq!(r.completed, r.sent);
    assert_eq!(r.timeouts + r.errors + r.error_answers + r.unmatched, 0);
    assert!(r.classes["set"].count > 0 && r.classes["get"].count > r.classes["set"].count);
}

#[test]
fn calibration_measures_the_generators_own_capacity() {
    let _serial = lock();
    let r = ginza_loadgen::calibrate::calibrate(Duration::from_millis(300), vec![]).unwrap();
    let capacity = r.generator_capacity_rps_per_core.unwrap();
    // Offered far beyond one worker: it is saturated by construction, and
    // what it answered per CPU-second is its capacity (even a debug build
    // on this VM does thousands per second).
    assert!(r.generator_saturated);
    assert!(r.completed > 0 && r.generator_cpu_s > 0.0);
    assert!(
        (capacity - r.completed as f64 / r.generator_cpu_s).abs() < 1e-6 * capacity
            && capacity > 1000.0,
        "{capacity} req/s per core"
    );
    assert!(r.summary().contains("generator capacity"));
}

#[test]
fn a_tcp_server_that_never_answers_times_out_and_its_connections_close() {
    let _serial = lock();
    let server = TcpServer::start(common::silent_connection);
    let mut cfg = config(
        server.addr,
        Transport::Tcp,
        500.0,
        Duration::from_millis(600),
    );
    cfg.arrivals = Arrivals::steady(Process::Constant, 500.0, Duration::from_millis(600));
    cfg.warmup = Duration::ZERO;
    cfg.connections = 2;
    cfg.timeout = Duration::from_millis(100);
    let r = run(&cfg);
    assert_eq!(r.completed, 0);
    assert_eq!(r.sent + r.errors, 300, "every request sent or lost");
    // The requests on a connection until its oldest timed out are timeouts;
    // the schedule's later requests on the closed connection are errors.
    assert!(
        r.timeouts >= 2 && r.errors > 0,
        "{} timeouts, {} errors",
        r.timeouts,
        r.errors
    );
    assert_eq!(r.timeouts + r.errors, 300);
    assert_eq!(r.error_kinds["an answer timed out; connection closed"], 2);
}
