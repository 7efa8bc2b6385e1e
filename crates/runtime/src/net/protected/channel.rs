//! The asynchronous API over the raw events and commands (docs/design.md,
//! "Protected mode (DLibOS)"): for applications that run their own event
//! loop instead of blocking sockets. Opening a [`Channel`] puts the
//! runtime's attachment in raw mode: events are no longer handed to
//! sockets but returned by [`Channel::next_event`]; the application
//! answers with commands ([`Channel::submit`]), reads received bytes in
//! place ([`Channel::rx`], read-only) and sends from its tx pool
//! ([`Channel::send`], which copies into the pool and gives the chunks
//! back when `DataAcked` counts them).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Duration;

use super::socket::send_ranges;
use super::tx_pool::TxPool;
use super::{ack, of, Command, ConnId, ConnState, Event, Protected, Range};
use crate::net::wait::{wait_until, Wait};
use crate::sched::{self, Shared};
use crate::spinlock::SpinLock;

/// An event and the ring pair it came on (`Accept` on a pair pins the
/// connection's events to it; commands are taken on any pair).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelEvent {
    pub pair: usize,
    pub event: Event,
}

/// The raw event/command interface of the calling runtime's netstack.
pub struct Channel {
    rt: Arc<Shared>,
    /// Chunks sent and not yet acknowledged, per connection.
    unacked: SpinLock<HashMap<u32, ConnState>>,
    scratch: SpinLock<VecDeque<ChannelEvent>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").finish_non_exhaustive()
    }
}

impl Channel {
    /// Takes the calling runtime's attachment in raw mode. Fails outside a
    /// protected runtime, when a channel is open already, or when sockets
    /// use the attachment.
    pub fn open() -> io::Result<Channel> {
        let rt =
            sched::current_shared().ok_or_else(|| crate::net::wait::no_runtime("Channel::open"))?;
        let p = of(&rt).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "the asynchronous API needs protected mode (Config::protected)",
            )
        })?;
        if !p.conns.lock().is_empty() || !p.listen_cookies.lock().is_empty() {
            return Err(io::Error::other(
                "sockets use the netstack attachment: open the channel before any socket",
            ));
        }
        if p.raw.on.swap(true, SeqCst) {
            return Err(io::Error::other("a channel is open already"));
        }
        Ok(Channel {
            rt,
            unacked: SpinLock::new(HashMap::new()),
            scratch: SpinLock::new(VecDeque::new()),
        })
    }

    fn p(&self) -> &Protected {
        of(&self.rt).expect("opened on an attached runtime")
    }

    /// Ring pairs (one per kthread of this runtime).
    pub fn pairs(&self) -> usize {
        self.p().wire.pairs()
    }

    /// A fresh cookie for `Listen` or `Connect`.
    pub fn cookie(&self) -> u32 {
        self.p().cookie()
    }

    /// Pushes a command (waiting while the ring is full: back-pressure).
    pub fn submit(&self, pair: usize, cmd: &Command) -> io::Result<()> {
        self.p().command(pair, cmd)
    }

    /// Copies `data` into the tx pool (as much as is free, up to 64 KiB)
    /// and sends it on `conn`: the bytes taken (0 when the pool is full:
    /// wait for `DataAcked`).
    pub fn send(&self, pair: usize, conn: ConnId, data: &[u8]) -> io::Result<usize> {
        let p = self.p();
        let used = p.tx.fill(data, 32);
        if used.is_empty() {
            return Ok(0);
        }
        let n = used.iter().map(|&(_, l)| l as usize).sum();
        {
            let mut map = self.unacked.lock();
            let st = map.entry(conn.get()).or_default();
            for &(c, l) in &used {
                st.unacked.push_back((c, l));
                st.unacked_bytes += u64::from(l);
            }
        }
        let ranges: Vec<Range> = used.iter().map(|&(c, l)| TxPool::range(c, l)).collect();
        send_ranges(p, pair, conn, &ranges)?;
        Ok(n)
    }

    /// The received bytes of a `NewData` range (read-only receive memory),
    /// or `None` for a range outside the pool.
    pub fn rx(&self, r: Range) -> Option<&[u8]> {
        self.p().wire.rx(r)
    }

    /// The next event, waiting at most `timeout` (`None`: forever);
    /// `Ok(None)` on timeout, `ConnectionReset` once the netstack is gone.
    /// `DataAcked` gives the acknowledged chunks back to the pool before
    /// it is returned; `Cleanup` frees what the connection still held.
    pub fn next_event(&self, timeout: Option<Duration>) -> io::Result<Option<ChannelEvent>> {
        let p = self.p();
        let r = wait_until(&p.raw.waiters, Wait::within(timeout), || {
            if let Some(e) = self.scratch.lock().pop_front() {
                return Some((Ok(e), ()));
            }
            let mut out = Vec::new();
            for pair in 0..p.wire.pairs() {
                if let Err(why) = p.wire.pop(pair, 32, &mut out) {
                    // `lost` wakes this queue: after its lock is released.
                    return Some((Err(why), ()));
                }
                let mut q = self.scratch.lock();
                q.extend(out.drain(..).map(|event| ChannelEvent { pair, event }));
            }
            if let Some(e) = self.scratch.lock().pop_front() {
                return Some((Ok(e), ()));
            }
            p.gone().map(|why| (Err(why), ()))
        });
        let Some(r) = r else { return Ok(None) };
        let e = match r {
            Ok(e) => e,
            Err(why) => {
                p.lost(why.clone());
                return Err(p.gone_error(why));
            }
        };
        p.counters.events.fetch_add(1, Relaxed);
        match &e.event {
            Event::DataAcked { conn, ranges } => {
                let (freed, unknown) = self
                    .unacked
                    .lock()
                    .get_mut(&conn.get())
                    .map(|st| ack(st, ranges.as_slice()))
                    .unwrap_or((Vec::new(), ranges.len()));
                if unknown > 0 {
                    p.bad(format_args!(
                        "DataAcked {}: {unknown} ranges were not sent on it",
                        conn.get()
                    ));
                }
                p.release(freed);
            }
            Event::Cleanup { conn } => {
                if let Some(mut st) = self.unacked.lock().remove(&conn.get()) {
                    p.release(st.unacked.drain(..).map(|(c, _)| c).collect());
                }
            }
            _ => {}
        }
        Ok(Some(e))
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if let Some(p) = of(&self.rt) {
            p.raw.on.store(false, SeqCst);
        }
    }
}
