//! The shared region of one runtime: a sealed memfd that starts with a
//! [`Header`], followed by one [`QueueLine`] per kthread, two command rings
//! per kthread (kthread → iokerneld, iokerneld → kthread), and the packet
//! rings and egress buffers of each kthread (see [`crate::packet`]).
//!
//! ```text
//! 0              Header (256 bytes)
//! lines_offset   QueueLine × n_kthreads            (64 bytes each)
//! up_offset      ring of RawMsg × n_kthreads        (up_stride bytes each)
//! down_offset    ring of RawMsg × n_kthreads        (down_stride bytes each)
//! in_offset      ring of PacketDesc × n_kthreads    ingress: iokerneld → kthread
//! done_offset    ring of u32 × n_kthreads           ingress buffers given back
//! out_offset     ring of PacketDesc × n_kthreads    egress: kthread → iokerneld
//! egress_offset  out_capacity buffers × n_kthreads  egress buffers (slot i ↔ buffer i)
//! latency_offset LatencyHistogram × n_kthreads      request latency (runtime → iokerneld)
//! region_size    (a multiple of the page size)
//! ```
//!
//! Ingress buffers are not here: iokerneld owns them in a pool of its own
//! that the runtime maps read-only ([`crate::packet::IngressPool`]).
//!
//! The runtime creates the region ([`Region::create`]) and passes the memfd
//! to iokerneld, which maps it ([`Region::attach`]). iokerneld reads the
//! header once, into its own memory, validates that copy
//! ([`Header::validate`]) against the size it mapped, and from then on uses
//! only the resulting [`Layout`]: the runtime may scribble over the header
//! afterwards without effect. The memfd must be sealed against shrinking, so
//! the mapping can never become shorter than the layout says.
//!
//! The layout and its validation are pure arithmetic and live in the
//! `layout` submodule, which forbids `unsafe`; this module keeps the
//! mapping and the pointers into it.

use std::alloc;
use std::io;
use std::ops::Deref;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::msg::{CmdRx, CmdTx, RawMsg, ToIokernel, ToKthread};
use crate::packet::{EgressBuffers, PacketDesc};
use crate::queue_line::QueueLine;
use crate::request_latency::LatencyHistogram;
use crate::ring::{self, Consumer, Keep, Producer};
use ginza_sys::memfd::{self, Seals};

mod layout;

use layout::{overflow, HEADER_SIZE};
pub use layout::{
    Area, Header, HeaderError, Layout, RegionConfig, RingArea, LAYOUT_VERSION, MAGIC, MAX_KTHREADS,
    MAX_REGION_SIZE, PAGE_SIZE,
};

/// Why a region could not be created, attached or used.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("shared region refused: {0}")]
    Header(#[from] HeaderError),
    #[error("shared region refused: memfd not sealed against shrinking (seals {0:#x}); it could be truncated under iokerneld")]
    NotSealed(i32),
    #[error("shared region refused: memfd is {len} bytes, more than the {max}-byte limit")]
    TooLarge { len: u64, max: u64 },
    #[error("kthread {k} does not exist (the region has {n})")]
    NoSuchKthread { k: u32, n: u32 },
    #[error("the {side} end of kthread {k} is already taken")]
    Taken { k: u32, side: &'static str },
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> RegionError {
    move |source| RegionError::Io { op, source }
}

enum Backing {
    Memfd(OwnedFd),
    Heap(alloc::Layout),
}

/// Memory holding a region.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
    backing: Backing,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: mapped by `memfd::map` with this length; every reference
            // into it is held through `Region`, which keeps us alive.
            Backing::Memfd(_) => unsafe { memfd::unmap(self.base, self.len) },
            // SAFETY: allocated by `alloc_zeroed` with this layout; as above.
            Backing::Heap(l) => unsafe { alloc::dealloc(self.base.as_ptr(), *l) },
        }
    }
}

const TAKEN_RUNTIME: u8 = 1;
const TAKEN_IOKERNEL: u8 = 2;

struct Inner {
    map: Mapping,
    layout: Layout,
    taken: Box<[AtomicU8]>,
}

