//! `ProtectedListener` and `ProtectedStream`: the protected backend of
//! `TcpListener`/`TcpStream`, blocking calls for uthreads over the
//! netstack's commands and events (see `mod.rs`).

use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use ginza_proto::netstack::ListenId;
use std::sync::Arc;
use std::time::Duration;

use super::tx_pool::{TxPool, TX_CHUNK};
use super::{
    errno_of, of, reason_error, Command, ConnState, ListenState, PConn, PListener, PendingConnect,
    Protected, Range, Ranges, SendFlags, MAX_RANGES,
};
use crate::net::readiness::{Readiness, SocketWaiters, Watched};
use crate::net::wait::{os_error, timeout_ns, timeout_of, wait_until, wake_all, would_block, Wait};
use crate::sched::Shared;
use crate::spinlock::SpinLock;
use ginza_sys::hops::{self, Hop};

/// Chunks one `write` fills at most (it returns a partial count beyond,
/// as std's `write` may).
const WRITE_CHUNKS: usize = 32;

/// Ephemeral ports `bind` to port 0 tries.
const EPHEMERAL_TRIES: u32 = 64;

/// The accept backlog a `Listen` asks for (at most).
const LISTEN_BACKLOG: u16 = 1024;

/// Sends `ranges` of the tx pool on `conn`, `MAX_RANGES` per `send`, each
/// but the last flagged `more`.
pub(crate) fn send_ranges(
    p: &Protected,
    pair: usize,
    conn: ginza_proto::netstack::ConnId,
    ranges: &[Range],
) -> io::Result<()> {
    let n = ranges.len().div_ceil(MAX_RANGES);
    for (i, part) in ranges.chunks(MAX_RANGES).enumerate() {
        let cmd = Command::Send {
            conn,
            ranges: Ranges::from_slice(part).expect("at most MAX_RANGES non-empty ranges"),
            flags: SendFlags { more: i + 1 < n },
        };
        // Before the push: the netstack may take the command at once.
        hops::stamp(Hop::AppSendOut);
        p.command(pair, &cmd)?;
    }
    Ok(())
}

fn p_of(rt: &Shared) -> &Protected {
    of(rt).expect("a protected socket exists only on an attached runtime")
}

/// A listening port on the netstack.
pub struct ProtectedListener {
    rt: Arc<Shared>,
    l: Arc<PListener>,
    /// `accept` gives `EAGAIN` rather than waiting.
    nonblocking: AtomicBool,
}

impl Watched for PListener {
    /// Readable while a connection waits to be accepted.
    fn readiness(&self) -> Readiness {
        Readiness {
            readable: !self.state.lock().backlog.is_empty(),
            ..Readiness::default()
        }
    }

    fn waiters(&self) -> &SpinLock<SocketWaiters> {
        &self.waiters
    }
}

impl fmt::Debug for ProtectedListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectedListener")
            .field("port", &self.l.port)
            .finish()
    }
}

