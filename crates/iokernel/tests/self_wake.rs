//! iokerneld's side of the self-woken kthread (docs/direct-path.md, "The
//! self-woken kthread") against a runtime the test plays (recording
//! actuator): a `SelfWoken` iokerneld would not have allowed is revoked —
//! the kthread gets a preemption, not a core — and a park answers it.
//!
//! Tests hold `LOCK`: iokerneld's loop spins while anything holds a core.

use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::RecordingActuator;
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_proto::{AppStats, StatsReport};
use ginza_shm::{LineFlags, ToIokernel, ToKthread, UNNUMBERED_GRANT};

mod common;
use common::{lock, Daemon};

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0, last]),
        ip: Ipv4Addr::new(10, 9, 0, last),
    }
}

fn app<'a>(s: &'a StatsReport, name: &str) -> &'a AppStats {
    s.apps
        .iter()
        .find(|a| a.name == name)
        .unwrap_or_else(|| panic!("{name} is registered"))
}

/// A runtime that says it woke itself, with no own socket (so nothing was
/// ever allowed, `SELF_WAKE_ALLOWED` never set): iokerneld counts the wake,
/// revokes it at once (`PREEMPT_PENDING`, a `Preempt` on the kthread's
/// ring), books no core for it at any point, and takes its `Yielded` as
/// the answer.
#[test]
fn a_self_wake_iokerneld_did_not_allow_is_revoked() {
    let _l = lock();
    let d = Daemon::start_with(RecordingActuator::new(), |c| c.self_wake = true);
    let mut liar = RawApp::register(&d.socket, "liar", iface(7), 1).unwrap();
    d.wait_for("the liar registered and parked", |s| {
        s.apps
            .iter()
            .any(|a| a.name == "liar" && a.parked_kthreads == 1)
    });
    let line = &liar.ends[0].line;
    assert!(
        !line.flags().contains(LineFlags::SELF_WAKE_ALLOWED),
        "no own socket: never allowed"
    );
    line.insert_flags(LineFlags::SELF_WOKEN);
    liar.ends[0]
        .to_iokernel
        .send(ToIokernel::SelfWoken {
            grant: UNNUMBERED_GRANT,
        })
        .unwrap();
    let s = d.wait_for("the self-wake revoked", |s| {
        (s.alloc.self_wakes, s.alloc.self_wakes_revoked) == (1, 1)
    });
    let a = app(&s, "liar");
    assert_eq!(a.cores_now, 0, "no core booked: {a:?}");
    assert_eq!(a.grants, 0, "no grant: {a:?}");
    assert_eq!(a.preemptions, 1, "revoked: {a:?}");
    assert_eq!(a.parked_kthreads, 0, "not parked until it yields: {a:?}");
    assert!(liar.ends[0]
        .line
        .flags()
        .contains(LineFlags::PREEMPT_PENDING));
    let mut preempts = 0;
    while let Ok(Some(m)) = liar.ends[0].from_iokernel.recv() {
        match m {
            ToKthread::Preempt { .. } => preempts += 1,
            other => panic!("only a preemption is sent: {other:?}"),
        }
    }
    assert_eq!(preempts, 1);
    liar.ends[0]
        .to_iokernel
        .send(ToIokernel::Yielded {
            next_deadline_ns: None,
            grant: UNNUMBERED_GRANT,
        })
        .unwrap();
    let s = d.wait_for("the liar parked again", |s| {
        app(s, "liar").parked_kthreads == 1
    });
    let a = app(&s, "liar");
    assert_eq!((a.cores_now, a.grants), (0, 0), "{a:?}");
    assert!(!liar.ends[0]
        .line
        .flags()
        .contains(LineFlags::PREEMPT_PENDING));
    assert_eq!(s.stale_parks, 0, "the Yielded answered the self-wake");
}

/// A `SelfWoken` from a kthread iokerneld does not believe parked (it
/// holds a core, granted by iokerneld) is not a grant: ignored, counted
/// nowhere, the books unchanged.
#[test]
fn a_self_wake_of_a_running_kthread_is_ignored() {
    let _l = lock();
    let d = Daemon::start_with(RecordingActuator::new(), |c| c.self_wake = true);
    let mut busy = RawApp::register(&d.socket, "busy", iface(8), 1).unwrap();
    busy.stay_busy(0);
    let s = d.wait_for("busy granted a core", |s| app(s, "busy").cores_now == 1);
    let before = app(&s, "busy").clone();
    busy.ends[0]
        .to_iokernel
        .send(ToIokernel::SelfWoken {
            grant: UNNUMBERED_GRANT,
        })
        .unwrap();
    // A stats request follows a pass that drained the ring: ask until one
    // comes after a few passes more.
    let passes = s.passes;
    let s = d.wait_for("a few passes", |s| s.passes > passes + 10);
    let a = app(&s, "busy");
    assert_eq!(s.alloc.self_wakes, 0, "not counted");
    assert_eq!(
        (a.cores_now, a.grants, a.preemptions),
        (1, before.grants, before.preemptions),
        "{a:?}"
    );
}

