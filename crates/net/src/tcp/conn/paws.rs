//! RFC 7323 §5 PAWS, protection against wrapped sequence numbers: with
//! timestamps on, a segment whose TSval is older than TS.Recent is an old
//! duplicate (from an earlier pass through the sequence space, or replayed)
//! and is dropped with an ACK. TS.Recent more than 24 days old is no longer
//! valid (§5.5: the peer's 1 ms clock may have wrapped past half its range
//! since), and the next segment's TSval is taken as it comes.

use crate::tcp::{Instant, Seq};
use std::time::Duration;

/// §5.5: 24 days, under 2³¹ ms.
pub(super) const TS_RECENT_VALID_FOR: Duration = Duration::from_secs(24 * 24 * 3600);

/// TS.Recent and when it was last set.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RecentTimestamp {
    value: u32,
    set_at: Instant,
}

impl RecentTimestamp {
    pub(super) fn new(value: u32, now: Instant) -> RecentTimestamp {
        RecentTimestamp { value, set_at: now }
    }

    pub(super) fn value(&self) -> u32 {
        self.value
    }

    /// §5.3 R1: whether a segment with `tsval` is an old duplicate
    /// (TSval < TS.Recent modulo 2³², and TS.Recent still valid). A
    /// TS.Recent past its validity is replaced by `tsval`.
    pub(super) fn rejects(&mut self, tsval: u32, now: Instant) -> bool {
        if now.saturating_since(self.set_at) > TS_RECENT_VALID_FOR {
            *self = RecentTimestamp::new(tsval, now);
            return false;
        }
        Seq(tsval).lt(Seq(self.value))
    }

    /// §4.3: a segment at or before Last.ACK.sent with a TSval not older
    /// moves TS.Recent.
    pub(super) fn update(&mut self, tsval: u32, now: Instant) {
        if Seq(tsval).ge(Seq(self.value)) {
            *self = RecentTimestamp::new(tsval, now);
        }
    }
}
