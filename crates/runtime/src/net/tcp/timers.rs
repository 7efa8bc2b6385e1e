//! Connection deadlines (retransmission, persist, delayed ACK, TIME-WAIT):
//! one ordered set per stack, fired by whoever looks first (docs/runtime.md,
//! "TCP sockets" → Timers):
//! * a kthread polling its packet rings (`Stack::poll`: idle kthreads in
//!   their steal loop, busy ones every 32 switches) fires what is due, at
//!   the cost of one atomic load when nothing is;
//! * a kthread about to sleep (its park under iokerneld, the idle block on
//!   its own socket) counts the earliest deadline with its timers
//!   (`Shared::earliest_deadline`), so a runtime whose kthreads all sleep
//!   wakes for it.
//!
//! So the earliest deadline must be one somebody needs: an entry whose
//! connection's deadline went, or moved at least `RE_ARM_LATER_NS` later,
//! is taken out at once ([`Deadlines::rearm`]), and a sleeping runtime is
//! never woken for a delayed ACK that the reply carried. Smaller moves (the
//! retransmission timer restarted by each ACK of a stream) leave the entry:
//! it fires once, finds nothing due, and arms the new deadline.
//!
//! Entries of items that are gone (a connection evicted under a SYN flood
//! leaves its entry behind) are swept whenever the set has doubled since
//! the last sweep, so it stays within a constant factor of the live items
//! however fast they come and go.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use crate::spinlock::SpinLock;

/// What the set needs to know of an item: whether it is gone.
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

/// An armed entry: its deadline (ns) and the arming's sequence number,
/// which tells two entries of one deadline apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Armed {
    pub(crate) deadline: u64,
    seq: u64,
}

struct Entries<T> {
    by_deadline: BTreeMap<Armed, T>,
    seq: u64,
    /// Entries after the last sweep.
    swept_len: usize,
}

/// Items by deadline (ns), with the earliest deadline readable without the
/// lock.
pub(crate) struct Deadlines<T> {
    entries: SpinLock<Entries<T>>,
    earliest: AtomicU64,
}

impl<T: Item> Deadlines<T> {
    pub(crate) fn new() -> Self {
        Deadlines {
            entries: SpinLock::new(Entries {
                by_deadline: BTreeMap::new(),
                seq: 0,
                swept_len: 0,
            }),
            earliest: AtomicU64::new(u64::MAX),
        }
    }

    /// The earliest deadline (`u64::MAX`: none).
    pub(crate) fn earliest(&self) -> u64 {
        self.earliest.load(SeqCst)
    }

    /// Takes `old` out (if armed) and arms `item` at `deadline` (if any);
    /// the new entry.
    pub(crate) fn rearm(
        &self,
        old: Option<Armed>,
        deadline: Option<u64>,
        item: impl FnOnce() -> T,
    ) -> Option<Armed> {
        let mut e = self.entries.lock();
        if let Some(old) = old {
            e.by_deadline.remove(&old);
        }
        if e.by_deadline.len() >= SWEEP_FLOOR.max(2 * e.swept_len) {
            e.by_deadline.retain(|_, item| !item.gone());
            e.swept_len = e.by_deadline.len();
        }
        let armed = deadline.map(|deadline| {
            e.seq += 1;
            let armed = Armed {
                deadline,
                seq: e.seq,
            };
            e.by_deadline.insert(armed, item());
            armed
        });
        self.publish_earliest(&e);
        armed
    }

    /// Takes every item due by `now`; nothing if another context is taking
    /// them.
    pub(crate) fn take_due(&self, now: u64, out: &mut Vec<(Armed, T)>) {
        if self.earliest.load(SeqCst) > now {
            return;
        }
        let Some(mut e) = self.entries.try_lock() else {
            return;
        };
        while let Some(entry) = e.by_deadline.first_entry() {
            if entry.key().deadline > now {
                break;
            }
            out.push(entry.remove_entry());
        }
        self.publish_earliest(&e);
    }

    fn publish_earliest(&self, e: &Entries<T>) {
        let next = e
            .by_deadline
            .first_key_value()
            .map_or(u64::MAX, |(a, _)| a.deadline);
        self.earliest.store(next, SeqCst);
    }

    /// Entries in the set, those of gone items included.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().by_deadline.len()
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
    fn entries_of_gone_items_are_swept_as_the_set_doubles() {
        let d = Deadlines::new();
        for _ in 0..10 * SWEEP_FLOOR {
            d.rearm(None, Some(1), || "gone");
            assert!(d.len() <= SWEEP_FLOOR + 1, "{}", d.len());
        }
        d.rearm(None, Some(5), || "live");
        let mut out = Vec::new();
        d.take_due(10, &mut out);
        assert!(out
            .iter()
            .any(|(a, item)| a.deadline == 5 && *item == "live"));
    }

    #[test]
    fn a_rearmed_entry_leaves_the_set_and_the_earliest_deadline() {
        let d = Deadlines::new();
        let ack = d.rearm(None, Some(10), || "delayed ack");
        let other = d.rearm(None, Some(30), || "other");
        assert_eq!(d.earliest(), 10);
        // The reply carried the ACK: its retransmission timer comes later.
        let rto = d.rearm(ack, Some(40), || "retransmission");
        assert_eq!(d.earliest(), 30, "nobody sleeps until the delayed ACK");
        assert_eq!(d.len(), 2);
        d.rearm(other, None, || unreachable!("no deadline, no item"));
        d.rearm(rto, None, || unreachable!());
        assert_eq!(d.earliest(), u64::MAX);
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn due_items_come_out_in_deadline_order() {
        let d = Deadlines::new();
        for (deadline, item) in [(30, "c"), (10, "a"), (20, "b"), (10, "a2")] {
            d.rearm(None, Some(deadline), || item);
        }
        assert_eq!(d.earliest(), 10);
        let mut out = Vec::new();
        d.take_due(5, &mut out);
        assert!(out.is_empty());
        d.take_due(20, &mut out);
        let items: Vec<_> = out.iter().map(|(a, item)| (a.deadline, *item)).collect();
        assert_eq!(items, vec![(10, "a"), (10, "a2"), (20, "b")]);
        assert_eq!(d.earliest(), 30);
        assert_eq!(d.len(), 1);
    }
}
