//! `ginza bench threadops --json` runs end to end in a short mode, with the C
//! columns: `bench/c/threadops.c` compiled with the system `cc` and run
//! alone (`c_glibc`) and under `ginza run` (`c_ginza`), beside native Ginza,
//! in two interleaved rounds; the comparison of the library with the native
//! API (`c_library`) is filled in. Without `cc` the C columns must be null and
//! the test says it skipped them, except under `CI=true` as root, where `cc`
//! is installed and its absence fails.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

const OPS: [&str; 4] = ["spawn_join", "yield_pingpong", "condvar_pingpong", "mutex"];

#[test]
fn threadops_has_the_c_columns() {
    let have_cc = Command::new("cc")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if have_cc {
        build_preload_library();
    }
    let out = common::ginza()
        .args([
            "bench",
            "threadops",
            "--json",
            "--iters",
            "50",
            "--samples",
            "3",
            "--rounds",
            "2",
            // Go takes a `go build`; Tokio adds nothing to what is checked here.
            "--skip",
            "go,tokio",
        ])
        .output()
        .unwrap();
    let (v, stderr) = common::json_report(&out);
    let c_columns = ["c_glibc", "c_ginza"];
    for op in OPS {
        let row = &v["ops"][op];
        for system in ["ginza", "pthread", "go", "tokio"]
            .into_iter()
            .chain(c_columns)
        {
            assert!(row.get(system).is_some(), "ops.{op} lacks {system}: {v}");
        }
        for system in ["ginza", "pthread"] {
            assert!(
                row[system].as_f64().is_some_and(|ns| ns > 0.0),
                "ops.{op}.{system}: {v}"
            );
        }
    }
    assert_eq!(v["meta"]["rounds"], 2, "{v}");
    assert_eq!(v["rounds"].as_array().map(Vec::len), Some(2), "{v}");
    // The table (on stderr with --json) has the two columns.
    assert!(
        stderr.contains("c-glibc") && stderr.contains("c-ginza"),
        "{stderr}"
    );

    if !have_cc {
        assert!(stderr.contains("cc not found"), "{stderr}");
        for op in OPS {
            for system in c_columns {
                assert!(v["ops"][op][system].is_null(), "ops.{op}.{system}: {v}");
            }
        }
        ginza_iokernel::testing::skip(
            "the C columns of bench threadops need the system C compiler `cc` (Debian: gcc)",
        );
        return;
    }
    for op in OPS {
        for system in c_columns {
            let ns = v["ops"][op][system].as_f64();
            assert!(
                ns.is_some_and(|ns| ns > 0.0),
                "ops.{op}.{system} is not a time: {v}\n{stderr}"
            );
        }
        let versus = &v["c_library"][op];
        for figure in [
            "c_ginza_minus_ginza_ns",
            "c_ginza_over_ginza",
            "c_ginza_over_c_glibc",
        ] {
            assert!(
                versus[figure].as_f64().is_some(),
                "c_library.{op}.{figure}: {v}"
            );
        }
    }
    // A debug build decides nothing about the aim; that it is decided is the check.
    assert!(v["c_library"]["aim_met"].is_boolean(), "{v}");
    for round in v["rounds"].as_array().unwrap() {
        for system in c_columns {
            assert!(
                round[system]["condvar_pingpong"].as_f64().is_some(),
                "round {round}"
            );
        }
    }
}

/// `ginza run` looks for `libginza_preload.so` next to `ginza`; Cargo builds
/// the binary for this test but not the library, so build it (same profile,
/// same target directory).
fn build_preload_library() {
    let ginza = Path::new(env!("CARGO_BIN_EXE_ginza"));
    let profile_dir = ginza.parent().expect("ginza has a directory");
    let target = profile_dir
        .parent()
        .expect("a profile directory has a parent");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "ginza-preload", "--target-dir"])
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null());
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("running cargo");
    assert!(
        out.status.success(),
        "`cargo build -p ginza-preload` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        profile_dir.join("libginza_preload.so").is_file(),
        "no libginza_preload.so next to {}",
        ginza.display()
    );
}
