//! An idle kthread blocked on its application's own AF_XDP socket
//! (`IokernelConfig::block_while_idle`, docs/idle-poll.md, "Blocked on the
//! own socket") over a veth pair: iokerneld on `af_xdp:IF,direct`, the echo
//! server's own socket on receive queue 1, the namespace transmitting on
//! queue 1 (XPS). The kthread keeps its core and sleeps in `poll` on the
//! socket; a datagram wakes it through the kernel. It answers with no grant
//! and without waking a sleeping iokerneld; and iokerneld still takes the
//! core back at once for another application.
//!
//! Needs root, `ip` and `ethtool`; skipped otherwise (failed under CI as
//! root). Run under `flock /tmp/ginza-heavy.lock`.

mod common;

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::{app_stats, asleep, Daemon};
use ginza_apps::echo_server::{self, EchoStats};
use ginza_iokernel::netns::{self, NetNs};
use ginza_iokernel::testing::wait_for;
use ginza_net::MacAddr;
use ginza_runtime::net::{NetConfig, NetStats};
use ginza_runtime::{Class, Handle, KthreadStats};

const ECHO_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x19]);
const PORT: u16 = 7;
/// The queue the application's own socket is bound to.
const QUEUE: u32 = 1;
/// Datagrams sent one at a time, each to a blocked kthread and a sleeping
/// iokerneld.
const PROBES: usize = 5;

/// The echo server with its own socket, blocking while idle; its
/// runtime's handle (for its kthread's counts) comes back on the channel.
struct Echo {
    stop: Arc<AtomicBool>,
    handle: Handle,
    app: common::App<(Result<(), String>, Option<NetStats>)>,
}

impl Echo {
    fn start(daemon: &Daemon, ns: &NetNs) -> Echo {
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stats) = (stop.clone(), Arc::new(EchoStats::default()));
        let (tx, rx) = mpsc::channel();
        let net = NetConfig::new(ECHO_MAC, ns.peer_ip).with_direct_path(&ns.host_if, QUEUE);
        let app = daemon.start_app_tuned(
            "echo-blocked",
            Some(net),
            1,
            // Blocks at once: polling first (2 s by default) would make
            // every probe wait the bound out, and a poller that loses a
            // quarter of its CPU to other processes parks instead of
            // blocking (seen once in CI's run under a loaded machine).
            |io| {
                io.block_while_idle = true;
                io.poll_while_idle = Duration::ZERO;
            },
            move || {
                // The stack is there once iokerneld has taken the own socket.
                while ginza_runtime::net::stats().is_none() {
                    ginza_runtime::sleep(Duration::from_millis(1));
                }
                tx.send(Handle::current().unwrap()).unwrap();
                let served = echo_server::serve_udp(PORT, s2, stats);
                (
                    served.map_err(|e| e.to_string()),
                    ginza_runtime::net::stats(),
                )
            },
        );
        let handle = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the application's stack came up");
        Echo { stop, handle, app }
    }

    fn kthread(&self) -> KthreadStats {
        self.handle.stats().remove(0)
    }

    fn finish(self) -> NetStats {
        self.stop.store(true, Relaxed);
        // `serve_udp` looks at `stop` at its next datagram or timer.
        let (served, net) = self.app.join(Duration::from_secs(10));
        served.expect("echo-server");
        net.expect("the runtime's network stats")
    }
}

/// `n` UDP round trips from the namespace to the echo server: each
/// answered within 500 ms, or `None`.
fn probe(ns: &NetNs, n: usize) -> Vec<Option<Duration>> {
    let (bind, target) = (
        SocketAddrV4::new(ns.ns_ip, 0),
        SocketAddrV4::new(ns.peer_ip, PORT),
    );
    ns.run_in(move || netns::udp_rtt_probe(bind, target, n, 100, Duration::from_millis(500)))
        .unwrap()
        .unwrap()
}

fn direct_daemon(ns: &NetNs) -> Daemon {
    ns.steer_transmit_to_queue(2, QUEUE).unwrap();
    Daemon::direct(ns)
}

