//! AF_INET sockets on the program's Ginza address, served by the runtime's
//! stack (docs/preload.md, "Sockets"): the socket object ([`GSock`]) and
//! the calls that make, name, connect, configure and close one. Reading
//! and writing are `sockio.rs`; readiness `epoll.rs` and `pollset.rs`.
//!
//! * `socket(AF_INET, SOCK_STREAM | SOCK_DGRAM)` makes a kernel socket, as
//!   always; when the runtime has a network its number goes in the table
//!   as an undecided Ginza socket. The kernel socket stays the number's
//!   holder (never bound or connected), so numbers never collide and
//!   `fcntl`, `dup` and `close` act on a real descriptor.
//! * `bind` to the Ginza address or 0.0.0.0, `listen` without a bind, and
//!   `connect` or `sendto` to an address that is not loopback make it
//!   Ginza's; `bind` to another address or `connect` to loopback give it
//!   back to the kernel (forgotten, then the call is the kernel's).
//! * Options go to the kernel socket first, so Linux checks them and
//!   answers `getsockopt` with what the program set; those Ginza acts on
//!   (`TCP_NODELAY`, `SO_RCVTIMEO`, `SO_SNDTIMEO`) are applied too, and
//!   `SO_ERROR` and `SO_ACCEPTCONN` are the Ginza socket's.

use std::net::{Shutdown, SocketAddr, SocketAddrV4};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ginza_runtime::net::{KeepAlive, TcpListener, TcpStream, UdpSocket};
use libc::{c_int, c_void, sockaddr, socklen_t};

use crate::fdtable::{self, Entry};
use crate::gsock::{errno_of, established, lock, to_c, GSock, Kind, Served};
use crate::mode::{caller, real, serve, set_errno, Caller};

/// Where an address's traffic goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Ginza,
    Kernel,
}

fn local_route(ip: std::net::Ipv4Addr) -> Route {
    match crate::config::network() {
        Some(n) if ip.is_unspecified() || ip == n.ip => Route::Ginza,
        _ => Route::Kernel,
    }
}

fn remote_route(ip: std::net::Ipv4Addr) -> Route {
    if ip.is_loopback() || crate::config::network().is_some_and(|n| n.ip == ip) {
        Route::Kernel
    } else {
        Route::Ginza
    }
}

/// Reads a `sockaddr_in` the program passed; None if it is not one.
///
/// # Safety
/// `addr` points to `len` readable bytes (the caller's contract).
pub(crate) unsafe fn read_v4(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddrV4> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
        return None;
    }
    // SAFETY: at least a sockaddr_in's bytes, per the caller's contract.
    let sin = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in) };
    (c_int::from(sin.sin_family) == libc::AF_INET).then(|| {
        SocketAddrV4::new(
            std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            u16::from_be(sin.sin_port),
        )
    })
}

/// Writes `a` to a `sockaddr` buffer of `*len` bytes, truncating as Linux
/// does, and sets `*len` to the full size. Null pointers write nothing.
///
/// # Safety
/// `addr` has `*len` writable bytes, `len` is writable (or both null).
pub(crate) unsafe fn write_v4(a: SocketAddrV4, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let full = std::mem::size_of::<libc::sockaddr_in>();
    // SAFETY: the caller's contract.
    let room = unsafe { *len } as usize;
    // SAFETY: copying at most `room` bytes into the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &sin as *const libc::sockaddr_in as *const u8,
            addr as *mut u8,
            room.min(full),
        );
        *len = full as socklen_t;
    }
}

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, a.port()),
    }
}

/// The number's socket when the caller is a program thread (the runtime's
/// own calls are never on a Ginza number).
pub(crate) fn ours(fd: c_int) -> Option<Arc<GSock>> {
    if caller() == Caller::Runtime {
        return None;
    }
    fdtable::socket(fd)
}

// ---- making and closing ---------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let f = real!(socket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int);
    // SAFETY: glibc's call with the caller's arguments.
    let fd = unsafe { f(domain, ty, protocol) };
    if fd < 0
        || domain != libc::AF_INET
        || caller() == Caller::Runtime
        || !crate::running::running()
    {
        return fd;
    }
    let Some(net) = crate::config::network() else {
        return fd;
    };
    let kind = match (ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC), protocol) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => Kind::Stream,
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) if net.udp => Kind::Datagram,
        _ => return fd,
    };
    let sock = GSock::new(kind, ty & libc::SOCK_NONBLOCK != 0, Served::None);
    drop(fdtable::insert(fd, Entry::Socket(sock)));
    fd
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let f = real!(close: unsafe extern "C" fn(c_int) -> c_int);
    // Dropped after the lookup's lock: a socket's last number closes it.
    let old = fdtable::remove(fd);
    // SAFETY: glibc's call.
    let r = unsafe { f(fd) };
    if old.is_some() {
        // Closing a connection may send segments: runtime code.
        serve(|| drop(old));
    }
    r
}

