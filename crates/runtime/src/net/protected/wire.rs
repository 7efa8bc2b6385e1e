//! The app ⇄ netstack channel as the protected backend uses it: DLibOS
//! Table 1's commands and events as `ginza_proto::netstack` defines them
//! (docs/protected.md), and [`Wire`], what a transport must offer: per ring
//! pair a command ring (app → net) and an event ring (net → app), the
//! netstack's receive pool mapped read-only, and a way to learn that the
//! netstack is gone. The transport to a netstack process (`transport.rs`)
//! and the in-test fake (`testing.rs`) implement it; everything read from
//! it is untrusted (the backend checks every id, range and cookie).

use std::time::Duration;

pub use ginza_proto::netstack::{
    Command, ConnId, Event, ListenId, Ranges, Reason, SendFlags, MAX_RANGES,
};
pub use ginza_shm::netstack::Range;

/// Why a command was not pushed.
#[derive(Debug)]
pub(crate) enum PushError {
    /// The ring is full: back-pressure, try again later.
    Full,
    /// The netstack is gone (or disconnected us), with what we know.
    Gone(String),
}

/// One attachment to a netstack.
pub(crate) trait Wire: Send + Sync {
    /// Ring pairs (one per application kthread).
    fn pairs(&self) -> usize;
    /// Pushes `cmd` on pair `pair`'s command ring (the transport
    /// serializes producers: any uthread may push on any pair).
    fn push(&self, pair: usize, cmd: &Command) -> Result<(), PushError>;
    /// Takes up to `max` events of pair `pair`'s event ring (nothing if
    /// another kthread is taking them now); `Err` when the ring is corrupt
    /// or a slot does not decode (the netstack is not to be followed).
    fn pop(&self, pair: usize, max: usize, out: &mut Vec<Event>) -> Result<usize, String>;
    /// Whether any event ring has events (a cheap look).
    fn pending(&self) -> bool;
    /// The bytes of `r` in the receive pool (read-only), if inside it.
    fn rx(&self, r: Range) -> Option<&[u8]>;
    /// Most bytes the netstack queues per connection for `send`.
    fn send_queue_bytes(&self) -> u64;
    /// Blocks at most `timeout` for the netstack to go away: `Some(why)`
    /// once it has.
    fn wait_gone(&self, timeout: Duration) -> Option<String>;
}
