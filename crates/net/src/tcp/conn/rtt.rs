//! The retransmission timeout (RFC 6298): a smoothed RTT and its variation
//! from samples taken under Karn's rule, doubled on each expiry.

use crate::tcp::{Instant, Seq};
use std::time::Duration;

/// RFC 6298 §2: the clock granularity G; ours counts nanoseconds, so the
/// floor that matters is `rto_min`.
const GRANULARITY: Duration = Duration::from_micros(1);

#[derive(Debug)]
pub(super) struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    /// The current RTO, back-off included.
    rto: Duration,
    min: Duration,
    max: Duration,
    /// The segment being timed: the sequence number that acknowledges it and
    /// when it was sent. Karn's rule (RFC 6298 §3): cleared when anything is
    /// retransmitted, so no sample comes from an ambiguous ACK.
    timed: Option<(Seq, Instant)>,
}

impl RttEstimator {
    pub(super) fn new(initial: Duration, min: Duration, max: Duration) -> RttEstimator {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            rto: initial.clamp(min, max),
            min,
            max,
            timed: None,
        }
    }

    pub(super) fn rto(&self) -> Duration {
        self.rto
    }

    pub(super) fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// Starts timing a segment of new data whose ACK is `end`, unless one is
    /// being timed already (one sample per round trip, RFC 6298 §3).
    pub(super) fn on_send(&mut self, end: Seq, now: Instant) {
        if self.timed.is_none() {
            self.timed = Some((end, now));
        }
    }

    /// Karn's rule: a retransmission makes the pending sample ambiguous.
    pub(super) fn on_retransmit(&mut self) {
        self.timed = None;
    }

    /// A cumulative ACK arrived: take a sample when it covers the timed
    /// segment (RFC 6298 §2.2 and §2.3).
    pub(super) fn on_ack(&mut self, ack: Seq, now: Instant) {
        let Some((end, sent)) = self.timed else {
            return;
        };
        if ack.lt(end) {
            return;
        }
        self.timed = None;
        let sample = now.saturating_since(sent);
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(sample);
                self.rttvar = self.rttvar * 3 / 4 + delta / 4;
                self.srtt = Some(srtt * 7 / 8 + sample / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(sample);
        self.rto = (srtt + GRANULARITY.max(self.rttvar * 4)).clamp(self.min, self.max);
    }

    /// RFC 6298 §5.5: the timer expired, double the RTO (up to the maximum).
    pub(super) fn back_off(&mut self) {
        self.rto = (self.rto * 2).min(self.max);
        self.timed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn samples_back_off_and_karn() {
        let mut rtt = RttEstimator::new(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(60),
        );
        assert_eq!(rtt.rto(), Duration::from_secs(1));
        rtt.on_send(Seq(100), Instant(0));
        rtt.on_send(Seq(200), Instant(10 * MS)); // ignored: one at a time
        rtt.on_ack(Seq(100), Instant(100 * MS));
        // srtt 100 ms, rttvar 50 ms: 100 + 200 = 300 ms.
        assert_eq!(rtt.rto(), Duration::from_millis(300));
        rtt.back_off();
        assert_eq!(rtt.rto(), Duration::from_millis(600));
        rtt.on_send(Seq(300), Instant(200 * MS));
        rtt.on_retransmit();
        rtt.on_ack(Seq(300), Instant(900 * MS));
        assert_eq!(rtt.rto(), Duration::from_millis(600), "Karn: no sample");
        rtt.on_send(Seq(400), Instant(1000 * MS));
        rtt.on_ack(Seq(400), Instant(1100 * MS));
        // rttvar 3/4·50 + 0 = 37.5 ms; srtt 100 ms: 250 ms.
        assert_eq!(rtt.rto(), Duration::from_millis(250));
        for _ in 0..20 {
            rtt.back_off();
        }
        assert_eq!(rtt.rto(), Duration::from_secs(60));
    }
}
