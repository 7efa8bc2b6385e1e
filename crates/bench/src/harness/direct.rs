//! The direct path in the benches (docs/direct-path.md): the veth has
//! [`QUEUES`] queues; iokerneld opens its host end for applications' own
//! sockets (`af_xdp:IF,direct`, driver mode); the Ginza server binds an
//! AF_XDP socket of its own to queue 1, 2, … in turn (a queue just closed
//! is freed by the kernel in a work item, tens of ms, which a reused queue
//! would wait for in `bind`'s retry; docs/direct-path.md); and while it
//! serves,
//! every CPU of the namespace transmits on that queue (XPS), which a veth
//! delivers on the receive queue of the same number. Between direct rounds the namespace transmits on queue 0, so
//! the other servers (iokerneld's switch path in generic mode, Linux's)
//! see its frames as on a one-queue veth.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use anyhow::{anyhow, Context as _};
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_proto::StatsReport;
use ginza_runtime::net::{DirectPathConfig, NetStats};
use serde::Serialize;

use super::iokerneld::{start_on, Cpus};

/// The veth's queues in a bench with a direct-path server: one direct-path
/// point per queue but 0 before a queue is used again, since a queue an
/// in-process server's own socket was bound to stayed busy (`EBUSY`) for
/// minutes after it, well past 15 points (`ginza bench memcached`'s
/// default sweep has 18 direct points, a run with memcached-ginza-direct
/// and the library's cost more).
pub(crate) const QUEUES: u32 = 64;

/// The queue of the next direct-path server's own socket: 1 to 63 in turn.
fn next_queue() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    1 + N.fetch_add(1, Relaxed) % (QUEUES - 1)
}

/// A namespace whose veth has [`QUEUES`] queues, transmitting on queue 0.
pub(crate) fn namespace() -> std::io::Result<NetNs> {
    let ns = NetNs::create_with_queues(QUEUES)?;
    ns.steer_transmit_to_queue(QUEUES, 0)?;
    Ok(ns)
}

/// Sets the direct path on in `config`'s network configuration (the own
/// socket on `queue` of `ns`'s host end; its tx ring kicked per frame
/// if `kick_per_frame`, for comparison, else per burst).
pub(crate) fn enable(
    config: &mut ginza_runtime::Config,
    ns: &NetNs,
    queue: u32,
    kick_per_frame: bool,
) {
    if let Some(net) = config.iokernel.as_mut().and_then(|io| io.net.as_mut()) {
        net.direct = Some(DirectPathConfig {
            interface: ns.host_if.clone(),
            queue,
            kick_per_frame,
        });
    }
}

/// iokerneld on `af_xdp:HOST_IF,direct` (its configuration adjusted by
/// `configure`), with the namespace transmitting on the queue `run` is
/// given for the server's own socket while `run` runs, and on queue 0
/// again after it, whatever `run` returned.
pub(crate) fn with_iokerneld_direct<R>(
    ns: &NetNs,
    cpus: Cpus,
    configure: impl FnOnce(&mut IokConfig) -> anyhow::Result<()>,
    run: impl FnOnce(&InProcess, u32) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let nic = format!("af_xdp:{},direct", ns.host_if);
    let iokerneld = start_on(&nic, cpus, configure)
        .with_context(|| format!("iokerneld for the direct path ({nic})"))?;
    let queue = next_queue();
    ns.steer_transmit_to_queue(QUEUES, queue)
        .context("steering the namespace's frames to the own socket's queue (XPS)")?;
    let result = run(&iokerneld, queue);
    let steered_back = ns.steer_transmit_to_queue(QUEUES, 0);
    drop(iokerneld);
    let result = result?;
    steered_back.context("steering the namespace back to queue 0 (XPS)")?;
    Ok(result)
}

/// Where a direct-path server's frames went: its own socket's counts
/// against iokerneld's NIC's over the same server's life.
#[derive(Serialize, Debug, Clone, Copy, Default)]
pub struct DirectFrames {
    /// Frames the server's runtime received and sent on its own socket.
    pub own_rx: u64,
    pub own_tx: u64,
    /// `sendto`s that kicked its tx ring.
    pub own_tx_kicks: u64,
    /// Frames iokerneld's NIC received and sent meanwhile (the switch
    /// path: misses of the XDP program, or nothing).
    pub iokernel_nic_rx: u64,
    pub iokernel_nic_tx: u64,
}

impl DirectFrames {
    /// The server's counters (`net`, read in its runtime as it stopped)
    /// and iokerneld's NIC counters at its start and now.
    pub(crate) fn of(
        net: Option<&NetStats>,
        before: &StatsReport,
        after: &StatsReport,
    ) -> anyhow::Result<DirectFrames> {
        let net = net.ok_or_else(|| anyhow!("the direct-path server has no network stats"))?;
        let own = [
            net.direct_rx_packets,
            net.direct_tx_packets,
            net.direct_tx_kicks,
        ];
        Ok(DirectFrames::with_nic(own, before, after))
    }

    /// The own socket's `[received, sent, kicks]` beside iokerneld's NIC
    /// counters at the server's start and now.
    pub(crate) fn with_nic(own: [u64; 3], before: &StatsReport, after: &StatsReport) -> Self {
        let nic = |f: fn(&StatsReport) -> u64| f(after).saturating_sub(f(before));
        DirectFrames {
            own_rx: own[0],
            own_tx: own[1],
            own_tx_kicks: own[2],
            iokernel_nic_rx: nic(|s| s.dataplane.nic_rx_frames),
            iokernel_nic_tx: nic(|s| s.dataplane.nic_tx_frames),
        }
    }

    /// An error unless the server's own socket carried at least `trips`
    /// requests and their replies: a direct-path figure must come from the
    /// direct path, not from the switch path it falls back to.
    pub(crate) fn check(&self, trips: u64) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.own_rx >= trips && self.own_tx >= trips,
            "the direct-path server's own socket carried {} frames in and {} out for {trips} \
             round trips (iokerneld's NIC: {} in, {} out): the frames did not take the direct path",
            self.own_rx,
            self.own_tx,
            self.iokernel_nic_rx,
            self.iokernel_nic_tx
        );
        Ok(())
    }

    /// The sum of two servers' counts.
    pub(crate) fn add(self, o: DirectFrames) -> DirectFrames {
        DirectFrames {
            own_rx: self.own_rx + o.own_rx,
            own_tx: self.own_tx + o.own_tx,
            own_tx_kicks: self.own_tx_kicks + o.own_tx_kicks,
            iokernel_nic_rx: self.iokernel_nic_rx + o.iokernel_nic_rx,
            iokernel_nic_tx: self.iokernel_nic_tx + o.iokernel_nic_tx,
        }
    }
}
