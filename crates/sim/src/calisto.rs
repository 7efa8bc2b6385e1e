//! `ginza sim calisto`: Calisto's experiment (its §5, Figs. 6–7) on a
//! simulated 10-core machine: ~700,000 flows of requests to one
//! latency-critical application under Shenango's 5 µs core allocator, p99
//! latency against packets per second for `rss-mod` (Shenango), `flow-
//! affinity` (Calisto) and `indirection`, before warm-up (an empty flow
//! table: nearly every packet of 700,000 flows is a flow's first) and after
//! (every flow steered once beforehand). The same policy objects as
//! iokerneld (`ginza_policy::steer`), in [`crate::allocsim`].
//!
//! Two costs are parameters, as the paper gives neither: iokerneld's time
//! per flow-table insertion (it steers one request at a time, so an
//! insertion delays every request behind it) and the extra service time of
//! a request run by another kthread than its flow's previous one (what flow
//! affinity saves). docs/simulator.md, "Calisto", compares the result with
//! the paper's figures.

use std::path::PathBuf;

use ginza_policy::steer::SteeringKind;

use crate::allocsim::{AllocPolicy, AllocSim};
use crate::dist::{LoadStep, Service};
use crate::plot::{line_chart, write_csv, Chart, Series};
use crate::steering::SteeringSpec;

/// The experiment's knobs.
#[derive(Clone, Debug)]
pub struct CalistoOpts {
    pub out: PathBuf,
    pub seed: u64,
    pub cores: usize,
    pub flows: u64,
    /// Offered loads, packets per second.
    pub rates: Vec<f64>,
    /// Mean (exponential) service time, µs.
    pub service_us: f64,
    pub table_insert_us: f64,
    pub migration_us: f64,
    /// Simulated time per point, µs.
    pub duration_us: f64,
}

impl CalistoOpts {
    /// The paper's setup: 10 cores, ~700,000 flows, 2,000 to 14,000
    /// packets/s (its Figs. 6–7 span 5,000 to 14,000), 1 s per point.
    pub fn paper(out: PathBuf, seed: u64) -> Self {
        CalistoOpts {
            out,
            seed,
            cores: 10,
            flows: 700_000,
            rates: vec![2_000.0, 5_000.0, 8_000.0, 10_000.0, 12_000.0, 14_000.0],
            service_us: 10.0,
            table_insert_us: 0.5,
            migration_us: 1.0,
            duration_us: 1_000_000.0,
        }
    }
}

/// One point of the sweep.
#[derive(Clone, Debug)]
pub struct Point {
    pub policy: SteeringKind,
    /// Whether the flow table was warmed up before the run.
    pub warm: bool,
    pub pps: f64,
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_cores: f64,
    pub table_inserts: u64,
    pub flows_moved: u64,
}

/// The CSV's columns.
pub const COLUMNS: [&str; 9] = [
    "policy",
    "state",
    "pps",
    "requests",
    "p50_us",
    "p99_us",
    "mean_cores",
    "table_inserts",
    "flows_moved",
];

