//! `exit` lingers for the connections the program closed (docs/preload.md,
//! "Exit"): Linux's kernel carries a closed connection on after its process
//! has gone, but a Ginza connection lives in the process, so a program that
//! writes, closes and exits would lose what was not yet acknowledged. An
//! `atexit` handler, registered before `main` (so it runs after the
//! program's own), waits at most 2 s for every connection the program
//! closed to have its FIN acknowledged
//! (`ginza_runtime::net::linger_for_closed_connections`). `_exit` and fatal
//! signals skip it, as they skip every `atexit` handler.

use std::sync::OnceLock;

/// The process that armed it (a forked child inherits the handler, and has
/// no runtime of its own).
static ARMED_BY: OnceLock<u32> = OnceLock::new();

/// Before `main`.
pub(crate) fn arm() {
    let _ = ARMED_BY.set(std::process::id());
    // SAFETY: registers a function with no arguments that never unwinds.
    if unsafe { libc::atexit(at_exit) } != 0 {
        crate::say::line(
            "ginza run",
            "atexit refused the handler that lingers for closed connections",
        );
    }
}

extern "C" fn at_exit() {
    if ARMED_BY.get() != Some(&std::process::id()) {
        return;
    }
    // On the runtime's side of the thread pointer, as every call into it.
    crate::mode::serve(|| {
        if crate::running::running() {
            ginza_runtime::net::linger_for_closed_connections();
        }
    });
}
