//! The wake page (docs/runtime.md, "Local wakes"): one futex word per
//! kthread of every application that asks for one, in a memfd that
//! iokerneld creates and maps writable, and that each such application
//! maps read-only.
//!
//! A kthread that sleeps for a grant waits on its word. iokerneld grants by
//! its grant word (`wake_word`), then bumps this word and wakes it — or asks
//! the kthread running on the granted core to wake it (a local wake:
//! without an inter-processor interrupt). A futex wake needs only the
//! word's address, which every application has, so the asked kthread may
//! belong to any process.
//!
//! Only iokerneld writes the words (the memfd is sealed against new
//! writable mappings and writes), so a kthread that read a value and then
//! found no grant cannot miss the next one: iokerneld's bump makes its wait
//! return at once. Another application can only wake it for nothing, and
//! it then finds no grant and waits again.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use ginza_sys::memfd::{self, Seals};

use crate::region::MAX_KTHREADS;

/// Blocks of [`MAX_KTHREADS`] words, one per application at most.
pub const WAKE_PAGE_BLOCKS: u32 = 256;
const SLOTS: u32 = WAKE_PAGE_BLOCKS * MAX_KTHREADS;
const BYTES: u64 = SLOTS as u64 * 4;

/// Why a wake page could not be made or mapped.
#[derive(Debug, thiserror::Error)]
pub enum WakePageError {
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("wake page memfd is {found} bytes, expected {expected}")]
    Size { found: u64, expected: u64 },
    #[error("wake page memfd seals {0:#x} lack shrink/future-write sealing")]
    NotSealed(i32),
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> WakePageError {
    move |source| WakePageError::Io { op, source }
}

/// The wake page (see the module doc).
#[derive(Debug)]
pub struct WakePage {
    fd: OwnedFd,
    base: NonNull<AtomicU32>,
    writable: bool,
}

// SAFETY: the mapping holds only atomics, reached through bounds-checked
// references, and lives as long as the value.
unsafe impl Send for WakePage {}
// SAFETY: as above.
unsafe impl Sync for WakePage {}

impl WakePage {
    /// iokerneld's side: a new page, mapped writable, then sealed so that
    /// nobody can map it writable again or write it.
    pub fn create() -> Result<WakePage, WakePageError> {
        let fd = memfd::create("ginza-wake-page", BYTES).map_err(io_err("memfd_create"))?;
        let base = memfd::map(fd.as_fd(), BYTES as usize).map_err(io_err("mmap"))?;
        let page = WakePage {
            fd,
            base: base.cast(),
            writable: true,
        };
        memfd::add_seals(page.fd.as_fd(), memfd::SIZE_SEALS | Seals::FUTURE_WRITE)
            .map_err(io_err("F_ADD_SEALS"))?;
        Ok(page)
    }

    /// An application's side: maps the page iokerneld sent, read-only,
    /// after checking its size and seals.
    pub fn map_read_only(fd: OwnedFd) -> Result<WakePage, WakePageError> {
        let seals = memfd::seals(fd.as_fd()).map_err(io_err("F_GET_SEALS"))?;
        if !seals.contains(Seals::SHRINK | Seals::FUTURE_WRITE) {
            return Err(WakePageError::NotSealed(seals.bits() as i32));
        }
        let found = memfd::size(fd.as_fd()).map_err(io_err("fstat"))?;
        if found != BYTES {
            return Err(WakePageError::Size {
                found,
                expected: BYTES,
            });
        }
        let base = memfd::map_read_only(fd.as_fd(), BYTES as usize).map_err(io_err("mmap"))?;
        Ok(WakePage {
            fd,
            base: base.cast(),
            writable: false,
        })
    }

    /// The memfd, to send to an application.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The first slot of block `block` (an application's kthreads take
    /// the slots from there on), if there is such a block.
    pub fn block_start(block: u32) -> Option<u32> {
        (block < WAKE_PAGE_BLOCKS).then(|| block * MAX_KTHREADS)
    }

    /// Whether `n` slots from `start` are all in the page.
    pub fn holds(start: u32, n: u32) -> bool {
        start.checked_add(n).is_some_and(|end| end <= SLOTS)
    }

