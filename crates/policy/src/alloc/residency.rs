//! Minimum residency between latency-critical applications (issue 35).
//!
//! Algorithm 2 lets a congested latency-critical application take a core
//! from any bursting one at every pass. Two of them, both congested and
//! sharing one core, then take it from each other every pass: each
//! hand-over costs a preemption signal and a wake (several µs each), more
//! than the pass interval, so neither runs and a third one's grant is
//! undone before it ran. Here a latency-critical owner keeps a core for a
//! minimum residency once it runs on it (as Linux's scheduler gives a task
//! a minimum slice), and the core then goes to the application that has
//! waited longest for one. Batch owners are preempted at once, as before.

use std::collections::HashMap;

use super::AppSnap;
use crate::Time;

/// Who holds a core, and since when it runs there (`None`: granted, its
/// hand-over not done yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tenant {
    key: u64,
    kthread: usize,
    since: Option<Time>,
}

/// Each core's owner and since when, and each application's wait for a
/// core, carried from one pass to the next.
#[derive(Debug, Default)]
pub(super) struct Residency {
    min: Time,
    held: Vec<Option<Tenant>>,
    /// Application key → since when it has waited for a core.
    waiting: HashMap<u64, Time>,
}

/// The per-pass view [`Residency::observe`] fills (slices of the board).
pub(super) struct View<'a> {
    pub owner: &'a [Option<(usize, usize)>],
    pub pending: &'a [bool],
    pub fresh: &'a mut [bool],
    pub waiting_since: &'a mut [Option<Time>],
}

impl Residency {
    pub(super) fn new(min: Time) -> Self {
        Self {
            min,
            ..Self::default()
        }
    }

    /// The minimum residency; 0: none (Algorithm 2 as published).
    pub(super) fn min(&self) -> Time {
        self.min
    }

    /// Before a pass: notes each core's owner (a new one from now, or from
    /// when its hand-over is done) and marks the cores held for less than
    /// the minimum (`fresh`); loads each application's wait.
    pub(super) fn observe(&mut self, now: Time, apps: &[AppSnap], v: View<'_>) {
        self.held.resize(v.owner.len(), None);
        for (c, held) in self.held.iter_mut().enumerate() {
            let owner = v.owner[c].map(|(a, k)| (apps[a].key, k));
            let pending = v.pending[c];
            *held = match (owner, *held) {
                (None, _) => None,
                (Some((key, kthread)), Some(t)) if t.key == key && t.kthread == kthread => {
                    let since = if pending { None } else { t.since.or(Some(now)) };
                    Some(Tenant { since, ..t })
                }
                (Some((key, kthread)), _) => Some(Tenant {
                    key,
                    kthread,
                    since: (!pending).then_some(now),
                }),
            };
            v.fresh[c] =
                held.is_some_and(|t| t.since.is_none_or(|s| now.saturating_sub(s) < self.min));
        }
        for (w, app) in v.waiting_since.iter_mut().zip(apps) {
            *w = self.waiting.get(&app.key).copied();
        }
    }

    /// After a pass: remembers who still waits for a core.
    pub(super) fn remember(&mut self, apps: &[AppSnap], waiting_since: &[Option<Time>]) {
        self.waiting.clear();
        for (app, w) in apps.iter().zip(waiting_since) {
            if let Some(t) = w {
                self.waiting.insert(app.key, *t);
            }
        }
    }
}
