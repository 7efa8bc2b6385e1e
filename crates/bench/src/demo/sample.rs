//! Sampling iokerneld during a point's measured window: the cores each
//! application holds every 10 ms, and the counters at both ends, read from
//! a thread on iokerneld's own CPU.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use ginza_proto::{client, StatsReport};

/// Time between two samples of iokerneld's stats in the window: each
/// costs iokerneld's loop tens of µs (a JSON reply), which the traffic
/// generator on the same loop feels as lag.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// How often the sampler checks for cancellation while it waits.
const MONITOR_EVERY: Duration = Duration::from_millis(10);

/// What the sampler read in the window.
pub(super) struct Samples {
    pub(super) first: StatsReport,
    pub(super) last: StatsReport,
    /// Batch paths at the first and last reading, and the time between.
    pub(super) paths: (u64, u64),
    pub(super) paths_window: Duration,
    pub(super) lc_cores: Vec<u32>,
    pub(super) batch_cores: Vec<u32>,
    /// When each sample was read (since the window start), and batch's
    /// paths then.
    pub(super) at: Vec<Duration>,
    pub(super) paths_at: Vec<u64>,
    /// Failed stats requests in the window.
    pub(super) errors: u32,
}

pub(super) fn app_cores(st: &StatsReport, name: &str) -> u32 {
    st.apps
        .iter()
        .find(|a| a.name == name)
        .map_or(0, |a| a.cores_now)
}

/// Preemptions not answered within iokerneld's deadline so far.
pub(super) fn overdue(st: &StatsReport) -> u64 {
    st.apps.iter().map(|a| a.preempt_overdue).sum()
}

/// Cores moved between applications so far: iokerneld's own count.
pub(super) fn reallocations(st: &StatsReport) -> u64 {
    st.alloc.reallocations
}

/// Samples iokerneld from `from` to `to` on iokerneld's CPU (a
/// monitoring thread there disturbs the managed cores least); returns
/// early, with an error, if `cancel` is set.
pub(super) fn sample(
    socket: PathBuf,
    cpu: usize,
    (from, to): (Instant, Instant),
    paths: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
) -> std::thread::JoinHandle<anyhow::Result<Samples>> {
    std::thread::spawn(move || {
        if let Err(e) = ginza_sys::affinity::pin_current_thread(cpu) {
            log::warn!("the stats sampler runs unpinned (CPU {cpu}: {e})");
        }
        let sleep_until = |t: Instant| -> anyhow::Result<()> {
            while Instant::now() < t {
                if cancel.load(Relaxed) {
                    bail!("sampling canceled");
                }
                std::thread::sleep(
                    t.saturating_duration_since(Instant::now())
                        .min(MONITOR_EVERY),
                );
            }
            Ok(())
        };
        sleep_until(from)?;
        let first =
            client::stats(&socket).context("reading iokerneld's stats at the window start")?;
        let p0 = paths.load(Relaxed);
        let t0 = Instant::now();
        let (mut lc_cores, mut batch_cores, mut errors) = (Vec::new(), Vec::new(), 0);
        let (mut at, mut paths_at) = (Vec::new(), Vec::new());
        let mut next = Instant::now() + SAMPLE_EVERY;
        while next < to {
            sleep_until(next)?;
            match client::stats(&socket) {
                Ok(st) => {
                    lc_cores.push(app_cores(&st, "lc"));
                    batch_cores.push(app_cores(&st, "batch"));
                    at.push(from.elapsed());
                    paths_at.push(paths.load(Relaxed));
                }
                Err(_) => errors += 1,
            }
            next += SAMPLE_EVERY;
        }
        sleep_until(to)?;
        let last = client::stats(&socket).context("reading iokerneld's stats at the window end")?;
        let p1 = paths.load(Relaxed);
        Ok(Samples {
            first,
            last,
            paths: (p0, p1),
            paths_window: t0.elapsed(),
            lc_cores,
            batch_cores,
            at,
            paths_at,
            errors,
        })
    })
}
