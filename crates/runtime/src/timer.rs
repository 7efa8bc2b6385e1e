//! Per-kthread timers (docs/runtime.md, "Scheduling"): a binary heap of
//! (deadline, sequence, entry) behind the runtime's spinlock, fired by the
//! owner and by idle kthreads, with the earliest deadline readable without
//! the lock. Entries are opaque words: the scheduler stores a uthread's
//! address or a tagged `Arc<Waiter>` and gives them their meaning; this
//! module never looks inside one. Deadlines are ns since the runtime's
//! epoch; `u64::MAX` means none.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use crossbeam_utils::CachePadded;

use crate::spinlock::SpinLock;

#[derive(Default)]
struct Heap {
    /// Ties are broken by the sequence: timers with one deadline fire in
    /// the order they were set.
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    seq: u64,
}

/// One kthread's timers.
pub(crate) struct Timers {
    heap: SpinLock<Heap>,
    /// Earliest deadline, `u64::MAX` if none. A line of its own: the
    /// Shinjuku dispatcher reads every worker's on every pass, and beside
    /// state the worker writes per request that would be a transfer per
    /// worker and pass.
    next_deadline: CachePadded<AtomicU64>,
}

impl Timers {
    pub(crate) fn new() -> Timers {
        Timers {
            heap: SpinLock::new(Heap::default()),
            next_deadline: CachePadded::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// The earliest deadline (`u64::MAX`: none).
    pub(crate) fn next_deadline(&self) -> u64 {
        self.next_deadline.load(Acquire)
    }

    /// Whether any timer is set (a cheap, relaxed look).
    pub(crate) fn any(&self) -> bool {
        self.next_deadline.load(Relaxed) != u64::MAX
    }

    /// Sets a timer for `entry` at `deadline`.
    pub(crate) fn add(&self, deadline: u64, entry: usize) {
        let mut timers = self.heap.lock();
        timers.seq += 1;
        let seq = timers.seq;
        timers.heap.push(Reverse((deadline, seq, entry)));
        if deadline < self.next_deadline.load(Relaxed) {
            self.next_deadline.store(deadline, Release);
        }
    }

    /// Takes every entry due by `now()` (read only if a timer is due at
    /// all) and hands each to `fire`, which says whether it woke anything;
    /// the count of those. Nothing if another kthread is firing them.
    pub(crate) fn fire_due(
        &self,
        now: impl FnOnce() -> u64,
        mut fire: impl FnMut(usize) -> bool,
    ) -> usize {
        let next = self.next_deadline.load(Acquire);
        if next == u64::MAX {
            return 0; // no timer: skip reading the clock
        }
        let now = now();
        if next > now {
            return 0;
        }
        let Some(mut timers) = self.heap.try_lock() else {
            return 0;
        };
        let mut fired = 0;
        while let Some(&Reverse((deadline, _, entry))) = timers.heap.peek() {
            if deadline > now {
                break;
            }
            timers.heap.pop();
            if fire(entry) {
                fired += 1;
            }
        }
        let next = timers.heap.peek().map_or(u64::MAX, |Reverse((d, _, _))| *d);
        self.next_deadline.store(next, Release);
        fired
    }

    /// Takes the earliest entries off while `stale` says they wake nobody
    /// any more (a timed wait that ended before its deadline), handing
    /// each to `release`, so that [`Timers::next_deadline`] is a deadline
    /// someone still waits for. A parked kthread reports that deadline to
    /// iokerneld, which wakes it then: a stale one cost a wake for
    /// nothing. Nothing if another kthread is firing the timers (it sets
    /// the deadline afresh).
    pub(crate) fn drop_stale(&self, stale: impl Fn(usize) -> bool, mut release: impl FnMut(usize)) {
        if self.next_deadline.load(Relaxed) == u64::MAX {
            return;
        }
        let Some(mut timers) = self.heap.try_lock() else {
            return;
        };
        let mut dropped = false;
        while let Some(&Reverse((_, _, entry))) = timers.heap.peek() {
            if !stale(entry) {
                break;
            }
            timers.heap.pop();
            release(entry);
            dropped = true;
        }
        if dropped {
            let next = timers.heap.peek().map_or(u64::MAX, |Reverse((d, _, _))| *d);
            self.next_deadline.store(next, Release);
        }
    }

    /// Takes every entry, due or not (the runtime has stopped).
    pub(crate) fn drain(&self, mut each: impl FnMut(usize)) {
        let mut timers = self.heap.lock();
        while let Some(Reverse((_, _, entry))) = timers.heap.pop() {
            each(entry);
        }
        self.next_deadline.store(u64::MAX, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::Timers;

    #[test]
    fn drop_stale_drops_the_stale_entries_at_the_top_and_no_live_one() {
        let timers = Timers::new();
        // Entries are opaque words: here, odd ones are stale.
        for (deadline, entry) in [(10, 1), (20, 3), (30, 4), (40, 5), (50, 6)] {
            timers.add(deadline, entry);
        }
        let mut released = Vec::new();
        timers.drop_stale(|e| e % 2 == 1, |e| released.push(e));
        assert_eq!(released, [1, 3], "stale until the first live entry");
        assert_eq!(timers.next_deadline(), 30);
        // The stale entry behind a live one stays until it comes to the top.
        let mut fired = Vec::new();
        timers.fire_due(
            || 30,
            |e| {
                fired.push(e);
                true
            },
        );
        assert_eq!(fired, [4]);
        timers.drop_stale(|e| e % 2 == 1, |e| released.push(e));
        assert_eq!(released, [1, 3, 5]);
        assert_eq!(timers.next_deadline(), 50);
        // All stale: no deadline left.
        timers.drop_stale(|_| true, |e| released.push(e));
        assert_eq!(released, [1, 3, 5, 6]);
        assert_eq!(timers.next_deadline(), u64::MAX);
    }
}
