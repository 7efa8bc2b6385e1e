//! Segment arrival: RFC 9293 §3.10.7.3 (SYN-SENT) and §3.10.7.4 (the other
//! states), with RFC 5961's stricter RST (§3), SYN (§4) and ACK (§5) checks.

use super::congestion::AckAction;
use super::loss_recovery::{self, SackRecovery};
use super::{Connection, State, TcpError};
use crate::tcp::{Instant, Segment, Seq};

/// RFC 9293 §3.10.7.4 first: the four cases of the acceptability test.
fn acceptable(seq: Seq, len: u32, rcv_nxt: Seq, rcv_wnd: u32) -> bool {
    let edge = rcv_nxt + rcv_wnd;
    match (len, rcv_wnd) {
        (0, 0) => seq == rcv_nxt,
        (0, _) => seq.in_range(rcv_nxt, edge),
        (_, 0) => false,
        (_, _) => seq.in_range(rcv_nxt, edge) || (seq + (len - 1)).in_range(rcv_nxt, edge),
    }
}

/// `<SEQ=ack><CTL=RST>`: the reply to an ACK of something never sent.
fn reset_at(ack: Seq) -> Segment<'static> {
    let mut rst = Segment::new(ack);
    rst.flags.rst = true;
    rst
}

impl Connection {
    /// Processes one received segment (RFC 9293 §3.10.7).
    pub fn on_segment(&mut self, segment: &Segment<'_>, now: Instant) {
        self.stats.segments_in += 1;
        match self.state {
            State::Closed => {
                // §3.10.7.1: as if no connection existed.
                self.stats.dropped += 1;
                self.pending_rst = super::reset_for(segment);
            }
            State::SynSent => {
                self.keepalive.heard(now);
                self.on_syn_sent(segment, now);
            }
            _ => {
                // Anything from the peer answers keep-alive probes.
                self.keepalive.heard(now);
                self.on_synchronized(segment, now);
            }
        }
        self.update_timers(now);
    }

