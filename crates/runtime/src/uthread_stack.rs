//! uthread stacks: anonymous mappings with a guard page at the low end, so an
//! overflow faults (and is reported by the SIGSEGV handler in `signals`)
//! instead of corrupting the neighbouring memory.

use std::io;
use std::ptr::NonNull;

use ginza_sys::mm;

/// One mapped stack; unmapped on drop.
pub(crate) struct Stack {
    base: NonNull<u8>,
    len: usize,
    guard: usize,
}

// SAFETY: a Stack is plain owned memory; moving it between threads is fine.
unsafe impl Send for Stack {}

impl Stack {
    /// Maps `usable` bytes (rounded up to pages) plus one guard page.
    pub(crate) fn new(usable: usize) -> io::Result<Stack> {
        let guard = mm::page_size();
        let usable = usable.div_ceil(guard) * guard;
        let len = usable + guard;
        let base = mm::map_stack(len)?;
        // SAFETY: `base..base+guard` is the first page of the mapping just
        // made, which nothing references yet.
        if let Err(err) = unsafe { mm::protect_none(base, guard) } {
            // SAFETY: unmapping the mapping created above, which nothing else references.
            unsafe { mm::unmap(base, len) };
            return Err(err);
        }
        Ok(Stack { base, len, guard })
    }

    /// High end of the stack (stacks grow down).
    pub(crate) fn top(&self) -> *mut u8 {
        // SAFETY: one past the end of our own mapping.
        unsafe { self.base.as_ptr().add(self.len) }
    }

    /// Address range of the guard page, `[start, end)`.
    pub(crate) fn guard_range(&self) -> (usize, usize) {
        let start = self.base.as_ptr() as usize;
        (start, start + self.guard)
    }

    pub(crate) fn usable_size(&self) -> usize {
        self.len - self.guard
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and no context runs on it any more
        // (stacks are only dropped after their uthread has exited).
        unsafe { mm::unmap(self.base, self.len) };
    }
}
