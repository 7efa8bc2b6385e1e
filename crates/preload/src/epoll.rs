//! epoll over any mix of Ginza sockets and kernel descriptors.
//!
//! An epoll instance stays the kernel's (its number, `close`, `dup` and
//! the kernel descriptors in it are Linux's own); the library keeps beside
//! it an [`EpollSet`]: a runtime `Poller` holding the Ginza sockets added
//! to it, with their events, data, and level, edge or one-shot mode.
//! `epoll_wait` reports the Ginza sockets that are ready and then the
//! kernel's; when neither is, the program thread parks on the poller while
//! the set's watcher thread watches the kernel instance (`epoll_watch.rs`),
//! so it wakes within microseconds on either kind, and an idle waiter holds
//! no core.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use ginza_runtime::net::{PollEvent, PollMode, Poller, Readiness, Registration};
use libc::{c_int, epoll_event};

use crate::epoll_watch::EpollWatcher;
use crate::gsock::{errno_of, lock, with_source, GSock, Served, Watcher};
use crate::kwatch::KernelWatch;
use crate::mode::{real, serve};
use crate::wait_mask::MaskedWait;

/// What epoll's event bits ask for, as the runtime's interest and mode.
fn interest_of(events: u32) -> (Readiness, PollMode) {
    let has = |bit: c_int| events & bit as u32 != 0;
    (
        Readiness {
            readable: has(libc::EPOLLIN),
            writable: has(libc::EPOLLOUT),
            read_closed: has(libc::EPOLLRDHUP),
            hung_up: false,
            error: false,
        },
        PollMode {
            edge: has(libc::EPOLLET),
            oneshot: has(libc::EPOLLONESHOT),
        },
    )
}

pub(crate) fn epoll_bits(r: Readiness) -> u32 {
    let mut bits = 0;
    for (on, bit) in [
        (r.readable, libc::EPOLLIN),
        (r.writable, libc::EPOLLOUT),
        (r.read_closed, libc::EPOLLRDHUP),
        (r.hung_up, libc::EPOLLHUP),
        (r.error, libc::EPOLLERR),
    ] {
        if on {
            bits |= bit as u32;
        }
    }
    bits
}

struct Member {
    /// The socket it was added as: the number may name another by the
    /// time this one's last number is closed (`Watcher::forget`).
    sock: Weak<GSock>,
    data: u64,
    events: u32,
    /// None until the socket is served (bound and listening, or connected).
    registration: Option<Registration>,
}

pub(crate) struct EpollSet {
    poller: Poller,
    members: Mutex<HashMap<c_int, Member>>,
    /// Kernel descriptors added (a descriptor closed without EPOLL_CTL_DEL
    /// stays counted: the kernel instance is then polled for nothing).
    pub(crate) kernel_members: AtomicUsize,
    /// The kernel half's watcher, from the first wait that parks with
    /// kernel members (`None` inside: none could be started).
    watcher: OnceLock<Option<EpollWatcher>>,
}

impl EpollSet {
    pub(crate) fn new() -> Arc<EpollSet> {
        Arc::new(EpollSet {
            poller: Poller::new(),
            members: Mutex::new(HashMap::new()),
            kernel_members: AtomicUsize::new(0),
            watcher: OnceLock::new(),
        })
    }

    fn register(&self, m: &mut Member, served: &Served) -> Result<(), c_int> {
        let (interest, mode) = interest_of(m.events);
        if let Some(reg) = &m.registration {
            return reg.modify(m.data, interest, mode).map_err(|e| errno_of(&e));
        }
        if let Some(r) = with_source(served, |src| {
            self.poller.register(src, m.data, interest, mode)
        }) {
            m.registration = Some(r.map_err(|e| errno_of(&e))?);
        }
        Ok(())
    }

    /// Whether no Ginza socket is in the set.
    pub(crate) fn has_no_socket(&self) -> bool {
        lock(&self.members).is_empty()
    }

