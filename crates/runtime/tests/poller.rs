//! The runtime's epoll (`ginza_runtime::net::Poller`) and non-blocking
//! sockets (docs/runtime.md, "Readiness and the Poller"), on the real
//! stack: applications talking TCP and UDP through the in-process
//! iokerneld's software switch (these tests hold the test lock), a
//! standalone runtime woken from a plain OS thread, and the protected
//! backend over the fake netstack.

mod common;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{iface, lock, quick_net as net, server_addr, share, Daemon, CLIENT, SERVER};
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_runtime::net::protected::testing::FakeNetstack;
use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::net::{
    PollEvent, PollMode, Poller, Readiness, Registration, TcpListener, TcpStream, UdpSocket,
};
use ginza_runtime::{Class, Config};

const PORT: u16 = 7;
const UDP_PORT: u16 = 5353;

/// Runs `body` as an application on its own OS thread.
fn spawn_app<T: Send + 'static>(
    cfg: Config,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || ginza_runtime::run(cfg, body).unwrap())
}

/// Waits (a uthread or an OS thread) until `step` reaches `at`, failing
/// the test after 10 s.
fn wait_step(step: &AtomicU32, at: u32) {
    let t0 = Instant::now();
    while step.load(Ordering::Acquire) < at {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "timed out waiting for step {at} (at {})",
            step.load(Ordering::Acquire)
        );
        if ginza_runtime::current_kthread_id().is_some() {
            ginza_runtime::sleep(Duration::from_micros(200));
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn is_eagain(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::WouldBlock && e.raw_os_error() == Some(libc::EAGAIN)
}

/// Waits up to 10 s for events; fails the test if none comes.
fn wait_events(p: &Poller, what: &str) -> Vec<PollEvent> {
    let mut ev = Vec::new();
    let n = p
        .wait(&mut ev, 64, Some(Instant::now() + Duration::from_secs(10)))
        .unwrap();
    assert!(n > 0, "no event within 10 s: {what}");
    assert_eq!(n, ev.len());
    ev
}

/// Looks for events for `window`, without expecting any.
fn events_within(p: &Poller, window: Duration) -> Vec<PollEvent> {
    let mut ev = Vec::new();
    p.wait(&mut ev, 64, Some(Instant::now() + window)).unwrap();
    ev
}

fn readable_and(read_closed: bool, writable: bool) -> Readiness {
    Readiness {
        readable: true,
        writable,
        read_closed,
        ..Readiness::default()
    }
}

/// One connection of the echo loop.
struct EchoConn {
    s: TcpStream,
    reg: Registration,
    edge: bool,
    /// Echo bytes the send buffer did not take yet.
    out: Vec<u8>,
    watching_writable: bool,
}

#[derive(Debug, Default)]
struct LoopStats {
    waits: u64,
    events: u64,
    writable_events: u64,
    bytes: u64,
}

const LISTENER: u64 = 0;

/// Writes what waits in `c.out` until the send buffer is full.
fn flush(c: &mut EchoConn) {
    while !c.out.is_empty() {
        match c.s.try_write(&c.out) {
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(e) if is_eagain(&e) => return,
            Err(e) => panic!("echo write: {e}"),
        }
    }
}

/// Reads what `c` has (once if level-triggered, to `EAGAIN` if edge) and
/// echoes it; true at the end of the stream.
fn serve_readable(c: &mut EchoConn, stats: &mut LoopStats) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match c.s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                stats.bytes += n as u64;
                c.out.extend_from_slice(&buf[..n]);
                flush(c);
                if !c.edge {
                    return false;
                }
            }
            Err(e) if is_eagain(&e) => return false,
            Err(e) => panic!("echo read: {e}"),
        }
    }
}

