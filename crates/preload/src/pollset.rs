//! `poll`, `ppoll`, `select` and `pselect` over any mix of Ginza sockets
//! and kernel descriptors. Without a Ginza socket among them the call is
//! the kernel's (`blocking.rs`). With one, the Ginza sockets' readiness is
//! read from the runtime and the kernel descriptors are polled without
//! waiting; when nothing is ready the program thread parks on a `Poller`
//! of the call's own while a pool thread polls the kernel descriptors
//! (`kwatch.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_runtime::net::{PollMode, Poller, Readiness};
use libc::{c_int, pollfd};

use crate::fdtable;
use crate::gsock::{with_source, GSock, Kind};
use crate::mode::{caller, real, serve, set_errno, Caller};
use crate::wait_mask::MaskedWait;

/// A Ginza socket's readiness now. One not served yet is what Linux says
/// of a fresh socket: a stream hung up and writable, a datagram writable.
pub(crate) fn readiness_of(s: &GSock) -> Readiness {
    let served = s.served();
    with_source(&served, |src| src.readiness()).unwrap_or(Readiness {
        writable: true,
        hung_up: s.kind == Kind::Stream,
        ..Readiness::default()
    })
}

fn poll_bits(r: Readiness, asked: i16) -> i16 {
    let mut bits = 0;
    for (on, bit) in [
        (r.readable, libc::POLLIN),
        (r.writable, libc::POLLOUT),
        (r.read_closed, libc::POLLRDHUP),
    ] {
        if on && asked & bit != 0 {
            bits |= bit;
        }
    }
    // Always reported, as Linux does.
    if r.hung_up {
        bits |= libc::POLLHUP;
    }
    if r.error {
        bits |= libc::POLLERR;
    }
    bits
}

/// The Ginza sockets among `fds`, by index.
fn ginza_of(fds: &[pollfd]) -> Vec<(usize, Arc<GSock>)> {
    fds.iter()
        .enumerate()
        .filter_map(|(i, p)| fdtable::socket(p.fd).map(|s| (i, s)))
        .collect()
}

/// Fills every `revents` without waiting; how many are non-zero, or errno.
fn look(
    fds: &mut [pollfd],
    ginza: &[(usize, Arc<GSock>)],
    kernel: &mut [pollfd],
) -> Result<usize, c_int> {
    let poll = real!(poll: unsafe extern "C" fn(*mut pollfd, libc::nfds_t, c_int) -> c_int);
    if !kernel.is_empty() {
        // SAFETY: a poll of our own copy, not waiting.
        if unsafe { poll(kernel.as_mut_ptr(), kernel.len() as libc::nfds_t, 0) } < 0 {
            // SAFETY: the kernel's errno, just set.
            return Err(unsafe { *libc::__errno_location() });
        }
    }
    let mut k = kernel.iter();
    let mut g = ginza.iter().peekable();
    let mut ready = 0;
    for (i, p) in fds.iter_mut().enumerate() {
        p.revents = match g.peek() {
            Some((at, s)) if *at == i => {
                g.next();
                serve(|| poll_bits(readiness_of(s), p.events))
            }
            // Negative numbers are skipped, as the kernel does.
            _ if p.fd < 0 => 0,
            _ => k.next().map_or(0, |kp| kp.revents),
        };
        ready += usize::from(p.revents != 0);
    }
    Ok(ready)
}

/// Polls `fds`, some of them Ginza sockets, until one is ready or
/// `timeout` passes.
///
/// # Safety
/// `mask` is null or the caller's valid `sigset_t`.
unsafe fn poll_mixed(
    fds: &mut [pollfd],
    ginza: &[(usize, Arc<GSock>)],
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
) -> Result<usize, c_int> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let poller = serve(Poller::new);
    let masked = if mask.is_null() {
        MaskedWait::none()
    } else {
        // SAFETY: the caller's contract.
        serve(|| unsafe { MaskedWait::apply(mask, poller.waker()) })
    };
    let mut kernel: Vec<pollfd> = fds
        .iter()
        .enumerate()
        .filter(|(i, p)| p.fd >= 0 && !ginza.iter().any(|(at, _)| at == i))
        .map(|(_, p)| *p)
        .collect();
    let r = wait_mixed(fds, ginza, &mut kernel, deadline, &poller, &masked);
    // Runtime objects: dropped as runtime code.
    serve(|| drop((masked, poller)));
    r
}

/// `poll_mixed`'s looks, and waits between them on `poller`.
fn wait_mixed(
    fds: &mut [pollfd],
    ginza: &[(usize, Arc<GSock>)],
    kernel: &mut [pollfd],
    deadline: Option<Instant>,
    poller: &Poller,
    masked: &MaskedWait,
) -> Result<usize, c_int> {
    loop {
        let ready = look(fds, ginza, kernel)?;
        if ready > 0 || deadline.is_some_and(|d| d <= Instant::now()) {
            return Ok(ready);
        }
        if masked.interrupted() {
            return Err(libc::EINTR);
        }
        serve(|| {
            let registrations: Vec<_> = ginza
                .iter()
                .filter_map(|(i, s)| {
                    let asked = fds[*i].events;
                    let interest = Readiness {
                        readable: asked & libc::POLLIN != 0,
                        writable: asked & libc::POLLOUT != 0,
                        read_closed: asked & libc::POLLRDHUP != 0,
                        ..Readiness::default()
                    };
                    let served = s.served();
                    with_source(&served, |src| {
                        poller.register(src, *i as u64, interest, PollMode::default())
                    })
                    .and_then(Result::ok)
                })
                .collect();
            let watch = (!kernel.is_empty())
                .then(|| crate::kwatch::start(kernel.to_vec(), deadline, poller.waker()));
            let mut events = Vec::new();
            let _ = poller.wait(&mut events, 1, deadline);
            drop(watch);
            drop(registrations);
        });
    }
}

