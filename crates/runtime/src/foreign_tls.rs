//! Uthreads that carry a thread pointer of their own: the support the
//! preload library (`ginza run`, docs/preload.md) needs to run C threads as
//! uthreads.
//!
//! A C program's thread-local storage (`errno`, `__thread`, glibc's malloc
//! caches and stdio locks) hangs off the x86-64 FS base. The preload library
//! gives each program thread its own thread control block and points FS at
//! it while the thread runs C code; the runtime's own code (its
//! `thread_local!`s, glibc as called from Rust) must run on the kthread's
//! own block. So on a kthread of such a runtime:
//!
//! * GS base holds the kthread's own FS value (Linux leaves GS unused in
//!   user space): set once at kthread start ([`on_kthread_start`]);
//! * FS equal to GS means runtime code is running; FS different from a
//!   non-zero GS means a uthread is in C code;
//! * the library switches FS at each call from C into the runtime and back;
//! * the preemption handler switches FS itself before any Rust code reads
//!   a thread-local, and preempts C code only where the library says it is
//!   safe (not inside libc, whose locks must not be held across a switch).
//!
//! Off unless [`enable`] is called, so native Rust applications pay one
//! relaxed load in the preemption handler and nothing elsewhere.
//!
//! `rdfsbase`/`wrfsbase` are used when the kernel enabled FSGSBASE (Linux
//! 5.9+, advertised in AT_HWCAP2); otherwise `arch_prctl`, which is correct
//! but costs a system call per switch.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

static ENABLED: AtomicBool = AtomicBool::new(false);
static HAVE_FSGSBASE: AtomicBool = AtomicBool::new(false);
/// `fn(rip) -> bool`: whether C code interrupted at `rip` may be preempted.
static MAY_PREEMPT_AT: AtomicUsize = AtomicUsize::new(0);

const HWCAP2_FSGSBASE: u64 = 1 << 1;
// asm/prctl.h
const ARCH_SET_GS: libc::c_int = 0x1001;
const ARCH_SET_FS: libc::c_int = 0x1002;
const ARCH_GET_FS: libc::c_int = 0x1003;
const ARCH_GET_GS: libc::c_int = 0x1004;

/// Turns the mode on for this process. `may_preempt_at(rip)` is asked,
/// from a signal handler, whether C code interrupted at `rip` may be
/// switched away from; it must be async-signal-safe. Call before the
/// runtime starts.
pub fn enable(may_preempt_at: fn(usize) -> bool) {
    // SAFETY: getauxval only reads the auxiliary vector.
    let hwcap2 = unsafe { libc::getauxval(libc::AT_HWCAP2) };
    HAVE_FSGSBASE.store(hwcap2 & HWCAP2_FSGSBASE != 0, Relaxed);
    MAY_PREEMPT_AT.store(may_preempt_at as usize, Relaxed);
    ENABLED.store(true, Relaxed);
}

/// Whether [`enable`] was called.
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// The FS base: the running code's thread pointer.
#[inline(always)]
pub fn fs_base() -> usize {
    if HAVE_FSGSBASE.load(Relaxed) {
        let v: usize;
        // SAFETY: rdfsbase reads a register; FSGSBASE is enabled (checked).
        unsafe {
            core::arch::asm!("rdfsbase {}", out(reg) v, options(nomem, nostack, preserves_flags))
        };
        v
    } else {
        arch_prctl_get(ARCH_GET_FS)
    }
}

/// The GS base: the kthread's own thread pointer on a kthread of a
/// foreign-TLS runtime, 0 on every other thread.
#[inline(always)]
pub fn gs_base() -> usize {
    if HAVE_FSGSBASE.load(Relaxed) {
        let v: usize;
        // SAFETY: as in fs_base.
        unsafe {
            core::arch::asm!("rdgsbase {}", out(reg) v, options(nomem, nostack, preserves_flags))
        };
        v
    } else {
        arch_prctl_get(ARCH_GET_GS)
    }
}

/// Points FS at `tp`.
///
/// # Safety
/// `tp` must be a valid glibc thread control block that no other thread
/// uses as its thread pointer at the same time, and the caller must not
/// keep thread-local addresses computed before the switch (call through a
/// non-inlined function).
#[inline(always)]
pub unsafe fn set_fs_base(tp: usize) {
    if HAVE_FSGSBASE.load(Relaxed) {
        // SAFETY: the caller vouches for `tp`; wrfsbase writes a register.
        unsafe { core::arch::asm!("wrfsbase {}", in(reg) tp, options(nostack, preserves_flags)) };
    } else {
        arch_prctl_set(ARCH_SET_FS, tp);
    }
}