impl ProtectedListener {
    /// `backlog`: `listen`'s, clamped to 1..=1024 (`None`: 1024).
    pub(crate) fn bind(
        rt: Arc<Shared>,
        addr: SocketAddrV4,
        backlog: Option<usize>,
    ) -> io::Result<ProtectedListener> {
        let p = p_of(&rt);
        let ip = *addr.ip();
        let backlog = backlog.map_or(LISTEN_BACKLOG, |b| {
            b.clamp(1, usize::from(LISTEN_BACKLOG)) as u16
        });
        if !ip.is_unspecified() && ip != p.cfg.interface.ip {
            return Err(os_error(
                libc::EADDRNOTAVAIL,
                format_args!(
                    "cannot bind TCP to {addr}: this application's address is {} (bind to it or to 0.0.0.0)",
                    p.cfg.interface.ip
                ),
            ));
        }
        if addr.port() != 0 {
            return Self::bind_port(rt, addr, backlog);
        }
        // Port 0: the netstack picks none, so try ephemeral ports (49152-
        // 65535, as the in-process stack) from a random one on; a port the
        // netstack says is in use (another application's) is skipped.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id().rotate_left(16);
        for i in 0..EPHEMERAL_TRIES {
            let port = 49152 + (seed.wrapping_add(i.wrapping_mul(7919)) % 16384) as u16;
            match Self::bind_port(Arc::clone(&rt), SocketAddrV4::new(ip, port), backlog) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                r => return r,
            }
        }
        Err(os_error(
            libc::EADDRINUSE,
            format_args!(
                "protected mode: no free TCP port among {EPHEMERAL_TRIES} ephemeral ones tried"
            ),
        ))
    }

    fn bind_port(
        rt: Arc<Shared>,
        addr: SocketAddrV4,
        backlog: u16,
    ) -> io::Result<ProtectedListener> {
        let p = p_of(&rt);
        let cookie = p.cookie();
        let l = Arc::new(PListener {
            port: addr.port(),
            cookie,
            state: SpinLock::new(ListenState {
                backlog: Default::default(),
                bound: None,
            }),
            waiters: SpinLock::new(SocketWaiters::new()),
        });
        {
            let mut ls = p.listen_cookies.lock();
            if ls.values().any(|o| o.port == addr.port()) {
                return Err(os_error(
                    libc::EADDRINUSE,
                    format_args!("TCP port {} is already bound", addr.port()),
                ));
            }
            ls.insert(cookie, Arc::clone(&l));
        }
        // From here on, dropping it unlistens (once the netstack answered).
        let listener = ProtectedListener {
            rt: Arc::clone(&rt),
            l: Arc::clone(&l),
            nonblocking: AtomicBool::new(false),
        };
        let listen = Command::Listen {
            cookie,
            port: addr.port(),
            backlog,
        };
        p.command(0, &listen)?;
        wait_until(&l.waiters, Wait::Forever, || {
            if let Some(why) = p.gone() {
                return Some((Err(p.gone_error(why)), ()));
            }
            let bound = l.state.lock().bound?;
            Some((
                bound.map(|_| ()).map_err(|r| {
                    let (kind, text) = reason_error(r);
                    os_error(errno_of(kind), format_args!("TCP listen on {addr}: {text}"))
                }),
                (),
            ))
        })
        .expect("no deadline")?;
        Ok(listener)
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        let ip = p_of(&self.rt).cfg.interface.ip;
        Ok(SocketAddr::V4(SocketAddrV4::new(ip, self.l.port)))
    }

    fn listen_id(&self) -> Option<ListenId> {
        self.l.state.lock().bound.and_then(Result::ok)
    }

    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Relaxed);
    }

    /// What a poller watches.
    pub(crate) fn watched(&self) -> Arc<dyn Watched> {
        self.l.clone()
    }

    pub(crate) fn accept(&self) -> io::Result<(ProtectedStream, SocketAddr)> {
        self.accept_within(Wait::forever_unless(self.nonblocking.load(Relaxed)))
    }

    /// `accept` that never waits: `EAGAIN` when nobody waits.
    pub(crate) fn try_accept(&self) -> io::Result<(ProtectedStream, SocketAddr)> {
        self.accept_within(Wait::Once)
    }

    fn accept_within(&self, wait: Wait) -> io::Result<(ProtectedStream, SocketAddr)> {
        let p = p_of(&self.rt);
        let conn = wait_until(&self.l.waiters, wait, || {
            if let Some(c) = self.l.state.lock().backlog.pop_front() {
                return Some((Ok(c), ()));
            }
            p.gone().map(|why| (Err(p.gone_error(why)), ()))
        })
        .ok_or_else(would_block)??;
        // Its events come on the pair the accept goes on from now on.
        let pair = p.next_pair();
        conn.pair.store(pair, Relaxed);
        let listener = self.listen_id().expect("a listener that accepts was bound");
        p.command(
            pair,
            &Command::Accept {
                conn: conn.id().expect("an announced connection has its id"),
                listener,
            },
        )?;
        let remote = conn.remote;
        Ok((
            ProtectedStream::new(Arc::clone(&self.rt), conn),
            SocketAddr::V4(remote),
        ))
    }
}

