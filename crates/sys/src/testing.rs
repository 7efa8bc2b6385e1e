//! What the crate's tests share.

/// A test that cannot run here says why; under `CI=true` as root, where
/// everything it needs is there, it fails instead.
pub(crate) fn cannot_run(why: impl std::fmt::Display) {
    let must_run =
        std::env::var("CI").is_ok_and(|v| v == "true") && rustix::process::geteuid().is_root();
    assert!(!must_run, "cannot run under CI=true as root: {why}");
    eprintln!("skipped: {why}");
}
