//! `scan-server` through the in-process iokerneld's software switch, with
//! Ginza clients: GET and SCAN over UDP and TCP (answers checked against
//! the same generated map), malformed requests answered BAD_REQUEST; and
//! Shinjuku mode over UDP, where long SCANs beside waiting GETs are
//! preempted. Every test starts iokerneld and holds the test lock.

mod http_scan_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ginza_apps::echo_server::Protocols;
use ginza_apps::scan_server::{
    self, key_at, mq_policy, Request, Response, ScanStats, Status, Store, RESPONSE_LEN,
};
use ginza_runtime::net::UdpSocket;
use ginza_runtime::shinjuku::dispatched::DispatchedConfig;
use ginza_runtime::shinjuku::ShinjukuConfig;
use http_scan_common::{connect, iface, lock, Switch};

const SERVER: u8 = 1;
const CLIENT: u8 = 2;
const PORT: u16 = 9090;
const SEED: u64 = 11;
const KEYS: u64 = 100_000;
/// The map of the preemption tests. A SCAN of all of it takes ~35 ms in a
/// debug build: well past a round trip on a 2-core machine that iokerneld
/// and the dispatcher keep spinning (4–16 ms measured, each hop waiting
/// for a scheduler tick), so GETs arrive while it runs.
const LONG_SCAN_KEYS: u64 = 1_000_000;
/// Rounds of the Shinjuku-mode test (`SCAN_ROUNDS` overrides).
const ROUNDS: u64 = 4;

fn server_addr() -> SocketAddrV4 {
    SocketAddrV4::new(iface(SERVER).1, PORT)
}

/// The requests every test sends (with ids 0..), valid ones.
fn requests() -> Vec<Request> {
    vec![
        Request::get(0, key_at(SEED, 5)),
        Request::get(1, key_at(SEED, 99_999)),
        Request::get(2, 12345), // almost surely missing
        Request::scan(3, 0, 100),
        Request::scan(4, key_at(SEED, 7), 1_000),
        Request::scan(5, u64::MAX - 1, 10), // past the end: fewer keys
    ]
}

/// Checks `got` against what the local copy of the map answers.
fn check(expected: &Store, sent: &Request, got: &Response) {
    assert_eq!(*got, expected.execute(sent), "{sent:?}");
}

/// Sends `request` over UDP and waits (retrying on loss) for its response.
fn udp_round_trip(socket: &UdpSocket, bytes: &[u8], id: u64) -> Response {
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    for _ in 0..20 {
        socket.send_to(bytes, server_addr()).unwrap();
        // A timeout means lost: send again.
        while let Ok((n, _)) = socket.recv_from(&mut buf) {
            let r = Response::decode(&buf[..n]).expect("a well-formed response");
            if r.id == id {
                return r;
            }
        }
    }
    panic!("no response to request {id}");
}

