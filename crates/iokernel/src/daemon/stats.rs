//! Stats: the allocator's counts and cost histograms over a window, and
//! the report a stats request gets.

use hdrhistogram::Histogram;

use super::Iokerneld;
use crate::actuator::CoreActuator;
use crate::dataplane::AppNet;
use crate::metrics::Lifetime;
use ginza_proto::messages::{
    AllocStats, AppStats, KthreadView, Latency, Request, Response, StatsReport,
};
use ginza_shm::GrantDelivery;
use ginza_sys::clock;

/// Longest duration the cost histograms tell apart; longer samples count
/// as this, so recording never resizes (allocates) in the loop. A
/// hand-over ends by the preemption deadline (at most 10 s).
pub const HIST_MAX_NS: u64 = 60_000_000_000;

/// Significant digits of the cost histograms: 0.1 %, about 220 KiB each.
const HIST_SIGFIG: u8 = 3;

/// A cost histogram (ns).
fn histogram() -> Histogram<u64> {
    // Constant bounds, checked by a unit test.
    Histogram::new_with_bounds(1, HIST_MAX_NS, HIST_SIGFIG).expect("valid histogram bounds")
}

/// The summary of a cost histogram that goes into the stats.
pub fn summarize(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency::default();
    }
    Latency {
        count: h.len(),
        p50_ns: h.value_at_quantile(0.5),
        p99_ns: h.value_at_quantile(0.99),
        max_ns: h.max(),
        mean_ns: h.mean().round() as u64,
    }
}

/// Fewest ns one steal can take (a lock or compare-and-swap on another
/// kthread's queue and the work taken): a queue line whose steal count grew
/// faster than this since iokerneld's previous read is not believed.
const MIN_NS_PER_STEAL: u64 = 20;

/// Steals believed beyond [`MIN_NS_PER_STEAL`]'s bound (a burst between two
/// reads that are close together).
const STEAL_SLACK: u64 = 1024;

/// One kthread's steals, as iokerneld counts them from the free-running
/// 32-bit count its runtime keeps in the queue line (crates/iokernel/README.md,
/// "Stats"). The runtime is untrusted: a count that went backwards (a
/// wrapping difference of 2^31 or more) or grew faster than one steal per
/// [`MIN_NS_PER_STEAL`] since the previous read adds nothing, and the next
/// read counts from the new value. Read every allocation pass, so the count
/// cannot wrap unseen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct StealCount {
    last_raw: u32,
    last_ns: u64,
    /// Steals believed so far.
    pub(super) total: u64,
    /// Reads whose change was not believed.
    pub(super) distrusted: u64,
}

impl StealCount {
    /// Counting from 0 at `now` (the line of a kthread just registered).
    pub(super) fn new(now: u64) -> Self {
        StealCount {
            last_ns: now,
            ..Default::default()
        }
    }

    /// The line said `raw` at `now`.
    pub(super) fn observe(&mut self, raw: u32, now: u64) {
        let delta = raw.wrapping_sub(self.last_raw);
        let elapsed = now.saturating_sub(self.last_ns);
        self.last_raw = raw;
        self.last_ns = now;
        if delta == 0 {
            return;
        }
        let bound = elapsed / MIN_NS_PER_STEAL + STEAL_SLACK;
        if delta >= 1 << 31 || u64::from(delta) > bound {
            self.distrusted += 1;
        } else {
            self.total += u64::from(delta);
        }
    }
}

/// The allocator's counts and costs over the current stats window
/// ([`AllocStats`]).
pub(super) struct Meter {
    since_ns: u64,
    since_cpu_ns: u64,
    pub(super) grants: u64,
    pub(super) preemptions: u64,
    pub(super) reallocations: u64,
    pub(super) handovers: u64,
    pub(super) handovers_abandoned: u64,
    pub(super) withdrawn: u64,
    /// Doorbells taken by the kthread asked, and by iokerneld after the wait.
    pub(super) local_wakes: u64,
    pub(super) local_wakes_by_iokernel: u64,
    pub(super) self_wakes: u64,
    pub(super) self_wakes_revoked: u64,
    /// Wakes, preemptions and evictions carried out (never reset): a pass
    /// that changed it acted.
    pub(super) actions: u64,
    pub(super) grant_cost: Histogram<u64>,
    /// `grant_cost` of the grants delivered by the grant word alone.
    pub(super) grant_cost_word: Histogram<u64>,
    /// `grant_cost` of the grants that wrote the eventfd.
    pub(super) grant_cost_eventfd: Histogram<u64>,
    pub(super) pass_acted: Histogram<u64>,
    pub(super) pass_idle: Histogram<u64>,
    pub(super) handover: Histogram<u64>,
    /// The same figures since iokerneld started, for the metrics.
    pub(super) lifetime: Lifetime,
}

