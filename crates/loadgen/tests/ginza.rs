//! The Ginza-runtime backend: the generator as a Ginza application against
//! `echo-server`'s library module (`ginza_apps::echo_server`) in another
//! runtime, both behind the in-process iokerneld's software switch (no root
//! needed). Holds the test lock: iokerneld spins.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_loadgen::ginza::{self, GinzaConfig};
use ginza_loadgen::protocol::echo::Echo;
use ginza_loadgen::protocol::spin::{ServiceTime, Spin};
use ginza_loadgen::protocol::{Transport, Workload};
use ginza_loadgen::schedule::{Arrivals, Process};
use ginza_loadgen::RunConfig;
use ginza_runtime::net::{MacAddr, NetConfig};
use ginza_runtime::{Class, Config, IokernelConfig};

const PORT: u16 = 7;

/// iokerneld spins while anything holds a core: one test at a time.
fn lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn mac(last: u8) -> MacAddr {
    MacAddr([0x02, 0x54, 0x00, 0x00, 0x0f, last])
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 9, 0, last)
}

/// iokerneld on a thread of the test, with its own socket directory.
struct Daemon {
    io: Option<InProcess>,
    socket: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    fn start() -> Daemon {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ginza-loadgen-iok-{}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        ));
        let socket = dir.join("iokerneld.sock");
        let mut cores = ginza_sys::affinity::allowed_cpus().unwrap();
        cores.truncate(2);
        let mut cfg = IokConfig::new(cores);
        cfg.socket = socket.clone();
        cfg.idle_sleep = Some(Duration::from_millis(1));
        cfg.validate(&ginza_sys::affinity::allowed_cpus().unwrap())
            .unwrap();
        Daemon {
            io: Some(InProcess::start(cfg).unwrap()),
            socket,
            dir,
        }
    }

    fn registered(&self, name: &str) -> bool {
        ginza_proto::client::stats(&self.socket)
            .is_ok_and(|s| s.apps.iter().any(|a| a.name == name))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        drop(self.io.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// echo-server (UDP and TCP on `PORT`) in its own runtime until dropped.
struct EchoServer {
    stop: Arc<AtomicBool>,
    stats: Arc<EchoStats>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    fn start(d: &Daemon) -> EchoServer {
        let mut io = IokernelConfig::new("echo-server", Class::LatencyCritical);
        io.socket = Some(d.socket.clone());
        io.net = Some(NetConfig::new(mac(1), ip(1)));
        let cfg = Config {
            iokernel: Some(io),
            ..Config::with_kthreads(1)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(EchoStats::default());
        let (s2, st2) = (stop.clone(), stats.clone());
        let thread = std::thread::spawn(move || {
            ginza_runtime::run(cfg, move || {
                echo_server::serve(PORT, Protocols::BOTH, s2, st2)
            })
            .unwrap()
            .unwrap()
        });
        let t0 = Instant::now();
        while !d.registered("echo-server") {
            assert!(
                t0.elapsed() < Duration::from_secs(10) && !thread.is_finished(),
                "echo-server did not register"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        EchoServer {
            stop,
            stats,
            thread: Some(thread),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn config(transport: Transport, connections: usize) -> RunConfig {
    RunConfig {
        target: SocketAddr::V4(SocketAddrV4::new(ip(1), PORT)),
        transport,
        workload: Workload::Echo(Echo { size: 32 }),
        arrivals: Arrivals::steady(Process::Poisson, 1000.0, Duration::from_millis(700)),
        // The server binds its sockets right after it registers; requests
        // of the warm-up that find no socket yet are not counted.
        warmup: Duration::from_millis(200),
        connections,
        threads: 1,
        // A deadline for the answer, not a measurement: on a loaded 2-CPU
        // machine a debug-build server can take longer than a second.
        timeout: Duration::from_secs(5),
        max_lag: Duration::from_millis(1),
        spin: Duration::ZERO,
        seed: 3,
        cpus: vec![],
        connect_timeout: Duration::from_secs(5),
    }
}

fn generator(d: &Daemon) -> GinzaConfig {
    GinzaConfig {
        mac: mac(2),
        ip: ip(2),
        socket: Some(d.socket.clone()),
        name: "loadgen".into(),
    }
}

#[test]
fn echo_over_udp_and_tcp_through_the_software_switch() {
    let _g = lock();
    let d = Daemon::start();
    let server = EchoServer::start(&d);

    let r = ginza::run(&config(Transport::Udp, 4), &generator(&d)).unwrap();
    eprintln!("{}", r.summary());
    assert_eq!(r.backend, "ginza");
    assert!(r.sent > 300, "{} sent", r.sent);
    // Every datagram answered or counted as timed out. Under load from
    // the builds beside the tests a datagram is lost now and then (seen
    // once in a dozen runs: an application descheduled long enough for a
    // queue to overflow), so a few losses pass; TCP below must lose none.
    assert_eq!(r.completed + r.timeouts, r.sent, "{:?}", r.error_kinds);
    assert!(
        r.completed * 10 >= r.sent * 9,
        "{} of {} answered",
        r.completed,
        r.sent
    );
    assert_eq!(r.errors + r.error_answers + r.unsent, 0);
    // Measured, and no longer than the answer deadline (a figure, not a
    // bound on speed: under a CPU hog it passed 10 ms).
    let deadline_us = config(Transport::Udp, 4).timeout.as_secs_f64() * 1e6;
    assert!(r.latency.p50_us > 0.0 && r.latency.p50_us <= deadline_us);
    assert!(server.stats.udp_echoed.load(Relaxed) >= r.completed);

    // TCP: the listener is up by now (bound right after the UDP socket).
    // Two kthreads: two senders, each with half the connections.
    let mut cfg = config(Transport::Tcp, 8);
    cfg.threads = 2;
    let r = ginza::run(&cfg, &generator(&d)).unwrap();
    eprintln!("{}", r.summary());
    assert_eq!(r.transport, "tcp");
    assert!(r.sent > 300, "{} sent", r.sent);
    assert_eq!(r.completed, r.sent, "{:?}", r.error_kinds);
    assert_eq!(r.timeouts + r.errors + r.error_answers + r.unmatched, 0);
    assert!(server.stats.tcp_accepted.load(Relaxed) >= 8);
    assert!(server.stats.tcp_bytes.load(Relaxed) >= 32 * r.completed);
}

#[test]
fn spin_requests_echoed_by_a_ginza_server_are_matched_by_their_header() {
    let _g = lock();
    let d = Daemon::start();
    let _server = EchoServer::start(&d);
    let mut cfg = config(Transport::Udp, 2);
    cfg.workload = Workload::Spin(Spin {
        service: ServiceTime::Bimodal {
            p: 0.5,
            short: Duration::from_micros(1),
            long: Duration::from_micros(100),
        },
        size: 48,
    });
    let r = ginza::run(&cfg, &generator(&d)).unwrap();
    eprintln!("{}", r.summary());
    // Every request is answered or counted as timed out; on this shared
    // machine a descheduled application can overflow a UDP queue now and
    // then, so a few losses are tolerated (none are usual).
    assert_eq!(r.completed + r.timeouts, r.sent);
    assert!(
        r.completed * 10 >= r.sent * 9,
        "{} of {} answered",
        r.completed,
        r.sent
    );
    assert_eq!(r.errors + r.error_answers + r.unmatched, 0);
    assert!(r.classes["short"].count > 50 && r.classes["long"].count > 50);
}

#[test]
fn hundreds_of_tcp_connections_through_the_switch() {
    let _g = lock();
    let d = Daemon::start();
    let server = EchoServer::start(&d);
    // Wait until the echo server listens: a UDP round of the warm-up.
    let r = ginza::run(&config(Transport::Udp, 1), &generator(&d)).unwrap();
    assert_eq!(r.completed, r.sent);
    let mut cfg = config(Transport::Tcp, 500);
    cfg.arrivals = Arrivals::steady(Process::Constant, 2000.0, Duration::from_millis(700));
    cfg.threads = 2;
    let r = ginza::run(&cfg, &generator(&d)).unwrap();
    eprintln!("{}", r.summary());
    assert_eq!(r.sent, 1000);
    assert_eq!(r.completed, r.sent, "{:?}", r.error_kinds);
    assert_eq!(r.timeouts + r.errors + r.error_answers + r.unmatched, 0);
    assert!(server.stats.tcp_accepted.load(Relaxed) >= 500);
}
