//! The system calls iokerneld and its client need, wrapped safely: unix
//! SOCK_SEQPACKET sockets with `SCM_RIGHTS`, peer credentials, `ppoll`,
//! eventfds, thread affinity and `tgkill`. All of the crate's `unsafe` is
//! here.

use std::ffi::OsStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Takes ownership of a descriptor the kernel just gave us.
fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: callers pass a descriptor freshly returned by a successful
    // syscall (socket, accept4, eventfd, or one received by SCM_RIGHTS),
    // which nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: `sockaddr_un` is plain integers and bytes; all zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is empty, contains NUL or is longer than {} bytes",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn seqpacket(nonblock: bool) -> io::Result<OwnedFd> {
    let flags =
        libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | if nonblock { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain syscall with integer arguments.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, flags, 0) })?;
    Ok(owned(fd))
}

/// A non-blocking listening SOCK_SEQPACKET socket bound at `path`.
pub fn listen_seqpacket(path: &Path, backlog: i32) -> io::Result<OwnedFd> {
    let (addr, len) = sockaddr(path)?;
    let fd = seqpacket(true)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    // SAFETY: plain syscall on a valid socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(fd)
}

/// A blocking SOCK_SEQPACKET socket connected to `path`.
pub fn connect_seqpacket(path: &Path) -> io::Result<OwnedFd> {
    let (addr, len) = sockaddr(path)?;
    let fd = seqpacket(false)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    Ok(fd)
}

/// Accepts one connection (non-blocking, close-on-exec); `None` if none is
/// waiting.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    // SAFETY: null address pointers are allowed (peer address not wanted).
    let r = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    match cvt(r) {
        Ok(fd) => Ok(Some(owned(fd))),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sends one message with `fds` attached (SCM_RIGHTS). `MSG_NOSIGNAL`: a
/// closed peer is an `EPIPE` error, not a SIGPIPE.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let fd_bytes = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE is a pure computation on its argument.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    // u64 elements keep the control buffer aligned for `cmsghdr`.
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `msghdr` is plain data; all zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg_control` points at `space` bytes, enough for one
        // header carrying `fd_bytes` of data (CMSG_SPACE above), so the
        // first header and its data lie inside `cbuf`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                raw.len(),
            );
        }
    }
    // SAFETY: `msg` points at live buffers (iov over `data`, `cbuf`) for the
    // duration of the call; the kernel only reads them.
    let n = cvt_size(unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })?;
    if n != data.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short send on a SOCK_SEQPACKET socket",
        ));
    }
    Ok(())
}

/// One received message.
#[derive(Debug)]
pub struct Received {
    /// Bytes of the message that fit in the buffer (0 with `closed`).
    pub len: usize,
    /// The message was longer than the buffer (`MSG_TRUNC`).
    pub truncated: bool,
    /// More descriptors were sent than the control buffer holds
    /// (`MSG_CTRUNC`); the extra ones were closed by the kernel.
    pub fds_truncated: bool,
    /// Descriptors received (owned: dropped = closed).
    pub fds: Vec<OwnedFd>,
    /// The peer closed the connection.
    pub closed: bool,
}

/// Receives one message, without blocking if `dontwait`. `Ok(None)`: none is
/// waiting. Received descriptors are close-on-exec.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
    dontwait: bool,
) -> io::Result<Option<Received>> {
    let fd_bytes = max_fds.max(1) * size_of::<RawFd>();
    // SAFETY: CMSG_SPACE is a pure computation on its argument.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `msghdr` is plain data; all zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let flags = libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: `msg` describes live, writable buffers of the stated sizes.
    let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags) };
    let n = match cvt_size(r) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => {
            return Ok(Some(Received {
                len: 0,
                truncated: false,
                fds_truncated: false,
                fds: Vec::new(),
                closed: true,
            }))
        }
        Err(e) => return Err(e),
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_control`/`msg_controllen`; the CMSG_*
    // macros walk only within that length. Each SCM_RIGHTS payload is an
    // array of descriptors now installed in this process and owned by us;
    // it may be unaligned, hence `read_unaligned`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let payload = (*c).cmsg_len as usize - (data as usize - c as usize);
                let count = payload / size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(owned(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some(Received {
        len: n.min(buf.len()),
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        fds_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
        closed: n == 0 && fds.is_empty(),
        fds,
    }))
}

/// The pid of the process at the other end of a unix socket (as it was at
/// connect time).
pub fn peer_pid(sock: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: `ucred` is plain integers.
    let mut cred: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable for `len` bytes.
    cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(cred.pid)
}

/// `ppoll` on `fds`; `None` waits forever. Returns how many are ready (0 on
/// timeout or EINTR).
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
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
    match cvt(r) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// A new non-blocking, close-on-exec eventfd with counter 0.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    Ok(owned(fd))
}

