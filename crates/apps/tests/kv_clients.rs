//! Unmodified memcached clients against kv-server: kv-server runs under
//! iokerneld on the host end of a veth pair, the clients run in the
//! network namespace at the other end.
//!
//! * `pymemcache` (PyPI): set/get/gets/cas/incr/decr/add/replace/append/
//!   prepend/touch/delete/get_many/set_many/stats/version/flush_all.
//! * Debian's `libmemcached-tools` (`memccp`, `memccat`, `memcrm`,
//!   `memcslap`, `memcaslap`, `memccapable`), over the text protocol and,
//!   where the tool offers it, the binary one.
//! * A Linux UDP client with memcached's frame header.
//!
//! Needs root, `ip`, `ethtool`, and the clients (CI installs them: `apt-get
//! install libmemcached-tools`, `pip install pymemcache`); elsewhere each
//! test prints `skipped: …` (under CI as root it fails instead).

mod common;

use std::net::SocketAddrV4;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use ginza_apps::echo_server::Protocols;
use ginza_apps::kv::server::serve;
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::Kv;
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::testing::skip;
use ginza_net::MacAddr;

const KV_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0b, 0x0c]);
const PORT: u16 = 11211;

/// kv-server (TCP and UDP) behind iokerneld on `ns`'s veth while `check`
/// runs with its address; returns the server's counters.
fn with_kv_server(ns: &NetNs, check: impl FnOnce(SocketAddrV4)) -> Kv {
    let daemon = Daemon::on(ns, "af_xdp", |_| {});
    let stop = Arc::new(AtomicBool::new(false));
    let kv = Kv::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
    let (s2, kv2) = (stop.clone(), kv.clone());
    let app = daemon.start_app("kv-clients", KV_MAC, ns.peer_ip, 2, move || {
        serve(PORT, Protocols::BOTH, kv2, s2)
    });
    check(SocketAddrV4::new(ns.peer_ip, PORT));
    stop.store(true, Relaxed);
    app.join(Duration::from_secs(10)).expect("kv-server");
    kv
}

