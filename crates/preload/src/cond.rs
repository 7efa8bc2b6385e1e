//! `pthread_cond_*`: a sequence word. A waiter reads it, releases the
//! mutex and parks while it is unchanged; signal and broadcast bump it and
//! wake one or all. Spurious wake-ups are allowed by POSIX, lost ones
//! cannot happen: the bump precedes the wake, and the waiter's check runs
//! under the lot's bucket lock.
//!
//! Layout in the 48-byte `pthread_cond_t`: the sequence (offset 0), the
//! clock of timed waits (4: 0 is CLOCK_REALTIME, as in the static
//! initializer) and whether it is process-shared (8).

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Instant;

use libc::{c_int, clockid_t, pthread_cond_t, pthread_condattr_t, pthread_mutex_t, timespec};

use crate::lot::{wait_word, wake_word, Waited};
use crate::mode::{real, serve};
use crate::mutex::{me, Mutex};
use crate::time::deadline;

struct Cond<'a> {
    seq: &'a AtomicU32,
    clock: clockid_t,
    shared: bool,
}

impl Cond<'_> {
    /// # Safety
    /// `c` points to a live condvar.
    unsafe fn of<'a>(c: *mut pthread_cond_t) -> Cond<'a> {
        let base = c as usize;
        // SAFETY: offsets inside the 48-byte object.
        unsafe {
            Cond {
                seq: &*(base as *const AtomicU32),
                clock: ((base + 4) as *const i32).read_volatile(),
                shared: ((base + 8) as *const i32).read_volatile() != 0,
            }
        }
    }

    fn wait(&self, m: *mut pthread_mutex_t, until: Option<Instant>) -> c_int {
        // SAFETY: C's contract: the caller holds `m`.
        let mutex = unsafe { Mutex::of(m) };
        let me = me();
        let seq = self.seq.load(SeqCst);
        let count = mutex.release_for_wait();
        let waited = serve(|| wait_word(self.seq, seq, self.shared, until));
        let r = mutex.lock(me, None);
        mutex.restore(count);
        match (r, waited) {
            (0, Waited::TimedOut) => libc::ETIMEDOUT,
            (r, _) => r,
        }
    }

    fn wake(&self, n: usize) {
        self.seq.fetch_add(1, SeqCst);
        serve(|| wake_word(self.seq, n, self.shared));
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cond_init(
    c: *mut pthread_cond_t,
    attr: *const pthread_condattr_t,
) -> c_int {
    let (mut clock, mut pshared) = (libc::CLOCK_REALTIME, 0);
    if !attr.is_null() {
        let getclock = real!(pthread_condattr_getclock: unsafe extern "C" fn(*const pthread_condattr_t, *mut clockid_t) -> c_int);
        let getpshared = real!(pthread_condattr_getpshared: unsafe extern "C" fn(*const pthread_condattr_t, *mut c_int) -> c_int);
        // SAFETY: glibc reads the caller's attribute object.
        unsafe {
            getclock(attr, &mut clock);
            getpshared(attr, &mut pshared);
        }
    }
    // SAFETY: C's contract: `c` is writable, 48 bytes.
    unsafe {
        std::ptr::write_bytes(c.cast::<u8>(), 0, std::mem::size_of::<pthread_cond_t>());
        ((c as usize + 4) as *mut i32).write(clock);
        ((c as usize + 8) as *mut i32).write(i32::from(pshared == libc::PTHREAD_PROCESS_SHARED));
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cond_destroy(_c: *mut pthread_cond_t) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cond_wait(
    c: *mut pthread_cond_t,
    m: *mut pthread_mutex_t,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { Cond::of(c) }.wait(m, None)
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cond_timedwait(
    c: *mut pthread_cond_t,
    m: *mut pthread_mutex_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    let cond = unsafe { Cond::of(c) };
    // SAFETY: C's contract: a valid timespec.
    match deadline(cond.clock, unsafe { &*abstime }) {
        Ok(d) => cond.wait(m, Some(d)),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cond_clockwait(
    c: *mut pthread_cond_t,
    m: *mut pthread_mutex_t,
    clock: clockid_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    let cond = unsafe { Cond::of(c) };
    // SAFETY: C's contract: a valid timespec.
    match deadline(clock, unsafe { &*abstime }) {
        Ok(d) => cond.wait(m, Some(d)),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cond_signal(c: *mut pthread_cond_t) -> c_int {
    // SAFETY: C's contract.
    unsafe { Cond::of(c) }.wake(1);
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cond_broadcast(c: *mut pthread_cond_t) -> c_int {
    // SAFETY: C's contract.
    unsafe { Cond::of(c) }.wake(usize::MAX);
    0
}
