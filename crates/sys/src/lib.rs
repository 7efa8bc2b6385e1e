//! Ginza's operating-system calls, one small module per concern (docs/design.md,
//! "Layout" and "Dependencies"): every other crate asks here instead of
//! writing its own wrapper.
//!
//! * [`affinity`]: pinning threads to CPUs, the CPUs a thread may use.
//! * [`cpulist`]: the kernel's CPU-list text (`0-3,5`), parsed and written.
//! * [`topology`]: online CPUs and hyperthread siblings, from sysfs.
//! * [`eventfd`]: the counters kthreads park on.
//! * [`futex`]: waits and wakes on words of a shared mapping (the wake page).
//! * [`memfd`]: sealable memfds and their shared mappings.
//! * [`mm`]: private mappings (uthread stacks with a guard page).
//! * [`clock`]: CLOCK_MONOTONIC and the calling thread's CPU time.
//! * [`tsc_clock`]: CLOCK_MONOTONIC from the TSC, for a spinning loop.
//! * [`hops`]: TSC stamps of one request's hops (benchmarks' breakdowns).
//! * [`signal`]: `tgkill` and a plain signal handler.
//! * [`socket`]: unix SOCK_SEQPACKET sockets with descriptor passing.
//! * [`poll`]: `ppoll` over a reusable list of descriptors.
//! * [`process`]: thread, process and user ids; what a descriptor is.
//! * [`sched_class`]: a thread's Linux scheduling policy (`SCHED_IDLE`),
//!   niceness, `sched_yield`.
//! * [`autogroup`]: the session's niceness put back when a signal ends the
//!   process.
//! * [`sched_stat`]: how much CPU a thread got, and how long it waited for one.
//! * [`terminal`]: the size of the terminal behind a descriptor.
//! * [`testing`]: skipping a test that cannot run here (a failure under CI
//!   as root).
//! * [`xsk`]: AF_XDP sockets, their UMEM and rings (iokerneld's switch
//!   path and an application's direct path alike).
//!
//! Calls go through `rustix`; `libc` only where rustix has none (`tgkill`,
//! `sigaction`, `sched_setscheduler`, and `ppoll` on entries a caller
//! keeps between calls). Each `unsafe` block says why it is sound.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod affinity;
pub mod autogroup;
pub mod clock;
pub mod cpulist;
pub mod eventfd;
pub mod futex;
pub mod hops;
pub mod memfd;
pub mod mm;
pub mod poll;
pub mod process;
pub mod sched_class;
pub mod sched_stat;
pub mod signal;
pub mod socket;
pub mod task_group;
pub mod terminal;
pub mod testing;
pub mod topology;
pub mod tsc_clock;
pub mod xsk;
