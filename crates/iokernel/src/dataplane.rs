//! iokerneld's dataplane (docs/design.md, "Packet steering", "NIC backends"):
//! frames between the links and the applications' packet rings.
//!
//! The fabric is a [`SoftwareSwitch`] with one port per application that
//! registered an address, one for the traffic generator, and, when iokerneld
//! drives a real interface, a trunk port towards it. Local traffic between
//! applications is switched there and never touches a NIC; the switch's
//! per-port MAC check keeps an application from sending as another.
//!
//! Per loop iteration ([`Dataplane::poll_links`] and the per-application
//! calls the daemon makes):
//! * the generator collects replies and injects due requests on its port;
//! * the real NIC's received frames enter the switch by the trunk, and what
//!   the switch sends to the trunk leaves by the NIC;
//! * [`Dataplane::deliver`]: frames on an application's port (switched
//!   there by destination MAC; of a broadcast ARP request, only the port of
//!   the application with the target IP keeps it) are copied
//!   into buffers of its ingress pool and steered by the application's
//!   steering policy ([`ginza_policy::steer`]: `rss-mod`, Shenango's
//!   `active[flow_hash % active.len()]`, by default; `flow-affinity` or
//!   `indirection` by configuration or registration) to an active kthread's ingress
//!   ring; an application with no active kthread gets the frame on a parked
//!   kthread's ring and the caller tells the core allocator at once
//!   (`CoreAllocator::on_work_for`), which grants a core;
//! * [`Dataplane::transmit`]: each frame of an active kthread's egress
//!   ring is copied once out of shared memory into a scratch buffer, and
//!   the switch copies it from there to its destination
//!   ([`SoftwareSwitch::send_copy`]: no port-pool buffer per frame);
//! * [`Dataplane::take_back`]: ingress buffers the runtime gave back return
//!   to the ledger; a buffer that was not lent disconnects the application.
//!
//! Nothing here blocks or grows: full rings and empty pools are counted
//! drops ([`NetStats`]), and one application's floods fill only its own
//! rings and pool.
//!
//! Fault injection (`--faults`, docs/fault-injection.md): each port gets,
//! when it is created (the generator's and the trunk at start, an
//! application's when it attaches), the injectors of the first rules that
//! name it ([`crate::nic::faults`]); the switch's clock is advanced at the
//! start of every [`Dataplane::poll_links`]. Counted per rule in
//! [`DataplaneStats::faults`]. Set up in `dataplane/fault_setup.rs`; the
//! generator's load runs are driven from `dataplane/load.rs`.

pub mod copy_floor;
mod direct;
mod fault_setup;
mod load;
mod own_socket;

pub use fault_setup::FaultsHandle;
use load::RunningLoad;
pub use load::{GeneratorHandle, LoadReport, LoadRun, GENERATOR_IP};
pub use own_socket::OwnSocket;

use std::time::Duration;

use ginza_net::flow::steer_key;
use ginza_net::{Interface, MacAddr};
use ginza_policy::steer::{AppSteering, SteeringKind, SteeringOptions};
use ginza_proto::messages::{DataplaneStats, NetStats, SteeringStats};
use ginza_shm::netstack::{
    assemble, GatherError, GatherList, EGRESS_FILL_L4_CHECKSUM, EGRESS_GATHER, GATHER_OFFSET,
};
use ginza_shm::{BufferLedger, IngressPool, IokernelEnd, PacketDesc, PKT_BUFFER_SIZE};
use ginza_sys::hops::{self, Hop};

use crate::loop_waker::LoopWaker;
use crate::nic::faults::{FaultCounters, FaultRule, PortIdentity};
use crate::nic::{Frame, Nic, PortConfig, PortId, SoftwareSwitch};

/// A burst's steering timed longer than this was preempted (a burst of
/// [`BURST`] decisions takes a few µs): not counted in the stats.
const STEER_TIMING_OUTLIER_NS: u64 = 50_000;

