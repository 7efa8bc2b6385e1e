//! The protected backend of `TcpListener`/`TcpStream` (docs/design.md,
//! "Protected mode (DLibOS)"; docs/runtime.md, "Protected mode"): the TCP
//! stack runs in the netstack process; this runtime talks to it through
//! per-network-kthread command and event rings ([`wire`]).
//!
//! * [`tx_pool`]: the application's tx pool; `write` copies into it and
//!   sends offsets, `data_acked` gives the chunks back.
//! * [`socket`]: `ProtectedListener`, `ProtectedStream` (blocking, for
//!   uthreads), with a zero-copy read that lends the read-only slice.
//! * [`channel`]: the asynchronous API over the raw events and commands.
//! * here: [`Protected`], the attachment: connections by the netstack's
//!   id, listeners by port, connects in flight by cookie; the event poll
//!   the scheduler runs (as it polls ingress rings), which hands each event
//!   to its connection and wakes the uthreads waiting there; and the loss
//!   of the netstack, which resets every connection (never a hang).

mod channel;
mod socket;
mod transport;
pub(crate) mod tx_pool;
mod wire;

#[doc(hidden)]
pub mod testing;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{
    AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

pub use crate::config::ProtectedConfig;
pub use channel::{Channel, ChannelEvent};
pub use socket::{ProtectedListener, ProtectedStream};
pub use tx_pool::TX_CHUNK;
pub use wire::{Command, ConnId, Event, ListenId, Range, Ranges, Reason, SendFlags, MAX_RANGES};
pub(crate) use wire::{PushError, Wire};

use super::readiness::SocketWaiters;
use super::wait::{os_error, wake_all};
use crate::link::EventSource;
use crate::sched::{self, Shared};
use crate::spinlock::SpinLock;
use tx_pool::TxPool;

/// The backend's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtectedStats {
    pub events: u64,
    pub commands: u64,
    /// Pushes that found a command ring full and waited (back-pressure:
    /// never dropped).
    pub command_ring_full: u64,
    /// Writes that waited for tx pool chunks or the per-connection bound.
    pub tx_waits: u64,
    /// Events naming a connection, listener or cookie we do not know, or
    /// receive memory outside the pool (ignored, counted).
    pub bad_events: u64,
    pub connections_open: u64,
    pub tx_chunks_free: u64,
}

#[derive(Default)]
struct Counters {
    events: AtomicU64,
    commands: AtomicU64,
    command_ring_full: AtomicU64,
    tx_waits: AtomicU64,
    bad_events: AtomicU64,
}

/// Received bytes not yet consumed: a `NewData` range, `used` of it read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxItem {
    range: Range,
    used: u32,
}

#[derive(Default)]
pub(crate) struct ConnState {
    rx: VecDeque<RxItem>,
    /// The peer sent FIN (reads return 0 after the data).
    remote_closed: bool,
    /// How the connection ended, if not cleanly; or the netstack is gone.
    error: Option<io::ErrorKind>,
    error_text: String,
    /// `Cleanup` came: the id is free.
    cleaned: bool,
    /// We sent `Close`.
    closed: bool,
    /// Chunks sent and not yet acknowledged, in order: (chunk, bytes).
    unacked: VecDeque<(u32, u32)>,
    unacked_bytes: u64,
    write_shut: bool,
    /// A non-blocking connect the netstack has not answered yet.
    connecting: bool,
}

/// One connection, by the netstack's id.
pub(crate) struct PConn {
    /// The netstack's id; 0 while a non-blocking connect waits for its
    /// answer (then the connection is in no table but its connect's).
    id: AtomicU32,
    /// The ring pair its commands go on (and, once accepted, its events
    /// come on).
    pair: AtomicUsize,
    local_ip: Ipv4Addr,
    /// 0 while a non-blocking connect waits for its answer.
    local_port: AtomicU16,
    remote: SocketAddrV4,
    /// The cookie of its non-blocking connect (0: none).
    connect_cookie: u32,
    state: SpinLock<ConnState>,
    waiters: SpinLock<SocketWaiters>,
}

pub(crate) struct ListenState {
    /// Connections announced and not accepted yet.
    backlog: VecDeque<Arc<PConn>>,
    /// The netstack's answer to `Listen`.
    bound: Option<Result<ListenId, Reason>>,
}

