//! The shared region of one runtime: a sealed memfd that starts with a
//! [`Header`], followed by one [`QueueLine`] per kthread, two command rings
//! per kthread (kthread → iokerneld, iokerneld → kthread), and the packet
//! rings and egress buffers of each kthread (see [`crate::packet`]).
//!
//! ```text
//! 0              Header (232 bytes)
//! lines_offset   QueueLine × n_kthreads            (64 bytes each)
//! up_offset      ring of RawMsg × n_kthreads        (up_stride bytes each)
//! down_offset    ring of RawMsg × n_kthreads        (down_stride bytes each)
//! in_offset      ring of PacketDesc × n_kthreads    ingress: iokerneld → kthread
//! done_offset    ring of u32 × n_kthreads           ingress buffers given back
//! out_offset     ring of PacketDesc × n_kthreads    egress: kthread → iokerneld
//! egress_offset  out_capacity buffers × n_kthreads  egress buffers (slot i ↔ buffer i)
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

use std::alloc;
use std::fmt;
use std::io;
use std::mem::size_of;
use std::ops::Deref;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use ginza_sys::memfd::{self, Seals};

use crate::msg::{CmdRx, CmdTx, RawMsg, ToIokernel, ToKthread};
use crate::packet::{EgressBuffers, PacketDesc, PKT_BUFFER_SIZE};
use crate::queue_line::QueueLine;
use crate::ring::{
    self, ring_bytes, Consumer, Keep, Producer, CACHE_LINE, MAX_CAPACITY, MIN_CAPACITY,
};

/// `b"GINZASHM"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GINZASHM");
/// The layout this code speaks.
pub const LAYOUT_VERSION: u32 = 2;
/// Most kthreads one runtime may register.
pub const MAX_KTHREADS: u32 = 256;
/// Largest region iokerneld maps.
pub const MAX_REGION_SIZE: u64 = 1 << 30;
/// Regions are whole pages.
pub const PAGE_SIZE: u64 = 4096;

/// The region header at offset 0. Only integers: any bytes are a valid
/// `Header`, which [`Header::validate`] then judges.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub magic: u64,
    pub version: u32,
    pub header_size: u32,
    pub region_size: u64,
    pub n_kthreads: u32,
    pub line_size: u32,
    pub lines_offset: u64,
    pub lines_size: u64,
    pub msg_size: u32,
    pub up_capacity: u32,
    pub up_offset: u64,
    pub up_stride: u64,
    pub up_size: u64,
    pub down_capacity: u32,
    pub reserved: u32,
    pub down_offset: u64,
    pub down_stride: u64,
    pub down_size: u64,
    pub pkt_desc_size: u32,
    pub buffer_size: u32,
    pub in_capacity: u32,
    pub done_capacity: u32,
    pub out_capacity: u32,
    pub reserved2: u32,
    pub in_offset: u64,
    pub in_stride: u64,
    pub in_size: u64,
    pub done_offset: u64,
    pub done_stride: u64,
    pub done_size: u64,
    pub out_offset: u64,
    pub out_stride: u64,
    pub out_size: u64,
    pub egress_offset: u64,
    pub egress_stride: u64,
    pub egress_size: u64,
}

const HEADER_SIZE: usize = size_of::<Header>();
const _: () = assert!(HEADER_SIZE == 232);

/// A part of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    Header,
    Lines,
    UpRings,
    DownRings,
    IngressRings,
    DoneRings,
    EgressRings,
    EgressBuffers,
}

impl fmt::Display for Area {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Area::Header => "header",
            Area::Lines => "queue-line area",
            Area::UpRings => "kthread→iokerneld ring area",
            Area::DownRings => "iokerneld→kthread ring area",
            Area::IngressRings => "ingress ring area",
            Area::DoneRings => "ingress-done ring area",
            Area::EgressRings => "egress ring area",
            Area::EgressBuffers => "egress buffer area",
        })
    }
}

