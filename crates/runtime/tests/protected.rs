//! Protected mode from the application's side (docs/runtime.md,
//! "Protected mode"): `TcpListener`/`TcpStream` and the asynchronous
//! `Channel` over a fake netstack (`net::protected::testing`) that speaks
//! the same commands and events and lends receive memory from a real
//! read-only pool; the faults an application meets when it misbehaves.
//! Standalone runtimes: no iokerneld, no lock.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ginza_runtime::net::protected::testing::FakeNetstack;
use ginza_runtime::net::protected::{self, Channel, Command, Event, ProtectedConfig};
use ginza_runtime::net::{Interface, MacAddr, TcpListener, TcpStream};
use ginza_runtime::Config;

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ginza-test-netstack-{}-{name}", std::process::id()))
}

fn config(path: &Path) -> Config {
    let me = Interface {
        mac: MacAddr([0x02, 0x47, 0, 0, 0, 1]),
        ip: Ipv4Addr::new(10, 47, 0, 1),
    };
    Config {
        protected: Some(ProtectedConfig::new(path, "protected-test", me)),
        ..Config::with_kthreads(2)
    }
}

fn peer(last: u8) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 47, 0, last), 40000 + u16::from(last))
}

#[test]
fn echo_over_the_netstack_with_the_same_socket_code() {
    let path = socket("echo");
    let net = FakeNetstack::new(&path, 2, 64);
    let served = std::thread::scope(|s| {
        let server = s.spawn(|| {
            ginza_runtime::run(config(&path), || {
                let l = TcpListener::bind("0.0.0.0:7").unwrap();
                assert!(l.is_protected());
                let (mut c, from) = l.accept().unwrap();
                assert_eq!(from, std::net::SocketAddr::V4(peer(9)));
                let mut buf = [0u8; 1000];
                let mut total = 0;
                loop {
                    let n = c.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    c.write_all(&buf[..n]).unwrap();
                    total += n;
                }
                c.shutdown(Shutdown::Write).unwrap();
                (total, protected::stats().unwrap())
            })
            .unwrap()
        });
        net.wait_listening(7);
        let p = net.connect_in(7, peer(9));
        let msg: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        p.deliver(&msg);
        assert_eq!(p.expect_bytes(msg.len()), msg);
        p.close();
        p.wait_app_shut();
        p.wait_app_closed();
        assert!(p.accepted());
        server.join().unwrap()
    });
    assert_eq!(served.0, 10_000);
    net.wait_rx_returned();
    assert!(net.refused().is_empty(), "{:?}", net.refused());
    let stats = served.1;
    assert!(stats.events > 0 && stats.commands > 0, "{stats:?}");
    assert_eq!(stats.bad_events, 0);
}

#[test]
fn connect_write_and_refusal() {
    let path = socket("connect");
    let net = FakeNetstack::new(&path, 1, 64);
    std::thread::scope(|s| {
        let app = s.spawn(|| {
            ginza_runtime::run(config(&path), || {
                let mut c = TcpStream::connect("10.47.0.5:80").unwrap();
                assert_eq!(c.peer_addr().unwrap().to_string(), "10.47.0.5:80");
                c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
                let mut got = Vec::new();
                c.read_to_end(&mut got).unwrap();
                assert_eq!(got, b"ok");
                drop(c);
                let e = TcpStream::connect("10.47.0.6:80").unwrap_err();
                assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
            })
            .unwrap()
        });
        let (p, to) = net.accept_out();
        assert_eq!(to, "10.47.0.5:80".parse().unwrap());
        assert_eq!(p.expect_bytes(18), b"GET / HTTP/1.1\r\n\r\n");
        net.refuse_connects();
        p.deliver(b"ok");
        p.close();
        app.join().unwrap();
    });
}

#[test]
fn a_full_command_ring_is_back_pressure_not_loss() {
    let path = socket("full");
    // One command fits: every write after the first finds the ring full.
    let net = FakeNetstack::new(&path, 1, 1);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::thread::scope(|s| {
        let d2 = data.clone();
        let app = s.spawn(|| {
            ginza_runtime::run(config(&path), move || {
                let mut c = TcpStream::connect("10.47.0.5:80").unwrap();
                for part in d2.chunks(1000) {
                    c.write_all(part).unwrap();
                }
                protected::stats().unwrap()
            })
            .unwrap()
        });
        let (p, _) = net.accept_out();
        assert_eq!(p.expect_bytes(data.len()), data);
        let stats = app.join().unwrap();
        assert!(stats.command_ring_full > 0, "{stats:?}");
    });
    assert!(net.full_pushes() > 0);
}

