//! NewReno congestion control: slow start and congestion avoidance
//! (RFC 5681 §3.1), fast retransmit and fast recovery (RFC 5681 §3.2) with
//! RFC 6582's partial-ACK handling, and the loss window after a timeout.

use crate::tcp::Seq;

/// What the sender must do after an ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AckAction {
    None,
    /// Retransmit the first unacknowledged segment now (third duplicate ACK,
    /// or a partial ACK in recovery).
    Retransmit,
}

#[derive(Debug)]
pub(super) struct NewReno {
    mss: u32,
    cwnd: u32,
    ssthresh: u32,
    duplicate_acks: u32,
    /// RFC 6582 §3.2 "recover": the highest sequence number sent when fast
    /// recovery (or a timeout) began; `Some` while in fast recovery.
    recovery: Option<Seq>,
    /// After a timeout, the highest number sent then: a third duplicate ACK
    /// below it does not start fast recovery (RFC 6582 §4.1).
    recover: Option<Seq>,
    /// Bytes acknowledged in congestion avoidance since cwnd last grew.
    acked_in_avoidance: u32,
    /// Whether the next partial ACK is the first of this recovery (RFC 6582
    /// §3.2 step 5: only that one resets the retransmission timer).
    first_partial: bool,
}

impl NewReno {
    /// RFC 6928's initial window of ten segments (datacenter RTTs make a
    /// smaller one cost whole round trips on every new connection).
    pub(super) fn new(mss: u32) -> NewReno {
        NewReno {
            mss,
            cwnd: 10 * mss,
            ssthresh: u32::MAX,
            duplicate_acks: 0,
            recovery: None,
            recover: None,
            acked_in_avoidance: 0,
            first_partial: false,
        }
    }

    pub(super) fn set_mss(&mut self, mss: u32) {
        self.mss = mss;
        self.cwnd = 10 * mss;
    }

    pub(super) fn window(&self) -> u32 {
        self.cwnd
    }

    /// The window for sending new data: cwnd plus RFC 3042's limited
    /// transmit (one new segment for each of the first two duplicate ACKs,
    /// so a small window still produces the third).
    pub(super) fn send_window(&self) -> u32 {
        if self.recovery.is_some() {
            return self.cwnd;
        }
        self.cwnd
            .saturating_add(self.duplicate_acks.min(2) * self.mss)
    }

    pub(super) fn ssthresh(&self) -> u32 {
        self.ssthresh
    }

    pub(super) fn in_recovery(&self) -> bool {
        self.recovery.is_some()
    }

    /// An ACK for new data (`acked` bytes, now acknowledged up to `ack`;
    /// `flight_before` bytes were outstanding). `Retransmit` for a partial
    /// ACK in fast recovery.
    pub(super) fn on_new_ack(&mut self, ack: Seq, acked: u32, flight_before: u32) -> AckAction {
        self.duplicate_acks = 0;
        if let Some(recover) = self.recovery {
            if ack.gt(recover) {
                // RFC 6582 §3.2 step 3, full ACK: deflate to
                // min(ssthresh, max(FlightSize, SMSS) + SMSS).
                let flight = flight_before.saturating_sub(acked);
                self.cwnd = self.ssthresh.min(flight.max(self.mss) + self.mss);
                self.recovery = None;
                return AckAction::None;
            }
            // Step 5, partial ACK: retransmit the next hole, deflate by the
            // amount acknowledged, add back one SMSS if that was ≥ SMSS.
            self.cwnd = self.cwnd.saturating_sub(acked);
            if acked >= self.mss {
                self.cwnd += self.mss;
            }
            self.cwnd = self.cwnd.max(self.mss);
            return AckAction::Retransmit;
        }
        if let Some(recover) = self.recover {
            if ack.gt(recover) {
                self.recover = None;
            }
        }
        if self.cwnd < self.ssthresh {
            // RFC 5681 §3.1 slow start (with RFC 3465's L = 1 SMSS).
            self.cwnd = self.cwnd.saturating_add(acked.min(self.mss));
        } else {
            // Congestion avoidance: one SMSS per window's worth of ACKs.
            self.acked_in_avoidance += acked;
            if self.acked_in_avoidance >= self.cwnd {
                self.acked_in_avoidance -= self.cwnd;
                self.cwnd = self.cwnd.saturating_add(self.mss);
            }
        }
        AckAction::None
    }

    /// Takes the "first partial ACK" token (RFC 6582 §3.2 step 5).
    pub(super) fn take_first_partial(&mut self) -> bool {
        std::mem::take(&mut self.first_partial)
    }

