//! Blocking primitives for uthreads: a waiting uthread is suspended and its
//! kthread runs other work. Called from an ordinary thread, `Mutex::lock`
//! falls back to spinning with `yield`; `Condvar` and `WaitGroup` waits
//! require a uthread.

mod condvar;
mod mutex;
mod waitgroup;

pub use condvar::Condvar;
pub use mutex::{Mutex, MutexGuard};
pub use waitgroup::WaitGroup;

use std::collections::VecDeque;

use crate::deferral;
use crate::sched::{self, URef};
use crate::spinlock::SpinLock;

/// FIFO of suspended uthreads.
pub(crate) type WaitQueue = SpinLock<VecDeque<URef>>;

/// How a [`wait_on`] ended.
#[derive(PartialEq, Eq, Debug)]
pub(crate) enum Waited {
    /// Queued, suspended, and woken by someone who took it off the queue.
    Woken,
    /// `decide` said not to wait.
    Declined,
    /// The caller is not a uthread; nothing was done.
    NotAUthread,
}

/// Suspends the calling uthread on `queue` if `decide`, run with the queue
/// locked, says so; returns once a waker has taken it off the queue. Running
/// `decide` under the queue lock makes "check the condition, then wait"
/// atomic with respect to wakers, who take the same lock.
pub(crate) fn wait_on(queue: &WaitQueue, decide: impl FnOnce() -> bool) -> Waited {
    // Deferred from before queueing until after resuming: a preemption in
    // between would put this uthread on a runqueue too.
    let deferred = deferral::Guard::new();
    let Some(me) = sched::current_uthread(&deferred) else {
        return Waited::NotAUthread;
    };
    let mut q = queue.lock();
    if !decide() {
        return Waited::Declined;
    }
    q.push_back(me);
    drop(q);
    sched::park_current(&deferred);
    Waited::Woken
}

/// Wakes every uthread on `queue`.
pub(crate) fn wake_all(queue: &WaitQueue) {
    let all = std::mem::take(&mut *queue.lock());
    all.into_iter().for_each(sched::wake);
}

pub(crate) fn outside_uthread(what: &str) -> ! {
    panic!("{what} must be called from a Ginza uthread (inside ginza_runtime::run)")
}
