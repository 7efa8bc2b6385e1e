//! The stack's state: the runtime-wide part ([`Stack`]: interface, ingress
//! pool, ARP table, sockets); each kthread's packet rings ([`KNet`]) are in
//! `link.rs`, below the scheduler, which holds them.
//!
//! Which context may touch what:
//! * a kthread's ingress consumer: whoever holds its try-lock (the owner, or
//!   a thief stealing packet processing);
//! * a kthread's done and egress producers: only the owner kthread, with
//!   preemption deferred (its scheduler context, or a uthread running on it
//!   inside a deferred section), so no preemption point falls between
//!   filling an egress buffer and pushing its descriptor;
//! * everything else: spinlocks, which defer preemption while held.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_net::{
    parse, tx, ArpOperation, ArpTable, Endpoint, Interface, MacAddr, Packet, Resolution,
    UdpDatagram, MAX_UDP_PAYLOAD, UDP_PAYLOAD_OFFSET,
};
use ginza_shm::{IngressPool, PacketDesc, PushError};
use ginza_sys::hops::{self, Hop};

use super::egress::{failed, transmit, TxFail};
use super::readiness::{Readiness, SocketWaiters, Watched};
use super::tcp::{Burst, Tcp};
use super::wait::no_runtime;
use super::{no_arp_reply, KthreadNetStats, NetStats, ARP_GIVE_UP, ARP_POLL};
use crate::config::NetConfig;
use crate::link::{KNet, PacketStack, TxSide};
use crate::own_socket::{OwnSocket, OWN_CHUNK, RX_BATCH};
use crate::sched::{self, bump, Shared};
use crate::spinlock::SpinLock;

/// Ports `bind(0)` picks from (IANA's dynamic range).
const EPHEMERAL_FIRST: u16 = 49152;
/// How often the ARP table is swept for addresses that never answered.
const ARP_EXPIRE_EVERY: Duration = Duration::from_millis(100);

fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed) + n, Relaxed);
}

/// Counters of one kthread's packet rings (the rings themselves: `link.rs`).
impl KNet {
    pub(crate) fn stats(&self, id: usize) -> KthreadNetStats {
        KthreadNetStats {
            id,
            rx_packets: self.counters.rx_packets.load(Relaxed),
            rx_stolen: self.counters.rx_stolen.load(Relaxed),
            tx_packets: self.counters.tx_packets.load(Relaxed),
        }
    }
}

impl PacketStack for Stack {
    fn poll(&self, me: &mut TxSide<'_>, ring: &KNet, budget: usize) -> usize {
        Stack::poll(self, me, ring, budget)
    }

    fn next_deadline(&self) -> Option<std::time::Instant> {
        self.tcp.next_deadline()
    }
}

/// A received datagram waiting in a socket's queue: its ingress buffer and
/// where the payload lies in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxItem {
    buf: u32,
    off: u16,
    len: u16,
    src: Endpoint,
}

impl RxItem {
    pub(crate) fn buf_index(&self) -> u32 {
        self.buf
    }
}

struct RxQueue {
    items: VecDeque<RxItem>,
    capacity: usize,
    /// The socket was closed: deliveries are refused (the deliverer gives
    /// the buffer back).
    closed: bool,
}

/// Why a datagram was not queued.
enum Refused {
    /// No socket on the port (or it is closing, or connected elsewhere).
    NoSocket,
    Full,
}

/// The shared part of a UDP socket.
pub(crate) struct SocketCore {
    /// As bound: the application's IP or 0.0.0.0, and the port.
    pub(crate) local: SocketAddrV4,
    /// Connected peer (`peer_key`), 0 when not connected.
    peer: AtomicU64,
    rx: SpinLock<RxQueue>,
    /// Uthreads waiting for a datagram, oldest first (a datagram wakes
    /// one), and the pollers watching (a datagram notifies all).
    pub(crate) waiters: SpinLock<SocketWaiters>,
    /// Read timeout in ns, 0 for none.
    pub(crate) read_timeout_ns: AtomicU64,
}

fn peer_key(e: Endpoint) -> u64 {
    1 << 48 | u64::from(u32::from(e.ip)) << 16 | u64::from(e.port)
}

impl SocketCore {
    pub(crate) fn port(&self) -> u16 {
        self.local.port()
    }

