//! One demo point (a policy at a load with a service distribution) and a
//! load-steps run: warm-up, the measured run with the sampler beside it,
//! and the row of figures made of what they measured.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::{LoadReport, LoadRun};
use ginza_net::Interface;

use super::args::{Policy, Workload};
use super::harness::{
    start_point, Setup, Started, LC_IP, LC_MAC, LC_PORT, REGISTER_TIMEOUT, STOP_WAIT,
};
use super::report::{self, Row};
use super::sample::{overdue, reallocations, sample};
use super::{phases, quiet};
use crate::harness::figures::round3;

/// After the last arrival of a load run, how long the generator waits for
/// replies (a backlog past saturation drains meanwhile, or is lost).
const DRAIN: Duration = Duration::from_millis(100);

/// A load run of the generator against `lc`: Poisson arrivals at `rate`
/// per second for `duration`.
fn load_run(service: ServiceTime, rate: f64, duration: Duration, seed: u64) -> LoadRun {
    let lc = Interface {
        mac: LC_MAC,
        ip: LC_IP,
    };
    let mut run = LoadRun::poisson(lc, LC_PORT, rate, service, duration);
    run.config.seed = seed;
    run.drain = DRAIN;
    run
}

/// Runs one policy at one load (a fraction of the managed cores' capacity)
/// with one service distribution: the point `ginza demo` and `ginza bench
/// run` (docs/experiments.md) share.
pub(crate) fn run_point(
    setup: &Setup,
    service: Workload,
    policy: Policy,
    load: f64,
    load_index: usize,
) -> anyhow::Result<Row> {
    let n = setup.managed.len();
    let Started {
        mut run,
        generator,
        socket,
        seed,
    } = start_point(setup, service, policy, load_index)?;
    let shared = run.shared.clone();
    let rate = load * n as f64 * 1e9 / service.dist.mean_ns();
    let mut notes = Vec::new();
    if !setup.warmup.is_zero() {
        generator
            .run(
                load_run(service.dist, rate, setup.warmup, seed ^ 1),
                STOP_WAIT,
            )
            .map_err(|e| anyhow!(e))
            .context("the warm-up run")?;
    }
    let busy0 = shared.spin.busy_ns.load(Relaxed);
    let cpus_before = quiet::snapshot();
    let from = Instant::now();
    let from_ns = ginza_sys::clock::monotonic_ns();
    let cancel = Arc::new(AtomicBool::new(false));
    let sampler = sample(
        socket.clone(),
        setup.iokernel_core,
        (from, from + setup.duration),
        Arc::clone(&shared.batch_paths),
        Arc::clone(&cancel),
    );
    let measured = generator
        .run(
            load_run(service.dist, rate, setup.duration, seed),
            STOP_WAIT,
        )
        .map_err(|e| anyhow!(e));
    let run_ns = from.elapsed().as_nanos() as u64;
    let to_ns = ginza_sys::clock::monotonic_ns();
    let ours: Vec<usize> = setup
        .managed
        .iter()
        .copied()
        .chain([setup.iokernel_core])
        .collect();
    let competition = cpus_before
        .zip(quiet::snapshot())
        .and_then(|(a, b)| quiet::measure(&a, &b, &ours));
    if measured.is_err() {
        cancel.store(true, Relaxed);
    }
    let samples = sampler
        .join()
        .map_err(|_| anyhow!("the stats sampler panicked"))?;
    // A run that failed while other processes held the CPUs says so: the
    // competition, not the allocator, is the likely cause (an application
    // starved past its stop deadline too: SCHED_IDLE batch gets no CPU
    // beside a spinning program).
    let blame = |e: anyhow::Error| match competition.and_then(|q| q.warning()) {
        Some(w) => e.context(w),
        None => e,
    };
    let report: LoadReport = measured.context("the measured run").map_err(blame)?;
    let busy_ns = shared.spin.busy_ns.load(Relaxed) - busy0;
    run.stop_lc().map_err(blame)?;
    // lc has returned: its trace is complete.
    let phases = phases::breakdown(
        &shared.spin.trace.records(),
        (from_ns, to_ns),
        shared.spin.trace.dropped(),
        &report.reply_transit,
    );
    let batch_alone = run.batch_alone(n).context("measuring batch alone")?;
    run.stop_batch_and_daemon().map_err(blame)?;
    if batch_alone.is_none() {
        notes.push(format!(
            "batch did not get the managed cores back within {REGISTER_TIMEOUT:?} of lc's end: not measured alone"
        ));
    }
    let batch_alone = batch_alone.unwrap_or(f64::NAN);

    let r3 = round3;
    let st = report.stats;
    let samples = samples.with_context(|| format!("{} at load {load}", policy.name()))?;
    if samples.errors > 0 {
        notes.push(format!("{} stats samples failed", samples.errors));
    }
    if st.lost() > 0 {
        notes.push(format!("{} requests unanswered", st.lost()));
    }
    let lag_p99_us = report.lag.value_at_quantile(0.99) as f64 / 1e3;
    if lag_p99_us > 50.0 {
        notes.push(format!("generator p99 lag {lag_p99_us:.0} µs"));
    }
    let (p50, p99, p999) = report::percentiles_us(&report.latency);
    let window_ns = samples
        .last
        .uptime_ns
        .saturating_sub(samples.first.uptime_ns);
    let paths_ns = u64::try_from(samples.paths_window.as_nanos()).unwrap_or(u64::MAX);
    let batch_paths_per_s = report::per_second(samples.paths.0, samples.paths.1, paths_ns);
    let achieved_load = report::achieved_load(busy_ns, run_ns, n);
    let mut row = Row {
        service: service.name,
        policy: policy.name(),
        offered_load: load,
        achieved_load: r3(achieved_load),
        p50_us: r3(p50),
        p99_us: r3(p99),
        p999_us: r3(p999),
        batch_mpaths_per_s: r3(batch_paths_per_s / 1e6),
        batch_alone_mpaths_per_s: r3(batch_alone / 1e6),
        batch_share_of_spare: r3(report::share_of_spare(
            batch_paths_per_s,
            batch_alone,
            achieved_load,
        )),
        p50_vs_static: f64::NAN,
        lc_cores: r3(report::mean(&samples.lc_cores)),
        batch_cores: r3(report::mean(&samples.batch_cores)),
        reallocations_per_s: r3(report::per_second(
            reallocations(&samples.first),
            reallocations(&samples.last),
            window_ns,
        )),
        withdrawn_per_s: r3(report::per_second(
            samples.first.alloc.preemptions_withdrawn,
            samples.last.alloc.preemptions_withdrawn,
            window_ns,
        )),
        local_wakes_per_s: r3(report::per_second(
            samples.first.alloc.local_wakes,
            samples.last.alloc.local_wakes,
            window_ns,
        )),
        local_wakes_by_iokernel_per_s: r3(report::per_second(
            samples.first.alloc.local_wakes_by_iokernel,
            samples.last.alloc.local_wakes_by_iokernel,
            window_ns,
        )),
        overdue_preemptions: overdue(&samples.last).saturating_sub(overdue(&samples.first)),
        lc_requests_sent: st.sent,
        lc_requests_answered: st.replies,
        foreign_cpu_pct: competition.map_or(f64::NAN, |q| r3(q.foreign_cpu_pct)),
        steal_pct: competition.map_or(f64::NAN, |q| r3(q.steal_pct)),
        quiet: match competition.map(|q| q.is_quiet()) {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        },
        note: String::new(),
        phases: Some(phases),
    };
    if let Some(w) = competition.and_then(|q| q.warning()) {
        log::warn!("{} at load {load}: {w}", policy.name());
    }
    if row.overdue_preemptions > 0 {
        notes.push(format!(
            "{} preemption(s) not answered within 1 ms",
            row.overdue_preemptions
        ));
    }
    row.note = notes.join("; ");
    Ok(row)
}