/// What is wrong with a region header. Every check names the field, the
/// value found and the value expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("region is {len} bytes, smaller than the {need}-byte header")]
    RegionTooSmall { len: u64, need: u64 },
    #[error("bad magic {found:#018x}, expected {expected:#018x}")]
    BadMagic { found: u64, expected: u64 },
    #[error("layout version {found}, this side speaks {supported}")]
    Version { found: u32, supported: u32 },
    #[error("header size {found}, expected {expected}")]
    HeaderSize { found: u32, expected: u32 },
    #[error("header says the region is {header} bytes, but it is {mapped} bytes")]
    RegionSize { header: u64, mapped: u64 },
    #[error("kthread count 0: a runtime has at least one kthread")]
    NoKthreads,
    #[error("kthread count {found} exceeds {max}")]
    TooManyKthreads { found: u32, max: u32 },
    #[error("queue line size {found}, expected {expected}")]
    LineSize { found: u32, expected: u32 },
    #[error("message size {found}, expected {expected}")]
    MsgSize { found: u32, expected: u32 },
    #[error("packet descriptor size {found}, expected {expected}")]
    DescSize { found: u32, expected: u32 },
    #[error("packet buffer size {found}, expected {expected}")]
    BufferSize { found: u32, expected: u32 },
    #[error("{area}: capacity {found} is not a power of two in {MIN_CAPACITY}..={MAX_CAPACITY}")]
    Capacity { area: Area, found: u32 },
    #[error("{area}: stride {found} bytes, expected {expected} for its capacity")]
    Stride {
        area: Area,
        found: u64,
        expected: u64,
    },
    #[error("{area}: size {found} bytes, expected {expected} ({n_kthreads} kthreads)")]
    AreaSize {
        area: Area,
        found: u64,
        expected: u64,
        n_kthreads: u32,
    },
    #[error("{area} at offset {offset:#x} is not {CACHE_LINE}-byte aligned")]
    Misaligned { area: Area, offset: u64 },
    #[error("{area} at offset {offset:#x} size {size:#x} runs past the region end {region:#x}")]
    PastEnd {
        area: Area,
        offset: u64,
        size: u64,
        region: u64,
    },
    #[error("{a} [{a_start:#x}, {a_end:#x}) overlaps {b} [{b_start:#x}, {b_end:#x})")]
    Overlap {
        a: Area,
        a_start: u64,
        a_end: u64,
        b: Area,
        b_start: u64,
        b_end: u64,
    },
    #[error("{what} does not fit in 64 bits")]
    Overflow { what: &'static str },
}

/// Where the rings of one direction live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingArea {
    pub offset: u64,
    pub stride: u64,
    pub capacity: u32,
}

impl RingArea {
    /// Offset of kthread `k`'s ring.
    pub fn kthread_offset(&self, k: u32) -> u64 {
        self.offset + self.stride * k as u64
    }
}

/// A validated layout, held in the reader's own memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub n_kthreads: u32,
    pub region_size: u64,
    pub lines_offset: u64,
    pub up: RingArea,
    pub down: RingArea,
    pub ingress: RingArea,
    pub done: RingArea,
    pub egress: RingArea,
    /// Offset of kthread 0's egress buffers; kthread `k`'s start
    /// `egress.capacity * PKT_BUFFER_SIZE` bytes further per kthread.
    pub egress_buffers_offset: u64,
}

/// What a runtime asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionConfig {
    pub n_kthreads: u32,
    /// Slots of each kthread → iokerneld command ring.
    pub up_capacity: u32,
    /// Slots of each iokerneld → kthread command ring.
    pub down_capacity: u32,
    /// Slots of each ingress ring (received packets waiting for a kthread).
    pub ingress_capacity: u32,
    /// Slots of each ingress-done ring; also the number of ingress buffers
    /// iokerneld gives the application, so returning every buffer through
    /// one kthread's ring never finds it full.
    pub done_capacity: u32,
    /// Slots of each egress ring, and egress buffers per kthread.
    pub egress_capacity: u32,
}

impl RegionConfig {
    pub fn new(n_kthreads: u32) -> Self {
        RegionConfig {
            n_kthreads,
            up_capacity: 64,
            down_capacity: 64,
            ingress_capacity: 512,
            done_capacity: 4096,
            egress_capacity: 256,
        }
    }
}

const LINE_SIZE: u64 = size_of::<QueueLine>() as u64;

/// Bytes of one ring of `T`, or the capacity error for `area`.
fn ring_stride<T: ring::Pod>(area: Area, capacity: u32) -> Result<u64, HeaderError> {
    ring_bytes::<T>(capacity)
        .map(|b| b as u64)
        .ok_or(HeaderError::Capacity {
            area,
            found: capacity,
        })
}

/// Bytes of one kthread's egress buffers.
fn egress_stride(out_capacity: u32) -> u64 {
    u64::from(out_capacity) * u64::from(PKT_BUFFER_SIZE)
}

