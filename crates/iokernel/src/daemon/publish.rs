//! The loop's side of the metrics (docs/metrics.md): every
//! [`PUBLISH_EVERY`] its counters are copied into the
//! snapshot the metrics server reads. The copy is made in place (names
//! with `clone_from`, histograms bucket by bucket), so it allocates only
//! when an application is added or its name grows, and it is skipped, not
//! awaited, while a scrape holds the snapshot.

use ginza_metrics::Buckets;
use ginza_proto::messages::Class;
use ginza_sys::clock;

use super::{protected, App, Iokerneld};
use crate::actuator::CoreActuator;
use crate::dataplane::AppNet;
use crate::metrics::{AppFigures, DispatchFigures, Snapshot, PUBLISH_EVERY};

impl<A: CoreActuator> Iokerneld<A> {
    /// Publishes the figures (the loop calls it when they are due); a
    /// scrape copying them now makes it try again at the next turn.
    pub(super) fn publish_metrics(&mut self, now: u64) {
        let Some(mut ep) = self.metrics.take() else {
            return;
        };
        let t0 = self.clock.now_ns();
        let cost = &ep.publish_cost;
        if ep.slot.try_update(|s| self.fill(s, cost)) {
            ep.next_due = now + PUBLISH_EVERY.as_nanos() as u64;
            ep.publish_cost
                .record(self.clock.now_ns().saturating_sub(t0));
        }
        self.metrics = Some(ep);
    }

    fn fill(&self, s: &mut Snapshot, publish_cost: &Buckets) {
        s.published = true;
        s.policy = self.cfg.policy.name();
        s.nic.clone_from(&self.cfg.nic);
        s.managed_cores = self.cfg.cores.len() as u64;
        s.interval_ns = self.cfg.interval.as_nanos() as u64;
        s.uptime_ns = clock::monotonic_ns().saturating_sub(self.start_ns);
        s.loop_cpu_ns = clock::thread_cpu_ns();
        s.passes = self.passes;
        s.registrations_refused = self.refused;
        s.apps_disconnected = self.disconnected;
        self.meter.lifetime_into(&mut s.alloc);
        (s.nic_rx_frames, s.nic_tx_frames, s.nic_drops) = self.dp.nic_counters();
        s.publish_cost.copy_from(publish_cost);
        s.apps.resize_with(self.apps.len(), AppFigures::default);
        for (a, f) in self.apps.iter().zip(s.apps.iter_mut()) {
            fill_app(a, f);
            f.channels = protected::back_pressure(&self.protected_pids, a);
        }
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
    match &a.dispatch {
        None => f.dispatch = None,
        Some(d) => {
            let df = f.dispatch.get_or_insert_with(DispatchFigures::default);
            df.counters = d.stats();
            d.sojourn_into(&mut df.sojourn);
        }
    }
}
