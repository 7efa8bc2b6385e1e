//! `ginza bench oneway --json` runs end to end in a short mode: one-way
//! latencies for rtc, protected and Linux (blocking and busy-polling) from
//! answered 64-byte round
//! trips (every echo is checked by the clients), positive and ordered
//! (p50 ≤ p99), each round recorded, the path of each figure named; and
//! a tiny throughput sweep of http-server in both modes and of its Linux
//! peer (one low load, a
//! loose p99 bound, since a test asserts no latency) whose figures come
//! from answered requests.

mod common;

#[test]
fn oneway_reports_rtc_protected_and_linux() {
    if !common::two_cpus("iokerneld and the applications") {
        return;
    }
    let out = common::ginza()
        .args([
            "bench",
            "oneway",
            "--json",
            "--rounds",
            "2",
            "--duration",
            "100ms",
            "--tput-loads",
            "300",
            "--tput-duration",
            "300ms",
            "--tput-warmup",
            "100ms",
            "--tput-connections",
            "2",
            "--p99-bound",
            "900ms",
        ])
        .output()
        .unwrap();
    let (v, _) = common::json_report(&out);
    for system in ["rtc", "protected", "linux", "linux_busy_poll"] {
        let q = &v["oneway_us"][system];
        let (p50, p99) = (q["p50"].as_f64(), q["p99"].as_f64());
        let (Some(p50), Some(p99)) = (p50, p99) else {
            panic!("oneway_us.{system} lacks p50/p99: {v}");
        };
        assert!(p50 > 0.0 && p50 <= p99, "oneway_us.{system}: {q}");
        assert!(
            v["paths"][system].as_str().is_some_and(|p| !p.is_empty()),
            "the path of {system} is named: {v}"
        );
    }
    let rounds = v["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 2, "{v}");
    for r in rounds {
        for system in ["rtc", "protected", "linux", "linux_busy_poll"] {
            assert!(r[system]["p50"].as_f64().is_some(), "round {r}");
        }
    }
    assert_eq!(v["payload_bytes"], 64);
    // Measured in both modes at the bound asked for.
    assert_eq!(
        v["throughput_p99_bound_us"].as_f64(),
        Some(900_000.0),
        "{v}"
    );
    for mode in ["rtc", "protected", "linux"] {
        let krps = v["throughput_krps"][mode].as_f64();
        assert!(krps.is_some_and(|k| k > 0.0), "throughput_krps.{mode}: {v}");
        let point = v["throughput_points"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["mode"] == mode))
            .unwrap_or_else(|| panic!("no throughput point of {mode}: {v}"));
        assert_eq!(point["within_bound"], true, "{point}");
        assert!(point["p99_us"].as_f64().is_some_and(|p| p > 0.0), "{point}");
    }
    assert!(
        v["paths"]["throughput"]
            .as_str()
            .is_some_and(|p| !p.is_empty()),
        "{v}"
    );
}

/// Asking for more CPUs than the process may use is refused, naming what
/// was asked and what there is, before anything starts.
#[test]
fn more_application_cpus_than_allowed_are_refused_clearly() {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    let out = common::ginza()
        .args(["bench", "oneway", "--no-throughput", "--app-cpus"])
        .arg(allowed.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("needs {} CPUs", allowed + 1))
            && err.contains(&format!("{allowed} for the applications")),
        "{err}"
    );
}
