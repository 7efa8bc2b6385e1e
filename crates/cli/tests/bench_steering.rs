//! `ginza bench steering --json` runs end to end in a quick mode: every
//! policy answers, and the JSON has the shape.

mod common;

#[test]
fn steering_reports_every_policy() {
    let out_dir = common::out_dir("bench-steering");
    let out = common::ginza()
        .args([
            "bench",
            "steering",
            "--json",
            "--rounds",
            "1",
            "--flows",
            "200",
            "--rate",
            "10000",
            "--send-ms",
            "120",
            "--phase-ms",
            "20",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .unwrap();
    let (v, _) = common::json_report(&out);
    for policy in ["rss-mod", "flow-affinity", "indirection"] {
        let p = &v["policies"][policy];
        for key in [
            "reordered_pct",
            "steals",
            "steals_per_kpkt",
            "stolen_pct",
            "flows_moved_per_change",
            "flows_seen_moving_per_change",
            "p50_us",
            "p99_us",
            "ns_per_decision",
            "table_bytes",
            "table_evictions",
        ] {
            assert!(p[key].is_number(), "{policy}.{key}: {v}");
        }
        assert!(p["sent"].as_u64().unwrap() > 0, "{v}");
        let pct = p["reordered_pct"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&pct), "{v}");
        assert!(
            p["p50_us"].as_f64().unwrap() <= p["p99_us"].as_f64().unwrap(),
            "{v}"
        );
        assert!(p["ns_per_decision"].as_f64().unwrap() > 0.0, "{v}");
    }
    assert_eq!(v["policies"]["rss-mod"]["table_bytes"], 0);
    // Only flow-affinity keeps a per-flow table that can evict.
    assert_eq!(v["policies"]["rss-mod"]["table_evictions"], 0.0);
    assert_eq!(v["policies"]["indirection"]["table_evictions"], 0.0);
    assert!(
        v["policies"]["indirection"]["table_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(v["runs"].as_array().unwrap().len(), 3);
    // Interleaved: one policy after the other within the round.
    let order: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["rss-mod", "flow-affinity", "indirection"]);
    let csv = std::fs::read_to_string(out_dir.join("steering.csv")).unwrap();
    assert!(csv.starts_with("round,policy,"), "{csv}");
    assert!(
        csv.lines()
            .next()
            .unwrap()
            .contains(",steals,steals_per_kpkt,"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(out_dir.join("moved.png").exists());
    assert!(out_dir.join("p99.png").exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}
