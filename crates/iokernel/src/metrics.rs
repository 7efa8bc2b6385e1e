//! iokerneld's Prometheus metrics (`--metrics ADDR`, docs/metrics.md).
//!
//! The loop never answers a scrape. Every [`PUBLISH_EVERY`] it copies its
//! counters into a [`Snapshot`] in a [`Slot`] whose lock it only tries to
//! take (`daemon::publish`), a few applications a turn: no allocation once
//! the snapshot has room for every application, no wait if a scrape is
//! copying it at that moment (then it tries again at its next turn). A [`MetricsServer`]
//! thread answers `GET /metrics` from a copy of that snapshot, encoded by
//! `prometheus-client` ([`exposition`]). So a scrape costs the loop
//! nothing, and publishing costs it a few microseconds a turn for a few
//! turns ten times a second (`ginza_iokernel_metrics_publish_duration_seconds`
//! says how much).
//!
//! * [`snapshot`]: the figures the loop publishes;
//! * [`exposition`]: those figures as named metrics.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ginza_metrics::prometheus_client::registry::Registry;
use ginza_metrics::{MetricsServer, Slot};

pub mod exposition;
pub mod snapshot;

pub use snapshot::{AppFigures, ChannelFigures, DispatchFigures, Lifetime, Snapshot};

/// How often the loop refreshes the snapshot: a scrape sees figures at
/// most this old.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// The loop's end of the metrics: the slot it publishes into and the
/// server that reads it.
pub(crate) struct Endpoint {
    pub(crate) slot: Arc<Slot<Snapshot>>,
    server: MetricsServer,
    /// When the next publication is due (the loop's clock).
    pub(crate) next_due: u64,
    /// A publication under way: the next application to copy.
    pub(crate) cursor: Option<usize>,
    /// The thread that runs the loop (set when it starts).
    pub(crate) loop_tid: i32,
    /// The loop's time per publication so far.
    pub(crate) publish_cost: ginza_metrics::Buckets,
}

impl Endpoint {
    /// Listens on `addr`; the text comes from the snapshot the loop
    /// publishes (empty of applications until its first publication).
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<Endpoint> {
        let slot = Arc::new(Slot::new(Snapshot::default()));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(exposition::Collector::new(Arc::clone(&slot))));
        let server = MetricsServer::bind(
            addr,
            Arc::new(move || ginza_metrics::exposition::render(&registry)),
        )?;
        Ok(Endpoint {
            slot,
            server,
            next_due: 0,
            cursor: None,
            loop_tid: 0,
            publish_cost: ginza_metrics::Buckets::new(ginza_metrics::buckets::PASS_BOUNDS_NS),
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// A publication step is due: one is under way, or the period ended.
    #[inline]
    pub(crate) fn due(&self, now: u64) -> bool {
        self.cursor.is_some() || now >= self.next_due
    }
}
