//! The application's tx pool (docs/design.md, "Protected mode (DLibOS)":
//! zero-touch transmit): a sealed memfd this process maps writable and the
//! netstack maps read-only, cut into fixed chunks. `write` copies the
//! caller's bytes into free chunks (that copy is the application's, as a
//! kernel's `write` copies into its socket buffer) and `send`s their
//! offsets; the chunks come back when `data_acked` counts their bytes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use ginza_shm::netstack::Range;
use ginza_sys::memfd;

use crate::spinlock::SpinLock;

/// Bytes of one chunk (one segment's worth of payload fits).
pub const TX_CHUNK: u32 = 2048;

/// The tx pool and its free chunks.
pub(crate) struct TxPool {
    fd: OwnedFd,
    base: NonNull<u8>,
    chunks: u32,
    free: SpinLock<Vec<u32>>,
}

// SAFETY: the mapping lives as long as the value; a chunk is written only
// by the holder of its index (taken from `free` under its lock), so no two
// writers share bytes, and the netstack only reads.
unsafe impl Send for TxPool {}
// SAFETY: as above.
unsafe impl Sync for TxPool {}

impl TxPool {
    /// A pool of `chunks` chunks, its size sealed (the netstack may trust
    /// it not to shrink under its reads).
    pub(crate) fn create(name: &str, chunks: u32) -> io::Result<TxPool> {
        // Whole pages (the netstack maps it), at most 1 GiB (its limit).
        if chunks == 0 || chunks > 1 << 19 || !chunks.is_multiple_of(2) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a tx pool of {chunks} chunks (an even number, 2 to 2^19)"),
            ));
        }
        let len = u64::from(chunks) * u64::from(TX_CHUNK);
        let fd = memfd::create(name, len)?;
        let base = memfd::map(fd.as_fd(), len as usize)?;
        memfd::add_seals(fd.as_fd(), memfd::SIZE_SEALS)?;
        Ok(TxPool {
            fd,
            base,
            chunks,
            free: SpinLock::new((0..chunks).rev().collect()),
        })
    }

    /// The memfd, to pass to the netstack.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn free_chunks(&self) -> usize {
        self.free.lock().len()
    }

    /// Copies as much of `data` as fits into at most `max` free chunks;
    /// the `(chunk, len)` pairs used, in order (empty if none is free).
    pub(crate) fn fill(&self, data: &[u8], max: usize) -> Vec<(u32, u32)> {
        let want = data.len().div_ceil(TX_CHUNK as usize).min(max);
        let taken: Vec<u32> = {
            let mut free = self.free.lock();
            let n = want.min(free.len());
            let at = free.len() - n;
            free.split_off(at)
        };
        let mut out = Vec::with_capacity(taken.len());
        for (chunk, part) in taken.into_iter().zip(data.chunks(TX_CHUNK as usize)) {
            // SAFETY: `chunk < chunks` (only such indices are ever free), so
            // its TX_CHUNK bytes lie inside the writable mapping; it was just
            // taken off the free list, so no one else writes it; `part` is
            // at most TX_CHUNK bytes of the caller's memory.
            unsafe {
                let dst = self.base.as_ptr().add(chunk as usize * TX_CHUNK as usize);
                std::ptr::copy_nonoverlapping(part.as_ptr(), dst, part.len());
            }
            out.push((chunk, part.len() as u32));
        }
        out
    }

    /// The pool range of `len` bytes of `chunk`.
    pub(crate) fn range(chunk: u32, len: u32) -> Range {
        Range::new(chunk * TX_CHUNK, len)
    }

    /// Gives chunks back.
    pub(crate) fn release(&self, chunks: Vec<u32>) {
        let mut free = self.free.lock();
        for c in chunks {
            debug_assert!(c < self.chunks && !free.contains(&c));
            free.push(c);
        }
    }
}

impl Drop for TxPool {
    fn drop(&mut self) {
        let len = self.chunks as usize * TX_CHUNK as usize;
        // SAFETY: mapped by `memfd::map` with this length; nothing borrows it
        // (writes go through `fill` only).
        unsafe { memfd::unmap(self.base, len) };
    }
}
