//! Fixed-size packet buffers and the move-only [`Frame`] handle that owns one.

use std::sync::atomic::{AtomicU32, Ordering};

/// The default buffer size: a full Ethernet frame (1514 bytes) rounded up to
/// a power of two, as NIC descriptor rings and AF_XDP UMEM chunks use.
pub const DEFAULT_BUFFER_SIZE: usize = 2048;

/// Tells pools apart, so a frame handed to the wrong pool is refused instead
/// of corrupting its free list.
static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);

/// Owns one buffer of a [`BufferPool`] and the length of the frame in it.
///
/// Not `Clone` or `Copy`: whoever holds the `Frame` owns the buffer, and
/// [`BufferPool::free`] consumes it, so a buffer cannot be returned twice:
///
/// ```compile_fail,E0382
/// use ginza_iokernel::nic::BufferPool;
/// let mut pool = BufferPool::new(1, 2048);
/// let frame = pool.alloc().unwrap();
/// pool.free(frame).unwrap();
/// pool.free(frame).unwrap(); // use of moved value
/// ```
///
/// Dropping a `Frame` instead of freeing it leaks its buffer until the pool
/// itself is dropped; [`BufferPool::in_use`] shows such leaks.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a dropped Frame leaks its buffer: free it, transmit it or lend it"]
pub struct Frame {
    pool_id: u32,
    index: u32,
    len: u32,
}

impl Frame {
    /// The frame's length in bytes (at most the pool's buffer size).
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's index in its pool.
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// A frame in flight outside a `Frame` handle (on a ring to another process,
/// later in shared memory): plain numbers that anyone can copy or forge, so
/// [`BufferPool::reclaim`] checks them against the pool's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferDescriptor {
    pub index: u32,
    pub len: u32,
}

/// Why a pool refused a frame or a descriptor.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    /// The frame belongs to another pool; it is handed back untouched.
    #[error("frame of buffer {} belongs to another pool", .0.index)]
    ForeignFrame(Frame),
    #[error("buffer index {index} is out of range (pool of {capacity})")]
    IndexOutOfRange { index: u32, capacity: u32 },
    /// The descriptor's buffer is not lent out: reclaimed already (a double
    /// free), or never lent.
    #[error("buffer {index} is not lent out (returned twice?)")]
    NotLent { index: u32 },
    #[error("length {len} exceeds the buffer size {buffer_size}")]
    TooLong { len: usize, buffer_size: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BufferState {
    Free,
    /// A `Frame` handle exists for it.
    Owned,
    /// Given out as a `BufferDescriptor`; only `reclaim` takes it back.
    Lent,
}

/// Counts kept by a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub allocations: u64,
    /// `alloc` found no free buffer: the caller drops what it wanted to
    /// build (never blocks).
    pub exhausted: u64,
}

/// A fixed number of fixed-size buffers, allocated once.
///
/// `alloc` and `free` are O(1) (a stack of free indices) and never allocate.
pub struct BufferPool {
    id: u32,
    buffer_size: usize,
    /// A mapping of its own (see `AnonMemory`): pools come and go with
    /// ports while iokerneld runs.
    storage: ginza_sys::mm::AnonMemory,
    free_indices: Vec<u32>,
    states: Vec<BufferState>,
    stats: PoolStats,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("id", &self.id)
            .field("capacity", &self.capacity())
            .field("buffer_size", &self.buffer_size)
            .field("available", &self.available())
            .field("stats", &self.stats)
            .finish()
    }
}

