//! The figures iokerneld's loop publishes for the metrics: plain copies
//! of its counters, refreshed in place.

use ginza_metrics::buckets::{Buckets, LATENCY_BOUNDS_NS, PASS_BOUNDS_NS};
use ginza_proto::messages::{DispatchStats, NetStats};
use ginza_shm::request_latency::REQUEST_LATENCY_BOUNDS_NS;

/// Upper bounds of the request sojourn histogram: the dispatch breakdown's
/// bands (2^i µs, docs/colocate.md) up to about a second; longer sojourns
/// count above every bound.
pub static SOJOURN_BOUNDS_NS: [u64; 20] = sojourn_bounds();

const fn sojourn_bounds() -> [u64; 20] {
    let mut b = [0; 20];
    let mut i = 0;
    while i < 20 {
        b[i] = 1000 << (i + 1);
        i += 1;
    }
    b
}

/// iokerneld as the metrics see it.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// False until the loop's first publication.
    pub published: bool,
    pub policy: &'static str,
    /// `software` or the real interface's spec.
    pub nic: String,
    pub managed_cores: u64,
    pub interval_ns: u64,
    /// When iokerneld started (CLOCK_MONOTONIC): the uptime is read at
    /// the scrape.
    pub start_ns: u64,
    /// The loop thread's id: its CPU time is read at the scrape, from the
    /// metrics thread (`ginza_sys::clock::thread_cpu_ns_of`), not by the
    /// loop (a system call of a microsecond or more).
    pub loop_tid: i32,
    pub passes: u64,
    pub registrations_refused: u64,
    pub apps_disconnected: u64,
    /// The allocator's counts and histograms since iokerneld started.
    pub alloc: Lifetime,
    pub nic_rx_frames: u64,
    pub nic_tx_frames: u64,
    pub nic_drops: u64,
    /// The loop's time per publication, before this one.
    pub publish_cost: Buckets,
    /// The registered applications, in registration order.
    pub apps: Vec<AppFigures>,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            published: false,
            policy: "",
            nic: String::new(),
            managed_cores: 0,
            interval_ns: 0,
            start_ns: 0,
            loop_tid: 0,
            passes: 0,
            registrations_refused: 0,
            apps_disconnected: 0,
            alloc: Lifetime::default(),
            nic_rx_frames: 0,
            nic_tx_frames: 0,
            nic_drops: 0,
            publish_cost: Buckets::new(PASS_BOUNDS_NS),
            apps: Vec::new(),
        }
    }
}

/// One registered application.
#[derive(Clone, Debug)]
pub struct AppFigures {
    pub name: String,
    pub class: &'static str,
    pub cores: u32,
    pub guaranteed: u32,
    pub max_cores: u32,
    pub kthreads: u32,
    pub parked_kthreads: u32,
    pub grants: u64,
    pub preemptions: u64,
    pub congestion_events: u64,
    /// `Parked` messages taken (a kthread gave its core back, idle).
    pub parks: u64,
    pub steals: u64,
    pub preempt_overdue: u64,
    /// Wake/preempt commands dropped: its command ring was full.
    pub commands_dropped: u64,
    /// Packets, for an application registered with `net`.
    pub net: Option<NetStats>,
    /// Its requests, when iokerneld dispatches them.
    pub dispatch: Option<DispatchFigures>,
    /// Protected mode: the back-pressure on its channels to a netstack.
    pub channels: Option<ChannelFigures>,
    /// Its requests' latency, as its runtime reports it (believed reads,
    /// summed over its kthreads).
    pub request_latency: Buckets,
}

impl Default for AppFigures {
    fn default() -> Self {
        AppFigures {
            name: String::new(),
            class: "",
            cores: 0,
            guaranteed: 0,
            max_cores: 0,
            kthreads: 0,
            parked_kthreads: 0,
            grants: 0,
            preemptions: 0,
            congestion_events: 0,
            parks: 0,
            steals: 0,
            preempt_overdue: 0,
            commands_dropped: 0,
            net: None,
            dispatch: None,
            channels: None,
            request_latency: Buckets::new(&REQUEST_LATENCY_BOUNDS_NS),
        }
    }
}

/// A dispatched application's requests.
#[derive(Clone, Debug)]
pub struct DispatchFigures {
    pub counters: DispatchStats,
    /// Completed requests' sojourn in iokerneld (held → handed back).
    pub sojourn: Buckets,
}

impl Default for DispatchFigures {
    fn default() -> Self {
        DispatchFigures {
            counters: DispatchStats::default(),
            sojourn: Buckets::new(&SOJOURN_BOUNDS_NS),
        }
    }
}

/// The channels between a protected application and its netstack, summed
/// over their ring pairs (counts the peers write: untrusted, stats only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelFigures {
    pub channels: u32,
    /// Times the application found a command ring full.
    pub command_ring_full: u64,
    /// Times the netstack found an event ring full.
    pub event_ring_full: u64,
}

/// The allocator's counts since iokerneld started: a `ResetStats` ends a
/// window of the stats, never these (Prometheus counters only go up).
/// Counts are folded in at each reset; histograms are recorded beside the
/// windows' into fixed buckets (a few ns a sample).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub grants: u64,
    pub preemptions: u64,
    pub reallocations: u64,
    pub handovers: u64,
    pub handovers_abandoned: u64,
    pub withdrawn: u64,
    pub local_wakes: u64,
    pub local_wakes_by_iokernel: u64,
    /// iokerneld's time per grant (`AllocStats::grant_cost`).
    pub grant_latency: Buckets,
    /// Per completed hand-over (`AllocStats::handover`).
    pub handover_latency: Buckets,
    /// Wall time of passes that acted, and of the others.
    pub pass_acted: Buckets,
    pub pass_idle: Buckets,
}

impl Default for Lifetime {
    fn default() -> Self {
        Lifetime {
            grants: 0,
            preemptions: 0,
            reallocations: 0,
            handovers: 0,
            handovers_abandoned: 0,
            withdrawn: 0,
            local_wakes: 0,
            local_wakes_by_iokernel: 0,
            grant_latency: Buckets::new(LATENCY_BOUNDS_NS),
            handover_latency: Buckets::new(LATENCY_BOUNDS_NS),
            pass_acted: Buckets::new(PASS_BOUNDS_NS),
            pass_idle: Buckets::new(PASS_BOUNDS_NS),
        }
    }
}

impl Lifetime {
    /// Becomes a copy of `o` without allocating (the published snapshot).
    pub fn copy_from(&mut self, o: &Lifetime) {
        self.grants = o.grants;
        self.preemptions = o.preemptions;
        self.reallocations = o.reallocations;
        self.handovers = o.handovers;
        self.handovers_abandoned = o.handovers_abandoned;
        self.withdrawn = o.withdrawn;
        self.local_wakes = o.local_wakes;
        self.local_wakes_by_iokernel = o.local_wakes_by_iokernel;
        self.grant_latency.copy_from(&o.grant_latency);
        self.handover_latency.copy_from(&o.handover_latency);
        self.pass_acted.copy_from(&o.pass_acted);
        self.pass_idle.copy_from(&o.pass_idle);
    }
}
