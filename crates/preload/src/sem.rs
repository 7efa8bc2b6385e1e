//! `sem_*`: glibc's layout (the value in the low 32 bits of the first
//! word, the waiter count in the high 32 bits, then the futex flag: 0 for
//! process-shared), so semaphores made by glibc's `sem_open` work too. A
//! process-private semaphore's waiters park in the lot; a shared one's
//! wait in the kernel, where glibc's `sem_post` in another process wakes
//! them.

use std::sync::atomic::{AtomicU32, Ordering::Acquire, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Instant;

use libc::{c_int, c_uint, clockid_t, sem_t, timespec};

use crate::lot::{wait_word, wake_word, Waited};
use crate::mode::{serve, set_errno};
use crate::time::deadline;

const FUTEX_PRIVATE: i32 = 128;
/// glibc's SEM_VALUE_MAX (INT_MAX).
const SEM_VALUE_MAX: u32 = i32::MAX as u32;

struct Sem<'a> {
    value: &'a AtomicU32,
    waiters: &'a AtomicU32,
    shared: bool,
}

impl Sem<'_> {
    /// # Safety
    /// `s` points to a live semaphore.
    unsafe fn of<'a>(s: *mut sem_t) -> Sem<'a> {
        let base = s as usize;
        // SAFETY: offsets inside the 32-byte object.
        unsafe {
            Sem {
                value: &*(base as *const AtomicU32),
                waiters: &*((base + 4) as *const AtomicU32),
                shared: ((base + 8) as *const i32).read_volatile() != FUTEX_PRIVATE,
            }
        }
    }

    fn try_take(&self) -> bool {
        let mut v = self.value.load(Relaxed);
        while v > 0 {
            match self.value.compare_exchange_weak(v, v - 1, Acquire, Relaxed) {
                Ok(_) => return true,
                Err(now) => v = now,
            }
        }
        false
    }

    fn wait(&self, until: Option<Instant>) -> Result<(), c_int> {
        loop {
            if self.try_take() {
                return Ok(());
            }
            self.waiters.fetch_add(1, SeqCst);
            let waited = serve(|| wait_word(self.value, 0, self.shared, until));
            self.waiters.fetch_sub(1, SeqCst);
            if waited == Waited::TimedOut {
                return if self.try_take() {
                    Ok(())
                } else {
                    Err(libc::ETIMEDOUT)
                };
            }
        }
    }

    fn post(&self) -> Result<(), c_int> {
        let mut v = self.value.load(Relaxed);
        loop {
            if v == SEM_VALUE_MAX {
                return Err(libc::EOVERFLOW);
            }
            match self.value.compare_exchange_weak(v, v + 1, SeqCst, Relaxed) {
                Ok(_) => break,
                Err(now) => v = now,
            }
        }
        if self.waiters.load(SeqCst) > 0 {
            serve(|| wake_word(self.value, 1, self.shared));
        }
        Ok(())
    }
}

fn status(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn sem_init(s: *mut sem_t, pshared: c_int, value: c_uint) -> c_int {
    if value > SEM_VALUE_MAX {
        return status(Err(libc::EINVAL));
    }
    // SAFETY: C's contract: a writable 32-byte object.
    unsafe {
        std::ptr::write_bytes(s.cast::<u8>(), 0, std::mem::size_of::<sem_t>());
        (s as *mut u32).write(value);
        ((s as usize + 8) as *mut i32).write(if pshared != 0 { 0 } else { FUTEX_PRIVATE });
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn sem_destroy(_s: *mut sem_t) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn sem_wait(s: *mut sem_t) -> c_int {
    // SAFETY: C's contract.
    status(unsafe { Sem::of(s) }.wait(None))
}

#[no_mangle]
pub unsafe extern "C" fn sem_trywait(s: *mut sem_t) -> c_int {
    // SAFETY: C's contract.
    status(if unsafe { Sem::of(s) }.try_take() {
        Ok(())
    } else {
        Err(libc::EAGAIN)
    })
}

#[no_mangle]
pub unsafe extern "C" fn sem_timedwait(s: *mut sem_t, abstime: *const timespec) -> c_int {
    // SAFETY: C's contract.
    unsafe { sem_clockwait(s, libc::CLOCK_REALTIME, abstime) }
}

#[no_mangle]
pub unsafe extern "C" fn sem_clockwait(
    s: *mut sem_t,
    clock: clockid_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    let sem = unsafe { Sem::of(s) };
    if sem.try_take() {
        return 0;
    }
    // SAFETY: C's contract: a valid timespec.
    status(deadline(clock, unsafe { &*abstime }).and_then(|d| sem.wait(Some(d))))
}

#[no_mangle]
pub unsafe extern "C" fn sem_post(s: *mut sem_t) -> c_int {
    // SAFETY: C's contract.
    status(unsafe { Sem::of(s) }.post())
}

#[no_mangle]
pub unsafe extern "C" fn sem_getvalue(s: *mut sem_t, out: *mut c_int) -> c_int {
    // SAFETY: C's contract.
    let v = unsafe { Sem::of(s) }.value.load(Relaxed);
    // SAFETY: C's contract: a writable int.
    unsafe { *out = v as c_int };
    0
}
