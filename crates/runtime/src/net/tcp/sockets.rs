//! `TcpListener` and `TcpStream`, shaped like `std::net`'s, over one of two
//! backends chosen by the runtime's configuration, not by the application's
//! code (docs/design.md, "The runtime": the same socket API has two
//! backends): the in-process stack (run to completion, `listener.rs`,
//! `stream.rs`) or the protected netstack process
//! (`Config::protected`, `net/protected/`). The choice is one `match` per
//! call; the in-process arm calls straight into the stack as before.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use super::super::poller::sealed::{Hook, Sealed};
use super::super::poller::PollSource;
use super::super::readiness::Readiness;
use super::super::wait::{no_runtime, os_error};
use super::listener::InProcessListener;
use super::stream::{self, InProcessStream};
use super::{first_v4, no_net};
use crate::net::protected::{self, ProtectedListener, ProtectedStream};
use crate::sched::{self, Shared};

enum ListenerBackend {
    InProcess(InProcessListener),
    Protected(ProtectedListener),
}

/// A TCP socket listening for connections. Blocking calls suspend the
/// uthread. `Sync`: accept from several uthreads through an `Arc`.
pub struct TcpListener {
    backend: ListenerBackend,
}

impl fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.backend {
            ListenerBackend::InProcess(l) => l.fmt(f),
            ListenerBackend::Protected(l) => l.fmt(f),
        }
    }
}

/// The calling uthread's runtime, for `what`.
fn runtime(what: &str) -> io::Result<Arc<Shared>> {
    sched::current_shared().ok_or_else(|| no_runtime(what))
}

impl TcpListener {
    /// Listens on `addr`: the application's IP or 0.0.0.0, and a port (0
    /// picks a free one in 49152-65535). `AddrInUse` if a listener has the
    /// port already. In-process, the half-open set and the accept backlog
    /// are bounded by `NetConfig::tcp_listen`; protected, by the netstack.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<TcpListener> {
        Self::listen(first_v4(addr)?, None)
    }

    /// [`bind`](Self::bind) with `listen`'s backlog: the accept backlog's
    /// bound, clamped to 1..=the configured one (`NetConfig::tcp_listen`
    /// in-process, the netstack's 1024 protected).
    pub fn bind_with_backlog(addr: impl ToSocketAddrs, backlog: usize) -> io::Result<TcpListener> {
        Self::listen(first_v4(addr)?, Some(backlog))
    }

    fn listen(addr: SocketAddrV4, backlog: Option<usize>) -> io::Result<TcpListener> {
        let rt = runtime("TcpListener::bind")?;
        let backend = if crate::net::tcp_of(&rt).is_some() {
            ListenerBackend::InProcess(InProcessListener::bind(rt, addr, backlog)?)
        } else if protected::of(&rt).is_some() {
            ListenerBackend::Protected(ProtectedListener::bind(rt, addr, backlog)?)
        } else {
            return Err(no_net());
        };
        Ok(TcpListener { backend })
    }

    /// In non-blocking mode `accept` gives `EAGAIN`
    /// (`ErrorKind::WouldBlock`) when no connection waits.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match &self.backend {
            ListenerBackend::InProcess(l) => l.set_nonblocking(on),
            ListenerBackend::Protected(l) => l.set_nonblocking(on),
        }
        Ok(())
    }

    /// `accept` that never waits: `EAGAIN` when no connection waits.
    pub fn try_accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        match &self.backend {
            ListenerBackend::InProcess(l) => {
                let (s, a) = l.try_accept()?;
                Ok((TcpStream::in_process(s), a))
            }
            ListenerBackend::Protected(l) => {
                let (s, a) = l.try_accept()?;
                Ok((TcpStream::protected(s), a))
            }
        }
    }

    /// What the listener is ready for now: readable while a connection
    /// waits to be accepted.
    pub fn readiness(&self) -> Readiness {
        PollSource::readiness(self)
    }

    /// The address bound (the IP given to `bind`, which may be 0.0.0.0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.backend {
            ListenerBackend::InProcess(l) => l.local_addr(),
            ListenerBackend::Protected(l) => l.local_addr(),
        }
    }

    /// Waits for a connection whose handshake has completed.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        match &self.backend {
            ListenerBackend::InProcess(l) => {
                let (s, a) = l.accept()?;
                Ok((TcpStream::in_process(s), a))
            }
            ListenerBackend::Protected(l) => {
                let (s, a) = l.accept()?;
                Ok((TcpStream::protected(s), a))
            }
        }
    }

    /// An endless iterator over `accept`'s connections.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// Whether this listener runs over the protected netstack.
    pub fn is_protected(&self) -> bool {
        matches!(self.backend, ListenerBackend::Protected(_))
    }
}

