//! What the two applications of `ginza demo` run inside their runtimes:
//! the latency-critical application's open-loop Poisson generator and its
//! spinning requests, and the batch application's Monte Carlo pricing.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, StandardNormal};

/// Mean service time of a synthetic request.
pub(crate) const MEAN_SERVICE: Duration = Duration::from_micros(10);

/// Largest latency the histograms hold; larger values are clamped (a point
/// that far past saturation is reported as such anyway).
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// An empty latency histogram (ns, 3 significant digits).
pub(crate) fn latency_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts (low 1 <= high / 2,
    // 3 digits); failing here is a programming error.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// Bursts per second that offer `load` of `cores` cores when each burst
/// carries `burst` requests of `mean_service` on average.
pub(crate) fn bursts_per_second(
    load: f64,
    cores: usize,
    mean_service: Duration,
    burst: u32,
) -> f64 {
    load * cores as f64 / mean_service.as_secs_f64() / f64::from(burst.max(1))
}

/// The intended start times of the bursts: a Poisson process, as offsets
/// from the start of the point. Drawn independently of when the generator
/// actually runs (open loop), so a late generator cannot thin the load.
pub(crate) struct BurstSchedule {
    rng: SmallRng,
    gap_ns: Exp<f64>,
    next_ns: f64,
}

impl BurstSchedule {
    pub(crate) fn new(bursts_per_s: f64, seed: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            bursts_per_s.is_finite() && bursts_per_s > 0.0,
            "burst rate {bursts_per_s} per second is not a positive number"
        );
        let gap_ns = Exp::new(bursts_per_s / 1e9)
            .map_err(|e| anyhow::anyhow!("burst rate {bursts_per_s}/s: {e}"))?;
        Ok(Self {
            rng: SmallRng::seed_from_u64(seed),
            gap_ns,
            next_ns: 0.0,
        })
    }

    /// The next burst's offset in ns (non-decreasing).
    pub(crate) fn next_ns(&mut self) -> u64 {
        self.next_ns += self.gap_ns.sample(&mut self.rng);
        self.next_ns as u64
    }
}

/// How the latency-critical application's generator runs one point.
#[derive(Clone, Debug)]
pub(crate) struct LcPlan {
    pub(crate) burst: u32,
    pub(crate) bursts_per_s: f64,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    /// After the window, a generator this far behind stops issuing bursts
    /// (the point is past saturation; waiting longer tells nothing more).
    pub(crate) grace: Duration,
    pub(crate) seed: u64,
}

/// What the generator measured.
pub(crate) struct LcOutcome {
    /// Completion − intended arrival, ns, of the requests that arrived in
    /// the measured window.
    pub(crate) latencies: Histogram<u64>,
    /// Requests that arrived in the window and were issued (all of them
    /// complete before the generator returns).
    pub(crate) issued_in_window: u64,
    /// Service times of the requests (whenever they arrived) that
    /// completed inside the window: the achieved load.
    pub(crate) service_ns_in_window: u64,
    /// The generator fell `grace` behind and stopped issuing bursts.
    pub(crate) gave_up: bool,
    /// The demo asked to abort before the point started.
    pub(crate) aborted: bool,
}

/// Counters every request updates. The histogram sits behind a std mutex
/// taken with preemption deferred: the section is a few ns and is never
/// preempted half-way, so no sample is lost and no uthread waits long.
struct Tally {
    latencies: std::sync::Mutex<Histogram<u64>>,
    service_ns_in_window: AtomicU64,
}

/// Spins (wall clock) for `d`: the synthetic request's work.
fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Polling period while waiting for the demo to set the start time.
const START_POLL: Duration = Duration::from_micros(200);

/// What the demo and the generator share.
#[derive(Clone)]
pub(crate) struct LcControl {
    /// Origin of `sleeping_until`.
    pub(crate) base: Instant,
    /// Set once by the demo: the point's time zero.
    pub(crate) start: Arc<OnceLock<Instant>>,
    /// Stop issuing bursts (the point failed or is stuck).
    pub(crate) abort: Arc<AtomicBool>,
    /// While the generator sleeps: its deadline, ns after `base`; 0 while
    /// it runs. The demo tells a timer nobody woke from a busy core by it.
    pub(crate) sleeping_until: Arc<AtomicU64>,
    /// The runtime, so the demo can hand it work from outside (which
    /// iokerneld sees queued) to wake a generator whose timer was missed.
    pub(crate) handle: Arc<OnceLock<ginza_runtime::Handle>>,
}