/// Adds `v` to an eventfd's counter (wakes a reader).
pub fn eventfd_write(fd: BorrowedFd<'_>, v: u64) -> io::Result<()> {
    let b = v.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer.
    let n = cvt_size(unsafe { libc::write(fd.as_raw_fd(), b.as_ptr().cast(), 8) })?;
    if n != 8 {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short eventfd write",
        ));
    }
    Ok(())
}

/// Reads and resets an eventfd's counter; `Ok(None)` if it is 0 (the fd
/// must be non-blocking).
pub fn eventfd_read(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    let mut b = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live buffer.
    let r = unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
    match cvt_size(r) {
        Ok(8) => Ok(Some(u64::from_ne_bytes(b))),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short eventfd read",
        )),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Pins thread `tid` (0: the calling thread) to `cpu`.
pub fn set_affinity(tid: i32, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} out of range"),
        ));
    }
    // SAFETY: `cpu_set_t` is a plain bit array; all zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: `cpu < CPU_SETSIZE`, checked above, so the bit is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    cvt(unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) }).map(drop)
}

/// Lets thread `tid` run on any of `cpus`.
pub fn set_affinity_set(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: `cpu_set_t` is a plain bit array; all zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {cpu} out of range"),
            ));
        }
        // SAFETY: `cpu < CPU_SETSIZE`, so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    cvt(unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) }).map(drop)
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: as in `set_affinity`.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: `set` is writable and of the size passed.
    cvt(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c < CPU_SETSIZE`, so the bit is inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Sends `sig` to thread `tid` of process `pid` (tgkill: the thread id is
/// checked against the process, so a reused tid elsewhere is never hit).
pub fn tgkill(pid: i32, tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            pid as libc::c_long,
            tid as libc::c_long,
            sig as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The calling thread's kernel thread id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// The calling process's real user id.
pub fn getuid() -> u32 {
    // SAFETY: getuid has no arguments and cannot fail.
    unsafe { libc::getuid() }
}

/// CLOCK_MONOTONIC in ns (the clock of runtimes' timer deadlines).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is writable; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What `/proc/self/fd/<fd>` says the descriptor is (e.g.
/// `anon_inode:[eventfd]`, `/memfd:name (deleted)`).
pub fn fd_target(fd: BorrowedFd<'_>) -> io::Result<std::ffi::OsString> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map(|p| p.into_os_string())
}

/// Whether `fd` is an eventfd.
pub fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
    fd_target(fd).is_ok_and(|t| t == OsStr::new("anon_inode:[eventfd]"))
}

/// Installs `handler` for `sig` (SA_RESTART), for tests of signal delivery
/// and, later, the runtime's preemption handler.
pub fn install_handler(sig: i32, handler: extern "C" fn(i32)) -> io::Result<()> {
    // SAFETY: `sigaction` is plain data; all zero is an empty action.
    let mut sa: libc::sigaction = unsafe { zeroed() };
    sa.sa_sigaction = handler as usize;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: `sa` is a valid action whose handler is an `extern "C"`
    // function taking the signal number; no old action is requested.
    cvt(unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) }).map(drop)
}

/// CPU time consumed by the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is writable; the clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
