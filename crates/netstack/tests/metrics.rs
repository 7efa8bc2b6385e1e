//! The netstack's Prometheus endpoint (`--metrics`, docs/metrics.md) end
//! to end: a netstack under an in-process iokerneld serves its counters; a
//! Ginza TCP client talks to a protected echo application through it; the
//! reference parser (the Python `prometheus_client` package) reads every
//! scrape, and the counters move by what was sent. The test holds the
//! lock: iokerneld's loop busy-polls a core while anything holds one.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ginza_iokernel::testing::skip;
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_metrics::testing::{exchange, reference_parse, scrape, value, ParseError, Sample};
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
        mac: MacAddr([0x02, 0x4e, 0x00, 0x00, 0x34, last]),
        ip: Ipv4Addr::new(10, 34, 1, last),
    }
}

fn cores() -> Vec<usize> {
    let mut c = ginza_sys::affinity::allowed_cpus().unwrap();
    c.truncate(2);
    c
}

fn parse(text: &str) -> Option<Vec<Sample>> {
    match reference_parse(text) {
        Ok(s) => Some(s),
        Err(ParseError::Unavailable(why)) => {
            skip(format!("the reference parser is missing: {why}"));
            None
        }
        Err(ParseError::Rejected(why)) => panic!("the reference parser refused it: {why}\n{text}"),
    }
}

fn get(s: &[Sample], name: &str) -> f64 {
    value(s, name, &[]).unwrap_or_else(|| panic!("no sample {name}"))
}

fn push(pair: &mut AppPair, c: Command) {
    while pair.commands.push(c.encode()).is_err() {
        std::thread::yield_now();
    }
}

/// A protected application on the raw channel that echoes what it
/// receives on `port` (standalone: not registered with iokerneld).
fn protected_echo(path: PathBuf, port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut tx = TxPool::create("echo-tx", 1 << 20).unwrap();
        let req = AttachRequest {
            protocol: NETSTACK_PROTOCOL,
            name: "echo".into(),
            interface: Interface {
                mac: MacAddr::ZERO,
                ip: Ipv4Addr::UNSPECIFIED,
            },
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
                backlog: 4,
            },
        );
        let mut next_tx = 0u32;
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
                        if next_tx as u64 + r.len as u64 > tx.len() {
                            next_tx = 0;
                        }
                        let t = ginza_shm::netstack::Range::new(next_tx, r.len);
                        tx.get_mut(t).unwrap().copy_from_slice(rx.get(*r).unwrap());
                        next_tx += r.len;
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
    })
}

