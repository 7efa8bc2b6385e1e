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
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use crate::config::ProtectedConfig;
pub use channel::{Channel, ChannelEvent};
pub use socket::{ProtectedListener, ProtectedStream};
pub use tx_pool::TX_CHUNK;
pub use wire::{Command, Event, Reason};
pub(crate) use wire::{PushError, Wire};

use super::tcp::wake_all;
use crate::link::EventSource;
use crate::sched::{self, Shared, Waiter};
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

/// Received bytes not yet consumed: `{offset, len}` of the receive pool,
/// `used` of them read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxItem {
    offset: u64,
    len: u32,
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
    /// Chunks sent and not yet acknowledged, in order: (chunk, bytes left).
    unacked: VecDeque<(u32, u32)>,
    unacked_bytes: u64,
    write_shut: bool,
}

/// One connection, by the netstack's id.
pub(crate) struct PConn {
    id: u32,
    /// The command ring of the network kthread that owns it.
    ring: usize,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    state: SpinLock<ConnState>,
    waiters: SpinLock<Vec<Arc<Waiter>>>,
}

pub(crate) struct ListenState {
    /// Connections announced and not accepted yet.
    backlog: VecDeque<Arc<PConn>>,
    /// The netstack's answer to `Listen`: the port, or why not.
    bound: Option<Result<u16, Reason>>,
    closed: bool,
}

pub(crate) struct PListener {
    port: u16,
    state: SpinLock<ListenState>,
    waiters: SpinLock<Vec<Arc<Waiter>>>,
}

/// A `Connect` in flight.
pub(crate) struct PendingConnect {
    to: SocketAddrV4,
    result: SpinLock<Option<Result<Arc<PConn>, Reason>>>,
    waiters: SpinLock<Vec<Arc<Waiter>>>,
}

/// Raw mode ([`Channel`]): events are queued for the application.
#[derive(Default)]
struct Raw {
    on: AtomicBool,
    waiters: SpinLock<Vec<Arc<Waiter>>>,
}

