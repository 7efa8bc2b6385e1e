//! The channel between one protected application and the netstack
//! (docs/protected.md, "Rings"): a sealed memfd that the netstack creates
//! and passes to the application at attach (and that iokerneld maps to
//! see pending work, docs/protected.md "Wake-ups").
//!
//! ```text
//! 0                     ChannelHeader (64 bytes)
//! 64                    PairLine × pairs            (64 bytes each)
//! commands_offset       ring of Slot × pairs        application → netstack
//! events_offset         ring of Slot × pairs        netstack → application
//! size                  (a multiple of the page size)
//! ```
//!
//! The header holds only `pairs` and `capacity`; every offset is computed
//! from them, so a peer that rewrites the header can change nothing for a
//! side that has validated its own copy. Rings never drop: a full ring is
//! back-pressure (the producer keeps the message and retries) and counted
//! in the [`PairLine`].

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use ginza_sys::memfd::{self, Seals};

use super::Slot;
use crate::ring::{self, capacity_ok, ring_bytes, Consumer, Keep, Producer, CACHE_LINE};

/// `b"GINZANET"` read as a little-endian `u64`.
pub const CHANNEL_MAGIC: u64 = u64::from_le_bytes(*b"GINZANET");
/// The channel layout this code speaks.
pub const CHANNEL_VERSION: u32 = 1;
/// Most ring pairs (network kthreads) a channel has.
pub const MAX_PAIRS: u32 = 64;
/// Most slots in one ring.
pub const MAX_RING_SLOTS: u32 = 4096;

const PAGE: u64 = 4096;
const HEADER_BYTES: u64 = 64;
const LINE_BYTES: u64 = 64;

/// The header at offset 0. Integers only: any bytes are a header, which
/// [`ChannelHeader::validate`] judges.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelHeader {
    pub magic: u64,
    pub version: u32,
    pub pairs: u32,
    pub capacity: u32,
    pub reserved: u32,
    pub size: u64,
}

const _: () = assert!(std::mem::size_of::<ChannelHeader>() == HEADER_BYTES as usize);

/// How many ring pairs and how many slots per ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// One per network kthread of the netstack.
    pub pairs: u32,
    /// Slots per ring (a power of two, at most [`MAX_RING_SLOTS`]).
    pub capacity: u32,
}

impl ChannelConfig {
    pub fn new(pairs: u32) -> ChannelConfig {
        ChannelConfig {
            pairs,
            capacity: 256,
        }
    }

    fn ring_stride(&self) -> u64 {
        // Checked by `check` before any use.
        ring_bytes::<Slot>(self.capacity).unwrap_or(0) as u64
    }

    fn check(&self) -> Result<(), ChannelError> {
        if self.pairs == 0 || self.pairs > MAX_PAIRS {
            return Err(ChannelError::Pairs(self.pairs));
        }
        if !capacity_ok(self.capacity) || self.capacity > MAX_RING_SLOTS {
            return Err(ChannelError::Capacity(self.capacity));
        }
        Ok(())
    }

    fn lines_offset(&self) -> u64 {
        HEADER_BYTES
    }

    fn commands_offset(&self) -> u64 {
        (HEADER_BYTES + LINE_BYTES * u64::from(self.pairs)).next_multiple_of(CACHE_LINE as u64)
    }

    fn events_offset(&self) -> u64 {
        self.commands_offset() + self.ring_stride() * u64::from(self.pairs)
    }

    /// Bytes of the whole channel (whole pages).
    pub fn size(&self) -> u64 {
        (self.events_offset() + self.ring_stride() * u64::from(self.pairs)).next_multiple_of(PAGE)
    }

    fn header(&self) -> ChannelHeader {
        ChannelHeader {
            magic: CHANNEL_MAGIC,
            version: CHANNEL_VERSION,
            pairs: self.pairs,
            capacity: self.capacity,
            reserved: 0,
            size: self.size(),
        }
    }
}

impl ChannelHeader {
    /// The configuration this header describes, if it is one this side
    /// accepts for a memfd of `mapped_len` bytes.
    pub fn validate(&self, mapped_len: u64) -> Result<ChannelConfig, ChannelError> {
        if self.magic != CHANNEL_MAGIC {
            return Err(ChannelError::Magic(self.magic));
        }
        if self.version != CHANNEL_VERSION {
            return Err(ChannelError::Version(self.version));
        }
        let cfg = ChannelConfig {
            pairs: self.pairs,
            capacity: self.capacity,
        };
        cfg.check()?;
        if self.size != cfg.size() || mapped_len != cfg.size() {
            return Err(ChannelError::Size {
                header: self.size,
                memfd: mapped_len,
                expected: cfg.size(),
            });
        }
        Ok(cfg)
    }
}

