//! A Linux client (kernel sockets in the network namespace, over veth)
//! talks to a protected echo-server: iokerneld drives the veth's host end
//! (AF_XDP), the netstack daemon (an application under iokerneld) runs the
//! TCP/IP stack at the veth's address, and echo-server, run protected,
//! shares the netstack's address (`0.0.0.0`, docs/protected.md,
//! "Addresses": no alias MAC for the NIC to accept). The echoed bytes are
//! compared by content hash.
//!
//! Needs root, `ip` and `ethtool`; elsewhere it prints `skipped: …` (under
//! CI as root it fails instead).

mod common;

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Daemon;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::netns::tcp as linux;
use ginza_iokernel::netns::NetNs;
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_netstack::daemon::{Daemon as Netstack, DaemonConfig};
use ginza_proto::content::Pattern;
use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::{Class, Config, IokernelConfig};

const NETSTACK_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0f, 0x01]);
const PORT: u16 = 7;
const IO_TIMEOUT: Duration = Duration::from_secs(20);
const BYTES: u64 = 1 << 20;

#[test]
fn a_linux_client_over_veth_is_echoed_by_a_protected_echo_server() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let daemon = Daemon::on(&ns, "af_xdp", |_| {});
    let socket = daemon.get().socket().to_path_buf();
    let dir = socket
        .parent()
        .expect("iokerneld's directory")
        .to_path_buf();

    let mut ns_cfg = DaemonConfig::new(Interface {
        mac: NETSTACK_MAC,
        ip: ns.peer_ip,
    });
    ns_cfg.iokernel_socket = socket.clone();
    ns_cfg.attach_socket = dir.join("netstack.sock");
    ns_cfg.kthreads = 1;
    let netstack = Netstack::start(ns_cfg.clone()).expect("the netstack daemon");

    // echo-server as `--protected` configures it: cores from iokerneld,
    // the TCP/IP stack in the netstack, at the netstack's own address.
    let mut io = IokernelConfig::new("echo-server", Class::LatencyCritical);
    io.socket = Some(socket);
    let shared = Interface {
        mac: MacAddr::ZERO,
        ip: Ipv4Addr::UNSPECIFIED,
    };
    let config = Config {
        iokernel: Some(io),
        protected: Some(ProtectedConfig::new(
            ns_cfg.attach_socket.clone(),
            "echo-server",
            shared,
        )),
        ..Config::with_kthreads(1)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let server = common::App::spawn(config, move || {
        let tcp_only = Protocols {
            udp: false,
            tcp: true,
        };
        echo_server::serve(PORT, tcp_only, s2, st2)
    });
    // Its `listen` went through: the netstack answered it.
    let t0 = Instant::now();
    while netstack.stats().events == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10) && !server.is_finished(),
            "the protected echo-server never listened"
        );
        std::thread::sleep(Duration::from_millis(2));
    }

    let target = SocketAddrV4::new(ns.peer_ip, PORT);
    let t = ns
        .run_in(move || linux::echo_transfer(target, BYTES, 0x9e70, IO_TIMEOUT))
        .unwrap()
        .unwrap_or_else(|e| panic!("a Linux client echoing {BYTES} bytes: {e}"));
    assert_eq!(t.sent_hash, Pattern::hash_of(0x9e70, BYTES));
    assert!(t.intact(), "the echo came back intact: {t:?}");

    stop.store(true, Relaxed);
    server
        .join(Duration::from_secs(10))
        .expect("the protected echo-server");
    assert_eq!(stats.tcp_accepted.load(Relaxed), 1);
    assert_eq!(stats.tcp_bytes.load(Relaxed), BYTES);
    let st = netstack.stats();
    assert_eq!(st.rx_bytes_delivered, BYTES, "{st:?}");
    // Zero-touch: iokerneld copied the payload from the echo-server's tx
    // pool into the AF_XDP frames (docs/protected.md, "Transmit"); the
    // netstack copied none of it.
    assert!(st.tx_bytes_zero_touch >= BYTES, "{st:?}");
    assert_eq!(st.tx_bytes_copied, 0, "{st:?}");
    drop(netstack);
    drop(daemon);
}
