//! The Shinjuku worker: its mailbox with the dispatcher and its loop
//! (docs/runtime.md, "Shinjuku mode").
//!
//! Each worker kthread has a mailbox of two cache lines: dispatcher →
//! worker (the assigned request context, and a pre-assigned next one) and
//! worker → dispatcher (how the request stopped, as a [`Report`], and when
//! it started). No locks on this path.
//!
//! The pre-assigned slot (`ShinjukuConfig::pre_assign`): the dispatcher
//! may put the next request there while the worker runs one, so that the
//! worker starts it as soon as its current one stops, without waiting for
//! the dispatcher's round trip. Whoever swaps it out owns it: the worker
//! (only as it posts a report, which then says so) or the dispatcher
//! (taking it back for an idle worker, to apply its policy, or to assign it
//! the ordinary way when the report says the worker did not take it). So it
//! runs once, or goes back to the queue, never both. A preempted request's
//! successor is the policy's choice (head placement runs the preempted one
//! again): on a preemption the worker takes only a request pre-assigned for
//! that case (`pre_assign_behind_preempted`). The cooperative preemption
//! flag is the kthread's own (`KThread::preempt_ask`), since revocation
//! uses it too.

use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{
    AtomicPtr, AtomicU64, AtomicU8,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

use crossbeam_utils::CachePadded;

use ginza_sys::clock::monotonic_ns;
use ginza_sys::tsc_clock::{ticks, TscClock};

use crate::sched::{self, KThread, Owner, Shared, SpareContext, Stopped, URef, UThread};

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
    /// The request pre-assigned behind the running one (null: none).
    next: AtomicPtr<UThread>,
}

