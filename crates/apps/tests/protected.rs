//! The applications in protected mode, chosen by their flags alone: the
//! same echo-server and http-server code (and http-server's asynchronous
//! event loop) serving connections through a fake netstack that speaks the
//! protected channel (`ginza_runtime::net::protected::testing`): real
//! read-only receive memory, the application's tx pool read through its
//! memfd. Standalone runtimes (`--standalone`): no iokerneld, no root.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use clap::Parser;
use ginza_apps::app_args::AppArgs;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_apps::http_async::serve_async;
use ginza_apps::http_server::{self, HttpStats};
use ginza_apps::kv::server as kv_server;
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::Kv;
use ginza_runtime::net::protected::testing::FakeNetstack;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    app: AppArgs,
}

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ginza-apps-netstack-{}-{name}", std::process::id()))
}

/// The runtime configuration the binaries build from their flags.
fn protected_args(path: &Path) -> AppArgs {
    let flag = format!("--protected={}", path.display());
    Cli::try_parse_from(["app", flag.as_str(), "--standalone"])
        .unwrap()
        .app
}

fn client(last: u8) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 47, 9, last), 50000 + u16::from(last))
}

#[test]
fn echo_server_serves_through_the_netstack_by_configuration() {
    let path = socket("echo");
    let net = FakeNetstack::new(&path, 2, 64);
    let args = protected_args(&path);
    assert!(!args.serve_udp(false).unwrap(), "TCP only when protected");
    let config = args.runtime_config("echo-server");
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    std::thread::scope(|s| {
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let server = s.spawn(move || {
            ginza_runtime::run(config, move || {
                let tcp_only = Protocols {
                    udp: false,
                    tcp: true,
                };
                echo_server::serve(7, tcp_only, stop2, stats2)
            })
            .unwrap()
        });
        net.wait_listening(7);
        let peers: Vec<_> = (1..=3).map(|i| net.connect_in(7, client(i))).collect();
        for (i, p) in peers.iter().enumerate() {
            let msg = vec![b'a' + i as u8; 3000 + i * 1000];
            p.deliver(&msg);
            assert_eq!(p.expect_bytes(msg.len()), msg);
        }
        for p in &peers {
            p.close();
            p.wait_app_closed();
        }
        stop.store(true, Relaxed);
        server.join().unwrap().unwrap();
    });
    assert_eq!(stats.tcp_accepted.load(Relaxed), 3);
    assert_eq!(stats.tcp_bytes.load(Relaxed), 3000 + 4000 + 5000);
    net.wait_rx_returned();
    assert!(net.refused().is_empty(), "{:?}", net.refused());
}

fn http_exchange(net: &FakeNetstack, port: u16) {
    net.wait_listening(port);
    let p = net.connect_in(port, client(7));
    // Two pipelined requests, the second split across deliveries.
    p.deliver(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /bytes/100000 HTTP/1.1\r\nHo");
    p.deliver(b"st: a\r\nConnection: close\r\n\r\n");
    let head_end = |b: &[u8], from: usize| {
        b[from..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|i| from + i + 4)
    };
    // Wait for the first response's head, then its body, then the second.
    let mut got = p.expect_bytes(1);
    while head_end(&got, 0).is_none() {
        got = p.expect_bytes(got.len() + 1);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let first_len: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let first_end = head_end(&got, 0).unwrap() + first_len;
    let mut all = p.expect_bytes(first_end + 1);
    while head_end(&all, first_end).is_none() {
        all = p.expect_bytes(all.len() + 1);
    }
    let second_head =
        String::from_utf8_lossy(&all[first_end..head_end(&all, first_end).unwrap()]).to_string();
    assert!(second_head.starts_with("HTTP/1.1 200"), "{second_head}");
    assert!(
        second_head.contains("Content-Length: 100000"),
        "{second_head}"
    );
    let total = head_end(&all, first_end).unwrap() + 100_000;
    let all = p.expect_bytes(total);
    assert_eq!(all.len(), total, "nothing beyond the second response");
    // `Connection: close`: the server shuts down writing.
    p.wait_app_shut();
    p.close();
    p.wait_app_closed();
}

#[test]
fn http_server_serves_through_the_netstack_by_configuration() {
    let path = socket("http");
    let net = FakeNetstack::new(&path, 2, 64);
    let config = protected_args(&path).runtime_config("http-server");
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(HttpStats::default());
    std::thread::scope(|s| {
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let server = s.spawn(move || {
            ginza_runtime::run(config, move || http_server::serve(8080, stop2, stats2)).unwrap()
        });
        http_exchange(&net, 8080);
        stop.store(true, Relaxed);
        server.join().unwrap().unwrap();
    });
    assert_eq!(stats.ok.load(Relaxed), 2);
    net.wait_rx_returned();
}

#[test]
fn http_server_async_event_loop_serves_through_the_netstack() {
    let path = socket("http-async");
    let net = FakeNetstack::new(&path, 2, 64);
    let config = protected_args(&path).runtime_config("http-server");
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(HttpStats::default());
    std::thread::scope(|s| {
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let server = s.spawn(move || {
            ginza_runtime::run(config, move || serve_async(8081, stop2, stats2)).unwrap()
        });
        http_exchange(&net, 8081);
        stop.store(true, Relaxed);
        server.join().unwrap().unwrap();
    });
    assert_eq!(stats.ok.load(Relaxed), 2);
    assert_eq!(stats.accepted.load(Relaxed), 1);
    net.wait_rx_returned();
}

#[test]
fn kv_server_serves_memcached_text_and_binary_through_the_netstack() {
    let path = socket("kv");
    let net = FakeNetstack::new(&path, 2, 64);
    let config = protected_args(&path).runtime_config("kv-server");
    let stop = Arc::new(AtomicBool::new(false));
    let kv = Kv::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
    std::thread::scope(|s| {
        let (stop2, kv2) = (stop.clone(), kv.clone());
        let server = s.spawn(move || {
            ginza_runtime::run(config, move || {
                let tcp_only = Protocols {
                    udp: false,
                    tcp: true,
                };
                kv_server::serve(11211, tcp_only, kv2, stop2)
            })
            .unwrap()
        });
        net.wait_listening(11211);
        let text = net.connect_in(11211, client(11));
        text.deliver(b"set k 5 0 3\r\nabc\r\nget k\r\n");
        let want: &[u8] = b"STORED\r\nVALUE k 5 3\r\nabc\r\nEND\r\n";
        assert_eq!(text.expect_bytes(want.len()), want);
        // A binary-protocol GET of the same key on a second connection:
        // magic 0x80, opcode 0x00, key length 1; the response carries the
        // 4-byte flags (5) and the value.
        let binary = net.connect_in(11211, client(12));
        let mut get = vec![0x80, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x01];
        get.extend_from_slice(&[0; 12]);
        get.push(b'k');
        binary.deliver(&get);
        let reply = binary.expect_bytes(24 + 4 + 3);
        assert_eq!(reply[0], 0x81, "a binary response");
        assert_eq!(&reply[6..8], &[0, 0], "status: no error");
        assert_eq!(&reply[24..28], &5u32.to_be_bytes(), "the flags");
        assert_eq!(&reply[28..], b"abc");
        for p in [&text, &binary] {
            p.close();
            p.wait_app_closed();
        }
        stop.store(true, Relaxed);
        server.join().unwrap().unwrap();
    });
    assert_eq!(kv.stats.total_connections.load(Relaxed), 2);
    net.wait_rx_returned();
    assert!(net.refused().is_empty(), "{:?}", net.refused());
}
