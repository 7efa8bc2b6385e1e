//! Waiting by address: the library's futex. Every pthread object keeps
//! only a word in the program's memory (so static initializers, objects
//! that are never destroyed and objects the program copies around all
//! work); whoever must wait parks in a bucket of this table under the
//! object's address, and wakers find it there.
//!
//! A bucket is a spinlock and a list. Its critical sections are short and
//! run with preemption deferred, so a holder is never switched away.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering::Acquire, Ordering::Release};
use std::time::Instant;

use ginza_runtime::park::{park_until, Parked, Unparker};
use ginza_runtime::without_preemption;

const BUCKETS: usize = 1024;

struct Waiting {
    addr: usize,
    /// What the object's protocol says this waiter waits for (readers and
    /// writers of a rwlock); 0 elsewhere.
    tag: u32,
    who: Unparker,
}

struct Bucket {
    locked: AtomicBool,
    waiting: UnsafeCell<Vec<Waiting>>,
}

// SAFETY: `waiting` is touched only with `locked` held (Bucket::with).
unsafe impl Sync for Bucket {}

impl Bucket {
    const fn new() -> Bucket {
        Bucket {
            locked: AtomicBool::new(false),
            waiting: UnsafeCell::new(Vec::new()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<Waiting>) -> R) -> R {
        without_preemption(|| {
            while self
                .locked
                .compare_exchange_weak(false, true, Acquire, std::sync::atomic::Ordering::Relaxed)
                .is_err()
            {
                std::hint::spin_loop();
            }
            // SAFETY: the lock is held until the store below.
            let r = f(unsafe { &mut *self.waiting.get() });
            self.locked.store(false, Release);
            r
        })
    }
}

static LOT: [Bucket; BUCKETS] = [const { Bucket::new() }; BUCKETS];

fn bucket(addr: usize) -> &'static Bucket {
    let h = (addr as u64 >> 2).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
    &LOT[h as usize % BUCKETS]
}

/// Parks the caller under `addr` if `still`, checked with the bucket
/// locked, holds; returns how the wait ended. Wakers of `addr` take the
/// same lock, so a wake-up between the caller's check and its sleep is
/// never lost. Call as runtime code (`mode::serve`).
pub(crate) fn park(
    addr: usize,
    tag: u32,
    deadline: Option<Instant>,
    still: impl FnOnce() -> bool,
) -> Parked {
    let b = bucket(addr);
    let mut mine = None;
    let parked = park_until(deadline, |who| {
        b.with(|w| {
            if !still() {
                return false;
            }
            mine = Some(who.clone());
            w.push(Waiting { addr, tag, who });
            true
        })
    });
    if parked == Parked::TimedOut {
        let mine = mine.expect("queued before timing out");
        b.with(|w| w.retain(|x| !x.who.same(&mine)));
    }
    parked
}

/// Wakes waiters of `addr` for which `pick(tag)` says so, up to `most`;
/// how many it woke.
pub(crate) fn unpark(addr: usize, most: usize, mut pick: impl FnMut(u32) -> bool) -> usize {
    let b = bucket(addr);
    let mut woken = 0;
    while woken < most {
        let next = b.with(|w| {
            let i = w.iter().position(|x| x.addr == addr && pick(x.tag))?;
            Some(w.remove(i).who)
        });
        match next {
            // One whose deadline won the race does not count.
            Some(who) => woken += usize::from(who.unpark()),
            None => break,
        }
    }
    woken
}

pub(crate) fn unpark_all(addr: usize) -> usize {
    unpark(addr, usize::MAX, |_| true)
}

/// How a [`wait_word`] ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Waited {
    /// Woken, or the word was no longer `expected`: look again.
    Again,
    TimedOut,
}

/// Waits while `word` holds `expected`, until a [`wake_word`] or the
/// deadline. A process-shared object (`shared`) waits in the kernel
/// (`FUTEX_WAIT`), where another process's wake can reach it; that blocks
/// the kthread, as any blocking system call does. Call as runtime code.
pub(crate) fn wait_word(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    shared: bool,
    deadline: Option<Instant>,
) -> Waited {
    let addr = word as *const _ as usize;
    if !shared {
        let still = || word.load(std::sync::atomic::Ordering::SeqCst) == expected;
        return match park(addr, 0, deadline, still) {
            Parked::TimedOut => Waited::TimedOut,
            Parked::Woken | Parked::Declined => Waited::Again,
        };
    }
    let timeout = deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        }
    });
    let ts = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a live word with a valid (or null) timeout.
    let r = unsafe { libc::syscall(libc::SYS_futex, addr, libc::FUTEX_WAIT, expected, ts) };
    // SAFETY: reading this thread's errno right after the call.
    if r == -1 && unsafe { *libc::__errno_location() } == libc::ETIMEDOUT {
        Waited::TimedOut
    } else {
        Waited::Again
    }
}

/// Wakes up to `n` waiters of `word`.
pub(crate) fn wake_word(word: &std::sync::atomic::AtomicU32, n: usize, shared: bool) {
    let addr = word as *const _ as usize;
    if shared {
        let n = n.min(i32::MAX as usize) as i32;
        // SAFETY: FUTEX_WAKE on a live word.
        unsafe { libc::syscall(libc::SYS_futex, addr, libc::FUTEX_WAKE, n) };
    } else {
        unpark(addr, n, |_| true);
    }
}
