//! The demo's results: one row per policy and load point, the arithmetic
//! that turns raw counters into them, the table, the CSV.

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::harness::figures::round3;

/// One policy at one offered load.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Row {
    /// Service-time distribution of the requests.
    pub(crate) service: &'static str,
    pub(crate) policy: &'static str,
    /// Offered load, a fraction of the managed cores' capacity.
    pub(crate) offered_load: f64,
    /// Service time the server spent during the measured run over the run
    /// × managed cores.
    pub(crate) achieved_load: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    /// Batch Monte Carlo paths per second, millions.
    pub(crate) batch_mpaths_per_s: f64,
    /// Batch's paths per second alone on the managed cores, millions:
    /// measured in the same point, after `lc` stopped.
    pub(crate) batch_alone_mpaths_per_s: f64,
    /// How much of the capacity `lc` left spare batch turned into work:
    /// batch's rate over its rate alone × (1 − achieved load)
    /// ([`share_of_spare`]; NaN: not measured).
    pub(crate) batch_share_of_spare: f64,
    /// p50 over `static`'s p50 at the same service distribution and
    /// offered load in the same run (NaN: no such row;
    /// [`fill_p50_vs_static`]).
    pub(crate) p50_vs_static: f64,
    /// Cores held, averaged over the window's samples.
    pub(crate) lc_cores: f64,
    pub(crate) batch_cores: f64,
    /// Cores moved from one application to the other, per second.
    pub(crate) reallocations_per_s: f64,
    /// Of those, preemptions of batch withdrawn (the core came back before
    /// batch was signalled), per second (JSON only).
    pub(crate) withdrawn_per_s: f64,
    /// `--local-wake`: lc woken by batch's kthread on the core, and by
    /// iokerneld after the wait, per second (JSON only).
    pub(crate) local_wakes_per_s: f64,
    pub(crate) local_wakes_by_iokernel_per_s: f64,
    /// Preemptions in the window that iokerneld had to enforce (not
    /// answered within its deadline).
    pub(crate) overdue_preemptions: u64,
    /// Requests the generator sent in the measured run.
    pub(crate) lc_requests_sent: u64,
    /// Of those, answered (latency samples).
    pub(crate) lc_requests_answered: u64,
    /// Busy time of other processes, and steal time, on the demo's CPUs
    /// during the measured run, % of their time (NaN: not measured;
    /// `super::quiet`).
    pub(crate) foreign_cpu_pct: f64,
    pub(crate) steal_pct: f64,
    /// `yes`: nothing else competed for the demo's CPUs, the figures stand;
    /// `no`: they do not (a warning under the row); `unknown`: `/proc`
    /// could not tell.
    pub(crate) quiet: &'static str,
    /// Empty, or what went wrong at this point.
    pub(crate) note: String,
    /// Where the requests' time went (JSON only; `super::phases`).
    pub(crate) phases: Option<super::phases::Phases>,
}

/// The CSV's header, in row order.
pub(crate) const CSV_HEADER: [&str; 21] = [
    "service",
    "policy",
    "offered_load",
    "achieved_load",
    "p50_us",
    "p99_us",
    "p999_us",
    "batch_mpaths_per_s",
    "batch_alone_mpaths_per_s",
    "batch_share_of_spare",
    "p50_vs_static",
    "lc_cores",
    "batch_cores",
    "reallocations_per_s",
    "overdue_preemptions",
    "lc_requests_sent",
    "lc_requests_answered",
    "foreign_cpu_pct",
    "steal_pct",
    "quiet",
    "note",
];

/// Latency percentiles in µs (`(0, 0, 0)` for an empty histogram).
pub(crate) fn percentiles_us(h: &Histogram<u64>) -> (f64, f64, f64) {
    if h.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    (us(0.50), us(0.99), us(0.999))
}

/// Average of the samples (0 without samples).
pub(crate) fn mean(samples: &[u32]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().map(|&c| f64::from(c)).sum::<f64>() / samples.len() as f64
}

