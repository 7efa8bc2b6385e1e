//! The snapshot a loop hands to its metrics server.
//!
//! The loop updates the snapshot in place under a lock it only ever *tries*
//! to take: if the server is copying it at that moment, the loop leaves it
//! and tries again at its next turn, so it never waits for a scrape. The
//! server holds the lock only while it copies the snapshot; all encoding
//! and socket work happens on its copy.

use std::sync::{Mutex, PoisonError, TryLockError};

/// A snapshot shared between the loop that writes it and the server that
/// reads it.
#[derive(Debug, Default)]
pub struct Slot<T> {
    inner: Mutex<T>,
}

impl<T: Clone> Slot<T> {
    pub fn new(v: T) -> Slot<T> {
        Slot {
            inner: Mutex::new(v),
        }
    }

    /// The loop: refreshes the snapshot in place with `f`, unless a reader
    /// holds it now; then returns false at once, and `f` is not called.
    pub fn try_update(&self, f: impl FnOnce(&mut T)) -> bool {
        match self.inner.try_lock() {
            Ok(mut g) => {
                f(&mut g);
                true
            }
            // A reader panicked while copying: the data is still whole.
            Err(TryLockError::Poisoned(p)) => {
                f(&mut p.into_inner());
                true
            }
            Err(TryLockError::WouldBlock) => false,
        }
    }

    /// The server: a copy of the snapshot.
    pub fn read(&self) -> T {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_while_a_reader_holds_it_is_skipped_not_awaited() {
        let s = Slot::new(1u64);
        assert!(s.try_update(|v| *v = 2));
        assert_eq!(s.read(), 2);
        let held = s.inner.lock().unwrap();
        assert!(!s.try_update(|v| *v = 3));
        drop(held);
        assert_eq!(s.read(), 2);
        assert!(s.try_update(|v| *v = 3));
        assert_eq!(s.read(), 3);
    }
}
