//! Connection deadlines (retransmission, persist, delayed ACK, TIME-WAIT):
//! one heap per stack, fired by whoever looks first (docs/runtime.md, "TCP
//! sockets" → Timers):
//! * a kthread polling its packet rings (`Stack::poll`: idle kthreads in
//!   their steal loop, busy ones every 32 switches) fires what is due, at
//!   the cost of one atomic load when nothing is;
//! * a timer uthread, started with the first TCP socket, sleeps on the
//!   runtime's own timers until the earliest deadline, so a runtime whose
//!   kthreads all parked (with iokerneld, or on their eventfds) wakes for
//!   it. An arming that moves the earliest deadline before the one it
//!   sleeps until wakes it.
//!
//! Entries are lazy: a connection remembers the one deadline it armed, and
//! an entry that no longer matches it when popped is stale and dropped.
//! Entries of items that are gone (a connection evicted under a SYN flood
//! leaves its retransmission entry behind) are swept whenever the heap has
//! doubled since the last sweep, so the heap stays within a constant factor
//! of the live items however fast they come and go.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use crate::sched::Waiter;
use crate::spinlock::SpinLock;

/// What the heap needs to know of an item: whether it is gone.
pub(crate) trait Item {
    fn gone(&self) -> bool;
}

impl<T> Item for std::sync::Weak<T> {
    fn gone(&self) -> bool {
        self.strong_count() == 0
    }
}

/// Entries below which no sweep is worth it.
const SWEEP_FLOOR: usize = 1024;

struct Heap<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    seq: u64,
    /// Entries after the last sweep.
    swept_len: usize,
}

struct Entry<T> {
    deadline: u64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

/// A heap of (deadline in ns, item), with its earliest deadline readable
/// without the lock.
pub(crate) struct Deadlines<T> {
    heap: SpinLock<Heap<T>>,
    earliest: AtomicU64,
    /// The timer uthread parked until this deadline (`u64::MAX`: without
    /// one; 0: it is awake and will look at the heap before parking).
    sleeping_until: AtomicU64,
    sleeper: SpinLock<Option<Arc<Waiter>>>,
}

impl<T: Item> Deadlines<T> {
    pub(crate) fn new() -> Self {
        Deadlines {
            heap: SpinLock::new(Heap {
                heap: BinaryHeap::new(),
                seq: 0,
                swept_len: 0,
            }),
            earliest: AtomicU64::new(u64::MAX),
            sleeping_until: AtomicU64::new(0),
            sleeper: SpinLock::new(None),
        }
    }

    /// The earliest deadline (`u64::MAX`: none).
    pub(crate) fn earliest(&self) -> u64 {
        self.earliest.load(SeqCst)
    }

    /// Arms `item` at `deadline`; returns the timer uthread if it sleeps
    /// past it: the caller wakes it ([`Waiter::wake`]) once its locks are
    /// released, after the uthreads its own change made runnable, so they
    /// run first.
    #[must_use]
    pub(crate) fn arm(&self, deadline: u64, item: T) -> Option<Arc<Waiter>> {
        {
            let mut h = self.heap.lock();
            if h.heap.len() >= SWEEP_FLOOR.max(2 * h.swept_len) {
                h.heap.retain(|Reverse(e)| !e.item.gone());
                h.swept_len = h.heap.len();
                let next = h.heap.peek().map_or(u64::MAX, |Reverse(e)| e.deadline);
                self.earliest.store(next, SeqCst);
            }
            h.seq += 1;
            let seq = h.seq;
            h.heap.push(Reverse(Entry {
                deadline,
                seq,
                item,
            }));
            if deadline < self.earliest.load(SeqCst) {
                self.earliest.store(deadline, SeqCst);
            }
        }
        // Pairs with `sleep`: it publishes `sleeping_until`, then reads
        // `earliest`; we published `earliest`, then read `sleeping_until`.
        if deadline < self.sleeping_until.load(SeqCst) {
            return self.sleeper.lock().take();
        }
        None
    }

    /// Takes every item due by `now`; nothing if another context is taking
    /// them.
    pub(crate) fn take_due(&self, now: u64, out: &mut Vec<(u64, T)>) {
        if self.earliest.load(SeqCst) > now {
            return;
        }
        let Some(mut guard) = self.heap.try_lock() else {
            return;
        };
        let heap = &mut guard.heap;
        while heap.peek().is_some_and(|Reverse(e)| e.deadline <= now) {
            if let Some(Reverse(e)) = heap.pop() {
                out.push((e.deadline, e.item));
            }
        }
        let next = heap.peek().map_or(u64::MAX, |Reverse(e)| e.deadline);
        self.earliest.store(next, SeqCst);
    }

