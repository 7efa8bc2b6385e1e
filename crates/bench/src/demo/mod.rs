//! `ginza demo`: iokerneld, a latency-critical UDP server and a batch
//! application on this machine, under the Shenango allocator (5 µs), the
//! `slow` one (1 ms) and `static` cores, over a sweep of offered loads and
//! three service-time distributions (Shenango's Fig. 4 on this machine).
//!
//! Per service distribution, policy and load point, everything starts
//! fresh (points are independent):
//!
//! * iokerneld on a thread of this process, pinned to its own CPU and
//!   spinning, managing the other CPUs, with the software NIC;
//! * `lc`, latency-critical: `spin-server` on a Ginza runtime with its own
//!   MAC and IP: each UDP request carries its service time; a uthread per
//!   request spins for it and echoes the request back;
//! * `batch`: one uthread per kthread prices a European call by Monte
//!   Carlo in chunks of about 25 µs, yielding between chunks;
//! * load: iokerneld's traffic generator, on the switch beside the
//!   applications, sends requests with Poisson arrivals at the point's rate
//!   and matches the replies (open loop: latency is reply − injection, as
//!   seen by iokerneld's loop; a late loop shows as lag, not fewer
//!   requests). First a warm-up run, then the measured run.
//!
//! During the measured run, iokerneld's stats are sampled every 10 ms for the
//! cores each application holds; counters read at both ends give batch
//! paths/s and reallocations/s (cores moved from one application to the
//! other). Achieved load is the service time the server spent in the run
//! over the run × managed cores.

mod args;
mod harness;
mod phases;
mod plot;
mod point;
pub(crate) mod quiet;
pub(crate) mod report;
mod sample;
mod summary;

use anyhow::{bail, Context as _};

pub use args::DemoArgs;
pub(crate) use args::{Policy, Workload};
pub(crate) use harness::{Setup, Tuning};
pub(crate) use point::{run_point, run_steps};

/// `v` without repeats, in first-seen order.
fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for x in v {
        if !out.contains(x) {
            out.push(*x);
        }
    }
    out
}

/// Runs `ginza demo`: every point of the sweep, then the CSV, PNG, table
/// and JSON.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.policies.is_empty() || args.points.is_empty() || args.services.is_empty() {
        bail!("nothing to run: give at least one policy, service distribution and load point");
    }
    let policies = dedup(&args.policies);
    let services = dedup(&args.services);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the output directory {}", args.out.display()))?;
    let mut setup = Setup::new(
        args.cores.as_ref().map(|c| c.0.as_slice()),
        args.iokernel_core,
        args.warmup,
        args.duration,
        args.seed,
    )?;
    let mut tuning = if args.classic {
        Tuning::classic()
    } else {
        Tuning::default()
    };
    tuning.lc_spin = args.lc_spin.unwrap_or(tuning.lc_spin);
    tuning.lc_linger = args.lc_linger.unwrap_or(tuning.lc_linger);
    tuning.batch_linger = args.batch_linger.unwrap_or(tuning.batch_linger);
    tuning.idle_victim_grace = args.idle_victim_grace.unwrap_or(tuning.idle_victim_grace);
    tuning.local_wake = match args.local_wake {
        Some(off) if off.is_zero() => None,
        Some(wait) => Some(wait),
        None => tuning.local_wake,
    };
    setup.tuning = tuning;
    let head = summary::header(&setup);

    // The sweep engine of `ginza bench run` (docs/experiments.md).
    let mut points = Vec::new();
    for &service in &services {
        for &policy in &policies {
            for (i, &load) in args.points.iter().enumerate() {
                points.push((service, policy, i, load));
            }
        }
    }
    let mut rows = crate::harness::sweep::sweep(
        &points,
        |(service, policy, _, load)| format!("{service} {policy} @ {load:.2}"),
        |_, &(service, policy, i, load)| {
            run_point(&setup, service.into(), policy, load, i).with_context(|| {
                format!("{service} service, policy {policy} at offered load {load}")
            })
        },
    )?;
    report::fill_p50_vs_static(&mut rows);

    summary::write(&args, &setup, &policies, &services, head, &rows)
}
