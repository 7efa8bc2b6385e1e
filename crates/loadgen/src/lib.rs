//! `ginza-loadgen`: the open-loop load generator of docs/design.md,
//! "Applications, load and experiments".
//!
//! * [`schedule`]: arrival times planned before the run (Poisson,
//!   constant, load steps; seeded).
//! * [`protocol`]: request encoders and response parsers (`echo`, `spin`,
//!   `memcached`, `http`).
//! * [`kernel`]: the Linux-socket backend: a few pinned threads, each
//!   driving many non-blocking UDP or TCP sockets with epoll.
//! * [`ginza`]: the Ginza-runtime backend: uthreads over
//!   `ginza_runtime::net`, through iokerneld's switch.
//! * [`record`]: HDR histograms of latency from the *scheduled* send time,
//!   per class; counts; the generator's own send lag.
//! * [`report`]: `--json` and the human summary, with
//!   `generator_saturated` when the generator fell behind its schedule.
//! * [`args`]: the command line (`ginza loadgen`, `loadgen`).
//! * [`calibrate`]: the generator's own capacity on this machine.
//!
//! How it works and what it measured: docs/loadgen.md.

#![forbid(unsafe_code)]

pub mod args;
pub mod calibrate;
pub mod clock;
pub mod ginza;
pub mod kernel;
pub mod protocol;
pub mod record;
pub mod report;
pub mod schedule;

use std::net::SocketAddr;
use std::time::Duration;

use protocol::{Transport, Workload};
use schedule::Arrivals;

/// A run, whatever the backend.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub target: SocketAddr,
    pub transport: Transport,
    pub workload: Workload,
    pub arrivals: Arrivals,
    /// The first part of the schedule: sent, not measured.
    pub warmup: Duration,
    /// Connections (TCP) or sockets (UDP); requests go round-robin.
    pub connections: usize,
    /// Kernel backend: OS threads, each driving a share of the
    /// connections. Ginza backend: kthreads.
    pub threads: usize,
    /// A request unanswered this long after its scheduled send times out.
    pub timeout: Duration,
    /// The p99 send lag beyond which the run is marked saturated.
    pub max_lag: Duration,
    /// A worker whose next send is this close busy-polls (kernel backend)
    /// or yields (Ginza backend) instead of sleeping (a sleeping CPU wakes
    /// late; a spinning one holds a CPU the server may need).
    pub spin: Duration,
    pub seed: u64,
    /// CPUs to pin the workers to (round-robin); empty: not pinned.
    pub cpus: Vec<usize>,
    pub connect_timeout: Duration,
}

impl RunConfig {
    /// Refuses configurations that cannot run, with the reason.
    pub fn validate(&self) -> Result<(), String> {
        self.arrivals.validate()?;
        self.workload.check(self.transport)?;
        if self.connections == 0 {
            return Err("at least one connection is needed (--connections)".into());
        }
        if self.threads == 0 {
            return Err("at least one thread is needed (--threads)".into());
        }
        if self.warmup >= self.arrivals.duration() {
            return Err(format!(
                "the warm-up ({:?}) leaves nothing of the {:?} schedule to measure",
                self.warmup,
                self.arrivals.duration()
            ));
        }
        if self.timeout.is_zero() {
            return Err("the timeout must be positive".into());
        }
        Ok(())
    }

    /// The connections worker `w` of `workers` drives: `c % workers == w`.
    pub fn connections_of(&self, w: usize, workers: usize) -> Vec<usize> {
        (w..self.connections).step_by(workers).collect()
    }

    /// The planned arrivals split by worker: request `i` goes on
    /// connection `i % connections`, driven by worker `connection %
    /// workers`; each worker's list holds (offset ns, index among its own
    /// connections).
    pub fn plan_by_worker(&self, workers: usize) -> Vec<Vec<(u64, u32)>> {
        let plan = self.arrivals.plan(self.seed);
        let mut out: Vec<Vec<(u64, u32)>> = (0..workers)
            .map(|_| Vec::with_capacity(plan.len() / workers + 1))
            .collect();
        for (i, t) in plan.into_iter().enumerate() {
            let c = i % self.connections;
            out[c % workers].push((t, (c / workers) as u32));
        }
        out
    }

    /// What the report says about the run's shape.
    pub(crate) fn facts(&self, backend: &'static str, threads: usize) -> report::RunFacts {
        let total = self.arrivals.duration();
        report::RunFacts {
            backend,
            transport: format!("{:?}", self.transport).to_lowercase(),
            protocol: match &self.workload {
                Workload::Echo(_) => "echo".into(),
                Workload::Spin(_) => "spin".into(),
                Workload::Memcached(m) => format!("memcached-{:?}", m.mix).to_lowercase(),
                Workload::Http(_) => "http".into(),
            },
            target: self.target.to_string(),
            arrivals: format!("{:?}", self.arrivals.process).to_lowercase(),
            connections: self.connections,
            threads,
            duration_s: (total - self.warmup).as_secs_f64(),
            warmup_s: self.warmup.as_secs_f64(),
            offered: self.arrivals.offered_between(self.warmup, total),
            max_lag_ns: self.max_lag.as_nanos() as u64,
            cpu_ns: 0,
            wall_ns: 0,
            steps: self
                .step_spans()
                .into_iter()
                .map(|(r, a, b)| (r, a.as_secs_f64(), b.as_secs_f64()))
                .collect(),
            step_offered: self
                .step_spans()
                .into_iter()
                .map(|(_, a, b)| self.arrivals.offered_between(a, b))
                .collect(),
        }
    }

    /// Each step's rate and its measured span (after the warm-up; empty
    /// for a step wholly inside it).
    pub fn step_spans(&self) -> Vec<(f64, Duration, Duration)> {
        let mut start = Duration::ZERO;
        let mut out = Vec::new();
        for s in &self.arrivals.steps {
            let end = start + s.duration;
            out.push((s.rate, start.max(self.warmup).min(end), end));
            start = end;
        }
        out
    }

    /// Where each step ends, ns on the generator's clock, for a run that
    /// starts at `start_ns`.
    pub fn step_ends_ns(&self, start_ns: u64) -> Vec<u64> {
        self.step_spans()
            .iter()
            .map(|&(_, _, end)| start_ns + end.as_nanos() as u64)
            .collect()
    }
}
