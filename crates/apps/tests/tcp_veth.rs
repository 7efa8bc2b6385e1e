//! Ginza's TCP against Linux's over a veth pair: iokerneld drives the host
//! end (AF_XDP), a Ginza runtime runs behind it, and Linux sockets live in
//! the network namespace at the other end.
//!
//! * A Linux client against `echo-server`: 64 MiB echoed (so 64 MiB each
//!   way), compared by content hash, and many concurrent connections.
//! * A Ginza client against a Linux echo server in the namespace: 64 MiB
//!   each way, compared by hash.
//! * Both again with iokerneld dropping 5 % of the frames on the veth port
//!   (both directions) and reordering 5 %: the transfers arrive intact.
//!   4 MiB each way there, not 64: in a debug build, before SACK, 16 MiB
//!   took 53 s (Linux client) and 91 s (Ginza client) through this loss,
//!   most of it in retransmission timeouts (200 ms floor); with SACK both
//!   ways 4 MiB takes about 2 s (`tcp_sack_veth.rs`). `GINZA_LOSSY_BYTES`
//!   overrides it, and `ginza bench tcp` moves 64 MiB through the same loss.
//! * A Ginza client whose reader stalls until both windows are closed and
//!   its zero-window probe went out, then reads its echo (docs/tcp.md,
//!   "Zero windows both ways").
//! * A Linux peer that vanishes (its link goes down): the Ginza writer's
//!   retransmissions give up with `TimedOut`.
//!
//! Needs root, `ip` and `ethtool` (CI installs them); elsewhere each test
//! prints `skipped: …` (under CI as root it fails instead).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Daemon;
use ginza_apps::echo_client;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::netns::tcp::{self as linux, EchoMode};
use ginza_iokernel::netns::NetNs;
use ginza_net::MacAddr;
use ginza_proto::content::{send_pattern, ContentHash, Pattern, Transfer};
use ginza_runtime::net::{NetConfig, TcpStream};

const ECHO_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x08]);
const PORT: u16 = 7;
const MIB: u64 = 1 << 20;
/// The longest wait for one read or write.
const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// 5 % of the frames dropped and 5 % reordered, both directions of the
/// veth port.
const LOSSY: &str = "drop=5%,reorder=5%,port=trunk,seed=7";

fn lossy(cfg: &mut ginza_iokernel::Config) {
    cfg.faults = vec![LOSSY.parse().expect("a valid fault rule")];
}

/// echo-server (UDP and TCP) behind iokerneld on the veth; runs `check`
/// with the server's address, then stops it and returns its counters.
fn with_echo_server(
    ns: &NetNs,
    tweak: impl FnOnce(&mut ginza_iokernel::Config),
    check: impl FnOnce(SocketAddrV4, &Daemon),
) -> Arc<EchoStats> {
    let daemon = Daemon::on(ns, "af_xdp", tweak);
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let app = daemon.start_app("echo-tcp", ECHO_MAC, ns.peer_ip, 1, move || {
        echo_server::serve(PORT, Protocols::BOTH, s2, st2)
    });
    check(SocketAddrV4::new(ns.peer_ip, PORT), &daemon);
    stop.store(true, Relaxed);
    app.join(Duration::from_secs(10)).expect("echo-server");
    stats
}

/// `bytes` from a Linux client in the namespace through `echo-server`.
fn linux_client_echo(ns: &NetNs, target: SocketAddrV4, bytes: u64) -> Transfer {
    let t = ns
        .run_in(move || linux::echo_transfer(target, bytes, 0xec40, IO_TIMEOUT))
        .unwrap()
        .unwrap_or_else(|e| panic!("a Linux client echoing {bytes} bytes: {e}"));
    assert_eq!(t.sent_hash, Pattern::hash_of(0xec40, bytes));
    t
}

#[test]
fn a_linux_client_gets_64_mib_echoed_by_echo_server_intact() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let mut took = Duration::ZERO;
    let stats = with_echo_server(
        &ns,
        |_| {},
        |target, _| {
            let t = linux_client_echo(&ns, target, 64 * MIB);
            assert!(t.intact(), "{t:?}");
            took = t.elapsed;
        },
    );
    println!("64 MiB echoed in {took:?}");
    assert!(stats.tcp_bytes.load(Relaxed) >= 64 * MIB);
    assert_eq!(stats.tcp_errors.load(Relaxed), 0);
}