/// One burst of steering decisions in this many is timed
/// ([`Dataplane::deliver`]).
const STEER_TIMING_EVERY: u32 = 8;

/// Frames moved per link or ring per call: bounds one iteration's work.
pub const BURST: usize = 32;

/// The traffic generator's MAC on the switch.
pub const GENERATOR_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0xff, 0x00, 0x01]);
/// The trunk port's MAC (frames it sends keep their own source MACs).
const TRUNK_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0xff, 0x00, 0x02]);

/// One application's side of the dataplane.
pub struct AppNet {
    pub interface: Interface,
    port: PortId,
    pool: IngressPool,
    ledger: BufferLedger,
    /// Which kthread's ring each frame goes to; the caller keeps its active
    /// set up to date ([`AppSteering::sync`]).
    pub steering: AppSteering,
    pub stats: NetStats,
    /// Steering decisions timed, and the ns they took ([`Dataplane::deliver`]).
    pub steer_decisions: u64,
    pub steer_ns: u64,
    /// Switch drops already counted in `stats` (the port's counters are
    /// cumulative): frames for the port, frames from it.
    switch_drops_seen: (u64, u64),
    /// More addresses steered to this application (protected mode: a
    /// netstack takes its applications' addresses; docs/protected.md).
    pub aliases: Vec<Interface>,
    /// Protected applications' tx pools, by link, for zero-touch frames
    /// (`ginza_shm::netstack::gather`).
    pub tx_pools: Vec<(u64, ginza_shm::netstack::TxPoolView)>,
    /// Dispatch by iokerneld (docs/colocate.md): UDP requests are held
    /// here for the dispatcher instead of being steered to a ring.
    pub held: Option<Vec<PacketDesc>>,
    /// Its own AF_XDP socket, on the direct path (docs/direct-path.md).
    pub own_socket: Option<OwnSocket>,
}

impl AppNet {
    /// Its counters for a stats report, the steering policy's included.
    pub fn report(&self) -> NetStats {
        let steer = self.steering.stats();
        NetStats {
            mv: self.steering.flows_remapped().unwrap_or(steer.flows_moved),
            ev: steer.table_evictions,
            tb: u32::try_from(steer.table_bytes).unwrap_or(u32::MAX),
            ..self.stats
        }
    }

    /// The bytes of a held request's packet.
    pub fn held_frame(&self, desc: PacketDesc) -> Option<&[u8]> {
        self.pool.frame(desc)
    }

    /// Adds its steering measurements to `totals` (one entry per policy),
    /// with `steals`, its application's steals.
    pub fn add_steering(&self, totals: &mut Vec<SteeringStats>, steals: u64) {
        let steer = self.steering.stats();
        let entry = match totals.iter_mut().position(|t| t.st == self.stats.st) {
            Some(i) => &mut totals[i],
            None => {
                totals.push(SteeringStats {
                    st: self.stats.st,
                    ..Default::default()
                });
                totals.last_mut().expect("just pushed")
            }
        };
        entry.apps += 1;
        entry.ch += self.steering.changes();
        entry.mv += self.steering.flows_remapped().unwrap_or(0);
        entry.ms += steer.flows_moved;
        entry.sd += self.steer_decisions;
        entry.sn += self.steer_ns;
        entry.tb += steer.table_bytes;
        entry.sl += steals;
    }

    /// Its port on the switch.
    pub fn port(&self) -> PortId {
        self.port
    }

    /// The pool's memfd, sent to the runtime with its acceptance.
    pub fn pool(&self) -> &IngressPool {
        &self.pool
    }
}

