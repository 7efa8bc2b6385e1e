//! What the Shinjuku-mode benchmarks and experiments share: the
//! dispatcher's and the worker's CPUs, the requests' busy work, and a run's
//! makespan.

use ginza_runtime::preempt_point;
use ginza_runtime::shinjuku::{Preemption, SchedPolicy, ServeReport, ShinjukuConfig};
use serde::Serialize;

use super::figures::allowed_cpus;

/// The dispatcher's and the worker's CPU.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Cores {
    pub(crate) dispatcher: usize,
    pub(crate) worker: usize,
}

impl Cores {
    /// `requested` (`[D, W]`) checked against the affinity mask, or the two
    /// last allowed CPUs.
    pub(crate) fn pick(requested: &[usize]) -> anyhow::Result<Cores> {
        let allowed = allowed_cpus()?;
        match requested {
            [] => {
                anyhow::ensure!(
                    allowed.len() >= 2,
                    "this process may only run on CPUs {allowed:?}; the dispatcher and the \
                     worker need two (or name them with --cores D,W)"
                );
                Ok(Cores {
                    dispatcher: allowed[allowed.len() - 2],
                    worker: allowed[allowed.len() - 1],
                })
            }
            &[dispatcher, worker] => {
                for c in [dispatcher, worker] {
                    anyhow::ensure!(
                        allowed.contains(&c),
                        "--cores: CPU {c} is not among the allowed CPUs {allowed:?}"
                    );
                }
                if dispatcher == worker {
                    eprintln!(
                        "warning: dispatcher and worker share CPU {dispatcher}: figures will \
                         mostly measure Linux time slicing"
                    );
                }
                Ok(Cores { dispatcher, worker })
            }
            other => anyhow::bail!("--cores takes two CPUs, D,W; got {other:?}"),
        }
    }

    /// A one-worker Shinjuku configuration on these cores.
    pub(crate) fn config(self, policy: SchedPolicy, preemption: Preemption) -> ShinjukuConfig {
        ShinjukuConfig {
            workers: 1,
            worker_cores: Some(vec![self.worker]),
            dispatcher_core: Some(self.dispatcher),
            policy,
            preemption,
            ..ShinjukuConfig::default()
        }
    }
}

/// `iters` steps of a xorshift generator (a chain of dependent shifts and
/// xors the compiler cannot fold), in chunks of `every` steps; with `POLL`,
/// a preemption point after each chunk.
#[inline(always)]
pub(crate) fn chunked<const POLL: bool>(iters: u64, every: u64, seed: u64) -> u64 {
    let mut x = seed | 1;
    let mut left = iters;
    let every = every.max(1);
    while left > 0 {
        let n = left.min(every);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        left -= n;
        if POLL {
            preempt_point();
        }
    }
    x
}

/// From the first arrival to the last completion, ns.
pub(crate) fn makespan_ns<R>(report: &ServeReport<R>) -> u64 {
    let first = report.completions.iter().map(|c| c.arrival_ns).min();
    let last = report.completions.iter().map(|c| c.finish_ns).max();
    match (first, last) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    }
}
