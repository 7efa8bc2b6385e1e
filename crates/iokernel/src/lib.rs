//! iokerneld, Ginza's core allocator daemon (DESIGN.md, "Processes", "The
//! core allocator"), and the client side of its control protocol.
//!
//! * [`config`]: TOML file + flags, validated.
//! * [`proto`]: the messages on the control socket (JSON over
//!   SOCK_SEQPACKET, fds by SCM_RIGHTS).
//! * [`client`]: what a runtime calls to register; [`client::stats`].
//! * [`daemon`]: the main loop: registration, hang-up detection, the
//!   allocation pass over the applications' queue lines and command rings.
//! * [`actuator`]: carrying out grants and preemptions (eventfd, affinity,
//!   signal), or recording them for tests.
//! * [`dataplane`]: packets between the links (software switch, traffic
//!   generator, a real NIC) and the applications' packet rings.
//! * [`nic`]: the NIC trait and its backends.
//! * [`netns`]: a network namespace joined by a veth pair, where ordinary
//!   Linux programs talk to a Ginza NIC backend (tests, benchmarks).
//!
//! `unsafe` code is in the private `sys` module, the Linux NIC backends
//! ([`nic::af_packet`], [`nic::af_xdp`]) and [`netns`] (`setns`), each
//! block with its `SAFETY` comment.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod actuator;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod dataplane;
mod in_process;
pub mod netns;
pub mod nic;
pub mod proto;
pub mod raw_app;
mod sys;
pub mod testing;

pub use actuator::{
    Action, CoreActuator, LinuxActuator, RecordingActuator, Target, PREEMPT_SIGNAL,
};
pub use client::{ClientError, Connection};
pub use config::{Cli, Config, ConfigError, PolicyKind};
pub use daemon::{DaemonError, Iokerneld, StopHandle};
pub use dataplane::{GeneratorHandle, LoadReport, LoadRun, NetStats, GENERATOR_IP, GENERATOR_MAC};
pub use in_process::InProcess;
pub use proto::{AppStats, Class, Registration, Removal, StatsReport, PROTOCOL_VERSION};

/// Test and tool helpers that need a system call.
pub mod util {
    /// The CPUs this thread may run on.
    pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
        crate::sys::allowed_cpus()
    }
    /// Pins the calling thread to `cpu`.
    pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
        crate::sys::set_affinity(0, cpu)
    }
    /// The calling thread's kernel thread id.
    pub fn gettid() -> i32 {
        crate::sys::gettid()
    }
    /// CLOCK_MONOTONIC ns (the clock of `Parked { next_deadline_ns }`).
    pub fn monotonic_ns() -> u64 {
        crate::sys::monotonic_ns()
    }
    /// Reads and resets a non-blocking eventfd (`None`: counter was 0).
    pub fn eventfd_read(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Option<u64>> {
        crate::sys::eventfd_read(fd)
    }
}
