//! An offset-free, `#[repr(C)]` single-producer single-consumer ring of
//! fixed-size messages that can live in memory shared by two processes.
//!
//! Memory layout of a ring of capacity `C` (a power of two) at a 64-byte
//! aligned base:
//!
//! ```text
//! +0    head: u32 (written by the consumer) , rest of the cache line unused
//! +64   tail: u32 (written by the producer) , rest of the cache line unused
//! +128  C slots of T
//! ```
//!
//! `head` and `tail` are free-running `u32` sequence numbers (`tail` counts
//! messages ever pushed, `head` messages ever popped); slot `i & (C - 1)`
//! holds message `i`. The ring holds no pointers, so each process maps it
//! wherever it likes.
//!
//! Neither side trusts the other. Each handle keeps its own index in local
//! memory (only ever *writes* its index to the shared line) and, whenever it
//! reads the peer's index, checks `tail - head <= C` in wrapping arithmetic.
//! A violation is a [`RingCorrupt`] error, sticky for the handle; slot indices
//! are always masked, so a corrupt ring is never read or written out of
//! bounds. The capacity a handle uses is the one it was given by its owner
//! (from a validated layout), never re-read from shared memory.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::sync::{AtomicU32, Ordering, SlotCell};

/// Cache line size assumed by the layout.
pub const CACHE_LINE: usize = 64;
/// Smallest ring capacity (slots).
pub const MIN_CAPACITY: u32 = 2;
/// Largest ring capacity (slots).
pub const MAX_CAPACITY: u32 = 1 << 16;

/// Plain old data that may be copied into and out of shared memory.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid value (only
/// integers and arrays/`#[repr(C)]` structs of integers), and the alignment
/// must not exceed [`CACHE_LINE`].
pub unsafe trait Pod: Copy + Send + 'static {}

// SAFETY: integers accept every bit pattern.
unsafe impl Pod for u32 {}
// SAFETY: integers accept every bit pattern.
unsafe impl Pod for u64 {}

#[repr(C, align(64))]
struct Padded<T>(T);

/// The shared index words of a ring, each on its own cache line.
#[repr(C)]
pub(crate) struct RingHeader {
    head: Padded<AtomicU32>,
    tail: Padded<AtomicU32>,
}

impl RingHeader {
    #[cfg(all(test, not(loom)))]
    pub(crate) fn store_head(&self, v: u32) {
        self.head.0.store(v, Ordering::Release)
    }

    #[cfg(all(test, not(loom)))]
    pub(crate) fn store_tail(&self, v: u32) {
        self.tail.0.store(v, Ordering::Release)
    }
}

/// Byte offset of the first slot from the ring base.
const SLOTS_OFFSET: usize = size_of::<RingHeader>();

/// `capacity` is a power of two in `MIN_CAPACITY..=MAX_CAPACITY`.
pub fn capacity_ok(capacity: u32) -> bool {
    capacity.is_power_of_two() && (MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity)
}

/// Bytes a ring of `capacity` slots of `T` occupies, rounded up to a cache
/// line; `None` if the capacity is invalid.
pub fn ring_bytes<T: Pod>(capacity: u32) -> Option<usize> {
    if !capacity_ok(capacity) {
        return None;
    }
    let slots = (capacity as usize).checked_mul(size_of::<SlotCell<T>>())?;
    let total = SLOTS_OFFSET.checked_add(slots)?;
    total.checked_next_multiple_of(CACHE_LINE)
}

/// The ring is inconsistent: the peer wrote an index that no correct peer
/// could have written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "ring corrupt: head {head}, tail {tail}, capacity {capacity} \
     (tail - head = {} > capacity)",
    tail.wrapping_sub(*head)
)]
pub struct RingCorrupt {
    pub head: u32,
    pub tail: u32,
    pub capacity: u32,
}

/// Why a push failed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PushError<T> {
    /// No free slot; the value is handed back.
    Full(T),
    /// The consumer's index is impossible.
    Corrupt(RingCorrupt),
}

