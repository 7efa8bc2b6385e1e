//! Networking for uthreads: the in-process stack (docs/design.md, "The runtime",
//! Networking) on the packet rings iokerneld fills and drains.
//!
//! * Each kthread polls its own ingress ring when its runqueue is empty and
//!   steals from other kthreads' rings (a try-lock per ring), in its
//!   scheduler context: a bounded batch of frames is parsed
//!   ([`ginza_net::parse`]), ARP and ICMP echo are answered at once, UDP
//!   datagrams are queued on the socket bound to their port (zero-copy: the
//!   queue holds the read-only ingress buffer) and a waiting uthread is woken.
//! * A uthread's [`UdpSocket::recv_from`] copies the payload out and gives
//!   the buffer back on the done ring of the kthread it runs on;
//!   [`UdpSocket::send_to`] builds the frame in place in its kthread's egress
//!   buffer and pushes it on the egress ring (yielding while that ring is
//!   full), after resolving the peer's MAC with the ARP table (datagrams for
//!   an address being resolved are queued, a few per address).
//!
//! * TCP: [`TcpListener`] and [`TcpStream`] drive `ginza_net::tcp`'s
//!   state machine (one lock per connection, a socket table by 4-tuple);
//!   see `tcp/mod.rs` and docs/runtime.md, "TCP sockets".
//!
//! * Readiness: [`Poller`] (`poller.rs`) watches any mix of these sockets,
//!   over either backend, the way epoll does, through an epoll-like ready
//!   list their wake-ups feed (`readiness.rs`); every socket has a
//!   non-blocking mode and `try_` calls that give `EAGAIN`. Errors carry
//!   the `errno` Linux gives (`raw_os_error`).
//!
//! Networking is configured with [`NetConfig`] in
//! [`IokernelConfig::net`](crate::IokernelConfig::net): it needs iokerneld.

mod egress;
mod poller;
pub mod protected;
mod readiness;
mod stack;
mod tcp;
#[doc(hidden)]
pub mod testing;
mod udp;
mod wait;

pub use crate::config::{DirectPathConfig, NetConfig};
use crate::sched::Shared;
pub use ginza_net::tcp::{ListenConfig, TcpConfig};
use ginza_net::Endpoint;
pub use ginza_net::{
    ArpConfig, ArpCounters, DropCounters, DropKind, Interface, Ipv4Addr, MacAddr, StaticArpEntry,
    MAX_UDP_PAYLOAD,
};
pub use poller::{PollSource, PollWaker, Poller, Registration};
pub use readiness::{PollEvent, PollMode, Readiness};
pub(crate) use stack::{Sent, Stack};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;
use tcp::Tcp;
pub use tcp::{Incoming, KeepAlive, TcpListener, TcpStats, TcpStream};
pub use udp::{ToBindAddr, UdpSocket};

/// One kthread's packet counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KthreadNetStats {
    pub id: usize,
    /// Frames this kthread took off ingress rings (its own and others').
    pub rx_packets: u64,
    /// Of `rx_packets`, those taken from another kthread's ring.
    pub rx_stolen: u64,
    /// Frames this kthread pushed on its egress ring.
    pub tx_packets: u64,
}

/// The network stack's counters (sums over kthreads, and per kthread).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames taken off the ingress rings.
    pub rx_packets: u64,
    /// Frames pushed on the egress rings.
    pub tx_packets: u64,
    /// Received frames dropped by [`ginza_net::parse`], by reason.
    pub drops: DropCounters,
    /// Datagrams queued on a socket.
    pub udp_delivered: u64,
    /// Datagrams for a port without a socket (or, on a connected socket,
    /// from another peer).
    pub udp_no_socket: u64,
    /// Datagrams dropped because their socket's queue was full.
    pub udp_queue_full: u64,
    /// Ingress descriptors naming no buffer of the pool, or too long.
    pub bad_descriptors: u64,
    /// Frames the stack built (ARP/ICMP replies, datagrams released by ARP)
    /// and dropped because the egress ring was full.
    pub tx_ring_full: u64,
    pub arp_replies: u64,
    pub icmp_echo_replies: u64,
    pub arp: ArpCounters,
    /// Ingress buffers held in socket queues now.
    pub buffers_held: u64,
    /// TCP's counters.
    pub tcp: TcpStats,
    /// The direct path (docs/direct-path.md): frames received on, and sent
    /// from, the application's own AF_XDP socket (in `rx_packets` and
    /// `tx_packets` too).
    pub direct_rx_packets: u64,
    pub direct_tx_packets: u64,
    /// `sendto`s that kicked the own socket's tx ring (one per burst of
    /// frames sent, `DirectPathConfig::kick_per_frame` aside).
    pub direct_tx_kicks: u64,
    pub kthreads: Vec<KthreadNetStats>,
}

