//! Skipping a test that cannot run on this host, visibly.
//!
//! Some tests need what an ordinary developer machine may lack: root, `ip`,
//! `ethtool`, `ping`, AF_XDP, two CPUs. Elsewhere they call [`skip`], which
//! prints `skipped: <reason>` and lets the test return. CI (`.ci/run`) runs
//! as root with `CI=true` and installs every prerequisite, so there a skip
//! would only hide a test that stopped checking anything: [`skip`] panics
//! with the reason instead.
//!
//! [`steering`]: the packet steering harness of the end-to-end test and
//! `ginza bench steering`.

use std::fmt::Display;

/// Skips the calling test: prints `skipped: <reason>`, or panics with the
/// reason when [`skips_are_failures`] (CI as root). The caller returns.
#[track_caller]
pub fn skip(reason: impl Display) {
    if skips_are_failures() {
        panic!("this test cannot run, and under CI=true as root it must: {reason}");
    }
    println!("skipped: {reason}");
}

/// True under CI as root (`CI=true` and effective uid 0): every
/// prerequisite should be installed, so a test that cannot run fails.
pub fn skips_are_failures() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    ci && running_as_root()
}

/// True when the effective uid is 0.
pub fn running_as_root() -> bool {
    ginza_sys::process::geteuid() == 0
}

pub mod steering;