// SAFETY: the mapping is reached only through atomics (queue lines, ring
// indices) and through ring handles that are unique per ring end.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

/// A mapped region with a trusted [`Layout`]. Cheap to clone; the mapping
/// lives as long as any clone, line or ring handle.
#[derive(Clone)]
pub struct Region(Arc<Inner>);

/// The runtime's end of one kthread's shared state.
pub struct RuntimeEnd {
    pub line: LineRef,
    /// The kthread's request-latency histogram (it alone writes it).
    pub latency: LatencyRef,
    pub to_iokernel: CmdTx<ToIokernel>,
    pub from_iokernel: CmdRx<ToKthread>,
    /// Received packets (descriptors of ingress-pool buffers).
    pub ingress: Consumer<PacketDesc>,
    /// Ingress buffers given back.
    pub done: Producer<u32>,
    /// Packets to send; descriptor `i` (sequence number) is in egress
    /// buffer `i % capacity`.
    pub egress: Producer<PacketDesc>,
    pub egress_buffers: EgressBuffers,
}

/// iokerneld's end of one kthread's shared state.
pub struct IokernelEnd {
    pub line: LineRef,
    /// The kthread's request-latency histogram (read, untrusted).
    pub latency: LatencyRef,
    pub from_kthread: CmdRx<ToIokernel>,
    pub to_kthread: CmdTx<ToKthread>,
    pub ingress: Producer<PacketDesc>,
    pub done: Consumer<u32>,
    pub egress: Consumer<PacketDesc>,
    pub egress_buffers: EgressBuffers,
}

/// A kthread's queue line, keeping its region mapped.
#[derive(Clone)]
pub struct LineRef {
    _region: Region,
    line: NonNull<QueueLine>,
}

// SAFETY: a `QueueLine` is atomics only (Sync); the region is kept alive.
unsafe impl Send for LineRef {}
// SAFETY: as above.
unsafe impl Sync for LineRef {}

impl Deref for LineRef {
    type Target = QueueLine;
    fn deref(&self) -> &QueueLine {
        // SAFETY: a validated, aligned offset inside the mapping, kept alive
        // by `_region`; any bytes are a valid `QueueLine` (atomics only).
        unsafe { self.line.as_ref() }
    }
}

/// A kthread's request-latency histogram, keeping its region mapped.
#[derive(Clone)]
pub struct LatencyRef {
    _region: Region,
    hist: NonNull<LatencyHistogram>,
}

// SAFETY: a `LatencyHistogram` is atomics only (Sync); the region is kept
// alive.
unsafe impl Send for LatencyRef {}
// SAFETY: as above.
unsafe impl Sync for LatencyRef {}

impl Deref for LatencyRef {
    type Target = LatencyHistogram;
    fn deref(&self) -> &LatencyHistogram {
        // SAFETY: a validated, 64-byte aligned offset inside the mapping,
        // kept alive by `_region`; any bytes are a valid histogram
        // (atomics only).
        unsafe { self.hist.as_ref() }
    }
}

impl Region {
    /// Runtime side: a new sealed memfd region for `cfg`, initialized.
    pub fn create(name: &str, cfg: &RegionConfig) -> Result<Region, RegionError> {
        let layout = Layout::new(cfg)?;
        let len = layout.region_size as usize;
        let fd = memfd::create(name, layout.region_size).map_err(io_err("memfd_create"))?;
        memfd::add_seals(fd.as_fd(), memfd::SIZE_SEALS).map_err(io_err("F_ADD_SEALS"))?;
        let base = memfd::map(fd.as_fd(), len).map_err(io_err("mmap"))?;
        let map = Mapping {
            base,
            len,
            backing: Backing::Memfd(fd),
        };
        // SAFETY: a fresh zeroed mapping of `len` bytes, page-aligned, that
        // nobody else uses yet.
        unsafe { init(base, &layout) };
        Ok(Region::new(map, layout))
    }

