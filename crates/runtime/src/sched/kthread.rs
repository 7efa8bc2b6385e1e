//! Kthreads: one pinned pthread per core the runtime may use, its owner
//! token ([`Owner`]), the state all kthreads of a runtime share
//! ([`Shared`]: injector, spare stacks, spinning and parked counts), eventfd
//! park and notify, and how per-kthread state is reached
//! ([`current_kthread`]; docs/design.md, "Per-kthread state and TLS"). Also
//! the types of the uthread context a kthread runs and queues ([`UThread`],
//! [`URef`]); what is done with them is in `uthread.rs`.

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::{null, null_mut, NonNull};
use std::sync::atomic::{
    fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use crossbeam_utils::CachePadded;
use ginza_shm::LineFlags;
use ginza_sys::eventfd;

use super::{Waiter, TIMER_WAITER};
use crate::config::{IokernelConfig, Plan};
use crate::deferral::{self, PreemptState};
use crate::link::{EventSource, KLink, KNet, Link, PacketStack, TxSide};
use crate::thread_word::ThreadWord;
use crate::timer::Timers;
use crate::uthread_stack::Stack;

pub(crate) const RUNNING: u8 = 0;
pub(crate) const SPINNING: u8 = 1;
pub(crate) const PARKED: u8 = 2;
/// A waker has claimed this parked kthread and written its eventfd.
const WAKING: u8 = 3;
/// Preempted and parked until granted again (the iokerneld revocation path).
pub(crate) const REVOKED: u8 = 4;

#[derive(Default)]
pub(crate) struct KStats {
    pub(crate) preemptions: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) parks: AtomicU64,
    pub(crate) revocations: AtomicU64,
    /// Cores granted by iokerneld.
    pub(crate) grants: AtomicU64,
    /// Of `grants`, those that ended a sleep on the kthread's eventfd (not
    /// on the wake page, nor found in the grant word while lingering).
    pub(crate) grants_by_eventfd: AtomicU64,
    /// Worker mode: preemptions taken at preemption points (cooperative).
    pub(crate) coop_preemptions: AtomicU64,
    /// Context switches into any context of this kthread (the time slicer
    /// sees a uthread that has run a whole period by this not moving).
    pub(crate) switches: AtomicU64,
    /// Times it began polling while idle instead of parking (`idle_poll.rs`).
    pub(crate) idle_polls: AtomicU64,
    /// Of those, the times iokerneld took the core back by its flag.
    pub(crate) idle_poll_takebacks: AtomicU64,
    /// Of those, the times it stopped because another task waited for its
    /// CPU (Linux switched it out while it polled).
    pub(crate) idle_poll_yields: AtomicU64,
    /// Times it blocked on the application's own socket while idle,
    /// holding its core (`idle_poll.rs`), and of those the times a frame
    /// on the socket ended the wait, and the times the earliest timer did.
    pub(crate) idle_blocks: AtomicU64,
    pub(crate) idle_block_frames: AtomicU64,
    pub(crate) idle_block_timeouts: AtomicU64,
    /// Times a frame on the application's own socket woke it while parked
    /// and it took its core itself (`self_wake.rs`).
    pub(crate) self_wakes: AtomicU64,
}

/// Owner-only increment of a statistics counter (readers may be elsewhere):
/// no locked instruction. The runtime's one such increment.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Relaxed) + 1, Relaxed);
}

/// How a runtime's kthreads schedule.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// Shenango: run to completion, work stealing, parking.
    Shenango,
    /// Shinjuku: each kthread is a worker that runs the one request context a
    /// dispatcher assigns it, and hands it back when done, preempted or blocked.
    Worker,
}

/// A kthread's cooperative preemption request (docs/runtime.md, "Shinjuku
/// mode"): none, one Shinjuku request run (named by its start stamp, which
/// is never 0), or whatever runs (a revocation, Shenango mode). One word,
/// so a preemption point reads it with one load, and an ask for a run that
/// has ended cannot be mistaken for one for the run that follows it.
#[derive(Default)]
pub(crate) struct PreemptAsk {
    run: AtomicU64,
    /// When the last run ask was stored (`tsc_clock::ticks`), for the
    /// worker's spans; on the same line, so reading it costs no transfer.
    asked_ticks: AtomicU64,
}

impl PreemptAsk {
    const NONE: u64 = 0;
    const ANY: u64 = u64::MAX;

    /// The preemption point's fast path: whether the run stamped `run` (0:
    /// not a Shinjuku worker's run) is asked to yield. An ask for another
    /// run is left where it is: the worker never writes the line the
    /// dispatcher writes, so no transfer of it back and forth per
    /// preemption.
    #[inline(always)]
    pub(crate) fn asks(&self, run: u64) -> bool {
        let asked = self.run.load(Relaxed);
        asked != Self::NONE && (asked == Self::ANY || asked == run)
    }

    /// Asks whatever runs to yield.
    pub(crate) fn ask_any(&self) {
        self.run.store(Self::ANY, SeqCst);
    }

    /// Asks the run stamped `run` (not 0) to yield; `ticks`: now, if the
    /// worker records its spans.
    pub(crate) fn ask_run(&self, run: u64, ticks: u64) {
        debug_assert_ne!(run, Self::NONE);
        self.asked_ticks.store(ticks, Relaxed);
        self.run.store(run, SeqCst);
    }

    /// When the last run ask was stored (0: not recorded).
    pub(crate) fn asked_ticks(&self) -> u64 {
        self.asked_ticks.load(Relaxed)
    }

    /// Takes any ask off (ordered by the caller's next release or fence).
    /// Writes only if there is one: the line stays shared with the worker
    /// that polls it, rather than moving on every assignment.
    pub(crate) fn clear(&self) {
        if self.run.load(Relaxed) != Self::NONE {
            self.run.store(Self::NONE, Relaxed);
        }
    }
}

