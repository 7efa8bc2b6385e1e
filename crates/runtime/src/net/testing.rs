//! Test hooks: the stack driven directly, without kthreads or iokerneld.
//! A test creates a region and an ingress pool, plays iokerneld on their
//! other ends, and calls [`Harness::poll`] where a kthread's scheduler would.
//! Not a stable API.

use std::cell::Cell;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddrV4;
use std::sync::Arc;

use ginza_shm::{IngressPool, Region, RuntimeEnd};

use super::stack::{Sent, SocketCore, Stack};
use super::tcp::ListenerCore;
use super::{NetConfig, NetStats};
use crate::link::{KNet, TxSide, POLL_BATCH};

/// The stack of one application and the runtime ends of its kthreads'
/// packet rings. Single-threaded (`!Sync`): each call acts as the kthread
/// it names, and one thread plays every kthread.
pub struct Harness {
    stack: Stack,
    knets: Vec<KNet>,
    _single_thread: PhantomData<Cell<()>>,
}

/// A socket bound through a [`Harness`].
pub struct Socket(Arc<SocketCore>);

impl Socket {
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.0.local
    }
}

/// A listening TCP port made through a [`Harness`]: no `accept` (that needs
/// a runtime), but its bounds can be watched.
pub struct Listening(Arc<ListenerCore>);

impl Listening {
    /// Connections whose handshake completed, waiting for `accept`.
    pub fn backlog_len(&self) -> usize {
        self.0.backlog_len()
    }

    pub fn half_open_len(&self) -> usize {
        self.0.half_open_len()
    }
}

/// What a [`Harness::send_to`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    Sent,
    QueuedForArp,
    DroppedByArp,
    RingFull,
}

impl Harness {
    /// Takes the runtime end of every kthread of `region`.
    pub fn new(cfg: &NetConfig, region: &Region, pool: IngressPool) -> Result<Harness, String> {
        cfg.check()?;
        let knets = (0..region.n_kthreads())
            .map(|k| {
                let RuntimeEnd {
                    ingress,
                    done,
                    egress,
                    egress_buffers,
                    ..
                } = region.runtime_end(k).map_err(|e| e.to_string())?;
                Ok(KNet::new(ingress, done, egress, egress_buffers))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Harness {
            stack: Stack::new(cfg, pool, None),
            knets,
            _single_thread: PhantomData,
        })
    }

    /// As kthread `k`, processes a batch (32 frames at most) of kthread
    /// `ring`'s ingress ring; the frames processed.
    pub fn poll(&self, k: usize, ring: usize) -> usize {
        self.stack
            .poll(&mut self.tx_side(k), &self.knets[ring], POLL_BATCH)
    }

    /// Whether frames wait on kthread `k`'s ingress ring.
    pub fn ingress_pending(&self, k: usize) -> bool {
        self.knets[k].ingress_pending()
    }

    pub fn bind(&self, addr: SocketAddrV4) -> io::Result<Socket> {
        self.stack.bind(addr).map(Socket)
    }

    /// Listens on TCP `port` of the interface.
    pub fn tcp_listen(&self, port: u16) -> io::Result<Listening> {
        let addr = SocketAddrV4::new(self.stack.iface.ip, port);
        self.stack.tcp.listen(addr, None).map(Listening)
    }

    /// As kthread `k`, takes a queued datagram, if any: copies it into
    /// `out` and gives its buffer back on `k`'s done ring.
    pub fn try_recv(&self, k: usize, s: &Socket, out: &mut [u8]) -> Option<(usize, SocketAddrV4)> {
        let item = s.0.take()?;
        self.stack.taken();
        let n = self.stack.copy_out(&item, out);
        self.stack.give_back(&mut self.tx_side(k), item.buf_index());
        Some((n, Stack::item_source(&item)))
    }

    /// As kthread `k`, sends from `s`.
    pub fn send_to(
        &self,
        k: usize,
        s: &Socket,
        payload: &[u8],
        dst: SocketAddrV4,
    ) -> io::Result<SendOutcome> {
        let r = self
            .stack
            .send_udp(&mut self.tx_side(k), s.0.port(), dst.into(), payload)?;
        Ok(match r {
            Sent::Now => SendOutcome::Sent,
            Sent::Queued => SendOutcome::QueuedForArp,
            Sent::Dropped => SendOutcome::DroppedByArp,
            Sent::RingFull => SendOutcome::RingFull,
        })
    }

    /// As kthread `k`, unbinds `s` and gives back what it holds.
    pub fn close(&self, k: usize, s: Socket) {
        let mut me = self.tx_side(k);
        self.stack.close(&s.0, |b| self.stack.give_back(&mut me, b));
    }

    /// Kthread `k`'s transmit side. Callers hold one at a time (each call
    /// of the harness takes one and drops it before returning).
    fn tx_side(&self, k: usize) -> TxSide<'_> {
        // SAFETY: `Harness` is !Sync and none of its calls re-enters: this
        // thread is the only user of kthread `k`'s transmit side, through
        // this one value.
        unsafe { TxSide::new(&self.knets[k]) }
    }

    pub fn stats(&self) -> NetStats {
        self.stack.stats(self.knets.iter().enumerate())
    }
}