    /// A region in an ordinary heap buffer (standalone runtimes, tests,
    /// Miri), initialized.
    pub fn create_heap(cfg: &RegionConfig) -> Result<Region, RegionError> {
        let layout = Layout::new(cfg)?;
        let len = layout.region_size as usize;
        let l = alloc::Layout::from_size_align(len, PAGE_SIZE as usize)
            .map_err(|_| overflow("region size"))?;
        // SAFETY: `len > 0`.
        let base = NonNull::new(unsafe { alloc::alloc_zeroed(l) })
            .unwrap_or_else(|| alloc::handle_alloc_error(l));
        let map = Mapping {
            base,
            len,
            backing: Backing::Heap(l),
        };
        // SAFETY: a fresh zeroed buffer of `len` bytes, page-aligned.
        unsafe { init(base, &layout) };
        Ok(Region::new(map, layout))
    }

    /// iokerneld side: maps a region received from a runtime, after checking
    /// that the memfd is sealed against shrinking, its size, and the header.
    pub fn attach(fd: OwnedFd) -> Result<Region, RegionError> {
        let seals = memfd::seals(fd.as_fd()).map_err(io_err("F_GET_SEALS"))?;
        if !seals.contains(Seals::SHRINK) {
            return Err(RegionError::NotSealed(seals.bits() as i32));
        }
        let len = memfd::size(fd.as_fd()).map_err(io_err("fstat"))?;
        if len < HEADER_SIZE as u64 {
            return Err(HeaderError::RegionTooSmall {
                len,
                need: HEADER_SIZE as u64,
            }
            .into());
        }
        if len > MAX_REGION_SIZE {
            return Err(RegionError::TooLarge {
                len,
                max: MAX_REGION_SIZE,
            });
        }
        let base = memfd::map(fd.as_fd(), len as usize).map_err(io_err("mmap"))?;
        let map = Mapping {
            base,
            len: len as usize,
            backing: Backing::Memfd(fd),
        };
        // SAFETY: the mapping is at least HEADER_SIZE bytes and page-aligned;
        // `Header` is integers only, so any bytes are a valid value. The
        // read is volatile: one copy, judged below and never re-read.
        let header = unsafe { std::ptr::read_volatile(base.as_ptr().cast::<Header>()) };
        let layout = Region::validate(&header, len)?;
        Ok(Region::new(map, layout))
    }

    /// Judges a header copied out of a region of `mapped_len` bytes (see
    /// [`Header::validate`]).
    pub fn validate(header: &Header, mapped_len: u64) -> Result<Layout, HeaderError> {
        header.validate(mapped_len)
    }

    fn new(map: Mapping, layout: Layout) -> Region {
        let taken = (0..layout.n_kthreads).map(|_| AtomicU8::new(0)).collect();
        Region(Arc::new(Inner { map, layout, taken }))
    }

    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    pub fn n_kthreads(&self) -> u32 {
        self.0.layout.n_kthreads
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.0.map.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.map.len == 0
    }

