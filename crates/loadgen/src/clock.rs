//! The generator's clocks: CLOCK_MONOTONIC in ns (the schedule, latency,
//! and the timerfd that wakes a sleeping worker use the same clock), and a
//! thread's CPU time (the generator's own cost).

use rustix::time::{clock_gettime, ClockId, Timespec};

/// CLOCK_MONOTONIC, ns.
pub fn now_ns() -> u64 {
    to_ns(clock_gettime(ClockId::Monotonic))
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    to_ns(clock_gettime(ClockId::ThreadCPUTime))
}

fn to_ns(t: Timespec) -> u64 {
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `ns` as a `Timespec`.
pub fn timespec(ns: u64) -> Timespec {
    Timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    }
}