/// [`TcpListener::incoming`]'s iterator.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a TcpListener,
}

impl Sealed for TcpListener {
    fn poll_hook(&self) -> Hook {
        Hook(match &self.backend {
            ListenerBackend::InProcess(l) => l.watched(),
            ListenerBackend::Protected(l) => l.watched(),
        })
    }
}

impl PollSource for TcpListener {}

impl Iterator for Incoming<'_> {
    type Item = io::Result<TcpStream>;

    fn next(&mut self) -> Option<io::Result<TcpStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

enum StreamBackend {
    InProcess(InProcessStream),
    Protected(ProtectedStream),
}

/// A TCP connection. Blocking calls suspend the uthread (its kthread runs
/// other work meanwhile). `Sync`; [`try_clone`](Self::try_clone) gives
/// another handle, so one uthread can read while another writes. Dropping
/// the last handle closes the connection.
pub struct TcpStream {
    backend: StreamBackend,
}

impl fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.backend {
            StreamBackend::InProcess(s) => s.fmt(f),
            StreamBackend::Protected(s) => s.fmt(f),
        }
    }
}

/// Forwards a call to whichever backend the stream has.
macro_rules! either {
    ($self:expr, $s:ident => $e:expr) => {
        match &$self.backend {
            StreamBackend::InProcess($s) => $e,
            StreamBackend::Protected($s) => $e,
        }
    };
}

impl TcpStream {
    fn in_process(s: InProcessStream) -> TcpStream {
        TcpStream {
            backend: StreamBackend::InProcess(s),
        }
    }

    pub(crate) fn protected(s: ProtectedStream) -> TcpStream {
        TcpStream {
            backend: StreamBackend::Protected(s),
        }
    }

    /// Connects to `addr` (the first IPv4 address it names) from an
    /// ephemeral port: `ConnectionRefused` if the peer resets our SYN,
    /// `TimedOut` if the SYN's retransmissions give up.
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<TcpStream> {
        connect(first_v4(addr)?, 0, None)
    }

    /// [`connect`](Self::connect) from `local_port` of the application's
    /// address (0: an ephemeral one), giving up after `timeout` if any:
    /// what a C program's `bind` then `connect` asks. `AddrNotAvailable`
    /// if that port already has a connection to `addr`. The protected
    /// netstack chooses its own ports: a nonzero one there is
    /// `Unsupported`.
    pub fn connect_from(
        local_port: u16,
        addr: SocketAddrV4,
        timeout: Option<Duration>,
    ) -> io::Result<TcpStream> {
        if timeout.is_some_and(|t| t.is_zero()) {
            return Err(os_error(
                libc::EINVAL,
                format_args!("cannot set a 0 duration timeout"),
            ));
        }
        connect(addr, local_port, timeout)
    }

