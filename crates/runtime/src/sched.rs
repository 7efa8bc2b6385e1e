//! The scheduler: uthreads, kthreads, context switches, work stealing,
//! parking and timers. The preemption entry points are in `preempt.rs`;
//! the Shinjuku worker loop in `shinjuku/worker.rs`.
//!
//! Invariants that keep switching safe:
//! * A context is only ever switched out and in with its preemption count
//!   raised (a new uthread starts at 1, the scheduler context stays at 1,
//!   a preempted uthread is raised by the signal handler). So a signal that
//!   lands mid-switch is always deferred.
//! * A uthread may be pushed to a runqueue *before* it has finished
//!   switching out (that is how yield and wake-ups stay cheap). Whoever pops
//!   it waits for its `on_cpu` flag, which the switch clears only after the
//!   registers are saved.
//! * Per-kthread state is reached through [`current_kthread`], never through
//!   a thread-local address a caller might have cached across a switch, and
//!   only with preemption deferred; owner-only state only through an
//!   [`Owner`] token, which never outlives a switch (docs/runtime.md,
//!   "Owner-only state and the owner token").

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::{null, null_mut, NonNull};
use std::sync::atomic::{
    fence, AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, SeqCst},
};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use crossbeam_utils::CachePadded;
use ginza_sys::eventfd;

use crate::arch;
use crate::config::Plan;
use crate::iokernel::{IokernelConfig, KLink, Link};
use crate::net::{KNet, Stack as NetStack, TxSide};
use crate::preempt::{self, PreemptState};
use crate::stack::Stack;
use crate::timer::Timers;

/// A user-level thread: a stack, a saved stack pointer, and what to run.
pub(crate) struct UThread {
    sp: UnsafeCell<*mut u8>,
    /// True from the moment a kthread decides to run this context until its
    /// registers are saved again.
    on_cpu: AtomicBool,
    pub(crate) preempt: PreemptState,
    stack: UnsafeCell<Option<Stack>>,
    entry: UnsafeCell<Option<Entry>>,
    rt: *const Shared,
    /// Worker mode: the identity the dispatcher gave this context (0: none
    /// yet). Unlike the address, never reused.
    serial: AtomicU64,
}

impl UThread {
    /// A new uthread, recycled (with its stack) from the calling kthread's
    /// cache when there is one.
    fn new_boxed(rt: *const Shared, entry: Entry) -> URef {
        let recycled = {
            let deferred = preempt::Guard::new();
            Owner::current(&deferred)
                .filter(|owner| owner.rt == rt)
                .and_then(|owner| owner.take_cached_uthread())
        };
        if let Some(mut u) = recycled {
            // Exited uthreads are cached with sp null (not started), their
            // count at 1, no entry, and their stack kept.
            *u.entry.get_mut() = Some(entry);
            *u.serial.get_mut() = 0;
            return URef(NonNull::from(Box::leak(u)));
        }
        let u = Box::new(UThread {
            sp: UnsafeCell::new(null_mut()),
            on_cpu: AtomicBool::new(false),
            // New contexts start deferred; their entry lowers the count.
            preempt: PreemptState::new(1),
            stack: UnsafeCell::new(None),
            entry: UnsafeCell::new(Some(entry)),
            rt,
            serial: AtomicU64::new(0),
        });
        URef(NonNull::from(Box::leak(u)))
    }

