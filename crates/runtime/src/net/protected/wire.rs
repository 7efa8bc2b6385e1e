//! The app ⇄ netstack channel as the protected backend uses it: DLibOS
//! Table 1's commands and events (docs/design.md, "Protected mode
//! (DLibOS)"), and [`Wire`], what a transport must offer: per network
//! kthread a command ring (app → net) and an event ring (net → app), the
//! netstack's receive pool mapped read-only, the application's own tx pool.
//! The transport to a netstack process and the in-test fake both implement
//! it; everything read from it is untrusted (lengths and offsets are
//! checked by the backend before use).

use std::net::SocketAddrV4;

/// Why the netstack refused or ended something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The peer answered our SYN with a reset.
    Refused,
    /// The peer (or the netstack) reset the connection.
    Reset,
    /// Retransmissions gave up.
    TimedOut,
    /// A listener has the port already.
    AddrInUse,
    /// The netstack refused the command (it says why in its log).
    Refusal,
}

/// A command, application → netstack (DLibOS Table 1, plus `listen`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Listen on `port` (0: the netstack picks); answered by `Listening`.
    Listen { port: u16 },
    /// Stop listening on `port`.
    Unlisten { port: u16 },
    /// Take connection `id` announced by `NewConn`.
    Accept { id: u32 },
    /// Open a connection; answered by `Connected` or `ConnectFailed` with
    /// the same cookie.
    Connect { cookie: u64, to: SocketAddrV4 },
    /// Send the bytes at these `{offset, len}` ranges of the tx pool, in
    /// order. They stay the application's to keep unchanged until
    /// `DataAcked` counts them.
    Send { id: u32, ranges: Vec<(u64, u32)> },
    /// The application is done with `count` more bytes of `NewData`:
    /// credits the receive window and frees receive memory, in order.
    RecvDone { id: u32, count: u32 },
    /// FIN after the data sent (reading goes on).
    Shutdown { id: u32 },
    /// Close and free the connection (RST if received data was unread).
    Close { id: u32 },
}

/// An event, netstack → application (DLibOS Table 1, plus the answers to
/// `listen` and `connect`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Listening {
        port: u16,
        result: Result<u16, Reason>,
    },
    NewConn {
        id: u32,
        port: u16,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    },
    Connected {
        cookie: u64,
        id: u32,
        local: SocketAddrV4,
    },
    ConnectFailed {
        cookie: u64,
        reason: Reason,
    },
    /// Received bytes at `{offset, len}` of the receive pool, in order.
    NewData {
        id: u32,
        items: Vec<(u64, u32)>,
    },
    /// The peer acknowledged `count` more bytes of what was sent.
    DataAcked {
        id: u32,
        count: u64,
    },
    RemoteClosed {
        id: u32,
    },
    /// The connection is gone (`reason`: how, if not a clean close); its
    /// resources may be freed.
    Cleanup {
        id: u32,
        reason: Option<Reason>,
    },
}

/// A command ring was full: back-pressure, try again later.
#[derive(Debug)]
pub(crate) enum PushError {
    Full,
    /// The netstack is gone (or disconnected us), with what we know.
    Gone(String),
}

/// One attachment to a netstack.
pub(crate) trait Wire: Send + Sync {
    /// The netstack's network kthreads: one command and one event ring each.
    fn rings(&self) -> usize;
    /// Pushes `cmd` on command ring `ring` (the transport serializes
    /// producers).
    fn push(&self, ring: usize, cmd: &Command) -> Result<(), PushError>;
    /// Takes up to `max` events of event ring `ring` (nothing if another
    /// kthread is taking them now); `Err` when the ring is corrupt or gone.
    fn pop(&self, ring: usize, max: usize, out: &mut Vec<Event>) -> Result<usize, String>;
    /// Whether any event ring has events (a cheap look).
    fn pending(&self) -> bool;
    /// `len` bytes at `offset` of the receive pool (read-only), if inside it.
    fn rx(&self, offset: u64, len: u32) -> Option<&[u8]>;
    /// Blocks at most `timeout` for the netstack to go away: `Some(why)`
    /// once it has.
    fn wait_gone(&self, timeout: std::time::Duration) -> Option<String>;
}