#[test]
fn echo_server_serves_many_linux_connections_at_once() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    const CONNECTIONS: u64 = 64;
    let stats = with_echo_server(
        &ns,
        |_| {},
        |target, _| {
            // Every client thread connects first and waits until all have, so
            // the connections are open at the same time.
            let transfers = ns
                .run_in(move || {
                    let all_connected = Arc::new(std::sync::Barrier::new(CONNECTIONS as usize));
                    let clients: Vec<_> = (0..CONNECTIONS)
                        .map(|i| {
                            let all_connected = all_connected.clone();
                            std::thread::spawn(move || -> std::io::Result<bool> {
                                let mut s = std::net::TcpStream::connect_timeout(
                                    &target.into(),
                                    IO_TIMEOUT,
                                )?;
                                s.set_read_timeout(Some(IO_TIMEOUT))?;
                                all_connected.wait();
                                let mut request = vec![0u8; 10_000];
                                Pattern::new(i).fill(&mut request);
                                s.write_all(&request)?;
                                let mut reply = vec![0u8; request.len()];
                                std::io::Read::read_exact(&mut s, &mut reply)?;
                                Ok(reply == request)
                            })
                        })
                        .collect();
                    clients
                        .into_iter()
                        .map(|c| c.join().expect("a client thread"))
                        .collect::<Vec<_>>()
                })
                .unwrap();
            for (i, t) in transfers.into_iter().enumerate() {
                assert!(
                    t.unwrap_or_else(|e| panic!("client {i}: {e}")),
                    "client {i}: the echo differs"
                );
            }
        },
    );
    assert!(stats.tcp_accepted.load(Relaxed) >= CONNECTIONS);
    assert_eq!(stats.tcp_bytes.load(Relaxed), CONNECTIONS * 10_000);
}

/// A Ginza client echoing `bytes` through a Linux echo server in the
/// namespace, with iokerneld configured by `tweak`.
fn ginza_client_echo(
    ns: &NetNs,
    bytes: u64,
    tweak: impl FnOnce(&mut ginza_iokernel::Config),
) -> Transfer {
    let server = ns.tcp_echo_server(PORT, EchoMode::Blocking).unwrap();
    let daemon = Daemon::on(ns, "af_xdp", tweak);
    let target = server.addr();
    let app = daemon.start_app("tcp-client", ECHO_MAC, ns.peer_ip, 1, move || {
        echo_client::echo_transfer(target, bytes, 0x61c, IO_TIMEOUT)
    });
    let t = app
        .join(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("the Ginza client: {e}"));
    let received = server.stop().unwrap();
    assert_eq!(received, bytes, "the Linux server received");
    assert_eq!(t.sent_hash, Pattern::hash_of(0x61c, bytes));
    t
}

#[test]
fn a_ginza_client_moves_64_mib_each_way_through_a_linux_echo_server() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let t = ginza_client_echo(&ns, 64 * MIB, |_| {});
    println!("64 MiB each way in {:?}", t.elapsed);
    assert!(t.intact(), "{t:?}");
}

#[test]
fn a_linux_client_gets_its_bytes_echoed_intact_through_5_percent_loss() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let bytes = lossy_bytes();
    let mut seen = None;
    with_echo_server(&ns, lossy, |target, daemon| {
        let t = linux_client_echo(&ns, target, bytes);
        let faults = daemon.get().stats().unwrap().dataplane.faults;
        println!(
            "{bytes} bytes echoed through loss in {:?}: {faults:?}",
            t.elapsed
        );
        assert!(t.intact(), "{t:?}");
        seen = faults.first().map(|f| (f.dropped, f.reordered));
    });
    let (dropped, reordered) = seen.expect("iokerneld reports the fault rule");
    assert!(
        dropped > 0 && reordered > 0,
        "dropped {dropped}, reordered {reordered}"
    );
}

#[test]
fn a_ginza_client_moves_its_bytes_each_way_intact_through_5_percent_loss() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let t = ginza_client_echo(&ns, lossy_bytes(), lossy);
    println!("{} bytes each way through loss in {:?}", t.sent, t.elapsed);
    assert!(t.intact(), "{t:?}");
}