impl<T> fmt::Debug for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Full(_) => f.write_str("Full(..)"),
            PushError::Corrupt(c) => f.debug_tuple("Corrupt").field(c).finish(),
        }
    }
}

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Full(_) => f.write_str("ring full"),
            PushError::Corrupt(c) => c.fmt(f),
        }
    }
}

impl<T> std::error::Error for PushError<T> {}

/// Keeps the memory a handle points into alive.
pub(crate) type Keep = Arc<dyn Any + Send + Sync>;

/// A ring located in memory: pointers to its header and slots, and the
/// trusted capacity.
struct RawRing<T> {
    hdr: NonNull<RingHeader>,
    slots: NonNull<SlotCell<T>>,
    capacity: u32,
}

impl<T: Pod> RawRing<T> {
    /// Locates a ring at `base` without touching memory.
    ///
    /// # Safety
    /// `base` is aligned to [`CACHE_LINE`], valid for reads and writes of
    /// `ring_bytes::<T>(capacity)` bytes for as long as the returned value
    /// and its handles live, and holds an initialized ring (see [`Self::init`]).
    /// `capacity` must satisfy [`capacity_ok`].
    unsafe fn at(base: NonNull<u8>, capacity: u32) -> Self {
        debug_assert!(capacity_ok(capacity));
        debug_assert_eq!(base.as_ptr() as usize % CACHE_LINE, 0);
        RawRing {
            hdr: base.cast(),
            // SAFETY: SLOTS_OFFSET is inside the ring (caller's contract).
            slots: unsafe { base.add(SLOTS_OFFSET) }.cast(),
            capacity,
        }
    }

    /// Writes an empty ring (indices at `start`, zeroed slots) at `base`.
    ///
    /// # Safety
    /// As for [`Self::at`], minus the initialized ring; no other handle to
    /// this memory is in use.
    unsafe fn init(base: NonNull<u8>, capacity: u32, start: u32) -> Self {
        // SAFETY: forwarded from the caller.
        let ring = unsafe { Self::at(base, capacity) };
        let hdr = RingHeader {
            head: Padded(AtomicU32::new(start)),
            tail: Padded(AtomicU32::new(start)),
        };
        // SAFETY: the header lies at `base`, valid and aligned, unused by others.
        unsafe { ring.hdr.as_ptr().write(hdr) };
        for i in 0..capacity as usize {
            // SAFETY: `T: Pod`, so an all-zero `T` is a valid value.
            let zero: T = unsafe { std::mem::zeroed() };
            // SAFETY: slot `i < capacity` lies inside the ring.
            unsafe { ring.slots.as_ptr().add(i).write(SlotCell::new(zero)) };
        }
        ring
    }

    fn hdr(&self) -> &RingHeader {
        // SAFETY: valid for the lifetime of the ring (contract of `at`); the
        // header is made of atomics only, so shared references are fine.
        unsafe { self.hdr.as_ref() }
    }

    fn slot(&self, seq: u32) -> &SlotCell<T> {
        let i = (seq & (self.capacity - 1)) as usize;
        // SAFETY: `i < capacity`, so the slot lies inside the ring.
        unsafe { &*self.slots.as_ptr().add(i) }
    }

    fn check(&self, head: u32, tail: u32) -> Result<u32, RingCorrupt> {
        let used = tail.wrapping_sub(head);
        if used > self.capacity {
            Err(RingCorrupt {
                head,
                tail,
                capacity: self.capacity,
            })
        } else {
            Ok(used)
        }
    }
}

/// The producing end of a ring. Not `Clone`: one producer per ring.
pub struct Producer<T: Pod> {
    ring: RawRing<T>,
    tail: u32,
    head_cache: u32,
    corrupt: Option<RingCorrupt>,
    _keep: Keep,
}

/// The consuming end of a ring. Not `Clone`: one consumer per ring.
pub struct Consumer<T: Pod> {
    ring: RawRing<T>,
    head: u32,
    tail_cache: u32,
    corrupt: Option<RingCorrupt>,
    _keep: Keep,
}

// SAFETY: a handle owns its end of the ring exclusively; the memory is kept
// alive by `_keep`, which is `Send + Sync`; `T: Send`.
unsafe impl<T: Pod> Send for Producer<T> {}
// SAFETY: as for `Producer`.
unsafe impl<T: Pod> Send for Consumer<T> {}