fn set_gs_base(v: usize) {
    if HAVE_FSGSBASE.load(Relaxed) {
        // SAFETY: GS is unused by Linux user space and by Rust; writing it
        // changes nothing but what gs_base reads.
        unsafe { core::arch::asm!("wrgsbase {}", in(reg) v, options(nostack, preserves_flags)) };
    } else {
        arch_prctl_set(ARCH_SET_GS, v);
    }
}

fn arch_prctl_get(code: libc::c_int) -> usize {
    let mut v: usize = 0;
    // SAFETY: ARCH_GET_FS/GS write one word at the address given.
    unsafe { libc::syscall(libc::SYS_arch_prctl, code, &mut v as *mut usize) };
    v
}

fn arch_prctl_set(code: libc::c_int, v: usize) {
    // SAFETY: ARCH_SET_FS/GS only set a register of this thread.
    unsafe { libc::syscall(libc::SYS_arch_prctl, code, v) };
}

/// Runs `f` on this kthread's own thread pointer when C code of a uthread
/// was interrupted (FS is the uthread's block), and puts FS back after:
/// for a signal handler that reads the runtime's per-kthread state but
/// never switches. Async-signal-safe. `f` runs as it is elsewhere.
#[inline(never)]
pub(crate) fn on_kthread_pointer_in_handler<R>(f: impl FnOnce() -> R) -> R {
    let (gs, fs) = (gs_base(), fs_base());
    if !enabled() || gs == 0 || fs == gs {
        return f();
    }
    // SAFETY: GS holds this kthread's own thread pointer.
    unsafe { set_fs_base(gs) };
    let r = f();
    // SAFETY: the interrupted code's own thread pointer, as it was; `f`
    // did not switch, so this is the same kernel thread.
    unsafe { set_fs_base(fs) };
    r
}

/// Marks the calling thread as runtime code (GS = its own FS). Kthreads do
/// it at start; the library does it on its own service threads.
pub fn mark_runtime_thread() {
    if enabled() {
        set_gs_base(fs_base());
    }
}

/// Marks the calling thread as not the runtime's (GS = 0): after `fork`,
/// in the child, where the runtime no longer exists.
pub fn unmark_thread() {
    if enabled() {
        set_gs_base(0);
    }
}

pub(crate) fn on_kthread_start() {
    mark_runtime_thread();
}

/// What a signal handler found when it came in.
pub(crate) enum Entry {
    /// Runtime code, or no foreign-TLS mode: nothing was switched.
    Runtime,
    /// C code of a uthread, now switched to the kthread's block; FS goes
    /// back to the C value on leaving.
    CCode { c_fs: usize },
    /// C code the library says must not be switched away from.
    Unsafe,
}

/// First thing of the preemption handler: moves FS to the kthread's block
/// if C code was interrupted. `ctx` is the handler's `ucontext_t`.
#[inline(always)]
pub(crate) fn enter_handler(ctx: *const libc::c_void) -> Entry {
    if !enabled() {
        return Entry::Runtime;
    }
    let gs = gs_base();
    let fs = fs_base();
    if gs == 0 || fs == gs {
        return Entry::Runtime;
    }
    let may = MAY_PREEMPT_AT.load(Relaxed);
    // SAFETY: the kernel passes a valid ucontext_t to SA_SIGINFO handlers.
    let rip = unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RIP as usize] }
        as usize;
    // SAFETY: MAY_PREEMPT_AT holds a `fn(usize) -> bool` stored by enable.
    let may: fn(usize) -> bool = unsafe { std::mem::transmute::<usize, fn(usize) -> bool>(may) };
    if !may(rip) {
        return Entry::Unsafe;
    }
    // SAFETY: GS holds this kthread's own thread pointer.
    unsafe { set_fs_base(gs) };
    Entry::CCode { c_fs: fs }
}

/// Last thing of the preemption handler, maybe on another kthread than
/// [`enter_handler`]'s: C code gets its block back; runtime code gets the
/// block of the kthread it now runs on.
#[inline(always)]
pub(crate) fn leave_handler(entry: Entry) {
    match entry {
        // SAFETY: the interrupted uthread's own block.
        Entry::CCode { c_fs } => unsafe { set_fs_base(c_fs) },
        Entry::Runtime if enabled() => {
            let gs = gs_base();
            if gs != 0 {
                // SAFETY: this kthread's own block.
                unsafe { set_fs_base(gs) };
            }
        }
        Entry::Runtime | Entry::Unsafe => {}
    }
}