/// Both windows closed at once (docs/tcp.md, "Zero windows both ways"): a
/// Ginza client writes while its reader stalls, so the Linux echo thread
/// blocks in `send`, stops reading, and Linux's window closes too; the
/// client's persist timer probes it. Once the reader reads again, its window
/// updates (and its ACKs of Linux's data) must be numbered within Linux's
/// zero window, or Linux drops them and neither side moves again (the
/// lossy test's occasional 20 s read timeout).
#[test]
fn a_ginza_client_whose_reader_stalls_gets_its_echo_once_it_reads_again() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let server = ns.tcp_echo_server(PORT, EchoMode::Blocking).unwrap();
    let daemon = Daemon::on(&ns, "af_xdp", |_| {});
    let target = server.addr();
    // More than both ends can buffer, so the client's writes block.
    let bytes = 32 * MIB;
    let read_now = Arc::new(AtomicBool::new(false));
    let reader_may_go = read_now.clone();
    let app = daemon.start_app("tcp-client", ECHO_MAC, ns.peer_ip, 1, move || {
        let stream = TcpStream::connect_timeout(&target.into(), IO_TIMEOUT)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT * 3))?;
        let writer = stream.try_clone()?;
        let sending =
            ginza_runtime::spawn(move || send_pattern(bytes, 0x5a11, |b| (&writer).write_all(b)));
        while !reader_may_go.load(Relaxed) {
            ginza_runtime::sleep(Duration::from_millis(1));
        }
        let mut received = ContentHash::new();
        let mut buf = vec![0u8; 64 * 1024];
        while received.len() < bytes {
            match (&stream).read(&mut buf)? {
                0 => break,
                n => received.update(&buf[..n]),
            }
        }
        let sent_hash = sending
            .join()
            .map_err(|e| std::io::Error::other(format!("the writer: {e}")))??;
        Ok::<_, std::io::Error>((sent_hash, received.len(), received.finish()))
    });
    // Both windows are closed once the Linux echo thread has received
    // nothing for a second: far longer than the client's persist timer
    // (one RTO, 200 ms here), so its probe went out.
    let t0 = Instant::now();
    let (mut seen, mut since) = (0, Instant::now());
    loop {
        let now = server.bytes_received();
        if now != seen {
            (seen, since) = (now, Instant::now());
        } else if seen > 0 && since.elapsed() >= Duration::from_secs(1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60) && !app.is_finished(),
            "the Linux echo server never stopped receiving ({seen} bytes)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(seen < bytes, "the transfer was held up, at {seen} bytes");
    read_now.store(true, Relaxed);
    let (sent_hash, received, received_hash) = app
        .join(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("the Ginza client (held up at {seen} bytes): {e}"));
    assert_eq!(sent_hash, Pattern::hash_of(0x5a11, bytes));
    assert_eq!(received, bytes, "the echo came back whole");
    assert_eq!(received_hash, sent_hash, "the echo came back intact");
    assert_eq!(server.stop().unwrap(), bytes, "the Linux server received");
}

/// A Linux peer that vanishes mid-transfer (its end of the veth goes down,
/// so nothing it would send arrives and nothing reaches it): the Ginza
/// writer's retransmissions give up and its write fails with `TimedOut`.
/// Retransmissions are kept short for the test (3 at most, RTO 10–100 ms).
#[test]
fn a_ginza_writer_times_out_when_its_linux_peer_vanishes() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let sink = ns.tcp_sink_server(PORT).unwrap();
    let daemon = Daemon::on(&ns, "af_xdp", |_| {});
    let target = sink.addr();
    let mut net = NetConfig::new(ECHO_MAC, ns.peer_ip);
    net.tcp.max_retransmissions = 3;
    net.tcp.rto_initial = Duration::from_millis(20);
    net.tcp.rto_min = Duration::from_millis(10);
    net.tcp.rto_max = Duration::from_millis(100);
    let connected = Arc::new(AtomicBool::new(false));
    let c2 = connected.clone();
    let app = daemon.start_app_with("tcp-writer", net, 1, move || {
        let stream = TcpStream::connect_timeout(&target.into(), IO_TIMEOUT)?;
        c2.store(true, Relaxed);
        let chunk = vec![0x5a; 64 * 1024];
        let started = Instant::now();
        // Writes succeed while the peer reads; once it is gone the send
        // buffer fills, the writer blocks, and the connection gives up.
        loop {
            if let Err(e) = (&stream).write_all(&chunk) {
                return Ok::<_, std::io::Error>((e, started.elapsed()));
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(std::io::Error::other("the writes never failed"));
            }
        }
    });
    let t0 = Instant::now();
    while !connected.load(Relaxed) {
        assert!(
            t0.elapsed() < IO_TIMEOUT && !app.is_finished(),
            "the Ginza client did not connect"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Let some bytes reach the sink first: the connection was working.
    while sink.bytes_received() < 1 << 20 {
        assert!(
            t0.elapsed() < IO_TIMEOUT && !app.is_finished(),
            "the sink got {} bytes",
            sink.bytes_received()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    ns.set_link_up(false).unwrap();
    let (error, after) = app
        .join(Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("the Ginza writer: {e}"));
    assert_eq!(
        error.kind(),
        ErrorKind::TimedOut,
        "{error} (after {after:?})"
    );
}

/// Bytes moved each way in the lossy tests (see the module docs).
fn lossy_bytes() -> u64 {
    std::env::var("GINZA_LOSSY_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4 * MIB)
}