    /// A duplicate ACK as RFC 5681 §2 defines it. `highest_sent` is the
    /// highest sequence number sent so far, `flight` the bytes outstanding.
    pub(super) fn on_duplicate_ack(
        &mut self,
        highest_sent: Seq,
        flight: u32,
        ack: Seq,
    ) -> AckAction {
        if self.recovery.is_some() {
            // RFC 5681 §3.2 step 4: inflate for each segment that left.
            self.cwnd = self.cwnd.saturating_add(self.mss);
            return AckAction::None;
        }
        self.duplicate_acks += 1;
        if self.duplicate_acks != 3 {
            return AckAction::None;
        }
        // RFC 6582 §3.2 step 2 (careful variant): no new recovery for
        // duplicates of data sent before the last timeout's retransmissions.
        if self.recover.is_some_and(|recover| ack.le(recover)) {
            return AckAction::None;
        }
        self.ssthresh = (flight / 2).max(2 * self.mss);
        self.cwnd = self.ssthresh + 3 * self.mss;
        self.recovery = Some(highest_sent - 1u32);
        self.first_partial = true;
        AckAction::Retransmit
    }

    /// A duplicate ACK on a SACK connection: counted (for limited
    /// transmit and DupThresh); RFC 6675 recovery decides the rest.
    pub(super) fn count_duplicate_ack(&mut self) {
        self.duplicate_acks = self.duplicate_acks.saturating_add(1);
    }

    pub(super) fn duplicate_acks(&self) -> u32 {
        self.duplicate_acks
    }

    /// Whether loss recovery may start with the cumulative ACK at `ack`:
    /// not for data sent before the last timeout (RFC 6582 §4.1, RFC 6675
    /// §5.1).
    pub(super) fn may_recover(&self, ack: Seq) -> bool {
        !self.recover.is_some_and(|recover| ack.le(recover))
    }

    /// RFC 6675 §5 step (4.2): ssthresh = cwnd = FlightSize / 2 (RFC 5681
    /// eq. 4), and no inflation: pipe, not cwnd, tracks what left.
    pub(super) fn enter_sack_recovery(&mut self, flight: u32) {
        self.ssthresh = (flight / 2).max(2 * self.mss);
        self.cwnd = self.ssthresh;
        self.duplicate_acks = 0;
        self.acked_in_avoidance = 0;
    }

    /// An ACK of new data inside a SACK recovery episode: cwnd unchanged.
    pub(super) fn on_ack_in_sack_recovery(&mut self) {
        self.duplicate_acks = 0;
    }

    /// The episode ended (RecoveryPoint acknowledged): congestion
    /// avoidance from ssthresh.
    pub(super) fn exit_sack_recovery(&mut self) {
        self.cwnd = self.ssthresh;
        self.duplicate_acks = 0;
    }

    /// RFC 5681 §3.1 eq. 4 after a retransmission timeout: ssthresh to half
    /// the flight, cwnd to the loss window of one segment.
    pub(super) fn on_timeout(&mut self, highest_sent: Seq, flight: u32) {
        self.ssthresh = (flight / 2).max(2 * self.mss);
        self.cwnd = self.mss;
        self.duplicate_acks = 0;
        self.recovery = None;
        self.recover = Some(highest_sent - 1u32);
        self.acked_in_avoidance = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_start_fast_recovery_and_timeout() {
        let mut cc = NewReno::new(1000);
        assert_eq!(cc.window(), 10_000);
        assert_eq!(cc.on_new_ack(Seq(1000), 1000, 10_000), AckAction::None);
        assert_eq!(cc.window(), 11_000);
        let highest = Seq(21_000);
        for _ in 0..2 {
            assert_eq!(
                cc.on_duplicate_ack(highest, 20_000, Seq(1000)),
                AckAction::None
            );
        }
        assert_eq!(
            cc.on_duplicate_ack(highest, 20_000, Seq(1000)),
            AckAction::Retransmit
        );
        assert_eq!((cc.ssthresh(), cc.window()), (10_000, 13_000));
        cc.on_duplicate_ack(highest, 20_000, Seq(1000));
        assert_eq!(cc.window(), 14_000);
        // A partial ACK retransmits and deflates.
        assert_eq!(
            cc.on_new_ack(Seq(5000), 4000, 20_000),
            AckAction::Retransmit
        );
        assert_eq!(cc.window(), 11_000);
        assert!(cc.in_recovery());
        // The full ACK ends recovery.
        assert_eq!(cc.on_new_ack(Seq(21_000), 16_000, 16_000), AckAction::None);
        assert!(!cc.in_recovery());
        assert_eq!(cc.window(), 1000 + 1000);
        cc.on_timeout(Seq(30_000), 8000);
        assert_eq!((cc.ssthresh(), cc.window()), (4000, 1000));
        // Duplicates of what was sent before the timeout start no recovery.
        for _ in 0..3 {
            assert_eq!(
                cc.on_duplicate_ack(Seq(30_000), 8000, Seq(22_000)),
                AckAction::None
            );
        }
    }
}
