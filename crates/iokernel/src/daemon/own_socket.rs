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
