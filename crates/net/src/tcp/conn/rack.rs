//! Time-ordered loss detection, the idea of RACK (RFC 8985 §6) kept small:
//! a data segment that is still outstanding although one sent after it was
//! delivered (cumulatively ACKed or SACKed), and that has been out for more
//! than a round trip plus a reordering window, is lost. With SACK this
//! finds a lost segment within about a round trip even when fewer than
//! DupThresh segments follow it (a small window) and when its
//! retransmission was lost too, cases where RFC 6675 alone waits for the
//! retransmission timer (200 ms at least, against round trips of tens of
//! microseconds here).

use super::sack::Scoreboard;
use crate::tcp::{Instant, Seq};
use std::collections::VecDeque;
use std::time::Duration;

/// Transmissions remembered at most (the oldest are forgotten: a loss
/// among them is left to the retransmission timer).
const MAX_TRACKED: usize = 8192;

/// The smallest reordering window: a segment held back by the path a
/// little is not lost (segments resequenced across kthreads, a reordering
/// link).
pub(super) const MIN_REORDER_WINDOW: Duration = Duration::from_millis(1);

#[derive(Debug, Default)]
pub(super) struct TransmitLog {
    /// Data segments outstanding, in the order last sent: `(start, end,
    /// sent at)`.
    sent: VecDeque<(Seq, Seq, Instant)>,
    /// RACK.xmit_ts and RACK.end_seq: when the most recently sent of the
    /// delivered segments was sent, and its end (segments sent in one
    /// burst share the time; the sequence number orders them).
    latest_delivered: Option<(Instant, Seq)>,
}

/// What [`TransmitLog::detect`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Detected {
    /// Segments now deemed lost, in the order sent.
    pub lost: Vec<(Seq, Seq)>,
    /// When to look again (a segment sent before a delivered one whose
    /// time is not up yet).
    pub recheck_at: Option<Instant>,
}

impl TransmitLog {
    /// `[start, end)` was sent (again) at `now`.
    pub(super) fn on_send(&mut self, start: Seq, end: Seq, now: Instant) {
        // A retransmission replaces what the log knew of that range.
        self.sent.retain(|&(s, e, _)| !(s.lt(end) && start.lt(e)));
        if self.sent.len() == MAX_TRACKED {
            self.sent.pop_front();
        }
        self.sent.push_back((start, end, now));
    }

    /// A timeout: go-back-N resends everything; the log starts over.
    pub(super) fn clear(&mut self) {
        self.sent.clear();
        self.latest_delivered = None;
    }

    /// After an ACK (or when a recheck is due): forgets what was
    /// delivered, and returns what is lost: sent before the latest
    /// delivered segment and out for more than `rtt + reorder`.
    pub(super) fn detect(
        &mut self,
        sb: &Scoreboard,
        snd_una: Seq,
        now: Instant,
        wait: Duration,
    ) -> Detected {
        let mut latest = self.latest_delivered;
        self.sent.retain(|&(s, e, at)| {
            let delivered = e.le(snd_una) || sb.unsacked_between(s.max(snd_una), e) == 0;
            if delivered && latest.is_none_or(|(t, end)| sent_before(t, end, at, e)) {
                latest = Some((at, e));
            }
            !delivered
        });
        self.latest_delivered = latest;
        let mut detected = Detected::default();
        let Some((latest_at, latest_end)) = latest else {
            return detected;
        };
        self.sent.retain(|&(s, e, at)| {
            if !sent_before(at, e, latest_at, latest_end) {
                return true;
            }
            let due = at + wait;
            if due <= now {
                detected.lost.push((s, e));
                false
            } else {
                detected.recheck_at = detected.recheck_at.min(Some(due)).or(Some(due));
                true
            }
        });
        detected
    }
}

/// Whether the segment ending at `end_a`, sent at `a`, went out before the
/// one ending at `end_b`, sent at `b` (RFC 8985 §6.2's RACK_sent_after,
/// the other way round).
fn sent_before(a: Instant, end_a: Seq, b: Instant, end_b: Seq) -> bool {
    a < b || (a == b && end_a.lt(end_b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::sack::{SackBlock, SackBlocks};

    #[test]
    fn a_segment_sent_before_a_delivered_one_is_lost_after_its_time() {
        let mut log = TransmitLog::default();
        let t = |us: u64| Instant::from_nanos(us * 1000);
        for n in 0..4u32 {
            log.on_send(Seq(n * 100), Seq(n * 100 + 100), t(u64::from(n)));
        }
        let mut sb = Scoreboard::default();
        let blocks: SackBlocks = [SackBlock {
            left: Seq(200),
            right: Seq(300),
        }]
        .into_iter()
        .collect();
        sb.update(&blocks, Seq(0), Seq(400));
        let wait = Duration::from_micros(50);
        // 0 and 1 were sent before 2, which arrived; not yet their time.
        let d = log.detect(&sb, Seq(0), t(30), wait);
        assert_eq!(d.lost, vec![]);
        assert_eq!(d.recheck_at, Some(t(50)));
        let d = log.detect(&sb, Seq(0), t(50), wait);
        assert_eq!(d.lost, vec![(Seq(0), Seq(100))]);
        assert_eq!(d.recheck_at, Some(t(51)));
        let d = log.detect(&sb, Seq(0), t(51), wait);
        assert_eq!(d.lost, vec![(Seq(100), Seq(200))]);
        // 3 was sent after 2: not lost whatever the time.
        assert_eq!(log.detect(&sb, Seq(0), t(10_000), wait).lost, vec![]);
        // The retransmission of 0 replaces its entry and is delivered: 3,
        // sent before it and out long enough, is lost now.
        log.on_send(Seq(0), Seq(100), t(60));
        let d = log.detect(&sb, Seq(100), t(61), wait);
        assert_eq!(d.lost, vec![(Seq(300), Seq(400))]);
        assert_eq!(log.detect(&sb, Seq(100), t(100), wait), Detected::default());
    }
}
