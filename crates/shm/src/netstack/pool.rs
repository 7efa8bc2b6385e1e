//! The payload pools of protected mode (docs/protected.md, "Memory").
//!
//! * The **receive pool** of one application: a memfd the netstack creates,
//!   maps writable, then seals with `F_SEAL_FUTURE_WRITE` (and against
//!   resizing). The application gets a descriptor opened `O_RDONLY`
//!   ([`RxPool::app_fd`]) and maps it read-only ([`RxPoolView`]): a
//!   writable shared mapping, an `mprotect(PROT_WRITE)` and a `write(2)`
//!   all fail, and a store through the mapping is SIGSEGV. It is cut into
//!   [`RX_CHUNK`]-byte chunks; one `new_data` item lies in one chunk.
//! * The **transmit pool** of one application: a memfd the application
//!   creates and writes ([`TxPool`]), sealed against resizing; the netstack
//!   (and iokerneld, for zero-touch transmit) map it read-only
//!   ([`TxPoolView`]). The application may keep writing it while the
//!   netstack reads: it can only garble its own payload.
//!
//! Every access goes through a bounds-checked [`Range`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use ginza_sys::memfd::{self, Seals};

use super::{OutOfPool, Range};

/// Bytes of one receive-pool chunk (one `new_data` item at most).
pub const RX_CHUNK: u32 = 2048;
/// Largest pool either side accepts.
pub const MAX_POOL_BYTES: u64 = 1 << 30;

/// Why a pool could not be created, mapped or read.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "pool of {0} bytes: must be a whole number of pages, 1 page to {MAX_POOL_BYTES} bytes"
    )]
    Size(u64),
    #[error("pool memfd is {found} bytes, expected {expected}")]
    SizeMismatch { found: u64, expected: u64 },
    #[error("pool memfd lacks seals {missing:#x} (has {has:#x})")]
    NotSealed { missing: u32, has: u32 },
    #[error("receive pool descriptor is writable: the netstack must pass one opened O_RDONLY")]
    WritableFd,
    #[error(transparent)]
    OutOfPool(#[from] OutOfPool),
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> PoolError {
    move |source| PoolError::Io { op, source }
}

const PAGE: u64 = 4096;

fn check_size(len: u64) -> Result<(), PoolError> {
    if len == 0 || len > MAX_POOL_BYTES || len % PAGE != 0 {
        return Err(PoolError::Size(len));
    }
    Ok(())
}

fn check_seals(fd: BorrowedFd<'_>, need: Seals) -> Result<(), PoolError> {
    let has = memfd::seals(fd).map_err(io_err("F_GET_SEALS"))?;
    if !has.contains(need) {
        return Err(PoolError::NotSealed {
            missing: (need - has).bits(),
            has: has.bits(),
        });
    }
    Ok(())
}

fn check_len(fd: BorrowedFd<'_>, expected: u64) -> Result<(), PoolError> {
    let found = memfd::size(fd).map_err(io_err("fstat"))?;
    if found != expected {
        return Err(PoolError::SizeMismatch { found, expected });
    }
    Ok(())
}

/// A mapping of a pool and its descriptor.
#[derive(Debug)]
struct Mapped {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: u64,
}

// SAFETY: plain shared bytes, reached only through bounds-checked copies
// and slices tied to the borrow of the owner.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: mapped with this length by `memfd::map`/`map_read_only`;
        // slices into it borrow the owner, so none is left.
        unsafe { memfd::unmap(self.base, self.len as usize) };
    }
}

impl Mapped {
    fn ptr(&self, r: Range) -> Result<*mut u8, OutOfPool> {
        r.check(self.len)?;
        // SAFETY: `r.offset <= len` (checked), so the pointer stays inside
        // the mapping or one past its end.
        Ok(unsafe { self.base.as_ptr().add(r.offset as usize) })
    }

    /// Copies the bytes of `r` into `out` (at most `out.len()`).
    fn copy_out(&self, r: Range, out: &mut [u8]) -> Result<usize, OutOfPool> {
        let p = self.ptr(r)?;
        let n = (r.len as usize).min(out.len());
        // SAFETY: `[p, p + n)` lies inside the mapping (checked above);
        // `out` is private memory and cannot overlap the shared mapping.
        // A peer writing these bytes meanwhile garbles only the copy.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n) };
        Ok(n)
    }
}

/// The netstack's side of one application's receive pool (writable).
#[derive(Debug)]
pub struct RxPool(Mapped);

