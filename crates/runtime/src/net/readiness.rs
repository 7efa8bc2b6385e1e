//! How a socket's changes reach the pollers watching it (docs/runtime.md,
//! "Readiness and the Poller"): an epoll-like ready list, never a scan of
//! every registration.
//!
//! * [`SocketWaiters`]: a socket's wait queue, the uthreads blocked on it
//!   and the registrations ([`Watch`]) of the pollers watching it. Every
//!   change that wakes the uthreads ([`SocketWaiters::wake_all`], called by
//!   the wakers in `wait.rs`) also notifies the watches.
//! * [`Watch`]: one registration. A notification puts it on its poller's
//!   [`ReadyList`] once (a flag says it is there already) and wakes the
//!   poller's waiting uthread.
//! * [`ReadyList`]: a poller's list of notified watches; `collect` pops
//!   them, asks each socket for its readiness now, reports what the
//!   interest allows, and puts level-triggered ones still ready back.
//!
//! A watch is taken off the list (its flag cleared) before its socket is
//! looked at, so a change after the look notifies it again: no lost
//! wake-up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Weak};

use crate::sched::Waiter;
use crate::spinlock::SpinLock;

/// What a socket is ready for, as epoll reports it (the level state, now).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Bytes or a datagram to read, a connection to accept, the peer's FIN
    /// (read gives 0), or an error pending (EPOLLIN).
    pub readable: bool,
    /// Established (or the connect finished, success or failure) and room
    /// to send; UDP: always (EPOLLOUT).
    pub writable: bool,
    /// The peer sent FIN, or reading was shut down (EPOLLRDHUP).
    pub read_closed: bool,
    /// Both directions closed, or reset (EPOLLHUP).
    pub hung_up: bool,
    /// An error is pending: `take_error` would return it (EPOLLERR).
    pub error: bool,
}

impl Readiness {
    /// Interest in reading (EPOLLIN).
    pub const READABLE: Readiness = Readiness {
        readable: true,
        writable: false,
        read_closed: false,
        hung_up: false,
        error: false,
    };
    /// Interest in writing (EPOLLOUT).
    pub const WRITABLE: Readiness = Readiness {
        readable: false,
        writable: true,
        read_closed: false,
        hung_up: false,
        error: false,
    };

    /// Nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == Readiness::default()
    }

    /// Both sets' members.
    pub fn union(self, o: Readiness) -> Readiness {
        Readiness {
            readable: self.readable || o.readable,
            writable: self.writable || o.writable,
            read_closed: self.read_closed || o.read_closed,
            hung_up: self.hung_up || o.hung_up,
            error: self.error || o.error,
        }
    }

    /// What a registration with `interest` reports of `self`: its error
    /// and hang-up always, as epoll does.
    pub fn reported(self, interest: Readiness) -> Readiness {
        Readiness {
            readable: self.readable && interest.readable,
            writable: self.writable && interest.writable,
            read_closed: self.read_closed && interest.read_closed,
            hung_up: self.hung_up,
            error: self.error,
        }
    }
}

/// How a registration reports (epoll's EPOLLET and EPOLLONESHOT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollMode {
    /// Edge-triggered: reported after a new notification only (level:
    /// again at every wait while still ready).
    pub edge: bool,
    /// Reported once, then not until `Registration::modify` re-arms it.
    pub oneshot: bool,
}

/// One event a `Poller::wait` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollEvent {
    pub token: u64,
    pub readiness: Readiness,
}

/// A socket a poller can watch: its readiness now, and its wait queue.
pub(crate) trait Watched: Send + Sync {
    fn readiness(&self) -> Readiness;
    fn waiters(&self) -> &SpinLock<SocketWaiters>;
}

/// A socket's wait queue: uthreads blocked on it (woken, and dropped from
/// the queue, on every change) and the watches of pollers (notified on
/// every change, kept until their registration goes).
#[derive(Default)]
pub(crate) struct SocketWaiters {
    pub(crate) uthreads: VecDeque<Arc<Waiter>>,
    watches: Vec<Weak<Watch>>,
}

impl SocketWaiters {
    pub(crate) fn new() -> SocketWaiters {
        SocketWaiters::default()
    }

    /// Takes every blocked uthread and every live watch, to be woken and
    /// notified ([`Woken::run`]) once the queue's lock is released.
    pub(crate) fn take_all(&mut self) -> Woken {
        Woken {
            uthreads: std::mem::take(&mut self.uthreads),
            watches: self.live_watches(),
        }
    }

    /// The live watches (dropping the entries of registrations gone), to
    /// be notified once the queue's lock is released.
    pub(crate) fn live_watches(&mut self) -> Vec<Arc<Watch>> {
        if self.watches.is_empty() {
            return Vec::new();
        }
        let mut live = Vec::with_capacity(self.watches.len());
        self.watches.retain(|w| match w.upgrade() {
            Some(w) => {
                live.push(w);
                true
            }
            None => false,
        });
        live
    }

