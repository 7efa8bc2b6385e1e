//! A TCP segment as the state machine sees it.

use super::sack::SackBlocks;
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
    /// The timestamps option (RFC 7323 §3), on any segment.
    pub timestamp: Option<Timestamp>,
    /// RFC 2018's SACK-permitted option (SYN segments only).
    pub sack_permitted: bool,
    /// RFC 2018's SACK blocks, on any segment with an ACK.
    pub sack: SackBlocks,
    pub payload: &'a [u8],
}

/// RFC 7323 §3's timestamps option: the sender's clock, and the latest
/// value it received (`echo`, TSecr; 0 on a SYN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp {
    pub value: u32,
    pub echo: u32,
}

impl<'a> Segment<'a> {
    /// A segment with no flags, no ACK, no options and no payload; set the
    /// fields you need (tests and the reset builder start here).
    pub const fn new(seq: Seq) -> Segment<'static> {
        Segment {
            seq,
            ack: None,
            flags: Flags {
                syn: false,
                fin: false,
                rst: false,
                psh: false,
            },
            window: 0,
            mss: None,
            window_scale: None,
            timestamp: None,
            sack_permitted: false,
            sack: SackBlocks::NONE,
            payload: &[],
        }
    }

    /// SEG.LEN (RFC 9293 §3.4): the payload plus one for SYN and one for FIN.
    pub fn seq_len(&self) -> usize {
        self.payload.len() + usize::from(self.flags.syn) + usize::from(self.flags.fin)
    }

    /// The same segment with its payload copied, so it outlives the buffer
    /// it borrowed (tests and drivers that queue segments).
    pub fn to_owned_payload(&self) -> (Segment<'static>, Vec<u8>) {
        let mut header = Segment::new(self.seq);
        header.ack = self.ack;
        header.flags = self.flags;
        header.window = self.window;
        header.mss = self.mss;
        header.window_scale = self.window_scale;
        header.timestamp = self.timestamp;
        header.sack_permitted = self.sack_permitted;
        header.sack = self.sack;
        (header, self.payload.to_vec())
    }
}