impl Meter {
    pub(super) fn new(now: u64, cpu: u64) -> Self {
        Meter {
            since_ns: now,
            since_cpu_ns: cpu,
            grants: 0,
            preemptions: 0,
            reallocations: 0,
            handovers: 0,
            handovers_abandoned: 0,
            withdrawn: 0,
            local_wakes: 0,
            local_wakes_by_iokernel: 0,
            self_wakes: 0,
            self_wakes_revoked: 0,
            actions: 0,
            grant_cost: histogram(),
            grant_cost_word: histogram(),
            grant_cost_eventfd: histogram(),
            pass_acted: histogram(),
            pass_idle: histogram(),
            handover: histogram(),
            lifetime: Lifetime::default(),
        }
    }

    /// Starts a new window (in place: no allocation).
    fn reset(&mut self, now: u64, cpu: u64) {
        self.fold_window();
        self.since_ns = now;
        self.since_cpu_ns = cpu;
        self.grants = 0;
        self.preemptions = 0;
        self.reallocations = 0;
        self.handovers = 0;
        self.handovers_abandoned = 0;
        self.withdrawn = 0;
        self.local_wakes = 0;
        self.local_wakes_by_iokernel = 0;
        self.self_wakes = 0;
        self.self_wakes_revoked = 0;
        self.grant_cost.reset();
        self.grant_cost_word.reset();
        self.grant_cost_eventfd.reset();
        self.pass_acted.reset();
        self.pass_idle.reset();
        self.handover.reset();
    }

    /// Adds the window's counts to the lifetime's (before a reset).
    fn fold_window(&mut self) {
        let l = &mut self.lifetime;
        l.grants += self.grants;
        l.preemptions += self.preemptions;
        l.reallocations += self.reallocations;
        l.handovers += self.handovers;
        l.handovers_abandoned += self.handovers_abandoned;
        l.withdrawn += self.withdrawn;
        l.local_wakes += self.local_wakes;
        l.local_wakes_by_iokernel += self.local_wakes_by_iokernel;
    }

    /// The lifetime figures now into `out` (the window's counts added),
    /// without allocating.
    pub(super) fn lifetime_into(&self, out: &mut Lifetime) {
        out.copy_from(&self.lifetime);
        out.grants += self.grants;
        out.preemptions += self.preemptions;
        out.reallocations += self.reallocations;
        out.handovers += self.handovers;
        out.handovers_abandoned += self.handovers_abandoned;
        out.withdrawn += self.withdrawn;
        out.local_wakes += self.local_wakes;
        out.local_wakes_by_iokernel += self.local_wakes_by_iokernel;
    }

    /// One pass's wall time, under whether it acted.
    pub(super) fn record_pass(&mut self, ns: u64, acted: bool) {
        if acted {
            self.pass_acted.saturating_record(ns);
            self.lifetime.pass_acted.record(ns);
        } else {
            self.pass_idle.saturating_record(ns);
            self.lifetime.pass_idle.record(ns);
        }
    }

    /// One completed hand-over's time.
    pub(super) fn record_handover(&mut self, ns: u64) {
        self.handover.saturating_record(ns);
        self.lifetime.handover_latency.record(ns);
    }

    /// One grant's cost, also under how it was delivered (a failed grant
    /// counts in the total only).
    pub(super) fn record_grant(&mut self, ns: u64, delivery: Option<GrantDelivery>) {
        self.grant_cost.saturating_record(ns);
        self.lifetime.grant_latency.record(ns);
        match delivery {
            Some(GrantDelivery::Word) => self.grant_cost_word.saturating_record(ns),
            Some(GrantDelivery::Eventfd) => self.grant_cost_eventfd.saturating_record(ns),
            Some(GrantDelivery::Doorbell) => {}
            None => {}
        }
    }

    fn report(&self, now: u64, cpu: u64) -> AllocStats {
        AllocStats {
            window_ns: now.saturating_sub(self.since_ns),
            window_cpu_ns: cpu.saturating_sub(self.since_cpu_ns),
            grants: self.grants,
            preemptions: self.preemptions,
            reallocations: self.reallocations,
            handovers: self.handovers,
            handovers_abandoned: self.handovers_abandoned,
            preemptions_withdrawn: self.withdrawn,
            local_wakes: self.local_wakes,
            local_wakes_by_iokernel: self.local_wakes_by_iokernel,
            self_wakes: self.self_wakes,
            self_wakes_revoked: self.self_wakes_revoked,
            grant_cost: summarize(&self.grant_cost),
            grant_cost_by_word: summarize(&self.grant_cost_word),
            grant_cost_by_eventfd: summarize(&self.grant_cost_eventfd),
            pass_cost_with_decisions: summarize(&self.pass_acted),
            pass_cost_idle: summarize(&self.pass_idle),
            handover: summarize(&self.handover),
        }
    }
}