#[test]
fn a_writer_starved_of_tx_chunks_wakes_when_another_connection_frees_some() {
    let path = socket("starved");
    let net = FakeNetstack::new(&path, 1, 64);
    let mut cfg = config(&path);
    // Two chunks: one connection's 4 KiB takes the whole pool.
    cfg.protected.as_mut().unwrap().tx_chunks = 2;
    net.hold_acks(true);
    let (writer_waits, waiting) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let app = s.spawn(|| {
            ginza_runtime::run(cfg, move || {
                let mut a = TcpStream::connect("10.47.0.5:80").unwrap();
                let mut b = TcpStream::connect("10.47.0.6:80").unwrap();
                a.write_all(&[1u8; 4096]).unwrap();
                // Tells the test once `b`'s writer waits, so the ACKs are
                // let through only then.
                let watcher = ginza_runtime::spawn(move || {
                    while protected::stats().unwrap().tx_waits == 0 {
                        ginza_runtime::yield_now();
                    }
                    writer_waits.send(()).unwrap();
                });
                // Blocks: no chunk is free until `a`'s are acknowledged (a
                // lost wake-up fails the test at the timeout, not a hang).
                b.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                b.write_all(b"after a").unwrap();
                watcher.join().unwrap();
                protected::stats().unwrap()
            })
            .unwrap()
        });
        let (pa, _) = net.accept_out();
        let (pb, _) = net.accept_out();
        assert_eq!(pa.expect_bytes(4096), vec![1u8; 4096]);
        waiting
            .recv_timeout(Duration::from_secs(5))
            .expect("the second writer waits for a free chunk");
        net.hold_acks(false);
        assert_eq!(pb.expect_bytes(7), b"after a");
        let stats = app.join().unwrap();
        assert!(stats.tx_waits > 0, "{stats:?}");
    });
}

#[test]
fn binding_port_0_picks_a_free_ephemeral_port() {
    let path = socket("port0");
    let net = FakeNetstack::new(&path, 1, 64);
    let (a, b, busy) = ginza_runtime::run(config(&path), || {
        let a = TcpListener::bind("0.0.0.0:0").unwrap();
        let b = TcpListener::bind("0.0.0.0:0").unwrap();
        let busy = TcpListener::bind(a.local_addr().unwrap()).map(|_| ());
        (
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
            busy.map_err(|e| e.kind()),
        )
    })
    .unwrap();
    assert!(a >= 49152 && b >= 49152 && a != b, "{a} {b}");
    assert_eq!(busy, Err(ErrorKind::AddrInUse));
    drop(net);
}

#[test]
fn zero_copy_read_lends_the_received_bytes() {
    let path = socket("lent");
    let net = FakeNetstack::new(&path, 1, 64);
    std::thread::scope(|s| {
        let app = s.spawn(|| {
            ginza_runtime::run(config(&path), || {
                let l = TcpListener::bind("0.0.0.0:9").unwrap();
                let (c, _) = l.accept().unwrap();
                let p = c.as_protected().unwrap();
                // Consume 3 bytes of the lent slice, then the rest.
                let first = p.read_lent(|b| (3, b.to_vec())).unwrap();
                let rest = p.read_lent(|b| (b.len(), b.to_vec())).unwrap();
                let end = p.read_lent(|b| (0, b.len())).unwrap();
                (first, rest, end)
            })
            .unwrap()
        });
        net.wait_listening(9);
        let p = net.connect_in(9, peer(3));
        p.deliver(b"abcdefgh");
        p.close();
        let (first, rest, end) = app.join().unwrap();
        assert_eq!(first, b"abcdefgh");
        assert_eq!(rest, b"defgh");
        assert_eq!(end, 0);
    });
    net.wait_rx_returned();
}