/// The counters of the calling uthread's runtime; `None` outside a runtime
/// or without networking.
pub fn stats() -> Option<NetStats> {
    let rt = crate::sched::current_shared()?;
    stats_of(&rt)
}

/// The network stack of `rt` (registered with networking).
pub(crate) fn stack_of(rt: &Shared) -> Option<&Stack> {
    let stack: &dyn Any = rt.packet_stack()?;
    stack.downcast_ref()
}

/// The TCP part of `rt`'s stack: the in-process sockets reach it here,
/// never through the stack.
pub(crate) fn tcp_of(rt: &Shared) -> Option<&Arc<Tcp>> {
    stack_of(rt).map(|s| &s.tcp)
}

/// The longest a runtime that ends waits for the connections its
/// application closed to finish (docs/runtime.md, "Lingering at exit").
pub(crate) const EXIT_LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// Called as the application ends, with every kthread still running (from
/// the thread that waited for `main`, or from a uthread calling
/// [`linger_for_closed_connections`]): waits until no connection the
/// application closed owes its peer the end of its stream (the FIN, or the
/// data before it, unacknowledged: a segment lost once the kthreads stop
/// could never be sent again), or [`EXIT_LINGER`] has passed. Connections
/// the application left open are not waited for.
pub(crate) fn linger_at_exit(rt: &Shared) {
    let Some(tcp) = tcp_of(rt) else {
        return;
    };
    let t0 = Instant::now();
    while tcp.owes_peers() {
        if t0.elapsed() >= EXIT_LINGER {
            log::warn!(
                "exiting with connections whose peer has not acknowledged their end after {EXIT_LINGER:?}"
            );
            return;
        }
        // A uthread sleeps on the runtime's timers, leaving its kthread to
        // the stack; the thread that waits for `main` is an OS thread.
        let pause = std::time::Duration::from_micros(100);
        if crate::current_kthread_id().is_some() {
            crate::sleep(pause);
        } else {
            std::thread::sleep(pause);
        }
    }
}

/// What `run` does when `main` returns, for a program that ends otherwise
/// (the preload library's `exit`): waits, at most 2 s, until every
/// connection the application closed has had its FIN acknowledged or its
/// reset sent (docs/runtime.md, "Lingering at exit"). Call it on a uthread
/// of the runtime; elsewhere it returns at once.
pub fn linger_for_closed_connections() {
    if crate::current_kthread_id().is_none() {
        return;
    }
    if let Some(rt) = crate::sched::current_shared() {
        linger_at_exit(&rt);
    }
}

/// The MAC a TCP `connect` from `rt` to `remote` sends to, asking ARP and
/// waiting until `deadline` if needed.
pub(crate) fn resolve_mac(
    rt: &Shared,
    remote: Endpoint,
    deadline: Option<Instant>,
) -> std::io::Result<MacAddr> {
    let stack = stack_of(rt)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::Unsupported, "no network stack"))?;
    stack.resolve_mac(rt, remote, deadline)
}

/// One look for `remote`'s MAC, asking ARP if it is unknown (see
/// `Stack::look_for_mac`).
pub(crate) fn look_for_mac(
    rt: &Shared,
    remote: Endpoint,
    asked_at: &mut Option<Instant>,
) -> std::io::Result<Option<MacAddr>> {
    let stack = stack_of(rt)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::Unsupported, "no network stack"))?;
    stack.look_for_mac(rt, remote, asked_at)
}

/// How long a TCP `connect` waits between looks at the ARP table.
pub(crate) const ARP_POLL: std::time::Duration = std::time::Duration::from_micros(100);
/// How long a TCP `connect` without a timeout waits for ARP.
pub(crate) const ARP_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(3);

/// A connect's peer never answered ARP (`ETIMEDOUT`, as a blocking
/// connect gives it).
pub(crate) fn no_arp_reply(remote: Endpoint) -> std::io::Error {
    wait::os_error(
        libc::ETIMEDOUT,
        format_args!("TCP connect to {remote}: no ARP reply for {}", remote.ip),
    )
}

/// The counters of `rt`'s stack and of each kthread's packet rings.
pub(crate) fn stats_of(rt: &Shared) -> Option<NetStats> {
    let stack = stack_of(rt)?;
    Some(
        stack.stats(
            rt.kthreads
                .iter()
                .filter_map(|k| k.knet().map(|n| (k.id, n))),
        ),
    )
}
