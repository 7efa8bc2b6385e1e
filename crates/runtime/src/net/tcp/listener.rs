//! The in-process backend of `TcpListener`: a listening port of the
//! calling uthread's runtime's own stack.

use std::fmt;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use ginza_net::tcp::Listener;
use ginza_net::Endpoint;

use super::super::readiness::{Readiness, SocketWaiters, Watched};
use super::super::wait::{os_error, wait_until, wake_all, would_block, Wait};
use super::stream::InProcessStream;
use super::{FourTuple, Tcp};
use crate::sched::Shared;
use crate::spinlock::SpinLock;

pub(crate) struct ListenState {
    pub(crate) backlog: Listener<Endpoint>,
    /// The listener was dropped: SYNs are answered with RST.
    pub(crate) closed: bool,
}

/// The shared part of a listener: the table and its connections point here.
pub(crate) struct ListenerCore {
    /// As bound (the application's IP or 0.0.0.0).
    pub(crate) local: SocketAddrV4,
    pub(crate) state: SpinLock<ListenState>,
    /// Uthreads in `accept`, and the pollers watching.
    pub(crate) waiters: SpinLock<SocketWaiters>,
}

/// A listening port of the in-process stack (the backend of
/// [`TcpListener`](super::TcpListener) without `--protected`).
pub(crate) struct InProcessListener {
    rt: Arc<Shared>,
    core: Arc<ListenerCore>,
    /// `accept` gives `EAGAIN` rather than waiting.
    nonblocking: AtomicBool,
}

impl fmt::Debug for InProcessListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessListener")
            .field("local", &self.core.local)
            .finish()
    }
}

impl ListenerCore {
    /// Connections waiting for `accept`.
    pub(crate) fn backlog_len(&self) -> usize {
        self.state.lock().backlog.backlog_len()
    }

    pub(crate) fn half_open_len(&self) -> usize {
        self.state.lock().backlog.half_open_len()
    }
}

impl Watched for ListenerCore {
    /// Readable while a connection waits to be accepted; nothing once
    /// closed.
    fn readiness(&self) -> Readiness {
        let state = self.state.lock();
        Readiness {
            readable: !state.closed && state.backlog.backlog_len() > 0,
            ..Readiness::default()
        }
    }

    fn waiters(&self) -> &SpinLock<SocketWaiters> {
        &self.waiters
    }
}

impl Tcp {
    /// The interface address connections and listeners are on.
    pub(crate) fn our_ip(&self) -> std::net::Ipv4Addr {
        self.iface.ip
    }

    /// Makes `addr`'s port (0: an ephemeral one) a listening port of the
    /// interface address.
    /// `backlog` bounds the accept backlog below the configured one
    /// (`None`: the configured one).
    pub(crate) fn listen(
        &self,
        addr: SocketAddrV4,
        backlog: Option<usize>,
    ) -> io::Result<Arc<ListenerCore>> {
        let our_ip = self.iface.ip;
        let mut config = self.listen;
        if let Some(b) = backlog {
            // As Linux: at least 1, at most the configured maximum.
            config.backlog = b.clamp(1, config.backlog.max(1));
        }
        let mut table = self.table.lock();
        let port = match addr.port() {
            0 => table
                .ephemeral_port(our_ip, Endpoint::new(*addr.ip(), 0))
                .ok_or_else(|| super::no_ephemeral_port(Endpoint::new(*addr.ip(), 0)))?,
            p => p,
        };
        let core = Arc::new(ListenerCore {
            local: SocketAddrV4::new(*addr.ip(), port),
            state: SpinLock::new(ListenState {
                backlog: Listener::new(config),
                closed: false,
            }),
            waiters: SpinLock::new(SocketWaiters::new()),
        });
        table
            .listen(Endpoint::new(our_ip, port), Arc::clone(&core))
            .map_err(|_| {
                os_error(
                    libc::EADDRINUSE,
                    format_args!("TCP port {port} is already listening"),
                )
            })?;
        Ok(core)
    }
}