    pub(crate) fn peer(&self) -> Option<Endpoint> {
        let k = self.peer.load(Relaxed);
        (k != 0).then(|| Endpoint::new(Ipv4Addr::from((k >> 16) as u32), k as u16))
    }

    pub(crate) fn set_peer(&self, peer: Endpoint) {
        self.peer.store(peer_key(peer), Relaxed);
    }

    /// A datagram is waiting, or the socket is closed.
    pub(crate) fn readable(&self) -> bool {
        let rx = self.rx.lock();
        !rx.items.is_empty() || rx.closed
    }

    /// The payload length of the next datagram (0: none): `FIONREAD`.
    pub(crate) fn next_len(&self) -> usize {
        self.rx
            .lock()
            .items
            .front()
            .map_or(0, |i| usize::from(i.len))
    }

    fn deliver(&self, item: RxItem) -> Result<(), (RxItem, Refused)> {
        {
            let mut rx = self.rx.lock();
            if rx.closed {
                return Err((item, Refused::NoSocket));
            }
            if rx.items.len() >= rx.capacity {
                return Err((item, Refused::Full));
            }
            rx.items.push_back(item);
        }
        // A waiter that timed out meanwhile does not take the wake-up: the
        // next one does.
        let watches = self.waiters.lock().live_watches();
        for w in watches {
            w.notify();
        }
        loop {
            let w = self.waiters.lock().uthreads.pop_front();
            match w {
                Some(w) if !w.wake() => continue,
                _ => return Ok(()),
            }
        }
    }

    pub(crate) fn take(&self) -> Option<RxItem> {
        self.rx.lock().items.pop_front()
    }
}

impl Watched for SocketCore {
    /// Readable while a datagram waits, always writable (a send never
    /// waits for the peer); nothing once closed.
    fn readiness(&self) -> Readiness {
        let rx = self.rx.lock();
        Readiness {
            readable: !rx.closed && !rx.items.is_empty(),
            writable: !rx.closed,
            ..Readiness::default()
        }
    }

    fn waiters(&self) -> &SpinLock<SocketWaiters> {
        &self.waiters
    }
}

/// What waits in the ARP table for a destination's MAC.
#[derive(Debug)]
enum Outgoing {
    /// A datagram (a copy: egress buffers belong to a kthread and cannot
    /// wait).
    Datagram {
        src_port: u16,
        dst: Endpoint,
        payload: Box<[u8]>,
    },
    /// A TCP connect asking for the address: it looks at the table itself.
    Probe,
}

struct Arp {
    table: ArpTable<Outgoing>,
    last_expire: Instant,
}

struct Sockets {
    by_port: HashMap<u16, Arc<SocketCore>>,
    next_ephemeral: u16,
}

/// What a send did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// On the egress ring.
    Now,
    /// Queued until the destination answers ARP.
    Queued,
    /// Refused by the ARP table (its queue for the address, or the table,
    /// is full); counted there.
    Dropped,
    /// The kthread's egress ring is full: try again later.
    RingFull,
}

/// The runtime-wide part of the stack.
pub(crate) struct Stack {
    pub(crate) iface: Interface,
    pool: IngressPool,
    arp: SpinLock<Arp>,
    sockets: SpinLock<Sockets>,
    udp_queue: usize,
    arp_retry_interval: Duration,
    pub(crate) tcp: Arc<Tcp>,
    /// Buffers given back outside any kthread (a socket dropped by an OS
    /// thread) or when a done ring was full: the next poll pushes them.
    orphans: SpinLock<Vec<u32>>,
    orphan_count: AtomicUsize,
    /// Ingress buffers in socket queues.
    held: AtomicU64,
    /// The application's own AF_XDP socket, on the direct path: its
    /// received frames are processed here like the ingress rings'.
    own: Option<Arc<OwnSocket>>,
}

impl Stack {
    pub(crate) fn new(cfg: &NetConfig, pool: IngressPool, own: Option<Arc<OwnSocket>>) -> Stack {
        Stack {
            iface: cfg.interface,
            pool,
            arp: SpinLock::new(Arp {
                table: ArpTable::new(cfg.arp, &cfg.static_arp),
                last_expire: Instant::now(),
            }),
            sockets: SpinLock::new(Sockets {
                by_port: HashMap::new(),
                next_ephemeral: EPHEMERAL_FIRST,
            }),
            udp_queue: cfg.udp_queue,
            arp_retry_interval: cfg.arp.retry_interval,
            tcp: Arc::new(Tcp::new(cfg.interface, cfg.tcp.clone(), cfg.tcp_listen)),
            orphans: SpinLock::new(Vec::new()),
            orphan_count: AtomicUsize::new(0),
            held: AtomicU64::new(0),
            own,
        }
    }

