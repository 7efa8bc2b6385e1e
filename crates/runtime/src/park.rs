//! Parking for code outside the runtime that builds its own blocking
//! primitives (the preload library's pthread mutexes, condvars, semaphores):
//! suspend the caller — a uthread, or an ordinary thread — until an
//! [`Unparker`] is used or a deadline passes.
//!
//! The caller keeps its waiters in its own structure (a queue keyed by an
//! address, say). [`park_until`] hands it the caller's `Unparker` with
//! preemption deferred, so "check the condition, then queue" under the
//! caller's lock is atomic with respect to wakers who take the same lock.
//! Exactly one of a waker and the deadline wins; the loser sees it (the
//! waker's [`Unparker::unpark`] returns false, the timed-out parker removes
//! itself from its queue).

use std::sync::atomic::{AtomicU32, Ordering::AcqRel, Ordering::Acquire};
use std::sync::Arc;
use std::time::Instant;

use crate::deferral;
use crate::sched::{self, URef, Waiter};

/// How a [`park_until`] ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Parked {
    /// An [`Unparker::unpark`] woke it.
    Woken,
    /// The deadline passed first; the caller still has its `Unparker`
    /// queued and must take it off.
    TimedOut,
    /// `enqueue` said not to wait.
    Declined,
}

/// The right to wake one parked caller. Cloned to keep an identity for
/// [`Unparker::same`].
#[derive(Clone)]
pub struct Unparker(Kind);

#[derive(Clone)]
enum Kind {
    /// A uthread parked without a deadline: only the one waker that takes
    /// it off the caller's queue can wake it, so no claim is needed (and
    /// nothing is allocated per wait).
    UThread(URef),
    /// A uthread parked until a deadline: the waker and the timer race
    /// for the claim.
    TimedUThread(Arc<Waiter>),
    Thread(Arc<ThreadWaiter>),
}

/// An ordinary thread's wait: a futex word, not `std::thread::park`, whose
/// thread handle is made on first use with an allocation that may itself
/// wait here (a program's malloc taking a pthread mutex of the preload
/// library), which std refuses as re-entrant.
struct ThreadWaiter {
    state: AtomicU32,
}

const WAITING: u32 = 0;
const WOKEN: u32 = 1;
const TIMED_OUT: u32 = 2;

impl Unparker {
    /// Makes the parked caller runnable; false if it was already woken or
    /// its deadline passed first.
    pub fn unpark(&self) -> bool {
        match &self.0 {
            Kind::UThread(u) => {
                sched::wake(*u);
                true
            }
            Kind::TimedUThread(w) => w.wake(),
            Kind::Thread(t) => {
                let won = t
                    .state
                    .compare_exchange(WAITING, WOKEN, AcqRel, Acquire)
                    .is_ok();
                if won {
                    let _ = ginza_sys::futex::wake_private(&t.state);
                }
                won
            }
        }
    }

    /// Whether both name the same wait.
    pub fn same(&self, other: &Unparker) -> bool {
        match (&self.0, &other.0) {
            (Kind::UThread(a), Kind::UThread(b)) => a == b,
            (Kind::TimedUThread(a), Kind::TimedUThread(b)) => Arc::ptr_eq(a, b),
            (Kind::Thread(a), Kind::Thread(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Parks the caller until it is unparked or `deadline` passes. `enqueue`
/// runs first, with preemption deferred: it stores the `Unparker` where
/// wakers will find it and returns true to wait, or false to return
/// [`Parked::Declined`] at once.
pub fn park_until(deadline: Option<Instant>, enqueue: impl FnOnce(Unparker) -> bool) -> Parked {
    let deferred = deferral::Guard::new();
    match sched::current_uthread(&deferred) {
        Some(me) => match deadline {
            None => {
                if !enqueue(Unparker(Kind::UThread(me))) {
                    return Parked::Declined;
                }
                sched::park_current(&deferred);
                Parked::Woken
            }
            Some(d) => {
                let w = Waiter::new(me);
                if !enqueue(Unparker(Kind::TimedUThread(Arc::clone(&w)))) {
                    return Parked::Declined;
                }
                sched::park_current_until(&deferred, &w, d);
                if w.timed_out() {
                    Parked::TimedOut
                } else {
                    Parked::Woken
                }
            }
        },
        None => {
            drop(deferred);
            let t = Arc::new(ThreadWaiter {
                state: AtomicU32::new(WAITING),
            });
            if !enqueue(Unparker(Kind::Thread(Arc::clone(&t)))) {
                return Parked::Declined;
            }
            loop {
                if t.state.load(Acquire) == WOKEN {
                    return Parked::Woken;
                }
                match deadline {
                    None => {
                        let _ = ginza_sys::futex::wait_private(&t.state, WAITING, None);
                    }
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            if t.state
                                .compare_exchange(WAITING, TIMED_OUT, AcqRel, Acquire)
                                .is_ok()
                            {
                                return Parked::TimedOut;
                            }
                            continue; // woken just now
                        }
                        let _ = ginza_sys::futex::wait_private(&t.state, WAITING, Some(d - now));
                    }
                }
            }
        }
    }
}