/// The descriptors staged per kthread → their ingress rings, one index
/// store per ring and burst (the kthread's core pays one cache-line
/// transfer, not one per packet); frames a full ring refuses are counted
/// drops and their buffers go back to the ledger. Returns why the
/// application must be disconnected, if a ring is corrupt.
fn publish(
    staged: &mut [Vec<PacketDesc>],
    net: &mut AppNet,
    ends: &mut [IokernelEnd],
) -> Option<String> {
    let mut corrupt = None;
    for (k, staged) in staged.iter_mut().enumerate().filter(|(_, s)| !s.is_empty()) {
        let taken = match ends.get_mut(k).map(|end| end.ingress.push_slice(staged)) {
            Some(Ok(n)) => n,
            Some(Err(e)) => {
                corrupt.get_or_insert(format!("kthread {k}'s ingress ring is corrupt: {e}"));
                0
            }
            None => 0,
        };
        net.stats.rx += taken as u64;
        for d in staged.drain(..).skip(taken) {
            // Never delivered: the buffer is still ours.
            net.stats.drop_ingress += 1;
            net.ledger.give_back(d.buf).expect("lent just now");
        }
    }
    corrupt
}

/// The other applications on the switch, for [`Dataplane::transmit`]'s
/// direct path: frames from one application to another go straight from
/// the sender's egress buffer into the receiver's ingress pool.
pub trait Peers {
    /// The application attached at `port`, with its kthreads' rings, if
    /// it takes frames by the direct path (not while it is being removed;
    /// not where iokerneld holds its requests for dispatch).
    fn peer(&mut self, port: PortId) -> Option<(&mut AppNet, &mut [IokernelEnd])>;

    /// A frame went to a parked kthread of the application at `port`: its
    /// core allocator must hear of it at once.
    fn work_for(&mut self, port: PortId);

    /// The application at `port` must be disconnected (a corrupt ingress
    /// ring), for `reason`.
    fn disconnect(&mut self, port: PortId, reason: String);
}

/// No peer takes frames directly: everything goes through the switch.
pub struct NoPeers;

impl Peers for NoPeers {
    fn peer(&mut self, _: PortId) -> Option<(&mut AppNet, &mut [IokernelEnd])> {
        None
    }

    fn work_for(&mut self, _: PortId) {}

    fn disconnect(&mut self, _: PortId, _: String) {}
}

/// iokerneld's links and fabric.
pub struct Dataplane {
    switch: SoftwareSwitch,
    nic: Option<(Box<dyn Nic + Send>, PortId)>,
    generator_port: PortId,
    handle: GeneratorHandle,
    faults_handle: FaultsHandle,
    /// What the two handles ring after leaving a request.
    waker: LoopWaker,
    load: Option<RunningLoad>,
    frames: Vec<Frame>,
    out: Vec<Frame>,
    /// Per kthread: descriptors to push on its ingress ring (scratch).
    staged: Vec<Vec<PacketDesc>>,
    /// Buffer indices popped from a done ring (scratch).
    returned: Vec<u32>,
    /// One egress buffer copied out, for zero-touch frames (scratch).
    gather_scratch: Vec<u8>,
    /// The frame being transmitted, copied out of its egress buffer
    /// (scratch).
    frame_scratch: Vec<u8>,
    /// Per frame of a burst: its flow hash, `None` for a frame with no
    /// flow key (scratch).
    keys: Vec<Option<u32>>,
    /// The direct path's copies of one run, before their steering
    /// (scratch).
    copies: Vec<PacketDesc>,
    /// Flow hashes of a burst, and the kthreads steering picked for them
    /// (scratch).
    hashes: Vec<u64>,
    kthreads: Vec<usize>,
    /// Bursts steered, to time one in [`STEER_TIMING_EVERY`].
    steer_bursts: u32,
    stats: DataplaneStats,
    /// Sizes of the steering policies [`Dataplane::attach`] builds, and the
    /// flow table's warm-up after each attach.
    steering_options: SteeringOptions,
    flow_warm_up: Duration,
    /// `--faults`, in the order given.
    fault_rules: Vec<FaultRule>,
    /// Per rule: what its injectors on ports since removed (or replaced)
    /// did.
    retired_faults: Vec<FaultCounters>,
    /// Applications' ports, to match rules set while they are attached.
    app_ports: Vec<(PortId, String, MacAddr)>,
}

