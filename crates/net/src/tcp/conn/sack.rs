//! RFC 2018 selective acknowledgements, both ends.
//!
//! * [`ReceiverReport`]: which out-of-order blocks the receiver reports,
//!   the block holding the most recently received segment first (§4).
//! * [`Scoreboard`]: the sender's record of what the peer SACKed, from
//!   blocks validated against SND.UNA..SND.MAX (they come from the network:
//!   blocks outside that range, empty or reversed ones are ignored, and the
//!   scoreboard holds a bounded number of ranges).

use crate::tcp::sack::{SackBlock, SackBlocks, MAX_SACK_BLOCKS};
use crate::tcp::Seq;

/// The most disjoint ranges the scoreboard keeps. Each hole between them
/// is a lost segment at least, so more than this in one window is beyond
/// any sane loss rate; the highest ranges are forgotten first (their data
/// is then merely retransmitted once more).
const MAX_RANGES: usize = 512;

/// The receiver's memory of where recent out-of-order segments landed.
#[derive(Debug, Default)]
pub(super) struct ReceiverReport {
    /// A sequence number inside each recently received out-of-order
    /// segment, the latest first.
    recent: [Option<Seq>; MAX_SACK_BLOCKS],
}

impl ReceiverReport {
    /// An out-of-order segment starting at `seq` arrived.
    pub(super) fn note(&mut self, seq: Seq) {
        self.recent.rotate_right(1);
        self.recent[0] = Some(seq);
    }

    /// The blocks to send, given the held out-of-order ranges `held`
    /// (sorted, merged, all after RCV.NXT): first the ones holding the most
    /// recent arrivals (RFC 2018 §4: the first block reports the latest
    /// segment, later ones repeat recent reports), then the lowest others,
    /// which are the holes a sender most needs to hear about.
    pub(super) fn blocks(&self, held: &[(Seq, Seq)]) -> SackBlocks {
        let mut chosen: Vec<(Seq, Seq)> = Vec::with_capacity(MAX_SACK_BLOCKS);
        let containing = |seq: Seq| {
            held.iter()
                .copied()
                .find(|&(left, right)| seq.in_range(left, right))
        };
        let recent = self.recent.iter().flatten().filter_map(|&s| containing(s));
        for block in recent.chain(held.iter().copied()) {
            if chosen.len() == MAX_SACK_BLOCKS {
                break;
            }
            if !chosen.contains(&block) {
                chosen.push(block);
            }
        }
        chosen
            .into_iter()
            .map(|(left, right)| SackBlock { left, right })
            .collect()
    }
}

/// What one ACK's SACK blocks did to the scoreboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct SackUpdate {
    /// Blocks within SND.UNA..SND.MAX, taken.
    pub accepted: u32,
    /// Blocks outside it (D-SACKs, stale or forged blocks), ignored.
    pub ignored: u32,
    /// Bytes newly SACKed by this ACK.
    pub newly_sacked: u32,
}

/// The sender's SACKed ranges: sorted, disjoint, not adjacent, all after
/// SND.UNA.
#[derive(Debug, Default)]
pub(super) struct Scoreboard {
    ranges: Vec<(Seq, Seq)>,
}

impl Scoreboard {
    /// Takes the blocks of an ACK whose cumulative number is `snd_una`
    /// (already applied) while `snd_max` is the highest number sent.
    pub(super) fn update(&mut self, blocks: &SackBlocks, snd_una: Seq, snd_max: Seq) -> SackUpdate {
        let mut update = SackUpdate::default();
        for SackBlock { left, right } in blocks.iter() {
            let valid = left.gt(snd_una) && right.gt(left) && right.le(snd_max);
            if !valid {
                update.ignored += 1;
                continue;
            }
            update.accepted += 1;
            update.newly_sacked += self.insert(left, right);
        }
        update
    }

    /// Adds `[left, right)`; returns how many of its bytes were new.
    fn insert(&mut self, mut left: Seq, mut right: Seq) -> u32 {
        let from = left;
        let before = self.sacked_bytes_from(from);
        // Ranges touching or overlapping [left, right) merge with it.
        let first = self.ranges.partition_point(|&(_, r)| r.lt(left));
        let mut last = first;
        while last < self.ranges.len() && self.ranges[last].0.le(right) {
            left = left.min(self.ranges[last].0);
            right = right.max(self.ranges[last].1);
            last += 1;
        }
        self.ranges.splice(first..last, [(left, right)]);
        if self.ranges.len() > MAX_RANGES {
            self.ranges.pop();
        }
        let after = self.sacked_bytes_from(from);
        after.saturating_sub(before)
    }

