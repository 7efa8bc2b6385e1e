//! Packets between iokerneld and a runtime (docs/design.md, "Shared memory
//! between iokerneld and a runtime").
//!
//! * **Ingress**: iokerneld copies each received frame into a buffer of the
//!   application's [`IngressPool`] — a memfd that iokerneld creates, writes,
//!   and seals with `F_SEAL_FUTURE_WRITE`, so the runtime can only map it
//!   read-only and no runtime ever sees another's packets — and pushes a
//!   [`PacketDesc`] on the kthread's ingress ring. The runtime gives the
//!   buffer back by pushing its index on one of its done rings when it is
//!   finished with it (a socket may hold it until the application reads).
//!   iokerneld checks each returned index against its [`BufferLedger`].
//! * **Egress**: each kthread owns `capacity` buffers in its own region
//!   ([`EgressBuffers`]), paired with the slots of its egress ring: the
//!   packet with sequence number `s` is in buffer `s % capacity`. The
//!   runtime fills the buffer and then pushes the descriptor; iokerneld
//!   copies the frame out and only then releases the slot
//!   ([`Consumer::peek`](crate::ring::Consumer::peek) / `release`), so no
//!   buffer needs returning and nothing on the egress side is iokerneld's
//!   to lose.
//!
//! Lengths and indices read from the peer are checked before use.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use ginza_sys::memfd::{self, Seals};

use crate::ring::{Keep, Pod};

/// Bytes of every packet buffer, ingress and egress: a 1514-byte Ethernet
/// frame fits, and buffers stay cache-line aligned.
pub const PKT_BUFFER_SIZE: u32 = 2048;

/// Most ingress buffers one application may have.
pub const MAX_INGRESS_BUFFERS: u32 = 1 << 16;

/// One packet on an ingress or egress ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketDesc {
    /// Ingress: the pool buffer. Egress: ignored (the slot names the buffer).
    pub buf: u32,
    /// Frame length in bytes.
    pub len: u32,
    /// Flow hash iokerneld steered by (ingress), 0 otherwise.
    pub hash: u32,
    pub reserved: u32,
}

// SAFETY: four integers, no padding; every bit pattern is valid.
unsafe impl Pod for PacketDesc {}

const _: () = assert!(std::mem::size_of::<PacketDesc>() == 16);

/// One kthread's egress buffers in its region.
pub struct EgressBuffers {
    base: NonNull<u8>,
    count: u32,
    _keep: Keep,
}

// SAFETY: the buffers are plain bytes reached through raw copies; the
// memory is kept alive by `_keep`.
unsafe impl Send for EgressBuffers {}

impl EgressBuffers {
    /// # Safety
    /// `base` is valid for reads and writes of `count * PKT_BUFFER_SIZE`
    /// bytes while `keep` lives; `count` is a power of two.
    pub(crate) unsafe fn new(base: NonNull<u8>, count: u32, keep: Keep) -> Self {
        EgressBuffers {
            base,
            count,
            _keep: keep,
        }
    }

    #[inline]
    fn ptr(&self, seq: u32) -> *mut u8 {
        let i = (seq & (self.count - 1)) as usize;
        // SAFETY: `i < count`, so the buffer lies inside the area.
        unsafe { self.base.as_ptr().add(i * PKT_BUFFER_SIZE as usize) }
    }

    /// Runtime side: the buffer of the packet with sequence number `seq`,
    /// to build a frame in. Only for a slot the ring has free (checked
    /// with `Producer::free` before), which iokerneld does not read.
    pub fn buffer_mut(&mut self, seq: u32) -> &mut [u8] {
        // SAFETY: inside the area; `&mut self` makes this the only
        // reference this handle gives out, and the ring protocol keeps the
        // consumer off a free slot's buffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(seq), PKT_BUFFER_SIZE as usize) }
    }

