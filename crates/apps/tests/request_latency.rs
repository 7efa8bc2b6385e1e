//! Per-request latency end to end (docs/metrics.md,
//! `ginza_app_request_latency_seconds`): kv-server (TCP and UDP),
//! http-server and spin-server each run in a runtime of their own under
//! an in-process iokerneld serving its metrics; a Ginza client runtime
//! sends them requests one at a time through the software switch; a
//! scrape, read by the Prometheus reference parser, must then show for
//! each server a histogram whose count is the requests it served (by its
//! own counters), whose buckets are whole, and whose figures fit what the
//! requests were (spin-server's spin 30 µs each, so none may be faster).
//!
//! Starts iokerneld and busy-polling runtimes: run it under the heavy-test
//! lock.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_apps::echo_server::Protocols;
use ginza_apps::http_server::{self, HttpStats};
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::Kv;
use ginza_apps::spin_server::{self, SpinStats};
use ginza_iokernel::testing::in_process;
use ginza_iokernel::testing::scrape::reference_samples;
use ginza_metrics::testing::{scrape, value, Sample};
use ginza_net::{Ipv4Addr, MacAddr};
use ginza_proto::RequestHeader;
use ginza_runtime::net::{NetConfig, TcpStream, UdpSocket};
use ginza_runtime::{Class, Config, IokernelConfig};

const KV_IP: Ipv4Addr = Ipv4Addr::new(10, 36, 0, 1);
const HTTP_IP: Ipv4Addr = Ipv4Addr::new(10, 36, 0, 2);
const SPIN_IP: Ipv4Addr = Ipv4Addr::new(10, 36, 0, 3);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 36, 0, 9);
const KV_PORT: u16 = 11211;
const HTTP_PORT: u16 = 8080;
const SPIN_PORT: u16 = 7000;
const WAIT: Duration = Duration::from_secs(20);

/// Each spin-server request spins this long: no latency can be shorter.
const SPIN_NS: u64 = 30_000;

fn app_config(socket: &std::path::Path, name: &str, last: u8, ip: Ipv4Addr) -> Config {
    let mut io = IokernelConfig::new(name, Class::LatencyCritical);
    io.socket = Some(socket.to_path_buf());
    io.net = Some(NetConfig::new(
        MacAddr([0x02, 0x4c, 0x41, 0x54, 0x00, last]),
        ip,
    ));
    Config {
        iokernel: Some(io),
        ..Config::with_kthreads(1)
    }
}

fn count(s: &[Sample], app: &str) -> Option<f64> {
    value(
        s,
        "ginza_app_request_latency_seconds_count",
        &[("app", app)],
    )
}

fn bucket(s: &[Sample], app: &str, le: &str) -> f64 {
    value(
        s,
        "ginza_app_request_latency_seconds_bucket",
        &[("app", app), ("le", le)],
    )
    .unwrap_or_else(|| {
        let les: Vec<_> = s
            .iter()
            .filter(|x| x.name == "ginza_app_request_latency_seconds_bucket")
            .map(|x| format!("{:?}", x.labels))
            .collect();
        panic!("no bucket le={le} for {app}: {les:?}")
    })
}

/// A kv text request over TCP and its whole reply (ending in `end`).
fn kv_request(s: &mut TcpStream, req: &str, end: &str) -> String {
    s.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while !got.ends_with(end.as_bytes()) {
        let n = s
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("no kv reply to {req:?}: {e}"));
        assert!(n > 0, "kv-server closed after {req:?}");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(got).unwrap()
}

/// One HTTP/1.1 GET on a kept-alive connection, its body read whole.
fn http_get(s: &mut TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: ginza\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(h) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..h]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("a Content-Length");
            if got.len() >= h + 4 + len {
                assert!(head.starts_with("http/1.1 200"), "{head}");
                return String::from_utf8_lossy(&got[h + 4..h + 4 + len]).into_owned();
            }
        }
        let n = s
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("no HTTP response: {e}"));
        assert!(n > 0, "http-server closed");
        got.extend_from_slice(&buf[..n]);
    }
}

