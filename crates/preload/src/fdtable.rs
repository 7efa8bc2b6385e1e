//! Which descriptor numbers are Ginza's: a socket the runtime serves
//! (`socket.rs`) or an epoll instance that watches some (`epoll.rs`).
//! Every such number is also a kernel descriptor the library holds open
//! (the socket's placeholder, the real epoll instance), so numbers never
//! collide with the kernel's, and `dup`, `fcntl(F_SETFD)` and `close`
//! work on both kinds.
//!
//! A lookup is one relaxed load when the program has no Ginza descriptor
//! and a flag load per call otherwise: every `read` and `write` asks.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;

use libc::c_int;

use crate::epoll::EpollSet;
use crate::gsock::GSock;

#[derive(Clone)]
pub(crate) enum Entry {
    Socket(Arc<GSock>),
    Epoll(Arc<EpollSet>),
}

const CHUNK: usize = 4096;
/// 2^20 descriptors, the kernel's default hard limit.
const CHUNKS: usize = 256;

struct Slot {
    present: AtomicBool,
    locked: AtomicBool,
    entry: UnsafeCell<Option<Entry>>,
}

// SAFETY: `entry` is touched only with `locked` held (Slot::with).
unsafe impl Sync for Slot {}

impl Slot {
    fn with<R>(&self, f: impl FnOnce(&mut Option<Entry>) -> R) -> R {
        ginza_runtime::without_preemption(|| {
            while self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::hint::spin_loop();
            }
            // SAFETY: the lock is held until the store below.
            let entry = unsafe { &mut *self.entry.get() };
            let r = f(entry);
            self.present.store(entry.is_some(), Ordering::Release);
            self.locked.store(false, Ordering::Release);
            r
        })
    }
}

static TABLE: [AtomicPtr<Slot>; CHUNKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];
/// Entries in the table; 0 skips every lookup.
static ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Cleared in a forked child: its runtime is gone, and with it the sockets.
static ENABLED: AtomicBool = AtomicBool::new(true);

fn slot(fd: c_int, make: bool) -> Option<&'static Slot> {
    let fd = usize::try_from(fd).ok()?;
    let (chunk, index) = (fd / CHUNK, fd % CHUNK);
    let head = TABLE.get(chunk)?;
    let mut p = head.load(Ordering::Acquire);
    if p.is_null() {
        if !make {
            return None;
        }
        let fresh: Box<[Slot]> = (0..CHUNK)
            .map(|_| Slot {
                present: AtomicBool::new(false),
                locked: AtomicBool::new(false),
                entry: UnsafeCell::new(None),
            })
            .collect();
        let fresh = Box::into_raw(fresh) as *mut Slot;
        match head.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p = fresh,
            Err(theirs) => {
                // SAFETY: ours lost the race and was never shared.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, CHUNK)) });
                p = theirs;
            }
        }
    }
    // SAFETY: a chunk is CHUNK slots, never freed once published.
    Some(unsafe { &*p.add(index) })
}

/// The entry of `fd`, if it is Ginza's.
#[inline]
pub(crate) fn get(fd: c_int) -> Option<Entry> {
    if ENTRIES.load(Ordering::Relaxed) == 0 || !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let s = slot(fd, false)?;
    if !s.present.load(Ordering::Acquire) {
        return None;
    }
    s.with(|e| e.clone())
}

pub(crate) fn socket(fd: c_int) -> Option<Arc<GSock>> {
    match get(fd)? {
        Entry::Socket(s) => Some(s),
        Entry::Epoll(_) => None,
    }
}

pub(crate) fn epoll(fd: c_int) -> Option<Arc<EpollSet>> {
    match get(fd)? {
        Entry::Epoll(e) => Some(e),
        Entry::Socket(_) => None,
    }
}

/// Makes `fd` name `entry`; what it named before, if anything (the caller
/// drops it outside the slot's lock).
pub(crate) fn insert(fd: c_int, entry: Entry) -> Option<Entry> {
    let Some(s) = slot(fd, true) else {
        crate::say::unsupported_once!("socket", "descriptor beyond 2^20: served by the kernel");
        return None;
    };
    let old = s.with(|e| e.replace(entry));
    if old.is_none() {
        ENTRIES.fetch_add(1, Ordering::Relaxed);
    }
    old
}

/// Forgets `fd`; what it named.
pub(crate) fn remove(fd: c_int) -> Option<Entry> {
    // In a forked child the entries are the parent's runtime's: never
    // dropped here (closing one would run that runtime's code).
    if ENTRIES.load(Ordering::Relaxed) == 0 || !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let s = slot(fd, false)?;
    if !s.present.load(Ordering::Acquire) {
        return None;
    }
    let old = s.with(|e| e.take());
    if old.is_some() {
        ENTRIES.fetch_sub(1, Ordering::Relaxed);
    }
    old
}

/// In a forked child: every number is the kernel's again.
pub(crate) fn forked() {
    ENABLED.store(false, Ordering::Relaxed);
}
