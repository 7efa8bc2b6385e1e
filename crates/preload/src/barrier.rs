//! `pthread_barrier_*`: an arrival count and a generation. The last of
//! `total` arrivals starts the next generation and wakes the others, which
//! park while the generation is unchanged.
//!
//! Layout in the 32-byte `pthread_barrier_t`: arrivals (offset 0), total
//! (4), generation (8).

use std::sync::atomic::{AtomicU32, Ordering::AcqRel, Ordering::Acquire, Ordering::Release};

use libc::{c_int, c_uint, pthread_barrier_t, pthread_barrierattr_t};

use crate::lot::{wait_word, wake_word};
use crate::mode::serve;

/// # Safety
/// `b` points to a live barrier.
unsafe fn words<'a>(b: *mut pthread_barrier_t) -> (&'a AtomicU32, u32, &'a AtomicU32) {
    let base = b as usize;
    // SAFETY: offsets inside the 32-byte object.
    unsafe {
        (
            &*(base as *const AtomicU32),
            ((base + 4) as *const u32).read_volatile(),
            &*((base + 8) as *const AtomicU32),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_barrier_init(
    b: *mut pthread_barrier_t,
    _attr: *const pthread_barrierattr_t,
    count: c_uint,
) -> c_int {
    if count == 0 {
        return libc::EINVAL;
    }
    // SAFETY: C's contract: a writable 32-byte object.
    unsafe {
        std::ptr::write_bytes(b.cast::<u8>(), 0, std::mem::size_of::<pthread_barrier_t>());
        ((b as usize + 4) as *mut u32).write(count);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_barrier_destroy(_b: *mut pthread_barrier_t) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_barrier_wait(b: *mut pthread_barrier_t) -> c_int {
    // SAFETY: C's contract.
    let (arrived, total, generation) = unsafe { words(b) };
    let gen = generation.load(Acquire);
    if arrived.fetch_add(1, AcqRel) + 1 == total {
        // Nobody of the next round can arrive before the generation moves.
        arrived.store(0, Release);
        generation.fetch_add(1, AcqRel);
        serve(|| wake_word(generation, usize::MAX, false));
        return libc::PTHREAD_BARRIER_SERIAL_THREAD;
    }
    while generation.load(Acquire) == gen {
        serve(|| wait_word(generation, gen, false, None));
    }
    0
}
