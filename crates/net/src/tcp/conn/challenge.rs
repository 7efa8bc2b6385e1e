//! RFC 5961 challenge ACKs (§3.2 for an in-window RST that is not exactly
//! at RCV.NXT, §4.2 for a SYN in a synchronized state, §5.2 for an ACK
//! outside the acceptable range) and their rate limit (§7).
//!
//! The limit is per connection: at most [`PER_SECOND`] challenge ACKs in
//! any one-second interval. RFC 5961 suggests a limit without a value;
//! a per-connection one (unlike Linux's old host-wide counter, CVE-2016-5696)
//! reveals nothing about other connections to an off-path attacker.

use crate::tcp::Instant;
use std::time::Duration;

pub(super) const PER_SECOND: u32 = 10;
const INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(super) struct ChallengeLimiter {
    interval_start: Option<Instant>,
    sent: u32,
}

impl ChallengeLimiter {
    /// Whether a challenge ACK may go out at `now` (counts it if so).
    pub(super) fn allow(&mut self, now: Instant) -> bool {
        match self.interval_start {
            Some(start) if now.saturating_since(start) < INTERVAL => {}
            _ => {
                self.interval_start = Some(now);
                self.sent = 0;
            }
        }
        if self.sent < PER_SECOND {
            self.sent += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_per_second() {
        let mut limiter = ChallengeLimiter::default();
        let t0 = Instant::from_nanos(5);
        assert_eq!((0..20).filter(|_| limiter.allow(t0)).count(), 10);
        assert!(!limiter.allow(t0 + Duration::from_millis(999)));
        assert!(limiter.allow(t0 + Duration::from_secs(1)));
    }
}
