//! Theory checks: the simulator against closed forms (`ginza sim validate`).

use serde::Serialize;

use crate::dist::Service;
use crate::reqsim::{ReqSim, Sched};
use crate::theory;

/// One comparison, printed by `ginza sim validate --json`.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub case: String,
    pub simulated: f64,
    pub theory: f64,
    pub rel_err: f64,
}

impl Check {
    fn new(case: String, simulated: f64, theory: f64) -> Self {
        Self {
            case,
            simulated,
            theory,
            rel_err: (simulated - theory).abs() / theory.abs(),
        }
    }
}

/// Requests per M/M/c case, sized so that the relative standard error of
/// both estimates is about 0.8 % (measured over 12 seeds): heavy load needs
/// more samples (relaxation time ~ 1/(1−ρ)²), and so do rare waits
/// (16 cores at ρ = 0.5: only 0.33 % of requests wait at all).
pub fn mmc_requests(c: usize, rho: f64, scale: f64) -> u64 {
    let millions = match (c, (rho * 10.0).round() as u32) {
        (1, 5) => 0.3,
        (1, 8) => 1.8,
        (1, 9) => 7.0,
        (4, 5) => 1.6,
        (4, 8) => 5.0,
        (4, 9) => 7.0,
        (16, 5) => 40.0,
        (16, 8) => 6.0,
        (16, 9) => 15.0,
        _ => 40.0 * (1.0 - rho).powi(-2) / 1e3,
    };
    (millions * 1e6 * scale).max(10_000.0) as u64
}

/// M/M/c FCFS (c-FCFS through the policy dispatcher) against Erlang C:
/// mean wait and P(W > t) at t = 1/(cμ − λ) (the mean wait of those who wait).
pub fn mmc_case(c: usize, rho: f64, requests: u64, seed: u64) -> [Check; 2] {
    let mu = 1.0;
    let lambda = rho * c as f64 * mu;
    let t = 1.0 / (c as f64 * mu - lambda);
    let mut cfg = ReqSim::new(
        c,
        Sched::CFcfs,
        Service::Exp { mean: 1.0 / mu },
        rho,
        requests,
        seed,
    );
    cfg.wait_thresholds_us = vec![t];
    cfg.histograms = false;
    let st = cfg.run();
    [
        Check::new(
            format!("M/M/{c} FCFS rho={rho} mean wait"),
            st.mean_wait_us(),
            theory::mmc_mean_wait(c, lambda, mu),
        ),
        Check::new(
            format!("M/M/{c} FCFS rho={rho} P(W>{t:.3})"),
            st.wait_exceed_prob()[0],
            theory::mmc_wait_exceeds(c, lambda, mu, t),
        ),
    ]
}

/// M/G/1 processor sharing mean sojourn against E[S]/(1 − ρ).
pub fn ps_case(service: &Service, rho: f64, requests: u64, seed: u64) -> Check {
    let mut cfg = ReqSim::new(1, Sched::Ps, service.clone(), rho, requests, seed);
    cfg.histograms = false;
    let st = cfg.run();
    Check::new(
        format!("M/G/1 PS {} rho={rho} mean sojourn", service.label()),
        st.mean_sojourn_us(),
        theory::mg1_ps_mean_sojourn(service.mean(), rho),
    )
}

pub const MMC_CORES: [usize; 3] = [1, 4, 16];
pub const MMC_RHOS: [f64; 3] = [0.5, 0.8, 0.9];

pub fn ps_services() -> Vec<Service> {
    vec![
        Service::Exp { mean: 1.0 },
        Service::Modes(vec![(0.5, 1.0), (0.5, 100.0)]),
    ]
}

pub const PS_RHOS: [f64; 2] = [0.5, 0.8];

/// Requests per M/G/1-PS case (relative standard error about 0.8 %).
pub fn ps_requests(rho: f64, scale: f64) -> u64 {
    ((60_000.0 / (1.0 - rho).powi(2)) * scale).max(10_000.0) as u64
}

/// All checks; `scale` multiplies sample counts. Cases run in parallel.
pub fn run_all(scale: f64, seed: u64) -> Vec<Check> {
    enum Job {
        Mmc(usize, f64, u64),
        Ps(Service, f64, u64),
    }
    let mut jobs = Vec::new();
    for (i, &c) in MMC_CORES.iter().enumerate() {
        for (j, &rho) in MMC_RHOS.iter().enumerate() {
            jobs.push(Job::Mmc(c, rho, seed + (i * 10 + j) as u64));
        }
    }
    for (i, s) in ps_services().into_iter().enumerate() {
        for (j, &rho) in PS_RHOS.iter().enumerate() {
            jobs.push(Job::Ps(s.clone(), rho, seed + 100 + (i * 10 + j) as u64));
        }
    }
    crate::figs::par_map("validate", &jobs, |j| match j {
        Job::Mmc(c, rho, sd) => mmc_case(*c, *rho, mmc_requests(*c, *rho, scale), *sd).to_vec(),
        Job::Ps(s, rho, sd) => vec![ps_case(s, *rho, ps_requests(*rho, scale), *sd)],
    })
    .into_iter()
    .flatten()
    .collect()
}