/// Scrapes until `f` holds (20 s at most).
fn scrape_until(
    addr: SocketAddr,
    what: &str,
    f: impl Fn(&[Sample]) -> bool,
) -> Option<Vec<Sample>> {
    let t0 = Instant::now();
    loop {
        let text = scrape(addr).unwrap();
        let s = parse(&text)?;
        if f(&s) {
            return Some(s);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_netstack_serves_its_counters_and_they_move_with_a_tcp_exchange() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if cores().len() < 2 {
        return skip("needs two CPUs (iokerneld busy-polls one)");
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("iokerneld.sock");
    let mut io_cfg = IokConfig::new(cores());
    io_cfg.socket = socket.clone();
    io_cfg.idle_sleep = Some(Duration::from_millis(1));
    io_cfg
        .validate(&ginza_sys::affinity::allowed_cpus().unwrap())
        .unwrap();
    let io = InProcess::start(io_cfg).unwrap();
    let mut cfg = DaemonConfig::new(iface(1));
    cfg.iokernel_socket = socket.clone();
    cfg.attach_socket = dir.path().join("netstack.sock");
    cfg.kthreads = 1;
    cfg.netstack.tcp.rto_initial = Duration::from_millis(50);
    cfg.netstack.tcp.rto_min = Duration::from_millis(20);
    cfg.metrics = Some("127.0.0.1:0".parse().unwrap());
    let ns = Daemon::start(cfg.clone()).unwrap();
    let addr = ns.metrics_addr().expect("metrics served");

    let Some(before) = scrape_until(addr, "a first scrape", |_| true) else {
        return;
    };
    assert_eq!(
        value(&before, "ginza_netstack_info", &[("name", "netstack")]),
        Some(1.0)
    );
    assert_eq!(get(&before, "ginza_netstack_applications"), 0.0);
    // Every family is documented, and every documented one served.
    let served: BTreeSet<String> = before.iter().map(|x| x.name.clone()).collect();
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("ginza_netstack"))
        .map(|n| n.split('{').next().unwrap_or(n).to_string())
        .collect();
    assert_eq!(
        served, documented,
        "docs/metrics.md's netstack table and the scrape"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let app = protected_echo(cfg.attach_socket.clone(), 7, Arc::clone(&stop));
    let Some(listening) = scrape_until(addr, "the application's listen", |s| {
        value(s, "ginza_netstack_applications", &[]) == Some(1.0)
            && value(s, "ginza_netstack_events_total", &[]) >= Some(1.0)
    }) else {
        return;
    };

    let mut client = IokernelConfig::new("client", Class::LatencyCritical);
    client.socket = Some(socket.clone());
    let me = iface(2);
    let mut net = NetConfig::new(me.mac, me.ip);
    net.tcp.rto_initial = Duration::from_millis(50);
    net.tcp.rto_min = Duration::from_millis(20);
    client.net = Some(net);
    let message: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let m2 = message.clone();
    let got = ginza_runtime::run(
        Config {
            iokernel: Some(client),
            ..Config::with_kthreads(1)
        },
        move || {
            let mut s = TcpStream::connect(SocketAddrV4::new(iface(1).ip, 7)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let w = {
                let (m3, mut w) = (m2.clone(), s.try_clone().unwrap());
                ginza_runtime::spawn(move || w.write_all(&m3).unwrap())
            };
            let mut back = vec![0u8; m2.len()];
            s.read_exact(&mut back).unwrap();
            w.join().unwrap();
            back
        },
    )
    .unwrap();
    assert_eq!(got, message);
    let len = message.len() as f64;
    let Some(after) = scrape_until(addr, "the echo in the counters", |s| {
        value(s, "ginza_netstack_rx_delivered_bytes_total", &[]) >= Some(len)
    }) else {
        return;
    };
    let moved = |name: &str| get(&after, name) - get(&listening, name);
    assert_eq!(moved("ginza_netstack_rx_delivered_bytes_total"), len);
    assert!(moved("ginza_netstack_tx_zero_touch_bytes_total") >= len);
    assert!(moved("ginza_netstack_rx_frames_total") > 0.0);
    assert!(moved("ginza_netstack_tx_frames_total") > 0.0);
    assert!(moved("ginza_netstack_rx_segments_total") > 0.0);
    assert!(
        moved("ginza_netstack_commands_total") >= 2.0,
        "accept, send, recv_done"
    );
    assert!(
        moved("ginza_netstack_events_total") >= 2.0,
        "new_conn, new_data"
    );
    assert_eq!(get(&after, "ginza_netstack_tx_copied_bytes_total"), 0.0);
    // The same figures as the engine's (scraped once more: the counters
    // may have moved since, never back).
    let st = ns.stats();
    let last = parse(&scrape(addr).unwrap()).unwrap();
    assert_eq!(
        get(&last, "ginza_netstack_rx_delivered_bytes_total"),
        st.rx_bytes_delivered as f64
    );
    assert!(get(&last, "ginza_netstack_rx_frames_total") >= st.frames_in as f64);

    // A bad request is answered 400 on the netstack's listener too.
    let r = String::from_utf8(exchange(addr, b"\x16\x03\x01 not http\r\n\r\n").unwrap()).unwrap();
    assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");

    stop.store(true, Ordering::Relaxed);
    app.join().unwrap();
    drop(ns);
    drop(io);
}

/// An address in use stops the netstack before it registers: its error
/// names the address.
#[test]
fn a_metrics_address_in_use_is_refused_before_registering() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = DaemonConfig::new(iface(9));
    // No iokerneld there: registering would fail with another error.
    cfg.iokernel_socket = dir.path().join("no-iokerneld.sock");
    cfg.attach_socket = dir.path().join("netstack.sock");
    cfg.metrics = Some(addr);
    let e = match Daemon::start(cfg) {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("started with its metrics address in use"),
    };
    assert!(
        e.starts_with(&format!("cannot serve metrics on {addr}")),
        "{e}"
    );
}