    /// [`connect`](Self::connect), giving up after `timeout` (`TimedOut`).
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        if timeout.is_zero() {
            return Err(os_error(
                libc::EINVAL,
                format_args!("cannot set a 0 duration timeout"),
            ));
        }
        connect(first_v4(*addr)?, 0, Some(timeout))
    }

    /// Sends the SYN and returns at once (a non-blocking `connect`'s
    /// `EINPROGRESS`): the stream becomes writable when the handshake
    /// finishes or fails, and [`take_error`](Self::take_error) then says
    /// how it failed. Reads and writes before it is established wait, or
    /// give `EAGAIN` in non-blocking mode. In-process, a peer whose MAC
    /// ARP does not know yet is asked for first (that is waited for).
    pub fn connect_nonblocking(addr: SocketAddrV4) -> io::Result<TcpStream> {
        Self::connect_nonblocking_from(0, addr)
    }

    /// [`connect_nonblocking`](Self::connect_nonblocking) from
    /// `local_port` of the application's address (0: an ephemeral one),
    /// as a C program's `bind` then `connect` asks: `AddrNotAvailable` if
    /// that port already has a connection to `addr`. The protected
    /// netstack chooses its own ports: a nonzero one there is
    /// `Unsupported`.
    pub fn connect_nonblocking_from(local_port: u16, addr: SocketAddrV4) -> io::Result<TcpStream> {
        check_connect_addr(addr)?;
        let rt = runtime("TcpStream::connect_nonblocking")?;
        let backend = if crate::net::tcp_of(&rt).is_some() {
            StreamBackend::InProcess(stream::connect_nonblocking(rt, addr, local_port)?)
        } else if protected::of(&rt).is_some() {
            no_port_choice(local_port)?;
            StreamBackend::Protected(ProtectedStream::connect_nonblocking(rt, addr)?)
        } else {
            return Err(no_net());
        };
        Ok(TcpStream { backend })
    }

    /// In non-blocking mode reads and writes give `EAGAIN`
    /// (`ErrorKind::WouldBlock`) rather than wait.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        either!(self, s => s.set_nonblocking(on));
        Ok(())
    }

    /// A read that never waits (`MSG_DONTWAIT`): `EAGAIN` when nothing has
    /// arrived.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.try_read(buf))
    }

    /// A write that never waits: `EAGAIN` when the send buffer is full.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        either!(self, s => s.try_write(buf))
    }

    /// Reads without consuming (`MSG_PEEK`), waiting as `read` does.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.peek(buf))
    }

    /// [`peek`](Self::peek) that never waits.
    pub fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.try_peek(buf))
    }

    /// Bytes a read would give now (`FIONREAD`).
    pub fn bytes_readable(&self) -> usize {
        either!(self, s => s.bytes_readable())
    }

    /// The error that ended the connection (`ECONNREFUSED`, `ECONNRESET`,
    /// `ETIMEDOUT`), given once and then cleared, as `SO_ERROR` does.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        either!(self, s => s.take_error())
    }

    /// What the stream is ready for now.
    pub fn readiness(&self) -> Readiness {
        PollSource::readiness(self)
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        either!(self, s => s.peer_addr())
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        either!(self, s => s.local_addr())
    }

    /// Another handle to the same connection (sharing its timeouts).
    pub fn try_clone(&self) -> io::Result<TcpStream> {
        let backend = match &self.backend {
            StreamBackend::InProcess(s) => StreamBackend::InProcess(s.try_clone()?),
            StreamBackend::Protected(s) => StreamBackend::Protected(s.try_clone()),
        };
        Ok(TcpStream { backend })
    }

    /// `Write`: FIN after the data queued (reading goes on); `Read`: reads
    /// return 0 from now on; `Both`: both.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        either!(self, s => s.shutdown(how))
    }

    /// `TCP_NODELAY`: segments go out at once rather than waiting to fill
    /// one (on by default; the protected netstack always sends at once).
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        either!(self, s => s.set_nodelay(nodelay))
    }

    pub fn nodelay(&self) -> io::Result<bool> {
        either!(self, s => s.nodelay())
    }

    /// `read` gives up after `timeout` with `WouldBlock` (as std does on
    /// Linux). `None`: wait forever; a zero duration is an error.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        either!(self, s => s.set_read_timeout(timeout))
    }

    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        either!(self, s => s.read_timeout())
    }

    /// `write` gives up after `timeout` with `WouldBlock` when the send
    /// buffer stays full.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        either!(self, s => s.set_write_timeout(timeout))
    }

    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        either!(self, s => s.write_timeout())
    }

    /// The protected backend of this stream (its zero-copy read), if the
    /// runtime runs protected.
    pub fn as_protected(&self) -> Option<&ProtectedStream> {
        match &self.backend {
            StreamBackend::Protected(s) => Some(s),
            StreamBackend::InProcess(_) => None,
        }
    }

    #[inline]
    fn read_bytes(&self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.read_bytes(buf))
    }

    #[inline]
    fn write_bytes(&self, buf: &[u8]) -> io::Result<usize> {
        either!(self, s => s.write_bytes(buf))
    }
}

