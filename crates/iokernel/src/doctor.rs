//! `ginza doctor`: what on this machine works for iokerneld and its
//! applications, and why (docs/operations.md). One small module per check;
//! each gives a [`Check`]: a verdict, what it found, and the fix.
//!
//! * [`cpus`]: CPUs online, the affinity mask, `isolcpus`/`nohz_full`,
//!   and the cores iokerneld would take.
//! * [`xdp`]: AF_XDP and the XDP modes on a named interface, with
//!   iokerneld's own NIC code (attached and detached at once).
//! * [`memlock`]: `RLIMIT_MEMLOCK` against what the UMEM pins.
//! * [`caps`]: the capabilities iokerneld uses, from `CapEff`.
//! * [`reach`]: whether iokerneld answers at the socket.
//! * [`wake`]: an eventfd ping-pong between two CPUs, and what its cost
//!   means for the latency of a request that finds its kthread parked.
//! * [`platform`]: FSGSBASE (`ginza run`) and the kernel version.
//!
//! A [`Verdict::Fail`] means iokerneld could not run here as asked; the
//! command then exits non-zero.

pub mod caps;
pub mod cpus;
pub mod memlock;
pub mod platform;
pub mod reach;
pub mod wake;
pub mod xdp;

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Works as iokerneld wants it.
    Pass,
    /// Works, with a limit worth knowing (or was not checked).
    Warn,
    /// iokerneld could not run here as asked.
    Fail,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One check's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Short and stable (`cpus`, `xdp`, ...): what scripts match on.
    pub name: &'static str,
    pub verdict: Verdict,
    /// What was found, in words.
    pub found: String,
    /// What to do about it; `None` when there is nothing to do.
    pub fix: Option<String>,
    /// The figures behind `found`, for `--json` readers.
    pub data: serde_json::Value,
}

impl Check {
    fn new(name: &'static str, verdict: Verdict, found: impl Into<String>) -> Check {
        Check {
            name,
            verdict,
            found: found.into(),
            fix: None,
            data: serde_json::Value::Null,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }

    fn data(mut self, data: serde_json::Value) -> Check {
        self.data = data;
        self
    }
}

/// What to check.
#[derive(Clone, Debug)]
pub struct Options {
    /// The interface iokerneld would serve (`nic = "af_xdp:IF"`); `None`:
    /// the NIC checks are not made.
    pub interface: Option<String>,
    /// iokerneld's control socket.
    pub socket: PathBuf,
    /// Try attaching in driver mode too (some drivers reset the link
    /// when a program is attached in driver mode).
    pub try_driver_mode: bool,
    /// Round trips of the wake measurement.
    pub wake_rounds: usize,
}

/// Every check, in the order they are printed.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
    /// No check failed.
    pub iokerneld_can_run: bool,
}

/// Runs every check. The XDP check attaches a program to the named
/// interface for a moment (and detaches it); nothing else changes the
/// machine.
pub fn run(opts: &Options) -> Report {
    let caps = caps::Capabilities::of_this_process();
    let interface = opts.interface.as_deref();
    let checks = vec![
        cpus::check(),
        xdp::check(interface, opts.try_driver_mode),
        memlock::check(&caps, interface.is_some()),
        caps::check(&caps, interface.is_some()),
        reach::check(&opts.socket),
        wake::check(opts.wake_rounds),
        platform::fsgsbase(),
        platform::kernel(),
    ];
    let iokerneld_can_run = checks.iter().all(|c| c.verdict != Verdict::Fail);
    Report {
        checks,
        iokerneld_can_run,
    }
}

impl Report {
    /// One line per check: `PASS  name  found. Fix: ...`, then a summary.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            // `write!` to a String cannot fail.
            let _ = write!(out, "{}  {:<9} {}", c.verdict.label(), c.name, c.found);
            if let Some(fix) = &c.fix {
                let _ = write!(out, ". Fix: {fix}");
            }
            out.push('\n');
        }
        let count = |v| self.checks.iter().filter(|c| c.verdict == v).count();
        let _ = writeln!(
            out,
            "{} passed, {} warnings, {} failed: iokerneld {}",
            count(Verdict::Pass),
            count(Verdict::Warn),
            count(Verdict::Fail),
            if self.iokerneld_can_run {
                "can run here"
            } else {
                "could not run here as asked"
            }
        );
        out
    }

    /// The exit status: 1 when a check failed.
    pub fn exit_code(&self) -> u8 {
        u8::from(!self.iokerneld_can_run)
    }
}

/// Bytes as `64 KiB`, `4 MiB`.
fn fmt_bytes(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_check_makes_the_exit_status_non_zero() {
        let pass = Check::new("a", Verdict::Pass, "fine");
        let warn = Check::new("b", Verdict::Warn, "meh").fix("do this");
        let mut r = Report {
            checks: vec![pass.clone(), warn.clone()],
            iokerneld_can_run: true,
        };
        assert_eq!(r.exit_code(), 0);
        let text = r.text();
        assert!(text.contains("PASS  a         fine\n"), "{text}");
        assert!(
            text.contains("WARN  b         meh. Fix: do this\n"),
            "{text}"
        );
        assert!(text.ends_with("1 passed, 1 warnings, 0 failed: iokerneld can run here\n"));
        r.checks.push(Check::new("c", Verdict::Fail, "no"));
        r.iokerneld_can_run = false;
        assert_eq!(r.exit_code(), 1);
        assert!(r.text().contains("could not run here"));
    }

    #[test]
    fn bytes_are_written_in_their_unit() {
        assert_eq!(fmt_bytes(4 << 20), "4 MiB");
        assert_eq!(fmt_bytes(64 << 10), "64 KiB");
        assert_eq!(fmt_bytes(1000), "1000 bytes");
    }
}
