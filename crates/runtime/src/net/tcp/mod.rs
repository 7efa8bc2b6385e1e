//! TCP sockets for uthreads (docs/runtime.md, "TCP sockets"): the sans-IO
//! state machine of `ginza_net::tcp` bound to the runtime.
//!
//! * `ginza_net::tcp`'s [`Table`] (connections by 4-tuple, listeners,
//!   ephemeral ports, where a segment goes), `Listener::admit_syn` and
//!   `Listener::step`: the driver's part it shares with the netstack.
//! * [`timers`]: the stack's connection deadlines, the earliest of which
//!   a kthread about to sleep counts with its own timers.
//! * [`sockets`]: the public `TcpListener` and `TcpStream`, each over one
//!   of two backends: this in-process stack or the protected netstack
//!   (`net/protected/`), chosen by configuration.
//! * [`listener`]: the in-process listener (bind, accept) over
//!   `ginza_net::tcp::Listener`'s bounded half-open set and backlog.
//! * [`stream`]: the in-process stream (connect, read, write, shutdown,
//!   timeouts).
//! * here: [`Tcp`], the stack's TCP part, and the one path every change to
//!   a connection takes ([`Tcp::settle`]): with the connection locked,
//!   segments out (`poll_transmit`, built in the running kthread's egress
//!   buffer by `net/egress.rs`: TCP never calls back into the stack that
//!   feeds it), events in (`take_events`: waiters to wake, a handshake to
//!   hand to its listener), its deadline armed, and, once the state machine
//!   says it is finished, out of the table.
//!
//! Locks, always taken in this order: a waiter queue, a connection, a
//! listener's state, the table, the deadlines. Waiters are woken after
//! every lock is released.

mod listener;
mod sockets;
mod stream;
mod timers;

pub use sockets::{Incoming, KeepAlive, TcpListener, TcpStream};

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use ginza_net::tcp::{
    Backlog, Connection, CookieAnswer, Demux, FourTuple, IsnGenerator, ListenConfig, Opened, State,
    SynAnswer, SynCookies, Table, TcpConfig, TcpError,
};
use ginza_net::{tx, Endpoint, Interface, MacAddr, TcpFrame};
use ginza_sys::hops::{self, Hop};

use super::egress::{self, transmit};
use super::readiness::SocketWaiters;
use super::wait::{os_error, wait_until, wake_all, Wait, WakeLater};
use crate::link::TxSide;
use crate::sched::{self, Shared, TurnClock};
use crate::spinlock::SpinLock;
pub(crate) use listener::ListenerCore;
use timers::{Armed, Deadlines};

/// How much later a connection's deadline must move for its armed entry to
/// be replaced rather than left to fire and find nothing due.
const RE_ARM_LATER_NS: u64 = 1_000_000;

/// The stack's TCP counters (sums over connections and kthreads).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpStats {
    pub segments_in: u64,
    pub segments_out: u64,
    /// Segments sent again (by the retransmission timer or fast
    /// retransmit), over every connection, open or gone.
    pub retransmissions: u64,
    /// RSTs sent, by connections and for segments that reached no socket.
    pub resets_sent: u64,
    /// Segments for a port without a listener or a connection.
    pub no_socket: u64,
    /// Handshakes completed while their listener's backlog was full (reset).
    pub listen_overflows: u64,
    /// Half-open connections evicted by newer SYNs (see
    /// `ginza_net::tcp::listen`).
    pub syns_evicted: u64,
    /// SYNs answered with a SYN cookie (their listener's half-open set
    /// full), ACKs whose cookie checked (a connection made), and ACKs to a
    /// listener whose cookie did not (reset), while cookies were out.
    pub syn_cookies_sent: u64,
    pub syn_cookies_accepted: u64,
    pub syn_cookies_rejected: u64,
    /// Connections in the table now (half-open to TIME-WAIT).
    pub connections_open: u64,
    /// SACK blocks sent and taken (RFC 2018), retransmissions chosen by
    /// SACK loss recovery (RFC 6675), keep-alive probes sent, segments
    /// dropped by PAWS (RFC 7323 §5): over every connection, open or gone.
    pub sack_blocks_sent: u64,
    pub sack_blocks_received: u64,
    pub sack_retransmissions: u64,
    pub keepalive_probes: u64,
    pub paws_drops: u64,
}

