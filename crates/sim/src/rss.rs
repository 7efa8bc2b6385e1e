//! RSS balance (Shinjuku §3.6, Fig. 4): how many connections `hash % n`
//! needs before the busiest queue is within 10 % of the mean with
//! probability above 90 %, by Monte Carlo over random flows.

use ginza_net::flow::{flow_hash, FlowKey};
use ginza_policy::steer::{AppSteering, RssMod, Steered};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Load imbalance of a queue-occupancy vector: how far the busiest queue is
/// above the mean, relative to the mean (0.1 = 10 % above). Zero for an
/// empty vector or no load.
pub fn imbalance(loads: &[u64]) -> f64 {
    if loads.is_empty() {
        return 0.0;
    }
    let total: u64 = loads.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let mean = total as f64 / loads.len() as f64;
    let max = *loads.iter().max().unwrap_or(&0) as f64;
    max / mean - 1.0
}

/// Probability, over `trials` random sets of `conns` equally loaded flows,
/// that the imbalance (busiest queue over mean, minus one) is below `limit`.
pub fn p_balanced(queues: usize, conns: u64, limit: f64, trials: u32, seed: u64) -> f64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut loads = vec![0u64; queues];
    // Every queue's core is active, as in a NIC's RSS.
    let mut steering = AppSteering::new(Box::new(RssMod::new()), queues);
    steering.sync(std::iter::repeat_n(true, queues), 0);
    let mut ok = 0u32;
    for _ in 0..trials {
        loads.iter_mut().for_each(|l| *l = 0);
        for _ in 0..conns {
            let key = FlowKey {
                src_ip: rng.random(),
                dst_ip: 0x0a00_0001,
                src_port: rng.random(),
                dst_port: 11211,
                proto: 17,
            };
            let Steered::Active(q) = steering.steer(flow_hash(&key), 0) else {
                unreachable!("every queue is active");
            };
            loads[q] += 1;
        }
        if imbalance(&loads) < limit {
            ok += 1;
        }
    }
    f64::from(ok) / f64::from(trials)
}

/// Smallest connection count (within 1 %) with P(imbalance < `limit`) >
/// `prob`. The same seed at every probe (common random numbers) keeps the
/// search monotone enough for bisection.
pub fn connections_needed(queues: usize, limit: f64, prob: f64, trials: u32, seed: u64) -> u64 {
    if queues <= 1 {
        return 1;
    }
    let ok = |n: u64| p_balanced(queues, n, limit, trials, seed) > prob;
    let mut lo = queues as u64;
    let mut hi = lo * 2;
    while !ok(hi) {
        lo = hi;
        hi *= 2;
    }
    while hi - lo > (hi / 100).max(1) {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imbalance_basic() {
        assert_eq!(imbalance(&[]), 0.0);
        assert_eq!(imbalance(&[5, 5, 5]), 0.0);
        assert!((imbalance(&[10, 5, 0, 5]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn more_queues_need_more_connections() {
        let a = connections_needed(2, 0.1, 0.9, 200, 1);
        let b = connections_needed(8, 0.1, 0.9, 200, 1);
        assert!(a < b, "{a} {b}");
        // Two queues: Binomial(n, 1/2) within 10 % of n/2 w.p. 0.9 needs
        // z = 1.645 ≈ 0.1·sqrt(n) → n ≈ 270.
        assert!((150..450).contains(&a), "{a}");
    }
}