/// Worker mode, when the dispatcher records preemptions: where each
/// cooperative preemption's time goes on the worker, from its own TSC
/// (`tsc_clock::ticks`; docs/results.md, "Where a cooperative preemption's
/// time goes"). The cells are the worker's own; the histograms are read
/// once the workers have stopped.
#[derive(Default)]
pub(crate) struct WorkerSpans {
    pub(crate) on: Cell<bool>,
    /// When the running request found its ask (0: none since).
    pub(crate) seen: Cell<u64>,
    /// When the worker loop switched into the running request.
    pub(crate) switched_in: Cell<u64>,
    /// The ask's store → found at a preemption point (ticks across two
    /// CPUs: useful work up to the next point, and the line's transfer).
    pub(crate) observe: SpanHistogram,
    /// Found → back in the worker loop (the yield path, the switch out).
    pub(crate) yield_out: SpanHistogram,
    /// Back in the loop → switching into the next request (its report, the
    /// second slot, the stamps), for preemptions handed straight over.
    pub(crate) handover: SpanHistogram,
    /// Switching into a request → it runs its own code again.
    pub(crate) switch_in: SpanHistogram,
}

/// Spans in ticks, counted in buckets of [`SpanHistogram::WIDTH`] ticks up
/// to [`SpanHistogram::BUCKETS`] of them; longer ones (the thread was
/// descheduled, most likely) only counted. Medians from buckets survive a
/// loaded machine, where a mean does not.
pub(crate) struct SpanHistogram {
    buckets: [AtomicU32; Self::BUCKETS],
    over: AtomicU64,
}

impl Default for SpanHistogram {
    fn default() -> Self {
        SpanHistogram {
            buckets: [const { AtomicU32::new(0) }; Self::BUCKETS],
            over: AtomicU64::new(0),
        }
    }
}

impl SpanHistogram {
    pub(crate) const WIDTH: u64 = 8;
    pub(crate) const BUCKETS: usize = 1024;

    /// Owner-only: counts one span.
    pub(crate) fn add(&self, ticks: u64) {
        match self.buckets.get((ticks / Self::WIDTH) as usize) {
            Some(b) => b.store(b.load(Relaxed).wrapping_add(1), Relaxed),
            None => bump(&self.over),
        }
    }

    /// Spans counted in buckets, and those beyond.
    pub(crate) fn counts(&self) -> (Vec<u32>, u64) {
        (
            self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            self.over.load(Relaxed),
        )
    }
}

pub(crate) struct KThread {
    pub(crate) id: usize,
    pub(crate) mode: Mode,
    /// Cooperative preemption request, polled at preemption points (its own
    /// cache line: the Shinjuku dispatcher writes it while the kthread
    /// polls). Set when a quantum is spent (naming the run it asks), and
    /// with a revocation (asking whatever runs).
    pub(crate) preempt_ask: CachePadded<PreemptAsk>,
    /// Worker mode: the stamp of the request run in progress (its start,
    /// as published in the worker's mailbox; 0 between runs). A Shinjuku
    /// ask naming another run is stale and ignored.
    pub(crate) run_stamp: Cell<u64>,
    /// Worker mode: the worker's spans of its cooperative preemptions.
    pub(crate) spans: WorkerSpans,
    /// Worker mode: the request context that just yielded back.
    pub(crate) yielded: Cell<*mut UThread>,
    pub(crate) core: usize,
    pub(crate) siblings: Vec<usize>,
    pub(super) rt: *const Shared,
    local: UnsafeCell<Worker<URef>>,
    pub(crate) stealer: Stealer<URef>,
    pub(crate) sched: UThread,
    pub(crate) current: Cell<*mut UThread>,
    /// A uthread that exited; the next context to run frees its stack.
    pub(super) exited: Cell<*mut UThread>,
    /// Exited uthreads kept with their stacks for the next spawn. Boxed:
    /// a uthread's address is its identity (URef) and must not move.
    #[allow(clippy::vec_box)]
    pub(super) free_uthreads: UnsafeCell<Vec<Box<UThread>>>,
    pub(crate) timers: Timers,
    /// A line of its own: read by the Shinjuku dispatcher at each
    /// assignment (is the worker parked?) while the worker writes its
    /// other fields per request.
    pub(crate) state: CachePadded<AtomicU8>,
    pub(crate) revoke_requested: AtomicBool,
    /// The time slicer asks the running uthread to make way (`slicer.rs`).
    pub(crate) slice_asked: AtomicBool,
    eventfd: OwnedFd,
    pub(crate) tid: AtomicI32,
    /// Shared state with iokerneld, when the runtime is registered.
    pub(crate) io: Option<KLink>,
    /// Managed runtimes whose iokerneld reads busy time: when the kthread
    /// left its scheduler context for uthreads (ns since the epoch), for
    /// the busy time on the queue line (`publish_busy`).
    pub(crate) busy_since: Cell<u64>,
    pub(super) tick: Cell<u32>,
    rng: Cell<u64>,
    /// Since when it has seen no arrival (`idle_poll.rs`); `None`: it just
    /// saw one.
    pub(crate) quiet_since: Cell<Option<Instant>>,
    /// Until when it may not poll while idle: Linux gave its CPU to
    /// another task while it polled (`idle_poll.rs`).
    pub(crate) poll_yielded_until: Cell<Option<Instant>>,
    /// The CPU time other tasks took from it, by window (`idle_poll.rs`).
    pub(crate) poll_share: Cell<PollShare>,
    /// The bell held back (`idle_poll.rs`, "the bell held"): on the direct
    /// path, from its idle state until it has run what the arrival that
    /// ended it brought, the kthread's own runqueue pushes do not wake a
    /// sleeping iokerneld; `bell_owed` says one would have.
    pub(crate) bell_held: Cell<bool>,
    pub(crate) bell_owed: Cell<bool>,
    pub(crate) stats: KStats,
}

// SAFETY: the Cell/UnsafeCell fields (local, sched, current, exited,
// free_uthreads, tick, rng, quiet_since, poll_yielded_until, poll_share,
// bell_held, bell_owed) are touched only by the kthread's own pthread;
// everything other threads touch is atomic or behind a lock.
unsafe impl Sync for KThread {}
// SAFETY: see Sync; the struct is created on one thread and then shared.
unsafe impl Send for KThread {}

// ---- the uthread context ------------------------------------------------------

// Here, not in uthread.rs: a `UThread` points at its runtime's `Shared`,
// which holds the `KThread`s, each holding its scheduler's `UThread`. Types
// that point at each other share a file; what a uthread does (spawn,
// switch, exit, the caches) is uthread.rs, above this one.

