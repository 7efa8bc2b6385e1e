//! Ids of the calling thread, process and user; what a descriptor is.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The calling thread's kernel thread id.
pub fn gettid() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// The calling process's id.
pub fn getpid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// The calling process's real user id.
pub fn getuid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// The calling process's effective user id (0: root).
pub fn geteuid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Makes this process non-dumpable: no core dumps, and processes of the
/// same user without `CAP_SYS_PTRACE` can no longer ptrace it nor open its
/// `/proc/<pid>/fd/*` (so they cannot reach the memfds it holds).
pub fn set_non_dumpable() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// What `/proc/self/fd/<fd>` says the descriptor is (e.g.
/// `anon_inode:[eventfd]`, `/memfd:name (deleted)`, `/dev/null`).
pub fn fd_target(fd: BorrowedFd<'_>) -> io::Result<OsString> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map(|p| p.into_os_string())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn ids_are_this_process() {
        assert_eq!(getpid() as u32, std::process::id());
        let main = gettid();
        let other = std::thread::spawn(gettid).join().unwrap();
        assert_ne!(main, other);
        let _ = getuid();
        let _ = geteuid();
    }

    #[test]
    fn a_descriptor_says_what_it_is() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(fd_target(f.as_fd()).unwrap(), "/dev/null");
    }
}