impl<T: Pod> Producer<T> {
    /// # Safety
    /// Contract of [`RawRing::at`], with `keep` keeping the memory alive, and
    /// no other producer of this ring in this process.
    pub(crate) unsafe fn attach(base: NonNull<u8>, capacity: u32, keep: Keep) -> Self {
        // SAFETY: forwarded.
        let ring = unsafe { RawRing::at(base, capacity) };
        let tail = ring.hdr().tail.0.load(Ordering::Relaxed);
        let head = ring.hdr().head.0.load(Ordering::Acquire);
        let corrupt = ring.check(head, tail).err();
        Producer {
            ring,
            tail,
            head_cache: head,
            corrupt,
            _keep: keep,
        }
    }

    /// The ring's capacity in messages.
    pub fn capacity(&self) -> u32 {
        self.ring.capacity
    }

    /// Free slots now (re-reads the consumer's index).
    pub fn free(&mut self) -> Result<u32, RingCorrupt> {
        let used = self.refresh()?;
        Ok(self.ring.capacity - used)
    }

    fn refresh(&mut self) -> Result<u32, RingCorrupt> {
        if let Some(c) = self.corrupt {
            return Err(c);
        }
        let head = self.ring.hdr().head.0.load(Ordering::Acquire);
        match self.ring.check(head, self.tail) {
            Ok(used) => {
                self.head_cache = head;
                Ok(used)
            }
            Err(c) => {
                self.corrupt = Some(c);
                Err(c)
            }
        }
    }

    /// Appends as many of `vs` as fit, in order, publishing them with one
    /// index store (one cache-line transfer to the consumer for the whole
    /// burst); returns how many were taken.
    pub fn push_slice(&mut self, vs: &[T]) -> Result<usize, RingCorrupt> {
        let used = self.refresh()?;
        let n = vs.len().min((self.ring.capacity - used) as usize);
        for (i, v) in vs[..n].iter().enumerate() {
            // SAFETY: as in `push`: slots `tail..tail + n` are free (n is at
            // most the free count just read) and unpublished.
            unsafe { self.ring.slot(self.tail.wrapping_add(i as u32)).write(*v) };
        }
        if n > 0 {
            self.tail = self.tail.wrapping_add(n as u32);
            self.ring.hdr().tail.0.store(self.tail, Ordering::Release);
        }
        Ok(n)
    }

    /// Sequence number the next pushed message gets (slot
    /// `next_seq() % capacity`): a producer that pairs each slot with a
    /// buffer of its own fills buffer `next_seq() % capacity` before the
    /// push, having checked [`free`](Self::free) first.
    pub fn next_seq(&self) -> u32 {
        self.tail
    }

    /// Appends `v`, or hands it back if the ring is full.
    pub fn push(&mut self, v: T) -> Result<(), PushError<T>> {
        if let Some(c) = self.corrupt {
            return Err(PushError::Corrupt(c));
        }
        if self.tail.wrapping_sub(self.head_cache) >= self.ring.capacity {
            let used = self.refresh().map_err(PushError::Corrupt)?;
            if used == self.ring.capacity {
                return Err(PushError::Full(v));
            }
        }
        // SAFETY: the slot at `tail` is outside `[head, tail)`, so the
        // consumer of this process (if any) does not touch it until the
        // release store below publishes it.
        unsafe { self.ring.slot(self.tail).write(v) };
        self.tail = self.tail.wrapping_add(1);
        self.ring.hdr().tail.0.store(self.tail, Ordering::Release);
        Ok(())
    }
}

impl<T: Pod> Consumer<T> {
    /// # Safety
    /// Contract of [`RawRing::at`], with `keep` keeping the memory alive, and
    /// no other consumer of this ring in this process.
    pub(crate) unsafe fn attach(base: NonNull<u8>, capacity: u32, keep: Keep) -> Self {
        // SAFETY: forwarded.
        let ring = unsafe { RawRing::at(base, capacity) };
        let head = ring.hdr().head.0.load(Ordering::Relaxed);
        let tail = ring.hdr().tail.0.load(Ordering::Acquire);
        let corrupt = ring.check(head, tail).err();
        Consumer {
            ring,
            head,
            tail_cache: if corrupt.is_some() { head } else { tail },
            corrupt,
            _keep: keep,
        }
    }

