use super::{outside_uthread, wait_on, wake_all, MutexGuard, WaitQueue, Waited};
use crate::sched;

/// A condition variable for uthreads, used with [`super::Mutex`].
#[derive(Default)]
pub struct Condvar {
    waiters: WaitQueue,
}

impl Condvar {
    pub const fn new() -> Self {
        Condvar {
            waiters: WaitQueue::new(std::collections::VecDeque::new()),
        }
    }

    /// Releases the mutex, waits for a notification, re-acquires the mutex.
    /// The caller is queued before the mutex is released, so a notify made
    /// under the mutex is never lost. Panics outside a uthread.
    pub fn wait<'a, T: ?Sized>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        let mutex = guard.mutex;
        let mut guard = Some(guard);
        let waited = wait_on(&self.waiters, || {
            // Released with the condvar's queue locked: a notifier that takes
            // the mutex next still finds this waiter queued.
            std::mem::forget(guard.take());
            // SAFETY: the forgotten guard held the lock.
            unsafe { mutex.unlock() };
            true
        });
        if waited == Waited::NotAUthread {
            drop(guard);
            outside_uthread("Condvar::wait");
        }
        mutex.lock()
    }

    /// Waits while `condition` holds.
    pub fn wait_while<'a, T: ?Sized>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: impl FnMut(&mut T) -> bool,
    ) -> MutexGuard<'a, T> {
        while condition(&mut *guard) {
            guard = self.wait(guard);
        }
        guard
    }

    pub fn notify_one(&self) {
        let next = self.waiters.lock().pop_front();
        if let Some(u) = next {
            sched::wake(u);
        }
    }

    pub fn notify_all(&self) {
        wake_all(&self.waiters);
    }
}
