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
