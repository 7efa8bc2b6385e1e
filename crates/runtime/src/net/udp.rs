//! `UdpSocket`: blocking, shaped like `std::net::UdpSocket`, for uthreads.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_net::Endpoint;
use ginza_sys::hops::{self, Hop};

use super::poller::sealed::{Hook, Sealed};
use super::poller::PollSource;
use super::readiness::{Readiness, Watched};
use super::stack::{Sent, SocketCore, Stack};
use super::wait::{os_error, would_block};
use crate::deferral;
use crate::sched::{self, Shared, Waiter};

/// What [`UdpSocket::bind`] accepts: a `SocketAddrV4`, a `SocketAddr`
/// (IPv4 only), `(Ipv4Addr, u16)`, or a bare port (on 0.0.0.0).
pub trait ToBindAddr {
    fn to_bind_addr(self) -> io::Result<SocketAddrV4>;
}

impl ToBindAddr for SocketAddrV4 {
    fn to_bind_addr(self) -> io::Result<SocketAddrV4> {
        Ok(self)
    }
}

impl ToBindAddr for u16 {
    fn to_bind_addr(self) -> io::Result<SocketAddrV4> {
        Ok(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, self))
    }
}

impl ToBindAddr for (Ipv4Addr, u16) {
    fn to_bind_addr(self) -> io::Result<SocketAddrV4> {
        Ok(SocketAddrV4::new(self.0, self.1))
    }
}

impl ToBindAddr for SocketAddr {
    fn to_bind_addr(self) -> io::Result<SocketAddrV4> {
        match self {
            SocketAddr::V4(a) => Ok(a),
            SocketAddr::V6(a) => Err(os_error(
                libc::EAFNOSUPPORT,
                format_args!("cannot bind UDP to {a}: the Ginza stack speaks IPv4 only"),
            )),
        }
    }
}

/// A UDP socket of the calling uthread's runtime. Blocking calls suspend
/// the uthread (its kthread runs other work meanwhile). `Sync`: share it
/// between uthreads with an `Arc`.
pub struct UdpSocket {
    rt: Arc<Shared>,
    core: Arc<SocketCore>,
    /// `recv`/`send` give `EAGAIN` rather than wait.
    nonblocking: AtomicBool,
}

impl fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpSocket")
            .field("local", &self.core.local)
            .field("peer", &self.core.peer())
            .finish()
    }
}

fn no_runtime(what: &str) -> io::Error {
    io::Error::other(format!(
        "{what} must be called from a Ginza uthread (inside ginza_runtime::run)"
    ))
}

fn no_net() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "networking needs Config::iokernel with net set (IokernelConfig::net = Some(NetConfig::new(mac, ip)))",
    )
}

impl UdpSocket {
    /// Binds a socket to `addr`: the application's IP or 0.0.0.0, and a
    /// port (0 picks a free one in 49152-65535).
    pub fn bind(addr: impl ToBindAddr) -> io::Result<UdpSocket> {
        let addr = addr.to_bind_addr()?;
        let rt = sched::current_shared().ok_or_else(|| no_runtime("UdpSocket::bind"))?;
        let core = super::stack_of(&rt).ok_or_else(no_net)?.bind(addr)?;
        Ok(UdpSocket {
            rt,
            core,
            nonblocking: AtomicBool::new(false),
        })
    }

