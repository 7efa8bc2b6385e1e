//! The region's layout and its validation: where each area lies, the
//! header that describes it, and the checks iokerneld applies to a header
//! before trusting any offset in it. Pure arithmetic over integers, so no
//! `unsafe` here; the mapping and the pointers into it are in the parent
//! module.

#![forbid(unsafe_code)]

use std::fmt;
use std::mem::size_of;

use crate::msg::RawMsg;
use crate::packet::{PacketDesc, PKT_BUFFER_SIZE};
use crate::queue_line::QueueLine;
use crate::request_latency::HISTOGRAM_SIZE;
use crate::ring::{self, ring_bytes, CACHE_LINE, MAX_CAPACITY, MIN_CAPACITY};

/// `b"GINZASHM"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GINZASHM");
/// The layout this code speaks.
/// 3: `LineFlags::IOKERNEL_ASLEEP`, which a runtime must answer by ringing
/// its bell (`iokernel_bell`); a runtime that does not know it would leave
/// a sleeping iokerneld asleep.
/// 4: `LineFlags::IDLE_POLLING`: a runtime that keeps its core while idle
/// must meet an iokerneld that takes it back at once when another wants it.
/// 5: the request-latency histograms after the egress buffers
/// (`request_latency`), three header fields longer.
pub const LAYOUT_VERSION: u32 = 5;
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
    pub latency_offset: u64,
    pub latency_stride: u64,
    pub latency_size: u64,
}

pub(super) const HEADER_SIZE: usize = size_of::<Header>();
const _: () = assert!(HEADER_SIZE == 256);

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
    LatencyHistograms,
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
            Area::LatencyHistograms => "request-latency histogram area",
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
    /// Offset of kthread 0's request-latency histogram; one
    /// [`HISTOGRAM_SIZE`] further per kthread.
    pub latency_offset: u64,
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

pub(super) fn overflow(what: &'static str) -> HeaderError {
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
        let latency_offset = place(HISTOGRAM_SIZE as u64)?;
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
            latency_offset,
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
            latency_offset: self.latency_offset,
            latency_stride: HISTOGRAM_SIZE as u64,
            latency_size: HISTOGRAM_SIZE as u64 * n,
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

    /// Offset of kthread `k`'s request-latency histogram.
    pub fn latency_offset(&self, k: u32) -> u64 {
        debug_assert!(k < self.n_kthreads);
        self.latency_offset + HISTOGRAM_SIZE as u64 * k as u64
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
            check_area(
                Area::LatencyHistograms,
                self.latency_offset,
                self.latency_size,
                self.latency_stride,
                HISTOGRAM_SIZE as u64,
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
            latency_offset: self.latency_offset,
        })
    }
}

#[cfg(all(test, not(loom)))]
pub(super) mod tests {
    use super::*;

    /// A valid header for 4 kthreads, and its region size.
    pub(in crate::region) fn good() -> (Header, u64) {
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
        assert_eq!(l.latency_offset, l.egress_buffers_offset + 4 * 256 * 2048);
        assert_eq!(l.latency_offset(3), l.latency_offset + 3 * 192);
        assert_eq!(
            l.region_size,
            (l.latency_offset + 4 * 192).next_multiple_of(4096)
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
            msg(&|b| b.version = 4, len),
            "layout version 4, this side speaks 5"
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
            "region is 100 bytes, smaller than the 256-byte header"
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
                "header [0x0, 0x100) overlaps kthread→iokerneld ring area [0x0, {:#x})",
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
            "header size 4096, expected 256"
        );
        assert_eq!(
            msg(&|b| b.latency_stride = 64, len),
            "request-latency histogram area: stride 64 bytes, expected 192 for its capacity"
        );
        assert_eq!(
            msg(&|b| b.latency_offset = len - 64, len),
            format!("request-latency histogram area at offset {:#x} size {:#x} runs past the region end {len:#x}", len - 64, h.latency_size)
        );
        assert_eq!(
            msg(&|b| b.n_kthreads = 0, len),
            "kthread count 0: a runtime has at least one kthread"
        );
    }
}