/// A datagram to `to` and its reply, sent again while none comes (so the
/// server may see a request more than once: the test compares with the
/// server's own count).
fn udp_exchange(udp: &UdpSocket, to: SocketAddrV4, request: &[u8]) -> Vec<u8> {
    let t0 = Instant::now();
    loop {
        udp.send_to(request, to).unwrap();
        let mut buf = [0u8; 2048];
        match udp.recv_from(&mut buf) {
            Ok((n, _)) => return buf[..n].to_vec(),
            Err(_) if t0.elapsed() < WAIT => continue,
            Err(e) => panic!("no UDP reply from {to}: {e}"),
        }
    }
}

fn connect(ip: Ipv4Addr, port: u16) -> TcpStream {
    let addr = SocketAddr::V4(SocketAddrV4::new(ip, port));
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                // A reply that never comes fails the test, not hangs it.
                s.set_read_timeout(Some(WAIT)).unwrap();
                return s;
            }
            Err(e) if t0.elapsed() < WAIT => {
                let _ = e;
                ginza_runtime::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// A server runtime on a thread of its own.
fn server<F>(cfg: Config, body: F) -> std::thread::JoinHandle<()>
where
    F: FnOnce() -> std::io::Result<()> + Send + 'static,
{
    std::thread::spawn(move || {
        ginza_runtime::run(cfg, body)
            .expect("the server's runtime")
            .expect("the server");
    })
}

#[test]
fn each_server_reports_every_request_it_served() {
    let dir = std::env::temp_dir().join(format!("ginza-request-latency-{}", std::process::id()));
    let (io, socket) = in_process(&dir, |c| c.metrics = Some("127.0.0.1:0".parse().unwrap()));
    let metrics = io.metrics_addr().expect("metrics served");

    let stop = Arc::new(AtomicBool::new(false));
    let kv = Kv::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
    let http_stats = Arc::new(HttpStats::default());
    let spin_stats = Arc::new(SpinStats::default());
    let servers = [
        server(app_config(&socket, "kv", 1, KV_IP), {
            let (kv, stop) = (kv.clone(), stop.clone());
            move || ginza_apps::kv::server::serve(KV_PORT, Protocols::BOTH, kv, stop)
        }),
        server(app_config(&socket, "http", 2, HTTP_IP), {
            let (stats, stop) = (http_stats.clone(), stop.clone());
            move || http_server::serve(HTTP_PORT, stop, stats)
        }),
        server(app_config(&socket, "spin", 3, SPIN_IP), {
            let (stats, stop) = (spin_stats.clone(), stop.clone());
            move || spin_server::serve(SPIN_PORT, stop, stats)
        }),
    ];

    const KV_TCP: usize = 40;
    const KV_UDP: usize = 30;
    const HTTP: usize = 40;
    const SPIN: usize = 50;
    ginza_runtime::run(app_config(&socket, "client", 9, CLIENT_IP), || {
        let mut s = connect(KV_IP, KV_PORT);
        for i in 0..KV_TCP / 2 {
            let set = format!("set k{i} 0 0 1\r\n{}\r\n", i % 10);
            assert_eq!(kv_request(&mut s, &set, "\r\n"), "STORED\r\n");
            let got = kv_request(&mut s, &format!("get k{i}\r\n"), "END\r\n");
            assert!(got.starts_with(&format!("VALUE k{i} 0 1\r\n")), "{got}");
        }
        eprintln!("kv over TCP: {KV_TCP} requests answered");
        let udp = UdpSocket::bind(0).unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        for i in 0..KV_UDP {
            let mut frame = vec![0, i as u8, 0, 0, 0, 1, 0, 0];
            frame.extend_from_slice(b"get k1\r\n");
            let reply = udp_exchange(&udp, SocketAddrV4::new(KV_IP, KV_PORT), &frame);
            assert_eq!(&reply[8..], b"VALUE k1 0 1\r\n1\r\nEND\r\n");
        }
        eprintln!("kv over UDP: {KV_UDP} requests answered");
        let mut h = connect(HTTP_IP, HTTP_PORT);
        for _ in 0..HTTP {
            assert_eq!(http_get(&mut h).as_bytes(), http_server::ROOT_BODY);
        }
        eprintln!("http: {HTTP} requests answered");
        for seq in 0..SPIN as u64 {
            let mut req = vec![0u8; 64];
            RequestHeader {
                seq,
                send_ns: 0,
                service_ns: SPIN_NS,
            }
            .encode(&mut req);
            let reply = udp_exchange(&udp, SocketAddrV4::new(SPIN_IP, SPIN_PORT), &req);
            assert_eq!(RequestHeader::decode(&reply).map(|h| h.seq), Some(seq));
        }
    })
    .expect("the client's runtime");

    // What each server says it served (read again at each scrape: a
    // datagram the client sent twice may still be answered).
    let served = || {
        [
            (
                "kv",
                KV_TCP as f64 + kv.stats.udp_requests.load(Relaxed) as f64,
            ),
            ("http", http_stats.ok.load(Relaxed) as f64),
            ("spin", spin_stats.served.load(Relaxed) as f64),
        ]
    };
    // Published every 100 ms: scrape until every figure is in.
    let t0 = Instant::now();
    let (samples, expected) = loop {
        let expected = served();
        let text = scrape(metrics).unwrap();
        let Some(s) = reference_samples(&text) else {
            stop.store(true, Relaxed);
            return;
        };
        if expected.iter().all(|&(app, n)| count(&s, app) == Some(n)) && expected == served() {
            break (s, expected);
        }
        assert!(
            t0.elapsed() < WAIT,
            "the requests never reached the metrics (want {expected:?}):\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let [(_, kv_served), (_, http_served), (_, spin_served)] = expected;
    assert!(kv_served >= (KV_TCP + KV_UDP) as f64);
    assert_eq!(http_served, HTTP as f64);
    assert!(spin_served >= SPIN as f64);
    for (app, n) in expected {
        let sum = value(
            &samples,
            "ginza_app_request_latency_seconds_sum",
            &[("app", app)],
        );
        eprintln!(
            "{app}: {n} requests, mean {:.1} µs, at most 20 µs: {}, at most 100 µs: {}",
            sum.unwrap_or(0.0) / n * 1e6,
            bucket(&samples, app, "0.00002"),
            bucket(&samples, app, "0.0001"),
        );
        assert_eq!(
            count(&samples, app),
            Some(n),
            "{app}: one sample per request served"
        );
        assert_eq!(
            bucket(&samples, app, "+Inf"),
            n,
            "{app}: the buckets are whole"
        );
        let sum = value(
            &samples,
            "ginza_app_request_latency_seconds_sum",
            &[("app", app)],
        )
        .unwrap();
        let mean = sum / n;
        assert!(
            mean > 0.0 && mean < 1.0,
            "{app}: a mean latency of {mean} s is not plausible"
        );
        // A request answered through the switch takes more than 500 ns
        // and well under a second here.
        assert!(
            bucket(&samples, app, "1.0") == n,
            "{app}: a request over 1 s"
        );
    }
    // spin-server's requests spin 30 µs: none fits under 20 µs, and
    // the mean is at least the spin.
    assert_eq!(bucket(&samples, "spin", "0.00002"), 0.0);
    let spin_sum = value(
        &samples,
        "ginza_app_request_latency_seconds_sum",
        &[("app", "spin")],
    )
    .unwrap();
    assert!(spin_sum / spin_served >= SPIN_NS as f64 / 1e9);

    stop.store(true, Relaxed);
    for s in servers {
        s.join().expect("a server thread");
    }
    drop(io);
    let _ = std::fs::remove_dir_all(&dir);
}
