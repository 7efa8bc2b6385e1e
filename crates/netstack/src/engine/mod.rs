//! The netstack's heart, without threads or sockets: attached applications
//! (their channel, pools and ledgers), connections driven by the sans-IO
//! `ginza_net::tcp::Connection` (the same state machine as the in-process
//! stack, docs/tcp.md), listeners, and the translation between frames and
//! the command/event rings (docs/protected.md).
//!
//! Frames go in with [`Netstack::on_frame`] and come out of
//! [`Netstack::pop_frame`]; [`Netstack::poll`] takes commands, fires timers,
//! moves payload and pushes events. The daemon (`crate::daemon`) and the
//! tests drive it the same way.
//!
//! One mechanism per file:
//! * here: the state (applications, connections, listeners, the socket
//!   table `ginza_net::tcp::Table` shared with the runtime's stack), and
//!   [`Netstack::poll`], the loop over the others, with the timers;
//! * `attach.rs`: applications attach and detach;
//! * `input.rs`: a received frame (ARP, ICMP echo, a TCP segment to its
//!   connection, a SYN to its listener, else a RST);
//! * `transmit.rs`: a connection's segments out, copied or zero-touch;
//! * `settle.rs`: the one path every change to a connection takes;
//! * `pumps.rs`: payload between the pools and the connections;
//! * `commands.rs`: an application's commands;
//! * `events.rs`: events onto their rings, with back-pressure.

mod attach;
mod commands;
mod events;
mod input;
mod pumps;
mod settle;
#[cfg(test)]
mod testing;
mod transmit;

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::time::Instant as StdInstant;

use ginza_net::tcp::{Connection, FourTuple, IsnGenerator, Listener, SynCookies, Table, TcpConfig};
use ginza_net::{Endpoint, Interface, MacAddr};
use ginza_proto::netstack::{Event, Range};
use ginza_shm::netstack::{Channel, GatherList, NetPair, RxPool, TxPoolView};
use ginza_shm::BufferLedger;

use crate::slab::Slab;

/// The netstack's tunables.
#[derive(Clone, Debug)]
pub struct NetstackConfig {
    pub tcp: TcpConfig,
    /// Slots per command and event ring.
    pub ring_capacity: u32,
    /// Receive-pool chunks ([`RX_CHUNK`] bytes) per application.
    pub rx_chunks: u32,
    /// Bytes of `send` ranges the netstack keeps queued per connection.
    pub send_queue_bytes: u64,
    /// Connections (and, separately, listeners) over all applications.
    pub max_connections: u32,
    /// Most ring pairs (application kthreads) per application.
    pub max_pairs: u32,
    /// Commands taken per ring pair and poll.
    pub command_budget: u32,
    /// Largest accept backlog a `listen` may ask for.
    pub max_backlog: u16,
    /// Peers whose MAC is known in advance (no ARP needed to connect).
    pub static_arp: Vec<(Ipv4Addr, MacAddr)>,
}

impl Default for NetstackConfig {
    fn default() -> Self {
        NetstackConfig {
            tcp: TcpConfig::default(),
            ring_capacity: 256,
            rx_chunks: 1024,
            send_queue_bytes: 1 << 20,
            max_connections: 16384,
            max_pairs: 64,
            command_budget: 64,
            max_backlog: 1024,
            static_arp: Vec::new(),
        }
    }
}

/// What an application brings to attach (the daemon fills it from the
/// attach request and its descriptors).
pub struct Attachment {
    pub name: String,
    pub pid: i32,
    pub interface: Interface,
    pub kthreads: u32,
    pub tx_pool: TxPoolView,
    /// One eventfd per kthread, or none.
    pub doorbells: Vec<OwnedFd>,
}

/// What the application gets back.
pub struct Granted {
    pub app_id: u64,
    pub pairs: u32,
    pub ring_capacity: u32,
    pub rx_pool_bytes: u64,
    pub send_queue_bytes: u64,
    /// The channel memfd (a duplicate; the netstack keeps its own).
    pub channel: OwnedFd,
    /// The rx pool, opened O_RDONLY.
    pub rx_pool: OwnedFd,
    /// The channel, for iokerneld (docs/protected.md, "Wake-ups").
    pub channel_handle: Channel,
    /// The application's tx pool (a duplicate), for iokerneld's zero-touch
    /// frames.
    pub tx_pool: OwnedFd,
}

