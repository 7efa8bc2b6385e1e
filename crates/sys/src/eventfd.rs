//! eventfds: the counters a parked kthread blocks on and iokerneld (or a
//! waker in the runtime) writes.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::EventfdFlags;

use crate::poll::PollFlags;

/// A new non-blocking, close-on-exec eventfd with counter 0.
pub fn new() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
    )?)
}

/// A new blocking, close-on-exec eventfd with counter 0: [`read`] waits
/// for a write (a benchmark measures that wake-up).
pub fn new_blocking() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(0, EventfdFlags::CLOEXEC)?)
}

/// Adds `v` to the counter (wakes a reader).
pub fn write(fd: BorrowedFd<'_>, v: u64) -> io::Result<()> {
    let n = rustix::io::write(fd, &v.to_ne_bytes())?;
    if n != 8 {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short eventfd write",
        ));
    }
    Ok(())
}

/// Adds 1 to the counter of the eventfd `fd` from a signal handler: one
/// `write(2)`, which is async-signal-safe; errors are ignored (a full
/// counter is readable already).
pub fn write_from_signal_handler(fd: std::os::fd::RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: `one` is 8 readable bytes alive for the call; a descriptor
    // that is no longer an eventfd fails the write, which is ignored.
    let _ = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
}

/// Reads and resets the counter; `Ok(None)` if it is 0 and the eventfd is
/// non-blocking (a blocking one waits for a write).
pub fn read(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    let mut b = [0u8; 8];
    match rustix::io::read(fd, &mut b) {
        Ok(8) => Ok(Some(u64::from_ne_bytes(b))),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short eventfd read",
        )),
        Err(rustix::io::Errno::AGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Blocks until the eventfd is readable, a signal interrupts, or `timeout`
/// passes (`None`: no timeout). Reads nothing; true if it is readable.
pub fn wait(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let ready = crate::poll::poll_one(fd, PollFlags::IN, timeout)?;
    Ok(ready.contains(PollFlags::IN))
}

/// Whether `fd` is an eventfd (what `/proc/self/fd` says it is).
pub fn is_eventfd(fd: impl AsFd) -> bool {
    crate::process::fd_target(fd.as_fd()).is_ok_and(|t| t == OsStr::new("anon_inode:[eventfd]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_add_up_and_a_read_resets() {
        let fd = new().unwrap();
        assert!(is_eventfd(&fd));
        assert_eq!(read(fd.as_fd()).unwrap(), None);
        assert!(!wait(fd.as_fd(), Some(Duration::ZERO)).unwrap());
        write(fd.as_fd(), 2).unwrap();
        write(fd.as_fd(), 3).unwrap();
        assert!(wait(fd.as_fd(), None).unwrap());
        assert_eq!(read(fd.as_fd()).unwrap(), Some(5));
        assert_eq!(read(fd.as_fd()).unwrap(), None);
    }

    #[test]
    fn a_write_from_another_thread_ends_a_wait() {
        let fd = new().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| write(fd.as_fd(), 1).unwrap());
            while !wait(fd.as_fd(), Some(Duration::from_secs(10))).unwrap() {}
        });
        assert_eq!(read(fd.as_fd()).unwrap(), Some(1));
    }

    #[test]
    fn a_file_is_not_an_eventfd() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(!is_eventfd(&f));
    }
}
