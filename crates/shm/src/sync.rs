//! The atomics and cells the ring is built from: `std` normally, `loom`'s
//! under `--cfg loom` so the model checker sees every access.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, Ordering};

/// Storage for one ring slot: the message, and the number that publishes
/// it (its sequence number plus one, stored by the producer after the
/// message). Reads and writes copy the whole message with volatile
/// accesses: the peer may be another process, so a value is read exactly
/// once into a local copy and then validated (no double fetch).
///
/// Aligned to 16 bytes so that a small message and its number share one
/// cache line (a 16-byte packet descriptor makes a 32-byte slot, two per
/// line and none straddling; a `u32` a 16-byte one): the consumer learns
/// that a message is there and reads it with one cache-line transfer.
#[cfg(not(loom))]
#[repr(C, align(16))]
pub(crate) struct SlotCell<T> {
    seq: AtomicU32,
    val: std::cell::UnsafeCell<T>,
}

#[cfg(not(loom))]
impl<T: Copy> SlotCell<T> {
    pub(crate) fn new(v: T, seq: u32) -> Self {
        SlotCell {
            seq: AtomicU32::new(seq),
            val: std::cell::UnsafeCell::new(v),
        }
    }

    /// # Safety
    /// No thread of this process writes the slot concurrently.
    pub(crate) unsafe fn read(&self) -> T {
        // SAFETY: the pointer comes from a live cell; the caller excludes
        // concurrent writers in this process.
        unsafe { std::ptr::read_volatile(self.val.get()) }
    }

    /// # Safety
    /// No thread of this process reads or writes the slot concurrently.
    pub(crate) unsafe fn write(&self, v: T) {
        // SAFETY: as for `read`, with readers excluded too.
        unsafe { std::ptr::write_volatile(self.val.get(), v) }
    }
}

#[cfg(loom)]
pub(crate) struct SlotCell<T> {
    seq: AtomicU32,
    val: loom::cell::UnsafeCell<T>,
}

#[cfg(loom)]
impl<T: Copy> SlotCell<T> {
    pub(crate) fn new(v: T, seq: u32) -> Self {
        SlotCell {
            seq: AtomicU32::new(seq),
            val: loom::cell::UnsafeCell::new(v),
        }
    }

    /// # Safety
    /// No concurrent writer (loom checks it).
    pub(crate) unsafe fn read(&self) -> T {
        // SAFETY: loom tracks this access and reports a race.
        self.val.with(|p| unsafe { p.read() })
    }

    /// # Safety
    /// No concurrent reader or writer (loom checks it).
    pub(crate) unsafe fn write(&self, v: T) {
        // SAFETY: loom tracks this access and reports a race.
        self.val.with_mut(|p| unsafe { p.write(v) })
    }
}

impl<T> SlotCell<T> {
    /// The number last published in this slot (acquire: the message
    /// written before it is visible once the number is).
    pub(crate) fn published(&self) -> u32 {
        self.seq.load(Ordering::Acquire)
    }

    /// Publishes the message just written, as `seq` (release).
    pub(crate) fn publish(&self, seq: u32) {
        self.seq.store(seq, Ordering::Release)
    }
}