#[test]
fn get_and_scan_over_udp_and_tcp_agree_with_the_map() {
    let _lock = lock();
    let switch = Switch::start();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(ScanStats::default());
    let store = Arc::new(Store::generate(SEED, KEYS));
    let (s2, st2, store2) = (stop.clone(), stats.clone(), store.clone());
    let server = switch.start_app("scan-server", SERVER, 1, move || {
        scan_server::serve(PORT, Protocols::BOTH, store2, s2, st2)
    });
    let expected = Store::generate(SEED, KEYS);
    switch.run_client(CLIENT, move || {
        // UDP: one request per datagram.
        let socket = UdpSocket::bind(0).unwrap();
        for r in requests() {
            let got = udp_round_trip(&socket, &r.encode(), r.id);
            check(&expected, &r, &got);
        }
        let missing = udp_round_trip(&socket, &Request::get(2, 12345).encode(), 2);
        assert_eq!(missing.status, Status::NotFound);
        // Malformed datagrams: BAD_REQUEST with their id.
        let mut bad = Request::scan(77, 0, 5).encode();
        bad[8] = 9;
        assert_eq!(udp_round_trip(&socket, &bad, 77), Response::bad_request(77));
        let long = [&Request::get(78, 1).encode()[..], b"x"].concat();
        assert_eq!(
            udp_round_trip(&socket, &long, 78),
            Response::bad_request(78)
        );
        // TCP: every request (and a bad one) in one write; responses in order.
        let mut stream = connect(SocketAddr::V4(server_addr()));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut sent = requests();
        sent.insert(2, Request::scan(50, 0, 0)); // a SCAN of 0 keys is bad
        let wire: Vec<u8> = sent.iter().flat_map(|r| r.encode()).collect();
        // In two pieces, cut inside a request.
        stream.write_all(&wire[..30]).unwrap();
        ginza_runtime::yield_now();
        stream.write_all(&wire[30..]).unwrap();
        let mut back = vec![0u8; sent.len() * RESPONSE_LEN];
        stream.read_exact(&mut back).unwrap();
        for (r, got) in sent.iter().zip(back.chunks_exact(RESPONSE_LEN)) {
            let got = Response::decode(got).unwrap();
            if r.id == 50 {
                assert_eq!(got, Response::bad_request(50));
            } else {
                check(&expected, r, &got);
            }
        }
    });
    stop.store(true, Relaxed);
    server.join(Duration::from_secs(10)).expect("scan-server");
    // (At least: a UDP request is sent again if its answer is slow.)
    assert!(stats.scans.load(Relaxed) >= 6);
    assert!(stats.gets.load(Relaxed) >= 7);
    assert!(stats.bad_requests.load(Relaxed) >= 3);
    assert_eq!(stats.tcp_accepted.load(Relaxed), 1);
}

