//! Histograms with fixed bucket bounds that a hot loop records into: a
//! sample is a binary search over a dozen bounds and two additions,
//! nothing is allocated after construction, and nothing is ever reset
//! (Prometheus computes rates and quantiles over its own windows).

/// Bounds for latencies from a fraction of a microsecond to a second (ns):
/// grants, hand-overs, requests.
pub const LATENCY_BOUNDS_NS: &[u64] = &[
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
    5_000_000,
    20_000_000,
    100_000_000,
    1_000_000_000,
];

/// Bounds for the cost of one pass of a loop (ns).
pub const PASS_BOUNDS_NS: &[u64] = &[
    250, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 1_000_000,
];

/// Counts of samples by bucket, and their sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets {
    bounds_ns: &'static [u64],
    /// Per bound `i`, the samples above bound `i - 1` and at most bound
    /// `i` (Prometheus's `le`); the last entry counts those above every
    /// bound.
    counts: Box<[u64]>,
    sum_ns: u64,
}

impl Buckets {
    /// Empty, with these upper bounds (strictly increasing; checked in
    /// debug builds, and the constants here by a unit test).
    pub fn new(bounds_ns: &'static [u64]) -> Buckets {
        debug_assert!(bounds_ns.windows(2).all(|w| w[0] < w[1]));
        Buckets {
            bounds_ns,
            counts: vec![0; bounds_ns.len() + 1].into_boxed_slice(),
            sum_ns: 0,
        }
    }

    /// One sample.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        let i = self.bounds_ns.partition_point(|&b| b < ns);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// Adds `n` samples whose sum is `sum_ns` to the bucket of `upper_ns`
    /// (figures that arrive counted already, e.g. by band).
    pub fn add(&mut self, upper_ns: u64, n: u64, sum_ns: u64) {
        let i = self.bounds_ns.partition_point(|&b| b < upper_ns);
        if let Some(c) = self.counts.get_mut(i) {
            *c += n;
        }
        self.sum_ns = self.sum_ns.saturating_add(sum_ns);
    }

    /// Adds whole buckets: `counts[i]` samples to bucket `i` (as many as
    /// there are buckets; extra entries are ignored), and `sum_ns` to the
    /// sum.
    pub fn add_counts(&mut self, counts: &[u64], sum_ns: u64) {
        for (c, n) in self.counts.iter_mut().zip(counts) {
            *c = c.saturating_add(*n);
        }
        self.sum_ns = self.sum_ns.saturating_add(sum_ns);
    }

    /// Back to no samples (for a snapshot rebuilt from figures counted
    /// elsewhere, not for a loop's own histogram).
    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.sum_ns = 0;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// Becomes a copy of `other` without allocating when both have the same
    /// bounds (a loop refreshing its published snapshot).
    pub fn copy_from(&mut self, other: &Buckets) {
        if self.counts.len() == other.counts.len() {
            self.bounds_ns = other.bounds_ns;
            self.counts.copy_from_slice(&other.counts);
            self.sum_ns = other.sum_ns;
        } else {
            *self = other.clone();
        }
    }

    /// (upper bound in seconds, samples in that bucket alone), the last
    /// bound infinite: what `prometheus-client` encodes (it accumulates).
    pub fn seconds(&self) -> Vec<(f64, u64)> {
        self.bounds_ns
            .iter()
            .map(|&b| b as f64 / 1e9)
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().copied())
            .collect()
    }

    /// The sum in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_strictly_increasing() {
        for b in [LATENCY_BOUNDS_NS, PASS_BOUNDS_NS] {
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        }
    }

    #[test]
    fn samples_land_at_or_below_their_bound() {
        let mut h = Buckets::new(PASS_BOUNDS_NS);
        for ns in [0, 250, 251, 999, 1_000, 1_000_001, u64::MAX] {
            h.record(ns);
        }
        let s = h.seconds();
        assert_eq!(s.len(), PASS_BOUNDS_NS.len() + 1);
        // `le` is inclusive: 0 and 250 in the first bucket, 251 in the
        // second, 999 and 1000 in the third, the rest above every bound.
        assert_eq!(s[0], (250e-9, 2));
        assert_eq!(s[1], (500e-9, 1));
        assert_eq!(s[2], (1e-6, 2));
        assert_eq!(s.last().copied(), Some((f64::INFINITY, 2)));
        assert_eq!(h.count(), 7);
        assert_eq!(h.sum_ns(), u64::MAX, "the sum saturates");
        let mut c = Buckets::new(PASS_BOUNDS_NS);
        c.copy_from(&h);
        assert_eq!(c, h);
        c.add(1_000, 3, 3_000);
        assert_eq!(c.seconds()[2], (1e-6, 5));
        c.add_counts(&[1, 0, 2], 10);
        assert_eq!(c.seconds()[0], (250e-9, 3));
        assert_eq!(c.seconds()[2], (1e-6, 7));
        assert_eq!(c.count(), 13);
    }
}
