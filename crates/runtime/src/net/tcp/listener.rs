//! The in-process backend of `TcpListener`: a listening port of the
//! calling uthread's runtime's own stack.

use std::fmt;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;

use ginza_net::tcp::Listener;
use ginza_net::Endpoint;

use super::{wait_until, Tcp, TcpStream, Wake};
use crate::net::stack::Stack;
use crate::sched::{Shared, Waiter};
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
    /// Uthreads in `accept`.
    pub(crate) waiters: SpinLock<Vec<Arc<Waiter>>>,
}

/// A listening port of the in-process stack (the backend of
/// [`TcpListener`](super::TcpListener) without `--protected`).
pub(crate) struct InProcessListener {
    rt: Arc<Shared>,
    core: Arc<ListenerCore>,
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

impl Tcp {
    /// Makes `addr`'s port (0: an ephemeral one) a listening port of the
    /// interface address `our_ip`.
    pub(crate) fn listen(
        &self,
        our_ip: std::net::Ipv4Addr,
        addr: SocketAddrV4,
    ) -> io::Result<Arc<ListenerCore>> {
        let mut table = self.table.lock();
        let port = match addr.port() {
            0 => table.ephemeral_port(our_ip, Endpoint::new(*addr.ip(), 0))?,
            p => p,
        };
        let core = Arc::new(ListenerCore {
            local: SocketAddrV4::new(*addr.ip(), port),
            state: SpinLock::new(ListenState {
                backlog: Listener::new(self.listen),
                closed: false,
            }),
            waiters: SpinLock::new(Vec::new()),
        });
        table.listen(port, Arc::clone(&core))?;
        Ok(core)
    }
}

impl InProcessListener {
    /// Listens on `addr`: the application's IP or 0.0.0.0, and a port (0
    /// picks a free one in 49152-65535). `AddrInUse` if a listener has the
    /// port already. The half-open set and the accept backlog are bounded
    /// by `NetConfig::tcp_listen`.
    pub(crate) fn bind(rt: Arc<Shared>, addr: SocketAddrV4) -> io::Result<InProcessListener> {
        let stack = super::super::stack_of(&rt).expect("the caller checked");
        let ip = *addr.ip();
        if !ip.is_unspecified() && ip != stack.iface.ip {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!(
                    "cannot bind TCP to {addr}: this application's address is {} (bind to it or to 0.0.0.0)",
                    stack.iface.ip
                ),
            ));
        }
        stack.tcp.start_timer(&rt);
        let core = stack.tcp.listen(stack.iface.ip, addr)?;
        Ok(InProcessListener { rt, core })
    }

    fn stack(&self) -> &Stack {
        super::super::stack_of(&self.rt).expect("a listener exists only with a stack")
    }

    /// The address bound (the IP given to `bind`, which may be 0.0.0.0).
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.core.local))
    }

    /// Waits for a connection whose handshake has completed.
    pub(crate) fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let stack = self.stack();
        let tcp: &Tcp = &stack.tcp;
        loop {
            let remote = wait_until(&self.core.waiters, None, || {
                let remote = self.core.state.lock().backlog.accept()?;
                Some((remote, Wake::default()))
            })
            .expect("no deadline");
            let key = super::FourTuple {
                local: Endpoint::new(stack.iface.ip, self.core.local.port()),
                remote,
            };
            // Gone if it was reset between its handshake and now: try the next.
            let Some(conn) = tcp.table.lock().get(&key) else {
                continue;
            };
            {
                let mut inner = conn.inner.lock();
                inner.listener = None;
                inner.in_backlog = false;
            }
            let stream = TcpStream::in_process(Arc::clone(&self.rt), conn);
            return Ok((stream, SocketAddr::V4(remote.into())));
        }
    }
}

impl Drop for InProcessListener {
    /// Stops listening and resets the connections not accepted yet.
    fn drop(&mut self) {
        let Some(stack) = super::super::stack_of(&self.rt) else {
            return;
        };
        let tcp = &stack.tcp;
        let port = self.core.local.port();
        tcp.table
            .lock()
            .unlisten(port, |l| Arc::ptr_eq(l, &self.core));
        let keys = {
            let mut state = self.core.state.lock();
            state.closed = true;
            state.backlog.drain()
        };
        for remote in keys {
            let key = super::FourTuple {
                local: Endpoint::new(stack.iface.ip, port),
                remote,
            };
            let conn = tcp.table.lock().get(&key);
            if let Some(conn) = conn {
                tcp.with_conn(&self.rt, stack, &conn, |inner| {
                    inner.listener = None;
                    inner.tcb.abort();
                });
            }
        }
        super::wake_all(&self.core.waiters);
    }
}