fn check_connect_addr(addr: SocketAddrV4) -> io::Result<()> {
    if addr.port() == 0 || addr.ip().is_unspecified() || addr.ip().is_broadcast() {
        return Err(os_error(
            libc::EINVAL,
            format_args!("cannot connect TCP to {addr}"),
        ));
    }
    Ok(())
}

/// The protected netstack's `connect` command names no local port.
fn no_port_choice(local_port: u16) -> io::Result<()> {
    if local_port == 0 {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "the protected netstack chooses the local port: cannot connect from port {local_port}"
        ),
    ))
}

fn connect(
    addr: SocketAddrV4,
    local_port: u16,
    timeout: Option<Duration>,
) -> io::Result<TcpStream> {
    check_connect_addr(addr)?;
    let rt = runtime("TcpStream::connect")?;
    let backend = if crate::net::tcp_of(&rt).is_some() {
        StreamBackend::InProcess(stream::connect(rt, addr, local_port, timeout)?)
    } else if protected::of(&rt).is_some() {
        no_port_choice(local_port)?;
        StreamBackend::Protected(ProtectedStream::connect(rt, addr, timeout)?)
    } else {
        return Err(no_net());
    };
    Ok(TcpStream { backend })
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_bytes(buf)
    }
}

impl Read for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_bytes(buf)
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_bytes(buf)
    }

    /// Segments leave at each `write` (or as the window allows): nothing to
    /// flush.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_bytes(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sealed for TcpStream {
    fn poll_hook(&self) -> Hook {
        Hook(either!(self, s => s.watched()))
    }
}

impl PollSource for TcpStream {}

/// Keep-alive settings for [`TcpStream::set_keepalive`]: Linux's
/// `SO_KEEPALIVE` with `TCP_KEEPIDLE`, `TCP_KEEPINTVL` and `TCP_KEEPCNT`.
pub use ginza_net::tcp::KeepAlive;

impl TcpStream {
    /// Keep-alive: after `idle` with nothing heard from the peer, a probe
    /// every `interval`; after `count` unanswered probes the connection
    /// ends and reads and writes fail with `TimedOut`. `None` turns it off
    /// (the default, as on Linux). Zero durations or a zero count are
    /// refused (`InvalidInput`). The protected netstack's command set has
    /// no socket options: there it is `Unsupported`.
    pub fn set_keepalive(&self, keepalive: Option<KeepAlive>) -> io::Result<()> {
        if let Some(k) = keepalive {
            if k.idle.is_zero() || k.interval.is_zero() || k.count == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "keep-alive needs a nonzero idle time, interval and probe count: {k:?}"
                    ),
                ));
            }
        }
        match &self.backend {
            StreamBackend::InProcess(s) => {
                s.set_keepalive(keepalive);
                Ok(())
            }
            StreamBackend::Protected(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "keep-alive is not available through the protected netstack (its command set has no socket options)",
            )),
        }
    }
}
