//! Preemption: the per-context deferral count, and the entry points that
//! preempt the running uthread (the signal handler's body, a deferred
//! preemption applied at the end of its section, and `preempt_point`).
//!
//! Every execution context (each uthread, and each kthread's scheduler) owns a
//! [`PreemptState`]. Its `count` is raised around sections that must not be
//! preempted: the scheduler, per-kthread state, allocator calls, and an
//! application's [`without_preemption`]. A preemption signal that arrives
//! while the count is non-zero only sets `pending`; the section's end applies
//! it.
//!
//! The count belongs to the context, not to the kthread, because a uthread
//! preempted between reading "where am I" and raising the count may resume on
//! another kthread: raising its own count stays correct there. Only the
//! signal handler on the same thread ever races with these updates, so plain
//! load/store pairs suffice (no locked instructions) with compiler fences to
//! keep the section's body inside.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{
    compiler_fence, AtomicBool, AtomicU32, Ordering::Relaxed, Ordering::SeqCst,
};

use crate::sched::{self, Mode, URef};

#[derive(Default)]
pub(crate) struct PreemptState {
    pub(crate) count: AtomicU32,
    pub(crate) pending: AtomicBool,
}

impl PreemptState {
    pub(crate) const fn new(count: u32) -> Self {
        PreemptState {
            count: AtomicU32::new(count),
            pending: AtomicBool::new(false),
        }
    }
}

thread_local! {
    /// The running context's preemption state; null on threads that are not
    /// kthreads. Read with a single thread-pointer-relative load, so the read
    /// itself cannot straddle a migration.
    static CURRENT: Cell<*const PreemptState> = const { Cell::new(std::ptr::null()) };
}

#[inline(always)]
pub(crate) fn current_state() -> *const PreemptState {
    CURRENT.with(|c| c.get())
}

/// Makes `state` the running context's; called only with preemption deferred
/// in both the old and the new context.
#[inline(always)]
pub(crate) fn set_current_state(state: *const PreemptState) {
    CURRENT.with(|c| c.set(state));
}

/// Raises the running context's count; returns the state to pass to
/// [`enable`] (null outside the runtime, where both are no-ops).
#[inline(always)]
pub(crate) fn disable() -> *const PreemptState {
    let state = current_state();
    if !state.is_null() {
        // SAFETY: a non-null CURRENT points to the running context's state,
        // which lives as long as the context (it is this very context).
        let count = unsafe { &(*state).count };
        count.store(count.load(Relaxed) + 1, Relaxed);
        compiler_fence(SeqCst);
    }
    state
}

/// Lowers the count raised by [`disable`]; applies a preemption that arrived
/// meanwhile.
#[inline(always)]
pub(crate) fn enable(state: *const PreemptState) {
    if state.is_null() {
        return;
    }
    compiler_fence(SeqCst);
    // SAFETY: `state` came from `disable` in this same context and the
    // context is still alive (it is running this code).
    let st = unsafe { &*state };
    let left = st.count.load(Relaxed) - 1;
    st.count.store(left, Relaxed);
    compiler_fence(SeqCst);
    if left == 0 && st.pending.load(Relaxed) {
        apply_pending_preemption(state);
    }
}

/// RAII form of [`disable`]/[`enable`].
pub(crate) struct Guard(*const PreemptState);

impl Guard {
    #[inline(always)]
    pub(crate) fn new() -> Guard {
        Guard(disable())
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        enable(self.0);
    }
}

/// Runs `f` with preemption deferred: a preemption signal that arrives inside
/// is applied when `f` returns. Outside a Ginza runtime it just runs `f`.
pub fn without_preemption<R>(f: impl FnOnce() -> R) -> R {
    let _guard = Guard::new();
    f()
}

// ---- the preemption entry points (docs/runtime.md, Preemption) ----------------

/// A preemption point: if a preemption was requested for this kthread (the
/// Shinjuku dispatcher's quantum expired, or the core is being revoked) and
/// the caller is not in a deferred section, yield now. Cheap enough for the
/// inner loop of a long request: one call and one load when nothing is asked.
#[inline]
pub fn preempt_point() {
    let k = sched::current_kthread();
    // SAFETY: a non-null kthread of this thread; reading an atomic flag.
    if !k.is_null() && unsafe { &*k }.preempt_flag.load(Relaxed) {
        preempt_point_slow();
    }
}

#[cold]
fn preempt_point_slow() {
    let state = current_state();
    // SAFETY: the running context's state.
    if state.is_null() || unsafe { (*state).count.load(Relaxed) } != 0 {
        return; // deferred: the next point after the section takes it
    }
    if let Some(k) = sched::current_kthread_ref() {
        if k.mode == Mode::Worker {
            sched::bump(&k.stats.coop_preemptions);
        }
    }
    sched::yield_now();
}

/// A preemption signal arrived while preemption was deferred in this
/// context; the section has ended, so apply it now.
pub(crate) fn apply_pending_preemption(state: *const PreemptState) {
    // SAFETY: `state` is the running context's (preempt::enable's caller).
    unsafe { (*state).pending.store(false, Relaxed) };
    if sched::current_uthread_unchecked_is_some() {
        if let Some(k) = sched::current_kthread_ref() {
            sched::bump(&k.stats.preemptions);
        }
        sched::yield_now();
    }
}

/// Body of the preemption signal handler (runs on the interrupted stack).
pub(crate) fn preempt_from_signal() {
    let state = current_state();
    let Some(k) = sched::current_kthread_ref() else {
        return;
    };
    if state.is_null() {
        return;
    }
    if k.mode == Mode::Worker && !k.preempt_flag.load(Relaxed) {
        // A late signal for a request that has finished meanwhile.
        return;
    }
    if k.rt().managed() {
        // iokerneld's request is the PREEMPT_PENDING flag of the queue
        // line; a signal without it is late (the kthread parked meanwhile).
        match &k.io {
            Some(io) if io.preempt_pending() => k.revoke_requested.store(true, SeqCst),
            _ => return,
        }
    }
    // SAFETY: CURRENT points to the interrupted context's state.
    let st = unsafe { &*state };
    if st.count.load(Relaxed) != 0 {
        st.pending.store(true, Relaxed);
        return;
    }
    // Interrupted uthread code outside any deferred section (the scheduler's
    // count never drops to zero). Allocation is a deferred section, so the
    // runqueue push below cannot re-enter an interrupted allocator.
    st.count.store(1, Relaxed);
    sched::bump(&k.stats.preemptions);
    loop {
        // SAFETY: the count stays raised (above) until after the loop.
        let k = unsafe { sched::Owner::current_deferred() };
        let cur = k.current.get();
        let worker = k.mode == Mode::Worker;
        if worker {
            k.yielded.set(cur);
        } else {
            // SAFETY: `cur` is the interrupted uthread, so not null; it is
            // stealable by others once its registers are saved.
            k.push(URef::from_nonnull(unsafe { NonNull::new_unchecked(cur) }));
            k.rt().notify_one();
        }
        let to = k.sched_ptr();
        // SAFETY: `cur` runs on `k`; the scheduler (or worker loop) decides
        // what happens next.
        unsafe { sched::switch_away(k, cur, to) };
        if worker {
            break; // the dispatcher re-decides on every resumption
        }
        // Resumed, maybe elsewhere. A request that arrived while we were
        // switching in is honoured before returning to the interrupted code.
        let here = sched::current_kthread_ref().expect("a uthread resumes on a kthread");
        if !st.pending.swap(false, Relaxed) && !here.revoke_requested.load(Relaxed) {
            break;
        }
    }
    st.count.store(0, Relaxed);
}
