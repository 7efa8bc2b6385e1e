//! iokerneld gives its CPU away at loop turns that move no frame.
//!
//! Where iokerneld shares its CPU with another thread (on two CPUs, a veth
//! peer's sender placed beside it), its spin takes that thread's time
//! share although the turns find nothing to do: with an application on
//! the direct path (docs/direct-path.md) no frame of its stream passes
//! through iokerneld, yet the loop stays awake while the application's
//! kthread works, and a Linux sender beside it got half of the CPU
//! (docs/results.md, "Session 21: TCP stream"). So once the loop's turns
//! have moved no frame and left nothing pending for [`QUIET_NS`], it
//! calls `sched_yield`, again after each further [`GAP_NS`] of such turns:
//! a thread waiting for the CPU runs now; with none, the call returns at
//! once and the loop goes on. Frames through the loop, however sparse
//! (round trips tens of µs apart), keep it from yielding: a frame that
//! arrived while the thread it yielded to ran would wait for that
//! thread's time slice. And only a loop pinned to a core of its own
//! (`Config::own_core`, never a managed core) yields: unpinned, it shares
//! CPUs with the applications' kthreads, which spin waiting for the frames
//! it moves, and each yield to one cost a time slice (round trips through
//! the software switch of 4 ms instead of 11 µs, `ginza bench tcp`).

use super::Iokerneld;
use crate::actuator::CoreActuator;

impl<A: CoreActuator> Iokerneld<A> {
    /// Whether the loop yields its CPU after this turn (`nic`: the NIC's
    /// frames received and sent so far). Nothing is counted where the
    /// option is off or the loop has no core of its own.
    pub(super) fn yield_after_idle_turn(&mut self, nic: (u64, u64), now: u64) -> bool {
        if !self.idle_yield.enabled {
            return false;
        }
        let moved = self.frames_moved(nic);
        // Pending work matters only on a turn that moved nothing.
        let pending = moved == self.idle_yield.moved_seen && self.pending();
        self.idle_yield.after_turn(moved, pending, now)
    }

    /// Frames moved so far: the NIC's (`nic`), received and sent, and
    /// those put on and taken from every application's rings.
    fn frames_moved(&self, (rx, tx): (u64, u64)) -> u64 {
        let apps = self.apps.iter().filter_map(|a| a.net.as_ref());
        apps.fold(rx.wrapping_add(tx), |sum, net| {
            sum.wrapping_add(net.stats.rx).wrapping_add(net.stats.tx)
        })
    }

    /// Something the next turns must carry forward: work arrived for
    /// parked kthreads, doorbells, handovers, wakes and signals, or a
    /// dataplane that must keep polling (a load run, held frames); or a
    /// duty whose traffic these counts do not see: a protected-mode
    /// netstack's channels, requests iokerneld dispatches.
    fn pending(&self) -> bool {
        !self.protected_pids.is_empty()
            || self
                .apps
                .iter()
                .any(|a| !a.protects.is_empty() || a.dispatch.is_some())
            || !self.work_arrived.is_empty()
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
    /// The last turn that moved a frame or left something pending, ns.
    active_at: u64,
    /// The last yield, ns.
    yielded_at: u64,
}

/// No frame moved and nothing pending for this long before the first
/// yield: a loop that moves frames now and then (round trips through it,
/// tens of µs apart) must not yield between them, or a frame arriving
/// while the thread it yielded to runs waits for that thread's time slice
/// (up to a scheduler tick, 4 ms here).
const QUIET_NS: u64 = 1_000_000;

/// Then idle turns spin this long between yields: a turn is well under a
/// µs, a `sched_yield` 0.8 µs on the 2-vCPU VM.
const GAP_NS: u64 = 5_000;

impl IdleYield {
    pub(super) fn new(enabled: bool) -> IdleYield {
        IdleYield {
            enabled,
            moved_seen: 0,
            active_at: 0,
            yielded_at: 0,
        }
    }

    /// After a loop turn at `now` (ns), the frames moved so far and whether
    /// anything is left for the next turn: `true` when neither frames nor
    /// pending work came for [`QUIET_NS`] and no yield for [`GAP_NS`]
    /// (yield now).
    pub(super) fn after_turn(&mut self, moved: u64, pending: bool, now: u64) -> bool {
        let idle = moved == self.moved_seen;
        self.moved_seen = moved;
        if !idle || pending {
            self.active_at = now;
            return false;
        }
        let quiet = now.saturating_sub(self.active_at) >= QUIET_NS;
        if self.enabled && quiet && now.saturating_sub(self.yielded_at) >= GAP_NS {
            self.yielded_at = now;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yields_after_a_quiet_spell_at_most_once_per_gap() {
        let mut y = IdleYield::new(true);
        assert!(!y.after_turn(0, false, QUIET_NS - 1), "quiet for less");
        assert!(
            y.after_turn(0, false, QUIET_NS),
            "nothing moved for a spell"
        );
        assert!(
            !y.after_turn(0, false, QUIET_NS + 1),
            "yielded a moment ago"
        );
        assert!(y.after_turn(0, false, QUIET_NS + GAP_NS), "a gap since");
        let t = 2 * QUIET_NS;
        assert!(!y.after_turn(3, false, t), "frames moved");
        assert!(!y.after_turn(3, false, t + GAP_NS), "a gap, but no spell");
        assert!(y.after_turn(3, false, t + QUIET_NS), "quiet for a spell");
        assert!(!y.after_turn(3, true, 4 * QUIET_NS), "work pending");
        assert!(!y.after_turn(3, false, 5 * QUIET_NS - 1), "within a spell");
        assert!(y.after_turn(3, false, 5 * QUIET_NS));
        let mut off = IdleYield::new(false);
        assert!(!off.after_turn(0, false, 10 * QUIET_NS), "turned off");
    }
}