/// The netstack's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetstackStats {
    pub apps: u64,
    pub connections: u64,
    pub frames_in: u64,
    pub frames_out: u64,
    pub frames_not_ours: u64,
    pub segments_in: u64,
    pub resets_sent: u64,
    pub commands: u64,
    pub events: u64,
    /// Commands refused (any reason).
    pub refused: u64,
    /// Applications cut off (garbage, corrupt rings, hang-ups).
    pub apps_disconnected: u64,
    /// Times an event ring was found full (events wait in the netstack).
    pub event_ring_full: u64,
    /// Bytes the netstack copied from tx pools into connections: the
    /// copying path only, never under iokerneld's zero-touch transmit
    /// (docs/protected.md, "Transmit").
    pub tx_bytes_copied: u64,
    /// Payload bytes sent zero-touch (per frame, retransmissions
    /// included): the netstack named them, iokerneld copied them from the
    /// tx pool.
    pub tx_bytes_zero_touch: u64,
    /// Zero-touch frames dropped because their payload could not be named
    /// by one gather list. Segments are cut at gather-list boundaries, so
    /// this stays 0 unless the netstack has a bug; counted, not copied.
    pub tx_frames_unnamed: u64,
    /// Bytes delivered into rx pools.
    pub rx_bytes_delivered: u64,
    /// Frames not sent because the peer's MAC was unknown (an ARP request
    /// went out instead).
    pub no_route: u64,
}

/// A frame to send: whole, or (zero-touch) headers plus a gather list
/// naming the payload in the application's tx pool, which iokerneld copies
/// (`ginza_shm::netstack::gather`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutFrame {
    /// The frame, or only its headers when `gather` is set.
    pub bytes: Vec<u8>,
    pub gather: Option<GatherList>,
    /// iokerneld must fill in the L4 checksum (always with `gather`).
    pub fill_checksum: bool,
}