    /// iokerneld side: the first `N` bytes (at most a buffer) of the packet
    /// with sequence number `seq`, read in place, without a call: for a
    /// header looked at before the frame is copied. The runtime may change
    /// the buffer meanwhile, so what the header decided must be checked
    /// again on the copy.
    #[inline]
    pub fn prefix<const N: usize>(&self, seq: u32) -> [u8; N] {
        const { assert!(N <= PKT_BUFFER_SIZE as usize) };
        // SAFETY: `N <= PKT_BUFFER_SIZE` bytes inside the buffer, read
        // unaligned; every byte pattern is a valid array.
        unsafe { std::ptr::read_unaligned(self.ptr(seq).cast::<[u8; N]>()) }
    }

    /// iokerneld side: copies the first `len` bytes (clamped to the buffer)
    /// of the packet with sequence number `seq` into `out`; returns the
    /// length copied. A runtime that writes the buffer meanwhile corrupts
    /// only its own packet.
    pub fn read(&self, seq: u32, len: u32, out: &mut [u8]) -> usize {
        let n = (len.min(PKT_BUFFER_SIZE) as usize).min(out.len());
        // SAFETY: `n <= PKT_BUFFER_SIZE` bytes inside the buffer; `out` is
        // our own memory and cannot overlap the shared mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(seq), out.as_mut_ptr(), n) };
        n
    }
}

/// Why an ingress pool could not be created or mapped.
#[derive(Debug, thiserror::Error)]
pub enum PoolMapError {
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("ingress pool of {0} buffers: must be 1..={MAX_INGRESS_BUFFERS}")]
    Count(u32),
    #[error("ingress pool memfd is {found} bytes, expected {expected}")]
    Size { found: u64, expected: u64 },
    #[error("ingress pool memfd seals {0:#x} lack shrink/future-write sealing")]
    NotSealed(i32),
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> PoolMapError {
    move |source| PoolMapError::Io { op, source }
}

/// An application's ingress buffers: written by iokerneld, read-only in the
/// runtime.
#[derive(Debug)]
pub struct IngressPool {
    fd: OwnedFd,
    base: NonNull<u8>,
    count: u32,
    writable: bool,
}

// SAFETY: plain shared bytes, reached through bounds-checked copies and
// slices; the mapping lives as long as the value.
unsafe impl Send for IngressPool {}
// SAFETY: as above; the read side hands out only shared slices, the write
// side needs `&mut self`.
unsafe impl Sync for IngressPool {}

impl IngressPool {
    fn bytes(count: u32) -> u64 {
        u64::from(count) * u64::from(PKT_BUFFER_SIZE)
    }

