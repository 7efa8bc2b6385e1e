//! The system calls behind a memfd region: create, seal, size, map, unmap.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Seals that make a memfd's size final: a runtime cannot shrink its region
/// under iokerneld (which would turn iokerneld's reads into SIGBUS).
pub(crate) const SIZE_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new close-on-exec memfd that allows sealing, `len` bytes long.
pub(crate) fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let name = CString::new(name.replace('\0', "_")).map_err(io::Error::other)?;
    // SAFETY: `name` is a valid C string; the flags are plain integers.
    let fd = cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: `fd` was just returned to us and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    Ok(fd)
}

pub(crate) fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

pub(crate) fn seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

pub(crate) fn size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let f = std::fs::File::from(fd.try_clone_to_owned()?);
    Ok(f.metadata()?.len())
}

/// Maps `len` bytes of `fd` shared, readable and writable.
pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    map_with(fd, len, libc::PROT_READ | libc::PROT_WRITE)
}

/// Maps `len` bytes of `fd` shared and read-only.
pub(crate) fn map_read_only(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    map_with(fd, len, libc::PROT_READ)
}

fn map_with(fd: BorrowedFd<'_>, len: usize, prot: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh mapping chosen by the kernel; it aliases no Rust object.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// # Safety
/// `base`/`len` is a mapping made by [`map`], no longer referenced.
pub(crate) unsafe fn unmap(base: NonNull<u8>, len: usize) {
    // SAFETY: caller's contract.
    let r = unsafe { libc::munmap(base.as_ptr().cast(), len) };
    debug_assert_eq!(r, 0, "munmap: {}", io::Error::last_os_error());
}