    /// The ring's capacity in messages.
    pub fn capacity(&self) -> u32 {
        self.ring.capacity
    }

    /// Messages waiting now (re-reads the producer's index).
    pub fn len(&mut self) -> Result<u32, RingCorrupt> {
        self.refresh()
    }

    /// No message waiting now.
    pub fn is_empty(&mut self) -> Result<bool, RingCorrupt> {
        Ok(self.refresh()? == 0)
    }

    fn refresh(&mut self) -> Result<u32, RingCorrupt> {
        if let Some(c) = self.corrupt {
            return Err(c);
        }
        let tail = self.ring.hdr().tail.0.load(Ordering::Acquire);
        match self.ring.check(self.head, tail) {
            Ok(avail) => {
                self.tail_cache = tail;
                Ok(avail)
            }
            Err(c) => {
                self.corrupt = Some(c);
                Err(c)
            }
        }
    }

    /// The oldest message and its sequence number, left in the ring: the
    /// producer may not reuse its slot (nor a buffer paired with the slot)
    /// until [`release`](Self::release).
    pub fn peek(&mut self) -> Result<Option<(u32, T)>, RingCorrupt> {
        if let Some(c) = self.corrupt {
            return Err(c);
        }
        if self.head == self.tail_cache && self.refresh()? == 0 {
            return Ok(None);
        }
        // SAFETY: as in `pop`.
        let v = unsafe { self.ring.slot(self.head).read() };
        Ok(Some((self.head, v)))
    }

    /// Drops the message [`peek`](Self::peek) returned. Does nothing on an
    /// empty ring.
    pub fn release(&mut self) {
        self.release_n(1);
    }

    /// The `i`-th waiting message (0 = the oldest) and its sequence number,
    /// left in the ring, or `None` if fewer than `i + 1` wait (as of the
    /// last look at the producer's index: call [`len`](Self::len) first).
    pub fn peek_nth(&self, i: u32) -> Option<(u32, T)> {
        if self.corrupt.is_some() || i >= self.tail_cache.wrapping_sub(self.head) {
            return None;
        }
        let seq = self.head.wrapping_add(i);
        // SAFETY: `seq` is inside `[head, tail)`, published by the acquire
        // load of `tail` that set `tail_cache`; the producer does not reuse
        // it before `head` moves past it.
        Some((seq, unsafe { self.ring.slot(seq).read() }))
    }

    /// Drops the `n` oldest messages (at most those waiting as of the last
    /// look) with one index store.
    pub fn release_n(&mut self, n: u32) {
        let n = n.min(self.tail_cache.wrapping_sub(self.head));
        if self.corrupt.is_none() && n > 0 {
            self.head = self.head.wrapping_add(n);
            self.ring.hdr().head.0.store(self.head, Ordering::Release);
        }
    }

    /// Moves up to `max` messages to the end of `out`, oldest first, with
    /// one index store; returns how many.
    pub fn pop_into(&mut self, out: &mut Vec<T>, max: usize) -> Result<usize, RingCorrupt> {
        let avail = self.refresh()?;
        let n = (avail as usize).min(max);
        out.extend((0..n as u32).filter_map(|i| self.peek_nth(i).map(|(_, v)| v)));
        self.release_n(n as u32);
        Ok(n)
    }

    /// Takes the oldest message, `Ok(None)` if the ring is empty.
    pub fn pop(&mut self) -> Result<Option<T>, RingCorrupt> {
        if let Some(c) = self.corrupt {
            return Err(c);
        }
        if self.head == self.tail_cache && self.refresh()? == 0 {
            return Ok(None);
        }
        // SAFETY: `head` is inside `[head, tail)`, published by the acquire
        // load of `tail`; the producer of this process (if any) does not
        // write it until the release store of `head` below.
        let v = unsafe { self.ring.slot(self.head).read() };
        self.head = self.head.wrapping_add(1);
        self.ring.hdr().head.0.store(self.head, Ordering::Release);
        Ok(Some(v))
    }
}

