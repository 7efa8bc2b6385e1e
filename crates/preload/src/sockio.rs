//! Reading and writing Ginza sockets (`socket.rs`): `read`, `write`,
//! their vector forms and the `recv*`/`send*` family, with `MSG_DONTWAIT`,
//! `MSG_PEEK`, `MSG_WAITALL` and `MSG_NOSIGNAL`. A call on any other
//! number is the kernel's (`blocking.rs`, which runs it on a pool thread
//! when it would block).
//!
//! As on Linux: a blocking stream write returns when everything is queued;
//! a non-blocking one queues what fits or fails with EAGAIN; EPIPE raises
//! SIGPIPE unless `MSG_NOSIGNAL` is given; a datagram longer than the
//! buffer is cut and `recvmsg` says `MSG_TRUNC`.

use std::net::SocketAddrV4;
use std::sync::atomic::Ordering::Relaxed;

use ginza_runtime::net::{TcpStream, UdpSocket};
use libc::{c_int, c_uint, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use crate::blocking;
use crate::gsock::{errno_of, GSock, Kind, Served};
use crate::mode::{serve, set_errno};
use crate::socket::{ours, read_v4, udp_of, write_v4};

#[derive(Clone, Copy, Default)]
struct Flags {
    dont_wait: bool,
    peek: bool,
    wait_all: bool,
    no_signal: bool,
}

impl Flags {
    fn of(flags: c_int) -> Flags {
        Flags {
            dont_wait: flags & libc::MSG_DONTWAIT != 0,
            peek: flags & libc::MSG_PEEK != 0,
            wait_all: flags & libc::MSG_WAITALL != 0,
            no_signal: flags & libc::MSG_NOSIGNAL != 0,
        }
    }
}

/// What one receive got: bytes, the datagram's source (none on a
/// stream), and whether the datagram was cut to fit the buffers.
#[derive(Debug, PartialEq)]
struct Received {
    len: usize,
    from: Option<SocketAddrV4>,
    cut: bool,
}

impl Received {
    /// `len` bytes of a stream (0: its end).
    fn stream(len: usize) -> Received {
        Received {
            len,
            from: None,
            cut: false,
        }
    }
}

/// The program's buffers, as slices.
///
/// # Safety
/// Each iovec names writable (or readable, for sending) memory of its
/// length, per the caller's contract.
unsafe fn slices<'a>(iov: *const iovec, n: usize) -> Vec<&'a mut [u8]> {
    if iov.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    let iov = unsafe { std::slice::from_raw_parts(iov, n) };
    iov.iter()
        .filter(|v| v.iov_len > 0 && !v.iov_base.is_null())
        // SAFETY: the caller's contract.
        .map(|v| unsafe { std::slice::from_raw_parts_mut(v.iov_base as *mut u8, v.iov_len) })
        .collect()
}

fn stream_recv(s: &GSock, t: &TcpStream, bufs: &mut [&mut [u8]], f: Flags) -> Result<usize, c_int> {
    let Some(first) = bufs.first_mut() else {
        return Ok(0);
    };
    let wait = !(f.dont_wait || s.is_nonblocking());
    if f.peek {
        let r = if wait {
            t.peek(first)
        } else {
            t.try_peek(first)
        };
        return r.map_err(|e| errno_of(&e));
    }
    let mut got = 0;
    for buf in bufs.iter_mut() {
        let mut at = 0;
        while at < buf.len() {
            // The first read may wait; later ones take what is there,
            // unless MSG_WAITALL asks for everything.
            let may_wait = wait && (got + at == 0 || f.wait_all);
            let r = if may_wait {
                std::io::Read::read(&mut &*t, &mut buf[at..])
            } else {
                t.try_read(&mut buf[at..])
            };
            match r {
                Ok(0) => return Ok(got + at),
                Ok(n) => at += n,
                // What was read now; the error (if it lasts) next time.
                Err(_) if got + at > 0 => return Ok(got + at),
                Err(e) => return Err(errno_of(&e)),
            }
        }
        got += at;
    }
    Ok(got)
}

fn stream_send(s: &GSock, t: &TcpStream, data: &[u8], f: Flags) -> Result<usize, c_int> {
    if s.is_nonblocking() || f.dont_wait {
        return t.try_write(data).map_err(|e| errno_of(&e));
    }
    let mut sent = 0;
    while sent < data.len() {
        match std::io::Write::write(&mut &*t, &data[sent..]) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(_) if sent > 0 => break,
            Err(e) => return Err(errno_of(&e)),
        }
    }
    Ok(sent)
}