/// One sample of a load-steps run (Shenango Fig. 5-like).
#[derive(Clone, Debug)]
pub(crate) struct StepSample {
    /// Since the first step began.
    pub(crate) at: Duration,
    /// The step running then.
    pub(crate) step: usize,
    pub(crate) lc_cores: u32,
    pub(crate) batch_cores: u32,
    /// Batch paths/s since the previous sample.
    pub(crate) batch_paths_per_s: f64,
}

/// One step's latency, as iokerneld's generator measured it.
#[derive(Clone, Debug)]
pub(crate) struct StepFigures {
    pub(crate) load: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) sent: u64,
    pub(crate) answered: u64,
    pub(crate) note: String,
}

/// A load-steps run: cores over time, and each step's latency.
pub(crate) struct StepsReport {
    pub(crate) samples: Vec<StepSample>,
    pub(crate) steps: Vec<StepFigures>,
}

/// Runs `steps` (load as a fraction of capacity, for how long) back to back
/// on one iokerneld with `lc` and `batch`, sampling the cores each holds
/// every 10 ms: latency and cores over time under load steps (Shenango
/// Fig. 5 on this machine). The generator starts each step when the
/// previous one's replies are in (a gap of a few hundred µs).
pub(crate) fn run_steps(
    setup: &Setup,
    service: Workload,
    policy: Policy,
    steps: &[(f64, Duration)],
) -> anyhow::Result<StepsReport> {
    anyhow::ensure!(!steps.is_empty(), "no load steps");
    let n = setup.managed.len();
    let Started {
        mut run,
        generator,
        socket,
        seed,
    } = start_point(setup, service, policy, 0)?;
    let shared = run.shared.clone();
    let rate = |load: f64| load * n as f64 * 1e9 / service.dist.mean_ns();
    if !setup.warmup.is_zero() {
        generator
            .run(
                load_run(service.dist, rate(steps[0].0), setup.warmup, seed ^ 1),
                STOP_WAIT,
            )
            .map_err(|e| anyhow!(e))
            .context("the warm-up run")?;
    }
    let total: Duration = steps.iter().map(|s| s.1).sum();
    let from = Instant::now();
    let cancel = Arc::new(AtomicBool::new(false));
    let sampler = sample(
        socket.clone(),
        setup.iokernel_core,
        // Each step's drain adds a little: sample past the planned end.
        (from, from + total + DRAIN),
        Arc::clone(&shared.batch_paths),
        Arc::clone(&cancel),
    );
    let mut figures = Vec::new();
    let mut ends = Vec::new();
    for (i, &(load, duration)) in steps.iter().enumerate() {
        let mut r = load_run(
            service.dist,
            rate(load),
            duration,
            seed.wrapping_add(i as u64),
        );
        r.drain = Duration::from_millis(20);
        let report = match generator.run(r, STOP_WAIT).map_err(|e| anyhow!(e)) {
            Ok(r) => r,
            Err(e) => {
                cancel.store(true, Relaxed);
                let _ = sampler.join();
                return Err(e.context(format!("load step {i}")));
            }
        };
        ends.push(from.elapsed());
        let (p50, p99, p999) = report::percentiles_us(&report.latency);
        let st = report.stats;
        let mut notes = Vec::new();
        if st.lost() > 0 {
            notes.push(format!("{} requests unanswered", st.lost()));
        }
        let lag_p99_us = report.lag.value_at_quantile(0.99) as f64 / 1e3;
        if lag_p99_us > 50.0 {
            notes.push(format!("generator p99 lag {lag_p99_us:.0} µs"));
        }
        figures.push(StepFigures {
            load,
            p50_us: round3(p50),
            p99_us: round3(p99),
            p999_us: round3(p999),
            sent: st.sent,
            answered: st.replies,
            note: notes.join("; "),
        });
    }
    let samples = sampler
        .join()
        .map_err(|_| anyhow!("the stats sampler panicked"))?
        .context("sampling iokerneld during the steps")?;
    run.stop_all()?;
    let mut out = Vec::new();
    let mut prev = (Duration::ZERO, samples.paths.0);
    for (k, &at) in samples.at.iter().enumerate() {
        let step = ends
            .iter()
            .position(|&e| at <= e)
            .unwrap_or(steps.len() - 1);
        let paths = samples.paths_at[k];
        let dt = at.saturating_sub(prev.0).as_secs_f64();
        out.push(StepSample {
            at,
            step,
            lc_cores: samples.lc_cores[k],
            batch_cores: samples.batch_cores[k],
            batch_paths_per_s: if dt > 0.0 {
                paths.saturating_sub(prev.1) as f64 / dt
            } else {
                0.0
            },
        });
        prev = (at, paths);
    }
    Ok(StepsReport {
        samples: out,
        steps: figures,
    })
}
