//! Samples → median nanoseconds per operation.

use std::time::Duration;

pub(crate) use crate::harness::figures::median;

/// Nanoseconds per operation of one sample: `elapsed` spent on `ops` operations.
pub fn ns_per_op(elapsed: Duration, ops: u64) -> f64 {
    assert!(ops > 0, "a sample must hold at least one operation");
    elapsed.as_nanos() as f64 / ops as f64
}

/// Runs `one` once to warm up (discarded), then `samples` times, and returns the
/// median ns/op. `one` does its operations and returns (time spent, operations).
pub fn median_ns(samples: usize, mut one: impl FnMut() -> (Duration, u64)) -> f64 {
    let _ = one();
    let per_op: Vec<f64> = (0..samples.max(1))
        .map(|_| {
            let (elapsed, ops) = one();
            ns_per_op(elapsed, ops)
        })
        .collect();
    median(&per_op).expect("at least one sample")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_per_op_divides() {
        assert_eq!(ns_per_op(Duration::from_micros(3), 1000), 3.0);
        assert_eq!(ns_per_op(Duration::from_nanos(5), 2), 2.5);
    }

    #[test]
    #[should_panic]
    fn ns_per_op_rejects_zero_ops() {
        ns_per_op(Duration::from_nanos(5), 0);
    }

    #[test]
    fn median_ns_discards_warmup() {
        // First call (warm-up) is slow, the rest are 10 ns/op.
        let mut calls = 0;
        let m = median_ns(3, || {
            calls += 1;
            if calls == 1 {
                (Duration::from_secs(1), 1)
            } else {
                (Duration::from_nanos(100), 10)
            }
        });
        assert_eq!(calls, 4);
        assert_eq!(m, 10.0);
    }
}
