//! A run's results: `--json` (one object, [`Report`]) or a human summary.
//! When the generator fell behind its own schedule the report says so
//! (`generator_saturated`) and the summary warns that the latencies
//! measure the generator, not the server.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::record::Recorder;

/// Latency percentiles of one class, µs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Summary {
    pub fn of(h: &Histogram<u64>) -> Summary {
        let us = |ns: u64| ns as f64 / 1e3;
        if h.is_empty() {
            return Summary {
                count: 0,
                mean_us: 0.0,
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
            };
        }
        Summary {
            count: h.len(),
            mean_us: h.mean() / 1e3,
            p50_us: us(h.value_at_quantile(0.5)),
            p90_us: us(h.value_at_quantile(0.9)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// How late the generator sent against its schedule, µs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Lag {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// One load step's results (a sweep is a run with several steps).
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// The step's rate, requests/s.
    pub rate: f64,
    /// Where its measured part starts and ends, s from the run's start.
    pub start_s: f64,
    pub end_s: f64,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub sent: u64,
    pub completed: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub send_lag_p99_us: f64,
    /// The generator could not keep this step's schedule: its latencies
    /// are not the server's.
    pub generator_saturated: bool,
}

/// Everything a run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `kernel` (Linux sockets) or `ginza` (the Ginza runtime).
    pub backend: String,
    pub transport: String,
    pub protocol: String,
    pub target: String,
    /// `poisson` or `constant`.
    pub arrivals: String,
    pub connections: usize,
    pub threads: usize,
    /// The measured window (the schedule less the warm-up), s.
    pub duration_s: f64,
    pub warmup_s: f64,
    /// Requests/s the schedule offered in the measured window.
    pub offered_rps: f64,
    /// Good answers/s to requests scheduled in the measured window.
    pub achieved_rps: f64,
    pub sent: u64,
    pub completed: u64,
    pub error_answers: u64,
    pub timeouts: u64,
    pub errors: u64,
    pub unmatched: u64,
    /// Requests the generator never got to send (it was still behind when
    /// the schedule plus the timeout was over).
    pub unsent: u64,
    pub error_kinds: BTreeMap<String, u64>,
    /// All classes together.
    pub latency: Summary,
    /// By load step (one for a plain run), measured part only.
    pub steps: Vec<StepReport>,
    /// By class name.
    pub classes: BTreeMap<String, Summary>,
    pub send_lag: Lag,
    /// The bound on the send lag's p99 beyond which the run is not valid.
    pub max_lag_us: f64,
    /// True when the generator could not keep its schedule: the latencies
    /// then include the generator's own delay and say nothing about the
    /// server.
    pub generator_saturated: bool,
    /// Why the run is marked saturated.
    pub saturation_reason: Option<String>,
    /// CPU time of the generator's workers, s.
    pub generator_cpu_s: f64,
    /// That time over the workers' wall-clock time (1.0: each worker busy
    /// all the time).
    pub generator_cpu_util: f64,
    /// Measured by `--calibrate`: requests/s one generator core sustains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generator_capacity_rps_per_core: Option<f64>,
}

/// What a backend tells the report besides its recorder.
#[derive(Debug, Clone)]
pub struct RunFacts {
    pub backend: &'static str,
    pub transport: String,
    pub protocol: String,
    pub target: String,
    pub arrivals: String,
    pub connections: usize,
    pub threads: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub offered: f64,
    pub max_lag_ns: u64,
    pub cpu_ns: u64,
    pub wall_ns: u64,
    /// Each step's rate and measured span (s from the start): the steps
    /// wholly inside the warm-up are left out.
    pub steps: Vec<(f64, f64, f64)>,
    /// Requests offered in each of those spans.
    pub step_offered: Vec<f64>,
}

impl Report {
    pub fn new(facts: RunFacts, rec: &Recorder, classes: &[&str]) -> Report {
        let mut all = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
        let mut by_class = BTreeMap::new();
        for (name, h) in classes.iter().zip(&rec.latency) {
            all.add(h).expect("same bounds");
            by_class.insert(name.to_string(), Summary::of(h));
        }
        let lag = Lag {
            p50_us: rec.send_lag.value_at_quantile(0.5) as f64 / 1e3,
            p99_us: rec.send_lag.value_at_quantile(0.99) as f64 / 1e3,
            max_us: rec.send_lag.max() as f64 / 1e3,
        };
        let lag_p99_ns = rec.send_lag.value_at_quantile(0.99);
        let saturation_reason = if rec.unsent > 0 {
            Some(format!(
                "the generator never sent {} of the scheduled requests: it fell behind its schedule and did not catch up",
                rec.unsent
            ))
        } else if lag_p99_ns > facts.max_lag_ns {
            Some(format!(
                "1 % of the requests went out more than {:.1} µs late (p99 send lag > bound {:.1} µs): the generator cannot keep this schedule on this machine",
                lag.p99_us,
                facts.max_lag_ns as f64 / 1e3
            ))
        } else {
            None
        };
        let window = facts.duration_s.max(1e-9);
        let mut steps = Vec::new();
        for (i, &(rate, start_s, end_s)) in facts.steps.iter().enumerate() {
            let Some(r) = rec.steps.get(i) else { break };
            if end_s <= start_s {
                continue;
            }
            let span = end_s - start_s;
            let lag_p99 = r.send_lag.value_at_quantile(0.99);
            let q = |x: f64| r.latency.value_at_quantile(x) as f64 / 1e3;
            steps.push(StepReport {
                rate,
                start_s,
                end_s,
                offered_rps: facts.step_offered[i] / span,
                achieved_rps: r.ok as f64 / span,
                sent: r.sent,
                completed: r.ok,
                p50_us: q(0.5),
                p99_us: q(0.99),
                p999_us: q(0.999),
                send_lag_p99_us: lag_p99 as f64 / 1e3,
                generator_saturated: lag_p99 > facts.max_lag_ns,
            });
        }
        Report {
            backend: facts.backend.to_string(),
            transport: facts.transport,
            protocol: facts.protocol,
            target: facts.target,
            arrivals: facts.arrivals,
            connections: facts.connections,
            threads: facts.threads,
            duration_s: facts.duration_s,
            warmup_s: facts.warmup_s,
            offered_rps: facts.offered / window,
            achieved_rps: rec.ok as f64 / window,
            sent: rec.sent,
            completed: rec.ok,
            error_answers: rec.error_answers,
            timeouts: rec.timeouts,
            errors: rec.errors,
            unmatched: rec.unmatched,
            unsent: rec.unsent,
            error_kinds: rec.error_kinds.clone(),
            latency: Summary::of(&all),
            steps,
            classes: by_class,
            send_lag: lag,
            max_lag_us: facts.max_lag_ns as f64 / 1e3,
            generator_saturated: saturation_reason.is_some(),
            saturation_reason,
            generator_cpu_s: facts.cpu_ns as f64 / 1e9,
            generator_cpu_util: facts.cpu_ns as f64
                / (facts.wall_ns.max(1) as f64 * facts.threads.max(1) as f64),
            generator_capacity_rps_per_core: None,
        }
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }

    /// A few lines for people.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} load over {} to {} ({} backend, {} connection(s), {} thread(s), {} arrivals)",
            self.protocol,
            self.transport,
            self.target,
            self.backend,
            self.connections,
            self.threads,
            self.arrivals
        );
        let _ = writeln!(
            s,
            "offered {:.0} req/s, achieved {:.0} req/s over {:.2} s; sent {}, answered {}, error answers {}, timeouts {}, errors {}, unsent {}",
            self.offered_rps,
            self.achieved_rps,
            self.duration_s,
            self.sent,
            self.completed,
            self.error_answers,
            self.timeouts,
            self.errors,
            self.unsent
        );
        let _ = writeln!(
            s,
            "{:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "class", "count", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "mean µs"
        );
        let mut row = |name: &str, c: &Summary| {
            let _ = writeln!(
                s,
                "{:<8} {:>10} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                name, c.count, c.p50_us, c.p99_us, c.p999_us, c.max_us, c.mean_us
            );
        };
        for (name, c) in &self.classes {
            row(name, c);
        }
        if self.classes.len() > 1 {
            row("all", &self.latency);
        }
        let _ = writeln!(
            s,
            "send lag p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs; generator CPU {:.2} s ({:.0} % of its threads)",
            self.send_lag.p50_us,
            self.send_lag.p99_us,
            self.send_lag.max_us,
            self.generator_cpu_s,
            self.generator_cpu_util * 100.0
        );
        if self.steps.len() > 1 {
            let _ = writeln!(
                s,
                "{:>10} {:>12} {:>12} {:>10} {:>10} {:>10}  generator",
                "step rate", "offered/s", "achieved/s", "p50 µs", "p99 µs", "p99.9 µs"
            );
            for st in &self.steps {
                let _ = writeln!(
                    s,
                    "{:>10.0} {:>12.0} {:>12.0} {:>10.1} {:>10.1} {:>10.1}  {}",
                    st.rate,
                    st.offered_rps,
                    st.achieved_rps,
                    st.p50_us,
                    st.p99_us,
                    st.p999_us,
                    if st.generator_saturated {
                        "SATURATED"
                    } else {
                        "ok"
                    }
                );
            }
        }
        if !self.error_kinds.is_empty() {
            let kinds: Vec<String> = self
                .error_kinds
                .iter()
                .map(|(k, v)| format!("{k} ×{v}"))
                .collect();
            let _ = writeln!(s, "errors: {}", kinds.join("; "));
        }
        if let Some(c) = self.generator_capacity_rps_per_core {
            let _ = writeln!(
                s,
                "generator capacity: {c:.0} req/s per core on this machine"
            );
        }
        if let Some(why) = &self.saturation_reason {
            let _ = writeln!(
                s,
                "WARNING: GENERATOR SATURATED — {why}. The latencies above are not the server's."
            );
        }
        s
    }
}