/// Worker → dispatcher.
#[derive(Default)]
struct FromWorker {
    /// An encoded [`Report`]; the dispatcher takes it (back to NONE).
    report: AtomicU8,
    /// When the reported request stopped running (ns since the epoch).
    report_ns: AtomicU64,
    /// When the reported request had started running (ns since the epoch).
    report_started_ns: AtomicU64,
    /// A completed request's context, kept with its stack for the
    /// dispatcher's next request (`SpareContext`; null: none).
    report_spare: AtomicPtr<UThread>,
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
        k.preempt_ask.clear();
        self.to.assigned.store(u.ptr(), Release);
        sched::wake_if_parked(k);
    }

    /// Dispatcher: puts `u` in the pre-assigned slot of a worker that runs
    /// a request, to run once that request completes or blocks; the slot
    /// must be empty (nothing pre-assigned, or taken).
    pub(crate) fn pre_assign(&self, u: URef) {
        self.fill_next(u.ptr());
    }

    /// Dispatcher: as [`Mailbox::pre_assign`], for the request the policy
    /// runs once the running one, asked to yield, is preempted.
    pub(crate) fn pre_assign_behind_preempted(&self, u: URef) {
        self.fill_next(u.ptr().wrapping_byte_add(BEHIND_PREEMPTED));
    }

    /// Fills the empty second slot. A plain store, not a swap: only the
    /// dispatcher ever fills it, so it is known empty, and a store does not
    /// hold the dispatcher until the line arrives (the stores to several
    /// workers' slots in one pass overlap).
    fn fill_next(&self, slot: *mut UThread) {
        debug_assert!(
            self.to.next.load(Relaxed).is_null(),
            "pre-assigned over a pre-assigned request"
        );
        self.to.next.store(slot, Release);
    }

    /// Dispatcher: takes the pre-assigned request back, unless the worker
    /// has taken it (then its report says so, or it has already).
    pub(crate) fn take_back(&self) -> Option<URef> {
        untagged(self.to.next.swap(null_mut(), Acquire))
    }

    /// Dispatcher: how the assigned request stopped, if the worker has
    /// said so.
    pub(crate) fn take_report(&self) -> Option<Posted> {
        let raw = self.from.report.load(Acquire);
        if raw == Report::NONE {
            return None;
        }
        let at = self.from.report_ns.load(Relaxed);
        let started_at = self.from.report_started_ns.load(Relaxed);
        let spare = NonNull::new(self.from.report_spare.swap(null_mut(), Relaxed)).map(|u| {
            // SAFETY: the worker put it there with this report, from
            // `SpareContext::into_raw`; the report is taken once.
            unsafe { SpareContext::from_raw(u) }
        });
        self.from.report.store(Report::NONE, Release);
        Some(Posted {
            report: Report::decode(raw & !TOOK_NEXT).expect("a worker wrote an unknown report"),
            at,
            started_at,
            took_next: raw & TOOK_NEXT != 0,
            spare,
        })
    }

    /// Dispatcher: when the worker switched into the assigned request (0:
    /// not yet), also the run's stamp (`PreemptAsk`). The worker sets it to
    /// the next run's start, or 0, as it posts a report, which the
    /// dispatcher takes before assigning again, so non-zero means this
    /// assignment has started.
    pub(crate) fn started_ns(&self) -> u64 {
        self.from.started_ns.load(Acquire)
    }

    /// Worker: the assigned request, if any. Looks before it swaps: a
    /// spinning worker that wrote the line on every look would pull it
    /// away from the dispatcher, whose assignment then waits for it.
    fn take_assignment(&self) -> Option<URef> {
        if self.to.assigned.load(Relaxed).is_null() {
            return None;
        }
        NonNull::new(self.to.assigned.swap(null_mut(), Acquire)).map(URef::from_nonnull)
    }

    /// Worker: reports how its request (started at `started`) stopped at
    /// `stopped_at`, taking the pre-assigned request (if any) in the same
    /// step; returns it, with the start `stamp_next` gave it, which is
    /// published with the report (one store, where a reset and a second
    /// stamp would move the mailbox's line twice). Waits first for the
    /// dispatcher to take the previous report (one report at a time).
    fn post(
        &self,
        k: &KThread,
        report: Report,
        started: u64,
        stopped_at: u64,
        spare: Option<SpareContext>,
        stamp_next: impl FnOnce() -> u64,
    ) -> Option<(URef, u64)> {
        while self.from.report.load(Acquire) != Report::NONE {
            if k.rt().shutdown.load(Acquire) {
                return None;
            }
            std::hint::spin_loop();
        }
        let next = if report == Report::Preempted {
            // A preempted request's successor is the policy's choice: only
            // one pre-assigned for that case is taken. An ordinary one is
            // taken back before the dispatcher asks a request to yield, so
            // finding it here means a preemption nobody asked for (a late
            // signal, say); it stays for the dispatcher to requeue.
            let slot = self.to.next.load(Acquire);
            let tagged = slot.addr() & BEHIND_PREEMPTED != 0;
            if tagged {
                self.to
                    .next
                    .compare_exchange(slot, null_mut(), Acquire, Relaxed)
                    .ok()
                    .and_then(untagged)
            } else {
                None
            }
        } else if self.to.next.load(Relaxed).is_null() {
            // Nothing pre-assigned: leave the line unwritten (as if the
            // swap had come before a pre-assignment the dispatcher now
            // makes, which it takes back when the report says so).
            None
        } else {
            untagged(self.to.next.swap(null_mut(), Acquire))
        };
        let mut raw = report.encode();
        let next = next.map(|u| (u, stamp_next()));
        // The next run's start, or 0 (no run): a dispatcher that sees the
        // report sees this too; one that sees only this still holds the
        // stopped run, and an ask it makes now names the new stamp, a
        // quantum that has barely begun.
        // (Release, no fence: the worker does not wait here for the line.)
        self.from
            .started_ns
            .store(next.as_ref().map_or(0, |&(_, stamp)| stamp), Release);
        if next.is_some() {
            // An ask left for the request that just stopped stays: the next
            // run, with its own stamp, ignores it.
            raw |= TOOK_NEXT;
        }
        self.from.report_started_ns.store(started, Relaxed);
        self.from.report_ns.store(stopped_at, Relaxed);
        let spare = spare.map_or(null_mut(), |c| c.into_raw().as_ptr());
        self.from.report_spare.store(spare, Relaxed);
        self.from.report.store(raw, Release);
        next
    }
}

/// A report as the dispatcher takes it.
pub(crate) struct Posted {
    pub(crate) report: Report,
    /// When the request stopped (ns since the epoch).
    pub(crate) at: u64,
    /// When it had started, this time on the worker (ns since the epoch).
    pub(crate) started_at: u64,
    /// The worker went on to the pre-assigned request.
    pub(crate) took_next: bool,
    /// The completed request's context, for the next request.
    pub(crate) spare: Option<SpareContext>,
}

/// Report bit: the worker took the pre-assigned request as it reported.
const TOOK_NEXT: u8 = 0x80;

/// Tag (low bit of the slot's pointer; request contexts are aligned) of a
/// request pre-assigned behind a preemption.
const BEHIND_PREEMPTED: usize = 1;
const _: () = assert!(std::mem::align_of::<UThread>() > BEHIND_PREEMPTED);

