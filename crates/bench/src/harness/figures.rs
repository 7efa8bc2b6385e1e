//! Figures and their printing, shared by the benchmarks: the CPUs we may
//! use, medians, percentiles, rounding, the load average, the table or JSON
//! report.

use std::io::Write as _;

use anyhow::Context as _;

/// Prints a benchmark's result: the table on stdout, or with `json` the
/// table on stderr and one JSON object on stdout.
pub(crate) fn emit(json: bool, table: &str, report: &impl serde::Serialize) -> anyhow::Result<()> {
    if json {
        eprint!("{table}");
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, report)?;
        writeln!(out)?;
    } else {
        print!("{table}");
    }
    Ok(())
}

/// Three decimals: what tables, CSVs and reports show; noise is larger
/// anyway. NaN and infinities pass through unchanged.
pub(crate) fn round3(v: f64) -> f64 {
    (v * 1e3).round() / 1e3
}

/// CPUs in this process's affinity mask, ascending.
pub(crate) fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    ginza_sys::affinity::allowed_cpus().context("sched_getaffinity")
}

/// Median (mean of the middle two for an even count); `None` if empty.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// Nearest-rank percentile (`q` in 0..=100) of ascending `sorted`; `None`
/// if empty.
pub(crate) fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The load average over 1, 5 and 15 minutes (`/proc/loadavg`), to print
/// beside figures taken on a shared machine.
pub(crate) fn loadavg() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[9.0, 1.0, 5.0]), Some(5.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[1.0, 1000.0, 2.0, 3.0, 2.0]), Some(2.0));
    }

    #[test]
    fn round3_keeps_three_decimals() {
        assert_eq!(round3(0.123_456), 0.123);
        assert!(round3(f64::NAN).is_nan());
        assert_eq!(round3(f64::INFINITY), f64::INFINITY);
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn this_process_may_use_some_cpu() {
        assert!(!allowed_cpus().unwrap().is_empty());
    }
}