/// After a successful `dup` of `old` to `new`: `new` names what `old`
/// names (and no longer what it named before).
fn duplicated(old: c_int, new: c_int) {
    if new < 0 || old == new {
        return;
    }
    let before = match fdtable::get(old) {
        Some(Entry::Socket(s)) => fdtable::insert(new, Entry::Socket(s)),
        // An epoll number's copy is a plain kernel epoll number: forgetting
        // it keeps the copy the kernel's.
        _ => fdtable::remove(new),
    };
    serve(|| drop(before));
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let f = real!(dup: unsafe extern "C" fn(c_int) -> c_int);
    // SAFETY: glibc's call.
    let new = unsafe { f(fd) };
    duplicated(fd, new);
    new
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    let f = real!(dup2: unsafe extern "C" fn(c_int, c_int) -> c_int);
    // SAFETY: glibc's call.
    let new = unsafe { f(fd, to) };
    duplicated(fd, new);
    new
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    let f = real!(dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int);
    // SAFETY: glibc's call.
    let new = unsafe { f(fd, to, flags) };
    duplicated(fd, new);
    new
}

/// `fcntl`: always the kernel's on the number; for a Ginza socket
/// `F_SETFL` also sets its `O_NONBLOCK`, and `F_DUPFD*` shares it.
/// The third argument travels as an integer (x86-64 passes `int` and
/// pointers in the same register), so one definition serves every command.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    let f = real!(fcntl: unsafe extern "C" fn(c_int, c_int, usize) -> c_int);
    // SAFETY: glibc's call with the caller's arguments.
    let r = unsafe { f(fd, cmd, arg) };
    if r >= 0 {
        match cmd {
            libc::F_SETFL => {
                if let Some(s) = fdtable::socket(fd) {
                    s.nonblocking
                        .store(arg as c_int & libc::O_NONBLOCK != 0, Relaxed);
                }
            }
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => duplicated(fd, r),
            _ => {}
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the same call.
    unsafe { fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, arg: *mut c_void) -> c_int {
    let f = real!(ioctl: unsafe extern "C" fn(c_int, libc::c_ulong, *mut c_void) -> c_int);
    let Some(s) = ours(fd) else {
        // SAFETY: glibc's call with the caller's arguments.
        return unsafe { f(fd, request, arg) };
    };
    if request == libc::FIONREAD as libc::c_ulong && !arg.is_null() {
        let n = serve(|| match s.served() {
            Served::Stream(t) => Ok(t.bytes_readable()),
            Served::Udp(u) => Ok(u.bytes_readable()),
            Served::Listener(_) | Served::None => Err(libc::EINVAL),
        });
        return to_c(n.map(|n| {
            // SAFETY: FIONREAD's argument is an int the caller gave.
            unsafe { *(arg as *mut c_int) = n.min(c_int::MAX as usize) as c_int };
            0
        }));
    }
    // SAFETY: glibc's call on the number's kernel socket.
    let r = unsafe { f(fd, request, arg) };
    if r == 0 && request == libc::FIONBIO as libc::c_ulong && !arg.is_null() {
        // SAFETY: FIONBIO's argument is an int the caller gave.
        s.nonblocking
            .store(unsafe { *(arg as *const c_int) } != 0, Relaxed);
    }
    r
}

// ---- naming and connecting -----------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let f = real!(bind: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int);
    let Some(s) = ours(fd) else {
        // SAFETY: glibc's call with the caller's arguments.
        return unsafe { f(fd, addr, len) };
    };
    // SAFETY: the caller's address and length.
    let a = unsafe { read_v4(addr, len) };
    let Some(a) = a.filter(|a| local_route(*a.ip()) == Route::Ginza) else {
        // Another address (or not an IPv4 one): the kernel's socket.
        drop(fdtable::remove(fd));
        // SAFETY: as above.
        return unsafe { f(fd, addr, len) };
    };
    to_c(serve(|| bind_ginza(&s, a)).map(|()| 0))
}

fn bind_ginza(s: &GSock, a: SocketAddrV4) -> Result<(), c_int> {
    let mut st = lock(&s.state);
    if st.bound.is_some() || !matches!(st.served, Served::None) {
        return Err(libc::EINVAL);
    }
    if s.kind == Kind::Datagram {
        let u = UdpSocket::bind(a).map_err(|e| errno_of(&e))?;
        let bound = u.local_addr().map_err(|e| errno_of(&e))?;
        st.bound = Some(bound);
        drop(st);
        s.attach(Served::Udp(Arc::new(u)));
        return Ok(());
    }
    // Linux's default listen backlog limit (somaxconn); `listen`'s own
    // backlog cannot change it afterwards.
    const BACKLOG: usize = 4096;
    let l = TcpListener::bind_with_backlog(a, BACKLOG).map_err(|e| errno_of(&e))?;
    let port = l.local_addr().map_err(|e| errno_of(&e))?.port();
    st.bound = Some(SocketAddrV4::new(*a.ip(), port));
    st.reserved = Some(l);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    let f = real!(listen: unsafe extern "C" fn(c_int, c_int) -> c_int);
    let Some(s) = ours(fd) else {
        // SAFETY: glibc's call.
        return unsafe { f(fd, backlog) };
    };
    to_c(serve(|| listen_ginza(&s, backlog)).map(|()| 0))
}

fn listen_ginza(s: &GSock, backlog: c_int) -> Result<(), c_int> {
    if s.kind != Kind::Stream {
        return Err(libc::EOPNOTSUPP);
    }
    let reserved = {
        let mut st = lock(&s.state);
        match st.served {
            // listen again: Linux changes the backlog; ours stays.
            Served::Listener(_) => return Ok(()),
            Served::None => {}
            _ => return Err(libc::EINVAL),
        }
        st.reserved.take()
    };
    let l = match reserved {
        Some(l) => l,
        // listen without bind: an ephemeral port on every address.
        None => {
            let any = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
            let backlog = usize::try_from(backlog).unwrap_or(0).max(1);
            let l = TcpListener::bind_with_backlog(any, backlog).map_err(|e| errno_of(&e))?;
            lock(&s.state).bound = l.local_addr().ok().map(v4);
            l
        }
    };
    if s.is_nonblocking() {
        let _ = l.set_nonblocking(true);
    }
    s.attach(Served::Listener(Arc::new(l)));
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the same call with no flags.
    unsafe { accept4(fd, addr, len, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call (on the blocking pool if it waits).
        return unsafe { crate::blocking::accept4(fd, addr, len, flags) };
    };
    let Served::Listener(l) = s.served() else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let accepted = serve(|| {
        if s.is_nonblocking() {
            l.try_accept()
        } else {
            l.accept()
        }
    });
    let (stream, peer) = match accepted {
        Ok(a) => a,
        Err(e) => {
            set_errno(errno_of(&e));
            return -1;
        }
    };
    let f = real!(socket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int);
    let holder_flags = flags & (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    // SAFETY: a fresh kernel socket to hold the new connection's number.
    let new = unsafe { f(libc::AF_INET, libc::SOCK_STREAM | holder_flags, 0) };
    if new < 0 {
        // The connection closes (RST or FIN) as `stream` drops; errno is
        // the kernel's (EMFILE, ENFILE, ENOMEM), as Linux would give.
        serve(|| drop(stream));
        return -1;
    }
    let sock = GSock::new(Kind::Stream, flags & libc::SOCK_NONBLOCK != 0, Served::None);
    serve(|| {
        apply_stream_options(&sock, &stream);
        lock(&sock.state).served = Served::Stream(Arc::new(stream));
        drop(fdtable::insert(new, Entry::Socket(sock)));
    });
    // SAFETY: the caller's buffer and length.
    unsafe { write_v4(v4(peer), addr, len) };
    new
}

fn apply_stream_options(s: &GSock, stream: &TcpStream) {
    let st = lock(&s.state);
    if let Some(n) = st.nodelay {
        let _ = stream.set_nodelay(n);
    }
    let _ = stream.set_read_timeout(st.read_timeout);
    let _ = stream.set_write_timeout(st.write_timeout);
    if let Some(k) = st.keepalive {
        // The protected netstack has no socket options: Linux's answer
        // stays on the kernel socket, the connection goes without.
        let _ = stream.set_keepalive(k);
    }
    // O_NONBLOCK stays the description's alone: each call picks the
    // waiting or the non-waiting runtime call by it (`sockio.rs`), so a
    // socket made blocking again by `fcntl` waits.
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = ours(fd) else {
        // SAFETY: the kernel's call (on the blocking pool if it waits).
        return unsafe { crate::blocking::connect(fd, addr, len) };
    };
    // SAFETY: the caller's address and length.
    let Some(to) = (unsafe { read_v4(addr, len) }) else {
        // Not IPv4 (AF_UNSPEC dissolving a UDP association, say): the
        // kernel's answer on the holder.
        // SAFETY: as above.
        return unsafe { crate::blocking::connect(fd, addr, len) };
    };
    if remote_route(*to.ip()) == Route::Kernel {
        let fresh = {
            let st = lock(&s.state);
            st.bound.is_none() && matches!(st.served, Served::None)
        };
        if !fresh {
            set_errno(libc::ENETUNREACH);
            return -1;
        }
        drop(fdtable::remove(fd));
        // SAFETY: as above.
        return unsafe { crate::blocking::connect(fd, addr, len) };
    }
    to_c(serve(|| match s.kind {
        Kind::Stream => connect_stream(&s, to),
        Kind::Datagram => connect_udp(&s, to),
    }))
}

fn connect_stream(s: &GSock, to: SocketAddrV4) -> Result<c_int, c_int> {
    match s.served() {
        Served::Stream(t) => {
            return Err(if s.connecting() && !established(&t) {
                libc::EALREADY
            } else {
                libc::EISCONN
            })
        }
        Served::Listener(_) => return Err(libc::EINVAL),
        _ => {}
    }
    // A port `bind` reserved (as a listener, so no other socket takes it)
    // is the connection's: the reservation goes just before it is used.
    let port = {
        let mut st = lock(&s.state);
        st.reserved
            .take()
            .and_then(|l| l.local_addr().ok())
            .map_or(0, |a| a.port())
    };
    let connected = if s.is_nonblocking() {
        TcpStream::connect_nonblocking_from(port, to)
    } else {
        TcpStream::connect_from(port, to, None)
    };
    let t = match connected {
        // The protected netstack picks its ports.
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported && port != 0 => {
            crate::say::unsupported_once!(
                "connect",
                "a bound local port is not kept through the protected netstack: the connection takes an ephemeral one"
            );
            if s.is_nonblocking() {
                TcpStream::connect_nonblocking(to)
            } else {
                TcpStream::connect(to)
            }
        }
        other => other,
    }
    .map_err(|e| errno_of(&e))?;
    if s.is_nonblocking() {
        apply_stream_options(s, &t);
        lock(&s.state).connecting = true;
        s.attach(Served::Stream(Arc::new(t)));
        return Err(libc::EINPROGRESS);
    }
    apply_stream_options(s, &t);
    s.attach(Served::Stream(Arc::new(t)));
    Ok(0)
}

/// The datagram socket, bound to an ephemeral port first if need be.
pub(crate) fn udp_of(s: &GSock) -> Result<Arc<UdpSocket>, c_int> {
    if let Served::Udp(u) = s.served() {
        return Ok(u);
    }
    let ip = crate::config::network().map_or(std::net::Ipv4Addr::UNSPECIFIED, |n| n.ip);
    let u = Arc::new(UdpSocket::bind(SocketAddrV4::new(ip, 0)).map_err(|e| errno_of(&e))?);
    if s.is_nonblocking() {
        let _ = u.set_nonblocking(true);
    }
    lock(&s.state).bound = u.local_addr().ok();
    s.attach(Served::Udp(Arc::clone(&u)));
    Ok(u)
}

fn connect_udp(s: &GSock, to: SocketAddrV4) -> Result<c_int, c_int> {
    let u = udp_of(s)?;
    u.connect(to).map_err(|e| errno_of(&e))?;
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    let f = real!(shutdown: unsafe extern "C" fn(c_int, c_int) -> c_int);
    let Some(s) = ours(fd) else {
        // SAFETY: glibc's call.
        return unsafe { f(fd, how) };
    };
    let how = match how {
        libc::SHUT_RD => Shutdown::Read,
        libc::SHUT_WR => Shutdown::Write,
        libc::SHUT_RDWR => Shutdown::Both,
        _ => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    to_c(serve(|| match s.served() {
        Served::Stream(t) => t.shutdown(how).map(|()| 0).map_err(|e| errno_of(&e)),
        _ => Err(libc::ENOTCONN),
    }))
}

#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let f = real!(getsockname: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int);
    let Some(s) = ours(fd) else {
        // SAFETY: glibc's call.
        return unsafe { f(fd, addr, len) };
    };
    let a = serve(|| {
        let st = lock(&s.state);
        let unbound = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
        match &st.served {
            // Linux answers with the address as bound (0.0.0.0 stays so).
            Served::Listener(l) => {
                let port = l.local_addr().map_or(0, |a| a.port());
                SocketAddrV4::new(*st.bound.unwrap_or(unbound).ip(), port)
            }
            Served::Stream(t) => t.local_addr().map_or(unbound, v4),
            Served::Udp(u) => u.local_addr().unwrap_or(unbound),
            Served::None => st.bound.unwrap_or(unbound),
        }
    });
    // SAFETY: the caller's buffer and length.
    unsafe { write_v4(a, addr, len) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let f = real!(getpeername: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int);
    let Some(s) = ours(fd) else {
        // SAFETY: glibc's call.
        return unsafe { f(fd, addr, len) };
    };
    let peer = serve(|| match s.served() {
        Served::Stream(t) if established(&t) => t.peer_addr().map(v4).map_err(|e| errno_of(&e)),
        Served::Udp(u) => u.peer_addr().map_err(|_| libc::ENOTCONN),
        _ => Err(libc::ENOTCONN),
    });
    to_c(peer.map(|p| {
        // SAFETY: the caller's buffer and length.
        unsafe { write_v4(p, addr, len) };
        0
    }))
}

// ---- options ----------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const c_void,
    len: socklen_t,
) -> c_int {
    let f = real!(setsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int);
    // Linux checks and keeps the option on the number's kernel socket.
    // SAFETY: glibc's call with the caller's arguments.
    let r = unsafe { f(fd, level, name, value, len) };
    if r != 0 {
        return r;
    }
    let Some(s) = ours(fd) else {
        return r;
    };
    // SAFETY: the kernel accepted `len` bytes at `value` for this option.
    let int = || unsafe { std::ptr::read_unaligned(value as *const c_int) };
    // SAFETY: as above; SO_RCVTIMEO/SO_SNDTIMEO take a timeval.
    let timeval = || unsafe { std::ptr::read_unaligned(value as *const libc::timeval) };
    let timeout = |t: libc::timeval| {
        let d = Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000);
        (!d.is_zero()).then_some(d)
    };
    serve(|| {
        let mut st = lock(&s.state);
        match (level, name) {
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.nodelay = Some(int() != 0),
            (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => st.read_timeout = timeout(timeval()),
            (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => st.write_timeout = timeout(timeval()),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE)
            | (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE | libc::TCP_KEEPINTVL | libc::TCP_KEEPCNT) => {
                st.keepalive = Some(keepalive_of(fd))
            }
            _ => return,
        }
        if let Served::Stream(t) = st.served.clone() {
            drop(st);
            apply_stream_options(&s, &t);
        }
    });
    0
}

/// The keep-alive the kernel socket holding `fd` was given (Linux keeps
/// and checks the options; its defaults are 7,200 s, 75 s and 9 probes).
fn keepalive_of(fd: c_int) -> Option<KeepAlive> {
    let f = real!(getsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int);
    let get = |level, name| {
        let mut v: c_int = 0;
        let mut len = std::mem::size_of::<c_int>() as socklen_t;
        // SAFETY: an int-sized option into a local.
        let r = unsafe { f(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
        (r == 0).then_some(v)
    };
    if get(libc::SOL_SOCKET, libc::SO_KEEPALIVE)? == 0 {
        return None;
    }
    let secs = |v: c_int| Duration::from_secs(v.max(1) as u64);
    Some(KeepAlive {
        idle: secs(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)?),
        interval: secs(get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)?),
        count: get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT)?.max(1) as u32,
    })
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let f = real!(getsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int);
    let ginza = match ours(fd) {
        Some(s) if level == libc::SOL_SOCKET => match name {
            libc::SO_ERROR => Some(serve(|| s.take_error())),
            libc::SO_ACCEPTCONN => Some(c_int::from(matches!(s.served(), Served::Listener(_)))),
            _ => None,
        },
        _ => None,
    };
    let Some(v) = ginza else {
        // SAFETY: glibc's call: Linux's answer, from the kernel socket.
        return unsafe { f(fd, level, name, value, len) };
    };
    // SAFETY: the caller's buffer of *len bytes; an int fits or is cut.
    unsafe {
        if value.is_null() || len.is_null() {
            set_errno(libc::EFAULT);
            return -1;
        }
        let room = (*len as usize).min(std::mem::size_of::<c_int>());
        std::ptr::copy_nonoverlapping(&v as *const c_int as *const u8, value as *mut u8, room);
        *len = room as socklen_t;
    }
    0
}