    // ---- receive ---------------------------------------------------------

    /// Processes up to `budget` frames of `ring`'s ingress ring as kthread
    /// `me` (replies on `me`'s egress ring, buffers back on `me`'s done
    /// ring); returns the frames taken. Does nothing if another kthread is
    /// processing that ring.
    ///
    pub(crate) fn poll(&self, me: &mut TxSide<'_>, ring: &KNet, budget: usize) -> usize {
        if self.orphan_count.load(Relaxed) > 0 {
            self.flush_orphans(me);
        }
        let mut burst = Burst::default();
        self.tcp.poll(me, &mut burst);
        let Some(mut ingress) = ring.ingress.try_lock() else {
            return 0;
        };
        // The ring stays locked while its batch is processed, so frames of
        // one ring (and so of one flow) are handled in order.
        let mut n = 0;
        while n < budget {
            let desc = match ingress.pop() {
                Ok(Some(d)) => d,
                Ok(None) => break,
                Err(e) => {
                    if !ring.ingress_corrupt_said.swap(true, Relaxed) {
                        log::error!("an ingress ring is corrupt, no longer read: {e}");
                    }
                    break;
                }
            };
            n += 1;
            hops::stamp(Hop::Picked);
            self.process(me, desc, &mut burst);
            hops::stamp(Hop::FrameProcessed);
        }
        drop(ingress);
        if let Some(own) = &self.own {
            n += self.poll_own(me, own, budget - n, &mut burst);
        }
        self.tcp.answer_deferred(me, &mut burst);
        if n > 0 {
            hops::stamp(Hop::Settled);
            add(&me.counters.rx_packets, n as u64);
            if !std::ptr::eq(&**me, ring) {
                add(&me.counters.rx_stolen, n as u64);
            }
        }
        n
    }

    /// Processes up to `budget` frames of the own socket's rx ring (the
    /// direct path); the frames taken.
    fn poll_own(
        &self,
        me: &mut TxSide<'_>,
        own: &OwnSocket,
        budget: usize,
        burst: &mut Burst,
    ) -> usize {
        let empty = ginza_sys::xsk::Desc {
            addr: 0,
            len: 0,
            options: 0,
        };
        let mut batch = [empty; RX_BATCH];
        let n = own.take_received(&mut batch[..budget.min(RX_BATCH)]);
        for d in &batch[..n] {
            hops::stamp(Hop::Picked);
            match own.frame(d) {
                Some((frame, buf, off)) => {
                    self.process_frame(me, buf, off, frame, burst);
                    hops::stamp(Hop::FrameProcessed);
                }
                None => {
                    bump(&me.counters.bad_descriptors);
                    log::warn!(
                        "own socket: descriptor {:#x}+{} outside the UMEM",
                        d.addr,
                        d.len
                    );
                }
            }
        }
        n
    }

    fn process(&self, me: &mut TxSide<'_>, desc: PacketDesc, burst: &mut Burst) {
        let Some(frame) = self.pool.frame(desc) else {
            bump(&me.counters.bad_descriptors);
            log::warn!(
                "ingress descriptor names buffer {} of {}, length {}: dropped",
                desc.buf,
                self.pool.count(),
                desc.len
            );
            if desc.buf < self.pool.count() {
                self.give_back(me, desc.buf);
            }
            return;
        };
        self.process_frame(me, desc.buf, 0, frame, burst);
    }