    /// The timer uthread, if it sleeps until `deadline`, for the caller to
    /// wake once its locks are released (the entry it sleeps for went
    /// stale: it plans again).
    #[must_use]
    pub(crate) fn sleeper_until(&self, deadline: u64) -> Option<Arc<Waiter>> {
        if self.sleeping_until.load(SeqCst) == deadline {
            return self.sleeper.lock().take();
        }
        None
    }

    /// Pops the earliest entries while `live` says they are stale, so that
    /// `earliest` is a deadline someone still needs. `live` runs without
    /// the heap's lock (it may take an item's own lock, which comes before
    /// the heap's).
    pub(crate) fn drop_stale(&self, live: impl Fn(u64, &T) -> bool)
    where
        T: Clone,
    {
        loop {
            let Some((deadline, seq, item)) = self
                .heap
                .lock()
                .heap
                .peek()
                .map(|Reverse(e)| (e.deadline, e.seq, e.item.clone()))
            else {
                return;
            };
            if live(deadline, &item) {
                return;
            }
            let mut h = self.heap.lock();
            if h.heap.peek().is_some_and(|Reverse(e)| e.seq == seq) {
                h.heap.pop();
            }
            let next = h.heap.peek().map_or(u64::MAX, |Reverse(e)| e.deadline);
            self.earliest.store(next, SeqCst);
        }
    }

    /// Entries in the heap, stale ones included.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.lock().heap.len()
    }

    /// The timer uthread is about to park as `w` until `until` (`u64::MAX`:
    /// no deadline): false if a deadline before it was armed meanwhile (look
    /// again instead; an `arm` may have taken `w` to wake it in between, so
    /// the caller withdraws `w` first, `Waiter::cancel`).
    pub(crate) fn sleep(&self, w: &Arc<Waiter>, until: u64) -> bool {
        *self.sleeper.lock() = Some(Arc::clone(w));
        self.sleeping_until.store(until, SeqCst);
        if self.earliest.load(SeqCst) < until {
            self.awake();
            return false;
        }
        true
    }

    /// The timer uthread runs again.
    pub(crate) fn awake(&self) {
        self.sleeping_until.store(0, SeqCst);
        self.sleeper.lock().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Item for &'static str {
        fn gone(&self) -> bool {
            self.starts_with("gone")
        }
    }

    #[test]
    fn entries_of_gone_items_are_swept_as_the_heap_doubles() {
        let d = Deadlines::new();
        for _ in 0..10 * SWEEP_FLOOR {
            assert!(d.arm(1, "gone").is_none(), "nobody sleeps");
            assert!(d.len() <= SWEEP_FLOOR + 1, "{}", d.len());
        }
        let _ = d.arm(5, "live");
        let mut out = Vec::new();
        d.take_due(10, &mut out);
        assert!(out.contains(&(5, "live")));
    }

    #[test]
    fn stale_entries_at_the_top_are_dropped_and_live_ones_kept() {
        let d = Deadlines::new();
        for (deadline, item) in [(10, "stale"), (20, "stale2"), (30, "live"), (40, "stale3")] {
            assert!(d.arm(deadline, item).is_none());
        }
        d.drop_stale(|_, item| !item.starts_with("stale"));
        assert_eq!(d.earliest(), 30, "up to the first live entry");
        assert_eq!(d.len(), 2, "entries behind it stay until they come up");
        d.drop_stale(|_, _| false);
        assert_eq!(d.earliest(), u64::MAX);
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn due_items_come_out_in_deadline_order() {
        let d = Deadlines::new();
        for (deadline, item) in [(30, "c"), (10, "a"), (20, "b"), (10, "a2")] {
            assert!(d.arm(deadline, item).is_none());
        }
        assert_eq!(d.earliest(), 10);
        let mut out = Vec::new();
        d.take_due(5, &mut out);
        assert!(out.is_empty());
        d.take_due(20, &mut out);
        assert_eq!(out, vec![(10, "a"), (10, "a2"), (20, "b")]);
        assert_eq!(d.earliest(), 30);
        assert_eq!(d.len(), 1);
    }
}