/// The per-connection counters `TcpStats` sums (kept for connections that
/// left the table).
#[derive(Default)]
struct ConnectionSums {
    retransmissions: AtomicU64,
    sack_blocks_sent: AtomicU64,
    sack_blocks_received: AtomicU64,
    sack_retransmissions: AtomicU64,
    keepalive_probes: AtomicU64,
    paws_drops: AtomicU64,
}

impl ConnectionSums {
    fn snapshot(&self) -> ginza_net::tcp::ConnectionStats {
        ginza_net::tcp::ConnectionStats {
            retransmissions: self.retransmissions.load(Relaxed),
            sack_blocks_sent: self.sack_blocks_sent.load(Relaxed),
            sack_blocks_received: self.sack_blocks_received.load(Relaxed),
            sack_retransmissions: self.sack_retransmissions.load(Relaxed),
            keepalive_probes: self.keepalive_probes.load(Relaxed),
            paws_drops: self.paws_drops.load(Relaxed),
            ..Default::default()
        }
    }

    fn add(&self, s: &ginza_net::tcp::ConnectionStats) {
        self.retransmissions.fetch_add(s.retransmissions, Relaxed);
        self.sack_blocks_sent.fetch_add(s.sack_blocks_sent, Relaxed);
        self.sack_blocks_received
            .fetch_add(s.sack_blocks_received, Relaxed);
        self.sack_retransmissions
            .fetch_add(s.sack_retransmissions, Relaxed);
        self.keepalive_probes.fetch_add(s.keepalive_probes, Relaxed);
        self.paws_drops.fetch_add(s.paws_drops, Relaxed);
    }
}

#[derive(Default)]
struct Counters {
    segments_in: AtomicU64,
    segments_out: AtomicU64,
    resets_sent: AtomicU64,
    no_socket: AtomicU64,
    listen_overflows: AtomicU64,
    syns_evicted: AtomicU64,
    syn_cookies_sent: AtomicU64,
    syn_cookies_accepted: AtomicU64,
    syn_cookies_rejected: AtomicU64,
    /// Counters of connections that left the table.
    gone: ConnectionSums,
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// One connection as the runtime holds it.
pub(crate) struct Conn {
    key: FourTuple,
    inner: SpinLock<ConnInner>,
    /// Uthreads waiting for anything on this connection (readers, writers,
    /// a connect); all are woken on any event and look again; and the
    /// pollers watching it, notified.
    waiters: SpinLock<SocketWaiters>,
}

struct ConnInner {
    tcb: Connection,
    /// Where its segments go: the source of its latest segment (the next
    /// hop), or what ARP said at connect.
    peer_mac: MacAddr,
    /// Not accepted yet: the listener it is half-open on or waiting in.
    listener: Option<Arc<ListenerCore>>,
    /// In the listener's backlog (rather than half-open).
    in_backlog: bool,
    /// Its entry in the stack's deadlines, if any.
    armed: Option<Armed>,
    /// On the stack's list of connections with segments to send.
    tx_pending: bool,
    in_table: bool,
    /// A non-blocking connect waits for ARP to give `peer_mac`: nothing
    /// is sent until it does (`stream::finish_connect`).
    awaiting_arp: bool,
}

impl ConnInner {
    /// Whether `entry` is this connection's live one (the connection is
    /// in the table and armed for it).
    fn armed_for(&self, entry: Armed) -> bool {
        self.in_table && self.armed == Some(entry)
    }
}

impl Conn {
    fn new(
        key: FourTuple,
        tcb: Connection,
        peer_mac: MacAddr,
        listener: Option<Arc<ListenerCore>>,
    ) -> Arc<Conn> {
        Arc::new(Conn {
            key,
            inner: SpinLock::new(ConnInner {
                tcb,
                peer_mac,
                listener,
                in_backlog: false,
                armed: None,
                tx_pending: false,
                in_table: true,
                awaiting_arp: false,
            }),
            waiters: SpinLock::new(SocketWaiters::new()),
        })
    }
}

/// Uthreads to wake once every lock is released.
#[derive(Default)]
#[must_use]
pub(crate) struct Wake {
    conn: Option<Arc<Conn>>,
    listener: Option<Arc<ListenerCore>>,
}

impl WakeLater for Wake {
    fn run(self) {
        if let Some(c) = self.conn {
            wake_all(&c.waiters);
        }
        if let Some(l) = self.listener {
            wake_all(&l.waiters);
        }
    }
}

/// One poll of a kthread's rings: the time its segments and deadlines
/// share (a [`TurnClock`], read at the first need: `clock_gettime`, read per segment
/// and per answer, was the largest single user-space item of a served
/// request, docs/results.md "Session 43"), and
/// the connection whose answer waits for the burst's end. One slot: a
/// bulk stream fills a burst with one connection, and a burst of many
/// connections answers each as the next one arrives.
#[derive(Default)]
pub(crate) struct Burst {
    clock: TurnClock,
    deferred: Option<Arc<Conn>>,
}

impl Burst {
    fn now(&mut self, tcp: &Tcp) -> ginza_net::tcp::Instant {
        tcp.at(self.clock.now())
    }

