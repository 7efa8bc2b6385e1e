//! Futexes on words of a shared mapping (the wake page, docs/runtime.md,
//! "Local wakes"): shared, not private, so that a word mapped by several
//! processes is one futex for all of them (the kernel keys it by file and
//! offset), and a process that maps it read-only may still wait on it and
//! wake it.

use std::io;
use std::sync::atomic::AtomicU32;

use rustix::thread::futex;

/// Blocks while `word` holds `seen`, until a [`wake`] of it or a signal.
/// Returns at once if the word already changed; the caller looks again
/// either way (a wake-up says nothing by itself).
pub fn wait(word: &AtomicU32, seen: u32) -> io::Result<()> {
    match futex::wait(word, futex::Flags::empty(), seen, None) {
        Ok(()) | Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Wakes one thread blocked in [`wait`] on `word`, in any process that
/// maps it; returns how many were woken.
pub fn wake(word: &AtomicU32) -> io::Result<usize> {
    Ok(futex::wake(word, futex::Flags::empty(), 1)?)
}

/// [`wait`] on a word of this process only (a private futex), giving up
/// after `timeout` if one is given. For threads that must block without
/// touching the standard library's thread handles (code that glibc or the
/// allocator may call while such a handle is being made).
pub fn wait_private(
    word: &AtomicU32,
    seen: u32,
    timeout: Option<std::time::Duration>,
) -> io::Result<()> {
    let ts = timeout.map(|t| rustix::time::Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    match futex::wait(word, futex::Flags::PRIVATE, seen, ts.as_ref()) {
        Ok(())
        | Err(rustix::io::Errno::AGAIN)
        | Err(rustix::io::Errno::INTR)
        | Err(rustix::io::Errno::TIMEDOUT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Wakes every thread in [`wait_private`] on `word`.
pub fn wake_private(word: &AtomicU32) -> io::Result<usize> {
    Ok(futex::wake(word, futex::Flags::PRIVATE, u32::MAX)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;

    #[test]
    #[cfg_attr(miri, ignore = "futex is not supported by Miri")]
    fn a_changed_word_and_a_wake_end_a_wait() {
        let w = Arc::new(AtomicU32::new(0));
        // Changed before the wait: it returns at once.
        wait(&w, 1).unwrap();
        let w2 = Arc::clone(&w);
        let waiter = std::thread::spawn(move || {
            while w2.load(SeqCst) == 0 {
                wait(&w2, 0).unwrap();
            }
        });
        w.store(1, SeqCst);
        // Whether or not the waiter is asleep yet, it sees 1 next.
        wake(&w).unwrap();
        waiter.join().unwrap();
    }
}