fn dgram_recv(
    s: &GSock,
    u: &UdpSocket,
    bufs: &mut [&mut [u8]],
    f: Flags,
) -> Result<Received, c_int> {
    if f.peek {
        crate::say::unsupported_once!("recv", "MSG_PEEK on a Ginza datagram socket reads it");
    }
    let wait = !(f.dont_wait || s.is_nonblocking());
    let room: usize = bufs.iter().map(|b| b.len()).sum();
    let mut whole = vec![0u8; ginza_runtime::net::MAX_UDP_PAYLOAD.max(room)];
    let r = if wait {
        u.recv_from(&mut whole)
    } else {
        u.try_recv_from(&mut whole)
    };
    let (len, from) = r.map_err(|e| errno_of(&e))?;
    let mut at = 0;
    for b in bufs.iter_mut() {
        let n = b.len().min(len - at);
        b[..n].copy_from_slice(&whole[at..at + n]);
        at += n;
        if at == len {
            break;
        }
    }
    Ok(Received {
        len: at,
        from: Some(from),
        cut: len > at,
    })
}

fn dgram_send(
    s: &GSock,
    u: &UdpSocket,
    data: &[u8],
    to: Option<SocketAddrV4>,
    f: Flags,
) -> Result<usize, c_int> {
    let wait = !(f.dont_wait || s.is_nonblocking());
    let r = match to {
        Some(to) if wait => u.send_to(data, to),
        Some(to) => u.try_send_to(data, to),
        None => match u.peer_addr() {
            Ok(peer) if wait => u.send_to(data, peer),
            Ok(peer) => u.try_send_to(data, peer),
            Err(_) => return Err(libc::EDESTADDRREQ),
        },
    };
    r.map_err(|e| errno_of(&e))
}

/// Receives into `bufs` from a Ginza socket; the datagram's source, if any.
fn recv_on(s: &GSock, bufs: &mut [&mut [u8]], f: Flags) -> Result<Received, c_int> {
    let r = serve(|| recv_served(s, bufs, f));
    if r == Err(libc::ECONNRESET) && s.reset_reported.swap(true, Relaxed) {
        return Ok(Received::stream(0));
    }
    r
}

fn recv_served(s: &GSock, bufs: &mut [&mut [u8]], f: Flags) -> Result<Received, c_int> {
    match s.served() {
        Served::Stream(t) => stream_recv(s, &t, bufs, f).map(Received::stream),
        Served::Udp(u) => dgram_recv(s, &u, bufs, f),
        Served::Listener(_) => Err(libc::ENOTCONN),
        Served::None if s.kind == Kind::Datagram => {
            // Unbound: nothing can arrive; Linux waits forever or EAGAINs.
            Err(libc::EAGAIN)
        }
        Served::None => Err(libc::ENOTCONN),
    }
}

/// Sends `data` on a Ginza socket (to `to`, for a datagram socket).
fn send_on(s: &GSock, data: &[u8], to: Option<SocketAddrV4>, f: Flags) -> Result<usize, c_int> {
    let r = serve(|| match s.served() {
        Served::Stream(t) => stream_send(s, &t, data, f),
        Served::Udp(u) => dgram_send(s, &u, data, to, f),
        Served::None if s.kind == Kind::Datagram => match to {
            Some(_) => udp_of(s).and_then(|u| dgram_send(s, &u, data, to, f)),
            None => Err(libc::EDESTADDRREQ),
        },
        // Linux: a stream that is not connected gives EPIPE.
        Served::None | Served::Listener(_) => Err(libc::EPIPE),
    });
    if r == Err(libc::ECONNRESET) {
        s.reset_reported.store(true, Relaxed);
    }
    if r == Err(libc::EPIPE) && !f.no_signal {
        // SAFETY: raising a signal at the calling thread, as Linux does.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    r
}

fn c_len(r: Result<usize, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// The program's buffer of `n` bytes (C allows a null pointer for 0).
///
/// # Safety
/// `buf` names `n` writable bytes, or `n` is 0.
unsafe fn buffer<'a>(buf: *mut c_void, n: size_t) -> &'a mut [u8] {
    if buf.is_null() || n == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n) }
}

/// Gathers the buffers of a send into one (one segment or datagram).
fn gather(bufs: &[&mut [u8]]) -> Vec<u8> {
    let mut all = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
    for b in bufs {
        all.extend_from_slice(b);
    }
    all
}

// ---- the calls -----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call with the caller's arguments.
        return unsafe { blocking::read(fd, buf, n) };
    };
    // SAFETY: the caller's buffer of n bytes.
    let mut bufs = [unsafe { buffer(buf, n) }];
    c_len(recv_on(&s, &mut bufs, Flags::default()).map(|r| r.len))
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: as above.
        return unsafe { blocking::readv(fd, iov, n) };
    };
    // SAFETY: the caller's iovecs.
    let mut bufs = unsafe { slices(iov, n.max(0) as usize) };
    c_len(recv_on(&s, &mut bufs, Flags::default()).map(|r| r.len))
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the same call without a source address.
    unsafe {
        recvfrom(
            fd,
            buf,
            n,
            flags,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call with the caller's arguments.
        return unsafe { blocking::recvfrom(fd, buf, n, flags, addr, len) };
    };
    // SAFETY: the caller's buffer of n bytes.
    let mut bufs = [unsafe { buffer(buf, n) }];
    let r = recv_on(&s, &mut bufs, Flags::of(flags));
    if let Some(from) = r.as_ref().ok().and_then(|r| r.from) {
        // SAFETY: the caller's address buffer.
        unsafe { write_v4(from, addr, len) };
    }
    c_len(r.map(|r| r.len))
}