    /// Keeps `conn`, returning an earlier other connection to answer now.
    fn defer(&mut self, conn: Arc<Conn>) -> Option<Arc<Conn>> {
        match &self.deferred {
            Some(held) if Arc::ptr_eq(held, &conn) => None,
            _ => self.deferred.replace(conn),
        }
    }

    /// `conn` was just answered: nothing of it waits any more.
    fn forget(&mut self, conn: &Arc<Conn>) {
        if self
            .deferred
            .as_ref()
            .is_some_and(|held| Arc::ptr_eq(held, conn))
        {
            self.deferred = None;
        }
    }
}

/// The stack's TCP part.
pub(crate) struct Tcp {
    /// The address its segments are built from.
    iface: Interface,
    config: TcpConfig,
    listen: ListenConfig,
    /// Made at the first TCP use (it draws a random key).
    isn: OnceLock<IsnGenerator>,
    /// Made at the first SYN cookie (it draws a random key).
    cookies: OnceLock<SynCookies>,
    /// Time 0 of the state machines' clock.
    epoch: Instant,
    table: SpinLock<Table<Arc<Conn>, Arc<ListenerCore>>>,
    deadlines: Deadlines<Weak<Conn>>,
    /// Connections whose segments found the egress ring full.
    tx_pending: SpinLock<Vec<Arc<Conn>>>,
    tx_pending_count: AtomicUsize,
    counters: Counters,
}

/// Where a connection's segments are built: the running kthread's egress
/// ring, or none (an OS thread: the next poll sends them).
type Egress<'a, 'b> = Option<&'a mut TxSide<'b>>;

impl Tcp {
    pub(crate) fn new(iface: Interface, config: TcpConfig, listen: ListenConfig) -> Tcp {
        Tcp {
            iface,
            config,
            listen,
            isn: OnceLock::new(),
            cookies: OnceLock::new(),
            epoch: Instant::now(),
            table: SpinLock::new(Table::new()),
            deadlines: Deadlines::new(),
            tx_pending: SpinLock::new(Vec::new()),
            tx_pending_count: AtomicUsize::new(0),
            counters: Counters::default(),
        }
    }

    fn now(&self) -> ginza_net::tcp::Instant {
        self.at(Instant::now())
    }

    /// `at` on the state machines' clock.
    fn at(&self, at: Instant) -> ginza_net::tcp::Instant {
        ginza_net::tcp::Instant::from_nanos(
            at.saturating_duration_since(self.epoch).as_nanos() as u64
        )
    }

    fn instant_of(&self, nanos: u64) -> Instant {
        self.epoch + Duration::from_nanos(nanos)
    }

    fn isn(&self) -> &IsnGenerator {
        self.isn.get_or_init(IsnGenerator::new)
    }

