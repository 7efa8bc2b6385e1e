//! `ginza bench preempt`: what one preemption costs in Shinjuku mode, for the
//! cooperative flag and for the signal, and how many requests per second one
//! dispatcher hands out.
//!
//! Everything runs in one process, in one run, with the dispatcher pinned to
//! one CPU and a single worker pinned to another (`--cores D,W`; default: the
//! two last CPUs this process may use).
//!
//! * **Preemption cost.** `--requests` identical long requests (a fixed
//!   number of iterations of a multiply-add chain, calibrated to `--work-ms`)
//!   are submitted at once to the worker under c-PRE-SQ (tail placement), so
//!   another request always waits and the running one is preempted every
//!   quantum. `coop` is `Preemption::Cooperative { backstop: None }` with the
//!   loop calling `preempt_point()` every 64 iterations, and the runtime's
//!   default pre-assignment of the next request as the flag is set;
//!   `coop_roundtrip` the same without it (`pre_assign_on_preempt: false`:
//!   the worker waits for the dispatcher to see its report and assign the
//!   next request, the behaviour before issue #16's fix); `signal` is
//!   `Preemption::Signal` with no preemption point in the loop. The baseline
//!   runs the same requests under c-FCFS (never preempted) with the loop
//!   without `preempt_point()`, so the cooperative loss includes polling.
//!   T is the worker's makespan: last completion minus first arrival (the
//!   worker is never idle in between for want of work; thread start-up and
//!   shutdown are left out, unlike `ServeReport::elapsed`).
//!   `loss_pct = (T_q - T_base) / T_base * 100`;
//!   `worker_ns = (T_q - T_base) / preemptions` (everything the worker loses
//!   per preemption: noticing, switching out, reporting, and waiting for the
//!   dispatcher to hand it the next request);
//!   `dispatcher_ns` = the dispatcher's own time to ask (flag store, or flag
//!   store + `tgkill`), `latency_ns` = ask to the worker's report that the
//!   request is off its core, both from `ServeReport::preemption_samples`.
//!   Each configuration runs `--reps` times (interleaved); per-run medians
//!   and percentiles, then the median over runs. `coop` / `signal` are given
//!   at a 10 µs quantum; `loss_pct` at 5, 10 and 15 µs.
//! * **Where a cooperative preemption's time goes** (`components_ns`, 5 µs
//!   quantum, `coop` and `coop_roundtrip`): spans stamped by the dispatcher
//!   and the worker with the runtime's clock (`PreemptionSample`): `late_ns`
//!   (quantum end → flag set), `ask_to_off_ns` (flag set → the request's
//!   report that it is off its core), `off_to_next_start_ns` (→ the worker
//!   switches into the next request), `took_next` (the fraction handed
//!   over through the second slot), beside `worker_ns`, the CPU time lost
//!   per preemption; and the worker's own TSC spans (`worker_*_ns`,
//!   `ShinjukuConfig::record_worker_spans`, in runs of their own so their
//!   TSC reads stay out of `loss_pct`): observe, yield out, hand-over,
//!   switch in, their sum `worker_direct_ns`, and the loss it accounts
//!   for (`direct_loss_per_quantum_pct`, `direct_loss_pct`).
//! * **Dispatch rates.** `--tiny` requests whose handler returns at once,
//!   from a source that always has the next one ready (up to 256 in
//!   flight), c-FCFS: completions / (last completion - first arrival), in
//!   three configurations, interleaved, `--reps` runs each, medians:
//!   `handoff_roundtrip_mrps` (one worker, no pre-assignment: every request
//!   is a round trip between the two CPUs, so this is a hand-off rate, not
//!   the dispatcher's capacity); `preassigned_mrps` (one worker, the next
//!   request pre-assigned in the mailbox's second slot, hiding the round
//!   trip); `dispatcher_capacity_mrps` (pre-assignment, as many workers as
//!   there are allowed CPUs besides the dispatcher's, `capacity_workers`).
//!   On a 2-CPU machine the last has one worker and equals the second in
//!   kind: the worker may still be the bound.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_runtime::shinjuku::{
    serve, Arrival, Placement, Preemption, PreemptionSample, SchedPolicy, ShinjukuConfig, Source,
    WorkerSpans,
};
use ginza_sys::clock;
use serde::Serialize;

use crate::harness::figures::{allowed_cpus, emit, loadavg, median, percentile, round3};
use crate::harness::work::{chunked, makespan_ns, Cores};

/// Arguments of `ginza bench preempt`.
#[derive(clap::Args, Debug)]
pub struct PreemptArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Dispatcher and worker CPUs, `D,W` (default: the two last CPUs this
    /// process may use).
    #[arg(long, value_delimiter = ',')]
    cores: Vec<usize>,
    /// Runs per configuration; medians over runs are reported.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Long requests submitted at once in each preemption run.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..))]
    requests: u64,
    /// Work of each long request, ms (converted once to an iteration count).
    #[arg(long, default_value_t = 20.0)]
    work_ms: f64,
    /// Tiny requests for the dispatcher-rate run.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    tiny: u64,
}

/// The quanta measured, µs.
const QUANTA_US: [u64; 3] = [5, 10, 15];
/// The quantum whose figures go into `coop` / `signal`.
const REPORTED_QUANTUM_US: u64 = 10;
/// Iterations between two preemption points in the cooperative loop.
const POLL_EVERY: u64 = 64;

