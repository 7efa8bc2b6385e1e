//! The atomics and cells the ring is built from: `std` normally, `loom`'s
//! under `--cfg loom` so the model checker sees every access.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, Ordering};

/// Storage for one ring slot. Reads and writes copy the whole value with
/// volatile accesses: the peer may be another process, so a value is read
/// exactly once into a local copy and then validated (no double fetch).
#[cfg(not(loom))]
#[repr(transparent)]
pub(crate) struct SlotCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T: Copy> SlotCell<T> {
    pub(crate) fn new(v: T) -> Self {
        SlotCell(std::cell::UnsafeCell::new(v))
    }

    /// # Safety
    /// No thread of this process writes the slot concurrently.
    pub(crate) unsafe fn read(&self) -> T {
        // SAFETY: the pointer comes from a live cell; the caller excludes
        // concurrent writers in this process.
        unsafe { std::ptr::read_volatile(self.0.get()) }
    }

    /// # Safety
    /// No thread of this process reads or writes the slot concurrently.
    pub(crate) unsafe fn write(&self, v: T) {
        // SAFETY: as for `read`, with readers excluded too.
        unsafe { std::ptr::write_volatile(self.0.get(), v) }
    }
}

#[cfg(loom)]
pub(crate) struct SlotCell<T>(loom::cell::UnsafeCell<T>);

#[cfg(loom)]
impl<T: Copy> SlotCell<T> {
    pub(crate) fn new(v: T) -> Self {
        SlotCell(loom::cell::UnsafeCell::new(v))
    }

    /// # Safety
    /// No concurrent writer (loom checks it).
    pub(crate) unsafe fn read(&self) -> T {
        // SAFETY: loom tracks this access and reports a race.
        self.0.with(|p| unsafe { p.read() })
    }

    /// # Safety
    /// No concurrent reader or writer (loom checks it).
    pub(crate) unsafe fn write(&self, v: T) {
        // SAFETY: loom tracks this access and reports a race.
        self.0.with_mut(|p| unsafe { p.write(v) })
    }
}
