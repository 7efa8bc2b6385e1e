//! `batch`: Monte Carlo pricing of a European call, the best-effort
//! application of the demo and of experiments that share cores between a
//! latency-critical server and background work. It reports paths (the unit
//! of work) per second.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// The option the batch application prices: a European call, spot 100,
/// strike 105, rate 5 %, volatility 20 %, one year. Black–Scholes value
/// 8.0214, which the Monte Carlo estimate must approach.
const SPOT: f64 = 100.0;
const STRIKE: f64 = 105.0;
const RATE: f64 = 0.05;
const VOL: f64 = 0.2;
const YEARS: f64 = 1.0;

/// Paths per chunk between two `yield_now`s: about 45 µs of arithmetic
/// (about 18 ns a path, 55 M paths per CPU-second, on the 2-vCPU
/// development VM in session 36), so busy time is published and
/// preemption points come often while each chunk is still real work; a
/// preemption signal does not wait for the chunk's end.
pub const PATHS_PER_CHUNK: u64 = 2560;

/// Paths between two preemption points inside a chunk (about 0.6 µs): a
/// request asked of the kthread there (a local wake, docs/runtime.md
/// "Local wakes") waits at most that long; a point that finds nothing
/// asked costs a call and a load or two. Every 256 paths (2.5 µs) made
/// the demo's wake of `lc` about 1 µs longer (docs/results.md, "Session
/// 13"), with no batch throughput to show for it.
pub const PATHS_PER_POINT: u64 = 32;

/// Sum of the call's payoffs at expiry over `n` simulated paths
/// (geometric Brownian motion, one step).
///
/// One out-of-line function, not generic, so that Ginza's batch and
/// Linux's batch peer (`ginza_bench`'s `linux_batch`) run the very same
/// machine code and a comparison of their work measures the systems. When
/// each caller had a copy inlined of its own, the Linux thread's kept the
/// generator's state in registers and priced about 20 % more paths per
/// CPU-second than the uthread's copy did on the same CPU with no
/// scheduler involved (docs/results.md, "Session 36").
#[inline(never)]
pub fn payoff_sum(rng: &mut SmallRng, n: u64) -> f64 {
    let drift = (RATE - 0.5 * VOL * VOL) * YEARS;
    let vol = VOL * YEARS.sqrt();
    // A local copy: the caller's generator may live where the compiler
    // must reload it around every sample.
    let mut local = rng.clone();
    let mut sum = 0.0;
    for _ in 0..n {
        let z: f64 = local.sample(StandardNormal);
        let st = SPOT * (drift + vol * z).exp();
        sum += (st - STRIKE).max(0.0);
    }
    *rng = local;
    sum
}

/// Discounted mean payoff: the Monte Carlo price.
pub fn price(payoff_sum: f64, paths: u64) -> f64 {
    if paths == 0 {
        return 0.0;
    }
    (-RATE * YEARS).exp() * payoff_sum / paths as f64
}

/// The batch application's main uthread: one pricing uthread per kthread,
/// each pricing chunk after chunk and yielding in between (where it can be
/// preempted cheaply), until `stop`. Paths done are added to `paths` as
/// they complete so the demo can read the rate over its window. Returns the
/// price estimate (a check that the work was real).
pub fn price_until_stopped(
    kthreads: usize,
    paths: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> f64 {
    let workers: Vec<_> = (0..kthreads as u64)
        .map(|i| {
            let paths = Arc::clone(&paths);
            let stop = Arc::clone(&stop);
            ginza_runtime::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (i + 1).wrapping_mul(0x9e37_79b9));
                let (mut sum, mut n) = (0.0, 0u64);
                while !stop.load(Relaxed) {
                    for _ in 0..PATHS_PER_CHUNK / PATHS_PER_POINT {
                        sum += black_box(payoff_sum(&mut rng, PATHS_PER_POINT));
                        ginza_runtime::preempt_point();
                    }
                    n += PATHS_PER_CHUNK;
                    paths.fetch_add(PATHS_PER_CHUNK, Relaxed);
                    ginza_runtime::yield_now();
                }
                (sum, n)
            })
        })
        .collect();
    let (mut sum, mut n) = (0.0, 0u64);
    for w in workers {
        // A pricing uthread cannot panic short of a bug; its share is then
        // simply missing from the estimate.
        if let Ok((s, k)) = w.join() {
            sum += s;
            n += k;
        }
    }
    price(sum, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monte_carlo_price_approaches_black_scholes() {
        let mut rng = SmallRng::seed_from_u64(3);
        let n = 400_000;
        let p = price(payoff_sum(&mut rng, n), n);
        assert!((p - 8.0214).abs() < 0.1, "price {p}");
        assert_eq!(price(0.0, 0), 0.0);
    }
}