impl Dataplane {
    /// The fabric with the generator's port, and `nic` behind a trunk port.
    pub fn new(nic: Option<(String, Box<dyn Nic + Send>)>) -> Dataplane {
        let mut switch = SoftwareSwitch::new();
        let generator_port = switch
            .add_port(PortConfig::new(GENERATOR_MAC))
            .expect("an empty switch takes the generator's port");
        let mut name = "software".to_string();
        let nic = nic.map(|(spec, nic)| {
            name = spec;
            let trunk = switch
                .add_port(PortConfig::trunk(TRUNK_MAC))
                .expect("the switch has no trunk yet");
            (nic, trunk)
        });
        let waker = LoopWaker::default();
        Dataplane {
            switch,
            nic,
            generator_port,
            handle: GeneratorHandle::new(waker.clone()),
            faults_handle: FaultsHandle::new(waker.clone()),
            waker,
            load: None,
            frames: Vec::with_capacity(BURST),
            out: Vec::with_capacity(BURST),
            staged: Vec::new(),
            returned: Vec::with_capacity(4 * BURST),
            gather_scratch: vec![0; PKT_BUFFER_SIZE as usize],
            frame_scratch: vec![0; PKT_BUFFER_SIZE as usize],
            keys: Vec::with_capacity(BURST),
            copies: Vec::with_capacity(BURST),
            hashes: Vec::with_capacity(BURST),
            kthreads: Vec::with_capacity(BURST),
            steer_bursts: 0,
            stats: DataplaneStats {
                nic: name,
                ..Default::default()
            },
            steering_options: SteeringOptions::default(),
            flow_warm_up: Duration::ZERO,
            fault_rules: Vec::new(),
            retired_faults: Vec::new(),
            app_ports: Vec::new(),
        }
    }

    pub fn stats(&self) -> DataplaneStats {
        let running = self.running_load_stats();
        DataplaneStats {
            faults: self.fault_stats(),
            generator_replies: self.stats.generator_replies + running.map_or(0, |s| s.replies),
            generator_reordered: self.stats.generator_reordered
                + running.map_or(0, |s| s.reordered),
            ..self.stats.clone()
        }
    }

    /// Sizes the steering policies of applications attached from now on;
    /// `flow_warm_up` after its attach, a `flow-affinity` table steers every
    /// other new flow round-robin (`warm_up_until` of `options` is ignored).
    pub fn set_steering_options(&mut self, options: SteeringOptions, flow_warm_up: Duration) {
        self.steering_options = options;
        self.flow_warm_up = flow_warm_up;
    }

    /// Frames the real NIC has received and transmitted so far (0, 0
    /// without one).
    pub fn nic_frames(&self) -> (u64, u64) {
        (self.stats.nic_rx_frames, self.stats.nic_tx_frames)
    }

    /// The NIC's frames received, transmitted and dropped so far.
    pub fn nic_counters(&self) -> (u64, u64, u64) {
        (
            self.stats.nic_rx_frames,
            self.stats.nic_tx_frames,
            self.stats.nic_drops,
        )
    }

    /// Whether the links have anything in flight: a load run, a real NIC
    /// (which may receive at any time), or frames a fault injector holds.
    pub fn busy(&self) -> bool {
        self.load.is_some() || self.nic.is_some() || self.switch.holds_frames()
    }

    /// Whether the loop must keep polling the links rather than sleep
    /// (docs/iokernel-idle.md): a load run (the generator's schedule is
    /// its timer) or frames a fault injector holds back. A real NIC does
    /// not keep it awake: the sleep polls its socket ([`Dataplane::nic_fd`]).
    pub fn keeps_awake(&self) -> bool {
        self.load.is_some()
            || self.switch.holds_frames()
            || self.nic.as_ref().is_some_and(|(nic, _)| !nic.settled())
    }

