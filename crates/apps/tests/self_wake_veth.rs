//! The self-woken kthread (iokerneld's `Config::self_wake`,
//! docs/direct-path.md, "The self-woken kthread") over a veth pair:
//! iokerneld on `af_xdp:IF,direct`, a UDP server with its own socket on
//! receive queue 1, the namespace transmitting on queue 1 (XPS). The
//! server's kthread parks at once when idle (`poll_while_idle` zero); a
//! datagram wakes it through the kernel, it answers with no grant of
//! iokerneld's, and iokerneld's books then show the core as the server's
//! until it parks again.
//!
//! Needs root, `ip` and `ethtool`; skipped otherwise (failed under CI as
//! root). Run under the lock of the heavy tests (its iokerneld busy-polls).

mod common;

use std::net::{SocketAddrV4, UdpSocket as LinuxUdp};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::{app_stats, asleep, Daemon};
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::testing::wait_for;
use ginza_net::MacAddr;
use ginza_runtime::net::{NetConfig, UdpSocket};
use ginza_runtime::{Handle, KthreadStats};

const MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x1a]);
const PORT: u16 = 9;
/// The queue the application's own socket is bound to.
const QUEUE: u32 = 1;
/// Datagrams that must each be answered by a self-woken kthread.
const CLEAN: usize = 3;

/// The server: echoes each datagram; after one that says `hold` it keeps
/// its core busy until the test lets it go, so that the test can read
/// iokerneld's books while it runs; `stop` ends it. No timer of its own
/// (it blocks in `recv_from` with no time-out): nothing but a datagram
/// wakes it.
fn serve(release: Arc<AtomicBool>) -> std::io::Result<()> {
    let socket = UdpSocket::bind(PORT)?;
    let mut buf = [0u8; 2048];
    loop {
        let (n, from) = socket.recv_from(&mut buf)?;
        socket.send_to(&buf[..n], from)?;
        match &buf[..n] {
            b"stop" => return Ok(()),
            // The reply leaves once this uthread blocks again (the own
            // socket's kick at the end of the burst).
            b"hold" => {
                while !release.swap(false, SeqCst) {
                    std::hint::spin_loop();
                }
            }
            _ => {}
        }
    }
}

/// A client socket in the namespace, connected to the server, that has
/// sent `payload`.
fn send(ns: &NetNs, payload: &'static [u8]) -> LinuxUdp {
    let (bind, target) = (
        SocketAddrV4::new(ns.ns_ip, 0),
        SocketAddrV4::new(ns.peer_ip, PORT),
    );
    ns.run_in(move || {
        let s = LinuxUdp::bind(bind).unwrap();
        s.connect(target).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.send(payload).unwrap();
        s
    })
    .unwrap()
}

/// Whether `payload` comes back on `s` within its time-out.
fn echoed(s: &LinuxUdp, payload: &[u8]) -> bool {
    let mut buf = [0u8; 64];
    matches!(s.recv(&mut buf), Ok(n) if &buf[..n] == payload)
}

/// One datagram from the namespace: whether it came back within 2 s.
fn ask(ns: &NetNs, payload: &'static [u8]) -> bool {
    echoed(&send(ns, payload), payload)
}

