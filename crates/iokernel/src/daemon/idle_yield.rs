//! iokerneld gives its CPU away at each loop turn that moved no frame.
//!
//! Where iokerneld shares its CPU with another thread (on two CPUs, a veth
//! peer's sender placed beside it), its spin takes that thread's time
//! share although the turns find nothing to do: with an application on
//! the direct path (docs/direct-path.md) no frame of its stream passes
//! through iokerneld, yet the loop stays awake while the application's
//! kthread works, and a Linux sender beside it got half of the CPU
//! (docs/results.md, "Session 21: TCP stream"). So at a turn that moved
//! no frame and left nothing pending, the loop calls `sched_yield`: a
//! thread waiting for the CPU runs now; with none, the call returns at
//! once and the loop goes on. A turn that moved frames never yields, so a
//! busy dataplane keeps its CPU.

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
}

impl IdleYield {
    pub(super) fn new(enabled: bool) -> IdleYield {
        IdleYield {
            enabled,
            moved_seen: 0,
        }
    }

    /// After a loop turn, the frames moved so far and whether anything is
    /// left for the next turn: `true` when this turn moved none and left
    /// nothing pending (yield now).
    pub(super) fn after_turn(&mut self, moved: u64, pending: bool) -> bool {
        let idle = moved == self.moved_seen;
        self.moved_seen = moved;
        self.enabled && idle && !pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_only_at_turns_that_moved_nothing_and_left_nothing() {
        let mut y = IdleYield::new(true);
        assert!(y.after_turn(0, false), "nothing moved");
        assert!(!y.after_turn(3, false), "frames moved");
        assert!(y.after_turn(3, false), "none since");
        assert!(!y.after_turn(3, true), "work pending");
        assert!(!y.after_turn(4, false));
        let mut off = IdleYield::new(false);
        assert!(!off.after_turn(0, false), "turned off");
    }
}
