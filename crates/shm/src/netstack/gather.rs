//! Zero-touch transmit (docs/protected.md, "Transmit"): an egress
//! descriptor whose buffer holds only the headers the netstack built, and,
//! at [`GATHER_OFFSET`] of the same buffer, a [`GatherList`] naming the
//! payload in a protected application's tx pool. iokerneld (which maps the
//! tx pool) copies headers and payload into the NIC's frame and fills in
//! the L4 checksum, as a NIC with checksum offload would: the netstack
//! never reads or writes payload bytes.
//!
//! The descriptor says which: `PacketDesc::reserved` carries
//! [`EGRESS_FILL_L4_CHECKSUM`] and [`EGRESS_GATHER`]. Everything in the
//! list is the netstack's word and checked ([`assemble`]).

#![forbid(unsafe_code)]

use super::{Range, TxPoolView};

/// Egress flag: fill in the TCP/UDP checksum of the frame.
pub const EGRESS_FILL_L4_CHECKSUM: u32 = 1;
/// Egress flag: the payload is in a tx pool, named by the gather list.
pub const EGRESS_GATHER: u32 = 2;
/// Where the gather list starts in an egress buffer (headers end before).
pub const GATHER_OFFSET: usize = 1920;
/// Most payload pieces of one frame.
pub const MAX_GATHER: usize = 8;
/// Bytes of an encoded gather list.
pub const GATHER_BYTES: usize = 16 + 8 * MAX_GATHER;

/// The payload of one frame: pieces of the tx pool of link `link` (the
/// netstack's id of the application, as in `Request::Protect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatherList {
    pub link: u64,
    pub n: u32,
    pub ranges: [Range; MAX_GATHER],
}

/// A gather list or descriptor that cannot be followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatherError {
    #[error("gather list of {0} pieces, at most {MAX_GATHER}")]
    TooManyPieces(u32),
    #[error("gather list truncated")]
    Truncated,
    #[error("no tx pool for link {0}")]
    NoPool(u64),
    #[error("gather piece {0:?} outside the tx pool")]
    OutOfPool(Range),
    #[error("frame of {need} bytes does not fit {room}")]
    TooLong { need: usize, room: usize },
}

impl GatherList {
    /// Appends a piece; false when full.
    pub fn push(&mut self, r: Range) -> bool {
        if self.n as usize == MAX_GATHER {
            return false;
        }
        self.ranges[self.n as usize] = r;
        self.n += 1;
        true
    }

    pub fn pieces(&self) -> &[Range] {
        &self.ranges[..(self.n as usize).min(MAX_GATHER)]
    }

    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.pieces().iter().map(|r| r.len as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Little-endian into `out` (at least [`GATHER_BYTES`]).
    pub fn encode(&self, out: &mut [u8]) -> Result<(), GatherError> {
        let out = out.get_mut(..GATHER_BYTES).ok_or(GatherError::Truncated)?;
        out.fill(0);
        out[0..8].copy_from_slice(&self.link.to_le_bytes());
        out[8..12].copy_from_slice(&self.n.to_le_bytes());
        for (i, r) in self.pieces().iter().enumerate() {
            let at = 16 + 8 * i;
            out[at..at + 4].copy_from_slice(&r.offset.to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&r.len.to_le_bytes());
        }
        Ok(())
    }

    /// The list in `bytes` (from the peer: checked).
    pub fn decode(bytes: &[u8]) -> Result<GatherList, GatherError> {
        let b = bytes.get(..GATHER_BYTES).ok_or(GatherError::Truncated)?;
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut link = [0u8; 8];
        link.copy_from_slice(&b[0..8]);
        let n = word(8);
        if n as usize > MAX_GATHER {
            return Err(GatherError::TooManyPieces(n));
        }
        let mut g = GatherList {
            link: u64::from_le_bytes(link),
            ..Default::default()
        };
        for i in 0..n as usize {
            g.push(Range::new(word(16 + 8 * i), word(20 + 8 * i)));
        }
        Ok(g)
    }
}

/// Writes `header` then the pieces of `list` (from `pool`) into `out`;
/// returns the frame length. The checksum is the caller's (iokerneld's
/// offload, after the copy).
pub fn assemble(
    header: &[u8],
    list: &GatherList,
    pool: &TxPoolView,
    out: &mut [u8],
) -> Result<usize, GatherError> {
    let need = header.len() + list.len();
    if need > out.len() {
        return Err(GatherError::TooLong {
            need,
            room: out.len(),
        });
    }
    out[..header.len()].copy_from_slice(header);
    let mut at = header.len();
    for r in list.pieces() {
        let end = at + r.len as usize;
        pool.copy_out(*r, &mut out[at..end])
            .map_err(|_| GatherError::OutOfPool(*r))?;
        at = end;
    }
    Ok(at)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::netstack::TxPool;

    #[test]
    #[cfg_attr(miri, ignore = "memfd")]
    fn gather_round_trip_and_bounds() {
        let mut tx = TxPool::create("g", 4096).unwrap();
        tx.get_mut(Range::new(100, 3))
            .unwrap()
            .copy_from_slice(b"abc");
        tx.get_mut(Range::new(4000, 2))
            .unwrap()
            .copy_from_slice(b"de");
        let view = TxPoolView::map(tx.fd().try_clone_to_owned().unwrap()).unwrap();
        let mut g = GatherList {
            link: 7,
            ..Default::default()
        };
        g.push(Range::new(100, 3));
        g.push(Range::new(4000, 2));
        let mut buf = [0u8; GATHER_BYTES];
        g.encode(&mut buf).unwrap();
        assert_eq!(GatherList::decode(&buf), Ok(g));
        let mut out = [0u8; 16];
        assert_eq!(assemble(b"HH", &g, &view, &mut out), Ok(7));
        assert_eq!(&out[..7], b"HHabcde");
        // A piece outside the pool, too many pieces, no room.
        g.push(Range::new(4095, 2));
        assert_eq!(
            assemble(b"HH", &g, &view, &mut out),
            Err(GatherError::OutOfPool(Range::new(4095, 2)))
        );
        buf[8] = 9;
        assert_eq!(GatherList::decode(&buf), Err(GatherError::TooManyPieces(9)));
        assert!(matches!(
            assemble(&[0; 15], &g, &view, &mut out),
            Err(GatherError::TooLong { .. })
        ));
    }
}
