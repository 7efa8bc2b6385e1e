//! `pthread_mutex_*`: a three-state lock word (0 free, 1 locked, 2 locked
//! with waiters) at the start of the object, as glibc's, so the static
//! initializers work; waiters park in the lot (`lot.rs`), or in the kernel
//! for a process-shared mutex.
//!
//! Layout in the 40-byte `pthread_mutex_t`: the lock word (offset 0), the
//! recursion count (4), glibc's kind (16: type in the low bits, bit 7
//! process-shared), and the owner's thread pointer (24, a 64-bit field of
//! ours where glibc keeps a robust-list link).
//!
//! Only a program thread in C code parks in the lot. Every other caller —
//! the runtime's own code (a program's `malloc`, e.g. jemalloc, called
//! from Rust or from glibc on a kthread's thread pointer, whose per-thread
//! state is that kthread's), a thread that is not the runtime's — waits
//! for the word in the kernel, as glibc does: it neither moves to another
//! kthread in the middle of the caller's code nor allocates while it waits
//! (docs/preload.md, "The program's allocator").

use std::sync::atomic::{
    AtomicU32, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::SeqCst,
};
use std::time::Instant;

use libc::{c_int, clockid_t, pthread_mutex_t, pthread_mutexattr_t, timespec};

use crate::lot::{wait_word, wake_word, Waited};
use crate::mode::{caller, real, serve, Caller};
use crate::say::unsupported_once;
use crate::time::deadline;

const KIND_TYPE_MASK: i32 = 0x7f & !0x10;
const KIND_ROBUST: i32 = 0x10;
const KIND_PSHARED: i32 = 0x80;
const RECURSIVE: i32 = libc::PTHREAD_MUTEX_RECURSIVE;
const ERRORCHECK: i32 = libc::PTHREAD_MUTEX_ERRORCHECK;

/// Callers waiting in the kernel for a process-private mutex now (any
/// mutex): while there are some, a contended unlock also wakes the word's
/// kernel waiters. Rare (a kthread's own allocation meeting a program
/// thread in the program's allocator), so one count serves every mutex.
static KERNEL_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// The views of one `pthread_mutex_t`.
pub(crate) struct Mutex<'a> {
    word: &'a AtomicU32,
    count: &'a AtomicU32,
    kind: i32,
    owner: &'a AtomicUsize,
}

impl Mutex<'_> {
    /// # Safety
    /// `m` points to a live, initialized (or statically initialized) mutex.
    pub(crate) unsafe fn of<'a>(m: *mut pthread_mutex_t) -> Mutex<'a> {
        let base = m as usize;
        // SAFETY: offsets inside the 40-byte, 8-aligned object.
        unsafe {
            Mutex {
                word: &*(base as *const AtomicU32),
                count: &*((base + 4) as *const AtomicU32),
                kind: ((base + 16) as *const i32).read_volatile(),
                owner: &*((base + 24) as *const AtomicUsize),
            }
        }
    }

    fn kind_type(&self) -> i32 {
        self.kind & KIND_TYPE_MASK
    }

    fn shared(&self) -> bool {
        self.kind & KIND_PSHARED != 0
    }

    /// Locks for the thread whose thread pointer is `me` (the caller's);
    /// ETIMEDOUT after `deadline`, EDEADLK or EAGAIN as Linux says.
    pub(crate) fn lock(&self, me: usize, deadline: Option<Instant>) -> c_int {
        if let Some(r) = self.relock(me, libc::EDEADLK) {
            return r;
        }
        if self.word.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            if let Err(e) = self.lock_contended(deadline) {
                return e;
            }
        }
        self.owner.store(me, Relaxed);
        self.count.store(1, Relaxed);
        0
    }

    pub(crate) fn try_lock(&self, me: usize) -> c_int {
        if let Some(r) = self.relock(me, libc::EBUSY) {
            return r;
        }
        if self.word.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            return libc::EBUSY;
        }
        self.owner.store(me, Relaxed);
        self.count.store(1, Relaxed);
        0
    }

    /// A lock attempt by the owner: recursive counts, errorcheck refuses
    /// with `refusal` (EDEADLK to lock, EBUSY to try, as glibc).
    fn relock(&self, me: usize, refusal: c_int) -> Option<c_int> {
        let t = self.kind_type();
        if (t != RECURSIVE && t != ERRORCHECK) || self.owner.load(Relaxed) != me {
            return None;
        }
        if t == ERRORCHECK {
            return Some(refusal);
        }
        let n = self.count.load(Relaxed);
        if n == u32::MAX {
            return Some(libc::EAGAIN);
        }
        self.count.store(n + 1, Relaxed);
        Some(0)
    }

    #[cold]
    fn lock_contended(&self, deadline: Option<Instant>) -> Result<(), c_int> {
        // A holder on another kthread is often about to unlock.
        for _ in 0..100 {
            std::hint::spin_loop();
            if self.word.load(Relaxed) == 0
                && self.word.compare_exchange(0, 1, Acquire, Relaxed).is_ok()
            {
                return Ok(());
            }
        }
        if self.shared() || caller() != Caller::Uthread {
            return self.lock_in_kernel(deadline);
        }
        serve(|| {
            while self.word.swap(2, Acquire) != 0 {
                if wait_word(self.word, 2, false, deadline) == Waited::TimedOut {
                    return Err(libc::ETIMEDOUT);
                }
            }
            Ok(())
        })
    }

    /// Waits for the word with `FUTEX_WAIT` (see the module's docs): for a
    /// process-shared mutex, and for any caller but a program thread.
    fn lock_in_kernel(&self, deadline: Option<Instant>) -> Result<(), c_int> {
        let counted = !self.shared();
        if counted {
            // Before the swap below: an unlock that does not see the count
            // released the word before it, and the swap takes the lock.
            KERNEL_WAITERS.fetch_add(1, SeqCst);
        }
        let got = loop {
            if self.word.swap(2, SeqCst) == 0 {
                break Ok(());
            }
            if wait_word(self.word, 2, true, deadline) == Waited::TimedOut {
                break Err(libc::ETIMEDOUT);
            }
        };
        if counted {
            KERNEL_WAITERS.fetch_sub(1, SeqCst);
        }
        got
    }

    pub(crate) fn unlock(&self, me: usize) -> c_int {
        let t = self.kind_type();
        if t == RECURSIVE || t == ERRORCHECK {
            if self.owner.load(Relaxed) != me || self.word.load(Relaxed) == 0 {
                return libc::EPERM;
            }
            if t == RECURSIVE {
                let n = self.count.load(Relaxed);
                if n > 1 {
                    self.count.store(n - 1, Relaxed);
                    return 0;
                }
            }
        }
        self.owner.store(0, Relaxed);
        self.count.store(0, Relaxed);
        if self.word.swap(0, SeqCst) == 2 {
            if self.shared() {
                wake_word(self.word, 1, true);
            } else {
                serve(|| wake_word(self.word, 1, false));
                if KERNEL_WAITERS.load(SeqCst) != 0 {
                    wake_word(self.word, 1, true);
                }
            }
        }
        0
    }

    /// Releases the lock whatever its recursion count, for a condvar wait;
    /// the count to give back to [`Mutex::restore`].
    pub(crate) fn release_for_wait(&self) -> u32 {
        let n = self.count.load(Relaxed).max(1);
        self.count.store(1, Relaxed);
        let owner = self.owner.load(Relaxed);
        self.unlock(owner);
        n
    }

    pub(crate) fn restore(&self, count: u32) {
        self.count.store(count, Relaxed);
    }
}