    fn word(&self, slot: u32) -> Option<&AtomicU32> {
        // SAFETY: in bounds of the mapping, which lives as long as `self`;
        // `AtomicU32` has the layout of the `u32` words it maps.
        (slot < SLOTS).then(|| unsafe { &*self.base.as_ptr().add(slot as usize) })
    }

    /// The word's value, to wait on once the caller has looked for what
    /// it waits for (0 for a slot outside the page).
    pub fn seen(&self, slot: u32) -> u32 {
        self.word(slot).map_or(0, |w| w.load(Ordering::Acquire))
    }

    fn word_or_err(&self, slot: u32) -> io::Result<&AtomicU32> {
        self.word(slot).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("wake slot {slot} is outside the page ({SLOTS} slots)"),
            )
        })
    }

    /// Sleeps while the word still holds `seen` (see [`ginza_sys::futex::wait`]).
    pub fn wait(&self, slot: u32, seen: u32) -> io::Result<()> {
        ginza_sys::futex::wait(self.word_or_err(slot)?, seen)
    }

    /// Wakes the kthread sleeping on `slot`, from any process that maps
    /// the page; says how many were asleep there (0 or 1).
    pub fn wake(&self, slot: u32) -> io::Result<usize> {
        ginza_sys::futex::wake(self.word_or_err(slot)?)
    }

    /// iokerneld's side: something the kthread on `slot` waits for has
    /// happened (before its wake). False on a read-only mapping or a slot
    /// outside the page.
    pub fn bump(&self, slot: u32) -> bool {
        match self.word(slot) {
            Some(w) if self.writable => {
                w.fetch_add(1, Ordering::AcqRel);
                true
            }
            _ => false,
        }
    }
}

impl Drop for WakePage {
    fn drop(&mut self) {
        // SAFETY: made by `memfd::map`/`map_read_only` with `BYTES` bytes;
        // the references `word` hands out borrow `self`, so none is left.
        unsafe { memfd::unmap(self.base.cast(), BYTES as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create/mmap/futex are not supported by Miri")]
    fn a_bump_by_iokerneld_ends_the_wait_of_a_reader_of_its_copy() {
        let page = WakePage::create().unwrap();
        let fd = page.fd().try_clone_to_owned().unwrap();
        let app = Arc::new(WakePage::map_read_only(fd).unwrap());
        let slot = WakePage::block_start(3).unwrap() + 5;
        assert!(!app.bump(slot), "the application's mapping is read-only");
        let seen = app.seen(slot);
        let app2 = Arc::clone(&app);
        let waiter = std::thread::spawn(move || {
            while app2.seen(slot) == seen {
                app2.wait(slot, seen).unwrap();
            }
        });
        assert!(page.bump(slot));
        // The application's side may wake it too (a local wake).
        app.wake(slot).unwrap();
        waiter.join().unwrap();
        assert_eq!(app.seen(slot), seen.wrapping_add(1));
        // A neighbour did not move.
        assert_eq!(app.seen(slot + 1), 0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create/mmap are not supported by Miri")]
    fn an_unsealed_or_wrong_sized_memfd_is_refused() {
        let fd = memfd::create("not-a-wake-page", BYTES).unwrap();
        assert!(matches!(
            WakePage::map_read_only(fd),
            Err(WakePageError::NotSealed(_))
        ));
        let fd = memfd::create("small-wake-page", 4096).unwrap();
        memfd::add_seals(fd.as_fd(), memfd::SIZE_SEALS | Seals::FUTURE_WRITE).unwrap();
        assert!(matches!(
            WakePage::map_read_only(fd),
            Err(WakePageError::Size { found: 4096, .. })
        ));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create/mmap are not supported by Miri")]
    fn slots_outside_the_page_are_refused() {
        assert_eq!(WakePage::block_start(WAKE_PAGE_BLOCKS), None);
        assert!(WakePage::holds(SLOTS - 2, 2));
        assert!(!WakePage::holds(SLOTS - 2, 3));
        assert!(!WakePage::holds(u32::MAX, 2));
        let page = WakePage::create().unwrap();
        assert!(!page.bump(SLOTS));
        assert_eq!(page.seen(SLOTS), 0);
        assert!(page.wake(SLOTS).is_err());
        assert!(page.wait(SLOTS, 0).is_err());
    }
}
