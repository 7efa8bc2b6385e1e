//! The scheduler: what a uthread asks of it (yield, sleep, park, wake,
//! timed waits), choosing the next context, timer entries, and what a
//! Shinjuku worker needs (`run_on_worker`). Its parts, one mechanism a file:
//! `uthread.rs` (uthreads, the switch, the uthread and stack caches) and,
//! below it, `kthread.rs` (kthreads, the owner token, the runtime's shared
//! state, eventfd park and notify, and the uthread context's types, which
//! point into that state). The preemption entry points are in
//! `preempt.rs`; the Shenango scheduler loop in `shenango.rs`; the
//! Shinjuku worker loop in `shinjuku/worker.rs`.
//!
//! Invariants that keep switching safe:
//! * A context is only ever switched out and in with its preemption count
//!   raised (a new uthread starts at 1, the scheduler context stays at 1,
//!   a preempted uthread is raised by the signal handler). So a signal that
//!   lands mid-switch is always deferred.
//! * A uthread may be pushed to a runqueue *before* it has finished
//!   switching out (that is how yield and wake-ups stay cheap). Whoever pops
//!   it waits for its `on_cpu` flag, which the switch clears only after the
//!   registers are saved. Only a scheduler context waits so: a uthread
//!   leaving for one still switching out goes through its scheduler
//!   instead ([`pick_next`]), since two kthreads each switching to the
//!   uthread the other is leaving would wait for each other forever.
//! * Per-kthread state is reached through [`current_kthread`], never through
//!   a thread-local address a caller might have cached across a switch, and
//!   only with preemption deferred; owner-only state only through an
//!   [`Owner`] token, which never outlives a switch (docs/runtime.md,
//!   "Owner-only state and the owner token").

mod kthread;
mod uthread;

pub use kthread::current_kthread_id;
pub(crate) use kthread::*;
pub use uthread::current_uthread_stack;
pub(crate) use uthread::*;

use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{
    AtomicU8,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::deferral;

/// The next context for `k`: a local uthread, or the scheduler when the
/// runqueue is empty or the kthread must stop.
pub(super) fn pick_next(owner: &mut Owner<'_>) -> *mut UThread {
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
        fire_timers_locally(owner, k, || rt.now_ns());
        // Nor its packets (a kthread that never runs dry would not poll).
        if k.io.is_some() {
            poll_net(owner, k);
        }
        poll_events(k);
        // Nor work made runnable outside the kthreads, on the shared
        // queue: behind a runqueue that never drains (a time-sliced
        // uthread that spins) it would wait for ever. It queues behind
        // what is here.
        if let Some(u) = owner.take_injected() {
            u.note_taken();
            owner.push(u);
        }
        k.publish_busy(true);
    }
    match owner.pop() {
        // Still switching out on another kthread: waiting for it here,
        // with our own context unsaved, could wait forever — that kthread
        // may be waiting just so for ours (each switching to the uthread
        // the other is leaving). The scheduler context waits for it instead.
        Some(u) if u.ptr() != k.current.get() && u.still_switching_out() => {
            u.note_taken();
            owner.push(u);
            k.sched_ptr()
        }
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
        // Woken before it could leave: it took itself off the queue.
        // SAFETY: `cur` is the running uthread, so not null.
        URef(unsafe { NonNull::new_unchecked(cur) }).note_taken();
        return;
    }
    // SAFETY: `cur` is the context running on `k`; `next` was dequeued.
    unsafe { switch_away(k, cur, next) };
}

/// The time of one turn of a scheduler loop, read at its first need and
/// then shared by what the turn looks at (the timers of every kthread, the
/// spin, the idle poller): one clock read a turn, not one for each.
#[derive(Default)]
pub(crate) struct TurnClock(Option<Instant>);

impl TurnClock {
    pub(crate) fn now(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }

    /// The turn's time on `rt`'s clock (ns since its epoch).
    pub(crate) fn ns(&mut self, rt: &Shared) -> u64 {
        rt.ns_at(self.now())
    }
}

/// Moves due timers of `owner` into the runqueue of `k`, as of `now` (ns
/// since the runtime's epoch, read only if a timer is pending).
pub(crate) fn fire_timers_locally(
    k: &Owner<'_>,
    owner: &KThread,
    now: impl FnOnce() -> u64,
) -> usize {
    fire_timers(owner, now, |u| k.push(u))
}