    /// The real NIC's socket, readable when frames arrive: `Ok(None)`
    /// without a real NIC, `Err(())` for one that cannot be waited on.
    #[allow(clippy::result_unit_err)]
    pub fn nic_fd(&self) -> Result<Option<std::os::fd::BorrowedFd<'_>>, ()> {
        match &self.nic {
            None => Ok(None),
            Some((nic, _)) => nic.wait_fd().map(Some).ok_or(()),
        }
    }

    /// What the in-process handles (and [`crate::StopHandle`]) ring.
    pub fn waker(&self) -> &LoopWaker {
        &self.waker
    }

    /// A port, an ingress pool of `buffers` and `steering` over `kthreads`
    /// for an application that registered `interface`; the daemon checked
    /// that no application has its IP. Refusals name the problem.
    pub fn attach(
        &mut self,
        name: &str,
        interface: Interface,
        buffers: u32,
        kthreads: usize,
        steering: SteeringKind,
    ) -> Result<AppNet, String> {
        if kthreads == 0 {
            return Err("no kthread to steer frames to".into());
        }
        if interface.mac.is_multicast() || interface.mac == MacAddr([0; 6]) {
            return Err(format!("MAC {} is not a unicast address", interface.mac));
        }
        if interface.ip.is_unspecified()
            || interface.ip.is_broadcast()
            || interface.ip.is_multicast()
        {
            return Err(format!("IP {} is not a host address", interface.ip));
        }
        let options = SteeringOptions {
            warm_up_until: match self.flow_warm_up {
                Duration::ZERO => 0,
                d => ginza_sys::clock::monotonic_ns().saturating_add(d.as_nanos() as u64),
            },
            ..self.steering_options.clone()
        };
        let pool = IngressPool::create(&format!("ginza-ingress-{name}"), buffers)
            .map_err(|e| format!("cannot create the ingress pool: {e}"))?;
        let port = self
            .switch
            .add_port(PortConfig::new(interface.mac))
            .map_err(|e| e.to_string())?;
        if let Err(e) = self.claim(interface.ip) {
            self.switch.remove_port(port);
            return Err(e);
        }
        self.app_ports.push((port, name.to_string(), interface.mac));
        if !self.fault_rules.is_empty() {
            let mac = interface.mac;
            self.install_faults(port, PortIdentity::App { name, mac });
        }
        Ok(AppNet {
            interface,
            port,
            pool,
            ledger: BufferLedger::new(buffers),
            steering: AppSteering::new(steering.build(kthreads, &options), kthreads).track_remaps(),
            stats: NetStats {
                st: steering.code(),
                ..NetStats::default()
            },
            switch_drops_seen: (0, 0),
            aliases: Vec::new(),
            tx_pools: Vec::new(),
            held: None,
            own_socket: None,
            steer_decisions: 0,
            steer_ns: 0,
        })
    }

    /// Steers `iface`'s frames to `net`'s port too, and lets it send from
    /// `iface.mac` (protected mode: docs/protected.md, "Addresses").
    pub fn add_alias(&mut self, net: &mut AppNet, iface: Interface) -> Result<(), String> {
        if net.aliases.iter().any(|a| a.ip == iface.ip) || net.interface.ip == iface.ip {
            return Err(format!("{} is already steered there", iface.ip));
        }
        self.switch
            .add_alias(net.port, iface.mac)
            .map_err(|e| format!("alias {} / {}: {e}", iface.mac, iface.ip))?;
        if let Err(e) = self.claim(iface.ip) {
            self.switch.remove_alias(net.port, iface.mac);
            return Err(format!("alias {} / {}: {e}", iface.mac, iface.ip));
        }
        net.aliases.push(iface);
        Ok(())
    }

    /// Undoes [`add_alias`](Self::add_alias) for `ip`.
    pub fn remove_alias(&mut self, net: &mut AppNet, ip: ginza_net::Ipv4Addr) {
        if let Some(i) = net.aliases.iter().position(|a| a.ip == ip) {
            let a = net.aliases.remove(i);
            self.switch.remove_alias(net.port, a.mac);
            self.release(a.ip);
        }
    }

    /// Removes an application's port (frames waiting there go with it);
    /// its addresses are the Linux stack's again.
    pub fn detach(&mut self, net: &AppNet) {
        self.detach_own_socket(net);
        self.release(net.interface.ip);
        for alias in &net.aliases {
            self.release(alias.ip);
        }
        self.retire_faults(net.port);
        self.app_ports.retain(|(port, _, _)| *port != net.port);
        self.switch.remove_port(net.port);
    }

    /// Frames for `ip` on the real NIC are for an application (the XDP
    /// program steers them here, not to the Linux stack).
    fn claim(&mut self, ip: ginza_net::Ipv4Addr) -> Result<(), String> {
        match &mut self.nic {
            Some((nic, _)) => nic
                .claim_address(ip)
                .map_err(|e| format!("the NIC cannot steer {ip} to iokerneld: {e}")),
            None => Ok(()),
        }
    }

    /// Undoes [`claim`](Self::claim).
    fn release(&mut self, ip: ginza_net::Ipv4Addr) {
        if let Some((nic, _)) = &mut self.nic {
            nic.release_address(ip);
        }
    }

    /// The generator and the real NIC, once per loop iteration. Picks up a
    /// load run asked for by the [`GeneratorHandle`] (checked every
    /// `check_handle` call, not every iteration: it takes a lock).
    pub fn poll_links(&mut self, now: u64, check_handle: bool) {
        // Frames held by fault injectors that are due leave first.
        self.switch.advance(now);
        if check_handle {
            self.check_load(now);
            self.check_faults();
        }
        self.poll_load(now);
        if let Some((nic, trunk)) = &mut self.nic {
            // NIC → switch: each frame copied once, from where the NIC
            // holds it straight to its receiver's port (the switch counts
            // what it drops there).
            let switch = &mut self.switch;
            let trunk = *trunk;
            let n = nic.rx_burst_with(&mut self.frames, BURST, &mut |bytes| {
                let sent = switch.send_copy(trunk, bytes);
                debug_assert!(sent, "the trunk is never removed");
            });
            self.stats.nic_rx_frames += n as u64;
        }
        self.flush_to_nic();
    }

    /// What the switch holds for the real NIC (the trunk port) → the NIC.
    /// [`poll_links`](Self::poll_links) does it, and the daemon again at
    /// the end of its loop turn, so that a reply the applications queued
    /// in that turn leaves at once rather than a turn later
    /// (docs/results.md, "Dataplane").
    pub fn flush_to_nic(&mut self) {
        if let Some((nic, trunk)) = &mut self.nic {
            let mut port = self
                .switch
                .port(*trunk)
                .expect("the trunk is never removed");
            port.rx_burst(&mut self.frames, BURST);
            if self.frames.is_empty() {
                return;
            }
            for frame in self.frames.drain(..) {
                match nic.pool_mut().alloc_copy(port.pool().bytes(&frame)) {
                    Some(copy) => self.out.push(copy),
                    None => self.stats.nic_drops += 1,
                }
                port.pool_mut()
                    .free(frame)
                    .expect("a received frame is of the trunk's pool");
            }
            let sent = nic.tx_burst(&mut self.out);
            self.stats.nic_tx_frames += sent as u64;
            self.stats.nic_drops += self.out.len() as u64;
            for frame in self.out.drain(..) {
                nic.pool_mut()
                    .free(frame)
                    .expect("allocated from the NIC's pool");
            }
        }
    }

    /// Frames waiting on an application's port → its kthreads' ingress
    /// rings, as `net.steering` (whose active set the caller brought up to
    /// date) says. Returns whether a frame went to a parked kthread (the
    /// caller then tells the core allocator at once); an error (why the
    /// application must be disconnected) if one of its ingress rings is
    /// corrupt.
    pub fn deliver(
        &mut self,
        net: &mut AppNet,
        ends: &mut [IokernelEnd],
        now: u64,
    ) -> Result<bool, String> {
        let Some(mut port) = self.switch.port(net.port) else {
            return Ok(false);
        };
        let d = port.counters().drops;
        let seen = (
            d.rx_ring_full + d.no_buffer,
            d.unknown_destination + d.spoofed_source + d.runt,
        );
        net.stats.drop_ingress += seen.0 - net.switch_drops_seen.0;
        net.stats.drop_egress += seen.1 - net.switch_drops_seen.1;
        net.switch_drops_seen = seen;
        let mut to_parked = false;
        if self.staged.len() < ends.len() {
            self.staged.resize_with(ends.len(), Vec::new);
        }
        port.rx_burst(&mut self.frames, BURST);
        if self.frames.is_empty() {
            return Ok(false);
        }
        // The steering decisions of the burst first (its flow keys, then
        // one `steer_burst`), timed together: two
        // clock reads per timed burst, divided by its frames in the stats
        // (`SteeringStats::sn / sd`), cost far less than timing each
        // decision; and only one burst in [`STEER_TIMING_EVERY`] is timed,
        // which keeps the clock off the per-packet path.
        self.steer_bursts = self.steer_bursts.wrapping_add(1);
        let started = (self.steer_bursts % STEER_TIMING_EVERY == 1).then(std::time::Instant::now);
        self.keys.clear();
        self.hashes.clear();
        for frame in &self.frames {
            let bytes = port.pool().bytes(frame);
            // Only ARP for another address gives `None`: an alias's, maybe.
            let key = steer_key(bytes, net.interface.ip)
                .or_else(|| net.aliases.iter().find_map(|a| steer_key(bytes, a.ip)));
            self.hashes.extend(key.map(u64::from));
            self.keys.push(key);
        }
        let parked = net
            .steering
            .steer_burst(&self.hashes, now, &mut self.kthreads);
        // A burst during which the loop lost its CPU (tens of µs at least)
        // says nothing about steering: left out, so that a noisy machine
        // does not inflate the mean.
        if let Some(started) = started {
            let took = started.elapsed().as_nanos() as u64;
            if took < STEER_TIMING_OUTLIER_NS {
                net.steer_ns += took;
                net.steer_decisions += self.frames.len() as u64;
            }
        }
        let mut picked = self.kthreads.iter();
        for (frame, key) in self.frames.drain(..).zip(&self.keys) {
            let bytes = port.pool().bytes(&frame);
            let Some(hash) = *key else {
                port.pool_mut()
                    .free(frame)
                    .expect("a received frame is of its port's pool");
                continue;
            };
            let k = *picked.next().expect("a kthread per flow key");
            if parked {
                to_parked = true;
                net.stats.to_parked += 1;
            }
            match net.ledger.lend() {
                None => net.stats.drop_ingress += 1,
                Some(buf) => {
                    let len = net
                        .pool
                        .write(buf, bytes)
                        .expect("a lent buffer is in the pool");
                    let desc = PacketDesc {
                        buf,
                        len: len as u32,
                        hash,
                        reserved: 0,
                    };
                    match &mut net.held {
                        Some(held) if crate::request_frame::is_request(bytes) => held.push(desc),
                        _ => self.staged[k].push(desc),
                    }
                }
            }
            port.pool_mut()
                .free(frame)
                .expect("a received frame is of its port's pool");
        }
        let published = publish(&mut self.staged, net, ends);
        hops::stamp(Hop::Delivered);
        published.map_or(Ok(to_parked), Err)
    }

    /// Up to [`BURST`] frames from kthread `k`'s egress ring into the
    /// switch, or, for frames to another application that `peers` has,
    /// by the direct path ([`direct`]); returns how many the ring held, or
    /// why the application must be disconnected (a corrupt ring). A
    /// protected netstack's frames always take the switch (see below).
    pub fn transmit(
        &mut self,
        net: &mut AppNet,
        end: &mut IokernelEnd,
        k: usize,
        peers: &mut dyn Peers,
        now: u64,
    ) -> Result<usize, String> {
        if self.switch.port(net.port).is_none() {
            return Ok(0);
        }
        let waiting = end
            .egress
            .len()
            .map_err(|e| format!("kthread {k}'s egress ring is corrupt: {e}"))?
            .min(BURST as u32);
        if waiting > 0 {
            hops::stamp(Hop::Egress);
        }
        // A protected netstack (aliases, tx pools) mixes gathered and
        // checksum-offload frames, which take the switch, with plain ones:
        // all of its frames take the switch, so that none overtakes an
        // earlier one of its flow.
        let direct = net.aliases.is_empty() && net.tx_pools.is_empty();
        let mut taken = 0;
        while taken < waiting {
            let Some((seq, desc)) = end.egress.peek_nth(taken) else {
                break;
            };
            if desc.len == 0 || desc.len > PKT_BUFFER_SIZE {
                net.stats.drop_egress += 1;
                taken += 1;
                continue;
            }
            if direct && desc.reserved & direct::SWITCHED_FLAGS == 0 {
                // Frames from this one on, while they go to the same peer.
                if let Some(n) = self.transmit_direct(net, end, taken, waiting, peers, now) {
                    taken += n;
                    continue;
                }
            }
            self.transmit_switched(net, end, seq, desc);
            taken += 1;
        }
        // Copied out: the slots (and their buffers) are the runtime's again.
        end.egress.release_n(taken);
        Ok(taken as usize)
    }

    /// One frame through the switch: copied once out of shared memory into
    /// a scratch buffer the runtime cannot touch, and from there by the
    /// switch to the receiver's port (no buffer of the sender's port pool
    /// is taken and freed per frame).
    fn transmit_switched(
        &mut self,
        net: &mut AppNet,
        end: &IokernelEnd,
        seq: u32,
        desc: PacketDesc,
    ) {
        let frame = &mut self.frame_scratch;
        let n = if desc.reserved & EGRESS_GATHER != 0 {
            // Zero-touch: headers here, payload in a tx pool.
            let scratch = &mut self.gather_scratch;
            end.egress_buffers.read(seq, PKT_BUFFER_SIZE, scratch);
            let header = &scratch[..(desc.len as usize).min(GATHER_OFFSET)];
            let built = GatherList::decode(&scratch[GATHER_OFFSET..]).and_then(|list| {
                let tx = net
                    .tx_pools
                    .iter()
                    .find(|(l, _)| *l == list.link)
                    .ok_or(GatherError::NoPool(list.link))?;
                assemble(header, &list, &tx.1, frame)
            });
            match built {
                Ok(n) => n,
                Err(_) => {
                    net.stats.drop_egress += 1;
                    return;
                }
            }
        } else {
            end.egress_buffers.read(seq, desc.len, frame)
        };
        if desc.reserved & EGRESS_FILL_L4_CHECKSUM != 0 {
            crate::offload::fill_l4_checksum(&mut frame[..n]);
        }
        net.stats.tx += 1;
        self.switch.send_copy(net.port, &frame[..n]);
    }

    /// Ingress buffers given back on one kthread's done ring → the ledger.
    /// An index that was not lent is the runtime's error: the caller
    /// disconnects it with this message.
    pub fn take_back(
        &mut self,
        net: &mut AppNet,
        end: &mut IokernelEnd,
        k: usize,
    ) -> Result<(), String> {
        loop {
            self.returned.clear();
            match end.done.pop_into(&mut self.returned, 4 * BURST) {
                Ok(0) => return Ok(()),
                Ok(_) => {
                    for &buf in &self.returned {
                        net.ledger.give_back(buf).map_err(|e| {
                            format!("kthread {k} gave back an ingress buffer wrongly: {e}")
                        })?;
                    }
                }
                Err(e) => return Err(format!("kthread {k}'s ingress-done ring is corrupt: {e}")),
            }
        }
    }
}
