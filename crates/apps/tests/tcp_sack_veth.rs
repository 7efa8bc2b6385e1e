//! SACK (RFC 2018, RFC 6675) and keep-alive against Linux's TCP over a
//! veth pair: iokerneld drives the host end (AF_XDP), a Ginza runtime runs
//! behind it, Linux sockets live in the network namespace.
//!
//! * A Ginza client echoes 4 MiB (`GINZA_LOSSY_BYTES` overrides) through a
//!   Linux echo server while iokerneld drops 5 % of the frames and reorders
//!   5 %: SACK is negotiated and used both ways (Ginza sends blocks and
//!   recovers from Linux's; Linux's own counters in the namespace show its
//!   SACK recoveries), and the bytes arrive intact.
//! * Keep-alive: an idle Ginza connection to a Linux echo server probes it
//!   and stays up while Linux answers; when Linux's link goes down, the
//!   probes go unanswered and the read ends with `TimedOut`.
//!
//! Needs root, `ip` and `ethtool`; elsewhere each test prints `skipped: …`
//! (under CI as root it fails instead).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use common::Daemon;
use ginza_apps::echo_client;
use ginza_iokernel::netns::tcp::EchoMode;
use ginza_iokernel::netns::NetNs;
use ginza_net::MacAddr;
use ginza_proto::content::Pattern;
use ginza_runtime::net::{KeepAlive, TcpStream};

const MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x15]);
const PORT: u16 = 7;
const MIB: u64 = 1 << 20;
const IO_TIMEOUT: Duration = Duration::from_secs(20);
const LOSSY: &str = "drop=5%,reorder=5%,port=trunk,seed=11";

fn lossy_bytes() -> u64 {
    std::env::var("GINZA_LOSSY_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4 * MIB)
}

/// One counter of Linux's `TcpExt` line in the namespace's
/// /proc/net/netstat.
fn linux_tcp_ext(ns: &NetNs, name: &str) -> u64 {
    let out = ns.exec_ok(&["cat", "/proc/net/netstat"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == name)
        .unwrap_or_else(|| panic!("no {name} in TcpExt: {names}"));
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

#[test]
fn sack_is_used_both_ways_with_linux_through_drop_and_reorder() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let bytes = lossy_bytes();
    let server = ns.tcp_echo_server(PORT, EchoMode::Blocking).unwrap();
    let sack_recoveries_before = linux_tcp_ext(&ns, "TCPSackRecovery");
    let daemon = Daemon::on(&ns, "af_xdp", |cfg| {
        cfg.faults = vec![LOSSY.parse().expect("a valid fault rule")];
    });
    let target = server.addr();
    let app = daemon.start_app("tcp-sack", MAC, ns.peer_ip, 1, move || {
        let t = echo_client::echo_transfer(target, bytes, 0x5ac, IO_TIMEOUT)?;
        let tcp = ginza_runtime::net::stats().expect("a network stack").tcp;
        Ok::<_, std::io::Error>((t, tcp))
    });
    let (t, tcp) = app
        .join(Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("the Ginza client: {e}"));
    let faults = daemon.get().stats().unwrap().dataplane.faults;
    let received = server.stop().unwrap();
    println!(
        "{bytes} bytes each way through loss in {:?}; Ginza: {tcp:?}; faults {faults:?}",
        t.elapsed
    );
    assert_eq!(t.sent_hash, Pattern::hash_of(0x5ac, bytes));
    assert_eq!(received, bytes, "the Linux server received everything");
    assert!(t.intact(), "the echo came back intact: {t:?}");
    let rule = faults.first().expect("iokerneld reports the fault rule");
    assert!(rule.dropped > 0 && rule.reordered > 0, "{rule:?}");
    // Ginza as receiver told Linux what it held; as sender it took
    // Linux's blocks and repaired holes from them.
    assert!(tcp.sack_blocks_sent > 0, "{tcp:?}");
    assert!(tcp.sack_blocks_received > 0, "{tcp:?}");
    assert!(tcp.sack_retransmissions > 0, "{tcp:?}");
    // Linux recovered with SACK from Ginza's blocks.
    let linux_recoveries = linux_tcp_ext(&ns, "TCPSackRecovery") - sack_recoveries_before;
    println!("Linux TCPSackRecovery: {linux_recoveries}");
    assert!(linux_recoveries > 0, "Linux never recovered with SACK");
}

#[test]
fn keepalive_probes_keep_an_idle_connection_and_time_out_a_vanished_peer() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let server = ns.tcp_echo_server(PORT, EchoMode::Blocking).unwrap();
    let daemon = Daemon::on(&ns, "af_xdp", |_| {});
    let target = server.addr();
    let (link_down_tx, link_down_rx) = std::sync::mpsc::channel::<()>();
    let (idle_done_tx, idle_done_rx) = std::sync::mpsc::channel::<u64>();
    // Linux answers an out-of-window segment without data (our probe) at
    // most every 500 ms (`net.ipv4.tcp_invalid_ratelimit`): probes closer
    // together than that go unanswered. Linux's own keep-alive interval is
    // 75 s.
    let keepalive = KeepAlive {
        idle: Duration::from_millis(700),
        interval: Duration::from_millis(600),
        count: 3,
    };
    let app = daemon.start_app("tcp-keepalive", MAC, ns.peer_ip, 1, move || {
        let probes = || {
            ginza_runtime::net::stats()
                .expect("a stack")
                .tcp
                .keepalive_probes
        };
        let mut stream = TcpStream::connect_timeout(&target.into(), IO_TIMEOUT)?;
        stream.set_keepalive(Some(keepalive))?;
        // Idle until several probes went out and were answered.
        stream.set_read_timeout(Some(Duration::from_millis(50)))?;
        let t0 = Instant::now();
        let mut buf = [0u8; 16];
        while probes() < 3 {
            match stream.read(&mut buf) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                other => return Err(std::io::Error::other(format!("while idle: {other:?}"))),
            }
            if t0.elapsed() > IO_TIMEOUT {
                return Err(std::io::Error::other("no keep-alive probes"));
            }
        }
        // Still alive: an echo goes through.
        stream.write_all(b"ping")?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.read_exact(&mut buf[..4])?;
        assert_eq!(&buf[..4], b"ping");
        idle_done_tx.send(probes()).unwrap();
        link_down_rx.recv().unwrap();
        // Now nobody answers: idle + count × interval later, TimedOut.
        let cut = Instant::now();
        let err = stream.read(&mut buf).expect_err("the read fails");
        Ok((err.kind(), cut.elapsed()))
    });
    let Ok(probes) = idle_done_rx.recv_timeout(Duration::from_secs(30)) else {
        let outcome = app.join(Duration::from_secs(5));
        panic!("the idle phase did not end: {:?}", outcome.map(|_| ()));
    };
    assert!(probes >= 3, "{probes} probes");
    ns.set_link_up(false).unwrap();
    link_down_tx.send(()).unwrap();
    let (kind, after) = app
        .join(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("the Ginza client: {e}"));
    let _ = server.stop();
    println!("{probes} probes answered; timed out {after:?} after the link went down");
    assert_eq!(kind, ErrorKind::TimedOut);
    // idle + count × interval = 2.5 s after the last answer.
    assert!(after < Duration::from_secs(6), "{after:?}");
}