#[test]
fn the_netstack_gone_resets_connections_instead_of_hanging() {
    let path = socket("gone");
    let net = FakeNetstack::new(&path, 1, 64);
    std::thread::scope(|s| {
        let app = s.spawn(|| {
            ginza_runtime::run(config(&path), || {
                let l = TcpListener::bind("0.0.0.0:7").unwrap();
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 16];
                let read = c.read(&mut buf).map_err(|e| e.kind());
                let write = c.write(b"x").map_err(|e| e.kind());
                let accept = l.accept().map(|_| ()).map_err(|e| e.kind());
                let connect = TcpStream::connect("10.47.0.5:1")
                    .map(|_| ())
                    .map_err(|e| e.kind());
                (read, write, accept, connect)
            })
            .unwrap()
        });
        net.wait_listening(7);
        let p = net.connect_in(7, peer(4));
        while !p.accepted() {
            std::thread::yield_now();
        }
        // The application is (or will be) blocked in read.
        net.kill();
        let (read, write, accept, connect) = app.join().unwrap();
        assert_eq!(read, Err(ErrorKind::ConnectionReset));
        assert!(write.is_err());
        assert_eq!(accept, Err(ErrorKind::ConnectionReset));
        assert_eq!(connect, Err(ErrorKind::ConnectionReset));
    });
}

#[test]
fn no_netstack_at_the_path_is_a_clear_start_error() {
    let path = socket("nobody");
    let e = ginza_runtime::run(config(&path), || ()).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("netstack") && text.contains("nobody"),
        "{text}"
    );
}

#[test]
fn the_asynchronous_channel_serves_an_echo_loop() {
    let path = socket("channel");
    let net = FakeNetstack::new(&path, 2, 64);
    std::thread::scope(|s| {
        let app = s.spawn(|| {
            ginza_runtime::run(config(&path), || {
                let ch = Channel::open().unwrap();
                assert!(Channel::open().is_err(), "one channel at a time");
                let cookie = ch.cookie();
                let listen = Command::Listen {
                    cookie,
                    port: 5,
                    backlog: 16,
                };
                ch.submit(0, &listen).unwrap();
                let mut echoed = 0usize;
                let mut acked = 0u64;
                loop {
                    let Some(e) = ch.next_event(Some(Duration::from_secs(10))).unwrap() else {
                        panic!("no event in 10 s");
                    };
                    match e.event {
                        Event::Listening { cookie: c, .. } => assert_eq!(c, cookie),
                        Event::NewConn { conn, listener, .. } => ch
                            .submit(e.pair, &Command::Accept { conn, listener })
                            .unwrap(),
                        Event::NewData { conn, ranges } => {
                            for &r in ranges.as_slice() {
                                let bytes = ch.rx(r).unwrap().to_vec();
                                let mut sent = 0;
                                while sent < bytes.len() {
                                    sent += ch.send(e.pair, conn, &bytes[sent..]).unwrap();
                                }
                                echoed += bytes.len();
                            }
                            ch.submit(e.pair, &Command::RecvDone { conn, ranges })
                                .unwrap();
                        }
                        Event::DataAcked { ranges, .. } => acked += ranges.bytes(),
                        Event::RemoteClosed { conn } => {
                            ch.submit(e.pair, &Command::Close { conn }).unwrap()
                        }
                        Event::Cleanup { .. } => break,
                        other => panic!("unexpected {other:?}"),
                    }
                }
                (echoed, acked, protected::stats().unwrap())
            })
            .unwrap()
        });
        net.wait_listening(5);
        let p = net.connect_in(5, peer(5));
        let msg = vec![42u8; 5000];
        p.deliver(&msg);
        assert_eq!(p.expect_bytes(5000), msg);
        p.close();
        let (echoed, acked, stats) = app.join().unwrap();
        assert_eq!(echoed, 5000);
        assert_eq!(acked, 5000);
        // Every tx chunk came back with `DataAcked`.
        assert_eq!(stats.tx_chunks_free, 4096, "{stats:?}");
    });
    net.wait_rx_returned();
}

