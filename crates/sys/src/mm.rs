//! Private memory mappings: uthread stacks with a guard page, and large
//! long-lived buffers that go back to the kernel when dropped.

use std::io;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

/// The size of a memory page.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// `len` bytes of fresh, zeroed, private read-write memory for a thread
/// stack: no swap is reserved for it (`MAP_NORESERVE`: most of a stack is
/// never touched) and the kernel may treat it as a stack (`MAP_STACK`).
pub fn map_stack(len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a null address lets the kernel choose where: the new mapping
    // replaces nothing and aliases no Rust object.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::STACK,
        )
    }?;
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Makes `len` bytes at `start` inaccessible: a touch faults (a guard
/// page).
///
/// # Safety
/// `start..start + len` is page-aligned memory of a mapping the caller
/// owns, and nothing references it.
pub unsafe fn protect_none(start: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller's contract.
    Ok(unsafe { rustix::mm::mprotect(start.as_ptr().cast(), len, MprotectFlags::empty()) }?)
}

/// Removes a mapping.
///
/// # Safety
/// `start..start + len` is a whole mapping made by this crate, and nothing
/// references its memory any more.
pub unsafe fn unmap(start: NonNull<u8>, len: usize) {
    // SAFETY: the caller's contract.
    let r = unsafe { rustix::mm::munmap(start.as_ptr().cast(), len) };
    debug_assert!(r.is_ok(), "munmap: {r:?}");
}

/// `len` bytes of private, zeroed memory in a mapping of their own, unmapped
/// when dropped.
///
/// For large buffers made and dropped while a daemon runs (a port's frame
/// pool): from the heap, each would come from a free chunk that `calloc`
/// must clear (every page touched at once) and, once freed, stay in the
/// allocator's arenas, split by smaller allocations, so the process's
/// resident memory would grow with each one. A mapping of its own is
/// touched only where it is used and returned whole.
pub struct AnonMemory {
    start: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (nothing else has its
// address), like a `Box<[u8]>`.
unsafe impl Send for AnonMemory {}
// SAFETY: shared access only reads, through `&[u8]`.
unsafe impl Sync for AnonMemory {}

impl AnonMemory {
    /// A fresh mapping of `len` zeroed bytes (`len` > 0).
    pub fn new(len: usize) -> io::Result<AnonMemory> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty anonymous mapping",
            ));
        }
        // SAFETY: a null address lets the kernel choose where: the new
        // mapping replaces nothing and aliases no Rust object.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        let start = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(AnonMemory { start, len })
    }
}

impl std::ops::Deref for AnonMemory {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `start..start + len` is this value's own readable
        // mapping, alive as long as `self`; writes need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AnonMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only
        // reference to the memory.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.len) }
    }
}

impl Drop for AnonMemory {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `new`; no reference to it
        // outlives `self`.
        unsafe { unmap(self.start, self.len) }
    }
}

impl std::fmt::Debug for AnonMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnonMemory")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "mmap is not supported by Miri")]
    fn a_stack_mapping_is_zeroed_and_writable() {
        let page = page_size();
        assert!(page.is_power_of_two() && page >= 4096);
        let len = 4 * page;
        let base = map_stack(len).unwrap();
        assert_eq!(base.as_ptr() as usize % page, 0);
        // SAFETY: `base..base + len` is the mapping made above, used only
        // here, and unmapped after the last access.
        unsafe {
            let top = base.as_ptr().add(len - 1);
            assert_eq!(top.read(), 0);
            top.write(9);
            assert_eq!(top.read(), 9);
            protect_none(base, page).unwrap();
            unmap(base, len);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap is not supported by Miri")]
    fn anonymous_memory_is_zeroed_writable_and_refuses_zero_length() {
        let mut m = AnonMemory::new(3 * page_size() + 5).unwrap();
        assert_eq!(m.len(), 3 * page_size() + 5);
        assert!(m.iter().all(|&b| b == 0));
        m[0] = 1;
        let last = m.len() - 1;
        m[last] = 2;
        assert_eq!((m[0], m[last]), (1, 2));
        let err = AnonMemory::new(0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
