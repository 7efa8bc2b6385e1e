//! The global allocator wrapper: every allocation is a deferred-preemption
//! section, so a preemption signal never interrupts the allocator and then
//! re-enters it, and allocator thread caches are never used across a
//! migration.
//!
//! On glibc it calls glibc's own allocator by the names a program cannot
//! replace (`__libc_malloc` and kin), not `malloc`. In a native binary
//! the two are one. In the preload library (`ginza run`) the program may
//! bring its own `malloc` (Redis: jemalloc), which takes pthread mutexes
//! (served by the library: a waiter may park) and keeps per-thread state
//! behind the thread pointer; reached from runtime code, a wait inside it
//! moved the caller to another kthread still holding the first kthread's
//! state, and a wait begun under a runtime spinlock could wait for itself
//! (docs/preload.md, "The program's allocator"). glibc's allocator takes
//! only its internal locks, which never call back into the library.

use std::alloc::{GlobalAlloc, Layout};

use crate::deferral;

/// The C library's allocator with preemption deferred around each call.
pub struct PreemptSafeAlloc;

// SAFETY: delegates every call unchanged to the C library's allocator.
unsafe impl GlobalAlloc for PreemptSafeAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { libc_heap::alloc(layout) };
        deferral::enable(p);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { libc_heap::dealloc(ptr, layout) };
        deferral::enable(p);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { libc_heap::alloc_zeroed(layout) };
        deferral::enable(p);
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        let new = unsafe { libc_heap::realloc(ptr, layout, new_size) };
        deferral::enable(p);
        new
    }
}

/// glibc's allocator under the names that no `malloc` of the program
/// interposes; the same rules as `std::alloc::System` (which calls
/// `malloc`): `malloc` for an alignment it gives anyway, `memalign` above.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod libc_heap {
    use std::alloc::Layout;
    use std::ffi::c_void;

    // Exported by glibc since 2.2.5 (x86-64's first version).
    extern "C" {
        fn __libc_malloc(size: usize) -> *mut c_void;
        fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
        fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
        fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
        fn __libc_free(p: *mut c_void);
    }

    /// What glibc's `malloc` aligns every block to on x86-64 and aarch64.
    const MIN_ALIGN: usize = 16;

    fn plain(layout: Layout) -> bool {
        layout.align() <= MIN_ALIGN && layout.align() <= layout.size()
    }

    pub(super) unsafe fn alloc(layout: Layout) -> *mut u8 {
        // SAFETY: glibc's allocator; `memalign` takes any power of two.
        unsafe {
            if plain(layout) {
                __libc_malloc(layout.size()).cast()
            } else {
                __libc_memalign(layout.align(), layout.size()).cast()
            }
        }
    }

    pub(super) unsafe fn alloc_zeroed(layout: Layout) -> *mut u8 {
        if plain(layout) {
            // SAFETY: glibc's calloc.
            return unsafe { __libc_calloc(1, layout.size()).cast() };
        }
        // SAFETY: as alloc; the block has `layout.size()` writable bytes.
        unsafe {
            let p = alloc(layout);
            if !p.is_null() {
                p.write_bytes(0, layout.size());
            }
            p
        }
    }

    pub(super) unsafe fn dealloc(ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this module, hence from glibc.
        unsafe { __libc_free(ptr.cast()) }
    }

    pub(super) unsafe fn realloc(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this module with `layout` (GlobalAlloc's
        // contract); a new block is copied by the smaller size.
        unsafe {
            let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
            if plain(new_layout) {
                return __libc_realloc(ptr.cast(), new_size).cast();
            }
            let new = alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                dealloc(ptr, layout);
            }
            new
        }
    }
}

/// Elsewhere the system allocator as it is.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod libc_heap {
    use std::alloc::{GlobalAlloc, Layout, System};

    pub(super) unsafe fn alloc(layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    pub(super) unsafe fn alloc_zeroed(layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    pub(super) unsafe fn dealloc(ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    pub(super) unsafe fn realloc(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(feature = "global-allocator")]
#[global_allocator]
static GLOBAL: PreemptSafeAlloc = PreemptSafeAlloc;
