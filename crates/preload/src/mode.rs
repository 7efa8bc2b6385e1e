//! Who is calling an interposed function, and the switch of the thread
//! pointer between a program thread's C code and the runtime.
//!
//! Three kinds of caller (`ginza_runtime::foreign_tls` keeps GS = the
//! kthread's own thread pointer on the runtime's threads):
//! * a program thread (uthread) in C code: GS ≠ 0 and FS ≠ GS. The call is
//!   served by the runtime, on the kthread's thread pointer ([`serve`]);
//! * the runtime's own code (its kthreads and service threads, and glibc as
//!   Rust calls it, e.g. `nanosleep` from `std::thread::sleep`): FS = GS.
//!   Such calls go to glibc unchanged ([`real!`]);
//! * any other thread (before the runtime starts, a thread the program made
//!   with glibc before that, the signal thread, a forked child): GS = 0.
//!   Synchronization objects are still ours (one object may be used by
//!   every kind of thread), served on the caller's own thread pointer;
//!   blocking is the thread's.
//!
//! A kernel thread made by glibc's `pthread_create` called behind the
//! library's back (jemalloc finds it with `dlsym(RTLD_NEXT)` for its
//! background threads, as Redis uses them) inherits its creator's GS: FS ≠
//! GS ≠ 0 as for a program thread, but FS is a block of glibc's, not one of
//! `tcb.rs`'s. Taken for a program thread, it would run the runtime on the
//! kthread's block, as that kthread, on its own stack: two kernel threads
//! in one scheduler. Such a thread is found by its block's mark, and its GS
//! is cleared on its first call, so it is any other thread from then on.

use ginza_runtime::foreign_tls::{enabled, fs_base, gs_base, set_fs_base};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Caller {
    /// A program thread running C code on its own thread pointer.
    Uthread,
    /// The runtime's own code.
    Runtime,
    /// Any other thread.
    Other,
}

#[inline(always)]
pub(crate) fn caller() -> Caller {
    if !enabled() {
        return Caller::Other;
    }
    let gs = gs_base();
    if gs == 0 {
        return Caller::Other;
    }
    let fs = fs_base();
    if fs == gs {
        Caller::Runtime
    } else if crate::tcb::is_program_thread_block(fs) {
        Caller::Uthread
    } else {
        adopt_foreign_thread()
    }
}

/// A kernel thread glibc made without the library, GS inherited from its
/// creator: from now on no thread of the runtime's. Async-signal-safe.
#[cold]
#[inline(never)]
fn adopt_foreign_thread() -> Caller {
    ginza_runtime::foreign_tls::unmark_thread();
    Caller::Other
}

/// Runs `f` as runtime code: for a uthread in C code, on its kthread's
/// thread pointer, switching back to the uthread's own (wherever it then
/// runs) before returning. Other callers run `f` as they are.
///
/// `f` runs with preemption deferred (it may still park and switch): it
/// calls into glibc (`_dl_allocate_tls` takes the dynamic linker's
/// recursive lock, which records the kernel thread that holds it), and a
/// uthread moved to another kthread there could never unlock it.
#[inline(always)]
pub(crate) fn serve<R>(f: impl FnOnce() -> R) -> R {
    on_kthread_pointer(|| ginza_runtime::without_preemption(f))
}

/// As [`serve`], without deferring preemption: for `ginza_preempt_point`,
/// which is where a pending preemption is taken.
#[inline(always)]
pub(crate) fn serve_preemptible<R>(f: impl FnOnce() -> R) -> R {
    on_kthread_pointer(f)
}

#[inline(always)]
fn on_kthread_pointer<R>(f: impl FnOnce() -> R) -> R {
    if caller() != Caller::Uthread {
        return run(f);
    }
    let c_fs = fs_base();
    // SAFETY: GS holds this kthread's own thread pointer (foreign_tls).
    unsafe { set_fs_base(gs_base()) };
    let r = run(f);
    // SAFETY: the uthread's own block, which only it uses.
    unsafe { set_fs_base(c_fs) };
    r
}

/// A function boundary the compiler cannot see through, so no
/// thread-local address computed on one thread pointer is used on the
/// other.
#[inline(never)]
fn run<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Runs `f` (C code, or Rust that touches only this library's
/// thread-locals) on the thread pointer `tp`, from runtime code; returns
/// on the thread pointer of the kthread the caller then runs on.
///
/// # Safety
/// `tp` is a thread control block of the calling uthread (`tcb.rs`).
#[inline(always)]
pub(crate) unsafe fn on_thread_pointer<R>(tp: usize, f: impl FnOnce() -> R) -> R {
    // SAFETY: the caller's contract.
    unsafe { set_fs_base(tp) };
    let r = run(f);
    // SAFETY: after f, maybe on another kthread: its own block.
    unsafe { set_fs_base(gs_base()) };
    r
}

/// Sets the calling C code's `errno`. Call only on the C thread pointer
/// (outside [`serve`]).
#[inline(never)]
pub(crate) fn set_errno(e: i32) {
    // SAFETY: this thread pointer's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// `dlsym(handle, name)` (`name` NUL-terminated), with preemption deferred:
/// the dynamic linker holds its recursive lock meanwhile, whose owner is
/// the thread pointer's tid, and runtime code runs on its kthread's. A
/// uthread preempted inside and resumed on another kthread could not
/// release it (EPERM), and the next `dlsym`, `dlopen` or `exit` waited for
/// it forever (seen: `exit` blocked in `_dl_fini`).
pub(crate) fn lookup(handle: *mut libc::c_void, name: &[u8]) -> usize {
    debug_assert_eq!(name.last(), Some(&0));
    ginza_runtime::without_preemption(|| {
        // SAFETY: a NUL-terminated name; dlsym only reads it.
        unsafe { libc::dlsym(handle, name.as_ptr().cast()) as usize }
    })
}

/// The glibc definition of an interposed function, found once with
/// `dlsym(RTLD_NEXT)`.
macro_rules! real {
    ($name:ident : $ty:ty) => {{
        static ADDR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mut a = ADDR.load(std::sync::atomic::Ordering::Relaxed);
        if a == 0 {
            // RTLD_NEXT skips this library.
            a = $crate::mode::lookup(libc::RTLD_NEXT, concat!(stringify!($name), "\0").as_bytes());
            if a == 0 {
                $crate::say::line(stringify!($name), "not found in the C library");
                // SAFETY: abort is always safe to call.
                unsafe { libc::abort() };
            }
            ADDR.store(a, std::sync::atomic::Ordering::Relaxed);
        }
        // SAFETY: the symbol has this C signature in glibc.
        unsafe { std::mem::transmute::<usize, $ty>(a) }
    }};
}
pub(crate) use real;