/// A user-level thread: a stack, a saved stack pointer, and what to run.
pub(crate) struct UThread {
    pub(super) sp: UnsafeCell<*mut u8>,
    /// True from the moment a kthread decides to run this context until its
    /// registers are saved again.
    pub(super) on_cpu: AtomicBool,
    pub(crate) preempt: PreemptState,
    pub(super) stack: UnsafeCell<Option<Stack>>,
    pub(super) entry: UnsafeCell<Option<Entry>>,
    pub(super) rt: *const Shared,
    /// Worker mode: the identity the dispatcher gave this context (0: none
    /// yet). Unlike the address, never reused.
    pub(super) serial: AtomicU64,
    /// Debug builds: made runnable and not yet taken to run
    /// ([`URef::note_queued`]).
    #[cfg(debug_assertions)]
    pub(super) queued: AtomicBool,
}

impl UThread {
    /// The scheduler's own context: runs on the kthread's pthread stack.
    pub(super) fn scheduler(rt: *const Shared) -> UThread {
        UThread {
            sp: UnsafeCell::new(null_mut()),
            on_cpu: AtomicBool::new(true),
            preempt: PreemptState::new(1),
            stack: UnsafeCell::new(None),
            entry: UnsafeCell::new(None),
            rt,
            serial: AtomicU64::new(0),
            #[cfg(debug_assertions)]
            queued: AtomicBool::new(false),
        }
    }
}

/// What a uthread runs: one allocation shared with its `JoinHandle`.
pub(crate) trait Runnable: Send + Sync {
    /// Called once, on the uthread's own stack; must not unwind.
    fn run(&self);
}

pub(crate) type Entry = Arc<dyn Runnable>;

/// A pointer to a uthread that is in exactly one place: a runqueue, a wait
/// queue, a timer, or running.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct URef(pub(super) NonNull<UThread>);

// SAFETY: a URef is a handle that moves between kthreads; the protocol above
// (on_cpu, single place) ensures only one kthread runs the uthread at a time.
unsafe impl Send for URef {}

impl URef {
    pub(crate) fn ptr(self) -> *mut UThread {
        self.0.as_ptr()
    }

    /// The handle to a uthread a mailbox carried as a pointer.
    pub(crate) fn from_nonnull(u: NonNull<UThread>) -> URef {
        URef(u)
    }
}

/// Spare stacks kept by default (`Shared::keep_spare_stacks` raises it).
pub(super) const SPARE_STACKS: usize = 1024;

// ---- the owner token ---------------------------------------------------------

/// Proof that the code holding it runs on kthread `k`'s own thread, in a
/// context that stays on `k` while the token lives: it may use `k`'s
/// owner-only state (the push/pop end of its runqueue, its uthread cache,
/// its command rings to iokerneld, the transmit side of its packet rings)
/// without locks. There are two kinds:
/// * the scheduler context's, made once per kthread in [`kthread_main`] and
///   lent to the scheduler (or worker) loop: that context never leaves its
///   pthread;
/// * a uthread's, made by [`Owner::current`] and tied to the deferral guard
///   that keeps the uthread from being preempted. A uthread still moves to
///   another kthread when it switches out on purpose (it yields, blocks or
///   sleeps), so the functions that switch a uthread out take its token by
///   value: no token survives the switch (docs/design.md, "Per-kthread state and
///   TLS"). Code holding a token must not call anything else that may switch
///   (`yield_now`, `Mutex::lock`, ...); debug builds check at every use that
///   the token's kthread is still the running one.
///
/// `!Send` and `!Sync`: a token never leaves the thread it was made on.
pub(crate) struct Owner<'a> {
    pub(super) k: &'a KThread,
    _this_thread_only: PhantomData<*const ()>,
}

impl<'a> Owner<'a> {
    /// # Safety
    /// Runs on `k`'s own thread, for its scheduler context.
    unsafe fn for_scheduler(k: &'a KThread) -> Owner<'a> {
        Owner {
            k,
            _this_thread_only: PhantomData,
        }
    }

    /// The token of the running context, kept on its kthread by `deferred`;
    /// None on a thread that is no kthread.
    pub(crate) fn current(deferred: &'a deferral::Guard) -> Option<Owner<'a>> {
        let _ = deferred;
        let k = current_kthread();
        (!k.is_null()).then(|| Owner {
            // SAFETY: a non-null kthread pointer of this thread; the kthread
            // outlives the code it runs, and with preemption deferred the
            // context stays on it until it switches out on purpose, which
            // takes the token.
            k: unsafe { &*k },
            _this_thread_only: PhantomData,
        })
    }

    /// As [`Owner::current`], where preemption is deferred by other means
    /// than a guard (a uthread's entry and exit, the signal handler, a
    /// context that has just switched in).
    ///
    /// # Safety
    /// The caller runs on a kthread, with preemption deferred for as long as
    /// the token lives.
    pub(crate) unsafe fn current_deferred() -> Owner<'a> {
        Owner {
            // SAFETY: the caller's contract, as in `current`.
            k: unsafe { &*current_kthread() },
            _this_thread_only: PhantomData,
        }
    }

    /// Pushes to the kthread's runqueue, counted on its queue line.
    pub(crate) fn push(&self, u: URef) {
        u.note_queued();
        self.count_pushed(1);
        self.runqueue().push(u);
        self.rt().slicer_doze.end();
    }

    /// Pops from the kthread's runqueue, counted on its queue line.
    pub(crate) fn pop(&self) -> Option<URef> {
        let u = self.runqueue().pop();
        if u.is_some() {
            self.count_taken(1);
        }
        u
    }

    pub(crate) fn runqueue(&self) -> &'a Worker<URef> {
        // SAFETY: the token proves we are the owner kthread's thread; a
        // `Worker` is used through `&` only (its push/pop take `&self`).
        unsafe { &*self.k.local.get() }
    }

    /// Steals a batch into the runqueue from `src` (a `steal_batch_and_pop`
    /// of a queue whose items were counted on `counted`'s line) and pops
    /// one of it.
    pub(crate) fn steal_batch(
        &self,
        src: impl Fn(&Worker<URef>) -> Steal<URef>,
        counted: &KThread,
    ) -> Option<URef> {
        let local = self.runqueue();
        loop {
            let before = local.len();
            match src(local) {
                Steal::Success(u) => {
                    // One popped for us, the rest of the batch now ours.
                    let moved = local.len().saturating_sub(before) as u32;
                    self.count_pushed(moved);
                    counted.count_taken(moved + 1);
                    return Some(u);
                }
                Steal::Empty => return None,
                Steal::Retry => std::hint::spin_loop(),
            }
        }
    }

