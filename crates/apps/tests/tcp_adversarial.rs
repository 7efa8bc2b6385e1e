//! Bad input at the socket level: `echo-server` on iokerneld's software
//! switch, and a peer that writes raw frames ([`common::raw_tcp`]) — a
//! connection it established by hand, and whatever no well-behaved stack
//! sends:
//!
//! * 100,000 SYNs from random ports: the half-open set stays bounded, the
//!   process's resident memory grows by less than 10 MiB, and the
//!   established connection keeps echoing.
//! * Bad checksum, bad data offset, options that overrun the header: the
//!   stack drops them and counts each by its reason; a SYN with data and a
//!   segment far outside the window on the established connection are
//!   answered with an ACK (RFC 5961's challenge ACK, RFC 9293's ACK of an
//!   unacceptable segment) and change nothing. The connection is unharmed.
//!
//! * A peer that holds its ACKs as a delayed-ACK client does (the ACK of a
//!   reply rides on the next request): no loss probe for the lone reply,
//!   and one grant of the parked server per request (a stale deadline of
//!   the request's once woke it a second time).
//!
//! No root needed: the switch is iokerneld's own. For the flood the server
//! is the `echo-server` binary in a process of its own, so that its
//! resident memory is its own.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::raw_tcp::{RawTcpPeer, WAIT};
use common::App;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::tcp::{Flags, Segment};
use ginza_net::{
    DropKind, Endpoint, Interface, Ipv4Addr, MacAddr, ETHERNET_HEADER_LEN, IPV4_HEADER_LEN,
};
use ginza_runtime::net::{NetConfig, NetStats, TcpListener};
use ginza_runtime::{Class, Config, IokernelConfig};
use rand::{Rng, SeedableRng};

const SERVER: Interface = Interface {
    mac: MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0a, 0x01]),
    ip: Ipv4Addr::new(10, 47, 10, 1),
};
const PEER: Interface = Interface {
    mac: MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0a, 0x02]),
    ip: Ipv4Addr::new(10, 47, 10, 2),
};
const PORT: u16 = 7;
/// The TCP header's offset in the frames the raw peer builds.
const TCP: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN;

/// iokerneld (software switch), echo-server at [`SERVER`] and the raw peer
/// at [`PEER`]; `check` runs with the peer; the server's counters are
/// returned once it stopped.
fn with_server_and_raw_peer(check: impl FnOnce(&mut RawTcpPeer)) -> (NetStats, Arc<EchoStats>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let (served, net) = with_iokerneld_server_and_raw_peer(
        |_| {},
        move || {
            echo_server::serve(
                PORT,
                Protocols {
                    udp: false,
                    tcp: true,
                },
                s2,
                st2,
            )
        },
        |peer, _| {
            check(peer);
            stop.store(true, Relaxed);
        },
    );
    served.expect("echo-server");
    (net, stats)
}

