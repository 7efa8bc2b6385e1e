//! Unix SOCK_SEQPACKET sockets that carry descriptors (`SCM_RIGHTS`): the
//! control connection between a runtime and iokerneld.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// Longest socket path, in bytes (`sun_path` less its NUL).
const MAX_PATH: usize = 107;

fn address(path: &Path) -> io::Result<SocketAddrUnix> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_PATH || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is empty, contains NUL or is longer than {MAX_PATH} bytes",
                path.display(),
            ),
        ));
    }
    Ok(SocketAddrUnix::new(path)?)
}

fn seqpacket(nonblock: bool) -> io::Result<OwnedFd> {
    let flags = SocketFlags::CLOEXEC
        | if nonblock {
            SocketFlags::NONBLOCK
        } else {
            SocketFlags::empty()
        };
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        flags,
        None,
    )?)
}

/// A non-blocking listening SOCK_SEQPACKET socket bound at `path`.
pub fn listen_seqpacket(path: &Path, backlog: i32) -> io::Result<OwnedFd> {
    let addr = address(path)?;
    let fd = seqpacket(true)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, backlog)?;
    Ok(fd)
}

/// A blocking SOCK_SEQPACKET socket connected to `path`.
pub fn connect_seqpacket(path: &Path) -> io::Result<OwnedFd> {
    let addr = address(path)?;
    let fd = seqpacket(false)?;
    rustix::net::connect(&fd, &addr)?;
    Ok(fd)
}

/// Accepts one connection (non-blocking, close-on-exec); `None` if none is
/// waiting (or the one waiting was aborted by its client).
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    match rustix::net::accept_with(listener, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::CONNABORTED) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Sends one message with `fds` attached. `MSG_NOSIGNAL`: a closed peer is
/// an `EPIPE` error, not a SIGPIPE.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let rights = SendAncillaryMessage::ScmRights(fds);
    let mut space = vec![MaybeUninit::uninit(); rights.size()];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(rights) {
        return Err(io::Error::other("no room for the descriptors"));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
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
    /// More than `max_fds` descriptors were sent; the extra ones are
    /// closed.
    pub fds_truncated: bool,
    /// Descriptors received (owned: dropped = closed).
    pub fds: Vec<OwnedFd>,
    /// The peer closed the connection.
    pub closed: bool,
}

/// Receives one message and at most `max_fds` descriptors, without
/// blocking if `dontwait`. `Ok(None)`: none is waiting. Received
/// descriptors are close-on-exec.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
    dontwait: bool,
) -> io::Result<Option<Received>> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let flags = RecvFlags::CMSG_CLOEXEC
        | if dontwait {
            RecvFlags::DONTWAIT
        } else {
            RecvFlags::empty()
        };
    let msg = match rustix::net::recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, flags) {
        Ok(msg) => msg,
        Err(rustix::io::Errno::AGAIN) => return Ok(None),
        Err(rustix::io::Errno::CONNRESET) => {
            return Ok(Some(Received {
                len: 0,
                truncated: false,
                fds_truncated: false,
                fds: Vec::new(),
                closed: true,
            }))
        }
        Err(e) => return Err(e.into()),
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    // The control buffer is rounded up for alignment, so it may hold more
    // than asked for; the limit is `max_fds` all the same.
    // A message with no bytes is still a message if it carried descriptors.
    let closed = msg.bytes == 0 && fds.is_empty();
    let fds_truncated = msg.flags.contains(ReturnFlags::CTRUNC) || fds.len() > max_fds;
    fds.truncate(max_fds);
    Ok(Some(Received {
        len: msg.bytes.min(buf.len()),
        truncated: msg.flags.contains(ReturnFlags::TRUNC),
        fds_truncated,
        closed,
        fds,
    }))
}

/// Asks for a send buffer of at least `bytes` (the kernel caps the request
/// at `net.core.wmem_max` and doubles it; as root, past the cap) and
/// returns the size the socket has now. On a SOCK_SEQPACKET socket this
/// bounds the longest message it can send.
pub fn set_send_buffer(sock: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    use rustix::net::sockopt;
    if sockopt::set_socket_send_buffer_size_force(sock, bytes).is_err() {
        sockopt::set_socket_send_buffer_size(sock, bytes)?;
    }
    Ok(sockopt::socket_send_buffer_size(sock)?)
}

