//! `ginza sim <scenario.toml>`: anything the reproductions do not cover.
//!
//! ```toml
//! name = "bimodal-16"
//! [requests]                     # a request-scheduling load sweep
//! cores = 16
//! service = "Bimodal(99.5-0.5, 0.5-500)"
//! loads = [0.3, 0.5, 0.7, 0.9]
//! requests = 200000
//! scheds = [{ kind = "c-fcfs" }, { kind = "c-pre-sq", quantum_us = 5.0, place = "tail" }]
//!
//! [[alloc]]                      # core-allocation runs (any number)
//! name = "shenango"
//! cores = 8
//! ...                            # the fields of `allocsim::AllocSim`
//! steering = { policy = "indirection", flows = 10000 }  # `steering::SteeringSpec`
//! ```

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use crate::allocsim::AllocSim;
use crate::dist::Service;
use crate::figs::par_map;
use crate::plot::{line_chart, write_csv, Chart, Series};
use crate::reqsim::{ReqSim, Sched};
use crate::steering::SteeringSpec;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub requests: Option<RequestSweep>,
    #[serde(default)]
    pub alloc: Vec<NamedAlloc>,
}

/// p99 (and more) vs load for several policies.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSweep {
    pub cores: usize,
    pub service: Service,
    pub loads: Vec<f64>,
    pub requests: u64,
    pub scheds: Vec<Sched>,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub preempt_cost_us: f64,
    #[serde(default)]
    pub ctx_switch_us: f64,
    /// The steering of d-FCFS runs.
    #[serde(default)]
    pub steering: SteeringSpec,
}

#[derive(Debug, Deserialize)]
pub struct NamedAlloc {
    pub name: String,
    #[serde(flatten)]
    pub sim: AllocSim,
}

pub fn load(path: &Path) -> anyhow::Result<Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Runs a scenario, writing CSV/PNG under `out/<name>/`; returns a summary.
pub fn run(sc: &Scenario, out: &Path) -> anyhow::Result<String> {
    let dir = out.join(&sc.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut summary = String::new();
    if let Some(rs) = &sc.requests {
        let jobs: Vec<(usize, f64)> = (0..rs.scheds.len())
            .flat_map(|s| rs.loads.iter().map(move |&l| (s, l)))
            .collect();
        let res = par_map(&sc.name, &jobs, |&(s, l)| {
            let mut c = ReqSim::new(
                rs.cores,
                rs.scheds[s].clone(),
                rs.service.clone(),
                l,
                rs.requests,
                rs.seed,
            );
            c.preempt_cost_us = rs.preempt_cost_us;
            c.ctx_switch_us = rs.ctx_switch_us;
            c.steering = rs.steering.clone();
            c.run()
        });
        let mut rows = Vec::new();
        let mut series: Vec<Series> = rs
            .scheds
            .iter()
            .map(|s| Series {
                name: s.label(),
                points: Vec::new(),
            })
            .collect();
        summary += "| policy | load | p50 us | p99 us | p99.9 us | p99 slowdown |\n|---|---|---|---|---|---|\n";
        for (&(s, l), st) in jobs.iter().zip(&res) {
            series[s].points.push((l, st.latency_pct_us(99.0)));
            let row = vec![
                rs.scheds[s].label(),
                format!("{l}"),
                format!("{:.3}", st.latency_pct_us(50.0)),
                format!("{:.3}", st.latency_pct_us(99.0)),
                format!("{:.3}", st.latency_pct_us(99.9)),
                format!("{:.3}", st.slowdown_pct(99.0)),
            ];
            summary += &format!("| {} |\n", row.join(" | "));
            rows.push(row);
        }
        write_csv(
            &dir.join("requests.csv"),
            &[
                "policy",
                "load",
                "p50_us",
                "p99_us",
                "p999_us",
                "p99_slowdown",
            ],
            &rows,
        )?;
        line_chart(
            &dir.join("requests.png"),
            &Chart {
                title: &format!("{}: {} on {} cores", sc.name, rs.service.label(), rs.cores),
                x_label: "load (utilization)",
                y_label: "p99 latency (us)",
                series: &series,
                log_y: true,
                y_max: None,
                legend_lower_right: false,
            },
        )?;
    }
    if !sc.alloc.is_empty() {
        let res = par_map(&sc.name, &sc.alloc, |a| a.sim.run());
        let header = [
            "name",
            "p50_us",
            "p99_us",
            "p999_us",
            "efficiency",
            "mean_cores",
            "batch_share",
            "grants",
            "preemptions",
            "steering",
            "flows_moved",
            "table_evictions",
        ];
        let mut rows = Vec::new();
        summary += &format!(
            "| {} |\n|{}\n",
            header.join(" | "),
            "---|".repeat(header.len())
        );
        for (a, r) in sc.alloc.iter().zip(&res) {
            let row = vec![
                a.name.clone(),
                format!("{:.2}", r.stats.latency_pct_us(50.0)),
                format!("{:.2}", r.stats.latency_pct_us(99.0)),
                format!("{:.2}", r.stats.latency_pct_us(99.9)),
                format!("{:.4}", r.efficiency),
                format!("{:.3}", r.mean_cores),
                format!("{:.4}", r.batch_share),
                r.grants.to_string(),
                r.preemptions.to_string(),
                a.sim.steering.policy.name().into(),
                r.steering.flows_moved.to_string(),
                r.steering.table_evictions.to_string(),
            ];
            summary += &format!("| {} |\n", row.join(" | "));
            rows.push(row);
        }
        write_csv(&dir.join("alloc.csv"), &header, &rows)?;
        let eff = [Series {
            name: "p99 latency (us) by run index".into(),
            points: res
                .iter()
                .enumerate()
                .map(|(i, r)| (i as f64, r.stats.latency_pct_us(99.0)))
                .collect(),
        }];
        line_chart(
            &dir.join("alloc.png"),
            &Chart {
                title: &format!("{}: p99 latency per run (see alloc.csv for names)", sc.name),
                x_label: "run",
                y_label: "p99 latency (us)",
                series: &eff,
                log_y: true,
                y_max: None,
                legend_lower_right: false,
            },
        )?;
    }
    if summary.is_empty() {
        anyhow::bail!("scenario {} has neither [requests] nor [[alloc]]", sc.name);
    }
    Ok(summary)
}