/// Per-second rate of a counter between two readings `window_ns` apart (a
/// counter that went backwards, i.e. was reset, counts as 0).
pub(crate) fn per_second(before: u64, after: u64, window_ns: u64) -> f64 {
    if window_ns == 0 {
        return 0.0;
    }
    after.saturating_sub(before) as f64 * 1e9 / window_ns as f64
}

/// Busy fraction of `cores` cores that `service_ns` of work fills in
/// `window_ns`.
pub(crate) fn achieved_load(service_ns: u64, window_ns: u64, cores: usize) -> f64 {
    if window_ns == 0 || cores == 0 {
        return 0.0;
    }
    service_ns as f64 / (window_ns as f64 * cores as f64)
}

/// Batch's share of the capacity `lc` left spare: its rate over its rate
/// alone on the same cores, over the spare fraction (1 − achieved load).
/// NaN when it cannot be told (nothing alone, or nothing spare).
pub(crate) fn share_of_spare(batch_per_s: f64, alone_per_s: f64, achieved_load: f64) -> f64 {
    let spare = 1.0 - achieved_load;
    if !(alone_per_s > 0.0 && spare > 0.0) {
        return f64::NAN;
    }
    batch_per_s / (alone_per_s * spare)
}

/// Sets every row's `p50_vs_static`: its p50 over the p50 of the `static`
/// row with the same service distribution and offered load (NaN where
/// there is none, or static's p50 is zero).
pub(crate) fn fill_p50_vs_static(rows: &mut [Row]) {
    let statics: Vec<(&'static str, f64, f64)> = rows
        .iter()
        .filter(|r| r.policy == "static")
        .map(|r| (r.service, r.offered_load, r.p50_us))
        .collect();
    for r in rows.iter_mut() {
        r.p50_vs_static = statics
            .iter()
            .find(|(service, load, _)| *service == r.service && *load == r.offered_load)
            .filter(|(_, _, p50)| *p50 > 0.0)
            .map_or(f64::NAN, |(_, _, p50)| round3(r.p50_us / p50));
    }
}

/// The CSV cells of a row, in [`CSV_HEADER`] order.
fn cells(r: &Row) -> Vec<String> {
    // Notes are free text: quoted, inner quotes doubled.
    let note = format!("\"{}\"", r.note.replace('"', "\"\""));
    vec![
        r.service.to_string(),
        r.policy.to_string(),
        r.offered_load.to_string(),
        r.achieved_load.to_string(),
        r.p50_us.to_string(),
        r.p99_us.to_string(),
        r.p999_us.to_string(),
        r.batch_mpaths_per_s.to_string(),
        num(r.batch_alone_mpaths_per_s, 3),
        num(r.batch_share_of_spare, 3),
        num(r.p50_vs_static, 3),
        r.lc_cores.to_string(),
        r.batch_cores.to_string(),
        r.reallocations_per_s.to_string(),
        r.overdue_preemptions.to_string(),
        r.lc_requests_sent.to_string(),
        r.lc_requests_answered.to_string(),
        num(r.foreign_cpu_pct, 1),
        num(r.steal_pct, 1),
        r.quiet.to_string(),
        note,
    ]
}

pub(crate) fn write_csv(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = rows.iter().map(cells).collect();
    ginza_sim::plot::write_csv(path, &CSV_HEADER, &rows)
}

/// `v` with `decimals`, or `-` for a value the point could not measure.
fn num(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        "-".into()
    }
}

