//! The self-woken kthread (docs/direct-path.md, "The self-woken kthread"):
//! a parked kthread of an application with its own AF_XDP socket sleeps in
//! `poll` on its eventfd and that socket, so the kernel wakes it for a
//! frame as it wakes a blocked Linux server thread, without iokerneld's
//! grant. It runs on the CPU iokerneld last pinned it to, ahead of a
//! `SCHED_IDLE` kthread there, and tells iokerneld (`SelfWoken`); here
//! iokerneld counts that as a grant of that CPU's core — taking the core
//! from the `SCHED_IDLE` kthread it had lent it to — or, where it would not
//! have granted it, revokes it.
//!
//! iokerneld says where a kthread may wake itself (`SELF_WAKE_ALLOWED` on
//! its queue line, after each pass): its application has an own socket,
//! holds fewer cores than its maximum besides it, and the CPU it is pinned
//! to is free or lent to a `SCHED_IDLE` kthread of another application.
//! The flag is advice: a `SelfWoken` is checked against the same rule when
//! it is read, so a runtime that lies gets a preemption, not a core.

use ginza_shm::{LineFlags, PreemptReason, SendError, ToKthread};
use log::{debug, warn};

use super::Iokerneld;
use crate::actuator::CoreActuator;

/// The kthread whose line carries the permission: the runtime sleeps on
/// its own socket from kthread 0 only (the one kthread whose queued work
/// the socket's frames are, `own_socket.rs`).
const SELF_WAKING_KTHREAD: usize = 0;

/// Whether a self-wake of a kthread may take a core, and whose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The core is free (or its own).
    Free(usize),
    /// The core is lent to this `SCHED_IDLE` kthread (application index,
    /// kthread), which is preempted for it.
    FromIdle(usize, usize, usize),
    /// Not allowed: revoked. The core the kthread runs on, if known.
    Refused(Option<usize>),
}

impl<A: CoreActuator> Iokerneld<A> {
    /// Where kthread `k` of application `a` would run if it woke itself
    /// now, and whether it may take that core.
    fn self_wake_verdict(&self, a: usize, k: usize) -> Verdict {
        let app = &self.apps[a];
        let kt = &app.kt[k];
        let core = kt
            .pinned
            .and_then(|cpu| self.cfg.cores.iter().position(|&c| c == cpu));
        let Some(core) = core else {
            return Verdict::Refused(None);
        };
        let has_socket = app.net.as_ref().is_some_and(|n| n.own_socket.is_some());
        let others = app
            .kt
            .iter()
            .enumerate()
            .filter(|&(j, o)| j != k && o.core.is_some())
            .count();
        if !self.cfg.self_wake
            || !has_socket
            || app.doomed.is_some()
            || k != SELF_WAKING_KTHREAD
            || others >= app.max_cores as usize
        {
            return Verdict::Refused(Some(core));
        }
        let holder = self.apps.iter().enumerate().find_map(|(i, x)| {
            x.kt.iter()
                .position(|o| o.core == Some(core))
                .map(|j| (i, j))
        });
        match holder {
            None => Verdict::Free(core),
            Some((i, j)) if (i, j) == (a, k) => Verdict::Free(core),
            Some((i, j)) if i != a && self.apps[i].kt[j].idle_class => {
                Verdict::FromIdle(i, j, core)
            }
            Some(_) => Verdict::Refused(Some(core)),
        }
    }

    /// The `SelfWoken`s read this pass (`pass.rs`, `drain`): each kthread
    /// holds the core of the CPU it runs on from now, or is revoked.
    pub(super) fn account_self_wakes(&mut self, now: u64) {
        for a in 0..self.apps.len() {
            for k in 0..self.apps[a].kt.len() {
                if !std::mem::take(&mut self.apps[a].kt[k].self_woke) {
                    continue;
                }
                if self.apps[a].doomed.is_some() {
                    continue;
                }
                self.meter.self_wakes += 1;
                match self.self_wake_verdict(a, k) {
                    Verdict::Free(core) => self.take_core(a, k, core),
                    Verdict::FromIdle(i, j, core) => {
                        // As a hand-over from a `SCHED_IDLE` victim: the
                        // kernel already runs the woken kthread ahead of
                        // it; it keeps the core if it gets it back before
                        // its grace ends (the preemption withdrawn).
                        self.preempt(i, j, core, PreemptReason::CoreNeeded, now);
                        self.take_core(a, k, core);
                    }
                    Verdict::Refused(core) => self.revoke_self_wake(a, k, core, now),
                }
            }
        }
    }

