//! Linux scheduling classes of threads: `sched_setscheduler` and
//! `sched_getscheduler` (no rustix call, so on `libc`), and `sched_yield`.
//!
//! The runtime runs batch kthreads under `SCHED_IDLE` (docs/runtime.md,
//! "Batch kthreads run SCHED_IDLE"): the kernel then runs a normal thread
//! woken on the same CPU at once instead of sharing the CPU with it.

use std::io;

/// A thread's scheduling policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_OTHER`: the default time-sharing class.
    Normal,
    /// `SCHED_BATCH`.
    Batch,
    /// `SCHED_IDLE`: runs only when nothing of the other classes wants the
    /// CPU, and a normal thread woken there preempts it at once.
    Idle,
    /// `SCHED_FIFO`, `SCHED_RR`, `SCHED_DEADLINE`, or one this list does
    /// not know: the raw value.
    Other(i32),
}

impl Policy {
    fn from_raw(p: i32) -> Policy {
        match p {
            libc::SCHED_OTHER => Policy::Normal,
            libc::SCHED_BATCH => Policy::Batch,
            libc::SCHED_IDLE => Policy::Idle,
            other => Policy::Other(other),
        }
    }
}

/// Puts the calling thread under `SCHED_IDLE`. Any user may lower its own
/// threads to it; going back needs `CAP_SYS_NICE` (or an `RLIMIT_NICE`).
pub fn set_current_idle() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` that lives across the call;
    // pid 0 is the calling thread, whose policy is all that changes.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Puts thread `tid` (0: the calling thread) under `policy`, one of the
/// classes without a priority (`Normal`, `Batch`, `Idle`); its niceness is
/// kept. Lowering to `Idle` needs no privilege; going back from it needs
/// `CAP_SYS_NICE` (or an `RLIMIT_NICE`).
pub fn set_policy(tid: i32, policy: Policy) -> io::Result<()> {
    let raw = match policy {
        Policy::Normal => libc::SCHED_OTHER,
        Policy::Batch => libc::SCHED_BATCH,
        Policy::Idle => libc::SCHED_IDLE,
        Policy::Other(p) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("policy {p} has a priority: not set here"),
            ))
        }
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` that lives across the call;
    // only thread `tid`'s policy changes.
    let r = unsafe { libc::sched_setscheduler(tid, raw, &param) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets the niceness of thread `tid` (0: the calling thread) to `nice`
/// (absolute, -20..=19); threads it creates afterwards inherit it. Below 0
/// needs `CAP_SYS_NICE`.
pub fn set_nice(tid: i32, nice: i32) -> io::Result<()> {
    let who = if tid == 0 {
        crate::process::gettid()
    } else {
        tid
    };
    // SAFETY: integer arguments only; on Linux `PRIO_PROCESS` with a thread
    // id changes that one thread's niceness.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, who as libc::id_t, nice) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The niceness of thread `tid` (0: the calling thread).
pub fn nice_of(tid: i32) -> io::Result<i32> {
    let who = if tid == 0 {
        crate::process::gettid()
    } else {
        tid
    };
    // SAFETY: as in `set_nice`. -1 is a valid niceness, so errno tells an
    // error apart: it is cleared first.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: integer arguments only; it reads the thread's niceness.
    let r = unsafe { libc::getpriority(libc::PRIO_PROCESS, who as libc::id_t) };
    let err = io::Error::last_os_error();
    if r == -1 && err.raw_os_error().is_some_and(|e| e != 0) {
        Err(err)
    } else {
        Ok(r)
    }
}

/// The niceness of the calling process's autogroup (`/proc/self/autogroup`,
/// "/autogroup-N nice K"); `None` where the kernel has no autogroups, and
/// for a process in no session (the root task group: the file is empty).
///
/// With `kernel.sched_autogroup_enabled`, Linux first shares a CPU fairly
/// between sessions (autogroups), and only then between the threads of
/// one by their niceness: a thread's niceness does not put it ahead of
/// another session's work, its autogroup's niceness does.
pub fn autogroup_nice() -> Option<i32> {
    autogroup_line_nice(&std::fs::read_to_string("/proc/self/autogroup").ok()?)
}

/// The niceness of process `pid`'s autogroup, as [`autogroup_nice`].
pub fn autogroup_nice_of(pid: u32) -> Option<i32> {
    autogroup_line_nice(&std::fs::read_to_string(format!("/proc/{pid}/autogroup")).ok()?)
}

fn autogroup_line_nice(line: &str) -> Option<i32> {
    let mut words = line.split_ascii_whitespace().skip_while(|w| *w != "nice");
    words.next()?;
    words.next()?.parse().ok()
}

/// Sets the niceness of the calling process's autogroup (every process of
/// its session); below 0 needs `CAP_SYS_NICE`.
pub fn set_autogroup_nice(nice: i32) -> io::Result<()> {
    std::fs::write("/proc/self/autogroup", nice.to_string())
}

/// Sets the niceness of process `pid`'s autogroup (its whole session);
/// below 0 needs `CAP_SYS_NICE`.
pub fn set_autogroup_nice_of(pid: u32, nice: i32) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/autogroup"), nice.to_string())
}

/// Whether Linux shares CPUs between sessions first
/// (`kernel.sched_autogroup_enabled`).
pub fn autogroups_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|v| v.trim() == "1")
}