/// The request context in a slot value, tag removed; `None` if empty.
fn untagged(slot: *mut UThread) -> Option<URef> {
    NonNull::new(slot.map_addr(|a| a & !BEHIND_PREEMPTED)).map(URef::from_nonnull)
}

/// The worker loop: runs the request contexts the dispatcher assigns, one
/// at a time, and reports how each one stopped. `owner` is the worker's
/// scheduler context.
pub(crate) fn run(owner: &mut Owner<'_>, mailbox: &Mailbox) {
    let k = owner.kthread();
    let mut clock = WorkerClock::new(k.rt());
    let spans = k.spans.on.get();
    while let Some(mut u) = wait_for_assignment(k, mailbox, &mut clock) {
        // The start stamps the run: the dispatcher names it when it asks
        // it to yield (`PreemptAsk`).
        let mut stamp = clock.stamp();
        mailbox.from.started_ns.store(stamp, Release);
        loop {
            k.run_stamp.set(stamp);
            if spans {
                k.spans.switched_in.set(ticks());
            }
            let (stopped, spare) = sched::run_on_worker_keeping(owner, u);
            k.run_stamp.set(0);
            let back = spans.then(ticks);
            let stopped_at = clock.now_ns();
            let seen = k.spans.seen.replace(0);
            if let Some(back) = back.filter(|_| seen != 0) {
                k.spans.yield_out.add(back.saturating_sub(seen));
            }
            match mailbox.post(k, stopped.into(), stamp, stopped_at, spare, || {
                clock.stamp()
            }) {
                Some((next, next_stamp)) => {
                    if let Some(back) = back.filter(|_| seen != 0) {
                        k.spans.handover.add(ticks().saturating_sub(back));
                    }
                    u = next;
                    stamp = next_stamp;
                }
                None => break,
            }
        }
    }
}

/// The workers' clock for their stamps (run starts, reports), and the
/// dispatcher's for its passes: the runtime's time line (ns since its
/// epoch) read from the TSC where the kernel trusts it
/// (`ginza_sys::tsc_clock`). A `clock_gettime` costs ~150 ns on a VM; the
/// worker read it twice per preemption (docs/results.md, "Where a
/// cooperative preemption's time goes") and the dispatcher once a pass.
/// Stamps strictly increase, so each names one run.
pub(super) struct WorkerClock {
    tsc: TscClock,
    /// CLOCK_MONOTONIC at the runtime's epoch, ns.
    epoch_ns: u64,
    last_stamp: u64,
}

impl WorkerClock {
    pub(super) fn new(rt: &Shared) -> WorkerClock {
        // The epoch on CLOCK_MONOTONIC: the pair of readings closest in
        // time of a few (the runtime's clock is CLOCK_MONOTONIC too).
        let epoch_ns = (0..5)
            .map(|_| {
                let before = rt.now_ns();
                let mono = monotonic_ns();
                let after = rt.now_ns();
                (after - before, mono.saturating_sub(before / 2 + after / 2))
            })
            .min()
            .map_or(0, |(_, epoch)| epoch);
        WorkerClock {
            tsc: TscClock::new(),
            epoch_ns,
            last_stamp: 0,
        }
    }

    pub(super) fn now_ns(&mut self) -> u64 {
        self.tsc.now_ns().saturating_sub(self.epoch_ns)
    }

    /// Now, as the stamp of a run: never 0, never one given before.
    fn stamp(&mut self) -> u64 {
        let stamp = self.now_ns().max(self.last_stamp + 1).max(1);
        self.last_stamp = stamp;
        stamp
    }
}

/// Spins for the next assignment, then parks on the eventfd (the dispatcher
/// signals it after assigning to a parked worker). None at shutdown. The
/// spin is timed on the worker's clock (the TSC, not a `clock_gettime` a
/// look).
fn wait_for_assignment(k: &KThread, mailbox: &Mailbox, clock: &mut WorkerClock) -> Option<URef> {
    let rt = k.rt();
    let spin_ns = rt.spin.as_nanos().min(u128::from(u64::MAX)) as u64;
    let mut idle_since: Option<u64> = None;
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
        let now = clock.now_ns();
        let since = *idle_since.get_or_insert(now);
        if now.saturating_sub(since) < spin_ns {
            std::hint::spin_loop();
            continue;
        }
        sched::park_worker(k, || mailbox.to.assigned.load(SeqCst).is_null());
        idle_since = None;
    }
}