/// The child half of the fault tests: gets received bytes lent and does
/// what `GINZA_FAULT` says with their memory.
#[test]
fn fault_child() {
    let Ok(what) = std::env::var("GINZA_FAULT") else {
        return; // run only as a child of the tests below
    };
    let path = socket(&format!("fault-{what}"));
    let net = FakeNetstack::new(&path, 1, 64);
    std::thread::scope(|s| {
        let app = s.spawn(|| {
            ginza_runtime::run(config(&path), move || {
                let l = TcpListener::bind("0.0.0.0:7").unwrap();
                let (c, _) = l.accept().unwrap();
                c.as_protected()
                    .unwrap()
                    .read_lent(|b| {
                        let page = (b.as_ptr() as usize) & !4095;
                        match what.as_str() {
                            "write" => {
                                // SAFETY: none — this deliberately writes to
                                // read-only receive memory; the test expects
                                // the kernel to kill the process (SIGSEGV).
                                unsafe { std::ptr::write_volatile(b.as_ptr() as *mut u8, 0) };
                                println!("FAULT-CHILD: the write went through");
                            }
                            "mprotect" => {
                                // SAFETY: changes only the protection of a
                                // page of our own mapping; it must fail.
                                let r = unsafe {
                                    libc::mprotect(
                                        page as *mut libc::c_void,
                                        4096,
                                        libc::PROT_READ | libc::PROT_WRITE,
                                    )
                                };
                                let err = std::io::Error::last_os_error();
                                println!("FAULT-CHILD: mprotect returned {r} ({err})");
                                assert_eq!(r, -1, "the receive pool became writable");
                            }
                            other => panic!("unknown GINZA_FAULT {other}"),
                        }
                        (b.len(), ())
                    })
                    .unwrap();
            })
            .unwrap()
        });
        net.wait_listening(7);
        let p = net.connect_in(7, peer(6));
        p.deliver(b"secret");
        app.join().unwrap();
    });
}

fn run_fault_child(what: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "fault_child", "--nocapture", "--test-threads=1"])
        .env("GINZA_FAULT", what)
        .output()
        .unwrap()
}

#[test]
fn writing_to_receive_memory_is_a_segfault() {
    use std::os::unix::process::ExitStatusExt;
    let out = run_fault_child("write");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("the write went through"), "{stdout}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "the child should die of SIGSEGV: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn receive_memory_cannot_be_made_writable() {
    let out = run_fault_child("mprotect");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("mprotect returned -1"),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The victim of `another_process_cannot_open_the_pools`: attached to a
/// fake netstack, it prints its pid and the descriptors of its memfds,
/// then waits for its stdin to close.
#[test]
fn victim_child() {
    if std::env::var("GINZA_VICTIM").is_err() {
        return; // run only as a child of the test below
    }
    let path = socket("victim");
    let _net = FakeNetstack::new(&path, 1, 64);
    ginza_runtime::run(config(&path), || {
        let mut fds = Vec::new();
        for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            if target.to_string_lossy().contains("memfd:") {
                fds.push(e.file_name().to_string_lossy().to_string());
            }
        }
        println!("VICTIM {} {}", std::process::id(), fds.join(","));
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    })
    .unwrap();
}

#[test]
fn another_process_cannot_open_the_pools() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    use std::process::{Command as Cmd, Stdio};
    // Root may open anything (CAP_SYS_PTRACE): run both sides as nobody.
    let as_nobody = |c: &mut Cmd| {
        if ginza_sys::process::geteuid() == 0 {
            c.uid(65534).gid(65534);
        }
    };
    let mut victim = Cmd::new(std::env::current_exe().unwrap());
    victim
        .args(["--exact", "victim_child", "--nocapture", "--test-threads=1"])
        .env("GINZA_VICTIM", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    as_nobody(&mut victim);
    let mut victim = victim.spawn().unwrap();
    let out = std::io::BufReader::new(victim.stdout.take().unwrap());
    let mut lines = out.lines().map_while(Result::ok);
    let line = lines
        .by_ref()
        .find_map(|l| l.find("VICTIM ").map(|at| l[at..].to_string()))
        .expect("the victim says its pid and memfds");
    let mut words = line.split_whitespace().skip(1);
    let pid = words.next().unwrap().to_string();
    let fds: Vec<String> = words
        .next()
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert!(fds.len() >= 2, "the victim holds its pools: {line}");
    for fd in &fds {
        let mut attacker = Cmd::new("cat");
        attacker
            .arg(format!("/proc/{pid}/fd/{fd}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_nobody(&mut attacker);
        let r = attacker.output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(
            !r.status.success() && err.contains("Permission denied"),
            "another process opened /proc/{pid}/fd/{fd}: {:?} {err}",
            r.status
        );
    }
    drop(victim.stdin.take());
    lines.for_each(drop); // to its end: the child writes to a pipe
    assert!(victim.wait().unwrap().success());
}
