//! uthread stacks: anonymous mappings with a guard page at the low end, so an
//! overflow faults (and is reported by the SIGSEGV handler in `signals`)
//! instead of corrupting the neighbouring memory.

use std::io;
use std::ptr::{null_mut, NonNull};

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

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
        let guard = page_size();
        let usable = usable.div_ceil(guard) * guard;
        let len = usable + guard;
        // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `base..base+guard` lies inside the mapping we just created.
        if unsafe { libc::mprotect(base, guard, libc::PROT_NONE) } != 0 {
            let err = io::Error::last_os_error();
            // SAFETY: unmapping the mapping created above, which nothing else references.
            unsafe { libc::munmap(base, len) };
            return Err(err);
        }
        Ok(Stack {
            base: NonNull::new(base.cast()).expect("mmap returned null"),
            len,
            guard,
        })
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
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