impl Drop for ProtectedListener {
    fn drop(&mut self) {
        let Some(p) = of(&self.rt) else { return };
        p.listen_cookies.lock().remove(&self.l.cookie);
        let id = self.listen_id();
        if let Some(id) = id {
            p.listeners.lock().remove(&id.get());
        }
        let backlog: Vec<_> = self.l.state.lock().backlog.drain(..).collect();
        if p.gone().is_some() {
            return;
        }
        if let Some(listener) = id {
            let _ = p.command(0, &Command::Unlisten { listener });
        }
        for c in backlog {
            c.state.lock().closed = true;
            if let Some(id) = c.id() {
                let _ = p.command(c.pair.load(Relaxed), &Command::Close { conn: id });
            }
        }
    }
}

struct Handle {
    rt: Arc<Shared>,
    conn: Arc<PConn>,
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    read_shut: AtomicBool,
    /// Reads and writes give `EAGAIN` rather than wait.
    nonblocking: AtomicBool,
    /// `take_error` gave the connection's error (`SO_ERROR` clears it).
    error_taken: AtomicBool,
}

impl Handle {
    /// The bytes a write may queue now: the per-connection bound less what
    /// is unacknowledged, in whole chunks, `WRITE_CHUNKS` at most.
    fn write_room(&self, p: &Protected, st: &ConnState) -> usize {
        let limit = p.cfg.tx_per_connection.min(p.wire.send_queue_bytes());
        let room = limit.saturating_sub(st.unacked_bytes);
        (room / u64::from(TX_CHUNK)).min(WRITE_CHUNKS as u64) as usize
    }
}

impl Watched for Handle {
    /// As the in-process stack's (Linux's `tcp_poll`): a connection ended
    /// by the netstack is readable, writable and hung up; one shut down
    /// for writing is writable (a write gives `EPIPE`).
    fn readiness(&self) -> Readiness {
        let Some(p) = of(&self.rt) else {
            return Readiness::default();
        };
        let c = &self.conn;
        let st = c.state.lock();
        if st.connecting {
            return Readiness::default();
        }
        let ended = st.cleaned || st.error.is_some();
        let read_closed = st.remote_closed || self.read_shut.load(SeqCst) || ended;
        let write_shut = st.write_shut || st.closed || ended;
        let chunks = self.write_room(p, &st);
        let pool_empty = chunks > 0 && p.tx.free_chunks() == 0;
        if pool_empty {
            // Chunks freed by any connection notify this one.
            p.pool_starved.lock().push(Arc::clone(c));
        }
        Readiness {
            readable: !st.rx.is_empty() || read_closed,
            writable: write_shut || (chunks > 0 && !pool_empty),
            read_closed,
            hung_up: ended || (read_closed && write_shut),
            error: st.error.is_some() && !self.error_taken.load(SeqCst),
        }
    }

    fn waiters(&self) -> &SpinLock<SocketWaiters> {
        &self.conn.waiters
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let Some(p) = of(&self.rt) else { return };
        let (cleaned, connecting) = {
            let mut st = self.conn.state.lock();
            st.closed = true;
            (st.cleaned, st.connecting)
        };
        if connecting {
            // Unanswered: the answer closes it (`Protected::connected`),
            // or finds no cookie (a bad event; the netstack closes it).
            p.connects.lock().remove(&self.conn.connect_cookie);
            return;
        }
        let Some(id) = self.conn.id() else {
            return; // its connect failed
        };
        if !cleaned && p.gone().is_none() {
            let pair = self.conn.pair.load(Relaxed);
            let _ = p.command(pair, &Command::Close { conn: id });
        }
    }
}

/// A connection on the netstack. Cheap to clone (`try_clone`).
pub struct ProtectedStream {
    h: Arc<Handle>,
}

impl fmt::Debug for ProtectedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectedStream")
            .field("id", &self.id())
            .field("local", &self.h.conn.local())
            .field("peer", &self.h.conn.remote)
            .finish()
    }
}

/// The error a connection's state gives, if any (a write's reset is
/// `EPIPE`, as Linux gives it after the first).
fn state_error(st: &ConnState, c: &PConn, writing: bool) -> Option<io::Error> {
    st.error.map(|kind| {
        let errno = match errno_of(kind) {
            libc::ECONNRESET if writing => libc::EPIPE,
            e => e,
        };
        os_error(
            errno,
            format_args!("TCP {} -> {}: {}", c.local(), c.remote, st.error_text),
        )
    })
}