/// Gives the calling thread's CPU to another thread runnable on it, if
/// any (`sched_yield`); returns at once when there is none.
pub fn yield_cpu() {
    rustix::thread::sched_yield();
}

/// The policy of thread `tid` (0: the calling thread).
pub fn policy_of(tid: i32) -> io::Result<Policy> {
    // SAFETY: an integer argument only; it reads the thread's policy.
    let r = unsafe { libc::sched_getscheduler(tid) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        // The kernel may report SCHED_RESET_ON_FORK or'ed in.
        Ok(Policy::from_raw(r & !libc::SCHED_RESET_ON_FORK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_autogroup_nice_is_read_from_its_line() {
        assert_eq!(autogroup_line_nice("/autogroup-286 nice -10\n"), Some(-10));
        assert_eq!(autogroup_line_nice("/autogroup-1 nice 0\n"), Some(0));
        assert_eq!(autogroup_line_nice("/autogroup-1\n"), None);
        assert_eq!(autogroup_line_nice("/autogroup-1 nice x\n"), None);
    }

    #[test]
    fn a_thread_lowered_to_idle_reads_back_idle_and_others_do_not_change() {
        assert_eq!(policy_of(0).unwrap(), Policy::Normal);
        let (tid, seen) = std::thread::spawn(|| {
            set_current_idle().unwrap();
            (crate::process::gettid(), policy_of(0).unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(seen, Policy::Idle);
        // That thread is gone: its tid names no thread now (or another one).
        let _ = policy_of(tid);
        assert_eq!(policy_of(0).unwrap(), Policy::Normal);
    }

    #[test]
    fn a_thread_raised_to_nice_10_reads_back_10() {
        let before = nice_of(0).unwrap();
        let seen = std::thread::spawn(move || {
            // Raising the niceness (lowering priority) needs no privilege.
            set_nice(0, (before + 10).min(19)).unwrap();
            nice_of(0).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen, (before + 10).min(19));
        assert_eq!(nice_of(0).unwrap(), before);
    }

    #[test]
    fn another_thread_lowered_to_idle_and_back_keeps_its_niceness() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            set_nice(0, 5).unwrap();
            tx.send(crate::process::gettid()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        set_policy(tid, Policy::Idle).unwrap();
        assert_eq!(policy_of(tid).unwrap(), Policy::Idle);
        match set_policy(tid, Policy::Normal) {
            Ok(()) => {
                assert_eq!(policy_of(tid).unwrap(), Policy::Normal);
                assert_eq!(nice_of(tid).unwrap(), 5);
            }
            // Back from SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        }
        assert!(set_policy(tid, Policy::Other(libc::SCHED_FIFO)).is_err());
        done_tx.send(()).unwrap();
        h.join().unwrap();
    }

    #[test]
    fn another_threads_policy_is_read_by_its_tid() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            set_current_idle().unwrap();
            tx.send(crate::process::gettid()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        assert_eq!(policy_of(tid).unwrap(), Policy::Idle);
        done_tx.send(()).unwrap();
        h.join().unwrap();
        assert!(policy_of(-1).is_err());
    }
}
