//! [`Poller`]: the runtime's epoll, a readiness multiplexer for uthreads
//! over Ginza sockets (docs/runtime.md, "Readiness and the Poller"). The
//! ready list and the way sockets notify it are in `readiness.rs`; here
//! are registration and the wait, which parks the uthread (its kthread
//! runs other work, or parks and gives its core back under iokerneld).

use std::fmt;
use std::io;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::readiness::{
    ListLook, PollEvent, PollMode, Readiness, ReadyList, Settings, Watch, Watched,
};
use super::wait::{os_error, Wait};
use crate::deferral;
use crate::sched::{self, Waiter};

/// The hidden half of [`PollSource`]: what a poller watches.
pub(crate) mod sealed {
    use super::Watched;
    use std::sync::Arc;

    /// The socket's shared state, as a poller holds it (weakly).
    pub struct Hook(pub(crate) Arc<dyn Watched>);

    pub trait Sealed {
        fn poll_hook(&self) -> Hook;
    }
}

/// A socket a [`Poller`] can watch: `TcpListener`, `TcpStream` and
/// `UdpSocket`, over either backend.
pub trait PollSource: sealed::Sealed {
    /// What the socket is ready for now (epoll's level state).
    fn readiness(&self) -> Readiness {
        self.poll_hook().0.readiness()
    }
}

/// A readiness multiplexer for uthreads over Ginza sockets. `Send + Sync`:
/// several uthreads may register, and wait, on one.
pub struct Poller {
    list: Arc<ReadyList>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

impl Default for Poller {
    fn default() -> Self {
        Poller::new()
    }
}

/// A socket watched by a poller; dropping it stops the watching.
pub struct Registration {
    watch: Arc<Watch>,
    source: Weak<dyn Watched>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").finish_non_exhaustive()
    }
}

/// Makes a poller's current or next `wait` return. Callable from any OS
/// thread, uthread or not.
#[derive(Clone)]
pub struct PollWaker {
    list: Arc<ReadyList>,
}

impl fmt::Debug for PollWaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollWaker").finish_non_exhaustive()
    }
}

impl PollWaker {
    pub fn wake(&self) {
        self.list.wake();
    }
}

/// How long an OS thread (not a uthread) sleeps between looks in `wait`.
const OS_THREAD_POLL: Duration = Duration::from_micros(20);

impl Poller {
    pub fn new() -> Poller {
        Poller {
            list: Arc::new(ReadyList::new()),
        }
    }

    /// Watches `source` for the readiness in `interest` (its error and
    /// hang-up are always reported, as epoll does). The socket is looked
    /// at by the next wait, as `EPOLL_CTL_ADD` does. Dropping the
    /// registration stops the watching; dropping the socket too.
    pub fn register(
        &self,
        source: &dyn PollSource,
        token: u64,
        interest: Readiness,
        mode: PollMode,
    ) -> io::Result<Registration> {
        let hook = source.poll_hook().0;
        let source = Arc::downgrade(&hook);
        let settings = Settings {
            token,
            interest,
            mode,
        };
        let watch = Watch::new(&self.list, source.clone(), settings);
        hook.waiters().lock().add_watch(&watch);
        watch.notify();
        Ok(Registration { watch, source })
    }

    /// Appends up to `max` events to `events`; returns when at least one is
    /// ready, when `deadline` passes (`Some(Instant::now())` or earlier:
    /// look, never park, as [`Poller::ready`] does), or when a
    /// [`PollWaker`] woke it (then possibly with 0 events).
    /// Level-triggered registrations still ready are reported again by the
    /// next wait; edge-triggered ones after a new notification only;
    /// oneshot ones once, until [`Registration::modify`]. `max` of 0 is
    /// `EINVAL`, as for `epoll_wait`.
    pub fn wait(
        &self,
        events: &mut Vec<PollEvent>,
        max: usize,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        self.wait_as(events, max, Wait::until(deadline))
    }

    /// The events ready now (up to `max`, appended to `events`), as `wait`
    /// with a deadline passed, without reading the clock: an event loop
    /// looks so before each wait.
    pub fn ready(&self, events: &mut Vec<PollEvent>, max: usize) -> io::Result<usize> {
        self.wait_as(events, max, Wait::Once)
    }

    fn wait_as(&self, events: &mut Vec<PollEvent>, max: usize, wait: Wait) -> io::Result<usize> {
        if max == 0 {
            return Err(os_error(
                libc::EINVAL,
                format_args!("Poller::wait: max must be at least 1"),
            ));
        }
        loop {
            let n = self.list.collect(events, max);
            if n > 0 {
                return Ok(n);
            }
            let deadline = match wait {
                Wait::Forever => None,
                Wait::Until(d) if d > Instant::now() => Some(d),
                Wait::Once | Wait::Until(_) => {
                    self.list.take_woken();
                    return Ok(0);
                }
            };
            if self.park(deadline) == ListLook::Woken {
                return Ok(self.list.collect(events, max));
            }
        }
    }

    /// Parks the calling uthread until the list has something, a waker
    /// wakes it, or `deadline`; an OS thread sleeps a little instead.
    fn park(&self, deadline: Option<Instant>) -> ListLook {
        // Deferred from before queueing until after resuming: a preemption
        // in between would put this uthread on a runqueue too.
        let deferred = deferral::Guard::new();
        let Some(me) = sched::current_uthread(&deferred) else {
            drop(deferred);
            let look = self.list.park_unless_ready(None);
            if look == ListLook::Parked {
                std::thread::sleep(OS_THREAD_POLL);
            }
            return look;
        };
        let w = Waiter::new(me);
        let look = self.list.park_unless_ready(Some(Arc::clone(&w)));
        if look != ListLook::Parked {
            return look;
        }
        match deadline {
            None => sched::park_current(&deferred),
            Some(d) => sched::park_current_until(&deferred, &w, d),
        }
        // Off the list however the park ended (a timeout, or a wake-up that
        // was not the list's): a waiter left there would wake this uthread
        // later, wherever it then waits.
        self.list.forget_waiter(&w);
        ListLook::Parked
    }

    /// A handle that makes the current or next `wait` return, from any
    /// thread.
    pub fn waker(&self) -> PollWaker {
        PollWaker {
            list: Arc::clone(&self.list),
        }
    }
}

impl Registration {
    /// New token, interest and mode; re-arms a oneshot registration; the
    /// socket is looked at again by the next wait (as `EPOLL_CTL_MOD`).
    pub fn modify(&self, token: u64, interest: Readiness, mode: PollMode) -> io::Result<()> {
        self.watch.modify(Settings {
            token,
            interest,
            mode,
        });
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.watch.drop_watch();
        if let Some(source) = self.source.upgrade() {
            source.waiters().lock().remove_watch(&self.watch);
        }
    }
}
