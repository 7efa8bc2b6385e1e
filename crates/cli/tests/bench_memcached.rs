//! `ginza bench memcached --json` runs end to end in a short mode (two
//! light loads, one round): as root, with `ip`, `ethtool` and Debian's
//! `memcached`, both systems answer without error, batch work runs beside
//! Ginza's server (iokerneld grants it cores), and the JSON, CSV and PNGs
//! have the documented shape. No rate is asserted beyond what can be
//! answered: on a loaded CI machine a debug-build server may answer late,
//! and batch work at SCHED_IDLE may get no CPU at all.
//!
//! The third system, the same memcached binary under `ginza run`, gets a
//! run of its own beside the other two (the preload library built for it),
//! and naming it without the library is refused with a message that says
//! how to build it.

mod common;

use std::sync::Mutex;

/// The benches of this file one at a time: each pins its generator and
/// servers to the same two CPUs and busy-polls one.
static ONE_BENCH: Mutex<()> = Mutex::new(());

/// This file's lock, held while a bench runs; `None` (said why) where the
/// bench cannot run here: under two CPUs, or no veth or memcached.
fn bench_may_run() -> Option<std::sync::MutexGuard<'static, ()>> {
    let one = ONE_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    if !common::two_cpus("the generator, iokerneld and the servers") {
        return None;
    }
    if let Some(why) = common::veth_or_memcached_missing() {
        ginza_iokernel::testing::skip(why);
        return None;
    }
    Some(one)
}

/// `ginza bench memcached --json` in its short mode (one round of 1 s per
/// load, 500 keys, 4 connections) with `extra` flags, the command set up
/// by `prepare`: the report, stderr and the output directory.
fn short_bench(
    out_name: &str,
    loads: &str,
    warmup: &str,
    systems: &str,
    extra: &[&str],
    prepare: impl FnOnce(&mut std::process::Command),
) -> (serde_json::Value, String, std::path::PathBuf) {
    let out_dir = common::out_dir(out_name);
    let mut command = common::ginza();
    command
        .args([
            "bench",
            "memcached",
            "--json",
            "--loads",
            loads,
            "--rounds",
            "1",
            "--duration",
            "1s",
            "--warmup",
            warmup,
            "--keys",
            "500",
            "--connections",
            "4",
            "--systems",
            systems,
        ])
        .args(extra)
        .arg("--out")
        .arg(&out_dir);
    prepare(&mut command);
    let out = command.output().unwrap();
    let (v, stderr) = common::json_report(&out);
    common::assert_names_its_build(&v, &stderr);
    (v, stderr, out_dir)
}