    /// Work from the runtime's shared queue (what was made runnable
    /// outside its kthreads), stolen as [`Owner::steal_batch`] does.
    pub(crate) fn take_injected(&self) -> Option<URef> {
        let rt = self.rt();
        self.steal_batch(
            |local| rt.injector.steal_batch_and_pop(local),
            &rt.kthreads[0],
        )
    }

    /// Sends a command to iokerneld on this kthread's ring.
    pub(crate) fn send_to_iokernel(&self, m: ginza_shm::ToIokernel) {
        if let Some(io) = &self.k.io {
            // SAFETY: the token proves we are the owner kthread.
            unsafe { io.send(m) };
        }
    }

    /// Drains iokerneld's commands to this kthread: the decision time of
    /// the last `Wake`.
    pub(crate) fn drain_from_iokernel(&self) -> Option<u64> {
        // SAFETY: the token proves we are the owner kthread.
        self.k.io.as_ref().and_then(|io| unsafe { io.drain() })
    }

    /// Whether the command ring to iokerneld is at least half free
    /// (`KLink::commands_half_free`); false without iokerneld.
    pub(crate) fn commands_half_free(&self) -> bool {
        // SAFETY: the token proves we are the owner kthread.
        self.k
            .io
            .as_ref()
            .is_some_and(|io| unsafe { io.commands_half_free() })
    }

    /// The number of the last `Wake` read from iokerneld (unnumbered
    /// without iokerneld).
    pub(crate) fn last_grant_from_iokernel(&self) -> u16 {
        match &self.k.io {
            // SAFETY: the token proves we are the owner kthread.
            Some(io) => unsafe { io.last_grant() },
            None => ginza_shm::UNNUMBERED_GRANT,
        }
    }

    /// About to give the core back to iokerneld: `Run`s read until the
    /// next `Wake` are stale (`KLink::expect_wake`). Returns the grant the
    /// park answers (unnumbered without iokerneld).
    pub(crate) fn expect_wake_from_iokernel(&self) -> u16 {
        match &self.k.io {
            // SAFETY: the token proves we are the owner kthread.
            Some(io) => unsafe { io.expect_wake() },
            None => ginza_shm::UNNUMBERED_GRANT,
        }
    }

    /// The transmit side of this kthread's packet rings (managed runtimes
    /// with networking). `&mut self`: one at a time per token, and the
    /// stack's code that uses it never makes another token.
    pub(crate) fn tx_side(&mut self) -> Option<TxSide<'_>> {
        let knet = self.k.knet()?;
        // SAFETY: the token proves we are the owner kthread and stay on it;
        // the exclusive borrow of the token keeps this the only `TxSide`
        // of this context.
        Some(unsafe { TxSide::new(knet) })
    }
}

impl<'a> Owner<'a> {
    /// The token's kthread (checked, in debug builds, to be the running one).
    pub(crate) fn kthread(&self) -> &'a KThread {
        debug_assert!(
            std::ptr::eq(current_kthread(), self.k),
            "a kthread's owner token used after its uthread moved"
        );
        self.k
    }
}

impl std::ops::Deref for Owner<'_> {
    type Target = KThread;
    fn deref(&self) -> &KThread {
        self.kthread()
    }
}

impl KThread {
    /// The earliest deadline a uthread still waits for on this kthread's
    /// timers (`u64::MAX`: none), stale entries dropped first: what a
    /// kthread about to sleep waits for, or reports to iokerneld.
    pub(crate) fn live_next_deadline(&self) -> u64 {
        super::drop_stale_timers(self);
        self.timers.next_deadline()
    }

    pub(crate) fn eventfd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.eventfd)
    }

    pub(crate) fn sched_ptr(&self) -> *mut UThread {
        &self.sched as *const UThread as *mut UThread
    }

    pub(crate) fn rt(&self) -> &Shared {
        // SAFETY: the Shared outlives its kthreads (run() joins them before dropping it).
        unsafe { &*self.rt }
    }

    // Queue-line counters for iokerneld's congestion detection: pushes are
    // counted before the item is visible and takes after it is gone, so
    // iokerneld never sees fewer items than are queued.

    /// Owner kthread only (its `bell_held`): see [`KThread::count_injected`]
    /// for pushes by anyone.
    #[inline]
    pub(crate) fn count_pushed(&self, n: u32) {
        if let Some(io) = &self.io {
            io.line.add_rq_tail(n);
            if self.bell_held.get() {
                self.bell_owed.set(true);
            } else {
                io.wake_iokernel();
            }
        }
    }

    /// [`KThread::count_pushed`] from any thread (work injected from
    /// outside): always followed by the bell's check.
    #[inline]
    fn count_injected(&self, n: u32) {
        if let Some(io) = &self.io {
            io.line.add_rq_tail(n);
            io.wake_iokernel();
        }
    }

    /// Wakes the kthread if it is blocked on its own socket while idle
    /// (`idle_poll.rs`), after work for it was published (injected from
    /// outside the runtime): one eventfd write, by whoever clears
    /// `IDLE_BLOCKED` first.
    fn wake_if_blocked(&self) {
        let Some(io) = &self.io else { return };
        // Against `IdlePoll::block`: the work is published, then the flag
        // read.
        fence(SeqCst);
        if io.line.flags().contains(LineFlags::IDLE_BLOCKED)
            && io
                .line
                .remove_flags(LineFlags::IDLE_BLOCKED)
                .contains(LineFlags::IDLE_BLOCKED)
        {
            eventfd_signal(self);
        }
    }

    /// Ends the bell held back since the idle state: rings it if a push
    /// meanwhile would have (the kthread is busy now: iokerneld must see
    /// its queues). Owner only.
    pub(crate) fn release_bell(&self) {
        if self.bell_held.replace(false) && self.bell_owed.replace(false) {
            if let Some(io) = &self.io {
                io.wake_iokernel();
            }
        }
    }

    #[inline]
    pub(crate) fn count_taken(&self, n: u32) {
        if let Some(io) = &self.io {
            io.line.add_rq_head(n);
        }
    }

    /// One steal: counted in [`KthreadStats::steals`] and, under
    /// iokerneld, in the queue line, where iokerneld's stats read it
    /// (docs/runtime.md).
    ///
    /// [`KthreadStats::steals`]: crate::KthreadStats
    #[inline]
    pub(crate) fn count_steal(&self) {
        bump(&self.stats.steals);
        if let Some(io) = &self.io {
            io.line.add_steal();
        }
    }

    /// Whether this kthread keeps busy time on its queue line: managed, and
    /// iokerneld's allocator reads it (utilization-based). Elsewhere each
    /// run of a uthread skips two clock reads and a write to the line that
    /// iokerneld reads every pass.
    pub(crate) fn keeps_busy_time(&self) -> bool {
        self.io.is_some()
            && self
                .rt()
                .link
                .as_ref()
                .is_some_and(|l| l.busy_time.load(Relaxed))
    }

    /// Marks the start of a run of uthreads, for [`KThread::publish_busy`].
    pub(crate) fn start_busy(&self) {
        if self.keeps_busy_time() {
            self.busy_since.set(self.rt().now_ns().max(1));
        }
    }

    /// Adds the busy time since `busy_since` to the queue line (for
    /// utilization-based allocators) and restarts the count.
    pub(crate) fn publish_busy(&self, running_on: bool) {
        let Some(io) = self.io.as_ref().filter(|_| self.keeps_busy_time()) else {
            return;
        };
        let now = self.rt().now_ns();
        let since = self.busy_since.replace(if running_on { now } else { 0 });
        if since != 0 {
            io.line.add_busy_ns(now.saturating_sub(since));
        }
    }

    /// This kthread's packet rings (managed runtimes with networking).
    #[inline]
    pub(crate) fn knet(&self) -> Option<&KNet> {
        self.io.as_ref()?.net.as_ref()
    }

    pub(crate) fn next_random(&self) -> u64 {
        // xorshift64: only used to pick a steal victim.
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }
}

