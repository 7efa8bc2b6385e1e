//! `ginza bench batch`: batch's work per CPU-second on a Ginza uthread next
//! to a pthread on the same CPU, rounds interleaved (pthread, Ginza,
//! pthread, …), nothing else on that CPU, no iokerneld.
//!
//! Both run `ginza_apps::batch::payoff_sum`, one out-of-line function, so
//! the two execute the same machine code (docs/results.md, "Session 36":
//! when each had a copy of its own, the compiler's choices alone made the
//! pthread's 20 % faster). The pthread prices as `bench memcached`'s Linux
//! batch peer does (`harness::linux_batch::price_chunks`: chunks of
//! `PATHS_PER_CHUNK` paths, nothing between them); the uthread as Ginza's
//! batch application does (`batch::price_until_stopped`: a preemption point
//! every `PATHS_PER_POINT` paths and a yield every chunk) in a standalone
//! runtime with one kthread pinned to the CPU. So the ratio is what the
//! runtime's scheduling points cost compute-bound work; what colocation
//! costs batch (preemptions, the server's share of the CPU) is
//! `bench memcached`'s.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use ginza_apps::batch::{price_until_stopped, PATHS_PER_CHUNK, PATHS_PER_POINT};
use ginza_sys::clock::thread_cpu_ns;
use serde::Serialize;

use crate::harness::figures::{allowed_cpus, emit, median};
use crate::harness::linux_batch::price_chunks;

/// Arguments of `ginza bench batch`.
#[derive(clap::Args, Debug)]
pub struct BatchWorkArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Rounds: the two take turns this many times; medians over rounds are reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    rounds: u64,
    /// How long each prices in a round.
    #[arg(long, default_value = "1s", value_parser = ginza_proto::parse_duration)]
    duration: Duration,
    /// CPU both run on (default: the last CPU this process may use).
    #[arg(long)]
    cpu: Option<usize>,
}

/// One round: each one's paths per CPU-second, millions.
#[derive(Serialize, Debug, Clone, Copy)]
struct Round {
    pthread: f64,
    ginza: f64,
}

#[derive(Serialize, Debug)]
struct Report {
    cpu: usize,
    duration_s: f64,
    paths_per_chunk: u64,
    paths_per_point: u64,
    rounds: Vec<Round>,
    /// Medians over rounds, millions of paths per CPU-second.
    pthread_mpaths_per_cpu_s: f64,
    ginza_mpaths_per_cpu_s: f64,
    /// The median over rounds of each round's Ginza / pthread.
    ginza_over_pthread: f64,
}

pub(crate) fn run(args: BatchWorkArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.duration.is_zero() && args.duration <= Duration::from_secs(600),
        "--duration {:?}: give a time above zero and at most 10 minutes",
        args.duration
    );
    let allowed = allowed_cpus()?;
    let cpu = match args.cpu {
        Some(c) if allowed.contains(&c) => c,
        Some(c) => {
            anyhow::bail!("--cpu {c}: not among the CPUs this process may use ({allowed:?})")
        }
        None => *allowed.last().context("no CPU allowed")?,
    };
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        let pthread = on_pthread(cpu, args.duration)?;
        let ginza = on_uthread(cpu, args.duration)?;
        rounds.push(Round { pthread, ginza });
    }
    let of =
        |f: fn(&Round) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0);
    let report = Report {
        cpu,
        duration_s: args.duration.as_secs_f64(),
        paths_per_chunk: PATHS_PER_CHUNK,
        paths_per_point: PATHS_PER_POINT,
        pthread_mpaths_per_cpu_s: of(|r| r.pthread),
        ginza_mpaths_per_cpu_s: of(|r| r.ginza),
        ginza_over_pthread: of(|r| r.ginza / r.pthread),
        rounds,
    };
    emit(args.json, &table(&report), &report)
}

/// Millions of paths per CPU-second of `paths` over `cpu_ns`.
fn rate(paths: u64, cpu_ns: u64) -> anyhow::Result<f64> {
    anyhow::ensure!(
        cpu_ns > 0 && paths > 0,
        "no work was measured ({paths} paths in {cpu_ns} ns)"
    );
    Ok(paths as f64 * 1e3 / cpu_ns as f64)
}

/// Sets `stop` after `duration` from a thread of its own (not pinned: it
/// only sleeps).
fn stop_after(duration: Duration) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    std::thread::spawn(move || {
        std::thread::sleep(duration);
        s.store(true, Relaxed);
    });
    stop
}

fn on_pthread(cpu: usize, duration: Duration) -> anyhow::Result<f64> {
    let stop = stop_after(duration);
    let worker = std::thread::Builder::new()
        .name("batch-pthread".into())
        .spawn(move || -> anyhow::Result<f64> {
            ginza_sys::affinity::pin_current_thread(cpu)
                .with_context(|| format!("pinning the pthread to CPU {cpu}"))?;
            let paths = AtomicU64::new(0);
            let cpu0 = thread_cpu_ns();
            std::hint::black_box(price_chunks(1, &paths, &stop));
            rate(paths.load(Relaxed), thread_cpu_ns() - cpu0)
        })
        .context("starting the pthread")?;
    worker
        .join()
        .map_err(|_| anyhow!("the pricing pthread panicked"))?
}

fn on_uthread(cpu: usize, duration: Duration) -> anyhow::Result<f64> {
    let config = ginza_runtime::Config {
        cores: Some(vec![cpu]),
        ..ginza_runtime::Config::with_kthreads(1)
    };
    let paths = Arc::new(AtomicU64::new(0));
    let p = Arc::clone(&paths);
    // The clock starts once the runtime runs (its start-up is not batch's
    // work); one kthread, so the main uthread's thread is the pricing
    // uthread's too, and its CPU time covers the pricing and every
    // scheduling step around it.
    let cpu_ns = std::thread::Builder::new()
        .name("batch-runtime".into())
        .spawn(move || {
            ginza_runtime::run(config, move || {
                let stop = stop_after(duration);
                let cpu0 = thread_cpu_ns();
                std::hint::black_box(price_until_stopped(1, p, stop, 1));
                thread_cpu_ns() - cpu0
            })
        })
        .context("starting the runtime's thread")?
        .join()
        .map_err(|_| anyhow!("the runtime's thread panicked"))?
        .map_err(|e| anyhow!("the standalone runtime: {e}"))?;
    rate(paths.load(Relaxed), cpu_ns)
}

fn table(r: &Report) -> String {
    let pthread = format!(
        "pthread (chunks of {} paths, nothing between them)",
        r.paths_per_chunk
    );
    let ginza = format!(
        "Ginza uthread (a preemption point every {} paths, a yield every {})",
        r.paths_per_point, r.paths_per_chunk
    );
    format!(
        "batch work per CPU-second on CPU {cpu}, ginza_apps::batch::payoff_sum on both; \
         medians of {n} rounds of {d:.1} s each, interleaved:\n\
         \x20 {pthread:<72} {p:7.2} M paths/CPU-s\n\
         \x20 {ginza:<72} {g:7.2} M paths/CPU-s\n\
         \x20 Ginza / pthread {ratio:.3}\n",
        cpu = r.cpu,
        n = r.rounds.len(),
        d = r.duration_s,
        p = r.pthread_mpaths_per_cpu_s,
        g = r.ginza_mpaths_per_cpu_s,
        ratio = r.ginza_over_pthread,
    )
}
