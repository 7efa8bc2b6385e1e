//! TCP as a sans-IO state machine (docs/design.md, "The runtime" → Networking).
//!
//! Nothing here reads a clock, owns a socket or starts a thread: segments and
//! the current time go in ([`Connection::on_segment`], [`Connection::on_timer`]),
//! and out come segments to send ([`Connection::poll_transmit`]), bytes for
//! the reader ([`Connection::recv`]), wake-ups ([`Connection::take_events`])
//! and the next timer deadline ([`Connection::next_deadline`]). The in-process
//! stack in the runtime, the protected netstack, the simulator and the tests
//! all drive this same code.
//!
//! * [`seq`]: sequence-number arithmetic (RFC 9293 §3.4, modulo 2³²).
//! * [`segment`]: the segment as the state machine sees it (ports and
//!   addresses are the driver's business: it demultiplexes by 4-tuple).
//! * [`frame`]: a received segment with its addresses, as a driver gets it.
//! * [`conn`]: one connection (the TCB): handshake, data, teardown, timers.
//! * [`isn`]: RFC 6528 initial sequence numbers.
//! * [`listen`]: a listening port's bounded half-open set and accept
//!   backlog, a SYN's admission and the backlog step.
//! * [`sack`]: RFC 2018's SACK blocks as a segment carries them.
//! * [`syncookie`]: SYN cookies (RFC 4987 §3.6): the ISN of a SYN-ACK
//!   sent without state when the half-open set is full, and its check.
//! * [`table`]: a driver's socket table (connections by 4-tuple, listeners,
//!   ephemeral ports) and where a received segment goes.
//! * [`wire`]: [`Segment`] to and from smoltcp's TCP header view.
//! * `testing` (hidden, not API): the connection in each starting state
//!   and its invariants, shared by the property test and `ginza fuzz tcp`.

pub mod conn;
pub mod frame;
pub mod isn;
pub mod listen;
pub mod sack;
pub mod segment;
pub mod seq;
pub mod syncookie;
pub mod table;
#[doc(hidden)]
pub mod testing;
pub mod wire;

pub use conn::{
    reset_for, Connection, ConnectionStats, Events, KeepAlive, State, TcpConfig, TcpError,
};
pub use frame::TcpFrame;
pub use isn::IsnGenerator;
pub use listen::{
    Admission, Backlog, CookieAnswer, ListenConfig, ListenStats, Listener, Opened, SynAnswer,
};
pub use sack::{SackBlock, SackBlocks, MAX_SACK_BLOCKS};
pub use segment::{Flags, Segment, Timestamp};
pub use seq::Seq;
pub use syncookie::{CookieError, SynCookies};
pub use table::{Demux, FourTuple, Table, EPHEMERAL_FIRST};

use std::time::Duration;

/// A point in time as the driver counts it: nanoseconds since an epoch the
/// driver chooses (the runtime's start, the simulator's zero). Only
/// differences matter to the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self - earlier`, zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}
