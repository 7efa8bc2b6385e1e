//! Wakes iokerneld's loop from another thread of its process: the stop,
//! generator and fault handles ring it after leaving their request, so a
//! loop asleep while idle (docs/iokernel-idle.md) takes the request at once.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// An eventfd shared by the loop and its handles. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LoopWaker(Arc<Option<OwnedFd>>);

impl Default for LoopWaker {
    /// A new eventfd; without one (the process is out of descriptors) the
    /// loop cannot be woken and must bound its sleeps ([`LoopWaker::fd`]).
    fn default() -> Self {
        let fd = ginza_sys::eventfd::new()
            .map_err(|e| {
                log::warn!("iokerneld: no eventfd for its handles ({e}): its sleeps are bounded")
            })
            .ok();
        LoopWaker(Arc::new(fd))
    }
}

impl LoopWaker {
    /// Wakes the loop if it sleeps (a handle left it a request).
    pub fn wake(&self) {
        if let Some(fd) = self.0.as_ref() {
            // A full counter is readable already.
            let _ = ginza_sys::eventfd::write(fd.as_fd(), 1);
        }
    }

    /// The descriptor the sleeping loop polls; `None` if there is none.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.0.as_ref().as_ref().map(|fd| fd.as_fd())
    }

    /// Resets the counter after a wake (the loop).
    pub fn clear(&self) {
        if let Some(fd) = self.fd() {
            let _ = ginza_sys::eventfd::read(fd);
        }
    }
}