    pub(crate) fn add_watch(&mut self, w: &Arc<Watch>) {
        self.watches.push(Arc::downgrade(w));
    }

    pub(crate) fn remove_watch(&mut self, w: &Arc<Watch>) {
        let me = Arc::as_ptr(w);
        self.watches
            .retain(|x| x.strong_count() > 0 && !std::ptr::eq(x.as_ptr(), me));
    }
}

/// What a wake-up takes off a queue: uthreads to wake, watches to notify.
#[must_use]
pub(crate) struct Woken {
    pub(crate) uthreads: VecDeque<Arc<Waiter>>,
    pub(crate) watches: Vec<Arc<Watch>>,
}

impl Woken {
    /// The watches first: a poller's uthread woken by them may run at once.
    pub(crate) fn run(self) {
        for w in self.watches {
            w.notify();
        }
        for u in self.uthreads {
            u.wake();
        }
    }
}

/// What a registration asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) token: u64,
    pub(crate) interest: Readiness,
    pub(crate) mode: PollMode,
}

/// One registration of a socket with a poller.
pub(crate) struct Watch {
    list: Weak<ReadyList>,
    source: Weak<dyn Watched>,
    settings: SpinLock<Settings>,
    /// On the ready list (or being put there).
    queued: AtomicBool,
    /// Oneshot: false once reported, until re-armed.
    armed: AtomicBool,
    /// Its registration was dropped.
    dropped: AtomicBool,
}

impl Watch {
    pub(crate) fn new(
        list: &Arc<ReadyList>,
        source: Weak<dyn Watched>,
        settings: Settings,
    ) -> Arc<Watch> {
        Arc::new(Watch {
            list: Arc::downgrade(list),
            source,
            settings: SpinLock::new(settings),
            queued: AtomicBool::new(false),
            armed: AtomicBool::new(true),
            dropped: AtomicBool::new(false),
        })
    }

    pub(crate) fn source(&self) -> Option<Arc<dyn Watched>> {
        self.source.upgrade()
    }

    /// Something changed on the socket: puts the watch on its poller's
    /// ready list unless it is there already (or disarmed, or dropped).
    pub(crate) fn notify(self: &Arc<Self>) {
        if self.dropped.load(SeqCst) || !self.armed.load(SeqCst) {
            return;
        }
        self.enqueue();
    }

    fn enqueue(self: &Arc<Self>) {
        if self.queued.swap(true, SeqCst) {
            return;
        }
        match self.list.upgrade() {
            Some(list) => list.push(Arc::clone(self)),
            None => self.queued.store(false, SeqCst),
        }
    }

    /// New settings (re-arming a oneshot); the socket is looked at again
    /// at the next wait, as `EPOLL_CTL_MOD` does.
    pub(crate) fn modify(self: &Arc<Self>, settings: Settings) {
        *self.settings.lock() = settings;
        self.armed.store(true, SeqCst);
        self.enqueue();
    }

    /// Its registration goes: never reported again.
    pub(crate) fn drop_watch(&self) {
        self.dropped.store(true, SeqCst);
    }
}

/// What a waiter found on a ready list before parking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListLook {
    /// Watches to look at.
    Ready,
    /// A `PollWaker` woke the poller: the wait returns.
    Woken,
    /// Nothing: the waiter was queued (a uthread parks, an OS thread sleeps
    /// a little).
    Parked,
}

struct ListState {
    ready: VecDeque<Arc<Watch>>,
    /// Uthreads parked in `wait` (woken by a push or a wake).
    waiters: Vec<Arc<Waiter>>,
    /// A `PollWaker` woke the list since the last wait returned.
    woken: bool,
}

/// A poller's ready list.
pub(crate) struct ReadyList {
    state: SpinLock<ListState>,
}

impl ReadyList {
    pub(crate) fn new() -> ReadyList {
        ReadyList {
            state: SpinLock::new(ListState {
                ready: VecDeque::new(),
                waiters: Vec::new(),
                woken: false,
            }),
        }
    }

    fn push(&self, w: Arc<Watch>) {
        let waiters = {
            let mut st = self.state.lock();
            st.ready.push_back(w);
            std::mem::take(&mut st.waiters)
        };
        for w in waiters {
            w.wake();
        }
    }

    /// A `PollWaker`: the current or next wait returns.
    pub(crate) fn wake(&self) {
        let waiters = {
            let mut st = self.state.lock();
            st.woken = true;
            std::mem::take(&mut st.waiters)
        };
        for w in waiters {
            w.wake();
        }
    }

    /// Under the list's lock: whether a wait has watches to look at, or a
    /// wake-up (which it consumes); else queues `park` to be woken.
    pub(crate) fn park_unless_ready(&self, park: Option<Arc<Waiter>>) -> ListLook {
        let mut st = self.state.lock();
        if !st.ready.is_empty() {
            return ListLook::Ready;
        }
        if std::mem::take(&mut st.woken) {
            return ListLook::Woken;
        }
        if let Some(w) = park {
            st.waiters.push(w);
        }
        ListLook::Parked
    }