    /// Processes one received frame, `frame_off` bytes into buffer `buf`
    /// (an ingress buffer, or an own socket's chunk: [`OWN_CHUNK`]).
    fn process_frame(
        &self,
        me: &mut TxSide<'_>,
        buf: u32,
        frame_off: u16,
        frame: &[u8],
        burst: &mut Burst,
    ) {
        match parse(frame, &self.iface) {
            Err(why) => {
                me.drops.lock().record(&why);
                log::trace!("received frame dropped: {why}");
            }
            Ok(Packet::Arp(m)) => {
                let released = if m.sender_ip.is_unspecified() {
                    VecDeque::new() // a probe: nothing to learn
                } else {
                    let now = Instant::now();
                    self.arp.lock().table.learn(m.sender_ip, m.sender_mac, now)
                };
                if m.operation == ArpOperation::Request {
                    match transmit(me, |b| tx::arp_reply(b, &self.iface, &m)) {
                        Ok(()) => bump(&me.counters.arp_replies),
                        Err(f) => failed(me, f, "ARP reply"),
                    }
                }
                for out in released {
                    let Outgoing::Datagram {
                        src_port,
                        dst,
                        payload,
                    } = out
                    else {
                        continue;
                    };
                    let r = transmit(me, |b| {
                        tx::udp_datagram(b, &self.iface, m.sender_mac, src_port, dst, &payload)
                    });
                    if let Err(f) = r {
                        failed(me, f, "datagram released by ARP");
                    }
                }
            }
            Ok(Packet::IcmpEchoRequest(req)) => {
                match transmit(me, |b| tx::icmp_echo_reply(b, &self.iface, &req)) {
                    Ok(()) => bump(&me.counters.icmp_echo_replies),
                    Err(f) => failed(me, f, "ICMP echo reply"),
                }
            }
            Ok(Packet::Udp(d)) => {
                // The buffer goes to a socket, or back below.
                return self.on_udp(me, buf, frame_off, frame, &d);
            }
            // The state machine copies the payload: the buffer goes back.
            Ok(Packet::Tcp(t)) => self.tcp.input(me, &t, burst),
        }
        self.give_back(me, buf);
    }

    fn on_udp(
        &self,
        me: &mut TxSide<'_>,
        buf: u32,
        frame_off: u16,
        frame: &[u8],
        d: &UdpDatagram<'_>,
    ) {
        // `parse` returns a payload inside the frame (≤ 2048 bytes; a chunk
        // of an own socket is 2048 bytes too).
        let off = d.payload.as_ptr() as usize - frame.as_ptr() as usize + usize::from(frame_off);
        let item = RxItem {
            buf,
            off: off as u16,
            len: d.payload.len() as u16,
            src: d.src,
        };
        self.held.fetch_add(1, Relaxed);
        let result = {
            let sockets = self.sockets.lock();
            match sockets.by_port.get(&d.dst.port) {
                // A connected socket takes datagrams from its peer only.
                Some(s) if s.peer().is_none_or(|p| p == d.src) => s.deliver(item),
                _ => Err((item, Refused::NoSocket)),
            }
        };
        match result {
            Ok(()) => bump(&me.counters.udp_delivered),
            Err((item, why)) => {
                self.held.fetch_sub(1, Relaxed);
                match why {
                    Refused::Full => bump(&me.counters.udp_queue_full),
                    Refused::NoSocket => bump(&me.counters.udp_no_socket),
                }
                self.give_back(me, item.buf);
            }
        }
    }

    /// Copies the payload of `item` (taken from a socket's queue) into
    /// `out`, truncated to its length like `std::net::UdpSocket`; returns
    /// the bytes copied. The buffer is still to be given back.
    pub(crate) fn copy_out(&self, item: &RxItem, out: &mut [u8]) -> usize {
        if item.buf & OWN_CHUNK != 0 {
            let held = self
                .own
                .as_ref()
                .and_then(|own| own.held_bytes(item.buf, item.off, item.len));
            let Some(payload) = held else {
                return 0;
            };
            let n = payload.len().min(out.len());
            out[..n].copy_from_slice(&payload[..n]);
            return n;
        }
        let desc = PacketDesc {
            buf: item.buf,
            len: u32::from(item.off) + u32::from(item.len),
            ..Default::default()
        };
        // Checked when the frame was received: the same bounds hold.
        let Some(frame) = self.pool.frame(desc) else {
            return 0;
        };
        let payload = &frame[item.off as usize..];
        let n = payload.len().min(out.len());
        out[..n].copy_from_slice(&payload[..n]);
        n
    }

