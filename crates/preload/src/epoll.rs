//! epoll over any mix of Ginza sockets and kernel descriptors.
//!
//! An epoll instance stays the kernel's (its number, `close`, `dup` and
//! the kernel descriptors in it are Linux's own); the library keeps beside
//! it an [`EpollSet`]: a runtime `Poller` holding the Ginza sockets added
//! to it, with their events, data, and level, edge or one-shot mode.
//! `epoll_wait` reports the Ginza sockets that are ready and then the
//! kernel's; when neither is, the program thread parks on the poller while
//! a pool thread watches the kernel instance (`kwatch.rs`), so it wakes
//! within microseconds on either kind, and an idle waiter holds no core.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ginza_runtime::net::{PollEvent, PollMode, PollSource, Poller, Readiness, Registration};
use libc::{c_int, epoll_event};

use crate::fdtable::{self, Entry};
use crate::mode::{caller, real, serve, set_errno, Caller};
use crate::socket::{lock, GSock, Served};

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

/// The runtime object a Ginza socket is served by, as a poll source.
pub(crate) fn with_source<R>(served: &Served, f: impl FnOnce(&dyn PollSource) -> R) -> Option<R> {
    match served {
        Served::Listener(l) => Some(f(&**l)),
        Served::Stream(t) => Some(f(&**t)),
        Served::Udp(u) => Some(f(&**u)),
        Served::None => None,
    }
}

struct Member {
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
    kernel_members: AtomicUsize,
}

impl EpollSet {
    fn new() -> Arc<EpollSet> {
        Arc::new(EpollSet {
            poller: Poller::new(),
            members: Mutex::new(HashMap::new()),
            kernel_members: AtomicUsize::new(0),
        })
    }

    fn register(&self, m: &mut Member, served: &Served) -> Result<(), c_int> {
        let (interest, mode) = interest_of(m.events);
        if let Some(reg) = &m.registration {
            return reg
                .modify(m.data, interest, mode)
                .map_err(|e| crate::socket::errno_of(&e));
        }
        if let Some(r) = with_source(served, |src| {
            self.poller.register(src, m.data, interest, mode)
        }) {
            m.registration = Some(r.map_err(|e| crate::socket::errno_of(&e))?);
        }
        Ok(())
    }

    /// `fd`'s socket is now served: watch the runtime's object.
    pub(crate) fn attach(&self, fd: c_int, s: &GSock) {
        let served = s.served();
        if let Some(m) = lock(&self.members).get_mut(&fd) {
            m.registration = None;
            let _ = self.register(m, &served);
        }
    }

    /// `fd`'s socket closed: out of the set, as Linux does.
    pub(crate) fn forget(&self, fd: c_int) {
        let gone = lock(&self.members).remove(&fd);
        drop(gone);
    }

    fn ctl(
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
                if members.contains_key(&fd) {
                    return Err(libc::EEXIST);
                }
                let mut m = Member {
                    data,
                    events,
                    registration: None,
                };
                self.register(&mut m, &s.served())?;
                members.insert(fd, m);
                drop(members);
                s.watched_by(self, fd);
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
                s.unwatched_by(self, fd);
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(())
    }

    /// Ginza events ready now or, with `deadline`, the first by then.
    fn ginza_events(&self, out: &mut [epoll_event], deadline: Option<Instant>) -> usize {
        let mut events: Vec<PollEvent> = Vec::new();
        let _ = self.poller.wait(&mut events, out.len(), deadline);
        for (slot, e) in out.iter_mut().zip(&events) {
            *slot = epoll_event {
                events: epoll_bits(e.readiness),
                u64: e.token,
            };
        }
        events.len().min(out.len())
    }

    /// `epoll_wait` on this set (`epfd` is its kernel instance).
    fn wait(
        &self,
        epfd: c_int,
        out: &mut [epoll_event],
        timeout: Option<Duration>,
    ) -> Result<usize, c_int> {
        let kernel_wait =
            real!(epoll_wait: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int) -> c_int);
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let mut n = serve(|| self.ginza_events(out, Some(Instant::now())));
            if n < out.len() && self.kernel_members.load(Relaxed) > 0 {
                let rest = &mut out[n..];
                // SAFETY: a look at the kernel instance into the caller's array.
                let k = unsafe { kernel_wait(epfd, rest.as_mut_ptr(), rest.len() as c_int, 0) };
                if k < 0 {
                    // SAFETY: the kernel's errno, just set.
                    return Err(unsafe { *libc::__errno_location() });
                }
                n += k as usize;
            }
            if n > 0 || deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(n);
            }
            let n = serve(|| {
                let watch = (self.kernel_members.load(Relaxed) > 0).then(|| {
                    let fd = libc::pollfd {
                        fd: epfd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    crate::kwatch::start(vec![fd], deadline, self.poller.waker())
                });
                let n = self.ginza_events(out, deadline);
                drop(watch);
                n
            });
            if n > 0 {
                return Ok(n);
            }
        }
    }
}

