//! The whole protected path under a real (in-process) iokerneld: the
//! echo-server, run protected by its flags (`--protected=PATH`, registered
//! with iokerneld for cores only), serves a Ginza client (the in-process
//! stack) through iokerneld's software switch, the netstack daemon's
//! kthreads (an application under iokerneld) and the rings. iokerneld
//! wakes the parked echo-server for its events (it watches the channel).
//! Holds the lock: iokerneld busy-polls a core.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use ginza_apps::app_args::AppArgs;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_iokernel::testing::{in_process, test_cores};
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_netstack::daemon::{Daemon, DaemonConfig};
use ginza_runtime::net::{NetConfig, TcpStream};
use ginza_runtime::{Class, Config, IokernelConfig};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    app: AppArgs,
}

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x4e, 0x01, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 9, 1, last),
    }
}

#[test]
fn echo_server_protected_by_its_flags_under_iokerneld() {
    let _g = common::lock();
    if test_cores().len() < 2 {
        return ginza_iokernel::testing::skip("needs two CPUs (iokerneld busy-polls one)");
    }
    let dir = std::env::temp_dir().join(format!("ginza-prot-iok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (io, socket) = in_process(&dir, |_| {});

    let mut ns_cfg = netstack_config(&dir, &socket);
    ns_cfg.netstack.tcp.rto_initial = Duration::from_millis(50);
    ns_cfg.netstack.tcp.rto_min = Duration::from_millis(20);
    let ns = Daemon::start(ns_cfg.clone()).unwrap();

    // The echo-server at its own address, protected: the flags alone.
    let args = protected_app_args("echo-server", &ns_cfg, &socket);
    let server_config = args.runtime_config("echo-server");
    assert!(server_config.iokernel.as_ref().unwrap().net.is_none());
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(EchoStats::default());
    let (stop2, stats2) = (stop.clone(), stats.clone());
    let server = std::thread::spawn(move || {
        ginza_runtime::run(server_config, move || {
            let tcp_only = Protocols {
                udp: false,
                tcp: true,
            };
            echo_server::serve(7, tcp_only, stop2, stats2)
        })
    });

    // The client: an ordinary Ginza application with the in-process stack.
    let mut client_io = IokernelConfig::new("client", Class::LatencyCritical);
    client_io.socket = Some(socket.clone());
    let me = iface(2);
    let mut net = NetConfig::new(me.mac, me.ip);
    net.tcp.rto_initial = Duration::from_millis(50);
    net.tcp.rto_min = Duration::from_millis(20);
    client_io.net = Some(net);
    let client_cfg = Config {
        iokernel: Some(client_io),
        ..Config::with_kthreads(1)
    };
    let message: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    let m2 = message.clone();
    let got = ginza_runtime::run(client_cfg, move || {
        // The echo-server may still be attaching and listening.
        let t0 = Instant::now();
        let mut s = loop {
            match TcpStream::connect(SocketAddrV4::new(iface(3).ip, 7)) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                    log::info!("connect: {e}; again");
                    ginza_runtime::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let w = {
            let m3 = m2.clone();
            let mut w = s.try_clone().unwrap();
            ginza_runtime::spawn(move || w.write_all(&m3).unwrap())
        };
        let mut back = vec![0u8; m2.len()];
        s.read_exact(&mut back).unwrap();
        w.join().unwrap();
        back
    })
    .unwrap();
    assert!(got == message, "the echo came back intact");
    // iokerneld lists the protected echo-server as an application of its
    // own (cores only; its frames went to the netstack).
    let apps = io.stats().unwrap().apps;
    let echo = apps.iter().find(|a| a.name == "echo-server");
    assert!(echo.is_some_and(|a| a.net.is_none()), "{apps:?}");
    stop.store(true, Relaxed);
    server.join().unwrap().unwrap().unwrap();
    assert_eq!(stats.tcp_accepted.load(Relaxed), 1);
    assert_eq!(stats.tcp_bytes.load(Relaxed), message.len() as u64);
    let st = ns.stats();
    assert_eq!(st.rx_bytes_delivered, message.len() as u64);
    // Zero-touch from the echo-server's tx pool: the netstack named the
    // payload, iokerneld copied it out (docs/protected.md, "Transmit").
    assert!(st.tx_bytes_zero_touch > 0, "{st:?}");
    drop(ns);
    drop(io);
    let _ = std::fs::remove_dir_all(PathBuf::from(&dir));
}

/// A latency-critical application that always has work queued: two
/// uthreads that each compute for 50 µs and yield, until `stop`. Two of
/// them on the one managed core take it from each other every pass
/// (`CoreNeeded`), as kv-rtc and kv-victim do in the soak.
fn busy_lc(
    name: &str,
    socket: &std::path::Path,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut io = IokernelConfig::new(name, Class::LatencyCritical);
    io.socket = Some(socket.to_path_buf());
    let cfg = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(1)
    };
    std::thread::spawn(move || {
        ginza_runtime::run(cfg, move || {
            let spin = move || {
                while !stop.load(Relaxed) {
                    let t0 = Instant::now();
                    while t0.elapsed() < Duration::from_micros(50) {
                        std::hint::spin_loop();
                    }
                    ginza_runtime::yield_now();
                }
            };
            let other = ginza_runtime::spawn(spin.clone());
            spin();
            other.join().unwrap();
        })
        .unwrap();
    })
}

/// Issue 35: a protected server with one kthread exits by itself after
/// its netstack goes away, while two busy latency-critical applications
/// trade the one managed core. Its acceptor fails with the netstack's
/// loss and its main uthread, which looks every `STOP_POLL` (a timer),
/// returns the error. Before the fix iokerneld could lose that timer (a
/// grant for it undone before the kthread ran) and the server never ran
/// again.
#[test]
fn a_protected_server_exits_after_its_netstack_stops_beside_busy_apps() {
    let _g = common::lock();
    if test_cores().len() < 2 {
        return ginza_iokernel::testing::skip("needs two CPUs (iokerneld busy-polls one)");
    }
    let dir = std::env::temp_dir().join(format!("ginza-prot-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One managed core, as in the soak; iokerneld's loop on the other.
    let (io, socket) = in_process(&dir, |c| {
        c.cores = vec![test_cores()[1]];
        c.own_core = Some(test_cores()[0]);
    });
    let ns_cfg = netstack_config(&dir, &socket);
    let ns = Daemon::start(ns_cfg.clone()).unwrap();

    let args = protected_app_args("protected-server", &ns_cfg, &socket);
    let server_config = args.runtime_config("protected-server");
    let stop = Arc::new(AtomicBool::new(false));
    let (done, result) = std::sync::mpsc::channel();
    let s2 = stop.clone();
    let server = std::thread::spawn(move || {
        let r = ginza_runtime::run(server_config, move || {
            ginza_apps::serve::accept_until_stopped(7, &s2, drop)
        });
        let _ = done.send(r.map_err(|e| e.to_string()));
    });
    // Attached and listening: a client's connection is accepted.
    let mut client_io = IokernelConfig::new("client", Class::LatencyCritical);
    client_io.socket = Some(socket.clone());
    client_io.net = Some(NetConfig::new(iface(2).mac, iface(2).ip));
    let client_cfg = Config {
        iokernel: Some(client_io),
        ..Config::with_kthreads(1)
    };
    // On a thread of its own: a runtime that is never run again (the
    // fault this test is about) must fail the test, not hang it.
    let (connected, client) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = ginza_runtime::run(client_cfg, || {
            let t0 = Instant::now();
            loop {
                match TcpStream::connect(SocketAddrV4::new(iface(3).ip, 7)) {
                    Ok(_) => return Ok(()),
                    Err(e) if t0.elapsed() > Duration::from_secs(10) => {
                        return Err(format!("connect: {e}"))
                    }
                    Err(_) => ginza_runtime::sleep(Duration::from_millis(20)),
                }
            }
        });
        let _ = connected.send(r.map_err(|e| e.to_string()));
    });
    match client.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r.unwrap().unwrap(),
        Err(_) => panic!(
            "the client did not connect within 20 s: {:#?}",
            io.stats().unwrap().apps
        ),
    }

    let busy_stop = Arc::new(AtomicBool::new(false));
    let busy = [
        busy_lc("busy-a", &socket, busy_stop.clone()),
        busy_lc("busy-b", &socket, busy_stop.clone()),
    ];
    // Both busy applications trade the core (and the server's 10 ms timer
    // gets its grants in between) for a while before the netstack goes.
    let t0 = Instant::now();
    // Grants of busy-a, busy-b and the server about once a second: a
    // failure then shows whether one of them stopped being granted or was
    // granted slowly all along.
    let mut history = Vec::new();
    loop {
        let apps = io.stats().unwrap().apps;
        let grants = |n: &str| apps.iter().find(|a| a.name == n).map_or(0, |a| a.grants);
        let now = (
            grants("busy-a"),
            grants("busy-b"),
            grants("protected-server"),
        );
        if now.0 > 200 && now.1 > 200 && now.2 > 20 {
            break;
        }
        let second = t0.elapsed().as_secs();
        if history.last().is_none_or(|&(s, _)| s < second) {
            history.push((second, now));
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the busy applications never traded the core; grants (busy-a, busy-b, server) by second: {history:?}; {apps:#?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(ns);
    let got = result.recv_timeout(Duration::from_secs(5));
    // Stopped either way; a runtime never run again is left behind.
    busy_stop.store(true, Relaxed);
    stop.store(true, Relaxed);
    let got = got.unwrap_or_else(|_| {
        panic!(
            "the protected server did not return within 5 s of its netstack's end: {:#?}",
            io.stats().unwrap().apps
        )
    });
    let err = got
        .expect("the runtime ran")
        .expect_err("serving ends with the netstack's loss");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    server.join().unwrap();
    let t0 = Instant::now();
    while !busy.iter().all(|b| b.is_finished()) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the busy applications did not stop: {:#?}",
            io.stats().unwrap().apps
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for b in busy {
        b.join().unwrap();
    }
    drop(io);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One netstack kthread under the iokerneld at `socket`, attached to at
/// `dir`/netstack.sock.
fn netstack_config(dir: &std::path::Path, socket: &std::path::Path) -> DaemonConfig {
    let mut cfg = DaemonConfig::new(iface(1));
    cfg.iokernel_socket = socket.to_path_buf();
    cfg.attach_socket = dir.join("netstack.sock");
    cfg.kthreads = 1;
    cfg
}

/// A protected application's flags alone: its netstack, iokerneld, its
/// own address, one kthread.
fn protected_app_args(name: &str, ns: &DaemonConfig, socket: &std::path::Path) -> AppArgs {
    Cli::try_parse_from([
        name.to_string(),
        format!("--protected={}", ns.attach_socket.display()),
        format!("--socket={}", socket.display()),
        format!("--ip={}", iface(3).ip),
        format!("--mac={}", iface(3).mac),
        "--kthreads=1".to_string(),
    ])
    .unwrap()
    .app
}
