//! The direct path (docs/direct-path.md) over a veth pair: iokerneld drives
//! the host end with AF_XDP opened for it (`af_xdp:IF,direct`), the echo
//! server's runtime binds an AF_XDP socket of its own to receive queue 1,
//! and the namespace's end transmits on queue 1 (XPS: every CPU there sends
//! on transmit queue 1, which a veth delivers on receive queue 1). A Linux
//! UDP client in the namespace gets every datagram echoed, and iokerneld's
//! NIC counters show that none of the frames, either way, went through it.
//!
//! Needs root, `ip` and `ethtool`; skipped otherwise (failed under CI as
//! root).

mod common;

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Daemon;
use ginza_apps::echo_server::{self, EchoStats};
use ginza_iokernel::netns::{self, NetNs};
use ginza_net::MacAddr;
use ginza_runtime::net::NetConfig;

const ECHO_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x09]);
const PORT: u16 = 7;
/// The queue the application's own socket is bound to.
const QUEUE: u32 = 1;
const DATAGRAMS: usize = 200;

/// Every CPU of the namespace's end transmits on `queue` (XPS).
fn steer_peer_to_queue(ns: &NetNs, queues: u32, queue: u32) {
    ns.steer_transmit_to_queue(queues, queue).unwrap();
}

/// A veth with two queues whose namespace end transmits on [`QUEUE`],
/// iokerneld on its host end with `,direct`, and the network of an
/// application with its own socket on that queue; `None` (the test
/// skipped) where the veth cannot be made.
fn direct_setup() -> Option<(NetNs, Daemon, NetConfig)> {
    let ns = NetNs::create_with_queues_or_skip(2)?;
    steer_peer_to_queue(&ns, 2, QUEUE);
    let daemon = Daemon::direct(&ns);
    let net = NetConfig::new(ECHO_MAC, ns.peer_ip).with_direct_path(&ns.host_if, QUEUE);
    Some((ns, daemon, net))
}

