//! `ginza bench steering`: the packet steering policies side by side
//! (docs/design.md, "Packet steering"; docs/results.md, "Steering").
//!
//! The harness is `ginza_iokernel::testing::steering` (the end-to-end
//! test runs it too): iokerneld's generator sends UDP spin requests (0 ns
//! of work: the figure is steering, not service) of `--flows` flows, each
//! flow numbering its requests, to an application of 4 kthreads while its
//! cores change: every two phases one kthread parks (gives its core back)
//! and the next phase it is granted one again, as a runtime's would when
//! load steps down and up. The application is a `RawApp` played by one
//! thread that echoes every ring (a parked kthread's ring is stolen from,
//! the reply leaving by the thief's egress ring, the steal counted in the
//! thief's queue line as a runtime counts it), so the figures are
//! iokerneld's and the policy's, not a runtime's. iokerneld runs with the
//! recording actuator and manages 4 cores that need not exist (grants are
//! bookkeeping), so that the active set can go 4 ⇄ 3 on a 2-CPU machine.
//!
//! Each round runs every policy once, in turn (`rss-mod`, `flow-affinity`,
//! `indirection`, then again), each on a fresh iokerneld; the JSON holds
//! each policy's medians over rounds:
//! * `reordered_pct`: replies that came back after the reply to a later
//!   request of their flow, % of replies (the generator's count: reply
//!   order is the observable proxy for packets processed out of order);
//! * `steals`, `steals_per_kpkt`: the application's steals as iokerneld
//!   reports them (read from its queue lines; here one per batch of
//!   replies taken from a parked kthread's ring), and per 1,000 replies;
//!   `stolen_pct`: replies taken that way, % of replies;
//! * `flows_moved_per_change`: flows the policy remapped per change of the
//!   active set, counted from its own mapping after each change, over the
//!   flows iokerneld tracks (up to `TRACKED_FLOWS`), whether or not a packet
//!   of the flow arrived before the next change, plus moves made at a flow's
//!   next packet (`flow-affinity`'s lazy moves, rebalancing);
//!   `flows_seen_moving_per_change`: the figure `flows_moved_per_change`
//!   was before — packets that went to another kthread than their flow's
//!   previous packet, which misses flows that sent nothing while a kthread
//!   was away (so it depends on how long a change lasts);
//! * `p50_us`, `p99_us`: injection → reply, as iokerneld's loop saw it;
//! * `ns_per_decision`: iokerneld's time per steering decision (flow key and
//!   policy pick of a burst, timed together, divided by its packets);
//! * `table_bytes`: the policy's tables.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use ginza_iokernel::testing::steering::{run_steering, SteeringRun};
use ginza_policy::steer::SteeringKind;
use ginza_sim::plot::{line_chart, write_csv, Chart, Series};
use serde::Serialize;

use crate::harness::figures::{emit, median};

/// Arguments of `ginza bench steering`.
#[derive(clap::Args, Debug)]
pub struct SteeringArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Flows of the generator (source address and port pairs; up to
    /// 25,536 ports per address, more flows take the next addresses).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    flows: u32,
    /// Requests per second.
    #[arg(long, default_value_t = 20_000.0)]
    rate: f64,
    /// Rounds (each runs every policy once); the JSON holds medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// How long the generator sends per policy and round, ms.
    #[arg(long, default_value_t = 720, value_parser = clap::value_parser!(u64).range(10..))]
    send_ms: u64,
    /// How long a kthread stays parked, and all hold a core between parks, ms.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    phase_ms: u64,
    /// Where the CSV and PNGs go.
    #[arg(long, default_value = "results/steering")]
    out: PathBuf,
}

/// One policy's run.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Run {
    round: u32,
    policy: &'static str,
    sent: u64,
    replies: u64,
    dropped: u64,
    reordered_pct: f64,
    steals: u64,
    steals_per_kpkt: f64,
    stolen_pct: f64,
    changes: u64,
    flows_moved: u64,
    flows_moved_per_change: f64,
    flows_seen_moving_per_change: f64,
    p50_us: f64,
    p99_us: f64,
    ns_per_decision: f64,
    table_bytes: u64,
    table_evictions: u64,
}