/// The long requests' work: `iters` steps of a xorshift generator (a chain
/// of dependent shifts and xors the compiler cannot fold), in chunks of
/// [`POLL_EVERY`] steps; with `POLL`, a preemption point after each chunk.
/// Both variants run the same chunked loop, so they differ only by the
/// preemption point.
#[inline(never)]
pub(super) fn chain<const POLL: bool>(iters: u64, seed: u64) -> u64 {
    chunked::<POLL>(iters, POLL_EVERY, seed)
}

/// Nanoseconds per step of [`chain`] (without polling), best of a few tries
/// on the calling thread.
fn chain_ns_per_iter() -> f64 {
    const N: u64 = 2_000_000;
    (0..5)
        .map(|s| {
            let t = Instant::now();
            black_box(chain::<false>(black_box(N), s));
            t.elapsed().as_nanos() as f64 / N as f64
        })
        .fold(f64::INFINITY, f64::min)
        .max(0.01)
}

/// Releases `n` requests in the first dispatcher pass at least `after_ns`
/// into the run, all arriving then.
struct AllAtOnce {
    left: u64,
    after_ns: u64,
}

impl Source<u64> for AllAtOnce {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<u64>> {
        if self.left == 0 || now_ns < self.after_ns {
            return None;
        }
        self.left -= 1;
        Some(Arrival {
            class: 0,
            at_ns: now_ns,
            payload: self.left,
        })
    }
    fn is_done(&self) -> bool {
        self.left == 0
    }
}

/// Always has the next tiny request ready while fewer than `window` are in
/// flight (released, not yet reported completed to the dispatcher), so the
/// dispatcher never waits for work and the runtime never holds more than
/// `window` request contexts. Completions are counted through
/// `Source::completed`, on the dispatcher's thread: a counter every
/// worker's handler wrote would be a cache line moved to the dispatcher on
/// every poll, a cost of the benchmark and not of the runtime.
struct Flood {
    left: u64,
    released: u64,
    window: u64,
    finished: u64,
}

impl Source<()> for Flood {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<()>> {
        if self.left == 0 || self.released - self.finished >= self.window {
            return None;
        }
        self.left -= 1;
        self.released += 1;
        Some(Arrival {
            class: 0,
            at_ns: now_ns,
            payload: (),
        })
    }
    fn is_done(&self) -> bool {
        self.left == 0
    }
    fn completed(&mut self, _id: u64) {
        self.finished += 1;
    }
}

/// A preemption mechanism under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mech {
    /// The cooperative flag, the next request pre-assigned as the flag is
    /// set (the runtime's default).
    Coop,
    /// The cooperative flag, the next request assigned only after the
    /// worker's report (`pre_assign_on_preempt: false`): a round trip
    /// through the dispatcher per preemption.
    CoopRoundTrip,
    Signal,
}

impl Mech {
    const ALL: [Mech; 3] = [Mech::Coop, Mech::CoopRoundTrip, Mech::Signal];

    fn name(self) -> &'static str {
        match self {
            Mech::Coop => "coop",
            Mech::CoopRoundTrip => "coop_roundtrip",
            Mech::Signal => "signal",
        }
    }

    fn polls(self) -> bool {
        self != Mech::Signal
    }
}

/// One run of the long requests.
#[derive(Clone, Debug, Default)]
struct LongRun {
    /// The worker thread's CPU time from the first request's start to the
    /// last one's end.
    worker_cpu_ns: u64,
    makespan_ns: u64,
    /// Signals were sent but none preempted (see `meta.signal_runs_left_out`).
    dud: bool,
    preemptions: u64,
    dispatcher_ns: Option<f64>,
    p50_ns: Option<f64>,
    p99_ns: Option<f64>,
    /// Medians over this run's preemptions of the spans of one preemption.
    late_ns: Option<f64>,
    resume_ns: Option<f64>,
    /// Fraction of preemptions after which the worker switched straight
    /// into a pre-assigned request.
    took_next: Option<f64>,
    /// The worker's own TSC spans of its cooperative preemptions.
    spans: Option<WorkerSpans>,
}

impl LongRun {
    /// The worker's direct loss (its own TSC spans: yield out, hand-over,
    /// switch in, times the preemptions) in % of `t_base`.
    fn direct_loss_pct(&self, t_base: f64) -> Option<f64> {
        let per = self.spans?.direct_ns_per_preemption()?;
        Some(per * self.preemptions as f64 / t_base * 100.0)
    }
}

