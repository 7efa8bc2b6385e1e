use std::sync::atomic::{AtomicUsize, Ordering::AcqRel, Ordering::Acquire};

use super::{outside_uthread, wait_on, wake_all, WaitQueue, Waited};

/// Waits for a counted set of tasks to finish (Go's sync.WaitGroup).
#[derive(Default)]
pub struct WaitGroup {
    count: AtomicUsize,
    waiters: WaitQueue,
}

impl WaitGroup {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` to the count of tasks to wait for.
    pub fn add(&self, n: usize) {
        self.count.fetch_add(n, AcqRel);
    }

    /// Marks one task finished; the last one wakes every waiter.
    pub fn done(&self) {
        let before = self
            .count
            .fetch_update(AcqRel, Acquire, |c| c.checked_sub(1))
            .expect("WaitGroup::done called more times than add");
        if before == 1 {
            // Waiters check the count under the queue lock, so taking it
            // here cannot miss one that is about to queue.
            wake_all(&self.waiters);
        }
    }

    /// Suspends the calling uthread until the count is zero.
    pub fn wait(&self) {
        if self.count.load(Acquire) == 0 {
            return;
        }
        if wait_on(&self.waiters, || self.count.load(Acquire) != 0) == Waited::NotAUthread {
            outside_uthread("WaitGroup::wait");
        }
    }
}
