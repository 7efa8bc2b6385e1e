//! End to end under a real (in-process) iokerneld: a Ginza application's
//! `TcpStream` (the in-process stack) → iokerneld's software switch →
//! `netstackd`'s kthreads (an application under iokerneld) → the rings →
//! a protected application (attached over the socket, a raw client on the
//! channel) that echoes → back. The test holds the lock: iokerneld's loop
//! busy-polls a core.

use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_netstack::daemon::{Daemon, DaemonConfig};
use ginza_proto::netstack::{
    attach, AttachRequest, Command, Event, Ranges, SendFlags, NETSTACK_PROTOCOL,
};
use ginza_runtime::net::{NetConfig, TcpStream};
use ginza_runtime::{Class, Config, IokernelConfig};
use ginza_shm::netstack::{AppPair, Channel, RxPoolView, TxPool};

static LOCK: Mutex<()> = Mutex::new(());

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x4e, 0x00, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 9, 0, last),
    }
}

fn cores() -> Vec<usize> {
    let mut c = ginza_sys::affinity::allowed_cpus().unwrap();
    c.truncate(2);
    c
}

fn iokerneld(dir: &std::path::Path) -> (InProcess, PathBuf) {
    iokerneld_with(dir, Some(Duration::from_millis(1)))
}

/// `idle_sleep`: iokerneld's nap while nothing is busy (`None`: it
/// busy-polls, as in production; a nap costs up to that much per hop).
fn iokerneld_with(dir: &std::path::Path, idle_sleep: Option<Duration>) -> (InProcess, PathBuf) {
    let socket = dir.join("iokerneld.sock");
    let mut cfg = IokConfig::new(cores());
    cfg.socket = socket.clone();
    cfg.idle_sleep = idle_sleep;
    cfg.validate(&ginza_sys::affinity::allowed_cpus().unwrap())
        .unwrap();
    (InProcess::start(cfg).unwrap(), socket)
}

/// A protected echo application on the raw channel (busy-polling its
/// event ring; standalone, not registered with iokerneld).
fn protected_echo(
    path: PathBuf,
    address: Interface,
    port: u16,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut tx = TxPool::create("echo-tx", 1 << 20).unwrap();
        let req = AttachRequest {
            protocol: NETSTACK_PROTOCOL,
            name: "echo".into(),
            interface: address,
            kthreads: 1,
            doorbells: false,
        };
        let att = attach(&path, &req, tx.fd(), &[]).unwrap();
        let ch = Channel::attach(att.channel).unwrap();
        let rx = RxPoolView::map(att.rx_pool, att.rx_pool_bytes).unwrap();
        let mut pair = ch.app_pair(0).unwrap();
        push(
            &mut pair,
            Command::Listen {
                cookie: 1,
                port,
                backlog: 16,
            },
        );
        let mut next_tx = 0u32;
        let mut echoed = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let Ok(Some(slot)) = pair.events.pop() else {
                std::thread::yield_now();
                continue;
            };
            let mut cmds = Vec::new();
            match Event::decode(&slot).unwrap() {
                Event::NewConn { conn, listener, .. } => {
                    cmds.push(Command::Accept { conn, listener })
                }
                Event::NewData { conn, ranges } => {
                    let mut out = Ranges::default();
                    for r in ranges.as_slice() {
                        let bytes = rx.get(*r).unwrap();
                        if next_tx as u64 + r.len as u64 > tx.len() {
                            next_tx = 0;
                        }
                        let t = ginza_shm::netstack::Range::new(next_tx, r.len);
                        tx.get_mut(t).unwrap().copy_from_slice(bytes);
                        next_tx += r.len;
                        echoed += u64::from(r.len);
                        out.push(t);
                    }
                    cmds.push(Command::Send {
                        conn,
                        ranges: out,
                        flags: SendFlags::default(),
                    });
                    cmds.push(Command::RecvDone { conn, ranges });
                }
                Event::RemoteClosed { conn } => cmds.push(Command::Close { conn }),
                _ => {}
            }
            for c in cmds {
                push(&mut pair, c);
            }
        }
        drop(att.socket);
        echoed
    })
}

fn push(pair: &mut AppPair, c: Command) {
    while pair.commands.push(c.encode()).is_err() {
        std::thread::yield_now();
    }
}

