//! What the `ginza` end-to-end tests share: an iokerneld to talk to
//! ([`daemon`]), skipping where a test cannot run
//! (`ginza_iokernel::testing::skip`: under `CI=true` as root a skip fails
//! instead), running the `ginza` binary Cargo built for this test, and
//! reading its JSON report.
#![allow(dead_code)] // each test binary uses a part

pub mod daemon;

use std::path::PathBuf;
use std::process::{Command, Output};

/// `ginza`, as built for this test by Cargo.
pub fn ginza() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ginza"))
}

/// Whether this process may use two CPUs (iokerneld spins on one); if not,
/// skips, saying that `who` needs them.
pub fn two_cpus(who: &str) -> bool {
    let cpus = ginza_sys::affinity::allowed_cpus().unwrap();
    if cpus.len() < 2 {
        ginza_iokernel::testing::skip(format!("{who} need two CPUs, this process has {cpus:?}"));
        return false;
    }
    true
}

/// Why a bench over a veth pair against Debian's memcached cannot run
/// here (no root, no `ip`/`ethtool`, no `memcached`), if it cannot.
pub fn veth_or_memcached_missing() -> Option<String> {
    if let Some(why) = ginza_iokernel::netns::missing_prerequisite() {
        return Some(format!("the veth pair: {why}"));
    }
    if Command::new("memcached").arg("-V").output().is_err() {
        return Some("Debian's memcached is not installed (package memcached)".into());
    }
    None
}

/// The report of a `ginza … --json` run that must have succeeded: its
/// stdout as one JSON value, and its stderr (for messages and checks).
pub fn json_report(out: &Output) -> (serde_json::Value, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "ginza failed: {stderr}");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON object on stdout ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (v, stderr)
}

/// Checks that a bench's report names the build that made it, in its JSON
/// and in its text: figures of a debug or a profile-guided build are not
/// those of the plain release build.
pub fn assert_names_its_build(v: &serde_json::Value, stderr: &str) {
    let build = v["build"]
        .as_str()
        .unwrap_or_else(|| panic!("no build in the report: {v}"));
    if cfg!(debug_assertions) {
        assert_eq!(build, "debug");
    } else {
        assert!(build.starts_with("release"), "{build}");
    }
    assert!(stderr.contains(&format!("build: {build}")), "{stderr}");
}

/// A directory for a test's output files, `ginza-NAME-PID` in the temp
/// directory (test binaries run in parallel).
pub fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ginza-{name}-{}", std::process::id()))
}

/// The preload library of this test's profile, built with `$CARGO build -p
/// ginza-preload` into this test's target directory (once per process);
/// panics with Cargo's output when the build fails.
pub fn preload_library() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // `ginza` lies in <target>/<profile>/, where the library goes.
            let ginza = PathBuf::from(env!("CARGO_BIN_EXE_ginza"));
            let profile_dir = ginza.parent().unwrap().to_path_buf();
            let target = profile_dir.parent().unwrap();
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "ginza-preload", "--target-dir"])
                .arg(target)
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if cfg!(not(debug_assertions)) {
                cmd.arg("--release");
            }
            let out = cmd.output().expect("running cargo");
            assert!(
                out.status.success(),
                "cargo build -p ginza-preload failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let library = profile_dir.join("libginza_preload.so");
            assert!(library.is_file(), "the build left no {}", library.display());
            library
        })
        .clone()
}