/// Waits until `app` says its stack is up (`ready`); fails the test if it
/// returns first or takes 10 s.
fn wait_for_stack<T>(ready: &AtomicBool, app: &common::App<T>) {
    let t0 = Instant::now();
    while !ready.load(Relaxed) {
        assert!(
            t0.elapsed() < Duration::from_secs(10) && !app.is_finished(),
            "the application's stack did not come up"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_linux_udp_client_is_echoed_through_the_applications_own_socket() {
    let _lock = common::lock();
    let Some((ns, daemon, net)) = direct_setup() else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (s2, st2, r2) = (stop.clone(), stats.clone(), ready.clone());
    let app = daemon.start_app_with("echo-direct", net, 1, move || {
        // The stack is there once iokerneld has taken the own socket.
        while ginza_runtime::net::stats().is_none() {
            ginza_runtime::sleep(Duration::from_millis(1));
        }
        r2.store(true, Relaxed);
        let served = echo_server::serve_udp(PORT, s2, st2);
        (
            served.map_err(|e| e.to_string()),
            ginza_runtime::net::stats(),
        )
    });
    wait_for_stack(&ready, &app);
    let before = daemon.get().stats().unwrap().dataplane;

    let (bind, target) = (
        SocketAddrV4::new(ns.ns_ip, 0),
        SocketAddrV4::new(ns.peer_ip, PORT),
    );
    let rtts = ns
        .run_in(move || {
            netns::udp_rtt_probe(bind, target, DATAGRAMS, 100, Duration::from_millis(500))
        })
        .unwrap()
        .unwrap();
    let answered = rtts.iter().filter(|r| r.is_some()).count();

    // Parked, the application is woken by iokerneld for frames waiting on
    // its own socket alone (its ingress rings stay empty): its rx ring is
    // queued work.
    let app_stats = || {
        let report = daemon.get().stats().unwrap();
        report
            .apps
            .into_iter()
            .find(|a| a.name == "echo-direct")
            .expect("registered")
    };
    let t0 = Instant::now();
    while app_stats().cores_now > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the application never parked"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let parked = app_stats();
    let woken = ns
        .run_in(move || netns::udp_rtt_probe(bind, target, 20, 100, Duration::from_millis(500)))
        .unwrap()
        .unwrap();
    let woken_at = app_stats();
    let after = daemon.get().stats().unwrap().dataplane;
    stop.store(true, Relaxed);
    let (served, net) = app.join(Duration::from_secs(10));
    served.expect("echo-server");
    let net = net.expect("the runtime's network stats");
    let mut sorted: Vec<Duration> = rtts.iter().flatten().copied().collect();
    sorted.sort();
    println!(
        "direct path: {answered} of {DATAGRAMS} echoed, p50 {:?}; own socket rx {} tx {}; \
         iokerneld's NIC rx {} tx {} before, {} {} after",
        sorted.get(sorted.len() / 2),
        net.direct_rx_packets,
        net.direct_tx_packets,
        before.nic_rx_frames,
        before.nic_tx_frames,
        after.nic_rx_frames,
        after.nic_tx_frames
    );
    let woken_max = woken.iter().flatten().max();
    println!(
        "parked after {} grants: {} of 20 echoed (slowest {woken_max:?}), {} grants after",
        parked.grants,
        woken.iter().flatten().count(),
        woken_at.grants
    );
    assert_eq!(
        answered, DATAGRAMS,
        "{answered} of {DATAGRAMS} datagrams echoed"
    );
    assert!(
        woken.iter().all(Option::is_some),
        "echoed after parking: {woken:?}"
    );
    assert!(
        woken_at.grants > parked.grants,
        "iokerneld granted a core for them"
    );
    assert_eq!(stats.udp_echoed.load(Relaxed), DATAGRAMS as u64 + 20);
    // Every datagram (and the ARP exchange) came in on the own socket and
    // its echo left from there.
    assert!(net.direct_rx_packets >= DATAGRAMS as u64, "{net:?}");
    assert!(net.direct_tx_packets >= DATAGRAMS as u64, "{net:?}");
    // None of them went through iokerneld: zero copies between it and the
    // application.
    assert_eq!(
        after.nic_rx_frames, before.nic_rx_frames,
        "frames iokerneld received"
    );
    assert_eq!(
        after.nic_tx_frames, before.nic_tx_frames,
        "frames iokerneld sent"
    );
}

/// A reply sent while nothing else waits to run on the kthread leaves at
/// once (`sched::flush_own_tx_if_alone`): its kick is made inside the
/// uthread's `send_to`, not when the uthread next blocks or yields, so a
/// program's work after its send (an event loop's bookkeeping) does not
/// delay the answer. The second of two exchanges is checked (the first
/// may wait for ARP).
#[test]
fn a_lone_reply_on_the_own_socket_is_kicked_inside_its_send() {
    let _lock = common::lock();
    let Some((ns, daemon, net)) = direct_setup() else {
        return;
    };
    let ready = Arc::new(AtomicBool::new(false));
    let r2 = ready.clone();
    let app = daemon.start_app_with("lone-reply", net, 1, move || {
        while ginza_runtime::net::stats().is_none() {
            ginza_runtime::sleep(Duration::from_millis(1));
        }
        let socket = ginza_runtime::net::UdpSocket::bind(PORT).map_err(|e| e.to_string())?;
        r2.store(true, Relaxed);
        let kicks = || ginza_runtime::net::stats().map_or(0, |s| s.direct_tx_kicks);
        let mut buf = [0u8; 256];
        let mut last = (0, 0);
        for _ in 0..2 {
            let (n, from) = socket.recv_from(&mut buf).map_err(|e| e.to_string())?;
            let before = kicks();
            socket.send_to(&buf[..n], from).map_err(|e| e.to_string())?;
            // No yield in between: only a kick inside `send_to` counts.
            last = (before, kicks());
        }
        Ok::<_, String>(last)
    });
    wait_for_stack(&ready, &app);
    let (bind, target) = (
        SocketAddrV4::new(ns.ns_ip, 0),
        SocketAddrV4::new(ns.peer_ip, PORT),
    );
    let rtts = ns
        .run_in(move || netns::udp_rtt_probe(bind, target, 2, 64, Duration::from_secs(2)))
        .unwrap()
        .unwrap();
    let (before, after) = app.join(Duration::from_secs(10)).expect("the server");
    assert!(rtts.iter().all(Option::is_some), "both echoed: {rtts:?}");
    assert!(
        after > before,
        "the reply was still on the tx ring when `send_to` returned ({before} kicks before, {after} after)"
    );
}

/// Rounds of the comparison below, and round trips per server and round.
const ROUNDS: usize = 5;
const PER_ROUND: usize = 2000;

/// A measurement, not a check (run it in release: `cargo test --release
/// -p ginza-apps --test direct_path_veth -- --ignored --nocapture`): UDP
/// round trips from a Linux client to two echo servers behind one
/// iokerneld on `af_xdp:IF,direct`, one on its own socket (queue 1), one
/// on the switch path (queue 0), in interleaved rounds; XPS in the
/// namespace moves the client's frames to the queue of the server it
/// probes. Both runtimes as configured by default (their kthread parks).
/// Prints the medians over the rounds of each round's p50 and p99.
#[test]
#[ignore = "a measurement: run it in release with --ignored --nocapture"]
fn round_trips_direct_and_switched_interleaved() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_with_queues_or_skip(2) else {
        return;
    };
    let daemon = Daemon::direct(&ns);
    let [a, b, c, _] = ns.ns_ip.octets();
    let switched_ip = ginza_net::Ipv4Addr::new(a, b, c, 4);
    let stop = Arc::new(AtomicBool::new(false));
    let mut apps = Vec::new();
    for (name, net) in [
        (
            "echo-direct",
            NetConfig::new(ECHO_MAC, ns.peer_ip).with_direct_path(&ns.host_if, QUEUE),
        ),
        (
            "echo-switched",
            NetConfig::new(MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x0a]), switched_ip),
        ),
    ] {
        let (s2, st2) = (stop.clone(), Arc::new(EchoStats::default()));
        let ready = Arc::new(AtomicBool::new(false));
        let r2 = ready.clone();
        let app = daemon.start_app_with(name, net, 1, move || {
            while ginza_runtime::net::stats().is_none() {
                ginza_runtime::sleep(Duration::from_millis(1));
            }
            r2.store(true, Relaxed);
            echo_server::serve_udp(PORT, s2, st2).map_err(|e| e.to_string())
        });
        let t0 = Instant::now();
        while !ready.load(Relaxed) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{name} did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        apps.push(app);
    }
    let percentile = |sorted: &[Duration], p: usize| sorted[(sorted.len() - 1) * p / 100];
    let mut rounds: [Vec<(Duration, Duration)>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (i, (queue, ip)) in [(QUEUE, ns.peer_ip), (0, switched_ip)]
            .into_iter()
            .enumerate()
        {
            steer_peer_to_queue(&ns, 2, queue);
            let (bind, target) = (SocketAddrV4::new(ns.ns_ip, 0), SocketAddrV4::new(ip, PORT));
            let rtts = ns
                .run_in(move || {
                    netns::udp_rtt_probe(bind, target, PER_ROUND, 64, Duration::from_millis(500))
                })
                .unwrap()
                .unwrap();
            let mut sorted: Vec<Duration> = rtts.iter().flatten().copied().collect();
            assert_eq!(sorted.len(), PER_ROUND, "every datagram echoed ({ip})");
            sorted.sort();
            rounds[i].push((percentile(&sorted, 50), percentile(&sorted, 99)));
        }
    }
    stop.store(true, Relaxed);
    for app in apps {
        app.join(Duration::from_secs(10)).expect("echo-server");
    }
    for (i, name) in ["direct (own socket)", "switch path"]
        .into_iter()
        .enumerate()
    {
        let mut p50: Vec<Duration> = rounds[i].iter().map(|r| r.0).collect();
        let mut p99: Vec<Duration> = rounds[i].iter().map(|r| r.1).collect();
        p50.sort();
        p99.sort();
        println!(
            "{name}: p50 {:?}, p99 {:?} (medians of {ROUNDS} rounds of {PER_ROUND}; rounds' p50 {:?})",
            p50[ROUNDS / 2],
            p99[ROUNDS / 2],
            rounds[i].iter().map(|r| r.0).collect::<Vec<_>>()
        );
    }
}

