//! The direct path in the runtime (docs/direct-path.md): the application's
//! own AF_XDP socket, bound to a receive queue of iokerneld's interface,
//! its UMEM in this process's private memory. iokerneld's XDP program
//! redirects the application's frames on that queue straight here (no
//! copy into iokerneld's rings), and frames the application sends leave
//! from here, not through iokerneld.
//!
//! * The receive side (rx and fill rings) and the transmit side (tx and
//!   completion rings) each have their lock: a frame received may be
//!   answered (ARP, ICMP, a datagram) while its batch is processed.
//! * A received frame's chunk stays the application's until it is given
//!   back ([`OwnSocket::give_back`]: a UDP socket's queue may hold it, as
//!   it holds an ingress buffer), then goes to the fill ring.
//! * Half the chunks receive, half transmit. Copy mode sends only inside
//!   a system call (the kernel takes at most 32 frames per call), so the
//!   tx ring is kicked once per burst, as iokerneld kicks once per pass:
//!   [`OwnSocket::flush`] when the kthread's scheduler regains control
//!   (its runqueue drained, a worker's request done) and after each
//!   receive batch, and at once every [`KICK_BATCH`] frames or when a
//!   transmission finds no room (`DirectPathConfig::kick_per_frame` kicks
//!   every frame, for comparison).
//! * [`OwnSocket::retire`] closes the socket and unmaps its rings when the
//!   runtime stops, whoever still holds the `OwnSocket`: a uthread left
//!   blocked at the end (an acceptor in `accept`) keeps the runtime's
//!   memory, and so this, alive, and a socket left open keeps its queue
//!   bound (`EBUSY` for the next application; docs/direct-path.md).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{AcqRel, Relaxed},
};

use ginza_sys::hops::{self, Hop};
use ginza_sys::xsk::{self, BindMode, Desc, Rings, Umem, UmemOwner, Xsk};

use crate::config::DirectPathConfig;
use crate::spinlock::SpinLock;

/// Entries per ring; the UMEM holds twice as many chunks.
const RING_SIZE: u32 = 512;
const CHUNK_SIZE: usize = 2048;

/// A buffer index naming a chunk of the own socket's UMEM rather than a
/// buffer of iokerneld's ingress pool (the pool has far fewer).
pub(crate) const OWN_CHUNK: u32 = 1 << 31;

/// Frames one receive batch takes at most.
pub(crate) const RX_BATCH: usize = 32;

/// Frames queued on the tx ring before a transmission kicks at once: the
/// kernel's copy-mode batch (it sends at most 32 frames per `sendto`).
const KICK_BATCH: u32 = 32;

struct RxSide {
    rx: xsk::Ring<Desc>,
    fill: xsk::Ring<u64>,
    /// Chunks given back that the fill ring had no room for yet.
    backlog: Vec<u64>,
}

struct TxSide {
    /// Kicked under this lock.
    socket: OwnedFd,
    tx: xsk::Ring<Desc>,
    completion: xsk::Ring<u64>,
    /// Chunks free for transmission.
    free: Vec<u64>,
}

/// Counters of the own socket.
#[derive(Default)]
pub(crate) struct OwnCounters {
    pub(crate) rx_frames: AtomicU64,
    pub(crate) tx_frames: AtomicU64,
    /// Transmissions refused: no chunk or no tx ring slot free.
    pub(crate) tx_full: AtomicU64,
    /// `sendto`s on the tx ring.
    pub(crate) tx_kicks: AtomicU64,
}

/// The application's own AF_XDP socket. Its rings and the socket itself
/// are gone (`None`) once [`retired`](OwnSocket::retire).
pub(crate) struct OwnSocket {
    rx: SpinLock<Option<RxSide>>,
    tx: SpinLock<Option<TxSide>>,
    umem: Umem,
    /// Frames put on the tx ring since the last kick.
    unkicked: AtomicU32,
    kick_per_frame: bool,
    pub(crate) counters: OwnCounters,
}

/// Why a frame was not sent on the own socket.
pub(crate) enum OwnTxFail<E> {
    Full,
    Build(E),
}

