//! Kernel descriptors watched for a program thread that waits on Ginza
//! sockets too (`epoll.rs`, `pollset.rs`): a thread of the blocking pool
//! polls them, with an eventfd of the watch's own, and wakes the thread's
//! `Poller` when one is ready or time is up. The program thread parks as
//! a uthread meanwhile, so its kthread serves others or gives the core
//! back. Whichever side is ready first wins: when a Ginza socket is, the
//! program thread drops the watch, which writes the eventfd and ends the
//! pool thread's poll.
//!
//! The pool thread only polls (an epoll instance polls readable while it
//! holds events): it consumes nothing, so the program thread's own
//! `epoll_wait` or `poll` then reports the events, edge-triggered ones
//! included.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ginza_runtime::net::PollWaker;
use libc::c_int;

use crate::mode::real;

/// Eventfds of finished watches, for the next.
static SPARE: Mutex<Vec<c_int>> = Mutex::new(Vec::new());

/// An eventfd the pool thread and the program thread share; back to
/// `SPARE` (drained) when both are done with it.
struct Cancel {
    efd: c_int,
}

impl Drop for Cancel {
    fn drop(&mut self) {
        let read = real!(read: unsafe extern "C" fn(c_int, *mut libc::c_void, usize) -> isize);
        let mut count = 0u64;
        // SAFETY: reads 8 bytes of a non-blocking eventfd into `count`.
        unsafe { read(self.efd, (&mut count as *mut u64).cast(), 8) };
        SPARE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.efd);
    }
}

fn eventfd() -> Option<c_int> {
    if let Some(fd) = SPARE.lock().unwrap_or_else(|e| e.into_inner()).pop() {
        return Some(fd);
    }
    // SAFETY: a new eventfd; no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// A watch in progress; dropping it ends it.
pub(crate) struct KernelWatch {
    cancel: Option<Arc<Cancel>>,
    /// Set when the program thread is done with the watch: the pool
    /// thread then wakes nobody. A wake-up after the wait it was for
    /// would end the thread's next wait at once, whose own watch's
    /// wake-up would end the one after: a loop of waits that never park.
    done: Arc<AtomicBool>,
}

impl Drop for KernelWatch {
    fn drop(&mut self) {
        self.done.store(true, SeqCst);
        if let Some(c) = self.cancel.take() {
            let write =
                real!(write: unsafe extern "C" fn(c_int, *const libc::c_void, usize) -> isize);
            let one = 1u64;
            // SAFETY: writes 8 bytes to the watch's eventfd.
            unsafe { write(c.efd, (&one as *const u64).cast(), 8) };
        }
    }
}

/// Starts watching `fds` (their `events`) until one is ready or
/// `deadline`; then `waker` wakes. Without a spare eventfd (descriptors
/// exhausted) the pool thread polls in 1 ms slices so the watch still ends.
pub(crate) fn start(
    fds: Vec<libc::pollfd>,
    deadline: Option<Instant>,
    waker: PollWaker,
) -> KernelWatch {
    let cancel = eventfd().map(|efd| Arc::new(Cancel { efd }));
    let theirs = cancel.clone();
    let done = Arc::new(AtomicBool::new(false));
    let finished = Arc::clone(&done);
    crate::blocking::submit(Box::new(move || {
        let poll =
            real!(poll: unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int);
        let mut fds = fds;
        if let Some(c) = &theirs {
            fds.push(libc::pollfd {
                fd: c.efd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let timeout = match (deadline, &theirs) {
            (_, None) => 1,
            (None, Some(_)) => -1,
            (Some(d), Some(_)) => {
                let left = d.saturating_duration_since(Instant::now());
                // Rounded up, so the thread never wakes before the deadline.
                left.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int
            }
        };
        // SAFETY: a poll over our own array.
        unsafe { poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        // The program thread looks at the kernel descriptors again
        // whenever its wait ends, so a watch it dropped wakes nobody.
        if !finished.load(SeqCst) {
            waker.wake();
        }
        drop(theirs);
    }));
    KernelWatch { cancel, done }
}
