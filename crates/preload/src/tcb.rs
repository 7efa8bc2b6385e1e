//! Thread control blocks for program threads: glibc's own TLS allocator
//! (`_dl_allocate_tls`, the one `pthread_create` uses) lays out every
//! module's static TLS and the DTV; this file fills in the header fields
//! C code and glibc read through the thread pointer.
//!
//! Fields set (x86-64 `tcbhead_t`, a stable ABI: the compiler reads the
//! stack guard at `%fs:0x28`): `tcb` and `self` (the block itself;
//! `pthread_self` returns `self`), `multiple_threads`, the stack and
//! pointer guards (copied from a running thread, as glibc does), the
//! descriptor's list link (self-linked, so `fork`'s child can unlink it),
//! its `tid` (one of its own, no kernel thread's: [`own_tid`]), and the
//! rseq area's `cpu_id` (-1: `sched_getcpu` asks the kernel instead of
//! reading a stale CPU). The list and tid offsets are
//! private to glibc; they are found at start by looking for the initial
//! thread's tid in its own descriptor.
//!
//! Each block also carries a mark in a header word glibc leaves unused
//! (`unused_vgetcpu_cache[0]`), so that a kernel thread glibc made behind
//! the library's back, which inherits its creator's GS, is not taken for
//! a program thread (`mode.rs`).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

use ginza_runtime::foreign_tls::fs_base;

const SELF_OFF: usize = 0x10;
const MULTIPLE_THREADS_OFF: usize = 0x18;
const STACK_GUARD_OFF: usize = 0x28;
const POINTER_GUARD_OFF: usize = 0x30;
/// `tcbhead_t.unused_vgetcpu_cache[0]`: kept by glibc, never read.
const MARK_OFF: usize = 0x38;
/// What [`allocate`] writes at [`MARK_OFF`] ("ginza tcb").
const MARK: usize = 0x6769_6e7a_6174_6362;

static ALLOCATE: AtomicUsize = AtomicUsize::new(0);
static DEALLOCATE: AtomicUsize = AtomicUsize::new(0);
/// Offset of `struct pthread`'s `tid`; 0 if not found.
static TID_OFF: AtomicUsize = AtomicUsize::new(0);
/// Offset of the rseq area from the thread pointer; 0: none registered.
static RSEQ_OFF: AtomicUsize = AtomicUsize::new(0);

type AllocateTls = unsafe extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
type DeallocateTls = unsafe extern "C" fn(*mut libc::c_void, bool);

fn symbol(name: &[u8]) -> usize {
    // SAFETY: NUL-terminated names; RTLD_DEFAULT searches every loaded object.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr().cast()) as usize }
}

/// Finds glibc's TLS allocator and the descriptor offsets; on the initial
/// thread, before any uthread exists. Err says what is missing.
pub(crate) fn init() -> Result<(), String> {
    let alloc = symbol(b"_dl_allocate_tls\0");
    let dealloc = symbol(b"_dl_deallocate_tls\0");
    if alloc == 0 || dealloc == 0 {
        return Err("glibc's _dl_allocate_tls/_dl_deallocate_tls not found (a glibc-based system is needed)".into());
    }
    ALLOCATE.store(alloc, Relaxed);
    DEALLOCATE.store(dealloc, Relaxed);
    let tp = fs_base();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // `struct pthread` starts with a 192-byte (or larger) header; its tid
    // follows a two-pointer list link.
    let found = (192..2048).step_by(4).find(|off| {
        // SAFETY: the initial thread's descriptor is far larger than 2 KiB.
        unsafe { ((tp + off) as *const i32).read() == tid }
    });
    TID_OFF.store(found.unwrap_or(0), Relaxed);
    let off = symbol(b"__rseq_offset\0");
    let size = symbol(b"__rseq_size\0");
    // SAFETY: glibc's exported rseq variables, when present.
    if off != 0 && size != 0 && unsafe { (size as *const u32).read() } != 0 {
        // SAFETY: as above.
        RSEQ_OFF.store(unsafe { (off as *const isize).read() } as usize, Relaxed);
    }
    Ok(())
}

