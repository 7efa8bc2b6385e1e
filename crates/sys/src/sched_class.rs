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