pub(crate) struct PListener {
    port: u16,
    cookie: u32,
    state: SpinLock<ListenState>,
    waiters: SpinLock<SocketWaiters>,
}

/// A `Connect` in flight.
pub(crate) struct PendingConnect {
    to: SocketAddrV4,
    result: SpinLock<Option<Result<Arc<PConn>, Reason>>>,
    waiters: SpinLock<SocketWaiters>,
    /// A non-blocking connect's connection, which its stream holds
    /// already: the answer completes it (`Protected::connected`).
    early: Option<Arc<PConn>>,
}

impl PConn {
    /// A connection of the netstack's (`id`, our `local` address).
    fn new(id: u32, pair: usize, local: SocketAddrV4, remote: SocketAddrV4) -> PConn {
        PConn {
            id: AtomicU32::new(id),
            pair: AtomicUsize::new(pair),
            local_ip: *local.ip(),
            local_port: AtomicU16::new(local.port()),
            remote,
            connect_cookie: 0,
            state: SpinLock::new(ConnState::default()),
            waiters: SpinLock::new(SocketWaiters::new()),
        }
    }

    /// A non-blocking connect's connection, before the netstack answers.
    pub(crate) fn connecting(cookie: u32, local_ip: Ipv4Addr, remote: SocketAddrV4) -> PConn {
        let c = PConn {
            connect_cookie: cookie,
            ..PConn::new(0, 0, SocketAddrV4::new(local_ip, 0), remote)
        };
        c.state.lock().connecting = true;
        c
    }

    /// The netstack's id (`None` while a non-blocking connect waits).
    pub(crate) fn id(&self) -> Option<ConnId> {
        ConnId::new(self.id.load(SeqCst))
    }

    pub(crate) fn local(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.local_ip, self.local_port.load(SeqCst))
    }
}

/// Raw mode ([`Channel`]): events are the application's to take.
#[derive(Default)]
struct Raw {
    on: AtomicBool,
    waiters: SpinLock<SocketWaiters>,
}

/// A runtime's attachment to a netstack.
pub(crate) struct Protected {
    wire: Box<dyn Wire>,
    tx: TxPool,
    cfg: ProtectedConfig,
    conns: SpinLock<HashMap<u32, Arc<PConn>>>,
    /// Listeners by the cookie of their `Listen`, and once answered by id.
    listen_cookies: SpinLock<HashMap<u32, Arc<PListener>>>,
    listeners: SpinLock<HashMap<u32, Arc<PListener>>>,
    connects: SpinLock<HashMap<u32, Arc<PendingConnect>>>,
    next_cookie: AtomicU32,
    next_pair: AtomicUsize,
    /// The netstack went away: why. Set once, read without a lock: a
    /// uthread preempted while holding a lock here left every other
    /// uthread of its kthread that asked blocked on it for good (the
    /// kthread itself waits in the kernel; issue 35).
    gone: OnceLock<String>,
    raw: Raw,
    counters: Counters,
    /// Connections whose writers found the tx pool empty: woken when
    /// chunks come back on any connection.
    pool_starved: SpinLock<Vec<Arc<PConn>>>,
    /// The poll's scratch vector (one poller at a time: try-lock).
    scratch: SpinLock<Vec<Event>>,
}

/// Events one poll takes from one ring at most.
const POLL_BATCH: usize = 32;

/// The attachment of `rt`, if it runs protected.
pub(crate) fn of(rt: &Shared) -> Option<&Protected> {
    let src: &dyn std::any::Any = rt.event_source()?;
    src.downcast_ref()
}

impl Protected {
    /// Builds the backend on an attached `wire` and starts the thread that
    /// notices when the netstack goes away.
    pub(crate) fn new(wire: Box<dyn Wire>, tx: TxPool, cfg: ProtectedConfig) -> Protected {
        Protected {
            wire,
            tx,
            cfg,
            conns: SpinLock::new(HashMap::new()),
            listen_cookies: SpinLock::new(HashMap::new()),
            listeners: SpinLock::new(HashMap::new()),
            connects: SpinLock::new(HashMap::new()),
            next_cookie: AtomicU32::new(1),
            next_pair: AtomicUsize::new(0),
            gone: OnceLock::new(),
            raw: Raw::default(),
            counters: Counters::default(),
            pool_starved: SpinLock::new(Vec::new()),
            scratch: SpinLock::new(Vec::with_capacity(POLL_BATCH)),
        }
    }