/// The time slicer's doze while nothing runs (`slicer.rs`), ended by
/// whoever makes a uthread runnable.
#[derive(Default)]
pub(crate) struct SlicerDoze {
    /// On a line of its own: read on every push.
    dozing: CachePadded<AtomicBool>,
    slicer: OnceLock<std::thread::Thread>,
}

impl SlicerDoze {
    /// A uthread was made runnable: the slicer must look again. One
    /// relaxed load while it is awake.
    #[inline]
    pub(crate) fn end(&self) {
        if self.dozing.load(Relaxed) {
            self.wake();
        }
    }

    #[cold]
    fn wake(&self) {
        if self.dozing.swap(false, SeqCst) {
            if let Some(t) = self.slicer.get() {
                t.unpark();
            }
        }
    }

    /// The slicer's thread, which [`SlicerDoze::end`] unparks.
    pub(crate) fn set_slicer(&self, slicer: std::thread::Thread) {
        let _ = self.slicer.set(slicer);
    }

    /// The slicer starts dozing: from here a push ends the doze.
    pub(crate) fn begin(&self) {
        self.dozing.store(true, SeqCst);
    }

    /// The slicer is awake again.
    pub(crate) fn over(&self) {
        self.dozing.store(false, SeqCst);
    }
}

/// State shared by all kthreads of one runtime.
pub(crate) struct Shared {
    pub(crate) kthreads: Box<[KThread]>,
    pub(crate) mode: Mode,
    /// Shenango mode: work for any kthread. Worker mode: request contexts
    /// made runnable again after blocking, for the dispatcher.
    pub(crate) injector: Injector<URef>,
    /// Stacks of exited uthreads, for first runs on any kthread.
    pub(super) spare_stacks: Injector<Stack>,
    /// A line of its own: written as stacks come and go, beside fields
    /// every kthread reads all the time (the epoch, `shutdown`).
    pub(super) spare_count: CachePadded<AtomicUsize>,
    /// Most spare stacks kept; beyond it an exited uthread's stack is
    /// unmapped (`Shared::keep_spare_stacks`).
    pub(super) spare_limit: AtomicUsize,
    /// Stacks mapped for request contexts (the rest reused spares).
    pub(crate) request_stacks_mapped: AtomicU64,
    pub(crate) n_spinning: AtomicUsize,
    pub(crate) n_parked: AtomicUsize,
    /// Kthreads polling while idle under iokerneld (`idle_poll.rs`): at
    /// most one.
    pub(crate) idle_pollers: AtomicUsize,
    pub(crate) shutdown: AtomicBool,
    /// The time slicer's sleep while nothing runs (`slicer.rs`), ended by
    /// any push.
    pub(crate) slicer_doze: SlicerDoze,
    pub(super) epoch: Instant,
    pub(super) stack_size: usize,
    pub(crate) spin: Duration,
    wake_cursor: AtomicUsize,
    self_ref: Weak<Shared>,
    /// Registration with iokerneld (None: standalone).
    pub(crate) link: Option<Link>,
    /// iokerneld went away: the kthreads run standalone from then on.
    pub(crate) link_lost: AtomicBool,
    /// Test hook (worker mode): timers fire only at a worker's periodic
    /// check in its switch path, neither in the dispatcher nor in an idle
    /// worker (see `shinjuku::testing`).
    pub(crate) timers_only_at_switch_checks: AtomicBool,
    /// Protected mode: the netstack's event rings, polled like packets.
    events: OnceLock<Box<dyn EventSource>>,
}