    fn cookies(&self) -> &SynCookies {
        self.cookies.get_or_init(SynCookies::new)
    }

    // ---- receive -----------------------------------------------------------

    /// A segment for us, in the scheduler context of the kthread `me`.
    /// A segment whose answer may wait for the end of its burst
    /// ([`Connection::may_answer_after_burst`]) leaves its connection in
    /// `burst`, answered by [`Tcp::answer_deferred`].
    pub(crate) fn input(&self, me: &mut TxSide<'_>, f: &TcpFrame<'_>, burst: &mut Burst) {
        count(&self.counters.segments_in);
        let key = FourTuple::of(f);
        let now = burst.now(self);
        let target = self.table.lock().demux(&key, &f.segment).cloned();
        match target {
            Demux::Connection(conn) => self.to_connection(me, conn, f, now, burst),
            Demux::Listener(l) => self.on_syn(me, &l, key, f, now),
            Demux::ListenerAck(l) => {
                if self.on_listener_ack(me, &l, key, f, now) {
                    // Another kthread was making its connection from a SYN
                    // cookie: if it is in the table now, the segment is
                    // its; if not yet, it is dropped (and sent again).
                    let made = self.table.lock().get(&key).cloned();
                    if let Some(conn) = made {
                        self.to_connection(me, conn, f, now, burst);
                    }
                }
            }
            Demux::NoSocket { reset } => {
                count(&self.counters.no_socket);
                self.reset(me, f, reset);
            }
        }
    }

    /// A segment for `conn`, as [`Tcp::input`] says.
    fn to_connection(
        &self,
        me: &mut TxSide<'_>,
        conn: Arc<Conn>,
        f: &TcpFrame<'_>,
        now: ginza_net::tcp::Instant,
        burst: &mut Burst,
    ) {
        let wake = {
            let mut inner = conn.inner.lock();
            inner.peer_mac = f.src_mac;
            let later = inner.tcb.may_answer_after_burst(&f.segment);
            inner.tcb.on_segment(&f.segment, now);
            if later {
                drop(inner);
                if let Some(earlier) = burst.defer(conn) {
                    self.answer(me, &earlier, now);
                }
                return;
            }
            self.settle(Some(me), &conn, &mut inner, now)
        };
        burst.forget(&conn);
        wake.run();
    }

    /// Answers the connection whose segments waited for the end of their
    /// burst: one ACK and one wake-up for all of them.
    pub(crate) fn answer_deferred(&self, me: &mut TxSide<'_>, burst: &mut Burst) {
        if let Some(conn) = burst.deferred.take() {
            let now = burst.now(self);
            self.answer(me, &conn, now);
        }
    }

    fn answer(&self, me: &mut TxSide<'_>, conn: &Arc<Conn>, now: ginza_net::tcp::Instant) {
        let wake = {
            let mut inner = conn.inner.lock();
            self.settle(Some(me), conn, &mut inner, now)
        };
        wake.run();
    }

    /// Answers a segment that reached no connection with `rst`
    /// (RFC 9293 §3.10.7.1).
    fn reset(
        &self,
        me: &mut TxSide<'_>,
        f: &TcpFrame<'_>,
        rst: Option<ginza_net::tcp::Segment<'static>>,
    ) {
        if let Some(rst) = rst {
            if self.answer_statelessly(me, f, &rst, "TCP reset") {
                count(&self.counters.resets_sent);
            }
        }
    }

    /// Sends `segment` to the source of `f`, from no connection (a RST, a
    /// SYN-ACK carrying a SYN cookie); whether it went out.
    fn answer_statelessly(
        &self,
        me: &mut TxSide<'_>,
        f: &TcpFrame<'_>,
        segment: &ginza_net::tcp::Segment<'static>,
        what: &str,
    ) -> bool {
        let iface = &self.iface;
        let r = transmit(me, |b| {
            tx::tcp_segment(b, iface, f.src_mac, f.dst.port, f.src, segment)
        });
        match r {
            Ok(()) => {
                count(&self.counters.segments_out);
                true
            }
            Err(e) => {
                egress::failed(me, e, what);
                false
            }
        }
    }