impl BufferPool {
    /// A pool of `count` buffers of `buffer_size` bytes each.
    ///
    /// Panics if either is zero or `buffer_size` exceeds `u32::MAX`: those are
    /// configuration errors caught at start-up, not run-time conditions.
    pub fn new(count: usize, buffer_size: usize) -> BufferPool {
        assert!(
            count > 0 && count <= u32::MAX as usize,
            "pool of {count} buffers"
        );
        assert!(
            buffer_size > 0 && buffer_size <= u32::MAX as usize,
            "buffer size {buffer_size}"
        );
        BufferPool {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            buffer_size,
            storage: ginza_sys::mm::AnonMemory::new(count * buffer_size).unwrap_or_else(|e| {
                panic!("mapping a pool of {count} buffers of {buffer_size} bytes: {e}")
            }),
            // Popped from the end: buffer 0 goes out first.
            free_indices: (0..count as u32).rev().collect(),
            states: vec![BufferState::Free; count],
            stats: PoolStats::default(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.states.len()
    }

    pub fn buffer_size(&self) -> usize {
        self.buffer_size
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.free_indices.len()
    }

    /// Buffers held as frames or lent out.
    pub fn in_use(&self) -> usize {
        self.capacity() - self.available()
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// An empty frame, or `None` (counted in [`PoolStats::exhausted`]) when
    /// every buffer is in use.
    pub fn alloc(&mut self) -> Option<Frame> {
        let Some(index) = self.free_indices.pop() else {
            self.stats.exhausted += 1;
            return None;
        };
        self.states[index as usize] = BufferState::Owned;
        self.stats.allocations += 1;
        Some(Frame {
            pool_id: self.id,
            index,
            len: 0,
        })
    }

    /// A frame holding a copy of `bytes`; `None` when the pool is exhausted
    /// (counted) or `bytes` does not fit a buffer.
    pub fn alloc_copy(&mut self, bytes: &[u8]) -> Option<Frame> {
        if bytes.len() > self.buffer_size {
            return None;
        }
        let mut frame = self.alloc()?;
        self.buffer_mut(&mut frame)[..bytes.len()].copy_from_slice(bytes);
        frame.len = bytes.len() as u32;
        Some(frame)
    }

    /// Returns the frame's buffer to the pool. A frame of another pool is
    /// refused and handed back in the error.
    pub fn free(&mut self, frame: Frame) -> Result<(), PoolError> {
        if frame.pool_id != self.id {
            return Err(PoolError::ForeignFrame(frame));
        }
        // A `Frame` of this pool exists only while its buffer is `Owned`:
        // handles are created by `alloc` and `reclaim` alone and never copied.
        debug_assert_eq!(self.states[frame.index as usize], BufferState::Owned);
        self.states[frame.index as usize] = BufferState::Free;
        self.free_indices.push(frame.index);
        Ok(())
    }

    /// The frame's bytes (its length, not the whole buffer).
    ///
    /// Panics if the frame belongs to another pool: reading another pool's
    /// buffer by index would show unrelated data.
    pub fn bytes(&self, frame: &Frame) -> &[u8] {
        let start = self.offset_of(frame);
        &self.storage[start..start + frame.len()]
    }

    /// The whole buffer, to write a frame into before [`set_len`](Self::set_len).
    ///
    /// Panics if the frame belongs to another pool.
    pub fn buffer_mut(&mut self, frame: &mut Frame) -> &mut [u8] {
        let start = self.offset_of(frame);
        &mut self.storage[start..start + self.buffer_size]
    }

    pub fn set_len(&self, frame: &mut Frame, len: usize) -> Result<(), PoolError> {
        if len > self.buffer_size {
            return Err(PoolError::TooLong {
                len,
                buffer_size: self.buffer_size,
            });
        }
        frame.len = len as u32;
        Ok(())
    }

    /// Turns a frame into a descriptor to put on a ring; the buffer stays in
    /// use until [`reclaim`](Self::reclaim)ed.
    pub fn lend(&mut self, frame: Frame) -> Result<BufferDescriptor, PoolError> {
        if frame.pool_id != self.id {
            return Err(PoolError::ForeignFrame(frame));
        }
        self.states[frame.index as usize] = BufferState::Lent;
        Ok(BufferDescriptor {
            index: frame.index,
            len: frame.len,
        })
    }

    /// Takes a lent buffer back as a frame. A descriptor whose buffer is not
    /// lent out (already reclaimed: a double free by the peer) or out of
    /// range is refused, so a buggy or hostile peer cannot make two owners
    /// of one buffer.
    pub fn reclaim(&mut self, descriptor: BufferDescriptor) -> Result<Frame, PoolError> {
        let BufferDescriptor { index, len } = descriptor;
        let Some(state) = self.states.get_mut(index as usize) else {
            return Err(PoolError::IndexOutOfRange {
                index,
                capacity: self.states.len() as u32,
            });
        };
        if *state != BufferState::Lent {
            return Err(PoolError::NotLent { index });
        }
        if len as usize > self.buffer_size {
            return Err(PoolError::TooLong {
                len: len as usize,
                buffer_size: self.buffer_size,
            });
        }
        *state = BufferState::Owned;
        Ok(Frame {
            pool_id: self.id,
            index,
            len,
        })
    }

    /// Whether `frame` belongs to this pool.
    pub fn owns(&self, frame: &Frame) -> bool {
        frame.pool_id == self.id
    }

    fn offset_of(&self, frame: &Frame) -> usize {
        assert!(
            self.owns(frame),
            "frame of buffer {} used with another pool",
            frame.index
        );
        frame.index as usize * self.buffer_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `/proc/self/maps` lists a mapping of `start..end`: one that
    /// begins or ends where it does and covers it (the kernel merges an
    /// anonymous mapping with a like neighbour into one line; a piece of
    /// malloc's heap or arena shares neither bound).
    fn mapped(start: usize, end: usize) -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("reading /proc/self/maps");
        maps.lines().any(|l| {
            let range = l.split(' ').next().unwrap_or("");
            let mut ends = range.split('-').map(|a| usize::from_str_radix(a, 16).ok());
            let (Some(Some(lo)), Some(Some(hi))) = (ends.next(), ends.next()) else {
                return false;
            };
            lo <= start && end <= hi && (lo == start || hi == end)
        })
    }

    #[test]
    fn a_dropped_pool_gives_its_memory_back_to_the_kernel() {
        // Pools come and go with ports while iokerneld runs: each must be a
        // mapping of its own, unmapped when dropped, not heap memory that
        // stays in the allocator (docs/soak.md, "Findings").
        // An odd size, so that no other test's mapping has the same bounds,
        // and a small one, which malloc would have served from its heap.
        let pool = BufferPool::new(13, 2048);
        let start = pool.storage.as_ptr() as usize;
        let end = start + (13 * 2048usize).next_multiple_of(ginza_sys::mm::page_size());
        assert!(
            mapped(start, end),
            "the pool's buffers are not a mapping of their own"
        );
        drop(pool);
        assert!(
            !mapped(start, end),
            "the dropped pool's mapping is still there"
        );
    }

    #[test]
    fn alloc_until_exhausted_then_free_makes_room() {
        let mut pool = BufferPool::new(2, 64);
        let first = pool.alloc().unwrap();
        let second = pool.alloc().unwrap();
        assert_ne!(first.index(), second.index());
        assert!(pool.alloc().is_none());
        assert!(pool.alloc().is_none());
        assert_eq!(pool.stats().exhausted, 2);
        assert_eq!(pool.in_use(), 2);
        pool.free(first).unwrap();
        let third = pool.alloc().unwrap();
        pool.free(second).unwrap();
        pool.free(third).unwrap();
        assert_eq!(pool.available(), 2);
        assert_eq!(pool.stats().allocations, 3);
    }

    #[test]
    fn bytes_round_trip_and_length_is_bounded() {
        let mut pool = BufferPool::new(1, 16);
        let mut frame = pool.alloc_copy(b"hello").unwrap();
        assert_eq!(pool.bytes(&frame), b"hello");
        pool.buffer_mut(&mut frame)[5] = b'!';
        pool.set_len(&mut frame, 6).unwrap();
        assert_eq!(pool.bytes(&frame), b"hello!");
        assert_eq!(
            pool.set_len(&mut frame, 17),
            Err(PoolError::TooLong {
                len: 17,
                buffer_size: 16
            })
        );
        pool.free(frame).unwrap();
        assert!(pool.alloc_copy(&[0; 17]).is_none());
    }

    #[test]
    fn foreign_frame_is_handed_back() {
        let mut ours = BufferPool::new(1, 64);
        let mut theirs = BufferPool::new(1, 64);
        let frame = theirs.alloc().unwrap();
        let Err(PoolError::ForeignFrame(frame)) = ours.free(frame) else {
            panic!("a foreign frame was accepted");
        };
        assert_eq!(ours.available(), 1);
        theirs.free(frame).unwrap();
    }

    #[test]
    fn reclaiming_a_descriptor_twice_is_refused() {
        let mut pool = BufferPool::new(2, 64);
        let frame = pool.alloc_copy(b"abc").unwrap();
        let descriptor = pool.lend(frame).unwrap();
        assert_eq!(pool.in_use(), 1);
        let frame = pool.reclaim(descriptor).unwrap();
        assert_eq!(pool.bytes(&frame), b"abc");
        assert_eq!(
            pool.reclaim(descriptor),
            Err(PoolError::NotLent {
                index: descriptor.index
            })
        );
        pool.free(frame).unwrap();
        // Freed: a stale descriptor for it is still refused.
        assert!(pool.reclaim(descriptor).is_err());
        assert_eq!(
            pool.reclaim(BufferDescriptor { index: 9, len: 0 }),
            Err(PoolError::IndexOutOfRange {
                index: 9,
                capacity: 2
            })
        );
        assert_eq!(pool.available(), 2);
    }
}