/// An aligned heap buffer holding one ring, for rings inside one process and
/// for tests (Miri and loom cannot map memfds).
struct HeapRing {
    base: NonNull<u8>,
    layout: Layout,
    capacity: u32,
    drop_slots: unsafe fn(NonNull<u8>, u32),
}

// SAFETY: the buffer is plain memory reached only through the handles, which
// synchronize with atomics.
unsafe impl Send for HeapRing {}
// SAFETY: as above; `HeapRing` itself exposes nothing.
unsafe impl Sync for HeapRing {}

/// # Safety
/// `base` holds an initialized ring of `capacity` slots of `T`, not used
/// after this call.
unsafe fn drop_ring<T: Pod>(base: NonNull<u8>, capacity: u32) {
    // SAFETY: caller's contract.
    let ring = unsafe { RawRing::<T>::at(base, capacity) };
    // SAFETY: the header and every slot were initialized by `init` and are
    // dropped once (they own nothing outside loom, which tracks them).
    unsafe {
        std::ptr::drop_in_place(ring.hdr.as_ptr());
        std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
            ring.slots.as_ptr(),
            capacity as usize,
        ));
    }
}

impl Drop for HeapRing {
    fn drop(&mut self) {
        // SAFETY: every handle holding `self` alive is gone; the ring was
        // initialized by `heap_ring_at` with the matching `T`.
        unsafe { (self.drop_slots)(self.base, self.capacity) };
        // SAFETY: allocated in `heap_ring_at` with this layout.
        unsafe { alloc::dealloc(self.base.as_ptr(), self.layout) };
    }
}

/// The capacity is not a power of two in `MIN_CAPACITY..=MAX_CAPACITY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ring capacity {0} is not a power of two in {MIN_CAPACITY}..={MAX_CAPACITY}")]
pub struct BadCapacity(pub u32);

/// A ring in an ordinary heap buffer.
pub fn heap_ring<T: Pod>(capacity: u32) -> Result<(Producer<T>, Consumer<T>), BadCapacity> {
    heap_ring_at(capacity, 0)
}

/// A ring in an ordinary heap buffer whose indices start at `start` (tests
/// use values near `u32::MAX` to exercise index wrap-around).
pub fn heap_ring_at<T: Pod>(
    capacity: u32,
    start: u32,
) -> Result<(Producer<T>, Consumer<T>), BadCapacity> {
    let bytes = ring_bytes::<T>(capacity).ok_or(BadCapacity(capacity))?;
    let layout = Layout::from_size_align(bytes, CACHE_LINE).map_err(|_| BadCapacity(capacity))?;
    // SAFETY: `bytes > 0`.
    let base = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
        .unwrap_or_else(|| alloc::handle_alloc_error(layout));
    // SAFETY: fresh buffer of `ring_bytes` bytes, aligned to CACHE_LINE.
    unsafe { RawRing::<T>::init(base, capacity, start) };
    let keep: Keep = Arc::new(HeapRing {
        base,
        layout,
        capacity,
        drop_slots: drop_ring::<T>,
    });
    // SAFETY: initialized above, kept alive by `keep`; one handle per end.
    let p = unsafe { Producer::attach(base, capacity, keep.clone()) };
    // SAFETY: as above.
    let c = unsafe { Consumer::attach(base, capacity, keep) };
    Ok((p, c))
}

/// Initializes a ring at `base`.
///
/// # Safety
/// Contract of [`RawRing::init`].
pub(crate) unsafe fn init_ring<T: Pod>(base: NonNull<u8>, capacity: u32) {
    // SAFETY: forwarded.
    unsafe { RawRing::<T>::init(base, capacity, 0) };
}