fn ms_timeout(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

fn ts_timeout(t: *const libc::timespec) -> Option<Duration> {
    // SAFETY: the caller's timespec, if any.
    (!t.is_null()).then(|| unsafe {
        Duration::new(
            (*t).tv_sec.max(0) as u64,
            (*t).tv_nsec.clamp(0, 999_999_999) as u32,
        )
    })
}

/// Serves a poll over `fds` if any is a Ginza socket.
///
/// # Safety
/// `fds` points to `n` pollfds (the caller's contract); `mask` is null or
/// a valid `sigset_t`, applied while waiting (`ppoll`).
unsafe fn poll_ours(
    fds: *mut pollfd,
    n: libc::nfds_t,
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
) -> Option<c_int> {
    if caller() == Caller::Runtime || fds.is_null() || n == 0 {
        return None;
    }
    // SAFETY: the caller's contract.
    let fds = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    let ginza = ginza_of(fds);
    if ginza.is_empty() {
        return None;
    }
    // SAFETY: the caller's mask, or null.
    Some(match unsafe { poll_mixed(fds, &ginza, timeout, mask) } {
        Ok(n) => n as c_int,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's array.
    if let Some(r) = unsafe { poll_ours(fds, n, ms_timeout(timeout), std::ptr::null()) } {
        return r;
    }
    // SAFETY: the kernel's call (on the blocking pool if it waits).
    unsafe { crate::blocking::poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's array.
    if let Some(r) = unsafe { poll_ours(fds, n, ts_timeout(timeout), mask) } {
        return r;
    }
    let f = real!(ppoll: unsafe extern "C" fn(*mut pollfd, libc::nfds_t, *const libc::timespec, *const libc::sigset_t) -> c_int);
    // SAFETY: glibc's call with the caller's arguments.
    unsafe { f(fds, n, timeout, mask) }
}

/// `select`'s sets as pollfds, if any descriptor in them is a Ginza socket.
///
/// # Safety
/// Each set is null or the caller's valid fd_set; `mask` is null or a
/// valid `sigset_t`, applied while waiting (`pselect`).
unsafe fn select_ours(
    n: c_int,
    sets: [*mut libc::fd_set; 3],
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
) -> Option<c_int> {
    if caller() == Caller::Runtime {
        return None;
    }
    // SAFETY: the caller's sets.
    let is_in = |set: *mut libc::fd_set, fd| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
    let mut fds = Vec::new();
    for fd in 0..n.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut events = 0;
        for (set, bit) in sets
            .iter()
            .zip([libc::POLLIN, libc::POLLOUT, libc::POLLPRI])
        {
            if is_in(*set, fd) {
                events |= bit;
            }
        }
        if events != 0 {
            fds.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let ginza = ginza_of(&fds);
    if ginza.is_empty() {
        return None;
    }
    // SAFETY: the caller's mask, or null.
    let ready = match unsafe { poll_mixed(&mut fds, &ginza, timeout, mask) } {
        Ok(_) => fds,
        Err(e) => {
            set_errno(e);
            return Some(-1);
        }
    };
    let mut count = 0;
    for set in sets.iter().filter(|s| !s.is_null()) {
        // SAFETY: the caller's set.
        unsafe { libc::FD_ZERO(*set) };
    }
    for p in &ready {
        let answers = [
            p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0,
            p.revents & (libc::POLLOUT | libc::POLLERR) != 0,
            p.revents & libc::POLLPRI != 0,
        ];
        for ((set, asked), yes) in sets
            .iter()
            .zip([libc::POLLIN, libc::POLLOUT, libc::POLLPRI])
            .zip(answers)
        {
            if yes && p.events & asked != 0 && !set.is_null() {
                // SAFETY: the caller's set.
                unsafe { libc::FD_SET(p.fd, *set) };
                count += 1;
            }
        }
    }
    Some(count)
}

#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's timeout, if any.
    let limit = (!timeout.is_null()).then(|| unsafe {
        Duration::new(
            (*timeout).tv_sec.max(0) as u64,
            ((*timeout).tv_usec.clamp(0, 999_999) as u32) * 1000,
        )
    });
    // SAFETY: the caller's sets.
    if let Some(c) = unsafe { select_ours(n, [r, w, e], limit, std::ptr::null()) } {
        return c;
    }
    // SAFETY: the kernel's call (on the blocking pool if it waits).
    unsafe { crate::blocking::select(n, r, w, e, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's sets.
    if let Some(c) = unsafe { select_ours(n, [r, w, e], ts_timeout(timeout), mask) } {
        return c;
    }
    let f = real!(pselect: unsafe extern "C" fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *const libc::timespec, *const libc::sigset_t) -> c_int);
    // SAFETY: glibc's call with the caller's arguments.
    unsafe { f(n, r, w, e, timeout, mask) }
}
