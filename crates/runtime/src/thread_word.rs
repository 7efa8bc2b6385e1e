//! Thread-locals that a preemption must not split: the running context's
//! deferral state (`deferral.rs`) and the kthread (`sched`).
//!
//! The compiler reaches a thread-local in two steps, its address and then
//! the load (in a shared library such as the preload library, a call to
//! `__tls_get_addr` first). A uthread preempted between the two and resumed
//! on another kthread goes on with the first kthread's address: it reads
//! what that kthread runs now, not what it runs itself. Found under a flood
//! of preemption signals: a uthread raised the deferral count of another
//! kthread's context from the wrong thread, counts were lowered twice, and
//! uthreads were then preempted inside the scheduler.
//!
//! A [`ThreadWord`] is read in one instruction relative to the thread
//! pointer (`mov reg, fs:[offset]`), which a signal cannot split. The
//! offset is the same in every thread, because the runtime's thread-locals
//! live in the static TLS block; each kthread checks it at its start.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::thread::LocalKey;

/// A pointer-sized thread-local of the runtime.
pub(crate) type PtrKey<T> = LocalKey<Cell<*const T>>;

/// Where a pointer-sized thread-local lies relative to the thread pointer;
/// unknown (0) until the first kthread starts. Before then no uthread can
/// move, and the compiler's own access serves.
pub(crate) struct ThreadWord {
    offset: AtomicUsize,
}

impl ThreadWord {
    pub(crate) const fn new() -> ThreadWord {
        ThreadWord {
            offset: AtomicUsize::new(0),
        }
    }

    /// Records where `key` lies in the calling thread's block; an error if
    /// another thread found it elsewhere (the runtime in a library loaded
    /// with `dlopen`, whose thread-locals each thread allocates apart).
    /// Called at each kthread's start.
    pub(crate) fn locate<T>(&self, key: &'static PtrKey<T>) -> Result<(), &'static str> {
        self.locate_at(key.with(|c| c as *const Cell<*const T> as usize))
    }

    fn locate_at(&self, addr: usize) -> Result<(), &'static str> {
        let offset = addr.wrapping_sub(thread_pointer());
        match self.offset.compare_exchange(0, offset, Relaxed, Relaxed) {
            Ok(_) => Ok(()),
            Err(known) if known == offset => Ok(()),
            Err(_) => Err(
                "the runtime's thread-locals lie at different places in different threads \
                 (is it in a library loaded with dlopen?)",
            ),
        }
    }

    /// The calling thread's value of `key` (the one located); the
    /// compiler's own access before any kthread has started.
    #[inline(always)]
    pub(crate) fn read<T>(&self, key: &'static PtrKey<T>) -> *const T {
        let offset = self.offset.load(Relaxed);
        if offset == 0 {
            return key.with(|c| c.get());
        }
        let value: *const T;
        // SAFETY: `offset` is the thread-local's place from the thread
        // pointer in every thread (`locate`): this reads the caller's own
        // copy. Not `pure`, so never merged with another read.
        unsafe {
            core::arch::asm!(
                "mov {value}, qword ptr fs:[{offset}]",
                offset = in(reg) offset,
                value = lateout(reg) value,
                options(nostack, readonly, preserves_flags),
            )
        };
        value
    }
}

/// The calling thread's thread pointer: on x86-64 glibc the first word of
/// the thread control block points to the block itself.
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: FS:0 is the TCB's self pointer, readable in every thread.
    unsafe {
        core::arch::asm!(
            "mov {}, qword ptr fs:[0]",
            out(reg) tp,
            options(nostack, readonly, preserves_flags)
        )
    };
    tp
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static WORD: Cell<*const u8> = const { Cell::new(std::ptr::null()) };
    }

    fn value(v: usize) -> *const u8 {
        v as *const u8
    }

    #[test]
    fn reads_each_threads_own_value_once_located() {
        static TW: ThreadWord = ThreadWord::new();
        WORD.with(|c| c.set(value(7)));
        TW.locate(&WORD).expect("first location");
        assert_eq!(TW.read(&WORD), value(7));
        std::thread::scope(|s| {
            s.spawn(|| {
                TW.locate(&WORD).expect("the same offset in another thread");
                WORD.with(|c| c.set(value(42)));
                assert_eq!(TW.read(&WORD), value(42));
            });
        });
        assert_eq!(TW.read(&WORD), value(7), "this thread's value is untouched");
    }

    #[test]
    fn refuses_a_thread_local_found_elsewhere() {
        let tw = ThreadWord::new();
        let addr = WORD.with(|c| c as *const Cell<*const u8> as usize);
        tw.locate_at(addr).expect("first location");
        let err = tw.locate_at(addr + 8).expect_err("another offset");
        assert!(err.contains("different places"), "{err}");
    }
}