fn scan_rounds() -> u64 {
    std::env::var("SCAN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS)
}

/// From a client uthread: the short requests one at a time, then rounds
/// of one long SCAN (the whole map) with GETs sent one at a time until
/// the SCAN is answered, each GET answered before the next is sent. With
/// one worker, a GET that arrives while the SCAN runs is answered first
/// only if the SCAN is preempted; sending GETs until the SCAN is answered
/// makes sure some arrive while it runs, however the first ones were
/// timed. Every answer is checked against `expected`. Returns the number
/// of requests sent.
fn short_then_long_over_udp(expected: &Store) -> u64 {
    let socket = UdpSocket::bind(0).unwrap();
    // The short requests first, one at a time.
    let short = requests();
    for r in &short {
        check(expected, r, &udp_round_trip(&socket, &r.encode(), r.id));
    }
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut sent = short.len() as u64;
    let mut id = 100;
    let mut buf = [0u8; 64];
    for round in 0..scan_rounds() {
        let scan = Request::scan(id, 0, expected.len() as u32);
        socket.send_to(&scan.encode(), server_addr()).unwrap();
        id += 1;
        sent += 1;
        let mut scan_answered = false;
        let mut get_index = round * 1_000;
        while !scan_answered {
            let get = Request::get(id, key_at(SEED, get_index % expected.len() as u64));
            socket.send_to(&get.encode(), server_addr()).unwrap();
            id += 1;
            sent += 1;
            get_index += 1;
            loop {
                let (n, _) = socket.recv_from(&mut buf).unwrap_or_else(|e| {
                    panic!(
                        "round {round}: no answer to GET {} or SCAN {}: {e}",
                        get.id, scan.id
                    )
                });
                let got = Response::decode(&buf[..n]).unwrap();
                if got.id == scan.id {
                    check(expected, &scan, &got);
                    scan_answered = true;
                } else {
                    assert_eq!(
                        got.id, get.id,
                        "round {round}: an answer to no open request"
                    );
                    check(expected, &get, &got);
                    break;
                }
            }
        }
    }
    sent
}

#[test]
fn shinjuku_mode_preempts_long_scans_over_udp() {
    let _lock = lock();
    let switch = Switch::start();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(ScanStats::default());
    let store = Arc::new(Store::generate(SEED, LONG_SCAN_KEYS));
    let expected = Arc::clone(&store);
    let front = switch.config("scan-front", SERVER, 1);
    let shinjuku = ShinjukuConfig {
        workers: 1,
        policy: mq_policy(
            Duration::from_micros(20),
            Duration::from_micros(50),
            Duration::from_millis(5),
        ),
        ..ShinjukuConfig::default()
    };
    let (s2, st2) = (stop.clone(), stats.clone());
    let server = std::thread::spawn(move || {
        scan_server::run_shinjuku(front, shinjuku, PORT, true, store, s2, st2)
    });
    switch.wait_registered("scan-front", || server.is_finished());
    let sent = switch.run_client(CLIENT, move || {
        let sent = short_then_long_over_udp(&expected);
        // TCP beside it, run to completion on the front runtime.
        let mut stream = http_scan_common::connect(SocketAddr::V4(server_addr()));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let r = Request::scan(9, 0, 10);
        stream.write_all(&r.encode()).unwrap();
        let mut back = [0u8; RESPONSE_LEN];
        stream.read_exact(&mut back).unwrap();
        check(&expected, &r, &Response::decode(&back).unwrap());
        sent
    });
    stop.store(true, Relaxed);
    let summary = server
        .join()
        .expect("the server thread")
        .expect("scan-server in Shinjuku mode");
    println!("{summary:?}");
    assert!(summary.served >= sent, "{sent} sent: {summary:?}");
    assert!(
        summary.preempted_requests > 0,
        "no SCAN was preempted: {summary:?}"
    );
    assert!(summary.coop_preemptions + summary.signal_preemptions > 0);
    // A long SCAN a round, 3 short ones, 1 over TCP.
    assert!(stats.scans.load(Relaxed) >= scan_rounds() + 4);
}

/// The same GETs and long SCANs with the dispatch step on iokerneld's core
/// (`--dispatched`): c-PRE-MQ with the classes read from the op byte, one
/// worker kthread granted by the core allocator; every answer correct and
/// SCANs preempted.
#[test]
fn dispatched_mode_preempts_long_scans_over_udp() {
    let _lock = lock();
    let switch = Switch::start();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(ScanStats::default());
    let store = Arc::new(Store::generate(SEED, LONG_SCAN_KEYS));
    let expected = Arc::clone(&store);
    let io = switch
        .config("scan-dispatched", SERVER, 1)
        .iokernel
        .expect("an iokerneld configuration");
    let spec = scan_server::dispatch_spec(
        "c-pre-mq",
        Duration::from_micros(20),
        Duration::from_micros(50),
        Duration::from_millis(5),
        Some(Duration::from_micros(200)),
    );
    let cfg = DispatchedConfig::new(io, spec, PORT).with_workers(1);
    let (s2, st2) = (stop.clone(), stats.clone());
    let server = std::thread::spawn(move || scan_server::run_dispatched(cfg, store, &s2, st2));
    switch.wait_registered("scan-dispatched", || server.is_finished());
    let sent = switch.run_client(CLIENT, move || short_then_long_over_udp(&expected));
    // iokerneld dispatched them: its counters for the application agree.
    let dispatch = switch
        .get()
        .stats()
        .unwrap()
        .apps
        .into_iter()
        .find(|a| a.name == "scan-dispatched")
        .and_then(|a| a.dispatch)
        .expect("iokerneld's dispatch counters of the application");
    assert!(dispatch.ar >= sent, "{sent} sent: {dispatch:?}");
    assert!(
        dispatch.pe > 0,
        "iokerneld saw no preempted hand-back: {dispatch:?}"
    );
    stop.store(true, Relaxed);
    let report = server
        .join()
        .expect("the server thread")
        .expect("scan-server dispatched by iokerneld");
    println!("{report:?}");
    assert!(report.served >= sent, "{sent} sent: {report:?}");
    assert!(report.preempted > 0, "no SCAN was preempted: {report:?}");
    assert_eq!(report.rejected + report.panicked + report.send_errors, 0);
    assert!(stats.scans.load(Relaxed) >= scan_rounds() + 3);
}
