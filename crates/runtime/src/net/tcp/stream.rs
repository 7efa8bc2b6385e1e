//! The in-process backend of `TcpStream`: one connection of the calling
//! uthread's runtime's own stack.

use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_net::tcp::{Connection, FourTuple, State, TcpError};
use ginza_net::Endpoint;

use super::super::wait::{timeout_ns, timeout_of, wake_all};
use super::{io_error, Conn, Tcp};
use crate::sched::Shared;

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
            }),
        }
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
            self.handle.read_shut.store(true, Relaxed);
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

    pub(crate) fn read_bytes(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || self.handle.read_shut.load(Relaxed) {
            return Ok(0);
        }
        let (rt, tcp, conn) = self.parts();
        let timeout = timeout_of(&self.handle.read_timeout);
        let deadline = timeout.map(|t| Instant::now() + t);
        let shut = &self.handle.read_shut;
        let r = tcp.wait_on(rt, conn, deadline, |inner| {
            if shut.load(Relaxed) {
                return Some(Ok(0));
            }
            match inner.tcb.recv(buf) {
                Err(TcpError::WouldBlock) => None,
                r => Some(r),
            }
        });
        match r {
            Some(Ok(n)) => Ok(n),
            Some(Err(e)) => Err(io_error(e, false, &conn.key)),
            None => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "TCP {} -> {}: nothing to read within the read timeout {:?}",
                    conn.key.local,
                    conn.key.remote,
                    timeout.unwrap_or_default()
                ),
            )),
        }
    }

    pub(crate) fn write_bytes(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let (rt, tcp, conn) = self.parts();
        let timeout = timeout_of(&self.handle.write_timeout);
        let deadline = timeout.map(|t| Instant::now() + t);
        let r = tcp.wait_on(rt, conn, deadline, |inner| match inner.tcb.send(buf) {
            Err(TcpError::WouldBlock) => None,
            r => Some(r),
        });
        match r {
            Some(Ok(n)) => Ok(n),
            Some(Err(e)) => Err(io_error(e, true, &conn.key)),
            None => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "TCP {} -> {}: the send buffer stayed full for the write timeout {:?}",
                    conn.key.local,
                    conn.key.remote,
                    timeout.unwrap_or_default()
                ),
            )),
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

/// Connects from an ephemeral port of `rt`'s stack (`addr` checked by the
/// caller).
pub(crate) fn connect(
    rt: Arc<Shared>,
    addr: SocketAddrV4,
    timeout: Option<Duration>,
) -> io::Result<InProcessStream> {
    let tcp = super::super::tcp_of(&rt).expect("the caller checked");
    tcp.start_timer(&rt);
    let deadline = timeout.map(|t| Instant::now() + t);
    let remote = Endpoint::from(addr);
    let mac = super::super::resolve_mac(&rt, remote, deadline)?;
    let conn = {
        let mut table = tcp.table.lock();
        let our_ip = tcp.our_ip();
        let port = table
            .ephemeral_port(our_ip, remote)
            .ok_or_else(|| super::no_ephemeral_port(remote))?;
        let key = FourTuple::new(Endpoint::new(our_ip, port), remote);
        let now = tcp.now();
        let iss = tcp.isn().isn(key.local, remote, now);
        let tcb = Connection::connect(&tcp.config, key.local, remote, iss, now);
        let conn = Conn::new(key, tcb, mac, None);
        table.insert(key, Arc::clone(&conn));
        conn
    };
    // The SYN goes out.
    tcp.with_conn(&rt, &conn, |_| ());
    let r = tcp.wait_on(&rt, &conn, deadline, |inner| {
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
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "TCP connect to {addr}: no answer within {:?}",
                    timeout.unwrap_or_default()
                ),
            ))
        }
    }
}
