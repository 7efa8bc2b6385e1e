//! The Ginza runtime: the per-application library of kthreads and uthreads
//! (see docs/design.md, "The runtime").
//!
//! ```no_run
//! let sum = ginza_runtime::run(ginza_runtime::Config::with_kthreads(2), || {
//!     let handles: Vec<_> = (0..10u64).map(|i| ginza_runtime::spawn(move || i * i)).collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
//! })
//! .unwrap();
//! assert_eq!(sum, 285);
//! ```
//!
//! Standalone mode: the runtime owns a fixed set of kthreads. Cores can be
//! taken away and given back through [`Handle::revoke`] / [`Handle::grant`],
//! the same park/unpark path iokerneld drives.
//!
//! Caveat of preemption, as in any user-level preemptive scheduler: code
//! preempted inside a C library call that holds a per-thread lock (stdio,
//! for instance) may resume on another kthread. Rust allocation is protected
//! (the global allocator defers preemption); wrap other such calls in
//! [`without_preemption`].
#![deny(unsafe_op_in_unsafe_fn)]

mod alloc;
mod arch;
mod config;
mod deferral;
mod error;
pub mod foreign_tls;
mod idle_poll;
mod iokernel;
mod link;
mod log_safe;
pub mod metrics;
pub mod net;
mod own_socket;
pub mod park;
mod preempt;
mod runtime;
mod sched;
mod self_wake;
mod shenango;
pub mod shinjuku;
mod signals;
mod slicer;
mod spinlock;
pub mod sync;
mod task;
mod thread_word;
mod timer;
mod uthread_stack;

pub use alloc::PreemptSafeAlloc;
pub use config::Config;
pub use config::{Class, IokernelConfig, BATCH_LINGER, POLL_WHILE_IDLE};
pub use deferral::without_preemption;
pub use error::{ConfigError, JoinError, PanicPayload, RuntimeError};
pub use iokernel::{last_wake, WakeStamps};
#[cfg(feature = "env-logger")]
pub use log_safe::init_logging;
pub use log_safe::{install_logger, PreemptSafeLog};
pub use net::NetConfig;
pub use preempt::preempt_point;
pub use runtime::{run, GrantLatencies, Handle, KthreadStats};
pub use sched::{current_kthread_id, current_uthread_stack, sleep, sleep_until, yield_now};
pub use signals::{abort_if_stack_overflow, report_fault_in_runtime};
pub use sync::{Condvar, Mutex, MutexGuard, WaitGroup};
pub use task::{spawn, spawn_with_stack_size, JoinHandle};
