//! The bell a runtime rings to wake a sleeping iokerneld (docs/iokernel-idle.md).
//!
//! iokerneld sleeps only when nothing is runnable; before it does, it sets
//! [`LineFlags::IOKERNEL_ASLEEP`] on every queue line of every application,
//! looks at all their rings once more, then blocks in `poll` on each
//! application's bell (an eventfd the runtime sent at registration). A
//! runtime that makes work visible to iokerneld (a runqueue push counted on
//! the line, a command on its ring) then calls [`IokernelBell::ring_if_asleep`]:
//!
//! ```text
//! iokerneld                          runtime
//! set ASLEEP on the lines            publish work (counter, ring slot)
//! fence(SeqCst)                      fence(SeqCst)
//! look at every line and ring        read the line's flags
//! poll(bells, ...)                   ASLEEP set → write the eventfd
//! ```
//!
//! With a full fence between each side's write and its read, at least one
//! of them sees the other's: iokerneld finds the work before it sleeps, or
//! the runtime finds the flag and rings. While iokerneld is awake (the busy
//! path) the runtime pays a fence and one load of a cache line it has just
//! written, and makes no system call.
//!
//! Everything here is advisory to iokerneld: a runtime that clears the flag
//! or never rings only delays its own work; one that rings without reason
//! only wakes iokerneld, which looks, finds nothing and sleeps again.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};

use crate::queue_line::{LineFlags, QueueLine};

/// The runtime's bell: an eventfd iokerneld polls while asleep.
#[derive(Debug)]
pub struct IokernelBell {
    efd: OwnedFd,
}

impl IokernelBell {
    /// A new bell (a non-blocking eventfd).
    pub fn new() -> std::io::Result<IokernelBell> {
        Ok(IokernelBell {
            efd: ginza_sys::eventfd::new()?,
        })
    }

    /// Call after making work visible on `line` (or on the rings of its
    /// kthread): wakes iokerneld if it said it sleeps. Returns whether it
    /// rang.
    #[inline]
    pub fn ring_if_asleep(&self, line: &QueueLine) -> bool {
        fence(Ordering::SeqCst);
        if line.flags().contains(LineFlags::IOKERNEL_ASLEEP) {
            self.ring();
            true
        } else {
            false
        }
    }

    /// Wakes iokerneld unconditionally.
    #[cold]
    pub fn ring(&self) {
        // Only a counter at its maximum refuses a write, and that counter
        // already wakes iokerneld.
        let _ = ginza_sys::eventfd::write(self.efd.as_fd(), 1);
    }
}

impl AsFd for IokernelBell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }
}

/// iokerneld's side: sets or clears [`LineFlags::IOKERNEL_ASLEEP`] on
/// `lines`; going to sleep, the caller looks at the lines and rings only
/// after this returns (it ends with the fence the protocol needs).
pub fn announce_asleep<'a>(lines: impl IntoIterator<Item = &'a QueueLine>, asleep: bool) {
    for line in lines {
        if asleep {
            line.insert_flags(LineFlags::IOKERNEL_ASLEEP);
        } else {
            line.remove_flags(LineFlags::IOKERNEL_ASLEEP);
        }
    }
    fence(Ordering::SeqCst);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn rings_only_while_iokerneld_says_it_sleeps() {
        let line = QueueLine::new();
        let bell = IokernelBell::new().unwrap();
        assert!(!bell.ring_if_asleep(&line));
        assert_eq!(ginza_sys::eventfd::read(bell.as_fd()).unwrap(), None);
        announce_asleep([&line], true);
        assert!(bell.ring_if_asleep(&line));
        assert_eq!(ginza_sys::eventfd::read(bell.as_fd()).unwrap(), Some(1));
        announce_asleep([&line], false);
        assert!(!bell.ring_if_asleep(&line));
        assert!(!line.flags().contains(LineFlags::IOKERNEL_ASLEEP));
    }

    /// Either iokerneld sees the work after announcing its sleep, or the
    /// runtime sees the announcement after publishing the work: never
    /// neither (many rounds of the two sides racing).
    #[test]
    fn a_sleep_and_a_push_never_miss_each_other() {
        use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
        use std::sync::Barrier;
        let line = QueueLine::new();
        let bell = IokernelBell::new().unwrap();
        let rounds = 20_000;
        let barrier = Barrier::new(2);
        let pushed = AtomicU32::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..rounds {
                    barrier.wait();
                    line.add_rq_tail(1);
                    pushed.fetch_add(1, Relaxed);
                    bell.ring_if_asleep(&line);
                    barrier.wait();
                }
            });
            let mut seen_tail = 0u32;
            for _ in 0..rounds {
                barrier.wait();
                announce_asleep([&line], true);
                let tail = line.snapshot().counters.rq_tail;
                let saw_work = tail != seen_tail;
                barrier.wait();
                let rang = ginza_sys::eventfd::read(bell.as_fd()).unwrap().is_some();
                assert!(saw_work || rang, "a push was neither seen nor rung");
                seen_tail = line.snapshot().counters.rq_tail;
                announce_asleep([&line], false);
            }
        });
        assert_eq!(pushed.load(Relaxed), rounds);
    }
}
