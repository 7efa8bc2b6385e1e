//! `scan-server` against Linux clients over a veth pair: iokerneld drives
//! the host end (AF_XDP), scan-server runs behind it in Shinjuku mode (UDP
//! through the workers, TCP run to completion on the front runtime), and
//! Linux sockets in the network namespace send GETs and SCANs, each answer
//! checked against the same generated map.
//!
//! Needs root, `ip` and `ethtool` (CI installs them); elsewhere the test
//! prints `skipped: …` (under CI as root it fails instead).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use ginza_apps::scan_server::{
    self, key_at, mq_policy, Request, Response, ScanStats, Store, RESPONSE_LEN,
};
use ginza_iokernel::netns::NetNs;
use ginza_net::MacAddr;
use ginza_runtime::net::NetConfig;
use ginza_runtime::shinjuku::ShinjukuConfig;
use ginza_runtime::{Class, Config, IokernelConfig};

const SCAN_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x05]);
const PORT: u16 = 9090;
const SEED: u64 = 5;
const KEYS: u64 = 100_000;

/// The requests sent, and what the map answers to each.
fn requests() -> Vec<Request> {
    let mut r = Vec::new();
    for i in 0..20u64 {
        r.push(Request::get(i, key_at(SEED, i * 37)));
    }
    r.push(Request::get(20, 3)); // almost surely missing
    r.push(Request::scan(21, 0, 50_000));
    r.push(Request::scan(22, key_at(SEED, 9), 2_000));
    r
}

#[test]
fn linux_clients_get_and_scan_from_scan_server_in_shinjuku_mode() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let daemon = Daemon::on(&ns, "af_xdp", |_| {});
    let mut io = IokernelConfig::new("scan-veth", Class::LatencyCritical);
    io.socket = Some(daemon.get().socket().to_path_buf());
    io.net = Some(NetConfig::new(SCAN_MAC, ns.peer_ip));
    let front = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(1)
    };
    let shinjuku = ShinjukuConfig {
        workers: 1,
        policy: mq_policy(
            Duration::from_micros(20),
            Duration::from_micros(50),
            Duration::from_millis(5),
        ),
        ..ShinjukuConfig::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(ScanStats::default());
    let store = Arc::new(Store::generate(SEED, KEYS));
    let (s2, st2) = (stop.clone(), stats.clone());
    let server = std::thread::spawn(move || {
        scan_server::run_shinjuku(front, shinjuku, PORT, true, store, s2, st2)
    });
    let t0 = std::time::Instant::now();
    while !daemon
        .get()
        .stats()
        .is_ok_and(|s| s.apps.iter().any(|a| a.name == "scan-veth"))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10) && !server.is_finished(),
            "scan-server did not register"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let target = SocketAddrV4::new(ns.peer_ip, PORT);
    let answers = ns
        .run_in(move || -> std::io::Result<(Vec<Response>, Vec<Response>)> {
            // UDP, one request at a time (sent again if lost).
            let socket = UdpSocket::bind("0.0.0.0:0")?;
            socket.set_read_timeout(Some(Duration::from_millis(500)))?;
            let mut udp = Vec::new();
            let mut buf = [0u8; 64];
            'next: for r in requests() {
                for _ in 0..20 {
                    socket.send_to(&r.encode(), target)?;
                    while let Ok((n, _)) = socket.recv_from(&mut buf) {
                        let got = Response::decode(&buf[..n]).expect("a well-formed response");
                        if got.id == r.id {
                            udp.push(got);
                            continue 'next;
                        }
                    }
                }
                return Err(std::io::Error::other(format!("no answer to {r:?}")));
            }
            // TCP: every request in one write, answers in order.
            let mut stream = TcpStream::connect_timeout(&target.into(), Duration::from_secs(10))?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            let wire: Vec<u8> = requests().iter().flat_map(|r| r.encode()).collect();
            stream.write_all(&wire)?;
            let mut back = vec![0u8; requests().len() * RESPONSE_LEN];
            stream.read_exact(&mut back)?;
            let tcp = back
                .chunks_exact(RESPONSE_LEN)
                .map(|b| Response::decode(b).expect("a well-formed response"))
                .collect();
            Ok((udp, tcp))
        })
        .unwrap();
    stop.store(true, Relaxed);
    let summary = server
        .join()
        .expect("the server thread")
        .expect("scan-server in Shinjuku mode");
    let (udp, tcp) = answers.unwrap_or_else(|e| panic!("the Linux client: {e}"));
    let expected = Store::generate(SEED, KEYS);
    for (r, (u, t)) in requests().iter().zip(udp.iter().zip(&tcp)) {
        assert_eq!(*u, expected.execute(r), "UDP {r:?}");
        assert_eq!(*t, expected.execute(r), "TCP {r:?}");
    }
    assert!(summary.served >= requests().len() as u64, "{summary:?}");
    assert_eq!(stats.tcp_accepted.load(Relaxed), 1);
}