    /// The bytes of a frame iokerneld lent outside the ingress rings (a
    /// request it dispatches, docs/colocate.md); `None` if `desc` names
    /// no buffer of the pool.
    pub(crate) fn lent_frame(&self, desc: PacketDesc) -> Option<&[u8]> {
        self.pool.frame(desc)
    }

    pub(crate) fn item_source(item: &RxItem) -> SocketAddrV4 {
        item.src.into()
    }

    /// Gives an ingress buffer back to iokerneld on `me`'s done ring.
    ///
    pub(crate) fn give_back(&self, me: &mut TxSide<'_>, buf: u32) {
        if buf & OWN_CHUNK != 0 {
            if let Some(own) = &self.own {
                own.give_back(buf);
            }
            return;
        }
        let tx = me.tx();
        match tx.done.push(buf) {
            Ok(()) => {}
            // It holds the whole pool: full means iokerneld is behind;
            // keep the buffer for the next poll.
            Err(PushError::Full(b)) => self.give_back_later(b),
            Err(PushError::Corrupt(e)) => {
                if !std::mem::replace(&mut tx.corrupt_said, true) {
                    log::error!("a done ring is corrupt; ingress buffers are not given back: {e}");
                }
            }
        }
    }

    /// Gives a buffer back from a context that may not use a done ring.
    pub(crate) fn give_back_later(&self, buf: u32) {
        self.orphans.lock().push(buf);
        self.orphan_count.fetch_add(1, Relaxed);
    }

    fn flush_orphans(&self, me: &mut TxSide<'_>) {
        let bufs = std::mem::take(&mut *self.orphans.lock());
        self.orphan_count.fetch_sub(bufs.len(), Relaxed);
        for b in bufs {
            self.give_back(me, b);
        }
    }

    // ---- transmit --------------------------------------------------------

    /// Sends a UDP datagram from `src_port` as kthread `me`.
    ///
    pub(crate) fn send_udp(
        &self,
        me: &mut TxSide<'_>,
        src_port: u16,
        dst: Endpoint,
        payload: &[u8],
    ) -> io::Result<Sent> {
        if payload.len() > MAX_UDP_PAYLOAD {
            return Err(super::wait::os_error(
                libc::EMSGSIZE,
                format_args!(
                    "UDP payload of {} bytes is larger than {MAX_UDP_PAYLOAD} (one unfragmented datagram)",
                    payload.len()
                ),
            ));
        }
        let now = Instant::now();
        let known = if dst.ip.is_broadcast() {
            Some(MacAddr::BROADCAST)
        } else if dst.ip == self.iface.ip {
            Some(self.iface.mac)
        } else {
            self.arp.lock().table.lookup(dst.ip, now)
        };
        let mac = match known {
            Some(mac) => mac,
            None => {
                // A full ring is seen before anything is queued or asked
                // for (with a known MAC, `transmit` sees it).
                match me.tx().egress.free() {
                    Ok(0) => return Ok(Sent::RingFull),
                    Ok(_) => {}
                    Err(e) => {
                        return Err(super::wait::os_error(
                            libc::EIO,
                            format_args!("this kthread's egress ring is corrupt: {e}"),
                        ))
                    }
                }
                let outgoing = Outgoing::Datagram {
                    src_port,
                    dst,
                    payload: payload.into(),
                };
                let resolution = {
                    let mut arp = self.arp.lock();
                    if now.saturating_duration_since(arp.last_expire) >= ARP_EXPIRE_EVERY {
                        arp.last_expire = now;
                        arp.table.expire(now, drop);
                    }
                    arp.table.resolve(dst.ip, now, outgoing)
                };
                let (sent, ask) = match resolution {
                    Resolution::Known { mac, .. } => {
                        // Learned between the lookup and now.
                        return self.send_udp_to(me, mac, src_port, dst, payload);
                    }
                    Resolution::Queued { send_request } => (Sent::Queued, send_request),
                    Resolution::Refused { send_request, .. } => (Sent::Dropped, send_request),
                };
                if ask {
                    let r = transmit(me, |b| tx::arp_request(b, &self.iface, dst.ip));
                    if let Err(f) = r {
                        failed(me, f, "ARP request");
                    }
                }
                return Ok(sent);
            }
        };
        self.send_udp_to(me, mac, src_port, dst, payload)
    }