impl LcControl {
    pub(crate) fn new() -> Self {
        LcControl {
            base: Instant::now(),
            start: Arc::default(),
            abort: Arc::default(),
            sleeping_until: Arc::default(),
            handle: Arc::default(),
        }
    }

    /// Sleeps the calling uthread until `t`, visibly to the demo.
    fn sleep_until(&self, t: Instant) {
        let ns = t.saturating_duration_since(self.base).as_nanos();
        self.sleeping_until
            .store(u64::try_from(ns).unwrap_or(u64::MAX).max(1), Relaxed);
        ginza_runtime::sleep_until(t);
        self.sleeping_until.store(0, Relaxed);
    }

    /// The deadline the generator has been sleeping for, if it sleeps.
    pub(crate) fn sleeping_until(&self) -> Option<Instant> {
        match self.sleeping_until.load(Relaxed) {
            0 => None,
            ns => Some(self.base + Duration::from_nanos(ns)),
        }
    }
}

/// The latency-critical application's main uthread: waits until `start`
/// is set (or `abort`), then issues Poisson bursts of spinning request
/// uthreads until the end of the window and waits for all of them.
pub(crate) fn lc_main(plan: LcPlan, ctl: LcControl) -> anyhow::Result<LcOutcome> {
    if let Some(h) = ginza_runtime::Handle::current() {
        let _ = ctl.handle.set(h);
    }
    let mut schedule = BurstSchedule::new(plan.bursts_per_s, plan.seed)?;
    let mut rng = SmallRng::seed_from_u64(plan.seed.rotate_left(17) ^ 0x5e41_1ce5);
    let service_ns = Exp::new(1.0 / MEAN_SERVICE.as_nanos() as f64)
        .map_err(|e| anyhow::anyhow!("service time distribution: {e}"))?;
    let tally = Arc::new(Tally {
        latencies: std::sync::Mutex::new(latency_histogram()),
        service_ns_in_window: AtomicU64::new(0),
    });
    // Waiting with timers (not spinning) so that, like the bursts below,
    // the wake-up goes through iokerneld when the application has parked.
    let t0 = loop {
        if ctl.abort.load(Relaxed) {
            return Ok(LcOutcome {
                latencies: latency_histogram(),
                issued_in_window: 0,
                service_ns_in_window: 0,
                gave_up: false,
                aborted: true,
            });
        }
        if let Some(&t) = ctl.start.get() {
            break t;
        }
        ctl.sleep_until(Instant::now() + START_POLL);
    };
    let win_start = t0 + plan.warmup;
    let win_end = win_start + plan.duration;
    let give_up_at = win_end + plan.grace;
    let wg = Arc::new(ginza_runtime::WaitGroup::new());
    let mut issued_in_window = 0u64;
    let mut gave_up = false;
    loop {
        let at = t0 + Duration::from_nanos(schedule.next_ns());
        if at >= win_end {
            break;
        }
        let now = Instant::now();
        if now >= give_up_at || ctl.abort.load(Relaxed) {
            gave_up = true;
            break;
        }
        // Behind schedule: issue at once, never skip (open loop).
        if at > now {
            ctl.sleep_until(at);
        }
        let measured = at >= win_start;
        wg.add(plan.burst as usize);
        for _ in 0..plan.burst {
            let service = Duration::from_nanos(service_ns.sample(&mut rng) as u64);
            let tally = Arc::clone(&tally);
            let wg = Arc::clone(&wg);
            if measured {
                issued_in_window += 1;
            }
            // Detached: the wait group tells when all are done.
            drop(ginza_runtime::spawn(move || {
                spin_for(service);
                let done = Instant::now();
                if measured {
                    let ns = done.saturating_duration_since(at).as_nanos();
                    let ns = u64::try_from(ns).unwrap_or(u64::MAX).max(1);
                    ginza_runtime::without_preemption(|| {
                        tally
                            .latencies
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .saturating_record(ns);
                    });
                }
                if done >= win_start && done < win_end {
                    let ns = u64::try_from(service.as_nanos()).unwrap_or(u64::MAX);
                    tally.service_ns_in_window.fetch_add(ns, Relaxed);
                }
                wg.done();
            }));
        }
    }
    wg.wait();
    let latencies = ginza_runtime::without_preemption(|| {
        std::mem::replace(
            &mut *tally.latencies.lock().unwrap_or_else(|p| p.into_inner()),
            latency_histogram(),
        )
    });
    Ok(LcOutcome {
        latencies,
        issued_in_window,
        service_ns_in_window: tally.service_ns_in_window.load(Relaxed),
        gave_up,
        aborted: false,
    })
}