/// The pid of the process at the other end of a unix socket (as it was at
/// connect time).
pub fn peer_pid(sock: impl AsFd) -> io::Result<i32> {
    let cred = rustix::net::sockopt::socket_peercred(sock)?;
    Ok(cred.pid.as_raw_nonzero().get())
}

/// `setsockopt(fd, level, option)` with a `T`: the option's C type.
pub fn set_option<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    option: libc::c_int,
    value: &T,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `value` points to a live `T` of `size_of::<T>()` bytes, the
    // type the option expects (callers pair options with their types).
    let result = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            option,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `getsockopt(fd, level, option)` into a `T`.
///
/// # Safety
/// `T` is the option's C struct: plain integers, for which every bit
/// pattern (all zero included) is a valid value.
pub unsafe fn get_option<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    option: libc::c_int,
) -> io::Result<T> {
    use std::os::fd::AsRawFd;
    // SAFETY: all zero is a valid `T` (caller's contract).
    let mut value: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes and `len` holds the
    // size of `value`.
    let result = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            option,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket_path(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ginza-sys-{tag}-{}.sock", std::process::id()))
    }

    #[test]
    fn messages_carry_descriptors_and_a_hang_up_is_seen() {
        let path = socket_path("pass");
        let _ = std::fs::remove_file(&path);
        let listener = listen_seqpacket(&path, 4).unwrap();
        assert!(accept(listener.as_fd()).unwrap().is_none());
        let client = connect_seqpacket(&path).unwrap();
        let server = loop {
            if let Some(s) = accept(listener.as_fd()).unwrap() {
                break s;
            }
        };
        std::fs::remove_file(&path).unwrap();
        assert_eq!(peer_pid(&server).unwrap() as u32, std::process::id());
        let mut buf = [0u8; 16];
        assert!(recv_with_fds(server.as_fd(), &mut buf, 2, true)
            .unwrap()
            .is_none());

        let efd = crate::eventfd::new().unwrap();
        send_with_fds(client.as_fd(), b"hello", &[efd.as_fd(), efd.as_fd()]).unwrap();
        let r = recv_with_fds(server.as_fd(), &mut buf, 2, false)
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..r.len], b"hello");
        assert!(!r.truncated && !r.fds_truncated && !r.closed);
        assert_eq!(r.fds.len(), 2);
        assert!(r.fds.iter().all(crate::eventfd::is_eventfd));

        // Too long for the buffer, more descriptors than room for.
        let efds = [efd.as_fd(), efd.as_fd(), efd.as_fd()];
        send_with_fds(client.as_fd(), &[7; 32], &efds).unwrap();
        let r = recv_with_fds(server.as_fd(), &mut buf, 1, false)
            .unwrap()
            .unwrap();
        assert_eq!(r.len, 16);
        assert!(r.truncated && r.fds_truncated, "{r:?}");
        assert_eq!(r.fds.len(), 1);

        // A child forked by another test of this binary holds a copy of
        // `client` until its exec: the hang-up comes when the last copy
        // closes, so it is waited for.
        drop(client);
        let r = loop {
            if let Some(r) = recv_with_fds(server.as_fd(), &mut buf, 1, false).unwrap() {
                break r;
            }
            let ready = crate::poll::poll_one(
                server.as_fd(),
                rustix::event::PollFlags::IN,
                Some(std::time::Duration::from_secs(10)),
            )
            .unwrap();
            assert!(!ready.is_empty(), "no hang-up within 10 s");
        };
        assert!(r.closed);
    }

    #[test]
    fn bad_paths_are_refused_before_any_call() {
        for p in ["", "/tmp/a\0b"] {
            let e = connect_seqpacket(Path::new(p)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{p:?}");
        }
        let long = format!("/tmp/{}", "x".repeat(200));
        let e = listen_seqpacket(Path::new(&long), 1).unwrap_err();
        assert!(e.to_string().contains("longer than 107 bytes"), "{e}");
    }
}
