//! A TCP segment as the state machine sees it.

use super::Seq;

/// The control bits the state machine acts on (ACK is `Segment::ack.is_some()`;
/// URG is ignored, as RFC 9293 allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags {
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
    pub psh: bool,
}

/// One segment, in or out. Ports are not here: the driver demultiplexes by
/// 4-tuple before the connection sees a segment, and writes them on the way
/// out ([`Connection::local`](super::Connection::local)/`remote`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<'a> {
    pub seq: Seq,
    /// The acknowledgement number when the ACK bit is set.
    pub ack: Option<Seq>,
    pub flags: Flags,
    /// The window field as on the wire (before scaling).
    pub window: u16,
    /// The MSS option (SYN segments only).
    pub mss: Option<u16>,
    /// The window-scale option's shift (SYN segments only).
    pub window_scale: Option<u8>,
    pub payload: &'a [u8],
}
