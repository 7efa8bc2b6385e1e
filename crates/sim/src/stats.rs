//! Per-run statistics: exact means, HDR histograms for percentiles.

use hdrhistogram::Histogram;

/// Latency statistics of one simulation run (µs in the API; histograms in ns).
#[derive(Clone, Debug)]
pub struct Stats {
    pub n: u64,
    sum_sojourn: f64,
    sum_wait: f64,
    sum_service: f64,
    latency: Histogram<u64>,
    per_class: Vec<Histogram<u64>>,
    /// Slowdown (latency / service) × 1000.
    slowdown: Histogram<u64>,
    wait_thresholds_us: Vec<f64>,
    wait_exceed: Vec<u64>,
    histograms: bool,
}

/// Records into an auto-resizing histogram (`saturating_record` would clamp
/// to the initial, tiny range instead of growing).
fn put(h: &mut Histogram<u64>, v: u64) {
    if h.record(v).is_err() {
        h.saturating_record(v);
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is valid")
}

impl Stats {
    /// `histograms = false` keeps only means and P(W > t) (faster, for the
    /// theory checks that need tens of millions of samples).
    pub fn new(classes: usize, wait_thresholds_us: &[f64], histograms: bool) -> Self {
        Self {
            n: 0,
            sum_sojourn: 0.0,
            sum_wait: 0.0,
            sum_service: 0.0,
            latency: hist(),
            per_class: (0..classes.max(1)).map(|_| hist()).collect(),
            slowdown: hist(),
            wait_thresholds_us: wait_thresholds_us.to_vec(),
            wait_exceed: vec![0; wait_thresholds_us.len()],
            histograms,
        }
    }

    /// One finished request (times in µs).
    pub fn record(&mut self, sojourn_us: f64, service_us: f64, class: usize) {
        let wait = (sojourn_us - service_us).max(0.0);
        self.n += 1;
        self.sum_sojourn += sojourn_us;
        self.sum_wait += wait;
        self.sum_service += service_us;
        if self.histograms {
            let ns = ((sojourn_us * 1000.0).round() as u64).max(1);
            put(&mut self.latency, ns);
            if let Some(h) = self.per_class.get_mut(class) {
                put(h, ns);
            }
            put(
                &mut self.slowdown,
                ((sojourn_us / service_us * 1000.0).round() as u64).max(1),
            );
        }
        for (t, c) in self
            .wait_thresholds_us
            .iter()
            .zip(self.wait_exceed.iter_mut())
        {
            if wait > *t {
                *c += 1;
            }
        }
    }

    pub fn mean_sojourn_us(&self) -> f64 {
        self.sum_sojourn / self.n.max(1) as f64
    }

    pub fn mean_wait_us(&self) -> f64 {
        self.sum_wait / self.n.max(1) as f64
    }

    pub fn mean_service_us(&self) -> f64 {
        self.sum_service / self.n.max(1) as f64
    }

    /// Latency percentile (`q` in 0..=100), µs.
    pub fn latency_pct_us(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q / 100.0) as f64 / 1000.0
    }

    pub fn class_pct_us(&self, class: usize, q: f64) -> f64 {
        self.per_class
            .get(class)
            .map_or(f64::NAN, |h| h.value_at_quantile(q / 100.0) as f64 / 1000.0)
    }

    pub fn slowdown_pct(&self, q: f64) -> f64 {
        self.slowdown.value_at_quantile(q / 100.0) as f64 / 1000.0
    }

    /// Adds another run's samples (same classes and thresholds).
    pub fn merge(&mut self, o: &Stats) {
        self.n += o.n;
        self.sum_sojourn += o.sum_sojourn;
        self.sum_wait += o.sum_wait;
        self.sum_service += o.sum_service;
        if self.histograms {
            // Same settings on both sides: adding cannot fail.
            let _ = self.latency.add(&o.latency);
            let _ = self.slowdown.add(&o.slowdown);
            for (a, b) in self.per_class.iter_mut().zip(&o.per_class) {
                let _ = a.add(b);
            }
        }
        for (a, b) in self.wait_exceed.iter_mut().zip(&o.wait_exceed) {
            *a += b;
        }
    }

    /// P(W > t) for each threshold given at construction.
    pub fn wait_exceed_prob(&self) -> Vec<f64> {
        self.wait_exceed
            .iter()
            .map(|&c| c as f64 / self.n.max(1) as f64)
            .collect()
    }
}
