//! The in-process backend of `TcpStream`: one connection of the calling
//! uthread's runtime's own stack.

use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ginza_net::tcp::{Connection, FourTuple, State, TcpError};
use ginza_net::{Endpoint, MacAddr};

use super::super::readiness::{Readiness, SocketWaiters, Watched};
use super::super::wait::{os_error, timeout_ns, timeout_of, wake_all, would_block, Wait};
use super::{io_error, pending_error, Conn, ConnInner, Tcp};
use crate::sched::Shared;
use crate::spinlock::SpinLock;

/// What every handle of one connection shares; the last one to go closes
/// the connection.
struct Handle {
    rt: Arc<Shared>,
    conn: Arc<Conn>,
    /// ns, 0 for none.
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    /// `shutdown(Read)`: reads return 0 from now on.
    read_shut: AtomicBool,
    /// Reads, writes (and a connect's wait) give `EAGAIN` rather than wait.
    nonblocking: AtomicBool,
    /// The error that ended the connection was given by `take_error`
    /// (`SO_ERROR` clears it).
    error_taken: AtomicBool,
}

/// Still in the handshake: reads and writes wait (or give `EAGAIN`).
fn connecting(inner: &ConnInner) -> bool {
    matches!(inner.tcb.state(), State::SynSent | State::SynReceived)
}

impl Watched for Handle {
    /// As Linux's `tcp_poll`: a closed connection (reset, refused, timed
    /// out, or done) is readable, writable and hung up; a connection shut
    /// down for writing is writable (a write gives `EPIPE`).
    fn readiness(&self) -> Readiness {
        let inner = self.conn.inner.lock();
        let tcb = &inner.tcb;
        let closed = tcb.state() == State::Closed;
        let read_closed = tcb.fin_received() || self.read_shut.load(SeqCst) || closed;
        let write_shut = tcb.send_shut() || closed;
        let error = tcb.error().is_some() && !self.error_taken.load(SeqCst);
        Readiness {
            readable: tcb.recv_available() > 0 || read_closed || error,
            writable: closed || (!connecting(&inner) && (write_shut || tcb.send_capacity() > 0)),
            read_closed,
            hung_up: closed || (read_closed && write_shut),
            error,
        }
    }

    fn waiters(&self) -> &SpinLock<SocketWaiters> {
        &self.conn.waiters
    }
}

/// A connection of the in-process stack (the backend of
/// [`TcpStream`](super::TcpStream) without `--protected`). Dropping the
/// last handle closes the connection (FIN after the data queued; RST if
/// received data was left unread); it lives on in the stack until its
/// state machine is done (TIME-WAIT included).
pub(crate) struct InProcessStream {
    handle: Arc<Handle>,
}

impl fmt::Debug for InProcessStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessStream")
            .field("local", &self.handle.conn.key.local)
            .field("peer", &self.handle.conn.key.remote)
            .finish()
    }
}

impl InProcessStream {
    pub(super) fn new(rt: Arc<Shared>, conn: Arc<Conn>) -> InProcessStream {
        InProcessStream {
            handle: Arc::new(Handle {
                rt,
                conn,
                read_timeout: AtomicU64::new(0),
                write_timeout: AtomicU64::new(0),
                read_shut: AtomicBool::new(false),
                nonblocking: AtomicBool::new(false),
                error_taken: AtomicBool::new(false),
            }),
        }
    }

