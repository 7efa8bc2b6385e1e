//! Skipping a test that cannot run on this host, visibly: the one rule
//! every crate's tests follow (`ginza_iokernel::testing` passes it on).
//!
//! A test that lacks what it needs (root, a tool, a kernel feature) calls
//! [`skip`], which prints `skipped: <reason>` and lets the test return.
//! CI (`.ci/run`) runs as root with `CI=true` and installs every
//! prerequisite, so there a skip would only hide a test that stopped
//! checking anything: [`skip`] panics with the reason instead.

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
    ci && crate::process::geteuid() == 0
}
