//! The `software` NIC backend: an in-memory Ethernet switch between ports on
//! this host.
//!
//! Switching happens inside [`Nic::tx_burst`]: each frame a port transmits
//! is copied into the destination port's pool and receive ring at once, so
//! there is no forwarding step to schedule and a frame is never in two places.
//! [`SoftwareSwitch::send_copy`] does the same for bytes the caller holds
//! in a buffer of its own (iokerneld's copy of an egress frame), without
//! a buffer of the sender's pool.
//! The MAC table is registration, not learning: iokerneld knows the MAC of
//! every port it creates, and a frame whose source MAC is not its port's is
//! dropped, so an application cannot impersonate another.
//!
//! Fault injection ([`super::faults`], docs/fault-injection.md): a port may
//! have a [`FaultInjector`] on the frames it sends (`out`, applied before
//! switching) and one on the frames delivered to it (`in`, applied before
//! its receive ring). Frames they hold are let go by
//! [`SoftwareSwitch::advance`], which the owner calls with the clock once
//! per loop iteration; that reading is also the time of every frame
//! switched until the next call. Without injectors the switch pays one
//! branch per burst and per `advance`, and frames take the path they
//! always took; with any, every frame is first copied out of its buffer
//! (which is freed at once), so that a held or duplicated frame never
//! pins a port's buffer.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use ginza_net::{MacAddr, ETHERNET_HEADER_LEN};

use super::faults::{FaultCounters, FaultInjector};
use super::{BufferPool, Frame, Nic, DEFAULT_BUFFER_SIZE};

/// A port of a [`SoftwareSwitch`]. Ids are never reused, so the id of a
/// removed port stays unknown rather than naming a newer port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortId(u32);

/// A new port's address and sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortConfig {
    pub mac: MacAddr,
    /// Buffers of the port's pool: frames waiting on its receive ring, frames
    /// it holds, frames it is building.
    pub buffers: usize,
    pub buffer_size: usize,
    /// Frames delivered but not yet taken by `rx_burst`; beyond that,
    /// arrivals are dropped (`rx_ring_full`).
    pub rx_ring_capacity: usize,
    /// The port towards a real NIC: it may send frames from any source MAC
    /// (hosts beyond the NIC), and frames for unknown unicast destinations
    /// go to it instead of being dropped. At most one per switch.
    pub trunk: bool,
}

impl PortConfig {
    /// 1024 buffers of [`DEFAULT_BUFFER_SIZE`] and a receive ring of 512.
    pub fn new(mac: MacAddr) -> PortConfig {
        PortConfig {
            mac,
            buffers: 1024,
            buffer_size: DEFAULT_BUFFER_SIZE,
            rx_ring_capacity: 512,
            trunk: false,
        }
    }

    /// [`new`](Self::new) as the trunk port.
    pub fn trunk(mac: MacAddr) -> PortConfig {
        PortConfig {
            trunk: true,
            ..PortConfig::new(mac)
        }
    }
}

/// Frames a port lost, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortDrops {
    /// Sent by this port to a MAC no port has (or a multicast group: none are
    /// registered).
    pub unknown_destination: u64,
    /// Sent by this port with a source MAC other than the port's.
    pub spoofed_source: u64,
    /// Sent by this port, shorter than an Ethernet header.
    pub runt: u64,
    /// For this port, but its receive ring was full.
    pub rx_ring_full: u64,
    /// For this port, but its pool had no free buffer for the copy.
    pub no_buffer: u64,
}

impl PortDrops {
    pub fn total(&self) -> u64 {
        self.unknown_destination
            + self.spoofed_source
            + self.runt
            + self.rx_ring_full
            + self.no_buffer
    }
}

/// What went through a port. Frames a port sends count in its `tx_*` whether
/// or not they are delivered; frames count in the receiver's `rx_*` when put
/// on its receive ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub drops: PortDrops,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SwitchError {
    #[error("MAC {0} is already the address of another port")]
    MacInUse(MacAddr),
    #[error("MAC {0} is a group address, not a port's")]
    GroupMac(MacAddr),
    #[error("a port needs at least one buffer and a receive ring of at least one frame")]
    EmptyPort,
    #[error("the switch already has a trunk port")]
    SecondTrunk,
    #[error("no such port")]
    NoSuchPort,
}

#[derive(Debug)]
struct Port {
    mac: MacAddr,
    /// More MACs the port answers to and may send from (protected mode:
    /// the netstack's port takes its applications' addresses).
    aliases: Vec<MacAddr>,
    trunk: bool,
    pool: BufferPool,
    rx_ring: VecDeque<Frame>,
    rx_ring_capacity: usize,
    counters: PortCounters,
}

impl Port {
    /// `mac` is the port's own address or one of its aliases.
    fn sends_from(&self, mac: MacAddr) -> bool {
        mac == self.mac || self.aliases.contains(&mac)
    }

