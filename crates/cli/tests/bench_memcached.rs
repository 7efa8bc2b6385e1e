//! `ginza bench memcached --json` runs end to end in a short mode (two
//! light loads, one round): as root, with `ip`, `ethtool` and Debian's
//! `memcached`, both systems answer without error, batch work runs beside
//! Ginza's server (iokerneld grants it cores), and the JSON, CSV and PNGs
//! have the documented shape. No rate is asserted beyond what can be
//! answered: on a loaded CI machine a debug-build server may answer late,
//! and batch work at SCHED_IDLE may get no CPU at all.

mod common;

#[test]
fn memcached_bench_reports_both_systems_at_each_load() {
    if !common::two_cpus("the generator, iokerneld and the servers") {
        return;
    }
    if let Some(why) = common::veth_or_memcached_missing() {
        ginza_iokernel::testing::skip(why);
        return;
    }
    let out_dir = common::out_dir("bench-memcached-test");
    let out = common::ginza()
        .args([
            "bench",
            "memcached",
            "--json",
            "--loads",
            "2k,4k",
            "--rounds",
            "1",
            "--duration",
            "1s",
            "--warmup",
            "100ms",
            "--keys",
            "500",
            "--connections",
            "4",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .unwrap();
    let (v, stderr) = common::json_report(&out);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 4, "{v}");
    // One round: the runs are the points, in the same order.
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{v}");
    for (i, (p, run)) in points.iter().zip(runs).enumerate() {
        let system = ["ginza", "linux"][i % 2];
        let offered = [2.0, 4.0][i / 2];
        assert_eq!(p["system"], system, "{p}");
        assert_eq!(run["system"], system, "{run}");
        assert_eq!(p["offered_krps"].as_f64(), Some(offered), "{p}");
        let achieved = p["achieved_krps"].as_f64().unwrap();
        // The server answered, never more than was offered (a Poisson
        // schedule's count varies by a few %), and never wrongly.
        assert!(
            0.0 < achieved && achieved < 1.2 * offered,
            "{system} at {offered} krps answered {achieved} krps: {p}\n{stderr}"
        );
        assert_eq!(run["errors"].as_u64(), Some(0), "{run}");
        let batch = p["batch_ops_per_s"].as_f64().unwrap();
        assert!(batch.is_finite() && batch >= 0.0, "{p}");
        if system == "ginza" {
            // The batch application held cores beside kv-server: iokerneld
            // granted it some ("batch: N grants, …").
            let iokerneld = run["iokerneld"].as_str().unwrap_or_default();
            let grants = iokerneld
                .split("batch: ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok());
            assert!(grants.is_some_and(|g| g > 0), "{run}");
        }
        let saturated = p["generator_saturated"].as_bool().unwrap();
        let quantiles: Vec<Option<f64>> = ["p50_us", "p99_us", "p999_us"]
            .iter()
            .map(|k| {
                assert!(p.get(*k).is_some(), "{k} missing: {p}");
                p[*k].as_f64()
            })
            .collect();
        if saturated {
            // The generator's lateness, not the server's latency: none.
            assert!(quantiles.iter().all(Option::is_none), "{p}");
        } else {
            let q: Vec<f64> = quantiles.into_iter().map(Option::unwrap).collect();
            assert!(0.0 < q[0] && q[0] <= q[1] && q[1] <= q[2], "{p}");
            assert!(q[0] < 1e6, "a p50 over a second: {p}");
        }
    }
    let max = &v["max_krps_at_p99_200us"];
    for system in ["ginza", "linux"] {
        let m = max
            .get(system)
            .unwrap_or_else(|| panic!("no {system}: {v}"));
        assert!(m.is_null() || m.as_f64().is_some_and(|k| k > 0.0), "{v}");
    }
    assert_eq!(v["runs"].as_array().unwrap().len(), 4, "{v}");
    let csv = std::fs::read_to_string(out_dir.join("memcached.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(
        csv.starts_with("system,offered_krps,achieved_krps"),
        "{csv}"
    );
    for png in ["p99.png", "batch.png"] {
        assert!(out_dir.join(png).metadata().unwrap().len() > 0);
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}