    /// The memfd, to pass to iokerneld (`None` for a heap region).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.0.map.backing {
            Backing::Memfd(fd) => Some(fd.as_fd()),
            Backing::Heap(_) => None,
        }
    }

    fn check_k(&self, k: u32) -> Result<(), RegionError> {
        let n = self.n_kthreads();
        if k < n {
            Ok(())
        } else {
            Err(RegionError::NoSuchKthread { k, n })
        }
    }

    fn at(&self, offset: u64) -> NonNull<u8> {
        // SAFETY: every offset passed here comes from the validated layout
        // for an existing kthread, so it lies inside the mapping.
        unsafe { self.0.map.base.add(offset as usize) }
    }

    /// Kthread `k`'s queue line.
    pub fn line(&self, k: u32) -> Result<LineRef, RegionError> {
        self.check_k(k)?;
        let line = self.at(self.0.layout.line_offset(k)).cast();
        Ok(LineRef {
            _region: self.clone(),
            line,
        })
    }

    /// Kthread `k`'s request-latency histogram.
    pub fn latency(&self, k: u32) -> Result<LatencyRef, RegionError> {
        self.check_k(k)?;
        let hist = self.at(self.0.layout.latency_offset(k)).cast();
        Ok(LatencyRef {
            _region: self.clone(),
            hist,
        })
    }

    fn take(&self, k: u32, bit: u8, side: &'static str) -> Result<(), RegionError> {
        self.check_k(k)?;
        if self.0.taken[k as usize].fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(RegionError::Taken { k, side });
        }
        Ok(())
    }

    fn keep(&self) -> Keep {
        self.0.clone()
    }

    /// The runtime's end of kthread `k` (once per region and kthread).
    pub fn runtime_end(&self, k: u32) -> Result<RuntimeEnd, RegionError> {
        self.take(k, TAKEN_RUNTIME, "runtime")?;
        let l = &self.0.layout;
        let up = self.at(l.up_ring_offset(k));
        let down = self.at(l.down_ring_offset(k));
        // SAFETY: validated ring locations (aligned, in bounds, sized for
        // the capacity), initialized by the creator (or, if the peer lied,
        // still plain memory that the handles only read through atomics and
        // masked slots); the region is kept alive; this end is taken once.
        let (p, c) = unsafe {
            (
                Producer::attach(up, l.up.capacity, self.keep()),
                Consumer::attach(down, l.down.capacity, self.keep()),
            )
        };
        // SAFETY: as above (validated ring locations, this end taken once).
        let ends = unsafe {
            (
                Consumer::attach(self.ring(&l.ingress, k), l.ingress.capacity, self.keep()),
                Producer::attach(self.ring(&l.done, k), l.done.capacity, self.keep()),
                Producer::attach(self.ring(&l.egress, k), l.egress.capacity, self.keep()),
            )
        };
        Ok(RuntimeEnd {
            line: self.line(k)?,
            latency: self.latency(k)?,
            to_iokernel: CmdTx::new(p),
            from_iokernel: CmdRx::new(c),
            ingress: ends.0,
            done: ends.1,
            egress: ends.2,
            egress_buffers: self.egress_buffers(k),
        })
    }

    /// iokerneld's end of kthread `k` (once per region and kthread).
    pub fn iokernel_end(&self, k: u32) -> Result<IokernelEnd, RegionError> {
        self.take(k, TAKEN_IOKERNEL, "iokerneld")?;
        let l = &self.0.layout;
        let up = self.at(l.up_ring_offset(k));
        let down = self.at(l.down_ring_offset(k));
        // SAFETY: as in `runtime_end`.
        let (c, p) = unsafe {
            (
                Consumer::attach(up, l.up.capacity, self.keep()),
                Producer::attach(down, l.down.capacity, self.keep()),
            )
        };
        // SAFETY: as in `runtime_end`.
        let ends = unsafe {
            (
                Producer::attach(self.ring(&l.ingress, k), l.ingress.capacity, self.keep()),
                Consumer::attach(self.ring(&l.done, k), l.done.capacity, self.keep()),
                Consumer::attach(self.ring(&l.egress, k), l.egress.capacity, self.keep()),
            )
        };
        Ok(IokernelEnd {
            line: self.line(k)?,
            latency: self.latency(k)?,
            from_kthread: CmdRx::new(c),
            to_kthread: CmdTx::new(p),
            ingress: ends.0,
            done: ends.1,
            egress: ends.2,
            egress_buffers: self.egress_buffers(k),
        })
    }

    /// Where kthread `k`'s ring of `area` starts in the mapping.
    fn ring(&self, area: &RingArea, k: u32) -> NonNull<u8> {
        self.at(area.kthread_offset(k))
    }

    fn egress_buffers(&self, k: u32) -> EgressBuffers {
        let l = &self.0.layout;
        // SAFETY: the validated egress buffer area of kthread `k`: `capacity`
        // buffers of PKT_BUFFER_SIZE bytes inside the mapping, kept alive by
        // the region handle.
        unsafe {
            EgressBuffers::new(
                self.at(l.egress_buffers_offset(k)),
                l.egress.capacity,
                self.keep(),
            )
        }
    }

    /// Pointer to the header in the mapping, for tests that corrupt it.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn header_ptr(&self) -> *mut Header {
        self.0.map.base.as_ptr().cast()
    }
}