    /// Copies `bytes` onto the receive ring, or counts why it could not.
    fn deliver_copy(&mut self, bytes: &[u8]) {
        // Ring first: a full ring must not take a buffer it cannot use.
        if self.rx_ring.len() >= self.rx_ring_capacity {
            self.counters.drops.rx_ring_full += 1;
            return;
        }
        match self.pool.alloc_copy(bytes) {
            Some(frame) => self.enqueue(frame),
            None => self.counters.drops.no_buffer += 1,
        }
    }

    fn enqueue(&mut self, frame: Frame) {
        self.counters.rx_frames += 1;
        self.counters.rx_bytes += frame.len() as u64;
        self.rx_ring.push_back(frame);
    }
}

/// Hashes MAC addresses for the port table, once per switched frame.
/// Only addresses iokerneld registered are keys (a frame's destination is
/// only looked up), so nobody outside chooses what collides, and a
/// multiply of the six bytes does the job of SipHash at a fraction of its
/// cost per frame.
#[derive(Default, Clone, Copy)]
struct MacHasher(u64);

impl Hasher for MacHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    /// The length prefix of the address's array: always 6, nothing to mix.
    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

/// The port of each registered MAC, with the last lookup remembered: the
/// frames of a burst mostly go to one destination, and comparing six bytes
/// costs less than hashing them (docs/results.md, "Dataplane").
#[derive(Debug, Default)]
struct MacTable {
    ports: HashMap<MacAddr, PortId, BuildHasherDefault<MacHasher>>,
    /// Forgotten whenever the table changes.
    last: Cell<Option<(MacAddr, PortId)>>,
}

impl MacTable {
    fn get(&self, mac: &MacAddr) -> Option<PortId> {
        if let Some((m, id)) = self.last.get() {
            if m == *mac {
                return Some(id);
            }
        }
        let id = self.ports.get(mac).copied();
        if let Some(id) = id {
            self.last.set(Some((*mac, id)));
        }
        id
    }

    fn contains_key(&self, mac: &MacAddr) -> bool {
        self.ports.contains_key(mac)
    }

    fn insert(&mut self, mac: MacAddr, id: PortId) {
        self.last.set(None);
        self.ports.insert(mac, id);
    }

    fn remove(&mut self, mac: &MacAddr) {
        self.last.set(None);
        self.ports.remove(mac);
    }
}

/// An in-memory Ethernet switch: one port per application (and one per
/// traffic generator), frames switched by destination MAC, broadcast to
/// every other port.
#[derive(Debug, Default)]
pub struct SoftwareSwitch {
    ports: Vec<Option<Port>>,
    port_by_mac: MacTable,
    trunk: Option<PortId>,
    /// `None` while no port has an injector: the fast path.
    faults: Option<Box<SwitchFaults>>,
}

/// The injectors of the ports, by port index, and the switch's clock.
#[derive(Debug, Default)]
struct SwitchFaults {
    /// Set by [`SoftwareSwitch::advance`].
    now_ns: u64,
    /// On frames delivered to the port.
    ingress: Vec<Option<FaultInjector>>,
    /// On frames the port sends.
    egress: Vec<Option<FaultInjector>>,
    /// The frame being switched, copied out of its buffer.
    scratch: Vec<u8>,
}

/// The parts of the switch a frame travels through once it is out of its
/// buffer (borrowed apart from the injectors that emit it).
struct Fabric<'a> {
    ports: &'a mut [Option<Port>],
    port_by_mac: &'a MacTable,
    trunk: Option<PortId>,
    ingress: &'a mut [Option<FaultInjector>],
    now_ns: u64,
}

impl Fabric<'_> {
    /// Switches `bytes` sent by port `source` (already checked: not a
    /// runt, not spoofed).
    fn route(&mut self, source: usize, bytes: &[u8]) {
        let destination = mac_at(bytes, 0);
        if destination.is_broadcast() {
            for receiver in 0..self.ports.len() {
                if receiver != source && self.ports[receiver].is_some() {
                    self.deliver(receiver, bytes);
                }
            }
            return;
        }
        let known = self.port_by_mac.get(&destination);
        let trunk = self.trunk.filter(|t| t.0 as usize != source);
        match known.or(trunk) {
            Some(receiver) => self.deliver(receiver.0 as usize, bytes),
            None => {
                if let Some(sender) = self.ports.get_mut(source).and_then(Option::as_mut) {
                    sender.counters.drops.unknown_destination += 1;
                }
            }
        }
    }

    /// Through the receiver's ingress injector, if any, onto its ring.
    fn deliver(&mut self, receiver: usize, bytes: &[u8]) {
        let Some(port) = self.ports.get_mut(receiver).and_then(Option::as_mut) else {
            return;
        };
        match self.ingress.get_mut(receiver).and_then(Option::as_mut) {
            Some(injector) => injector.offer(bytes, self.now_ns, &mut |b| port.deliver_copy(b)),
            None => port.deliver_copy(bytes),
        }
    }
}

impl SoftwareSwitch {
    pub fn new() -> SoftwareSwitch {
        SoftwareSwitch::default()
    }

