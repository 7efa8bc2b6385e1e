//! iokerneld gives its CPU away at loop turns that move no frame.
//!
//! Where iokerneld shares its CPU with another thread (on two CPUs, a veth
//! peer's sender placed beside it), its spin takes that thread's time
//! share although the turns find nothing to do: with an application on
//! the direct path (docs/direct-path.md) no frame of its stream passes
//! through iokerneld, yet the loop stays awake while the application's
//! kthread works, and a Linux sender beside it got half of the CPU
//! (docs/results.md, "Session 21: TCP stream"). So once the loop's turns
//! have moved no frame and left nothing pending for [`GAP_NS`], it calls
//! `sched_yield` (again after each further gap): a thread waiting for the
//! CPU runs now; with none, the call returns at once and the loop goes
//! on. A turn that moves frames never yields, so a busy dataplane keeps
//! its CPU.

use super::Iokerneld;
use crate::actuator::CoreActuator;

impl<A: CoreActuator> Iokerneld<A> {
    /// Frames moved so far: the NIC's, received and sent, and those put on
    /// and taken from every application's rings.
    pub(super) fn frames_moved(&self) -> u64 {
        let (rx, tx) = self.dp.nic_frames();
        let apps = self.apps.iter().filter_map(|a| a.net.as_ref());
        apps.fold(rx.wrapping_add(tx), |sum, net| {
            sum.wrapping_add(net.stats.rx).wrapping_add(net.stats.tx)
        })
    }

    /// Something the next turns must carry forward: work arrived for
    /// parked kthreads, doorbells, handovers, wakes and signals, or a
    /// dataplane that must keep polling (a load run, held frames).
    pub(super) fn pending(&self) -> bool {
        !self.work_arrived.is_empty()
            || self.handover_waiting
            || !self.doorbells.is_empty()
            || !self.ready.is_empty()
            || !self.signal_after_wakes.is_empty()
            || self.dp.keeps_awake()
    }
}

/// Whether the loop should yield, from the frames moved so far.
#[derive(Debug)]
pub(super) struct IdleYield {
    enabled: bool,
    /// Frames moved (NIC and applications' rings) as of the last turn.
    moved_seen: u64,
    /// When the loop last yielded (or last moved a frame), ns.
    last: u64,
}

/// Idle turns spin this long before a yield, and between yields: a turn
/// is well under a µs, a `sched_yield` 0.8 µs on the 2-vCPU VM; at most one
/// call per gap keeps a frame that arrives during the call rare, and a
/// thread waiting for the CPU waits at most this long.
const GAP_NS: u64 = 5_000;

impl IdleYield {
    pub(super) fn new(enabled: bool) -> IdleYield {
        IdleYield {
            enabled,
            moved_seen: 0,
            last: 0,
        }
    }

    /// After a loop turn at `now` (ns), the frames moved so far and whether
    /// anything is left for the next turn: `true` when neither frames nor
    /// pending work nor a yield came for [`GAP_NS`] (yield now).
    pub(super) fn after_turn(&mut self, moved: u64, pending: bool, now: u64) -> bool {
        let idle = moved == self.moved_seen;
        self.moved_seen = moved;
        if !idle || pending {
            self.last = now;
            return false;
        }
        if self.enabled && now.saturating_sub(self.last) >= GAP_NS {
            self.last = now;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_at_idle_turns_at_most_once_per_gap() {
        let mut y = IdleYield::new(true);
        assert!(y.after_turn(0, false, GAP_NS), "nothing moved for a gap");
        assert!(!y.after_turn(0, false, GAP_NS + 1), "yielded a moment ago");
        assert!(y.after_turn(0, false, 2 * GAP_NS), "a gap since the yield");
        assert!(!y.after_turn(3, false, 4 * GAP_NS), "frames moved");
        assert!(
            !y.after_turn(3, false, 5 * GAP_NS - 1),
            "within a gap of them"
        );
        assert!(y.after_turn(3, false, 5 * GAP_NS), "none for a gap");
        assert!(!y.after_turn(3, true, 7 * GAP_NS), "work pending");
        assert!(
            !y.after_turn(3, false, 8 * GAP_NS - 1),
            "within a gap of it"
        );
        let mut off = IdleYield::new(false);
        assert!(!off.after_turn(0, false, 10 * GAP_NS), "turned off");
    }
}