#[test]
fn memcached_bench_reports_both_systems_at_each_load() {
    let Some(_one) = bench_may_run() else {
        return;
    };
    let (v, stderr, out_dir) = short_bench(
        "bench-memcached-test",
        "2k,4k",
        "100ms",
        "ginza,linux",
        &[],
        |_| {},
    );
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
        // Work per CPU-second of batch's own threads: present when it did
        // work, and a path costs more than a nanosecond (a figure above
        // 10⁹ would mean its CPU time was read from the wrong threads).
        if batch > 0.0 {
            let per_cpu = p["batch_ops_per_cpu_s"].as_f64();
            assert!(
                per_cpu.is_some_and(|v| v > 0.0 && v < 1e9),
                "{system}: batch {batch} paths/s, per CPU-second {per_cpu:?}: {p}"
            );
        }
        // The server's and iokerneld's CPU, split into user space and
        // the kernel where their threads were ticked at all: the parts
        // make the whole. iokerneld's loop ran all through the round.
        let cpu = &run["cpu_us_per_request"];
        for (whole, must) in [
            ("server: kv-server kthreads", false),
            ("server: memcached, all threads", false),
            ("iokerneld loop", system == "ginza"),
        ] {
            let part = |p: &str| cpu[format!("{whole}: {p}")].as_f64();
            match (
                cpu[whole].as_f64(),
                part("in user space"),
                part("in the kernel"),
            ) {
                (Some(w), Some(u), Some(k)) => {
                    assert!((u + k - w).abs() <= 1e-6 * w.max(1.0), "{whole}: {cpu}")
                }
                _ => assert!(!must, "{whole} not split: {cpu}"),
            }
        }
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
            // Batch is a process of its own: its kthread was found there
            // for its CPU time, and it answered its count of paths (the
            // price it computed was checked by the bench).
            assert_eq!(
                run["cpu_threads"]["batch kthreads"].as_u64(),
                Some(1),
                "{run}"
            );
            assert!(
                p["cpu_us_per_request"]["batch kthreads"].as_f64().is_some(),
                "{p}"
            );
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

/// kv-server on the direct path (its own AF_XDP socket), its tx ring
/// kicked once per burst and, to compare, once per frame: both answer
/// without error beside batch, and their frames crossed their own socket
/// (the bench fails a point otherwise), counted with the kicks.
#[test]
fn memcached_bench_runs_kv_server_on_the_direct_path() {
    let Some(_one) = bench_may_run() else {
        return;
    };
    let (v, stderr, out_dir) = short_bench(
        "bench-memcached-direct-test",
        "2k",
        "200ms",
        "ginza-direct,ginza-direct-kick-per-frame",
        &[],
        |_| {},
    );
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    for (run, system) in runs
        .iter()
        .zip(["ginza-direct", "ginza-direct-kick-per-frame"])
    {
        assert_eq!(run["system"], system, "{run}");
        assert_eq!(run["errors"].as_u64(), Some(0), "{run}");
        let achieved = run["achieved_krps"].as_f64().unwrap();
        assert!(0.0 < achieved && achieved < 2.4, "{run}\n{stderr}");
        assert!(batch_grants(run).is_some_and(|g| g > 0), "{run}");
        let f = &run["direct_frames"];
        let count = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k}: {run}"));
        // Every answered request came in on the own socket and its answer
        // left there.
        let answered = (achieved * 1000.0) as u64;
        assert!(count("own_rx") >= answered, "{run}");
        assert!(count("own_tx") >= answered, "{run}");
        if system == "ginza-direct-kick-per-frame" {
            assert!(count("own_tx_kicks") >= count("own_tx"), "{run}");
        } else {
            assert!(count("own_tx_kicks") <= count("own_tx"), "{run}");
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// `--self-wake true`: kv-server on the direct path answers beside batch
/// with its parked kthread waking itself (docs/direct-path.md, "The
/// self-woken kthread"), and the run's iokerneld summary counts the
/// self-wakes it booked.
#[test]
fn memcached_bench_reports_self_wakes_on_the_direct_path() {
    let Some(_one) = bench_may_run() else {
        return;
    };
    let (v, stderr, out_dir) = short_bench(
        "bench-memcached-self-wake-test",
        "2k",
        "200ms",
        "ginza-direct",
        &["--self-wake", "true"],
        |_| {},
    );
    let run = &v["runs"][0];
    assert_eq!(run["errors"].as_u64(), Some(0), "{run}");
    let achieved = run["achieved_krps"].as_f64().unwrap();
    assert!(0.0 < achieved && achieved < 2.4, "{run}\n{stderr}");
    let self_wakes: u64 = run["iokerneld"]
        .as_str()
        .and_then(|s| s.split("self-wakes: ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no self-wakes counted: {run}"));
    assert!(self_wakes > 0, "{run}");
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// memcached under `ginza run --direct`: it answers without error beside
/// batch, and the counts of its own socket, which it wrote as it exited
/// (`GINZA_NET_STATS`), show every answered request in and out there while
/// iokerneld's NIC saw none of them. The library's cost is measured on the
/// direct path too (the bench fails a direct series whose frames went
/// through iokerneld).
#[test]
fn memcached_under_ginza_run_reports_its_own_sockets_frames() {
    let Some(_one) = bench_may_run() else {
        return;
    };
    let library = common::preload_library();
    let (v, stderr, out_dir) = short_bench(
        "bench-memcached-ginza-direct-test",
        "2k",
        "200ms",
        "memcached-ginza-direct",
        &["--library-rounds", "1", "--library-duration", "300ms"],
        |c| {
            c.env("GINZA_PRELOAD", &library);
        },
    );
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{v}");
    let run = &runs[0];
    assert_eq!(run["system"], "memcached-ginza-direct", "{run}");
    assert_eq!(run["errors"].as_u64(), Some(0), "{run}");
    let achieved = run["achieved_krps"].as_f64().unwrap();
    assert!(0.0 < achieved && achieved < 2.4, "{run}\n{stderr}");
    let f = &run["direct_frames"];
    let count = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k}: {run}"));
    let answered = (achieved * 1000.0) as u64;
    assert!(count("own_rx") >= answered, "{run}");
    assert!(count("own_tx") >= answered, "{run}");
    assert!(
        0 < count("own_tx_kicks") && count("own_tx_kicks") <= count("own_tx"),
        "{run}"
    );
    assert!(count("iokernel_nic_rx") < answered / 10, "{run}");
    // The highest load within the p99 bound names the one system that ran.
    let max = v["max_krps_at_p99_200us"].as_object().unwrap();
    assert_eq!(
        max.keys().collect::<Vec<_>>(),
        ["memcached_ginza_direct"],
        "{v}"
    );
    let cost = &v["library_cost"];
    let rounds = cost["rounds"].as_array().unwrap_or_else(|| panic!("{v}"));
    let direct: Vec<&str> = rounds
        .iter()
        .filter(|r| r["direct"] == true)
        .map(|r| r["server"].as_str().unwrap())
        .collect();
    assert_eq!(
        direct,
        ["native-api", "c-under-ginza-run", "c-epoll-under-ginza-run"],
        "{cost}"
    );
    let d = &cost["direct_path"];
    let (native, c) = (
        d["native_api_p50_us"].as_f64().unwrap(),
        d["c_under_ginza_run_p50_us"].as_f64().unwrap(),
    );
    assert!(0.0 < native && 0.0 < c, "{d}");
    assert!(
        (c - native - d["added_p50_us"].as_f64().unwrap()).abs() < 1e-6,
        "{d}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// The batch application's grants in a run's `iokerneld` summary
/// ("batch: N grants, …").
fn batch_grants(run: &serde_json::Value) -> Option<u64> {
    run["iokerneld"]
        .as_str()?
        .split("batch: ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn memcached_bench_runs_the_same_binary_under_ginza_run() {
    let Some(_one) = bench_may_run() else {
        return;
    };
    let library = common::preload_library();
    let (v, stderr, out_dir) = short_bench(
        "bench-memcached-ginza-run-test",
        "2k",
        "200ms",
        "ginza,linux,memcached-ginza",
        &["--library-rounds", "1", "--library-duration", "300ms"],
        |c| {
            c.env("GINZA_PRELOAD", &library);
        },
    );
    let runs = v["runs"].as_array().unwrap();
    let systems: Vec<&str> = runs.iter().map(|r| r["system"].as_str().unwrap()).collect();
    assert_eq!(systems, ["ginza", "linux", "memcached-ginza"], "{v}");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 3, "{v}");
    for (p, run) in points.iter().zip(runs) {
        let system = run["system"].as_str().unwrap();
        assert_eq!(p["system"], system, "{p}");
        // Every request answered, and rightly: the keys were set, so the
        // gets hit and the sets store (a wrong answer counts as an error).
        let achieved = p["achieved_krps"].as_f64().unwrap();
        assert!(
            1.6 < achieved && achieved < 2.4,
            "{system} at 2 krps answered {achieved} krps: {run}\n{stderr}"
        );
        assert_eq!(run["errors"].as_u64(), Some(0), "{run}");
        assert_eq!(run["timeouts"].as_u64(), Some(0), "{run}");
        let cpu = p["iokerneld_cpu_pct"].as_f64();
        if system == "linux" {
            assert!(cpu.is_none(), "no iokerneld in the Linux system: {p}");
            continue;
        }
        // iokerneld's loop ran over the measured second (it polls the NIC),
        // and no more than the whole of it, with some slack for sampling.
        assert!(cpu.is_some_and(|c| 0.0 < c && c <= 110.0), "{p}");
        assert!(batch_grants(run).is_some_and(|g| g > 0), "{run}");
        if system == "memcached-ginza" {
            let server = run["server"].as_str().unwrap_or_default();
            assert!(server.contains("under ginza run"), "{run}");
            if !p["generator_saturated"].as_bool().unwrap() {
                let p50 = p["p50_us"].as_f64().unwrap();
                let p99 = p["p99_us"].as_f64().unwrap();
                assert!(0.0 < p50 && p50 <= p99 && p99 < 1e6, "{p}");
            }
        }
    }
    let max = &v["max_krps_at_p99_200us"]["memcached_ginza"];
    assert!(
        max.is_null() || max.as_f64().is_some_and(|k| k > 0.0),
        "{v}"
    );
    // The difference of the two Ginza servers' p50 at the one load, when
    // both were measured.
    let both = points
        .iter()
        .filter(|p| p["system"] != "linux")
        .all(|p| p["p50_us"].is_f64());
    let diffs = v["library_and_protocol_us"].as_array().unwrap();
    assert_eq!(diffs.len(), usize::from(both), "{v}");
    if let Some(d) = diffs.first() {
        let added = d["added_p50_us"].as_f64().unwrap();
        let mine = d["memcached_ginza_p50_us"].as_f64().unwrap();
        let kv = d["ginza_kv_server_p50_us"].as_f64().unwrap();
        assert!((mine - kv - added).abs() < 1e-6, "{d}");
    }
    // The library's own cost: an echo through it (blocking and epoll) and
    // on the native API, one round each, all answered.
    let cost = &v["library_cost"];
    assert!(cost.is_object(), "{v}");
    let rounds = cost["rounds"].as_array().unwrap();
    let servers: Vec<&str> = rounds
        .iter()
        .map(|r| r["server"].as_str().unwrap())
        .collect();
    assert_eq!(
        servers,
        ["native-api", "c-under-ginza-run", "c-epoll-under-ginza-run"],
        "{cost}"
    );
    for r in rounds {
        assert!(r["round_trips"].as_u64().is_some_and(|n| n > 0), "{r}");
        let (p50, p99) = (r["p50_us"].as_f64().unwrap(), r["p99_us"].as_f64().unwrap());
        assert!(0.0 < p50 && p50 <= p99 && p99 < 1e6, "{r}");
    }
    let (native, c) = (
        cost["native_api_p50_us"].as_f64().unwrap(),
        cost["c_under_ginza_run_p50_us"].as_f64().unwrap(),
    );
    assert!(
        (c - native - cost["added_p50_us"].as_f64().unwrap()).abs() < 1e-6,
        "{cost}"
    );
    let epoll = cost["c_epoll_under_ginza_run_p50_us"].as_f64().unwrap();
    let added = cost["added_with_epoll_p50_us"].as_f64().unwrap();
    assert!((epoll - native - added).abs() < 1e-6, "{cost}");
    let csv = std::fs::read_to_string(out_dir.join("memcached.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(csv.contains("\nmemcached-ginza,2.000,"), "{csv}");
    assert!(
        csv.lines().next().unwrap().contains("iokerneld_cpu_pct"),
        "{csv}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn naming_memcached_ginza_without_the_library_is_an_error_that_says_how_to_build_it() {
    let out = common::ginza()
        .args([
            "bench",
            "memcached",
            "--systems",
            "memcached-ginza",
            "--loads",
            "1k",
        ])
        .env("GINZA_PRELOAD", "/nonexistent/libginza_preload.so")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("memcached-ginza") && stderr.contains("GINZA_PRELOAD"),
        "{stderr}"
    );
}
