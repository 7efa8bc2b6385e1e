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

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant as StdInstant;

use ginza_net::tcp::{
    Backlog, Connection, Demux, FourTuple, IsnGenerator, ListenConfig, Listener, Opened, Segment,
    Seq, State, Table, TcpConfig, TcpError,
};
use ginza_net::{parse, tx, ArpOperation, Endpoint, Interface, MacAddr, Packet, MAX_FRAME_LEN};
use ginza_proto::netstack::{Command, ConnId, Event, ListenId, Range, Ranges, Reason, MAX_RANGES};
use ginza_shm::netstack::{
    Channel, ChannelConfig, GatherList, NetPair, RxPool, TxPoolView, MAX_GATHER, RX_CHUNK,
};
use ginza_shm::{BufferLedger, RingCorrupt};
use log::{debug, info, warn};

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

fn reason_of(e: TcpError) -> Reason {
    match e {
        TcpError::Refused => Reason::ConnectionRefused,
        TcpError::Reset => Reason::ConnectionReset,
        TcpError::TimedOut => Reason::TimedOut,
        _ => Reason::InvalidState,
    }
}

/// The destination IPv4 address of a frame (IPv4 or ARP), to find the
/// interface it is for.
fn destination(frame: &[u8]) -> Option<Ipv4Addr> {
    use smoltcp::wire::{ArpPacket, EthernetFrame, EthernetProtocol, Ipv4Packet};
    let eth = EthernetFrame::new_checked(frame).ok()?;
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
            Some(ip.dst_addr())
        }
        EthernetProtocol::Arp => {
            let arp = ArpPacket::new_checked(eth.payload()).ok()?;
            let t = arp.target_protocol_addr();
            (t.len() == 4).then(|| Ipv4Addr::new(t[0], t[1], t[2], t[3]))
        }
        _ => None,
    }
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

    // ---- applications ------------------------------------------------------

    /// Attaches an application: its channel, its rx pool, its address.
    pub fn attach(&mut self, a: Attachment) -> Result<Granted, String> {
        if a.kthreads == 0 || a.kthreads > self.cfg.max_pairs {
            return Err(format!(
                "{} kthreads: must be 1..={}",
                a.kthreads, self.cfg.max_pairs
            ));
        }
        if !a.doorbells.is_empty() && a.doorbells.len() != a.kthreads as usize {
            return Err(format!(
                "{} doorbells for {} kthreads",
                a.doorbells.len(),
                a.kthreads
            ));
        }
        if let Some((iface, _)) = self.addresses.get(&a.interface.ip) {
            if iface.mac != a.interface.mac {
                return Err(format!(
                    "address {} is served with MAC {}, not {}",
                    a.interface.ip, iface.mac, a.interface.mac
                ));
            }
        }
        let id = self.next_app;
        let channel = Channel::create(
            &format!("ginza-netstack-chan-{id}"),
            &ChannelConfig {
                pairs: a.kthreads,
                capacity: self.cfg.ring_capacity,
            },
        )
        .map_err(|e| format!("cannot create the channel: {e}"))?;
        let rx = RxPool::create(&format!("ginza-netstack-rx-{id}"), self.cfg.rx_chunks)
            .map_err(|e| format!("cannot create the rx pool: {e}"))?;
        let pairs = (0..a.kthreads)
            .map(|p| channel.net_pair(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let channel_fd = channel
            .fd()
            .try_clone_to_owned()
            .map_err(|e| format!("dup channel: {e}"))?;
        let rx_fd = rx.app_fd().map_err(|e| e.to_string())?;
        let tx_fd = a
            .tx_pool
            .fd()
            .try_clone_to_owned()
            .map_err(|e| format!("dup tx pool: {e}"))?;
        let granted = Granted {
            app_id: id,
            pairs: a.kthreads,
            ring_capacity: self.cfg.ring_capacity,
            rx_pool_bytes: rx.len(),
            send_queue_bytes: self.cfg.send_queue_bytes,
            channel: channel_fd,
            rx_pool: rx_fd,
            channel_handle: channel.clone(),
            tx_pool: tx_fd,
        };
        self.next_app += 1;
        self.addresses
            .entry(a.interface.ip)
            .or_insert((a.interface, 0))
            .1 += 1;
        let chunks = self.cfg.rx_chunks;
        info!(
            "attached {} (pid {}, app {id}) at {} with {} ring pairs",
            a.name, a.pid, a.interface.ip, a.kthreads
        );
        self.apps.insert(
            id,
            App {
                id,
                name: a.name,
                pid: a.pid,
                interface: a.interface,
                channel,
                waiting: (0..a.kthreads).map(|_| VecDeque::new()).collect(),
                pairs,
                doorbells: a.doorbells,
                rx,
                ledger: BufferLedger::new(chunks),
                lent: vec![None; chunks as usize],
                tx: a.tx_pool,
                zero_touch: false,
                conns: Vec::new(),
                listeners: Vec::new(),
                doomed: None,
            },
        );
        Ok(granted)
    }

    /// From now on application `id`'s payload goes zero-touch: iokerneld
    /// maps its tx pool and assembles the frames (call before the
    /// application's first command).
    pub fn set_zero_touch(&mut self, id: u64) {
        if let Some(a) = self.apps.get_mut(&id) {
            a.zero_touch = true;
        }
    }

    /// Answers for `iface` for good (the netstack's own address, which
    /// applications may share).
    pub fn add_address(&mut self, iface: Interface) {
        self.addresses.entry(iface.ip).or_insert((iface, 0)).1 += 1;
    }

    /// Time until the earliest TCP timer, if any.
    pub fn next_deadline_in(&self) -> Option<std::time::Duration> {
        (self.earliest != u64::MAX).then(|| {
            ginza_net::tcp::Instant::from_nanos(self.earliest).saturating_since(self.now())
        })
    }

    /// Applications the netstack cut off since the last call, and why (the
    /// daemon closes their sockets; they are detached already).
    pub fn take_doomed(&mut self) -> Vec<(u64, String)> {
        let ids: Vec<u64> = self
            .apps
            .values()
            .filter(|a| a.doomed.is_some())
            .map(|a| a.id)
            .collect();
        let mut out = Vec::new();
        for id in ids {
            let why = self.apps.get_mut(&id).and_then(|a| a.doomed.take());
            self.detach(id);
            out.push((id, why.unwrap_or_default()));
        }
        out
    }

    /// Detaches an application (it hung up, was killed, or was cut off):
    /// every connection of it is reset, its listeners closed, its pools and
    /// ledgers freed. Other applications notice nothing.
    pub fn detach(&mut self, id: u64) {
        let Some(app) = self.apps.remove(&id) else {
            return;
        };
        let now = self.now();
        for &l in &app.listeners {
            if let Some(entry) = self.listeners.remove(l) {
                self.table.unlisten(&entry.local, |&x| x == l);
            }
        }
        let n = app.conns.len();
        for c in app.conns.iter().copied() {
            let Some(mut conn) = self.conns.remove(c) else {
                continue;
            };
            self.table.remove(&conn.key);
            conn.tcb.abort();
            self.transmit(&app.interface, &mut conn, now, None);
        }
        if let Some(e) = self.addresses.get_mut(&app.interface.ip) {
            e.1 -= 1;
            if e.1 == 0 {
                self.addresses.remove(&app.interface.ip);
            }
        }
        self.stats.apps_disconnected += 1;
        info!(
            "detached {} (app {id}, pid {}): {n} connections reset",
            app.name, app.pid
        );
    }

    /// The application's channel (iokerneld maps it to see pending work).
    pub fn channel(&self, id: u64) -> Option<&Channel> {
        self.apps.get(&id).map(|a| &a.channel)
    }

    /// Attached application ids.
    pub fn app_ids(&self) -> Vec<u64> {
        self.apps.keys().copied().collect()
    }

    /// Whether some attached application is answering now: it took every
    /// event it was given (so it runs, or ran) and still holds received
    /// data (a `recv_done`, most likely with a reply, is due). The daemon
    /// keeps its core a while longer then (`DaemonConfig::reply_spin`), so
    /// that the command is taken at once rather than after a wake of its
    /// own. An application with events still unread is not running: it
    /// may need this very core (docs/protected.md, "Where the one-way time
    /// goes").
    pub fn reply_due(&self) -> bool {
        self.apps.values().any(|a| {
            a.doomed.is_none()
                && a.ledger.lent() > 0
                && a.waiting.iter().all(|q| q.is_empty())
                && (0..a.pairs.len() as u32)
                    .all(|p| a.channel.pending(p).is_ok_and(|(_, ev)| ev == 0))
        })
    }

    /// Rx chunks lent to application `id` now (tests check that a reset
    /// frees them).
    pub fn rx_lent(&self, id: u64) -> Option<usize> {
        self.apps.get(&id).map(|a| a.ledger.lent())
    }

    // ---- frames ------------------------------------------------------------

    /// Next frame to send, if any.
    pub fn pop_frame(&mut self) -> Option<OutFrame> {
        self.frames.pop_front()
    }

    /// Frames waiting to be sent.
    pub fn frames_waiting(&self) -> usize {
        self.frames.len()
    }

    fn push_frame(&mut self, f: Vec<u8>) {
        self.stats.frames_out += 1;
        self.frames.push_back(OutFrame::whole(f));
    }

    fn build(&mut self, build: impl FnOnce(&mut [u8]) -> Result<usize, ginza_net::BuildError>) {
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        match build(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                self.push_frame(buf);
            }
            Err(e) => warn!("cannot build a frame: {e}"),
        }
    }

    /// One received frame.
    pub fn on_frame(&mut self, frame: &[u8]) {
        self.stats.frames_in += 1;
        let Some(iface) = destination(frame).and_then(|ip| self.addresses.get(&ip).map(|e| e.0))
        else {
            self.stats.frames_not_ours += 1;
            return;
        };
        let pkt = match parse(frame, &iface) {
            Ok(p) => p,
            Err(_) => {
                self.stats.frames_not_ours += 1;
                return;
            }
        };
        match pkt {
            Packet::Arp(m) => {
                self.arp.insert(m.sender_ip, m.sender_mac);
                if m.operation == ArpOperation::Request {
                    self.build(|b| tx::arp_reply(b, &iface, &m));
                }
            }
            Packet::IcmpEchoRequest(e) => self.build(|b| tx::icmp_echo_reply(b, &iface, &e)),
            Packet::Udp(_) => self.stats.frames_not_ours += 1,
            Packet::Tcp(f) => {
                if !f.segment.payload.is_empty() {
                    ginza_sys::hops::stamp(ginza_sys::hops::Hop::NetstackFrameIn);
                }
                self.stats.segments_in += 1;
                self.arp.insert(f.src.ip, f.src_mac);
                let key = FourTuple::of(&f);
                let now = self.now();
                match self.table.demux(&key, &f.segment).cloned() {
                    Demux::Connection(c) => {
                        if let Some(conn) = self.conns.get_mut(c) {
                            conn.peer_mac = Some(f.src_mac);
                            conn.tcb.on_segment(&f.segment, now);
                        }
                        self.settle(c, now);
                    }
                    Demux::Listener(l) => self.on_syn(l, &f, now),
                    Demux::NoSocket { reset } => {
                        self.reset(&iface, f.src_mac, f.dst.port, f.src, reset)
                    }
                }
            }
        }
    }

    fn reset(
        &mut self,
        iface: &Interface,
        mac: MacAddr,
        port: u16,
        to: Endpoint,
        rst: Option<Segment<'static>>,
    ) {
        if let Some(rst) = rst {
            self.stats.resets_sent += 1;
            self.build(|b| tx::tcp_segment(b, iface, mac, port, to, &rst));
        }
    }

    fn on_syn(&mut self, l: u32, f: &ginza_net::TcpFrame<'_>, now: ginza_net::tcp::Instant) {
        let Some(entry) = self.listeners.get_mut(l) else {
            return;
        };
        let key = FourTuple::of(f);
        let (app, pair) = (entry.app, entry.pair);
        let opened = entry
            .backlog
            .admit_syn(key, &f.segment, &self.cfg.tcp, &self.isn, now);
        let Some(Opened { tcb, evicted }) = opened else {
            return;
        };
        if let Some(old) = evicted {
            if let Some(c) = self.table.remove(&old) {
                self.forget(c);
            }
        }
        let conn = Conn::new(
            app,
            pair,
            key,
            Some(f.src_mac),
            tcb,
            Phase::HalfOpen { listener: l },
        );
        let Some(c) = self.conns.insert(conn) else {
            if let Some(entry) = self.listeners.get_mut(l) {
                entry.backlog.forget(f.src);
            }
            return;
        };
        self.table.insert(key, c);
        if let Some(a) = self.apps.get_mut(&app) {
            a.conns.push(c);
        }
        self.settle(c, now);
    }

    /// Drops a connection the application never knew of.
    fn forget(&mut self, c: u32) {
        if let Some(conn) = self.conns.remove(c) {
            self.table.remove(&conn.key);
            if let Some(a) = self.apps.get_mut(&conn.app) {
                a.conns.retain(|x| *x != c);
            }
        }
    }

    /// Sends the connection's segments.
    fn transmit(
        &mut self,
        iface: &Interface,
        conn: &mut Conn,
        now: ginza_net::tcp::Instant,
        zero_touch: Option<u64>,
    ) {
        let mac = conn
            .peer_mac
            .or_else(|| self.arp.get(&conn.key.remote.ip).copied());
        let (iss, _) = conn.tcb.initial_sequence_numbers();
        let (sends, written) = (&conn.sends, conn.written);
        // Zero-touch: a segment ends where one gather list's pieces end.
        let limit = |seq: Seq| match zero_touch {
            Some(_) => gather_reach(sends, stream_pos(written, iss, seq)) as usize,
            None => usize::MAX,
        };
        while let Some(seg) = conn.tcb.poll_transmit_within(now, limit) {
            let Some(mac) = mac else {
                self.stats.no_route += 1;
                let ip = conn.key.remote.ip;
                self.build(|b| tx::arp_request(b, iface, ip));
                continue;
            };
            if seg.flags.rst {
                self.stats.resets_sent += 1;
            }
            let (port, remote) = (conn.key.local.port, conn.key.remote);
            let mut buf = vec![0u8; MAX_FRAME_LEN];
            let n = match tx::tcp_segment(&mut buf, iface, mac, port, remote, &seg) {
                Ok(n) => n,
                Err(e) => {
                    warn!("cannot build a TCP segment: {e}");
                    continue;
                }
            };
            buf.truncate(n);
            self.stats.frames_out += 1;
            let payload = seg.payload.len();
            let frame = match zero_touch {
                // The payload the TCB holds is zeros (see `pump_send`):
                // the real bytes are named in the tx pool, for iokerneld.
                Some(link) if payload > 0 => {
                    let pos = stream_pos(written, iss, seg.seq);
                    let Some(g) = gather_of(sends, link, pos, payload as u64) else {
                        // `limit` keeps every segment within one list.
                        warn!(
                            "{}: {payload} payload bytes at stream position {pos} \
                             not named by one gather list: frame dropped",
                            conn.key.remote
                        );
                        self.stats.tx_frames_unnamed += 1;
                        continue;
                    };
                    buf.truncate(n - payload);
                    self.stats.tx_bytes_zero_touch += payload as u64;
                    OutFrame {
                        bytes: buf,
                        gather: Some(g),
                        fill_checksum: true,
                    }
                }
                _ => OutFrame::whole(buf),
            };
            self.frames.push_back(frame);
        }
    }

    // ---- every change to a connection ends here -----------------------------

    /// After any change to connection `c`: payload moved both ways,
    /// segments out, phase changes and errors told to the application, and
    /// the connection freed once nobody needs it.
    fn settle(&mut self, c: u32, now: ginza_net::tcp::Instant) {
        let Some(mut conn) = self.conns.remove_for_settle(c) else {
            return;
        };
        let app_id = conn.app;
        let mut events: Vec<(u32, Event)> = Vec::new();
        let mut keep = true;
        let iface = self.apps.get(&app_id).map(|a| a.interface);
        let zero_touch = self
            .apps
            .get(&app_id)
            .and_then(|a| a.zero_touch.then_some(a.id));
        if let Some(app) = self.apps.get_mut(&app_id) {
            if conn.phase == Phase::Open && !conn.released {
                self.stats.tx_bytes_copied += pump_send(app, &mut conn, c, &mut events);
                self.stats.rx_bytes_delivered += pump_recv(app, &mut conn, c, &mut events);
            }
        }
        if let Some(iface) = iface {
            self.transmit(&iface, &mut conn, now, zero_touch);
        }
        let _ = conn.tcb.take_events();
        let id = ConnId::new(c);
        let synchronized = !matches!(
            conn.tcb.state(),
            State::SynSent | State::SynReceived | State::Closed
        );
        match conn.phase {
            Phase::Connecting { cookie } => {
                if synchronized {
                    conn.phase = Phase::Open;
                    if let Some(id) = id {
                        events.push((
                            conn.pair,
                            Event::Connected {
                                cookie,
                                conn: id,
                                local_port: conn.key.local.port,
                            },
                        ));
                    }
                } else if conn.tcb.error().is_some() || conn.tcb.state() == State::Closed {
                    events.push((
                        conn.pair,
                        Event::Refused {
                            conn: None,
                            cookie,
                            command: Command::CONNECT_TAG,
                            reason: conn
                                .tcb
                                .error()
                                .map_or(Reason::ConnectionRefused, reason_of),
                        },
                    ));
                    keep = false;
                }
            }
            Phase::HalfOpen { listener } => {
                match self.listeners.get_mut(listener) {
                    None => {
                        conn.tcb.abort();
                        keep = false;
                    }
                    Some(l) => match l.backlog.step(conn.key.remote, &mut conn.tcb, false) {
                        Backlog::Waiting => {}
                        // Ended, or refused by a full backlog (a reset).
                        Backlog::Ended | Backlog::Refused => keep = false,
                        Backlog::Queued => {
                            conn.phase = Phase::Announced { listener };
                            conn.pair = l.pair;
                            if let (Some(id), Some(lid)) = (id, ListenId::new(listener)) {
                                events.push((
                                    l.pair,
                                    Event::NewConn {
                                        conn: id,
                                        listener: lid,
                                        remote: SocketAddrV4::new(
                                            conn.key.remote.ip,
                                            conn.key.remote.port,
                                        ),
                                    },
                                ));
                            }
                        }
                    },
                }
                if !keep {
                    if let Some(iface) = iface {
                        self.transmit(&iface, &mut conn, now, zero_touch);
                    }
                }
            }
            Phase::Announced { .. } | Phase::Open => {}
        }
        if keep && matches!(conn.phase, Phase::Announced { .. } | Phase::Open) && !conn.released {
            if let (Some(e), false) = (conn.tcb.error(), conn.error_sent) {
                conn.error_sent = true;
                events.push((
                    conn.pair,
                    Event::Refused {
                        conn: id,
                        cookie: 0,
                        command: 0,
                        reason: reason_of(e),
                    },
                ));
            }
            // Cleanup: the application closed it (or it died) and the TCB
            // needs nobody any more.
            let done = conn.tcb.is_finished() || conn.tcb.state() == State::TimeWait;
            let dead = conn.tcb.error().is_some() || conn.tcb.state() == State::Closed;
            if (conn.close_requested && done) || dead {
                self.release(app_id, &mut conn, c, &mut events);
            }
        }
        if conn.released && conn.tcb.is_finished() {
            keep = false;
        }
        if keep {
            if let Some(d) = conn.tcb.next_deadline() {
                self.earliest = self.earliest.min(d.as_nanos());
            }
            if conn.phase == Phase::Open
                && !conn.released
                && conn.tcb.recv_available() > 0
                && !self.starved.contains(&c)
            {
                self.starved.push(c);
            }
            self.conns.put_back(c, conn);
        } else {
            self.table.remove(&conn.key);
            if let Some(a) = self.apps.get_mut(&app_id) {
                a.conns.retain(|x| *x != c);
            }
            self.conns.free(c);
        }
        for (pair, ev) in events {
            self.emit(app_id, pair, ev);
        }
    }

    /// Gives everything of the connection back to the application (unacked
    /// tx ranges with `data_acked`, rx chunks taken back) and says `cleanup`.
    fn release(&mut self, app_id: u64, conn: &mut Conn, c: u32, events: &mut Vec<(u32, Event)>) {
        conn.released = true;
        let Some(id) = ConnId::new(c) else { return };
        let pair = conn.pair;
        push_data_acked(pair, id, conn.sends.drain(..).map(|s| s.range), events);
        if let Some(app) = self.apps.get_mut(&app_id) {
            for chunk in 0..app.lent.len() {
                if matches!(app.lent[chunk], Some((owner, _)) if owner == c) {
                    app.lent[chunk] = None;
                    let _ = app.ledger.give_back(chunk as u32);
                }
            }
        }
        conn.rx_held = 0;
        self.chunks_freed = true;
        events.push((conn.pair, Event::Cleanup { conn: id }));
    }

    // ---- events ------------------------------------------------------------

    fn emit(&mut self, app_id: u64, pair: u32, ev: Event) {
        if let Some(app) = self.apps.get_mut(&app_id) {
            if let Some(q) = app.waiting.get_mut(pair as usize) {
                q.push_back(ev);
            }
        }
    }

    /// Pushes waiting events on their rings; rings found full are counted
    /// and the events wait (never dropped).
    fn flush_events(&mut self) {
        let ids: Vec<u64> = self.apps.keys().copied().collect();
        for id in ids {
            let pairs = self.apps.get(&id).map_or(0, |a| a.pairs.len());
            for p in 0..pairs {
                self.flush_pair(id, p);
            }
        }
    }

    /// Pushes pair `p`'s waiting events; true if none is left waiting.
    fn flush_pair(&mut self, id: u64, p: usize) -> bool {
        let Some(app) = self.apps.get_mut(&id) else {
            return true;
        };
        let q = &mut app.waiting[p];
        if q.is_empty() {
            return true;
        }
        let ring = &mut app.pairs[p];
        let mut n = 0;
        while let Some(ev) = q.front() {
            if matches!(ev, Event::NewData { .. }) {
                // Before the push: the application may take it at once.
                ginza_sys::hops::stamp(ginza_sys::hops::Hop::NetstackEventOut);
            }
            match ring.events.push(ev.encode()) {
                Ok(()) => {
                    q.pop_front();
                    n += 1;
                }
                Err(ginza_shm::PushError::Full(_)) => {
                    self.stats.event_ring_full += 1;
                    ring.line.count_event_ring_full();
                    break;
                }
                Err(ginza_shm::PushError::Corrupt(e)) => {
                    app.doomed
                        .get_or_insert_with(|| format!("event ring {p} corrupt: {e}"));
                    break;
                }
            }
        }
        self.stats.events += n;
        if n > 0 && ring.line.app_waiting() {
            ring.line.set_app_waiting(false);
            if let Some(fd) = app.doorbells.get(p) {
                let _ = ginza_sys::eventfd::write(fd.as_fd(), 1);
            }
        }
        q.is_empty()
    }

    // ---- commands ----------------------------------------------------------

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

    fn take_commands(&mut self, id: u64, p: u32) {
        for _ in 0..self.cfg.command_budget {
            let Some(app) = self.apps.get_mut(&id) else {
                return;
            };
            if app.doomed.is_some() {
                return;
            }
            // Back-pressure: while this pair's events cannot all go out,
            // its commands (which make more events) wait.
            if !app.waiting[p as usize].is_empty() && !self.flush_pair(id, p as usize) {
                return;
            }
            let Some(app) = self.apps.get_mut(&id) else {
                return;
            };
            let slot = match app.pairs[p as usize].commands.pop() {
                Ok(Some(s)) => s,
                Ok(None) => return,
                Err(RingCorrupt { head, tail, .. }) => {
                    return self.cut_off(
                        id,
                        p,
                        Reason::RingCorrupt,
                        format!("command ring {p} corrupt (head {head}, tail {tail})"),
                    );
                }
            };
            self.stats.commands += 1;
            match Command::decode(&slot) {
                Ok(cmd) => {
                    if matches!(cmd, Command::Send { .. }) {
                        ginza_sys::hops::stamp(ginza_sys::hops::Hop::NetstackCommandIn);
                    }
                    self.on_command(id, p, cmd)
                }
                Err(e) => {
                    return self.cut_off(
                        id,
                        p,
                        Reason::BadCommand,
                        format!("undecodable command on ring {p}: {e}"),
                    );
                }
            }
        }
    }

    /// Cuts an application off: `disconnected` as its last event, then the
    /// daemon detaches it ([`Self::take_doomed`]).
    fn cut_off(&mut self, id: u64, p: u32, reason: Reason, why: String) {
        warn!("cutting off app {id}: {why}");
        if let Some(app) = self.apps.get_mut(&id) {
            let _ = app.pairs[p as usize]
                .events
                .push(Event::Disconnected { reason }.encode());
            app.doomed.get_or_insert(why);
        }
    }

    fn refuse(
        &mut self,
        id: u64,
        p: u32,
        conn: Option<ConnId>,
        cookie: u32,
        cmd: &Command,
        reason: Reason,
    ) {
        self.stats.refused += 1;
        debug!("app {id}: {cmd:?} refused: {reason}");
        self.emit(
            id,
            p,
            Event::Refused {
                conn,
                cookie,
                command: cmd.tag(),
                reason,
            },
        );
    }

    /// The connection `conn` names, if application `id` owns it.
    fn owned(&self, id: u64, conn: ConnId) -> Result<u32, Reason> {
        match self.conns.get(conn.get()) {
            None => Err(Reason::NoSuchConnection),
            Some(k) if k.app != id => Err(Reason::NotOwner),
            Some(k) if k.released => Err(Reason::NoSuchConnection),
            Some(_) => Ok(conn.get()),
        }
    }

    fn on_command(&mut self, id: u64, p: u32, cmd: Command) {
        let now = self.now();
        match cmd {
            Command::Listen {
                cookie,
                port,
                backlog,
            } => {
                let Some(iface) = self.apps.get(&id).map(|a| a.interface) else {
                    return;
                };
                let local = Endpoint::new(iface.ip, port);
                if self.table.is_listening(&local) {
                    return self.refuse(id, p, None, cookie, &cmd, Reason::PortInUse);
                }
                let backlog = usize::from(backlog.clamp(1, self.cfg.max_backlog));
                let entry = ListenerEntry {
                    app: id,
                    pair: p,
                    local,
                    backlog: Listener::new(ListenConfig {
                        half_open: backlog.max(64),
                        backlog,
                    }),
                };
                let Some(l) = self.listeners.insert(entry) else {
                    return self.refuse(id, p, None, cookie, &cmd, Reason::TooManyConnections);
                };
                let _ = self.table.listen(local, l);
                if let Some(a) = self.apps.get_mut(&id) {
                    a.listeners.push(l);
                }
                if let Some(listener) = ListenId::new(l) {
                    self.emit(id, p, Event::Listening { cookie, listener });
                }
            }
            Command::Unlisten { listener } => {
                match self.listeners.get(listener.get()) {
                    None => return self.refuse(id, p, None, 0, &cmd, Reason::NoSuchConnection),
                    Some(l) if l.app != id => {
                        return self.refuse(id, p, None, 0, &cmd, Reason::NotOwner)
                    }
                    Some(_) => {}
                }
                if let Some(l) = self.listeners.remove(listener.get()) {
                    self.table.unlisten(&l.local, |&x| x == listener.get());
                    if let Some(a) = self.apps.get_mut(&id) {
                        a.listeners.retain(|x| *x != listener.get());
                    }
                }
            }
            Command::Accept { conn, listener } => {
                let c = match self.owned(id, conn) {
                    Ok(c) => c,
                    Err(r) => return self.refuse(id, p, Some(conn), 0, &cmd, r),
                };
                let ok = matches!(
                    self.conns.get(c).map(|k| k.phase),
                    Some(Phase::Announced { listener: l }) if l == listener.get()
                );
                if !ok {
                    return self.refuse(id, p, Some(conn), 0, &cmd, Reason::InvalidState);
                }
                let remote = self.conns.get(c).map(|k| k.key.remote);
                if let (Some(l), Some(remote)) = (self.listeners.get_mut(listener.get()), remote) {
                    l.backlog.forget(remote);
                }
                if let Some(k) = self.conns.get_mut(c) {
                    k.phase = Phase::Open;
                    k.pair = p;
                }
                self.settle(c, now);
            }
            Command::Connect { cookie, remote } => {
                let Some(iface) = self.apps.get(&id).map(|a| a.interface) else {
                    return;
                };
                let remote = Endpoint::new(*remote.ip(), remote.port());
                let Some(port) = self.table.ephemeral_port(iface.ip, remote) else {
                    return self.refuse(id, p, None, cookie, &cmd, Reason::TooManyConnections);
                };
                let key = FourTuple::new(Endpoint::new(iface.ip, port), remote);
                let iss = self.isn.isn(key.local, key.remote, now);
                let tcb = Connection::connect(&self.cfg.tcp, key.local, key.remote, iss, now);
                let mac = self.arp.get(&remote.ip).copied();
                let conn = Conn::new(id, p, key, mac, tcb, Phase::Connecting { cookie });
                let Some(c) = self.conns.insert(conn) else {
                    return self.refuse(id, p, None, cookie, &cmd, Reason::TooManyConnections);
                };
                self.table.insert(key, c);
                if let Some(a) = self.apps.get_mut(&id) {
                    a.conns.push(c);
                }
                self.settle(c, now);
            }
            Command::Send { conn, ranges, .. } => {
                let c = match self.owned(id, conn) {
                    Ok(c) => c,
                    Err(r) => return self.refuse(id, p, Some(conn), 0, &cmd, r),
                };
                let Some(app) = self.apps.get(&id) else {
                    return;
                };
                if ranges.as_slice().iter().any(|r| app.tx.check(*r).is_err()) {
                    return self.refuse(id, p, Some(conn), 0, &cmd, Reason::OutsideTxPool);
                }
                let limit = self.cfg.send_queue_bytes;
                let Some(k) = self.conns.get_mut(c) else {
                    return;
                };
                if k.phase != Phase::Open || k.shutdown_requested || k.close_requested {
                    return self.refuse(id, p, Some(conn), 0, &cmd, Reason::InvalidState);
                }
                if k.named - k.acked() + ranges.bytes() > limit {
                    return self.refuse(id, p, Some(conn), 0, &cmd, Reason::SendQueueFull);
                }
                for r in ranges.as_slice() {
                    k.named += u64::from(r.len);
                    k.sends.push_back(PendingSend {
                        range: *r,
                        end: k.named,
                    });
                }
                self.settle(c, now);
            }
            Command::RecvDone { conn, ranges } => {
                let c = match self.owned(id, conn) {
                    Ok(c) => c,
                    Err(r) => return self.refuse(id, p, Some(conn), 0, &cmd, r),
                };
                let Some(app) = self.apps.get_mut(&id) else {
                    return;
                };
                // All or nothing: every range must be a chunk lent to this
                // connection with exactly this length.
                let mut chunks = Vec::with_capacity(MAX_RANGES);
                for r in ranges.as_slice() {
                    let chunk = RxPool::chunk_of(r.offset);
                    let ok = chunk.is_some_and(|ch| {
                        app.lent.get(ch as usize).copied().flatten() == Some((c, r.len))
                            && !chunks.contains(&ch)
                    });
                    if !ok {
                        return self.refuse(id, p, Some(conn), 0, &cmd, Reason::NotDelivered);
                    }
                    chunks.extend(chunk);
                }
                let mut freed = 0u64;
                for (ch, r) in chunks.iter().zip(ranges.as_slice()) {
                    app.lent[*ch as usize] = None;
                    let _ = app.ledger.give_back(*ch);
                    freed += u64::from(r.len);
                }
                if let Some(k) = self.conns.get_mut(c) {
                    k.rx_held = k.rx_held.saturating_sub(freed);
                }
                self.chunks_freed = true;
                self.settle(c, now);
            }
            Command::Shutdown { conn } | Command::Close { conn } => {
                let c = match self.owned(id, conn) {
                    Ok(c) => c,
                    Err(r) => return self.refuse(id, p, Some(conn), 0, &cmd, r),
                };
                let close = matches!(cmd, Command::Close { .. });
                if let Some(k) = self.conns.get_mut(c) {
                    if close {
                        k.close_requested = true;
                        if k.phase != Phase::Open {
                            // Never accepted: nothing of the application's
                            // to send first.
                            k.tcb.abort();
                            k.phase = Phase::Open;
                        }
                    } else {
                        k.shutdown_requested = true;
                    }
                    if k.sends.is_empty() || k.tcb.error().is_some() {
                        if close {
                            k.tcb.close();
                        } else {
                            k.tcb.shutdown();
                        }
                    }
                }
                self.settle(c, now);
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

/// Copies queued `send` ranges into the TCB while it has room, and returns
/// acknowledged ranges with `data_acked`. Returns the bytes copied.
fn pump_send(app: &mut App, conn: &mut Conn, c: u32, events: &mut Vec<(u32, Event)>) -> u64 {
    let Some(id) = ConnId::new(c) else { return 0 };
    let mut copied = 0u64;
    let mut buf = [0u8; 4096];
    // The range holding stream position `written`.
    'fill: while conn.tcb.send_capacity() > 0 {
        let start_of = |s: &PendingSend| s.end - u64::from(s.range.len);
        let Some(s) = conn
            .sends
            .iter()
            .find(|s| start_of(s) <= conn.written && conn.written < s.end)
        else {
            break;
        };
        let skip = (conn.written - start_of(s)) as u32;
        let len = (s.range.len - skip).min(buf.len() as u32);
        let r = Range::new(s.range.offset + skip, len);
        let n = if app.zero_touch {
            // Zero-touch: the TCB holds zeros in the payload's place (it
            // needs lengths and sequence numbers, never the bytes); frames
            // name the tx pool instead (`Netstack::transmit`).
            buf[..len as usize].fill(0);
            len as usize
        } else {
            match app.tx.copy_out(r, &mut buf) {
                Ok(n) => n,
                Err(_) => break, // checked at `send`; the pool cannot shrink
            }
        };
        match conn.tcb.send(&buf[..n]) {
            Ok(k) => {
                conn.written += k as u64;
                if !app.zero_touch {
                    copied += k as u64;
                }
                if k < n {
                    break 'fill;
                }
            }
            Err(_) => break,
        }
    }
    if conn.sends.is_empty() || conn.written == conn.named {
        if conn.close_requested && conn.tcb.state() != State::Closed {
            conn.tcb.close();
        } else if conn.shutdown_requested {
            conn.tcb.shutdown();
        }
    }
    let acked = conn.acked();
    let pair = conn.pair;
    let sends = &mut conn.sends;
    let done = std::iter::from_fn(|| {
        if sends.front()?.end <= acked {
            sends.pop_front().map(|s| s.range)
        } else {
            None
        }
    });
    push_data_acked(pair, id, done, events);
    copied
}

/// `data_acked` events for `ranges`, in order, as many ranges to an event
/// as it holds.
fn push_data_acked(
    pair: u32,
    conn: ConnId,
    ranges: impl Iterator<Item = Range>,
    events: &mut Vec<(u32, Event)>,
) {
    let mut rs = Ranges::default();
    for r in ranges {
        if !rs.push(r) {
            events.push((pair, Event::DataAcked { conn, ranges: rs }));
            rs = Ranges::default();
            rs.push(r);
        }
    }
    if !rs.is_empty() {
        events.push((pair, Event::DataAcked { conn, ranges: rs }));
    }
}

/// Moves received bytes from the TCB into rx chunks (while the
/// application holds less than a receive buffer and chunks are free) and
/// announces them with `new_data`; `remote_closed` after the FIN. Returns
/// the bytes delivered.
fn pump_recv(app: &mut App, conn: &mut Conn, c: u32, events: &mut Vec<(u32, Event)>) -> u64 {
    let Some(id) = ConnId::new(c) else { return 0 };
    let limit = conn_recv_limit();
    let mut delivered = 0u64;
    let mut rs = Ranges::default();
    while conn.tcb.recv_available() > 0 && conn.rx_held < limit {
        let Some(chunk) = app.ledger.lend() else {
            break;
        };
        let Some(buf) = app.rx.chunk_mut(chunk) else {
            break;
        };
        let n = match conn.tcb.recv(buf) {
            Ok(n) if n > 0 => n as u32,
            _ => {
                let _ = app.ledger.give_back(chunk);
                break;
            }
        };
        app.lent[chunk as usize] = Some((c, n));
        conn.rx_held += u64::from(n);
        delivered += u64::from(n);
        let r = RxPool::chunk_range(chunk, n);
        if !rs.push(r) {
            events.push((
                conn.pair,
                Event::NewData {
                    conn: id,
                    ranges: rs,
                },
            ));
            rs = Ranges::default();
            rs.push(r);
        }
    }
    if !rs.is_empty() {
        events.push((
            conn.pair,
            Event::NewData {
                conn: id,
                ranges: rs,
            },
        ));
    }
    if conn.tcb.recv_available() == 0
        && !conn.remote_closed_sent
        && matches!(conn.tcb.recv(&mut []), Ok(0))
        && matches!(
            conn.tcb.state(),
            State::CloseWait | State::LastAck | State::Closing | State::TimeWait
        )
    {
        conn.remote_closed_sent = true;
        events.push((conn.pair, Event::RemoteClosed { conn: id }));
    }
    delivered
}

/// The pieces of the tx pool holding stream bytes `[pos, pos + len)`.
fn pieces(sends: &VecDeque<PendingSend>, pos: u64, len: u64) -> impl Iterator<Item = Range> + '_ {
    let end = pos + len;
    sends.iter().filter_map(move |s| {
        let start = s.end - u64::from(s.range.len);
        let (from, to) = (start.max(pos), s.end.min(end));
        (from < to).then(|| Range::new(s.range.offset + (from - start) as u32, (to - from) as u32))
    })
}

/// A gather list for stream bytes `[pos, pos + len)`, if they are all
/// still held and fit one list.
fn gather_of(sends: &VecDeque<PendingSend>, link: u64, pos: u64, len: u64) -> Option<GatherList> {
    let mut g = GatherList {
        link,
        ..Default::default()
    };
    for r in pieces(sends, pos, len) {
        if !g.push(r) {
            return None;
        }
    }
    (g.len() as u64 == len).then_some(g)
}

/// Stream bytes from `pos` on that one gather list can name: those of the
/// first `MAX_GATHER` send ranges still held from there.
fn gather_reach(sends: &VecDeque<PendingSend>, pos: u64) -> u64 {
    pieces(sends, pos, u64::MAX - pos)
        .take(MAX_GATHER)
        .map(|r| u64::from(r.len))
        .sum()
}

/// The stream position (bytes since the first `send`) of sequence number
/// `seq`, the nearest to `written` (positions are 64-bit, sequence numbers
/// wrap at 32).
fn stream_pos(written: u64, iss: Seq, seq: Seq) -> u64 {
    let pos32 = seq.0.wrapping_sub(iss.0.wrapping_add(1));
    written.wrapping_sub(u64::from((written as u32).wrapping_sub(pos32)))
}

/// Bytes of received data one connection may have lent out at once (then
/// the TCB's own buffer fills and its window closes: flow control).
fn conn_recv_limit() -> u64 {
    256 * 1024
}

const _: () = assert!(RX_CHUNK as usize <= 4096);

/// Slab operations for `settle`, which takes a connection out while it
/// works on it (so `self` stays borrowable) and puts it back.
trait SettleSlab {
    fn remove_for_settle(&mut self, c: u32) -> Option<Conn>;
    fn put_back(&mut self, c: u32, conn: Conn);
    fn free(&mut self, c: u32);
}

impl SettleSlab for Slab<Conn> {
    fn remove_for_settle(&mut self, c: u32) -> Option<Conn> {
        self.take(c)
    }
    fn put_back(&mut self, c: u32, conn: Conn) {
        self.restore(c, conn)
    }
    fn free(&mut self, c: u32) {
        self.release(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(ranges: &[(u32, u32)]) -> VecDeque<PendingSend> {
        let mut end = 0;
        ranges
            .iter()
            .map(|&(o, l)| {
                end += u64::from(l);
                PendingSend {
                    range: Range::new(o, l),
                    end,
                }
            })
            .collect()
    }

    #[test]
    fn stream_bytes_map_to_tx_pool_pieces() {
        let s = sends(&[(1000, 10), (5000, 5)]);
        let g = gather_of(&s, 9, 8, 5).unwrap();
        assert_eq!(g.link, 9);
        assert_eq!(g.pieces(), &[Range::new(1008, 2), Range::new(5000, 3)]);
        // Bytes no longer held (acked and returned) give no list.
        assert_eq!(gather_of(&s, 9, 12, 10), None);
        // More pieces than a list holds: none (the netstack copies).
        let tiny = sends(&[(0, 1); 9]);
        assert_eq!(gather_of(&tiny, 1, 0, 9), None);
        assert!(gather_of(&tiny, 1, 0, 8).is_some());
    }
}