    /// What a poller watches.
    pub(crate) fn watched(&self) -> Arc<dyn Watched> {
        self.handle.clone()
    }

    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.handle.nonblocking.store(on, Relaxed);
    }

    /// The error that ended the connection (refused, reset, timed out),
    /// once: `SO_ERROR`.
    pub(crate) fn take_error(&self) -> io::Result<Option<io::Error>> {
        let conn = &self.handle.conn;
        let error = conn.inner.lock().tcb.error();
        Ok(match error {
            Some(e) if !self.handle.error_taken.swap(true, SeqCst) => {
                Some(pending_error(e, &conn.key))
            }
            _ => None,
        })
    }

    /// Bytes a read would give now (`FIONREAD`).
    pub(crate) fn bytes_readable(&self) -> usize {
        if self.handle.read_shut.load(SeqCst) {
            return 0;
        }
        self.handle.conn.inner.lock().tcb.recv_available()
    }

    fn parts(&self) -> (&Shared, &Tcp, &Arc<Conn>) {
        let h = &*self.handle;
        let tcp = super::super::tcp_of(&h.rt).expect("a stream exists only with a stack");
        (&h.rt, tcp, &h.conn)
    }

    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.handle.conn.key.remote.into()))
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.handle.conn.key.local.into()))
    }

    /// Another handle to the same connection (sharing its timeouts).
    pub(crate) fn try_clone(&self) -> io::Result<InProcessStream> {
        Ok(InProcessStream {
            handle: Arc::clone(&self.handle),
        })
    }

    /// `Write`: FIN after the data queued (reading goes on); `Read`: reads
    /// return 0 from now on; `Both`: both.
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.handle.read_shut.store(true, SeqCst);
            wake_all(&self.handle.conn.waiters);
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            let (rt, tcp, conn) = self.parts();
            let state = tcp.with_conn(rt, conn, |inner| {
                let state = inner.tcb.state();
                if state != State::SynSent && state != State::SynReceived {
                    inner.tcb.shutdown();
                }
                state
            });
            if matches!(state, State::SynSent | State::SynReceived) {
                return Err(io_error(TcpError::NotConnected, true, &conn.key));
            }
            // Writable now (a write gives EPIPE): pollers look again.
            wake_all(&conn.waiters);
        }
        Ok(())
    }

    /// `TCP_NODELAY`: segments go out at once rather than waiting to fill
    /// one (on by default).
    pub(crate) fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        let (rt, tcp, conn) = self.parts();
        tcp.with_conn(rt, conn, |inner| inner.tcb.set_nodelay(nodelay));
        Ok(())
    }

    pub(crate) fn nodelay(&self) -> io::Result<bool> {
        Ok(self.handle.conn.inner.lock().tcb.nodelay())
    }

    /// Keep-alive probes on this connection (`None`: off).
    pub(crate) fn set_keepalive(&self, keepalive: Option<ginza_net::tcp::KeepAlive>) {
        let (rt, tcp, conn) = self.parts();
        let now = tcp.now();
        tcp.with_conn(rt, conn, |inner| inner.tcb.set_keepalive(keepalive, now));
    }

    /// `read` gives up after `timeout` with `WouldBlock` (as std does on
    /// Linux). `None`: wait forever; a zero duration is an error.
    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.handle
            .read_timeout
            .store(timeout_ns(timeout)?, Relaxed);
        Ok(())
    }

    pub(crate) fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(timeout_of(&self.handle.read_timeout))
    }

    /// `write` gives up after `timeout` with `WouldBlock` when the send
    /// buffer stays full.
    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.handle
            .write_timeout
            .store(timeout_ns(timeout)?, Relaxed);
        Ok(())
    }

    pub(crate) fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(timeout_of(&self.handle.write_timeout))
    }

    /// How long a call may wait: once if non-blocking (or `try_only`),
    /// else for the timeout, if any.
    fn wait(&self, timeout: &AtomicU64, try_only: bool) -> Wait {
        Wait::for_call(try_only || self.handle.nonblocking.load(Relaxed), timeout)
    }

    pub(crate) fn read_bytes(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, false, false)
    }

    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, false, true)
    }

    /// Reads without consuming (`MSG_PEEK`).
    pub(crate) fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, true, false)
    }

    pub(crate) fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, true, true)
    }

    /// Reads (or peeks) what has arrived, waiting (unless `try_only` or
    /// non-blocking) for something; `EAGAIN` once the wait is over (as
    /// Linux gives for `SO_RCVTIMEO` too).
    fn recv(&self, buf: &mut [u8], peek: bool, try_only: bool) -> io::Result<usize> {
        if buf.is_empty() || self.handle.read_shut.load(SeqCst) {
            return Ok(0);
        }
        let (rt, tcp, conn) = self.parts();
        let wait = self.wait(&self.handle.read_timeout, try_only);
        let shut = &self.handle.read_shut;
        let r = tcp.wait_on(rt, conn, wait, |inner| {
            if shut.load(SeqCst) {
                return Some(Ok(0));
            }
            let r = if peek {
                inner.tcb.peek(buf)
            } else {
                inner.tcb.recv(buf)
            };
            match r {
                Err(TcpError::WouldBlock) => None,
                Err(TcpError::NotConnected) if connecting(inner) => None,
                r => Some(r),
            }
        });
        match r {
            Some(Ok(n)) => Ok(n),
            Some(Err(e)) => Err(io_error(e, false, &conn.key)),
            None => Err(would_block()),
        }
    }

    pub(crate) fn write_bytes(&self, buf: &[u8]) -> io::Result<usize> {
        self.send(buf, false)
    }

    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.send(buf, true)
    }

    /// Queues what the send buffer takes of `buf`, waiting (unless
    /// `try_only` or non-blocking) for room; `EAGAIN` once the wait is
    /// over.
    fn send(&self, buf: &[u8], try_only: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let (rt, tcp, conn) = self.parts();
        let wait = self.wait(&self.handle.write_timeout, try_only);
        let r = tcp.wait_on(rt, conn, wait, |inner| match inner.tcb.send(buf) {
            Err(TcpError::WouldBlock) => None,
            Err(TcpError::NotConnected) if connecting(inner) => None,
            r => Some(r),
        });
        match r {
            Some(Ok(n)) => Ok(n),
            Some(Err(e)) => Err(io_error(e, true, &conn.key)),
            None => Err(would_block()),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let Some(tcp) = super::super::tcp_of(&self.rt) else {
            return;
        };
        tcp.with_conn(&self.rt, &self.conn, |inner| inner.tcb.close());
    }
}