impl OutFrame {
    fn whole(bytes: Vec<u8>) -> OutFrame {
        OutFrame {
            bytes,
            gather: None,
            fill_checksum: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// `connect` sent the SYN; `connected` or `refused` will follow.
    Connecting { cookie: u32 },
    /// A SYN to a listener; not announced yet.
    HalfOpen { listener: u32 },
    /// `new_conn` sent; waiting for `accept`.
    Announced { listener: u32 },
    /// The application has it.
    Open,
}

struct PendingSend {
    range: Range,
    /// Stream position (bytes since the first `send`) after this range.
    end: u64,
}

struct Conn {
    app: u64,
    /// Pair its events go to.
    pair: u32,
    key: FourTuple,
    peer_mac: Option<MacAddr>,
    tcb: Connection,
    phase: Phase,
    sends: VecDeque<PendingSend>,
    /// Stream positions: bytes named by `send`, bytes handed to the TCB.
    named: u64,
    written: u64,
    /// Bytes of `new_data` the application holds.
    rx_held: u64,
    remote_closed_sent: bool,
    error_sent: bool,
    shutdown_requested: bool,
    close_requested: bool,
    /// `cleanup` sent: the application's id is dead; the TCB may linger
    /// (TIME-WAIT) without an owner.
    released: bool,
}

struct ListenerEntry {
    app: u64,
    pair: u32,
    local: Endpoint,
    backlog: Listener<Endpoint>,
}

struct App {
    id: u64,
    name: String,
    pid: i32,
    interface: Interface,
    channel: Channel,
    pairs: Vec<NetPair>,
    /// Events not yet on their ring (back-pressure), per pair.
    waiting: Vec<VecDeque<Event>>,
    doorbells: Vec<OwnedFd>,
    rx: RxPool,
    ledger: BufferLedger,
    /// Per rx chunk: the connection and length lent, if lent.
    lent: Vec<Option<(u32, u32)>>,
    tx: TxPoolView,
    /// iokerneld maps this application's tx pool: payload goes zero-touch.
    zero_touch: bool,
    conns: Vec<u32>,
    listeners: Vec<u32>,
    /// Why the application was cut off (the daemon closes its socket).
    doomed: Option<String>,
}

/// The netstack: every attached application and connection.
pub struct Netstack {
    cfg: NetstackConfig,
    epoch: StdInstant,
    isn: IsnGenerator,
    /// SYN cookies for listeners whose half-open set is full.
    cookies: SynCookies,
    apps: HashMap<u64, App>,
    next_app: u64,
    conns: Slab<Conn>,
    listeners: Slab<ListenerEntry>,
    /// Connections and listeners by address: handles into the slabs.
    table: Table<u32, u32>,
    /// Interfaces the netstack answers for, and how many apps use each.
    addresses: HashMap<Ipv4Addr, (Interface, u32)>,
    arp: HashMap<Ipv4Addr, MacAddr>,
    frames: VecDeque<OutFrame>,
    stats: NetstackStats,
    /// No connection's timer is due before this (TCP clock, ns); may be
    /// early (a deadline moved later), never late.
    earliest: u64,
    /// Connections with received bytes that found no rx chunk (or their
    /// share used up): settled again once chunks come back.
    starved: Vec<u32>,
    chunks_freed: bool,
}

fn tcp_now(epoch: StdInstant) -> ginza_net::tcp::Instant {
    ginza_net::tcp::Instant::from_nanos(epoch.elapsed().as_nanos() as u64)
}

impl Netstack {
    pub fn new(cfg: NetstackConfig) -> Netstack {
        let arp = cfg.static_arp.iter().copied().collect();
        Netstack {
            conns: Slab::new(cfg.max_connections),
            listeners: Slab::new(cfg.max_connections),
            cfg,
            epoch: StdInstant::now(),
            isn: IsnGenerator::new(),
            cookies: SynCookies::new(),
            apps: HashMap::new(),
            next_app: 1,
            table: Table::new(),
            addresses: HashMap::new(),
            arp,
            frames: VecDeque::new(),
            stats: NetstackStats::default(),
            earliest: u64::MAX,
            starved: Vec::new(),
            chunks_freed: false,
        }
    }

    pub fn config(&self) -> &NetstackConfig {
        &self.cfg
    }

    pub fn stats(&self) -> NetstackStats {
        NetstackStats {
            apps: self.apps.len() as u64,
            connections: self.conns.len() as u64,
            ..self.stats.clone()
        }
    }

    fn now(&self) -> ginza_net::tcp::Instant {
        tcp_now(self.epoch)
    }

    /// Time until the earliest TCP timer, if any.
    pub fn next_deadline_in(&self) -> Option<std::time::Duration> {
        (self.earliest != u64::MAX).then(|| {
            ginza_net::tcp::Instant::from_nanos(self.earliest).saturating_since(self.now())
        })
    }

    /// Takes commands, fires timers, moves data, pushes events. Returns
    /// whether anything happened.
    pub fn poll(&mut self) -> bool {
        let before = (self.stats.commands, self.stats.events, self.frames.len());
        self.flush_events();
        let ids: Vec<u64> = self.apps.keys().copied().collect();
        for id in ids {
            let pairs = self.apps.get(&id).map_or(0, |a| a.pairs.len());
            for p in 0..pairs {
                self.take_commands(id, p as u32);
            }
        }
        self.fire_timers();
        // Received bytes that waited for rx chunks, now that some are back.
        if std::mem::take(&mut self.chunks_freed) && !self.starved.is_empty() {
            let now = self.now();
            for c in std::mem::take(&mut self.starved) {
                self.settle(c, now);
            }
        }
        self.flush_events();
        before != (self.stats.commands, self.stats.events, self.frames.len())
    }

    fn fire_timers(&mut self) {
        let now = self.now();
        if now.as_nanos() < self.earliest {
            return;
        }
        self.earliest = u64::MAX;
        for c in self.conns.handles() {
            let due = self
                .conns
                .get(c)
                .and_then(|k| k.tcb.next_deadline())
                .is_some_and(|d| d <= now);
            if due {
                if let Some(k) = self.conns.get_mut(c) {
                    k.tcb.on_timer(now);
                }
                self.settle(c, now);
            } else if let Some(d) = self.conns.get(c).and_then(|k| k.tcb.next_deadline()) {
                self.earliest = self.earliest.min(d.as_nanos());
            }
        }
    }
}

impl Conn {
    fn new(
        app: u64,
        pair: u32,
        key: FourTuple,
        peer_mac: Option<MacAddr>,
        tcb: Connection,
        phase: Phase,
    ) -> Conn {
        Conn {
            app,
            pair,
            key,
            peer_mac,
            tcb,
            phase,
            sends: VecDeque::new(),
            named: 0,
            written: 0,
            rx_held: 0,
            remote_closed_sent: false,
            error_sent: false,
            shutdown_requested: false,
            close_requested: false,
            released: false,
        }
    }

    /// Stream position the peer has acknowledged.
    fn acked(&self) -> u64 {
        self.written - self.tcb.send_queued() as u64
    }
}
