//! `ginza bench forward --json` runs end to end: packets really move
//! between the two applications, and (as root, with `ip` and `ethtool`)
//! every round-trip series (the direct path's included, its frames counted
//! on its own sockets) comes from answered datagrams.

mod common;

#[test]
fn forward_reports_packets_per_second_and_round_trips() {
    if !common::two_cpus("iokerneld and the applications") {
        return;
    }
    let dump = std::env::temp_dir().join(format!("ginza-rtt-dump-{}.jsonl", std::process::id()));
    let out = common::ginza()
        .args([
            "bench",
            "forward",
            "--json",
            "--windows",
            "2",
            "--window-ms",
            "50",
            "--rtt-rounds",
            "2",
            "--rtt-dump",
            dump.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let (v, stderr) = common::json_report(&out);
    common::assert_names_its_build(&v, &stderr);
    assert!(v["forward_mpps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["copy_floor_mpps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["forward_per_floor"].as_f64().unwrap() > 0.0, "{v}");
    for series in ["forward_windows_mpps", "copy_floor_windows_mpps"] {
        assert_eq!(v[series].as_array().unwrap().len(), 2, "{series}: {v}");
    }
    assert_eq!(v["frame_bytes"], 64);
    match ginza_iokernel::netns::missing_prerequisite() {
        Some(reason) => {
            assert!(v["rtt_us"].is_null(), "{v}");
            assert_eq!(v["rtt_skipped"].as_str(), Some(reason.as_str()));
            ginza_iokernel::testing::skip(format!("round trips over veth: {reason}"));
        }
        None => {
            for side in ["ginza", "ginza_direct", "linux_blocking", "linux_busy_poll"] {
                let r = &v["rtt_us"][side];
                let (p50, p99) = (r["p50"].as_f64().unwrap(), r["p99"].as_f64().unwrap());
                assert!(0.0 < p50 && p50 <= p99, "{side}: {r}");
                assert!(r["lost"].as_u64().unwrap() < 200, "{side}: {r}");
                assert!(p99 <= r["p999"].as_f64().unwrap(), "{side}: {r}");
                assert!(r["over_1ms"].as_u64().is_some(), "{side}: {r}");
                let p50s = &v["rtt_us"][format!("{side}_p50s")];
                assert_eq!(p50s.as_array().unwrap().len(), 2, "{side}: {v}");
            }
            // The dump: the stamps' rate, then per round and server an
            // anchor and every measured round trip.
            let text = std::fs::read_to_string(&dump).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert!(lines[0]["ticks_per_us"].as_f64().unwrap() > 0.0);
            for side in [
                "ginza",
                "ginza_spin",
                "ginza_direct",
                "linux_blocking",
                "linux_busy_poll",
            ] {
                let trips = lines.iter().filter(|l| l["server"] == side).count();
                assert_eq!(trips, 2 * 2000, "{side}");
            }
            let ginza_sent = lines
                .iter()
                .filter(|l| l["server"] == "ginza")
                .filter(|l| l["stamps"][0].as_u64().unwrap() > 0)
                .count();
            assert_eq!(ginza_sent, 2 * 2000, "every trip stamps its send");
            // The direct path's figures came from its own sockets: every
            // measured request and reply (and the warm-up's) crossed them.
            let frames = &v["rtt_us"]["ginza_direct_frames"];
            for count in ["own_rx", "own_tx"] {
                assert!(
                    frames[count].as_u64().unwrap() >= 2 * 2000,
                    "{count}: {frames}"
                );
            }
            assert!(stderr.contains("ginza direct path"), "{stderr}");
            assert_eq!(v["rtt_rounds"], 2, "{v}");
            assert!(stderr.contains("p50 ratio ginza/linux"), "{stderr}");
        }
    }
    let _ = std::fs::remove_file(&dump);
}