    /// Adds a port answering to `config.mac`, with its own pool and ring.
    pub fn add_port(&mut self, config: PortConfig) -> Result<PortId, SwitchError> {
        if config.mac.is_multicast() {
            return Err(SwitchError::GroupMac(config.mac));
        }
        if self.port_by_mac.contains_key(&config.mac) {
            return Err(SwitchError::MacInUse(config.mac));
        }
        if config.buffers == 0 || config.buffer_size == 0 || config.rx_ring_capacity == 0 {
            return Err(SwitchError::EmptyPort);
        }
        if config.trunk && self.trunk.is_some() {
            return Err(SwitchError::SecondTrunk);
        }
        let id = PortId(self.ports.len() as u32);
        if config.trunk {
            self.trunk = Some(id);
        }
        self.ports.push(Some(Port {
            mac: config.mac,
            aliases: Vec::new(),
            trunk: config.trunk,
            pool: BufferPool::new(config.buffers, config.buffer_size),
            rx_ring: VecDeque::with_capacity(config.rx_ring_capacity),
            rx_ring_capacity: config.rx_ring_capacity,
            counters: PortCounters::default(),
        }));
        self.port_by_mac.insert(config.mac, id);
        if let Some(faults) = &mut self.faults {
            faults.ingress.resize_with(self.ports.len(), || None);
            faults.egress.resize_with(self.ports.len(), || None);
        }
        Ok(id)
    }

    /// Makes port `id` answer to `mac` too, and send from it.
    pub fn add_alias(&mut self, id: PortId, mac: MacAddr) -> Result<(), SwitchError> {
        if mac.is_multicast() {
            return Err(SwitchError::GroupMac(mac));
        }
        if self.port_by_mac.contains_key(&mac) {
            return Err(SwitchError::MacInUse(mac));
        }
        let port = self
            .ports
            .get_mut(id.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(SwitchError::NoSuchPort)?;
        port.aliases.push(mac);
        self.port_by_mac.insert(mac, id);
        Ok(())
    }

    /// Undoes [`add_alias`](Self::add_alias); false if it was not one.
    pub fn remove_alias(&mut self, id: PortId, mac: MacAddr) -> bool {
        let Some(port) = self.ports.get_mut(id.0 as usize).and_then(Option::as_mut) else {
            return false;
        };
        let before = port.aliases.len();
        port.aliases.retain(|a| *a != mac);
        let removed = port.aliases.len() != before;
        if removed {
            self.port_by_mac.remove(&mac);
        }
        removed
    }

    /// Removes a port with its pool: frames on its ring go with it, and frames
    /// of its pool still held elsewhere can no longer be freed anywhere
    /// (refused as foreign). Returns whether the port existed.
    pub fn remove_port(&mut self, id: PortId) -> bool {
        let Some(port) = self.ports.get_mut(id.0 as usize).and_then(Option::take) else {
            return false;
        };
        self.port_by_mac.remove(&port.mac);
        for a in &port.aliases {
            self.port_by_mac.remove(a);
        }
        if self.trunk == Some(id) {
            self.trunk = None;
        }
        // Its injectors go with it, and the frames they held.
        self.set_faults(id, None, None);
        true
    }

    /// Gives port `id` these injectors (`None`: none), replacing any it
    /// had (with the frames they held). Returns whether the port exists.
    pub fn set_faults(
        &mut self,
        id: PortId,
        ingress: Option<FaultInjector>,
        egress: Option<FaultInjector>,
    ) -> bool {
        let index = id.0 as usize;
        let live = self.port_ref(id).is_some();
        let (ingress, egress) = if live {
            (ingress, egress)
        } else {
            (None, None)
        };
        if ingress.is_none() && egress.is_none() && self.faults.is_none() {
            return live;
        }
        let n = self.ports.len();
        let faults = self.faults.get_or_insert_with(Box::default);
        faults.ingress.resize_with(n, || None);
        faults.egress.resize_with(n, || None);
        if index < n {
            faults.ingress[index] = ingress;
            faults.egress[index] = egress;
        }
        if faults
            .ingress
            .iter()
            .chain(&faults.egress)
            .all(Option::is_none)
        {
            // Back to the fast path.
            self.faults = None;
        }
        live
    }

    /// The injectors of port `id`: on frames delivered to it, on frames it
    /// sends.
    pub fn faults(&self, id: PortId) -> (Option<&FaultInjector>, Option<&FaultInjector>) {
        let index = id.0 as usize;
        match &self.faults {
            None => (None, None),
            Some(f) => (
                f.ingress.get(index).and_then(Option::as_ref),
                f.egress.get(index).and_then(Option::as_ref),
            ),
        }
    }

    /// Every injector of every port.
    pub fn injectors(&self) -> impl Iterator<Item = &FaultInjector> {
        self.faults
            .iter()
            .flat_map(|f| f.ingress.iter().chain(&f.egress))
            .flatten()
    }

    /// Whether an injector holds frames (they leave on a later
    /// [`advance`](Self::advance)).
    pub fn holds_frames(&self) -> bool {
        self.injectors().any(|i| i.held() > 0)
    }

    /// The counters of port `id`'s injectors, added up.
    pub fn fault_counters(&self, id: PortId) -> FaultCounters {
        let (ingress, egress) = self.faults(id);
        let mut total = FaultCounters::default();
        for injector in ingress.into_iter().chain(egress) {
            total += injector.counters();
        }
        total
    }

    /// Sets the switch's clock (ns, monotonic) and lets go of the frames
    /// the injectors hold that are due. Without injectors, one branch.
    pub fn advance(&mut self, now_ns: u64) {
        let Some(faults) = self.faults.as_deref_mut() else {
            return;
        };
        faults.now_ns = now_ns;
        let SwitchFaults {
            ingress, egress, ..
        } = faults;
        let mut fabric = Fabric {
            ports: &mut self.ports,
            port_by_mac: &self.port_by_mac,
            trunk: self.trunk,
            ingress,
            now_ns,
        };
        for (source, injector) in egress.iter_mut().enumerate() {
            if let Some(injector) = injector.as_mut().filter(|i| i.held() > 0) {
                injector.release(now_ns, &mut |b| fabric.route(source, b));
            }
        }
        for (receiver, injector) in fabric.ingress.iter_mut().enumerate() {
            let Some(injector) = injector.as_mut().filter(|i| i.held() > 0) else {
                continue;
            };
            if let Some(port) = fabric.ports[receiver].as_mut() {
                injector.release(now_ns, &mut |b| port.deliver_copy(b));
            }
        }
    }

    /// The port as a [`Nic`], or `None` if it was removed.
    pub fn port(&mut self, id: PortId) -> Option<SwitchPort<'_>> {
        self.ports.get(id.0 as usize)?.as_ref()?;
        Some(SwitchPort { switch: self, id })
    }

