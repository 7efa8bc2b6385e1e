//! The direct path in iokerneld (docs/direct-path.md): a registered
//! application hands over its own AF_XDP socket (`Request::DirectSocket`
//! on its connection); the dataplane puts it in the NIC's XDP maps, the
//! allocation pass counts the frames waiting on its rx ring as kthread
//! 0's queued work (the one kthread that polls it), a frame there while
//! the application holds no core is work arrived (`packets.rs`, every
//! loop turn, as for frames delivered to its rings), and a sleeping
//! iokerneld wakes when that ring fills (`idle.rs`).

use std::os::fd::{BorrowedFd, OwnedFd};

use ginza_policy::alloc::QueueCounters;
use ginza_proto::messages::Response;
use ginza_shm::{LineFlags, QueueLine};
use log::info;

use super::{App, Iokerneld};
use crate::actuator::CoreActuator;
use crate::dataplane::AppNet;

/// The kthread whose queued work an own socket's frames are: the runtime
/// polls its own socket from kthread 0 (docs/direct-path.md, "Left").
const POLLING_KTHREAD: usize = 0;

impl<A: CoreActuator> Iokerneld<A> {
    /// `DirectSocket { queue }` from registered application `i`, with
    /// `fds` attached (one: the socket).
    pub(super) fn own_socket_request(
        &mut self,
        i: usize,
        queue: u32,
        fds: Vec<OwnedFd>,
    ) -> Response {
        let refuse = |why: String| Response::Refused {
            reason: format!("direct socket on queue {queue}: {why}"),
        };
        let mut fds = fds.into_iter();
        let (Some(socket), None) = (fds.next(), fds.next()) else {
            return refuse("attach exactly one descriptor, the AF_XDP socket".into());
        };
        let app = &mut self.apps[i];
        let Some(net) = app.net.as_mut() else {
            return refuse("the application registered no network interface".into());
        };
        match self.dp.attach_own_socket(net, queue, socket) {
            Ok(()) => {
                info!(
                    "app {:?}: frames for {} on queue {queue} go to its own socket",
                    app.name, net.interface.ip
                );
                Response::Accepted {
                    app_id: app.id,
                    ingress_buffers: 0,
                    wake_slots: None,
                    busy_time: None,
                }
            }
            Err(why) => refuse(why),
        }
    }
}

/// Whether frames wait on `net`'s own socket, if it has one (two loads,
/// every loop turn).
pub(super) fn frames_waiting(net: &AppNet) -> bool {
    net.own_socket.as_ref().is_some_and(|own| {
        let (produced, consumed) = own.rx_indices();
        produced != consumed
    })
}

/// The indices of `app`'s own socket's rx ring (producer, consumer), if
/// it has one.
pub(super) fn rx_indices(app: &App) -> Option<(u32, u32)> {
    let own = app.net.as_ref()?.own_socket.as_ref()?;
    Some(own.rx_indices())
}

/// How long frames wait on the own socket of a kthread left to wake itself
/// (parked, armed and allowed: `left_to_self_wake`) before the allocation
/// pass counts them as its queued work: the kernel's wake of the kthread
/// gets this head start over iokerneld's grant, which is the backstop for a
/// kthread that does not wake. Counted at once, as before, the 5 µs pass
/// won the race against the kernel's wake (10–20 µs on the development VM)
/// for many frames, and the kthread, woken by the frame too, waited on its
/// eventfd for the grant (docs/direct-path.md, "The self-woken server's
/// cost").
pub(super) const SELF_WAKE_HEAD_START_NS: u64 = 50_000;

/// The own socket's rx `indices` as the pass counts them for kthread `k`:
/// where it is left to wake itself, the waiting frames count only once the
/// consumer index has stood still with frames there for
/// [`SELF_WAKE_HEAD_START_NS`] (`waiting`: that index and when a pass first
/// saw them); before, none do.
pub(super) fn counted(
    indices: Option<(u32, u32)>,
    k: usize,
    left_to_self_wake: bool,
    waiting: &mut Option<(u32, u64)>,
    now: u64,
) -> Option<(u32, u32)> {
    let (produced, consumed) = indices?;
    if k != POLLING_KTHREAD || !left_to_self_wake || produced == consumed {
        *waiting = None;
        return indices;
    }
    match *waiting {
        Some((c, since)) if c == consumed => {
            if now.saturating_sub(since) >= SELF_WAKE_HEAD_START_NS {
                indices
            } else {
                Some((consumed, consumed))
            }
        }
        _ => {
            *waiting = Some((consumed, now));
            Some((consumed, consumed))
        }
    }
}

/// Adds the frames waiting on an own socket (its rx ring's `indices`) to
/// kthread `k`'s ingress counters, as if they were on its ingress ring.
pub(super) fn fold(indices: Option<(u32, u32)>, k: usize, counters: &mut QueueCounters) {
    if let (POLLING_KTHREAD, Some((produced, consumed))) = (k, indices) {
        counters.in_head = counters.in_head.wrapping_add(consumed);
        counters.in_tail = counters.in_tail.wrapping_add(produced);
    }
}

/// Wakes a kthread blocked on its own socket while idle (the runtime's
/// `idle_poll.rs`, `LineFlags::IDLE_BLOCKED`): clears the flag and, if it
/// was set, writes the kthread's eventfd. Called after the caller asked
/// for the core (`PREEMPT_PENDING`) or delivered to its ingress ring: the
/// kthread then looks at its line and rings. Whether it wrote.
pub(super) fn wake_blocked(line: &QueueLine, eventfd: BorrowedFd<'_>) -> bool {
    if !line
        .remove_flags(LineFlags::IDLE_BLOCKED)
        .contains(LineFlags::IDLE_BLOCKED)
    {
        return false;
    }
    if let Err(e) = ginza_sys::eventfd::write(eventfd, 1) {
        log::warn!("waking a kthread blocked on its own socket: {e}");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames of a kthread left to wake itself count once they have waited
    /// the head start with the consumer index still; at once otherwise.
    #[test]
    fn frames_left_to_a_self_wake_count_after_the_head_start() {
        let mut w = None;
        let head = SELF_WAKE_HEAD_START_NS;
        // Not left to wake itself: counted at once.
        assert_eq!(counted(Some((5, 3)), 0, false, &mut w, 0), Some((5, 3)));
        assert_eq!(w, None);
        // Left to it: none at first, none within the head start ...
        assert_eq!(counted(Some((5, 3)), 0, true, &mut w, 1_000), Some((3, 3)));
        assert_eq!(counted(Some((6, 3)), 0, true, &mut w, head), Some((3, 3)));
        // ... all once the consumer index stood still that long.
        assert_eq!(
            counted(Some((6, 3)), 0, true, &mut w, head + 1_000),
            Some((6, 3))
        );
        // The kthread read some: the wait starts again.
        assert_eq!(
            counted(Some((6, 4)), 0, true, &mut w, head + 2_000),
            Some((4, 4))
        );
        assert_eq!(w, Some((4, head + 2_000)));
        // Nothing waiting: forgotten.
        assert_eq!(
            counted(Some((6, 6)), 0, true, &mut w, head * 3),
            Some((6, 6))
        );
        assert_eq!(w, None);
        // Another kthread: as before.
        assert_eq!(counted(Some((5, 3)), 1, true, &mut w, 0), Some((5, 3)));
    }
}