impl<A: CoreActuator> Iokerneld<A> {
    pub(super) fn report(&self, now: u64) -> StatsReport {
        let cpu = clock::thread_cpu_ns();
        StatsReport {
            policy: self.cfg.policy.name().into(),
            managed_cores: self.cfg.cores.clone(),
            interval_ns: self.cfg.interval.as_nanos() as u64,
            uptime_ns: now.saturating_sub(self.start_ns),
            loop_cpu_ns: cpu,
            passes: self.passes,
            registrations_refused: self.refused,
            apps_disconnected: self.disconnected,
            stale_parks: self.apps.iter().map(|a| a.stale_parks).sum(),
            apps: self
                .apps
                .iter()
                .map(|a| AppStats {
                    app_id: a.id,
                    name: a.name.clone(),
                    pid: a.pid,
                    class: a.class,
                    cores_now: a.kt.iter().filter(|k| k.core.is_some()).count() as u32,
                    guaranteed: a.guaranteed,
                    max_cores: a.max_cores,
                    kthreads: a.kt.len() as u32,
                    parked_kthreads: a.kt.iter().filter(|k| k.parked).count() as u32,
                    grants: a.grants,
                    preemptions: a.preemptions,
                    congestion_events: a.congestion,
                    ring_full: a.ring_full,
                    preempt_overdue: a.preempt_overdue,
                    steals: a.steals(),
                    net: a.net.as_ref().map(AppNet::report),
                    dispatch: a.dispatch.as_ref().map(|d| d.stats()),
                })
                .collect(),
            recent_removals: self.removals.iter().cloned().collect(),
            alloc: self.meter.report(now, cpu),
            idle: self.idle.report(),
            dataplane: {
                let mut dp = self.dp.stats();
                for a in &self.apps {
                    if let Some(net) = &a.net {
                        net.add_steering(&mut dp.steering, a.steals());
                    }
                }
                dp.steering.sort_by_key(|t| t.st);
                dp
            },
        }
    }

    /// Where the time of the requests of application `name` went, if
    /// iokerneld dispatches them (docs/colocate.md).
    pub(super) fn dispatch_breakdown(&self, name: &str) -> Response {
        match self
            .apps
            .iter()
            .find_map(|a| a.dispatch.as_ref().filter(|_| a.name == name))
        {
            Some(d) => Response::DispatchBreakdown {
                bands: d.breakdown(),
            },
            None => Response::Refused {
                reason: format!("no application {name:?} whose requests iokerneld dispatches"),
            },
        }
    }

    /// Each kthread of application `name` as iokerneld sees it now
    /// (`Request::Kthreads`).
    pub(super) fn kthread_views(&mut self, name: &str, now: u64) -> Response {
        let Some(i) = self.apps.iter().position(|a| a.name == name) else {
            return Response::Refused {
                reason: format!("no application {name:?}"),
            };
        };
        // The last pass's view, if it is still this application's.
        let snap = self.snaps.get(i).filter(|s| s.key == self.apps[i].id);
        let app = &self.apps[i];
        let queued = |k: usize| {
            snap.and_then(|s| s.kthreads.get(k)).map_or(0, |ks| {
                let c = ks.counters;
                c.rq_tail.wrapping_sub(c.rq_head).min(1 << 20)
                    + c.in_tail.wrapping_sub(c.in_head).min(1 << 20)
            })
        };
        let kthreads = app
            .kt
            .iter()
            .enumerate()
            .map(|(k, kt)| KthreadView {
                cpu: kt
                    .core
                    .and_then(|c| self.cfg.cores.get(c))
                    .map(|&c| c as u32),
                parked: kt.parked,
                preempting: kt.preempting,
                evicted: kt.evicted,
                awaiting_handover: kt.awaiting.is_some(),
                grant: kt.grants.last(),
                grant_open: kt.grants.is_open(),
                queued: queued(k),
                flags: app.ends[k].line.flags().0,
                timer_in_ns: kt.timer.map(|t| t.wrapping_sub(now) as i64),
                busy_ns: app.ends[k].line.snapshot().busy_ns,
            })
            .collect();
        Response::Kthreads { kthreads }
    }

