//! The Shinjuku worker: its mailbox with the dispatcher and its loop
//! (docs/runtime.md, "Shinjuku mode").
//!
//! Each worker kthread has a mailbox of two cache lines: dispatcher →
//! worker (the assigned request context) and worker → dispatcher (how the
//! request stopped, as a [`Report`], and when it started). No locks on this
//! path. The cooperative preemption flag is the kthread's own
//! (`KThread::preempt_flag`), since revocation uses it too.

use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{
    AtomicPtr, AtomicU64, AtomicU8,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::sched::{self, KThread, Owner, Stopped, URef, UThread};

/// How the request a worker ran gave the worker back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Report {
    /// It returned: its result is in its `JoinHandle`.
    Completed,
    /// It was preempted: the dispatcher queues it again.
    Preempted,
    /// It waits (a `Mutex`, a `sleep`): its waker, or its timer, hands it
    /// back to the dispatcher.
    Blocked,
}

impl Report {
    /// No report waiting.
    const NONE: u8 = 0;

    fn encode(self) -> u8 {
        match self {
            Report::Completed => 1,
            Report::Preempted => 2,
            Report::Blocked => 3,
        }
    }

    fn decode(raw: u8) -> Option<Report> {
        match raw {
            1 => Some(Report::Completed),
            2 => Some(Report::Preempted),
            3 => Some(Report::Blocked),
            _ => None,
        }
    }
}

impl From<Stopped> for Report {
    fn from(stopped: Stopped) -> Report {
        match stopped {
            Stopped::Exited => Report::Completed,
            Stopped::Yielded => Report::Preempted,
            Stopped::Blocked => Report::Blocked,
        }
    }
}

/// Dispatcher → worker.
#[derive(Default)]
struct ToWorker {
    /// The request context to run next (null: none).
    assigned: AtomicPtr<UThread>,
}

/// Worker → dispatcher.
#[derive(Default)]
struct FromWorker {
    /// An encoded [`Report`]; the dispatcher takes it (back to NONE).
    report: AtomicU8,
    /// When the reported request stopped running (ns since the epoch).
    report_ns: AtomicU64,
    /// When the worker switched into its current request (ns since the
    /// epoch; 0 while it runs none): quanta count from here, not from the
    /// assignment, so a worker's wake-up does not eat its request's quantum.
    started_ns: AtomicU64,
}

/// One worker's mailbox.
#[derive(Default)]
pub(crate) struct Mailbox {
    to: CachePadded<ToWorker>,
    from: CachePadded<FromWorker>,
}

impl Mailbox {
    /// Dispatcher: hands `u` to worker `k`, whose previous report it has
    /// taken; wakes the worker if parked.
    pub(crate) fn assign(&self, k: &KThread, u: URef) {
        k.preempt_flag.store(false, Relaxed);
        self.to.assigned.store(u.ptr(), Release);
        sched::wake_if_parked(k);
    }

    /// Dispatcher: how the assigned request stopped, and when, if the
    /// worker has said so.
    pub(crate) fn take_report(&self) -> Option<(Report, u64)> {
        let raw = self.from.report.load(Acquire);
        if raw == Report::NONE {
            return None;
        }
        let at = self.from.report_ns.load(Relaxed);
        self.from.report.store(Report::NONE, Relaxed);
        Some((
            Report::decode(raw).expect("a worker wrote an unknown report"),
            at,
        ))
    }

    /// Dispatcher: when the worker switched into the assigned request (0:
    /// not yet). Reset by the worker before its report, which the
    /// dispatcher takes before assigning again, so non-zero means this
    /// assignment has started.
    pub(crate) fn started_ns(&self) -> u64 {
        self.from.started_ns.load(Relaxed)
    }

    fn take_assignment(&self) -> Option<URef> {
        NonNull::new(self.to.assigned.swap(null_mut(), Acquire)).map(URef::from_nonnull)
    }

    fn post(&self, report: Report, at_ns: u64) {
        self.from.started_ns.store(0, Relaxed);
        self.from.report_ns.store(at_ns, Relaxed);
        self.from.report.store(report.encode(), Release);
    }
}

/// The worker loop: runs the request contexts the dispatcher assigns, one
/// at a time, and reports how each one stopped. `owner` is the worker's
/// scheduler context.
pub(crate) fn run(owner: &mut Owner<'_>, mailbox: &Mailbox) {
    let k = owner.kthread();
    let rt = k.rt();
    while let Some(u) = wait_for_assignment(k, mailbox) {
        mailbox.from.started_ns.store(rt.now_ns().max(1), Relaxed);
        let stopped = sched::run_on_worker(owner, u);
        mailbox.post(stopped.into(), rt.now_ns());
    }
}

/// Spins for the next assignment, then parks on the eventfd (the dispatcher
/// signals it after assigning to a parked worker). None at shutdown.
fn wait_for_assignment(k: &KThread, mailbox: &Mailbox) -> Option<URef> {
    let rt = k.rt();
    let mut idle_since: Option<Instant> = None;
    loop {
        if let Some(u) = mailbox.take_assignment() {
            return Some(u);
        }
        if rt.shutdown.load(Acquire) {
            return None;
        }
        if !rt.timers_only_at_switch_checks.load(Relaxed) {
            sched::fire_timers_to_dispatcher(k);
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < rt.spin {
            std::hint::spin_loop();
            continue;
        }
        sched::park_worker(k, || mailbox.to.assigned.load(SeqCst).is_null());
        idle_since = None;
    }
}
