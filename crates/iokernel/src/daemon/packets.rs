//! The dataplane's turn in the loop: each application's packets moved,
//! steered by its active set, and a packet for an application with no core
//! noted for the policy.

use ginza_shm::IokernelEnd;
use log::debug;

use super::{App, Iokerneld, Kthread};
use crate::actuator::CoreActuator;
use crate::dataplane::{AppNet, Peers};
use crate::nic::PortId;

impl<A: CoreActuator> Iokerneld<A> {
    /// Moves packets: links, then each application's port, egress rings
    /// (kthreads holding a core, or parked since their ring was last
    /// empty) and done rings. A packet for an application with no core
    /// is reported to the policy at once.
    pub(super) fn dataplane(&mut self, now: u64, check_handle: bool) {
        self.dp.poll_links(now, check_handle);
        for a in 0..self.apps.len() {
            let (before, rest) = self.apps.split_at_mut(a);
            let (app, after) = rest.split_first_mut().expect("a < apps.len()");
            if app.dispatch.is_some() {
                // Hand-backs every turn of the loop, not only at the
                // allocation passes: a worker waits for its next request
                // until its hand-back is read.
                for k in 0..app.kt.len() {
                    if app.doomed.is_none() {
                        Self::drain(app, k, now, &mut self.ready);
                    }
                }
            }
            let self_waking = Self::left_to_self_wake(app);
            let Some(net) = &mut app.net else { continue };
            if app.doomed.is_some() {
                continue;
            }
            net.steering
                .sync(app.kt.iter().map(|k| k.core.is_some()), now);
            match self.dp.deliver(net, &mut app.ends, now) {
                Ok(true) if !self.work_arrived.contains(&app.id) => {
                    self.work_arrived.push(app.id);
                }
                Ok(_) => {}
                Err(reason) => {
                    app.doom(reason);
                    continue;
                }
            }
            // The direct path: frames on the application's own socket
            // while none of its kthreads holds a core are work arrived, as
            // frames delivered to its rings are (not left to the next
            // interval pass).
            if super::own_socket::frames_waiting(net)
                && app.kt.iter().all(|k| k.core.is_none())
                && !self_waking
                && !self.work_arrived.contains(&app.id)
            {
                self.work_arrived.push(app.id);
            }
            if let Some(d) = &mut app.dispatch {
                // Dispatch by iokerneld (docs/colocate.md): held requests
                // into the queues, then one dispatch step.
                if let Some(held) = net.held.as_mut().map(std::mem::take) {
                    for desc in &held {
                        d.arrive(*desc, net.held_frame(*desc).unwrap_or(&[]), now);
                    }
                    net.held = Some(held).map(|mut v| {
                        v.clear();
                        v
                    });
                }
                // Woken (or waking): a `Run` must follow the `Wake`.
                net.stats.rx += d.step(now, granted(&app.kt), &mut app.ends);
                if d.queued() > 0
                    && app.kt.iter().all(|k| k.core.is_none())
                    && !self.work_arrived.contains(&app.id)
                {
                    self.work_arrived.push(app.id);
                }
            }
            // Frames to another application go straight to its rings
            // (the direct path, `Dataplane::transmit`).
            let mut peers = OtherApps {
                before,
                after,
                work_arrived: &mut self.work_arrived,
            };
            for (k, kt) in app.kt.iter_mut().enumerate() {
                let end = &mut app.ends[k];
                let mut moved = Ok(());
                if kt.core.is_some() || kt.preempting || kt.drain_egress {
                    moved = self.dp.transmit(net, end, k, &mut peers, now).map(|n| {
                        if n == 0 {
                            kt.drain_egress = false;
                        }
                    });
                }
                if let Err(reason) = moved.and_then(|()| self.dp.take_back(net, end, k)) {
                    // A corrupt ring: the application is not followed.
                    app.doomed.get_or_insert(reason);
                    break;
                }
            }
            Self::send_backstops(&mut self.actuator, app);
        }
        // Replies queued for the NIC in this turn leave now, not after
        // the next turn's receive (docs/results.md, "Dataplane").
        self.dp.flush_to_nic();
    }

    /// The dispatch step of every application iokerneld dispatches for
    /// (docs/colocate.md), arrivals left to [`Self::dataplane`].
    pub(super) fn dispatch_step(&mut self, now: u64) {
        for app in &mut self.apps {
            if let (Some(d), Some(net), None) = (&mut app.dispatch, &mut app.net, &app.doomed) {
                net.stats.rx += d.step(now, granted(&app.kt), &mut app.ends);
            } else {
                continue;
            }
            Self::send_backstops(&mut self.actuator, app);
        }
    }

    /// Sends the backstop signals the last dispatch step asked for
    /// (docs/colocate.md): to workers whose request was asked to yield and
    /// has not.
    fn send_backstops(actuator: &mut A, app: &mut App) {
        let Some(d) = app.dispatch.as_mut() else {
            return;
        };
        let workers = d.take_signals();
        let mut failed = 0;
        for &k in &workers {
            if k >= app.kt.len() {
                continue;
            }
            if let Err(e) = actuator.interrupt_request(&Self::target(app, k)) {
                failed += 1;
                debug!(
                    "dispatch: backstop signal to app {:?} kthread {k}: {e}",
                    app.name
                );
            }
        }
        if let Some(d) = app.dispatch.as_mut() {
            d.signals_sent(workers, failed);
        }
    }
}

/// Every application but the one transmitting, as the dataplane's direct
/// path sees them.
struct OtherApps<'a> {
    before: &'a mut [App],
    after: &'a mut [App],
    work_arrived: &'a mut Vec<u64>,
}

impl OtherApps<'_> {
    fn find(&mut self, port: PortId) -> Option<&mut App> {
        self.before
            .iter_mut()
            .chain(self.after.iter_mut())
            .find(|a| a.net.as_ref().is_some_and(|n| n.port() == port))
    }
}

impl Peers for OtherApps<'_> {
    /// Not an application being removed, nor one whose requests iokerneld
    /// holds for dispatch (those take the switch and `deliver`).
    fn peer(&mut self, port: PortId) -> Option<(&mut AppNet, &mut [IokernelEnd])> {
        let App {
            net,
            ends,
            doomed,
            dispatch,
            ..
        } = self.find(port)?;
        if doomed.is_some() || dispatch.is_some() {
            return None;
        }
        Some((net.as_mut()?, &mut ends[..]))
    }

    fn work_for(&mut self, port: PortId) {
        if let Some(id) = self.find(port).map(|a| a.id) {
            if !self.work_arrived.contains(&id) {
                self.work_arrived.push(id);
            }
        }
    }

    fn disconnect(&mut self, port: PortId, reason: String) {
        if let Some(app) = self.find(port) {
            app.doom(reason);
        }
    }
}

/// Which kthreads may be given requests: woken (or waking) and not being
/// revoked; a `Run` must follow the kthread's `Wake`.
pub(super) fn granted(kt: &[Kthread]) -> impl Iterator<Item = bool> + '_ {
    kt.iter()
        .map(|k| k.core.is_some() && !k.preempting && k.awaiting.is_none())
}