    fn on_syn(
        &self,
        me: &mut TxSide<'_>,
        l: &Arc<ListenerCore>,
        key: FourTuple,
        f: &TcpFrame<'_>,
        now: ginza_net::tcp::Instant,
    ) {
        let opened = {
            let mut state = l.state.lock();
            if state.closed {
                None
            } else {
                let (isn, cookies) = (self.isn(), self.cookies());
                Some(
                    state
                        .backlog
                        .admit_syn(key, &f.segment, &self.config, isn, cookies, now),
                )
            }
        };
        let (tcb, evicted) = match opened {
            None => return self.reset(me, f, ginza_net::tcp::reset_for(&f.segment)),
            // Its connection is being made by another kthread right now.
            Some(SynAnswer::Known) => return,
            Some(SynAnswer::Cookie(syn_ack)) => {
                count(&self.counters.syn_cookies_sent);
                self.answer_statelessly(me, f, &syn_ack, "TCP SYN-ACK with a cookie");
                return;
            }
            Some(SynAnswer::Opened(Opened { tcb, evicted })) => (tcb, evicted),
        };
        if let Some(old) = evicted {
            count(&self.counters.syns_evicted);
            self.evict(old);
        }
        self.open_passive(me, l, key, f, tcb, now);
    }

    /// An ACK for a listening endpoint without a connection: a SYN
    /// cookie's connection is made if it carries one, else it is reset.
    /// True if its connection is being made by another kthread.
    fn on_listener_ack(
        &self,
        me: &mut TxSide<'_>,
        l: &Arc<ListenerCore>,
        key: FourTuple,
        f: &TcpFrame<'_>,
        now: ginza_net::tcp::Instant,
    ) -> bool {
        let answer = {
            let mut state = l.state.lock();
            if state.closed {
                CookieAnswer::NotACookie
            } else {
                let before = state.backlog.stats().cookies_rejected;
                let answer =
                    state
                        .backlog
                        .admit_cookie(key, &f.segment, &self.config, self.cookies(), now);
                if state.backlog.stats().cookies_rejected != before {
                    count(&self.counters.syn_cookies_rejected);
                }
                answer
            }
        };
        match answer {
            CookieAnswer::Opened(tcb) => {
                count(&self.counters.syn_cookies_accepted);
                self.open_passive(me, l, key, f, tcb, now);
            }
            CookieAnswer::Known => return true,
            CookieAnswer::NotACookie => {
                // As before cookies: a segment that reached no connection.
                count(&self.counters.no_socket);
                self.reset(me, f, ginza_net::tcp::reset_for(&f.segment))
            }
        }
        false
    }

    /// Puts a connection the listener `l` opened into the table and
    /// settles it (its SYN-ACK out, or, made from a SYN cookie, its place
    /// in the backlog).
    fn open_passive(
        &self,
        me: &mut TxSide<'_>,
        l: &Arc<ListenerCore>,
        key: FourTuple,
        f: &TcpFrame<'_>,
        tcb: Connection,
        now: ginza_net::tcp::Instant,
    ) {
        let conn = Conn::new(key, tcb, f.src_mac, Some(Arc::clone(l)));
        if !self.table.lock().insert(key, Arc::clone(&conn)) {
            l.state.lock().backlog.forget(key.remote);
            return;
        }
        let wake = {
            let mut inner = conn.inner.lock();
            self.settle(Some(me), &conn, &mut inner, now)
        };
        wake.run();
    }

    /// Forgets a half-open connection without a word (its peer never
    /// completed the handshake; under a flood, it never will).
    fn evict(&self, key: FourTuple) {
        let conn = self.table.lock().remove(&key);
        if let Some(conn) = conn {
            let mut inner = conn.inner.lock();
            inner.in_table = false;
            inner.listener = None;
        }
    }

    // ---- every change to a connection ends here -----------------------------

