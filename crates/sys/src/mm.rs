//! Private memory mappings: uthread stacks with a guard page.

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
}
