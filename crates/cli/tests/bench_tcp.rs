//! `ginza bench tcp --json` runs end to end in a short mode: Ginza ⇄
//! Ginza round trips through the switch always, and (as root, with `ip`
//! and `ethtool`) the veth figures (the direct path's too) from answered
//! round trips, streams whose receipts matched, and an intact transfer
//! through 5 % loss, and the runtime's hops of a round trip stamped.

mod common;

#[test]
fn tcp_reports_round_trips_streams_and_a_lossy_transfer() {
    if !common::two_cpus("iokerneld and the applications") {
        return;
    }
    let out = common::ginza()
        .args([
            "bench",
            "tcp",
            "--json",
            "--rounds",
            "1",
            "--duration",
            "100ms",
            "--stream-mb",
            "2",
            "--lossy-mb",
            "1",
        ])
        .output()
        .unwrap();
    let (v, stderr) = common::json_report(&out);
    common::assert_names_its_build(&v, &stderr);
    let positive_quantiles = |q: &serde_json::Value, what: &str| {
        let (p50, p99) = (q["p50"].as_f64().unwrap(), q["p99"].as_f64().unwrap());
        assert!(0.0 < p50 && p50 <= p99, "{what}: {q}");
    };
    positive_quantiles(&v["switch_rtt_us"], "switch_rtt_us");
    assert_eq!(v["rounds"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["payload_bytes"], 64);
    match ginza_iokernel::netns::missing_prerequisite() {
        Some(reason) => {
            assert!(v["rtt_us"].is_null() && v["lossy"].is_null(), "{v}");
            assert_eq!(v["veth_skipped"].as_str(), Some(reason.as_str()));
            ginza_iokernel::testing::skip(format!("the veth figures: {reason}"));
        }
        None => {
            for side in ["ginza", "ginza_direct", "linux", "linux_busy_poll"] {
                positive_quantiles(&v["rtt_us"][side], side);
            }
            for side in ["ginza", "ginza_direct", "linux"] {
                assert!(v["stream_mbps"][side].as_f64().unwrap() > 0.0, "{v}");
            }
            // The direct path's round trips crossed its own socket (the
            // bench fails the round otherwise): its frames are counted.
            let frames = &v["rounds"][0]["ginza_direct_frames"];
            assert!(frames["own_rx"].as_u64().unwrap() > 0, "{frames}");
            assert!(frames["own_tx"].as_u64().unwrap() > 0, "{frames}");
            // Where a request's time goes inside the runtime: every hop
            // from the frame's pick-up to the reply was stamped.
            for side in ["ginza", "ginza_direct"] {
                let hops = v["phases"][side]["all"].as_array().unwrap();
                for hop in [
                    "picked",
                    "frame_processed",
                    "settled",
                    "waiter_runs",
                    "app_read",
                    "replied",
                ] {
                    let seen = hops.iter().find(|h| h["hop"] == hop);
                    assert!(
                        seen.is_some_and(|h| h["trips"].as_u64().unwrap() > 0),
                        "{side}: hop {hop} never stamped: {hops:?}"
                    );
                }
            }
            let lossy = &v["lossy"];
            assert_eq!(lossy["loss_pct"], 5, "{v}");
            assert_eq!(lossy["bytes"], 1 << 20, "{v}");
            assert_eq!(lossy["intact"], true, "{v}");
            assert!(lossy["seconds"].as_f64().unwrap() > 0.0, "{v}");
            assert!(lossy["frames_dropped"].as_u64().unwrap() > 0, "{v}");
            assert!(stderr.contains("busy-polling"), "{stderr}");
        }
    }
}
