//! Whether the program's runtime runs, and its handle: set by `start.rs`
//! once `main`'s thread is up, cleared in a forked child (`process.rs`),
//! read by whoever makes threads or reports on the runtime.

use std::sync::atomic::{AtomicBool, Ordering::Acquire, Ordering::Release};
use std::sync::OnceLock;

static RUNNING: AtomicBool = AtomicBool::new(false);
static HANDLE: OnceLock<ginza_runtime::Handle> = OnceLock::new();

/// Whether the runtime runs program threads (not before `main`, not in a
/// forked child).
pub(crate) fn running() -> bool {
    RUNNING.load(Acquire)
}

/// The runtime, for program threads made by threads that are not its own.
pub(crate) fn handle() -> Option<&'static ginza_runtime::Handle> {
    HANDLE.get()
}

/// From the first uthread: the runtime runs.
pub(crate) fn started(handle: ginza_runtime::Handle) {
    let _ = HANDLE.set(handle);
    RUNNING.store(true, Release);
}

/// In a forked child: no runtime any more.
pub(crate) fn forked() {
    RUNNING.store(false, Release);
}
