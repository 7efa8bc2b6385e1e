//! Shared memory of protected mode (docs/protected.md): the channel of
//! rings between a protected application and the netstack, and the two
//! payload pools.
//!
//! * [`channel`]: one sealed memfd per protected application holding, per
//!   network kthread ("pair"), a command ring (application → netstack), an
//!   event ring (netstack → application) and a [`PairLine`] of wake-up
//!   flags and back-pressure counters. Slots are fixed-size [`Slot`]s; what
//!   they mean is `ginza_proto::netstack`'s business.
//! * [`pool`]: the receive pool (owned and written by the netstack, mapped
//!   read-only by the application) and the transmit pool (owned and written
//!   by the application, mapped read-only by the netstack and iokerneld),
//!   both addressed by bounds-checked [`Range`]s.
//! * [`gather`]: zero-touch transmit's egress format (headers + a gather
//!   list into a tx pool) and its assembly.

pub mod channel;
pub mod gather;
pub mod pool;

pub use channel::{
    AppPair, Channel, ChannelConfig, ChannelError, ChannelHeader, NetPair, PairLine, CHANNEL_MAGIC,
    CHANNEL_VERSION, MAX_PAIRS, MAX_RING_SLOTS,
};
pub use gather::{
    assemble, GatherError, GatherList, EGRESS_FILL_L4_CHECKSUM, EGRESS_GATHER, GATHER_BYTES,
    GATHER_OFFSET, MAX_GATHER,
};
pub use pool::{PoolError, RxPool, RxPoolView, TxPool, TxPoolView, MAX_POOL_BYTES, RX_CHUNK};

use crate::ring::Pod;

/// 32-bit words in a [`Slot`].
pub const SLOT_WORDS: usize = 16;

/// One message on a command or event ring: 64 bytes, one cache line.
/// Encoded and decoded by `ginza_proto::netstack`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub words: [u32; SLOT_WORDS],
}

// SAFETY: an array of integers, no padding; every bit pattern is valid.
unsafe impl Pod for Slot {}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// Bytes `[offset, offset + len)` of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Range {
    pub offset: u32,
    pub len: u32,
}

/// A range that does not lie inside its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("range {offset}+{len} is outside the {pool_len}-byte pool")]
pub struct OutOfPool {
    pub offset: u32,
    pub len: u32,
    pub pool_len: u64,
}

impl Range {
    pub const fn new(offset: u32, len: u32) -> Range {
        Range { offset, len }
    }

    /// One past the last byte (no overflow: computed in `u64`).
    pub const fn end(self) -> u64 {
        self.offset as u64 + self.len as u64
    }

    /// Checks that the range lies inside a pool of `pool_len` bytes.
    pub fn check(self, pool_len: u64) -> Result<(), OutOfPool> {
        if self.end() <= pool_len {
            Ok(())
        } else {
            Err(OutOfPool {
                offset: self.offset,
                len: self.len,
                pool_len,
            })
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn range_bounds() {
        assert!(Range::new(0, 10).check(10).is_ok());
        assert!(Range::new(10, 0).check(10).is_ok());
        assert_eq!(
            Range::new(u32::MAX, u32::MAX)
                .check(100)
                .unwrap_err()
                .to_string(),
            "range 4294967295+4294967295 is outside the 100-byte pool"
        );
        assert!(Range::new(5, 6).check(10).is_err());
    }
}