    pub fn counters(&self, id: PortId) -> Option<PortCounters> {
        Some(self.port_ref(id)?.counters)
    }

    /// The port's pool, e.g. to check for leaks.
    pub fn pool(&self, id: PortId) -> Option<&BufferPool> {
        Some(&self.port_ref(id)?.pool)
    }

    /// Where a unicast frame from port `from` to `destination` may go
    /// around the switch, straight to the receiver's own buffers (iokerneld's
    /// direct path between two applications, docs/results.md,
    /// "Dataplane"): the receiving port, when no port has a fault injector,
    /// `from` may send from `source`, and the destination is another
    /// registered port (not the trunk, not `from` itself). The caller then
    /// counts the frame with [`count_direct`](Self::count_direct).
    pub fn direct_route(
        &self,
        from: PortId,
        source: MacAddr,
        destination: MacAddr,
    ) -> Option<PortId> {
        if self.faults.is_some() || destination.is_multicast() {
            return None;
        }
        let sender = self.port_ref(from)?;
        if sender.trunk || !sender.sends_from(source) {
            return None;
        }
        let to = self.port_by_mac.get(&destination)?;
        (to != from && Some(to) != self.trunk).then_some(to)
    }

    /// Counts `frames` frames of `bytes` bytes in all that went from `from`
    /// to `to` by the direct path as the switch would have (once per run
    /// of frames, not per frame).
    pub fn count_direct(&mut self, from: PortId, to: PortId, frames: u64, bytes: u64) {
        if let Some(p) = self.ports.get_mut(from.0 as usize).and_then(Option::as_mut) {
            p.counters.tx_frames += frames;
            p.counters.tx_bytes += bytes;
        }
        if let Some(p) = self.ports.get_mut(to.0 as usize).and_then(Option::as_mut) {
            p.counters.rx_frames += frames;
            p.counters.rx_bytes += bytes;
        }
    }

    pub fn port_of(&self, mac: MacAddr) -> Option<PortId> {
        self.port_by_mac.get(&mac)
    }

    fn port_ref(&self, id: PortId) -> Option<&Port> {
        self.ports.get(id.0 as usize)?.as_ref()
    }

    /// [`switch_frame`](Self::switch_frame) when some port has an injector:
    /// the frame is copied out and its buffer freed, then it goes through
    /// the sender's egress injector (if any), and each copy that leaves it
    /// through the receiver's ingress injector (if any).
    fn switch_frame_with_faults(&mut self, source: usize, frame: Frame) {
        let sender = self.ports[source].as_mut().expect("a live port sends");
        let faults = self.faults.as_deref_mut().expect("called with injectors");
        let mut scratch = std::mem::take(&mut faults.scratch);
        scratch.clear();
        scratch.extend_from_slice(sender.pool.bytes(&frame));
        free_to(&mut sender.pool, frame);
        if admit(sender, &scratch) {
            self.switch_admitted(source, &scratch);
        }
        if let Some(faults) = self.faults.as_deref_mut() {
            faults.scratch = scratch;
        }
    }

    /// Switches `bytes` that port `source` may send ([`admit`]): through
    /// its egress injector, if any, then by destination.
    fn switch_admitted(&mut self, source: usize, bytes: &[u8]) {
        let (ingress, egress, now_ns) = match self.faults.as_deref_mut() {
            Some(f) => (
                &mut f.ingress[..],
                f.egress.get_mut(source).and_then(Option::as_mut),
                f.now_ns,
            ),
            None => (&mut [][..], None, 0),
        };
        let mut fabric = Fabric {
            ports: &mut self.ports,
            port_by_mac: &self.port_by_mac,
            trunk: self.trunk,
            ingress,
            now_ns,
        };
        match egress {
            Some(injector) => injector.offer(bytes, now_ns, &mut |b| fabric.route(source, b)),
            None => fabric.route(source, bytes),
        }
    }

