//! RFC 6675 SACK-based loss recovery: the sender's estimate of what is in
//! the network (`pipe`), which segment goes next (`NextSeg`), and a
//! retransmission found lost again.
//!
//! The scoreboard ([`super::sack::Scoreboard`]) says what arrived; this
//! module keeps the recovery episode: RecoveryPoint, HighRxt, and the
//! retransmissions in flight. A retransmission counts as lost again once
//! more than (DupThresh − 1) × SMSS of data sent after it was SACKed (the
//! idea RACK generalises): without that, RFC 6675 learns of a lost
//! retransmission only from the retransmission timer, 200 ms or more,
//! which on a path that drops one segment in twenty is the larger part of
//! a transfer's time.

use super::sack::Scoreboard;
use crate::tcp::Seq;
use std::collections::VecDeque;

/// RFC 6675 §2's DupThresh.
pub(super) const DUP_THRESH: u32 = 3;

/// Retransmissions in flight remembered at most (older ones are forgotten:
/// a loss among them is then left to the retransmission timer).
const MAX_TRACKED: usize = 1024;

/// One loss-recovery episode (RFC 6675 §5, from entering to the ACK of
/// RecoveryPoint).
#[derive(Debug)]
pub(super) struct SackRecovery {
    /// RecoveryPoint: HighData when the episode began; a cumulative ACK at
    /// or beyond it ends the episode.
    recovery_point: Seq,
    /// HighRxt (exclusive): the end of the highest retransmission.
    high_rxt: Seq,
    /// Retransmissions in flight: `(start, end, SND.MAX when sent)`.
    in_flight: VecDeque<(Seq, Seq, Seq)>,
    /// Retransmissions found lost again, and segments found lost by time,
    /// to be resent first.
    relost: Vec<(Seq, Seq)>,
}

impl SackRecovery {
    pub(super) fn new(snd_una: Seq, snd_max: Seq) -> SackRecovery {
        SackRecovery {
            recovery_point: snd_max,
            high_rxt: snd_una,
            in_flight: VecDeque::new(),
            relost: Vec::new(),
        }
    }

    /// Whether a cumulative ACK at `ack` ends the episode.
    pub(super) fn is_over(&self, ack: Seq) -> bool {
        ack.ge(self.recovery_point)
    }

    /// RFC 6675 §4 SetPipe: every unSACKed byte not deemed lost counts
    /// once, every retransmitted unSACKed byte once more; a retransmission
    /// found lost again is no longer in the network.
    pub(super) fn pipe(
        &self,
        sb: &Scoreboard,
        snd_una: Seq,
        snd_max: Seq,
        lost_edge: Option<Seq>,
    ) -> u32 {
        let not_lost_from = lost_edge.map_or(snd_una, |edge| edge.max(snd_una));
        let retransmitted_to = self.high_rxt.min(snd_max);
        let relost: u32 = self
            .relost
            .iter()
            .map(|&(s, e)| sb.unsacked_between(s.max(snd_una), e))
            .sum();
        (sb.unsacked_between(not_lost_from, snd_max)
            + sb.unsacked_between(snd_una, retransmitted_to))
        .saturating_sub(relost)
    }

    /// After an ACK was taken: forgets retransmissions that arrived, and
    /// moves those that data sent after them overtook to the lost-again
    /// list.
    pub(super) fn on_ack(&mut self, sb: &Scoreboard, snd_una: Seq, mss: u32) {
        let arrived = |s: Seq, e: Seq| e.le(snd_una) || sb.unsacked_between(s.max(snd_una), e) == 0;
        self.relost.retain(|&(s, e)| !arrived(s, e));
        let overtaken = (DUP_THRESH - 1) * mss;
        let mut kept = VecDeque::with_capacity(self.in_flight.len());
        for (s, e, sent_at) in self.in_flight.drain(..) {
            if arrived(s, e) {
                continue;
            }
            if sb.sacked_bytes_from(sent_at) > overtaken {
                self.relost.push((s, e));
            } else {
                kept.push_back((s, e, sent_at));
            }
        }
        self.in_flight = kept;
    }

