//! `ginza bench corealloc --json` runs end to end and reports every figure
//! the issue asks for, each from real events (counts, ordered percentiles).

mod common;

#[test]
fn corealloc_reports_every_figure() {
    if !common::two_cpus("iokerneld and the managed core") {
        return;
    }
    let out = common::ginza()
        .args([
            "bench",
            "corealloc",
            "--json",
            "--grants",
            "30",
            "--handover-for",
            "200ms",
        ])
        .output()
        .unwrap();
    let (v, stderr) = common::json_report(&out);
    for (key, min_n) in [
        ("grant_us", 30),
        ("grant_spinning_us", 1),
        ("eventfd_floor_us", 30),
        ("iokernel_ns_per_grant", 30),
        ("iokernel_ns_per_grant_blocked", 30),
        ("iokernel_ns_per_pass", 1),
        ("preempt_handover_us", 1),
    ] {
        let p = &v[key];
        let (p50, p99, n) = (p["p50"].as_f64(), p["p99"].as_f64(), p["n"].as_u64());
        let (Some(p50), Some(p99), Some(n)) = (p50, p99, n) else {
            panic!("{key} missing in {v}\n{stderr}");
        };
        assert!(n >= min_n, "{key}: only {n} samples");
        assert!(0.0 < p50 && p50 <= p99, "{key}: p50 {p50} p99 {p99}");
    }
    assert!(v["reallocs_per_s"].as_f64().unwrap() > 0.0, "{v}");
    // The default gaps, 5–15 µs: two moves per 10 µs at best.
    assert_eq!(v["handover_gap_us"], serde_json::json!([5, 15]), "{v}");
    assert_eq!(v["reallocs_ceiling_per_s"].as_f64(), Some(200_000.0), "{v}");
    assert!(v["preemptions"].as_u64().unwrap() >= v["handovers"].as_u64().unwrap());
    assert!(stderr.contains("grant / floor"), "{stderr}");
}

#[test]
fn corealloc_refuses_bad_gaps_with_a_clear_error() {
    for bad in ["15,5", "0,10", "10", "a,b"] {
        let out = common::ginza()
            .args(["bench", "corealloc", "--handover-gap-us", bad])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--handover-gap-us"), "{bad}: {stderr}");
        assert!(!stderr.contains("panicked"), "{bad}: {stderr}");
    }
}
