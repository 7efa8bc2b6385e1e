//! iokerneld, Ginza's core allocator daemon (docs/design.md, "Processes", "The
//! core allocator"). The protocol it speaks, and the client side of it, are
//! `ginza_proto`'s; its system calls are `ginza_sys`'s.
//!
//! * [`config`]: TOML file + flags, validated.
//! * [`daemon`]: the main loop: registration, hang-up detection, the
//!   allocation pass over the applications' queue lines and command rings.
//! * [`actuator`]: carrying out grants and preemptions (eventfd, affinity,
//!   signal), or recording them for tests.
//! * [`dataplane`]: packets between the links (software switch, traffic
//!   generator, a real NIC) and the applications' packet rings.
//! * [`nic`]: the NIC trait and its backends.
//! * [`metrics`]: the Prometheus endpoint (`--metrics`), served off the
//!   loop from the figures it publishes.
//! * [`doctor`]: `ginza doctor`, what on this machine works for iokerneld.
//! * [`loop_waker`]: how the in-process handles wake a sleeping loop.
//! * [`netns`]: a network namespace joined by a veth pair, where ordinary
//!   Linux programs talk to a Ginza NIC backend (tests, benchmarks).
//!
//! `unsafe` code is in the Linux NIC backends ([`nic::af_packet`],
//! [`nic::af_xdp`]) and [`netns`] (`setns`), each block with its `SAFETY`
//! comment.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod actuator;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod doctor;
mod in_process;
pub mod loop_waker;
pub mod metrics;
pub mod netns;
pub mod nic;
pub mod offload;
pub mod raw_app;
mod request_frame;
pub mod testing;

pub use actuator::{
    Action, CoreActuator, LinuxActuator, RecordingActuator, Target, PREEMPT_SIGNAL,
};
pub use config::{Cli, Config, ConfigError, PolicyKind};
pub use daemon::{DaemonError, Iokerneld, StopHandle};
pub use dataplane::{
    FaultsHandle, GeneratorHandle, LoadReport, LoadRun, GENERATOR_IP, GENERATOR_MAC,
};
pub use in_process::InProcess;
pub use nic::faults::{FaultRule, FaultRuleError};
