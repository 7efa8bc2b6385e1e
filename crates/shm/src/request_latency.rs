//! Per-request latency an application reports (docs/metrics.md): one
//! fixed-bucket histogram per kthread in the shared region, written by
//! the runtime (`ginza_runtime::metrics::record_request`) and read by
//! iokerneld, which exports the sum over the kthreads as
//! `ginza_app_request_latency_seconds`.
//!
//! Each histogram has a single writer (its kthread, with preemption
//! deferred), so a sample is a plain load and store of two counters, no
//! locked instruction. iokerneld's reads are copies of counters that a
//! hostile or buggy runtime may set to anything: it judges each read
//! against the previous one ([`LatencyTally`]) before believing it.

use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// Upper bounds of the buckets, ns (inclusive, as Prometheus's `le`): from
/// half a microsecond to a second, 1-2-5 steps. Longer requests count in
/// the last bucket, above every bound.
pub const REQUEST_LATENCY_BOUNDS_NS: [u64; 20] = [
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
];

/// Buckets of a histogram: one per bound and one above them all.
pub const LATENCY_BUCKETS: usize = REQUEST_LATENCY_BOUNDS_NS.len() + 1;

/// The longest latency one sample may add to the sum, ns (an hour): what
/// iokerneld takes as the upper end of the last bucket when it checks a
/// sum against the counts.
pub const MAX_SAMPLE_NS: u64 = 3_600 * 1_000_000_000;

/// One kthread's histogram in shared memory: all atomics, so any bytes a
/// runtime leaves there are a valid value.
#[repr(C, align(64))]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    /// Sum of the samples, ns (saturating).
    sum_ns: AtomicU64,
}

/// Bytes of one histogram (three cache lines).
pub const HISTOGRAM_SIZE: usize = std::mem::size_of::<LatencyHistogram>();
const _: () = assert!(HISTOGRAM_SIZE == 192);

/// The bucket of a sample of `ns`.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    REQUEST_LATENCY_BOUNDS_NS.partition_point(|&b| b < ns)
}