/// The ring at `base`'s head and tail as they are now, read without
/// taking either end: an observer (iokerneld's congestion detection)
/// learns whether messages wait. The values are the peers' and untrusted.
///
/// # Safety
/// `base` holds a ring (or plain memory of at least a ring header, aligned
/// to [`CACHE_LINE`]) that outlives the call.
pub(crate) unsafe fn indices_at(base: NonNull<u8>) -> (u32, u32) {
    // SAFETY: caller's contract; the header is atomics only.
    let hdr = unsafe { base.cast::<RingHeader>().as_ref() };
    (
        hdr.head.0.load(Ordering::Acquire),
        hdr.tail.0.load(Ordering::Acquire),
    )
}

/// The shared header of the ring at `base`, for tests that corrupt it.
///
/// # Safety
/// `base` holds a ring that outlives the returned reference.
#[cfg(all(test, not(loom)))]
pub(crate) unsafe fn header_at<'a>(base: NonNull<u8>) -> &'a RingHeader {
    // SAFETY: caller's contract.
    unsafe { base.cast::<RingHeader>().as_ref() }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn layout_constants() {
        assert_eq!(size_of::<RingHeader>(), 128);
        assert_eq!(ring_bytes::<u64>(2), Some(192));
        assert_eq!(ring_bytes::<u64>(16), Some(256));
        assert_eq!(ring_bytes::<u64>(3), None);
        assert_eq!(ring_bytes::<u64>(1), None);
        assert_eq!(ring_bytes::<u64>(MAX_CAPACITY * 2), None);
        assert!(heap_ring::<u64>(0).is_err());
    }

    #[test]
    fn fifo_full_empty() {
        let (mut p, mut c) = heap_ring::<u64>(4).unwrap();
        assert_eq!(c.pop(), Ok(None));
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(PushError::Full(9)));
        assert_eq!(p.free(), Ok(0));
        assert_eq!(c.len(), Ok(4));
        assert_eq!(c.pop(), Ok(Some(0)));
        p.push(4).unwrap();
        for i in 1..5 {
            assert_eq!(c.pop(), Ok(Some(i)));
        }
        assert_eq!(c.pop(), Ok(None));
        assert_eq!(p.free(), Ok(4));
    }

    #[test]
    fn index_wraparound() {
        let (mut p, mut c) = heap_ring_at::<u32>(4, u32::MAX - 5).unwrap();
        for i in 0..100 {
            p.push(i).unwrap();
            p.push(i + 1000).unwrap();
            assert_eq!(c.pop(), Ok(Some(i)));
            assert_eq!(c.pop(), Ok(Some(i + 1000)));
        }
    }

    fn keep_of(c: &Consumer<u64>) -> NonNull<u8> {
        c.ring.hdr.cast()
    }

    #[test]
    fn consumer_detects_runaway_tail() {
        let (mut p, mut c) = heap_ring::<u64>(8).unwrap();
        p.push(1).unwrap();
        // SAFETY: the ring outlives the reference (both handles alive).
        let hdr = unsafe { header_at(keep_of(&c)) };
        hdr.store_tail(9 + 1); // head 0, tail 10 > capacity 8
        let err = c.pop().unwrap_err();
        assert_eq!(
            err,
            RingCorrupt {
                head: 0,
                tail: 10,
                capacity: 8
            }
        );
        assert!(
            err.to_string().contains("tail - head = 10 > capacity"),
            "{err}"
        );
        // Sticky, even if the producer "repairs" it.
        hdr.store_tail(1);
        assert_eq!(c.pop(), Err(err));
        // Tail behind head: wraps to a huge distance.
        let (_p, mut c) = heap_ring::<u64>(8).unwrap();
        // SAFETY: as above.
        unsafe { header_at(keep_of(&c)) }.store_tail(u32::MAX);
        assert!(c.pop().is_err());
    }

    #[test]
    fn producer_detects_bogus_head() {
        let (mut p, c) = heap_ring::<u64>(2).unwrap();
        p.push(1).unwrap();
        p.push(2).unwrap();
        // SAFETY: the ring outlives the reference.
        let hdr = unsafe { header_at(keep_of(&c)) };
        hdr.store_head(5); // past the tail
        assert!(matches!(
            p.push(3),
            Err(PushError::Corrupt(RingCorrupt {
                head: 5,
                tail: 2,
                capacity: 2
            }))
        ));
        assert!(p.free().is_err());
    }

    #[test]
    fn corrupt_at_attach() {
        let (p, c) = heap_ring::<u64>(4).unwrap();
        let base = keep_of(&c);
        let keep = c._keep.clone();
        // SAFETY: the ring outlives the reference.
        unsafe { header_at(base) }.store_tail(100);
        drop((p, c));
        // SAFETY: the ring is alive (keep) and no other consumer exists.
        let mut c2 = unsafe { Consumer::<u64>::attach(base, 4, keep) };
        assert!(c2.pop().is_err());
    }

    #[test]
    fn threads_in_order() {
        let n: u64 = if cfg!(miri) { 200 } else { 100_000 };
        let (mut p, mut c) = heap_ring::<u64>(16).unwrap();
        let t = std::thread::spawn(move || {
            for i in 0..n {
                let mut v = i;
                while let Err(e) = p.push(v) {
                    match e {
                        PushError::Full(x) => v = x,
                        PushError::Corrupt(e) => panic!("{e}"),
                    }
                    std::thread::yield_now();
                }
            }
        });
        let mut next = 0;
        while next < n {
            match c.pop().unwrap() {
                Some(v) => {
                    assert_eq!(v, next);
                    next += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        t.join().unwrap();
        assert_eq!(c.pop(), Ok(None));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u64),
        Pop,
        Free,
        Len,
        PushSlice(Vec<u64>),
        PopInto(usize),
        /// Peek the n-th waiting message, then release that many + 1.
        PeekRelease(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u64>().prop_map(Op::Push),
            Just(Op::Pop),
            Just(Op::Free),
            Just(Op::Len),
            proptest::collection::vec(any::<u64>(), 0..40).prop_map(Op::PushSlice),
            (0usize..40).prop_map(Op::PopInto),
            (0u32..40).prop_map(Op::PeekRelease),
        ]
    }

    proptest! {
        #![proptest_config(crate::test_config(256, 4))]

        #[test]
        fn matches_vecdeque(cap_log in 1u32..6, start in any::<u32>(), ops in proptest::collection::vec(op(), 0..200)) {
            let cap = 1u32 << cap_log;
            let (mut p, mut c) = heap_ring_at::<u64>(cap, start).unwrap();
            let mut model = VecDeque::new();
            for o in ops {
                match o {
                    Op::Push(v) => {
                        let r = p.push(v);
                        if model.len() == cap as usize {
                            prop_assert_eq!(r, Err(PushError::Full(v)));
                        } else {
                            prop_assert_eq!(r, Ok(()));
                            model.push_back(v);
                        }
                    }
                    Op::Pop => prop_assert_eq!(c.pop(), Ok(model.pop_front())),
                    Op::Free => prop_assert_eq!(p.free(), Ok(cap - model.len() as u32)),
                    Op::Len => prop_assert_eq!(c.len(), Ok(model.len() as u32)),
                    Op::PushSlice(vs) => {
                        let room = cap as usize - model.len();
                        prop_assert_eq!(p.push_slice(&vs), Ok(vs.len().min(room)));
                        model.extend(vs.iter().take(room));
                    }
                    Op::PopInto(max) => {
                        let mut out = vec![7];
                        let n = c.pop_into(&mut out, max).unwrap();
                        prop_assert_eq!(n, max.min(model.len()));
                        let expect: Vec<u64> = std::iter::once(7).chain(model.drain(..n)).collect();
                        prop_assert_eq!(out, expect);
                    }
                    Op::PeekRelease(i) => {
                        prop_assert_eq!(c.len(), Ok(model.len() as u32));
                        let got = c.peek_nth(i).map(|(_, v)| v);
                        prop_assert_eq!(got, model.get(i as usize).copied());
                        if got.is_some() {
                            c.release_n(i + 1);
                            model.drain(..=i as usize);
                        }
                    }
                }
            }
        }

        #[test]
        fn random_indices_never_out_of_bounds(cap_log in 1u32..6, head in any::<u32>(), tail in any::<u32>(), pops in 0usize..80) {
            let cap = 1u32 << cap_log;
            let (mut p, c) = heap_ring::<u64>(cap).unwrap();
            // SAFETY: the ring outlives the reference.
            let hdr = unsafe { header_at(keep_of(&c)) };
            hdr.store_head(head);
            hdr.store_tail(tail);
            // A fresh consumer at the forged head (the old one keeps its own).
            let keep = c._keep.clone();
            let base = keep_of(&c);
            drop(c);
            // SAFETY: alive via keep; single consumer.
            let mut c = unsafe { Consumer::<u64>::attach(base, cap, keep) };
            let valid = tail.wrapping_sub(head) <= cap;
            for _ in 0..pops {
                match c.pop() {
                    Ok(_) => prop_assert!(valid),
                    Err(e) => {
                        prop_assert!(!valid);
                        prop_assert_eq!(e, RingCorrupt { head, tail, capacity: cap });
                    }
                }
            }
            // The producer (local tail 0) checks the forged head too.
            let cur = c.head;
            match p.free() {
                Ok(free) => prop_assert!(free <= cap && 0u32.wrapping_sub(cur) <= cap),
                Err(e) => prop_assert_eq!(e, RingCorrupt { head: cur, tail: 0, capacity: cap }),
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    fn push_spin(p: &mut Producer<u32>, mut v: u32) {
        loop {
            match p.push(v) {
                Ok(()) => return,
                Err(PushError::Full(x)) => {
                    v = x;
                    loom::thread::yield_now();
                }
                Err(PushError::Corrupt(e)) => panic!("{e}"),
            }
        }
    }

    fn pop_spin(c: &mut Consumer<u32>) -> u32 {
        loop {
            match c.pop() {
                Ok(Some(v)) => return v,
                Ok(None) => loom::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Three messages through two slots: the producer may find the ring
    /// full and the consumer empty, slot 0 is reused, and the u32 indices
    /// wrap past `u32::MAX` (they start at `u32::MAX - 1`). (Four messages
    /// take about 2 minutes of model checking for little more coverage.)
    #[test]
    fn loom_spsc_wraparound_full_empty() {
        loom::model(|| {
            let (mut p, mut c) = heap_ring_at::<u32>(2, u32::MAX - 1).unwrap();
            let t = loom::thread::spawn(move || {
                for i in 0..3 {
                    push_spin(&mut p, i);
                }
                p
            });
            for i in 0..3 {
                assert_eq!(pop_spin(&mut c), i);
            }
            let mut p = t.join().unwrap();
            assert_eq!(c.pop(), Ok(None));
            assert_eq!(p.free(), Ok(2));
        });
    }

    /// Bursts: three messages through two slots with `push_slice` and
    /// `pop_into` (one index store per burst), indices wrapping.
    #[test]
    fn loom_spsc_bursts() {
        loom::model(|| {
            let (mut p, mut c) = heap_ring_at::<u32>(2, u32::MAX - 1).unwrap();
            let t = loom::thread::spawn(move || {
                let msgs = [0u32, 1, 2];
                let mut sent = 0;
                while sent < msgs.len() {
                    match p.push_slice(&msgs[sent..]) {
                        Ok(0) => loom::thread::yield_now(),
                        Ok(n) => sent += n,
                        Err(e) => panic!("{e}"),
                    }
                }
            });
            let mut got = Vec::new();
            while got.len() < 3 {
                match c.pop_into(&mut got, 3) {
                    Ok(0) => loom::thread::yield_now(),
                    Ok(_) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(got, [0, 1, 2]);
            t.join().unwrap();
        });
    }

    /// While the producer fills the ring, the consumer's view of the length
    /// is always within `0..=capacity` and never corrupt.
    #[test]
    fn loom_len_bounded() {
        loom::model(|| {
            let (mut p, mut c) = heap_ring::<u32>(2).unwrap();
            let t = loom::thread::spawn(move || {
                p.push(7).unwrap();
                p.push(8).unwrap();
                assert!(matches!(p.push(9), Err(PushError::Full(9)) | Ok(())));
            });
            let n = c.len().unwrap();
            assert!(n <= 2);
            if let Some(v) = c.pop().unwrap() {
                assert_eq!(v, 7);
            }
            t.join().unwrap();
        });
    }
}