#[test]
fn a_ginza_tcp_client_talks_to_a_protected_app_through_the_netstack() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if cores().len() < 2 {
        return ginza_iokernel::testing::skip("needs two CPUs (iokerneld busy-polls one)");
    }
    let dir = tempfile::tempdir().unwrap();
    let (io, socket) = iokerneld(dir.path());
    let mut cfg = DaemonConfig::new(iface(1));
    cfg.iokernel_socket = socket.clone();
    cfg.attach_socket = dir.path().join("netstack.sock");
    cfg.kthreads = 1;
    // Short TCP timers: a lost frame costs milliseconds, not a second.
    cfg.netstack.tcp.rto_initial = Duration::from_millis(50);
    cfg.netstack.tcp.rto_min = Duration::from_millis(20);
    // No polling of the command rings: iokerneld must wake the netstack
    // for commands (it watches the channels).
    cfg.command_poll = Duration::from_secs(30);
    let ns = Daemon::start(cfg.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // One protected app shares the netstack's address, one has its own
    // (iokerneld steers it to the netstack).
    let shared = Interface {
        mac: MacAddr::ZERO,
        ip: Ipv4Addr::UNSPECIFIED,
    };
    let app = protected_echo(cfg.attach_socket.clone(), shared, 7, Arc::clone(&stop));
    let own = protected_echo(cfg.attach_socket.clone(), iface(3), 7, Arc::clone(&stop));
    // Wait until both protected apps listen (their `listen` went through).
    let t0 = Instant::now();
    while ns.stats().events < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the app never listened"
        );
        std::thread::sleep(Duration::from_millis(1));
    }

    assert!(
        ns.iokerneld_watches_channels(),
        "iokerneld took the channel"
    );

    // The client: an ordinary Ginza application with the in-process stack.
    let mut io_cfg = IokernelConfig::new("client", Class::LatencyCritical);
    io_cfg.socket = Some(socket.clone());
    let me = iface(2);
    let mut net = NetConfig::new(me.mac, me.ip);
    net.tcp.rto_initial = Duration::from_millis(50);
    net.tcp.rto_min = Duration::from_millis(20);
    io_cfg.net = Some(net);
    let client_cfg = Config {
        iokernel: Some(io_cfg),
        ..Config::with_kthreads(1)
    };
    let message: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    let m2 = message.clone();
    let got = ginza_runtime::run(client_cfg, move || {
        let echo = |to: Ipv4Addr| {
            let mut s = TcpStream::connect(SocketAddrV4::new(to, 7)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut back = vec![0u8; m2.len()];
            let w = {
                let m3 = m2.clone();
                let mut w = s.try_clone().unwrap();
                ginza_runtime::spawn(move || w.write_all(&m3).unwrap())
            };
            s.read_exact(&mut back).unwrap();
            w.join().unwrap();
            back
        };
        (echo(iface(1).ip), echo(iface(3).ip))
    })
    .unwrap();
    let (got, got_own) = got;
    assert_eq!(got_own, message, "the app at its own address echoed too");
    assert_eq!(got, message, "the protected app's echo came back intact");
    let st = ns.stats();
    assert_eq!(st.rx_bytes_delivered, 2 * message.len() as u64);
    // Zero-touch: the netstack named the payload, iokerneld copied it from
    // the applications' tx pools; the netstack copied none (frames'
    // payload, retransmissions included: at least every byte once).
    assert!(st.tx_bytes_zero_touch >= 2 * message.len() as u64, "{st:?}");
    assert_eq!(st.tx_bytes_copied, 0, "{st:?}");
    assert_eq!(st.tx_frames_unnamed, 0, "{st:?}");
    stop.store(true, Ordering::Relaxed);
    assert_eq!(app.join().unwrap(), message.len() as u64);
    assert_eq!(own.join().unwrap(), message.len() as u64);
    // iokerneld lists the netstack like any application; it got cores
    // for the traffic (grants), and gives them back when idle.
    let netstack = |io: &InProcess| {
        io.stats()
            .unwrap()
            .apps
            .into_iter()
            .find(|a| a.name == "netstack")
            .expect("iokerneld lists the netstack")
    };
    assert!(
        netstack(&io).grants > 0,
        "the netstack got cores for the traffic"
    );
    let t0 = Instant::now();
    while netstack(&io).cores_now > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the idle netstack kept its core"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(ns);
    drop(io);
}

