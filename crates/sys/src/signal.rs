//! Signals between threads: `tgkill` and a plain handler. Neither has a
//! rustix call, so both are on `libc`.

use std::io;

/// Sends `sig` to thread `tid` of process `pid`. The kernel checks the
/// thread id against the process, so a tid reused elsewhere is never hit.
pub fn tgkill(pid: i32, tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: a syscall with integer arguments only; it sends a signal and
    // touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            pid as libc::c_long,
            tid as libc::c_long,
            sig as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Installs `handler` for `sig` with `SA_RESTART` (interrupted system
/// calls resume), replacing the old action. The handler must be
/// async-signal-safe (e.g. store to an atomic).
pub fn install_handler(sig: i32, handler: extern "C" fn(i32)) -> io::Result<()> {
    // SAFETY: `sigaction` is plain data; all zero is an empty action with
    // an empty mask.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler as usize;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: `sa` is a valid action whose handler is an `extern "C"`
    // function taking the signal number; no old action is requested.
    let r = unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static CAUGHT: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn count(_: i32) {
        CAUGHT.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn tgkill_reaches_the_handler_of_the_named_thread() {
        // SIGUSR2: no other test of this crate uses it.
        install_handler(libc::SIGUSR2, count).unwrap();
        let me = crate::process::gettid();
        tgkill(crate::process::getpid(), me, libc::SIGUSR2).unwrap();
        // A signal a thread sends itself is delivered before tgkill returns.
        assert_eq!(CAUGHT.load(Ordering::SeqCst), 1);
        // A tid that is not a thread of this process.
        assert!(tgkill(crate::process::getpid(), i32::MAX, libc::SIGUSR2).is_err());
    }
}
