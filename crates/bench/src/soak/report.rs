//! The soak's JSON: what it counted, the growth of each process's memory
//! and descriptors, latency by window, and the aims it is judged by.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::procs::{Crash, Sample};
use super::verifier::Percentiles;

/// Growth past which a process that was never restarted is not "flat".
pub const RSS_FLAT_MIB: f64 = 16.0;
pub const FDS_FLAT: i64 = 8;

/// `ginza bench soak`'s report (docs/soak.md).
#[derive(Serialize, Debug, Default)]
pub struct SoakReport {
    pub duration_s: f64,
    pub seed: u64,
    /// iokerneld's NIC backend on the veth.
    pub backend: String,
    /// iokerneld's minimum residency of a latency-critical core, µs.
    pub min_residency_us: f64,
    /// Answered requests: the verifier's and loadgen's.
    pub requests: u64,
    pub requests_verified: u64,
    pub requests_loadgen: u64,
    pub lost_writes: u64,
    pub wrong_answers: u64,
    /// Processes of ours that died unasked.
    pub crashes: u64,
    pub crash_details: Vec<Crash>,
    /// Per process, MiB: median over the last window less median over the
    /// first (see `growth_windows`).
    pub rss_growth_mib: BTreeMap<String, Option<f64>>,
    pub fds_growth: BTreeMap<String, Option<i64>>,
    /// Median resident memory of each process over the last window, MiB.
    pub rss_last_mib: BTreeMap<String, Option<f64>>,
    pub growth_windows: String,
    /// Times each process was started after its first start.
    pub restarts: BTreeMap<String, u32>,
    pub faults_injected: BTreeMap<String, u64>,
    /// Latency by window (a minute; a tenth of the run if under 2 min).
    pub windows: Vec<Window>,
    pub verifier: VerifierCounts,
    /// kv-protected exited by itself after the netstack it was attached to
    /// was killed (protected applications do not re-attach: docs/soak.md).
    pub protected_exits_after_netstack_kill: u64,
    /// ... or had to be killed because it did not exit within 10 s.
    pub protected_hangs_after_netstack_kill: u64,
    /// Findings, at most 20, for the reader.
    pub examples: Vec<String>,
    /// Where the children's stderr went (kept only when something failed).
    pub logs: Option<String>,
}

/// The verifying client's own counts.
#[derive(Serialize, Debug, Default)]
pub struct VerifierCounts {
    pub answered: u64,
    /// Requests that got no answer (the model took both outcomes).
    pub unanswered: u64,
    /// Answers to requests during which their server restarted.
    pub not_judged: u64,
    pub connects_failed: u64,
    /// Key models forgotten because their server was killed.
    pub models_forgotten: u64,
    /// The final pass: every key read once after the faults ended.
    pub final_keys_read: u64,
    pub final_keys_unread: u64,
    /// Answers whose latency came after their window's percentiles were
    /// taken (not in `windows`; none expected: windows stay open far
    /// longer than the workers' time-outs).
    pub latency_records_late: u64,
}

/// One latency window.
#[derive(Serialize, Debug)]
pub struct Window {
    pub start_s: f64,
    pub end_s: f64,
    /// The verifier's answered requests (closed loop, µs).
    pub verifier: Option<serde_json::Value>,
    /// loadgen's open-loop run on kv-rtc in this window.
    pub loadgen: Option<serde_json::Value>,
}

impl SoakReport {
    /// Each aim the run missed, said in words; empty when it met them all.
    pub fn missed_aims(&self) -> Vec<String> {
        let mut missed = Vec::new();
        let counts = [
            ("lost_writes", self.lost_writes),
            ("wrong_answers", self.wrong_answers),
            ("crashes", self.crashes),
            ("final_keys_unread", self.verifier.final_keys_unread),
            (
                "protected_hangs_after_netstack_kill",
                self.protected_hangs_after_netstack_kill,
            ),
        ];
        for (name, n) in counts {
            if n > 0 {
                missed.push(format!("{name} = {n}"));
            }
        }
        for (name, restarts) in &self.restarts {
            if *restarts > 0 {
                continue;
            }
            if let Some(Some(g)) = self.rss_growth_mib.get(name) {
                if *g > RSS_FLAT_MIB {
                    missed.push(format!("{name}: resident memory grew {g:.1} MiB"));
                }
            }
            if let Some(Some(g)) = self.fds_growth.get(name) {
                if *g > FDS_FLAT {
                    missed.push(format!("{name}: {g} more descriptors open"));
                }
            }
        }
        missed
    }
}