    /// Sends what `inner` has to send, takes its events, arms its deadline,
    /// hands a completed handshake to its listener and removes it from the
    /// table once finished; returns whom to wake once the lock is released.
    fn settle(
        &self,
        mut me: Egress<'_, '_>,
        conn: &Arc<Conn>,
        inner: &mut ConnInner,
        now: ginza_net::tcp::Instant,
    ) -> Wake {
        self.send(me.as_deref_mut(), conn, inner, now);
        let events = inner.tcb.take_events();
        let mut wake = Wake::default();
        if events.readable || events.writable || events.connected || events.closed {
            wake.conn = Some(Arc::clone(conn));
        }
        // As on Linux, a connection reset while it waits in the backlog is
        // still accepted (its reads give what arrived, then the reset): it
        // keeps its place until `accept` takes it.
        let ended = inner.tcb.error().is_some() || inner.tcb.state() == State::Closed;
        let listener = inner
            .listener
            .clone()
            .filter(|_| !(inner.in_backlog && ended));
        if let Some(l) = listener {
            let step =
                l.state
                    .lock()
                    .backlog
                    .step(conn.key.remote, &mut inner.tcb, inner.in_backlog);
            match step {
                Backlog::Waiting => {}
                Backlog::Ended => {
                    inner.listener = None;
                    wake.listener = Some(l);
                }
                Backlog::Queued => {
                    inner.in_backlog = true;
                    wake.listener = Some(l);
                }
                Backlog::Refused => {
                    count(&self.counters.listen_overflows);
                    inner.listener = None;
                    self.send(me, conn, inner, now);
                    let _ = inner.tcb.take_events();
                }
            }
        }
        if inner.in_table {
            // One waiting to be accepted stays findable until it is.
            let leaving = inner.tcb.is_finished() && !inner.in_backlog;
            let next = inner
                .tcb
                .next_deadline()
                .map(|d| d.as_nanos())
                .filter(|_| !leaving);
            let rearm = match (inner.armed, next) {
                (None, next) => next.is_some(),
                // Its deadline went, or moved well later (a delayed ACK
                // that the reply carried, now the retransmission timer):
                // left armed, the entry would wake a sleeping runtime for
                // nothing (an iokerneld grant per request). A small move
                // later (the retransmission timer restarted by each ACK of
                // a stream) stays lazy: its entry fires once, finds nothing
                // due and arms the new one.
                (Some(_), None) => true,
                (Some(a), Some(d)) => d < a.deadline || d - a.deadline >= RE_ARM_LATER_NS,
            };
            if rearm {
                inner.armed = self
                    .deadlines
                    .rearm(inner.armed, next, || Arc::downgrade(conn));
            }
            if leaving {
                inner.in_table = false;
                self.table.lock().remove(&conn.key);
                self.counters.gone.add(&inner.tcb.stats());
            }
        }
        wake
    }

    /// Builds `inner`'s segments in `me`'s egress buffers while its ring has
    /// room; what is left waits for the next poll.
    fn send(
        &self,
        me: Egress<'_, '_>,
        conn: &Arc<Conn>,
        inner: &mut ConnInner,
        now: ginza_net::tcp::Instant,
    ) {
        if inner.awaiting_arp {
            return;
        }
        let Some(me) = me else {
            return self.defer_send(conn, inner);
        };
        let (mac, key) = (inner.peer_mac, conn.key);
        loop {
            match me.tx().egress.free() {
                Ok(0) => return self.defer_send(conn, inner),
                Ok(_) => {}
                // Reported by `transmit` elsewhere; nothing is sent on it.
                Err(_) => return,
            }
            let Some(seg) = inner.tcb.poll_transmit(now) else {
                return;
            };
            let (rst, data) = (seg.flags.rst, !seg.payload.is_empty());
            let iface = &self.iface;
            let r = transmit(me, |b| {
                tx::tcp_segment(b, iface, mac, key.local.port, key.remote, &seg)
            });
            match r {
                Ok(()) => {
                    count(&self.counters.segments_out);
                    if rst {
                        count(&self.counters.resets_sent);
                    }
                    if data {
                        hops::stamp(Hop::Replied);
                    }
                }
                Err(e) => egress::failed(me, e, "TCP segment"),
            }
        }
    }