    /// iokerneld side: a new pool of `count` buffers, mapped writable, then
    /// sealed so that nobody can map it writable again.
    pub fn create(name: &str, count: u32) -> Result<IngressPool, PoolMapError> {
        if count == 0 || count > MAX_INGRESS_BUFFERS {
            return Err(PoolMapError::Count(count));
        }
        let len = Self::bytes(count);
        let fd = memfd::create(name, len).map_err(io_err("memfd_create"))?;
        let base = memfd::map(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        let pool = IngressPool {
            fd,
            base,
            count,
            writable: true,
        };
        // After our writable mapping: existing mappings keep working,
        // new writable ones (the runtime's) are refused.
        memfd::add_seals(pool.fd.as_fd(), memfd::SIZE_SEALS | Seals::FUTURE_WRITE)
            .map_err(io_err("F_ADD_SEALS"))?;
        Ok(pool)
    }

    /// Runtime side: maps a pool received from iokerneld, read-only, after
    /// checking its size and that it is sealed (no shrinking under us).
    pub fn map_read_only(fd: OwnedFd, count: u32) -> Result<IngressPool, PoolMapError> {
        if count == 0 || count > MAX_INGRESS_BUFFERS {
            return Err(PoolMapError::Count(count));
        }
        let seals = memfd::seals(fd.as_fd()).map_err(io_err("F_GET_SEALS"))?;
        if !seals.contains(Seals::SHRINK | Seals::FUTURE_WRITE) {
            return Err(PoolMapError::NotSealed(seals.bits() as i32));
        }
        let found = memfd::size(fd.as_fd()).map_err(io_err("fstat"))?;
        let expected = Self::bytes(count);
        if found != expected {
            return Err(PoolMapError::Size { found, expected });
        }
        let base = memfd::map_read_only(fd.as_fd(), expected as usize).map_err(io_err("mmap"))?;
        Ok(IngressPool {
            fd,
            base,
            count,
            writable: false,
        })
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// The memfd, to pass to the runtime.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// iokerneld side: copies `frame` (at most a buffer) into buffer `buf`;
    /// returns the bytes written, or `None` for an index out of range.
    pub fn write(&mut self, buf: u32, frame: &[u8]) -> Option<usize> {
        assert!(self.writable, "a read-only ingress pool is not written");
        if buf >= self.count {
            return None;
        }
        let n = frame.len().min(PKT_BUFFER_SIZE as usize);
        // SAFETY: buffer `buf < count` lies inside the writable mapping;
        // `frame` is our own memory.
        unsafe {
            let dst = self
                .base
                .as_ptr()
                .add(buf as usize * PKT_BUFFER_SIZE as usize);
            std::ptr::copy_nonoverlapping(frame.as_ptr(), dst, n);
        }
        Some(n)
    }

    /// iokerneld side: buffer `buf` to copy a frame into directly (e.g.
    /// with [`EgressBuffers::read`]: one copy instead of two through a
    /// scratch buffer), or `None` for an index out of range. Only for a
    /// buffer not lent to the runtime, as for [`write`](Self::write).
    pub fn buffer_mut(&mut self, buf: u32) -> Option<&mut [u8]> {
        assert!(self.writable, "a read-only ingress pool is not written");
        if buf >= self.count {
            return None;
        }
        // SAFETY: buffer `buf < count` lies inside the writable mapping,
        // and `&mut self` makes this the only slice of it this value gives
        // out; the runtime maps the pool read-only and reads only buffers
        // lent to it, which the caller does not hand here.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.base
                    .as_ptr()
                    .add(buf as usize * PKT_BUFFER_SIZE as usize),
                PKT_BUFFER_SIZE as usize,
            )
        })
    }

    /// Runtime side: the frame a descriptor names, or `None` if its buffer
    /// index or length is out of range.
    pub fn frame(&self, desc: PacketDesc) -> Option<&[u8]> {
        if desc.buf >= self.count || desc.len > PKT_BUFFER_SIZE {
            return None;
        }
        // SAFETY: inside the mapping. iokerneld writes a buffer only while
        // it is not lent to us, so these bytes stay put until we give the
        // buffer back.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.base
                    .as_ptr()
                    .add(desc.buf as usize * PKT_BUFFER_SIZE as usize),
                desc.len as usize,
            )
        })
    }
}

impl Drop for IngressPool {
    fn drop(&mut self) {
        // SAFETY: mapped by `memfd::map`/`map_read_only` with this length; the
        // slices `frame` hands out borrow `self`, so none is left.
        unsafe { memfd::unmap(self.base, Self::bytes(self.count) as usize) };
    }
}

/// A returned ingress buffer that iokerneld had not lent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("buffer {buf} does not exist (the pool has {count})")]
    OutOfRange { buf: u32, count: u32 },
    #[error("buffer {buf} was given back but is not lent")]
    NotLent { buf: u32 },
}

/// iokerneld's record of which ingress buffers are lent to the runtime.
pub struct BufferLedger {
    free: Vec<u32>,
    lent: Vec<bool>,
}

impl fmt::Debug for BufferLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferLedger")
            .field("count", &self.lent.len())
            .field("free", &self.free.len())
            .finish()
    }
}

impl BufferLedger {
    pub fn new(count: u32) -> BufferLedger {
        BufferLedger {
            free: (0..count).rev().collect(),
            lent: vec![false; count as usize],
        }
    }