impl OwnSocket {
    /// Opens the socket `cfg` names, every receive chunk lent to the
    /// kernel. Not yet steered to: iokerneld puts it in its maps when the
    /// runtime hands it over.
    pub(crate) fn open(cfg: &DirectPathConfig) -> Result<OwnSocket, String> {
        let err = |what: &str, e: &dyn std::fmt::Display| {
            format!(
                "direct path on {} queue {}: {what}: {e}",
                cfg.interface, cfg.queue
            )
        };
        let ifindex = interface_index(&cfg.interface).map_err(|e| err("interface", &e))?;
        let umem =
            Umem::private(2 * RING_SIZE as usize, CHUNK_SIZE).map_err(|e| err("UMEM", &e))?;
        let xsk = Xsk::open(
            ifindex,
            cfg.queue,
            umem,
            UmemOwner::Own,
            RING_SIZE,
            BindMode::Copy,
        )
        .map_err(|e| err("AF_XDP socket", &e))?;
        let (socket, rings, umem) = xsk.into_parts();
        let Rings {
            mut fill,
            completion,
            rx,
            tx,
        } = rings;
        let lent = fill.produce((0..RING_SIZE as usize).map(|c| umem.chunk_addr(c)));
        debug_assert_eq!(lent, RING_SIZE as usize);
        let free = (RING_SIZE as usize..2 * RING_SIZE as usize)
            .map(|c| umem.chunk_addr(c))
            .collect();
        Ok(OwnSocket {
            rx: SpinLock::new(Some(RxSide {
                rx,
                fill,
                backlog: Vec::new(),
            })),
            tx: SpinLock::new(Some(TxSide {
                socket,
                tx,
                completion,
                free,
            })),
            umem,
            unkicked: AtomicU32::new(0),
            kick_per_frame: cfg.kick_per_frame,
            counters: OwnCounters::default(),
        })
    }

    /// Runs `f` on the socket (to hand it to iokerneld); `None` once
    /// retired.
    pub(crate) fn with_fd<R>(&self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
        self.tx.lock().as_ref().map(|side| f(side.socket.as_fd()))
    }

    /// Closes the socket and unmaps its rings, so the kernel frees its
    /// queue for another socket, even while something still holds this
    /// `OwnSocket` (frames received stay readable: the UMEM stays). For
    /// the runtime's stop, once no kthread runs: nothing is received or
    /// sent after it, and what waited on the tx ring unkicked is dropped.
    pub(crate) fn retire(&self) {
        drop(self.rx.lock().take());
        drop(self.tx.lock().take());
    }

    /// Whether frames wait on the rx ring (a look before parking).
    pub(crate) fn rx_pending(&self) -> bool {
        match self.rx.try_lock() {
            Some(side) => side.as_ref().is_some_and(|s| s.rx.available() > 0),
            None => true,
        }
    }

    /// Takes up to `out.len()` received frames off the rx ring (nothing if
    /// another kthread is taking them now); each is the application's
    /// until [`give_back`](Self::give_back).
    pub(crate) fn take_received(&self, out: &mut [Desc]) -> usize {
        let Some(mut guard) = self.rx.try_lock() else {
            return 0;
        };
        let Some(side) = guard.as_mut() else {
            return 0;
        };
        if !side.backlog.is_empty() {
            let RxSide { fill, backlog, .. } = side;
            let returned = fill.produce(backlog.iter().copied());
            backlog.drain(..returned);
        }
        let mut n = 0;
        side.rx.consume(out.len(), |d| {
            out[n] = d;
            n += 1;
        });
        self.counters
            .rx_frames
            .store(self.counters.rx_frames.load(Relaxed) + n as u64, Relaxed);
        n
    }

    /// The bytes of a frame [`take_received`](Self::take_received) gave,
    /// and the buffer index ([`OWN_CHUNK`] | chunk) and offset in it that
    /// name it; `None` for a descriptor outside the UMEM (the kernel's
    /// never is).
    pub(crate) fn frame(&self, d: &Desc) -> Option<(&[u8], u32, u16)> {
        let bytes = self.umem.bytes(d.addr, d.len)?;
        let chunk = self.umem.chunk_of(d.addr);
        let index = u32::try_from(chunk / CHUNK_SIZE as u64).ok()?;
        Some((bytes, OWN_CHUNK | index, (d.addr - chunk) as u16))
    }

