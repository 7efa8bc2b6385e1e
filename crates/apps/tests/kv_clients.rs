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
mod memcached_clients;

use std::net::SocketAddrV4;
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

#[test]
fn pymemcache_works_against_kv_server() {
    let _lock = common::lock();
    if !memcached_clients::have_pymemcache() {
        skip("python3 with pymemcache is not installed (pip install pymemcache)");
        return;
    }
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let kv = with_kv_server(&ns, |addr| memcached_clients::pymemcache_session(&ns, addr));
    assert!(kv.stats.cas_hits.load(Relaxed) >= 1);
    assert!(kv.stats.total_connections.load(Relaxed) >= 1);
}

#[test]
fn libmemcached_tools_work_against_kv_server() {
    let _lock = common::lock();
    let Some(tools) = memcached_clients::libmemcached_tools() else {
        skip("libmemcached-tools is not installed (apt-get install libmemcached-tools)");
        return;
    };
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    with_kv_server(&ns, |addr| {
        memcached_clients::libmemcached_session(&ns, addr, tools, "ginza-kv-clients")
    });
}

#[test]
fn memccapable_passes_against_kv_server() {
    let _lock = common::lock();
    if memcached_clients::tool(&["memccapable", "memcapable"]).is_none() {
        skip("libmemcached-tools is not installed (apt-get install libmemcached-tools)");
        return;
    }
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    with_kv_server(&ns, |addr| memcached_clients::memccapable(&ns, addr, None));
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
