//! `ginza demo` end to end: iokerneld, its traffic generator, the UDP
//! spin-server and the batch application really run (one short point per
//! policy, two service distributions), and the CSV and PNG come out with
//! sane numbers.

use std::path::PathBuf;
use std::process::Command;

/// CPUs this process may use (from /proc: the test needs no libc call).
fn allowed_cpus() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| {
                    v.trim()
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|p| match p.split_once('-') {
                            Some((a, b)) => {
                                let a: usize = a.parse().unwrap_or(0);
                                let b: usize = b.parse().unwrap_or(a);
                                b - a + 1
                            }
                            None => 1,
                        })
                        .sum()
                })
        })
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The tests that run a demo hold this: each busy-polls iokerneld's CPU
/// and uses the managed one, so two at once would measure each other.
static ONE_DEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_demo() -> std::sync::MutexGuard<'static, ()> {
    ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh output directory per test (tests run in parallel).
fn out_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ginza-demo-test-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn demo_runs_two_policies_and_writes_csv_and_png() {
    let _one = one_demo();
    if allowed_cpus() < 2 {
        ginza_iokernel::testing::skip("ginza demo needs 2 CPUs (iokerneld's and a managed one)");
        return;
    }
    let out = out_dir("run");
    let run = Command::new(env!("CARGO_BIN_EXE_ginza"))
        // A light load: the test runs the debug build, several times slower
        // per request than the release build.
        .args(["demo", "--points", "0.1", "--duration", "200ms"])
        .args([
            "--warmup",
            "50ms",
            "--policies",
            "shenango,static",
            "--services",
            "exponential,bimodal",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("run ginza demo");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "ginza demo failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        run.status
    );
    assert!(
        stdout.contains("shenango") && stdout.contains("static"),
        "{stdout}"
    );

    let csv = std::fs::read_to_string(out.join("demo.csv")).expect("demo.csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    for col in [
        "service",
        "policy",
        "offered_load",
        "achieved_load",
        "p50_us",
        "p99_us",
        "p999_us",
        "batch_mpaths_per_s",
        "batch_alone_mpaths_per_s",
        "batch_share_of_spare",
        "p50_vs_static",
        "lc_cores",
        "batch_cores",
        "reallocations_per_s",
        "lc_requests_sent",
        "lc_requests_answered",
        "foreign_cpu_pct",
        "steal_pct",
        "quiet",
    ] {
        assert!(header.contains(&col), "no column {col} in {header:?}");
    }
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    let num = |r: &[&str], name: &str| -> f64 {
        r[col(name)]
            .parse()
            .unwrap_or_else(|_| panic!("{name} = {:?} is not a number in {csv}", r[col(name)]))
    };
    for r in &rows {
        let (p50, p99, p999) = (num(r, "p50_us"), num(r, "p99_us"), num(r, "p999_us"));
        assert!(
            p50 > 0.0 && p50 <= p99 && p99 <= p999,
            "percentiles {p50} {p99} {p999}: {csv}"
        );
        let (sent, answered) = (num(r, "lc_requests_sent"), num(r, "lc_requests_answered"));
        // 0.1 of a core at 10 µs per request for 200 ms: about 2000.
        assert!(sent > 1000.0, "{csv}");
        if r[col("quiet")] == "no" {
            // Another process took the managed CPU: the demo marks the
            // point as no result, and requests may go unanswered.
            eprintln!("a point was not quiet; not judging its answers: {csv}");
        } else {
            assert!(answered > 0.8 * sent, "most requests answered: {csv}");
            assert!(num(r, "achieved_load") > 0.03, "{csv}");
        }
        assert_eq!(num(r, "offered_load"), 0.1);
        // Measured, whatever the machine's load (only reported, never a
        // failure: a loaded machine is what it warns about).
        assert!(["yes", "no"].contains(&r[col("quiet")]), "{csv}");
        assert!(num(r, "foreign_cpu_pct") >= 0.0, "{csv}");
    }
    assert!(rows.iter().any(|r| r[col("service")] == "bimodal"), "{csv}");
    let shenango = rows
        .iter()
        .find(|r| r[col("policy")] == "shenango")
        .expect("a shenango row");
    if shenango[col("quiet")] == "yes" {
        // On a loaded machine batch may get nothing: judged only when quiet.
        assert!(num(shenango, "batch_mpaths_per_s") > 0.0, "{csv}");
    }
    let stat = rows
        .iter()
        .find(|r| r[col("policy")] == "static")
        .expect("a static row");
    assert!(
        num(stat, "lc_cores") > 0.9,
        "static lc holds its cores: {csv}"
    );
    // Each row against static's at its service and load: static's own is 1.
    for r in &rows {
        let twin = rows
            .iter()
            .find(|s| {
                s[col("policy")] == "static"
                    && s[col("service")] == r[col("service")]
                    && s[col("offered_load")] == r[col("offered_load")]
            })
            .expect("a static row per service");
        let want = num(r, "p50_us") / num(twin, "p50_us");
        assert!(
            (num(r, "p50_vs_static") - want).abs() < 0.01,
            "p50_vs_static of {r:?}: {csv}"
        );
    }
    // Batch alone on the core is measured at every point, under every
    // policy (lc has stopped by then); SCHED_IDLE batch may get nothing
    // beside another process, so judged only where the point was quiet.
    for r in rows.iter().filter(|r| r[col("quiet")] == "yes") {
        assert!(num(r, "batch_alone_mpaths_per_s") > 0.0, "{csv}");
    }
    if shenango[col("quiet")] == "yes" {
        assert!(num(shenango, "batch_share_of_spare") > 0.0, "{csv}");
    }

    let png = std::fs::read(out.join("demo.png")).expect("demo.png");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "demo.png is not a PNG"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Local wakes are the demo's default (its applications run in iokerneld's
/// process, where they apply): batch's kthread wakes lc on the core; with
/// `--local-wake 0` iokerneld writes every wake itself.
#[test]
fn demo_wakes_lc_from_its_core_by_default() {
    let _one = one_demo();
    if allowed_cpus() < 2 {
        ginza_iokernel::testing::skip("ginza demo needs 2 CPUs (iokerneld's and a managed one)");
        return;
    }
    let demo = |extra: &[&str]| -> serde_json::Value {
        let out = out_dir("local-wake");
        let run = Command::new(env!("CARGO_BIN_EXE_ginza"))
            .args(["demo", "--json", "--points", "0.1", "--duration", "200ms"])
            .args(["--warmup", "50ms", "--policies", "shenango"])
            .args(["--services", "constant", "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .expect("run ginza demo");
        assert!(
            run.status.success(),
            "ginza demo failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let _ = std::fs::remove_dir_all(&out);
        serde_json::from_slice(&run.stdout).expect("the demo's JSON")
    };
    let on = demo(&[]);
    assert_eq!(on["local_wake_us"], 5.0, "{on}");
    let row = &on["rows"][0];
    if row["quiet"] == "yes" {
        // SCHED_IDLE batch runs only on a quiet core, and only it answers.
        assert!(row["local_wakes_per_s"].as_f64().unwrap() > 0.0, "{on}");
    }
    let off = demo(&["--local-wake", "0"]);
    assert!(off["local_wake_us"].is_null(), "{off}");
    assert_eq!(off["rows"][0]["local_wakes_per_s"], 0.0, "{off}");
}

#[test]
fn demo_refuses_bad_arguments_with_a_message() {
    let out = out_dir("bad");
    let run = Command::new(env!("CARGO_BIN_EXE_ginza"))
        .args(["demo", "--points", "0.3", "--policies", "fastest", "--out"])
        .arg(&out)
        .output()
        .expect("run ginza demo");
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("unknown policy \"fastest\""), "{stderr}");
    assert!(
        !out.exists(),
        "nothing is written for a refused command line"
    );
}

#[test]
fn demo_says_why_when_iokerneld_has_nowhere_to_put_its_socket() {
    if allowed_cpus() < 2 {
        ginza_iokernel::testing::skip("ginza demo needs 2 CPUs (iokerneld's and a managed one)");
        return;
    }
    let out = out_dir("nosock");
    let run = Command::new(env!("CARGO_BIN_EXE_ginza"))
        .args(["demo", "--points", "0.3", "--duration", "50ms", "--out"])
        .arg(&out)
        // The sockets live under the temp dir: make it a path that cannot exist.
        .env("TMPDIR", "/proc/self/status/no-such-dir")
        .output()
        .expect("run ginza demo");
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("socket directory"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A process that spins until killed (dropped), pinned to `cpu`.
struct Hog(std::process::Child);

impl Hog {
    fn on(cpu: usize) -> Hog {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("start sh");
        let hog = Hog(child);
        ginza_sys::affinity::pin_thread(hog.0.id() as i32, cpu).expect("pin the hog");
        hog
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue #17's "Also": with another process spinning on the managed core,
/// the demo must not print a latency table that looks like a result — the
/// point is marked not quiet (JSON, table and a warning) with the foreign
/// CPU time it measured. Also: the point's phase breakdown is there.
#[test]
fn demo_marks_a_point_not_quiet_when_another_process_spins_on_its_core() {
    let _one = one_demo();
    let cpus = ginza_sys::affinity::allowed_cpus().unwrap();
    if cpus.len() < 2 {
        ginza_iokernel::testing::skip("ginza demo needs 2 CPUs (iokerneld's and a managed one)");
        return;
    }
    let out = out_dir("hog");
    // The demo's default: iokerneld on the first allowed CPU, the next managed.
    let _hog = Hog::on(cpus[1]);
    let run = Command::new(env!("CARGO_BIN_EXE_ginza"))
        .args(["demo", "--json", "--points", "0.1", "--duration", "200ms"])
        .args(["--warmup", "50ms", "--policies", "static", "--services"])
        .args([
            "constant",
            "--cores",
            &cpus[1].to_string(),
            "--iokernel-core",
        ])
        .arg(cpus[0].to_string())
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run ginza demo");
    let stderr = String::from_utf8_lossy(&run.stderr);
    if !run.status.success() {
        // Starved outright (the load run could not finish beside the hog
        // on a loaded machine): the error must say why.
        assert!(stderr.contains("NOT QUIET"), "{stderr}");
        let _ = std::fs::remove_dir_all(&out);
        return;
    }
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).expect("one JSON object");
    let row = &v["rows"][0];
    assert_eq!(row["quiet"], "no", "{row}\n{stderr}");
    assert!(row["foreign_cpu_pct"].as_f64().unwrap() > 10.0, "{row}");
    assert!(stderr.contains("NOT QUIET"), "{stderr}");
    assert!(stderr.contains("WARNING: 1 of 1 points"), "{stderr}");
    // The breakdown covers the traced requests, each with its way in.
    let phases = &row["phases"];
    let traced = phases["requests"].as_u64().unwrap();
    assert!(traced > 0, "{phases}");
    assert_eq!(
        phases["inject_to_picked"]["n"].as_u64(),
        Some(traced),
        "{phases}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
