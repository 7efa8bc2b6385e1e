//! `ginza bench batch --json` runs end to end in a short mode: both sides
//! priced (a pthread and a uthread of a standalone runtime, on the CPU
//! asked for), in as many rounds as asked, and the figures it reports are
//! the medians of its rounds. A CPU this process may not use is refused.

mod common;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

#[test]
fn batch_prices_on_both_and_reports_the_medians_of_its_rounds() {
    let cpu = *ginza_sys::affinity::allowed_cpus()
        .unwrap()
        .first()
        .unwrap();
    let out = common::ginza()
        .args([
            "bench",
            "batch",
            "--json",
            "--rounds",
            "3",
            "--duration",
            "100ms",
        ])
        .args(["--cpu", &cpu.to_string()])
        .output()
        .unwrap();
    let (v, stderr) = common::json_report(&out);
    assert_eq!(v["cpu"], cpu, "{v}");
    let rounds = v["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 3, "{v}");
    let side = |name: &str| -> Vec<f64> {
        rounds
            .iter()
            .map(|r| r[name].as_f64().unwrap_or_else(|| panic!("{name}: {v}")))
            .collect()
    };
    let (pthread, ginza) = (side("pthread"), side("ginza"));
    for rate in pthread.iter().chain(&ginza) {
        assert!(*rate > 0.0, "a side did no work: {v}");
    }
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert!(
        close(
            v["pthread_mpaths_per_cpu_s"].as_f64().unwrap(),
            median(pthread.clone())
        ),
        "{v}"
    );
    assert!(
        close(
            v["ginza_mpaths_per_cpu_s"].as_f64().unwrap(),
            median(ginza.clone())
        ),
        "{v}"
    );
    let ratios = ginza.iter().zip(&pthread).map(|(g, p)| g / p).collect();
    assert!(
        close(v["ginza_over_pthread"].as_f64().unwrap(), median(ratios)),
        "{v}"
    );
    assert!(stderr.contains("Ginza / pthread"), "{stderr}");
}

#[test]
fn a_cpu_this_process_may_not_use_is_refused() {
    let out = common::ginza()
        .args([
            "bench",
            "batch",
            "--cpu",
            "4095",
            "--rounds",
            "1",
            "--duration",
            "10ms",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--cpu 4095: not among the CPUs"),
        "{stderr}"
    );
}