    /// Sends a UDP datagram to `dst` at the Ethernet address `mac` (a
    /// reply to a frame that came from there: no ARP lookup).
    pub(crate) fn send_udp_to(
        &self,
        me: &mut TxSide<'_>,
        mac: MacAddr,
        src_port: u16,
        dst: Endpoint,
        payload: &[u8],
    ) -> io::Result<Sent> {
        let build = |b: &mut [u8]| {
            // In place: the payload is copied once, into the egress buffer.
            b[UDP_PAYLOAD_OFFSET..UDP_PAYLOAD_OFFSET + payload.len()].copy_from_slice(payload);
            tx::write_udp_headers(b, &self.iface, mac, src_port, dst, payload.len())
        };
        match transmit(me, build) {
            Ok(()) => Ok(Sent::Now),
            Err(TxFail::RingFull) => Ok(Sent::RingFull),
            Err(TxFail::Corrupt) => Err(super::wait::os_error(
                libc::EIO,
                format_args!("this kthread's egress ring is corrupt"),
            )),
            Err(TxFail::Build(e)) => Err(super::wait::os_error(
                libc::EINVAL,
                format_args!("UDP datagram to {dst}: {e}"),
            )),
        }
    }

    /// The MAC a TCP `connect` to `remote` sends to: the ARP table's,
    /// after asking for it if needed (polling the table until it answers or
    /// `deadline`), as a uthread of `rt`.
    pub(super) fn resolve_mac(
        &self,
        rt: &Shared,
        remote: Endpoint,
        deadline: Option<Instant>,
    ) -> io::Result<MacAddr> {
        let give_up = deadline.unwrap_or_else(|| Instant::now() + ARP_GIVE_UP);
        let mut asked_at: Option<Instant> = None;
        loop {
            if let Some(mac) = self.look_for_mac(rt, remote, &mut asked_at)? {
                return Ok(mac);
            }
            if Instant::now() >= give_up {
                return Err(no_arp_reply(remote));
            }
            sched::sleep(ARP_POLL);
        }
    }

    /// One look at the ARP table for `remote`'s MAC; if it is unknown,
    /// asks for it (again once ARP's retry interval has passed since
    /// `asked_at`, which it updates), as a uthread of `rt`.
    pub(super) fn look_for_mac(
        &self,
        rt: &Shared,
        remote: Endpoint,
        asked_at: &mut Option<Instant>,
    ) -> io::Result<Option<MacAddr>> {
        if let Some(mac) = self.lookup_mac(remote.ip) {
            return Ok(Some(mac));
        }
        let now = Instant::now();
        if asked_at.is_none_or(|t| now.duration_since(t) >= self.arp_retry_interval) {
            *asked_at = Some(now);
            if sched::with_current_knet(rt, |me| self.ask_mac(me, remote.ip)).is_none() {
                return Err(no_runtime(
                    "TcpStream::connect (on a uthread of the runtime)",
                ));
            }
        }
        Ok(None)
    }

    /// The MAC of `ip` if the ARP table knows it (our own for our IP).
    fn lookup_mac(&self, ip: Ipv4Addr) -> Option<MacAddr> {
        if ip == self.iface.ip {
            return Some(self.iface.mac);
        }
        self.arp.lock().table.lookup(ip, Instant::now())
    }

    /// Asks for `ip`'s MAC (an ARP request, unless one is outstanding).
    fn ask_mac(&self, me: &mut TxSide<'_>, ip: Ipv4Addr) {
        let resolution = self
            .arp
            .lock()
            .table
            .resolve(ip, Instant::now(), Outgoing::Probe);
        let ask = match resolution {
            Resolution::Known { .. } => false,
            Resolution::Queued { send_request } | Resolution::Refused { send_request, .. } => {
                send_request
            }
        };
        if ask {
            let r = transmit(me, |b| tx::arp_request(b, &self.iface, ip));
            if let Err(f) = r {
                failed(me, f, "ARP request");
            }
        }
    }

    // ---- sockets ---------------------------------------------------------

