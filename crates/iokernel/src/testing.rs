//! Skipping a test that cannot run on this host, visibly.
//!
//! Some tests need what an ordinary developer machine may lack: root, `ip`,
//! `ethtool`, `ping`, AF_XDP, two CPUs. Elsewhere they call [`skip`]
//! (`ginza_sys::testing`, passed on here): `skipped: <reason>`, or under
//! CI as root a failure.
//!
//! The tests' other shared fixtures: [`test_cores`], an in-process
//! iokerneld in a directory of the test's ([`in_process`]), [`scrape`]
//! (a Prometheus endpoint read by the reference parser) and [`steering`]
//! (the packet steering harness of the end-to-end test and `ginza bench
//! steering`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Config, InProcess};

/// Polls `f` every millisecond until it gives a value; fails the test
/// after 10 s, naming `what` (tests wait for conditions, never a fixed
/// time).
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub use ginza_sys::testing::{skip, skips_are_failures};

/// True when the effective uid is 0.
pub fn running_as_root() -> bool {
    ginza_sys::process::geteuid() == 0
}

/// Up to two CPUs this process may use: the cores a test's iokerneld
/// manages (a test that needs two skips with fewer).
pub fn test_cores() -> Vec<usize> {
    let mut c = ginza_sys::affinity::allowed_cpus().expect("the allowed CPUs");
    c.truncate(2);
    c
}

/// iokerneld on a thread of the test, managing [`test_cores`], its socket
/// `iokerneld.sock` in `dir`, napping 1 ms while nothing is busy, as
/// `tweak` leaves it (`idle_sleep = None`: it busy-polls, as in
/// production; a nap costs up to that much per hop).
pub fn in_process(dir: &Path, tweak: impl FnOnce(&mut Config)) -> (InProcess, PathBuf) {
    let socket = dir.join("iokerneld.sock");
    let mut cfg = Config::new(test_cores());
    cfg.socket = socket.clone();
    cfg.idle_sleep = Some(Duration::from_millis(1));
    tweak(&mut cfg);
    cfg.validate(&ginza_sys::affinity::allowed_cpus().expect("the allowed CPUs"))
        .expect("a valid iokerneld configuration");
    let io = InProcess::start(cfg).expect("iokerneld starts");
    (io, socket)
}

pub mod scrape;
pub mod steering;
