//! The program's network counters written to a file when it exits
//! (`GINZA_NET_STATS`, docs/preload.md): a program under `ginza run` is a
//! process of its own, so whoever started it (`ginza bench memcached`)
//! reads its counters there, e.g. to prove its frames crossed its own
//! AF_XDP socket (docs/direct-path.md). One `name value` line per counter;
//! written to `PATH.tmp`, then renamed, so a reader never sees half a file.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::sync::OnceLock;

use ginza_runtime::net::NetStats;

/// The variable naming the file.
const VAR: &str = "GINZA_NET_STATS";

/// The path, and the process that armed it (a forked child inherits the
/// handler, and must not overwrite its parent's file).
static PATH: OnceLock<(OsString, u32)> = OnceLock::new();

/// Before `main`: takes the path from the environment (and out of it, so
/// that a program this one executes does not overwrite the file) and has
/// `exit` write the counters there.
pub(crate) fn arm() {
    let Some(path) = std::env::var_os(VAR).filter(|p| !p.is_empty()) else {
        return;
    };
    let _ = PATH.set((path, std::process::id()));
    // SAFETY: before main, on the only thread that runs the program's code.
    unsafe { libc::unsetenv(c"GINZA_NET_STATS".as_ptr()) };
    // SAFETY: registers a function with no arguments that never unwinds
    // (`at_exit` catches nothing: it only formats and writes).
    if unsafe { libc::atexit(at_exit) } != 0 {
        crate::say::line("ginza run", "GINZA_NET_STATS: atexit refused the handler");
    }
}

extern "C" fn at_exit() {
    let Some((path, pid)) = PATH.get() else {
        return;
    };
    if *pid != std::process::id() {
        return;
    }
    // On the runtime's side of the thread pointer, as every call into it.
    crate::mode::serve(|| {
        let stats = crate::running::running()
            .then(ginza_runtime::net::stats)
            .flatten();
        let text = stats.map_or_else(|| "unavailable 1\n".to_string(), |s| render(&s));
        let mut tmp = path.clone();
        tmp.push(".tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let why = format!("GINZA_NET_STATS={}: {e}", path.to_string_lossy());
            crate::say::line("ginza run", &why);
        }
    });
}

/// One `name value` line per counter the benches read.
fn render(s: &NetStats) -> String {
    let mut out = String::new();
    for (name, value) in [
        ("rx_packets", s.rx_packets),
        ("tx_packets", s.tx_packets),
        ("direct_rx_packets", s.direct_rx_packets),
        ("direct_tx_packets", s.direct_tx_packets),
        ("direct_tx_kicks", s.direct_tx_kicks),
    ] {
        let _ = writeln!(out, "{name} {value}");
    }
    out
}
