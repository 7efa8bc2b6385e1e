//! Errors the runtime reports to its caller.

use std::time::Duration;

/// A configuration that cannot run on this machine.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid runtime config: need at least one kthread (kthreads = 0)")]
    NoKthreads,
    #[error("invalid runtime config: kthreads = {requested}, at most {max} are supported")]
    TooManyKthreads { requested: usize, max: usize },
    #[error("invalid runtime config: stack size {requested} bytes is outside {min}..={max}")]
    StackSize {
        requested: usize,
        min: usize,
        max: usize,
    },
    #[error("invalid runtime config: spin_before_park {0:?} is longer than 1 s; an idle kthread would burn its core")]
    SpinTooLong(Duration),
    #[error("invalid runtime config: the core list is empty")]
    EmptyCoreList,
    #[error("invalid runtime config: core {core} does not exist or is not allowed for this process (allowed: {allowed})")]
    UnknownCore { core: usize, allowed: String },
    #[error("invalid runtime config: core {0} is listed twice")]
    DuplicateCore(usize),
    #[error("invalid scheduling policy: {0}")]
    Policy(String),
    #[error("this process may run on no CPU at all")]
    NoAllowedCpus,
    #[error("cannot read this process's CPU affinity: {0}")]
    Affinity(String),
}

/// Why [`crate::run`] could not run or finish the application.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start the runtime: {0}")]
    Start(String),
    #[error("cannot register with iokerneld: {0}")]
    Iokernel(String),
    #[error("cannot attach to the netstack (protected mode): {0}")]
    Netstack(String),
    #[error("the application's main uthread panicked: {0}")]
    MainPanicked(String),
}

/// Why [`crate::JoinHandle::join`] has no value.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("uthread panicked: {message}")]
    Panicked {
        message: String,
        #[source]
        payload: PanicPayload,
    },
}

/// The panic payload of a uthread, kept so it can be re-raised.
pub struct PanicPayload(pub Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for PanicPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PanicPayload")
    }
}
impl std::fmt::Display for PanicPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&panic_message(&*self.0))
    }
}
impl std::error::Error for PanicPayload {}

impl JoinError {
    pub(crate) fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        JoinError::Panicked {
            message: panic_message(&*payload),
            payload: PanicPayload(payload),
        }
    }

    /// The panic payload, for `std::panic::resume_unwind`.
    pub fn into_panic(self) -> Box<dyn std::any::Any + Send> {
        match self {
            JoinError::Panicked { payload, .. } => payload.0,
        }
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
