//! A received TCP segment with the addresses it came with: what the frame
//! parser ([`crate::rx`]) hands a driver and what its table demultiplexes
//! by, kept under `tcp` so that the table does not import the parser.

use super::Segment;
use crate::{Endpoint, MacAddr};

/// A TCP segment addressed to us, its header checked (see
/// [`crate::tcp::wire::parse`]); the payload borrows from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpFrame<'a> {
    /// The Ethernet source: where replies go (the next hop).
    pub src_mac: MacAddr,
    pub src: Endpoint,
    pub dst: Endpoint,
    pub segment: Segment<'a>,
}