    /// Binds `addr` (the application's IP or 0.0.0.0; port 0 picks a free
    /// ephemeral port).
    pub(crate) fn bind(&self, addr: SocketAddrV4) -> io::Result<Arc<SocketCore>> {
        let ip = *addr.ip();
        if !ip.is_unspecified() && ip != self.iface.ip {
            return Err(super::wait::os_error(
                libc::EADDRNOTAVAIL,
                format_args!(
                    "cannot bind UDP to {addr}: this application's address is {} (bind to it or to 0.0.0.0)",
                    self.iface.ip
                ),
            ));
        }
        let mut sockets = self.sockets.lock();
        let port = match addr.port() {
            0 => {
                let n = u32::from(u16::MAX - EPHEMERAL_FIRST) + 1;
                let start = sockets.next_ephemeral;
                let free = (0..n)
                    .map(|i| {
                        let off = (u32::from(start - EPHEMERAL_FIRST) + i) % n;
                        EPHEMERAL_FIRST + off as u16
                    })
                    .find(|p| !sockets.by_port.contains_key(p));
                let Some(p) = free else {
                    return Err(super::wait::os_error(
                        libc::EADDRINUSE,
                        format_args!(
                            "no free ephemeral UDP port: {EPHEMERAL_FIRST}-65535 are all bound"
                        ),
                    ));
                };
                sockets.next_ephemeral = p.checked_add(1).unwrap_or(EPHEMERAL_FIRST);
                p
            }
            p if sockets.by_port.contains_key(&p) => {
                return Err(super::wait::os_error(
                    libc::EADDRINUSE,
                    format_args!("UDP port {p} is already bound"),
                ));
            }
            p => p,
        };
        let core = Arc::new(SocketCore {
            local: SocketAddrV4::new(ip, port),
            peer: AtomicU64::new(0),
            rx: SpinLock::new(RxQueue {
                items: VecDeque::with_capacity(self.udp_queue),
                capacity: self.udp_queue,
                closed: false,
            }),
            waiters: SpinLock::new(SocketWaiters::new()),
            read_timeout_ns: AtomicU64::new(0),
        });
        sockets.by_port.insert(port, Arc::clone(&core));
        Ok(core)
    }

    /// Unbinds `core` and returns the buffers it still holds through
    /// `give_back`.
    pub(crate) fn close(&self, core: &Arc<SocketCore>, mut give_back: impl FnMut(u32)) {
        {
            let mut sockets = self.sockets.lock();
            if sockets
                .by_port
                .get(&core.port())
                .is_some_and(|s| Arc::ptr_eq(s, core))
            {
                sockets.by_port.remove(&core.port());
            }
        }
        let items = {
            let mut rx = core.rx.lock();
            rx.closed = true;
            std::mem::take(&mut rx.items)
        };
        self.held.fetch_sub(items.len() as u64, Relaxed);
        items.iter().for_each(|i| give_back(i.buf));
        // Nobody can be waiting on a socket being dropped, but wake any
        // anyway: they see it closed.
        let woken = core.waiters.lock().take_all();
        woken.run();
    }

    /// A datagram was taken from a socket's queue.
    pub(crate) fn taken(&self) {
        self.held.fetch_sub(1, Relaxed);
    }

    pub(crate) fn stats<'a>(&self, knets: impl Iterator<Item = (usize, &'a KNet)>) -> NetStats {
        let mut s = NetStats {
            arp: self.arp.lock().table.counters().clone(),
            buffers_held: self.held.load(Relaxed),
            tcp: self.tcp.stats(),
            ..NetStats::default()
        };
        if let Some(own) = &self.own {
            s.direct_rx_packets = own.counters.rx_frames.load(Relaxed);
            s.direct_tx_packets = own.counters.tx_frames.load(Relaxed);
            s.direct_tx_kicks = own.counters.tx_kicks.load(Relaxed);
        }
        for (id, k) in knets {
            let c = &k.counters;
            let ks = k.stats(id);
            s.rx_packets += ks.rx_packets;
            s.tx_packets += ks.tx_packets;
            s.udp_delivered += c.udp_delivered.load(Relaxed);
            s.udp_no_socket += c.udp_no_socket.load(Relaxed);
            s.udp_queue_full += c.udp_queue_full.load(Relaxed);
            s.bad_descriptors += c.bad_descriptors.load(Relaxed);
            s.tx_ring_full += c.tx_ring_full.load(Relaxed);
            s.arp_replies += c.arp_replies.load(Relaxed);
            s.icmp_echo_replies += c.icmp_echo_replies.load(Relaxed);
            s.drops.merge(&k.drops.lock());
            s.kthreads.push(ks);
        }
        s
    }
}