    /// Whether a wake-up came (consumed).
    pub(crate) fn take_woken(&self) -> bool {
        std::mem::take(&mut self.state.lock().woken)
    }

    pub(crate) fn forget_waiter(&self, w: &Arc<Waiter>) {
        self.state.lock().waiters.retain(|x| !Arc::ptr_eq(x, w));
    }

    /// Appends up to `max` events of the watches on the list; the number
    /// appended. Each watch on the list now is looked at once at most.
    pub(crate) fn collect(&self, events: &mut Vec<PollEvent>, max: usize) -> usize {
        let mut n = 0;
        let mut budget = self.state.lock().ready.len();
        let mut again = Vec::new();
        while n < max && budget > 0 {
            budget -= 1;
            let Some(w) = self.state.lock().ready.pop_front() else {
                break;
            };
            // Off the list before the look: a change after it notifies again.
            w.queued.store(false, SeqCst);
            if w.dropped.load(SeqCst) || !w.armed.load(SeqCst) {
                continue;
            }
            let Some(source) = w.source() else { continue };
            let now = source.readiness();
            let s = *w.settings.lock();
            let r = now.reported(s.interest);
            if r.is_empty() {
                continue;
            }
            if s.mode.oneshot {
                w.armed.store(false, SeqCst);
            }
            events.push(PollEvent {
                token: s.token,
                readiness: r,
            });
            n += 1;
            if !s.mode.edge && !s.mode.oneshot {
                again.push(w);
            }
        }
        for w in again {
            w.enqueue();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

    /// A socket whose readiness the test sets.
    struct Fake {
        bits: AtomicU8,
        waiters: SpinLock<SocketWaiters>,
    }

    impl Fake {
        fn set(&self, readable: bool, writable: bool) {
            self.bits
                .store(u8::from(readable) | u8::from(writable) << 1, Relaxed);
            let woken = self.waiters.lock().take_all();
            assert!(woken.uthreads.is_empty());
            woken.run();
        }
    }

    impl Watched for Fake {
        fn readiness(&self) -> Readiness {
            let b = self.bits.load(Relaxed);
            Readiness {
                readable: b & 1 != 0,
                writable: b & 2 != 0,
                ..Readiness::default()
            }
        }
        fn waiters(&self) -> &SpinLock<SocketWaiters> {
            &self.waiters
        }
    }

    fn watch(list: &Arc<ReadyList>, fake: &Arc<Fake>, mode: PollMode) -> Arc<Watch> {
        let src: Arc<dyn Watched> = fake.clone();
        let w = Watch::new(
            list,
            Arc::downgrade(&src),
            Settings {
                token: 7,
                interest: Readiness::READABLE,
                mode,
            },
        );
        fake.waiters.lock().add_watch(&w);
        w.notify();
        w
    }

    fn fake() -> Arc<Fake> {
        Arc::new(Fake {
            bits: AtomicU8::new(0),
            waiters: SpinLock::new(SocketWaiters::new()),
        })
    }

    fn collect(list: &ReadyList) -> Vec<PollEvent> {
        let mut ev = Vec::new();
        list.collect(&mut ev, 64);
        ev
    }

    #[test]
    fn level_reports_while_ready_edge_once_per_change_oneshot_until_modified() {
        let list = Arc::new(ReadyList::new());
        let (l, e, o) = (fake(), fake(), fake());
        let _wl = watch(&list, &l, PollMode::default());
        let _we = watch(
            &list,
            &e,
            PollMode {
                edge: true,
                oneshot: false,
            },
        );
        let wo = watch(
            &list,
            &o,
            PollMode {
                edge: false,
                oneshot: true,
            },
        );
        assert!(collect(&list).is_empty(), "nothing ready yet");
        for f in [&l, &e, &o] {
            f.set(true, true);
        }
        assert_eq!(collect(&list).len(), 3);
        assert_eq!(collect(&list).len(), 1, "only the level one again");
        assert_eq!(collect(&list).len(), 1);
        e.set(true, true);
        o.set(true, true);
        assert_eq!(collect(&list).len(), 2, "the edge one after a change");
        wo.modify(Settings {
            token: 9,
            interest: Readiness::READABLE,
            mode: PollMode {
                edge: false,
                oneshot: true,
            },
        });
        let ev = collect(&list);
        assert_eq!(ev.len(), 2);
        assert!(ev.iter().any(|e| e.token == 9));
        l.set(false, true);
        assert!(collect(&list).is_empty(), "writable is not of interest");
    }

    #[test]
    fn a_dropped_watch_is_not_reported_and_leaves_the_queue() {
        let list = Arc::new(ReadyList::new());
        let f = fake();
        let w = watch(&list, &f, PollMode::default());
        f.set(true, false);
        w.drop_watch();
        f.waiters.lock().remove_watch(&w);
        drop(w);
        assert!(collect(&list).is_empty());
        assert!(f.waiters.lock().watches.is_empty());
    }
}
