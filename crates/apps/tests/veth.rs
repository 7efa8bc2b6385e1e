//! A Ginza application reached from ordinary Linux programs over a real
//! interface: iokerneld drives one end of a veth pair (AF_PACKET, then
//! AF_XDP), `spin-server` runs on a Ginza runtime behind it, and from a
//! network namespace at the other end `ping` and a Linux UDP socket talk to
//! it. The runtime's stack answers ARP and ICMP echo itself.
//!
//! Needs root, `ip`, `ethtool` and `ping` (CI installs them); elsewhere the
//! test prints `skipped: …` (under CI as root it fails instead). iokerneld
//! spins while it drives a NIC, so the backends run one after the other.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_apps::spin_server::{self, SpinStats};
use ginza_iokernel::netns::{self, NetNs};
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::MacAddr;
use ginza_runtime::net::NetConfig;
use ginza_runtime::{Class, Config, IokernelConfig};

const APP_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x01]);
const PORT: u16 = 7;

fn ping_available() -> bool {
    std::process::Command::new("ping")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Starts iokerneld on `backend:host_if` and spin-server at the
/// namespace's `peer_ip`; runs `check`; stops both.
fn with_app_behind(backend: &str, ns: &NetNs, check: impl FnOnce(&InProcess)) {
    let dir = std::env::temp_dir().join(format!("ginza-veth-{}-{backend}", std::process::id()));
    let mut cores = ginza_sys::affinity::allowed_cpus().unwrap();
    cores.truncate(2);
    let mut cfg = IokConfig::new(cores);
    cfg.socket = dir.join("iokerneld.sock");
    cfg.idle_sleep = Some(Duration::from_millis(1));
    cfg.nic = format!("{backend}:{}", ns.host_if);
    cfg.validate(&ginza_sys::affinity::allowed_cpus().unwrap())
        .unwrap();
    let iokerneld =
        InProcess::start(cfg.clone()).unwrap_or_else(|e| panic!("iokerneld on {}: {e}", cfg.nic));
    let mut io = IokernelConfig::new("veth-server", Class::LatencyCritical);
    io.socket = Some(cfg.socket.clone());
    io.net = Some(NetConfig::new(APP_MAC, ns.peer_ip));
    let config = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(1)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(SpinStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let server = std::thread::spawn(move || {
        ginza_runtime::run(config, move || spin_server::serve(PORT, s2, st2))
    });
    let t0 = Instant::now();
    while !iokerneld
        .stats()
        .is_ok_and(|s| s.apps.iter().any(|a| a.name == "veth-server"))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5) && !server.is_finished(),
            "spin-server did not register"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    check(&iokerneld);
    stop.store(true, Relaxed);
    server
        .join()
        .expect("the runtime thread")
        .expect("the runtime")
        .expect("spin-server");
    assert!(stats.served.load(Relaxed) > 0);
    drop(iokerneld);
    let _ = std::fs::remove_dir_all(&dir);
}

fn ping_and_udp_reach_the_app(backend: &str) {
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    with_app_behind(backend, &ns, |iokerneld| {
        // ping: ARP for the app's IP, then ICMP echo, both answered by the
        // Ginza stack.
        let out = ns
            .exec(&[
                "ping",
                "-c",
                "3",
                "-i",
                "0.2",
                "-W",
                "2",
                &ns.peer_ip.to_string(),
            ])
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ping via {backend} failed: {text}");
        assert!(text.contains("3 received"), "{text}");
        // A Linux UDP socket in the namespace: every datagram echoed.
        let (bind, target) = (
            SocketAddrV4::new(ns.ns_ip, 0),
            SocketAddrV4::new(ns.peer_ip, PORT),
        );
        let rtts = ns
            .run_in(move || netns::udp_rtt_probe(bind, target, 200, 32, Duration::from_millis(200)))
            .unwrap()
            .unwrap();
        let answered = rtts.iter().filter(|r| r.is_some()).count();
        assert_eq!(
            answered, 200,
            "{backend}: {answered} of 200 datagrams echoed"
        );
        let s = iokerneld.stats().unwrap();
        assert_eq!(s.dataplane.nic, format!("{backend}:{}", ns.host_if));
        assert!(s.dataplane.nic_rx_frames >= 203, "{:?}", s.dataplane);
        let net = s.apps[0].net.unwrap();
        assert!(net.rx >= 203 && net.tx >= 203, "{net:?}");
    });
}

#[test]
fn ping_and_a_linux_udp_client_reach_a_ginza_app_over_veth() {
    if !ping_available() {
        ginza_iokernel::testing::skip("`ping` is missing (Debian package iputils-ping)");
        return;
    }
    ping_and_udp_reach_the_app("af_packet");
    ping_and_udp_reach_the_app("af_xdp");
}