/// Sends a SYN from `local_port` (0: an ephemeral port) of `rt`'s stack
/// to `addr` (checked by the caller). The peer's MAC: `Some`, the one ARP
/// gave; `None`, not known yet (the connection sends nothing until
/// `finish_connect` has it).
fn start_connect(
    rt: &Arc<Shared>,
    addr: SocketAddrV4,
    local_port: u16,
    mac: Option<MacAddr>,
) -> io::Result<Arc<Conn>> {
    let tcp = super::super::tcp_of(rt).expect("the caller checked");
    let remote = Endpoint::from(addr);
    let conn = {
        let mut table = tcp.table.lock();
        let our_ip = tcp.our_ip();
        let port = match local_port {
            0 => table
                .ephemeral_port(our_ip, remote)
                .ok_or_else(|| super::no_ephemeral_port(remote))?,
            p => p,
        };
        let key = FourTuple::new(Endpoint::new(our_ip, port), remote);
        let now = tcp.now();
        let iss = tcp.isn().isn(key.local, remote, now);
        let tcb = Connection::connect(&tcp.config, key.local, remote, iss, now);
        let conn = Conn::new(key, tcb, mac.unwrap_or(MacAddr::BROADCAST), None);
        conn.inner.lock().awaiting_arp = mac.is_none();
        if !table.insert(key, Arc::clone(&conn)) {
            // Only a chosen port can meet a connection already there.
            return Err(os_error(
                libc::EADDRNOTAVAIL,
                format_args!("TCP connect from port {port} to {addr}: that connection exists"),
            ));
        }
        conn
    };
    if mac.is_some() {
        // The SYN goes out.
        tcp.with_conn(rt, &conn, |_| ());
    }
    Ok(conn)
}