    /// Sends `bytes` from port `id` as [`Nic::tx_burst`] would send a frame
    /// holding them, without a buffer of the port's pool: for a caller that
    /// already holds its own copy (iokerneld copies an application's egress
    /// buffer out of shared memory first, so that the frame cannot change
    /// between the checks and the copy to the receiver). Same checks,
    /// counters and fault injection as a frame of the pool. False if the
    /// port does not exist.
    pub fn send_copy(&mut self, id: PortId, bytes: &[u8]) -> bool {
        let source = id.0 as usize;
        let Some(sender) = self.ports.get_mut(source).and_then(Option::as_mut) else {
            return false;
        };
        if admit(sender, bytes) {
            self.switch_admitted(source, bytes);
        }
        true
    }

    /// Switches one frame sent by port `source`; the frame's buffer goes back
    /// to the source's pool unless it is looped back to the source itself.
    fn switch_frame(&mut self, source: usize, frame: Frame) {
        let sender = self.ports[source].as_mut().expect("a live port sends");
        sender.counters.tx_frames += 1;
        sender.counters.tx_bytes += frame.len() as u64;
        let bytes = sender.pool.bytes(&frame);
        if bytes.len() < ETHERNET_HEADER_LEN {
            sender.counters.drops.runt += 1;
            return free_to(&mut sender.pool, frame);
        }
        let destination = mac_at(bytes, 0);
        if !sender.trunk && !sender.sends_from(mac_at(bytes, 6)) {
            sender.counters.drops.spoofed_source += 1;
            return free_to(&mut sender.pool, frame);
        }
        if destination.is_broadcast() {
            for receiver in 0..self.ports.len() {
                if receiver != source && self.ports[receiver].is_some() {
                    let (sender, receiver) = two_ports(&mut self.ports, source, receiver);
                    receiver.deliver_copy(sender.pool.bytes(&frame));
                }
            }
        } else {
            let known = self.port_by_mac.get(&destination);
            // Unknown unicast leaves through the trunk, unless it came from there.
            let trunk = self.trunk.filter(|t| t.0 as usize != source);
            match known.or(trunk) {
                Some(receiver) if receiver.0 as usize == source => {
                    // Looped back: same pool, no copy needed.
                    let sender = self.ports[source].as_mut().expect("live");
                    if sender.rx_ring.len() < sender.rx_ring_capacity {
                        return sender.enqueue(frame);
                    }
                    sender.counters.drops.rx_ring_full += 1;
                }
                Some(receiver) => {
                    let (sender, receiver) =
                        two_ports(&mut self.ports, source, receiver.0 as usize);
                    receiver.deliver_copy(sender.pool.bytes(&frame));
                }
                None => {
                    let sender = self.ports[source].as_mut().expect("live");
                    sender.counters.drops.unknown_destination += 1;
                }
            }
        }
        let sender = self.ports[source].as_mut().expect("live");
        free_to(&mut sender.pool, frame);
    }
}

fn mac_at(bytes: &[u8], offset: usize) -> MacAddr {
    let mut mac = [0; 6];
    mac.copy_from_slice(&bytes[offset..offset + 6]);
    MacAddr(mac)
}

/// Counts a frame `sender` sends and says whether it may leave: not a
/// runt, and from one of the port's MACs (any, from the trunk).
fn admit(sender: &mut Port, bytes: &[u8]) -> bool {
    sender.counters.tx_frames += 1;
    sender.counters.tx_bytes += bytes.len() as u64;
    if bytes.len() < ETHERNET_HEADER_LEN {
        sender.counters.drops.runt += 1;
        false
    } else if !sender.trunk && !sender.sends_from(mac_at(bytes, 6)) {
        sender.counters.drops.spoofed_source += 1;
        false
    } else {
        true
    }
}

fn free_to(pool: &mut BufferPool, frame: Frame) {
    // tx_burst accepts only frames of the sender's pool.
    pool.free(frame)
        .expect("a sent frame comes from its port's pool");
}

/// Two distinct live ports, mutably.
fn two_ports(ports: &mut [Option<Port>], a: usize, b: usize) -> (&mut Port, &mut Port) {
    assert_ne!(a, b);
    let (first, second) = if a < b {
        let (low, high) = ports.split_at_mut(b);
        (&mut low[a], &mut high[0])
    } else {
        let (low, high) = ports.split_at_mut(a);
        (&mut high[0], &mut low[b])
    };
    (
        first.as_mut().expect("live port"),
        second.as_mut().expect("live port"),
    )
}

/// One port of a [`SoftwareSwitch`], seen as a [`Nic`] (borrowing the switch
/// for as long as it is used).
#[derive(Debug)]
pub struct SwitchPort<'a> {
    switch: &'a mut SoftwareSwitch,
    id: PortId,
}

