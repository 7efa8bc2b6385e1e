//! Waiting for descriptors (`ppoll`).

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use rustix::event::PollFd;
pub use rustix::event::PollFlags;
use rustix::time::Timespec;

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: d.subsec_nanos().into(),
    }
}

/// Waits until `fd` has one of `events` (or a hang-up or error, which
/// need not be asked for), a signal interrupts, or `timeout` passes
/// (`None`: no timeout). Returns what happened: empty on timeout or
/// interruption.
pub fn poll_one(
    fd: BorrowedFd<'_>,
    events: PollFlags,
    timeout: Option<Duration>,
) -> io::Result<PollFlags> {
    let ts = timeout.map(timespec);
    let mut fds = [PollFd::from_borrowed_fd(fd, events)];
    match rustix::event::poll(&mut fds, ts.as_ref()) {
        Ok(0) => Ok(PollFlags::empty()),
        Ok(_) => Ok(fds[0].revents()),
        Err(rustix::io::Errno::INTR) => Ok(PollFlags::empty()),
        Err(e) => Err(e.into()),
    }
}

/// `ppoll` on raw entries that the caller keeps between calls (iokerneld's
/// loop refills one list each turn instead of allocating it; rustix's
/// `PollFd` borrows its descriptors, so it cannot be kept beside their
/// owners). `None` waits forever. Returns how many are ready (0 on timeout
/// or interruption).
pub fn poll_raw(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` is a valid mutable slice of pollfd; `tsp` is null or
    // points at `ts`, alive for the call; no signal mask is changed.
    let r = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if r >= 0 {
        return Ok(r as usize);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::Interrupted {
        Ok(0)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::UnixDatagram;

    use super::*;

    #[test]
    fn readiness_and_hang_up_are_reported() {
        let (a, b) = UnixDatagram::pair().unwrap();
        let none = poll_one(a.as_fd(), PollFlags::IN, Some(Duration::ZERO)).unwrap();
        assert!(none.is_empty());
        b.send(b"x").unwrap();
        let ready = poll_one(a.as_fd(), PollFlags::IN, None).unwrap();
        assert!(ready.contains(PollFlags::IN));
        let mut raw = [libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(poll_raw(&mut raw, Some(Duration::ZERO)).unwrap(), 1);
        assert_ne!(raw[0].revents & libc::POLLIN, 0);
    }
}