impl ProtectedStream {
    fn new(rt: Arc<Shared>, conn: Arc<PConn>) -> ProtectedStream {
        ProtectedStream {
            h: Arc::new(Handle {
                rt,
                conn,
                read_timeout: AtomicU64::new(0),
                write_timeout: AtomicU64::new(0),
                read_shut: AtomicBool::new(false),
                nonblocking: AtomicBool::new(false),
                error_taken: AtomicBool::new(false),
            }),
        }
    }

    /// What a poller watches.
    pub(crate) fn watched(&self) -> Arc<dyn Watched> {
        self.h.clone()
    }

    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.h.nonblocking.store(on, Relaxed);
    }

    /// The error that ended the connection, once (`SO_ERROR`).
    pub(crate) fn take_error(&self) -> io::Result<Option<io::Error>> {
        let c = &self.h.conn;
        let st = c.state.lock();
        if st.error.is_none() || self.h.error_taken.swap(true, SeqCst) {
            return Ok(None);
        }
        Ok(state_error(&st, c, false))
    }

    /// Bytes a read would give now (`FIONREAD`).
    pub(crate) fn bytes_readable(&self) -> usize {
        if self.h.read_shut.load(SeqCst) {
            return 0;
        }
        let st = self.h.conn.state.lock();
        st.rx.iter().map(|i| (i.range.len - i.used) as usize).sum()
    }

    /// How long a call may wait: once if non-blocking (or `try_only`),
    /// else for the timeout, if any.
    fn wait(&self, timeout: &AtomicU64, try_only: bool) -> Wait {
        Wait::for_call(try_only || self.h.nonblocking.load(Relaxed), timeout)
    }

    pub(crate) fn connect(
        rt: Arc<Shared>,
        to: SocketAddrV4,
        timeout: Option<Duration>,
    ) -> io::Result<ProtectedStream> {
        let p = p_of(&rt);
        let cookie = p.cookie();
        let pending = Arc::new(PendingConnect {
            to,
            result: SpinLock::new(None),
            waiters: SpinLock::new(SocketWaiters::new()),
            early: None,
        });
        p.connects.lock().insert(cookie, Arc::clone(&pending));
        if let Err(e) = p.command(p.next_pair(), &Command::Connect { cookie, remote: to }) {
            p.connects.lock().remove(&cookie);
            return Err(e);
        }
        let r = wait_until(&pending.waiters, Wait::within(timeout), || {
            if let Some(r) = pending.result.lock().take() {
                return Some((Ok(r), ()));
            }
            p.gone().map(|why| (Err(p.gone_error(why)), ()))
        });
        match r {
            Some(Ok(Ok(conn))) => Ok(ProtectedStream::new(rt, conn)),
            Some(Ok(Err(reason))) => {
                let (kind, text) = reason_error(reason);
                Err(os_error(
                    errno_of(kind),
                    format_args!("TCP connect to {to}: {text}"),
                ))
            }
            Some(Err(e)) => Err(e),
            None => {
                // The netstack may still answer: a late `Connected` finds no
                // cookie and is counted as a bad event; the connection is
                // then never used (the netstack closes it on its own time).
                p.connects.lock().remove(&cookie);
                Err(os_error(
                    libc::ETIMEDOUT,
                    format_args!(
                        "TCP connect to {to}: no answer within {:?}",
                        timeout.unwrap_or_default()
                    ),
                ))
            }
        }
    }

    /// Sends `Connect` and returns at once: the stream turns writable
    /// when the netstack answers (`Protected::connected`), or readable,
    /// writable and hung up with its error for `take_error` when it
    /// refuses.
    pub(crate) fn connect_nonblocking(
        rt: Arc<Shared>,
        to: SocketAddrV4,
    ) -> io::Result<ProtectedStream> {
        let p = p_of(&rt);
        let cookie = p.cookie();
        let conn = Arc::new(PConn::connecting(cookie, p.cfg.interface.ip, to));
        let pending = Arc::new(PendingConnect {
            to,
            result: SpinLock::new(None),
            waiters: SpinLock::new(SocketWaiters::new()),
            early: Some(Arc::clone(&conn)),
        });
        p.connects.lock().insert(cookie, pending);
        if let Err(e) = p.command(p.next_pair(), &Command::Connect { cookie, remote: to }) {
            p.connects.lock().remove(&cookie);
            conn.state.lock().connecting = false;
            return Err(e);
        }
        Ok(ProtectedStream::new(rt, conn))
    }

    fn p(&self) -> &Protected {
        p_of(&self.h.rt)
    }

    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.h.conn.remote))
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.h.conn.local()))
    }

    pub(crate) fn try_clone(&self) -> ProtectedStream {
        ProtectedStream {
            h: Arc::clone(&self.h),
        }
    }

    /// The netstack's id of this connection (0 while a non-blocking
    /// connect waits for its answer).
    pub fn id(&self) -> u32 {
        self.h.conn.id().map_or(0, |id| id.get())
    }

    fn pair(&self) -> usize {
        self.h.conn.pair.load(Relaxed)
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.h.read_shut.store(true, SeqCst);
            wake_all(&self.h.conn.waiters);
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            let Some(id) = self.h.conn.id() else {
                return Err(os_error(
                    libc::ENOTCONN,
                    format_args!("shutdown of a TCP connect not answered yet"),
                ));
            };
            let first = {
                let mut st = self.h.conn.state.lock();
                !std::mem::replace(&mut st.write_shut, true)
            };
            if first {
                self.p()
                    .command(self.pair(), &Command::Shutdown { conn: id })?;
                // Writable now (a write gives EPIPE): pollers look again.
                wake_all(&self.h.conn.waiters);
            }
        }
        Ok(())
    }

    /// The netstack sends each `send` at once (no Nagle): setting it is
    /// accepted and changes nothing.
    pub(crate) fn set_nodelay(&self, _nodelay: bool) -> io::Result<()> {
        Ok(())
    }

    pub(crate) fn nodelay(&self) -> io::Result<bool> {
        Ok(true)
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.h.read_timeout.store(timeout_ns(t)?, Relaxed);
        Ok(())
    }

    pub(crate) fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(timeout_of(&self.h.read_timeout))
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.h.write_timeout.store(timeout_ns(t)?, Relaxed);
        Ok(())
    }

    pub(crate) fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(timeout_of(&self.h.write_timeout))
    }

    /// Waits until the front of the received data can be looked at, then
    /// calls `f` with it (read-only receive memory, lent: no copy); `f`
    /// says how many bytes it consumed (at most the slice's length) and
    /// what to return. An empty slice means end of stream. Ranges wholly
    /// consumed go back to the netstack (`recv_done`).
    pub fn read_lent<R>(&self, f: impl FnOnce(&[u8]) -> (usize, R)) -> io::Result<R> {
        let mut f = Some(f);
        self.wait_rx(false, |st, p, done| {
            let f = f.take().expect("called once");
            let Some(front) = st.rx.front_mut() else {
                return f(&[]).1; // end of stream
            };
            let all = p.wire.rx(front.range).expect("checked when the event came");
            let (n, r) = f(&all[front.used as usize..]);
            front.used += n.min((front.range.len - front.used) as usize) as u32;
            if front.used == front.range.len {
                done.push(front.range);
                st.rx.pop_front();
            }
            r
        })
    }

    /// Waits for received data (or the end, or an error, or the read
    /// timeout), then runs `take` on the connection's state, which notes
    /// the ranges it consumed wholly; sends `recv_done` for them.
    /// Never waits with `try_only` or in non-blocking mode (`EAGAIN`).
    fn wait_rx<R>(
        &self,
        try_only: bool,
        mut take: impl FnMut(&mut ConnState, &Protected, &mut Vec<Range>) -> R,
    ) -> io::Result<R> {
        let p = self.p();
        let c = &self.h.conn;
        let wait = self.wait(&self.h.read_timeout, try_only);
        let shut = &self.h.read_shut;
        let mut done = Vec::new();
        let r = wait_until(&c.waiters, wait, || {
            let mut st = c.state.lock();
            let readable = !st.rx.is_empty()
                || shut.load(SeqCst)
                || st.remote_closed
                || (st.cleaned && st.error.is_none());
            if readable {
                return Some((Ok(take(&mut st, p, &mut done)), ()));
            }
            state_error(&st, c, false).map(|e| (Err(e), ()))
        });
        if !done.is_empty() {
            // Bytes read (not a read timeout).
            hops::stamp(Hop::AppRead);
        }
        for ranges in done.chunks(MAX_RANGES) {
            let ranges = Ranges::from_slice(ranges).expect("at most MAX_RANGES non-empty ranges");
            let conn = c.id().expect("bytes came: it is connected");
            p.command(self.pair(), &Command::RecvDone { conn, ranges })?;
        }
        match r {
            Some(r) => r,
            None => Err(would_block()),
        }
    }

    pub(crate) fn read_bytes(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, false, false)
    }

    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, false, true)
    }

    pub(crate) fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, true, false)
    }

    pub(crate) fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, true, true)
    }

    /// Copies received bytes into `buf`, consuming them unless `peek`.
    fn recv(&self, buf: &mut [u8], peek: bool, try_only: bool) -> io::Result<usize> {
        if buf.is_empty() || self.h.read_shut.load(SeqCst) {
            return Ok(0);
        }
        self.wait_rx(try_only, |st, p, done| {
            let mut n = 0;
            let mut i = 0;
            while n < buf.len() {
                let Some(item) = st.rx.get_mut(i) else {
                    break;
                };
                let all = p.wire.rx(item.range).expect("checked when the event came");
                let avail = &all[item.used as usize..];
                let k = avail.len().min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&avail[..k]);
                n += k;
                if peek {
                    i += 1;
                    continue;
                }
                item.used += k as u32;
                if item.used == item.range.len {
                    done.push(item.range);
                    st.rx.pop_front();
                }
            }
            n
        })
    }

    pub(crate) fn write_bytes(&self, buf: &[u8]) -> io::Result<usize> {
        self.send(buf, false)
    }

    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.send(buf, true)
    }

    fn send(&self, buf: &[u8], try_only: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let p = self.p();
        let c = &self.h.conn;
        let wait = self.wait(&self.h.write_timeout, try_only);
        let mut waited = false;
        let r = wait_until(&c.waiters, wait, || {
            let mut st = c.state.lock();
            if let Some(e) = state_error(&st, c, true) {
                return Some((Err(e), ()));
            }
            if st.write_shut || st.cleaned {
                return Some((
                    Err(os_error(
                        libc::EPIPE,
                        format_args!(
                            "TCP {} -> {}: broken pipe: the connection was shut down for writing",
                            c.local(),
                            c.remote
                        ),
                    )),
                    (),
                ));
            }
            if st.connecting {
                return None; // woken by the answer
            }
            let max = self.h.write_room(p, &st);
            let used = if max > 0 {
                p.tx.fill(buf, max)
            } else {
                Vec::new()
            };
            if used.is_empty() && max > 0 {
                // The pool is empty: chunks freed by any connection wake us.
                p.pool_starved.lock().push(Arc::clone(c));
            }
            if used.is_empty() {
                if !waited {
                    waited = true;
                    p.counters.tx_waits.fetch_add(1, Relaxed);
                }
                return None;
            }
            let mut n = 0usize;
            for &(chunk, len) in &used {
                st.unacked.push_back((chunk, len));
                st.unacked_bytes += u64::from(len);
                n += len as usize;
            }
            let ranges: Vec<Range> = used
                .iter()
                .map(|&(chunk, len)| TxPool::range(chunk, len))
                .collect();
            Some((Ok((n, ranges)), ()))
        });
        match r {
            Some(Ok((n, ranges))) => {
                let conn = c.id().expect("written: it is connected");
                send_ranges(p, self.pair(), conn, &ranges)?;
                Ok(n)
            }
            Some(Err(e)) => Err(e),
            None => Err(would_block()),
        }
    }
}