/// The option the batch application prices: a European call, spot 100,
/// strike 105, rate 5 %, volatility 20 %, one year. Black–Scholes value
/// 8.0214, which the Monte Carlo estimate must approach.
const SPOT: f64 = 100.0;
const STRIKE: f64 = 105.0;
const RATE: f64 = 0.05;
const VOL: f64 = 0.2;
const YEARS: f64 = 1.0;

/// Paths per chunk between two `yield_now`s: about 25 µs of arithmetic
/// (measured about 10 ns a path on the 2-vCPU development VM), so busy
/// time is published and preemption points come often while each chunk is
/// still real work; a preemption signal does not wait for the chunk's end.
pub(crate) const PATHS_PER_CHUNK: u64 = 2560;

/// Sum of the call's payoffs at expiry over `n` simulated paths
/// (geometric Brownian motion, one step).
pub(crate) fn payoff_sum<R: Rng>(rng: &mut R, n: u64) -> f64 {
    let drift = (RATE - 0.5 * VOL * VOL) * YEARS;
    let vol = VOL * YEARS.sqrt();
    let mut sum = 0.0;
    for _ in 0..n {
        let z: f64 = rng.sample(StandardNormal);
        let st = SPOT * (drift + vol * z).exp();
        sum += (st - STRIKE).max(0.0);
    }
    sum
}

/// Discounted mean payoff: the Monte Carlo price.
pub(crate) fn price(payoff_sum: f64, paths: u64) -> f64 {
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
pub(crate) fn batch_main(
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
                    sum += black_box(payoff_sum(&mut rng, PATHS_PER_CHUNK));
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
    fn burst_rate_offers_the_requested_load() {
        // Half of one core, 10 µs requests in bursts of 8: 50 000 requests
        // a second, 6 250 bursts.
        let r = bursts_per_second(0.5, 1, MEAN_SERVICE, 8);
        assert!((r - 6250.0).abs() < 1e-6, "{r}");
        let r = bursts_per_second(0.9, 3, MEAN_SERVICE, 1);
        assert!((r - 270_000.0).abs() < 1e-6, "{r}");
    }

    #[test]
    fn schedule_is_poisson_with_the_requested_rate() {
        let rate = 6250.0;
        let mut s = BurstSchedule::new(rate, 7).unwrap();
        let n = 200_000;
        let mut prev = 0;
        let mut gaps = Vec::with_capacity(n);
        for _ in 0..n {
            let t = s.next_ns();
            assert!(t >= prev, "arrivals go back in time");
            gaps.push((t - prev) as f64);
            prev = t;
        }
        let mean = gaps.iter().sum::<f64>() / n as f64;
        let expect = 1e9 / rate;
        assert!(
            (mean / expect - 1.0).abs() < 0.01,
            "mean gap {mean} ns, expected {expect}"
        );
        // Exponential gaps: the standard deviation equals the mean.
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.02,
            "cv {}",
            var.sqrt() / mean
        );
        // Same seed, same schedule: every policy sees the same arrivals.
        let mut a = BurstSchedule::new(rate, 7).unwrap();
        let mut b = BurstSchedule::new(rate, 7).unwrap();
        assert!((0..100).all(|_| a.next_ns() == b.next_ns()));
    }

    #[test]
    fn schedule_refuses_a_rate_that_is_not_positive() {
        assert!(BurstSchedule::new(0.0, 1).is_err());
        assert!(BurstSchedule::new(f64::NAN, 1).is_err());
        assert!(BurstSchedule::new(-3.0, 1).is_err());
    }

    #[test]
    fn monte_carlo_price_approaches_black_scholes() {
        let mut rng = SmallRng::seed_from_u64(3);
        let n = 400_000;
        let p = price(payoff_sum(&mut rng, n), n);
        assert!((p - 8.0214).abs() < 0.1, "price {p}");
        assert_eq!(price(0.0, 0), 0.0);
    }
}
