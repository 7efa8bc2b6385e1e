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

/// CPU time of thread `tid` of this process so far, ns: its CPU-time
/// clock, the one `pthread_getcpuclockid` names. Another thread reads it
/// without the measured thread's help (iokerneld's metrics server reads
/// the loop's). An error if no thread `tid` of this process exists.
pub fn thread_cpu_ns_of(tid: i32) -> std::io::Result<u64> {
    // Thread ids are positive and below 2^22 (`pid_max`'s ceiling): any
    // other value would not survive the shift below.
    if !(1..1 << 22).contains(&tid) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{tid} is not a thread id"),
        ));
    }
    // Linux's id of a thread's CPU clock: MAKE_THREAD_CPUCLOCK(tid,
    // CPUCLOCK_SCHED) in include/linux/posix-timers.h (per-thread bit 4,
    // scheduler clock 2).
    let id: libc::clockid_t = ((!tid) << 3) | 6;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the whole call; a
    // clock id the kernel does not know is refused with EINVAL.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_threads_cpu_time_is_read_from_outside() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(crate::process::gettid()).unwrap();
            // Burn 10 ms of CPU, then wait to be read.
            while thread_cpu_ns() < 10_000_000 {
                std::hint::spin_loop();
            }
            let own = thread_cpu_ns();
            tx.send(own as i32).unwrap();
            done_rx.recv().unwrap();
            own
        });
        let tid = rx.recv().unwrap();
        let _ = rx.recv().unwrap();
        let seen = thread_cpu_ns_of(tid).unwrap();
        done_tx.send(()).unwrap();
        let own = t.join().unwrap();
        // Read after the thread's own reading, while it waits: not less,
        // and not the reader's own time.
        assert!(seen >= own && own >= 10_000_000, "seen {seen}, own {own}");
        assert!(thread_cpu_ns_of(i32::MAX).is_err());
        assert!(thread_cpu_ns_of(0).is_err());
        // A thread that has exited has no clock, once the kernel has
        // released it: `join` returns when the thread clears its tid,
        // which is before that, so the release is waited for.
        let gone = std::thread::spawn(crate::process::gettid).join().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while thread_cpu_ns_of(gone).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "tid {gone} still has a clock after 10 s"
            );
            std::thread::yield_now();
        }
    }

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