    pub(crate) fn stats(&self) -> ProtectedStats {
        ProtectedStats {
            events: self.counters.events.load(Relaxed),
            commands: self.counters.commands.load(Relaxed),
            command_ring_full: self.counters.command_ring_full.load(Relaxed),
            tx_waits: self.counters.tx_waits.load(Relaxed),
            bad_events: self.counters.bad_events.load(Relaxed),
            connections_open: self.conns.lock().len() as u64,
            tx_chunks_free: self.tx.free_chunks() as u64,
        }
    }

    /// Why the netstack is gone, if it is.
    pub(crate) fn gone(&self) -> Option<String> {
        self.gone.get().cloned()
    }

    fn gone_error(&self, why: String) -> io::Error {
        os_error(
            libc::ECONNRESET,
            format_args!("the netstack is gone: {why}"),
        )
    }

    /// Pushes `cmd` on `ring`, waiting (yielding the uthread) while the
    /// ring is full: back-pressure, counted, never dropped.
    pub(crate) fn command(&self, pair: usize, cmd: &Command) -> io::Result<()> {
        let mut waited = false;
        loop {
            if let Some(why) = self.gone() {
                return Err(self.gone_error(why));
            }
            match self.wire.push(pair % self.wire.pairs().max(1), cmd) {
                Ok(()) => {
                    self.counters.commands.fetch_add(1, Relaxed);
                    return Ok(());
                }
                Err(PushError::Full) => {
                    if !waited {
                        waited = true;
                        self.counters.command_ring_full.fetch_add(1, Relaxed);
                    }
                    if sched::current_shared().is_some() {
                        sched::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
                Err(PushError::Gone(why)) => {
                    self.lost(why.clone());
                    return Err(self.gone_error(why));
                }
            }
        }
    }

    /// The netstack went away: every connection is reset, every waiter
    /// woken with an error.
    pub(crate) fn lost(&self, why: String) {
        {
            // Deferred: a uthread preempted inside `set` would keep a
            // second caller (the watcher, or a kthread's `Disconnected`)
            // waiting for it.
            let _deferred = crate::deferral::Guard::new();
            if self.gone.set(why.clone()).is_err() {
                return;
            }
        }
        log::error!("protected mode: the netstack is gone ({why}); connections are reset");
        let conns: Vec<_> = self.conns.lock().values().cloned().collect();
        for c in conns {
            {
                let mut st = c.state.lock();
                if st.error.is_none() {
                    st.error = Some(io::ErrorKind::ConnectionReset);
                    st.error_text = format!("the netstack is gone: {why}");
                }
            }
            wake_all(&c.waiters);
        }
        let listeners: Vec<_> = self.listen_cookies.lock().values().cloned().collect();
        for l in listeners {
            wake_all(&l.waiters);
        }
        let connects: Vec<_> = self.connects.lock().values().cloned().collect();
        for p in connects {
            if let Some(c) = &p.early {
                end_connect(
                    c,
                    io::ErrorKind::ConnectionReset,
                    format!("the netstack is gone: {why}"),
                );
            }
            wake_all(&p.waiters);
        }
        wake_all(&self.raw.waiters);
    }

    fn bad(&self, what: std::fmt::Arguments<'_>) {
        self.counters.bad_events.fetch_add(1, Relaxed);
        log::warn!("protected mode: {what} (ignored)");
    }

    /// Processes up to `budget` events of every ring (a ring another
    /// kthread is processing is skipped); the events taken.
    fn poll_events(&self, budget: usize) -> usize {
        if self.raw.on.load(Relaxed) {
            // Raw mode: the application's event loop takes them.
            if self.wire.pending() {
                wake_all(&self.raw.waiters);
            }
            return 0;
        }
        let Some(mut scratch) = self.scratch.try_lock() else {
            return 0;
        };
        let mut total = 0;
        for pair in 0..self.wire.pairs() {
            scratch.clear();
            match self.wire.pop(pair, budget.min(POLL_BATCH), &mut scratch) {
                Ok(_) => {}
                Err(why) => {
                    drop(scratch);
                    self.lost(why);
                    return total;
                }
            }
            for ev in scratch.drain(..) {
                total += 1;
                self.counters.events.fetch_add(1, Relaxed);
                self.dispatch(pair, ev);
            }
        }
        total
    }

    /// A cookie for a `Listen` or `Connect` (one sequence for both, so a
    /// `Refused` names one of them).
    pub(crate) fn cookie(&self) -> u32 {
        self.next_cookie.fetch_add(1, Relaxed)
    }

    /// The ring pair a new connection's commands go on (round robin).
    pub(crate) fn next_pair(&self) -> usize {
        self.next_pair.fetch_add(1, Relaxed) % self.wire.pairs().max(1)
    }

    /// Hands one event to whom it concerns and wakes them.
    fn dispatch(&self, pair: usize, ev: Event) {
        match ev {
            Event::Listening { cookie, listener } => {
                let Some(l) = self.listen_cookies.lock().get(&cookie).cloned() else {
                    return self.bad(format_args!("Listening for unknown cookie {cookie}"));
                };
                l.state.lock().bound = Some(Ok(listener));
                self.listeners.lock().insert(listener.get(), Arc::clone(&l));
                wake_all(&l.waiters);
            }
            Event::NewConn {
                conn,
                listener,
                remote,
            } => {
                let Some(l) = self.listeners.lock().get(&listener.get()).cloned() else {
                    return self.bad(format_args!(
                        "NewConn {} for unknown listener {}",
                        conn.get(),
                        listener.get()
                    ));
                };
                let local = SocketAddrV4::new(self.cfg.interface.ip, l.port);
                let Some(c) = self.insert_conn(conn, pair, local, remote) else {
                    return self.bad(format_args!("NewConn {}: the id is in use", conn.get()));
                };
                l.state.lock().backlog.push_back(c);
                wake_all(&l.waiters);
            }
            Event::Connected {
                cookie,
                conn,
                local_port,
            } => {
                let Some(p) = self.connects.lock().remove(&cookie) else {
                    return self.bad(format_args!("Connected for unknown cookie {cookie}"));
                };
                if let Some(c) = &p.early {
                    return self.connected(c, conn, pair, local_port);
                }
                let local = SocketAddrV4::new(self.cfg.interface.ip, local_port);
                let r = match self.insert_conn(conn, pair, local, p.to) {
                    Some(c) => Ok(c),
                    None => {
                        self.bad(format_args!("Connected {}: the id is in use", conn.get()));
                        Err(Reason::InvalidState)
                    }
                };
                *p.result.lock() = Some(r);
                wake_all(&p.waiters);
            }
            Event::NewData { conn, ranges } => {
                ginza_sys::hops::stamp(ginza_sys::hops::Hop::AppEventIn);
                let Some(c) = self.conn(conn) else {
                    return self.bad(format_args!(
                        "NewData for unknown connection {}",
                        conn.get()
                    ));
                };
                {
                    let mut st = c.state.lock();
                    for &range in ranges.as_slice() {
                        if self.wire.rx(range).is_none() {
                            self.bad(format_args!(
                                "NewData {}: {range:?} lies outside the receive pool",
                                conn.get()
                            ));
                            continue;
                        }
                        st.rx.push_back(RxItem { range, used: 0 });
                    }
                }
                wake_all(&c.waiters);
            }
            Event::DataAcked { conn, ranges } => {
                let Some(c) = self.conn(conn) else {
                    return self.bad(format_args!(
                        "DataAcked for unknown connection {}",
                        conn.get()
                    ));
                };
                let (freed, unknown) = {
                    let mut st = c.state.lock();
                    ack(&mut st, ranges.as_slice())
                };
                if unknown > 0 {
                    self.bad(format_args!(
                        "DataAcked {}: {unknown} ranges were not sent on it",
                        conn.get()
                    ));
                }
                self.release(freed);
                wake_all(&c.waiters);
            }
            Event::RemoteClosed { conn } => {
                let Some(c) = self.conn(conn) else {
                    return self.bad(format_args!(
                        "RemoteClosed for unknown connection {}",
                        conn.get()
                    ));
                };
                c.state.lock().remote_closed = true;
                wake_all(&c.waiters);
            }
            Event::Cleanup { conn } => {
                let Some(c) = self.conns.lock().remove(&conn.get()) else {
                    return self.bad(format_args!(
                        "Cleanup for unknown connection {}",
                        conn.get()
                    ));
                };
                let freed = {
                    let mut st = c.state.lock();
                    st.cleaned = true;
                    // The netstack took its receive ranges back.
                    st.rx.clear();
                    if st.error.is_none() && !st.closed && !st.remote_closed {
                        st.error = Some(io::ErrorKind::ConnectionReset);
                        st.error_text = "the netstack closed the connection".into();
                    }
                    st.unacked_bytes = 0;
                    st.unacked.drain(..).map(|(c, _)| c).collect::<Vec<_>>()
                };
                self.release(freed);
                wake_all(&c.waiters);
            }
            Event::Refused {
                conn: Some(conn),
                reason,
                ..
            } => {
                let Some(c) = self.conn(conn) else {
                    return self.bad(format_args!(
                        "Refused for unknown connection {}",
                        conn.get()
                    ));
                };
                {
                    let mut st = c.state.lock();
                    if st.error.is_none() {
                        let (kind, text) = reason_error(reason);
                        st.error = Some(kind);
                        st.error_text = text;
                    }
                }
                wake_all(&c.waiters);
            }
            Event::Refused {
                conn: None,
                cookie,
                reason,
                ..
            } => {
                if let Some(l) = self.listen_cookies.lock().get(&cookie).cloned() {
                    l.state.lock().bound = Some(Err(reason));
                    wake_all(&l.waiters);
                } else if let Some(p) = self.connects.lock().remove(&cookie) {
                    if let Some(c) = &p.early {
                        let (kind, text) = reason_error(reason);
                        end_connect(c, kind, text);
                    }
                    *p.result.lock() = Some(Err(reason));
                    wake_all(&p.waiters);
                } else {
                    self.bad(format_args!(
                        "Refused ({reason}) for unknown cookie {cookie}"
                    ));
                }
            }
            Event::Disconnected { reason } => {
                self.lost(format!("it disconnected this application: {reason}"));
            }
        }
    }

    fn insert_conn(
        &self,
        id: ConnId,
        pair: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Option<Arc<PConn>> {
        let mut conns = self.conns.lock();
        if conns.contains_key(&id.get()) {
            return None;
        }
        let c = Arc::new(PConn::new(id.get(), pair, local, remote));
        conns.insert(id.get(), Arc::clone(&c));
        Some(c)
    }

    /// A non-blocking connect's answer: its connection gets the netstack's
    /// id and its events from now on; its stream turns writable.
    fn connected(&self, c: &Arc<PConn>, id: ConnId, pair: usize, local_port: u16) {
        {
            let mut conns = self.conns.lock();
            if conns.contains_key(&id.get()) {
                drop(conns);
                self.bad(format_args!("Connected {}: the id is in use", id.get()));
                return end_connect(c, io::ErrorKind::Other, "the netstack reused an id".into());
            }
            c.pair.store(pair, SeqCst);
            c.local_port.store(local_port, SeqCst);
            c.id.store(id.get(), SeqCst);
            conns.insert(id.get(), Arc::clone(c));
        }
        // Under the state's lock, as the stream's drop looks: exactly one
        // of the two closes a connection dropped while connecting.
        let dropped = {
            let mut st = c.state.lock();
            st.connecting = false;
            st.closed
        };
        if dropped {
            let _ = self.command(pair, &Command::Close { conn: id });
        }
        wake_all(&c.waiters);
    }

    /// Gives tx chunks back and wakes the writers that found the pool
    /// empty.
    pub(crate) fn release(&self, chunks: Vec<u32>) {
        if chunks.is_empty() {
            return;
        }
        self.tx.release(chunks);
        let starved = std::mem::take(&mut *self.pool_starved.lock());
        for c in starved {
            wake_all(&c.waiters);
        }
    }

    fn conn(&self, id: ConnId) -> Option<Arc<PConn>> {
        self.conns.lock().get(&id.get()).cloned()
    }
}

/// A non-blocking connect failed (`kind`, as `reason_error` gives): its
/// stream is readable, writable and hung up, `take_error` gives why.
fn end_connect(c: &PConn, kind: io::ErrorKind, text: String) {
    {
        let mut st = c.state.lock();
        st.connecting = false;
        if st.error.is_none() {
            st.error = Some(kind);
            st.error_text = text;
        }
    }
    wake_all(&c.waiters);
}

/// Takes the acknowledged `ranges` off `st.unacked` (each must be one that
/// was sent on this connection: a chunk's offset and its length); the
/// chunks now free, and how many ranges matched nothing.
fn ack(st: &mut ConnState, ranges: &[Range]) -> (Vec<u32>, usize) {
    let mut freed = Vec::new();
    let mut unknown = 0;
    for r in ranges {
        let chunk = r.offset / TX_CHUNK;
        let found = (r.offset % TX_CHUNK == 0)
            .then(|| {
                st.unacked
                    .iter()
                    .position(|&(c, l)| c == chunk && l == r.len)
            })
            .flatten();
        match found {
            Some(i) => {
                st.unacked.remove(i);
                st.unacked_bytes -= u64::from(r.len);
                freed.push(chunk);
            }
            None => unknown += 1,
        }
    }
    (freed, unknown)
}

/// The `errno` Linux gives for an error of `kind` (one of those
/// [`reason_error`] gives, or the netstack's loss).
pub(crate) fn errno_of(kind: io::ErrorKind) -> i32 {
    use io::ErrorKind as K;
    match kind {
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionReset => libc::ECONNRESET,
        K::BrokenPipe => libc::EPIPE,
        K::TimedOut => libc::ETIMEDOUT,
        K::AddrInUse => libc::EADDRINUSE,
        K::NotConnected => libc::ENOTCONN,
        K::WouldBlock => libc::EAGAIN,
        K::InvalidInput => libc::EINVAL,
        _ => libc::EIO,
    }
}

/// The `io::Error` kind and text for a netstack's reason.
fn reason_error(r: Reason) -> (io::ErrorKind, String) {
    use io::ErrorKind as K;
    let kind = match r {
        Reason::ConnectionRefused => K::ConnectionRefused,
        Reason::ConnectionReset | Reason::Shutdown => K::ConnectionReset,
        Reason::TimedOut => K::TimedOut,
        Reason::PortInUse => K::AddrInUse,
        _ => K::Other,
    };
    (kind, format!("the netstack says: {r}"))
}

impl EventSource for Protected {
    fn poll(&self, budget: usize) -> usize {
        self.poll_events(budget)
    }

    fn pending(&self) -> bool {
        self.wire.pending()
    }
}

/// Attaches `rt` to the netstack `cfg` names: its tx pool is made here and
/// passed; the netstack passes the rings and its receive pool, mapped
/// read-only. Then installs the attachment (see [`install`]).
pub(crate) fn attach(rt: &Arc<Shared>, cfg: &ProtectedConfig) -> Result<(), String> {
    // Another process of the same user could otherwise open our pools
    // through /proc/<pid>/fd (docs/runtime.md, "Protected mode").
    ginza_sys::process::set_non_dumpable()
        .map_err(|e| format!("cannot make the process non-dumpable: {e}"))?;
    let tx = TxPool::create("ginza-tx-pool", cfg.tx_chunks)
        .map_err(|e| format!("cannot create the tx pool: {e}"))?;
    let wire: Box<dyn Wire> = match testing::attach(&cfg.socket, tx.fd()) {
        Some(fake) => Box::new(fake?),
        None => transport::attach(cfg, rt.kthreads.len(), &tx)?,
    };
    install(rt, Protected::new(wire, tx, cfg.clone()))
}

/// Installs the attachment on `rt` and starts the thread that notices when
/// the netstack goes away (it blocks on the netstack's socket).
pub(crate) fn install(rt: &Arc<Shared>, p: Protected) -> Result<(), String> {
    rt.set_event_source(Box::new(p))
        .map_err(|_| "the runtime is attached to a netstack already".to_string())?;
    let weak: Weak<Shared> = Arc::downgrade(rt);
    std::thread::Builder::new()
        .name("ginza-netstack-watch".into())
        .spawn(move || loop {
            let Some(rt) = weak.upgrade() else { return };
            if rt.shutdown.load(Relaxed) {
                return;
            }
            let Some(p) = of(&rt) else { return };
            if let Some(why) = p.wire.wait_gone(Duration::from_millis(20)) {
                // A netstack stopped after this runtime finished is no loss.
                if !rt.shutdown.load(Relaxed) {
                    p.lost(why);
                }
                return;
            }
        })
        .map_err(|e| format!("cannot start the netstack watcher: {e}"))?;
    Ok(())
}

/// The calling uthread's runtime's protected-mode counters; `None` outside
/// a runtime or when it does not run protected.
pub fn stats() -> Option<ProtectedStats> {
    let rt = sched::current_shared()?;
    of(&rt).map(Protected::stats)
}