/// A new thread control block for a program thread: every module's TLS at
/// its initial values. Call from runtime code (FS is a running thread's).
pub(crate) fn allocate() -> Option<usize> {
    // SAFETY: set by init to glibc's function of this signature.
    let alloc: AllocateTls = unsafe { std::mem::transmute(ALLOCATE.load(Relaxed)) };
    // SAFETY: null asks glibc to allocate the block itself.
    let tcb = unsafe { alloc(std::ptr::null_mut()) } as usize;
    if tcb == 0 {
        return None;
    }
    let running = fs_base();
    // SAFETY: `tcb` is a fresh, zeroed descriptor of at least the header's
    // size; `running` is the calling thread's live descriptor.
    unsafe {
        let put = |off: usize, v: usize| ((tcb + off) as *mut usize).write(v);
        let get = |off: usize| ((running + off) as *const usize).read();
        put(0, tcb);
        put(SELF_OFF, tcb);
        ((tcb + MULTIPLE_THREADS_OFF) as *mut i32).write(1);
        put(STACK_GUARD_OFF, get(STACK_GUARD_OFF));
        put(POINTER_GUARD_OFF, get(POINTER_GUARD_OFF));
        put(MARK_OFF, MARK);
        let tid_off = TID_OFF.load(Relaxed);
        if tid_off != 0 {
            let list = tcb + tid_off - 16;
            put(tid_off - 16, list);
            put(tid_off - 8, list);
            ((tcb + tid_off) as *mut i32).write(own_tid());
        }
        let rseq = RSEQ_OFF.load(Relaxed);
        if rseq != 0 {
            ((tcb.wrapping_add(rseq) + 4) as *mut i32).write(-1);
        }
    }
    Some(tcb)
}

/// A tid no kernel thread has, for a new block: glibc's recursive locks
/// (the dynamic linker's among them) name their holder by the tid in the
/// holder's descriptor, so two program threads with one tid would both
/// enter, and a thread moved to another kthread while holding one must
/// still unlock it. Kernel tids stay below `PID_MAX_LIMIT` (2^22); these
/// count up from there and stay under glibc's tid mask (2^30), wrapping
/// after about a billion threads.
fn own_tid() -> i32 {
    const FIRST: u32 = 1 << 22;
    const END: u32 = 1 << 30;
    static COUNT: AtomicU32 = AtomicU32::new(0);
    (FIRST + COUNT.fetch_add(1, Relaxed) % (END - FIRST)) as i32
}

/// Whether the thread pointer `tp` of a running thread is a block made by
/// [`allocate`]: async-signal-safe (one load).
#[inline(always)]
pub(crate) fn is_program_thread_block(tp: usize) -> bool {
    // SAFETY: `tp` is a running thread's thread pointer: a glibc thread
    // control block, whose header is larger than MARK_OFF + 8 bytes.
    unsafe { ((tp + MARK_OFF) as *const usize).read_volatile() == MARK }
}

static CTYPE_INIT: AtomicUsize = AtomicUsize::new(0);

/// What glibc's thread start sets in a new thread's TLS before the start
/// routine: the `<ctype.h>` table pointers (`isalpha` and friends read
/// them). Call on the new block, before any C code.
pub(crate) fn init_thread_locals() {
    let mut f = CTYPE_INIT.load(Relaxed);
    if f == 0 {
        f = symbol(b"__ctype_init\0").max(1);
        CTYPE_INIT.store(f, Relaxed);
    }
    if f > 1 {
        // SAFETY: glibc's `void __ctype_init(void)`.
        let init: unsafe extern "C" fn() = unsafe { std::mem::transmute(f) };
        // SAFETY: sets the current thread pointer's ctype pointers.
        unsafe { init() };
    }
}

/// Frees a block made by [`allocate`].
///
/// # Safety
/// No code runs on `tcb` any more.
pub(crate) unsafe fn free(tcb: usize) {
    // SAFETY: set by init to glibc's function of this signature.
    let dealloc: DeallocateTls = unsafe { std::mem::transmute(DEALLOCATE.load(Relaxed)) };
    // SAFETY: the caller's contract; `true` frees the block with the DTV.
    unsafe { dealloc(tcb as *mut libc::c_void, true) };
}