/// The first and last windows growth is read over, and their description:
/// a minute each from 2 minutes up, else a tenth of the run each.
pub(crate) fn growth_span(run: Duration) -> (Duration, String) {
    if run >= Duration::from_secs(120) {
        (
            Duration::from_secs(60),
            "first minute against last minute".into(),
        )
    } else {
        (
            run / 10,
            "first 10 % against last 10 % of the run (shorter than 2 min)".into(),
        )
    }
}

/// Median RSS (MiB) and descriptors (if readable) of the samples in
/// `[from, to)`.
fn medians(samples: &[Sample], from: Instant, to: Instant) -> Option<(f64, Option<i64>)> {
    let mut rss: Vec<u64> = Vec::new();
    let mut fds: Vec<u64> = Vec::new();
    for s in samples.iter().filter(|s| s.at >= from && s.at < to) {
        rss.push(s.rss_kib);
        fds.extend(s.fds);
    }
    if rss.is_empty() {
        return None;
    }
    rss.sort_unstable();
    fds.sort_unstable();
    let fds = (!fds.is_empty()).then(|| fds[fds.len() / 2] as i64);
    Some((rss[rss.len() / 2] as f64 / 1024.0, fds))
}

/// Growth of one process between the first and last `span` of
/// `[start, end)`: (RSS MiB, descriptors, last RSS MiB).
pub(crate) fn growth(
    samples: &[Sample],
    start: Instant,
    end: Instant,
    span: Duration,
) -> (Option<f64>, Option<i64>, Option<f64>) {
    let first = medians(samples, start, start + span);
    let last = medians(samples, end.checked_sub(span).unwrap_or(start), end);
    match (first, last) {
        (Some((r0, f0)), Some((r1, f1))) => {
            (Some(r1 - r0), f0.zip(f1).map(|(a, b)| b - a), Some(r1))
        }
        (_, last) => (None, None, last.map(|(r, _)| r)),
    }
}

/// The verifier's window percentiles as JSON.
pub(crate) fn percentiles_json(p: &Percentiles) -> serde_json::Value {
    serde_json::to_value(p).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, rss_mib: u64, fds: u64) -> Sample {
        Sample {
            at,
            rss_kib: rss_mib * 1024,
            fds: Some(fds),
        }
    }

    #[test]
    fn growth_compares_the_medians_of_the_first_and_last_windows() {
        let t0 = Instant::now();
        let s: Vec<Sample> = (0..100)
            .map(|i| sample(t0 + Duration::from_secs(i), 10 + i / 10, 5 + i / 50))
            .collect();
        let end = t0 + Duration::from_secs(100);
        let (rss, fds, last) = growth(&s, t0, end, Duration::from_secs(10));
        assert_eq!(rss, Some(9.0));
        assert_eq!(fds, Some(1));
        assert_eq!(last, Some(19.0));
        assert_eq!(growth(&[], t0, end, Duration::from_secs(10)).0, None);
    }

    #[test]
    fn short_runs_read_growth_over_tenths() {
        assert_eq!(
            growth_span(Duration::from_secs(30)).0,
            Duration::from_secs(3)
        );
        assert_eq!(
            growth_span(Duration::from_secs(600)).0,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_clean_report_meets_its_aims_and_a_grown_one_does_not() {
        let mut r = SoakReport::default();
        r.restarts.insert("kv-rtc".into(), 0);
        r.rss_growth_mib.insert("kv-rtc".into(), Some(1.0));
        assert!(r.missed_aims().is_empty());
        r.rss_growth_mib.insert("kv-rtc".into(), Some(100.0));
        r.lost_writes = 1;
        assert_eq!(r.missed_aims().len(), 2);
    }
}
