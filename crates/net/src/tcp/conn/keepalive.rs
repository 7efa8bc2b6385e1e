//! Keep-alive (RFC 1122 §4.2.3.6, as Linux does it): after `idle` with
//! nothing received and nothing outstanding, a probe every `interval`: a
//! segment at SND.UNA − 1 without data, which the peer must answer with an
//! ACK (it lies left of its window). After `count` unanswered probes the
//! connection ends with `TimedOut` (ETIMEDOUT). Off by default, as on Linux.

use crate::tcp::Instant;
use std::time::Duration;

/// Keep-alive settings: Linux's `SO_KEEPALIVE` with `TCP_KEEPIDLE`,
/// `TCP_KEEPINTVL` and `TCP_KEEPCNT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Quiet time before the first probe.
    pub idle: Duration,
    /// Time between unanswered probes.
    pub interval: Duration,
    /// Unanswered probes before the connection gives up.
    pub count: u32,
}

/// What the keep-alive timer asks for when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeepAliveAction {
    None,
    Probe,
    GiveUp,
}

#[derive(Debug, Default)]
pub(super) struct KeepAliveTimer {
    settings: Option<KeepAlive>,
    /// The last time the peer was heard from (or the connection was busy).
    quiet_since: Instant,
    probes_unanswered: u32,
    last_probe: Instant,
}

impl KeepAliveTimer {
    pub(super) fn set(&mut self, settings: Option<KeepAlive>, now: Instant) {
        self.settings = settings;
        self.quiet_since = self.quiet_since.max(now);
        self.probes_unanswered = 0;
    }

    pub(super) fn settings(&self) -> Option<KeepAlive> {
        self.settings
    }

    /// Any segment from the peer answers the probes.
    pub(super) fn heard(&mut self, now: Instant) {
        self.quiet_since = now;
        self.probes_unanswered = 0;
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        let k = self.settings?;
        Some(match self.probes_unanswered {
            0 => self.quiet_since + k.idle,
            _ => self.last_probe + k.interval,
        })
    }

    /// The deadline passed. `busy`: data is outstanding or queued, which
    /// the retransmission and persist timers watch instead (the idle time
    /// starts over, as Linux does).
    pub(super) fn on_due(&mut self, now: Instant, busy: bool) -> KeepAliveAction {
        let Some(k) = self.settings else {
            return KeepAliveAction::None;
        };
        if busy {
            self.heard(now);
            return KeepAliveAction::None;
        }
        if self.probes_unanswered >= k.count {
            return KeepAliveAction::GiveUp;
        }
        self.probes_unanswered += 1;
        self.last_probe = now;
        KeepAliveAction::Probe
    }
}