/// A non-blocking connect's wait for ARP, on a uthread of its own: the SYN
/// goes once the peer's MAC is known; after `ARP_GIVE_UP` without it, the
/// connect times out (`ETIMEDOUT` from `take_error`). Holds the runtime
/// only between looks.
fn finish_connect(rt: &Weak<Shared>, conn: &Arc<Conn>, mut asked_at: Option<Instant>) {
    let give_up = Instant::now() + super::super::ARP_GIVE_UP;
    loop {
        {
            let Some(rt) = rt.upgrade() else { return };
            let Some(tcp) = super::super::tcp_of(&rt) else {
                return;
            };
            let remote = conn.key.remote;
            let mac = super::super::look_for_mac(&rt, remote, &mut asked_at);
            match mac {
                Ok(Some(mac)) => {
                    return tcp.with_conn(&rt, conn, |inner| {
                        inner.peer_mac = mac;
                        inner.awaiting_arp = false;
                    })
                }
                Ok(None) if Instant::now() < give_up => {}
                _ => {
                    log::debug!("{}", super::super::no_arp_reply(remote));
                    return tcp.with_conn(&rt, conn, |inner| {
                        inner.awaiting_arp = false;
                        inner.tcb.time_out();
                    });
                }
            }
        }
        crate::sched::sleep(super::super::ARP_POLL);
    }
}

/// Connects from `local_port` (0: an ephemeral port) of `rt`'s stack
/// (`addr` checked by the caller).
pub(crate) fn connect(
    rt: Arc<Shared>,
    addr: SocketAddrV4,
    local_port: u16,
    timeout: Option<Duration>,
) -> io::Result<InProcessStream> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mac = super::super::resolve_mac(&rt, Endpoint::from(addr), deadline)?;
    let conn = start_connect(&rt, addr, local_port, Some(mac))?;
    let tcp = super::super::tcp_of(&rt).expect("the caller checked");
    let r = tcp.wait_on(&rt, &conn, Wait::until(deadline), |inner| {
        match (inner.tcb.error(), inner.tcb.state()) {
            (Some(e), _) => Some(Err(e)),
            (None, State::SynSent) => None,
            (None, State::Closed) => Some(Err(TcpError::NotConnected)),
            (None, _) => Some(Ok(())),
        }
    });
    let stream = InProcessStream::new(Arc::clone(&rt), Arc::clone(&conn));
    match r {
        Some(Ok(())) => Ok(stream),
        Some(Err(e)) => Err(io_error(e, false, &conn.key)),
        None => {
            tcp.with_conn(&rt, &conn, |inner| inner.tcb.abort());
            Err(os_error(
                libc::ETIMEDOUT,
                format_args!(
                    "TCP connect to {addr}: no answer within {:?}",
                    timeout.unwrap_or_default()
                ),
            ))
        }
    }
}

/// Starts connecting and returns at once (`EINPROGRESS`'s connect): the
/// stream becomes writable when the handshake ends, and `take_error` says
/// how it failed. A peer whose MAC ARP does not know yet is asked for by a
/// uthread of its own, which sends the SYN once it is known.
pub(crate) fn connect_nonblocking(
    rt: Arc<Shared>,
    addr: SocketAddrV4,
    local_port: u16,
) -> io::Result<InProcessStream> {
    let mut asked_at = None;
    let mac = super::super::look_for_mac(&rt, Endpoint::from(addr), &mut asked_at)?;
    let conn = start_connect(&rt, addr, local_port, mac)?;
    if mac.is_none() {
        let (weak, c) = (Arc::downgrade(&rt), Arc::clone(&conn));
        // Detached: it ends within ARP's give-up time.
        drop(crate::task::spawn_on(Arc::as_ptr(&rt), move || {
            finish_connect(&weak, &c, asked_at)
        }));
    }
    Ok(InProcessStream::new(rt, conn))
}
