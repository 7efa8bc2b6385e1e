//! Arrival times, planned before the run starts (docs/design.md,
//! "Applications, load and experiments"): the generator never decides
//! *when* to send while it runs, so a slow reply cannot delay the next
//! request (no coordinated omission).
//!
//! A schedule is a list of [`Step`]s, each a rate held for a duration;
//! within a step arrivals are Poisson (exponential gaps) or constant
//! (exactly evenly spaced). A plain run is one step.

use std::time::Duration;

use rand::{rngs::SmallRng, SeedableRng};
use rand_distr::{Distribution, Exp};

/// How arrivals are spaced within a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Process {
    /// Exponential gaps: the open-loop arrivals of the papers.
    Poisson,
    /// Evenly spaced, `1/rate` apart.
    Constant,
}

/// A rate (requests/s) held for `duration`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub rate: f64,
    pub duration: Duration,
}

/// A whole run's arrival process.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrivals {
    pub process: Process,
    pub steps: Vec<Step>,
}

impl Arrivals {
    /// One rate for `duration`.
    pub fn steady(process: Process, rate: f64, duration: Duration) -> Arrivals {
        Arrivals {
            process,
            steps: vec![Step { rate, duration }],
        }
    }

    /// Refuses negative or non-finite rates, empty schedules and rates so
    /// high that the plan would not fit in memory.
    pub fn validate(&self) -> Result<(), String> {
        if self.steps.is_empty() {
            return Err("the schedule has no steps".into());
        }
        let mut total = 0.0;
        for (i, s) in self.steps.iter().enumerate() {
            if !s.rate.is_finite() || s.rate < 0.0 {
                return Err(format!(
                    "step {i}: rate {} is not a non-negative number",
                    s.rate
                ));
            }
            total += s.rate * s.duration.as_secs_f64();
        }
        if total > MAX_PLANNED as f64 {
            return Err(format!(
                "the schedule asks for about {total:.0} requests; at most {MAX_PLANNED} can be planned (shorten the run or lower the rate)"
            ));
        }
        Ok(())
    }

    /// The schedule's length.
    pub fn duration(&self) -> Duration {
        self.steps.iter().map(|s| s.duration).sum()
    }

    /// Requests offered between `from` and `to` (offsets from the start),
    /// by the rates (not by the planned arrivals).
    pub fn offered_between(&self, from: Duration, to: Duration) -> f64 {
        let mut start = Duration::ZERO;
        let mut n = 0.0;
        for s in &self.steps {
            let end = start + s.duration;
            let lo = from.max(start);
            let hi = to.min(end);
            if hi > lo {
                n += s.rate * (hi - lo).as_secs_f64();
            }
            start = end;
        }
        n
    }

    /// Send times in ns from the start of the run, ascending; the same for
    /// the same `seed`.
    pub fn plan(&self, seed: u64) -> Vec<u64> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out =
            Vec::with_capacity(self.offered_between(Duration::ZERO, self.duration()) as usize + 16);
        let mut step_start = 0u64;
        for s in &self.steps {
            let step_ns = s.duration.as_nanos() as u64;
            let step_end = step_start + step_ns;
            if s.rate > 0.0 {
                match self.process {
                    Process::Constant => {
                        let period = 1e9 / s.rate;
                        for k in 0u64.. {
                            let t = step_start + (k as f64 * period).round() as u64;
                            if t >= step_end {
                                break;
                            }
                            out.push(t);
                        }
                    }
                    Process::Poisson => {
                        // Memoryless: starting afresh at the step's start
                        // is still a Poisson process at the new rate.
                        let gap = Exp::new(s.rate / 1e9).expect("rate checked positive");
                        let mut t = step_start as f64;
                        loop {
                            t += gap.sample(&mut rng);
                            if t >= step_end as f64 {
                                break;
                            }
                            out.push(t as u64);
                        }
                    }
                }
            }
            step_start = step_end;
        }
        out
    }
}

/// The most arrivals one run plans (8 bytes each).
pub const MAX_PLANNED: u64 = 200_000_000;

/// Parses load steps, `RATE:DURATION[,RATE:DURATION…]` (e.g.
/// `10000:2s,50000:2s`).
pub fn parse_steps(s: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for part in s.split(',') {
        let (rate, duration) = part
            .split_once(':')
            .ok_or_else(|| format!("{part:?}: a step is RATE:DURATION (e.g. 10000:2s)"))?;
        let rate = parse_rate(rate)?;
        let duration = ginza_proto::parse_duration(duration)?;
        if duration.is_zero() {
            return Err(format!("{part:?}: a step needs a positive duration"));
        }
        steps.push(Step { rate, duration });
    }
    Ok(steps)
}

/// Parses a rate in requests/s: a number, optionally with a `k` or `M`
/// suffix (`50k` = 50,000).
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix(['k', 'K']) {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix('M') {
        (n, 1e6)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a rate in requests/s (e.g. 20000, 50k, 1M)"))?;
    let v = v * scale;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?}: a rate must be a non-negative number"));
    }
    Ok(v)
}
