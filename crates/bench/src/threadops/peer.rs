//! Running an external peer program (the Go peer, the C program) on the
//! benchmark CPU and reading its medians.
//!
//! The CPU mask is set in the child between fork and exec (`pre_exec` +
//! `sched_setaffinity`), so every thread the program (or, for `c-ginza`,
//! `ginza run` and then the program it execs) later starts inherits it and no
//! external `taskset` is needed.

use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use anyhow::Context as _;

use super::{cpu_set_of, Medians};

/// Runs `cmd` pinned to `core` and parses the last non-empty line of its
/// stdout, `{"spawn_join":N,"yield_pingpong":N,"condvar_pingpong":N,"mutex":N}`.
/// `what` names the peer in errors.
pub(super) fn run(mut cmd: Command, core: usize, what: &str) -> anyhow::Result<Medians> {
    let set = cpu_set_of(core);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: the hook runs in the forked child before exec and only makes one
    // async-signal-safe system call on a cpu_set_t copied into the closure.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    anyhow::ensure!(out.status.success(), "{what} exited with {}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .with_context(|| format!("{what} printed nothing"))?;
    serde_json::from_str(line).with_context(|| format!("{what} printed {line:?}, not its medians"))
}