fn overflow(what: &'static str) -> HeaderError {
    HeaderError::Overflow { what }
}

impl Layout {
    /// The layout for `cfg`: header, lines, up rings, down rings, packed in
    /// that order on cache-line boundaries and rounded up to a page.
    pub fn new(cfg: &RegionConfig) -> Result<Layout, HeaderError> {
        let n = cfg.n_kthreads;
        if n == 0 {
            return Err(HeaderError::NoKthreads);
        }
        if n > MAX_KTHREADS {
            return Err(HeaderError::TooManyKthreads {
                found: n,
                max: MAX_KTHREADS,
            });
        }
        let n64 = u64::from(n);
        let lines_offset = (HEADER_SIZE as u64).next_multiple_of(CACHE_LINE as u64);
        let mut end = lines_offset + LINE_SIZE * n64;
        // Places one area of `stride` bytes per kthread at the current end.
        let mut place = |stride: u64| -> Result<u64, HeaderError> {
            let offset = end;
            let size = stride.checked_mul(n64).ok_or(overflow("area size"))?;
            end = offset.checked_add(size).ok_or(overflow("region size"))?;
            Ok(offset)
        };
        let mut ring = |area, capacity, stride: fn(Area, u32) -> Result<u64, HeaderError>| {
            let stride = stride(area, capacity)?;
            Ok::<_, HeaderError>(RingArea {
                offset: place(stride)?,
                stride,
                capacity,
            })
        };
        let up = ring(Area::UpRings, cfg.up_capacity, ring_stride::<RawMsg>)?;
        let down = ring(Area::DownRings, cfg.down_capacity, ring_stride::<RawMsg>)?;
        let ingress = ring(
            Area::IngressRings,
            cfg.ingress_capacity,
            ring_stride::<PacketDesc>,
        )?;
        let done = ring(Area::DoneRings, cfg.done_capacity, ring_stride::<u32>)?;
        let egress = ring(
            Area::EgressRings,
            cfg.egress_capacity,
            ring_stride::<PacketDesc>,
        )?;
        let egress_buffers_offset = place(egress_stride(cfg.egress_capacity))?;
        let region_size = end
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(overflow("region size"))?;
        let layout = Layout {
            n_kthreads: n,
            region_size,
            lines_offset,
            up,
            down,
            ingress,
            done,
            egress,
            egress_buffers_offset,
        };
        // Our own output must pass our own checks (and the size limit).
        layout.header().validate(region_size)
    }

    /// The header describing this layout.
    pub fn header(&self) -> Header {
        let n = self.n_kthreads as u64;
        Header {
            magic: MAGIC,
            version: LAYOUT_VERSION,
            header_size: HEADER_SIZE as u32,
            region_size: self.region_size,
            n_kthreads: self.n_kthreads,
            line_size: LINE_SIZE as u32,
            lines_offset: self.lines_offset,
            lines_size: LINE_SIZE * n,
            msg_size: size_of::<RawMsg>() as u32,
            up_capacity: self.up.capacity,
            up_offset: self.up.offset,
            up_stride: self.up.stride,
            up_size: self.up.stride * n,
            down_capacity: self.down.capacity,
            reserved: 0,
            down_offset: self.down.offset,
            down_stride: self.down.stride,
            down_size: self.down.stride * n,
            pkt_desc_size: size_of::<PacketDesc>() as u32,
            buffer_size: PKT_BUFFER_SIZE,
            in_capacity: self.ingress.capacity,
            done_capacity: self.done.capacity,
            out_capacity: self.egress.capacity,
            reserved2: 0,
            in_offset: self.ingress.offset,
            in_stride: self.ingress.stride,
            in_size: self.ingress.stride * n,
            done_offset: self.done.offset,
            done_stride: self.done.stride,
            done_size: self.done.stride * n,
            out_offset: self.egress.offset,
            out_stride: self.egress.stride,
            out_size: self.egress.stride * n,
            egress_offset: self.egress_buffers_offset,
            egress_stride: egress_stride(self.egress.capacity),
            egress_size: egress_stride(self.egress.capacity) * n,
        }
    }

    /// Offset of kthread `k`'s queue line (`k < n_kthreads`).
    pub fn line_offset(&self, k: u32) -> u64 {
        debug_assert!(k < self.n_kthreads);
        self.lines_offset + LINE_SIZE * k as u64
    }