    /// In non-blocking mode `recv_from` and `send_to` give `EAGAIN`
    /// (`ErrorKind::WouldBlock`) rather than wait.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.nonblocking.store(on, Relaxed);
        Ok(())
    }

    /// What the socket is ready for now.
    pub fn readiness(&self) -> Readiness {
        self.core.readiness()
    }

    /// The payload length of the next datagram, 0 if none (`FIONREAD`).
    pub fn bytes_readable(&self) -> usize {
        self.core.next_len()
    }

    fn watched(&self) -> Arc<dyn Watched> {
        self.core.clone()
    }

    fn stack(&self) -> &Stack {
        super::stack_of(&self.rt).expect("a socket exists only with a stack")
    }

    /// The address bound (the IP given to `bind`, which may be 0.0.0.0).
    pub fn local_addr(&self) -> io::Result<SocketAddrV4> {
        Ok(self.core.local)
    }

    /// The peer set by [`connect`](Self::connect).
    pub fn peer_addr(&self) -> io::Result<SocketAddrV4> {
        self.core.peer().map(Into::into).ok_or_else(|| {
            os_error(
                libc::ENOTCONN,
                format_args!("UDP socket {} is not connected", self.core.local),
            )
        })
    }

    /// Sets the default destination of [`send`](Self::send) and receives
    /// only from it from now on (datagrams from others are dropped,
    /// counted in `udp_no_socket`).
    pub fn connect(&self, peer: SocketAddrV4) -> io::Result<()> {
        if peer.port() == 0 || peer.ip().is_unspecified() {
            return Err(os_error(
                libc::EINVAL,
                format_args!("cannot connect UDP socket {} to {peer}", self.core.local),
            ));
        }
        self.core.set_peer(peer.into());
        Ok(())
    }

    /// `recv_from` gives up after `timeout` with `ErrorKind::WouldBlock`
    /// (as std does on Linux). `None`: wait forever. A zero duration is an
    /// error, as in std.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        let ns = match timeout {
            None => 0,
            Some(d) if d.is_zero() => {
                return Err(os_error(
                    libc::EINVAL,
                    format_args!("cannot set a 0 duration timeout"),
                ))
            }
            Some(d) => d.as_nanos().clamp(1, u64::MAX as u128) as u64,
        };
        self.core.read_timeout_ns.store(ns, Relaxed);
        Ok(())
    }

    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        let ns = self.core.read_timeout_ns.load(Relaxed);
        Ok((ns != 0).then(|| Duration::from_nanos(ns)))
    }

    /// Sends `buf` as one datagram to `dst`. Waits (yields) while this
    /// kthread's egress ring is full. A destination whose MAC is not known
    /// yet is asked for by ARP and the datagram queued (a few per address;
    /// beyond that, or unanswered, it is dropped and counted in
    /// `NetStats::arp`), like a kernel does: `Ok` says it was accepted,
    /// not delivered.
    pub fn send_to(&self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize> {
        self.send_datagram(buf, dst, self.nonblocking.load(Relaxed))
    }

    /// `send_to` that never waits: `EAGAIN` while this kthread's egress
    /// ring is full (`MSG_DONTWAIT`).
    pub fn try_send_to(&self, buf: &[u8], dst: SocketAddrV4) -> io::Result<usize> {
        self.send_datagram(buf, dst, true)
    }

    fn send_datagram(&self, buf: &[u8], dst: SocketAddrV4, try_only: bool) -> io::Result<usize> {
        if dst.port() == 0 {
            return Err(os_error(
                libc::EINVAL,
                format_args!("cannot send to {dst}: port 0"),
            ));
        }
        let dst = Endpoint::from(dst);
        let port = self.core.port();
        loop {
            let stack = self.stack();
            let r = sched::with_current_knet(&self.rt, |me| stack.send_udp(me, port, dst, buf))
                .ok_or_else(|| {
                no_runtime("UdpSocket::send_to (on a uthread of the socket's runtime)")
            })??;
            match r {
                Sent::Now | Sent::Queued => {
                    hops::stamp(Hop::Replied);
                    sched::flush_own_tx_if_alone();
                    return Ok(buf.len());
                }
                Sent::Dropped => return Ok(buf.len()),
                Sent::RingFull if try_only => return Err(would_block()),
                Sent::RingFull => {
                    if !self.rt.managed() {
                        return Err(os_error(
                            libc::EPIPE,
                            format_args!(
                                "iokerneld is gone: nothing drains the egress ring any more"
                            ),
                        ));
                    }
                    // iokerneld drains the rings of kthreads that hold a
                    // core, which ours does while it runs us.
                    sched::yield_now();
                }
            }
        }
    }

    /// [`send_to`](Self::send_to) the connected peer.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        self.send_to(buf, peer)
    }

    /// Waits for a datagram and copies its payload into `buf` (the rest of
    /// a longer datagram is discarded, as with std); returns its length
    /// copied and its source.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddrV4)> {
        if self.nonblocking.load(Relaxed) {
            return self.try_recv_from(buf);
        }
        let timeout = self.read_timeout()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(r) = self.try_recv(buf) {
                return Ok(r);
            }
            match wait_readable(&self.core, deadline) {
                Wait::Ready | Wait::Woken => {}
                Wait::TimedOut => {
                    // A datagram that came with the timeout is still taken.
                    return self.try_recv(buf).ok_or_else(would_block);
                }
                // An OS thread: poll.
                Wait::NotAUthread => std::thread::sleep(Duration::from_micros(20)),
            }
        }
    }

    /// [`recv_from`](Self::recv_from) without the source; on a connected
    /// socket only the peer's datagrams arrive.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    /// `recv_from` that never waits: `EAGAIN` when no datagram is queued
    /// (`MSG_DONTWAIT`).
    pub fn try_recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddrV4)> {
        self.try_recv(buf).ok_or_else(would_block)
    }

    /// A datagram if one is queued, without waiting.
    fn try_recv(&self, buf: &mut [u8]) -> Option<(usize, SocketAddrV4)> {
        let item = self.core.take()?;
        let stack = self.stack();
        stack.taken();
        let n = stack.copy_out(&item, buf);
        let buf_index = item.buf_index();
        if sched::with_current_knet(&self.rt, |me| stack.give_back(me, buf_index)).is_none() {
            stack.give_back_later(buf_index);
        }
        Some((n, Stack::item_source(&item)))
    }
}

impl Sealed for UdpSocket {
    fn poll_hook(&self) -> Hook {
        Hook(self.watched())
    }
}

impl PollSource for UdpSocket {}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        let Some(stack) = super::stack_of(&self.rt) else {
            return;
        };
        let rt = &self.rt;
        stack.close(&self.core, |b| {
            if sched::with_current_knet(rt, |me| stack.give_back(me, b)).is_none() {
                stack.give_back_later(b);
            }
        });
    }
}

enum Wait {
    /// A datagram (or the close) was there already.
    Ready,
    Woken,
    TimedOut,
    NotAUthread,
}

/// Suspends the calling uthread until `core` has a datagram (or is closed)
/// or `deadline` passes. The check and the queueing happen under the
/// waiters' lock, which deliveries take after queueing their datagram, so
/// no wake-up is lost.
fn wait_readable(core: &SocketCore, deadline: Option<Instant>) -> Wait {
    // Deferred from before queueing until after resuming: a preemption in
    // between would put this uthread on a runqueue too.
    let deferred = deferral::Guard::new();
    let Some(me) = sched::current_uthread(&deferred) else {
        return Wait::NotAUthread;
    };
    if deadline.is_some_and(|d| d <= Instant::now()) {
        return Wait::TimedOut;
    }
    let w = Waiter::new(me);
    {
        let mut q = core.waiters.lock();
        if core.readable() {
            return Wait::Ready;
        }
        q.uthreads.push_back(Arc::clone(&w));
    }
    match deadline {
        None => sched::park_current(&deferred),
        Some(d) => sched::park_current_until(&deferred, &w, d),
    }
    if w.timed_out() {
        core.waiters.lock().uthreads.retain(|x| !Arc::ptr_eq(x, &w));
        return Wait::TimedOut;
    }
    Wait::Woken
}
