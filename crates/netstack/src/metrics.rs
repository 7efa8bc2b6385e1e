//! The netstack's Prometheus metrics (`ginza netstack --metrics ADDR`,
//! docs/metrics.md). The netstack has no fixed-period loop to publish
//! from: a scrape, on the metrics server's thread, takes the engine's lock
//! only to copy its counters (plain integers, no allocation), as
//! [`crate::daemon::Daemon::stats`] does, and encodes the copy after
//! letting go.

use std::fmt;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use ginza_metrics::exposition::Writer;
use ginza_metrics::prometheus_client::collector;
use ginza_metrics::prometheus_client::encoding::DescriptorEncoder;
use ginza_metrics::prometheus_client::registry::{Registry, Unit};
use ginza_metrics::MetricsServer;

use crate::engine::{Netstack, NetstackStats};
use crate::server::lock;

/// Encodes the engine's counters at each scrape.
struct Collector {
    engine: Arc<Mutex<Netstack>>,
    name: String,
}

impl fmt::Debug for Collector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collector")
            .field("name", &self.name)
            .finish()
    }
}

impl collector::Collector for Collector {
    fn encode(&self, enc: DescriptorEncoder) -> fmt::Result {
        let st = lock(&self.engine).stats();
        write(&self.name, &st, &mut Writer::new(enc))
    }
}

/// Serves the counters of `engine` (the netstack named `name`) at
/// `http://ADDR/metrics` on `listener` (bound to ADDR).
pub fn serve(
    listener: TcpListener,
    name: &str,
    engine: Arc<Mutex<Netstack>>,
) -> std::io::Result<MetricsServer> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collector {
        engine,
        name: name.to_string(),
    }));
    MetricsServer::start(
        listener,
        Arc::new(move || ginza_metrics::exposition::render(&registry)),
    )
}

/// Every metric of the netstack named `name` with counters `st`.
pub fn write(name: &str, st: &NetstackStats, w: &mut Writer) -> fmt::Result {
    w.info(
        "ginza_netstack",
        "The netstack's name in iokerneld",
        [("name", name)],
    )?;
    w.gauge(
        "ginza_netstack_applications",
        "Protected applications attached",
        None,
        st.apps,
    )?;
    w.gauge(
        "ginza_netstack_connections",
        "TCP connections open",
        None,
        st.connections,
    )?;
    let counters: [(&str, &str, u64); 11] = [
        (
            "ginza_netstack_rx_frames",
            "Frames taken from its ingress rings",
            st.frames_in,
        ),
        (
            "ginza_netstack_tx_frames",
            "Frames put on its egress rings",
            st.frames_out,
        ),
        (
            "ginza_netstack_rx_frames_not_ours",
            "Frames for no address or connection of its",
            st.frames_not_ours,
        ),
        (
            "ginza_netstack_rx_segments",
            "TCP segments received",
            st.segments_in,
        ),
        (
            "ginza_netstack_resets_sent",
            "TCP resets sent",
            st.resets_sent,
        ),
        (
            "ginza_netstack_no_route",
            "Frames not sent because the peer's MAC was unknown",
            st.no_route,
        ),
        (
            "ginza_netstack_commands",
            "Commands taken from the applications' command rings",
            st.commands,
        ),
        (
            "ginza_netstack_commands_refused",
            "Commands refused",
            st.refused,
        ),
        (
            "ginza_netstack_events",
            "Events put on the applications' event rings",
            st.events,
        ),
        (
            "ginza_netstack_event_ring_full",
            "Times an event ring was full (back-pressure: the events wait)",
            st.event_ring_full,
        ),
        (
            "ginza_netstack_applications_disconnected",
            "Applications cut off (garbage, corrupt rings, hang-ups)",
            st.apps_disconnected,
        ),
    ];
    for (name, help, v) in counters {
        w.counter(name, help, None, v)?;
    }
    let bytes: [(&str, &str, u64); 3] = [
        (
            "ginza_netstack_rx_delivered",
            "Payload bytes delivered into the applications' receive pools",
            st.rx_bytes_delivered,
        ),
        (
            "ginza_netstack_tx_copied",
            "Payload bytes copied from transmit pools (the copying path)",
            st.tx_bytes_copied,
        ),
        (
            "ginza_netstack_tx_zero_touch",
            "Payload bytes sent zero-touch (named by the netstack, copied by iokerneld)",
            st.tx_bytes_zero_touch,
        ),
    ];
    for (name, help, v) in bytes {
        w.counter(name, help, Some(Unit::Bytes), v)?;
    }
    w.counter(
        "ginza_netstack_tx_unnamed_frames",
        "Zero-touch frames dropped because a gather list could not name their payload",
        None,
        st.tx_frames_unnamed,
    )
}
