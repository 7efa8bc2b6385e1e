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

/// A directory for a test's output files, `ginza-NAME-PID` in the temp
/// directory (test binaries run in parallel).
pub fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ginza-{name}-{}", std::process::id()))
}
