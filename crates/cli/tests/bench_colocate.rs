//! `ginza bench colocate --json` runs end to end in a quick mode: the three
//! configurations at one load, in order, with the JSON shape, a CSV
//! and a PNG. (Figures are not checked here: a debug build on a loaded
//! machine says nothing about them.)

mod common;

#[test]
fn colocate_reports_the_three_configurations() {
    let out_dir = common::out_dir("bench-colocate");
    let out = common::ginza()
        .args([
            "bench",
            "colocate",
            "--json",
            "--loads",
            "0.2",
            "--duration",
            "100ms",
            "--sim-ms",
            "20",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .unwrap();
    let (v, _) = common::json_report(&out);
    let points = v["points"].as_array().unwrap();
    let order: Vec<(&str, &str)> = points
        .iter()
        .map(|p| (p["sched"].as_str().unwrap(), p["alloc"].as_str().unwrap()))
        .collect();
    assert_eq!(
        order,
        [
            ("c-fcfs", "shenango"),
            ("c-pre-sq", "shenango"),
            ("c-pre-sq", "static")
        ]
    );
    for p in points {
        for key in [
            "load",
            "p50_us",
            "p99_us",
            "batch_mpaths_per_s",
            "lc_cores",
            "sim_p99_us",
        ] {
            assert!(p[key].is_number(), "{key}: {v}");
        }
        assert!(p["sent"].as_u64().unwrap() > 0, "{v}");
        // The spinning threads were found: what Linux kept from them is
        // reported (the figures themselves depend on the machine).
        let waited = &p["cpu_waited"];
        for key in ["iokerneld_ms", "workers_ms"] {
            assert!(
                waited[key].as_f64().is_some_and(|ms| ms >= 0.0),
                "{key}: {v}"
            );
        }
        for key in ["iokerneld_preemptions", "workers_preemptions"] {
            assert!(waited[key].is_u64(), "{key}: {v}");
        }
    }
    let csv = std::fs::read_to_string(out_dir.join("colocate.csv")).unwrap();
    assert!(csv.starts_with("sched,alloc,load,"), "{csv}");
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(out_dir.join("colocate.png").exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}
