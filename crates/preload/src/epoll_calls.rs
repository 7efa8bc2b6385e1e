//! The epoll calls (`epoll_create*`, `epoll_ctl`, `epoll_wait`,
//! `epoll_pwait`, `epoll_pwait2`): an epoll number with Ginza sockets in it
//! is served by its `EpollSet` (`epoll.rs`), any other by the kernel.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use libc::{c_int, epoll_event};

use crate::epoll::EpollSet;
use crate::fdtable::{self, Entry};
use crate::mode::{caller, real, serve, set_errno, Caller};

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
///
/// # Safety
/// `mask` is null or the caller's valid `sigset_t`.
unsafe fn wait_on(
    epfd: c_int,
    events: *mut epoll_event,
    most: c_int,
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
) -> Option<c_int> {
    if caller() == Caller::Runtime {
        return None;
    }
    let set = fdtable::epoll(epfd)?;
    if set.has_no_socket() {
        return None;
    }
    if most <= 0 || events.is_null() {
        set_errno(libc::EINVAL);
        return Some(-1);
    }
    // SAFETY: the caller's array of `most` events.
    let out = unsafe { std::slice::from_raw_parts_mut(events, most as usize) };
    // SAFETY: the caller's contract.
    Some(match unsafe { set.wait(epfd, out, timeout, mask) } {
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
    let no_mask = std::ptr::null();
    // SAFETY: no mask.
    if let Some(r) = unsafe { wait_on(epfd, events, most, timeout_of_ms(timeout), no_mask) } {
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
    // SAFETY: the caller's mask (checked non-null).
    if let Some(r) = unsafe { wait_on(epfd, events, most, timeout_of_ms(timeout), mask) } {
        return r;
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
    // SAFETY: the caller's mask, or null.
    if let Some(r) = unsafe { wait_on(epfd, events, most, limit, mask) } {
        return r;
    }
    let f = real!(epoll_pwait2: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, *const libc::timespec, *const libc::sigset_t) -> c_int);
    // SAFETY: glibc's call with the caller's arguments.
    unsafe { f(epfd, events, most, timeout, mask) }
}
