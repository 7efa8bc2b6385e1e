//! Waiting on a socket, for uthreads (an OS thread polls): shared by the
//! in-process TCP sockets (`tcp/`) and the protected backend
//! (`protected/`), so neither imports the other for it.
//!
//! * [`wait_until`]: an attempt under a waiter queue's lock, parking until
//!   a waker empties the queue or the [`Wait`] is over;
//! * [`wake_all`]: the wakers' side, which also notifies the pollers
//!   watching the socket (`readiness.rs`);
//! * [`would_block`] and [`os_error`]: errors carrying the `errno` Linux
//!   gives;
//! * timeouts as std's sockets take them, and the error for a call made
//!   outside a runtime.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::readiness::SocketWaiters;
use crate::deferral;
use crate::sched::{self, Waiter};
use crate::spinlock::SpinLock;

/// Wake-ups an attempt leaves to run once the waiter queue's lock is
/// released (`()`: none).
pub(in crate::net) trait WakeLater {
    fn run(self);
}

impl WakeLater for () {
    fn run(self) {}
}

/// Wakes every uthread in `waiters` (each looks again) and notifies the
/// pollers watching.
pub(in crate::net) fn wake_all(waiters: &SpinLock<SocketWaiters>) {
    let woken = waiters.lock().take_all();
    woken.run();
}

/// How long a socket call waits for its attempt to succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::net) enum Wait {
    /// One attempt (a non-blocking socket, a `try_` call). It reads no
    /// clock: an event loop's every read and write is such a call.
    Once,
    /// Until the attempt succeeds.
    Forever,
    /// Until then (then `EAGAIN`, or the caller's timeout error).
    Until(Instant),
}

impl Wait {
    /// For a call on a socket: once if `once` (non-blocking, or a `try_`
    /// call), else for the socket's timeout (`timeout_ns`), if it has one.
    pub(in crate::net) fn for_call(once: bool, timeout: &AtomicU64) -> Wait {
        if once {
            return Wait::Once;
        }
        Wait::within(timeout_of(timeout))
    }

    /// Once if `nonblocking`, else until the attempt succeeds (a call with
    /// no timeout: `accept`).
    pub(in crate::net) fn forever_unless(nonblocking: bool) -> Wait {
        if nonblocking {
            Wait::Once
        } else {
            Wait::Forever
        }
    }

    /// For at most `timeout` from now (`None`: forever).
    pub(in crate::net) fn within(timeout: Option<Duration>) -> Wait {
        Wait::until(timeout.map(|t| Instant::now() + t))
    }

    /// Until `deadline` (`None`: forever).
    pub(in crate::net) fn until(deadline: Option<Instant>) -> Wait {
        deadline.map_or(Wait::Forever, Wait::Until)
    }
}

/// Waits until `attempt` gives `Some((result, wake))` (`wake` runs once the
/// queue's lock is released) or `wait` is over (`None`). The attempt and
/// the queueing happen under the waiters' lock, which wakers take after
/// changing what the attempt looks at, so no wake-up is lost.
pub(in crate::net) fn wait_until<R, W: WakeLater>(
    waiters: &SpinLock<SocketWaiters>,
    wait: Wait,
    mut attempt: impl FnMut() -> Option<(R, W)>,
) -> Option<R> {
    let mut timed_out = false;
    loop {
        // Deferred from before queueing until after resuming: a preemption
        // in between would put this uthread on a runqueue too.
        let deferred = deferral::Guard::new();
        let me = sched::current_uthread(&deferred);
        let w = {
            let mut q = waiters.lock();
            if let Some((r, wake)) = attempt() {
                drop(q);
                wake.run();
                return Some(r);
            }
            let over = match wait {
                Wait::Once => true,
                Wait::Forever => false,
                Wait::Until(d) => timed_out || d <= Instant::now(),
            };
            if over {
                return None;
            }
            me.map(|me| {
                let w = Waiter::new(me);
                q.uthreads.push_back(Arc::clone(&w));
                w
            })
        };
        let Some(w) = w else {
            // An OS thread: poll.
            drop(deferred);
            std::thread::sleep(Duration::from_micros(20));
            continue;
        };
        match wait {
            Wait::Until(d) => sched::park_current_until(&deferred, &w, d),
            Wait::Once | Wait::Forever => sched::park_current(&deferred),
        }
        ginza_sys::hops::stamp(ginza_sys::hops::Hop::WaiterRuns);
        if w.timed_out() {
            waiters.lock().uthreads.retain(|x| !Arc::ptr_eq(x, &w));
            timed_out = true; // one more look, then give up
        }
    }
}

/// A socket timeout as std takes it (`None`: none; zero is an error), in
/// ns for an atomic (0: none).
pub(in crate::net) fn timeout_ns(timeout: Option<Duration>) -> io::Result<u64> {
    match timeout {
        None => Ok(0),
        Some(d) if d.is_zero() => Err(os_error(
            libc::EINVAL,
            format_args!("cannot set a 0 duration timeout"),
        )),
        Some(d) => Ok(d.as_nanos().clamp(1, u64::MAX as u128) as u64),
    }
}

/// The timeout `timeout_ns` stored.
pub(in crate::net) fn timeout_of(ns: &AtomicU64) -> Option<Duration> {
    let ns = ns.load(Relaxed);
    (ns != 0).then(|| Duration::from_nanos(ns))
}

pub(in crate::net) fn no_runtime(what: &str) -> io::Error {
    io::Error::other(format!(
        "{what} must be called from a Ginza uthread (inside ginza_runtime::run)"
    ))
}

/// `EAGAIN` (`ErrorKind::WouldBlock`): a non-blocking call found nothing to
/// do.
pub(in crate::net) fn would_block() -> io::Error {
    io::Error::from_raw_os_error(libc::EAGAIN)
}

/// The error Linux gives as `errno` (`raw_os_error` is `Some`, the kind the
/// one std maps it to): what a C program behind the preload library sees.
/// The text would be lost in it, so `what` (where, and why) goes to the
/// debug log.
pub(in crate::net) fn os_error(errno: i32, what: std::fmt::Arguments<'_>) -> io::Error {
    log::debug!("{what}: errno {errno}");
    io::Error::from_raw_os_error(errno)
}