/// A thread of this process under `SCHED_IDLE`, alive until the returned
/// sender is dropped: the tid a test's batch kthread reports in `Started`,
/// so that iokerneld reads its class as a runtime's `SCHED_IDLE` kthread.
fn idle_class_thread() -> (i32, std::sync::mpsc::Sender<()>) {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        ginza_sys::sched_class::set_current_idle().expect("SCHED_IDLE for the batch thread");
        tid_tx.send(ginza_sys::process::gettid()).unwrap();
        let _ = stop_rx.recv();
    });
    (tid_rx.recv().unwrap(), stop_tx)
}

/// What a runtime's kthread 0 says as a frame wakes it (`SelfWoken`).
fn self_wake(app: &mut RawApp) {
    app.ends[0].line.insert_flags(LineFlags::SELF_WOKEN);
    app.ends[0]
        .to_iokernel
        .send(ToIokernel::SelfWoken {
            grant: UNNUMBERED_GRANT,
        })
        .unwrap();
}

/// What it says as it parks again (`Parked`).
fn park(app: &mut RawApp) {
    app.ends[0].line.remove_flags(LineFlags::SELF_WOKEN);
    app.ends[0]
        .to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: None,
            grant: UNNUMBERED_GRANT,
        })
        .unwrap();
}

/// A train of short self-woken stays on a core lent to a `SCHED_IDLE`
/// kthread, each park read together with the next self-wake (as when
/// iokerneld's loop reads the ring after several requests): the victim's
/// preemption is withdrawn at each park and made afresh at each self-wake,
/// so it is never signalled while every stay is shorter than its grace —
/// though the train lasts many graces. (Booked before the withdrawal, the
/// grace ran from the train's first wake and the victim was signalled:
/// docs/direct-path.md, "The self-woken server's cost".)
#[test]
fn a_victim_is_not_signalled_while_each_self_woken_stay_is_shorter_than_its_grace() {
    use ginza_iokernel::netns::NetNs;
    use ginza_iokernel::Action;
    use std::time::{Duration, Instant};

    // Long against the kernel's time slices (a few ms): the test's own
    // thread, spinning beside iokerneld's on a loaded machine, is
    // descheduled for that long now and then.
    const GRACE: Duration = Duration::from_millis(25);
    let _l = lock();
    let Some(ns) = NetNs::create_with_queues_or_skip(2) else {
        return;
    };
    let own = ns.own_socket(1, 64).unwrap();
    let recorder = RecordingActuator::new();
    let direct = format!("af_xdp:{},direct", ns.host_if);
    let d = Daemon::start_with(recorder.clone(), |c| {
        c.nic = direct;
        c.self_wake = true;
        c.idle_victim_grace = GRACE;
        // One core: the batch kthread holds the one the server is pinned to.
        c.cores.truncate(1);
        c.idle_sleep = None;
    });
    let server_if = Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0, 0x31]),
        ip: ns.peer_ip,
    };
    let mut server = RawApp::register(&d.socket, "server", server_if, 1).unwrap();
    server.conn.attach_direct_socket(1, own.fd()).unwrap();
    server.ends[0]
        .to_iokernel
        .send(ToIokernel::Started {
            tid: ginza_sys::process::gettid() as u32,
        })
        .unwrap();
    // Granted once, so that iokerneld knows the CPU it is pinned to (a
    // grant made before it read `Started` is pinned when it does); then
    // parked.
    server.stay_busy(0);
    d.wait_for("the server granted", |s| app(s, "server").cores_now == 1);
    server.ends[0].line.set_rq_head(1);
    server.report_parked(0);
    d.wait_for("the server parked", |s| {
        app(s, "server").parked_kthreads == 1
    });

    let (batch_tid, _keep) = idle_class_thread();
    let mut batch = RawApp::register_batch(&d.socket, "batch", iface(32), 1).unwrap();
    batch.ends[0]
        .to_iokernel
        .send(ToIokernel::Started {
            tid: batch_tid as u32,
        })
        .unwrap();
    batch.stay_busy(0);
    d.wait_for("batch holds the core", |s| app(s, "batch").cores_now == 1);
    let t0 = Instant::now();
    while !server.ends[0]
        .line
        .flags()
        .contains(LineFlags::SELF_WAKE_ALLOWED)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the server is never allowed to wake itself onto batch's core"
        );
        std::hint::spin_loop();
    }
    let withdrawn_before = d.stats().alloc.preemptions_withdrawn;

    // Stays of GRACE / 10, for 4 graces: a park and the next wake back to
    // back each time. A train where this thread was descheduled for a
    // grace (a stay that long: a signal is then right) is run again.
    let stay = GRACE / 10;
    for attempt in 1..=5 {
        let mut longest = Duration::ZERO;
        self_wake(&mut server);
        let train = Instant::now();
        let mut last = Instant::now();
        while train.elapsed() < GRACE * 4 {
            while last.elapsed() < stay {
                std::hint::spin_loop();
            }
            park(&mut server);
            self_wake(&mut server);
            longest = longest.max(last.elapsed());
            last = Instant::now();
        }
        park(&mut server);
        let s = d.wait_for("the server parked after the train", |s| {
            app(s, "server").parked_kthreads == 1
        });
        assert_eq!(s.alloc.self_wakes_revoked, 0, "{:?}", s.alloc);
        let signals: Vec<_> = recorder
            .actions()
            .into_iter()
            .filter(|a| matches!(a, Action::Preempt { app, .. } if app == "batch"))
            .collect();
        if longest >= GRACE {
            eprintln!("attempt {attempt}: a stay of {longest:?} (the grace: {GRACE:?}); again");
            if !signals.is_empty() {
                // Rightly signalled: batch's runtime would yield, and be
                // granted the core again.
                batch.ends[0]
                    .to_iokernel
                    .send(ToIokernel::Yielded {
                        next_deadline_ns: None,
                        grant: UNNUMBERED_GRANT,
                    })
                    .unwrap();
                d.wait_for("batch granted again", |s| app(s, "batch").cores_now == 1);
            }
            recorder.log.lock().unwrap().clear();
            continue;
        }
        assert!(
            s.alloc.preemptions_withdrawn > withdrawn_before,
            "batch's preemptions were withdrawn: {:?}",
            s.alloc
        );
        assert!(
            signals.is_empty(),
            "batch was signalled though no stay reached the grace ({longest:?} at most): {signals:?}"
        );
        return;
    }
    panic!("every train had a stay as long as the grace: this machine is too busy to tell");
}