/// The table: per service distribution, one block per policy (in the
/// orders given), one line per load.
pub(crate) fn render_table(
    rows: &[Row],
    services: &[(&'static str, String)],
    policies: &[(&'static str, String)],
) -> String {
    let mut t = String::new();
    for (service, about) in services {
        if !rows.iter().any(|r| r.service == *service) {
            continue;
        }
        let _ = writeln!(t, "\n=== {service}: {about}");
        for (name, what) in policies {
            let mine: Vec<&Row> = rows
                .iter()
                .filter(|r| r.policy == *name && r.service == *service)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let _ = writeln!(t, "\n{name}: {what}");
            let _ = writeln!(
                t,
                "  {:>7} {:>8} {:>8} {:>7} {:>8} {:>9} {:>11} {:>11} {:>8} {:>8} {:>10} {:>15}",
                "offered",
                "achieved",
                "p50 µs",
                "×static",
                "p99 µs",
                "p99.9 µs",
                "batch Mp/s",
                "batch/spare",
                "LC cores",
                "batch c.",
                "realloc/s",
                "LC ans/sent"
            );
            for r in mine {
                let _ = write!(
                    t,
                    "  {:>7.2} {:>8} {:>8} {:>7} {:>8} {:>9} {:>11} {:>11} {:>8} {:>8} {:>10} {:>15}",
                    r.offered_load,
                    num(r.achieved_load, 3),
                    num(r.p50_us, 1),
                    num(r.p50_vs_static, 2),
                    num(r.p99_us, 1),
                    num(r.p999_us, 1),
                    num(r.batch_mpaths_per_s, 2),
                    num(r.batch_share_of_spare, 2),
                    num(r.lc_cores, 2),
                    num(r.batch_cores, 2),
                    num(r.reallocations_per_s, 0),
                    format!("{}/{}", r.lc_requests_answered, r.lc_requests_sent),
                );
                if !r.note.is_empty() {
                    let _ = write!(t, "  ({})", r.note);
                }
                t.push('\n');
                if r.quiet == "no" {
                    let _ = writeln!(
                        t,
                        "  ^ NOT QUIET: other processes ran {} % and the hypervisor stole {} % of the demo's CPUs' time during this point: not a result",
                        num(r.foreign_cpu_pct, 0),
                        num(r.steal_pct, 0)
                    );
                }
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &'static str, load: f64) -> Row {
        Row {
            service: "exponential",
            policy,
            offered_load: load,
            achieved_load: load,
            p50_us: 12.0,
            p99_us: 80.0,
            p999_us: 120.5,
            batch_mpaths_per_s: 30.0,
            batch_alone_mpaths_per_s: 50.0,
            batch_share_of_spare: 0.8,
            p50_vs_static: f64::NAN,
            lc_cores: 0.3,
            batch_cores: 0.7,
            reallocations_per_s: 2500.0,
            overdue_preemptions: 0,
            lc_requests_sent: 30_000,
            lc_requests_answered: 29_950,
            foreign_cpu_pct: 1.0,
            steal_pct: 0.0,
            quiet: "yes",
            note: String::new(),
            phases: None,
            withdrawn_per_s: 0.0,
            local_wakes_per_s: 0.0,
            local_wakes_by_iokernel_per_s: 0.0,
        }
    }

    #[test]
    fn percentiles_of_a_known_histogram() {
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap(); // 1..=1000 µs
        }
        let (p50, p99, p999) = percentiles_us(&h);
        assert!((p50 - 500.0).abs() < 1.0, "{p50}");
        assert!((p99 - 990.0).abs() < 1.0, "{p99}");
        assert!((p999 - 999.0).abs() < 1.0, "{p999}");
        assert!(p50 <= p99 && p99 <= p999);
        assert_eq!(
            percentiles_us(&hdrhistogram::Histogram::<u64>::new(3).unwrap()),
            (0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn aggregation_helpers() {
        assert_eq!(mean(&[]), 0.0);
        assert_eq!(mean(&[0, 1, 1, 0]), 0.5);
        assert_eq!(per_second(100, 600, 500_000_000), 1000.0);
        assert_eq!(
            per_second(600, 100, 1_000_000_000),
            0.0,
            "a reset counter is no negative rate"
        );
        assert_eq!(per_second(1, 2, 0), 0.0);
        // 0.5 s of work in a 1 s window on 2 cores: a quarter of capacity.
        assert_eq!(achieved_load(500_000_000, 1_000_000_000, 2), 0.25);
        assert_eq!(achieved_load(5, 0, 1), 0.0);
    }

    #[test]
    fn share_of_spare_and_p50_against_static() {
        // 0.3 of the cores busy with lc: 0.7 spare; batch did 35 of the 50
        // it does alone, all of the spare.
        assert!((share_of_spare(35.0, 50.0, 0.3) - 1.0).abs() < 1e-9);
        assert!((share_of_spare(14.0, 50.0, 0.3) - 0.4).abs() < 1e-9);
        assert!(share_of_spare(1.0, 0.0, 0.1).is_nan());
        assert!(share_of_spare(1.0, 5.0, 1.0).is_nan());
        let mut rows = vec![
            row("shenango", 0.1),
            row("static", 0.1),
            row("shenango", 0.5),
        ];
        rows[0].p50_us = 15.0;
        rows[1].p50_us = 10.0;
        fill_p50_vs_static(&mut rows);
        assert_eq!(rows[0].p50_vs_static, 1.5);
        assert_eq!(rows[1].p50_vs_static, 1.0);
        assert!(rows[2].p50_vs_static.is_nan(), "no static row at 0.5");
        let mut other = row("shenango", 0.1);
        other.service = "bimodal";
        fill_p50_vs_static(std::slice::from_mut(&mut other));
        assert!(other.p50_vs_static.is_nan(), "static of another service");
    }

    #[test]
    fn csv_has_every_column_and_quotes_notes() {
        let dir = std::env::temp_dir().join(format!("ginza-demo-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("demo.csv");
        let mut r2 = row("static", 0.5);
        r2.note = "stuck, \"lc\" never woke".into();
        write_csv(&path, &[row("shenango", 0.1), r2]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], CSV_HEADER.join(","));
        assert_eq!(lines[1].split(',').count(), CSV_HEADER.len());
        assert!(
            lines[1].starts_with("exponential,shenango,0.1,0.1,12,80,120.5,30,"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].ends_with("\"stuck, \"\"lc\"\" never woke\""),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn table_groups_rows_by_policy_in_the_given_order() {
        let rows = [
            row("shenango", 0.1),
            row("static", 0.1),
            row("shenango", 0.5),
        ];
        let services = [("exponential", "exp".to_string())];
        let t = render_table(
            &rows,
            &services,
            &[
                ("static", "fixed".into()),
                ("shenango", "5 µs".into()),
                ("slow", "1 ms".into()),
            ],
        );
        let st = t.find("static: fixed").unwrap();
        let sh = t.find("shenango: 5 µs").unwrap();
        assert!(st < sh, "{t}");
        assert!(
            !t.contains("slow"),
            "a policy without rows has no block: {t}"
        );
        assert_eq!(t.matches("29950/30000").count(), 3, "{t}");
        let mut stuck = row("slow", 0.3);
        stuck.p99_us = f64::NAN;
        stuck.note = "stuck".into();
        let t = render_table(&[stuck], &services, &[("slow", "1 ms".into())]);
        assert!(
            t.contains(" - ") && t.contains("(stuck)") && !t.contains("NaN"),
            "{t}"
        );
        assert!(!t.contains("NOT QUIET"), "{t}");
        // A point with a competitor says so under its row.
        let mut noisy = row("slow", 0.1);
        (noisy.foreign_cpu_pct, noisy.steal_pct, noisy.quiet) = (23.4, 1.0, "no");
        let t = render_table(&[noisy], &services, &[("slow", "1 ms".into())]);
        let lines: Vec<&str> = t.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains("29950/30000"))
            .unwrap();
        assert!(
            lines[at + 1].contains("NOT QUIET: other processes ran 23 %")
                && lines[at + 1].contains("not a result"),
            "{t}"
        );
    }
}
