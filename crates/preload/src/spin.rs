//! `pthread_spin_*`: a spinning lock that yields the uthread after a short
//! spin, so a holder switched out on the same kthread gets to run.

use std::sync::atomic::{AtomicI32, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use libc::{c_int, pthread_spinlock_t};

/// # Safety
/// `s` points to a live spinlock.
unsafe fn word<'a>(s: *mut pthread_spinlock_t) -> &'a AtomicI32 {
    // SAFETY: `pthread_spinlock_t` is an int.
    unsafe { &*(s as *const AtomicI32) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_spin_init(s: *mut pthread_spinlock_t, _pshared: c_int) -> c_int {
    // SAFETY: C's contract.
    unsafe { word(s) }.store(0, Relaxed);
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_spin_destroy(_s: *mut pthread_spinlock_t) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_spin_lock(s: *mut pthread_spinlock_t) -> c_int {
    // SAFETY: C's contract.
    let w = unsafe { word(s) };
    loop {
        if w.swap(1, Acquire) == 0 {
            return 0;
        }
        for _ in 0..256 {
            std::hint::spin_loop();
            if w.load(Relaxed) == 0 {
                break;
            }
        }
        if w.load(Relaxed) != 0 {
            // SAFETY: our own sched_yield (a uthread yield, or the kernel's).
            unsafe { crate::time::sched_yield() };
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_spin_trylock(s: *mut pthread_spinlock_t) -> c_int {
    // SAFETY: C's contract.
    if unsafe { word(s) }.swap(1, Acquire) == 0 {
        0
    } else {
        libc::EBUSY
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_spin_unlock(s: *mut pthread_spinlock_t) -> c_int {
    // SAFETY: C's contract.
    unsafe { word(s) }.store(0, Release);
    0
}