/// The AF_XDP sockets this process has open.
fn own_xsk_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&fd| {
            // SAFETY: only borrowed for the `getsockopt` below; a descriptor
            // closed meanwhile (the directory's own) just fails it.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            ginza_sys::xsk::is_xsk(fd)
        })
        .count()
}

/// A TCP echo server on the direct path serves a Linux client, then
/// exits; at once another socket binds to its queue. (After `ginza bench
/// tcp`'s direct rounds the queue stayed bound, `EBUSY`, for over 10 s:
/// docs/direct-path.md.)
#[test]
fn a_tcp_servers_queue_is_bound_again_right_after_it_exits() {
    let _lock = common::lock();
    let Some((ns, daemon, net)) = direct_setup() else {
        return;
    };
    let xsks_before = own_xsk_count();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let app = daemon.start_app_with("tcp-direct", net, 1, move || {
        echo_server::serve_tcp(PORT, s2, st2).map_err(|e| e.to_string())
    });
    let target = SocketAddrV4::new(ns.peer_ip, PORT);
    // The runtime listens once it has registered: retry a refused connect.
    let t0 = Instant::now();
    let trips = loop {
        let probed = ns
            .run_in(move || netns::tcp::rtt_probe(target, 10, 200, 64, Duration::from_secs(5)))
            .unwrap();
        match probed {
            Ok(report) => break report.histogram.len(),
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("the TCP round trips: {e}"),
        }
    };
    assert_eq!(trips, 200);
    stop.store(true, Relaxed);
    app.join(Duration::from_secs(10))
        .expect("the TCP echo server");
    let exited = Instant::now();

    let deadline = exited + Duration::from_secs(3);
    let bound = loop {
        match ns.own_socket(QUEUE, 32) {
            Ok(xsk) => break Ok(xsk),
            Err(_) if Instant::now() < deadline => {}
            Err(e) => break Err(e),
        }
    };
    let waited = exited.elapsed();
    let registered = daemon
        .get()
        .stats()
        .unwrap()
        .apps
        .iter()
        .any(|a| a.name == "tcp-direct");
    let xsks_after = own_xsk_count();
    println!(
        "rebound queue {QUEUE} after {waited:?}: {}; AF_XDP sockets open: {xsks_before} before \
         the server, {xsks_after} after (the new one included if bound); still registered: \
         {registered}",
        bound
            .as_ref()
            .map_or_else(|e| e.to_string(), |_| "ok".into())
    );
    bound.unwrap_or_else(|e| {
        panic!(
            "queue {QUEUE} not free {waited:?} after the TCP server exited: {e} \
             (AF_XDP sockets of this process: {xsks_before} before it, {xsks_after} now; \
             iokerneld still lists it: {registered})"
        )
    });
}