/// A runtime's attachment to a netstack.
pub(crate) struct Protected {
    wire: Box<dyn Wire>,
    tx: TxPool,
    cfg: ProtectedConfig,
    conns: SpinLock<HashMap<u32, Arc<PConn>>>,
    listeners: SpinLock<HashMap<u16, Arc<PListener>>>,
    connects: SpinLock<HashMap<u64, Arc<PendingConnect>>>,
    next_cookie: AtomicU64,
    /// The netstack went away: why.
    gone: Mutex<Option<String>>,
    gone_flag: AtomicBool,
    raw: Raw,
    counters: Counters,
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
            listeners: SpinLock::new(HashMap::new()),
            connects: SpinLock::new(HashMap::new()),
            next_cookie: AtomicU64::new(1),
            gone: Mutex::new(None),
            gone_flag: AtomicBool::new(false),
            raw: Raw::default(),
            counters: Counters::default(),
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
        if !self.gone_flag.load(SeqCst) {
            return None;
        }
        self.gone.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn gone_error(&self, why: String) -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionReset,
            format!("the netstack is gone: {why}"),
        )
    }

    /// Pushes `cmd` on `ring`, waiting (yielding the uthread) while the
    /// ring is full: back-pressure, counted, never dropped.
    pub(crate) fn command(&self, ring: usize, cmd: &Command) -> io::Result<()> {
        let mut waited = false;
        loop {
            if let Some(why) = self.gone() {
                return Err(self.gone_error(why));
            }
            match self.wire.push(ring % self.wire.rings().max(1), cmd) {
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
            let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
            if g.is_some() {
                return;
            }
            *g = Some(why.clone());
        }
        self.gone_flag.store(true, SeqCst);
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
        let listeners: Vec<_> = self.listeners.lock().values().cloned().collect();
        for l in listeners {
            wake_all(&l.waiters);
        }
        let connects: Vec<_> = self.connects.lock().values().cloned().collect();
        for p in connects {
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
        for ring in 0..self.wire.rings() {
            scratch.clear();
            match self.wire.pop(ring, budget.min(POLL_BATCH), &mut scratch) {
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
                self.dispatch(ring, ev);
            }
        }
        total
    }

    /// Hands one event to whom it concerns and wakes them.
    fn dispatch(&self, ring: usize, ev: Event) {
        match ev {
            Event::Listening { port, result } => {
                let Some(l) = self.listeners.lock().get(&port).cloned() else {
                    return self.bad(format_args!("Listening for unknown port {port}"));
                };
                l.state.lock().bound = Some(result);
                wake_all(&l.waiters);
            }
            Event::NewConn {
                id,
                port,
                local,
                remote,
            } => {
                let Some(l) = self.listeners.lock().get(&port).cloned() else {
                    return self.bad(format_args!("NewConn {id} for unknown port {port}"));
                };
                let conn = self.insert_conn(id, ring, local, remote);
                let Some(conn) = conn else {
                    return self.bad(format_args!("NewConn {id}: the id is in use"));
                };
                l.state.lock().backlog.push_back(conn);
                wake_all(&l.waiters);
            }
            Event::Connected { cookie, id, local } => {
                let Some(p) = self.connects.lock().remove(&cookie) else {
                    return self.bad(format_args!("Connected for unknown cookie {cookie}"));
                };
                let r = match self.insert_conn(id, ring, local, p.to) {
                    Some(c) => Ok(c),
                    None => {
                        self.bad(format_args!("Connected {id}: the id is in use"));
                        Err(Reason::Refusal)
                    }
                };
                *p.result.lock() = Some(r);
                wake_all(&p.waiters);
            }
            Event::ConnectFailed { cookie, reason } => {
                let Some(p) = self.connects.lock().remove(&cookie) else {
                    return self.bad(format_args!("ConnectFailed for unknown cookie {cookie}"));
                };
                *p.result.lock() = Some(Err(reason));
                wake_all(&p.waiters);
            }
            Event::NewData { id, items } => {
                let Some(c) = self.conn(id) else {
                    return self.bad(format_args!("NewData for unknown connection {id}"));
                };
                {
                    let mut st = c.state.lock();
                    for (offset, len) in items {
                        if len == 0 {
                            continue;
                        }
                        if self.wire.rx(offset, len).is_none() {
                            self.bad(format_args!(
                                "NewData {id}: {len} bytes at {offset} lie outside the receive pool"
                            ));
                            continue;
                        }
                        st.rx.push_back(RxItem {
                            offset,
                            len,
                            used: 0,
                        });
                    }
                }
                wake_all(&c.waiters);
            }
            Event::DataAcked { id, count } => {
                let Some(c) = self.conn(id) else {
                    return self.bad(format_args!("DataAcked for unknown connection {id}"));
                };
                let freed = {
                    let mut st = c.state.lock();
                    ack(&mut st, count)
                };
                self.tx.release(freed);
                wake_all(&c.waiters);
            }
            Event::RemoteClosed { id } => {
                let Some(c) = self.conn(id) else {
                    return self.bad(format_args!("RemoteClosed for unknown connection {id}"));
                };
                c.state.lock().remote_closed = true;
                wake_all(&c.waiters);
            }
            Event::Cleanup { id, reason } => {
                let Some(c) = self.conns.lock().remove(&id) else {
                    return self.bad(format_args!("Cleanup for unknown connection {id}"));
                };
                let freed = {
                    let mut st = c.state.lock();
                    st.cleaned = true;
                    if let (Some(r), None) = (reason, st.error) {
                        let (kind, text) = reason_error(r);
                        st.error = Some(kind);
                        st.error_text = text.to_string();
                    } else if st.error.is_none() && !st.remote_closed {
                        st.error = Some(io::ErrorKind::ConnectionReset);
                        st.error_text = "the netstack closed the connection".into();
                    }
                    st.unacked_bytes = 0;
                    st.unacked.drain(..).map(|(c, _)| c).collect::<Vec<_>>()
                };
                self.tx.release(freed);
                wake_all(&c.waiters);
            }
        }
    }

    fn insert_conn(
        &self,
        id: u32,
        ring: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> Option<Arc<PConn>> {
        let mut conns = self.conns.lock();
        if conns.contains_key(&id) {
            return None;
        }
        let c = Arc::new(PConn {
            id,
            ring,
            local,
            remote,
            state: SpinLock::new(ConnState::default()),
            waiters: SpinLock::new(Vec::new()),
        });
        conns.insert(id, Arc::clone(&c));
        Some(c)
    }

    fn conn(&self, id: u32) -> Option<Arc<PConn>> {
        self.conns.lock().get(&id).cloned()
    }
}

/// Counts `count` acknowledged bytes off the front of `st.unacked`; the
/// chunks now free.
fn ack(st: &mut ConnState, mut count: u64) -> Vec<u32> {
    let mut freed = Vec::new();
    while count > 0 {
        let Some(front) = st.unacked.front_mut() else {
            break; // more than was sent: the rest is ignored
        };
        let n = u64::from(front.1).min(count);
        front.1 -= n as u32;
        count -= n;
        st.unacked_bytes -= n;
        if front.1 == 0 {
            freed.push(front.0);
            st.unacked.pop_front();
        }
    }
    freed
}

/// The `io::Error` kind and text for a netstack's reason.
fn reason_error(r: Reason) -> (io::ErrorKind, &'static str) {
    use io::ErrorKind as K;
    match r {
        Reason::Refused => (K::ConnectionRefused, "connection refused"),
        Reason::Reset => (K::ConnectionReset, "connection reset by the peer"),
        Reason::TimedOut => (K::TimedOut, "connection timed out"),
        Reason::AddrInUse => (K::AddrInUse, "address in use"),
        Reason::Refusal => (K::Other, "the netstack refused the command"),
    }
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
    let tx = TxPool::create("ginza-tx-pool", cfg.tx_chunks)
        .map_err(|e| format!("cannot create the tx pool: {e}"))?;
    let wire: Box<dyn Wire> = match testing::attach(&cfg.socket, tx.fd()) {
        Some(fake) => Box::new(fake?),
        None => transport::attach(&cfg.socket, &tx)?,
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
                p.lost(why);
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