    /// Offset of kthread `k`'s kthread → iokerneld ring.
    pub fn up_ring_offset(&self, k: u32) -> u64 {
        debug_assert!(k < self.n_kthreads);
        self.up.kthread_offset(k)
    }

    /// Offset of kthread `k`'s iokerneld → kthread ring.
    pub fn down_ring_offset(&self, k: u32) -> u64 {
        debug_assert!(k < self.n_kthreads);
        self.down.kthread_offset(k)
    }

    /// Offset of kthread `k`'s first egress buffer.
    pub fn egress_buffers_offset(&self, k: u32) -> u64 {
        debug_assert!(k < self.n_kthreads);
        self.egress_buffers_offset + egress_stride(self.egress.capacity) * k as u64
    }
}

struct Span {
    area: Area,
    start: u64,
    end: u64,
}

/// Checks one per-kthread area and returns its extent.
fn check_area(
    area: Area,
    offset: u64,
    size: u64,
    stride: u64,
    expected_stride: u64,
    n: u32,
    region: u64,
) -> Result<Span, HeaderError> {
    if stride != expected_stride {
        return Err(HeaderError::Stride {
            area,
            found: stride,
            expected: expected_stride,
        });
    }
    let expected = expected_stride
        .checked_mul(n as u64)
        .ok_or(overflow("area size"))?;
    if size != expected {
        return Err(HeaderError::AreaSize {
            area,
            found: size,
            expected,
            n_kthreads: n,
        });
    }
    if offset % CACHE_LINE as u64 != 0 {
        return Err(HeaderError::Misaligned { area, offset });
    }
    match offset.checked_add(size) {
        Some(end) if end <= region => Ok(Span {
            area,
            start: offset,
            end,
        }),
        _ => Err(HeaderError::PastEnd {
            area,
            offset,
            size,
            region,
        }),
    }
}

