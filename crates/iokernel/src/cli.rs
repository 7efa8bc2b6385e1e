//! The body of `iokerneld`, shared by the `iokerneld` binary and
//! `ginza iokernel` so that both take the same flags ([`Cli`]) and behave
//! the same: bad configuration → message and exit code 2, any other
//! failure → message and exit code 1, a clean stop (`--run-for`, SIGINT,
//! SIGTERM) → the final stats as one JSON line on stdout and exit code 0.
//!
//! Logging is left to the caller: `iokerneld` logs at `info` by default,
//! `ginza` at `warn` (`RUST_LOG` overrides both).

use std::io::Write;
use std::process::ExitCode;

use crate::{Cli, Config, Iokerneld, LinuxActuator};

/// Exit status for a configuration that was refused (as clap does for bad
/// flags, so scripts see one code for "you asked for something invalid").
pub const EXIT_BAD_CONFIG: u8 = 2;

/// Runs iokerneld with these flags until it stops; returns the process exit
/// status (see the module doc). Errors are printed on stderr prefixed with
/// `iokerneld:`.
pub fn run(cli: &Cli) -> u8 {
    // iokerneld holds every application's regions and tx pools: other processes
    // of the same user must not open them through /proc/<pid>/fd.
    if let Err(e) = ginza_sys::process::set_non_dumpable() {
        eprintln!("iokerneld: cannot make the process non-dumpable: {e}");
        return 1;
    }
    let cfg = match Config::from_cli(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("iokerneld: {e}");
            return EXIT_BAD_CONFIG;
        }
    };
    let actuator = match LinuxActuator::for_config(&cfg) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("iokerneld: {e}");
            return 1;
        }
    };
    let mut d = match Iokerneld::bind(cfg, actuator) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("iokerneld: {e}");
            return 1;
        }
    };
    if let Err(e) = d.stop_on_signals() {
        eprintln!("iokerneld: cannot install the SIGINT/SIGTERM handler: {e}");
        return 1;
    }
    match d.run() {
        Ok(report) => {
            let mut out = std::io::stdout().lock();
            // The caller may leave with `process::exit`, which does not
            // flush: flush here so the final stats are never lost.
            let written = writeln!(
                out,
                "{}",
                serde_json::to_string(&report).unwrap_or_default()
            )
            .and_then(|()| out.flush());
            match written {
                Ok(()) => 0,
                // A closed pipe on stdout: iokerneld itself stopped fine,
                // but the caller asked for the stats and did not get them.
                Err(e) => {
                    eprintln!("iokerneld: cannot print the final stats: {e}");
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("iokerneld: {e}");
            1
        }
    }
}

/// [`run`] as a `main` result.
pub fn main_with(cli: &Cli) -> ExitCode {
    ExitCode::from(run(cli))
}