/// Long requests under `mech` at `quantum_us`, or the c-FCFS baseline when
/// `mech` is `None`.
fn long_run(
    cores: Cores,
    mech: Option<(Mech, u64)>,
    requests: u64,
    iters: u64,
    worker_spans: bool,
) -> anyhow::Result<LongRun> {
    let (policy, preemption, poll) = match mech {
        None => (
            SchedPolicy::CFcfs,
            Preemption::Cooperative { backstop: None },
            false,
        ),
        Some((Mech::Coop, 0)) => (
            SchedPolicy::CFcfs,
            Preemption::Cooperative { backstop: None },
            true,
        ),
        Some((m, q_us)) => (
            SchedPolicy::CPreSq {
                quantum: q_us * 1000,
                placement: Placement::Tail,
            },
            match m {
                Mech::Coop | Mech::CoopRoundTrip => Preemption::Cooperative { backstop: None },
                Mech::Signal => Preemption::Signal,
            },
            m.polls(),
        ),
    };
    let config = ShinjukuConfig {
        record_preemptions: mech.is_some(),
        record_worker_spans: worker_spans,
        pre_assign_on_preempt: !matches!(mech, Some((Mech::CoopRoundTrip, _))),
        // All of them are in flight at once: none may be refused.
        max_in_flight: usize::try_from(requests).unwrap_or(usize::MAX),
        ..cores.config(policy, preemption)
    };
    let source = AllAtOnce {
        left: requests,
        after_ns: 1_000_000,
    };
    let report = serve(config, source, move |seed: u64| {
        let start = clock::thread_cpu_ns();
        let value = if poll {
            chain::<true>(iters, seed)
        } else {
            chain::<false>(iters, seed)
        };
        (start, clock::thread_cpu_ns(), value)
    })
    .context("serving the long requests")?;
    anyhow::ensure!(
        report.completions.len() as u64 == requests
            && report.completions.iter().all(|c| c.result.is_ok()),
        "a long request was lost or failed"
    );
    let preemptions: u64 = report
        .completions
        .iter()
        .map(|c| u64::from(c.preemptions))
        .sum();
    let dispatcher: Vec<f64> = report
        .preemption_samples
        .iter()
        .map(|s| s.dispatcher_ns as f64)
        .collect();
    let mut handback: Vec<u64> = report
        .preemption_samples
        .iter()
        .map(|s| s.handback_ns)
        .collect();
    handback.sort_unstable();
    let span_median = |f: fn(&PreemptionSample) -> Option<u64>| {
        let v: Vec<f64> = report
            .preemption_samples
            .iter()
            .filter_map(f)
            .map(|x| x as f64)
            .collect();
        median(&v)
    };
    let samples = report.preemption_samples.len();
    // One worker: every request ran on the same OS thread, so its CPU clock
    // spans them all.
    let cpu = |f: fn(&(u64, u64, u64)) -> u64| {
        report
            .completions
            .iter()
            .filter_map(move |c| c.result.as_ref().ok().map(f))
    };
    let first = cpu(|r| r.0).min().unwrap_or(0);
    let last = cpu(|r| r.1).max().unwrap_or(0);
    Ok(LongRun {
        worker_cpu_ns: last.saturating_sub(first),
        dud: report.signals_sent > 0 && report.signal_preemptions == 0,
        makespan_ns: makespan_ns(&report),
        preemptions,
        dispatcher_ns: median(&dispatcher),
        p50_ns: percentile(&handback, 50.0).map(|v| v as f64),
        p99_ns: percentile(&handback, 99.0).map(|v| v as f64),
        late_ns: span_median(|s| Some(s.late_ns)),
        resume_ns: span_median(|s| s.resume_ns),
        took_next: (samples > 0).then(|| {
            report
                .preemption_samples
                .iter()
                .filter(|s| s.took_next)
                .count() as f64
                / samples as f64
        }),
        spans: report.worker_spans,
    })
}