/// A policy's medians over rounds.
#[derive(Clone, Debug, Serialize)]
struct PolicyFigures {
    reordered_pct: f64,
    /// The application's steals (iokerneld's stats), and per 1,000
    /// replies.
    steals: f64,
    steals_per_kpkt: f64,
    /// Replies the harness took from a parked kthread's ring, % of replies.
    stolen_pct: f64,
    /// Remapped by the policy per change of the active set (its mapping).
    flows_moved_per_change: f64,
    /// Seen moving (a packet on another kthread than its flow's previous
    /// one) per change.
    flows_seen_moving_per_change: f64,
    p50_us: f64,
    p99_us: f64,
    ns_per_decision: f64,
    table_bytes: u64,
    /// Flows the policy's bounded table evicted to make room (flow-affinity
    /// under more flows than its table holds), median per round.
    table_evictions: f64,
    /// Requests sent and dropped for want of room (all rounds).
    sent: u64,
    dropped: u64,
}

#[derive(Serialize)]
struct Report {
    policies: std::collections::BTreeMap<&'static str, PolicyFigures>,
    flows: u32,
    rate_per_s: f64,
    rounds: u32,
    runs: Vec<Run>,
    csv: String,
    /// Whether this binary was built without optimisations (figures of a
    /// debug build are not iokerneld's real cost).
    debug_build: bool,
}

pub fn run(args: SteeringArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.rate.is_finite() && args.rate > 0.0,
        "--rate must be positive"
    );
    // Through the experiments' sweep loop (docs/experiments.md): rounds
    // outermost, the policies interleaved within each.
    let plan: Vec<(u32, SteeringKind)> = (0..args.rounds)
        .flat_map(|round| SteeringKind::ALL.map(|policy| (round, policy)))
        .collect();
    let runs = crate::harness::sweep::sweep(
        &plan,
        |&(round, policy)| format!("round {round}, {policy}"),
        |_, &(round, policy)| {
            let r = one_run(&args, round, policy)?;
            eprintln!(
                "round {round} {:<13} moved/change {:>7.1} (seen {:>6.1})  steals {:>6}  reordered {:>6.3} %  p99 {:>8.1} us  {:>6.0} ns/decision",
                r.policy, r.flows_moved_per_change, r.flows_seen_moving_per_change, r.steals, r.reordered_pct, r.p99_us, r.ns_per_decision
            );
            Ok(r)
        },
    )?;
    let mut policies = std::collections::BTreeMap::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<14} {:>12} {:>12} {:>10} {:>8} {:>9} {:>9} {:>12} {:>8}",
        "policy",
        "reordered %",
        "moved/change",
        "seen/change",
        "steals",
        "p50 us",
        "p99 us",
        "ns/decision",
        "table"
    );
    for policy in SteeringKind::ALL {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.policy == policy.name()).collect();
        let med = |f: fn(&Run) -> f64| {
            median(&mine.iter().map(|r| f(r)).collect::<Vec<_>>()).unwrap_or(f64::NAN)
        };
        let figures = PolicyFigures {
            reordered_pct: med(|r| r.reordered_pct),
            steals: med(|r| r.steals as f64),
            steals_per_kpkt: med(|r| r.steals_per_kpkt),
            stolen_pct: med(|r| r.stolen_pct),
            flows_moved_per_change: med(|r| r.flows_moved_per_change),
            flows_seen_moving_per_change: med(|r| r.flows_seen_moving_per_change),
            p50_us: med(|r| r.p50_us),
            p99_us: med(|r| r.p99_us),
            ns_per_decision: med(|r| r.ns_per_decision),
            table_bytes: mine.first().map_or(0, |r| r.table_bytes),
            table_evictions: med(|r| r.table_evictions as f64),
            sent: mine.iter().map(|r| r.sent).sum(),
            dropped: mine.iter().map(|r| r.dropped).sum(),
        };
        let _ = writeln!(
            table,
            "{:<14} {:>12.3} {:>12.1} {:>10.1} {:>8.0} {:>9.1} {:>9.1} {:>12.0} {:>8}",
            policy.name(),
            figures.reordered_pct,
            figures.flows_moved_per_change,
            figures.flows_seen_moving_per_change,
            figures.steals,
            figures.p50_us,
            figures.p99_us,
            figures.ns_per_decision,
            figures.table_bytes
        );
        policies.insert(policy.name(), figures);
    }
    let debug_build = cfg!(debug_assertions);
    if debug_build {
        table.push_str("(debug build: ns per decision is not iokerneld's real cost)\n");
    }
    let csv = args.out.join("steering.csv");
    write_outputs(&args.out, &csv, &runs)?;
    let report = Report {
        policies,
        flows: args.flows,
        rate_per_s: args.rate,
        rounds: args.rounds,
        runs,
        csv: csv.display().to_string(),
        debug_build,
    };
    emit(args.json, &table, &report)
}