    fn defer_send(&self, conn: &Arc<Conn>, inner: &mut ConnInner) {
        if !inner.tx_pending {
            inner.tx_pending = true;
            self.tx_pending.lock().push(Arc::clone(conn));
            self.tx_pending_count.fetch_add(1, Relaxed);
        }
    }

    /// Runs `f` on the connection, then settles it (segments out on the
    /// calling kthread's ring, or the next poll's).
    fn with_conn<R>(
        &self,
        rt: &Shared,
        conn: &Arc<Conn>,
        f: impl FnOnce(&mut ConnInner) -> R,
    ) -> R {
        let (r, wake) = {
            let mut inner = conn.inner.lock();
            let r = f(&mut inner);
            let now = self.now();
            let wake = match sched::with_current_knet(rt, |me| {
                self.settle(Some(me), conn, &mut inner, now)
            }) {
                Some(w) => w,
                None => self.settle(None, conn, &mut inner, now),
            };
            (r, wake)
        };
        wake.run();
        sched::flush_own_tx_if_alone();
        r
    }

    /// Waits (parking the uthread; an OS thread polls) until `attempt`,
    /// run on the connection and settled after, gives `Some`, or until
    /// `wait` is over (then `None`).
    fn wait_on<R>(
        &self,
        rt: &Shared,
        conn: &Arc<Conn>,
        wait: Wait,
        mut attempt: impl FnMut(&mut ConnInner) -> Option<R>,
    ) -> Option<R> {
        let r = wait_until(&conn.waiters, wait, || {
            let mut inner = conn.inner.lock();
            let r = attempt(&mut inner)?;
            let now = self.now();
            let wake = match sched::with_current_knet(rt, |me| {
                self.settle(Some(me), conn, &mut inner, now)
            }) {
                Some(w) => w,
                None => self.settle(None, conn, &mut inner, now),
            };
            Some((r, wake))
        });
        sched::flush_own_tx_if_alone();
        r
    }

    // ---- polled by kthreads ---------------------------------------------------

    /// Sends what waited for egress room and fires due deadlines, as the
    /// kthread `me` polling its rings.
    pub(crate) fn poll(&self, me: &mut TxSide<'_>, burst: &mut Burst) {
        if self.tx_pending_count.load(Relaxed) > 0 {
            let pending = std::mem::take(&mut *self.tx_pending.lock());
            self.tx_pending_count.fetch_sub(pending.len(), Relaxed);
            let now = burst.now(self);
            for conn in pending {
                let wake = {
                    let mut inner = conn.inner.lock();
                    inner.tx_pending = false;
                    self.settle(Some(me), &conn, &mut inner, now)
                };
                wake.run();
            }
        }
        if self.deadlines.earliest() != u64::MAX {
            let now = burst.now(self);
            self.fire(me, now);
        }
    }

    fn fire(&self, me: &mut TxSide<'_>, now: ginza_net::tcp::Instant) {
        let mut due = Vec::new();
        self.deadlines.take_due(now.as_nanos(), &mut due);
        for (entry, conn) in due {
            let Some(conn) = conn.upgrade() else {
                continue;
            };
            let wake = {
                let mut inner = conn.inner.lock();
                if !inner.armed_for(entry) {
                    continue; // stale: gone, or re-armed
                }
                inner.armed = None;
                inner.tcb.on_timer(now);
                self.settle(Some(me), &conn, &mut inner, now)
            };
            wake.run();
        }
    }

    /// The earliest connection deadline, if any: a kthread about to sleep
    /// wakes for it (`Shared::earliest_deadline`).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let earliest = self.deadlines.earliest();
        (earliest != u64::MAX).then(|| self.instant_of(earliest))
    }

    /// Whether a connection the application ended still owes its peer the
    /// end of its stream: its FIN (and the data before it) not acknowledged
    /// yet, or its reset not sent (`runtime.rs` lingers at exit for it).
    pub(crate) fn owes_peers(&self) -> bool {
        let conns: Vec<Arc<Conn>> = self.table.lock().conns().cloned().collect();
        conns.iter().any(|c| c.inner.lock().tcb.owes_peer_its_end())
    }

