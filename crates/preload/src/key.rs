//! `pthread_key_*` and `pthread_once`. Values live in an array hung off
//! one thread-local pointer of this library: each program thread has its
//! own thread control block, hence its own array, and so does any other
//! thread. The array is made by a thread's first `pthread_setspecific`
//! (a thread control block is laid out at every `pthread_create`: a large
//! thread-local array would be copied every time). A slot keeps the key's
//! sequence number, so a key deleted and made again reads NULL everywhere,
//! as POSIX asks.

use std::cell::Cell;
use std::sync::atomic::{
    AtomicI32, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};

use libc::{c_int, c_void, pthread_key_t, pthread_once_t};

use crate::lot::{wait_word, wake_word};
use crate::mode::serve;

const KEYS: usize = 1024;
const DESTRUCTOR_ROUNDS: usize = 4;

/// Per key: its sequence number (odd while the key exists) and destructor.
struct Key {
    seq: AtomicUsize,
    dtor: AtomicUsize,
}

static TABLE: [Key; KEYS] = [const {
    Key {
        seq: AtomicUsize::new(0),
        dtor: AtomicUsize::new(0),
    }
}; KEYS];

/// (sequence number, value) per key, as far as this thread has set keys.
type Values = Vec<(usize, *mut c_void)>;

thread_local! {
    /// The values of the thread whose thread pointer is current; null
    /// until it sets one.
    static VALUES: Cell<*mut Values> = const { Cell::new(std::ptr::null_mut()) };
}

/// Runs `f` on the current thread's values, made if `make`.
fn with_values<R>(make: bool, f: impl FnOnce(Option<&mut Values>) -> R) -> R {
    VALUES.with(|v| {
        let mut p = v.get();
        if p.is_null() && make {
            p = Box::into_raw(Box::default());
            v.set(p);
        }
        // SAFETY: made above by this thread, freed only by it (`free_values`).
        f(unsafe { p.as_mut() })
    })
}

/// Frees the current thread's values (at its exit, after the destructors).
fn free_values() {
    let p = VALUES.with(|v| v.replace(std::ptr::null_mut()));
    if !p.is_null() {
        // SAFETY: made by with_values on this thread, no longer referenced.
        drop(unsafe { Box::from_raw(p) });
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_key_create(
    key: *mut pthread_key_t,
    dtor: Option<unsafe extern "C" fn(*mut c_void)>,
) -> c_int {
    for (i, k) in TABLE.iter().enumerate() {
        let seq = k.seq.load(Relaxed);
        if seq % 2 == 0
            && k.seq
                .compare_exchange(seq, seq + 1, AcqRel, Relaxed)
                .is_ok()
        {
            k.dtor.store(dtor.map_or(0, |f| f as usize), Release);
            // SAFETY: C's contract: a writable key.
            unsafe { *key = i as pthread_key_t };
            return 0;
        }
    }
    libc::EAGAIN
}

#[no_mangle]
pub unsafe extern "C" fn pthread_key_delete(key: pthread_key_t) -> c_int {
    let Some(k) = TABLE.get(key as usize) else {
        return libc::EINVAL;
    };
    let seq = k.seq.load(Relaxed);
    if seq % 2 == 0
        || k.seq
            .compare_exchange(seq, seq + 1, AcqRel, Relaxed)
            .is_err()
    {
        return libc::EINVAL;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_getspecific(key: pthread_key_t) -> *mut c_void {
    let Some(k) = TABLE.get(key as usize) else {
        return std::ptr::null_mut();
    };
    let seq = k.seq.load(Acquire);
    with_values(false, |v| match v.and_then(|v| v.get(key as usize)) {
        Some(&(s, val)) if s == seq => val,
        _ => std::ptr::null_mut(),
    })
}

#[no_mangle]
pub unsafe extern "C" fn pthread_setspecific(key: pthread_key_t, value: *const c_void) -> c_int {
    let Some(k) = TABLE.get(key as usize) else {
        return libc::EINVAL;
    };
    let seq = k.seq.load(Acquire);
    if seq % 2 == 0 {
        return libc::EINVAL;
    }
    with_values(true, |v| {
        let v = v.expect("made");
        let i = key as usize;
        if v.len() <= i {
            v.resize(i + 1, (0, std::ptr::null_mut()));
        }
        v[i] = (seq, value.cast_mut());
    });
    0
}

/// Runs the destructors of the calling thread's non-NULL values, up to
/// PTHREAD_DESTRUCTOR_ITERATIONS rounds. Call on the exiting thread's own
/// thread pointer (C code may run, and may set values again).
pub(crate) fn run_destructors() {
    if with_values(false, |v| v.is_none()) {
        return; // this thread never set a value
    }
    for _ in 0..DESTRUCTOR_ROUNDS {
        let mut ran = false;
        let set = with_values(false, |v| v.map_or(0, |v| v.len()));
        for (i, k) in TABLE.iter().enumerate().take(set) {
            let seq = k.seq.load(Acquire);
            let dtor = k.dtor.load(Acquire);
            if seq % 2 == 0 || dtor == 0 {
                continue;
            }
            let value = with_values(false, |v| match v.and_then(|v| v.get_mut(i)) {
                Some(slot) if slot.0 == seq => std::mem::replace(&mut slot.1, std::ptr::null_mut()),
                _ => std::ptr::null_mut(),
            });
            if !value.is_null() {
                // SAFETY: the program registered this destructor for the key.
                let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(dtor) };
                // SAFETY: called as POSIX says, with the thread's value.
                unsafe { f(value) };
                ran = true;
            }
        }
        if !ran {
            break;
        }
    }
    free_values();
}

const ONCE_RUNNING: i32 = 1;
const ONCE_DONE: i32 = 2;

#[no_mangle]
pub unsafe extern "C" fn pthread_once(
    once: *mut pthread_once_t,
    init: Option<unsafe extern "C" fn()>,
) -> c_int {
    // SAFETY: pthread_once_t is an int.
    let state = unsafe { &*(once as *const AtomicI32) };
    loop {
        match state.compare_exchange(0, ONCE_RUNNING, Acquire, Acquire) {
            Ok(_) => {
                if let Some(f) = init {
                    // SAFETY: the program's init routine.
                    unsafe { f() };
                }
                state.store(ONCE_DONE, Release);
                // SAFETY: an AtomicI32 viewed as the lot's AtomicU32 word.
                let word = unsafe { &*(once as *const std::sync::atomic::AtomicU32) };
                serve(|| wake_word(word, usize::MAX, false));
                return 0;
            }
            Err(ONCE_DONE) => return 0,
            Err(_) => {
                // SAFETY: as above.
                let word = unsafe { &*(once as *const std::sync::atomic::AtomicU32) };
                serve(|| wait_word(word, ONCE_RUNNING as u32, false, None));
            }
        }
    }
}
