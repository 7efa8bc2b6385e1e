//! Rust's standard output and error under time slices. std guards each
//! with a reentrant lock whose owner is the OS thread, and every uthread
//! on a kthread is that one thread to it: a uthread preempted while it
//! writes leaves the lock held in that thread's name, and the next uthread
//! the kthread runs re-enters it and finds the writer's buffer borrowed
//! ("RefCell already borrowed", a panic; 6 uthreads × 20,000 lines at a
//! 50 µs slice panicked within the first 40,000 lines when this file was
//! written). Writing with preemption deferred is the remedy, and loggers
//! installed with `install_logger` get it on every call (docs/runtime.md,
//! "Limits worth knowing"); this checks that both hold.
//! In a file of its own: it points the process's stdout at /dev/null
//! while it runs.

use std::io::Write;
use std::time::Duration;

use ginza_runtime::{install_logger, run, spawn, without_preemption, Config};

/// A logger that writes through std's stdout lock, as env_logger does
/// through stderr's.
struct StdoutLogger;

impl log::Log for StdoutLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        writeln!(std::io::stdout().lock(), "{}", record.args()).unwrap();
    }
    fn flush(&self) {}
}

#[test]
fn lines_written_or_logged_with_preemption_deferred_survive_time_slices() {
    const UTHREADS: u32 = 6;
    const LINES: u32 = 20_000;
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    // Stdout goes to /dev/null while the writers run (this binary runs no
    // other test), then back.
    // SAFETY: dup of an open descriptor.
    let saved = unsafe { libc::dup(1) };
    assert!(saved >= 0);
    let null_fd = std::os::fd::AsRawFd::as_raw_fd(&null);
    // SAFETY: dup2 of two open descriptors.
    assert_eq!(unsafe { libc::dup2(null_fd, 1) }, 1);
    install_logger(StdoutLogger, log::LevelFilter::Info).unwrap();
    let mut config = Config::with_kthreads(2);
    config.time_slice = Some(Duration::from_micros(50));
    let (written, preemptions) = run(config, || {
        let handle = ginza_runtime::Handle::current().unwrap();
        let writers: Vec<_> = (0..UTHREADS)
            .map(|t| {
                spawn(move || {
                    let mut written = 0;
                    for i in 0..LINES {
                        if i % 2 == 0 {
                            without_preemption(|| {
                                let mut out = std::io::stdout().lock();
                                writeln!(out, "uthread {t} line {i} {:064}", 0).unwrap();
                            });
                        } else {
                            // Through the installed logger (PreemptSafeLog).
                            log::info!("uthread {t} line {i} {:064}", 0);
                        }
                        written += 1;
                        // Work outside the deferred section, where the
                        // slices land.
                        std::hint::black_box((0..200).sum::<u32>());
                    }
                    written
                })
            })
            .collect();
        let written: u32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        let preemptions: u64 = handle.stats().iter().map(|s| s.preemptions).sum();
        (written, preemptions)
    })
    .unwrap();
    // SAFETY: dup2 of two open descriptors.
    assert_eq!(unsafe { libc::dup2(saved, 1) }, 1);
    assert_eq!(written, UTHREADS * LINES);
    assert!(preemptions > 0, "no time slice preempted a writer");
}