    /// Segments found lost by time ([`super::rack`]): resent first.
    pub(super) fn mark_lost(&mut self, lost: &[(Seq, Seq)]) {
        for &range in lost {
            if !self.relost.contains(&range) {
                self.relost.push(range);
            }
        }
    }

    /// NextSeg's retransmissions that come before new data: a
    /// retransmission lost again, else (rule 1) the first unSACKed hole
    /// above HighRxt that IsLost says is lost. `(start, end)` of the hole;
    /// the caller cuts it to one segment.
    pub(super) fn next_lost(
        &self,
        sb: &Scoreboard,
        snd_una: Seq,
        lost_edge: Option<Seq>,
    ) -> Option<(Seq, Seq)> {
        for &(s, e) in &self.relost {
            if let Some(hole) = sb.hole_from(s.max(snd_una), e) {
                return Some(hole);
            }
        }
        let edge = lost_edge?;
        let below = sb.highest_sacked().map_or(edge, |h| h.min(edge));
        sb.hole_from(self.high_rxt.max(snd_una), below)
    }

    /// NextSeg rule 3, when no new data can go: the first unSACKed hole
    /// above HighRxt below the highest SACKed byte, lost or not yet.
    pub(super) fn next_rescue(&self, sb: &Scoreboard, snd_una: Seq) -> Option<(Seq, Seq)> {
        let below = sb.highest_sacked()?;
        sb.hole_from(self.high_rxt.max(snd_una), below)
    }

    /// `[start, end)` was retransmitted while `snd_max` was the highest
    /// number sent.
    pub(super) fn on_retransmit(&mut self, start: Seq, end: Seq, snd_max: Seq) {
        self.high_rxt = self.high_rxt.max(end);
        // What was resent leaves the lost list (a range is resent from its
        // first unSACKed byte on, so what lies below `end` is done).
        for range in &mut self.relost {
            if range.0.lt(end) && start.lt(range.1) {
                range.0 = end.min(range.1);
            }
        }
        self.relost.retain(|&(s, e)| s.lt(e));
        if self.in_flight.len() == MAX_TRACKED {
            self.in_flight.pop_front();
        }
        self.in_flight.push_back((start, end, snd_max));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::sack::{SackBlock, SackBlocks};

    fn sack(sb: &mut Scoreboard, pairs: &[(u32, u32)], una: u32, max: u32) {
        let blocks: SackBlocks = pairs
            .iter()
            .map(|&(l, r)| SackBlock {
                left: Seq(l),
                right: Seq(r),
            })
            .collect();
        sb.update(&blocks, Seq(una), Seq(max));
    }

    #[test]
    fn pipe_next_seg_and_a_retransmission_lost_again() {
        // Ten segments of 100 bytes from 0; 0 and 300 lost, the rest SACKed.
        let mut sb = Scoreboard::default();
        sack(&mut sb, &[(100, 300), (400, 1000)], 0, 1000);
        let edge = sb.lost_edge(DUP_THRESH, 100);
        assert_eq!(edge, Some(Seq(400)));
        let mut rec = SackRecovery::new(Seq(0), Seq(1000));
        assert_eq!(rec.pipe(&sb, Seq(0), Seq(1000), edge), 0, "both holes lost");
        assert_eq!(rec.next_lost(&sb, Seq(0), edge), Some((Seq(0), Seq(100))));
        rec.on_retransmit(Seq(0), Seq(100), Seq(1000));
        assert_eq!(rec.pipe(&sb, Seq(0), Seq(1000), edge), 100);
        assert_eq!(rec.next_lost(&sb, Seq(0), edge), Some((Seq(300), Seq(400))));
        rec.on_retransmit(Seq(300), Seq(400), Seq(1000));
        assert_eq!(rec.next_lost(&sb, Seq(0), edge), None);
        // New data 1000..1400 goes out and is SACKed; the retransmission of
        // 0 is not: it was lost again and goes first.
        sack(&mut sb, &[(1000, 1400), (300, 400)], 0, 1400);
        rec.on_ack(&sb, Seq(0), 100);
        assert_eq!(
            rec.next_lost(&sb, Seq(0), sb.lost_edge(DUP_THRESH, 100)),
            Some((Seq(0), Seq(100)))
        );
        assert!(!rec.is_over(Seq(999)));
        assert!(rec.is_over(Seq(1000)));
    }
}
