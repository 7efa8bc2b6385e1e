//! iokerneld's snapshot as named metrics (docs/metrics.md lists them).
//! Names carry their unit; the encoder appends `_total` to counters and
//! the unit to the names of families that have one.

use std::fmt;
use std::sync::Arc;

use ginza_metrics::exposition::{Histogram, Writer};
use ginza_metrics::prometheus_client::collector;
use ginza_metrics::prometheus_client::encoding::DescriptorEncoder;
use ginza_metrics::prometheus_client::registry::Unit;
use ginza_metrics::Slot;

use super::snapshot::{AppFigures, Snapshot};

/// Encodes a copy of the published snapshot at each scrape.
#[derive(Debug)]
pub struct Collector {
    slot: Arc<Slot<Snapshot>>,
}

impl Collector {
    pub fn new(slot: Arc<Slot<Snapshot>>) -> Collector {
        Collector { slot }
    }
}

impl collector::Collector for Collector {
    fn encode(&self, enc: DescriptorEncoder) -> fmt::Result {
        let mut s = self.slot.read();
        one_entry_per_app(&mut s.apps);
        write(&s, &mut Writer::new(enc))
    }
}

/// Drops the entries a publication under way has not written yet (no
/// name), and any second entry of one name (an application seen at two
/// places while the list shifted under a publication): one sample per
/// label set, as the format requires.
pub fn one_entry_per_app(apps: &mut Vec<AppFigures>) {
    let mut seen = std::collections::HashSet::new();
    apps.retain(|a| !a.name.is_empty() && seen.insert(a.name.clone()));
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

type AppLabel<'a> = [(&'static str, &'a str); 1];

fn app(a: &AppFigures) -> AppLabel<'_> {
    [("app", a.name.as_str())]
}

/// Every metric of `s`.
pub fn write(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    daemon_wide(s, w)?;
    allocator(s, w)?;
    nic(s, w)?;
    per_app(s, w)?;
    per_app_net(s, w)?;
    per_app_dispatch(s, w)?;
    per_app_channels(s, w)
}

fn daemon_wide(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    w.info(
        "ginza_iokernel",
        "iokerneld's core allocation policy and NIC",
        [("policy", s.policy), ("nic", s.nic.as_str())],
    )?;
    w.gauge(
        "ginza_iokernel_up",
        "1 once iokerneld's loop has published its figures (0: none yet)",
        None,
        i64::from(s.published),
    )?;
    w.gauge(
        "ginza_iokernel_uptime",
        "Time since iokerneld started",
        Some(Unit::Seconds),
        secs(ginza_sys::clock::monotonic_ns().saturating_sub(s.start_ns)),
    )?;
    w.counter(
        "ginza_iokernel_loop_cpu",
        "CPU time of iokerneld's loop thread",
        Some(Unit::Seconds),
        // 0 before the loop's first publication.
        secs(ginza_sys::clock::thread_cpu_ns_of(s.loop_tid).unwrap_or(0)),
    )?;
    w.gauge(
        "ginza_iokernel_managed_cores",
        "Cores iokerneld hands out",
        None,
        s.managed_cores,
    )?;
    w.gauge(
        "ginza_iokernel_interval",
        "Period of the allocation pass",
        Some(Unit::Seconds),
        secs(s.interval_ns),
    )?;
    w.gauge(
        "ginza_iokernel_applications",
        "Applications registered",
        None,
        s.apps.len() as u64,
    )?;
    w.counter(
        "ginza_iokernel_registrations_refused",
        "Registrations iokerneld refused",
        None,
        s.registrations_refused,
    )?;
    w.counter(
        "ginza_iokernel_applications_disconnected",
        "Applications iokerneld cut off (corrupt rings, bad messages)",
        None,
        s.apps_disconnected,
    )?;
    w.histograms(
        "ginza_iokernel_metrics_publish_duration",
        "The loop's time to publish these figures, per publication (every 100 ms)",
        Some(Unit::Seconds),
        [([] as [(&str, &str); 0], Histogram::from(&s.publish_cost))],
    )
}