impl LatencyHistogram {
    /// Empty.
    pub fn new() -> Self {
        LatencyHistogram {
            buckets: Default::default(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// One sample. Single writer: only the owning kthread calls this,
    /// with preemption deferred (a plain load and store per counter).
    /// The sum is written before the bucket, so a reader that sees the
    /// count (acquire) sees its sample in the sum.
    #[inline]
    pub fn record(&self, ns: u64) {
        let ns = ns.min(MAX_SAMPLE_NS);
        self.sum_ns
            .store(self.sum_ns.load(Relaxed).saturating_add(ns), Relaxed);
        let b = &self.buckets[bucket_of(ns)];
        b.store(b.load(Relaxed).wrapping_add(1), Release);
    }

    /// A copy of the counters (untrusted: whatever the writer left).
    pub fn read(&self) -> LatencyRead {
        let mut buckets = [0; LATENCY_BUCKETS];
        for (v, b) in buckets.iter_mut().zip(&self.buckets) {
            *v = b.load(Acquire);
        }
        LatencyRead {
            buckets,
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

/// Raw counters read from a histogram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyRead {
    pub buckets: [u64; LATENCY_BUCKETS],
    pub sum_ns: u64,
}

/// Fewest ns one request takes on one kthread (receive, answer, send): a
/// read whose counts grew faster than this since the previous one is not
/// believed.
pub const MIN_NS_PER_REQUEST: u64 = 20;

/// Requests believed beyond [`MIN_NS_PER_REQUEST`]'s bound (reads close
/// together).
pub const REQUEST_SLACK: u64 = 4096;

/// iokerneld's belief about one kthread's histogram: the totals it has
/// accepted, and the raw counters of its previous read. A read is judged
/// against the previous one: a bucket that went backwards, or counts that
/// grew faster than one request per [`MIN_NS_PER_REQUEST`], make the
/// whole read unbelieved (counted in `distrusted`; the next read counts
/// from it). A believed read's sum is clamped to what its new samples'
/// buckets allow, so the exported sum always agrees with the counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencyTally {
    last: LatencyRead,
    last_ns: u64,
    /// Believed samples by bucket, and their sum.
    pub buckets: [u64; LATENCY_BUCKETS],
    pub sum_ns: u64,
    /// Reads not believed.
    pub distrusted: u64,
}

impl LatencyTally {
    /// Counting from an empty histogram at `now` (a kthread just
    /// registered; its region starts zeroed).
    pub fn new(now: u64) -> Self {
        LatencyTally {
            last_ns: now,
            ..Default::default()
        }
    }

    /// The histogram read `r` at `now`.
    pub fn observe(&mut self, r: &LatencyRead, now: u64) {
        let elapsed = now.saturating_sub(self.last_ns);
        let prev = std::mem::replace(&mut self.last, *r);
        self.last_ns = now;
        let bound = elapsed / MIN_NS_PER_REQUEST + REQUEST_SLACK;
        let mut deltas = [0u64; LATENCY_BUCKETS];
        let mut total = 0u64;
        for (i, d) in deltas.iter_mut().enumerate() {
            match r.buckets[i].checked_sub(prev.buckets[i]) {
                Some(x) => *d = x,
                None => {
                    self.distrusted += 1;
                    return;
                }
            }
            total = total.saturating_add(*d);
        }
        if total == 0 {
            return;
        }
        if total > bound {
            self.distrusted += 1;
            return;
        }
        // What the new samples' buckets allow their sum to be.
        let (mut lo, mut hi) = (0u64, 0u64);
        for (i, &d) in deltas.iter().enumerate() {
            let lower = if i == 0 {
                0
            } else {
                REQUEST_LATENCY_BOUNDS_NS[i - 1] + 1
            };
            let upper = REQUEST_LATENCY_BOUNDS_NS
                .get(i)
                .copied()
                .unwrap_or(MAX_SAMPLE_NS);
            lo = lo.saturating_add(d.saturating_mul(lower));
            hi = hi.saturating_add(d.saturating_mul(upper));
        }
        let sum = r.sum_ns.wrapping_sub(prev.sum_ns).clamp(lo, hi);
        for (b, d) in self.buckets.iter_mut().zip(deltas) {
            *b += d;
        }
        self.sum_ns = self.sum_ns.saturating_add(sum);
    }

    /// Believed samples.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_their_bucket_and_the_sum() {
        let h = LatencyHistogram::new();
        for ns in [0, 500, 501, 1_000, 7_000, 2_000_000_000, u64::MAX] {
            h.record(ns);
        }
        let r = h.read();
        assert_eq!(r.buckets[0], 2, "0 and 500 are at most 500");
        assert_eq!(r.buckets[1], 2, "501 and 1000");
        assert_eq!(r.buckets[4], 1, "7 µs is in (5, 10] µs");
        assert_eq!(r.buckets[LATENCY_BUCKETS - 1], 2, "above a second");
        assert_eq!(
            r.sum_ns,
            500 + 501 + 1_000 + 7_000 + 2_000_000_000 + MAX_SAMPLE_NS,
            "a sample is clamped to an hour"
        );
        assert!(REQUEST_LATENCY_BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_tally_believes_plausible_reads_and_keeps_the_sum_in_range() {
        let h = LatencyHistogram::new();
        let mut t = LatencyTally::new(0);
        for _ in 0..10 {
            h.record(3_000);
        }
        t.observe(&h.read(), 1_000_000);
        assert_eq!(t.count(), 10);
        assert_eq!(t.buckets[bucket_of(3_000)], 10);
        assert_eq!(t.sum_ns, 30_000);
        // Nothing new: nothing changes.
        t.observe(&h.read(), 2_000_000);
        assert_eq!((t.count(), t.sum_ns, t.distrusted), (10, 30_000, 0));
        // A lying sum is clamped to the buckets' range: 5 samples in
        // (2, 5] µs sum to at most 25 µs and at least 10 µs + 5 ns.
        let mut r = h.read();
        r.buckets[bucket_of(3_000)] += 5;
        r.sum_ns = u64::MAX;
        t.observe(&r, 3_000_000);
        assert_eq!((t.count(), t.sum_ns), (15, 30_000 + 25_000));
        let mut r2 = r;
        r2.buckets[bucket_of(3_000)] += 5;
        r2.sum_ns = r.sum_ns; // no time at all for 5 samples
        t.observe(&r2, 4_000_000);
        assert_eq!((t.count(), t.sum_ns), (20, 55_000 + 5 * 2_001));
    }

    #[test]
    fn a_tally_refuses_counts_that_go_back_or_grow_absurdly() {
        let mut t = LatencyTally::new(0);
        let mut r = LatencyRead::default();
        r.buckets[3] = 100;
        r.sum_ns = 400_000;
        t.observe(&r, 1_000_000);
        assert_eq!(t.count(), 100);
        // Backwards: not believed, and counted from there on.
        r.buckets[3] = 50;
        t.observe(&r, 2_000_000);
        assert_eq!((t.count(), t.distrusted), (100, 1));
        r.buckets[3] = 60;
        r.sum_ns += 40_000;
        t.observe(&r, 3_000_000);
        assert_eq!((t.count(), t.distrusted), (110, 1));
        // A million requests in 1 µs: not believed.
        r.buckets[0] += 1_000_000;
        t.observe(&r, 3_001_000);
        assert_eq!((t.count(), t.distrusted), (110, 2));
        // Every counter at its maximum: no overflow, not believed.
        let r = LatencyRead {
            buckets: [u64::MAX; LATENCY_BUCKETS],
            sum_ns: u64::MAX,
        };
        t.observe(&r, 4_000_000);
        assert_eq!((t.count(), t.distrusted), (110, 3));
    }

    proptest::proptest! {
        #![proptest_config(crate::test_config(512, 8))]

        /// Any sequence of reads keeps the totals consistent: the sum lies
        /// within what the believed buckets allow, and nothing panics.
        #[test]
        fn any_reads_keep_the_tally_consistent(
            reads in proptest::collection::vec(
                (proptest::collection::vec(0u64..100_000, LATENCY_BUCKETS), proptest::prelude::any::<u64>(), 0u64..10_000_000),
                1..8,
            )
        ) {
            let mut t = LatencyTally::new(0);
            let mut now = 0;
            for (b, sum, dt) in reads {
                let mut r = LatencyRead { sum_ns: sum, ..Default::default() };
                r.buckets.copy_from_slice(&b);
                now += dt;
                t.observe(&r, now);
                let lo: u64 = t.buckets.iter().enumerate().skip(1)
                    .map(|(i, &n)| n * (REQUEST_LATENCY_BOUNDS_NS[i - 1] + 1)).sum();
                proptest::prop_assert!(t.sum_ns >= lo);
            }
        }
    }
}