    /// The stats answer; for `ResetStats` the window it reports ends and a
    /// new one starts.
    pub(super) fn stats_answer(&mut self, req: &Request, now: u64) -> Response {
        let rep = Response::Stats(self.report(now));
        if *req == Request::ResetStats {
            // `now` may be older than the samples already in the window.
            let t = clock::monotonic_ns().max(now);
            self.meter.reset(t, clock::thread_cpu_ns());
        }
        rep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_of_cost_histograms() {
        let mut h = histogram();
        assert_eq!(summarize(&h), Latency::default());
        // 1 µs .. 1 ms.
        for us in 1..=1000u64 {
            h.saturating_record(us * 1000);
        }
        let s = summarize(&h);
        assert_eq!(s.count, 1000);
        // Upper ends of 0.1 % buckets: never below the value.
        let near = |got: u64, want: u64| got >= want && got <= want + want / 1000;
        assert!(near(s.p50_ns, 500_000), "{s:?}");
        assert!(near(s.p99_ns, 990_000), "{s:?}");
        assert!(near(s.max_ns, 1_000_000), "{s:?}");
        assert!(s.mean_ns.abs_diff(500_500) <= 500, "{s:?}");
        // Out of range: clamped, not lost, nothing allocated.
        h.saturating_record(u64::MAX);
        h.saturating_record(0);
        let s = summarize(&h);
        assert_eq!(s.count, 1002);
        assert!(s.max_ns >= HIST_MAX_NS && s.max_ns <= HIST_MAX_NS + HIST_MAX_NS / 1000);
    }

    #[test]
    fn steals_are_counted_from_the_line_and_absurd_changes_are_not_believed() {
        let mut c = StealCount::new(1_000);
        c.observe(0, 2_000);
        assert_eq!(c.total, 0);
        c.observe(5, 3_000);
        c.observe(12, 4_000);
        assert_eq!((c.total, c.distrusted), (12, 0));
        // Across the wrap of the 32-bit count.
        let mut w = StealCount::new(0);
        w.observe((1 << 31) - 1, 1_000_000_000_000);
        w.observe(u32::MAX - 1, 2_000_000_000_000);
        w.observe(3, 2_000_000_001_000);
        assert_eq!((w.total, w.distrusted), (u64::from(u32::MAX) - 1 + 5, 0));
        // Backwards: nothing counted; the next read counts from there.
        c.observe(10, 5_000);
        assert_eq!((c.total, c.distrusted), (12, 1));
        c.observe(11, 6_000);
        assert_eq!(c.total, 13);
        // 1 µs allows 1_000 / 20 + 1_024 = 1_074 steals, not a million.
        c.observe(11 + 1_000_000, 7_000);
        assert_eq!((c.total, c.distrusted), (13, 2));
        c.observe(11 + 1_000_000 + 1_074, 8_000);
        assert_eq!((c.total, c.distrusted), (13 + 1_074, 2));
        // A read at the same instant still allows the slack, no more.
        c.observe(11 + 1_000_000 + 1_074 + 1_025, 8_000);
        assert_eq!((c.total, c.distrusted), (13 + 1_074, 3));
    }

    #[test]
    fn a_reset_starts_a_new_window() {
        let mut m = Meter::new(1_000, 0);
        m.grants = 3;
        m.preemptions = 2;
        m.reallocations = 1;
        m.handovers = 1;
        m.handovers_abandoned = 1;
        m.actions = 9;
        for h in [
            &mut m.grant_cost,
            &mut m.pass_acted,
            &mut m.pass_idle,
            &mut m.handover,
        ] {
            h.saturating_record(5_000);
        }
        m.record_grant(300, Some(GrantDelivery::Word));
        m.record_grant(9_000, Some(GrantDelivery::Eventfd));
        m.record_grant(9_000, None);
        let r = m.report(11_000, 500);
        assert_eq!((r.window_ns, r.window_cpu_ns), (10_000, 500));
        assert_eq!((r.grants, r.handover.count), (3, 1));
        // Every grant in the total, each delivered one under its way.
        assert_eq!(r.grant_cost.count, 4);
        assert_eq!(r.grant_cost_by_word.count, 1);
        assert_eq!(r.grant_cost_by_eventfd.count, 1);
        assert!(r.grant_cost_by_word.max_ns < 1_000);
        m.reset(20_000, 700);
        let r = m.report(25_000, 800);
        assert_eq!(
            r,
            AllocStats {
                window_ns: 5_000,
                window_cpu_ns: 100,
                ..Default::default()
            }
        );
        // Not a window count: passes compare it before and after.
        assert_eq!(m.actions, 9);
        // The metrics' figures survive the reset.
        m.grants = 2;
        m.record_pass(700, true);
        let mut l = Lifetime::default();
        m.lifetime_into(&mut l);
        assert_eq!((l.grants, l.preemptions, l.reallocations), (5, 2, 1));
        assert_eq!(l.grant_latency.count(), 3);
        assert_eq!(l.pass_acted.count(), 1);
    }
}