impl InProcessListener {
    /// Listens on `addr`: the application's IP or 0.0.0.0, and a port (0
    /// picks a free one in 49152-65535). `AddrInUse` if a listener has the
    /// port already. The half-open set and the accept backlog are bounded
    /// by `NetConfig::tcp_listen`.
    /// `backlog`: the accept backlog, clamped to the configured one.
    pub(crate) fn bind(
        rt: Arc<Shared>,
        addr: SocketAddrV4,
        backlog: Option<usize>,
    ) -> io::Result<InProcessListener> {
        let tcp = super::super::tcp_of(&rt).expect("the caller checked");
        let ip = *addr.ip();
        if !ip.is_unspecified() && ip != tcp.our_ip() {
            return Err(os_error(
                libc::EADDRNOTAVAIL,
                format_args!(
                    "cannot bind TCP to {addr}: this application's address is {} (bind to it or to 0.0.0.0)",
                    tcp.our_ip()
                ),
            ));
        }
        let core = tcp.listen(addr, backlog)?;
        Ok(InProcessListener {
            rt,
            core,
            nonblocking: AtomicBool::new(false),
        })
    }

    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Relaxed);
    }

    /// What a poller watches.
    pub(crate) fn watched(&self) -> Arc<dyn Watched> {
        self.core.clone()
    }

    fn tcp(&self) -> &Tcp {
        super::super::tcp_of(&self.rt).expect("a listener exists only with a stack")
    }

    /// The address bound (the IP given to `bind`, which may be 0.0.0.0).
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.core.local))
    }

    /// Waits for a connection whose handshake has completed. The stream,
    /// not the public `TcpStream` (sockets.rs wraps it), so that this file
    /// stays below the sockets that choose a backend.
    pub(crate) fn accept(&self) -> io::Result<(InProcessStream, SocketAddr)> {
        self.accept_within(Wait::forever_unless(self.nonblocking.load(Relaxed)))
    }

    /// `accept` that never waits: `EAGAIN` when nobody is in the backlog.
    pub(crate) fn try_accept(&self) -> io::Result<(InProcessStream, SocketAddr)> {
        self.accept_within(Wait::Once)
    }

    /// Accepts, waiting as `wait` says (then `EAGAIN`).
    fn accept_within(&self, wait: Wait) -> io::Result<(InProcessStream, SocketAddr)> {
        let tcp = self.tcp();
        loop {
            let remote = wait_until(&self.core.waiters, wait, || {
                let remote = self.core.state.lock().backlog.accept()?;
                Some((remote, ()))
            })
            .ok_or_else(would_block)?;
            let key = FourTuple::new(Endpoint::new(tcp.our_ip(), self.core.local.port()), remote);
            // Gone if it was reset between its handshake and now: try the next.
            let Some(conn) = tcp.table.lock().get(&key).cloned() else {
                continue;
            };
            {
                let mut inner = conn.inner.lock();
                inner.listener = None;
                inner.in_backlog = false;
            }
            let stream = InProcessStream::new(Arc::clone(&self.rt), conn);
            return Ok((stream, SocketAddr::V4(remote.into())));
        }
    }
}

impl Drop for InProcessListener {
    /// Stops listening and resets the connections not accepted yet.
    fn drop(&mut self) {
        let Some(tcp) = super::super::tcp_of(&self.rt) else {
            return;
        };
        let local = Endpoint::new(tcp.our_ip(), self.core.local.port());
        tcp.table
            .lock()
            .unlisten(&local, |l| Arc::ptr_eq(l, &self.core));
        let keys = {
            let mut state = self.core.state.lock();
            state.closed = true;
            state.backlog.drain()
        };
        for remote in keys {
            let conn = tcp
                .table
                .lock()
                .get(&FourTuple::new(local, remote))
                .cloned();
            if let Some(conn) = conn {
                tcp.with_conn(&self.rt, &conn, |inner| {
                    inner.listener = None;
                    inner.tcb.abort();
                });
            }
        }
        wake_all(&self.core.waiters);
    }
}