/// The tiny-request run: millions of completions per second, with
/// `workers` (CPUs; `None`: the one worker of `cores`), with or without
/// pre-assignment.
fn dispatch_mrps(
    cores: Cores,
    n: u64,
    workers: Option<&[usize]>,
    pre_assign: bool,
) -> anyhow::Result<f64> {
    let source = Flood {
        left: n,
        released: 0,
        window: 256,
        finished: 0,
    };
    let mut config = ShinjukuConfig {
        pre_assign,
        ..cores.config(SchedPolicy::CFcfs, Preemption::default())
    };
    if let Some(w) = workers {
        config.workers = w.len();
        config.worker_cores = Some(w.to_vec());
    }
    let report = serve(config, source, |()| ()).context("serving the tiny requests")?;
    anyhow::ensure!(
        report.completions.len() as u64 == n,
        "{} of {n} tiny requests completed",
        report.completions.len()
    );
    let ns = makespan_ns(&report).max(1);
    Ok(n as f64 / ns as f64 * 1e3)
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Latency {
    p50: Option<f64>,
    p99: Option<f64>,
}

/// One mechanism's figures at the reported quantum.
#[derive(Clone, Copy, Debug, Serialize)]
struct MechFigures {
    dispatcher_ns: Option<f64>,
    worker_ns: Option<f64>,
    latency_ns: Latency,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Loss {
    coop: Option<f64>,
    coop_roundtrip: Option<f64>,
    signal: Option<f64>,
}

/// Where one cooperative preemption's time goes, at the 5 µs quantum:
/// spans stamped with the runtime's clock by the dispatcher and the worker
/// (`PreemptionSample`), medians over runs of per-run medians.
#[derive(Clone, Copy, Debug, Serialize)]
struct Spans {
    /// Worker CPU time lost per preemption (the loss over the baseline,
    /// divided by the preemptions).
    worker_ns: Option<f64>,
    /// End of the quantum → the dispatcher sets the flag (its pass).
    late_ns: Option<f64>,
    /// Flag set → the worker's report that the request is off its core:
    /// the flag's cache line, the wait for the next preemption point
    /// (useful work goes on meanwhile), the yield and the switch out.
    ask_to_off_ns: Option<f64>,
    /// Off its core → the worker switches into the next request: the
    /// round trip through the dispatcher, or the hand-over of the request
    /// pre-assigned as the flag was set (no useful work meanwhile).
    off_to_next_start_ns: Option<f64>,
    /// Fraction of preemptions after which the worker took the
    /// pre-assigned request itself.
    took_next: Option<f64>,
    /// From the worker's own TSC (`ShinjukuConfig::record_worker_spans`, in
    /// runs of their own), median ns per preemption: the dispatcher's store of the ask → the
    /// worker finds it at a preemption point (useful work up to the point,
    /// and the line's transfer; two CPUs' TSCs).
    worker_observe_ns: Option<f64>,
    /// The ask found → the worker loop (yield path, switch out).
    worker_yield_out_ns: Option<f64>,
    /// The worker loop → switching into the next request (report, second
    /// slot, stamps).
    worker_handover_ns: Option<f64>,
    /// Switching into the next request → its code runs again.
    worker_switch_in_ns: Option<f64>,
    /// The three above: the worker's direct CPU loss per preemption.
    worker_direct_ns: Option<f64>,
    /// `worker_direct_ns` over the 5 µs quantum, %: the direct loss were
    /// every quantum to end in a preemption (on a loaded machine the
    /// dispatcher preempts less often than that, which `direct_loss_pct`
    /// reflects and this does not).
    direct_loss_per_quantum_pct: Option<f64>,
    /// `worker_direct_ns` × preemptions over the baseline's CPU time, %:
    /// the loss the worker's own spans account for (`loss_pct` minus it is
    /// the indirect part: cold caches after switches, polling, and noise).
    direct_loss_pct: Option<f64>,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Components {
    coop: Spans,
    coop_roundtrip: Spans,
}

/// Per quantum: the cooperative loss the worker's own TSC spans account
/// for (`Spans::direct_loss_pct`).
#[derive(Clone, Copy, Debug, Serialize)]
struct DirectLoss {
    coop: Option<f64>,
    coop_roundtrip: Option<f64>,
}

/// At the 5 µs quantum, from runs of their own with the worker's spans on.
#[derive(Clone, Copy, Debug, Serialize)]
struct DirectLossPct {
    #[serde(rename = "5us")]
    q5: DirectLoss,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct LossPct {
    #[serde(rename = "5us")]
    q5: Loss,
    #[serde(rename = "10us")]
    q10: Loss,
    #[serde(rename = "15us")]
    q15: Loss,
}

#[derive(Clone, Debug, Serialize)]
struct Meta {
    cores: Cores,
    reps: u64,
    requests_per_run: u64,
    iters_per_request: u64,
    ns_per_iter: f64,
    poll_every_iters: u64,
    baseline_worker_cpu_ms: Option<f64>,
    baseline_makespan_ms: Option<f64>,
    /// c-FCFS with the polling loop vs without: the polling cost alone.
    poll_only_loss_pct: Option<f64>,
    /// Per quantum (µs) and mechanism: the loss computed from wall makespans.
    wall_loss_pct: Vec<(u64, &'static str, Option<f64>)>,
    /// Signal runs in which signals were sent but not one preempted the
    /// request (a runtime defect, reported separately); left out of the
    /// medians.
    signal_runs_left_out: usize,
    /// Per quantum (µs) and mechanism: median preemptions per run.
    preemptions_per_run: Vec<(u64, &'static str, Option<f64>)>,
    reported_quantum_us: u64,
    /// `loss_pct.5us.coop` of each run (against the baseline's median), in
    /// run order: how stable the median is.
    loss_5us_coop_runs: Vec<f64>,
    /// The dispatcher's and the worker's CPUs are hyperthreads of one core
    /// (then the dispatcher's spinning slows the worker in every run).
    cores_are_siblings: Option<bool>,
    /// `/proc/loadavg` (1, 5, 15 minutes) before and after.
    loadavg_before: Option<String>,
    loadavg_after: Option<String>,
    tiny_requests: u64,
    time_base: &'static str,
    statistic: &'static str,
    note: &'static str,
}

/// The JSON document.
#[derive(Clone, Debug, Serialize)]
struct Report {
    coop: MechFigures,
    coop_roundtrip: MechFigures,
    signal: MechFigures,
    /// At a 5 µs quantum.
    components_ns: Components,
    loss_pct: LossPct,
    /// The part of `loss_pct` the worker's own TSC spans account for (runs
    /// of their own with `record_worker_spans`).
    direct_loss_pct: DirectLossPct,
    /// One worker, no pre-assignment: a hand-off round-trip rate.
    handoff_roundtrip_mrps: Option<f64>,
    /// One worker, the next request pre-assigned.
    preassigned_mrps: Option<f64>,
    /// Pre-assignment, `capacity_workers` workers.
    dispatcher_capacity_mrps: Option<f64>,
    capacity_workers: usize,
    meta: Meta,
}

/// Every run of one (mechanism, quantum).
#[derive(Default)]
struct Cell {
    runs: Vec<LongRun>,
}

impl Cell {
    fn median_of(&self, f: impl Fn(&LongRun) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.runs.iter().filter(|r| !r.dud).filter_map(f).collect();
        median(&v)
    }
}

/// Loss in % of a configuration's makespan over the baseline's.
fn loss_pct(t_q: f64, t_base: f64) -> f64 {
    (t_q - t_base) / t_base * 100.0
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Runs `ginza bench preempt`.
pub fn run(args: PreemptArgs) -> anyhow::Result<()> {
    let cores = Cores::pick(&args.cores)?;
    let report = measure(
        cores,
        args.reps,
        args.requests,
        Duration::from_secs_f64(args.work_ms.max(0.001) / 1e3),
        args.tiny,
        &QUANTA_US,
    )?;
    let table = render_table(&report);
    emit(args.json, &table, &report)
}

/// The dispatcher's request rates over `reps` runs of `tiny` requests
/// each, Mrequests/s per run.
struct DispatchRates {
    /// One worker, each request a round trip between the two CPUs.
    handoff: Vec<f64>,
    /// One worker, the next request pre-assigned.
    preassigned: Vec<f64>,
    /// Pre-assignment with `workers` workers.
    capacity: Vec<f64>,
    workers: usize,
}

fn dispatch_rates(cores: Cores, reps: u64, tiny: u64) -> anyhow::Result<DispatchRates> {
    // Every allowed CPU but the dispatcher's works in the capacity run.
    let capacity_cores: Vec<usize> = allowed_cpus()?
        .into_iter()
        .filter(|&c| c != cores.dispatcher)
        .collect();
    anyhow::ensure!(!capacity_cores.is_empty(), "no CPU left for a worker");
    let (mut handoff, mut preassigned, mut capacity) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        eprintln!(
            "preempt: dispatch rates, run {}/{reps} ({tiny} tiny requests each)",
            rep + 1
        );
        handoff.push(dispatch_mrps(cores, tiny, None, false)?);
        preassigned.push(dispatch_mrps(cores, tiny, None, true)?);
        capacity.push(dispatch_mrps(cores, tiny, Some(&capacity_cores), true)?);
    }
    Ok(DispatchRates {
        handoff,
        preassigned,
        capacity,
        workers: capacity_cores.len(),
    })
}

fn measure(
    cores: Cores,
    reps: u64,
    requests: u64,
    work: Duration,
    tiny: u64,
    quanta: &[u64],
) -> anyhow::Result<Report> {
    let loadavg_before = loadavg();
    let ns_per_iter = chain_ns_per_iter();
    let iters = ((work.as_nanos() as f64 / ns_per_iter).round() as u64).max(POLL_EVERY);
    eprintln!(
        "preempt: dispatcher on CPU {}, worker on CPU {}; {requests} requests x {iters} \
         iterations (~{:.1} ms each), {reps} runs per configuration",
        cores.dispatcher,
        cores.worker,
        iters as f64 * ns_per_iter / 1e6
    );
    let mut base = Cell::default();
    let mut poll_base = Cell::default();
    let mut cells: Vec<((u64, Mech), Cell)> = quanta
        .iter()
        .flat_map(|&q| Mech::ALL.map(|m| ((q, m), Cell::default())))
        .collect();
    let mut span_cells: Vec<(Mech, Cell)> = [Mech::Coop, Mech::CoopRoundTrip]
        .map(|m| (m, Cell::default()))
        .into();
    for rep in 0..reps {
        eprintln!("preempt: run {}/{reps}", rep + 1);
        base.runs
            .push(long_run(cores, None, requests, iters, false)?);
        poll_base.runs.push(long_run(
            cores,
            Some((Mech::Coop, 0)),
            requests,
            iters,
            false,
        )?);
        for ((q, m), cell) in cells.iter_mut() {
            cell.runs
                .push(long_run(cores, Some((*m, *q)), requests, iters, false)?);
        }
        // The worker's own spans cost a few TSC reads per preemption: runs
        // of their own, left out of `loss_pct`.
        for (m, cell) in span_cells.iter_mut() {
            cell.runs
                .push(long_run(cores, Some((*m, 5)), requests, iters, true)?);
        }
    }
    let t_base = base.median_of(|r| Some(r.worker_cpu_ns as f64));
    let wall_base = base.median_of(|r| Some(r.makespan_ns as f64));
    let t_poll = poll_base.median_of(|r| Some(r.worker_cpu_ns as f64));
    let cell = |q: u64, m: Mech| {
        cells
            .iter()
            .find(|((cq, cm), _)| *cq == q && *cm == m)
            .map(|(_, c)| c)
    };
    let loss = |q: u64, m: Mech| -> Option<f64> {
        let c = cell(q, m)?;
        let t = c.median_of(|r| Some(r.worker_cpu_ns as f64))?;
        Some(round3(loss_pct(t, t_base?)))
    };
    let wall_loss = |q: u64, m: Mech| -> Option<f64> {
        let t = cell(q, m)?.median_of(|r| Some(r.makespan_ns as f64))?;
        Some(round3(loss_pct(t, wall_base?)))
    };
    let figures = |m: Mech| -> MechFigures {
        let c = cell(REPORTED_QUANTUM_US, m);
        let get = |f: &dyn Fn(&LongRun) -> Option<f64>| c.and_then(|c| c.median_of(f));
        MechFigures {
            dispatcher_ns: get(&|r| r.dispatcher_ns).map(round1),
            worker_ns: get(&|r| {
                let tb = t_base?;
                (r.preemptions > 0).then(|| (r.worker_cpu_ns as f64 - tb) / r.preemptions as f64)
            })
            .map(round1),
            latency_ns: Latency {
                p50: get(&|r| r.p50_ns).map(round1),
                p99: get(&|r| r.p99_ns).map(round1),
            },
        }
    };
    let direct = |m: Mech| -> Option<f64> {
        span_cells
            .iter()
            .find(|(sm, _)| *sm == m)?
            .1
            .median_of(|r| r.direct_loss_pct(t_base?))
            .map(round3)
    };
    let loss_5us_coop_runs = cell(5, Mech::Coop).map_or(Vec::new(), |c| {
        c.runs
            .iter()
            .filter_map(|r| Some(round3(loss_pct(r.worker_cpu_ns as f64, t_base?))))
            .collect()
    });
    let loss_at = |q: u64| Loss {
        coop: loss(q, Mech::Coop),
        coop_roundtrip: loss(q, Mech::CoopRoundTrip),
        signal: loss(q, Mech::Signal),
    };
    let spans = |m: Mech| -> Spans {
        let c = cell(5, m);
        let get = |f: &dyn Fn(&LongRun) -> Option<f64>| c.and_then(|c| c.median_of(f));
        let sc = span_cells.iter().find(|(sm, _)| *sm == m).map(|(_, c)| c);
        let sget = |f: &dyn Fn(&LongRun) -> Option<f64>| sc.and_then(|c| c.median_of(f));
        Spans {
            worker_ns: get(&|r| {
                let tb = t_base?;
                (r.preemptions > 0).then(|| (r.worker_cpu_ns as f64 - tb) / r.preemptions as f64)
            })
            .map(round1),
            late_ns: get(&|r| r.late_ns).map(round1),
            ask_to_off_ns: get(&|r| r.p50_ns).map(round1),
            off_to_next_start_ns: get(&|r| r.resume_ns).map(round1),
            took_next: get(&|r| r.took_next).map(round3),
            worker_observe_ns: sget(&|r| r.spans?.observe.median_ns).map(round1),
            worker_yield_out_ns: sget(&|r| r.spans?.yield_out.median_ns).map(round1),
            worker_handover_ns: sget(&|r| r.spans?.handover.median_ns).map(round1),
            worker_switch_in_ns: sget(&|r| r.spans?.switch_in.median_ns).map(round1),
            worker_direct_ns: sget(&|r| r.spans?.direct_ns_per_preemption()).map(round1),
            direct_loss_per_quantum_pct: sget(&|r| r.spans?.direct_ns_per_preemption())
                .map(|ns| round3(ns / 5_000.0 * 100.0)),
            direct_loss_pct: sget(&|r| r.direct_loss_pct(t_base?)).map(round3),
        }
    };
    let signal_runs_left_out = cells
        .iter()
        .map(|(_, c)| c.runs.iter().filter(|r| r.dud).count())
        .sum();
    let wall_loss_pct = cells
        .iter()
        .map(|((q, m), _)| (*q, m.name(), wall_loss(*q, *m)))
        .collect();
    let preemptions_per_run = cells
        .iter()
        .map(|((q, m), c)| (*q, m.name(), c.median_of(|r| Some(r.preemptions as f64))))
        .collect();
    let rates = dispatch_rates(cores, reps, tiny)?;
    Ok(Report {
        coop: figures(Mech::Coop),
        coop_roundtrip: figures(Mech::CoopRoundTrip),
        signal: figures(Mech::Signal),
        components_ns: Components {
            coop: spans(Mech::Coop),
            coop_roundtrip: spans(Mech::CoopRoundTrip),
        },
        loss_pct: LossPct {
            q5: loss_at(5),
            q10: loss_at(10),
            q15: loss_at(15),
        },
        direct_loss_pct: DirectLossPct {
            q5: DirectLoss {
                coop: direct(Mech::Coop),
                coop_roundtrip: direct(Mech::CoopRoundTrip),
            },
        },
        handoff_roundtrip_mrps: median(&rates.handoff).map(round3),
        preassigned_mrps: median(&rates.preassigned).map(round3),
        dispatcher_capacity_mrps: median(&rates.capacity).map(round3),
        capacity_workers: rates.workers,
        meta: Meta {
            cores,
            reps,
            requests_per_run: requests,
            iters_per_request: iters,
            ns_per_iter: round3(ns_per_iter),
            poll_every_iters: POLL_EVERY,
            baseline_worker_cpu_ms: t_base.map(|t| round3(t / 1e6)),
            baseline_makespan_ms: wall_base.map(|t| round3(t / 1e6)),
            poll_only_loss_pct: t_poll.and_then(|p| Some(round3(loss_pct(p, t_base?)))),
            wall_loss_pct,
            signal_runs_left_out,
            preemptions_per_run,
            reported_quantum_us: REPORTED_QUANTUM_US,
            loss_5us_coop_runs,
            cores_are_siblings: ginza_sys::topology::thread_siblings(cores.worker)
                .ok()
                .map(|s| cores.dispatcher != cores.worker && s.contains(&cores.dispatcher)),
            loadavg_before,
            loadavg_after: loadavg(),
            tiny_requests: tiny,
            time_base: "T = the worker thread's CPU time (CLOCK_THREAD_CPUTIME_ID) from the \
                        first request's start to the last one's end, so time the worker was \
                        descheduled by Linux is left out; wall_loss_pct uses the wall \
                        makespan (first arrival to last completion) instead",
            statistic: "median over runs of per-run medians / percentiles",
            note: "handoff_roundtrip_mrps: one worker, each request a round trip between \
                   the two CPUs; preassigned_mrps: one worker, the next request pre-assigned; \
                   dispatcher_capacity_mrps: pre-assignment with capacity_workers workers \
                   (every allowed CPU but the dispatcher's); the workers may still bound it",
        },
    })
}

fn render_table(r: &Report) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let f3 = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8}{:>15}{:>12}{:>12}{:>12}   anchor (Shinjuku+Dune, cycles)",
        "mech", "dispatcher_ns", "worker_ns", "lat p50", "lat p99"
    );
    let _ = writeln!(out, "{}", "-".repeat(90));
    for (name, m) in [
        ("coop", &r.coop),
        ("coop-rt", &r.coop_roundtrip),
        ("signal", &r.signal),
    ] {
        let _ = writeln!(
            out,
            "{name:<8}{:>15}{:>12}{:>12}{:>12}   {}",
            f(m.dispatcher_ns),
            f(m.worker_ns),
            f(m.latency_ns.p50),
            f(m.latency_ns.p99),
            if name != "signal" {
                "298 sender / 1,212 receiver"
            } else {
                "Linux signal ~4,950 end to end"
            },
        );
    }
    let _ = writeln!(
        out,
        "(at a {} us quantum; latency = ask to request off the core, ns)",
        r.meta.reported_quantum_us
    );
    let _ = writeln!(out, "\nthroughput loss of the worker, %:");
    let _ = writeln!(
        out,
        "{:<8}{:>10}{:>10}{:>10}",
        "quantum", "coop", "coop-rt", "signal"
    );
    for (q, l) in [
        ("5us", r.loss_pct.q5),
        ("10us", r.loss_pct.q10),
        ("15us", r.loss_pct.q15),
    ] {
        let g = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let _ = writeln!(
            out,
            "{q:<8}{:>10}{:>10}{:>10}",
            g(l.coop),
            g(l.coop_roundtrip),
            g(l.signal)
        );
    }
    let _ = writeln!(
        out,
        "\none cooperative preemption at 5 us, ns (coop-rt: next request only after the \
         report):\n{:<8}{:>10}{:>8}{:>12}{:>12}{:>10}",
        "", "worker", "late", "ask->off", "off->next", "took_next"
    );
    for (name, sp) in [
        ("coop", &r.components_ns.coop),
        ("coop-rt", &r.components_ns.coop_roundtrip),
    ] {
        let _ = writeln!(
            out,
            "{name:<8}{:>10}{:>8}{:>12}{:>12}{:>10}",
            f(sp.worker_ns),
            f(sp.late_ns),
            f(sp.ask_to_off_ns),
            f(sp.off_to_next_start_ns),
            f3(sp.took_next)
        );
    }
    let _ = writeln!(
        out,
        "\nthe worker's own TSC spans at 5 us, ns per preemption:\n{:<8}{:>10}{:>11}{:>10}{:>11}{:>9}{:>13}",
        "", "observe", "yield-out", "handover", "switch-in", "direct", "direct loss%"
    );
    for (name, sp) in [
        ("coop", &r.components_ns.coop),
        ("coop-rt", &r.components_ns.coop_roundtrip),
    ] {
        let _ = writeln!(
            out,
            "{name:<8}{:>10}{:>11}{:>10}{:>11}{:>9}{:>13}",
            f(sp.worker_observe_ns),
            f(sp.worker_yield_out_ns),
            f(sp.worker_handover_ns),
            f(sp.worker_switch_in_ns),
            f(sp.worker_direct_ns),
            f3(sp.direct_loss_pct)
        );
    }
    let _ = writeln!(
        out,
        "(worker CPU time; polling alone, c-FCFS: {} %)",
        r.meta
            .poll_only_loss_pct
            .map_or("-".to_string(), |v| format!("{v:.2}"))
    );
    if r.meta.signal_runs_left_out > 0 {
        let _ = writeln!(
            out,
            "warning: {} signal run(s) in which no signal preempted were left out",
            r.meta.signal_runs_left_out
        );
    }
    let _ = writeln!(
        out,
        "\ndispatch, M requests/s (anchor: Shinjuku ~5 M/s per dispatcher):\n  hand-off \
         round trip, 1 worker: {}\n  pre-assigned, 1 worker: {}\n  capacity, pre-assigned, \
         {} worker(s): {}",
        f3(r.handoff_roundtrip_mrps),
        f3(r.preassigned_mrps),
        r.capacity_workers,
        f3(r.dispatcher_capacity_mrps)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        assert_eq!(percentile(&[], 50.0), None);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.0), Some(7));
    }

    #[test]
    fn loss_is_relative_to_the_baseline() {
        assert!((loss_pct(101.0, 100.0) - 1.0).abs() < 1e-12);
        assert!((loss_pct(100.0, 100.0)).abs() < 1e-12);
    }

    #[test]
    fn chain_polls_without_changing_its_value() {
        assert_eq!(chain::<true>(1000, 7), chain::<false>(1000, 7));
    }

    #[test]
    fn cores_are_checked() {
        let allowed = allowed_cpus().unwrap();
        assert!(Cores::pick(&[0, 1, 2]).is_err());
        assert!(Cores::pick(&[usize::MAX - 1, allowed[0]]).is_err());
        let c = Cores::pick(&[allowed[0], allowed[0]]).unwrap();
        assert_eq!(c.worker, allowed[0]);
    }

    #[test]
    fn json_has_the_issue_shape_with_measured_figures() {
        let allowed = allowed_cpus().unwrap();
        let cores = Cores {
            dispatcher: allowed[0],
            worker: *allowed.last().unwrap(),
        };
        // Small, so the debug build stays quick, but every quantum, and
        // enough work that each preemption run preempts many times.
        // On a loaded machine the dispatcher can be descheduled for all of
        // such short runs, so that `coop` preempts in none and its figures
        // are null: measure again (a few times) until it preempted.
        let preempted = |v: &serde_json::Value| {
            v.pointer("/coop/dispatcher_ns")
                .is_some_and(|x| x.is_number())
        };
        let mut tries = 0;
        let (report, v) = loop {
            let report = measure(cores, 3, 2, Duration::from_millis(5), 1000, &QUANTA_US).unwrap();
            let v = serde_json::to_value(&report).unwrap();
            tries += 1;
            if preempted(&v) || tries == 5 {
                break (report, v);
            }
        };
        assert!(
            preempted(&v),
            "the cooperative flag preempted in no run of five measurements: {v:#}"
        );
        let number = |path: &str| -> f64 {
            let x = v
                .pointer(path)
                .unwrap_or_else(|| panic!("{path} missing in {v:#}"));
            let x = x
                .as_f64()
                .unwrap_or_else(|| panic!("{path} is {x}, not a number, in {v:#}"));
            assert!(x.is_finite(), "{path} = {x}");
            x
        };
        for m in ["coop", "coop_roundtrip", "signal"] {
            // `coop_roundtrip`, added for comparison, may have preempted in
            // no run at all on a loaded machine (the dispatcher
            // descheduled for the whole of a short run): then its figures
            // are null, which is what they must be.
            if m == "coop_roundtrip"
                && v.pointer("/coop_roundtrip/dispatcher_ns") == Some(&serde_json::Value::Null)
            {
                continue;
            }
            // Net of the clock's own overhead: a flag store may come out at
            // 0 ns, a signal (tgkill) costs microseconds.
            let dispatcher = number(&format!("/{m}/dispatcher_ns"));
            assert!(dispatcher >= 0.0, "{m}: dispatcher_ns {dispatcher}");
            if m == "signal" {
                assert!(dispatcher > 0.0, "{m}: dispatcher_ns {dispatcher}");
            }
            // A difference of two CPU times (preempted runs minus the
            // never-preempted baseline), so its sign is not checked: on a
            // loaded VM, time stolen from the worker thread counts as its
            // CPU time and can swamp the loss in runs this short.
            number(&format!("/{m}/worker_ns"));
            let p50 = number(&format!("/{m}/latency_ns/p50"));
            let p99 = number(&format!("/{m}/latency_ns/p99"));
            assert!(0.0 < p50 && p50 <= p99, "{m}: latency p50 {p50} p99 {p99}");
        }
        for q in ["5us", "10us", "15us"] {
            for m in ["coop", "coop_roundtrip", "signal"] {
                number(&format!("/loss_pct/{q}/{m}"));
            }
        }
        for key in [
            "handoff_roundtrip_mrps",
            "preassigned_mrps",
            "dispatcher_capacity_mrps",
        ] {
            assert!(number(&format!("/{key}")) > 0.0, "{key}");
        }
        assert!(number("/capacity_workers") >= 1.0);
        // The spans at 5 µs, where a configuration preempted at all (see
        // above): without pre-assignment at the ask the worker never finds
        // a request in its second slot; with it, the other long request is
        // put behind nearly every preempted one (two are always in flight).
        for m in ["coop", "coop_roundtrip"] {
            if v.pointer(&format!("/components_ns/{m}/took_next")) == Some(&serde_json::Value::Null)
            {
                continue;
            }
            for span in ["late_ns", "ask_to_off_ns", "off_to_next_start_ns"] {
                assert!(number(&format!("/components_ns/{m}/{span}")) >= 0.0);
            }
            number(&format!("/components_ns/{m}/worker_ns"));
            let took_next = number(&format!("/components_ns/{m}/took_next"));
            if m == "coop" {
                assert!(took_next > 0.0, "{m}: took_next {took_next}");
            } else {
                assert_eq!(took_next, 0.0, "{m}");
            }
        }
        // The worker's own spans, where the cooperative configuration
        // preempted: every part of a preemption takes some time.
        if v.pointer("/components_ns/coop/took_next") != Some(&serde_json::Value::Null) {
            for span in [
                "worker_yield_out_ns",
                "worker_handover_ns",
                "worker_switch_in_ns",
                "worker_direct_ns",
            ] {
                assert!(
                    number(&format!("/components_ns/coop/{span}")) > 0.0,
                    "{span}"
                );
            }
            number("/components_ns/coop/direct_loss_pct");
            number("/direct_loss_pct/5us/coop");
        }
        assert!(v
            .pointer("/meta/loss_5us_coop_runs")
            .is_some_and(|r| r.is_array()));
        assert!(number("/meta/baseline_worker_cpu_ms") > 0.0);
        assert!(number("/meta/baseline_makespan_ms") > 0.0);
        number("/meta/poll_only_loss_pct");
        // Counted for every configuration. Not required to be positive: a
        // dispatcher that Linux keeps off its CPU for a whole run (a loaded
        // 2-CPU machine) preempts nothing; the 10 us figures above, which
        // only preempting runs give, are required.
        for (q, m, runs) in &report.meta.preemptions_per_run {
            let runs = runs.unwrap_or_else(|| panic!("{q} us {m}: no run counted"));
            assert!(runs >= 0.0, "{q} us {m}: {runs} preemptions per run");
        }
        for (q, m, loss) in &report.meta.wall_loss_pct {
            assert!(loss.is_some_and(f64::is_finite), "{q} us {m}: {loss:?}");
        }
        // Signal runs in which no signal preempted are left out of the
        // medians and counted in `signal_runs_left_out`; a configuration
        // with no run left would have had null figures, refused above.
    }
}