/// iokerneld (software switch), a server application at [`SERVER`] (its
/// runtime's configuration adjusted by `tune`, its main `serve`, which
/// must return once `check` returned) and the raw peer at [`PEER`];
/// `check` runs with the peer and iokerneld. Returns what `serve` returned
/// and the server's network counters.
fn with_iokerneld_server_and_raw_peer<T: Send + 'static>(
    tune: impl FnOnce(&mut IokernelConfig),
    serve: impl FnOnce() -> T + Send + 'static,
    check: impl FnOnce(&mut RawTcpPeer, &InProcess),
) -> (T, NetStats) {
    let _lock = common::lock();
    let dir = std::env::temp_dir().join(format!("ginza-apps-adv-{}", std::process::id()));
    let mut cores = ginza_sys::affinity::allowed_cpus().unwrap();
    cores.truncate(2);
    let mut cfg = IokConfig::new(cores);
    cfg.socket = dir.join("iokerneld.sock");
    cfg.idle_sleep = Some(Duration::from_millis(1));
    let iokerneld = InProcess::start(cfg).expect("iokerneld");
    let mut io = IokernelConfig::new("adv-echo", Class::LatencyCritical);
    io.socket = Some(iokerneld.socket().to_path_buf());
    // The raw peer does not answer ARP.
    io.net = Some(NetConfig::new(SERVER.mac, SERVER.ip).with_static_arp(PEER.ip, PEER.mac));
    tune(&mut io);
    let config = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(1)
    };
    let server = App::spawn(config, move || (serve(), ginza_runtime::net::stats()));
    let t0 = Instant::now();
    while !iokerneld
        .stats()
        .is_ok_and(|s| s.apps.iter().any(|a| a.name == "adv-echo"))
    {
        assert!(
            t0.elapsed() < WAIT && !server.is_finished(),
            "the server did not register"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut peer = RawTcpPeer::register(
        iokerneld.socket(),
        "adv-peer",
        PEER,
        SERVER.mac,
        Endpoint {
            ip: SERVER.ip,
            port: PORT,
        },
    );
    check(&mut peer, &iokerneld);
    let (served, net) = server.join(WAIT);
    drop(peer);
    drop(iokerneld);
    let _ = std::fs::remove_dir_all(&dir);
    (served, net.expect("the server has networking"))
}

/// Resident memory of process `pid`, in KiB.
fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// Sends `count` SYNs from random ports (never `spare`) with random
/// sequence numbers, at most `IN_FLIGHT` unanswered: each SYN-ACK to one
/// of them lets another go (when none comes for `SILENCE` the unanswered
/// are given up), so that the SYNs reach the server rather than overflow
/// its ingress ring. A SYN-ACK the server sends again (its half-open
/// retransmission), or one to a SYN given up, releases nothing. Returns
/// the SYNs answered.
fn syn_flood(peer: &mut RawTcpPeer, rng: &mut impl Rng, count: usize, spare: u16) -> usize {
    const IN_FLIGHT: usize = 128;
    // Each time the unanswered are given up another `IN_FLIGHT` go out: a
    // server held off its CPU for four silences would find more SYNs than
    // its ingress ring holds. Long enough that a loaded machine's stalls
    // rarely reach that; short enough that SYNs lost for good (a few, on
    // such a machine) cost little time.
    const SILENCE: Duration = Duration::from_millis(50);
    // Port → the SYN's sequence number, for the SYNs awaiting an answer.
    let mut in_flight: HashMap<u16, u32> = HashMap::new();
    let (mut sent, mut answered) = (0, 0);
    while sent < count {
        while in_flight.len() < IN_FLIGHT && sent < count {
            let port = loop {
                let p = rng.random_range(1024..=u16::MAX);
                if p != spare && !in_flight.contains_key(&p) {
                    break p;
                }
            };
            let iss: u32 = rng.random();
            peer.syn(port, iss, &[]);
            in_flight.insert(port, iss);
            sent += 1;
        }
        match peer.recv_until(Instant::now() + SILENCE) {
            Some(r) if r.flags.syn && r.ack.is_some() => {
                let iss = in_flight.get(&r.dst_port).copied();
                if iss.is_some_and(|iss| r.ack == Some(iss.wrapping_add(1))) {
                    in_flight.remove(&r.dst_port);
                    answered += 1;
                }
            }
            Some(_) => {}
            None => in_flight.clear(),
        }
    }
    answered
}

/// The `echo-server` binary as a child process, killed on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The number just before `label` in echo-server's summary.
fn counter(summary: &str, label: &str) -> u64 {
    let at = summary
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {summary}"));
    summary[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before {label:?} in {summary}"))
}

/// 100,000 SYNs against `echo-server` in a process of its own, whose
/// resident memory is read from /proc. The baseline is taken after a first
/// 20,000 SYNs: they fill the listener's half-open set to its bound and
/// bring the ingress buffers the flood cycles through into memory (each is
/// counted in the process's RSS once it has been read), so what is measured
/// is growth with the number of SYNs.
#[test]
fn a_flood_of_100000_syns_leaves_memory_bounded_and_a_connection_working() {
    const WARM_UP: usize = 20_000;
    const SYNS: usize = 100_000;
    let _lock = common::lock();
    let dir = std::env::temp_dir().join(format!("ginza-apps-flood-{}", std::process::id()));
    let mut cores = ginza_sys::affinity::allowed_cpus().unwrap();
    cores.truncate(2);
    let mut cfg = IokConfig::new(cores);
    cfg.socket = dir.join("iokerneld.sock");
    cfg.idle_sleep = Some(Duration::from_millis(1));
    let iokerneld = InProcess::start(cfg).expect("iokerneld");
    let mut server = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_echo-server"))
            .args(["--tcp-only", "--kthreads", "1", "--port", &PORT.to_string()])
            .args([
                "--ip",
                &SERVER.ip.to_string(),
                "--mac",
                &SERVER.mac.to_string(),
            ])
            .args(["--static-arp", &format!("{}={}", PEER.ip, PEER.mac)])
            .arg("--socket")
            .arg(iokerneld.socket())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting echo-server"),
    );
    let t0 = Instant::now();
    while !iokerneld
        .stats()
        .is_ok_and(|s| s.apps.iter().any(|a| a.name == "echo-server"))
    {
        assert!(
            t0.elapsed() < WAIT && server.0.try_wait().unwrap().is_none(),
            "echo-server did not register"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut peer = RawTcpPeer::register(
        iokerneld.socket(),
        "flood-peer",
        PEER,
        SERVER.mac,
        Endpoint {
            ip: SERVER.ip,
            port: PORT,
        },
    );
    let mut conn = peer.connect(40_000, 1_000);
    assert_eq!(
        peer.echo(&mut conn, b"before the flood"),
        b"before the flood"
    );
    let mut rng = rand::rngs::SmallRng::seed_from_u64(12);
    let pid = server.0.id();
    syn_flood(&mut peer, &mut rng, WARM_UP, conn.port);
    let before = vm_rss_kib(pid);
    let answered = syn_flood(&mut peer, &mut rng, SYNS, conn.port);
    peer.drain();
    let payload: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    assert_eq!(peer.echo(&mut conn, &payload), payload, "after the flood");
    let after = vm_rss_kib(pid);
    // What iokerneld delivered to the server and what it dropped (its
    // rings full while it was held off its CPU), read while it is
    // registered.
    let server_net = iokerneld
        .stats()
        .unwrap()
        .apps
        .iter()
        .find(|a| a.name == "echo-server")
        .and_then(|a| a.net)
        .expect("echo-server's net stats");
    // SIGTERM: echo-server stops and prints its counters.
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(t0.elapsed() < WAIT, "echo-server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(server.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    println!(
        "VmRSS {before} KiB before, {after} KiB after {SYNS} SYNs ({answered} answered); \
         iokerneld: {server_net:?}; {out}"
    );
    assert!(status.success(), "{out}");
    let grown_kib = after.saturating_sub(before);
    assert!(
        grown_kib < 10 * 1024,
        "resident memory grew by {grown_kib} KiB"
    );
    // The SYNs reached the server (most answered; the server counts what it
    // took in, iokerneld what it dropped), and the half-open set stayed
    // bounded (1024 by default): once full, SYNs are answered with SYN
    // cookies, keeping nothing (docs/tcp.md).
    //
    // On a loaded machine iokerneld drops SYNs while the server is held
    // off its CPU (its ingress ring full): each SYN sent was taken in by
    // the server or counted dropped, and the server took in at least 20
    // times its half-open bound, so that the set was full and churned.
    let segments_in = counter(&out, "segments in");
    assert!(
        segments_in + server_net.drop_ingress >= (WARM_UP + SYNS) as u64,
        "{server_net:?} {out}"
    );
    assert!(segments_in >= 20 * 1024, "{server_net:?} {out}");
    // SYN-ACKs that come after their SYN was given up do not count (a
    // loaded machine's stalls give up many): at least a half-open set's
    // worth came in time.
    assert!(answered >= 1024, "{answered} SYNs answered; {out}");
    assert_eq!(counter(&out, "half-open evicted"), 0, "{out}");
    assert!(
        counter(&out, "SYN cookies sent") >= segments_in / 2,
        "{out}"
    );
    assert!(counter(&out, "connections open") <= 1024 + 8, "{out}");
    drop(peer);
    drop(iokerneld);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Recomputes the TCP checksum of `frame` (after an edit).
fn fill_checksum(frame: &mut [u8]) {
    let mut tcp = smoltcp::wire::TcpPacket::new_unchecked(&mut frame[TCP..]);
    tcp.fill_checksum(&PEER.ip.into(), &SERVER.ip.into());
}

#[test]
fn malformed_and_out_of_window_segments_are_dropped_or_answered_and_harm_nothing() {
    let (net, stats) = with_server_and_raw_peer(|peer| {
        let mut conn = peer.connect(40_001, 77);
        assert_eq!(peer.echo(&mut conn, b"hello"), b"hello");

        // A data segment at the right place, with a wrong checksum.
        let mut frame = peer.frame(conn.port, &conn.segment(conn.snd_nxt, b"garbage"));
        frame[TCP + 16] ^= 0xff;
        peer.send_frame(&frame);

        // A data offset of 4 words: below the fixed header.
        let mut frame = peer.frame(conn.port, &conn.segment(conn.snd_nxt, b"garbage"));
        frame[TCP + 12] = (4 << 4) | (frame[TCP + 12] & 0x0f);
        fill_checksum(&mut frame);
        peer.send_frame(&frame);

        // A 24-byte header whose one option (MSS, length 10) runs past it.
        let mut frame = peer.frame(
            conn.port,
            &conn.segment(conn.snd_nxt, &[2, 10, 0, 0, 1, 2, 3]),
        );
        frame[TCP + 12] = (6 << 4) | (frame[TCP + 12] & 0x0f);
        fill_checksum(&mut frame);
        peer.send_frame(&frame);

        // A SYN with data on the established 4-tuple: a challenge ACK
        // (RFC 5961 §4), the data not taken.
        peer.send(
            conn.port,
            &Segment {
                flags: Flags {
                    syn: true,
                    ..Flags::default()
                },
                ..conn.segment(conn.snd_nxt.wrapping_add(10), b"syn data")
            },
        );
        let challenge = peer
            .recv_for(conn.port, Instant::now() + WAIT)
            .expect("a challenge ACK");
        assert!(
            !challenge.flags.syn && !challenge.flags.rst && challenge.ack == Some(conn.snd_nxt),
            "{challenge:?}"
        );

        // Data 2^30 beyond the window: an ACK of what was really received,
        // the data not taken.
        peer.send(
            conn.port,
            &conn.segment(conn.snd_nxt.wrapping_add(1 << 30), b"far away"),
        );
        let ack = peer
            .recv_for(conn.port, Instant::now() + WAIT)
            .expect("an ACK");
        assert!(!ack.flags.rst && ack.ack == Some(conn.snd_nxt), "{ack:?}");
        // An old duplicate far behind, likewise.
        peer.send(
            conn.port,
            &conn.segment(conn.snd_nxt.wrapping_sub(1 << 30), b"long ago"),
        );
        let ack = peer
            .recv_for(conn.port, Instant::now() + WAIT)
            .expect("an ACK");
        assert!(!ack.flags.rst && ack.ack == Some(conn.snd_nxt), "{ack:?}");

        // The connection goes on as if nothing had come.
        assert_eq!(peer.echo(&mut conn, b"still here"), b"still here");
    });
    assert_eq!(
        net.drops.get(DropKind::BadTcpChecksum),
        1,
        "{:?}",
        net.drops
    );
    assert_eq!(
        net.drops.get(DropKind::BadTcpDataOffset),
        1,
        "{:?}",
        net.drops
    );
    assert_eq!(net.drops.get(DropKind::BadTcpOptions), 1, "{:?}", net.drops);
    // Only the good bytes were echoed: "hello" and "still here".
    assert_eq!(stats.tcp_bytes.load(Relaxed), 15);
    assert_eq!(stats.tcp_errors.load(Relaxed), 0);
}

/// An echo server of one connection, with blocking reads and no time-outs:
/// no timer of its own wakes it (echo-server's loops look at their stop
/// flag every few ms).
fn echo_one_connection() -> std::io::Result<u64> {
    use std::io::{Read, Write};
    let listener = TcpListener::bind((SERVER.ip, PORT))?;
    let (mut stream, _) = listener.accept()?;
    let mut buf = [0u8; 256];
    let mut echoed = 0;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(echoed);
        }
        stream.write_all(&buf[..n])?;
        echoed += n as u64;
    }
}

fn grants_of_the_server(iokerneld: &InProcess) -> u64 {
    let s = iokerneld.stats().expect("iokerneld's stats");
    common::app_stats(&s, "adv-echo").grants
}

#[test]
fn a_parked_server_wakes_to_send_again_a_reply_its_peer_never_acknowledged() {
    // The runtime has no timer thread: its kthread parks with the stack's
    // earliest deadline (here the reply's retransmission timer) counted
    // among its timers, and iokerneld wakes it then.
    let (echoed, net) = with_iokerneld_server_and_raw_peer(
        // Parks at once when out of work, so nothing polls meanwhile.
        |io| io.poll_while_idle = Duration::ZERO,
        echo_one_connection,
        |peer, iokerneld| {
            let mut conn = peer.connect(40_001, 9_000);
            // A round-trip time measured: the timeout is then `rto_min`
            // (200 ms) or so, not the initial 1 s.
            assert_eq!(peer.echo(&mut conn, b"hello"), b"hello");
            let before = grants_of_the_server(iokerneld);
            let request = b"never acknowledged";
            peer.data(&conn, request);
            conn.snd_nxt = conn.snd_nxt.wrapping_add(request.len() as u32);
            let reply = peer
                .recv_for(conn.port, Instant::now() + WAIT)
                .expect("the echo");
            assert_eq!(reply.payload, request, "{reply:?}");
            let again = peer
                .recv_for(conn.port, Instant::now() + WAIT)
                .expect("the echo sent again");
            assert_eq!((again.seq, &again.payload), (reply.seq, &reply.payload));
            let woken = grants_of_the_server(iokerneld) - before;
            assert!(
                woken >= 2,
                "{woken} grants: the request's, then the timer's expected"
            );
            conn.rcv_nxt = conn.rcv_nxt.wrapping_add(reply.payload.len() as u32);
            peer.fin(&mut conn);
        },
    );
    assert!(echoed.expect("the echo server") > 0);
    assert!(net.tcp.retransmissions >= 1, "{:?}", net.tcp);
}

#[test]
fn a_peer_that_holds_its_acks_costs_a_parked_server_one_wake_per_request_and_no_probes() {
    // An RPC client as Linux's kernel is one: it acknowledges a reply only
    // with its next request (its delayed ACK). The server's reply is a lone
    // segment in flight: no loss probe goes out for it (RFC 8985 §7.2 adds
    // the peer's delayed ACK to its timeout), and the deadline its request
    // armed (our own delayed ACK, which the reply carried) is not left to
    // wake the parked server: one grant per request.
    const REQUESTS: u64 = 20;
    const QUIET: Duration = Duration::from_millis(5);
    let (echoed, net) = with_iokerneld_server_and_raw_peer(
        // Parks at once when out of work, so every wake is a grant.
        |io| io.poll_while_idle = Duration::ZERO,
        echo_one_connection,
        |peer, iokerneld| {
            peer.offer_sack = true;
            let mut conn = peer.connect(40_000, 7_000);
            // A first round trip with its ACK: a round-trip time measured.
            assert_eq!(peer.echo(&mut conn, b"hello"), b"hello");
            let grants = || grants_of_the_server(iokerneld);
            let before = grants();
            let mut unexpected = Vec::new();
            for i in 0..REQUESTS {
                let request = format!("request {i:02}");
                peer.data(&conn, request.as_bytes());
                conn.snd_nxt = conn.snd_nxt.wrapping_add(request.len() as u32);
                let reply = peer
                    .recv_for(conn.port, Instant::now() + WAIT)
                    .expect("the echo of a request");
                assert_eq!(reply.payload, request.as_bytes(), "{reply:?}");
                conn.rcv_nxt = conn.rcv_nxt.wrapping_add(reply.payload.len() as u32);
                // No ACK: the next request carries it. Anything the server
                // sends meanwhile is a probe or a retransmission.
                let quiet_until = Instant::now() + QUIET;
                while let Some(r) = peer.recv_for(conn.port, quiet_until) {
                    unexpected.push(r);
                }
            }
            let woken = grants() - before;
            println!("{woken} grants for {REQUESTS} requests");
            peer.fin(&mut conn);
            assert!(
                unexpected.is_empty(),
                "sent while the reply waited for its ACK: {unexpected:?}"
            );
            // A request's frame wakes it; a few more for other reasons (a
            // preemption while it answered) are allowed, one per request
            // is not (that was the stale deadline's).
            assert!(
                woken <= REQUESTS + REQUESTS / 4,
                "{woken} grants for {REQUESTS} requests"
            );
        },
    );
    assert!(echoed.expect("the echo server") > 0);
    assert_eq!(net.tcp.retransmissions, 0, "{:?}", net.tcp);
}