#[test]
fn a_parked_server_wakes_itself_for_a_datagram_and_iokerneld_books_its_core() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_with_queues_or_skip(2) else {
        return;
    };
    ns.steer_transmit_to_queue(2, QUEUE).unwrap();
    let host_if = ns.host_if.clone();
    let daemon = Daemon::on(&ns, "af_xdp", |cfg| {
        cfg.nic = format!("af_xdp:{host_if},direct");
        cfg.self_wake = true;
    });
    let release = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let r2 = release.clone();
    let net = NetConfig::new(MAC, ns.peer_ip).with_direct_path(&ns.host_if, QUEUE);
    let server = daemon.start_app_tuned(
        "self-waker",
        Some(net),
        1,
        |io| io.poll_while_idle = Duration::ZERO,
        move || {
            while ginza_runtime::net::stats().is_none() {
                ginza_runtime::sleep(Duration::from_millis(1));
            }
            tx.send(Handle::current().unwrap()).unwrap();
            serve(r2).map_err(|e| e.to_string())
        },
    );
    let handle = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the application's stack came up");
    let kthread = || -> KthreadStats { handle.stats().remove(0) };
    // ARP and the first grants.
    for _ in 0..20 {
        assert!(ask(&ns, b"ping"), "warm-up echoed");
    }
    let (mut clean, mut i) = (0, 0);
    while clean < CLEAN {
        assert!(
            i < 5 * CLEAN,
            "only {clean} of {i} datagrams answered by a self-woken kthread"
        );
        i += 1;
        // Parked in iokerneld's books, armed, allowed, asleep.
        let before = wait_for("the server parked and asleep", || {
            let s = daemon.get().stats().ok()?;
            let a = app_stats(&s, "self-waker");
            (a.parked_kthreads == 1 && a.cores_now == 0 && asleep("ginza-k0")).then_some(s)
        });
        let k0 = kthread();
        let client = send(&ns, b"hold");
        // While it holds the core: iokerneld's books (it counts the core
        // at the first pass after it read the kthread's `SelfWoken`).
        let during = wait_for("iokerneld to book the server's core", || {
            let s = daemon.get().stats().ok()?;
            (app_stats(&s, "self-waker").cores_now == 1).then_some(s)
        });
        let k = kthread();
        release.store(true, SeqCst);
        let answered = echoed(&client, b"hold");
        let (a0, a) = (
            app_stats(&before, "self-waker"),
            app_stats(&during, "self-waker"),
        );
        let (w0, w) = (
            (before.alloc.self_wakes, before.alloc.self_wakes_revoked),
            (during.alloc.self_wakes, during.alloc.self_wakes_revoked),
        );
        println!(
            "datagram {i}: answered {answered}; grants {} → {}, self-wakes (booked, revoked) {:?} → {:?}, cores {} → {}; \
             the kthread's grants {} → {}, self-wakes {} → {}",
            a0.grants,
            a.grants,
            w0,
            w,
            a0.cores_now,
            a.cores_now,
            k0.grants,
            k.grants,
            k0.self_wakes,
            k.self_wakes
        );
        assert!(answered, "datagram {i} echoed");
        assert_eq!(w.1, 0, "never revoked");
        assert_eq!(a.cores_now, 1, "the core is the server's while it runs");
        if a.grants == a0.grants {
            // iokerneld granted nothing: the kthread woke itself, and
            // iokerneld booked the core from its word.
            assert_eq!(w.0, w0.0 + 1, "booked from its word");
            assert_eq!(k.self_wakes, k0.self_wakes + 1, "{k0:?} then {k:?}");
            assert_eq!(k.grants, k0.grants, "{k0:?} then {k:?}");
            assert_eq!(a.preempt_overdue, 0);
            clean += 1;
        } else if k.self_wakes == k0.self_wakes {
            // iokerneld's grant came first (its loop saw the frame before
            // the kernel ran the kthread): then the kthread stood back.
            assert_eq!(w.0, w0.0, "no self-wake booked");
        } else {
            // Both (seen once in a CI run; the likely order, not traced):
            // the kthread woke itself and disarmed, and iokerneld, which
            // had not read its `SelfWoken` yet and no longer saw it armed,
            // granted it the core it was already running on. The core is
            // the server's by that grant; the `SelfWoken` is not booked
            // besides it.
            assert_eq!(k.self_wakes, k0.self_wakes + 1, "{k0:?} then {k:?}");
            assert_eq!(a.grants, a0.grants + 1, "one grant");
            assert_eq!(w.0, w0.0, "the self-wake not booked besides the grant");
        }
    }
    assert!(ask(&ns, b"stop"), "stop echoed");
    server
        .join(Duration::from_secs(10))
        .expect("the server ended cleanly");
}