    /// The bytes `off..off + len` of chunk `buf` (an [`OWN_CHUNK`] index)
    /// the application holds.
    pub(crate) fn held_bytes(&self, buf: u32, off: u16, len: u16) -> Option<&[u8]> {
        let chunk = self.umem.chunk_addr((buf & !OWN_CHUNK) as usize);
        self.umem.bytes(chunk + u64::from(off), u32::from(len))
    }

    /// Lends chunk `buf` (an [`OWN_CHUNK`] index) to the kernel again.
    pub(crate) fn give_back(&self, buf: u32) {
        let chunk = self.umem.chunk_addr((buf & !OWN_CHUNK) as usize);
        let mut guard = self.rx.lock();
        let Some(side) = guard.as_mut() else {
            return;
        };
        if !side.backlog.is_empty() || side.fill.produce(std::iter::once(chunk)) == 0 {
            side.backlog.push(chunk);
        }
    }

    /// Builds a frame in a free chunk and puts it on the tx ring; it
    /// leaves at the next kick ([`flush`](Self::flush), or at once every
    /// [`KICK_BATCH`] frames).
    pub(crate) fn transmit<E>(
        &self,
        build: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<(), OwnTxFail<E>> {
        let mut guard = self.tx.lock();
        let Some(side) = guard.as_mut() else {
            return Err(OwnTxFail::Full);
        };
        let mut chunk = self.reserve(side);
        if chunk.is_none() && self.unkicked.load(Relaxed) > 0 {
            // No room until the kernel sends what waits (copy mode
            // completes frames inside the kick).
            self.kick(side);
            chunk = self.reserve(side);
        }
        let Some(chunk) = chunk else {
            bump(&self.counters.tx_full);
            return Err(OwnTxFail::Full);
        };
        // SAFETY: `chunk` came off the free list under the tx lock: it is on
        // no ring and nothing else refers to it.
        let buffer = unsafe { self.umem.bytes_unshared(chunk, CHUNK_SIZE as u32) }
            .expect("a chunk of the UMEM");
        let len = match build(buffer) {
            Ok(len) => len,
            Err(e) => {
                side.free.push(chunk);
                return Err(OwnTxFail::Build(e));
            }
        };
        let desc = Desc {
            addr: chunk,
            len: len as u32,
            options: 0,
        };
        let pushed = side.tx.produce(std::iter::once(desc));
        debug_assert_eq!(pushed, 1);
        bump(&self.counters.tx_frames);
        let queued = self.unkicked.fetch_add(1, AcqRel) + 1;
        if self.kick_per_frame || queued >= KICK_BATCH {
            self.kick(side);
        }
        Ok(())
    }

    /// A free chunk with a tx ring slot for it (completed chunks reclaimed
    /// first), or `None`.
    fn reserve(&self, side: &mut TxSide) -> Option<u64> {
        let TxSide {
            tx,
            completion,
            free,
            ..
        } = side;
        completion.consume(usize::MAX, |addr| free.push(self.umem.chunk_of(addr)));
        if tx.free_slots() == 0 {
            return None;
        }
        free.pop()
    }

    /// Kicks the tx ring if frames were put there since the last kick: the
    /// end of a burst.
    pub(crate) fn flush(&self) {
        if self.unkicked.load(Relaxed) == 0 {
            return;
        }
        if let Some(side) = self.tx.lock().as_mut() {
            self.kick(side);
        }
    }

    /// Makes the kernel send what waits on the tx ring: copy mode sends
    /// only inside `sendto`, at most 32 frames a call, so it is repeated
    /// while that makes progress. "Busy" and "no buffers" leave the frames
    /// on the ring for the next kick.
    fn kick(&self, side: &mut TxSide) {
        self.unkicked.store(0, Relaxed);
        for _ in 0..RING_SIZE / KICK_BATCH {
            let pending = side.tx.pending();
            if pending == 0 {
                return;
            }
            bump(&self.counters.tx_kicks);
            hops::stamp(Hop::Kick);
            let kicked = xsk::kick(side.socket.as_fd());
            hops::stamp(Hop::Kicked);
            let Err(e) = kicked else {
                return;
            };
            match e.raw_os_error() {
                Some(libc::EAGAIN) if side.tx.pending() < pending => continue,
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => {}
                _ => log::warn!("direct path: kicking the tx ring: {e}"),
            }
            return;
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// The index of network interface `name`.
fn interface_index(name: &str) -> io::Result<u32> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))?;
    text.trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("ifindex: {e}")))
}