/// Network cores by load (DLibOS's future work): the netstack (2
/// kthreads) under ping-pong traffic from 8 connections holds a core most
/// of the time, and once the traffic stops it gives its cores back and
/// stays without one. iokerneld's view of its cores is sampled every 2 ms;
/// the shares of samples at 0, 1 and 2 cores are printed
/// (`-- --nocapture`). The bounds are loose: on a loaded 2-vCPU VM it held
/// a core in about 90 % of the samples under load and none in 99 % idle.
#[test]
fn netstack_cores_follow_the_load() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if cores().len() < 2 {
        return ginza_iokernel::testing::skip("needs two CPUs");
    }
    let dir = tempfile::tempdir().unwrap();
    // Busy-polling, as in production.
    let (io, socket) = iokerneld_with(dir.path(), None);
    let mut cfg = DaemonConfig::new(iface(1));
    cfg.iokernel_socket = socket.clone();
    cfg.attach_socket = dir.path().join("netstack.sock");
    cfg.kthreads = 2;
    let ns = Daemon::start(cfg.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Interface {
        mac: MacAddr::ZERO,
        ip: Ipv4Addr::UNSPECIFIED,
    };
    let app = protected_echo(cfg.attach_socket.clone(), shared, 7, Arc::clone(&stop));
    let t0 = Instant::now();
    while ns.stats().events == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1));
    }
    let sampling = Arc::new(AtomicBool::new(true));
    let phase = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (s2, p2, sock2) = (Arc::clone(&sampling), Arc::clone(&phase), socket.clone());
    // Phases: 0 under load, 1 settling after it (not counted), 2 idle.
    let sampler = std::thread::spawn(move || {
        let mut counts = [[0u64; 3]; 3];
        while s2.load(Ordering::Relaxed) {
            if let Ok(r) = ginza_proto::client::stats(&sock2) {
                if let Some(a) = r.apps.iter().find(|a| a.name == "netstack") {
                    let p = p2.load(Ordering::Relaxed).min(2);
                    counts[p][(a.cores_now as usize).min(2)] += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        counts
    });
    let mut io_cfg = IokernelConfig::new("client", Class::LatencyCritical);
    io_cfg.socket = Some(socket.clone());
    let me = iface(2);
    io_cfg.net = Some(NetConfig::new(me.mac, me.ip));
    let client_cfg = Config {
        iokernel: Some(io_cfg),
        ..Config::with_kthreads(2)
    };
    let round_trips = ginza_runtime::run(client_cfg, move || {
        let until = Instant::now() + Duration::from_millis(1500);
        let conns: usize = std::env::var("GINZA_NS_CONNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8);
        let handles: Vec<_> = (0..conns)
            .map(|_| {
                ginza_runtime::spawn(move || {
                    let mut s = TcpStream::connect(SocketAddrV4::new(iface(1).ip, 7)).unwrap();
                    let mut buf = [0u8; 64];
                    let mut n = 0u64;
                    while Instant::now() < until {
                        s.write_all(&buf).unwrap();
                        s.read_exact(&mut buf).unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    })
    .unwrap();
    phase.store(1, Ordering::Relaxed);
    // The load is over: the netstack gives its cores back (its kthreads
    // park), then is watched idle for a while.
    let cores_now = || {
        ginza_proto::client::stats(&socket).ok().and_then(|r| {
            r.apps
                .iter()
                .find(|a| a.name == "netstack")
                .map(|a| a.cores_now)
        })
    };
    let t0 = Instant::now();
    while cores_now() != Some(0) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the idle netstack kept its cores: {:?}",
            cores_now()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    phase.store(2, Ordering::Relaxed);
    let idle_from = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let idle_for = idle_from.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let counts = sampler.join().unwrap();
    let share = |c: [u64; 3]| {
        let t = c.iter().sum::<u64>().max(1) as f64;
        c.map(|x| x as f64 / t)
    };
    let (busy, idle) = (share(counts[0]), share(counts[2]));
    let shown = |s: [f64; 3]| s.map(|x| format!("{:.0}%", 100.0 * x));
    println!(
        "netstack cores under load ({round_trips} round trips of 64 B in 1.5 s): 0/1/2 cores {:?}; idle ({idle_for:?}) after it gave them back: {:?}",
        shown(busy),
        shown(idle)
    );
    assert!(round_trips > 0, "no round trip");
    assert!(
        counts[0].iter().sum::<u64>() > 0 && counts[2].iter().sum::<u64>() > 0,
        "no samples: {counts:?}"
    );
    assert!(
        busy[1] + busy[2] >= 0.5,
        "under load the netstack held a core in {:.0}% of the samples",
        100.0 * (busy[1] + busy[2])
    );
    assert!(
        idle[0] >= 0.8,
        "idle, the netstack held no core in only {:.0}% of the samples",
        100.0 * idle[0]
    );
    stop.store(true, Ordering::Relaxed);
    app.join().unwrap();
    drop(ns);
    drop(io);
}
