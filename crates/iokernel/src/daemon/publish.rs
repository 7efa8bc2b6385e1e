//! The loop's side of the metrics (docs/metrics.md): every
//! [`PUBLISH_EVERY`] its counters are copied into the snapshot the metrics
//! server reads, in steps of one loop turn each: iokerneld's own figures,
//! then [`APPS_PER_TURN`] applications a turn, so that no turn is held up
//! by more than a few microseconds however many applications there are
//! (the copy touches memory the loop does not otherwise keep in cache:
//! about 0.4 µs an application, measured in docs/results.md). The copy is
//! made in place (names with `clone_from`, histograms bucket by bucket),
//! so it allocates only when an application is added or its name grows,
//! and a step is skipped, not awaited, while a scrape holds the snapshot.
//! Between steps a scrape sees some applications' figures from this
//! publication and some from the last, each application's whole.

use ginza_metrics::Buckets;
use ginza_proto::messages::Class;

use super::{protected, App, Iokerneld};
use crate::actuator::CoreActuator;
use crate::dataplane::AppNet;
use crate::metrics::{AppFigures, DispatchFigures, Snapshot, PUBLISH_EVERY};

/// Applications copied in one loop turn.
pub const APPS_PER_TURN: usize = 4;

/// Steps an idle loop takes at once to finish a publication (enough for
/// `ginza_proto::MAX_APPS` applications, and retries while scrapes hold
/// the snapshot).
const IDLE_STEPS: usize = 256;

impl<A: CoreActuator> Iokerneld<A> {
    /// One step of a publication (the loop calls it while one is due or
    /// under way); a scrape copying the snapshot now makes it try the same
    /// step again at the next turn.
    pub(super) fn publish_metrics(&mut self, now: u64) {
        let Some(mut ep) = self.metrics.take() else {
            return;
        };
        let t0 = self.clock.now_ns();
        let (cost, tid, step) = (&ep.publish_cost, ep.loop_tid, ep.cursor);
        let mut next = step;
        let done = ep.slot.try_update(|s| {
            next = match step {
                None => {
                    self.fill_daemon(s, cost, tid);
                    Some(0)
                }
                Some(i) => self.fill_apps(s, i, now),
            }
        });
        if done {
            ep.cursor = next;
            if next.is_none() {
                ep.next_due = now + PUBLISH_EVERY.as_nanos() as u64;
            }
            ep.publish_cost
                .record(self.clock.now_ns().saturating_sub(t0));
        }
        self.metrics = Some(ep);
    }

    /// Before an idle sleep: finishes a publication under way at once (no
    /// request waits on this turn) and says when the next step is due, so
    /// that the sleep ends for it; `None` if the metrics are not served.
    pub(super) fn finish_publication(&mut self, now: u64) -> Option<u64> {
        for _ in 0..IDLE_STEPS {
            if self.metrics.as_ref()?.cursor.is_none() {
                break;
            }
            self.publish_metrics(now);
        }
        self.metrics
            .as_ref()
            .map(|m| if m.cursor.is_some() { now } else { m.next_due })
    }

    /// iokerneld's own figures, and room for every application.
    fn fill_daemon(&self, s: &mut Snapshot, publish_cost: &Buckets, loop_tid: i32) {
        s.published = true;
        s.policy = self.cfg.policy.name();
        s.nic.clone_from(&self.cfg.nic);
        s.managed_cores = self.cfg.cores.len() as u64;
        s.interval_ns = self.cfg.interval.as_nanos() as u64;
        s.start_ns = self.start_ns;
        s.loop_tid = loop_tid;
        s.passes = self.passes;
        s.registrations_refused = self.refused;
        s.apps_disconnected = self.disconnected;
        self.meter.lifetime_into(&mut s.alloc);
        (s.nic_rx_frames, s.nic_tx_frames, s.nic_drops) = self.dp.nic_counters();
        s.publish_cost.copy_from(publish_cost);
        // New entries have no name until their step: not shown till then.
        s.apps.resize_with(self.apps.len(), AppFigures::default);
    }

    /// Applications `from..` (at most [`APPS_PER_TURN`]); the next step,
    /// or `None` when this was the last.
    fn fill_apps(&mut self, s: &mut Snapshot, from: usize, now: u64) -> Option<usize> {
        let end = (from + APPS_PER_TURN).min(self.apps.len());
        // The applications may have changed since the first step.
        s.apps.resize_with(self.apps.len(), AppFigures::default);
        for k in from..end {
            read_request_latency(&mut self.apps[k], now);
            let a = &self.apps[k];
            fill_app(a, &mut s.apps[k]);
            s.apps[k].channels = protected::back_pressure(&self.protected_pids, a);
        }
        (end < self.apps.len()).then_some(end)
    }
}

/// Judges what each kthread's runtime wrote in its latency histogram
/// since the previous publication (`ginza_shm::LatencyTally`).
fn read_request_latency(a: &mut App, now: u64) {
    for (k, end) in a.kt.iter_mut().zip(&a.ends) {
        k.latency.observe(&end.latency.read(), now);
    }
}

fn fill_app(a: &App, f: &mut AppFigures) {
    f.name.clone_from(&a.name);
    f.class = match a.class {
        Class::LatencyCritical => "latency-critical",
        Class::Batch => "batch",
    };
    f.cores = a.kt.iter().filter(|k| k.core.is_some()).count() as u32;
    f.guaranteed = a.guaranteed;
    f.max_cores = a.max_cores;
    f.kthreads = a.kt.len() as u32;
    f.parked_kthreads = a.kt.iter().filter(|k| k.parked).count() as u32;
    f.grants = a.grants;
    f.preemptions = a.preemptions;
    f.congestion_events = a.congestion;
    f.parks = a.parks;
    f.steals = a.steals();
    f.preempt_overdue = a.preempt_overdue;
    f.commands_dropped = a.ring_full;
    f.net = a.net.as_ref().map(AppNet::report);
    f.request_latency.clear();
    for k in &a.kt {
        f.request_latency
            .add_counts(&k.latency.buckets, k.latency.sum_ns);
    }
    match &a.dispatch {
        None => f.dispatch = None,
        Some(d) => {
            let df = f.dispatch.get_or_insert_with(DispatchFigures::default);
            df.counters = d.stats();
            d.sojourn_into(&mut df.sojourn);
        }
    }
}