/// The first of `names` on the PATH (Debian renamed libmemcached's tools
/// from memcp to memccp and so on).
fn tool(names: &[&'static str]) -> Option<&'static str> {
    names.iter().copied().find(|name| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs `args` in the namespace under `timeout`; panics with its output if
/// it fails.
fn run_ok(ns: &NetNs, args: &[&str]) -> Output {
    let mut full = vec!["timeout", "120"];
    full.extend_from_slice(args);
    let out = ns.exec(&full).expect("running a client");
    assert!(
        out.status.success(),
        "{args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

const PYMEMCACHE_SESSION: &str = r#"
import sys
from pymemcache.client.base import Client
c = Client((sys.argv[1], int(sys.argv[2])), connect_timeout=10, timeout=10, default_noreply=False)
assert c.set('a', b'1') is True
assert c.get('a') == b'1'
value, cas = c.gets('a')
assert value == b'1', value
assert c.cas('a', b'2', cas) is True
assert c.cas('a', b'3', cas) is False, 'a stale cas unique'
assert c.get('a') == b'2'
assert c.incr('a', 5) == 7
assert c.decr('a', 10) == 0
assert c.incr('missing', 1) is None
assert c.add('a', b'x') is False
assert c.add('b', b'x', expire=100) is True
assert c.replace('b', b'y') is True
assert c.append('b', b'z') is True
assert c.prepend('b', b'w') is True
assert c.get('b') == b'wyz'
assert c.touch('b', 50) is True
assert c.touch('missing', 50) is False
assert c.set_many({'x': b'1', 'y': b'2' * 100000}) == []
assert c.get_many(['x', 'y', 'nope']) == {'x': b'1', 'y': b'2' * 100000}
assert c.delete('x') is True
assert c.delete('x') is False
assert c.get('x') is None
assert c.set('expired', b'v', expire=-1) is True
assert c.get('expired') is None
stats = c.stats()
assert b'curr_items' in stats or 'curr_items' in stats, stats
assert c.version()
assert c.flush_all() is True
assert c.get('a') is None
for i in range(200):
    c.set('k%d' % i, str(i).encode())
assert c.get_many(['k%d' % i for i in range(200)]) == {'k%d' % i: str(i).encode() for i in range(200)}
print('pymemcache: ok')
"#;

#[test]
fn pymemcache_works_against_kv_server() {
    let _lock = common::lock();
    let has_pymemcache = std::process::Command::new("python3")
        .args(["-c", "import pymemcache"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pymemcache {
        skip("python3 with pymemcache is not installed (pip install pymemcache)");
        return;
    }
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let kv = with_kv_server(&ns, |addr| {
        let (ip, port) = (addr.ip().to_string(), addr.port().to_string());
        let out = run_ok(&ns, &["python3", "-c", PYMEMCACHE_SESSION, &ip, &port]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("pymemcache: ok"));
    });
    assert!(kv.stats.cas_hits.load(Relaxed) >= 1);
    assert!(kv.stats.total_connections.load(Relaxed) >= 1);
}

#[test]
fn libmemcached_tools_work_against_kv_server() {
    let _lock = common::lock();
    let (Some(cp), Some(cat), Some(rm)) = (
        tool(&["memccp", "memcp"]),
        tool(&["memccat", "memcat"]),
        tool(&["memcrm", "memrm"]),
    ) else {
        skip("libmemcached-tools is not installed (apt-get install libmemcached-tools)");
        return;
    };
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("ginza-kv-clients-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    with_kv_server(&ns, |addr| {
        let servers = format!("--servers={addr}");
        for (protocol, flag) in [("text", None), ("binary", Some("--binary"))] {
            let with = |args: &[&str]| -> Vec<String> {
                let mut v: Vec<String> = vec![servers.clone()];
                v.extend(flag.map(String::from));
                v.extend(args.iter().map(|s| s.to_string()));
                v
            };
            for (i, size) in [1usize, 1000, 200_000].into_iter().enumerate() {
                let name = format!("file-{protocol}-{i}");
                let path = dir.join(&name);
                let content: Vec<u8> = (0..size).map(|j| b'a' + (j % 26) as u8).collect();
                std::fs::write(&path, &content).unwrap();
                let path = path.to_string_lossy().to_string();
                let args = with(&[&path]);
                let mut argv = vec![cp];
                argv.extend(args.iter().map(String::as_str));
                run_ok(&ns, &argv);
                let args = with(&[&name]);
                let mut argv = vec![cat];
                argv.extend(args.iter().map(String::as_str));
                let out = run_ok(&ns, &argv);
                // memccat ends what it prints with a newline.
                let mut printed = content.clone();
                printed.push(b'\n');
                assert!(
                    out.stdout == printed,
                    "{protocol}: {cat} {name} gave back other bytes"
                );
                let mut argv = vec![rm];
                argv.extend(args.iter().map(String::as_str));
                run_ok(&ns, &argv);
                let mut argv = vec!["timeout", "60", cat];
                argv.extend(args.iter().map(String::as_str));
                let gone = ns.exec(&argv).unwrap();
                assert!(
                    !gone.status.success() && gone.stdout.is_empty(),
                    "{protocol}: {name} after {rm}"
                );
            }
        }
        if let Some(slap) = tool(&["memcslap", "memslap"]) {
            for flag in [None, Some("--binary")] {
                for test in ["set", "get", "mget"] {
                    let mut argv = vec![slap, &servers, "--concurrency=4", "--execute-number=200"];
                    let t = format!("--test={test}");
                    argv.push(&t);
                    argv.extend(flag);
                    let out = run_ok(&ns, &argv);
                    println!("{argv:?}: {}", String::from_utf8_lossy(&out.stdout).trim());
                }
            }
        }
        if let Some(aslap) = tool(&["memcaslap", "memaslap"]) {
            let s = format!("--servers={addr}");
            let out = run_ok(
                &ns,
                &[
                    aslap,
                    &s,
                    "--threads=1",
                    "--concurrency=4",
                    "--execute_number=2000",
                ],
            );
            let text = String::from_utf8_lossy(&out.stdout);
            println!("{aslap}: {text}");
            assert!(!text.contains("error"), "{text}");
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memccapable_passes_against_kv_server() {
    let _lock = common::lock();
    let Some(capable) = tool(&["memccapable", "memcapable"]) else {
        skip("libmemcached-tools is not installed (apt-get install libmemcached-tools)");
        return;
    };
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    with_kv_server(&ns, |addr| {
        let (ip, port) = (addr.ip().to_string(), addr.port().to_string());
        let out = run_ok(&ns, &[capable, "-h", &ip, "-p", &port, "-t", "5"]);
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}");
        assert!(!text.contains("FAIL"), "{text}");
    });
}

#[test]
fn a_linux_udp_client_gets_framed_replies() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    with_kv_server(&ns, |addr| {
        let replies = ns
            .run_in(move || {
                let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                let ask = |id: u16, request: &[u8]| -> Vec<Vec<u8>> {
                    let mut d = id.to_be_bytes().to_vec();
                    d.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
                    d.extend_from_slice(request);
                    // UDP may lose the first datagrams while ARP settles.
                    for _ in 0..50 {
                        s.send_to(&d, addr).unwrap();
                        let mut got = Vec::new();
                        let mut buf = [0u8; 2048];
                        while let Ok((n, _)) = s.recv_from(&mut buf) {
                            // A late reply to an earlier try of another
                            // request is not this one's.
                            if n < 8 || buf[..2] != id.to_be_bytes() {
                                continue;
                            }
                            got.push(buf[..n].to_vec());
                            let total = u16::from_be_bytes([buf[4], buf[5]]) as usize;
                            if got.len() == total {
                                return got;
                            }
                        }
                    }
                    panic!(
                        "no whole UDP reply to {:?}",
                        String::from_utf8_lossy(request)
                    );
                };
                let set = ask(1, b"set u 0 0 5\r\nhello\r\n");
                // A request must fit one datagram (no IP fragments): the
                // long reply comes from several 1000-byte items.
                let mut set_big = Vec::new();
                for i in 0..5u8 {
                    let mut req = format!("set big{i} 0 0 1000\r\n").into_bytes();
                    req.extend(std::iter::repeat_n(b'a' + i, 1000));
                    req.extend_from_slice(b"\r\n");
                    set_big.extend(ask(10 + u16::from(i), &req));
                }
                let get = ask(3, b"get u big0 big1 big2 big3 big4\r\n");
                (set, set_big, get)
            })
            .unwrap();
        let (set, set_big, get) = replies;
        assert_eq!(set, vec![b"\0\x01\0\0\0\x01\0\0STORED\r\n".to_vec()]);
        for d in &set_big {
            assert_eq!(&d[8..], b"STORED\r\n");
        }
        // The 5 KB reply comes in several datagrams, each numbered.
        assert!(get.len() >= 4, "{} datagrams", get.len());
        let mut joined = Vec::new();
        for (i, d) in get.iter().enumerate() {
            assert_eq!(&d[..2], &[0, 3]);
            assert_eq!(u16::from_be_bytes([d[2], d[3]]) as usize, i);
            joined.extend_from_slice(&d[8..]);
        }
        let mut want = b"VALUE u 0 5\r\nhello\r\n".to_vec();
        for i in 0..5u8 {
            want.extend_from_slice(format!("VALUE big{i} 0 1000\r\n").as_bytes());
            want.extend(std::iter::repeat_n(b'a' + i, 1000));
            want.extend_from_slice(b"\r\n");
        }
        want.extend_from_slice(b"END\r\n");
        assert!(joined == want, "the joined UDP reply differs");
    });
}