impl RxPool {
    /// A new pool of `chunks` chunks of [`RX_CHUNK`] bytes, mapped writable
    /// here and sealed so that nobody can map or write it writable again.
    pub fn create(name: &str, chunks: u32) -> Result<RxPool, PoolError> {
        let len = u64::from(chunks) * u64::from(RX_CHUNK);
        check_size(len)?;
        let fd = memfd::create(name, len).map_err(io_err("memfd_create"))?;
        let base = memfd::map(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        let pool = RxPool(Mapped { fd, base, len });
        // After our own writable mapping: it keeps working, new writable
        // ones (the application's) are refused.
        memfd::add_seals(pool.0.fd.as_fd(), memfd::SIZE_SEALS | Seals::FUTURE_WRITE)
            .map_err(io_err("F_ADD_SEALS"))?;
        Ok(pool)
    }

    pub fn len(&self) -> u64 {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    pub fn chunks(&self) -> u32 {
        (self.0.len / u64::from(RX_CHUNK)) as u32
    }

    /// The range of chunk `chunk` filled with `len` bytes.
    pub fn chunk_range(chunk: u32, len: u32) -> Range {
        Range::new(chunk.saturating_mul(RX_CHUNK), len.min(RX_CHUNK))
    }

    /// The chunk `offset` starts, if it is a chunk boundary.
    pub fn chunk_of(offset: u32) -> Option<u32> {
        (offset % RX_CHUNK == 0).then_some(offset / RX_CHUNK)
    }

    /// Chunk `chunk`'s bytes, to fill with received payload before the
    /// `new_data` event names it. `None` for a chunk out of range.
    pub fn chunk_mut(&mut self, chunk: u32) -> Option<&mut [u8]> {
        let p = self.0.ptr(Self::chunk_range(chunk, RX_CHUNK)).ok()?;
        if u64::from(chunk) >= u64::from(self.chunks()) {
            return None;
        }
        // SAFETY: a whole chunk inside our writable mapping; `&mut self`
        // makes this the only slice this side hands out; the application
        // maps it read-only, so nobody else writes it.
        Some(unsafe { std::slice::from_raw_parts_mut(p, RX_CHUNK as usize) })
    }

    /// A descriptor for the application: the same memfd opened `O_RDONLY`.
    pub fn app_fd(&self) -> Result<OwnedFd, PoolError> {
        memfd::reopen_read_only(self.0.fd.as_fd()).map_err(io_err("reopen read-only"))
    }
}

/// The application's read-only view of its receive pool.
#[derive(Debug)]
pub struct RxPoolView(Mapped);

impl RxPoolView {
    /// Maps the pool the netstack passed, after checking that the
    /// descriptor is read-only, the seals and the size.
    pub fn map(fd: OwnedFd, len: u64) -> Result<RxPoolView, PoolError> {
        check_size(len)?;
        if !memfd::is_read_only(fd.as_fd()).map_err(io_err("F_GETFL"))? {
            return Err(PoolError::WritableFd);
        }
        check_seals(
            fd.as_fd(),
            Seals::SHRINK | Seals::GROW | Seals::FUTURE_WRITE,
        )?;
        check_len(fd.as_fd(), len)?;
        let base = memfd::map_read_only(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        Ok(RxPoolView(Mapped { fd, base, len }))
    }

    pub fn len(&self) -> u64 {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The received bytes of `r` (from a `new_data` event), in place.
    pub fn get(&self, r: Range) -> Result<&[u8], PoolError> {
        let p = self.0.ptr(r)?;
        // SAFETY: inside the mapping (checked). The netstack writes a chunk
        // only while it is not lent to us, so these bytes stay put until
        // the application gives the range back with `recv_done`.
        Ok(unsafe { std::slice::from_raw_parts(p, r.len as usize) })
    }

    /// Start of the read-only mapping, for tests that try to write it.
    pub fn base_ptr(&self) -> *const u8 {
        self.0.base.as_ptr()
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }
}

/// The application's transmit pool (writable, its own).
#[derive(Debug)]
pub struct TxPool(Mapped);

impl TxPool {
    /// A new pool of `len` bytes (whole pages), sealed against resizing.
    pub fn create(name: &str, len: u64) -> Result<TxPool, PoolError> {
        check_size(len)?;
        let fd = memfd::create(name, len).map_err(io_err("memfd_create"))?;
        memfd::add_seals(fd.as_fd(), memfd::SIZE_SEALS).map_err(io_err("F_ADD_SEALS"))?;
        let base = memfd::map(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        Ok(TxPool(Mapped { fd, base, len }))
    }

    pub fn len(&self) -> u64 {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The memfd, to pass to the netstack at attach.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }

    /// The bytes of `r`, to write payload into before `send` names them.
    pub fn get_mut(&mut self, r: Range) -> Result<&mut [u8], PoolError> {
        let p = self.0.ptr(r)?;
        // SAFETY: inside our writable mapping (checked); `&mut self` makes
        // this the only slice this side hands out; the netstack and
        // iokerneld only read.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, r.len as usize) })
    }

    /// The bytes of `r`.
    pub fn get(&self, r: Range) -> Result<&[u8], PoolError> {
        let p = self.0.ptr(r)?;
        // SAFETY: inside the mapping (checked); only this side writes it,
        // and not while `&self` is borrowed.
        Ok(unsafe { std::slice::from_raw_parts(p, r.len as usize) })
    }
}

/// The netstack's (or iokerneld's) read-only view of an application's
/// transmit pool. The application may write it concurrently, so bytes are
/// only ever copied out, never lent as slices.
#[derive(Debug)]
pub struct TxPoolView(Mapped);

impl TxPoolView {
    /// Maps the pool an application passed, after checking its seals (it
    /// cannot shrink under us: no SIGBUS) and size.
    pub fn map(fd: OwnedFd) -> Result<TxPoolView, PoolError> {
        check_seals(fd.as_fd(), Seals::SHRINK | Seals::GROW)?;
        let len = memfd::size(fd.as_fd()).map_err(io_err("fstat"))?;
        check_size(len)?;
        let base = memfd::map_read_only(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        Ok(TxPoolView(Mapped { fd, base, len }))
    }

    pub fn len(&self) -> u64 {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Checks that `r` lies in the pool.
    pub fn check(&self, r: Range) -> Result<(), OutOfPool> {
        r.check(self.0.len)
    }

    /// Copies `r`'s bytes (at most `out.len()`) into `out`.
    pub fn copy_out(&self, r: Range, out: &mut [u8]) -> Result<usize, OutOfPool> {
        self.0.copy_out(r, out)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "memfd")]
    fn rx_pool_is_read_only_for_the_application() {
        let mut rx = RxPool::create("test-rx", 4).unwrap();
        assert_eq!(rx.chunks(), 4);
        rx.chunk_mut(1).unwrap()[..5].copy_from_slice(b"hello");
        assert!(rx.chunk_mut(4).is_none());
        let fd = rx.app_fd().unwrap();
        assert!(memfd::is_read_only(fd.as_fd()).unwrap());
        // The application cannot map it writable: not through this fd, not
        // through a descriptor re-opened read-write (the seal holds).
        assert!(memfd::map(fd.as_fd(), 4 * RX_CHUNK as usize).is_err());
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ))
            .unwrap();
        assert!(memfd::map(rw.as_fd(), 4 * RX_CHUNK as usize).is_err());
        assert!(std::os::unix::fs::FileExt::write_at(&rw, b"x", 0).is_err());
        let view = RxPoolView::map(fd, 4 * u64::from(RX_CHUNK)).unwrap();
        let r = RxPool::chunk_range(1, 5);
        assert_eq!(view.get(r).unwrap(), b"hello");
        assert!(matches!(
            view.get(Range::new(4 * RX_CHUNK - 1, 2)),
            Err(PoolError::OutOfPool(_))
        ));
        // mprotect cannot make the read-only mapping writable.
        // SAFETY: asks the kernel to change protection of our own mapping;
        // it refuses, so no Rust reference is invalidated.
        let rc = unsafe {
            libc::mprotect(
                view.base_ptr() as *mut libc::c_void,
                4 * RX_CHUNK as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        assert_eq!(rc, -1, "mprotect(PROT_WRITE) on the receive pool must fail");
        // A writable descriptor is refused by the application side.
        assert!(matches!(
            RxPoolView::map(rw.into(), 4 * u64::from(RX_CHUNK)),
            Err(PoolError::WritableFd)
        ));
        // A wrong size is refused.
        assert!(matches!(
            RxPoolView::map(rx.app_fd().unwrap(), 8 * u64::from(RX_CHUNK)),
            Err(PoolError::SizeMismatch { .. })
        ));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd")]
    fn tx_pool_reads_are_bounds_checked() {
        let mut tx = TxPool::create("test-tx", 8192).unwrap();
        tx.get_mut(Range::new(8190, 2))
            .unwrap()
            .copy_from_slice(b"ok");
        assert!(tx.get_mut(Range::new(8191, 2)).is_err());
        let view = TxPoolView::map(tx.fd().try_clone_to_owned().unwrap()).unwrap();
        let mut out = [0u8; 4];
        assert_eq!(view.copy_out(Range::new(8190, 2), &mut out), Ok(2));
        assert_eq!(&out[..2], b"ok");
        assert_eq!(
            view.copy_out(Range::new(8190, 3), &mut out),
            Err(OutOfPool {
                offset: 8190,
                len: 3,
                pool_len: 8192
            })
        );
        // An unsealed memfd is refused (it could shrink: SIGBUS).
        let plain = memfd::create("plain", 8192).unwrap();
        assert!(matches!(
            TxPoolView::map(plain),
            Err(PoolError::NotSealed { .. })
        ));
        assert!(matches!(
            TxPool::create("x", 100),
            Err(PoolError::Size(100))
        ));
    }
}