    /// A free buffer, now lent; `None` when every buffer is lent.
    pub fn lend(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.lent[b as usize] = true;
        Some(b)
    }

    /// A buffer that was lent and not delivered after all.
    pub fn give_back(&mut self, buf: u32) -> Result<(), LedgerError> {
        let count = self.lent.len() as u32;
        match self.lent.get_mut(buf as usize) {
            None => Err(LedgerError::OutOfRange { buf, count }),
            Some(l) if !*l => Err(LedgerError::NotLent { buf }),
            Some(l) => {
                *l = false;
                self.free.push(buf);
                Ok(())
            }
        }
    }

    pub fn lent(&self) -> usize {
        self.lent.len() - self.free.len()
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ledger_refuses_double_and_foreign_returns() {
        let mut l = BufferLedger::new(2);
        let a = l.lend().unwrap();
        let b = l.lend().unwrap();
        assert_ne!(a, b);
        assert_eq!(l.lend(), None);
        l.give_back(a).unwrap();
        assert_eq!(l.give_back(a), Err(LedgerError::NotLent { buf: a }));
        assert_eq!(
            l.give_back(7).unwrap_err().to_string(),
            "buffer 7 does not exist (the pool has 2)"
        );
        assert_eq!((l.lent(), l.available()), (1, 1));
    }

    proptest! {
        #![proptest_config(crate::test_config(256, 16))]
        /// Any sequence of lends and returns (valid or not) keeps the
        /// ledger consistent: lent + available = count, no index twice.
        #[test]
        fn ledger_stays_consistent(ops in proptest::collection::vec(any::<Option<u8>>(), 0..200)) {
            let mut l = BufferLedger::new(16);
            let mut out = std::collections::HashSet::new();
            for op in ops {
                match op {
                    None => if let Some(b) = l.lend() { prop_assert!(out.insert(b)); },
                    Some(b) => {
                        let b = u32::from(b % 20);
                        prop_assert_eq!(l.give_back(b).is_ok(), out.remove(&b));
                    }
                }
                prop_assert_eq!(l.lent() + l.available(), 16);
                prop_assert_eq!(l.lent(), out.len());
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // memfd and mmap
    fn ingress_pool_is_read_only_for_the_runtime() {
        let mut pool = IngressPool::create("test-ingress", 4).unwrap();
        assert_eq!(pool.write(2, b"hello"), Some(5));
        assert_eq!(pool.write(4, b"x"), None);
        let fd = pool.fd().try_clone_to_owned().unwrap();
        let ro = IngressPool::map_read_only(fd, 4).unwrap();
        let desc = PacketDesc {
            buf: 2,
            len: 5,
            ..Default::default()
        };
        assert_eq!(ro.frame(desc), Some(&b"hello"[..]));
        assert_eq!(ro.frame(PacketDesc { buf: 4, ..desc }), None);
        assert_eq!(
            ro.frame(PacketDesc {
                len: PKT_BUFFER_SIZE + 1,
                ..desc
            }),
            None
        );
        // Nobody may map it writable now, nor write through the fd.
        let fd = pool.fd();
        assert!(memfd::map(fd, 4 * PKT_BUFFER_SIZE as usize).is_err());
        let f = std::fs::File::from(fd.try_clone_to_owned().unwrap());
        assert!(std::os::unix::fs::FileExt::write_at(&f, b"x", 0).is_err());
        // A wrong count is refused with the sizes.
        let fd = pool.fd().try_clone_to_owned().unwrap();
        let e = IngressPool::map_read_only(fd, 8).err().unwrap();
        assert_eq!(
            e.to_string(),
            "ingress pool memfd is 8192 bytes, expected 16384"
        );
        // An unsealed memfd is refused.
        let plain = memfd::create("plain", 8192).unwrap();
        assert!(matches!(
            IngressPool::map_read_only(plain, 4),
            Err(PoolMapError::NotSealed(_))
        ));
    }
}