/// An echo server on one uthread and one poller: the listener and every
/// connection, non-blocking; odd connections edge-triggered, even ones
/// level-triggered; writable interest only while echo bytes wait. Ends
/// once `expect` connections have ended.
fn echo_loop(listener: TcpListener, expect: usize) -> LoopStats {
    listener.set_nonblocking(true).unwrap();
    let poller = Poller::new();
    let _l = poller
        .register(
            &listener,
            LISTENER,
            Readiness::READABLE,
            PollMode::default(),
        )
        .unwrap();
    let mut conns: HashMap<u64, EchoConn> = HashMap::new();
    let (mut next, mut ended) = (1u64, 0usize);
    let mut stats = LoopStats::default();
    let mut events = Vec::new();
    while ended < expect {
        events.clear();
        let deadline = Some(Instant::now() + Duration::from_secs(20));
        let n = poller.wait(&mut events, 64, deadline).unwrap();
        assert!(n > 0, "no event within 20 s: {ended} of {expect} ended");
        stats.waits += 1;
        stats.events += n as u64;
        for ev in &events {
            if ev.token == LISTENER {
                loop {
                    match listener.try_accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(true).unwrap();
                            let mode = PollMode {
                                edge: next % 2 == 1,
                                oneshot: false,
                            };
                            let reg = poller
                                .register(&s, next, Readiness::READABLE, mode)
                                .unwrap();
                            conns.insert(
                                next,
                                EchoConn {
                                    s,
                                    reg,
                                    edge: mode.edge,
                                    out: Vec::new(),
                                    watching_writable: false,
                                },
                            );
                            next += 1;
                        }
                        Err(e) if is_eagain(&e) => break,
                        Err(e) => panic!("accept: {e}"),
                    }
                }
                continue;
            }
            let Some(c) = conns.get_mut(&ev.token) else {
                continue; // ended earlier in this batch
            };
            assert!(!ev.readiness.error, "connection {}: {ev:?}", ev.token);
            if ev.readiness.writable {
                stats.writable_events += 1;
                flush(c);
            }
            if ev.readiness.readable && serve_readable(c, &mut stats) {
                assert!(c.out.is_empty(), "the peer ended before its echo");
                conns.remove(&ev.token);
                ended += 1;
                continue;
            }
            let want = !c.out.is_empty();
            if want != c.watching_writable {
                c.watching_writable = want;
                let interest = Readiness {
                    writable: want,
                    ..Readiness::READABLE
                };
                let mode = PollMode {
                    edge: c.edge,
                    oneshot: false,
                };
                c.reg.modify(ev.token, interest, mode).unwrap();
            }
        }
    }
    stats
}