/// Writes the header, queue lines and empty rings of `layout` at `base`.
///
/// # Safety
/// `base` is page-aligned, valid for writes of `layout.region_size` bytes,
/// and not in use by anyone else.
unsafe fn init(base: NonNull<u8>, layout: &Layout) {
    // SAFETY: offset 0 of the buffer, aligned, HEADER_SIZE bytes.
    unsafe { base.cast::<Header>().as_ptr().write(layout.header()) };
    for k in 0..layout.n_kthreads {
        // SAFETY: the layout (validated by `Layout::new`) places every line
        // and ring inside the buffer, cache-line aligned, without overlap.
        unsafe {
            base.add(layout.line_offset(k) as usize)
                .cast::<QueueLine>()
                .as_ptr()
                .write(QueueLine::new());
            base.add(layout.latency_offset(k) as usize)
                .cast::<LatencyHistogram>()
                .as_ptr()
                .write(LatencyHistogram::new());
            ring::init_ring::<RawMsg>(
                base.add(layout.up_ring_offset(k) as usize),
                layout.up.capacity,
            );
            ring::init_ring::<RawMsg>(
                base.add(layout.down_ring_offset(k) as usize),
                layout.down.capacity,
            );
            ring::init_ring::<PacketDesc>(
                base.add(layout.ingress.kthread_offset(k) as usize),
                layout.ingress.capacity,
            );
            ring::init_ring::<u32>(
                base.add(layout.done.kthread_offset(k) as usize),
                layout.done.capacity,
            );
            ring::init_ring::<PacketDesc>(
                base.add(layout.egress.kthread_offset(k) as usize),
                layout.egress.capacity,
            );
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use proptest::prelude::*;

    use super::layout::tests::good;
    use super::*;
    use crate::msg::{PreemptReason, RecvError};
    use crate::packet::{PacketDesc, PKT_BUFFER_SIZE};
    use crate::queue_line::LineFlags;

    fn header_bytes(h: &Header) -> [u8; HEADER_SIZE] {
        // SAFETY: `Header` is integers without padding: all bytes initialized.
        unsafe { std::mem::transmute_copy(h) }
    }

    fn header_from(b: [u8; HEADER_SIZE]) -> Header {
        // SAFETY: any bytes are a valid `Header` (integers only).
        unsafe { std::mem::transmute(b) }
    }

    proptest! {
        #![proptest_config(crate::test_config(2048, 8))]

        /// Flipping bytes of a good header yields Ok (and then a layout that
        /// stays inside the region) or a typed error, never a panic.
        #[test]
        fn corrupted_header_never_panics(flips in proptest::collection::vec((0..HEADER_SIZE, any::<u8>()), 1..6), len_delta in -8192i64..8192) {
            let (h, len) = good();
            let mut b = header_bytes(&h);
            for (i, v) in flips { b[i] = v; }
            let len = (len as i64 + len_delta).max(0) as u64;
            if let Ok(l) = header_from(b).validate(len) {
                let n = l.n_kthreads;
                prop_assert!((1..=MAX_KTHREADS).contains(&n));
                prop_assert!(l.line_offset(n - 1) + 64 <= len);
                prop_assert!(l.up_ring_offset(n - 1) + l.up.stride <= len);
                prop_assert!(l.down_ring_offset(n - 1) + l.down.stride <= len);
            }
        }

        /// Completely random headers (with the magic and version right, to
        /// get past the first checks) and lengths.
        #[test]
        fn random_header_never_panics(raw in proptest::collection::vec(any::<u8>(), HEADER_SIZE), len in any::<u64>()) {
            let mut b = [0u8; HEADER_SIZE];
            b.copy_from_slice(&raw);
            let mut h = header_from(b);
            h.magic = MAGIC;
            h.version = LAYOUT_VERSION;
            let _ = h.validate(len);
            let _ = header_from(b).validate(len);
        }
    }

    #[test]
    fn heap_region_packets_flow() {
        let r = Region::create_heap(&RegionConfig {
            n_kthreads: 2,
            ingress_capacity: 4,
            done_capacity: 8,
            egress_capacity: 2,
            ..RegionConfig::new(2)
        })
        .unwrap();
        let mut rt = r.runtime_end(1).unwrap();
        let mut io = r.iokernel_end(1).unwrap();
        // Egress: fill the buffer of the next slot, then push; iokerneld
        // copies out before releasing the slot.
        for round in 0..5u8 {
            assert_eq!(rt.egress.free(), Ok(2));
            let seq = rt.egress.next_seq();
            rt.egress_buffers.buffer_mut(seq)[..3].copy_from_slice(&[round; 3]);
            rt.egress
                .push(PacketDesc {
                    len: 3,
                    ..Default::default()
                })
                .unwrap();
            let (s, d) = io.egress.peek().unwrap().unwrap();
            assert_eq!(s, seq);
            let mut out = [0u8; 8];
            assert_eq!(io.egress_buffers.read(s, d.len, &mut out), 3);
            assert_eq!(out[..3], [round; 3]);
            io.egress.release();
            assert_eq!(io.egress.peek(), Ok(None));
        }
        // A lying length is clamped to the buffer.
        let seq = rt.egress.next_seq();
        rt.egress
            .push(PacketDesc {
                len: u32::MAX,
                ..Default::default()
            })
            .unwrap();
        let mut big = vec![0u8; 4096];
        assert_eq!(
            io.egress_buffers.read(seq, u32::MAX, &mut big),
            PKT_BUFFER_SIZE as usize
        );
        // Ingress descriptors and returned buffers.
        let d = PacketDesc {
            buf: 5,
            len: 60,
            hash: 7,
            reserved: 0,
        };
        io.ingress.push(d).unwrap();
        assert_eq!(rt.ingress.pop(), Ok(Some(d)));
        rt.done.push(5).unwrap();
        assert_eq!(io.done.pop(), Ok(Some(5)));
        // Kthread 0's packet rings are separate.
        let mut io0 = r.iokernel_end(0).unwrap();
        assert_eq!(io0.egress.peek(), Ok(None));
        assert_eq!(io0.done.pop(), Ok(None));
    }

    #[test]
    fn heap_region_ends_talk() {
        let r = Region::create_heap(&RegionConfig {
            n_kthreads: 2,
            up_capacity: 4,
            down_capacity: 4,
            ..RegionConfig::new(1)
        })
        .unwrap();
        assert!(r.fd().is_none());
        let mut rt = r.runtime_end(1).unwrap();
        let mut io = r.iokernel_end(1).unwrap();
        assert!(matches!(
            r.runtime_end(1),
            Err(RegionError::Taken {
                k: 1,
                side: "runtime"
            })
        ));
        assert!(matches!(
            r.iokernel_end(2),
            Err(RegionError::NoSuchKthread { k: 2, n: 2 })
        ));
        rt.to_iokernel
            .send(ToIokernel::Parked {
                next_deadline_ns: Some(99),
                grant: crate::UNNUMBERED_GRANT,
            })
            .unwrap();
        rt.line.set_rq_tail(3);
        rt.line.insert_flags(LineFlags::PARKED);
        assert_eq!(
            io.from_kthread.recv().unwrap(),
            Some(ToIokernel::Parked {
                next_deadline_ns: Some(99),
                grant: crate::UNNUMBERED_GRANT,
            })
        );
        assert_eq!(io.line.snapshot().counters.rq_tail, 3);
        rt.latency.record(4_000);
        let lat = io.latency.read();
        assert_eq!(lat.buckets.iter().sum::<u64>(), 1);
        assert_eq!(lat.sum_ns, 4_000);
        let other = rt.line._region.latency(0).unwrap().read();
        assert_eq!(
            other.buckets.iter().sum::<u64>(),
            0,
            "kthread 0's is its own"
        );
        io.to_kthread
            .send(ToKthread::Preempt {
                reason: PreemptReason::CoreNeeded,
            })
            .unwrap();
        drop(r);
        assert_eq!(
            rt.from_iokernel.recv().unwrap(),
            Some(ToKthread::Preempt {
                reason: PreemptReason::CoreNeeded
            })
        );
        // Kthread 0's rings are separate.
        let mut io0 = rt.line._region.iokernel_end(0).unwrap();
        assert_eq!(io0.from_kthread.recv(), Ok(None));
    }

    #[test]
    fn corrupt_ring_index_in_region() {
        let r = Region::create_heap(&RegionConfig::new(1)).unwrap();
        let mut io = r.iokernel_end(0).unwrap();
        let up = r.at(r.layout().up_ring_offset(0));
        // SAFETY: the ring lives as long as `r`.
        unsafe { ring::header_at(up) }.store_tail(1000);
        assert!(matches!(io.from_kthread.recv(), Err(RecvError::Corrupt(_))));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create/mmap are not supported by Miri")]
    fn memfd_create_attach() {
        let r = Region::create("ginza-test", &RegionConfig::new(3)).unwrap();
        let fd = r.fd().unwrap().try_clone_to_owned().unwrap();
        let a = Region::attach(fd).unwrap();
        assert_eq!(a.layout(), r.layout());
        let mut rt = r.runtime_end(2).unwrap();
        let mut io = a.iokernel_end(2).unwrap();
        rt.to_iokernel
            .send(ToIokernel::Started { tid: 42 })
            .unwrap();
        rt.line.set_in_tail(7);
        assert_eq!(
            io.from_kthread.recv().unwrap(),
            Some(ToIokernel::Started { tid: 42 })
        );
        assert_eq!(io.line.snapshot().counters.in_tail, 7);
        io.to_kthread
            .send(ToKthread::Wake {
                core: 1,
                decided_ns: 5,
                grant: 7,
            })
            .unwrap();
        assert_eq!(
            rt.from_iokernel.recv().unwrap(),
            Some(ToKthread::Wake {
                core: 1,
                decided_ns: 5,
                grant: 7,
            })
        );
        // Seals hold: the runtime cannot shrink the memfd any more.
        let f = std::fs::File::from(r.fd().unwrap().try_clone_to_owned().unwrap());
        assert!(f.set_len(64).is_err());
        // Corrupting the header after attach changes nothing for `a`.
        // SAFETY: the header is plain integers; nobody reads it concurrently.
        unsafe { (*r.header_ptr()).n_kthreads = 9999 };
        assert_eq!(a.n_kthreads(), 3);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd_create/mmap are not supported by Miri")]
    fn memfd_attach_refuses_bad_regions() {
        let r = Region::create("ginza-test", &RegionConfig::new(1)).unwrap();
        let attach = || Region::attach(r.fd().unwrap().try_clone_to_owned().unwrap());
        // A runtime of the layout before the request-latency histograms.
        // SAFETY: plain integers; no concurrent reader.
        unsafe { (*r.header_ptr()).version = 4 };
        let e = attach().err().unwrap();
        assert_eq!(
            e.to_string(),
            "shared region refused: layout version 4, this side speaks 5"
        );
        // SAFETY: as above.
        unsafe { (*r.header_ptr()).version = LAYOUT_VERSION };
        assert!(attach().is_ok());

        // An unsealed memfd is refused before it is mapped.
        let fd = memfd::create("unsealed", 4096).unwrap();
        assert!(matches!(Region::attach(fd), Err(RegionError::NotSealed(_))));
        // A sealed but empty one too.
        let fd = memfd::create("tiny", 0).unwrap();
        memfd::add_seals(fd.as_fd(), memfd::SIZE_SEALS).unwrap();
        assert!(matches!(
            Region::attach(fd),
            Err(RegionError::Header(HeaderError::RegionTooSmall {
                len: 0,
                ..
            }))
        ));
        // A sealed page of zeros: bad magic.
        let fd = memfd::create("zeros", 4096).unwrap();
        memfd::add_seals(fd.as_fd(), memfd::SIZE_SEALS).unwrap();
        let e = Region::attach(fd).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!("shared region refused: bad magic 0x0000000000000000, expected {MAGIC:#018x}")
        );
    }
}