/// A new epoll instance gets its set when the program may have Ginza
/// sockets.
fn created(fd: c_int) -> c_int {
    if fd >= 0 && caller() != Caller::Runtime && crate::config::network().is_some() {
        let set = serve(EpollSet::new);
        drop(fdtable::insert(fd, Entry::Epoll(set)));
    }
    fd
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    let f = real!(epoll_create: unsafe extern "C" fn(c_int) -> c_int);
    // SAFETY: glibc's call.
    created(unsafe { f(size) })
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    let f = real!(epoll_create1: unsafe extern "C" fn(c_int) -> c_int);
    // SAFETY: glibc's call.
    created(unsafe { f(flags) })
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    let f = real!(epoll_ctl: unsafe extern "C" fn(c_int, c_int, c_int, *mut epoll_event) -> c_int);
    let set = fdtable::epoll(epfd);
    let sock = if caller() == Caller::Runtime {
        None
    } else {
        fdtable::socket(fd)
    };
    let (Some(set), Some(sock)) = (set.clone(), sock) else {
        if sock_without_set(fd, epfd) {
            crate::say::unsupported_once!(
                "epoll_ctl",
                "a Ginza socket added to an epoll instance made before the program's main: EINVAL"
            );
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: glibc's call with the caller's arguments.
        let r = unsafe { f(epfd, op, fd, ev) };
        if r == 0 {
            if let Some(set) = set {
                match op {
                    libc::EPOLL_CTL_ADD => set.kernel_members.fetch_add(1, Relaxed),
                    libc::EPOLL_CTL_DEL => set.kernel_members.fetch_sub(1, Relaxed),
                    _ => 0,
                };
            }
        }
        return r;
    };
    match serve(|| set.ctl(op, fd, &sock, ev)) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// A Ginza socket and an epoll number with no set of ours.
fn sock_without_set(fd: c_int, epfd: c_int) -> bool {
    caller() != Caller::Runtime && fdtable::socket(fd).is_some() && fdtable::epoll(epfd).is_none()
}

fn timeout_of_ms(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// `epoll_wait` on a set of ours; None when `epfd` has no Ginza member (the
/// kernel's call then serves it).
fn wait_on(
    epfd: c_int,
    events: *mut epoll_event,
    most: c_int,
    timeout: Option<Duration>,
) -> Option<c_int> {
    if caller() == Caller::Runtime {
        return None;
    }
    let set = fdtable::epoll(epfd)?;
    if lock(&set.members).is_empty() {
        return None;
    }
    if most <= 0 || events.is_null() {
        set_errno(libc::EINVAL);
        return Some(-1);
    }
    // SAFETY: the caller's array of `most` events.
    let out = unsafe { std::slice::from_raw_parts_mut(events, most as usize) };
    Some(match set.wait(epfd, out, timeout) {
        Ok(n) => n as c_int,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    most: c_int,
    timeout: c_int,
) -> c_int {
    if let Some(r) = wait_on(epfd, events, most, timeout_of_ms(timeout)) {
        return r;
    }
    // SAFETY: the kernel's call (on the blocking pool if it waits).
    unsafe { crate::blocking::epoll_wait(epfd, events, most, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut epoll_event,
    most: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if mask.is_null() {
        // SAFETY: the same call.
        return unsafe { epoll_wait(epfd, events, most, timeout) };
    }
    if fdtable::epoll(epfd).is_some() {
        crate::say::unsupported_once!(
            "epoll_pwait",
            "the signal mask is not applied while waiting on Ginza sockets"
        );
        if let Some(r) = wait_on(epfd, events, most, timeout_of_ms(timeout)) {
            return r;
        }
    }
    let f = real!(epoll_pwait: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int);
    // SAFETY: glibc's call with the caller's arguments.
    unsafe { f(epfd, events, most, timeout, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut epoll_event,
    most: c_int,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's timeout, if any.
    let t = (!timeout.is_null()).then(|| unsafe { *timeout });
    let limit = t.map(|t| {
        Duration::new(
            t.tv_sec.max(0) as u64,
            t.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    });
    if fdtable::epoll(epfd).is_some() {
        if !mask.is_null() {
            crate::say::unsupported_once!(
                "epoll_pwait2",
                "the signal mask is not applied while waiting on Ginza sockets"
            );
        }
        if let Some(r) = wait_on(epfd, events, most, limit) {
            return r;
        }
    }
    let f = real!(epoll_pwait2: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, *const libc::timespec, *const libc::sigset_t) -> c_int);
    // SAFETY: glibc's call with the caller's arguments.
    unsafe { f(epfd, events, most, timeout, mask) }
}