#[test]
fn a_blocked_idle_kthread_answers_a_datagram_without_a_grant_or_iokerneld() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_with_queues_or_skip(2) else {
        return;
    };
    let daemon = direct_daemon(&ns);
    let echo = Echo::start(&daemon, &ns);
    // ARP and the first grant.
    assert!(probe(&ns, 20).iter().all(Option::is_some), "warm-up echoed");
    // The server's receive time-out (`serve::STOP_POLL`, 10 ms) is a
    // timer of its own: when it fires while the kthread answers a
    // datagram, the kthread is busy and rings iokerneld's bell (the bell
    // held's rule), a wake the datagram did not cause. Such a datagram is
    // sent again; every other check holds for every one.
    let (mut clean, mut i) = (0, 0);
    while clean < PROBES {
        assert!(
            i < 3 * PROBES,
            "only {clean} of {i} datagrams answered without a wake by the application's bell"
        );
        i += 1;
        let before = daemon.get().stats().unwrap();
        // The stats request woke iokerneld: wait for it to sleep again,
        // and for the kthread to be blocked on its socket, holding its
        // core (it never parks: it has no polling bound to run out).
        wait_for("iokerneld and the kthread asleep", || {
            (asleep("iokerneld") && asleep("ginza-k0")).then_some(())
        });
        let k0 = echo.kthread();
        let rtt = probe(&ns, 1);
        let after = daemon.get().stats().unwrap();
        let k = echo.kthread();
        let (a0, a) = (
            app_stats(&before, "echo-blocked"),
            app_stats(&after, "echo-blocked"),
        );
        println!(
            "datagram {i}: {rtt:?}; iokerneld's sleeps {} → {}, wakes nic {} → {}, app {} → {}; \
             grants {} → {}; the kthread's blocks {} → {}, woken by a frame {} → {}, by a timer {} → {}",
            before.idle.sleeps,
            after.idle.sleeps,
            before.idle.wakes_nic,
            after.idle.wakes_nic,
            before.idle.wakes_app,
            after.idle.wakes_app,
            a0.grants,
            a.grants,
            k0.idle_blocks,
            k.idle_blocks,
            k0.idle_block_frames,
            k.idle_block_frames,
            k0.idle_block_timeouts,
            k.idle_block_timeouts
        );
        assert!(rtt[0].is_some(), "datagram {i} echoed");
        assert_eq!(a0.cores_now, 1, "it held its core while idle: {a0:?}");
        assert_eq!(a.grants, a0.grants, "answered with no grant");
        assert_eq!(k.grants, k0.grants, "answered with no grant: {k:?}");
        // iokerneld slept meanwhile and the frame did not wake it: not
        // its NIC socket, nor the application's own (counted as an
        // application's wake, with the bell, below).
        assert!(after.idle.sleeps > before.idle.sleeps, "iokerneld slept");
        assert_eq!(after.idle.wakes_nic, before.idle.wakes_nic, "NIC wakes");
        if after.idle.wakes_app != before.idle.wakes_app {
            // The time-out's timer rang the bell: it may have woken the
            // kthread just before the datagram came, which then found it
            // polling (a fresh machine's CI run saw it), so the frame
            // need not have woken it.
            continue;
        }
        if k.idle_block_frames == k0.idle_block_frames
            && k.idle_block_timeouts != k0.idle_block_timeouts
        {
            // The same with the time-out's timer while the kthread was not
            // busy (no bell): the timer woke it, and the datagram found it
            // awake (one run in 20 here).
            continue;
        }
        assert!(
            k.idle_block_frames > k0.idle_block_frames,
            "a frame on its socket woke it: {k0:?} then {k:?}"
        );
        clean += 1;
    }
    let net = echo.finish();
    assert!(net.direct_rx_packets >= 20 + PROBES as u64, "{net:?}");
    assert!(net.direct_tx_packets >= 20 + PROBES as u64, "{net:?}");
}

/// A batch application that wants the one managed core the blocked
/// kthread holds: iokerneld takes it back (`PREEMPT_PENDING`, and the
/// kthread's eventfd, since it reads no flag while blocked), the kthread
/// yields, batch runs; the echo server is granted a core again for its
/// next datagram.
#[test]
fn iokerneld_takes_the_blocked_core_back_for_another_application() {
    let _lock = common::lock();
    let Some(ns) = NetNs::create_with_queues_or_skip(2) else {
        return;
    };
    let daemon = direct_daemon(&ns);
    let echo = Echo::start(&daemon, &ns);
    assert!(probe(&ns, 20).iter().all(Option::is_some), "warm-up echoed");
    let k0 = wait_for("the kthread to block while idle", || {
        let k = echo.kthread();
        (k.idle_blocks >= 1 && asleep("ginza-k0")).then_some(k)
    });
    let managed = daemon.get().stats().unwrap().managed_cores.len();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let t0 = Instant::now();
    let batch = daemon.start_app_tuned(
        "batch",
        None,
        managed,
        |io| {
            io.class = Class::Batch;
            io.sched_idle = true;
        },
        move || {
            let spinners: Vec<_> = (0..managed)
                .map(|_| {
                    let s = s2.clone();
                    ginza_runtime::spawn(move || {
                        while !s.load(Relaxed) {
                            std::hint::spin_loop();
                        }
                    })
                })
                .collect();
            for s in spinners {
                s.join().unwrap();
            }
        },
    );
    let taken = wait_for("batch on every managed core", || {
        let s = daemon.get().stats().unwrap();
        let (b, e) = (app_stats(&s, "batch"), app_stats(&s, "echo-blocked"));
        (b.cores_now as usize == managed && e.cores_now == 0).then_some(s)
    });
    let took = t0.elapsed();
    let k = wait_for("the blocked kthread to have given its core back", || {
        let k = echo.kthread();
        (k.idle_poll_takebacks > k0.idle_poll_takebacks).then_some(k)
    });
    println!("batch on every core {took:?} after it started; the kthread {k0:?} then {k:?}");
    assert_eq!(
        app_stats(&taken, "echo-blocked").preempt_overdue,
        0,
        "the blocked kthread yielded in time"
    );
    // The echo server still answers: granted a core for its datagram. Its
    // grants are counted from a moment it holds no core (a grant made just
    // before, for its own timer, could otherwise answer the probes).
    let e0 = wait_for("the echo server to hold no core", || {
        let s = daemon.get().stats().unwrap();
        let e = app_stats(&s, "echo-blocked");
        (e.cores_now == 0).then_some(e.grants)
    });
    assert!(probe(&ns, 3).iter().all(Option::is_some), "echoed after");
    let e1 = app_stats(&daemon.get().stats().unwrap(), "echo-blocked").grants;
    assert!(e1 > e0, "granted a core again: {e0} then {e1}");
    stop.store(true, Relaxed);
    batch.join(Duration::from_secs(10));
    echo.finish();
}
