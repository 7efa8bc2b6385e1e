//! `pthread_rwlock_*`: one word, the reader count in the low bits, a
//! writer bit and a waiters bit. Readers are preferred, as glibc's default
//! (`PTHREAD_RWLOCK_PREFER_READER_NP`) does; an unlock that finds waiters
//! wakes them all and they race again.

use std::sync::atomic::{AtomicU32, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::time::Instant;

use libc::{c_int, clockid_t, pthread_rwlock_t, pthread_rwlockattr_t, timespec};

use crate::lot::{park, unpark_all};
use crate::mode::serve;
use crate::time::deadline;

const WRITER: u32 = 1 << 31;
const WAITERS: u32 = 1 << 30;
const READERS: u32 = WAITERS - 1;

/// # Safety
/// `rw` points to a live rwlock.
unsafe fn word<'a>(rw: *mut pthread_rwlock_t) -> &'a AtomicU32 {
    // SAFETY: the first 4 bytes of the 56-byte object.
    unsafe { &*(rw as *const AtomicU32) }
}

fn try_read(w: &AtomicU32) -> c_int {
    let mut s = w.load(Relaxed);
    loop {
        if s & WRITER != 0 {
            return libc::EBUSY;
        }
        if s & READERS == READERS {
            return libc::EAGAIN;
        }
        match w.compare_exchange_weak(s, s + 1, Acquire, Relaxed) {
            Ok(_) => return 0,
            Err(now) => s = now,
        }
    }
}

fn try_write(w: &AtomicU32) -> c_int {
    let mut s = w.load(Relaxed);
    loop {
        if s & (WRITER | READERS) != 0 {
            return libc::EBUSY;
        }
        match w.compare_exchange_weak(s, s | WRITER, Acquire, Relaxed) {
            Ok(_) => return 0,
            Err(now) => s = now,
        }
    }
}

/// Takes the lock with `attempt`, parking while it is busy.
fn acquire(w: &AtomicU32, write: bool, until: Option<Instant>) -> c_int {
    let attempt = if write { try_write } else { try_read };
    loop {
        match attempt(w) {
            libc::EBUSY => {}
            r => return r,
        }
        let addr = w as *const AtomicU32 as usize;
        let parked = serve(|| {
            park(addr, 0, until, || {
                // Announce a waiter, unless the lock came free meanwhile.
                let s = w.fetch_or(WAITERS, Relaxed) | WAITERS;
                if write {
                    s & (WRITER | READERS) != 0
                } else {
                    s & WRITER != 0
                }
            })
        });
        if parked == ginza_runtime::park::Parked::TimedOut {
            return libc::ETIMEDOUT;
        }
    }
}

fn release(w: &AtomicU32) -> c_int {
    let mut s = w.load(Relaxed);
    loop {
        let next = if s & WRITER != 0 {
            0
        } else if s & READERS != 0 {
            let left = s - 1;
            if left & READERS == 0 {
                0
            } else {
                left
            }
        } else {
            return libc::EPERM;
        };
        match w.compare_exchange_weak(s, next, Release, Relaxed) {
            Ok(_) => break,
            Err(now) => s = now,
        }
    }
    // The last holder out wakes whoever waits (cleared WAITERS above).
    if s & WAITERS != 0 && (s & WRITER != 0 || s & READERS == 1) {
        let addr = w as *const AtomicU32 as usize;
        serve(|| unpark_all(addr));
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_init(
    rw: *mut pthread_rwlock_t,
    _attr: *const pthread_rwlockattr_t,
) -> c_int {
    // SAFETY: C's contract: a writable 56-byte object.
    unsafe { std::ptr::write_bytes(rw.cast::<u8>(), 0, std::mem::size_of::<pthread_rwlock_t>()) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_destroy(rw: *mut pthread_rwlock_t) -> c_int {
    // SAFETY: C's contract.
    if unsafe { word(rw) }.load(Relaxed) & (WRITER | READERS) != 0 {
        return libc::EBUSY;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_rdlock(rw: *mut pthread_rwlock_t) -> c_int {
    // SAFETY: C's contract.
    acquire(unsafe { word(rw) }, false, None)
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_wrlock(rw: *mut pthread_rwlock_t) -> c_int {
    // SAFETY: C's contract.
    acquire(unsafe { word(rw) }, true, None)
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_tryrdlock(rw: *mut pthread_rwlock_t) -> c_int {
    // SAFETY: C's contract.
    try_read(unsafe { word(rw) })
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_trywrlock(rw: *mut pthread_rwlock_t) -> c_int {
    // SAFETY: C's contract.
    try_write(unsafe { word(rw) })
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_unlock(rw: *mut pthread_rwlock_t) -> c_int {
    // SAFETY: C's contract.
    release(unsafe { word(rw) })
}

unsafe fn timed(
    rw: *mut pthread_rwlock_t,
    clock: clockid_t,
    abstime: *const timespec,
    write: bool,
) -> c_int {
    // SAFETY: C's contract.
    let w = unsafe { word(rw) };
    let attempt = if write { try_write } else { try_read };
    match attempt(w) {
        libc::EBUSY => {}
        r => return r,
    }
    // SAFETY: C's contract: a valid timespec.
    match deadline(clock, unsafe { &*abstime }) {
        Ok(d) => acquire(w, write, Some(d)),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_timedrdlock(
    rw: *mut pthread_rwlock_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { timed(rw, libc::CLOCK_REALTIME, abstime, false) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_timedwrlock(
    rw: *mut pthread_rwlock_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { timed(rw, libc::CLOCK_REALTIME, abstime, true) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_clockrdlock(
    rw: *mut pthread_rwlock_t,
    clock: clockid_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { timed(rw, clock, abstime, false) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_clockwrlock(
    rw: *mut pthread_rwlock_t,
    clock: clockid_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { timed(rw, clock, abstime, true) }
}