/// Why a channel could not be created, attached or used.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("channel of {0} ring pairs: must be 1..={MAX_PAIRS}")]
    Pairs(u32),
    #[error("channel ring capacity {0}: must be a power of two in 2..={MAX_RING_SLOTS}")]
    Capacity(u32),
    #[error("channel refused: bad magic {0:#018x}")]
    Magic(u64),
    #[error("channel refused: layout version {0}, this side speaks {CHANNEL_VERSION}")]
    Version(u32),
    #[error(
        "channel refused: header says {header} bytes, memfd is {memfd}, layout needs {expected}"
    )]
    Size {
        header: u64,
        memfd: u64,
        expected: u64,
    },
    #[error("channel refused: memfd not sealed against resizing (seals {0:#x})")]
    NotSealed(u32),
    #[error("ring pair {pair} does not exist (the channel has {pairs})")]
    NoSuchPair { pair: u32, pairs: u32 },
    #[error("the {side} end of ring pair {pair} is already taken")]
    Taken { pair: u32, side: &'static str },
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> ChannelError {
    move |source| ChannelError::Io { op, source }
}

/// Per ring pair, one cache line both sides write: wake-up flags and
/// back-pressure counters (docs/protected.md, "Wake-ups"). Atomics only,
/// so any bytes are a valid line; what a peer writes here is a hint, never
/// trusted for memory safety.
#[repr(C, align(64))]
pub struct PairLine {
    /// The application side of this pair waits for events (set before it
    /// parks, after a last look at the event ring).
    app_waiting: AtomicU32,
    /// The netstack kthread of this pair waits for commands.
    net_waiting: AtomicU32,
    /// Times the application found the command ring full.
    command_ring_full: AtomicU64,
    /// Times the netstack found the event ring full.
    event_ring_full: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<PairLine>() == LINE_BYTES as usize);

impl PairLine {
    pub fn set_app_waiting(&self, waiting: bool) {
        self.app_waiting.store(u32::from(waiting), Ordering::SeqCst);
    }

    pub fn app_waiting(&self) -> bool {
        self.app_waiting.load(Ordering::SeqCst) != 0
    }

    pub fn set_net_waiting(&self, waiting: bool) {
        self.net_waiting.store(u32::from(waiting), Ordering::SeqCst);
    }

    pub fn net_waiting(&self) -> bool {
        self.net_waiting.load(Ordering::SeqCst) != 0
    }

    pub fn count_command_ring_full(&self) {
        self.command_ring_full.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_event_ring_full(&self) {
        self.event_ring_full.fetch_add(1, Ordering::Relaxed);
    }

    /// (command ring full, event ring full) counts as written by the
    /// peers (untrusted: for stats only).
    pub fn full_counts(&self) -> (u64, u64) {
        (
            self.command_ring_full.load(Ordering::Relaxed),
            self.event_ring_full.load(Ordering::Relaxed),
        )
    }
}

struct Mapping {
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `memfd::map` with this length; every handle into
        // it keeps the `Inner` that owns us alive.
        unsafe { memfd::unmap(self.base, self.len) };
    }
}

struct Inner {
    map: Mapping,
    cfg: ChannelConfig,
    taken: Box<[AtomicU8]>,
}

// SAFETY: the mapping is reached only through atomics (pair lines, ring
// indices) and through ring handles unique per ring end.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

const TAKEN_APP: u8 = 1;
const TAKEN_NET: u8 = 2;

/// A mapped channel with a trusted configuration. Cheap to clone.
#[derive(Clone)]
pub struct Channel(Arc<Inner>);

/// The application's end of one ring pair.
pub struct AppPair {
    pub commands: Producer<Slot>,
    pub events: Consumer<Slot>,
    pub line: LineHandle,
}

/// The netstack's end of one ring pair.
pub struct NetPair {
    pub commands: Consumer<Slot>,
    pub events: Producer<Slot>,
    pub line: LineHandle,
}

/// A pair's [`PairLine`], keeping the channel mapped.
#[derive(Clone)]
pub struct LineHandle {
    channel: Channel,
    pair: u32,
}

impl std::ops::Deref for LineHandle {
    type Target = PairLine;
    fn deref(&self) -> &PairLine {
        self.channel.line(self.pair)
    }
}

impl Channel {
    /// Netstack side: a new sealed memfd channel, initialized.
    pub fn create(name: &str, cfg: &ChannelConfig) -> Result<Channel, ChannelError> {
        cfg.check()?;
        let len = cfg.size();
        let fd = memfd::create(name, len).map_err(io_err("memfd_create"))?;
        memfd::add_seals(fd.as_fd(), memfd::SIZE_SEALS).map_err(io_err("F_ADD_SEALS"))?;
        let base = memfd::map(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        let map = Mapping {
            base,
            len: len as usize,
            fd,
        };
        // SAFETY: a fresh zeroed mapping of `cfg.size()` bytes, page-aligned,
        // used by nobody else yet; every offset below is inside it.
        unsafe {
            base.cast::<ChannelHeader>().as_ptr().write(cfg.header());
            for p in 0..cfg.pairs {
                ring::init_ring::<Slot>(
                    base.add(ring_offset(cfg, cfg.commands_offset(), p) as usize),
                    cfg.capacity,
                );
                ring::init_ring::<Slot>(
                    base.add(ring_offset(cfg, cfg.events_offset(), p) as usize),
                    cfg.capacity,
                );
            }
        }
        Ok(Channel::new(map, *cfg))
    }

    /// Application (or iokerneld) side: maps a channel received from the
    /// netstack after checking its seals, size and header.
    pub fn attach(fd: OwnedFd) -> Result<Channel, ChannelError> {
        let seals = memfd::seals(fd.as_fd()).map_err(io_err("F_GET_SEALS"))?;
        if !seals.contains(Seals::SHRINK | Seals::GROW) {
            return Err(ChannelError::NotSealed(seals.bits()));
        }
        let len = memfd::size(fd.as_fd()).map_err(io_err("fstat"))?;
        let max = ChannelConfig {
            pairs: MAX_PAIRS,
            capacity: MAX_RING_SLOTS,
        }
        .size();
        if !(PAGE..=max).contains(&len) {
            return Err(ChannelError::Size {
                header: 0,
                memfd: len,
                expected: 0,
            });
        }
        let base = memfd::map(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        let map = Mapping {
            base,
            len: len as usize,
            fd,
        };
        // SAFETY: the mapping is at least a page; the header is integers
        // only. One volatile copy, judged below and never re-read.
        let header = unsafe { std::ptr::read_volatile(base.as_ptr().cast::<ChannelHeader>()) };
        let cfg = header.validate(len)?;
        Ok(Channel::new(map, cfg))
    }

    fn new(map: Mapping, cfg: ChannelConfig) -> Channel {
        let taken = (0..cfg.pairs).map(|_| AtomicU8::new(0)).collect();
        Channel(Arc::new(Inner { map, cfg, taken }))
    }

    pub fn config(&self) -> ChannelConfig {
        self.0.cfg
    }

    pub fn pairs(&self) -> u32 {
        self.0.cfg.pairs
    }

    /// The memfd, to pass to the application (and to iokerneld).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.map.fd.as_fd()
    }

    fn check_pair(&self, pair: u32) -> Result<(), ChannelError> {
        if pair < self.pairs() {
            Ok(())
        } else {
            Err(ChannelError::NoSuchPair {
                pair,
                pairs: self.pairs(),
            })
        }
    }

    fn at(&self, offset: u64) -> NonNull<u8> {
        debug_assert!(offset < self.0.map.len as u64);
        // SAFETY: every offset passed here is computed from the validated
        // configuration for an existing pair, so it lies inside the mapping.
        unsafe { self.0.map.base.add(offset as usize) }
    }

    fn line(&self, pair: u32) -> &PairLine {
        let off = self.0.cfg.lines_offset() + LINE_BYTES * u64::from(pair);
        // SAFETY: inside the mapping (pair checked by every caller), 64-byte
        // aligned; a `PairLine` is atomics only, valid for any bytes.
        unsafe { self.at(off).cast::<PairLine>().as_ref() }
    }

    fn take(&self, pair: u32, bit: u8, side: &'static str) -> Result<(), ChannelError> {
        self.check_pair(pair)?;
        if self.0.taken[pair as usize].fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(ChannelError::Taken { pair, side });
        }
        Ok(())
    }

    fn keep(&self) -> Keep {
        self.0.clone()
    }

    fn rings(&self, pair: u32) -> (NonNull<u8>, NonNull<u8>) {
        let cfg = &self.0.cfg;
        (
            self.at(ring_offset(cfg, cfg.commands_offset(), pair)),
            self.at(ring_offset(cfg, cfg.events_offset(), pair)),
        )
    }

    /// The application's end of ring pair `pair` (once per channel mapping).
    pub fn app_pair(&self, pair: u32) -> Result<AppPair, ChannelError> {
        self.take(pair, TAKEN_APP, "application")?;
        let (cmd, ev) = self.rings(pair);
        let cap = self.0.cfg.capacity;
        // SAFETY: validated ring locations (aligned, inside the mapping,
        // sized for `cap`); initialized by the creator, or if the peer lied
        // still plain memory the handles read only through atomics and
        // masked slots; kept alive by `keep`; this end is taken once.
        let (commands, events) = unsafe {
            (
                Producer::attach(cmd, cap, self.keep()),
                Consumer::attach(ev, cap, self.keep()),
            )
        };
        Ok(AppPair {
            commands,
            events,
            line: LineHandle {
                channel: self.clone(),
                pair,
            },
        })
    }

    /// The netstack's end of ring pair `pair` (once per channel mapping).
    pub fn net_pair(&self, pair: u32) -> Result<NetPair, ChannelError> {
        self.take(pair, TAKEN_NET, "netstack")?;
        let (cmd, ev) = self.rings(pair);
        let cap = self.0.cfg.capacity;
        // SAFETY: as in `app_pair`.
        let (commands, events) = unsafe {
            (
                Consumer::attach(cmd, cap, self.keep()),
                Producer::attach(ev, cap, self.keep()),
            )
        };
        Ok(NetPair {
            commands,
            events,
            line: LineHandle {
                channel: self.clone(),
                pair,
            },
        })
    }

    /// Pair `pair`'s line, without taking an end (iokerneld, stats).
    pub fn line_handle(&self, pair: u32) -> Result<LineHandle, ChannelError> {
        self.check_pair(pair)?;
        Ok(LineHandle {
            channel: self.clone(),
            pair,
        })
    }

    /// Messages waiting on pair `pair`'s (command ring, event ring) as an
    /// observer sees them now, each clamped to the capacity (the indices
    /// are the peers' and untrusted). iokerneld's congestion detection
    /// reads this (docs/protected.md, "Wake-ups").
    pub fn pending(&self, pair: u32) -> Result<(u32, u32), ChannelError> {
        self.check_pair(pair)?;
        let cap = self.0.cfg.capacity;
        let (cmd, ev) = self.rings(pair);
        let waiting = |base| {
            // SAFETY: a ring header inside the mapping, kept alive by self.
            let (head, tail) = unsafe { ring::indices_at(base) };
            tail.wrapping_sub(head).min(cap)
        };
        Ok((waiting(cmd), waiting(ev)))
    }

    /// Pair `pair`'s (command ring, event ring) indices as an observer
    /// sees them now, each as (head, tail) with the tail at most
    /// `capacity` ahead of the head (the indices are the peers' and
    /// untrusted: a forged distance is clamped, never followed).
    pub fn indices(&self, pair: u32) -> Result<[(u32, u32); 2], ChannelError> {
        self.check_pair(pair)?;
        let cap = self.0.cfg.capacity;
        let (cmd, ev) = self.rings(pair);
        let read = |base| {
            // SAFETY: a ring header inside the mapping, kept alive by self.
            let (head, tail) = unsafe { ring::indices_at(base) };
            let n = tail.wrapping_sub(head).min(cap);
            (tail.wrapping_sub(n), tail)
        };
        Ok([read(cmd), read(ev)])
    }

    /// Pointer to the header, for tests that corrupt it.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn header_ptr(&self) -> *mut ChannelHeader {
        self.0.map.base.as_ptr().cast()
    }
}

