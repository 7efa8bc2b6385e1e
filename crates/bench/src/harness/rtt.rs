//! The round trips several benchmarks measure (64-byte echoes after a
//! warm-up) and their p50/p99.

use std::time::Duration;

use anyhow::anyhow;
use serde::Serialize;

use super::figures::percentile;

/// Request and reply size of the round trips.
pub(crate) const PAYLOAD: usize = 64;
/// Round trips before each measured series.
pub(crate) const WARMUP: usize = 1000;
/// The longest wait for one read or write before a run is declared stuck.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Serialize, Clone, Copy, Debug, Default)]
pub(crate) struct Quantiles {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
}

/// p50 and p99 in µs of round trips in ns.
pub(crate) fn quantiles(mut ns: Vec<u64>) -> anyhow::Result<Quantiles> {
    ns.sort_unstable();
    let us = |q| percentile(&ns, q).map(|v| v as f64 / 1e3);
    Ok(Quantiles {
        p50: us(50.0).ok_or_else(|| anyhow!("no round trip measured"))?,
        p99: us(99.0).ok_or_else(|| anyhow!("no round trip measured"))?,
    })
}