/// A kthread that a frame woke runs before its `SelfWoken` is on the ring,
/// its line no longer armed. iokerneld, which still books it parked, must
/// not grant it a core meanwhile (here for the timer it parked with): such
/// a `Wake` reached a running kthread, whose next park answered the grant
/// before it and was ignored as stale, so iokerneld booked the kthread
/// running while it slept and served none of its timers (a `ginza bench
/// memcached` point that never ended, docs/results.md, "Session 35").
#[test]
fn a_kthread_that_woke_itself_is_not_granted_before_its_self_woken_is_read() {
    use std::time::{Duration, Instant};

    let _l = lock();
    let recorder = RecordingActuator::new();
    let d = Daemon::start_with(recorder.clone(), |c| c.self_wake = true);
    let mut server = RawApp::register(&d.socket, "server", iface(9), 1).unwrap();
    d.wait_for("the server registered and parked", |s| {
        app(s, "server").parked_kthreads == 1
    });
    // Parked, armed, with a timer 50 ms out.
    let due = ginza_sys::clock::monotonic_ns() + 50_000_000;
    server.ends[0]
        .line
        .insert_flags(LineFlags::SELF_WAKE_ARMED | LineFlags::PARKED);
    server.ends[0]
        .to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: Some(due),
            grant: UNNUMBERED_GRANT,
        })
        .unwrap();
    let passes = d.stats().passes;
    d.wait_for("the park read", |s| s.passes > passes + 10);
    // A frame wakes it: the runtime's steps up to its `SelfWoken`.
    let line = &server.ends[0].line;
    line.insert_flags(LineFlags::SELF_WOKEN);
    line.remove_flags(LineFlags::PARKED | LineFlags::SELF_WAKE_ARMED);
    // Past the timer, and a few passes more.
    while ginza_sys::clock::monotonic_ns() < due {
        std::thread::sleep(Duration::from_millis(5));
    }
    let passes = d.stats().passes;
    let s = d.wait_for("passes after the timer", |s| s.passes > passes + 10);
    let a = app(&s, "server");
    assert_eq!(a.grants, 0, "granted while it ran on its own wake: {a:?}");
    let wakes = std::iter::from_fn(|| server.ends[0].from_iokernel.recv().ok().flatten())
        .filter(|m| matches!(m, ToKthread::Wake { .. }))
        .count();
    assert_eq!(wakes, 0, "a Wake went to a kthread that runs");
    // Its `SelfWoken` comes: iokerneld reads it as the wake it is (no own
    // socket here, so it is revoked; the books never show a grant).
    server.ends[0]
        .to_iokernel
        .send(ToIokernel::SelfWoken {
            grant: UNNUMBERED_GRANT,
        })
        .unwrap();
    let t0 = Instant::now();
    let s = d.wait_for("the self-wake read", |s| s.alloc.self_wakes == 1);
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert_eq!(app(&s, "server").grants, 0, "{:?}", app(&s, "server"));
}
