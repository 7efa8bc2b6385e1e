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

/// Runs `client` again, after `sleep(10 ms)`, while its connection is
/// refused, for up to `timeout`: a Ginza application registers with
/// iokerneld before its servers listen. `sleep` is the caller's own
/// (`std::thread::sleep`, or `ginza_runtime::sleep` on a uthread).
pub(crate) fn retry_refused<T>(
    timeout: Duration,
    sleep: impl Fn(Duration),
    mut client: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match client() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && std::time::Instant::now() < deadline =>
            {
                sleep(Duration::from_millis(10))
            }
            result => return result,
        }
    }
}
