//! `ginza bench soak` for 30 s, as CI runs it: the aims (no lost write, no
//! wrong answer, no crash, memory and descriptors flat) asserted on its
//! JSON, and every kind of fault seen to happen.
//!
//! Heavy (iokerneld, a veth pair, busy clients): run it alone, e.g.
//! `flock /tmp/ginza-heavy.lock cargo test -p ginza-bench --test soak`.
//! The soak's children are this binary again (`soak-role …`), so it has
//! its own `main` rather than libtest's.

use std::time::Duration;

use ginza_bench::soak::{role_main, soak, Launcher, SoakConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("soak-role") {
        if let Err(e) = role_main(args) {
            eprintln!("soak-role: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .try_init();
    if std::env::args().any(|a| a == "--list") {
        println!("soak_30s: test");
        return;
    }
    soak_30s();
    println!("test soak_30s ... ok");
}

fn soak_30s() {
    if let Some(reason) = ginza_iokernel::netns::missing_prerequisite() {
        ginza_iokernel::testing::skip(reason);
        return;
    }
    let keys = 600;
    let cfg = SoakConfig {
        duration: Duration::from_secs(30),
        seed: 35,
        load_rps: 400.0,
        verify_rps: 600.0,
        keys,
        connections: 3,
        reset_every: Duration::from_millis(300),
        min_residency: None,
    };
    let launcher = Launcher::current_exe().expect("the test binary");
    let report = soak(&cfg, &launcher).expect("the soak runs");
    let json = serde_json::to_string_pretty(&report).expect("the report serializes");
    println!("{json}");
    // Every aim, kv-protected's exit after each netstack kill included
    // (docs/soak.md, "Findings": the one-core thrash that kept it from
    // running is fixed).
    let missed = report.missed_aims();
    assert!(missed.is_empty(), "missed aims: {missed:?}\n{json}");
    assert_eq!(report.protected_hangs_after_netstack_kill, 0, "{json}");
    // It did what it says: load, every kind of fault, every key read back.
    // kv-rtc shares the one managed core with kv-victim, kv-protected, the
    // netstack and batch. With the allocator's minimum residency
    // (docs/soak.md, "Findings") loadgen completed 10.7–11.5 k of the 12 k
    // requests it offers and the verifier 13–18 k in runs on a busy 2-CPU
    // machine (docs/results.md, "Session 18: the one-core thrash"); the
    // floors leave room for a slower CI machine.
    assert!(report.requests_verified > 9000, "{json}");
    assert!(report.requests_loadgen > 8000, "{json}");
    assert_eq!(report.verifier.final_keys_read, 3 * keys, "{json}");
    for kind in [
        "frames_dropped",
        "frames_duplicated",
        "frames_reordered",
        "frames_corrupted",
        "frame_fault_storms",
        "sigkill_batch",
        "sigkill_kv_victim",
        "sigkill_netstack",
        "mid_request_resets",
    ] {
        let n = report.faults_injected.get(kind).copied().unwrap_or(0);
        assert!(n > 0, "no {kind} injected: {json}");
    }
    assert_eq!(report.windows.len(), 10, "{json}");
    for name in ["kv-rtc", "soak (iokerneld, clients)"] {
        assert!(
            report.rss_growth_mib.get(name).is_some_and(Option::is_some),
            "no memory growth for {name}: {json}"
        );
    }
}
