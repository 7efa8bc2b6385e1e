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

    /// Takes every entry, due or not (the runtime has stopped).
    pub(crate) fn drain(&self, mut each: impl FnMut(usize)) {
        let mut timers = self.heap.lock();
        while let Some(Reverse((_, _, entry))) = timers.heap.pop() {
            each(entry);
        }
        self.next_deadline.store(u64::MAX, Release);
    }
}