impl Shared {
    pub(crate) fn new(
        plan: &Plan,
        mode: Mode,
        iokernel: Option<&IokernelConfig>,
    ) -> Result<Arc<Shared>, String> {
        let mut eventfds = Vec::with_capacity(plan.cores.len());
        for _ in &plan.cores {
            // Blocking: a wait with no deadline is one `read`, which the
            // write ends (`eventfd_wait`).
            let fd = eventfd::new_blocking()
                .map_err(|e| format!("cannot create kthread eventfds: {e}"))?;
            eventfds.push(fd);
        }
        let epoch = Instant::now();
        let (link, mut ends) = match iokernel {
            Some(cfg) => {
                let (link, ends) = Link::new(cfg, plan.cores.len(), epoch)?;
                (Some(link), ends.into_iter().map(Some).collect())
            }
            None => (None, Vec::new()),
        };
        ends.resize_with(plan.cores.len(), || None);
        Ok(Arc::new_cyclic(|weak: &Weak<Shared>| {
            let rt = weak.as_ptr();
            let kthreads = plan
                .cores
                .iter()
                .zip(eventfds)
                .zip(ends)
                .enumerate()
                .map(|(id, ((&core, eventfd), io))| {
                    let local = Worker::new_fifo();
                    KThread {
                        id,
                        mode,
                        preempt_ask: CachePadded::new(PreemptAsk::default()),
                        run_stamp: Cell::new(0),
                        spans: WorkerSpans::default(),
                        yielded: Cell::new(null_mut()),
                        core,
                        siblings: plan.siblings[id].clone(),
                        rt,
                        stealer: local.stealer(),
                        local: UnsafeCell::new(local),
                        sched: UThread::scheduler(rt),
                        current: Cell::new(null_mut()),
                        exited: Cell::new(null_mut()),
                        free_uthreads: UnsafeCell::new(Vec::new()),
                        timers: Timers::new(),
                        state: CachePadded::new(AtomicU8::new(RUNNING)),
                        revoke_requested: AtomicBool::new(false),
                        slice_asked: AtomicBool::new(false),
                        eventfd,
                        tid: AtomicI32::new(0),
                        io,
                        busy_since: Cell::new(0),
                        tick: Cell::new(0),
                        rng: Cell::new(0x9E37_79B9_7F4A_7C15 ^ ((id as u64 + 1) << 17)),
                        quiet_since: Cell::new(None),
                        poll_yielded_until: Cell::new(None),
                        poll_share: Cell::new(Default::default()),
                        bell_held: Cell::new(false),
                        bell_owed: Cell::new(false),
                        stats: KStats::default(),
                    }
                })
                .collect();
            Shared {
                kthreads,
                mode,
                injector: Injector::new(),
                spare_stacks: Injector::new(),
                spare_count: CachePadded::new(AtomicUsize::new(0)),
                spare_limit: AtomicUsize::new(SPARE_STACKS),
                request_stacks_mapped: AtomicU64::new(0),
                n_spinning: AtomicUsize::new(0),
                n_parked: AtomicUsize::new(0),
                idle_pollers: AtomicUsize::new(0),
                slicer_doze: SlicerDoze::default(),
                shutdown: AtomicBool::new(false),
                epoch,
                stack_size: plan.stack_size,
                spin: plan.spin_before_park,
                wake_cursor: AtomicUsize::new(0),
                self_ref: weak.clone(),
                link,
                link_lost: AtomicBool::new(false),
                timers_only_at_switch_checks: AtomicBool::new(false),
                events: OnceLock::new(),
            }
        }))
    }

    /// Whether iokerneld decides which kthreads hold a core.
    #[inline]
    pub(crate) fn managed(&self) -> bool {
        // SeqCst (a plain load on x86): a kthread sleeping on the wake page
        // and `fall_back_to_standalone` each see the other's store.
        self.link.is_some() && !self.link_lost.load(SeqCst)
    }

    /// The network stack (registered with networking), as the scheduler
    /// polls it; `net::stack_of` gives the stack itself.
    #[inline]
    pub(crate) fn packet_stack(&self) -> Option<&dyn PacketStack> {
        self.link.as_ref()?.net.get().map(|s| &**s)
    }

    /// The protected backend's event rings, if attached.
    #[inline]
    pub(crate) fn event_source(&self) -> Option<&dyn EventSource> {
        self.events.get().map(|s| &**s)
    }

    /// Attaches the protected backend (once).
    pub(crate) fn set_event_source(
        &self,
        src: Box<dyn EventSource>,
    ) -> Result<(), Box<dyn EventSource>> {
        self.events.set(src)
    }

    /// Protected mode, standalone: whether `me`, about to park, would
    /// leave no other kthread awake to poll the event rings (nothing wakes
    /// a parked standalone kthread for events; one stays polling, as
    /// DLibOS's application cores do). Under iokerneld, parking is fine:
    /// iokerneld counts the events waiting on our rings as queued work and
    /// grants a core (docs/protected.md, "Wake-ups"). Called after `me`
    /// stored its parked state (SeqCst), so of two kthreads parking at once
    /// at least one sees the other parked.
    pub(crate) fn last_event_poller(&self, me: &KThread) -> bool {
        self.events.get().is_some()
            && self
                .kthreads
                .iter()
                .filter(|k| k.id != me.id)
                .all(|k| !matches!(k.state.load(SeqCst), RUNNING | SPINNING | WAKING))
    }

    /// Worker mode: a request made runnable goes to the shared queue the
    /// dispatcher takes from (no counting, no kthread to wake: the
    /// dispatcher decides where it runs).
    pub(crate) fn queue_for_dispatcher(&self, u: URef) {
        u.note_queued();
        self.injector.push(u);
    }

    /// Injected work is counted on kthread 0's queue line: iokerneld sees
    /// it wait there whether or not kthread 0 holds a core.
    pub(crate) fn push_injector(&self, u: URef) {
        u.note_queued();
        self.kthreads[0].count_injected(1);
        self.injector.push(u);
        self.slicer_doze.end();
        // An idle kthread blocked on its own socket does not see the
        // queue: wake it (idle_poll.rs).
        for k in self.kthreads.iter() {
            k.wake_if_blocked();
        }
    }

