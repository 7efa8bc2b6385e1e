//! A logger wrapper whose every call is a deferred-preemption section.
//!
//! Loggers that write to stderr go through std's reentrant stderr lock,
//! which is owned by the OS thread: to it every uthread of a kthread is
//! that one thread. A uthread preempted inside a log call would leave the
//! lock held in the kthread's name, and the next uthread the kthread runs
//! would re-enter it and find the writer's buffer borrowed (std panics:
//! docs/runtime.md, "Limits worth knowing"). Deferring preemption around
//! the call keeps the whole write on one uthread.

use crate::deferral;

/// `L` with preemption deferred around each call.
pub struct PreemptSafeLog<L>(pub L);

impl<L: log::Log> log::Log for PreemptSafeLog<L> {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        deferral::without_preemption(|| self.0.log(record));
    }

    fn flush(&self) {
        deferral::without_preemption(|| self.0.flush());
    }
}

/// Makes `logger`, wrapped in [`PreemptSafeLog`], the process's logger,
/// with `max_level` as `log`'s filter. An error if one is set already.
pub fn install_logger(
    logger: impl log::Log + 'static,
    max_level: log::LevelFilter,
) -> Result<(), log::SetLoggerError> {
    log::set_boxed_logger(Box::new(PreemptSafeLog(logger)))?;
    log::set_max_level(max_level);
    Ok(())
}

/// env_logger as `RUST_LOG` says (else at `default_filter`), installed
/// with [`install_logger`]. An error if a logger is set already.
#[cfg(feature = "env-logger")]
pub fn init_logging(default_filter: &str) -> Result<(), log::SetLoggerError> {
    let logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter))
            .build();
    let max_level = logger.filter();
    install_logger(logger, max_level)
}