/// One `recvmsg` on a Ginza socket.
///
/// # Safety
/// `msg` is the caller's valid msghdr.
unsafe fn recvmsg_on(s: &GSock, msg: *mut msghdr, flags: c_int) -> Result<usize, c_int> {
    // SAFETY: the caller's contract.
    let m = unsafe { &mut *msg };
    // SAFETY: the caller's iovecs.
    let mut bufs = unsafe { slices(m.msg_iov, m.msg_iovlen) };
    let Received { len, from, cut } = recv_on(s, &mut bufs, Flags::of(flags))?;
    m.msg_controllen = 0;
    m.msg_flags = if cut { libc::MSG_TRUNC } else { 0 };
    match from {
        // SAFETY: the caller's name buffer.
        Some(from) => unsafe { write_v4(from, m.msg_name as *mut sockaddr, &mut m.msg_namelen) },
        None => m.msg_namelen = 0,
    }
    Ok(len)
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call with the caller's arguments.
        return unsafe { blocking::recvmsg(fd, msg, flags) };
    };
    // SAFETY: the caller's msghdr.
    c_len(unsafe { recvmsg_on(&s, msg, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    let Some(s) = ours(fd) else {
        let f = crate::mode::real!(recvmmsg: unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int, *mut libc::timespec) -> c_int);
        // SAFETY: glibc's call with the caller's arguments.
        return unsafe { f(fd, msgs, n, flags, timeout) };
    };
    if !timeout.is_null() {
        crate::say::unsupported_once!("recvmmsg", "the timeout is not applied on a Ginza socket");
    }
    let mut got = 0;
    while got < n as usize {
        // After the first message, take only what is there (as
        // MSG_WAITFORONE does; Linux's timeout is checked between messages).
        let f = if got == 0 {
            flags & !libc::MSG_WAITFORONE
        } else {
            flags | libc::MSG_DONTWAIT
        };
        // SAFETY: the caller's array of n messages.
        let m = unsafe { &mut *msgs.add(got) };
        // SAFETY: its msghdr.
        match unsafe { recvmsg_on(&s, &mut m.msg_hdr, f) } {
            Ok(len) => {
                m.msg_len = len as c_uint;
                got += 1;
            }
            Err(_) if got > 0 => break,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        }
    }
    got as c_int
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call with the caller's arguments.
        return unsafe { blocking::write(fd, buf, n) };
    };
    // SAFETY: the caller's buffer of n bytes.
    let data = unsafe { &*buffer(buf as *mut c_void, n) };
    c_len(send_on(&s, data, None, Flags::default()))
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: as above.
        return unsafe { blocking::writev(fd, iov, n) };
    };
    // SAFETY: the caller's iovecs (read only).
    let bufs = unsafe { slices(iov, n.max(0) as usize) };
    c_len(send_on(&s, &gather(&bufs), None, Flags::default()))
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the same call without a destination.
    unsafe { sendto(fd, buf, n, flags, std::ptr::null(), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call with the caller's arguments.
        return unsafe { blocking::sendto(fd, buf, n, flags, addr, len) };
    };
    // SAFETY: the caller's buffer and address.
    let (data, to) = unsafe { (&*buffer(buf as *mut c_void, n), read_v4(addr, len)) };
    c_len(send_on(&s, data, to, Flags::of(flags)))
}

/// One `sendmsg` on a Ginza socket.
///
/// # Safety
/// `msg` is the caller's valid msghdr.
unsafe fn sendmsg_on(s: &GSock, msg: *const msghdr, flags: c_int) -> Result<usize, c_int> {
    // SAFETY: the caller's contract.
    let m = unsafe { &*msg };
    // SAFETY: the caller's iovecs (read only) and name.
    let (bufs, to) = unsafe {
        (
            slices(m.msg_iov, m.msg_iovlen),
            read_v4(m.msg_name as *const sockaddr, m.msg_namelen),
        )
    };
    let f = Flags::of(flags);
    match bufs.as_slice() {
        [one] => send_on(s, one, to, f),
        many => send_on(s, &gather(many), to, f),
    }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call with the caller's arguments.
        return unsafe { blocking::sendmsg(fd, msg, flags) };
    };
    // SAFETY: the caller's msghdr.
    c_len(unsafe { sendmsg_on(&s, msg, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
) -> c_int {
    let Some(s) = ours(fd) else {
        let f = crate::mode::real!(sendmmsg: unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int) -> c_int);
        // SAFETY: glibc's call with the caller's arguments.
        return unsafe { f(fd, msgs, n, flags) };
    };
    let mut sent = 0;
    while sent < n as usize {
        // SAFETY: the caller's array of n messages.
        let m = unsafe { &mut *msgs.add(sent) };
        // SAFETY: its msghdr.
        match unsafe { sendmsg_on(&s, &m.msg_hdr, flags) } {
            Ok(len) => {
                m.msg_len = len as c_uint;
                sent += 1;
            }
            Err(_) if sent > 0 => break,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        }
    }
    sent as c_int
}