fn allocator(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    let a = &s.alloc;
    w.counter("ginza_iokernel_passes", "Allocation passes", None, s.passes)?;
    w.histograms(
        "ginza_iokernel_pass_duration",
        "Wall time of an allocation pass, by whether it acted (a decision, wake, preemption or eviction) or not",
        Some(Unit::Seconds),
        [
            ([("outcome", "acted")], Histogram::from(&a.pass_acted)),
            ([("outcome", "idle")], Histogram::from(&a.pass_idle)),
        ],
    )?;
    w.counter("ginza_iokernel_grants", "Cores granted", None, a.grants)?;
    w.counter(
        "ginza_iokernel_preemptions",
        "Kthreads asked to give their core back",
        None,
        a.preemptions,
    )?;
    w.counter(
        "ginza_iokernel_reallocations",
        "Grants of a core last held by another application",
        None,
        a.reallocations,
    )?;
    w.counter(
        "ginza_iokernel_preemptions_withdrawn",
        "Preemptions of SCHED_IDLE kthreads withdrawn before their signal",
        None,
        a.withdrawn,
    )?;
    w.counters(
        "ginza_iokernel_handovers",
        "Hand-overs of a preempted core: completed, or abandoned (the receiver lost the core or left)",
        None,
        [
            ([("result", "completed")], a.handovers),
            ([("result", "abandoned")], a.handovers_abandoned),
        ],
    )?;
    w.counters(
        "ginza_iokernel_local_wakes",
        "Local wakes, by who woke the kthread: the SCHED_IDLE kthread on its core, or iokerneld after the wait",
        None,
        [
            ([("by", "kthread")], a.local_wakes),
            ([("by", "iokerneld")], a.local_wakes_by_iokernel),
        ],
    )?;
    w.histograms(
        "ginza_iokernel_grant_latency",
        "iokerneld's time to carry out a grant: bookkeeping, the Wake on the command ring, affinity and the wake-up",
        Some(Unit::Seconds),
        [([] as [(&str, &str); 0], Histogram::from(&a.grant_latency))],
    )?;
    w.histograms(
        "ginza_iokernel_handover_latency",
        "A completed hand-over: from the victim's preemption to the receiving kthread's wake",
        Some(Unit::Seconds),
        [(
            [] as [(&str, &str); 0],
            Histogram::from(&a.handover_latency),
        )],
    )
}

fn nic(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    let nic = [("nic", s.nic.as_str())];
    w.counters(
        "ginza_nic_rx_frames",
        "Frames received from the NIC",
        None,
        [(nic, s.nic_rx_frames)],
    )?;
    w.counters(
        "ginza_nic_tx_frames",
        "Frames transmitted on the NIC",
        None,
        [(nic, s.nic_tx_frames)],
    )?;
    w.counters(
        "ginza_nic_dropped_frames",
        "Frames for the NIC it did not accept",
        None,
        [(nic, s.nic_drops)],
    )
}

/// A counter family over the applications.
fn app_counter(
    s: &Snapshot,
    w: &mut Writer,
    name: &str,
    help: &str,
    f: impl Fn(&AppFigures) -> u64,
) -> fmt::Result {
    w.counters(name, help, None, s.apps.iter().map(|a| (app(a), f(a))))
}

/// A gauge family over the applications.
fn app_gauge(
    s: &Snapshot,
    w: &mut Writer,
    name: &str,
    help: &str,
    f: impl Fn(&AppFigures) -> u32,
) -> fmt::Result {
    w.gauges(name, help, None, s.apps.iter().map(|a| (app(a), f(a))))
}

fn per_app(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    w.infos(
        "ginza_app",
        "A registered application and its class",
        s.apps
            .iter()
            .map(|a| [("app", a.name.as_str()), ("class", a.class)]),
    )?;
    app_gauge(
        s,
        w,
        "ginza_app_cores",
        "Cores the application holds now",
        |a| a.cores,
    )?;
    app_gauge(
        s,
        w,
        "ginza_app_guaranteed_cores",
        "Cores never taken from it",
        |a| a.guaranteed,
    )?;
    app_gauge(
        s,
        w,
        "ginza_app_max_cores",
        "The most cores it may hold",
        |a| a.max_cores,
    )?;
    app_gauge(s, w, "ginza_app_kthreads", "Its kthreads", |a| a.kthreads)?;
    app_gauge(
        s,
        w,
        "ginza_app_parked_kthreads",
        "Its kthreads parked now",
        |a| a.parked_kthreads,
    )?;
    app_counter(s, w, "ginza_app_grants", "Cores granted to it", |a| {
        a.grants
    })?;
    app_counter(
        s,
        w,
        "ginza_app_preemptions",
        "Its kthreads asked to give a core back",
        |a| a.preemptions,
    )?;
    app_counter(
        s,
        w,
        "ginza_app_congestion_events",
        "Passes that found an item of it waiting since the previous pass",
        |a| a.congestion_events,
    )?;
    app_counter(
        s,
        w,
        "ginza_app_parks",
        "Times a kthread of it parked (gave its core back, idle)",
        |a| a.parks,
    )?;
    app_counter(
        s,
        w,
        "ginza_app_steals",
        "Work its kthreads took from each other, as its runtime counts it (untrusted)",
        |a| a.steals,
    )?;
    app_counter(
        s,
        w,
        "ginza_app_preemptions_overdue",
        "Its preempted kthreads that missed the deadline and were moved off their core",
        |a| a.preempt_overdue,
    )?;
    app_counter(
        s,
        w,
        "ginza_app_commands_dropped",
        "Wake or preempt commands to it dropped because its command ring was full",
        |a| a.commands_dropped,
    )?;
    w.histograms(
        "ginza_app_request_latency",
        "Its requests' time from arrival to the reply's send, as its runtime reports them (ginza_runtime::metrics; untrusted, judged before it is believed)",
        Some(Unit::Seconds),
        s.apps
            .iter()
            .map(|a| (app(a), Histogram::from(&a.request_latency))),
    )
}