    /// SND.UNA moved to `snd_una`: ranges at or below it go. A range that
    /// starts at or below the new SND.UNA but reaches past it means the
    /// peer dropped data it had SACKed (reneging, RFC 2018 §8): it goes
    /// too, and that data is sent again.
    pub(super) fn acknowledge(&mut self, snd_una: Seq) {
        let keep_from = self.ranges.partition_point(|&(l, _)| l.le(snd_una));
        self.ranges.drain(..keep_from);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub(super) fn ranges(&self) -> &[(Seq, Seq)] {
        &self.ranges
    }

    /// The end of the highest SACKed range (RFC 6675's HighACK is below
    /// it; nothing above it is known to have arrived).
    pub(super) fn highest_sacked(&self) -> Option<Seq> {
        self.ranges.last().map(|&(_, r)| r)
    }

    /// The SACKed range holding `seq`, if one does.
    pub(super) fn range_at(&self, seq: Seq) -> Option<(Seq, Seq)> {
        self.ranges
            .iter()
            .copied()
            .find(|&(l, r)| seq.in_range(l, r))
    }

    /// The first SACKed range starting after `seq`.
    pub(super) fn next_range_after(&self, seq: Seq) -> Option<(Seq, Seq)> {
        self.ranges.iter().copied().find(|&(l, _)| l.gt(seq))
    }

    /// SACKed bytes at or after `seq`.
    pub(super) fn sacked_bytes_from(&self, seq: Seq) -> u32 {
        self.ranges
            .iter()
            .filter(|&&(_, r)| r.gt(seq))
            .map(|&(l, r)| r.distance_from(l.max(seq)))
            .sum()
    }

    /// RFC 6675 §4 IsLost for every number at once: unSACKed bytes below
    /// the returned edge are lost (DupThresh discontiguous SACKed ranges
    /// above them, or more than (DupThresh − 1) × SMSS SACKed bytes);
    /// `None`: nothing is.
    pub(super) fn lost_edge(&self, dup_thresh: u32, mss: u32) -> Option<Seq> {
        let (mut bytes, mut count) = (0u32, 0u32);
        for &(l, r) in self.ranges.iter().rev() {
            bytes = bytes.saturating_add(r.distance_from(l));
            count += 1;
            if count >= dup_thresh || bytes > (dup_thresh - 1) * mss {
                return Some(l);
            }
        }
        None
    }

    /// The first unSACKed range at or after `from` and below `below`,
    /// as `(start, end)`; `None` when every byte there is SACKed.
    pub(super) fn hole_from(&self, from: Seq, below: Seq) -> Option<(Seq, Seq)> {
        let mut start = from;
        for &(l, r) in &self.ranges {
            if r.le(start) {
                continue;
            }
            if l.gt(start) {
                let end = l.min(below);
                return start.lt(end).then_some((start, end));
            }
            start = r;
        }
        start.lt(below).then_some((start, below))
    }

    /// UnSACKed bytes in `[from, to)`.
    pub(super) fn unsacked_between(&self, from: Seq, to: Seq) -> u32 {
        if !from.lt(to) {
            return 0;
        }
        let sacked: u32 = self
            .ranges
            .iter()
            .filter(|&&(l, r)| r.gt(from) && l.lt(to))
            .map(|&(l, r)| r.min(to).distance_from(l.max(from)))
            .sum();
        to.distance_from(from) - sacked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(pairs: &[(u32, u32)]) -> SackBlocks {
        pairs
            .iter()
            .map(|&(l, r)| SackBlock {
                left: Seq(l),
                right: Seq(r),
            })
            .collect()
    }

    #[test]
    fn scoreboard_merges_validates_and_prunes() {
        let mut sb = Scoreboard::default();
        let update = sb.update(
            &blocks(&[(200, 300), (400, 500), (50, 60)]),
            Seq(100),
            Seq(1000),
        );
        assert_eq!(
            update,
            SackUpdate {
                accepted: 2,
                ignored: 1,
                newly_sacked: 200
            }
        );
        // Bridging and beyond SND.MAX.
        let update = sb.update(
            &blocks(&[(300, 400), (900, 1100), (700, 600)]),
            Seq(100),
            Seq(1000),
        );
        assert_eq!(
            update,
            SackUpdate {
                accepted: 1,
                ignored: 2,
                newly_sacked: 100
            }
        );
        assert_eq!(sb.ranges(), &[(Seq(200), Seq(500))]);
        sb.update(&blocks(&[(600, 700), (800, 900)]), Seq(100), Seq(1000));
        assert_eq!(sb.hole_from(Seq(100), Seq(900)), Some((Seq(100), Seq(200))));
        assert_eq!(sb.hole_from(Seq(200), Seq(900)), Some((Seq(500), Seq(600))));
        assert_eq!(sb.hole_from(Seq(850), Seq(900)), None);
        assert_eq!(sb.unsacked_between(Seq(100), Seq(1000)), 900 - 500);
        // Three ranges above 200..: IsLost below 200's range's left edge.
        assert_eq!(sb.lost_edge(3, 1000), Some(Seq(200)));
        assert_eq!(sb.lost_edge(3, 10), Some(Seq(800)), "over 20 bytes above");
        sb.acknowledge(Seq(600));
        assert_eq!(sb.ranges(), &[(Seq(800), Seq(900))], "600..700 reneged");
    }

    #[test]
    fn receiver_reports_the_latest_block_first() {
        let mut report = ReceiverReport::default();
        let held = [
            (Seq(10), Seq(20)),
            (Seq(30), Seq(40)),
            (Seq(50), Seq(60)),
            (Seq(70), Seq(80)),
        ];
        report.note(Seq(55));
        report.note(Seq(70));
        assert_eq!(
            report.blocks(&held).to_pairs(),
            vec![(70, 80), (50, 60), (10, 20)]
        );
    }
}
