//! The Prometheus endpoint of Ginza's daemons (docs/metrics.md).
//!
//! A daemon's hot loop never formats text nor answers a socket: it
//! records into fixed-bucket histograms ([`Buckets`], one array index per
//! sample) and, every so often, copies its counters into a [`Slot`]
//! without ever waiting for it. A [`MetricsServer`] thread answers
//! `GET /metrics` by copying the slot's snapshot and encoding it with
//! `prometheus-client` (OpenMetrics text), so a scrape costs the loop
//! nothing.
//!
//! * [`buckets`]: histograms a loop can record into without allocating;
//! * [`slot`]: the snapshot handed from the loop to the server;
//! * [`http`]: one request in, one response out (pure, no sockets);
//! * [`server`]: the listener thread and its connections;
//! * [`exposition`]: helpers that write metrics with `prometheus-client`;
//! * [`testing`]: a scraping client and the reference parser for tests.

#![forbid(unsafe_code)]

pub mod buckets;
pub mod exposition;
pub mod http;
pub mod server;
pub mod slot;
pub mod testing;

pub use buckets::Buckets;
pub use prometheus_client;
pub use server::{MetricsServer, Render};
pub use slot::Slot;

/// How a metrics address is written: `IP:PORT`.
pub fn parse_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.trim().parse().map_err(|_| {
        format!("{s:?} is not an address to listen on: expected IP:PORT, e.g. 127.0.0.1:9464 or [::]:9464")
    })
}
