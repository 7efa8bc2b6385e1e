//! The whole protected path in one process: the netstack daemon under an
//! in-process iokerneld, a protected echo application on its raw channel,
//! and a Ginza client with the in-process stack.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ginza_net::tcp::TcpConfig;
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_netstack::daemon::DaemonConfig;
use ginza_proto::netstack::{
    attach, AttachRequest, Command, Event, Ranges, SendFlags, NETSTACK_PROTOCOL,
};
use ginza_runtime::net::NetConfig;
use ginza_runtime::{Class, Config, IokernelConfig};
use ginza_shm::netstack::{AppPair, Channel, RxPoolView, TxPool};

/// The host numbered `last` on the software switch of the test's iokerneld;
/// the netstack is host 1.
pub fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x4e, 0x00, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 9, 0, last),
    }
}

/// An application that shares the netstack's address.
pub const SHARED: Interface = Interface {
    mac: MacAddr::ZERO,
    ip: Ipv4Addr::UNSPECIFIED,
};

/// TCP timers for a test: a lost frame costs milliseconds, not a second.
pub fn short_timers(tcp: &mut TcpConfig) {
    tcp.rto_initial = Duration::from_millis(50);
    tcp.rto_min = Duration::from_millis(20);
}

/// The netstack at host 1 with `kthreads`, registered with the iokerneld
/// at `iokerneld`, its attach socket in `dir`.
pub fn netstack_config(dir: &Path, iokerneld: &Path, kthreads: u32) -> DaemonConfig {
    let mut cfg = DaemonConfig::new(iface(1));
    cfg.iokernel_socket = iokerneld.to_path_buf();
    cfg.attach_socket = dir.join("netstack.sock");
    cfg.kthreads = kthreads;
    cfg
}

/// A latency-critical Ginza application at host `last` with `kthreads`,
/// registered with the iokerneld at `iokerneld`; `tcp` tunes its TCP.
pub fn client_config(
    iokerneld: &Path,
    last: u8,
    kthreads: usize,
    tcp: impl FnOnce(&mut TcpConfig),
) -> Config {
    let mut io = IokernelConfig::new("client", Class::LatencyCritical);
    io.socket = Some(iokerneld.to_path_buf());
    let me = iface(last);
    let mut net = NetConfig::new(me.mac, me.ip);
    tcp(&mut net.tcp);
    io.net = Some(net);
    Config {
        iokernel: Some(io),
        ..Config::with_kthreads(kthreads)
    }
}

/// A protected echo application on the raw channel of the netstack at
/// `path` (busy-polling its event ring; standalone, not registered with
/// iokerneld), listening on `port` at `address`; its thread returns the
/// bytes it echoed.
pub fn protected_echo(
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

/// Pushes `c` on the command ring, waiting for room.
fn push(pair: &mut AppPair, c: Command) {
    while pair.commands.push(c.encode()).is_err() {
        std::thread::yield_now();
    }
}

/// iokerneld's view of the netstack and the client now — each one's
/// cores, grants and congestion, and each kthread (held CPU, grant,
/// queued items, queue-line flags, timer) — for a failure message: it
/// tells a core held by a kthread that never runs from one that keeps
/// being granted for work nobody takes.
pub fn iokerneld_view(socket: &Path) -> String {
    let mut out = String::new();
    let stats = ginza_proto::client::stats(socket);
    for name in ["netstack", "client"] {
        let app = stats
            .as_ref()
            .ok()
            .and_then(|r| r.apps.iter().find(|a| a.name == name));
        if let Some(a) = app {
            out += &format!(
                "\n{name}: cores_now {} parked {}/{} grants {} preemptions {} congestion {} overdue {}",
                a.cores_now,
                a.parked_kthreads,
                a.kthreads,
                a.grants,
                a.preemptions,
                a.congestion_events,
                a.preempt_overdue
            );
        }
        match ginza_proto::client::kthreads(socket, name) {
            Ok(ks) => {
                for (k, v) in ks.iter().enumerate() {
                    out += &format!("\n  {name} kthread {k}: {v:?}");
                }
            }
            Err(e) => out += &format!("\n{name}: no kthreads view: {e}"),
        }
    }
    if let Err(e) = stats {
        out += &format!("\nno stats: {e}");
    }
    out
}
