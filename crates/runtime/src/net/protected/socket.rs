//! `ProtectedListener` and `ProtectedStream`: the protected backend of
//! `TcpListener`/`TcpStream`, blocking calls for uthreads over the
//! netstack's commands and events (see `mod.rs`).

use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use ginza_proto::netstack::ListenId;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tx_pool::{TxPool, TX_CHUNK};
use super::{
    of, reason_error, Command, ConnState, ListenState, PConn, PListener, PendingConnect, Protected,
    Range, Ranges, SendFlags, MAX_RANGES,
};
use crate::net::wait::{timeout_ns, timeout_of, wait_until, wake_all};
use crate::sched::Shared;
use crate::spinlock::SpinLock;
use ginza_sys::hops::{self, Hop};

/// Chunks one `write` fills at most (it returns a partial count beyond,
/// as std's `write` may).
const WRITE_CHUNKS: usize = 32;

/// Ephemeral ports `bind` to port 0 tries.
const EPHEMERAL_TRIES: u32 = 64;

/// The accept backlog a `Listen` asks for.
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
}

impl fmt::Debug for ProtectedListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectedListener")
            .field("port", &self.l.port)
            .finish()
    }
}

impl ProtectedListener {
    pub(crate) fn bind(rt: Arc<Shared>, addr: SocketAddrV4) -> io::Result<ProtectedListener> {
        let p = p_of(&rt);
        let ip = *addr.ip();
        if !ip.is_unspecified() && ip != p.cfg.interface.ip {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!(
                    "cannot bind TCP to {addr}: this application's address is {} (bind to it or to 0.0.0.0)",
                    p.cfg.interface.ip
                ),
            ));
        }
        if addr.port() != 0 {
            return Self::bind_port(rt, addr);
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
            match Self::bind_port(Arc::clone(&rt), SocketAddrV4::new(ip, port)) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                r => return r,
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "protected mode: no free TCP port among {EPHEMERAL_TRIES} ephemeral ones tried"
            ),
        ))
    }

    fn bind_port(rt: Arc<Shared>, addr: SocketAddrV4) -> io::Result<ProtectedListener> {
        let p = p_of(&rt);
        let cookie = p.cookie();
        let l = Arc::new(PListener {
            port: addr.port(),
            cookie,
            state: SpinLock::new(ListenState {
                backlog: Default::default(),
                bound: None,
            }),
            waiters: SpinLock::new(Vec::new()),
        });
        {
            let mut ls = p.listen_cookies.lock();
            if ls.values().any(|o| o.port == addr.port()) {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("TCP port {} is already bound", addr.port()),
                ));
            }
            ls.insert(cookie, Arc::clone(&l));
        }
        // From here on, dropping it unlistens (once the netstack answered).
        let listener = ProtectedListener {
            rt: Arc::clone(&rt),
            l: Arc::clone(&l),
        };
        let listen = Command::Listen {
            cookie,
            port: addr.port(),
            backlog: LISTEN_BACKLOG,
        };
        p.command(0, &listen)?;
        wait_until(&l.waiters, None, || {
            if let Some(why) = p.gone() {
                return Some((Err(p.gone_error(why)), ()));
            }
            let bound = l.state.lock().bound?;
            Some((
                bound.map(|_| ()).map_err(|r| {
                    let (kind, text) = reason_error(r);
                    io::Error::new(kind, format!("TCP listen on {addr}: {text}"))
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

    pub(crate) fn accept(&self) -> io::Result<(ProtectedStream, SocketAddr)> {
        let p = p_of(&self.rt);
        let conn = wait_until(&self.l.waiters, None, || {
            if let Some(c) = self.l.state.lock().backlog.pop_front() {
                return Some((Ok(c), ()));
            }
            p.gone().map(|why| (Err(p.gone_error(why)), ()))
        })
        .expect("no deadline")?;
        // Its events come on the pair the accept goes on from now on.
        let pair = p.next_pair();
        conn.pair.store(pair, Relaxed);
        let listener = self.listen_id().expect("a listener that accepts was bound");
        p.command(
            pair,
            &Command::Accept {
                conn: conn.id,
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
            let _ = p.command(c.pair.load(Relaxed), &Command::Close { conn: c.id });
        }
    }
}

struct Handle {
    rt: Arc<Shared>,
    conn: Arc<PConn>,
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    read_shut: AtomicBool,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let Some(p) = of(&self.rt) else { return };
        let cleaned = {
            let mut st = self.conn.state.lock();
            st.closed = true;
            st.cleaned
        };
        if !cleaned && p.gone().is_none() {
            let pair = self.conn.pair.load(Relaxed);
            let _ = p.command(pair, &Command::Close { conn: self.conn.id });
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
            .field("id", &self.h.conn.id.get())
            .field("local", &self.h.conn.local)
            .field("peer", &self.h.conn.remote)
            .finish()
    }
}

/// The error a connection's state gives, if any.
fn state_error(st: &ConnState, c: &PConn) -> Option<io::Error> {
    st.error.map(|kind| {
        io::Error::new(
            kind,
            format!("TCP {} -> {}: {}", c.local, c.remote, st.error_text),
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
            }),
        }
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
            waiters: SpinLock::new(Vec::new()),
        });
        p.connects.lock().insert(cookie, Arc::clone(&pending));
        if let Err(e) = p.command(p.next_pair(), &Command::Connect { cookie, remote: to }) {
            p.connects.lock().remove(&cookie);
            return Err(e);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let r = wait_until(&pending.waiters, deadline, || {
            if let Some(r) = pending.result.lock().take() {
                return Some((Ok(r), ()));
            }
            p.gone().map(|why| (Err(p.gone_error(why)), ()))
        });
        match r {
            Some(Ok(Ok(conn))) => Ok(ProtectedStream::new(rt, conn)),
            Some(Ok(Err(reason))) => {
                let (kind, text) = reason_error(reason);
                Err(io::Error::new(kind, format!("TCP connect to {to}: {text}")))
            }
            Some(Err(e)) => Err(e),
            None => {
                // The netstack may still answer: a late `Connected` finds no
                // cookie and is counted as a bad event; the connection is
                // then never used (the netstack closes it on its own time).
                p.connects.lock().remove(&cookie);
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "TCP connect to {to}: no answer within {:?}",
                        timeout.unwrap_or_default()
                    ),
                ))
            }
        }
    }

    fn p(&self) -> &Protected {
        p_of(&self.h.rt)
    }

    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.h.conn.remote))
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.h.conn.local))
    }

    pub(crate) fn try_clone(&self) -> ProtectedStream {
        ProtectedStream {
            h: Arc::clone(&self.h),
        }
    }

    /// The netstack's id of this connection.
    pub fn id(&self) -> u32 {
        self.h.conn.id.get()
    }

    fn pair(&self) -> usize {
        self.h.conn.pair.load(Relaxed)
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.h.read_shut.store(true, Relaxed);
            wake_all(&self.h.conn.waiters);
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            let first = {
                let mut st = self.h.conn.state.lock();
                !std::mem::replace(&mut st.write_shut, true)
            };
            if first {
                self.p().command(
                    self.pair(),
                    &Command::Shutdown {
                        conn: self.h.conn.id,
                    },
                )?;
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
        self.wait_rx(|st, p, done| {
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
    fn wait_rx<R>(
        &self,
        mut take: impl FnMut(&mut ConnState, &Protected, &mut Vec<Range>) -> R,
    ) -> io::Result<R> {
        let p = self.p();
        let c = &self.h.conn;
        let timeout = timeout_of(&self.h.read_timeout);
        let deadline = timeout.map(|t| Instant::now() + t);
        let shut = &self.h.read_shut;
        let mut done = Vec::new();
        let r = wait_until(&c.waiters, deadline, || {
            let mut st = c.state.lock();
            let readable = !st.rx.is_empty()
                || shut.load(Relaxed)
                || st.remote_closed
                || (st.cleaned && st.error.is_none());
            if readable {
                return Some((Ok(take(&mut st, p, &mut done)), ()));
            }
            state_error(&st, c).map(|e| (Err(e), ()))
        });
        if !done.is_empty() {
            // Bytes read (not a read timeout).
            hops::stamp(Hop::AppRead);
        }
        for ranges in done.chunks(MAX_RANGES) {
            let ranges = Ranges::from_slice(ranges).expect("at most MAX_RANGES non-empty ranges");
            p.command(self.pair(), &Command::RecvDone { conn: c.id, ranges })?;
        }
        match r {
            Some(r) => r,
            None => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "TCP {} -> {}: nothing to read within the read timeout {:?}",
                    c.local,
                    c.remote,
                    timeout.unwrap_or_default()
                ),
            )),
        }
    }

    pub(crate) fn read_bytes(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || self.h.read_shut.load(Relaxed) {
            return Ok(0);
        }
        self.wait_rx(|st, p, done| {
            let mut n = 0;
            while n < buf.len() {
                let Some(front) = st.rx.front_mut() else {
                    break;
                };
                let all = p.wire.rx(front.range).expect("checked when the event came");
                let avail = &all[front.used as usize..];
                let k = avail.len().min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&avail[..k]);
                n += k;
                front.used += k as u32;
                if front.used == front.range.len {
                    done.push(front.range);
                    st.rx.pop_front();
                }
            }
            n
        })
    }

    pub(crate) fn write_bytes(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let p = self.p();
        let c = &self.h.conn;
        let timeout = timeout_of(&self.h.write_timeout);
        let deadline = timeout.map(|t| Instant::now() + t);
        let limit = p.cfg.tx_per_connection.min(p.wire.send_queue_bytes());
        let mut waited = false;
        let r = wait_until(&c.waiters, deadline, || {
            let mut st = c.state.lock();
            if let Some(e) = state_error(&st, c) {
                let e = io::Error::new(
                    if e.kind() == io::ErrorKind::ConnectionReset {
                        io::ErrorKind::BrokenPipe
                    } else {
                        e.kind()
                    },
                    e.to_string(),
                );
                return Some((Err(e), ()));
            }
            if st.write_shut || st.cleaned {
                return Some((
                    Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        format!(
                            "TCP {} -> {}: broken pipe: the connection was shut down for writing",
                            c.local, c.remote
                        ),
                    )),
                    (),
                ));
            }
            let room = limit.saturating_sub(st.unacked_bytes);
            let max = (room / u64::from(TX_CHUNK)).min(WRITE_CHUNKS as u64) as usize;
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
                send_ranges(p, self.pair(), c.id, &ranges)?;
                Ok(n)
            }
            Some(Err(e)) => Err(e),
            None => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "TCP {} -> {}: the send buffer stayed full for the write timeout {:?}",
                    c.local,
                    c.remote,
                    timeout.unwrap_or_default()
                ),
            )),
        }
    }
}
