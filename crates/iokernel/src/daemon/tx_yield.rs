//! iokerneld hands its CPU over once after a NIC transmit that left it
//! with nothing to do (docs/results.md, "Dataplane": iokerneld yields after
//! a transmit).
//!
//! On a veth the transmit's `sendto` runs the peer's receive and wakes the
//! receiving thread inside iokerneld's system call. When that thread may
//! only run on iokerneld's own CPU (a client placed beside it, as `ginza
//! bench forward` does on two CPUs), Linux's fair scheduler usually runs it
//! as the call returns, but now and then lets the spinning loop keep the
//! CPU — the woken thread then waits for the next scheduler tick, up to
//! 4 ms at HZ=250: the round trips' millisecond outliers. So at the first
//! loop turn after a transmit that moves no frame through the NIC, the
//! loop calls `sched_yield`: a thread woken there runs now; with none, the
//! call returns at once (one system call per transmit followed by an idle
//! turn, in time the loop had nothing to do).

/// Whether the loop should yield, from the NIC's frame counters after
/// each turn.
#[derive(Debug)]
pub(super) struct TxYield {
    enabled: bool,
    tx_seen: u64,
    rx_seen: u64,
    /// A transmit since the last frame received or the last yield.
    armed: bool,
}

impl TxYield {
    pub(super) fn new(enabled: bool) -> TxYield {
        TxYield {
            enabled,
            tx_seen: 0,
            rx_seen: 0,
            armed: false,
        }
    }

    /// After a loop turn, the NIC's frames received and transmitted so far:
    /// `true` when this turn is the first without NIC traffic after a
    /// transmit (yield now).
    pub(super) fn after_turn(&mut self, rx_frames: u64, tx_frames: u64) -> bool {
        let (received, sent) = (rx_frames != self.rx_seen, tx_frames != self.tx_seen);
        (self.rx_seen, self.tx_seen) = (rx_frames, tx_frames);
        if !self.enabled {
            return false;
        }
        if sent {
            // A turn receives before it transmits: the transmit is last.
            self.armed = true;
            return false;
        }
        if received {
            // The peer ran and sent again: its wake did not wait.
            self.armed = false;
            return false;
        }
        std::mem::take(&mut self.armed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_once_at_the_first_idle_turn_after_a_transmit() {
        let mut y = TxYield::new(true);
        assert!(!y.after_turn(0, 0), "nothing sent yet");
        assert!(!y.after_turn(1, 0), "a frame in, none out");
        assert!(!y.after_turn(1, 1), "the turn that transmits");
        assert!(y.after_turn(1, 1), "the next idle turn yields");
        assert!(!y.after_turn(1, 1), "once");
        assert!(!y.after_turn(1, 1));
    }

    #[test]
    fn a_frame_received_after_the_transmit_means_no_yield() {
        let mut y = TxYield::new(true);
        assert!(!y.after_turn(0, 1));
        // The woken peer ran and its next frame is in.
        assert!(!y.after_turn(1, 1));
        assert!(!y.after_turn(1, 1));
        // Received and transmitted in one turn: the transmit is last.
        assert!(!y.after_turn(2, 2));
        assert!(y.after_turn(2, 2));
    }

    #[test]
    fn steady_traffic_never_yields_and_off_is_off() {
        let mut y = TxYield::new(true);
        for n in 1..100 {
            assert!(!y.after_turn(n, n));
        }
        let mut off = TxYield::new(false);
        assert!(!off.after_turn(0, 1));
        assert!(!off.after_turn(0, 1));
    }
}
