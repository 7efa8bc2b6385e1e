//! The figures iokerneld's loop publishes for the metrics: plain copies
//! of its counters, refreshed in place.

use ginza_metrics::Buckets;
use ginza_proto::messages::{DispatchStats, NetStats};

use crate::daemon::Lifetime;

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
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// False until the loop's first publication.
    pub published: bool,
    pub policy: &'static str,
    /// `software` or the real interface's spec.
    pub nic: String,
    pub managed_cores: u64,
    pub interval_ns: u64,
    pub uptime_ns: u64,
    /// CPU time of the loop thread.
    pub loop_cpu_ns: u64,
    pub passes: u64,
    pub registrations_refused: u64,
    pub apps_disconnected: u64,
    /// The allocator's counts and histograms since iokerneld started.
    pub alloc: Lifetime,
    pub nic_rx_frames: u64,
    pub nic_tx_frames: u64,
    pub nic_drops: u64,
    /// Publications before this one, and the loop's time spent on them.
    pub publishes: u64,
    pub publish_ns: u64,
    /// The registered applications, in registration order.
    pub apps: Vec<AppFigures>,
}

/// One registered application.
#[derive(Clone, Debug, Default)]
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
