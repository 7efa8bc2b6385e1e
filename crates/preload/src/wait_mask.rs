//! The signal mask of `ppoll`, `pselect`, `epoll_pwait` and `epoll_pwait2`
//! while they wait on Ginza sockets (`pollset.rs`, `epoll.rs`).
//!
//! The kernel applies such a mask atomically for the wait: a signal it
//! lets in interrupts the wait (EINTR) once its handler ran. The program
//! thread does not wait in the kernel here (it parks as a uthread), and
//! its handlers run wherever the library's trampoline runs them
//! (`signal.rs`). So a wait with a mask takes a slot here naming the
//! signals the mask lets in and the poller it parks on; the trampoline,
//! after running a program handler, marks every slot that lets that
//! signal in and wakes its poller, and the wait returns EINTR. A signal
//! pending when the wait starts is let in at once, as the kernel does,
//! by opening the mask for an instant on the calling kthread.
//!
//! Signals a mask lets in interrupt the wait wherever the process takes
//! them (the kernel would pick one thread); a signal the mask blocks never
//! does.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};

use ginza_runtime::net::PollWaker;

/// Waits with a mask at once; one more is served without its mask (said
/// once on stderr).
const SLOTS: usize = 64;

const FREE: u8 = 0;
/// Being filled in or emptied by its owner.
const BUSY: u8 = 1;
const ARMED: u8 = 2;

struct Slot {
    state: AtomicU8,
    /// Trampolines looking at the slot now.
    readers: AtomicUsize,
    /// Bit `n - 1`: signal `n` interrupts the wait.
    let_in: AtomicU64,
    hit: AtomicBool,
    waker: UnsafeCell<Option<PollWaker>>,
}

// SAFETY: `waker` is written by the slot's owner only while the slot is
// BUSY with no reader in it, and read by trampolines only while it is
// ARMED (counted in `readers`).
unsafe impl Sync for Slot {}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        state: AtomicU8::new(FREE),
        readers: AtomicUsize::new(0),
        let_in: AtomicU64::new(0),
        hit: AtomicBool::new(false),
        waker: UnsafeCell::new(None),
    }
}; SLOTS];

/// Armed slots; 0 keeps the trampoline's look to one load.
static ARMED_COUNT: AtomicUsize = AtomicUsize::new(0);

fn bit(sig: libc::c_int) -> u64 {
    match sig {
        1..=64 => 1u64 << (sig - 1),
        _ => 0,
    }
}

/// The signals `mask` lets in (those not in it, SIGKILL and SIGSTOP aside).
fn let_in_by(mask: &libc::sigset_t) -> u64 {
    let mut bits = 0;
    for sig in 1..=64 {
        // SAFETY: a valid set and a signal number in range.
        if unsafe { libc::sigismember(mask, sig) } == 0 {
            bits |= bit(sig);
        }
    }
    bits & !(bit(libc::SIGKILL) | bit(libc::SIGSTOP))
}

/// A wait's mask, applied until it is dropped.
pub(crate) struct MaskedWait {
    slot: Option<&'static Slot>,
}

impl MaskedWait {
    /// A wait without a mask (`epoll_wait`, `poll`, `select`).
    pub(crate) fn none() -> MaskedWait {
        MaskedWait { slot: None }
    }

    /// Applies `mask` (the caller's, or null: nothing) to a wait that
    /// parks on `waker`'s poller.
    ///
    /// # Safety
    /// `mask` is null or points to a valid `sigset_t`.
    pub(crate) unsafe fn apply(mask: *const libc::sigset_t, waker: PollWaker) -> MaskedWait {
        if mask.is_null() {
            return MaskedWait { slot: None };
        }
        // SAFETY: the caller's valid set, copied.
        let mask = unsafe { *mask };
        let Some(slot) = TABLE
            .iter()
            .find(|s| s.state.compare_exchange(FREE, BUSY, SeqCst, SeqCst).is_ok())
        else {
            crate::say::unsupported_once!(
                "ppoll",
                "more than 64 waits with a signal mask at once: one waits without its mask"
            );
            return MaskedWait { slot: None };
        };
        slot.let_in.store(let_in_by(&mask), SeqCst);
        slot.hit.store(false, SeqCst);
        // SAFETY: BUSY, so no trampoline reads it.
        unsafe { *slot.waker.get() = Some(waker) };
        slot.state.store(ARMED, SeqCst);
        ARMED_COUNT.fetch_add(1, SeqCst);
        // A signal already pending that the mask lets in is taken now: only
        // those are unblocked, for an instant, and their handlers run (the
        // trampoline marks the slot).
        // SAFETY: sets of our own.
        unsafe {
            let mut pending: libc::sigset_t = std::mem::zeroed();
            let mut open: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut open);
            let current = open;
            let mut any = false;
            for sig in 1..=64 {
                if libc::sigismember(&pending, sig) == 1 && slot.let_in.load(SeqCst) & bit(sig) != 0
                {
                    libc::sigdelset(&mut open, sig);
                    any = true;
                }
            }
            if any {
                libc::pthread_sigmask(libc::SIG_SETMASK, &open, std::ptr::null_mut());
                libc::pthread_sigmask(libc::SIG_SETMASK, &current, std::ptr::null_mut());
            }
        }
        MaskedWait { slot: Some(slot) }
    }

    /// A signal the mask lets in was taken since the wait began: it
    /// returns EINTR.
    pub(crate) fn interrupted(&self) -> bool {
        self.slot.is_some_and(|s| s.hit.load(SeqCst))
    }
}

impl Drop for MaskedWait {
    fn drop(&mut self) {
        let Some(slot) = self.slot else { return };
        slot.state.store(BUSY, SeqCst);
        ARMED_COUNT.fetch_sub(1, SeqCst);
        // A trampoline that saw it ARMED finishes with the waker first.
        while slot.readers.load(SeqCst) != 0 {
            std::hint::spin_loop();
        }
        // SAFETY: BUSY with no reader.
        let waker = unsafe { (*slot.waker.get()).take() };
        crate::mode::serve(|| drop(waker));
        slot.state.store(FREE, SeqCst);
    }
}

/// Whether any wait with a mask is armed (one load; no thread-local).
#[inline]
pub(crate) fn any_armed() -> bool {
    ARMED_COUNT.load(SeqCst) != 0
}

/// Called by the trampoline after a program handler for `sig` ran: every
/// wait whose mask lets `sig` in is interrupted. Async-signal-safe: atomics,
/// and a poller's wake-up (a spinlock no program code holds).
pub(crate) fn signal_taken(sig: libc::c_int) {
    if ARMED_COUNT.load(SeqCst) == 0 {
        return;
    }
    let b = bit(sig);
    for slot in &TABLE {
        if slot.state.load(SeqCst) != ARMED || slot.let_in.load(SeqCst) & b == 0 {
            continue;
        }
        slot.readers.fetch_add(1, SeqCst);
        // Still armed (and for this signal: it may be another wait's now).
        if slot.state.load(SeqCst) == ARMED && slot.let_in.load(SeqCst) & b != 0 {
            slot.hit.store(true, SeqCst);
            // SAFETY: ARMED and counted in `readers`: the owner keeps the
            // waker until we are done.
            if let Some(w) = unsafe { &*slot.waker.get() } {
                w.wake();
            }
        }
        slot.readers.fetch_sub(1, SeqCst);
    }
}