impl Header {
    /// Judges a header copied out of a region of `mapped_len` bytes. On
    /// success every offset the [`Layout`] yields lies, with its whole
    /// object, inside the mapping, suitably aligned, and no two areas
    /// overlap. Never panics.
    pub fn validate(&self, mapped_len: u64) -> Result<Layout, HeaderError> {
        if mapped_len < HEADER_SIZE as u64 {
            return Err(HeaderError::RegionTooSmall {
                len: mapped_len,
                need: HEADER_SIZE as u64,
            });
        }
        if self.magic != MAGIC {
            return Err(HeaderError::BadMagic {
                found: self.magic,
                expected: MAGIC,
            });
        }
        if self.version != LAYOUT_VERSION {
            return Err(HeaderError::Version {
                found: self.version,
                supported: LAYOUT_VERSION,
            });
        }
        if self.header_size != HEADER_SIZE as u32 {
            return Err(HeaderError::HeaderSize {
                found: self.header_size,
                expected: HEADER_SIZE as u32,
            });
        }
        if self.region_size != mapped_len {
            return Err(HeaderError::RegionSize {
                header: self.region_size,
                mapped: mapped_len,
            });
        }
        let n = self.n_kthreads;
        if n == 0 {
            return Err(HeaderError::NoKthreads);
        }
        if n > MAX_KTHREADS {
            return Err(HeaderError::TooManyKthreads {
                found: n,
                max: MAX_KTHREADS,
            });
        }
        if self.line_size as u64 != LINE_SIZE {
            return Err(HeaderError::LineSize {
                found: self.line_size,
                expected: LINE_SIZE as u32,
            });
        }
        let msg = size_of::<RawMsg>() as u32;
        if self.msg_size != msg {
            return Err(HeaderError::MsgSize {
                found: self.msg_size,
                expected: msg,
            });
        }
        if self.pkt_desc_size as usize != size_of::<PacketDesc>() {
            return Err(HeaderError::DescSize {
                found: self.pkt_desc_size,
                expected: size_of::<PacketDesc>() as u32,
            });
        }
        if self.buffer_size != PKT_BUFFER_SIZE {
            return Err(HeaderError::BufferSize {
                found: self.buffer_size,
                expected: PKT_BUFFER_SIZE,
            });
        }
        // Each per-kthread area: (area, offset, size, stride, stride its
        // capacity needs, capacity).
        let rings = [
            (
                Area::UpRings,
                self.up_offset,
                self.up_size,
                self.up_stride,
                ring_stride::<RawMsg>(Area::UpRings, self.up_capacity)?,
                self.up_capacity,
            ),
            (
                Area::DownRings,
                self.down_offset,
                self.down_size,
                self.down_stride,
                ring_stride::<RawMsg>(Area::DownRings, self.down_capacity)?,
                self.down_capacity,
            ),
            (
                Area::IngressRings,
                self.in_offset,
                self.in_size,
                self.in_stride,
                ring_stride::<PacketDesc>(Area::IngressRings, self.in_capacity)?,
                self.in_capacity,
            ),
            (
                Area::DoneRings,
                self.done_offset,
                self.done_size,
                self.done_stride,
                ring_stride::<u32>(Area::DoneRings, self.done_capacity)?,
                self.done_capacity,
            ),
            (
                Area::EgressRings,
                self.out_offset,
                self.out_size,
                self.out_stride,
                ring_stride::<PacketDesc>(Area::EgressRings, self.out_capacity)?,
                self.out_capacity,
            ),
        ];
        let mut spans = vec![
            Span {
                area: Area::Header,
                start: 0,
                end: HEADER_SIZE as u64,
            },
            check_area(
                Area::Lines,
                self.lines_offset,
                self.lines_size,
                LINE_SIZE,
                LINE_SIZE,
                n,
                mapped_len,
            )?,
            check_area(
                Area::EgressBuffers,
                self.egress_offset,
                self.egress_size,
                self.egress_stride,
                egress_stride(self.out_capacity),
                n,
                mapped_len,
            )?,
        ];
        let mut areas = [RingArea {
            offset: 0,
            stride: 0,
            capacity: 0,
        }; 5];
        for (i, &(area, offset, size, stride, expected, capacity)) in rings.iter().enumerate() {
            spans.push(check_area(
                area, offset, size, stride, expected, n, mapped_len,
            )?);
            areas[i] = RingArea {
                offset,
                stride,
                capacity,
            };
        }
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                if a.start < b.end && b.start < a.end {
                    return Err(HeaderError::Overlap {
                        a: a.area,
                        a_start: a.start,
                        a_end: a.end,
                        b: b.area,
                        b_start: b.start,
                        b_end: b.end,
                    });
                }
            }
        }
        let [up, down, ingress, done, egress] = areas;
        Ok(Layout {
            n_kthreads: n,
            region_size: mapped_len,
            lines_offset: self.lines_offset,
            up,
            down,
            ingress,
            done,
            egress,
            egress_buffers_offset: self.egress_offset,
        })
    }
}

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

    use super::*;
    use crate::msg::{PreemptReason, RecvError};
    use crate::packet::{PacketDesc, PKT_BUFFER_SIZE};
    use crate::queue_line::LineFlags;

    fn good() -> (Header, u64) {
        let l = Layout::new(&RegionConfig {
            n_kthreads: 4,
            up_capacity: 16,
            down_capacity: 8,
            ..RegionConfig::new(1)
        })
        .unwrap();
        (l.header(), l.region_size)
    }

    #[test]
    fn layout_for_config() {
        let l = Layout::new(&RegionConfig {
            n_kthreads: 4,
            up_capacity: 16,
            down_capacity: 8,
            ..RegionConfig::new(1)
        })
        .unwrap();
        assert_eq!(l.lines_offset, 256);
        assert_eq!(l.up.offset, 256 + 4 * 64);
        assert_eq!(l.up.stride, 128 + 16 * 16);
        assert_eq!(l.down.offset, l.up.offset + 4 * l.up.stride);
        assert_eq!(l.down.stride, 128 + 8 * 16);
        assert_eq!(l.ingress.offset, l.down.offset + 4 * l.down.stride);
        assert_eq!(l.ingress.stride, 128 + 512 * 16);
        assert_eq!(l.done.stride, 128 + 4096 * 4);
        assert_eq!(l.egress.stride, 128 + 256 * 16);
        assert_eq!(
            l.egress_buffers_offset(1),
            l.egress_buffers_offset + 256 * 2048
        );
        assert_eq!(
            l.region_size,
            (l.egress_buffers_offset + 4 * 256 * 2048).next_multiple_of(4096)
        );
        let big = Layout::new(&RegionConfig {
            n_kthreads: MAX_KTHREADS,
            up_capacity: MAX_CAPACITY,
            down_capacity: MAX_CAPACITY,
            ..RegionConfig::new(1)
        });
        assert!(big.unwrap().region_size <= MAX_REGION_SIZE);
        assert_eq!(
            Layout::new(&RegionConfig::new(0)),
            Err(HeaderError::NoKthreads)
        );
        assert_eq!(
            Layout::new(&RegionConfig::new(5000))
                .unwrap_err()
                .to_string(),
            "kthread count 5000 exceeds 256"
        );
        let e = Layout::new(&RegionConfig {
            n_kthreads: 1,
            up_capacity: 3,
            down_capacity: 8,
            ..RegionConfig::new(1)
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "kthread→iokerneld ring area: capacity 3 is not a power of two in 2..=65536"
        );
    }

    #[test]
    fn error_messages_name_the_problem() {
        let (h, len) = good();
        assert_eq!(h.validate(len).map(|l| l.header()), Ok(h));
        let msg = |f: &dyn Fn(&mut Header), len: u64| {
            let mut b = h;
            f(&mut b);
            b.validate(len).unwrap_err().to_string()
        };
        assert_eq!(
            msg(&|b| b.magic = 0xdead_beef, len),
            format!("bad magic 0x00000000deadbeef, expected {MAGIC:#018x}")
        );
        assert_eq!(
            msg(&|b| b.version = 3, len),
            "layout version 3, this side speaks 2"
        );
        assert_eq!(
            msg(&|b| b.n_kthreads = 5000, len),
            "kthread count 5000 exceeds 256"
        );
        assert_eq!(
            msg(&|_| (), len + 4096),
            format!(
                "header says the region is {len} bytes, but it is {} bytes",
                len + 4096
            )
        );
        assert_eq!(
            msg(&|b| b.region_size = 100, 100),
            "region is 100 bytes, smaller than the 232-byte header"
        );
        assert_eq!(
            msg(&|b| b.down_offset = len - 64, len),
            format!("iokerneld→kthread ring area at offset {:#x} size {:#x} runs past the region end {len:#x}", len - 64, h.down_size)
        );
        assert_eq!(
            msg(&|b| b.down_offset = u64::MAX - 63, len),
            format!("iokerneld→kthread ring area at offset {:#x} size {:#x} runs past the region end {len:#x}", u64::MAX - 63, h.down_size)
        );
        assert_eq!(
            msg(&|b| b.up_offset += 8, len),
            format!(
                "kthread→iokerneld ring area at offset {:#x} is not 64-byte aligned",
                h.up_offset + 8
            )
        );
        assert_eq!(
            msg(&|b| b.up_offset = 0, len),
            format!(
                "header [0x0, 0xe8) overlaps kthread→iokerneld ring area [0x0, {:#x})",
                h.up_size
            )
        );
        assert!(msg(&|b| b.lines_offset = h.up_offset, len).contains("queue-line area [0x"));
        assert_eq!(
            msg(&|b| b.up_capacity = 32, len),
            format!(
                "kthread→iokerneld ring area: stride {} bytes, expected {} for its capacity",
                h.up_stride,
                128 + 32 * 16
            )
        );
        assert_eq!(
            msg(&|b| b.lines_size = 64, len),
            "queue-line area: size 64 bytes, expected 256 (4 kthreads)"
        );
        assert_eq!(
            msg(&|b| b.msg_size = 32, len),
            "message size 32, expected 16"
        );
        assert_eq!(
            msg(&|b| b.line_size = 128, len),
            "queue line size 128, expected 64"
        );
        assert_eq!(
            msg(&|b| b.header_size = 4096, len),
            "header size 4096, expected 232"
        );
        assert_eq!(
            msg(&|b| b.n_kthreads = 0, len),
            "kthread count 0: a runtime has at least one kthread"
        );
    }

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
            })
            .unwrap();
        rt.line.set_rq_tail(3);
        rt.line.insert_flags(LineFlags::PARKED);
        assert_eq!(
            io.from_kthread.recv().unwrap(),
            Some(ToIokernel::Parked {
                next_deadline_ns: Some(99)
            })
        );
        assert_eq!(io.line.snapshot().counters.rq_tail, 3);
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
            })
            .unwrap();
        assert_eq!(
            rt.from_iokernel.recv().unwrap(),
            Some(ToKthread::Wake {
                core: 1,
                decided_ns: 5
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
        // SAFETY: plain integers; no concurrent reader.
        unsafe { (*r.header_ptr()).version = 3 };
        let e = attach().err().unwrap();
        assert_eq!(
            e.to_string(),
            "shared region refused: layout version 3, this side speaks 2"
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