    /// The scheduler's own context: runs on the kthread's pthread stack.
    fn scheduler(rt: *const Shared) -> UThread {
        UThread {
            sp: UnsafeCell::new(null_mut()),
            on_cpu: AtomicBool::new(true),
            preempt: PreemptState::new(1),
            stack: UnsafeCell::new(None),
            entry: UnsafeCell::new(None),
            rt,
            serial: AtomicU64::new(0),
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
pub(crate) struct URef(NonNull<UThread>);

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

    /// Whether it has never run (freshly spawned). Only for a uthread that
    /// is in a queue, where nobody runs it.
    pub(crate) fn never_ran(self) -> bool {
        // SAFETY: a queued uthread's fields are not being written.
        unsafe { (*self.ptr()).sp.get().read().is_null() }
    }

    /// The identity the Shinjuku dispatcher gave it (0: none yet).
    pub(crate) fn serial(self) -> u64 {
        // SAFETY: a URef names a live uthread; the field is atomic.
        unsafe { (*self.ptr()).serial.load(Relaxed) }
    }

    /// Gives it an identity (the Shinjuku dispatcher, before it first runs
    /// the context: the assignment publishes the store).
    pub(crate) fn set_serial(self, serial: u64) {
        // SAFETY: as in `serial`.
        unsafe { (*self.ptr()).serial.store(serial, Relaxed) }
    }
}

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
    /// Worker mode: preemptions taken at preemption points (cooperative).
    pub(crate) coop_preemptions: AtomicU64,
}

/// Owner-only increment of a statistics counter (readers may be elsewhere).
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

pub(crate) struct KThread {
    pub(crate) id: usize,
    pub(crate) mode: Mode,
    /// Cooperative preemption request, polled at preemption points (its own
    /// cache line: the Shinjuku dispatcher writes it while the kthread
    /// polls). Set when a quantum is spent, and with a revocation.
    pub(crate) preempt_flag: CachePadded<AtomicBool>,
    /// Worker mode: the request context that just yielded back.
    pub(crate) yielded: Cell<*mut UThread>,
    pub(crate) core: usize,
    pub(crate) siblings: Vec<usize>,
    rt: *const Shared,
    local: UnsafeCell<Worker<URef>>,
    pub(crate) stealer: Stealer<URef>,
    pub(crate) sched: UThread,
    pub(crate) current: Cell<*mut UThread>,
    /// A uthread that exited; the next context to run frees its stack.
    exited: Cell<*mut UThread>,
    /// Exited uthreads kept with their stacks for the next spawn. Boxed:
    /// a uthread's address is its identity (URef) and must not move.
    #[allow(clippy::vec_box)]
    free_uthreads: UnsafeCell<Vec<Box<UThread>>>,
    pub(crate) timers: Timers,
    pub(crate) state: AtomicU8,
    pub(crate) revoke_requested: AtomicBool,
    eventfd: OwnedFd,
    pub(crate) tid: AtomicI32,
    /// Shared state with iokerneld, when the runtime is registered.
    pub(crate) io: Option<KLink>,
    /// Managed runtimes: when the kthread left its scheduler context for
    /// uthreads (ns since the epoch), for the busy time on the queue line.
    pub(crate) busy_since: Cell<u64>,
    tick: Cell<u32>,
    rng: Cell<u64>,
    pub(crate) stats: KStats,
}

// SAFETY: the Cell/UnsafeCell fields (local, sched, current, exited,
// free_uthreads, tick, rng) are touched only by the kthread's own pthread;
// everything other threads touch is atomic or behind a lock.
unsafe impl Sync for KThread {}
// SAFETY: see Sync; the struct is created on one thread and then shared.
unsafe impl Send for KThread {}

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
///   value: no token survives the switch (DESIGN.md, "Per-kthread state and
///   TLS"). Code holding a token must not call anything else that may switch
///   (`yield_now`, `Mutex::lock`, ...); debug builds check at every use that
///   the token's kthread is still the running one.
///
/// `!Send` and `!Sync`: a token never leaves the thread it was made on.
pub(crate) struct Owner<'a> {
    k: &'a KThread,
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
    pub(crate) fn current(deferred: &'a preempt::Guard) -> Option<Owner<'a>> {
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
        self.count_pushed(1);
        self.runqueue().push(u);
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

    fn take_cached_uthread(&self) -> Option<Box<UThread>> {
        // SAFETY: owner-only field (the token); no other borrow of it lives
        // across this call.
        unsafe { &mut *self.k.free_uthreads.get() }.pop()
    }

    /// Keeps `u` (exited, with its stack) for the next spawn, if there is
    /// room; else gives it back.
    fn cache_uthread(&self, u: Box<UThread>) -> Option<Box<UThread>> {
        // SAFETY: as in `take_cached_uthread`.
        let cache = unsafe { &mut *self.k.free_uthreads.get() };
        if cache.len() >= UTHREAD_CACHE {
            return Some(u);
        }
        cache.push(u);
        None
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

    #[inline]
    pub(crate) fn count_pushed(&self, n: u32) {
        if let Some(io) = &self.io {
            io.line.add_rq_tail(n);
        }
    }

    #[inline]
    pub(crate) fn count_taken(&self, n: u32) {
        if let Some(io) = &self.io {
            io.line.add_rq_head(n);
        }
    }

    /// Adds the busy time since `busy_since` to the queue line (for
    /// utilization-based allocators) and restarts the count.
    pub(crate) fn publish_busy(&self, running_on: bool) {
        if let Some(io) = &self.io {
            let now = self.rt().now_ns();
            let since = self.busy_since.replace(if running_on { now } else { 0 });
            if since != 0 {
                io.line.add_busy_ns(now.saturating_sub(since));
            }
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

/// State shared by all kthreads of one runtime.
pub(crate) struct Shared {
    pub(crate) kthreads: Box<[KThread]>,
    pub(crate) mode: Mode,
    /// Shenango mode: work for any kthread. Worker mode: request contexts
    /// made runnable again after blocking, for the dispatcher.
    pub(crate) injector: Injector<URef>,
    /// Stacks of exited uthreads, for first runs on any kthread.
    spare_stacks: Injector<Stack>,
    spare_count: AtomicUsize,
    pub(crate) n_spinning: AtomicUsize,
    pub(crate) n_parked: AtomicUsize,
    pub(crate) shutdown: AtomicBool,
    epoch: Instant,
    stack_size: usize,
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
}

impl Shared {
    pub(crate) fn new(
        plan: &Plan,
        mode: Mode,
        iokernel: Option<&IokernelConfig>,
    ) -> Result<Arc<Shared>, String> {
        let mut eventfds = Vec::with_capacity(plan.cores.len());
        for _ in &plan.cores {
            let fd = eventfd::new().map_err(|e| format!("cannot create kthread eventfds: {e}"))?;
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
                        preempt_flag: CachePadded::new(AtomicBool::new(false)),
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
                        state: AtomicU8::new(RUNNING),
                        revoke_requested: AtomicBool::new(false),
                        eventfd,
                        tid: AtomicI32::new(0),
                        io,
                        busy_since: Cell::new(0),
                        tick: Cell::new(0),
                        rng: Cell::new(0x9E37_79B9_7F4A_7C15 ^ ((id as u64 + 1) << 17)),
                        stats: KStats::default(),
                    }
                })
                .collect();
            Shared {
                kthreads,
                mode,
                injector: Injector::new(),
                spare_stacks: Injector::new(),
                spare_count: AtomicUsize::new(0),
                n_spinning: AtomicUsize::new(0),
                n_parked: AtomicUsize::new(0),
                shutdown: AtomicBool::new(false),
                epoch,
                stack_size: plan.stack_size,
                spin: plan.spin_before_park,
                wake_cursor: AtomicUsize::new(0),
                self_ref: weak.clone(),
                link,
                link_lost: AtomicBool::new(false),
                timers_only_at_switch_checks: AtomicBool::new(false),
            }
        }))
    }

    /// Whether iokerneld decides which kthreads hold a core.
    #[inline]
    pub(crate) fn managed(&self) -> bool {
        self.link.is_some() && !self.link_lost.load(Relaxed)
    }

    /// The network stack (registered with networking).
    #[inline]
    pub(crate) fn stack(&self) -> Option<&NetStack> {
        self.link.as_ref()?.net.get()
    }

    pub(crate) fn net_stats(&self) -> Option<crate::net::NetStats> {
        let stack = self.stack()?;
        Some(
            stack.stats(
                self.kthreads
                    .iter()
                    .filter_map(|k| k.knet().map(|n| (k.id, n))),
            ),
        )
    }

    /// Injected work is counted on kthread 0's queue line: iokerneld sees
    /// it wait there whether or not kthread 0 holds a core.
    pub(crate) fn push_injector(&self, u: URef) {
        self.kthreads[0].count_pushed(1);
        self.injector.push(u);
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
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Keeps the stack of an exited uthread for any kthread's next first
    /// run, up to `SPARE_STACKS`; beyond that it is unmapped.
    fn put_spare_stack(&self, stack: Stack) {
        if self.spare_count.fetch_add(1, Relaxed) < SPARE_STACKS {
            self.spare_stacks.push(stack);
        } else {
            self.spare_count.fetch_sub(1, Relaxed);
        }
    }

    fn take_spare_stack(&self) -> Option<Stack> {
        loop {
            match self.spare_stacks.steal() {
                Steal::Success(stack) => {
                    self.spare_count.fetch_sub(1, Relaxed);
                    return Some(stack);
                }
                Steal::Empty => return None,
                Steal::Retry => std::hint::spin_loop(),
            }
        }
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
    }

    /// Work any idle kthread could take right now.
    pub(crate) fn work_visible(&self, me: &KThread) -> bool {
        !self.injector.is_empty()
            || self.kthreads.iter().any(|k| !k.stealer.is_empty())
            || me.timers.next_deadline() <= self.now_ns()
            || (self.link.is_some()
                && self
                    .kthreads
                    .iter()
                    .any(|k| k.knet().is_some_and(KNet::ingress_pending)))
    }

    pub(crate) fn earliest_deadline(&self) -> u64 {
        self.kthreads
            .iter()
            .map(|k| k.timers.next_deadline())
            .min()
            .unwrap_or(u64::MAX)
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

/// Blocks on the kthread's eventfd until signalled, a signal interrupts, or
/// `deadline` (ns since the epoch; u64::MAX for none). True if the eventfd
/// had been written.
pub(crate) fn eventfd_wait(k: &KThread, deadline: u64) -> bool {
    let rt = k.rt();
    let timeout =
        (deadline != u64::MAX).then(|| Duration::from_nanos(deadline.saturating_sub(rt.now_ns())));
    let _ = eventfd::wait(k.eventfd.as_fd(), timeout);
    eventfd_try_read(k)
}

/// Reads and resets the eventfd without blocking; true if it was written.
pub(crate) fn eventfd_try_read(k: &KThread) -> bool {
    matches!(eventfd::read(k.eventfd.as_fd()), Ok(Some(n)) if n > 0)
}

thread_local! {
    static KTHREAD: Cell<*const KThread> = const { Cell::new(null()) };
}

/// The kthread running the caller. Never inlined, so no caller can keep a
/// thread-local address from before a migration (DESIGN.md, "Per-kthread
/// state and TLS"). Stable only while preemption is deferred.
#[inline(never)]
pub(crate) fn current_kthread() -> *const KThread {
    KTHREAD.with(|k| k.get())
}

/// Switches from `from` (running on `k`) to `to`. Both have preemption
/// deferred. Returns when `from` is resumed — possibly on another kthread,
/// so a uthread gives up its token first (see [`switch_away`]).
///
/// # Safety
/// `from` must be the context running on `k`; `to` must be runnable and in no
/// queue.
pub(crate) unsafe fn switch_to(k: &Owner<'_>, from: *mut UThread, to: *mut UThread) {
    // SAFETY: `to` is a live context handed to us by a queue or the kthread.
    let target = unsafe { &*to };
    if to != k.sched_ptr() {
        // It may still be saving its registers on another core.
        while target.on_cpu.load(Acquire) {
            std::hint::spin_loop();
        }
        // SAFETY: the target is not running anywhere, so we own its fields.
        if unsafe { (*target.sp.get()).is_null() } {
            // SAFETY: as above: a uthread that has never run.
            unsafe { prepare_first_run(k, to) };
        }
    }
    target.on_cpu.store(true, Relaxed);
    k.current.set(to);
    preempt::set_current_state(&target.preempt);
    // SAFETY: `from` is running here, `to` is suspended with a saved stack
    // pointer on a mapped stack (or the scheduler's pthread stack).
    unsafe { arch::switch((*from).sp.get(), *target.sp.get(), &(*from).on_cpu) };
}

/// A uthread's side of [`switch_to`]: it gives up its token, since it may
/// resume on another kthread, and finishes the switch when it resumes.
///
/// # Safety
/// As for [`switch_to`].
pub(crate) unsafe fn switch_away(owner: Owner<'_>, from: *mut UThread, to: *mut UThread) {
    /// Takes the token, so that it ends with the switch.
    ///
    /// # Safety
    /// As for [`switch_to`].
    unsafe fn switch_giving_up(owner: Owner<'_>, from: *mut UThread, to: *mut UThread) {
        // SAFETY: the caller's contract.
        unsafe { switch_to(&owner, from, to) }
    }
    // SAFETY: the caller's contract.
    unsafe { switch_giving_up(owner, from, to) };
    finish_switch();
}

/// Called by a context right after it resumes: frees a uthread that exited
/// on the way here (its stack could not be freed while in use).
pub(crate) fn finish_switch() {
    // SAFETY: preemption is deferred in every context that resumes from a
    // switch, until after this returns.
    let k = unsafe { Owner::current_deferred() };
    let dead = k.exited.replace(null_mut());
    if !dead.is_null() {
        // SAFETY: the exited uthread is off-CPU (we are running) and in no queue.
        let mut u = unsafe { Box::from_raw(dead) };
        if k.mode == Mode::Shenango && u.stack.get_mut().is_some() {
            *u.sp.get_mut() = null_mut();
            u.preempt = PreemptState::new(1);
            if let Some(mut u) = k.cache_uthread(u) {
                if let Some(stack) = u.stack.get_mut().take() {
                    k.rt().put_spare_stack(stack);
                }
            }
        } else if let Some(stack) = u.stack.get_mut().take() {
            // Shinjuku requests are created by the dispatcher, which is no
            // kthread: their stacks go back through the runtime-wide pool.
            k.rt().put_spare_stack(stack);
        }
    }
}

const UTHREAD_CACHE: usize = 64;
const SPARE_STACKS: usize = 1024;

/// Gives a uthread that has never run a stack (unless it kept one from a
/// previous life) and lays out its first frame.
///
/// # Safety
/// `u` must not be running and must never have run since it was (re)spawned.
unsafe fn prepare_first_run(k: &Owner<'_>, u: *mut UThread) {
    // SAFETY: `u` is ours until it runs (caller's contract).
    let stack = unsafe { &mut *(*u).stack.get() };
    if stack.is_none() {
        let rt = k.rt();
        *stack = Some(rt.take_spare_stack().unwrap_or_else(|| {
            Stack::new(rt.stack_size).unwrap_or_else(|e| {
                crate::signals::fatal(&format!(
                    "cannot map a uthread stack: {e} (every started, unfinished uthread \
                     holds one: check vm.max_map_count and memory, or bound the requests in flight)"
                ))
            })
        }));
    }
    let top = stack
        .as_ref()
        .map(Stack::top)
        .expect("stack assigned above");
    // SAFETY: the stack is ours and unused; `u` is not running.
    unsafe { *(*u).sp.get() = arch::init_stack(top, uthread_entry, u.cast()) };
}

/// First Rust code of every uthread.
unsafe extern "C" fn uthread_entry(arg: *mut u8) -> ! {
    let u = arg.cast::<UThread>();
    finish_switch();
    // SAFETY: `u` is the running uthread; its entry is taken exactly once.
    let entry = unsafe { (*(*u).entry.get()).take() };
    // SAFETY: as above; `u` lives until exit below.
    preempt::enable(unsafe { &(*u).preempt });
    if let Some(task) = entry {
        task.run(); // catches its own panics (see task.rs)
    }
    preempt::disable();
    // SAFETY: preemption deferred (for good: this context ends here).
    let mut k = unsafe { Owner::current_deferred() };
    k.exited.set(u);
    let next = pick_next(&mut k);
    // SAFETY: `u` runs on `k`; `next` is runnable and dequeued.
    unsafe { switch_to(&k, u, next) };
    crate::signals::fatal("an exited uthread was resumed")
}

/// The next context for `k`: a local uthread, or the scheduler when the
/// runqueue is empty or the kthread must stop.
fn pick_next(owner: &mut Owner<'_>) -> *mut UThread {
    let k = owner.kthread();
    let rt = k.rt();
    if k.revoke_requested.load(Relaxed) || rt.shutdown.load(Relaxed) {
        return k.sched_ptr();
    }
    // Do not let a busy runqueue starve this kthread's timers.
    let tick = k.tick.get().wrapping_add(1);
    k.tick.set(tick);
    if k.mode == Mode::Worker {
        // Only the dispatcher decides what a worker runs: a request whose
        // sleep is over goes back to it, never onto this worker's runqueue.
        // Run from here it would stop behind the dispatcher's back, which
        // then waits for it forever (docs/runtime.md, Shinjuku mode).
        if tick.is_multiple_of(32) {
            fire_timers_to_dispatcher(k);
        }
        return k.sched_ptr();
    }
    if tick.is_multiple_of(32) {
        fire_timers_locally(owner, k);
        // Nor its packets (a kthread that never runs dry would not poll).
        if k.io.is_some() {
            poll_net(owner, k);
        }
        k.publish_busy(true);
    }
    match owner.pop() {
        Some(u) => u.ptr(),
        None => k.sched_ptr(),
    }
}

/// Leaves the running uthread for the next context; returns when it runs
/// again, maybe on another kthread (so it gives up its token). The caller
/// has deferred preemption and has already put the uthread where it will
/// be found (a runqueue, a wait queue, a timer).
fn schedule_away(mut k: Owner<'_>) {
    let cur = k.current.get();
    let next = pick_next(&mut k);
    if next == cur {
        return;
    }
    // SAFETY: `cur` is the context running on `k`; `next` was dequeued.
    unsafe { switch_away(k, cur, next) };
}

/// Moves due timers of `owner` into the runqueue of `k`.
pub(crate) fn fire_timers_locally(k: &Owner<'_>, owner: &KThread) -> usize {
    fire_timers(owner, |u| k.push(u))
}

/// Makes the uthreads whose timers on `owner` are due runnable through
/// `sink`; how many.
pub(crate) fn fire_timers(owner: &KThread, mut sink: impl FnMut(URef)) -> usize {
    owner.timers.fire_due(
        || owner.rt().now_ns(),
        // SAFETY: taken off the heap, so exactly once.
        |entry| match unsafe { timer_target(entry) } {
            Some(u) => {
                sink(u);
                true
            }
            None => false,
        },
    )
}

// ---- operations used by uthreads -------------------------------------------

/// The running uthread, if the caller is a uthread (kept where it is by
/// `deferred`).
pub(crate) fn current_uthread(deferred: &preempt::Guard) -> Option<URef> {
    let k = Owner::current(deferred)?;
    let cur = k.current.get();
    if cur == k.sched_ptr() || cur.is_null() {
        None
    } else {
        NonNull::new(cur).map(URef)
    }
}

/// Suspends the running uthread, which the caller has put on a wait queue
/// while `deferred` kept it from being preempted; returns after someone
/// [`wake`]s it.
pub(crate) fn park_current(deferred: &preempt::Guard) {
    let k = Owner::current(deferred).expect("park_current outside a kthread");
    schedule_away(k);
}

/// Makes `u` runnable: on the caller's runqueue when it is a kthread of the
/// same runtime, on the runtime's shared queue otherwise.
pub(crate) fn wake(u: URef) {
    let deferred = preempt::Guard::new();
    // SAFETY: `u` is a live uthread in no queue (the caller just took it off one).
    let rt_ptr = unsafe { (*u.ptr()).rt };
    // SAFETY: the runtime outlives its uthreads' wake-ups (run() waits for main).
    let rt = unsafe { &*rt_ptr };
    if rt.mode == Mode::Worker {
        // Only the dispatcher decides where a request runs.
        rt.injector.push(u);
        return;
    }
    match Owner::current(&deferred).filter(|k| k.rt == rt_ptr) {
        Some(k) => k.push(u),
        None => rt.push_injector(u),
    }
    rt.notify_one();
}

/// Cooperative yield: the running uthread goes to the back of its runqueue.
pub fn yield_now() {
    let deferred = preempt::Guard::new();
    let Some(k) = Owner::current(&deferred) else {
        std::thread::yield_now();
        return;
    };
    if k.current.get() != k.sched_ptr() {
        requeue_and_leave(k);
    }
}

/// Puts the running uthread back where it can run again and leaves it:
/// Shenango mode, at the back of the local runqueue (stealable); worker
/// mode, back to the dispatcher through the worker loop.
fn requeue_and_leave(k: Owner<'_>) {
    let cur = k.current.get();
    match k.mode {
        Mode::Shenango => {
            // SAFETY: `cur` is the running uthread, so not null.
            k.push(URef(unsafe { NonNull::new_unchecked(cur) }));
            schedule_away(k);
        }
        Mode::Worker => {
            k.yielded.set(cur);
            let to = k.sched_ptr();
            // SAFETY: `cur` runs on `k`; the worker loop takes it from `yielded`.
            unsafe { switch_away(k, cur, to) };
        }
    }
}

/// Suspends the running uthread for at least `duration`. Outside a runtime
/// it sleeps the OS thread.
pub fn sleep(duration: Duration) {
    if duration.is_zero() {
        return yield_now();
    }
    sleep_until(Instant::now() + duration);
}

/// Suspends the running uthread until `deadline` has passed. Outside a
/// runtime it sleeps the OS thread.
pub fn sleep_until(deadline: Instant) {
    let deferred = preempt::Guard::new();
    let Some(cur) = current_uthread(&deferred) else {
        drop(deferred);
        return std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
    };
    let k = Owner::current(&deferred).expect("a uthread runs on a kthread");
    add_timer(&k, deadline, cur.ptr() as usize);
    // The uthread sits in the timer heap.
    schedule_away(k);
}

/// Adds a timer entry (a uthread's address, or a tagged `Arc<Waiter>`) to
/// `k`'s heap.
fn add_timer(k: &Owner<'_>, deadline: Instant, entry: usize) {
    let since_epoch = deadline.saturating_duration_since(k.rt().epoch);
    // Round up: a timer fires at the first check at or past its deadline.
    let deadline = (since_epoch.as_nanos() + 1).min(u64::MAX as u128) as u64;
    k.timers.add(deadline, entry);
    if !k.runqueue().is_empty() {
        // We go on running other uthreads; someone idle should watch the timer.
        k.rt().watch_timers_of(k);
    }
}

/// Low bit of a timer entry that is an `Arc<Waiter>` (addresses of uthreads
/// and waiters are at least 8-aligned).
const TIMER_WAITER: usize = 1;

const WAITER_WAITING: u8 = 0;
const WAITER_WOKEN: u8 = 1;
const WAITER_TIMED_OUT: u8 = 2;

/// A uthread waiting with a timeout, on a wait queue and in a timer heap at
/// once: whoever claims it first (a waker, or the timer) makes it runnable,
/// the other finds it claimed and leaves it alone.
pub(crate) struct Waiter {
    u: URef,
    state: AtomicU8,
}

// SAFETY: `u` is only read (a copy) and handed to `wake` by the single
// winner of the `state` claim.
unsafe impl Sync for Waiter {}

impl Waiter {
    pub(crate) fn new(u: URef) -> Arc<Waiter> {
        Arc::new(Waiter {
            u,
            state: AtomicU8::new(WAITER_WAITING),
        })
    }

    /// Makes the uthread runnable unless the timer did already; true if
    /// this call woke it.
    pub(crate) fn wake(&self) -> bool {
        let won = self
            .state
            .compare_exchange(WAITER_WAITING, WAITER_WOKEN, AcqRel, Acquire)
            .is_ok();
        if won {
            wake(self.u);
        }
        won
    }

    /// The timer fired first.
    pub(crate) fn timed_out(&self) -> bool {
        self.state.load(Acquire) == WAITER_TIMED_OUT
    }
}

/// The uthread a popped timer entry makes runnable, if any.
///
/// # Safety
/// `entry` was in a timer heap and has just been taken off it.
unsafe fn timer_target(entry: usize) -> Option<URef> {
    if entry & TIMER_WAITER == 0 {
        return Some(URef(
            NonNull::new(entry as *mut UThread).expect("null timer entry"),
        ));
    }
    // SAFETY: tagged entries are made by `Arc::into_raw` in
    // `park_current_until`; the caller took this one off the heap, once.
    let w = unsafe { Arc::from_raw((entry & !TIMER_WAITER) as *const Waiter) };
    w.state
        .compare_exchange(WAITER_WAITING, WAITER_TIMED_OUT, AcqRel, Acquire)
        .is_ok()
        .then_some(w.u)
}

/// Suspends the running uthread, which the caller has put on a wait queue
/// as `w` with preemption deferred, until `w` is woken or `deadline`
/// passes (then [`Waiter::timed_out`]; the caller takes `w` off its queue).
pub(crate) fn park_current_until(deferred: &preempt::Guard, w: &Arc<Waiter>, deadline: Instant) {
    let k = Owner::current(deferred).expect("park_current_until outside a kthread");
    debug_assert_eq!(k.current.get(), w.u.ptr());
    let entry = Arc::into_raw(Arc::clone(w)) as usize;
    debug_assert_eq!(entry & TIMER_WAITER, 0);
    add_timer(&k, deadline, entry | TIMER_WAITER);
    // The uthread is on a wait queue and in the heap.
    schedule_away(k);
}

/// Runs `f` on the transmit side of the calling kthread's packet rings,
/// with preemption deferred, if the caller runs on a kthread of `rt` with
/// networking. `f` must not switch (it cannot: it has no token to give up).
pub(crate) fn with_current_knet<R>(rt: &Shared, f: impl FnOnce(&mut TxSide<'_>) -> R) -> Option<R> {
    let deferred = preempt::Guard::new();
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

/// Spawns a uthread on the runtime `rt` that runs `entry`.
pub(crate) fn spawn_erased(rt: *const Shared, entry: Entry) {
    wake(UThread::new_boxed(rt, entry));
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

/// Whether a uthread (not the scheduler) is running on this kthread.
pub(crate) fn current_uthread_unchecked_is_some() -> bool {
    current_kthread_ref().is_some_and(|k| k.current.get() != k.sched_ptr())
}

/// If `addr` is in the guard page of the running uthread's stack: the
/// kthread id and the stack's usable size.
pub(crate) fn guard_page_hit(addr: usize) -> Option<(usize, usize)> {
    let k = current_kthread_ref()?;
    let cur = k.current.get();
    if cur.is_null() || cur == k.sched_ptr() {
        return None;
    }
    // SAFETY: the running uthread's stack is not modified while it runs.
    let stack = unsafe { (*(*cur).stack.get()).as_ref() }?;
    let (lo, hi) = stack.guard_range();
    (lo..hi)
        .contains(&addr)
        .then(|| (k.id, stack.usable_size()))
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
    KTHREAD.with(|c| c.set(k));
    k.current.set(k.sched_ptr());
    preempt::set_current_state(&k.sched.preempt);
    // SAFETY: this is `k`'s own thread, in its scheduler context.
    let mut owner = unsafe { Owner::for_scheduler(k) };
    if let Some(io) = &k.io {
        owner.send_to_iokernel(ginza_shm::ToIokernel::Started {
            tid: k.tid.load(SeqCst) as u32,
        });
        // iokerneld counts every kthread parked until it grants it a core.
        crate::iokernel::wait_for_grant(&owner, io);
    }

    body(&mut owner);

    preempt::set_current_state(null());
    KTHREAD.with(|c| c.set(null()));
    k.tid.store(0, SeqCst);
}

/// What a kthread runs in its scheduler context: the Shenango scheduler
/// loop (`idle::scheduler_loop`) or the Shinjuku worker loop
/// (`shinjuku::worker`).
pub(crate) type KthreadBody = Arc<dyn Fn(&mut Owner<'_>) + Send + Sync>;

/// How a request context gave its worker back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Stopped {
    /// It returned (and is freed).
    Exited,
    /// It yielded: preempted, cooperatively or by the signal.
    Yielded,
    /// It waits on a wait queue or a timer; its waker hands it to the
    /// dispatcher.
    Blocked,
}

/// Worker mode: runs `u`, which the dispatcher handed to `k` alone, until
/// it gives the worker back. `k` is the scheduler context's token.
pub(crate) fn run_on_worker(k: &mut Owner<'_>, u: URef) -> Stopped {
    let u = u.ptr();
    k.yielded.set(null_mut());
    let from = k.sched_ptr();
    // SAFETY: the dispatcher handed `u` to us alone; we are in the
    // scheduler context, which resumes on this kthread.
    unsafe { switch_to(k, from, u) };
    let exited = k.exited.get() == u;
    finish_switch(); // frees `u` if it exited
    if exited {
        Stopped::Exited
    } else if k.yielded.replace(null_mut()) == u {
        Stopped::Yielded
    } else {
        Stopped::Blocked
    }
}

/// Worker mode: blocks the idle kthread `k` on its eventfd, unless
/// `still_idle` says otherwise once `k` is marked parked, until
/// [`wake_if_parked`] or its next timer.
pub(crate) fn park_worker(k: &KThread, still_idle: impl Fn() -> bool) {
    k.state.store(PARKED, SeqCst);
    fence(SeqCst);
    if still_idle() && !k.rt().shutdown.load(SeqCst) {
        bump(&k.stats.parks);
        eventfd_wait(k, k.timers.next_deadline());
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

/// Worker mode: request contexts whose sleep on worker `k` is over go back
/// to the dispatcher. Called by the idle worker and by the dispatcher (a
/// busy worker cannot), and every 32nd pass through a worker's `pick_next`.
pub(crate) fn fire_timers_to_dispatcher(k: &KThread) {
    let rt = k.rt();
    fire_timers(k, |u| rt.injector.push(u));
}

/// Test hook: the calling kthread's next pass through `pick_next` takes
/// its periodic check (timers, packets). Called with preemption deferred.
pub(crate) fn check_timers_at_next_switch() {
    if let Some(k) = current_kthread_ref() {
        k.tick.set(31);
    }
}

/// A uthread that is not queued anywhere yet (the dispatcher holds it).
pub(crate) fn new_unqueued(rt: *const Shared, entry: Entry) -> URef {
    UThread::new_boxed(rt, entry)
}

/// Processes a batch of `ring`'s ingress ring as the owner's kthread
/// (nothing if another kthread is processing it); the frames taken.
/// Uthreads woken by datagrams land on the owner's runqueue.
#[inline]
pub(crate) fn poll_net(owner: &mut Owner<'_>, ring: &KThread) -> usize {
    let (Some(theirs), Some(stack)) = (ring.knet(), owner.kthread().rt().stack()) else {
        return 0;
    };
    let Some(mut me) = owner.tx_side() else {
        return 0;
    };
    stack.poll(&mut me, theirs, crate::net::POLL_BATCH)
}

/// Asks kthread `id` to give up its core: a preemption signal makes it save
/// its uthread where others can steal it, and park until [`grant`].
pub(crate) fn revoke(rt: &Shared, id: usize) -> std::io::Result<()> {
    let k = &rt.kthreads[id];
    k.revoke_requested.store(true, SeqCst);
    k.preempt_flag.store(true, SeqCst);
    let tid = k.tid.load(SeqCst);
    if tid != 0 {
        crate::signals::send_preempt(tid)?;
    }
    Ok(())
}

pub(crate) fn grant(rt: &Shared, id: usize) {
    let k = &rt.kthreads[id];
    k.revoke_requested.store(false, SeqCst);
    k.preempt_flag.store(false, SeqCst);
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
