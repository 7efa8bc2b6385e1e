//! The planned arrival times: Poisson statistics for a seed, exact
//! constant spacing, load steps switching rate at the right times.

use std::time::Duration;

use ginza_loadgen::schedule::{parse_rate, parse_steps, Arrivals, Process, Step};

fn gaps(plan: &[u64]) -> Vec<f64> {
    plan.windows(2).map(|w| (w[1] - w[0]) as f64).collect()
}

fn mean_var(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var)
}

#[test]
fn poisson_arrivals_have_exponential_gaps_and_poisson_counts() {
    let rate = 100_000.0;
    let a = Arrivals::steady(Process::Poisson, rate, Duration::from_secs(1));
    let plan = a.plan(7);
    // The count of a Poisson process over 1 s: mean 100,000, σ ≈ 316;
    // 5σ is about 1.6 %.
    let n = plan.len() as f64;
    assert!((n - rate).abs() < 5.0 * rate.sqrt(), "{n} arrivals");
    assert!(plan.windows(2).all(|w| w[0] <= w[1]), "not ascending");
    assert!(*plan.last().unwrap() < 1_000_000_000);
    // Exponential gaps: mean 1/rate = 10 µs, variance mean² (the
    // coefficient of variation is 1). With 10^5 samples the standard error
    // of the mean is 0.3 % and of the variance about 0.9 %.
    let (mean, var) = mean_var(&gaps(&plan));
    assert!((mean - 10_000.0).abs() < 10_000.0 * 0.02, "mean gap {mean}");
    let cv2 = var / (mean * mean);
    assert!(
        (cv2 - 1.0).abs() < 0.05,
        "squared coefficient of variation {cv2}"
    );
    // Counts per 1 ms window: Poisson, so variance ≈ mean (dispersion 1).
    let mut counts = vec![0f64; 1000];
    for t in &plan {
        counts[(*t / 1_000_000) as usize] += 1.0;
    }
    let (m, v) = mean_var(&counts);
    assert!((v / m - 1.0).abs() < 0.15, "index of dispersion {}", v / m);
}

#[test]
fn a_seed_gives_the_same_plan_and_another_seed_another() {
    let a = Arrivals::steady(Process::Poisson, 10_000.0, Duration::from_millis(100));
    assert_eq!(a.plan(3), a.plan(3));
    assert_ne!(a.plan(3), a.plan(4));
}

#[test]
fn constant_arrivals_are_exactly_evenly_spaced() {
    let a = Arrivals::steady(Process::Constant, 1000.0, Duration::from_secs(1));
    let plan = a.plan(1);
    assert_eq!(plan.len(), 1000);
    assert_eq!(plan[0], 0);
    assert!(gaps(&plan).iter().all(|&g| g == 1_000_000.0));
    // A period that is not a whole number of ns: each send time is the
    // exact multiple, rounded to the ns, so gaps differ by at most 1 ns
    // and never drift.
    let a = Arrivals::steady(Process::Constant, 3000.0, Duration::from_secs(1));
    let plan = a.plan(1);
    assert_eq!(plan.len(), 3000);
    assert!(gaps(&plan)
        .iter()
        .all(|&g| g == 333_333.0 || g == 333_334.0));
    assert_eq!(plan[2999], 999_666_667);
}

#[test]
fn steps_switch_rate_at_their_boundaries() {
    let steps = parse_steps("1k:1s,10k:500ms,0:200ms,5k:300ms").unwrap();
    assert_eq!(steps.len(), 4);
    let a = Arrivals {
        process: Process::Constant,
        steps: steps.clone(),
    };
    assert_eq!(a.duration(), Duration::from_millis(2000));
    let plan = a.plan(1);
    let count = |from: u64, to: u64| plan.iter().filter(|&&t| t >= from && t < to).count();
    let ms = 1_000_000;
    assert_eq!(count(0, 1000 * ms), 1000);
    assert_eq!(count(1000 * ms, 1500 * ms), 5000);
    assert_eq!(count(1500 * ms, 1700 * ms), 0);
    assert_eq!(count(1700 * ms, 2000 * ms), 1500);
    // The new rate starts exactly at the boundary.
    assert!(plan.contains(&(1000 * ms)) && plan.contains(&(1700 * ms)));
    assert_eq!(plan.len(), 7500);
    // Poisson steps: counts within 5σ of each step's expectation, none in
    // the silent step.
    let a = Arrivals {
        process: Process::Poisson,
        steps,
    };
    let plan = a.plan(11);
    let count = |from: u64, to: u64| plan.iter().filter(|&&t| t >= from && t < to).count() as f64;
    for (from, to, expect) in [
        (0, 1000 * ms, 1000.0),
        (1000 * ms, 1500 * ms, 5000.0),
        (1700 * ms, 2000 * ms, 1500.0),
    ] {
        let n = count(from, to);
        assert!(
            (n - expect).abs() < 5.0 * f64::sqrt(expect),
            "{n} arrivals in [{from}, {to}), expected about {expect}"
        );
    }
    assert_eq!(count(1500 * ms, 1700 * ms), 0.0);
    assert_eq!(
        a.offered_between(Duration::from_millis(500), Duration::from_millis(1600)),
        500.0 + 5000.0
    );
}

#[test]
fn bad_steps_and_rates_say_why() {
    assert!(parse_steps("1000").unwrap_err().contains("RATE:DURATION"));
    assert!(parse_steps("x:1s").unwrap_err().contains("not a rate"));
    assert!(parse_steps("10:1parsec").unwrap_err().contains("unit"));
    assert!(parse_steps("10:0s").unwrap_err().contains("positive"));
    assert!(parse_rate("-5").unwrap_err().contains("non-negative"));
    assert_eq!(parse_rate("2.5k").unwrap(), 2500.0);
    assert_eq!(parse_rate("1M").unwrap(), 1e6);
    let huge = Arrivals {
        process: Process::Poisson,
        steps: vec![Step {
            rate: 1e12,
            duration: Duration::from_secs(10),
        }],
    };
    assert!(huge.validate().unwrap_err().contains("at most"));
    let nan = Arrivals::steady(Process::Poisson, f64::NAN, Duration::from_secs(1));
    assert!(nan.validate().is_err());
}
