//! What to send next: the SYN or SYN-ACK, a retransmission, a zero-window
//! probe, new data within min(peer window, cwnd) with Nagle and sender-side
//! silly-window avoidance, the FIN, or a lone ACK.

use super::{Connection, State};
use crate::tcp::segment::Flags;
use crate::tcp::{Instant, Segment, Seq};

/// One segment to build.
#[derive(Debug, Clone, Copy)]
struct Plan {
    seq: Seq,
    len: usize,
    syn: bool,
    fin: bool,
    /// A zero-window probe: sent beyond the window, SND.NXT does not move.
    probe: bool,
}

impl Plan {
    /// Cut to at most `limit(seq)` payload bytes (never below one); a cut
    /// segment leaves its FIN to the next.
    fn limited(self, limit: impl Fn(Seq) -> usize) -> Plan {
        if self.len == 0 {
            return self;
        }
        let most = limit(self.seq).max(1);
        if self.len <= most {
            return self;
        }
        Plan {
            len: most,
            fin: false,
            ..self
        }
    }

    fn ack_only(seq: Seq) -> Plan {
        Plan {
            seq,
            len: 0,
            syn: false,
            fin: false,
            probe: false,
        }
    }
}

impl Connection {
    /// The next segment to send now, if any; call until `None`. The payload
    /// borrows the send buffer.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Segment<'_>> {
        self.poll_transmit_within(now, |_| usize::MAX)
    }

    /// As [`Connection::poll_transmit`], with a data segment starting at
    /// sequence number `seq` carrying at most `limit(seq)` bytes (at least
    /// one): for a sender whose payload must stay within boundaries of its
    /// own, such as the protected netstack's gather lists. The windows, Nagle
    /// and silly-window avoidance decide as without the limit; the limit only
    /// cuts the segment they chose, and the rest follows in the next.
    pub fn poll_transmit_within(
        &mut self,
        now: Instant,
        limit: impl Fn(Seq) -> usize,
    ) -> Option<Segment<'_>> {
        if let Some(rst) = self.pending_rst.take() {
            self.stats.segments_out += 1;
            return Some(rst);
        }
        if std::mem::take(&mut self.window_update_later) {
            if let Some(delay) = self.config.delayed_ack {
                self.ack_at.get_or_insert(now + delay);
            }
        }
        let Some(plan) = self.plan().map(|p| p.limited(&limit)) else {
            // Data queued since the last call may need the persist timer.
            self.update_timers(now);
            return None;
        };
        Some(self.emit(plan, now))
    }

    fn plan(&mut self) -> Option<Plan> {
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived if self.snd_nxt == self.iss => {
                return Some(Plan {
                    syn: true,
                    ..Plan::ack_only(self.iss)
                });
            }
            State::SynSent => return None,
            _ => {}
        }
        if std::mem::take(&mut self.keepalive_probe_now) && self.is_synchronized() {
            // As Linux's: SND.UNA − 1 and no data, left of the peer's
            // window, so the peer must answer with an ACK.
            self.stats.keepalive_probes += 1;
            return Some(Plan::ack_only(self.snd_una - 1u32));
        }
        if self.can_send_data() {
            if let Some(plan) = self.plan_data() {
                return Some(plan);
            }
        }
        // A lone ACK carries the highest number sent: after a go-back-N
        // SND.NXT lies behind what the peer already received, and a
        // sequence number left of its window would make it drop the ACK;
        // but not past the window's right edge, where a refused zero-window
        // probe leaves SND.MAX, for the same reason.
        self.ack_now.then(|| Plan::ack_only(self.unoccupied_seq()))
    }

    fn plan_data(&mut self) -> Option<Plan> {
        let mss = self.payload_mss();
        let fin_seq = self.fin_seq();
        // Fast retransmit (RFC 5681 §3.2 step 2) or a partial ACK's
        // retransmission (RFC 6582 §3.2 step 5): the first unacknowledged
        // segment, whatever the windows say.
        if std::mem::take(&mut self.retransmit_now) && self.snd_una != self.snd_max {
            let len = self
                .send
                .available_from(self.snd_una)
                .min(mss)
                .min(self.unsacked_run(self.snd_una));
            let fin = fin_seq == Some(self.snd_una + len);
            if len > 0 || fin {
                return Some(Plan {
                    len,
                    fin,
                    ..Plan::ack_only(self.snd_una)
                });
            }
        }
        if std::mem::take(&mut self.loss_probe_now) {
            if let Some(plan) = self.plan_loss_probe(mss) {
                self.stats.loss_probes += 1;
                self.loss_probes_unanswered += 1;
                // The next probe, if this one gets no answer either, waits
                // twice as long (set after the segment is built).
                self.probe_timeout_at = None;
                return Some(plan);
            }
        }
        // RFC 9293 §3.8.6.1: the persist timer fired, one byte beyond the
        // zero window.
        if std::mem::take(&mut self.probe_now) && self.send.available_from(self.snd_nxt) > 0 {
            self.stats.zero_window_probes += 1;
            return Some(Plan {
                len: 1,
                probe: true,
                ..Plan::ack_only(self.snd_nxt)
            });
        }
        let recovery_room = match self.sack_recovery.is_some() {
            true => match self.plan_sack_recovery(mss) {
                Ok(plan) => return plan,
                Err(room) => Some(room),
            },
            false => None,
        };
        self.skip_sacked();
        let in_flight = self.snd_nxt.distance_from(self.snd_una);
        let usable = match recovery_room {
            // In recovery, pipe stands for the flight (RFC 6675 §5).
            Some(room) => self.snd_wnd.saturating_sub(in_flight).min(room),
            None => {
                let window = self.snd_wnd.min(self.cc.send_window());
                window.saturating_sub(in_flight)
            }
        } as usize;
        let available = self.send.available_from(self.snd_nxt);
        let len = available
            .min(mss)
            .min(usable)
            .min(self.unsacked_run(self.snd_nxt));
        let fin = fin_seq == Some(self.snd_nxt + len) && len == available;
        if len == 0 && !fin {
            // NextSeg rule 3: nothing new may go; a hole below the highest
            // SACKed byte may.
            return recovery_room.and_then(|_| self.plan_rescue(mss));
        }
        if len < mss && !fin {
            if len < available {
                // Sender SWS avoidance (RFC 9293 §3.8.6.2.1): a window too
                // small for a full segment is used only when nothing is in
                // flight or it is half the largest window the peer offered.
                if in_flight > 0 && (len as u32) < self.max_snd_wnd / 2 {
                    return None;
                }
            } else if !self.config.nodelay && in_flight > 0 {
                // Nagle (RFC 9293 §3.7.4): at most one small segment
                // unacknowledged.
                return None;
            }
        }
        Some(Plan {
            len,
            fin,
            ..Plan::ack_only(self.snd_nxt)
        })
    }

    /// RFC 6675 §5 (C): while cwnd − pipe ≥ 1 SMSS, NextSeg's rule 1 (a
    /// lost hole, a retransmission lost again first). `Ok`: the decision
    /// (a retransmission, or nothing: no room); `Err(room)`: new data may
    /// use `room` bytes of the congestion window (rule 2).
    fn plan_sack_recovery(&mut self, mss: usize) -> Result<Option<Plan>, u32> {
        let recovery = self.sack_recovery.as_ref().expect("in recovery");
        let full = self.full_payload_mss() as u32;
        let lost_edge = self
            .scoreboard
            .lost_edge(super::loss_recovery::DUP_THRESH, full);
        let pipe = recovery.pipe(&self.scoreboard, self.snd_una, self.snd_max, lost_edge);
        let room = self.cc.window().saturating_sub(pipe);
        if room < full {
            return Ok(None);
        }
        if let Some(hole) = recovery.next_lost(&self.scoreboard, self.snd_una, lost_edge) {
            if let Some(plan) = self.hole_plan(hole, mss) {
                return Ok(Some(plan));
            }
        }
        Err(room)
    }

    /// NextSeg rule 3 (RFC 6675 §4): the first unSACKed hole above HighRxt
    /// below the highest SACKed byte, lost or not.
    fn plan_rescue(&mut self, mss: usize) -> Option<Plan> {
        let recovery = self.sack_recovery.as_ref()?;
        let hole = recovery.next_rescue(&self.scoreboard, self.snd_una)?;
        self.hole_plan(hole, mss)
    }

    /// RFC 8985 §7.3's tail loss probe: a new segment if the peer's window
    /// has room (whatever cwnd says), else the last segment sent again,
    /// so that the peer's answer (SACK blocks) shows what was lost without
    /// waiting for the retransmission timer.
    fn plan_loss_probe(&mut self, mss: usize) -> Option<Plan> {
        let in_flight = self.snd_max.distance_from(self.snd_una);
        let room = self.snd_wnd.saturating_sub(in_flight) as usize;
        let available = self.send.available_from(self.snd_max);
        if self.snd_nxt == self.snd_max && available > 0 && room > 0 {
            let len = available.min(mss).min(room);
            return Some(Plan {
                len,
                ..Plan::ack_only(self.snd_max)
            });
        }
        if self.fin_seq().is_some() {
            // The FIN's own retransmission is the timer's business.
            return None;
        }
        let len = (in_flight as usize).min(mss);
        let start = self.snd_max - len;
        (len > 0 && self.send.available_from(start) >= len).then(|| Plan {
            len,
            ..Plan::ack_only(start)
        })
    }

    /// One segment from the start of the unSACKed `hole`.
    fn hole_plan(&self, (start, end): (Seq, Seq), mss: usize) -> Option<Plan> {
        let hole = end.distance_from(start) as usize;
        let len = self.send.available_from(start).min(mss).min(hole);
        let fin = self.fin_seq() == Some(start + len) && len < hole;
        (len > 0 || fin).then_some(Plan {
            len,
            fin,
            ..Plan::ack_only(start)
        })
    }

    /// After a timeout's go-back-N, SND.NXT steps over data the peer
    /// SACKed (RFC 6675 §5.1: the scoreboard is kept).
    fn skip_sacked(&mut self) {
        while self.snd_nxt.lt(self.snd_max) {
            match self.scoreboard.range_at(self.snd_nxt) {
                Some((_, end)) => self.snd_nxt = end.min(self.snd_max),
                None => break,
            }
        }
    }

    /// Bytes from `seq` up to the next SACKed range (no limit without one):
    /// a retransmission never carries data the peer SACKed.
    fn unsacked_run(&self, seq: Seq) -> usize {
        if seq.ge(self.snd_max) {
            return usize::MAX;
        }
        self.scoreboard
            .next_range_after(seq)
            .map_or(usize::MAX, |(left, _)| left.distance_from(seq) as usize)
    }

    /// Builds the planned segment and does the sender's bookkeeping.
    fn emit(&mut self, plan: Plan, now: Instant) -> Segment<'_> {
        let Plan {
            seq,
            len,
            syn,
            fin,
            probe,
        } = plan;
        let end = seq + len + usize::from(syn) + usize::from(fin);
        let occupies = end != seq;
        self.stats.segments_out += 1;
        if occupies && !probe {
            if seq.lt(self.snd_max) {
                // Karn's rule: no RTT sample across a retransmission.
                self.stats.retransmissions += 1;
                self.rtt.on_retransmit();
                if let Some(recovery) = &mut self.sack_recovery {
                    recovery.on_retransmit(seq, end, self.snd_max);
                    self.stats.sack_retransmissions += 1;
                } else if !self.scoreboard.is_empty() {
                    self.stats.sack_retransmissions += 1;
                }
            } else {
                self.rtt.on_send(end, now);
            }
            self.snd_nxt = self.snd_nxt.max(end);
            if self.rto_at.is_none() {
                // RFC 6298 §5.1.
                self.rto_at = Some(now + self.rtt.rto());
            }
        }
        self.snd_max = self.snd_max.max(end);
        if self.sack_enabled && len > 0 && !probe {
            self.transmit_log.on_send(seq, seq + len, now);
            // RFC 8985 §7.2: (re)start the loss probe timer after sending
            // new data (or a probe), while probes are left.
            let new_data = !seq.lt(self.snd_max - len);
            if (new_data || self.loss_probes_unanswered > 0)
                && self.loss_probes_unanswered < super::MAX_LOSS_PROBES
            {
                self.probe_timeout_at = Some(self.probe_timeout(now));
            }
        }

        // Every segment but the first SYN carries an ACK (RFC 9293 §3.10.7).
        let ack = (self.state != State::SynSent).then_some(self.rcv_nxt);
        let sack = match ack {
            Some(_) => self.sack_blocks_to_send(),
            None => crate::tcp::SackBlocks::NONE,
        };
        self.stats.sack_blocks_sent += sack.len() as u64;
        if let Some(ack) = ack {
            self.last_ack_sent = ack;
            self.ack_now = false;
            self.ack_at = None;
            self.segments_unacked = 0;
        }
        let window = if syn {
            // RFC 7323 §2.2: the window in a SYN is never scaled.
            self.advertisable_window().min(u32::from(u16::MAX))
        } else {
            (self.window_to_advertise() >> self.rcv_wscale).min(u32::from(u16::MAX))
        };
        let advertised = if syn {
            window
        } else {
            window << self.rcv_wscale
        };
        self.rcv_adv = self.rcv_adv.max(self.rcv_nxt + advertised);

        let mut segment = Segment::new(seq);
        segment.ack = ack;
        segment.flags = Flags {
            syn,
            fin,
            rst: false,
            psh: len > 0 && seq + len == self.send.end(),
        };
        segment.window = window as u16;
        segment.sack = sack;
        if self.ts_enabled {
            // Our clock in milliseconds (RFC 7323 §5.4: 1 ms to 1 s a
            // tick), never going back.
            let clock = (now.as_nanos() / 1_000_000) as u32;
            if Seq(clock).gt(Seq(self.ts_sent)) {
                self.ts_sent = clock;
            }
            segment.timestamp = Some(crate::tcp::Timestamp {
                value: self.ts_sent,
                echo: self.ts_recent.value(),
            });
        }
        if syn {
            segment.mss = Some(self.config.mss);
            // RFC 2018 §2: offered on our SYN when configured; on a
            // SYN-ACK only when the peer's SYN offered it too.
            segment.sack_permitted = match self.state {
                State::SynSent => self.config.sack,
                _ => self.sack_enabled,
            };
            // RFC 7323 §2.2: offered on our SYN; on a SYN-ACK only when the
            // peer's SYN offered it.
            if self.state == State::SynSent || self.peer_window_scale {
                segment.window_scale = Some(self.rcv_wscale);
            }
        }
        self.update_timers(now);
        if len > 0 {
            segment.payload = self.send.slice(seq, len);
        }
        segment
    }
}