/// Runs the sweep; writes `calisto.csv` and `calisto-cold.png`,
/// `calisto-warm.png` under `out`; returns the points and a summary.
pub fn run(o: &CalistoOpts) -> anyhow::Result<(Vec<Point>, String)> {
    let mut points = Vec::new();
    for warm in [false, true] {
        for &pps in &o.rates {
            // Policies side by side at each load, with the same seed.
            for policy in SteeringKind::ALL {
                let sim = AllocSim {
                    cores: o.cores,
                    policy: AllocPolicy::Shenango { interval_us: 5.0 },
                    service: Service::Exp { mean: o.service_us },
                    load: vec![LoadStep {
                        duration_us: f64::INFINITY,
                        rate_per_us: pps / 1e6,
                    }],
                    kthreads: o.cores,
                    guaranteed: 0,
                    batch: false,
                    hyperthreads: false,
                    grant_latency_us: 1.0,
                    preempt_latency_us: 1.0,
                    park_spin_us: 2.0,
                    idle_poll_us: 0.0,
                    duration_us: o.duration_us,
                    warmup_us: 0.0,
                    seed: o.seed,
                    steering: SteeringSpec {
                        flows: o.flows,
                        flow_table_capacity: (o.flows as usize).next_power_of_two().max(1024),
                        ..SteeringSpec::of(policy)
                    },
                    table_insert_us: o.table_insert_us,
                    migration_us: o.migration_us,
                    warm_table: warm,
                };
                let r = sim.run();
                points.push(Point {
                    policy,
                    warm,
                    pps,
                    requests: r.stats.n,
                    p50_us: r.stats.latency_pct_us(50.0),
                    p99_us: r.stats.latency_pct_us(99.0),
                    mean_cores: r.mean_cores,
                    table_inserts: r.steering.table_inserts,
                    flows_moved: r.steering.flows_moved,
                });
            }
        }
    }
    std::fs::create_dir_all(&o.out)?;
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.policy.name().to_string(),
                if p.warm { "warm" } else { "cold" }.to_string(),
                format!("{}", p.pps),
                p.requests.to_string(),
                format!("{:.3}", p.p50_us),
                format!("{:.3}", p.p99_us),
                format!("{:.3}", p.mean_cores),
                p.table_inserts.to_string(),
                p.flows_moved.to_string(),
            ]
        })
        .collect();
    write_csv(&o.out.join("calisto.csv"), &COLUMNS, &rows)?;
    let mut summary = format!(
        "{} cores, {} flows, Exp({} µs) service, insert {} µs, migration {} µs\n{:<14} {:<5} {:>8} {:>9} {:>9} {:>10}\n",
        o.cores, o.flows, o.service_us, o.table_insert_us, o.migration_us,
        "policy", "state", "pps", "p50 us", "p99 us", "vs rss-mod"
    );
    for warm in [false, true] {
        let series: Vec<Series> = SteeringKind::ALL
            .iter()
            .map(|&policy| Series {
                name: policy.name().to_string(),
                points: points
                    .iter()
                    .filter(|p| p.policy == policy && p.warm == warm)
                    .map(|p| (p.pps, p.p99_us))
                    .collect(),
            })
            .collect();
        let state = if warm { "warm" } else { "cold" };
        line_chart(
            &o.out.join(format!("calisto-{state}.png")),
            &Chart {
                title: &format!(
                    "p99 vs packets/s, {} flows on {} cores ({})",
                    o.flows,
                    o.cores,
                    if warm {
                        "after warm-up"
                    } else {
                        "empty flow table"
                    }
                ),
                x_label: "packets per second",
                y_label: "p99 latency (us)",
                series: &series,
                log_y: false,
                y_max: None,
                legend_lower_right: false,
            },
        )?;
        for p in points.iter().filter(|p| p.warm == warm) {
            let base = points
                .iter()
                .find(|q| q.warm == warm && q.pps == p.pps && q.policy == SteeringKind::RssMod)
                .map_or(f64::NAN, |q| q.p99_us);
            summary.push_str(&format!(
                "{:<14} {:<5} {:>8} {:>9.1} {:>9.1} {:>+9.1}%\n",
                p.policy.name(),
                state,
                p.pps,
                p.p50_us,
                p.p99_us,
                100.0 * (p.p99_us / base - 1.0)
            ));
        }
    }
    Ok((points, summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny version runs and writes every column for every policy and
    /// state; `flow-affinity` inserts flows in the run before warm-up, and
    /// every flow in the warm-up.
    #[test]
    fn a_tiny_calisto_sweep_runs() {
        let dir = std::env::temp_dir().join(format!("ginza-calisto-{}", std::process::id()));
        let o = CalistoOpts {
            flows: 5_000,
            rates: vec![5_000.0, 14_000.0],
            duration_us: 50_000.0,
            ..CalistoOpts::paper(dir.clone(), 3)
        };
        let (points, summary) = run(&o).unwrap();
        assert_eq!(points.len(), 2 * 2 * 3, "{summary}");
        for p in &points {
            assert!(p.requests > 100, "{p:?}");
            assert!(p.p50_us > 0.0 && p.p50_us <= p.p99_us, "{p:?}");
        }
        let fa = |warm: bool| {
            points
                .iter()
                .find(|p| {
                    p.policy == SteeringKind::FlowAffinity && p.warm == warm && p.pps == 5_000.0
                })
                .unwrap()
        };
        // Cold: the run itself inserts flows (a packet for an application
        // with no core goes to a parked kthread without a look-up).
        assert!(fa(false).table_inserts > 0, "{:?}", fa(false));
        // Warm: the warm-up inserted every flow, the run nearly none more.
        assert!(fa(true).table_inserts >= 5_000, "{:?}", fa(true));
        let csv = std::fs::read_to_string(dir.join("calisto.csv")).unwrap();
        assert_eq!(csv.lines().next().unwrap(), COLUMNS.join(","));
        assert_eq!(csv.lines().count(), 1 + points.len());
        assert!(dir.join("calisto-cold.png").exists());
        assert!(dir.join("calisto-warm.png").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