    /// RFC 9293 §3.10.7.3.
    fn on_syn_sent(&mut self, seg: &Segment<'_>, now: Instant) {
        // First: an ACK must acknowledge our SYN and nothing else.
        if let Some(ack) = seg.ack {
            if ack.le(self.iss) || ack.gt(self.snd_max) {
                self.stats.dropped += 1;
                if !seg.flags.rst {
                    self.pending_rst = Some(reset_at(ack));
                }
                return;
            }
        }
        // Second: a RST counts only with an acceptable ACK.
        if seg.flags.rst {
            if seg.ack.is_some() {
                self.fail(TcpError::Refused);
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        // Fourth: neither SYN nor RST: drop.
        if !seg.flags.syn {
            self.stats.dropped += 1;
            return;
        }
        self.irs = seg.seq;
        self.rcv_nxt = seg.seq + 1u32;
        self.rcv_adv = self.rcv_nxt;
        self.take_syn_options(seg, now);
        match seg.ack {
            Some(ack) => {
                // Our SYN is acknowledged: ESTABLISHED, ACK it; data and FIN
                // on the SYN-ACK are processed as in ESTABLISHED (sixth step).
                self.snd_una = ack;
                self.snd_nxt = self.snd_nxt.max(ack);
                self.snd_wl2 = ack;
                self.rtt.on_ack(ack, now);
                self.retries = 0;
                self.rto_at = None;
                self.establish();
                self.ack_now = true;
                self.process_text(seg.seq + 1u32, seg.payload, seg.flags.fin, now);
            }
            None => {
                // Simultaneous open (§3.5, Figure 7): SYN-RECEIVED, and our
                // SYN goes out again as a SYN-ACK. Data on the SYN is not
                // kept: the peer sends it again.
                self.state = State::SynReceived;
                self.snd_nxt = self.iss;
            }
        }
    }

    fn establish(&mut self) {
        self.state = if self.fin_queued {
            State::FinWait1
        } else {
            State::Established
        };
        self.events.connected = true;
        self.events.writable = true;
    }

    /// RFC 9293 §3.10.7.4, for SYN-RECEIVED and every synchronized state.
    fn on_synchronized(&mut self, seg: &Segment<'_>, now: Instant) {
        if seg.flags.rst {
            self.on_rst(seg, now);
            return;
        }
        if seg.flags.syn {
            if self.state == State::SynReceived && seg.seq == self.irs {
                match seg.ack {
                    None => {
                        // The peer's SYN again: our SYN-ACK was lost; resend it.
                        self.stats.duplicate_segments += 1;
                        self.snd_nxt = self.iss;
                        return;
                    }
                    Some(ack) if ack.gt(self.snd_una) && ack.le(self.snd_max) => {
                        // Simultaneous open: the peer's SYN-ACK acknowledges
                        // ours; its SYN is known already, the rest goes on.
                        let mut rest = *seg;
                        rest.flags.syn = false;
                        rest.seq = seg.seq + 1u32;
                        self.on_synchronized_data(&rest, now);
                        return;
                    }
                    Some(ack) => {
                        self.stats.dropped += 1;
                        self.pending_rst = Some(reset_at(ack));
                        return;
                    }
                }
            }
            // RFC 5961 §4.2: a SYN in a synchronized state, whatever its
            // sequence number, gets a challenge ACK (a peer that really
            // restarted answers it with a RST at RCV.NXT).
            self.challenge_ack(now);
            return;
        }
        self.on_synchronized_data(seg, now);
    }

    /// RFC 9293 §3.10.7.4 second step with RFC 5961 §3.2: a RST resets only
    /// at exactly RCV.NXT; elsewhere in the window it gets a challenge ACK;
    /// outside it is dropped.
    fn on_rst(&mut self, seg: &Segment<'_>, now: Instant) {
        let window = self.receive_window();
        if seg.seq == self.rcv_nxt {
            match self.state {
                State::SynReceived if self.passive => self.fail(TcpError::Reset),
                State::SynReceived => self.fail(TcpError::Refused),
                State::Established | State::FinWait1 | State::FinWait2 | State::CloseWait => {
                    // RFC 9293 flushes the queues; Linux, which programs
                    // are written against, still hands the reader the bytes
                    // that arrived before the reset, then ECONNRESET.
                    self.fail(TcpError::Reset);
                }
                _ => self.enter_closed(),
            }
        } else if window > 0 && seg.seq.in_range(self.rcv_nxt, self.rcv_nxt + window) {
            self.challenge_ack(now);
        } else {
            self.stats.dropped += 1;
        }
    }

    /// Sends a challenge ACK if the rate limit allows; the segment that
    /// provoked it is dropped either way.
    fn challenge_ack(&mut self, now: Instant) {
        self.stats.dropped += 1;
        if self.challenge.allow(now) {
            self.stats.challenge_acks += 1;
            self.ack_now = true;
        }
    }

    /// §3.10.7.4 from the first step on, for a segment without SYN or RST.
    fn on_synchronized_data(&mut self, seg: &Segment<'_>, now: Instant) {
        if self.paws_rejects(seg, now) {
            return;
        }
        let mut payload = seg.payload;
        let mut fin = seg.flags.fin;
        let window = self.receive_window();
        let len = seg.seq_len() as u32;
        if !acceptable(seg.seq, len, self.rcv_nxt, window) {
            // First step: not acceptable: ACK (to resynchronize the peer)
            // and drop.
            if (seg.seq + len).le(self.rcv_nxt) {
                self.stats.duplicate_segments += 1;
            } else {
                self.stats.dropped += 1;
            }
            if self.state == State::TimeWait && fin {
                // Eighth step, TIME-WAIT: a retransmitted FIN restarts 2 MSL.
                self.time_wait_at = Some(now + self.config.time_wait);
            }
            self.ack_now = true;
            // With a zero window, valid ACKs still count (RFC 9293 §3.10.7.4:
            // "special allowance"), else a sender probing us would never
            // learn that its data was acknowledged.
            if !(window == 0 && seg.seq == self.rcv_nxt && seg.ack.is_some()) {
                return;
            }
            payload = &[];
            fin = false;
        }
        // RFC 7323 §4.3: TS.Recent follows the segment that the next ACK
        // acknowledges (SEG.SEQ <= Last.ACK.sent); a retransmission that
        // fills a hole is echoed, so the peer measures its round trip.
        if let Some(ts) = seg.timestamp.filter(|_| self.ts_enabled) {
            if seg.seq.le(self.last_ack_sent) {
                self.ts_recent.update(ts.value, now);
            }
        }
        // Fifth step: no ACK, drop.
        let Some(ack) = seg.ack else {
            self.stats.dropped += 1;
            return;
        };
        if !self.process_ack(seg, ack, now) {
            return;
        }
        // Sixth (URG) is ignored; seventh and eighth: text and FIN.
        self.process_text(seg.seq, payload, fin, now);
    }

    /// RFC 7323 §5.3 R1 (PAWS), before the acceptability test: with
    /// timestamps on, a segment older than TS.Recent is dropped and
    /// answered with an ACK. RSTs are exempt (R1 leaves them to RFC 5961).
    fn paws_rejects(&mut self, seg: &Segment<'_>, now: Instant) -> bool {
        let Some(ts) = seg.timestamp.filter(|_| self.ts_enabled) else {
            return false;
        };
        if !self.ts_recent.rejects(ts.value, now) {
            return false;
        }
        self.stats.paws_drops += 1;
        self.stats.dropped += 1;
        self.ack_now = true;
        true
    }

    /// RFC 9293 §3.10.7.4 fifth step with RFC 5961 §5.2. Returns whether
    /// processing goes on with the segment's text.
    fn process_ack(&mut self, seg: &Segment<'_>, ack: Seq, now: Instant) -> bool {
        if self.state == State::SynReceived {
            if ack.gt(self.snd_una) && ack.le(self.snd_max) {
                self.snd_wnd = u32::from(seg.window) << self.snd_wscale;
                self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
                self.snd_wl1 = seg.seq;
                self.snd_wl2 = ack;
                self.establish();
            } else {
                // An ACK of something we never sent: <SEQ=SEG.ACK><CTL=RST>.
                self.stats.dropped += 1;
                self.pending_rst = Some(reset_at(ack));
                return false;
            }
        }
        if ack.gt(self.snd_max) {
            // An ACK of unsent data: send an ACK, drop (RFC 5961 §5.2 makes
            // it a rate-limited challenge ACK).
            self.challenge_ack(now);
            return false;
        }
        if ack.lt(self.snd_una - self.max_snd_wnd.max(1)) {
            // RFC 5961 §5.2: older than any window we could have had out.
            self.challenge_ack(now);
            return false;
        }
        let window = u32::from(seg.window) << self.snd_wscale;
        let newly_sacked = self.take_sack_blocks(seg, ack);
        let advanced = ack.gt(self.snd_una);
        if advanced {
            self.on_new_ack(ack, now);
        } else if self.sack_enabled {
            // RFC 6675 §2: with SACK, a duplicate ACK is one that SACKs
            // data not SACKed before, so forged or stale blocks count for
            // nothing; one without any blocks counts as RFC 5681 says (a
            // peer or middlebox that negotiated SACK and sends none still
            // gets fast retransmission). Recovery is decided below.
            if ack == self.snd_una
                && (newly_sacked > 0
                    || (seg.sack.is_empty() && self.is_classic_duplicate(seg, window)))
            {
                self.cc.count_duplicate_ack();
            }
        } else if ack == self.snd_una && self.is_classic_duplicate(seg, window) {
            let flight = self.snd_max.distance_from(self.snd_una);
            if self.cc.on_duplicate_ack(self.snd_max, flight, ack) == AckAction::Retransmit {
                self.stats.fast_retransmits += 1;
                self.retransmit_now = true;
            }
        }
        if self.sack_enabled {
            if advanced || newly_sacked > 0 {
                // News from the peer: a probe was answered; probe again
                // two round trips after this if nothing else comes.
                self.loss_probes_unanswered = 0;
                if self.snd_max != self.snd_una {
                    self.probe_timeout_at = Some(self.probe_timeout(now));
                }
            }
            self.sack_recovery_step(now);
        }
        // The peer is alive: probes answered.
        self.probes_unanswered = 0;
        // Window update, only from a segment newer than the last one used
        // (SND.WL1/SND.WL2).
        if self.snd_wl1.lt(seg.seq) || (self.snd_wl1 == seg.seq && self.snd_wl2.le(ack)) {
            if window > 0 {
                self.persist_backoff = 0;
            }
            self.snd_wnd = window;
            self.max_snd_wnd = self.max_snd_wnd.max(window);
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = ack;
        }
        // Our FIN acknowledged: the per-state transitions.
        if self.fin_acked() {
            match self.state {
                State::FinWait1 => self.state = State::FinWait2,
                State::Closing => self.enter_time_wait(now),
                State::LastAck => {
                    self.enter_closed();
                    return false;
                }
                _ => {}
            }
        }
        true
    }

    /// RFC 5681 §2's duplicate ACK, but for the acknowledgement number: no
    /// data, no FIN, the window unchanged and open (a zero window answers a
    /// refused zero-window probe, whose byte is all that is outstanding: a
    /// fast retransmission would go beyond the window), data outstanding.
    fn is_classic_duplicate(&self, seg: &Segment<'_>, window: u32) -> bool {
        seg.payload.is_empty()
            && !seg.flags.fin
            && window == self.snd_wnd
            && window > 0
            && self.snd_max != self.snd_una
    }

    /// RFC 2018: the segment's SACK blocks into the scoreboard, validated
    /// against SND.UNA (after this ACK) and SND.MAX. Returns the bytes
    /// newly SACKed.
    fn take_sack_blocks(&mut self, seg: &Segment<'_>, ack: Seq) -> u32 {
        if !self.sack_enabled || seg.sack.is_empty() {
            return 0;
        }
        let update = self
            .scoreboard
            .update(&seg.sack, ack.max(self.snd_una), self.snd_max);
        self.stats.sack_blocks_received += u64::from(update.accepted);
        self.stats.sack_blocks_ignored += u64::from(update.ignored);
        update.newly_sacked
    }

    /// RFC 6675 §5 after an ACK (or when a loss check is due): end the
    /// episode at RecoveryPoint, note segments lost by time and
    /// retransmissions lost again, or enter recovery when DupThresh
    /// duplicate ACKs came, IsLost(SND.UNA) holds or a segment is lost by
    /// time.
    pub(super) fn sack_recovery_step(&mut self, now: Instant) {
        let mss = self.full_payload_mss() as u32;
        let srtt = self.rtt.srtt().unwrap_or(self.rtt.rto());
        let wait = srtt + (srtt / 4).max(super::rack::MIN_REORDER_WINDOW);
        let detected = self
            .transmit_log
            .detect(&self.scoreboard, self.snd_una, now, wait);
        self.rack_at = detected.recheck_at;
        if let Some(recovery) = &mut self.sack_recovery {
            if recovery.is_over(self.snd_una) {
                self.sack_recovery = None;
                self.cc.exit_sack_recovery();
            } else {
                recovery.on_ack(&self.scoreboard, self.snd_una, mss);
                recovery.mark_lost(&detected.lost);
                return;
            }
        }
        if self.snd_max == self.snd_una || !self.can_send_data() {
            return;
        }
        let lost = self
            .scoreboard
            .lost_edge(loss_recovery::DUP_THRESH, mss)
            .is_some();
        let dup_acks = self.cc.duplicate_acks() >= loss_recovery::DUP_THRESH;
        // After a timeout, duplicate ACKs may be the answers to go-back-N's
        // needless retransmissions (RFC 6582 §4.1); SACKed data beyond a
        // hole, or a segment lost by time, is evidence of a loss either way.
        if lost || !detected.lost.is_empty() || (dup_acks && self.cc.may_recover(self.snd_una)) {
            let flight = self.snd_max.distance_from(self.snd_una);
            self.cc.enter_sack_recovery(flight);
            let mut recovery = SackRecovery::new(self.snd_una, self.snd_max);
            recovery.mark_lost(&detected.lost);
            self.sack_recovery = Some(recovery);
            self.stats.sack_recoveries += 1;
            self.stats.fast_retransmits += 1;
        }
    }

    /// SND.UNA advances: free the buffer, sample the RTT, grow the window,
    /// restart the retransmission timer (RFC 6298 §5.3).
    fn on_new_ack(&mut self, ack: Seq, now: Instant) {
        let flight_before = self.snd_max.distance_from(self.snd_una);
        // Data bytes only: the SYN and FIN grow no window.
        let acked = self.send.acknowledge(ack);
        if acked > 0 {
            self.events.writable = true;
        }
        self.snd_una = ack;
        // After a go-back-N or an accepted window probe, SND.NXT may lag.
        self.snd_nxt = self.snd_nxt.max(ack);
        self.rtt.on_ack(ack, now);
        self.retries = 0;
        self.scoreboard.acknowledge(ack);
        let action = if self.sack_recovery.is_some() {
            // RFC 6675: cwnd stays put during the episode; pipe decides.
            self.cc.on_ack_in_sack_recovery();
            AckAction::None
        } else {
            self.cc.on_new_ack(ack, acked as u32, flight_before)
        };
        let restart = match action {
            AckAction::Retransmit => {
                // RFC 6582 §3.2 step 5: a partial ACK; only the first one
                // restarts the timer.
                self.retransmit_now = true;
                self.cc.take_first_partial()
            }
            AckAction::None => true,
        };
        if self.snd_nxt == self.snd_una {
            self.rto_at = None;
        } else if restart || self.rto_at.is_none() {
            self.rto_at = Some(now + self.rtt.rto());
        }
    }

    /// RFC 9293 §3.10.7.4 seventh (text) and eighth (FIN), for a segment
    /// already found acceptable; `seq` is its first data byte's number.
    fn process_text(&mut self, seq: Seq, payload: &[u8], fin: bool, now: Instant) {
        if !matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        ) {
            // The peer's FIN came already: nothing more is taken; a FIN
            // retransmission is acknowledged again.
            if !payload.is_empty() || fin {
                self.ack_now = true;
            }
            return;
        }
        let (mut start, mut data, mut fin) = (seq, payload, fin);
        // Trim what was received already (a retransmission overlapping).
        if start.lt(self.rcv_nxt) {
            let skip = self.rcv_nxt.distance_from(start) as usize;
            if !data.is_empty() {
                self.stats.duplicate_segments += 1;
            }
            let skip_data = skip.min(data.len());
            data = &data[skip_data..];
            start += skip_data;
            if start.lt(self.rcv_nxt) {
                // The FIN itself lies before RCV.NXT: received already.
                fin = false;
                start = self.rcv_nxt;
            }
        }
        // Trim what lies beyond the window (and the FIN after it).
        let window = self.receive_window() as usize;
        let offset = start.distance_from(self.rcv_nxt) as usize;
        if offset + data.len() > window {
            data = &data[..window.saturating_sub(offset).min(data.len())];
            fin = false;
        }
        if self.app_closed && !data.is_empty() {
            // RFC 1122 §4.2.2.13: the application closed; nobody reads this.
            self.abort();
            return;
        }
        if start != self.rcv_nxt {
            // Out of order: hold it and ACK at once (RFC 5681 §4.2), which
            // the peer counts as a duplicate ACK.
            self.stats.out_of_order_segments += 1;
            self.sack_report.note(start);
            if !data.is_empty() {
                self.recv.insert_out_of_order(self.rcv_nxt, start, data);
            }
            if fin {
                self.recv.set_fin(start + data.len());
            }
            self.ack_now = true;
            return;
        }
        let mut fin_in_order = fin;
        if !data.is_empty() {
            let filled_gap = self.recv.held() > 0;
            self.recv.push_in_order(data);
            let (rcv_nxt, held_fin) = self.recv.advance(self.rcv_nxt + data.len());
            self.rcv_nxt = rcv_nxt;
            fin_in_order |= held_fin;
            self.events.readable = true;
            self.segments_unacked += 1;
            // RFC 5681 §4.2: ACK a segment that fills a gap at once, and at
            // least every second segment; else within the delayed-ACK time.
            match self.config.delayed_ack {
                Some(delay) if !filled_gap && self.segments_unacked < 2 => {
                    if self.ack_at.is_none() {
                        self.ack_at = Some(now + delay);
                    }
                }
                _ => self.ack_now = true,
            }
        }
        if fin_in_order {
            self.receive_fin(now);
        }
    }

    /// RFC 9293 §3.10.7.4 eighth step: the peer's FIN, in order.
    fn receive_fin(&mut self, now: Instant) {
        self.rcv_nxt += 1u32;
        self.fin_received = true;
        self.events.readable = true;
        self.ack_now = true;
        match self.state {
            State::Established => self.state = State::CloseWait,
            State::FinWait1 if self.fin_acked() => self.enter_time_wait(now),
            State::FinWait1 => self.state = State::Closing,
            State::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.time_wait_at = Some(now + self.config.time_wait);
        self.rto_at = None;
        self.persist_at = None;
    }
}
