//! `echo-server` reached from ordinary Linux programs over a veth pair:
//! iokerneld drives the host end (AF_XDP), the echo server runs on a Ginza
//! runtime behind it, and Linux sockets in the network namespace at the
//! other end talk to it.
//!
//! Needs root, `ip` and `ethtool` (CI installs them); elsewhere each test
//! prints `skipped: …` (under CI as root it fails instead).

mod common;

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::netns::{self, NetNs};
use ginza_net::MacAddr;

const ECHO_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x07]);
const PORT: u16 = 7;

#[test]
fn a_linux_udp_client_gets_every_datagram_echoed() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let daemon = Daemon::on(&ns, "af_xdp", |_| {});
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    // Both protocols on the one port, as `echo-server` runs by default.
    let protocols = Protocols::BOTH;
    let app = daemon.start_app("echo-udp", ECHO_MAC, ns.peer_ip, 1, move || {
        echo_server::serve(PORT, protocols, s2, st2)
    });
    let (bind, target) = (
        SocketAddrV4::new(ns.ns_ip, 0),
        SocketAddrV4::new(ns.peer_ip, PORT),
    );
    let rtts = ns
        .run_in(move || netns::udp_rtt_probe(bind, target, 300, 1000, Duration::from_millis(500)))
        .unwrap()
        .unwrap();
    let answered = rtts.iter().filter(|r| r.is_some()).count();
    stop.store(true, Relaxed);
    app.join(Duration::from_secs(10)).expect("echo-server");
    assert_eq!(answered, 300, "{answered} of 300 datagrams echoed");
    assert_eq!(stats.udp_echoed.load(Relaxed), 300);
}