    pub(crate) fn ctl(
        self: &Arc<Self>,
        op: c_int,
        fd: c_int,
        s: &Arc<GSock>,
        ev: *const epoll_event,
    ) -> Result<(), c_int> {
        let event = || {
            if ev.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: the caller's event (checked non-null).
            let e = unsafe { std::ptr::read_unaligned(ev) };
            Ok((e.u64, e.events))
        };
        let mut members = lock(&self.members);
        match op {
            libc::EPOLL_CTL_ADD => {
                let (data, events) = event()?;
                // A member under this number that is another socket is
                // one closed whose last reference is not dropped yet: the
                // new socket takes its place.
                if members
                    .get(&fd)
                    .is_some_and(|m| std::ptr::eq(m.sock.as_ptr(), Arc::as_ptr(s)))
                {
                    return Err(libc::EEXIST);
                }
                let mut m = Member {
                    sock: Arc::downgrade(s),
                    data,
                    events,
                    registration: None,
                };
                self.register(&mut m, &s.served())?;
                let replaced = members.insert(fd, m);
                drop(members);
                drop(replaced);
                let me: Arc<dyn Watcher> = self.clone();
                s.watched_by(Arc::downgrade(&me), fd);
            }
            libc::EPOLL_CTL_MOD => {
                let (data, events) = event()?;
                let m = members.get_mut(&fd).ok_or(libc::ENOENT)?;
                m.data = data;
                m.events = events;
                self.register(m, &s.served())?;
            }
            libc::EPOLL_CTL_DEL => {
                let gone = members.remove(&fd).ok_or(libc::ENOENT)?;
                drop(members);
                drop(gone);
                s.unwatched_by(&**self, fd);
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(())
    }

    /// Ginza events ready now.
    fn ginza_ready(&self, out: &mut [epoll_event]) -> usize {
        let mut events: Vec<PollEvent> = Vec::new();
        let _ = self.poller.ready(&mut events, out.len());
        Self::fill(out, &events)
    }

    /// The first Ginza events by `deadline` (`None`: however long).
    fn ginza_events(&self, out: &mut [epoll_event], deadline: Option<Instant>) -> usize {
        let mut events: Vec<PollEvent> = Vec::new();
        let _ = self.poller.wait(&mut events, out.len(), deadline);
        Self::fill(out, &events)
    }

    fn fill(out: &mut [epoll_event], events: &[PollEvent]) -> usize {
        for (slot, e) in out.iter_mut().zip(events) {
            *slot = epoll_event {
                events: epoll_bits(e.readiness),
                u64: e.token,
            };
        }
        events.len().min(out.len())
    }

    /// `epoll_wait` on this set (`epfd` is its kernel instance), with
    /// `epoll_pwait`'s signal mask if `mask` is not null (`wait_mask.rs`).
    ///
    /// # Safety
    /// `mask` is null or the caller's valid `sigset_t`.
    pub(crate) unsafe fn wait(
        &self,
        epfd: c_int,
        out: &mut [epoll_event],
        timeout: Option<Duration>,
        mask: *const libc::sigset_t,
    ) -> Result<usize, c_int> {
        let kernel_wait =
            real!(epoll_wait: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int) -> c_int);
        // Taken at the first park, not before the first look: a wait that
        // finds events at once (most of a busy event loop's) reads no clock.
        let mut deadline = None;
        let masked = if mask.is_null() {
            MaskedWait::none()
        } else {
            // SAFETY: the caller's contract.
            serve(|| unsafe { MaskedWait::apply(mask, self.poller.waker()) })
        };
        loop {
            let mut n = serve(|| self.ginza_ready(out));
            if n < out.len() && self.kernel_members.load(Relaxed) > 0 && self.kernel_may_be_ready()
            {
                let rest = &mut out[n..];
                // SAFETY: a look at the kernel instance into the caller's array.
                let k = unsafe { kernel_wait(epfd, rest.as_mut_ptr(), rest.len() as c_int, 0) };
                if k < 0 {
                    // SAFETY: the kernel's errno, just set.
                    return Err(unsafe { *libc::__errno_location() });
                }
                n += k as usize;
            }
            if n > 0 || timeout.is_some_and(|t| t.is_zero()) {
                return Ok(n);
            }
            let until = match deadline {
                None => *deadline.insert(timeout.map(|t| Instant::now() + t)),
                Some(until) if until.is_some_and(|d| d <= Instant::now()) => return Ok(0),
                Some(until) => until,
            };
            if masked.interrupted() {
                return Err(libc::EINTR);
            }
            let n = serve(|| {
                let watch = (self.kernel_members.load(Relaxed) > 0)
                    .then(|| self.watch_kernel(epfd, until))
                    .flatten();
                let n = self.ginza_events(out, until);
                drop(watch);
                n
            });
            if n > 0 {
                return Ok(n);
            }
        }
    }
}

impl EpollSet {
    /// Whether the kernel instance may hold events: yes, unless the set's
    /// watcher is armed and has not fired (then an event that comes wakes
    /// the waiter and makes this true). Saves a system call per wait.
    fn kernel_may_be_ready(&self) -> bool {
        match self.watcher.get() {
            Some(Some(w)) => w.fired(),
            _ => true,
        }
    }

    /// Before a park, with the kernel instance `epfd` just found empty:
    /// arms the set's own watcher (started at the first such park), or,
    /// without one, starts a watch for this wait alone (returned, to be
    /// dropped when the wait ends).
    fn watch_kernel(&self, epfd: c_int, deadline: Option<Instant>) -> Option<KernelWatch> {
        let watcher = self
            .watcher
            .get_or_init(|| EpollWatcher::start(epfd, self.poller.waker()));
        if let Some(w) = watcher {
            w.arm();
            return None;
        }
        let fd = libc::pollfd {
            fd: epfd,
            events: libc::POLLIN,
            revents: 0,
        };
        Some(crate::kwatch::start(
            vec![fd],
            deadline,
            self.poller.waker(),
        ))
    }
}

impl Watcher for EpollSet {
    /// `fd`'s socket is now served: watch the runtime's object.
    fn attach(&self, fd: c_int, s: &GSock) {
        let served = s.served();
        if let Some(m) = lock(&self.members).get_mut(&fd) {
            m.registration = None;
            let _ = self.register(m, &served);
        }
    }

    /// `fd`'s socket `s` closed: out of the set, as Linux does. Only if
    /// `fd` is still `s` there: its number is free once closed, and may
    /// already name a socket another thread accepted and added.
    fn forget(&self, fd: c_int, s: &GSock) {
        let mut members = lock(&self.members);
        let gone = match members.get(&fd) {
            Some(m) if std::ptr::eq(m.sock.as_ptr(), s) => members.remove(&fd),
            _ => None,
        };
        drop(members);
        drop(gone);
    }
}