    /// iokerneld went away: run standalone on whatever cores the kthreads
    /// hold now, and wake every parked kthread.
    pub(crate) fn fall_back_to_standalone(&self) {
        if self.link_lost.swap(true, SeqCst) {
            return;
        }
        for k in self.kthreads.iter() {
            k.revoke_requested.store(false, SeqCst);
            eventfd_signal(k);
        }
        self.wake_page_sleepers();
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// `at` on this runtime's clock (ns since its epoch).
    pub(crate) fn ns_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    pub(crate) fn arc(&self) -> Option<Arc<Shared>> {
        self.self_ref.upgrade()
    }

    /// Wakes one parked kthread if nobody is already looking for work.
    /// Callers have just published work; the SeqCst fence pairs with the
    /// one in `park_idle` so that either the parker sees the work or we see
    /// the parker.
    pub(crate) fn notify_one(&self) {
        if self.managed() {
            return; // only iokerneld grants cores
        }
        if self.kthreads.len() == 1 {
            let k = current_kthread();
            // SAFETY: a non-null kthread pointer of this thread.
            if !k.is_null() && std::ptr::eq(unsafe { (*k).rt }, self) {
                return; // the only kthread is the one publishing the work
            }
        }
        fence(SeqCst);
        if self.n_spinning.load(SeqCst) > 0 || self.n_parked.load(SeqCst) == 0 {
            return;
        }
        let n = self.kthreads.len();
        let start = self.wake_cursor.fetch_add(1, Relaxed);
        for i in 0..n {
            let k = &self.kthreads[(start + i) % n];
            if k.state
                .compare_exchange(PARKED, WAKING, SeqCst, Relaxed)
                .is_ok()
            {
                self.n_parked.fetch_sub(1, SeqCst);
                eventfd_signal(k);
                return;
            }
        }
    }

    pub(crate) fn wake_all_for_shutdown(&self) {
        self.shutdown.store(true, SeqCst);
        for k in self.kthreads.iter() {
            eventfd_signal(k);
        }
        self.slicer_doze.end();
        self.wake_page_sleepers();
    }

    /// Wakes the kthreads sleeping on iokerneld's wake page for a grant
    /// (after the caller set `shutdown` or `link_lost`, which they look at
    /// when woken). The runtime cannot change their words (the page is
    /// read-only here), so a wake that came between a kthread's look and
    /// its sleep would be lost: repeated until each has left, at most a
    /// second. For an OS thread (the watcher, or the one stopping the
    /// runtime): it sleeps between rounds.
    fn wake_page_sleepers(&self) {
        let Some(link) = &self.link else {
            return;
        };
        let t0 = Instant::now();
        loop {
            let mut asleep = false;
            for k in self.kthreads.iter() {
                if let (Some(io), Some((page, slot))) = (&k.io, link.wake_slot(k.id)) {
                    if io.sleeping_on_page.load(SeqCst) {
                        asleep = true;
                        let _ = page.wake(slot);
                    }
                }
            }
            if !asleep {
                return;
            }
            if t0.elapsed() > Duration::from_secs(1) {
                log::warn!(
                    "kthreads of {:?} still sleep on the wake page after 1 s of wakes",
                    link.cfg.name
                );
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Work any idle kthread could take right now.
    pub(crate) fn work_visible(&self, me: &KThread) -> bool {
        !self.injector.is_empty()
            || self.kthreads.iter().any(|k| !k.stealer.is_empty())
            || me.timers.next_deadline().min(self.stack_deadline()) <= self.now_ns()
            || (self.link.is_some()
                && self
                    .kthreads
                    .iter()
                    .any(|k| k.knet().is_some_and(KNet::ingress_pending)))
            || self.events.get().is_some_and(|e| e.pending())
    }

    /// The earliest deadline a kthread about to sleep must wake for: any
    /// kthread's timers (a busy one cannot fire its own), and the network
    /// stack's (TCP's retransmission and delayed-ACK timers, fired by
    /// whoever polls it).
    pub(crate) fn earliest_deadline(&self) -> u64 {
        self.kthreads
            .iter()
            .map(KThread::live_next_deadline)
            .min()
            .unwrap_or(u64::MAX)
            .min(self.stack_deadline())
    }

    /// The network stack's earliest deadline on this runtime's clock
    /// (`u64::MAX`: none).
    fn stack_deadline(&self) -> u64 {
        self.packet_stack()
            .and_then(|s| s.next_deadline())
            .map_or(u64::MAX, |at| self.ns_at(at))
    }

    /// `k` is about to be busy while it has timers pending: make sure an
    /// idle kthread is awake to fire them on time (it parks with the earliest
    /// deadline of all kthreads as its timeout).
    pub(crate) fn watch_timers_of(&self, k: &KThread) {
        if k.timers.any() && self.n_spinning.load(Relaxed) == 0 && self.n_parked.load(Relaxed) > 0 {
            self.notify_one();
        }
    }

    /// Frees what the runqueues still hold after every kthread has stopped.
    /// uthreads blocked on a wait queue at this point are unreachable and
    /// leak, as threads do at process exit.
    pub(crate) fn drain_after_shutdown(&self) {
        let free = |u: URef| {
            // SAFETY: all kthreads have exited, so no context runs; each
            // URef is in exactly one queue, so it is freed once. A uthread
            // that had started is dropped without unwinding its stack.
            unsafe { drop(Box::from_raw(u.ptr())) };
        };
        while let Steal::Success(u) = self.injector.steal() {
            free(u);
        }

        for k in self.kthreads.iter() {
            while let Steal::Success(u) = k.stealer.steal() {
                free(u);
            }
            k.timers.drain(|addr| {
                if addr & TIMER_WAITER != 0 {
                    // A timed wait: the uthread is on a wait queue (or
                    // already elsewhere); only the timer's reference goes.
                    // SAFETY: made by `Arc::into_raw` in
                    // `park_current_until`, taken once.
                    drop(unsafe { Arc::from_raw((addr & !TIMER_WAITER) as *const Waiter) });
                    return;
                }
                free(URef(
                    NonNull::new(addr as *mut UThread).expect("null timer entry"),
                ));
            });
        }
    }
}

fn eventfd_signal(k: &KThread) {
    let _ = eventfd::write(k.eventfd.as_fd(), 1);
}

/// Blocks on the kthread's eventfd until signalled, or until `deadline`
/// (ns since the epoch; u64::MAX for none) or a signal interrupts a timed
/// wait. True if the eventfd had been written.
pub(crate) fn eventfd_wait(k: &KThread, deadline: u64) -> bool {
    let fd = k.eventfd.as_fd();
    if deadline == u64::MAX {
        // One system call that the write ends: a poll and then a read
        // cost a wake about 0.5 µs more on the development VM
        // (docs/results.md, the wake of a parked kthread). A preemption
        // signal restarts it (SA_RESTART): only the eventfd means a grant.
        return matches!(eventfd::read(fd), Ok(Some(n)) if n > 0);
    }
    let rt = k.rt();
    let timeout = Duration::from_nanos(deadline.saturating_sub(rt.now_ns()));
    // Read only what the poll saw: on this blocking eventfd a read of a
    // zero count would wait.
    eventfd::wait(fd, Some(timeout)).unwrap_or(false)
        && matches!(eventfd::read(fd), Ok(Some(n)) if n > 0)
}

thread_local! {
    static KTHREAD: Cell<*const KThread> = const { Cell::new(null()) };
}

static KTHREAD_WORD: ThreadWord = ThreadWord::new();

/// The kthread running the caller. Never inlined, so no caller can keep a
/// thread-local address from before a migration (docs/design.md, "Per-kthread
/// state and TLS"), and read in one instruction (`thread_word.rs`). Stable
/// only while preemption is deferred.
#[inline(never)]
pub(crate) fn current_kthread() -> *const KThread {
    KTHREAD_WORD.read(&KTHREAD)
}

/// Runs `f` on the transmit side of the calling kthread's packet rings,
/// with preemption deferred, if the caller runs on a kthread of `rt` with
/// networking. `f` must not switch (it cannot: it has no token to give up).
pub(crate) fn with_current_knet<R>(rt: &Shared, f: impl FnOnce(&mut TxSide<'_>) -> R) -> Option<R> {
    let deferred = deferral::Guard::new();
    let mut k = Owner::current(&deferred)?;
    if !std::ptr::eq(k.rt, rt) {
        return None;
    }
    let mut tx = k.tx_side()?;
    Some(f(&mut tx))
}

/// The calling uthread's runtime.
pub(crate) fn current_shared() -> Option<Arc<Shared>> {
    let rt = current_runtime()?;
    // SAFETY: a kthread's runtime is alive while the kthread runs.
    unsafe { (*rt).arc() }
}

/// The runtime of the calling kthread, if any.
pub(crate) fn current_runtime() -> Option<*const Shared> {
    let k = current_kthread();
    // SAFETY: a non-null kthread pointer of this thread.
    (!k.is_null()).then(|| unsafe { (*k).rt })
}

/// Index of the kthread running the caller (may change at the next
/// preemption point or yield).
pub fn current_kthread_id() -> Option<usize> {
    let k = current_kthread();
    // SAFETY: a non-null kthread pointer of this thread.
    (!k.is_null()).then(|| unsafe { (*k).id })
}

/// The kthread running the caller, if any (see [`current_kthread`]).
pub(crate) fn current_kthread_ref() -> Option<&'static KThread> {
    let k = current_kthread();
    // SAFETY: kthreads live as long as their thread runs code.
    (!k.is_null()).then(|| unsafe { &*k })
}

// ---- the kthread's own loop -------------------------------------------------------

pub(crate) fn kthread_main(rt: Arc<Shared>, id: usize, body: KthreadBody) {
    let k = &rt.kthreads[id];
    // Under iokerneld the grant sets the affinity.
    if !rt.managed() {
        if let Err(e) = ginza_sys::affinity::pin_current_thread(k.core) {
            log::warn!(
                "kthread {id}: cannot pin to core {}: {e}; running unpinned",
                k.core
            );
        }
    }
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack:
    // 1 ns instead of 50 µs, so sleeps wake on time.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    k.tid.store(ginza_sys::process::gettid(), SeqCst);
    crate::signals::ensure_altstack();
    crate::foreign_tls::on_kthread_start();
    KTHREAD.with(|c| c.set(k));
    k.current.set(k.sched_ptr());
    let located = KTHREAD_WORD
        .locate(&KTHREAD)
        .and_then(|()| deferral::start_kthread(&k.sched.preempt));
    if let Err(why) = located {
        crate::signals::fatal(&format!("kthread {id}: {why}"));
    }
    // SAFETY: this is `k`'s own thread, in its scheduler context.
    let mut owner = unsafe { Owner::for_scheduler(k) };
    // Under iokerneld the body starts by waiting for the first grant
    // (`runtime::start` wraps it: `iokernel::wait_for_first_grant`).
    body(&mut owner);

    deferral::set_current_state(null());
    KTHREAD.with(|c| c.set(null()));
    k.tid.store(0, SeqCst);
}

/// What a kthread runs in its scheduler context: the Shenango scheduler
/// loop (`shenango::scheduler_loop`) or the Shinjuku worker loop
/// (`shinjuku::worker`).
pub(crate) type KthreadBody = Arc<dyn Fn(&mut Owner<'_>) + Send + Sync>;

/// Worker mode: blocks the idle kthread `k` on its eventfd, unless
/// `still_idle` says otherwise once `k` is marked parked, until
/// [`wake_if_parked`] or its next timer.
pub(crate) fn park_worker(k: &KThread, still_idle: impl Fn() -> bool) {
    k.state.store(PARKED, SeqCst);
    fence(SeqCst);
    if still_idle() && !k.rt().shutdown.load(SeqCst) {
        bump(&k.stats.parks);
        eventfd_wait(k, k.live_next_deadline());
    }
    k.state.store(RUNNING, SeqCst);
}

/// Worker mode: wakes `k` if it is parked; the caller has just published
/// work for it (the SeqCst fence pairs with the one in [`park_worker`]).
pub(crate) fn wake_if_parked(k: &KThread) {
    fence(SeqCst);
    if k.state.load(SeqCst) == PARKED {
        eventfd_signal(k);
    }
}

/// Asks kthread `id` to give up its core: a preemption signal makes it save
/// its uthread where others can steal it, and park until [`grant`].
pub(crate) fn revoke(rt: &Shared, id: usize) -> std::io::Result<()> {
    let k = &rt.kthreads[id];
    k.revoke_requested.store(true, SeqCst);
    k.preempt_ask.ask_any();
    let tid = k.tid.load(SeqCst);
    if tid != 0 {
        crate::signals::send_preempt(tid)?;
    }
    Ok(())
}

pub(crate) fn grant(rt: &Shared, id: usize) {
    let k = &rt.kthreads[id];
    k.revoke_requested.store(false, SeqCst);
    k.preempt_ask.clear();
    eventfd_signal(k);
}

pub(crate) fn kthread_state_name(rt: &Shared, id: usize) -> &'static str {
    match rt.kthreads[id].state.load(Relaxed) {
        RUNNING => "running",
        SPINNING => "spinning",
        PARKED | WAKING => "parked",
        REVOKED => "revoked",
        _ => "unknown",
    }
}

/// A kthread's window for the CPU time other tasks took from it, which
/// spans its polling spells (a spell ends at each request; `idle_poll.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PollShare {
    pub(crate) window_start: Option<Instant>,
    /// How long it had waited for its CPU (ns,
    /// `runnable_waiting_ns_of_current`) and how often Linux had switched
    /// it out (`involuntary_switches_of_current`) when the window began;
    /// `None`: unknown, the window never counts as lost.
    pub(crate) waited_ns: Option<u64>,
    pub(crate) switches: Option<u64>,
}

impl PollShare {
    pub(crate) fn started(now: Instant) -> PollShare {
        use ginza_sys::sched_stat::{
            involuntary_switches_of_current, runnable_waiting_ns_of_current,
        };
        PollShare {
            window_start: Some(now),
            waited_ns: runnable_waiting_ns_of_current().ok(),
            switches: involuntary_switches_of_current().ok(),
        }
    }
}
