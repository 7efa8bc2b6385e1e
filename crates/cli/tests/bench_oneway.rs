//! `ginza bench oneway --json` runs end to end in a short mode: one-way
//! latencies for rtc, protected and Linux from answered 64-byte round
//! trips (every echo is checked by the clients), positive and ordered
//! (p50 ≤ p99), each round recorded, the path of each figure named, and
//! the throughput reported as not measured rather than invented.

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
        ])
        .output()
        .unwrap();
    let (v, _) = common::json_report(&out);
    for system in ["rtc", "protected", "linux"] {
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
        for system in ["rtc", "protected", "linux"] {
            assert!(r[system]["p50"].as_f64().is_some(), "round {r}");
        }
    }
    assert_eq!(v["payload_bytes"], 64);
    // Not measured yet: null, and said so.
    for mode in ["rtc", "protected"] {
        assert!(v["throughput_krps"][mode].is_null(), "{v}");
    }
    assert!(
        v["notes"].as_array().is_some_and(|n| n
            .iter()
            .any(|s| s.as_str().is_some_and(|s| s.contains("not_measured")))),
        "{v}"
    );
}
