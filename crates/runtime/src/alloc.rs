//! The global allocator wrapper: every allocation is a deferred-preemption
//! section, so a preemption signal never interrupts the allocator and then
//! re-enters it, and allocator thread caches are never used across a
//! migration.

use std::alloc::{GlobalAlloc, Layout, System};

use crate::deferral;

/// The system allocator with preemption deferred around each call.
pub struct PreemptSafeAlloc;

// SAFETY: delegates every call unchanged to the system allocator.
unsafe impl GlobalAlloc for PreemptSafeAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc(layout) };
        deferral::enable(p);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) };
        deferral::enable(p);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        deferral::enable(p);
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = deferral::disable();
        // SAFETY: forwarded with the caller's guarantees.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        deferral::enable(p);
        new
    }
}

#[cfg(feature = "global-allocator")]
#[global_allocator]
static GLOBAL: PreemptSafeAlloc = PreemptSafeAlloc;