impl SwitchPort<'_> {
    pub fn id(&self) -> PortId {
        self.id
    }

    pub fn mac(&self) -> MacAddr {
        self.port().mac
    }

    pub fn counters(&self) -> PortCounters {
        self.port().counters
    }

    fn port(&self) -> &Port {
        self.switch.ports[self.id.0 as usize]
            .as_ref()
            .expect("a SwitchPort is made for a live port and borrows the switch")
    }

    fn port_mut(&mut self) -> &mut Port {
        self.switch.ports[self.id.0 as usize]
            .as_mut()
            .expect("a SwitchPort is made for a live port and borrows the switch")
    }
}

impl Nic for SwitchPort<'_> {
    fn pool(&self) -> &BufferPool {
        &self.port().pool
    }

    fn pool_mut(&mut self) -> &mut BufferPool {
        &mut self.port_mut().pool
    }

    fn rx_burst(&mut self, out: &mut Vec<Frame>, max: usize) -> usize {
        let ring = &mut self.port_mut().rx_ring;
        let taken = max.min(ring.len());
        out.extend(ring.drain(..taken));
        taken
    }

    /// Accepts frames up to the first one that is not from this port's pool
    /// (that one and the rest stay with the caller) and switches them.
    fn tx_burst(&mut self, frames: &mut Vec<Frame>) -> usize {
        let pool = &self.port().pool;
        let accepted = frames.iter().take_while(|frame| pool.owns(frame)).count();
        let source = self.id.0 as usize;
        if self.switch.faults.is_none() {
            for frame in frames.drain(..accepted) {
                self.switch.switch_frame(source, frame);
            }
        } else {
            for frame in frames.drain(..accepted) {
                self.switch.switch_frame_with_faults(source, frame);
            }
        }
        accepted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(last: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, last])
    }

    fn ethernet(dst: MacAddr, src: MacAddr, fill: u8) -> Vec<u8> {
        let mut bytes = Vec::from(dst.0);
        bytes.extend_from_slice(&src.0);
        bytes.extend_from_slice(&[0x08, 0x00]);
        bytes.extend_from_slice(&[fill; 50]);
        bytes
    }

    fn send(switch: &mut SoftwareSwitch, from: PortId, bytes: &[u8]) {
        let mut port = switch.port(from).unwrap();
        let frame = port.pool_mut().alloc_copy(bytes).unwrap();
        let mut burst = vec![frame];
        assert_eq!(port.tx_burst(&mut burst), 1);
    }

    fn receive_all(switch: &mut SoftwareSwitch, at: PortId) -> Vec<Vec<u8>> {
        let mut port = switch.port(at).unwrap();
        let mut frames = Vec::new();
        port.rx_burst(&mut frames, usize::MAX);
        frames
            .into_iter()
            .map(|frame| {
                let bytes = port.pool().bytes(&frame).to_vec();
                port.pool_mut().free(frame).unwrap();
                bytes
            })
            .collect()
    }

    /// `Nic::rx_burst_with`'s default: each received frame's bytes handed
    /// over in order, at most `max`, and its buffer back in the pool.
    #[test]
    fn rx_burst_with_hands_over_the_bytes_and_frees_the_buffers() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        for fill in 1..=3 {
            send(&mut switch, a, &ethernet(mac(2), mac(1), fill));
        }
        let mut port = switch.port(b).unwrap();
        let free = port.pool().available();
        let mut scratch = Vec::new();
        let mut seen = Vec::new();
        let n = port.rx_burst_with(&mut scratch, 2, &mut |bytes| seen.push(bytes[14]));
        assert_eq!((n, seen.as_slice()), (2, &[1, 2][..]));
        assert!(scratch.is_empty());
        assert_eq!(port.pool().available(), free + 2, "buffers freed");
        let n = port.rx_burst_with(&mut scratch, 8, &mut |bytes| seen.push(bytes[14]));
        assert_eq!((n, seen.as_slice()), (1, &[1, 2, 3][..]));
    }

    #[test]
    fn duplicate_and_group_macs_are_refused() {
        let mut switch = SoftwareSwitch::new();
        switch.add_port(PortConfig::new(mac(1))).unwrap();
        assert_eq!(
            switch.add_port(PortConfig::new(mac(1))),
            Err(SwitchError::MacInUse(mac(1)))
        );
        assert_eq!(
            switch.add_port(PortConfig::new(MacAddr::BROADCAST)),
            Err(SwitchError::GroupMac(MacAddr::BROADCAST))
        );
    }

    #[test]
    fn spoofed_runt_and_looped_back_frames() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        send(&mut switch, a, &ethernet(mac(2), mac(9), 0));
        send(&mut switch, a, &[0; 13]);
        let to_self = ethernet(mac(1), mac(1), 7);
        send(&mut switch, a, &to_self);
        let drops = switch.counters(a).unwrap().drops;
        assert_eq!((drops.spoofed_source, drops.runt, drops.total()), (1, 1, 2));
        assert_eq!(receive_all(&mut switch, a), vec![to_self]);
        assert!(receive_all(&mut switch, b).is_empty());
        assert_eq!(switch.pool(a).unwrap().in_use(), 0);
    }

    #[test]
    fn an_alias_is_received_and_sent_from_until_removed() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        switch.add_alias(a, mac(3)).unwrap();
        assert_eq!(
            switch.add_alias(b, mac(3)),
            Err(SwitchError::MacInUse(mac(3)))
        );
        assert_eq!(
            switch.add_alias(b, mac(1)),
            Err(SwitchError::MacInUse(mac(1)))
        );
        // b → the alias reaches a; a may send from the alias.
        let to_alias = ethernet(mac(3), mac(2), 1);
        send(&mut switch, b, &to_alias);
        assert_eq!(receive_all(&mut switch, a), vec![to_alias]);
        let from_alias = ethernet(mac(2), mac(3), 2);
        send(&mut switch, a, &from_alias);
        assert_eq!(receive_all(&mut switch, b), vec![from_alias]);
        // b may not.
        send(&mut switch, b, &ethernet(mac(1), mac(3), 3));
        assert_eq!(switch.counters(b).unwrap().drops.spoofed_source, 1);
        // Removed: unknown again, and spoofed from a.
        assert!(switch.remove_alias(a, mac(3)));
        assert!(!switch.remove_alias(a, mac(3)));
        send(&mut switch, b, &ethernet(mac(3), mac(2), 4));
        assert_eq!(switch.counters(b).unwrap().drops.unknown_destination, 1);
        send(&mut switch, a, &ethernet(mac(2), mac(3), 5));
        assert_eq!(switch.counters(a).unwrap().drops.spoofed_source, 1);
    }

    #[test]
    fn removed_port_is_gone_and_its_mac_unknown() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        assert!(switch.remove_port(b));
        assert!(!switch.remove_port(b));
        assert!(switch.port(b).is_none());
        send(&mut switch, a, &ethernet(mac(2), mac(1), 0));
        assert_eq!(switch.counters(a).unwrap().drops.unknown_destination, 1);
        // The MAC is free again, under a new id.
        let b_again = switch.add_port(PortConfig::new(mac(2))).unwrap();
        assert_ne!(b, b_again);
    }

    #[test]
    fn trunk_sends_any_source_and_takes_unknown_unicast() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let uplink = switch.add_port(PortConfig::trunk(mac(9))).unwrap();
        assert_eq!(
            switch.add_port(PortConfig::trunk(mac(8))),
            Err(SwitchError::SecondTrunk)
        );
        // From a host beyond the NIC (source MAC not the trunk's) to `a`.
        let inbound = ethernet(mac(1), mac(0x42), 3);
        send(&mut switch, uplink, &inbound);
        assert_eq!(receive_all(&mut switch, a), vec![inbound]);
        // From `a` to a host beyond the NIC.
        let outbound = ethernet(mac(0x42), mac(1), 4);
        send(&mut switch, a, &outbound);
        assert_eq!(receive_all(&mut switch, uplink), vec![outbound]);
        // Unknown unicast from the trunk itself is dropped, not looped.
        send(&mut switch, uplink, &ethernet(mac(0x43), mac(0x42), 5));
        assert_eq!(
            switch.counters(uplink).unwrap().drops.unknown_destination,
            1
        );
        assert!(receive_all(&mut switch, uplink).is_empty());
    }

    #[test]
    fn a_frame_of_another_pool_stays_with_the_caller() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        let mut other_pool = BufferPool::new(1, 2048);
        let foreign = other_pool.alloc_copy(&ethernet(mac(2), mac(1), 1)).unwrap();
        let mut port = switch.port(a).unwrap();
        let own = port
            .pool_mut()
            .alloc_copy(&ethernet(mac(2), mac(1), 2))
            .unwrap();
        let mut burst = vec![own, foreign];
        assert_eq!(port.tx_burst(&mut burst), 1);
        assert_eq!(burst.len(), 1);
        other_pool.free(burst.pop().unwrap()).unwrap();
        assert_eq!(receive_all(&mut switch, b).len(), 1);
    }

    #[test]
    fn send_copy_switches_like_a_frame_of_the_pool() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        let frames: Vec<Vec<u8>> = (0..40).map(|i| ethernet(mac(2), mac(1), i)).collect();
        for f in &frames {
            assert!(switch.send_copy(a, f));
        }
        // Every frame, in order, intact; the sender's pool untouched.
        assert_eq!(receive_all(&mut switch, b), frames);
        assert_eq!(switch.pool(a).unwrap().stats().allocations, 0);
        // The same refusals and counters as `tx_burst`.
        assert!(switch.send_copy(a, &ethernet(mac(2), mac(3), 0)));
        assert!(switch.send_copy(a, &[0; 10]));
        assert!(switch.send_copy(a, &ethernet(mac(9), mac(1), 0)));
        let c = switch.counters(a).unwrap();
        assert_eq!(c.tx_frames, 43);
        assert_eq!(
            (
                c.drops.spoofed_source,
                c.drops.runt,
                c.drops.unknown_destination
            ),
            (1, 1, 1)
        );
        assert!(receive_all(&mut switch, b).is_empty());
        // To itself: a copy in its own pool.
        assert!(switch.send_copy(a, &ethernet(mac(1), mac(1), 7)));
        assert_eq!(
            receive_all(&mut switch, a),
            vec![ethernet(mac(1), mac(1), 7)]
        );
        // Through the sender's egress injector.
        switch.set_faults(a, None, Some(injector("duplicate=100%,dir=out,port=all")));
        switch.advance(0);
        assert!(switch.send_copy(a, &frames[0]));
        assert_eq!(receive_all(&mut switch, b).len(), 2);
        // A removed port sends nothing.
        switch.remove_port(a);
        assert!(!switch.send_copy(a, &frames[0]));
    }

    fn injector(rule: &str) -> FaultInjector {
        FaultInjector::new(&rule.parse().unwrap(), 0, 0)
    }

    #[test]
    fn an_ingress_injector_drops_frames_for_its_port_only() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        let c = switch.add_port(PortConfig::new(mac(3))).unwrap();
        assert!(switch.set_faults(b, Some(injector("drop=100%,dir=in,port=all")), None));
        switch.advance(0);
        for _ in 0..10 {
            send(&mut switch, a, &ethernet(mac(2), mac(1), 1));
            send(&mut switch, a, &ethernet(mac(3), mac(1), 2));
        }
        assert!(receive_all(&mut switch, b).is_empty());
        assert_eq!(receive_all(&mut switch, c).len(), 10);
        let counted = switch.fault_counters(b);
        assert_eq!((counted.frames, counted.dropped), (10, 10));
        assert_eq!(switch.fault_counters(c), FaultCounters::default());
        // Switch drops are not fault drops.
        assert_eq!(switch.counters(b).unwrap().drops.total(), 0);
        // Every buffer went back: frames are copied out before injection.
        assert_eq!(switch.pool(a).unwrap().in_use(), 0);
        // Injectors removed: the fast path again, frames arrive.
        switch.set_faults(b, None, None);
        assert!(switch.faults.is_none());
        send(&mut switch, a, &ethernet(mac(2), mac(1), 3));
        assert_eq!(receive_all(&mut switch, b).len(), 1);
    }

    #[test]
    fn delayed_frames_leave_when_the_clock_passes_their_delay() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let b = switch.add_port(PortConfig::new(mac(2))).unwrap();
        switch.set_faults(a, None, Some(injector("delay=100us")));
        switch.advance(1_000_000);
        let frames: Vec<Vec<u8>> = (0..3).map(|i| ethernet(mac(2), mac(1), i)).collect();
        for f in &frames {
            send(&mut switch, a, f);
        }
        assert!(switch.holds_frames());
        switch.advance(1_099_999);
        assert!(receive_all(&mut switch, b).is_empty());
        switch.advance(1_100_000);
        assert_eq!(receive_all(&mut switch, b), frames);
        assert!(!switch.holds_frames());
        assert_eq!(switch.fault_counters(a).delayed, 3);
    }

    #[test]
    fn egress_and_ingress_injectors_both_apply_and_duplicates_arrive_twice() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        let uplink = switch.add_port(PortConfig::trunk(mac(9))).unwrap();
        switch.set_faults(
            uplink,
            Some(injector("duplicate=100%,port=trunk")),
            Some(injector("corrupt=100%,port=trunk")),
        );
        switch.advance(0);
        // To the trunk (its ingress): twice.
        let outbound = ethernet(mac(0x42), mac(1), 4);
        send(&mut switch, a, &outbound);
        assert_eq!(
            receive_all(&mut switch, uplink),
            vec![outbound.clone(), outbound]
        );
        // From the trunk (its egress): one byte past the header differs.
        let inbound = ethernet(mac(1), mac(0x42), 3);
        send(&mut switch, uplink, &inbound);
        let got = receive_all(&mut switch, a);
        assert_eq!(got.len(), 1);
        let differing: Vec<usize> = (0..inbound.len())
            .filter(|&i| got[0][i] != inbound[i])
            .collect();
        assert!(differing.len() == 1 && differing[0] >= ETHERNET_HEADER_LEN);
        // A removed port takes its injectors along.
        assert!(switch.remove_port(uplink));
        assert_eq!(switch.injectors().count(), 0);
        assert!(switch.faults.is_none());
    }

    #[test]
    fn spoofed_and_runt_frames_are_refused_before_injection() {
        let mut switch = SoftwareSwitch::new();
        let a = switch.add_port(PortConfig::new(mac(1))).unwrap();
        switch.add_port(PortConfig::new(mac(2))).unwrap();
        switch.set_faults(a, None, Some(injector("duplicate=100%")));
        send(&mut switch, a, &ethernet(mac(2), mac(9), 0));
        send(&mut switch, a, &[0; 13]);
        let drops = switch.counters(a).unwrap().drops;
        assert_eq!((drops.spoofed_source, drops.runt), (1, 1));
        assert_eq!(switch.fault_counters(a).frames, 0);
        assert_eq!(switch.pool(a).unwrap().in_use(), 0);
    }
}
