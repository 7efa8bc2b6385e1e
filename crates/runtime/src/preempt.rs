//! Preemption: the entry points that preempt the running uthread (the
//! signal handler's body, a preemption deferred to the end of its section,
//! and `preempt_point`), and [`install`], which wires them to the signal
//! handlers and to the deferral count (`deferral.rs`, which sits below the
//! scheduler and so cannot call it directly).

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};

use crate::deferral::{current_state, PreemptState};
use crate::sched::{self, Mode, URef};
use crate::signals;
use ginza_sys::tsc_clock::ticks;

/// Installs the preemption entry points: the signal handlers (preemption,
/// and the stack-overflow report, which asks the scheduler about guard
/// pages) and what ends a deferred section with a preemption pending.
/// Idempotent; called before any kthread starts.
pub(crate) fn install() -> io::Result<()> {
    crate::deferral::set_apply_pending(apply_pending_preemption);
    signals::install(preempt_from_signal, sched::guard_page_hit)
}

// ---- the preemption entry points (docs/runtime.md, Preemption) ----------------

/// A preemption point: if a preemption was requested for this kthread (the
/// Shinjuku dispatcher's quantum expired, or the core is being revoked) and
/// the caller is not in a deferred section, yield now. Cheap enough for the
/// inner loop of a long request: one call and one load when nothing is asked.
#[inline]
pub fn preempt_point() {
    let k = sched::current_kthread();
    if k.is_null() {
        return;
    }
    // SAFETY: a non-null kthread of this thread; reading atomic flags.
    let k = unsafe { &*k };
    // A kthread woken onto this CPU waits for us (docs/runtime.md, "Local
    // wakes"); answered before any yield.
    crate::iokernel::answer_doorbell(k);
    // A worker whose requests iokerneld dispatches is asked through its
    // queue line (docs/colocate.md).
    // An in-process dispatcher's ask names the run it is for: one for a
    // run that has ended (it raced with the worker's switch to this run)
    // does not stop this one (docs/runtime.md, "Shinjuku mode").
    // The time slicer's ask (slicer.rs) too: a point is a safe place to
    // take it, where its signal may have found none.
    if k.preempt_ask.asks(k.run_stamp.get())
        || k.slice_asked.load(Relaxed)
        || (k.mode == Mode::Worker && k.io.as_ref().is_some_and(|io| io.yield_asked()))
    {
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
            if k.spans.on.get() {
                let now = ticks();
                let asked = k.preempt_ask.asked_ticks();
                if asked != 0 {
                    k.spans.observe.add(now.saturating_sub(asked));
                }
                k.spans.seen.set(now);
            }
        }
    }
    clear_slice_ask();
    sched::yield_now();
    // Resumed (maybe on another worker): the switch into this request ends.
    if let Some(k) = sched::current_kthread_ref() {
        let since = k.spans.switched_in.get();
        if k.mode == Mode::Worker && k.spans.on.get() && since != 0 {
            k.spans.switch_in.add(ticks().saturating_sub(since));
        }
    }
}

/// The slicer's ask is answered by the yield that follows.
fn clear_slice_ask() {
    if let Some(k) = sched::current_kthread_ref() {
        k.slice_asked.store(false, Relaxed);
    }
}

/// A preemption signal arrived while preemption was deferred in this
/// context; the section has ended, so apply it now (called by
/// `deferral::enable`, through the hook [`install`] sets).
fn apply_pending_preemption(state: *const PreemptState) {
    // SAFETY: `state` is the running context's (`deferral::enable`'s caller).
    unsafe { (*state).pending.store(false, Relaxed) };
    if sched::current_uthread_unchecked_is_some() {
        if let Some(k) = sched::current_kthread_ref() {
            // A signal that landed while the request was already yielding
            // stays pending in its context; applied at its next run, it
            // would stop a run nobody asked to stop (and let the worker
            // take the request pre-assigned behind it).
            if worker_not_asked(k) {
                return;
            }
            sched::bump(&k.stats.preemptions);
        }
        sched::yield_now();
    }
}

/// A Shinjuku worker whose dispatcher (in process or iokerneld) has not
/// asked its running request to stop: a preemption signal now is late.
fn worker_not_asked(k: &sched::KThread) -> bool {
    k.mode == Mode::Worker
        && !k.preempt_ask.asks(k.run_stamp.get())
        && !k.io.as_ref().is_some_and(|io| io.yield_asked())
}

/// Body of the preemption signal handler (runs on the interrupted stack).
fn preempt_from_signal() {
    let state = current_state();
    let Some(k) = sched::current_kthread_ref() else {
        return;
    };
    if state.is_null() {
        return;
    }
    if worker_not_asked(k) {
        // A late signal for a request that has finished meanwhile.
        return;
    }
    if k.rt().managed() {
        // iokerneld's request is the PREEMPT_PENDING flag of the queue
        // line; a signal without it is late (the kthread parked meanwhile).
        match &k.io {
            Some(io) if io.preempt_pending() => k.revoke_requested.store(true, SeqCst),
            // iokerneld's backstop (docs/colocate.md): a dispatched request
            // asked to yield that has not; the worker keeps its core.
            Some(io) if k.mode == Mode::Worker && io.yield_asked() => {}
            // The time slicer's (slicer.rs): the uthread makes way, the
            // kthread keeps its core.
            _ if k.slice_asked.swap(false, SeqCst) => {}
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
    // Deferred: a signal from here on only leaves a note (`pending`).
    signals::unblock_preempt();
    sched::bump(&k.stats.preemptions);
    // Answered: the slicer need not ask again (slicer.rs).
    k.slice_asked.store(false, Relaxed);
    loop {
        // SAFETY: the count stays raised (above) until after the loop.
        let k = unsafe { sched::Owner::current_deferred() };
        let cur = k.current.get();
        let worker = k.mode == Mode::Worker;
        if worker {
            k.yielded.set(cur);
        } else {
            // Sleepers whose time has come go first: the scheduler pops the
            // runqueue before it looks at timers, and a time slice is asked
            // for them as much as for queued uthreads (slicer.rs).
            sched::fire_timers_locally(&k, &k, || k.rt().now_ns());
            // So does what waits on the shared queue (made runnable outside
            // the kthreads): the scheduler steals from it only once the
            // runqueue is empty, which a time-sliced spinner never lets
            // it be.
            if let Some(u) = k.take_injected() {
                u.note_taken();
                k.push(u);
            }
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