    pub(crate) fn stats(&self) -> TcpStats {
        let (conns, open): (Vec<Arc<Conn>>, usize) = {
            let table = self.table.lock();
            (table.conns().cloned().collect(), table.len())
        };
        let sums = ConnectionSums::default();
        for c in &conns {
            sums.add(&c.inner.lock().tcb.stats());
        }
        sums.add(&self.counters.gone.snapshot());
        let c = &self.counters;
        TcpStats {
            segments_in: c.segments_in.load(Relaxed),
            segments_out: c.segments_out.load(Relaxed),
            retransmissions: sums.retransmissions.load(Relaxed),
            resets_sent: c.resets_sent.load(Relaxed),
            no_socket: c.no_socket.load(Relaxed),
            listen_overflows: c.listen_overflows.load(Relaxed),
            syns_evicted: c.syns_evicted.load(Relaxed),
            syn_cookies_sent: c.syn_cookies_sent.load(Relaxed),
            syn_cookies_accepted: c.syn_cookies_accepted.load(Relaxed),
            syn_cookies_rejected: c.syn_cookies_rejected.load(Relaxed),
            connections_open: open as u64,
            sack_blocks_sent: sums.sack_blocks_sent.load(Relaxed),
            sack_blocks_received: sums.sack_blocks_received.load(Relaxed),
            sack_retransmissions: sums.sack_retransmissions.load(Relaxed),
            keepalive_probes: sums.keepalive_probes.load(Relaxed),
            paws_drops: sums.paws_drops.load(Relaxed),
        }
    }
}

/// The `io::Error` for `e` on `key`, with the `errno` Linux gives.
fn io_error(e: TcpError, writing: bool, key: &FourTuple) -> io::Error {
    let (errno, what) = match e {
        TcpError::WouldBlock => (libc::EAGAIN, "operation would block"),
        TcpError::Refused => (
            libc::ECONNREFUSED,
            "connection refused (the peer answered our SYN with a reset)",
        ),
        TcpError::Reset if writing => (libc::EPIPE, "broken pipe: the peer reset the connection"),
        TcpError::Reset => (libc::ECONNRESET, "connection reset by the peer"),
        TcpError::TimedOut => (
            libc::ETIMEDOUT,
            "connection timed out: the peer stopped acknowledging",
        ),
        TcpError::Closed => (
            libc::EPIPE,
            "broken pipe: the connection was shut down for writing",
        ),
        TcpError::NotConnected => (libc::ENOTCONN, "not connected"),
    };
    os_error(
        errno,
        format_args!("TCP {} -> {}: {what}", key.local, key.remote),
    )
}

/// The error `SO_ERROR` gives for the error that ended a connection.
fn pending_error(e: TcpError, key: &FourTuple) -> io::Error {
    io_error(e, false, key)
}

fn no_ephemeral_port(remote: Endpoint) -> io::Error {
    os_error(
        libc::EADDRINUSE,
        format_args!(
            "no free ephemeral TCP port for a connection to {remote}: {}-65535 are all used",
            ginza_net::tcp::EPHEMERAL_FIRST
        ),
    )
}

fn no_net() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "networking needs Config::iokernel with net set (IokernelConfig::net = Some(NetConfig::new(mac, ip)))",
    )
}

/// The first IPv4 address of `addr` (the stack speaks IPv4 only).
fn first_v4(addr: impl std::net::ToSocketAddrs) -> io::Result<std::net::SocketAddrV4> {
    let mut v6 = None;
    for a in addr.to_socket_addrs()? {
        match a {
            std::net::SocketAddr::V4(a) => return Ok(a),
            std::net::SocketAddr::V6(a) => v6 = Some(a),
        }
    }
    Err(match v6 {
        Some(a) => os_error(
            libc::EINVAL,
            format_args!("{a}: the Ginza stack speaks IPv4 only"),
        ),
        None => os_error(libc::EINVAL, format_args!("no address to use")),
    })
}
