//! Where a spin-server request's time goes (docs/results.md, "Where a
//! request's time goes"): per request, the CLOCK_MONOTONIC stamps the
//! server can take — the injection time the request carries, the grant its
//! kthread last ran after (iokerneld's decision, the kthread running), the
//! receiver handing it over, its uthread starting, its reply posted — kept
//! in a fixed log that `ginza demo` reads once the server has stopped.
//!
//! Writers never block and never allocate: a slot is claimed by one
//! `fetch_add`, and requests past the capacity are only counted.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The stamps of one request, CLOCK_MONOTONIC ns (0: not taken).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestStamps {
    /// Injection, as the request's header says (the generator's clock
    /// reading when it sent the request).
    pub inject_ns: u64,
    /// iokerneld's decision of the last grant the receiving kthread ran
    /// after, and when it ran (0 if it never parked under iokerneld).
    pub decided_ns: u64,
    pub running_ns: u64,
    /// The receiver uthread had the datagram.
    pub picked_ns: u64,
    /// The request's uthread started.
    pub started_ns: u64,
    /// The reply was about to be posted (the service time spun).
    pub reply_ns: u64,
    /// The service time the request asked for.
    pub service_ns: u64,
}

impl RequestStamps {
    /// The request found its kthread parked: the kthread ran after a grant
    /// that came after the injection, so the request waited for the wake.
    pub fn waited_for_wake(&self) -> bool {
        self.running_ns != 0 && self.running_ns >= self.inject_ns
    }
}

const FIELDS: usize = 7;

/// A fixed log of [`RequestStamps`].
#[derive(Debug, Default)]
pub struct RequestTrace {
    slots: Box<[[AtomicU64; FIELDS]]>,
    next: AtomicUsize,
}

impl RequestTrace {
    /// A log of `capacity` requests (0: tracing off, nothing recorded).
    pub fn with_capacity(capacity: usize) -> RequestTrace {
        RequestTrace {
            slots: (0..capacity).map(|_| Default::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Records one request (dropped, and counted by `dropped`, past the
    /// capacity).
    pub fn record(&self, s: &RequestStamps) {
        if !self.enabled() {
            return;
        }
        let i = self.next.fetch_add(1, Relaxed);
        let Some(slot) = self.slots.get(i) else {
            return;
        };
        let v = [
            s.inject_ns,
            s.decided_ns,
            s.running_ns,
            s.picked_ns,
            s.started_ns,
            s.reply_ns,
            s.service_ns,
        ];
        for (f, x) in slot.iter().zip(v) {
            f.store(x, Relaxed);
        }
    }

    /// Requests recorded past the capacity.
    pub fn dropped(&self) -> usize {
        self.next.load(Relaxed).saturating_sub(self.slots.len())
    }

    /// The records so far. Read once the writers are done (a record being
    /// written concurrently may be read half-written).
    pub fn records(&self) -> Vec<RequestStamps> {
        let n = self.next.load(Relaxed).min(self.slots.len());
        self.slots[..n]
            .iter()
            .map(|f| {
                let g = |i: usize| f[i].load(Relaxed);
                RequestStamps {
                    inject_ns: g(0),
                    decided_ns: g(1),
                    running_ns: g(2),
                    picked_ns: g(3),
                    started_ns: g(4),
                    reply_ns: g(5),
                    service_ns: g(6),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_up_to_the_capacity_and_counts_the_rest() {
        let t = RequestTrace::with_capacity(2);
        let s = |x| RequestStamps {
            inject_ns: x,
            running_ns: x + 1,
            ..Default::default()
        };
        for x in [10, 20, 30] {
            t.record(&s(x));
        }
        assert_eq!(t.records(), vec![s(10), s(20)]);
        assert_eq!(t.dropped(), 1);
        assert!(t.records()[0].waited_for_wake());
        let off = RequestTrace::default();
        off.record(&s(1));
        assert!(off.records().is_empty() && !off.enabled() && off.dropped() == 0);
        let found_running = RequestStamps {
            inject_ns: 100,
            running_ns: 50,
            ..Default::default()
        };
        assert!(!found_running.waited_for_wake());
    }
}
