//! Experiments as files (docs/experiments.md): every file in
//! `bench/experiments/` parses and runs a tiny version through `ginza bench
//! run --tiny` (or is refused with the reason when nothing in it exists on
//! this branch yet); a malformed file is refused with its line and key; the
//! CSV columns are stable.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;

/// The runs that start iokerneld spin on a CPU: one at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// The CSV header, pinned: add new columns at the end, never reorder.
const COLUMNS: &str = "experiment,system,kind,round,offered,unit,achieved,p50_us,p99_us,\
p999_us,p99_class0_us,p99_class1_us,batch_ops_per_s,lc_cores,batch_cores,efficiency,\
reallocations_per_s,flows_moved,reordered_pct,sent,answered,t_ms,note";

fn experiments() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/experiments");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

fn ginza(args: &[&str], files: &[&Path]) -> Output {
    common::ginza()
        .args(args)
        .args(files)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn out_dir(tag: &str) -> PathBuf {
    common::out_dir(&format!("experiments-{tag}"))
}

#[test]
fn every_experiment_file_runs_tiny() {
    if !common::two_cpus("the Ginza experiments") {
        return;
    }
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let files = experiments();
    assert!(files.len() >= 10, "{files:?}");
    let out = out_dir("tiny");
    let mut ran = 0;
    for file in &files {
        let o = ginza(
            &[
                "bench",
                "run",
                "--tiny",
                "--json",
                "--out",
                out.to_str().unwrap(),
            ],
            &[file],
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() && needs_veth(file) {
            // Its points run over a veth pair (root) against Debian's
            // memcached: without them, skipped like the other veth tests.
            if let Some(why) = common::veth_or_memcached_missing() {
                ginza_iokernel::testing::skip(format!("{}: {why}", file.display()));
                continue;
            }
            panic!("{}: {stderr}", file.display());
        }
        if !o.status.success() {
            // Only a refusal for parts other branches are building is
            // acceptable, and it must say so.
            assert!(
                stderr.contains("nothing in this experiment can run on this branch yet")
                    && stderr.contains("not"),
                "{}: {stderr}",
                file.display()
            );
            continue;
        }
        ran += 1;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{}: {e}: {stderr}", file.display()));
        let rows = v["rows"].as_array().unwrap();
        let systems = v["systems"].as_array().unwrap().len();
        // Load steps give a row per 10 ms sample; a sweep one per load point.
        let steps = rows.iter().any(|r| r["t_ms"].is_f64());
        if steps {
            assert!(rows.len() >= 2 * systems, "{}: samples", file.display());
        } else {
            // Two load points (or the file's one) per system.
            let points = v["offered"].as_array().unwrap().len();
            assert!((1..=2).contains(&points), "{}", file.display());
            assert_eq!(
                rows.len(),
                points * systems,
                "{}: a row per point and system",
                file.display()
            );
        }
        for r in rows {
            // A memcached point whose generator fell behind has no latency
            // (bench memcached withholds it) but its achieved rate.
            let any = ["p99_us", "efficiency", "p999_us", "lc_cores", "achieved"]
                .iter()
                .any(|k| r[k].as_f64().is_some_and(|x| x.is_finite() && x >= 0.0));
            assert!(any, "{}: a row without a figure: {r}", file.display());
        }
        assert!(!v["reproduces"].as_str().unwrap().is_empty());
        let csv = std::fs::read_to_string(v["csv"].as_str().unwrap()).unwrap();
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some(COLUMNS), "{}", file.display());
        assert_eq!(lines.count(), rows.len());
        for png in v["png"].as_array().unwrap() {
            let meta = std::fs::metadata(png.as_str().unwrap()).unwrap();
            assert!(meta.len() > 1000, "{png}");
        }
    }
    assert!(ran >= 8, "only {ran} experiment files ran");
    let _ = std::fs::remove_dir_all(out);
}

/// The files whose points need root, a veth pair and Debian's memcached.
fn needs_veth(file: &Path) -> bool {
    file.file_stem()
        .is_some_and(|s| s == "shenango-fig3-memcached" || s == "dlibos-fig7")
}

#[test]
fn list_shows_every_file_with_its_figure() {
    let o = ginza(&["bench", "list"], &[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in experiments() {
        let name = f.file_stem().unwrap().to_str().unwrap();
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing from {stdout}"));
        assert!(line.contains("Fig"), "{line}");
    }
}

/// Writes `text` to a temp file and runs it; returns the error output.
fn refused(tag: &str, text: &str) -> String {
    let dir = out_dir(tag);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(&file, text).unwrap();
    let o = ginza(
        &["bench", "run", "--tiny", "--out", dir.to_str().unwrap()],
        &[&file],
    );
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{tag}: accepted: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("bad.toml:"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
    stderr
}

const GOOD: &str = r#"[experiment]
name = "bad"
reproduces = "nothing"

[[app]]
name = "lc"
program = "spin-server"

[system]
label = "ginza"
kind = "ginza"
allocator = "shenango"

[load]
generator = "builtin"
service = { exponential = { mean = "10us" } }
offered = [0.1]
duration = "20ms"
"#;

#[test]
fn a_malformed_file_is_refused_with_its_line_and_key() {
    // An unknown key on line 12.
    let e = refused("unknown", &GOOD.replace("allocator = ", "alocator = "));
    assert!(e.contains("bad.toml:12:") && e.contains("alocator"), "{e}");
    // A value that is not one of the choices.
    let e = refused("variant", &GOOD.replace("\"shenango\"", "\"fastest\""));
    assert!(
        e.contains("bad.toml:12:") && e.contains("key `allocator`") && e.contains("fastest"),
        "{e}"
    );
    // A duration without a unit it knows, on line 18.
    let e = refused("duration", &GOOD.replace("\"20ms\"", "\"20 parsecs\""));
    assert!(
        e.contains("bad.toml:18:") && e.contains("key `duration`") && e.contains("parsecs"),
        "{e}"
    );
    // A load that is not positive (line 17), a missing table.
    let e = refused("load", &GOOD.replace("[0.1]", "[0.1, -2]"));
    assert!(
        e.contains("bad.toml:17:") && e.contains("key `offered`"),
        "{e}"
    );
    let e = refused("missing", &GOOD.replace("[load]", "[lode]"));
    assert!(e.contains("lode"), "{e}");
    // Parsed, but asks for what cannot be: a Ginza spin-server without an
    // allocator is reported at its system's label (line 10).
    let e = refused("semantic", &GOOD.replace("allocator = \"shenango\"\n", ""));
    assert!(
        e.contains("bad.toml:10:") && e.contains("key `allocator`"),
        "{e}"
    );
    // A system's mode that is not one (line 12).
    let e = refused(
        "mode",
        &GOOD.replace(
            "kind = \"ginza\"\n",
            "kind = \"ginza\"\nmode = \"protekted\"\n",
        ),
    );
    assert!(
        e.contains("bad.toml:12:") && e.contains("key `mode`") && e.contains("protekted"),
        "{e}"
    );
    // Ping-pong measures 64-byte messages only: the `offered` line (17).
    let ping_pong = GOOD
        .replace("\"spin-server\"", "\"echo\"")
        .replace("allocator = \"shenango\"\n", "")
        .replace(
            "generator = \"builtin\"",
            "generator = \"ping-pong\"\nunit = \"bytes\"",
        )
        .replace("[0.1]", "[128]");
    let e = refused("ping-pong", &ping_pong);
    assert!(
        e.contains("bad.toml:17:") && e.contains("key `offered`") && e.contains("64-byte"),
        "{e}"
    );
    // A Linux spin peer has no allocator (reported at its label, line 10).
    let e = refused(
        "linux-allocator",
        &GOOD.replace("kind = \"ginza\"", "kind = \"linux\""),
    );
    assert!(
        e.contains("bad.toml:10:") && e.contains("key `kind`"),
        "{e}"
    );
}
