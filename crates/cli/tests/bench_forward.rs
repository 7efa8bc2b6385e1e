//! `ginza bench forward --json` runs end to end: packets really move
//! between the two applications, and (as root, with `ip` and `ethtool`)
//! both round-trip series come from answered datagrams.

mod common;

#[test]
fn forward_reports_packets_per_second_and_round_trips() {
    if !common::two_cpus("iokerneld and the applications") {
        return;
    }
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
        ])
        .output()
        .unwrap();
    let (v, stderr) = common::json_report(&out);
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
            for side in ["ginza", "linux_blocking", "linux_busy_poll"] {
                let r = &v["rtt_us"][side];
                let (p50, p99) = (r["p50"].as_f64().unwrap(), r["p99"].as_f64().unwrap());
                assert!(0.0 < p50 && p50 <= p99, "{side}: {r}");
                assert!(r["lost"].as_u64().unwrap() < 200, "{side}: {r}");
                let p50s = &v["rtt_us"][format!("{side}_p50s")];
                assert_eq!(p50s.as_array().unwrap().len(), 2, "{side}: {v}");
            }
            assert_eq!(v["rtt_rounds"], 2, "{v}");
            assert!(stderr.contains("p50 ratio ginza/linux"), "{stderr}");
        }
    }
}