fn ring_offset(cfg: &ChannelConfig, area: u64, pair: u32) -> u64 {
    area + cfg.ring_stride() * u64::from(pair)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::PushError;

    fn slot(v: u32) -> Slot {
        let mut s = Slot::default();
        s.words[0] = v;
        s.words[15] = !v;
        s
    }

    #[test]
    fn layout_is_aligned_and_bounded() {
        for pairs in [1, 2, 7, MAX_PAIRS] {
            for capacity in [2, 64, MAX_RING_SLOTS] {
                let c = ChannelConfig { pairs, capacity };
                c.check().unwrap();
                assert_eq!(c.commands_offset() % 64, 0);
                assert_eq!(c.events_offset() % 64, 0);
                assert_eq!(c.size() % PAGE, 0);
                assert!(
                    ring_offset(&c, c.events_offset(), pairs - 1) + c.ring_stride() <= c.size()
                );
                assert!(c.header().validate(c.size()).is_ok());
            }
        }
        assert!(matches!(
            ChannelConfig::new(0).check(),
            Err(ChannelError::Pairs(0))
        ));
        let c = ChannelConfig {
            pairs: 1,
            capacity: 3,
        };
        assert!(matches!(c.check(), Err(ChannelError::Capacity(3))));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd")]
    fn commands_and_events_cross_processes_mappings() {
        let net = Channel::create(
            "test-chan",
            &ChannelConfig {
                pairs: 2,
                capacity: 4,
            },
        )
        .unwrap();
        let app = Channel::attach(net.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(app.config(), net.config());
        let mut a = app.app_pair(1).unwrap();
        let mut n = net.net_pair(1).unwrap();
        assert!(matches!(
            app.app_pair(1),
            Err(ChannelError::Taken { pair: 1, .. })
        ));
        assert!(matches!(
            app.app_pair(2),
            Err(ChannelError::NoSuchPair { pair: 2, pairs: 2 })
        ));
        for i in 0..4 {
            a.commands.push(slot(i)).unwrap();
        }
        // Full: back-pressure, the message comes back.
        assert_eq!(a.commands.push(slot(9)), Err(PushError::Full(slot(9))));
        a.line.count_command_ring_full();
        assert_eq!(net.pending(1).unwrap(), (4, 0));
        assert_eq!(net.pending(0).unwrap(), (0, 0));
        for i in 0..4 {
            assert_eq!(n.commands.pop().unwrap(), Some(slot(i)));
        }
        n.events.push(slot(77)).unwrap();
        assert_eq!(app.pending(1).unwrap(), (0, 1));
        assert_eq!(a.events.pop().unwrap(), Some(slot(77)));
        a.line.set_app_waiting(true);
        assert!(n.line.app_waiting());
        assert_eq!(n.line.full_counts(), (1, 0));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd")]
    fn attach_refuses_bad_channels() {
        let net = Channel::create("test-chan", &ChannelConfig::new(1)).unwrap();
        let attach = || Channel::attach(net.fd().try_clone_to_owned().unwrap());
        // SAFETY: plain integers; no concurrent reader.
        unsafe { (*net.header_ptr()).version = 7 };
        assert_eq!(
            attach().err().unwrap().to_string(),
            "channel refused: layout version 7, this side speaks 1"
        );
        // SAFETY: as above.
        unsafe {
            (*net.header_ptr()).version = CHANNEL_VERSION;
            (*net.header_ptr()).pairs = 2;
        }
        assert!(matches!(attach(), Err(ChannelError::Size { .. })));
        // SAFETY: as above.
        unsafe {
            (*net.header_ptr()).pairs = 1;
            (*net.header_ptr()).magic = 5;
        }
        assert!(matches!(attach(), Err(ChannelError::Magic(5))));
        let fd = memfd::create("unsealed", 8192).unwrap();
        assert!(matches!(
            Channel::attach(fd),
            Err(ChannelError::NotSealed(_))
        ));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd")]
    fn forged_indices_are_clamped_for_observers() {
        let net = Channel::create(
            "test-chan",
            &ChannelConfig {
                pairs: 1,
                capacity: 8,
            },
        )
        .unwrap();
        let (cmd, _) = net.rings(0);
        // SAFETY: the ring lives as long as `net`.
        unsafe { ring::header_at(cmd) }.store_tail(1_000_000);
        assert_eq!(net.pending(0).unwrap(), (8, 0));
        let mut n = net.net_pair(0).unwrap();
        assert!(n.commands.pop().is_err());
    }
}
