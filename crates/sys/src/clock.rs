//! Clocks in ns.

use rustix::time::{clock_gettime, ClockId, Timespec};

fn ns(ts: Timespec) -> u64 {
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in ns: the clock runtimes and iokerneld share (timer
/// deadlines in `Parked`, grant decision times, the traffic generator's
/// send times).
pub fn monotonic_ns() -> u64 {
    ns(clock_gettime(ClockId::Monotonic))
}

/// CPU time the calling thread has used, ns (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_ns() -> u64 {
    ns(clock_gettime(ClockId::ThreadCPUTime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_time_never_goes_back() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn thread_cpu_time_grows_with_work() {
        let start = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() == start {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_ns() > start);
    }
}
