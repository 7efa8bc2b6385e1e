//! The per-context preemption-deferral count: the lowest piece of the
//! runtime (it imports nothing of the crate but `thread_word`), used by
//! the allocator, the spinlock, the timers and the scheduler. What preempts
//! a uthread (the signal handler's body, a preemption applied at the end of
//! its deferred section, `preempt_point`) is in `preempt.rs`, above the
//! scheduler; a section's end reaches it through the hook that
//! `preempt::install` sets.
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
use std::sync::atomic::{
    compiler_fence, AtomicBool, AtomicU32, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::OnceLock;

use crate::thread_word::ThreadWord;

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
    /// kthreads. Read only through [`current_state`].
    static CURRENT: Cell<*const PreemptState> = const { Cell::new(std::ptr::null()) };
}

static CURRENT_WORD: ThreadWord = ThreadWord::new();

/// The running context's state, read in one instruction (`thread_word.rs`:
/// a uthread moved between finding CURRENT and reading it would get the
/// first kthread's context).
#[inline(always)]
pub(crate) fn current_state() -> *const PreemptState {
    CURRENT_WORD.read(&CURRENT)
}

/// Makes `state` the running context's; called only with preemption deferred
/// in both the old and the new context.
#[inline(always)]
pub(crate) fn set_current_state(state: *const PreemptState) {
    CURRENT.with(|c| c.set(state));
}

/// A kthread starts in its scheduler context, whose state is `sched`.
pub(crate) fn start_kthread(sched: *const PreemptState) -> Result<(), &'static str> {
    CURRENT_WORD.locate(&CURRENT)?;
    set_current_state(sched);
    Ok(())
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
        apply_pending(state);
    }
}

/// Applies a preemption that arrived inside a deferred section of the
/// context that owns `state`: `preempt::apply_pending_preemption`, set by
/// `preempt::install` before the handler that marks one pending exists.
static APPLY_PENDING: OnceLock<fn(*const PreemptState)> = OnceLock::new();

/// Sets what the end of a deferred section calls when a preemption is
/// pending (once per process; later calls keep the first).
pub(crate) fn set_apply_pending(apply: fn(*const PreemptState)) {
    let _ = APPLY_PENDING.set(apply);
}

#[cold]
fn apply_pending(state: *const PreemptState) {
    if let Some(apply) = APPLY_PENDING.get() {
        apply(state);
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
