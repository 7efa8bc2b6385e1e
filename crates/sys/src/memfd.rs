//! Sealable memfds and their shared mappings: the shared regions and
//! packet pools between iokerneld and a runtime.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Seals that make a memfd's size final: a runtime cannot shrink its region
/// under iokerneld (which would turn iokerneld's reads into SIGBUS).
pub const SIZE_SEALS: Seals = Seals::SHRINK.union(Seals::GROW).union(Seals::SEAL);

/// The seals of a memfd (`F_SEAL_*`).
pub type Seals = SealFlags;

/// A new close-on-exec memfd that allows sealing, `len` bytes long (zeros).
/// NUL bytes in `name` (only a label in `/proc`) become `_`.
pub fn create(name: &str, len: u64) -> io::Result<OwnedFd> {
    let name = name.replace('\0', "_");
    let fd = rustix::fs::memfd_create(
        name.as_str(),
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, len)?;
    Ok(fd)
}

/// Adds `seals` to the memfd.
pub fn add_seals(fd: BorrowedFd<'_>, seals: Seals) -> io::Result<()> {
    Ok(rustix::fs::fcntl_add_seals(fd, seals)?)
}

/// The memfd's seals.
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<Seals> {
    Ok(rustix::fs::fcntl_get_seals(fd)?)
}

/// The file's size in bytes.
pub fn size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_size as u64)
}

/// A second descriptor of the same file, opened read-only (through
/// `/proc/self/fd`): a process given only this one cannot `write` the file
/// nor map it shared and writable.
pub fn reopen_read_only(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(rustix::fs::open(
        path.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// The descriptor was opened read-only.
pub fn is_read_only(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    Ok(flags & rustix::fs::OFlags::RWMODE == rustix::fs::OFlags::RDONLY)
}

/// Maps `len` bytes of `fd` shared, readable and writable.
pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    map_with(fd, len, ProtFlags::READ | ProtFlags::WRITE)
}

/// Maps `len` bytes of `fd` shared and read-only.
pub fn map_read_only(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    map_with(fd, len, ProtFlags::READ)
}

fn map_with(fd: BorrowedFd<'_>, len: usize, prot: ProtFlags) -> io::Result<NonNull<u8>> {
    // SAFETY: a null address lets the kernel choose where: the new mapping
    // replaces nothing and aliases no Rust object.
    let p = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }?;
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Removes a mapping.
///
/// # Safety
/// `base`/`len` is a mapping made by [`map`] or [`map_read_only`] with this
/// length, and nothing references its memory any more.
pub unsafe fn unmap(base: NonNull<u8>, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { crate::mm::unmap(base, len) }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create/mmap are not supported by Miri")]
    fn a_sealed_memfd_keeps_its_size_and_its_mappings_share_bytes() {
        let fd = create("ginza-sys-test\0", 4096).unwrap();
        assert_eq!(size(fd.as_fd()).unwrap(), 4096);
        assert!(!seals(fd.as_fd()).unwrap().contains(Seals::SHRINK));
        add_seals(fd.as_fd(), SIZE_SEALS).unwrap();
        assert!(seals(fd.as_fd()).unwrap().contains(SIZE_SEALS));
        assert!(rustix::fs::ftruncate(&fd, 8192).is_err());
        let w = map(fd.as_fd(), 4096).unwrap();
        let r = map_read_only(fd.as_fd(), 4096).unwrap();
        // SAFETY: both mappings are 4096 bytes of the same live memfd, only
        // this test uses them, and they are unmapped after the last access.
        unsafe {
            w.as_ptr().add(100).write_volatile(7);
            assert_eq!(r.as_ptr().add(100).read_volatile(), 7);
            unmap(w, 4096);
            unmap(r, 4096);
        }
    }
}