/// The calling thread's identity: its thread pointer (`pthread_self`).
#[inline(always)]
pub(crate) fn me() -> usize {
    ginza_runtime::foreign_tls::fs_base()
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_init(
    m: *mut pthread_mutex_t,
    attr: *const pthread_mutexattr_t,
) -> c_int {
    let mut kind = 0;
    if !attr.is_null() {
        let (mut t, mut pshared, mut robust) = (0, 0, 0);
        let gettype = real!(pthread_mutexattr_gettype: unsafe extern "C" fn(*const pthread_mutexattr_t, *mut c_int) -> c_int);
        let getpshared = real!(pthread_mutexattr_getpshared: unsafe extern "C" fn(*const pthread_mutexattr_t, *mut c_int) -> c_int);
        let getrobust = real!(pthread_mutexattr_getrobust: unsafe extern "C" fn(*const pthread_mutexattr_t, *mut c_int) -> c_int);
        // SAFETY: glibc reads the caller's attribute object.
        unsafe {
            gettype(attr, &mut t);
            getpshared(attr, &mut pshared);
            getrobust(attr, &mut robust);
        }
        kind = t & KIND_TYPE_MASK;
        if pshared == libc::PTHREAD_PROCESS_SHARED {
            kind |= KIND_PSHARED;
        }
        if robust != 0 {
            unsupported_once!(
                "pthread_mutex_init",
                "robust mutexes are served as ordinary ones (an owner that dies leaves the mutex locked)"
            );
            kind |= KIND_ROBUST;
        }
    }
    // SAFETY: C's contract: `m` is writable, 40 bytes.
    unsafe {
        std::ptr::write_bytes(m.cast::<u8>(), 0, std::mem::size_of::<pthread_mutex_t>());
        ((m as usize + 16) as *mut i32).write(kind);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_destroy(m: *mut pthread_mutex_t) -> c_int {
    // SAFETY: C's contract.
    let mutex = unsafe { Mutex::of(m) };
    if mutex.word.load(Relaxed) != 0 {
        return libc::EBUSY;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_lock(m: *mut pthread_mutex_t) -> c_int {
    // SAFETY: C's contract.
    unsafe { Mutex::of(m) }.lock(me(), None)
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_trylock(m: *mut pthread_mutex_t) -> c_int {
    // SAFETY: C's contract.
    unsafe { Mutex::of(m) }.try_lock(me())
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_unlock(m: *mut pthread_mutex_t) -> c_int {
    // SAFETY: C's contract.
    unsafe { Mutex::of(m) }.unlock(me())
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_timedlock(
    m: *mut pthread_mutex_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { pthread_mutex_clocklock(m, libc::CLOCK_REALTIME, abstime) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_clocklock(
    m: *mut pthread_mutex_t,
    clock: clockid_t,
    abstime: *const timespec,
) -> c_int {
    // SAFETY: C's contract.
    let mutex = unsafe { Mutex::of(m) };
    let me = me();
    if mutex.try_lock(me) == 0 {
        return 0;
    }
    // SAFETY: C's contract: a valid timespec.
    match deadline(clock, unsafe { &*abstime }) {
        Ok(d) => mutex.lock(me, Some(d)),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_consistent(_m: *mut pthread_mutex_t) -> c_int {
    // No mutex is ever left inconsistent: robust ones are ordinary here.
    libc::EINVAL
}