/// Makes the uthreads whose timers on `owner` are due as of `now` (read
/// only if a timer is pending) runnable through `sink`; how many.
pub(crate) fn fire_timers(
    owner: &KThread,
    now: impl FnOnce() -> u64,
    mut sink: impl FnMut(URef),
) -> usize {
    owner.timers.fire_due(
        now,
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
pub(crate) fn current_uthread(deferred: &deferral::Guard) -> Option<URef> {
    let k = Owner::current(deferred)?;
    let cur = k.current.get();
    if cur == k.sched_ptr() || cur.is_null() {
        None
    } else {
        NonNull::new(cur).map(URef)
    }
}

/// Whether a timer entry wakes nobody any more: a timed wait whose waiter
/// was woken or withdrawn before its deadline (a waiter never waits again).
///
/// # Safety
/// `entry` is in a timer heap, looked at under that heap's lock (so it is
/// not taken off and released meanwhile).
unsafe fn timer_entry_stale(entry: usize) -> bool {
    if entry & TIMER_WAITER == 0 {
        return false;
    }
    // SAFETY: a tagged entry holds a strong count of its `Waiter` while it
    // is in the heap (`Arc::into_raw` in `park_current_until`), and the
    // caller's lock keeps it there.
    let w = unsafe { &*((entry & !TIMER_WAITER) as *const Waiter) };
    w.state.load(Acquire) != WAITER_WAITING
}

/// Drops `k`'s earliest timers while they are stale, so that its next
/// deadline is one a uthread still waits for.
pub(crate) fn drop_stale_timers(k: &KThread) {
    k.timers.drop_stale(
        // SAFETY: `drop_stale` asks about entries still in the heap, under
        // its lock.
        |entry| unsafe { timer_entry_stale(entry) },
        |entry| {
            // SAFETY: taken off the heap, once. Stale, it wakes nobody: this
            // only drops the waiter's count.
            let woke = unsafe { timer_target(entry) };
            debug_assert!(woke.is_none(), "a stale timer entry woke a uthread");
        },
    );
}

/// Suspends the running uthread, which the caller has put on a wait queue
/// while `deferred` kept it from being preempted; returns after someone
/// [`wake`]s it.
pub(crate) fn park_current(deferred: &deferral::Guard) {
    let k = Owner::current(deferred).expect("park_current outside a kthread");
    schedule_away(k);
}

/// Makes `u` runnable: on the caller's runqueue when it is a kthread of the
/// same runtime, on the runtime's shared queue otherwise.
pub(crate) fn wake(u: URef) {
    let deferred = deferral::Guard::new();
    // SAFETY: `u` is a live uthread in no queue (the caller just took it off one).
    let rt_ptr = unsafe { (*u.ptr()).rt };
    // SAFETY: the runtime outlives its uthreads' wake-ups (run() waits for main).
    let rt = unsafe { &*rt_ptr };
    if rt.mode == Mode::Worker {
        // Only the dispatcher decides where a request runs.
        rt.queue_for_dispatcher(u);
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
    let deferred = deferral::Guard::new();
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
    let deferred = deferral::Guard::new();
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
pub(super) const TIMER_WAITER: usize = 1;

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
pub(crate) fn park_current_until(deferred: &deferral::Guard, w: &Arc<Waiter>, deadline: Instant) {
    let k = Owner::current(deferred).expect("park_current_until outside a kthread");
    debug_assert_eq!(k.current.get(), w.u.ptr());
    let entry = Arc::into_raw(Arc::clone(w)) as usize;
    debug_assert_eq!(entry & TIMER_WAITER, 0);
    add_timer(&k, deadline, entry | TIMER_WAITER);
    // The uthread is on a wait queue and in the heap.
    schedule_away(k);
}

/// Spawns a uthread on the runtime `rt` that runs `entry`.
pub(crate) fn spawn_erased(rt: *const Shared, entry: Entry) {
    wake(UThread::new_boxed(rt, entry));
}

/// As [`spawn_erased`], with a stack of at least `stack_size` usable bytes.
pub(crate) fn spawn_erased_with_stack(
    rt: *const Shared,
    entry: Entry,
    stack_size: usize,
) -> std::io::Result<()> {
    // SAFETY: just made, in no queue.
    let u = unsafe { ensure_stack(UThread::new_boxed(rt, entry), stack_size)? };
    wake(u);
    Ok(())
}

/// Whether a uthread (not the scheduler) is running on this kthread.
pub(crate) fn current_uthread_unchecked_is_some() -> bool {
    current_kthread_ref().is_some_and(|k| k.current.get() != k.sched_ptr())
}

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
    run_until_stopped(k, u, false).0
}

/// As [`run_on_worker`], but a context that exited is not freed: it comes
/// back, with its stack, for the dispatcher to reuse (Shinjuku mode, where
/// the dispatcher makes every request's context).
pub(crate) fn run_on_worker_keeping(k: &mut Owner<'_>, u: URef) -> (Stopped, Option<SpareContext>) {
    run_until_stopped(k, u, true)
}

fn run_until_stopped(
    k: &mut Owner<'_>,
    u: URef,
    keep_exited: bool,
) -> (Stopped, Option<SpareContext>) {
    let u = u.ptr();
    k.yielded.set(null_mut());
    let from = k.sched_ptr();
    // SAFETY: the dispatcher handed `u` to us alone; we are in the
    // scheduler context, which resumes on this kthread.
    unsafe { switch_to(k, from, u) };
    flush_own_tx(k.kthread());
    let exited = k.exited.get() == u;
    let spare = if exited && keep_exited {
        // SAFETY: `u` exited and switched to us (it is off its CPU, its
        // stack unused) and is in no queue; taken from `exited`, so
        // `finish_switch` leaves it alone.
        unsafe { SpareContext::of_exited(k.exited.replace(null_mut())) }
    } else {
        None
    };
    finish_switch(); // frees `u` if it exited and is not kept
    let stopped = if exited {
        Stopped::Exited
    } else if k.yielded.replace(null_mut()) == u {
        Stopped::Yielded
    } else {
        Stopped::Blocked
    };
    (stopped, spare)
}

/// Worker mode: request contexts whose sleep on worker `k` is over go back
/// to the dispatcher. Called by the idle worker and by the dispatcher (a
/// busy worker cannot), and every 32nd pass through a worker's `pick_next`.
pub(crate) fn fire_timers_to_dispatcher(k: &KThread) {
    let rt = k.rt();
    fire_timers(k, || rt.now_ns(), |u| rt.queue_for_dispatcher(u));
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

/// Protected mode: processes a batch of the netstack's events (uthreads
/// they wake land on this kthread's runqueue); the events taken.
#[inline]
pub(crate) fn poll_events(k: &KThread) -> usize {
    match k.rt().event_source() {
        Some(src) => src.poll(crate::link::POLL_BATCH),
        None => 0,
    }
}

/// Processes a batch of `ring`'s ingress ring as the owner's kthread
/// (nothing if another kthread is processing it); the frames taken.
/// Uthreads woken by datagrams land on the owner's runqueue. On the
/// direct path, the replies the batch made leave in one kick.
#[inline]
pub(crate) fn poll_net(owner: &mut Owner<'_>, ring: &KThread) -> usize {
    let (Some(theirs), Some(stack)) = (ring.knet(), owner.kthread().rt().packet_stack()) else {
        return 0;
    };
    let Some(mut me) = owner.tx_side() else {
        return 0;
    };
    let sent_before = me.counters.tx_packets.load(Relaxed);
    let n = stack.poll(&mut me, theirs, crate::link::POLL_BATCH);
    let to_egress =
        me.own_socket.get().is_none() && me.counters.tx_packets.load(Relaxed) != sent_before;
    flush_own_tx(owner.kthread());
    // What the batch sent (an ACK, a SYN-ACK, a retransmission its timers
    // fired) waits on the egress ring for iokerneld, which may sleep: a
    // kthread polling while idle does not keep it awake and rings only as
    // it leaves that state, so frames sent from the polling loop itself
    // rang nothing and waited for iokerneld's next wake (1.3 s in the
    // poller test's failing runs, session 35). A kthread that is not idle
    // keeps iokerneld awake: no bell's check (its fence) for it.
    if let (true, Some(io)) = (to_egress, &owner.kthread().io) {
        if io.line.flags().contains(ginza_shm::LineFlags::IDLE_POLLING) {
            io.wake_iokernel();
        }
    }
    n
}

/// The direct path (docs/direct-path.md, "Kicks"): what the calling
/// uthread sent on the own socket leaves now if nothing else waits to run
/// on its kthread (a lone reply), not when the uthread next blocks or
/// yields: the work a program does between its send and its next wait
/// (memcached's event loop) no longer delays the answer. With uthreads
/// queued, their sends share the kick the scheduler makes after them.
pub(crate) fn flush_own_tx_if_alone() {
    let deferred = deferral::Guard::new();
    if let Some(k) = Owner::current(&deferred) {
        if k.runqueue().is_empty() {
            flush_own_tx(k.kthread());
        }
    }
}

/// The direct path (docs/direct-path.md): frames sent on the application's
/// own socket since its last kick leave now, one `sendto` for the burst.
/// Called where a burst ends: the scheduler context regains control (the
/// runqueue drained, a worker's request stopped) and after a receive batch.
#[inline]
pub(crate) fn flush_own_tx(k: &KThread) {
    if let Some(own) = k.knet().and_then(|n| n.own_socket.get()) {
        own.flush();
    }
}
