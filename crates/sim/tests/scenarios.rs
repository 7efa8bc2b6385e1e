//! The shipped scenario files parse, and a small one runs end to end.

use std::path::Path;

#[test]
fn shipped_scenarios_parse_and_load_step_runs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    for f in ["load-step.toml", "preemption-costs.toml", "intervals.toml"] {
        ginza_sim::scenario::load(&dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e:#}"));
    }
    let sc = ginza_sim::scenario::load(&dir.join("load-step.toml")).unwrap();
    let out = std::env::temp_dir().join(format!("ginza-sim-test-{}", std::process::id()));
    let summary = ginza_sim::scenario::run(&sc, &out).unwrap();
    assert!(summary.contains("shenango-5us"), "{summary}");
    assert!(out.join("load-step/alloc.csv").exists());
    assert!(out.join("load-step/alloc.png").exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_scenario_is_refused_with_a_reason() {
    let sc: Result<ginza_sim::scenario::Scenario, _> = toml::from_str("name = 'x'\n[requests]\ncores = 2\nservice = 'Bogus(1)'\nloads=[0.5]\nrequests=10\nscheds=[]\n");
    let err = sc.unwrap_err().to_string();
    assert!(err.contains("unknown distribution"), "{err}");
}