pub(super) fn one_run(
    args: &SteeringArgs,
    round: u32,
    policy: SteeringKind,
) -> anyhow::Result<Run> {
    let mut run = SteeringRun::new(policy);
    run.flows = args.flows;
    run.rate = args.rate;
    run.sending = Duration::from_millis(args.send_ms);
    run.phase = Duration::from_millis(args.phase_ms);
    run.seed = 11 + u64::from(round);
    let o = run_steering(&run).map_err(|e| anyhow::anyhow!("{e}"))?;
    let st = o.report.stats;
    let replies = st.replies.max(1) as f64;
    let us = |q: f64| o.report.latency.value_at_quantile(q) as f64 / 1e3;
    Ok(Run {
        round,
        policy: policy.name(),
        sent: st.sent,
        replies: st.replies,
        dropped: o.net.drop_ingress,
        reordered_pct: 100.0 * st.reordered as f64 / replies,
        steals: o.app.steals,
        steals_per_kpkt: 1000.0 * o.app.steals as f64 / replies,
        stolen_pct: 100.0 * o.stolen as f64 / replies,
        changes: o.steering.ch,
        flows_moved: o.steering.mv,
        flows_moved_per_change: o.steering.moved_per_change().unwrap_or(0.0),
        flows_seen_moving_per_change: o.steering.seen_moving_per_change().unwrap_or(0.0),
        p50_us: us(0.5),
        p99_us: us(0.99),
        ns_per_decision: o.steering.ns_per_decision().unwrap_or(0.0),
        table_bytes: o.steering.tb,
        table_evictions: o.net.ev,
    })
}

fn write_outputs(dir: &Path, csv: &Path, runs: &[Run]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.round.to_string(),
                r.policy.to_string(),
                r.sent.to_string(),
                r.replies.to_string(),
                r.dropped.to_string(),
                format!("{:.4}", r.reordered_pct),
                r.steals.to_string(),
                format!("{:.3}", r.steals_per_kpkt),
                format!("{:.4}", r.stolen_pct),
                r.changes.to_string(),
                r.flows_moved.to_string(),
                format!("{:.2}", r.flows_moved_per_change),
                format!("{:.2}", r.flows_seen_moving_per_change),
                format!("{:.2}", r.p50_us),
                format!("{:.2}", r.p99_us),
                format!("{:.1}", r.ns_per_decision),
                r.table_bytes.to_string(),
            ]
        })
        .collect();
    write_csv(
        csv,
        &[
            "round",
            "policy",
            "sent",
            "replies",
            "dropped",
            "reordered_pct",
            "steals",
            "steals_per_kpkt",
            "stolen_pct",
            "changes",
            "flows_moved",
            "flows_moved_per_change",
            "flows_seen_moving_per_change",
            "p50_us",
            "p99_us",
            "ns_per_decision",
            "table_bytes",
        ],
        &rows,
    )?;
    let series = |f: fn(&Run) -> f64| -> Vec<Series> {
        SteeringKind::ALL
            .iter()
            .map(|p| Series {
                name: p.name().to_string(),
                points: runs
                    .iter()
                    .filter(|r| r.policy == p.name())
                    .map(|r| (f64::from(r.round), f(r)))
                    .collect(),
            })
            .collect()
    };
    for (file, title, y_label, data) in [
        (
            "moved.png",
            "Flows moved per change of the active set",
            "flows per change",
            series(|r| r.flows_moved_per_change),
        ),
        (
            "p99.png",
            "p99 latency while cores come and go",
            "p99 (us)",
            series(|r| r.p99_us),
        ),
    ] {
        line_chart(
            &dir.join(file),
            &Chart {
                title,
                x_label: "round",
                y_label,
                series: &data,
                log_y: false,
                y_max: None,
                legend_lower_right: false,
            },
        )?;
    }
    Ok(())
}
