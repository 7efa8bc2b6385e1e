//! `ginza bench steering`: the packet steering policies side by side
//! (docs/design.md, "Packet steering"; docs/results.md, "Steering").
//!
//! iokerneld's generator sends UDP spin requests (0 ns of work: the figure
//! is steering, not service) of `--flows` flows, each flow numbering its
//! requests, to an application of 4 kthreads while its cores change: every
//! two phases one kthread parks (gives its core back) and the next phase
//! it is granted one again, as a runtime's would when load steps down and
//! up. The application is a [`RawApp`] played by one thread that echoes
//! every ring (a parked kthread's ring is stolen from, the reply leaving by
//! the thief's egress ring), so the figures are iokerneld's and the
//! policy's, not a runtime's. iokerneld runs with the recording actuator
//! and manages 4 cores that need not exist (grants are bookkeeping), so
//! that the active set can go 4 ⇄ 3 on a 2-CPU machine.
//!
//! Each round runs every policy once, in turn (`rss-mod`, `flow-affinity`,
//! `indirection`, then again), each on a fresh iokerneld; the JSON holds
//! each policy's medians over rounds:
//! * `reordered_pct`: replies that came back after the reply to a later
//!   request of their flow, % of replies (the generator's count: reply
//!   order is the observable proxy for packets processed out of order);
//! * `stolen_pct`: replies the harness took from a parked kthread's ring
//!   (the harness's steals: a runtime's steals are counted by the runtime,
//!   `KthreadStats::steals`, not by iokerneld), % of replies;
//! * `flows_moved_per_change`: flows whose packet went to another kthread
//!   than their previous packet, per change of the active set (iokerneld's
//!   counts);
//! * `p50_us`, `p99_us`: injection → reply, as iokerneld's loop saw it;
//! * `ns_per_decision`: iokerneld's time per steering decision (flow key and
//!   policy pick of a burst, timed together, divided by its packets);
//! * `table_bytes`: the policy's tables.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::{Config as IokConfig, Iokerneld, LoadRun, RecordingActuator};
use ginza_net::{Interface, Ipv4Addr, MacAddr, Packet};
use ginza_policy::steer::SteeringKind;
use ginza_proto::client;
use ginza_shm::LineFlags;
use ginza_sim::plot::{line_chart, write_csv, Chart, Series};
use serde::Serialize;

use super::common::{emit, median};

/// Kthreads of the application, and cores iokerneld manages.
const KTHREADS: usize = 4;

/// Arguments of `ginza bench steering`.
#[derive(clap::Args, Debug)]
pub struct SteeringArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Flows (source ports) of the generator.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
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
    stolen_pct: f64,
    changes: u64,
    flows_moved: u64,
    flows_moved_per_change: f64,
    p50_us: f64,
    p99_us: f64,
    ns_per_decision: f64,
    table_bytes: u64,
}