#[test]
fn one_poller_echoes_on_many_connections_level_and_edge_triggered() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    const N: usize = 128;
    let listening = Arc::new(AtomicBool::new(false));
    let l2 = Arc::clone(&listening);
    let server = spawn_app(d.net_app("server", 1, net(SERVER)), move || {
        let l = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
        l2.store(true, Ordering::Release);
        echo_loop(l, N)
    });
    let t0 = Instant::now();
    while !listening.load(Ordering::Acquire) {
        assert!(t0.elapsed() < Duration::from_secs(10) && !server.is_finished());
        std::thread::sleep(Duration::from_micros(200));
    }
    let ok = ginza_runtime::run(d.net_app("client", 2, net(CLIENT)), || {
        let handles: Vec<_> = (0..N)
            .map(|i| {
                ginza_runtime::spawn(move || {
                    let s = TcpStream::connect(server_addr(PORT))
                        .unwrap_or_else(|e| panic!("connection {i}: {e}"));
                    // Every 16th sends more than the server's send buffer
                    // and our receive buffer hold together, and reads its
                    // echo only once all is sent: the server's writes must
                    // fill its send buffer and wait for writable.
                    let large = i % 16 == 0;
                    let len = if large { 300_000 } else { 100 + i * 7 };
                    let msg: Vec<u8> = (0..len).map(|j| (i * 31 + j / 3) as u8).collect();
                    let s = Arc::new(s);
                    let (w, sent) = (Arc::clone(&s), msg.clone());
                    let writer = ginza_runtime::spawn(move || {
                        for part in sent.chunks(1000) {
                            (&*w).write_all(part).unwrap();
                        }
                    });
                    let writer = if large {
                        writer.join().unwrap();
                        None
                    } else {
                        Some(writer)
                    };
                    let mut back = vec![0u8; msg.len()];
                    (&*s).read_exact(&mut back).unwrap();
                    if let Some(w) = writer {
                        w.join().unwrap();
                    }
                    back == msg
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&ok| ok)
            .count()
    })
    .unwrap();
    let stats = server.join().unwrap();
    eprintln!("echo loop: {stats:?}");
    assert_eq!(ok, N, "connections whose echo matched");
    let expected: u64 = (0..N)
        .map(|i| if i % 16 == 0 { 300_000 } else { 100 + i * 7 } as u64)
        .sum();
    assert_eq!(stats.bytes, expected);
    assert!(
        stats.writable_events > 0,
        "the large transfers waited for writable: {stats:?}"
    );
    assert!(
        stats.waits < stats.bytes,
        "one wait reports many events: {stats:?}"
    );
}

/// The server's side of `nonblocking_calls_give_eagain_until_the_poller_reports`.
fn nonblocking_server(step: &AtomicU32, written: &AtomicU64) {
    let l = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
    let e = TcpListener::bind(("0.0.0.0", PORT)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE), "{e}");
    l.set_nonblocking(true).unwrap();
    assert!(is_eagain(&l.try_accept().unwrap_err()));
    assert!(is_eagain(&l.accept().unwrap_err()), "non-blocking accept");
    let p = Poller::new();
    let _lr = p
        .register(&l, 10, Readiness::READABLE, PollMode::default())
        .unwrap();
    assert!(events_within(&p, Duration::ZERO).is_empty());
    step.store(1, Ordering::Release); // the client connects
    let ev = wait_events(&p, "the connection in the backlog");
    assert_eq!(ev[0].token, 10);
    assert!(ev[0].readiness.readable);
    // Level-triggered: reported again while the backlog holds it, by a
    // look that never waits too.
    let mut again = Vec::new();
    assert_eq!(p.ready(&mut again, 8).unwrap(), 1);
    assert_eq!((again[0].token, again[0].readiness.readable), (10, true));
    let (s, from) = l.try_accept().unwrap();
    assert_eq!(from.ip(), std::net::IpAddr::V4(iface(CLIENT).ip));
    assert!(!l.readiness().readable, "the backlog is empty again");
    s.set_nonblocking(true).unwrap();
    assert!(is_eagain(&(&s).read(&mut [0u8; 16]).unwrap_err()));
    assert!(is_eagain(&s.try_read(&mut [0u8; 16]).unwrap_err()));
    assert_eq!(s.bytes_readable(), 0);
    let oneshot = PollMode {
        edge: false,
        oneshot: true,
    };
    let r = p.register(&s, 11, Readiness::READABLE, oneshot).unwrap();
    step.store(2, Ordering::Release); // the client writes "hello world"
    let ev = wait_events(&p, "the request");
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].token, ev[0].readiness),
        (11, readable_and(false, false))
    );
    let t0 = Instant::now();
    while s.bytes_readable() < 11 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        ginza_runtime::yield_now();
    }
    let mut five = [0u8; 5];
    assert_eq!(s.peek(&mut five).unwrap(), 5);
    assert_eq!(&five, b"hello");
    assert_eq!(s.try_peek(&mut five).unwrap(), 5);
    assert_eq!(s.bytes_readable(), 11, "peeking consumes nothing");
    // Oneshot: still readable, not reported again until re-armed.
    assert!(events_within(&p, Duration::from_millis(30)).is_empty());
    r.modify(12, Readiness::READABLE, oneshot).unwrap();
    let ev = wait_events(&p, "the re-armed oneshot");
    assert_eq!((ev.len(), ev[0].token), (1, 12));
    let mut buf = [0u8; 64];
    assert_eq!(s.try_read(&mut buf).unwrap(), 11);
    assert_eq!(&buf[..11], b"hello world");
    assert!(is_eagain(&s.try_read(&mut buf).unwrap_err()));
    drop(r);
    // Writable, edge-triggered: reported once (the look at registration),
    // then only after the send buffer drains.
    let edge = PollMode {
        edge: true,
        oneshot: false,
    };
    let w = p.register(&s, 13, Readiness::WRITABLE, edge).unwrap();
    let ev = wait_events(&p, "writable at registration");
    assert_eq!((ev[0].token, ev[0].readiness.writable), (13, true));
    // Fill the send buffer; acknowledgements free room (a new edge) until
    // the peer's window is full too, then nothing is reported.
    let chunk = [7u8; 16 * 1024];
    let mut total = 0u64;
    let mut edges = 0;
    loop {
        match (&s).write(&chunk) {
            Ok(n) => total += n as u64,
            Err(e) if is_eagain(&e) => {
                assert!(!s.readiness().writable);
                let ev = events_within(&p, Duration::from_millis(30));
                if ev.is_empty() {
                    break;
                }
                assert!(ev.iter().all(|e| e.token == 13 && e.readiness.writable));
                edges += 1;
                assert!(edges < 1000, "writable reported without room");
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(total >= 64 * 1024, "the send buffer and the peer's window");
    written.store(total, Ordering::Release);
    step.store(3, Ordering::Release); // the client reads it all
    let ev = wait_events(&p, "writable once the peer read");
    assert_eq!((ev[0].token, ev[0].readiness.writable), (13, true));
    // Writable means room for at least a byte, not for all four (a
    // window that opened by one byte took one: the client then waited
    // for three bytes never sent, in a clean-clone CI run).
    let more = s.try_write(b"more").unwrap();
    assert!(more > 0);
    written.fetch_add(more as u64, Ordering::Release);
    drop(w);
    // A dropped registration reports nothing more.
    let level = p
        .register(&s, 14, Readiness::WRITABLE, PollMode::default())
        .unwrap();
    let t0 = Instant::now();
    loop {
        let ev = wait_events(&p, "writable, level-triggered");
        assert!(ev.iter().all(|e| e.token == 14), "{ev:?}");
        if ev.iter().any(|e| e.readiness.writable) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(events_within(&p, Duration::ZERO).len(), 1, "level: again");
    drop(level);
    assert!(events_within(&p, Duration::from_millis(30)).is_empty());
    udp_through_the_poller(&p, step);
    // The client closes: readable (read gives 0) and read-closed.
    let fin = p
        .register(
            &s,
            16,
            readable_and(true, false),
            PollMode {
                edge: true,
                oneshot: false,
            },
        )
        .unwrap();
    step.store(5, Ordering::Release);
    let t0 = Instant::now();
    loop {
        let ev = wait_events(&p, "the client's FIN");
        if ev.iter().any(|e| e.token == 16 && e.readiness.read_closed) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert!(s.readiness().readable);
    assert_eq!(s.try_read(&mut buf).unwrap(), 0);
    drop(fin);
}

/// A datagram wakes the poller; the non-blocking calls around it.
fn udp_through_the_poller(p: &Poller, step: &AtomicU32) {
    let u = UdpSocket::bind(UDP_PORT).unwrap();
    u.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(is_eagain(&u.recv_from(&mut buf).unwrap_err()));
    assert!(is_eagain(&u.try_recv_from(&mut buf).unwrap_err()));
    assert!(u.readiness().writable && !u.readiness().readable);
    let _r = p
        .register(&u, 15, Readiness::READABLE, PollMode::default())
        .unwrap();
    step.store(4, Ordering::Release); // the client sends "datagram!"
    let ev = wait_events(p, "the datagram");
    assert_eq!((ev.len(), ev[0].token), (1, 15));
    assert_eq!(u.bytes_readable(), 9);
    let (n, from) = u.try_recv_from(&mut buf).unwrap();
    assert_eq!(
        (&buf[..n], *from.ip()),
        (&b"datagram!"[..], iface(CLIENT).ip)
    );
    assert!(is_eagain(&u.try_recv_from(&mut buf).unwrap_err()));
    assert_eq!(u.bytes_readable(), 0);
}

#[test]
fn nonblocking_calls_give_eagain_until_the_poller_reports() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let step = Arc::new(AtomicU32::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let (s2, w2) = (Arc::clone(&step), Arc::clone(&written));
    let server = spawn_app(d.net_app("server", 1, net(SERVER)), move || {
        nonblocking_server(&s2, &w2)
    });
    let total = Arc::clone(&written);
    let client = ginza_runtime::run(d.net_app("client", 1, net(CLIENT)), move || {
        wait_step(&step, 1);
        let mut c = TcpStream::connect(server_addr(PORT)).unwrap();
        wait_step(&step, 2);
        c.write_all(b"hello world").unwrap();
        wait_step(&step, 3);
        // Everything the server wrote: it adds up to 4 bytes once writable, then
        // goes to step 4.
        let mut got = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        c.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        let t0 = Instant::now();
        while !(step.load(Ordering::Acquire) >= 4 && got == written.load(Ordering::Acquire)) {
            assert!(t0.elapsed() < Duration::from_secs(10), "read {got}");
            match c.read(&mut buf) {
                Ok(n) => got += n as u64,
                Err(e) if is_eagain(&e) => {}
                Err(e) => panic!("{e}"),
            }
        }
        let u = UdpSocket::bind(0).unwrap();
        u.send_to(b"datagram!", server_addr(UDP_PORT)).unwrap();
        wait_step(&step, 5);
        drop(c);
        got
    });
    let client = client.unwrap();
    server.join().unwrap();
    assert_eq!(client, total.load(Ordering::Acquire));
}

#[test]
fn a_nonblocking_connect_reports_refusal_through_take_error_and_success_as_writable() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let listening = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (l2, stop2) = (Arc::clone(&listening), Arc::clone(&stop));
    // Echoes on PORT; every other port of its address answers SYNs with RST.
    let server = spawn_app(d.net_app("server", 1, net(SERVER)), move || {
        let l = Arc::new(TcpListener::bind(("0.0.0.0", PORT)).unwrap());
        l2.store(true, Ordering::Release);
        let l3 = Arc::clone(&l);
        ginza_runtime::spawn(move || {
            let (mut s, _) = l3.accept().unwrap();
            let mut buf = [0u8; 64];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
            // The second connection is closed with its request unread: RST.
            let (s, _) = l3.accept().unwrap();
            let t0 = Instant::now();
            while s.bytes_readable() == 0 {
                assert!(t0.elapsed() < Duration::from_secs(10));
                ginza_runtime::sleep(Duration::from_micros(100));
            }
            drop(s);
        });
        while !stop2.load(Ordering::Acquire) {
            ginza_runtime::sleep(Duration::from_millis(1));
        }
    });
    wait_step_flag(&listening);
    ginza_runtime::run(d.net_app("client", 1, net(CLIENT)), || {
        let p = Poller::new();
        let s = TcpStream::connect_nonblocking(server_addr(9)).unwrap();
        s.set_nonblocking(true).unwrap();
        match s.try_read(&mut [0u8; 8]) {
            Err(e) if is_eagain(&e) => {}
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}"),
            Ok(n) => panic!("read {n} bytes before the handshake"),
        }
        let refused = p
            .register(&s, 1, Readiness::WRITABLE, PollMode::default())
            .unwrap();
        let ev = wait_events(&p, "the refusal");
        let r = ev[0].readiness;
        assert!(r.writable && r.error && r.hung_up, "{r:?}");
        let e = s.take_error().unwrap().expect("the refusal");
        assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
        assert!(s.take_error().unwrap().is_none(), "SO_ERROR clears it");
        assert!(!s.readiness().error);
        // Level-triggered: still writable and hung up, so reported again.
        let ev = events_within(&p, Duration::ZERO);
        assert_eq!(ev.len(), 1);
        assert!(!ev[0].readiness.error && ev[0].readiness.hung_up);
        drop(refused);

        // To the listening port: writable once established, no error.
        let s = TcpStream::connect_nonblocking(server_addr(PORT)).unwrap();
        let both = Readiness {
            writable: true,
            ..Readiness::READABLE
        };
        let oneshot = PollMode {
            edge: false,
            oneshot: true,
        };
        let r = p.register(&s, 2, both, oneshot).unwrap();
        let ev = wait_events(&p, "the handshake");
        assert_eq!(ev[0].token, 2);
        assert_eq!(ev[0].readiness, Readiness::WRITABLE);
        assert!(s.take_error().unwrap().is_none());
        s.set_nonblocking(true).unwrap();
        assert_eq!(s.try_write(b"ping").unwrap(), 4);
        r.modify(3, Readiness::READABLE, oneshot).unwrap();
        let ev = wait_events(&p, "the echo");
        assert_eq!((ev[0].token, ev[0].readiness.readable), (3, true));
        let mut buf = [0u8; 8];
        assert_eq!(s.try_read(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"ping");
        // shutdown(Read): reads give 0, and the stream reads as readable.
        s.shutdown(Shutdown::Read).unwrap();
        assert_eq!(s.try_read(&mut buf).unwrap(), 0);
        let r = s.readiness();
        assert!(r.readable && r.read_closed && !r.hung_up, "{r:?}");
        // Writing after shutdown(Write) is EPIPE.
        s.shutdown(Shutdown::Write).unwrap();
        let e = s.try_write(b"late").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
        assert!(s.readiness().writable && s.readiness().hung_up);
        drop(s);

        // A reset: error and hang-up; ECONNRESET, then EPIPE for a write.
        let s = TcpStream::connect(server_addr(PORT)).unwrap();
        s.set_nonblocking(true).unwrap();
        let _r = p
            .register(&s, 4, Readiness::READABLE, PollMode::default())
            .unwrap();
        assert_eq!(s.try_write(b"unread").unwrap(), 6);
        let t0 = Instant::now();
        let r = loop {
            let ev = wait_events(&p, "the reset");
            if let Some(e) = ev.iter().find(|e| e.token == 4 && e.readiness.error) {
                break e.readiness;
            }
            assert!(t0.elapsed() < Duration::from_secs(10));
        };
        assert!(r.readable && r.hung_up, "{r:?}");
        let e = s.take_error().unwrap().expect("the reset");
        assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");
        let e = s.try_read(&mut buf).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");
        let e = s.try_write(b"late").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
        drop(s);

        // A peer that never answers ARP: the call returns at once; ARP's
        // give-up (3 s) ends the connect with ETIMEDOUT.
        let t0 = Instant::now();
        let nobody = SocketAddrV4::new(iface(99).ip, PORT);
        let s = TcpStream::connect_nonblocking(nobody).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert!(s.readiness().is_empty(), "{:?}", s.readiness());
        let _r = p
            .register(&s, 5, Readiness::WRITABLE, PollMode::default())
            .unwrap();
        let t = Instant::now();
        let r = loop {
            let mut ev = Vec::new();
            p.wait(&mut ev, 8, Some(t + Duration::from_secs(10)))
                .unwrap();
            if let Some(e) = ev.iter().find(|e| e.token == 5) {
                break e.readiness;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no answer for ARP's give-up"
            );
        };
        assert!(r.writable && r.error, "{r:?}");
        let e = s.take_error().unwrap().expect("the time-out");
        assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    })
    .unwrap();
    stop.store(true, Ordering::Release);
    server.join().unwrap();
}

fn wait_step_flag(flag: &AtomicBool) {
    let t0 = Instant::now();
    while !flag.load(Ordering::Acquire) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the server never listened"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn a_poll_waker_wakes_a_waiting_poller_from_a_plain_os_thread() {
    fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<Poller>();
    shared_between_threads::<Registration>();
    shared_between_threads::<ginza_runtime::net::PollWaker>();
    let _g = share();
    ginza_runtime::run(Config::with_kthreads(1), || {
        let p = Poller::new();
        let mut ev = Vec::new();
        assert_eq!(p.wait(&mut ev, 8, Some(Instant::now())).unwrap(), 0);
        assert_eq!(p.ready(&mut ev, 8).unwrap(), 0, "nothing registered");
        assert!(p.wait(&mut ev, 0, None).unwrap_err().raw_os_error() == Some(libc::EINVAL));
        assert!(p.ready(&mut ev, 0).unwrap_err().raw_os_error() == Some(libc::EINVAL));
        // Woken before the wait: the next wait returns at once.
        p.waker().wake();
        let t0 = Instant::now();
        assert_eq!(
            p.wait(&mut ev, 8, Some(t0 + Duration::from_secs(10)))
                .unwrap(),
            0
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
        // Woken by a thread that is no uthread while the poller is parked.
        for round in 0..20 {
            let waker = p.waker();
            let parked = Arc::new(AtomicBool::new(false));
            let p2 = Arc::clone(&parked);
            let t = std::thread::spawn(move || {
                while !p2.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                waker.wake();
            });
            parked.store(true, Ordering::Release);
            let t0 = Instant::now();
            let n = p
                .wait(&mut ev, 8, Some(t0 + Duration::from_secs(10)))
                .unwrap();
            assert_eq!(n, 0, "round {round}");
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "round {round}: the waker did not wake the poller"
            );
            t.join().unwrap();
        }
        // Nothing woke it: the deadline ends the wait.
        let t0 = Instant::now();
        let n = p
            .wait(&mut ev, 8, Some(t0 + Duration::from_millis(20)))
            .unwrap();
        assert_eq!(n, 0);
        assert!(t0.elapsed() >= Duration::from_millis(20));
    })
    .unwrap();
}

fn netstack_socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ginza-test-poller-{}-{name}", std::process::id()))
}

fn protected_config(path: &std::path::Path) -> Config {
    let me = Interface {
        mac: MacAddr([0x02, 0x48, 0, 0, 0, 1]),
        ip: Ipv4Addr::new(10, 48, 0, 1),
    };
    Config {
        protected: Some(ProtectedConfig::new(path, "poller-test", me)),
        ..Config::with_kthreads(2)
    }
}

/// The protected application's side: one poller over a listener and its
/// connections on the netstack.
fn protected_app(step: &AtomicU32) {
    let l = TcpListener::bind_with_backlog("0.0.0.0:7", 16).unwrap();
    assert!(l.is_protected());
    l.set_nonblocking(true).unwrap();
    assert!(is_eagain(&l.try_accept().unwrap_err()));
    let p = Poller::new();
    let _lr = p
        .register(&l, 0, Readiness::READABLE, PollMode::default())
        .unwrap();
    step.store(1, Ordering::Release); // a connection comes in
    let ev = wait_events(&p, "the connection");
    assert_eq!(ev[0].token, 0);
    let (s, _) = l.try_accept().unwrap();
    s.set_nonblocking(true).unwrap();
    assert!(is_eagain(&(&s).read(&mut [0u8; 8]).unwrap_err()));
    let interest = readable_and(true, false);
    let r = p.register(&s, 1, interest, PollMode::default()).unwrap();
    assert!(events_within(&p, Duration::ZERO).is_empty());
    step.store(2, Ordering::Release); // it delivers "hello poller"
    let ev = wait_events(&p, "the data");
    assert_eq!(
        (ev[0].token, ev[0].readiness),
        (1, readable_and(false, false))
    );
    assert_eq!(s.bytes_readable(), 12);
    let mut buf = [0u8; 32];
    assert_eq!(s.try_peek(&mut buf[..5]).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(s.try_read(&mut buf).unwrap(), 12);
    assert_eq!(&buf[..12], b"hello poller");
    assert!(is_eagain(&s.try_read(&mut buf).unwrap_err()));
    assert!(events_within(&p, Duration::from_millis(20)).is_empty());
    let w = p
        .register(&s, 2, Readiness::WRITABLE, PollMode::default())
        .unwrap();
    let ev = wait_events(&p, "writable");
    assert_eq!((ev[0].token, ev[0].readiness.writable), (2, true));
    drop(w);
    assert_eq!(s.try_write(b"back").unwrap(), 4);
    step.store(3, Ordering::Release); // the peer reads and closes (FIN)
    let ev = wait_events(&p, "the FIN");
    assert_eq!(
        (ev[0].token, ev[0].readiness),
        (1, readable_and(true, false))
    );
    assert_eq!(s.try_read(&mut buf).unwrap(), 0);
    assert!(s.take_error().unwrap().is_none());
    drop(r);
    // A second connection is reset: error and hang-up, ECONNRESET.
    step.store(4, Ordering::Release);
    let ev = wait_events(&p, "the second connection");
    assert_eq!(ev[0].token, 0);
    let (s2, _) = l.try_accept().unwrap();
    let r2 = p
        .register(&s2, 3, Readiness::READABLE, PollMode::default())
        .unwrap();
    step.store(5, Ordering::Release); // it resets
    let t0 = Instant::now();
    let r = loop {
        let ev = wait_events(&p, "the reset");
        if let Some(e) = ev.iter().find(|e| e.token == 3 && e.readiness.error) {
            break e.readiness;
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
    };
    assert!(r.hung_up && r.readable, "{r:?}");
    let e = s2.take_error().unwrap().expect("the reset");
    assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");
    assert!(s2.take_error().unwrap().is_none());
    drop(r2);
    protected_connects(&p, step);
}

/// Waits for an event of `token`; its readiness.
fn event_of(p: &Poller, token: u64, what: &str) -> Readiness {
    let t0 = Instant::now();
    loop {
        let ev = wait_events(p, what);
        if let Some(e) = ev.iter().find(|e| e.token == token) {
            return e.readiness;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
    }
}

/// Non-blocking connects on the netstack: answered (writable), refused
/// (error, `ECONNREFUSED` from `take_error`).
fn protected_connects(p: &Poller, step: &AtomicU32) {
    let out = TcpStream::connect_nonblocking("10.48.0.5:80".parse().unwrap()).unwrap();
    out.set_nonblocking(true).unwrap();
    let o = p
        .register(&out, 4, Readiness::WRITABLE, PollMode::default())
        .unwrap();
    let r = event_of(p, 4, "the connect's answer");
    assert!(r.writable && !r.error, "{r:?}");
    drop(o);
    assert!(out.take_error().unwrap().is_none());
    assert!(out.local_addr().unwrap().port() >= 49152);
    assert_eq!(out.try_write(b"hi").unwrap(), 2);
    step.store(6, Ordering::Release); // the peer reads; connects are refused
    wait_step(step, 7);
    let refused = TcpStream::connect_nonblocking("10.48.0.6:80".parse().unwrap()).unwrap();
    let _f = p
        .register(&refused, 5, Readiness::WRITABLE, PollMode::default())
        .unwrap();
    let r = event_of(p, 5, "the refusal");
    assert!(r.writable && r.error && r.hung_up, "{r:?}");
    let e = refused.take_error().unwrap().expect("the refusal");
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
    assert!(refused.take_error().unwrap().is_none());
}

#[test]
fn the_protected_backend_through_the_same_poller() {
    let _g = share();
    let path = netstack_socket("protected");
    let net = FakeNetstack::new(&path, 2, 64);
    let step = Arc::new(AtomicU32::new(0));
    std::thread::scope(|sc| {
        let s2 = Arc::clone(&step);
        let app = sc.spawn(|| {
            ginza_runtime::run(protected_config(&path), move || protected_app(&s2)).unwrap()
        });
        wait_step(&step, 1);
        let peer = SocketAddrV4::new(Ipv4Addr::new(10, 48, 0, 9), 40009);
        let c = net.connect_in(7, peer);
        wait_step(&step, 2);
        c.deliver(b"hello poller");
        wait_step(&step, 3);
        assert_eq!(c.expect_bytes(4), b"back");
        c.close();
        wait_step(&step, 4);
        let c2 = net.connect_in(7, SocketAddrV4::new(*peer.ip(), 40010));
        wait_step(&step, 5);
        c2.reset();
        wait_step(&step, 6);
        let (out, to) = net.accept_out();
        assert_eq!(to, "10.48.0.5:80".parse().unwrap());
        assert_eq!(out.expect_bytes(2), b"hi");
        net.refuse_connects();
        step.store(7, Ordering::Release);
        app.join().unwrap();
    });
    assert!(net.refused().is_empty(), "{:?}", net.refused());
}

/// How the measured server waits for its connection.
#[derive(Clone, Copy, Debug)]
enum ServerWait {
    /// A uthread blocked in `read`.
    Blocking,
    /// A poller's `wait`, then `try_read` and `try_write`, with this many
    /// idle connections registered beside the measured one.
    Poller(usize),
}

/// Echoes the requests of `len` bytes on the last of the connections it
/// accepts (the others idle) until it ends.
fn serve_one(l: &TcpListener, how: ServerWait, len: usize) {
    let mut buf = vec![0u8; len];
    let idle = match how {
        ServerWait::Blocking => {
            let (mut s, _) = l.accept().unwrap();
            loop {
                if s.read_exact(&mut buf).is_err() {
                    return;
                }
                s.write_all(&buf).unwrap();
            }
        }
        ServerWait::Poller(idle) => idle,
    };
    let p = Poller::new();
    let mut conns = Vec::new();
    for token in 0..=idle {
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let r = p
            .register(&s, token as u64, Readiness::READABLE, PollMode::default())
            .unwrap();
        conns.push(Some((s, r)));
    }
    let mut ev = Vec::new();
    let mut have = 0;
    loop {
        ev.clear();
        p.wait(&mut ev, 64, None).unwrap();
        for e in &ev {
            let token = e.token as usize;
            if token != idle {
                conns[token] = None; // an idle one ended
                continue;
            }
            let Some((s, _)) = &conns[idle] else { continue };
            loop {
                match s.try_read(&mut buf[have..]) {
                    Ok(0) => return,
                    Ok(n) => have += n,
                    Err(e) if is_eagain(&e) => break,
                    Err(_) => return,
                }
                if have == len {
                    // The reply fits the send buffer: one try_write.
                    assert_eq!(s.try_write(&buf).unwrap(), len);
                    have = 0;
                }
            }
        }
    }
}

/// One connection's round trips of `len`-byte requests against a server
/// that waits `how`; the round-trip times in ns.
fn round_trips(d: &Daemon, how: ServerWait, len: usize, n: usize) -> Vec<u64> {
    let listening = Arc::new(AtomicBool::new(false));
    let l2 = Arc::clone(&listening);
    let server = spawn_app(d.net_app("server", 1, net(SERVER)), move || {
        let l = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
        l2.store(true, Ordering::Release);
        serve_one(&l, how, len);
    });
    wait_step_flag(&listening);
    let idle = match how {
        ServerWait::Blocking => 0,
        ServerWait::Poller(idle) => idle,
    };
    let times = ginza_runtime::run(d.net_app("client", 1, net(CLIENT)), move || {
        let idle: Vec<TcpStream> = (0..idle)
            .map(|_| TcpStream::connect(server_addr(PORT)).unwrap())
            .collect();
        let mut s = TcpStream::connect(server_addr(PORT)).unwrap();
        let req = vec![5u8; len];
        let mut back = vec![0u8; len];
        let mut times = Vec::with_capacity(n);
        for i in 0..n + 100 {
            let t = Instant::now();
            s.write_all(&req).unwrap();
            s.read_exact(&mut back).unwrap();
            if i >= 100 {
                times.push(t.elapsed().as_nanos() as u64);
            }
        }
        drop(idle);
        times
    })
    .unwrap();
    server.join().unwrap();
    times
}

/// Round trips on one connection through iokerneld's switch, the server
/// blocked in `read`, or waiting on a `Poller` that watches it alone or
/// beside 1,000 idle connections; interleaved in each round. Prints one
/// line per round (docs/results.md, "Session 15").
#[test]
#[ignore = "a measurement, not a check: run with --release -- --ignored --nocapture"]
fn poller_against_blocking_read_round_trip() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let pct = |v: &mut Vec<u64>, q: f64| {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q) as usize] as f64 / 1e3
    };
    for round in 0..5 {
        let mut line = format!("round {round}:");
        for how in [
            ServerWait::Blocking,
            ServerWait::Poller(0),
            ServerWait::Poller(1000),
        ] {
            let mut t = round_trips(&d, how, 64, 5000);
            let (p50, p99) = (pct(&mut t, 0.5), pct(&mut t, 0.99));
            line += &format!("  {how:?} p50 {p50:.1} µs p99 {p99:.1} µs");
        }
        println!("{line}");
    }
}

/// `n` wakes of a parked poller by a plain OS thread (the preload
/// library's helper thread for kernel descriptors): from `wake` to `wait`'s
/// return, in ns. The thread lets the poller's kthread idle 200 µs before
/// each wake, long enough to park (and, under iokerneld, to give its core
/// back).
fn waker_latencies(cfg: Config, n: u32) -> Vec<u64> {
    ginza_runtime::run(cfg, move || {
        let p = Poller::new();
        let base = Instant::now();
        let asked = Arc::new(AtomicU32::new(0));
        let sent_at = Arc::new(AtomicU64::new(0));
        let (waker, a2, s2) = (p.waker(), Arc::clone(&asked), Arc::clone(&sent_at));
        let t = std::thread::spawn(move || {
            for i in 1..=n {
                while a2.load(Ordering::Acquire) < i {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_micros(200));
                s2.store(base.elapsed().as_nanos() as u64, Ordering::Release);
                waker.wake();
            }
        });
        let mut ev = Vec::new();
        let mut lat = Vec::with_capacity(n as usize);
        for i in 1..=n {
            asked.store(i, Ordering::Release);
            let deadline = Some(Instant::now() + Duration::from_secs(10));
            p.wait(&mut ev, 8, deadline).unwrap();
            let now = base.elapsed().as_nanos() as u64;
            lat.push(now.saturating_sub(sent_at.load(Ordering::Acquire)));
        }
        t.join().unwrap();
        lat
    })
    .unwrap()
}

/// A `PollWaker` on a plain thread waking a parked poller: on a standalone
/// runtime; under iokerneld polling as deployed (no idle sleep); under
/// iokerneld sleeping 1 ms while idle (as the other tests run it);
/// interleaved in each round. Prints one line per round (docs/results.md,
/// "Session 15").
#[test]
#[ignore = "a measurement, not a check: run with --release -- --ignored --nocapture"]
fn poll_waker_wake_latency() {
    let _g = lock();
    let pct = |v: &mut Vec<u64>, q: f64| {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q) as usize] as f64 / 1e3
    };
    for round in 0..5 {
        let mut line = format!("round {round}:");
        for (name, idle_sleep) in [
            ("standalone", None),
            ("iokerneld polling", Some(None)),
            (
                "iokerneld idle-sleep 1 ms",
                Some(Some(Duration::from_millis(1))),
            ),
        ] {
            let mut t = match idle_sleep {
                None => waker_latencies(Config::with_kthreads(1), 500),
                Some(sleep) => {
                    let d = Daemon::start(|c| c.idle_sleep = sleep);
                    waker_latencies(d.app("waker", Class::LatencyCritical, 0, 1), 500)
                }
            };
            let (p50, p99) = (pct(&mut t, 0.5), pct(&mut t, 0.99));
            line += &format!("  {name} p50 {p50:.1} µs p99 {p99:.1} µs");
        }
        println!("{line}");
    }
}
