//! End to end through the real netstack engine and its attach socket
//! (`ginza_netstack`): two protected applications, each attached over the
//! unix socket with its tx pool passed by `SCM_RIGHTS`, its ring pairs and
//! read-only receive pool mapped from what the netstack hands back. The
//! echo-server (configured by its flags: `--protected=PATH --standalone`)
//! serves a Ginza client (`TcpStream` in protected mode); the netstack's
//! frames go straight back into it (a wire looped back: it owns both
//! addresses). Then the netstack goes away under a blocked reader, which
//! gets `ConnectionReset`, not a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use ginza_apps::app_args::AppArgs;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_netstack::server::{lock, Server, ServerConfig};
use ginza_netstack::{Netstack, NetstackConfig};
use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::net::{Interface, MacAddr, TcpStream};
use ginza_runtime::Config;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    app: AppArgs,
}

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 47, 20, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 47, 20, 2);

fn iface(ip: Ipv4Addr) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x47, 0x20, 0, 0, ip.octets()[3]]),
        ip,
    }
}

/// The netstack engine and its attach server on threads of their own,
/// frames looped back; stops (and drops both, closing every socket) when
/// `stop` is set.
fn netstack(path: &Path, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    let mut ns = Netstack::new(NetstackConfig::default());
    ns.add_address(iface(SERVER_IP));
    let engine = Arc::new(Mutex::new(ns));
    let mut server = Server::bind(ServerConfig {
        path: path.to_path_buf(),
        interface: iface(SERVER_IP),
        other_addresses: true,
    })
    .unwrap();
    let (e2, s2) = (engine.clone(), stop.clone());
    let attach = std::thread::spawn(move || {
        while !s2.load(Relaxed) {
            server.poll(&e2, Duration::from_millis(2));
        }
    });
    let wire = std::thread::spawn(move || {
        let mut frames = Vec::new();
        while !stop.load(Relaxed) {
            let busy = {
                let mut ns = lock(&engine);
                let mut busy = ns.poll();
                while let Some(f) = ns.pop_frame() {
                    frames.push(f);
                }
                for f in frames.drain(..) {
                    busy = true;
                    // Whole frames: zero-touch (a gather list into the
                    // tx pool) is iokerneld's to assemble, and off here.
                    assert!(f.gather.is_none());
                    ns.on_frame(&f.bytes);
                }
                busy
            };
            if !busy {
                std::thread::yield_now();
            }
        }
    });
    vec![attach, wire]
}

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ginza-e2e-netstack-{}-{name}", std::process::id()))
}

#[test]
fn echo_server_serves_a_ginza_client_through_the_netstack() {
    let path = socket("echo");
    let ns_stop = Arc::new(AtomicBool::new(false));
    let ns_threads = netstack(&path, ns_stop.clone());

    let flag = format!("--protected={}", path.display());
    let ip = format!("--ip={SERVER_IP}");
    let args = Cli::try_parse_from(["echo-server", flag.as_str(), "--standalone", ip.as_str()])
        .unwrap()
        .app;
    let server_config = args.runtime_config("echo-server");
    let client_config = Config {
        protected: Some(ProtectedConfig::new(&path, "client", iface(CLIENT_IP))),
        ..Config::with_kthreads(2)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (stop2, stats2) = (stop.clone(), stats.clone());
    let server = std::thread::spawn(move || {
        ginza_runtime::run(server_config, move || {
            let tcp_only = Protocols {
                udp: false,
                tcp: true,
            };
            echo_server::serve(7, tcp_only, stop2, stats2)
        })
    });
    let ns_stop2 = ns_stop.clone();
    let client = std::thread::spawn(move || {
        ginza_runtime::run(client_config, move || {
            // The server may still be attaching: retry a refused connect.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut c = loop {
                match TcpStream::connect((SERVER_IP, 7)) {
                    Ok(c) => break c,
                    Err(e) if std::time::Instant::now() < deadline => {
                        log::info!("connect: {e}; again");
                        ginza_runtime::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("connect: {e}"),
                }
            };
            let msg: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 251) as u8).collect();
            let w = c.try_clone().unwrap();
            let m2 = msg.clone();
            let writer = ginza_runtime::spawn(move || (&w).write_all(&m2));
            let mut back = vec![0u8; msg.len()];
            c.read_exact(&mut back).unwrap();
            writer.join().unwrap().unwrap();
            assert!(back == msg, "the echo differs");
            // Now the netstack goes away under a blocked read.
            ns_stop2.store(true, Relaxed);
            let mut one = [0u8; 1];
            c.read(&mut one).map_err(|e| e.kind())
        })
        .unwrap()
    });
    let after_loss = client.join().unwrap();
    assert_eq!(after_loss, Err(ErrorKind::ConnectionReset));
    for t in ns_threads {
        t.join().unwrap();
    }
    // The server's acceptor sees the netstack go too, and `serve` ends
    // with it (not with `stop`, which stays unset).
    let served = server.join().unwrap().unwrap();
    assert_eq!(
        served.map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionReset)
    );
    assert_eq!(stats.tcp_accepted.load(Relaxed), 1);
    assert_eq!(stats.tcp_bytes.load(Relaxed), 200_000);
}

#[test]
fn http_server_async_loop_serves_a_ginza_client_through_the_netstack() {
    use ginza_apps::http_async::serve_async;
    use ginza_apps::http_server::HttpStats;
    let path = socket("http");
    let ns_stop = Arc::new(AtomicBool::new(false));
    let ns_threads = netstack(&path, ns_stop.clone());
    let flag = format!("--protected={}", path.display());
    let ip = format!("--ip={SERVER_IP}");
    let args = Cli::try_parse_from(["http-server", flag.as_str(), "--standalone", ip.as_str()])
        .unwrap()
        .app;
    let server_config = args.runtime_config("http-server");
    let client_config = Config {
        protected: Some(ProtectedConfig::new(&path, "client", iface(CLIENT_IP))),
        ..Config::with_kthreads(1)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(HttpStats::default());
    let (stop2, stats2) = (stop.clone(), stats.clone());
    let server = std::thread::spawn(move || {
        ginza_runtime::run(server_config, move || serve_async(80, stop2, stats2))
    });
    let client = std::thread::spawn(move || {
        ginza_runtime::run(client_config, move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut c = loop {
                match TcpStream::connect((SERVER_IP, 80)) {
                    Ok(c) => break c,
                    Err(e) if std::time::Instant::now() < deadline => {
                        log::info!("connect: {e}; again");
                        ginza_runtime::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("connect: {e}"),
                }
            };
            c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            c.write_all(b"GET /bytes/50000 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut all = Vec::new();
            c.read_to_end(&mut all).unwrap();
            all
        })
        .unwrap()
    });
    let all = client.join().unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..text.len().min(200)]
    );
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2);
    assert!(text.contains("Content-Length: 50000"));
    let last_head = text.rfind("\r\n\r\n").unwrap() + 4;
    assert_eq!(all.len() - last_head, 50_000, "the second body, whole");
    stop.store(true, Relaxed);
    server.join().unwrap().unwrap().unwrap();
    ns_stop.store(true, Relaxed);
    for t in ns_threads {
        t.join().unwrap();
    }
    assert_eq!(stats.ok.load(Relaxed), 2);
}
