//! One line on stderr per call the library cannot serve, the first time
//! it is made: the program gets Linux's errno, the operator learns why.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Writes `ginza: <call>: <what>` once per `flag`. Async-signal-safe (one
/// `write` of a stack buffer), so it may be called from any context.
pub(crate) fn once(flag: &AtomicBool, call: &str, what: &str) {
    if flag.swap(true, Relaxed) {
        return;
    }
    line(call, what);
}

/// Writes `ginza: <call>: <what>` now.
pub(crate) fn line(call: &str, what: &str) {
    let mut buf = [0u8; 512];
    let mut len = 0;
    for part in ["ginza: ", call, ": ", what, "\n"] {
        let bytes = part.as_bytes();
        let n = bytes.len().min(buf.len() - len);
        buf[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    }
    // SAFETY: writing our own initialized buffer to stderr.
    unsafe { libc::write(2, buf.as_ptr().cast(), len) };
}

/// `say::once` with a flag of its own at the call site.
macro_rules! unsupported_once {
    ($call:expr, $what:expr) => {{
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        $crate::say::once(&SAID, $call, $what)
    }};
}
pub(crate) use unsupported_once;
