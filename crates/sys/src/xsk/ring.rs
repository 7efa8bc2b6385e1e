//! The four rings an AF_XDP socket shares with the kernel, and the memory
//! mappings they (and the UMEM) live in.
//!
//! Each ring is a power-of-two array with a producer and a consumer index,
//! each written by one side only: acquire loads of the other side's index,
//! release stores of ours (the layout is the kernel's; `libc` has its
//! structs).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// A memory mapping, unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by one value and touched only through it
// (`&self`/`&mut self`); no thread-local state is involved.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Private anonymous memory, populated (a UMEM of one socket).
    pub(crate) fn anonymous(len: usize) -> io::Result<Mapping> {
        Mapping::new(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    }

    /// `len` bytes of `fd` from `offset`, shared and read-only.
    pub(crate) fn read_only(fd: BorrowedFd<'_>, len: usize, offset: u64) -> io::Result<Mapping> {
        Mapping::new(
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset,
        )
    }

    /// `len` bytes of `fd` from `offset`, shared, readable and writable.
    pub(crate) fn shared(fd: BorrowedFd<'_>, len: usize, offset: u64) -> io::Result<Mapping> {
        Mapping::new(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset,
        )
    }

    fn new(
        len: usize,
        prot: libc::c_int,
        flags: libc::c_int,
        fd: RawFd,
        offset: u64,
    ) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel (no address hint), so
        // no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                flags | libc::MAP_POPULATE,
                fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap does not return null on success"),
            len,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference into
        // it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One of the four rings shared with the kernel: `size` (a power of two)
/// entries of `T`.
pub struct Ring<T> {
    map: Mapping,
    size: u32,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    entries: NonNull<T>,
}

// SAFETY: the ring's memory is owned by its mapping and used through `&mut
// self` only; the kernel is the other party, whatever thread we are on.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps the ring of `size` entries whose offsets the kernel gave for
    /// `page_offset`.
    pub(crate) fn map(
        socket: BorrowedFd<'_>,
        offsets: &libc::xdp_ring_offset,
        page_offset: u64,
        size: u32,
    ) -> io::Result<Ring<T>> {
        debug_assert!(size.is_power_of_two());
        let len = offsets.desc as usize + size as usize * size_of::<T>();
        let map = Mapping::shared(socket, len, page_offset)?;
        let at = |offset: u64| {
            // SAFETY: the kernel's offsets lie inside the mapping, which is
            // page aligned, and each field is aligned for its type.
            unsafe { NonNull::new_unchecked(map.as_ptr().add(offset as usize)) }
        };
        Ok(Ring {
            producer: at(offsets.producer).cast(),
            consumer: at(offsets.consumer).cast(),
            entries: at(offsets.desc).cast(),
            size,
            map,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into `self.map`, alive as long as `self`; the
        // kernel accesses the index atomically too.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.consumer.as_ref() }
    }

    fn slot(&self, index: u32) -> *mut T {
        debug_assert!(self.map.len() >= size_of::<T>() * self.size as usize);
        // SAFETY: `index & (size - 1)` is within the ring's entries.
        unsafe {
            self.entries
                .as_ptr()
                .add((index & (self.size - 1)) as usize)
        }
    }

    /// Entries in the ring.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The producer's and the consumer's indices as they are now (what a
    /// reader of the ring's congestion looks at).
    pub fn indices(&self) -> (u32, u32) {
        (
            self.producer().load(Ordering::Acquire),
            self.consumer().load(Ordering::Acquire),
        )
    }

    /// Free entries, on a ring we produce to (fill, tx).
    pub fn free_slots(&self) -> usize {
        let ours = self.producer().load(Ordering::Relaxed);
        let theirs = self.consumer().load(Ordering::Acquire);
        (self.size - ours.wrapping_sub(theirs)) as usize
    }

    /// Entries produced and not yet consumed by the kernel, on a ring we
    /// produce to.
    pub fn pending(&self) -> usize {
        self.size as usize - self.free_slots()
    }

    /// Entries ready for us, on a ring we consume from (rx, completion).
    pub fn available(&self) -> usize {
        let theirs = self.producer().load(Ordering::Acquire);
        let ours = self.consumer().load(Ordering::Relaxed);
        theirs.wrapping_sub(ours) as usize
    }

    /// Writes entries while there is room; returns how many.
    pub fn produce(&mut self, entries: impl Iterator<Item = T>) -> usize {
        let start = self.producer().load(Ordering::Relaxed);
        let room = self.free_slots();
        let mut count = 0;
        for entry in entries.take(room) {
            // SAFETY: the slot is free: the kernel consumed it (acquire
            // load in `free_slots`) and will not read it before the
            // release store below.
            unsafe { self.slot(start.wrapping_add(count)).write(entry) };
            count += 1;
        }
        self.producer()
            .store(start.wrapping_add(count), Ordering::Release);
        count as usize
    }

    /// Reads up to `max` entries; returns how many.
    pub fn consume(&mut self, max: usize, mut each: impl FnMut(T)) -> usize {
        let start = self.consumer().load(Ordering::Relaxed);
        let count = self.available().min(max);
        for i in 0..count as u32 {
            // SAFETY: the kernel produced this slot (acquire load in
            // `available`) and will not reuse it before the release store
            // below.
            each(unsafe { self.slot(start.wrapping_add(i)).read() });
        }
        self.consumer()
            .store(start.wrapping_add(count as u32), Ordering::Release);
        count
    }
}

/// Another process's view of a ring's two indices, mapped read-only: how
/// many entries wait on it (iokerneld reads an application's rx ring this
/// way, for congestion detection; docs/direct-path.md).
pub struct RingIndices {
    _map: Mapping,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
}

// SAFETY: the indices are only loaded, atomically, through `&self`; the
// mapping lives as long as the value.
unsafe impl Send for RingIndices {}

impl RingIndices {
    /// Maps the part of the ring at `page_offset` of `socket` that holds
    /// its indices (not its entries), read-only.
    pub(crate) fn map(
        socket: BorrowedFd<'_>,
        offsets: &libc::xdp_ring_offset,
        page_offset: u64,
    ) -> io::Result<RingIndices> {
        let end = offsets.producer.max(offsets.consumer) as usize + size_of::<AtomicU32>();
        let map = Mapping::read_only(socket, end, page_offset)?;
        let at = |offset: u64| {
            // SAFETY: both indices lie inside the mapping (`end`), which is
            // page aligned; the kernel aligns each for a u32.
            unsafe { NonNull::new_unchecked(map.as_ptr().add(offset as usize)) }
        };
        Ok(RingIndices {
            producer: at(offsets.producer).cast(),
            consumer: at(offsets.consumer).cast(),
            _map: map,
        })
    }

    /// The producer's and the consumer's indices now (free-running u32s:
    /// their difference is the entries waiting).
    pub fn load(&self) -> (u32, u32) {
        // SAFETY: both point into the mapping, alive as long as `self`;
        // the owners write them atomically and we only load.
        unsafe {
            (
                self.producer.as_ref().load(Ordering::Acquire),
                self.consumer.as_ref().load(Ordering::Acquire),
            )
        }
    }
}