/// A policy's medians over rounds.
#[derive(Clone, Debug, Serialize)]
struct PolicyFigures {
    reordered_pct: f64,
    /// Replies the harness took from a parked kthread's ring (its steals),
    /// % of replies.
    stolen_pct: f64,
    flows_moved_per_change: f64,
    p50_us: f64,
    p99_us: f64,
    ns_per_decision: f64,
    table_bytes: u64,
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
    let mut runs = Vec::new();
    for round in 0..args.rounds {
        for policy in SteeringKind::ALL {
            let r = one_run(&args, round, policy)
                .with_context(|| format!("round {round}, {policy}"))?;
            eprintln!(
                "round {round} {:<13} moved/change {:>7.1}  reordered {:>6.3} %  p99 {:>8.1} us  {:>6.0} ns/decision",
                r.policy, r.flows_moved_per_change, r.reordered_pct, r.p99_us, r.ns_per_decision
            );
            runs.push(r);
        }
    }
    let mut policies = std::collections::BTreeMap::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<14} {:>12} {:>12} {:>9} {:>9} {:>12} {:>8}",
        "policy", "reordered %", "moved/change", "p50 us", "p99 us", "ns/decision", "table"
    );
    for policy in SteeringKind::ALL {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.policy == policy.name()).collect();
        let med = |f: fn(&Run) -> f64| {
            median(&mine.iter().map(|r| f(r)).collect::<Vec<_>>()).unwrap_or(f64::NAN)
        };
        let figures = PolicyFigures {
            reordered_pct: med(|r| r.reordered_pct),
            stolen_pct: med(|r| r.stolen_pct),
            flows_moved_per_change: med(|r| r.flows_moved_per_change),
            p50_us: med(|r| r.p50_us),
            p99_us: med(|r| r.p99_us),
            ns_per_decision: med(|r| r.ns_per_decision),
            table_bytes: mine.first().map_or(0, |r| r.table_bytes),
            sent: mine.iter().map(|r| r.sent).sum(),
            dropped: mine.iter().map(|r| r.dropped).sum(),
        };
        let _ = writeln!(
            table,
            "{:<14} {:>12.3} {:>12.1} {:>9.1} {:>9.1} {:>12.0} {:>8}",
            policy.name(),
            figures.reordered_pct,
            figures.flows_moved_per_change,
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

/// The test's side of the kthreads' queue lines (as a runtime writes them).
struct Lines {
    queued: Vec<u32>,
}

impl Lines {
    /// An item queued and never taken: iokerneld grants `k` a core.
    fn busy(&mut self, app: &RawApp, k: usize) {
        self.queued[k] += 1;
        let line = &app.ends[k].line;
        line.set_rq_tail(self.queued[k]);
        line.remove_flags(LineFlags::PARKED);
    }

    fn settle(&self, app: &RawApp, k: usize) {
        app.ends[k].line.set_rq_head(self.queued[k]);
    }

    fn park(&self, app: &mut RawApp, k: usize) {
        self.settle(app, k);
        app.ends[k].line.insert_flags(LineFlags::PARKED);
        app.report_parked(k);
    }
}

/// Echoes every datagram on every ring; a parked kthread's replies leave by
/// the next kthread's egress ring. Returns how many were echoed, and how
/// many of those were stolen (taken from a parked kthread's ring).
fn echo(app: &mut RawApp, parked: Option<usize>) -> (u64, u64) {
    let (mut echoed, mut stolen) = (0, 0);
    for k in 0..KTHREADS {
        let out = if parked == Some(k) {
            (k + 1) % KTHREADS
        } else {
            k
        };
        while let Some((bytes, desc)) = app.recv(k) {
            if let Ok(Packet::Udp(d)) = ginza_net::parse(&bytes, &app.interface) {
                let (mac, src, port) = (d.src_mac, d.src, d.dst.port);
                let payload = d.payload.to_vec();
                let sent = u64::from(app.send_udp(out, mac, src, port, &payload));
                echoed += sent;
                if parked == Some(k) {
                    stolen += sent;
                }
            }
            app.give_back(k, desc.buf);
        }
    }
    (echoed, stolen)
}

pub(super) fn one_run(
    args: &SteeringArgs,
    round: u32,
    policy: SteeringKind,
) -> anyhow::Result<Run> {
    let dir = std::env::temp_dir().join(format!(
        "ginza-bench-steering-{}-{round}-{policy}",
        std::process::id()
    ));
    let cores: Vec<usize> = (0..KTHREADS).collect();
    let mut cfg = IokConfig::new(cores.clone());
    cfg.socket = dir.join("iokerneld.sock");
    cfg.idle_sleep = Some(Duration::from_millis(1));
    cfg.validate(&cores).map_err(|e| anyhow::anyhow!("{e}"))?;
    let socket = cfg.socket.clone();
    let daemon = Iokerneld::bind(cfg, RecordingActuator::new())?;
    let stop_daemon = daemon.stop_handle();
    let generator = daemon.generator();
    let loop_thread = std::thread::spawn(move || daemon.run());
    let result = drive(args, &socket, &generator, round, policy);
    stop_daemon.stop();
    let _ = loop_thread.join();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn drive(
    args: &SteeringArgs,
    socket: &Path,
    generator: &ginza_iokernel::GeneratorHandle,
    round: u32,
    policy: SteeringKind,
) -> anyhow::Result<Run> {
    let me = Interface {
        mac: MacAddr([0x02, 0x47, 0x5a, 0, 0, 1]),
        ip: Ipv4Addr::new(10, 47, 0, 1),
    };
    let mut app =
        RawApp::register_steered(socket, "steered", me, KTHREADS as u32, Some(policy.name()))
            .map_err(|e| anyhow::anyhow!("registration: {e}"))?;
    let mut lines = Lines {
        queued: vec![0; KTHREADS],
    };
    for k in 0..KTHREADS {
        lines.busy(&app, k);
    }
    let t0 = Instant::now();
    loop {
        let s = client::stats(socket)?;
        if s.apps
            .first()
            .is_some_and(|a| a.cores_now == KTHREADS as u32)
        {
            break;
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "the application never held {KTHREADS} cores"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for k in 0..KTHREADS {
        lines.settle(&app, k);
    }
    let sending = Duration::from_millis(args.send_ms);
    let phase = Duration::from_millis(args.phase_ms);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let driver = std::thread::spawn(move || {
        let (mut step, mut parked) = (0usize, None::<usize>);
        let (started, mut phase_start) = (Instant::now(), Instant::now());
        let mut stolen = 0u64;
        while !stop2.load(Ordering::Acquire) {
            stolen += echo(&mut app, parked).1;
            if started.elapsed() > sending {
                if let Some(k) = parked.take() {
                    lines.busy(&app, k);
                }
                continue;
            }
            if phase_start.elapsed() < phase {
                continue;
            }
            phase_start = Instant::now();
            match parked.take() {
                None => {
                    for k in 0..KTHREADS {
                        lines.settle(&app, k);
                    }
                    let k = step % KTHREADS;
                    lines.park(&mut app, k);
                    parked = Some(k);
                    step += 1;
                }
                Some(k) => lines.busy(&app, k),
            }
        }
        (app, stolen)
    });
    let mut load = LoadRun::poisson(me, 7, args.rate, ServiceTime::Constant { ns: 0 }, sending);
    load.config.flows = args.flows;
    load.config.seed = 11 + u64::from(round);
    load.drain = Duration::from_millis(300);
    let report = generator.run(load, Duration::from_secs(10));
    stop.store(true, Ordering::Release);
    let (app, stolen) = driver
        .join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))?;
    let report = report.map_err(|e| anyhow::anyhow!("{e}"))?;
    let stats = client::stats(socket)?;
    drop(app);
    let net = stats
        .apps
        .first()
        .and_then(|a| a.net)
        .context("no net stats")?;
    let steer = stats
        .dataplane
        .steering
        .iter()
        .find(|s| s.st == policy.code())
        .copied()
        .context("no steering stats")?;
    let st = report.stats;
    let us = |q: f64| report.latency.value_at_quantile(q) as f64 / 1e3;
    Ok(Run {
        round,
        policy: policy.name(),
        sent: st.sent,
        replies: st.replies,
        dropped: net.drop_ingress,
        reordered_pct: 100.0 * st.reordered as f64 / st.replies.max(1) as f64,
        stolen_pct: 100.0 * stolen as f64 / st.replies.max(1) as f64,
        changes: steer.ch,
        flows_moved: steer.mv,
        flows_moved_per_change: steer.moved_per_change().unwrap_or(0.0),
        p50_us: us(0.5),
        p99_us: us(0.99),
        ns_per_decision: steer.ns_per_decision().unwrap_or(0.0),
        table_bytes: steer.tb,
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
                format!("{:.4}", r.stolen_pct),
                r.changes.to_string(),
                r.flows_moved.to_string(),
                format!("{:.2}", r.flows_moved_per_change),
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
            "stolen_pct",
            "changes",
            "flows_moved",
            "flows_moved_per_change",
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