    /// Books kthread `k` of application `a` as holding `core`: granted by
    /// its own wake (no `Wake`, no eventfd; its next park answers it).
    fn take_core(&mut self, a: usize, k: usize, core: usize) {
        let app = &mut self.apps[a];
        let kt = &mut app.kt[k];
        kt.core = Some(core);
        kt.last_core = Some(core);
        kt.parked = false;
        kt.preempting = false;
        kt.evicted = false;
        self.meter.actions += 1;
        let prev = self.core_holder[core].replace(app.id);
        if prev.is_some_and(|p| p != app.id) {
            self.meter.reallocations += 1;
        }
        if let Err(e) = self.actuator.reinstate(&Self::target(app, k)) {
            warn!(
                "app {:?} kthread {k}: its policy before an eviction not given back: {e}",
                app.name
            );
        }
        debug!(
            "self-wake: app {:?} kthread {k} holds core {core}",
            app.name
        );
    }

    /// A self-wake iokerneld would not have granted: the kthread is asked
    /// to give the CPU back at once (the flag, the command and the signal),
    /// and moved off it if it does not within the preemption deadline.
    fn revoke_self_wake(&mut self, a: usize, k: usize, core: Option<usize>, now: u64) {
        self.meter.self_wakes_revoked += 1;
        let app = &mut self.apps[a];
        app.preemptions += 1;
        self.meter.preemptions += 1;
        self.meter.actions += 1;
        let kt = &mut app.kt[k];
        kt.core = None;
        kt.parked = false;
        kt.preempting = true;
        kt.evicted = false;
        kt.preempted_polling = false;
        kt.preempt_since = now;
        if core.is_some() {
            kt.last_core = core;
        }
        app.ends[k].line.insert_flags(LineFlags::PREEMPT_PENDING);
        let reason = PreemptReason::Shrink;
        match app.ends[k].to_kthread.send(ToKthread::Preempt { reason }) {
            Ok(()) => {}
            Err(SendError::Full) => app.ring_full += 1,
            Err(SendError::Corrupt(e)) => {
                return app.doom(format!("kthread {k}'s command ring is corrupt: {e}"));
            }
        }
        warn!(
            "app {:?} kthread {k} woke itself where it may not (core {core:?}): revoked",
            app.name
        );
        let cpu = core
            .and_then(|c| self.cfg.cores.get(c).copied())
            .or(app.kt[k].pinned);
        if let Some(cpu) = cpu {
            let app = &self.apps[a];
            if let Err(e) = self.actuator.preempt(&Self::target(app, k), cpu, reason) {
                warn!("revoking app {:?} kthread {k}'s self-wake: {e}", app.name);
            }
        }
    }

    /// Writes `SELF_WAKE_ALLOWED` where it changed: on the self-waking
    /// kthread of each application with an own socket, by the rule of
    /// [`Self::self_wake_verdict`]. The runtime reads it as it parks (to
    /// arm) and as a frame wakes it (to go ahead).
    pub(super) fn mark_self_wake(&mut self) {
        if !self.cfg.self_wake {
            return;
        }
        for a in 0..self.apps.len() {
            let k = SELF_WAKING_KTHREAD;
            let has_socket = self.apps[a]
                .net
                .as_ref()
                .is_some_and(|n| n.own_socket.is_some());
            if !has_socket || k >= self.apps[a].kt.len() {
                continue;
            }
            let allowed = !matches!(self.self_wake_verdict(a, k), Verdict::Refused(_));
            let app = &mut self.apps[a];
            if app.kt[k].self_wake_allowed == allowed {
                continue;
            }
            let line = &app.ends[k].line;
            if allowed {
                line.insert_flags(LineFlags::SELF_WAKE_ALLOWED);
            } else {
                line.remove_flags(LineFlags::SELF_WAKE_ALLOWED);
            }
            app.kt[k].self_wake_allowed = allowed;
        }
    }

    /// Whether application `a`'s own socket is left to its self-waking
    /// kthread: parked, armed on the socket, and allowed. iokerneld's loop
    /// then does not hurry a grant for the socket's frames, and its sleep
    /// does not wait on the socket (the kernel wakes the kthread); the
    /// interval pass's congestion detection still sees them.
    pub(super) fn left_to_self_wake(app: &super::App) -> bool {
        let k = SELF_WAKING_KTHREAD;
        app.kt.get(k).is_some_and(|kt| {
            kt.parked
                && kt.self_wake_allowed
                && app.ends[k]
                    .line
                    .flags()
                    .contains(LineFlags::SELF_WAKE_ARMED)
        })
    }
}