fn per_app_net(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    let net = |f: fn(&ginza_proto::messages::NetStats) -> u64| {
        s.apps
            .iter()
            .filter_map(move |a| a.net.as_ref().map(|n| (app(a), f(n))))
    };
    w.counters(
        "ginza_app_rx_packets",
        "Packets put on its ingress rings",
        None,
        net(|n| n.rx),
    )?;
    w.counters(
        "ginza_app_tx_packets",
        "Packets taken from its egress rings",
        None,
        net(|n| n.tx),
    )?;
    w.counters(
        "ginza_app_rx_dropped_packets",
        "Packets for it dropped (ingress ring, buffers or switch port full)",
        None,
        net(|n| n.drop_ingress),
    )?;
    w.counters(
        "ginza_app_tx_dropped_packets",
        "Packets it sent that were dropped (bad length, unknown destination, spoofed source)",
        None,
        net(|n| n.drop_egress),
    )?;
    w.counters(
        "ginza_app_rx_to_parked_packets",
        "Packets that went to a parked kthread because none was active",
        None,
        net(|n| n.to_parked),
    )?;
    w.counters(
        "ginza_app_flows_moved",
        "Flows its packet steering moved from one kthread to another",
        None,
        net(|n| n.mv),
    )
}

/// One of a dispatched application's counters.
type DispatchCounter = fn(&ginza_proto::messages::DispatchStats) -> u64;

fn per_app_dispatch(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    let d = |f: fn(&ginza_proto::messages::DispatchStats) -> u64| {
        s.apps
            .iter()
            .filter_map(move |a| a.dispatch.as_ref().map(|d| (app(a), f(&d.counters))))
    };
    let counters: [(&str, &str, DispatchCounter); 9] = [
        (
            "ginza_app_dispatch_arrived",
            "Requests iokerneld queued for it",
            |c| c.ar,
        ),
        (
            "ginza_app_dispatch_runs",
            "Run commands sent (new and resumed requests)",
            |c| c.ru,
        ),
        ("ginza_app_dispatch_completed", "Requests completed", |c| {
            c.co
        }),
        (
            "ginza_app_dispatch_preempted",
            "Requests handed back preempted",
            |c| c.pe,
        ),
        (
            "ginza_app_dispatch_preemptions_asked",
            "Preemptions asked (the yield flag set)",
            |c| c.ak,
        ),
        (
            "ginza_app_dispatch_backstop_signals",
            "Backstop signals to workers that had not yielded",
            |c| c.bs,
        ),
        (
            "ginza_app_dispatch_refused",
            "Requests it refused unrun",
            |c| c.rf,
        ),
        (
            "ginza_app_dispatch_taken_back",
            "Runs taken back unrun and queued again",
            |c| c.tb,
        ),
        (
            "ginza_app_dispatch_bad_hand_backs",
            "Hand-backs refused (they named a request the worker did not hold)",
            |c| c.li,
        ),
    ];
    for (name, help, f) in counters {
        w.counters(name, help, None, d(f))?;
    }
    w.gauges(
        "ginza_app_dispatch_queued_requests",
        "Requests queued now",
        None,
        d(|c| c.qu),
    )?;
    w.histograms(
        "ginza_app_request_sojourn",
        "Completed requests' time in iokerneld, held to handed back (dispatched applications; bounds are the breakdown's power-of-two bands)",
        Some(Unit::Seconds),
        s.apps
            .iter()
            .filter_map(|a| a.dispatch.as_ref().map(|d| (app(a), Histogram::from(&d.sojourn)))),
    )
}

fn per_app_channels(s: &Snapshot, w: &mut Writer) -> fmt::Result {
    let ch = |f: fn(&super::ChannelFigures) -> u64| {
        s.apps
            .iter()
            .filter_map(move |a| a.channels.as_ref().map(|c| (app(a), f(c))))
    };
    w.counters(
        "ginza_app_command_ring_full",
        "Protected mode: times it found a command ring to its netstack full (back-pressure)",
        None,
        ch(|c| c.command_ring_full),
    )?;
    w.counters(
        "ginza_app_event_ring_full",
        "Protected mode: times its netstack found its event ring full (back-pressure)",
        None,
        ch(|c| c.event_ring_full),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_and_repeated_entries_are_not_shown() {
        let named = |n: &str, grants| AppFigures {
            name: n.into(),
            grants,
            ..Default::default()
        };
        let mut apps = vec![
            named("b", 1),
            named("b", 2),
            AppFigures::default(),
            named("c", 3),
        ];
        one_entry_per_app(&mut apps);
        let got: Vec<_> = apps.iter().map(|a| (a.name.as_str(), a.grants)).collect();
        assert_eq!(got, [("b", 1), ("c", 3)]);
    }
}
