//! [`Segment`] to and from the TCP header, through
//! `smoltcp::wire` (parsing, options, checksums).
//!
//! [`parse`] checks a received TCP header (length, data offset, options,
//! checksum, flags, ports) before anything reads past what was established,
//! so no input makes it panic; [`emit`] writes a header and payload into a
//! caller's buffer without allocating. The IPv4 and Ethernet layers around
//! them are `rx.rs` and `tx.rs`.

use super::sack::{SackBlock, SackBlocks};
use super::segment::Timestamp;
use super::{Flags, Segment, Seq};
use smoltcp::wire::{IpAddress, TcpOption, TcpPacket, TcpSeqNumber};
use std::fmt;
use std::net::Ipv4Addr;

/// The TCP header without options.
pub const TCP_HEADER_LEN: usize = 20;
/// The largest TCP header: a 4-bit data offset counts 15 words.
pub const MAX_TCP_HEADER_LEN: usize = 60;
/// RFC 7323 §2.3: a larger shift is taken as 14.
pub const MAX_WINDOW_SCALE: u8 = 14;

/// A parsed segment with the ports the driver demultiplexes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpHeader<'a> {
    pub src_port: u16,
    pub dst_port: u16,
    pub segment: Segment<'a>,
}

/// Why a TCP header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the fixed header, or than the data offset claims.
    Truncated {
        needed: usize,
        available: usize,
    },
    /// A data offset below the 20-byte fixed header.
    BadDataOffset {
        header_len: usize,
    },
    /// An option runs past the header's end or has an impossible length.
    BadOptions {
        offset: usize,
    },
    BadChecksum,
    /// SYN, FIN and RST combined (smoltcp, like most stacks, refuses these).
    BadFlags {
        syn: bool,
        fin: bool,
        rst: bool,
    },
    /// Port 0 is reserved and never a connection's.
    PortZero {
        src_port: u16,
        dst_port: u16,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { needed, available } => {
                write!(f, "truncated TCP header: need {needed} bytes, {available} present")
            }
            WireError::BadDataOffset { header_len } => write!(
                f,
                "bad TCP data offset: {header_len}-byte header, below the {TCP_HEADER_LEN}-byte minimum"
            ),
            WireError::BadOptions { offset } => {
                write!(f, "bad TCP options: the option at header byte {offset} overruns the header or has a bad length")
            }
            WireError::BadChecksum => f.write_str("bad TCP checksum"),
            WireError::BadFlags { syn, fin, rst } => {
                write!(f, "bad TCP flags: SYN {syn}, FIN {fin}, RST {rst} (at most one of them)")
            }
            WireError::PortZero { src_port, dst_port } => {
                write!(f, "TCP port 0: {src_port} -> {dst_port}")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// Parses the TCP segment `bytes` (the IPv4 payload) sent from `src_ip` to
/// `dst_ip`. The payload borrows from `bytes`.
pub fn parse(bytes: &[u8], src_ip: Ipv4Addr, dst_ip: Ipv4Addr) -> Result<TcpHeader<'_>, WireError> {
    if bytes.len() < TCP_HEADER_LEN {
        return Err(WireError::Truncated {
            needed: TCP_HEADER_LEN,
            available: bytes.len(),
        });
    }
    let packet = TcpPacket::new_unchecked(bytes);
    let header_len = usize::from(packet.header_len());
    if header_len < TCP_HEADER_LEN {
        return Err(WireError::BadDataOffset { header_len });
    }
    if header_len > bytes.len() {
        return Err(WireError::Truncated {
            needed: header_len,
            available: bytes.len(),
        });
    }
    if !packet.verify_checksum(&IpAddress::Ipv4(src_ip), &IpAddress::Ipv4(dst_ip)) {
        return Err(WireError::BadChecksum);
    }
    let (syn, fin, rst) = (packet.syn(), packet.fin(), packet.rst());
    if u8::from(syn) + u8::from(fin) + u8::from(rst) > 1 {
        return Err(WireError::BadFlags { syn, fin, rst });
    }
    let (src_port, dst_port) = (packet.src_port(), packet.dst_port());
    if src_port == 0 || dst_port == 0 {
        return Err(WireError::PortZero { src_port, dst_port });
    }
    let options = parse_options(&bytes[TCP_HEADER_LEN..header_len])?;
    Ok(TcpHeader {
        src_port,
        dst_port,
        segment: Segment {
            seq: Seq(packet.seq_number().0 as u32),
            ack: packet.ack().then(|| Seq(packet.ack_number().0 as u32)),
            flags: Flags {
                syn,
                fin,
                rst,
                psh: packet.psh(),
            },
            window: packet.window_len(),
            // RFC 9293 §3.2: MSS and window scale mean something on SYNs only.
            mss: options.mss.filter(|_| syn),
            window_scale: options.window_scale.filter(|_| syn),
            timestamp: options.timestamp,
            sack_permitted: options.sack_permitted && syn,
            sack: options.sack,
            payload: &bytes[header_len..],
        },
    })
}

/// The options the state machine uses.
#[derive(Default)]
struct Options {
    mss: Option<u16>,
    window_scale: Option<u8>,
    timestamp: Option<Timestamp>,
    sack_permitted: bool,
    sack: SackBlocks,
}

/// The MSS, window-scale, timestamps, SACK-permitted and SACK options;
/// unknown options are skipped, as RFC 9293 §3.2 requires. Of a SACK
/// option with four blocks the first three are kept (smoltcp's parser).
fn parse_options(mut options: &[u8]) -> Result<Options, WireError> {
    let total = options.len();
    let mut parsed = Options::default();
    while !options.is_empty() {
        let offset = TCP_HEADER_LEN + total - options.len();
        let (rest, option) =
            TcpOption::parse(options).map_err(|_| WireError::BadOptions { offset })?;
        match option {
            TcpOption::EndOfList => break,
            TcpOption::MaxSegmentSize(value) => parsed.mss = Some(value),
            TcpOption::WindowScale(shift) => {
                parsed.window_scale = Some(shift.min(MAX_WINDOW_SCALE))
            }
            TcpOption::TimeStamp { tsval, tsecr } => {
                parsed.timestamp = Some(Timestamp {
                    value: tsval,
                    echo: tsecr,
                })
            }
            TcpOption::SackPermitted => parsed.sack_permitted = true,
            TcpOption::SackRange(ranges) => {
                parsed.sack = ranges
                    .iter()
                    .flatten()
                    .map(|&(left, right)| SackBlock {
                        left: Seq(left),
                        right: Seq(right),
                    })
                    .collect();
            }
            _ => {}
        }
        // A length below 2 would not advance (smoltcp then returns the
        // same slice): that is a malformed option too.
        if rest.len() >= options.len() {
            return Err(WireError::BadOptions { offset });
        }
        options = rest;
    }
    Ok(parsed)
}

/// The header length [`emit`] writes for `segment` (options padded to a
/// 4-byte boundary).
pub fn header_len(segment: &Segment<'_>) -> usize {
    let options = options_before_sack(segment) + sack_option_len_of(sack_blocks_that_fit(segment));
    TCP_HEADER_LEN + options.div_ceil(4) * 4
}

/// The option bytes other than SACK blocks: MSS, window scale and
/// SACK-permitted on a SYN, timestamps on any segment.
fn options_before_sack(segment: &Segment<'_>) -> usize {
    segment.mss.map_or(0, |_| 4)
        + segment.window_scale.map_or(0, |_| 3)
        + segment.timestamp.map_or(0, |_| 12)
        + usize::from(segment.sack_permitted && segment.flags.syn) * 2
}

/// How many of the segment's SACK blocks fit in the 40 option bytes
/// beside its other options (the first ones, which matter most).
fn sack_blocks_that_fit(segment: &Segment<'_>) -> usize {
    let room = (MAX_TCP_HEADER_LEN - TCP_HEADER_LEN).saturating_sub(options_before_sack(segment));
    segment.sack.len().min(room.saturating_sub(4) / 8)
}

fn sack_option_len_of(blocks: usize) -> usize {
    match blocks {
        0 => 0,
        n => 4 + 8 * n,
    }
}

/// The SACK option's bytes with the two no-ops that align it; 0 without
/// blocks.
pub fn sack_option_len(sack: &SackBlocks) -> usize {
    sack_option_len_of(sack.len())
}

/// Writes `segment` from `src` to `dst` (addresses for the checksum) at the
/// start of `buf`, which must hold exactly [`header_len`] plus the payload;
/// returns that length. `None` if `buf` has another length.
pub fn emit(
    buf: &mut [u8],
    src_ip: Ipv4Addr,
    src_port: u16,
    dst_ip: Ipv4Addr,
    dst_port: u16,
    segment: &Segment<'_>,
) -> Option<usize> {
    let header_len = header_len(segment);
    let len = header_len + segment.payload.len();
    if buf.len() != len {
        return None;
    }
    let mut packet = TcpPacket::new_unchecked(&mut *buf);
    packet.set_src_port(src_port);
    packet.set_dst_port(dst_port);
    packet.set_seq_number(TcpSeqNumber(segment.seq.0 as i32));
    packet.set_ack_number(TcpSeqNumber(segment.ack.map_or(0, |a| a.0) as i32));
    packet.set_header_len(header_len as u8);
    packet.clear_flags();
    packet.set_syn(segment.flags.syn);
    packet.set_fin(segment.flags.fin);
    packet.set_rst(segment.flags.rst);
    packet.set_psh(segment.flags.psh);
    packet.set_ack(segment.ack.is_some());
    packet.set_window_len(segment.window);
    packet.set_urgent_at(0);
    let mut options = packet.options_mut();
    if let Some(mss) = segment.mss {
        options = TcpOption::MaxSegmentSize(mss).emit(options);
    }
    if let Some(shift) = segment.window_scale {
        options = TcpOption::WindowScale(shift).emit(options);
    }
    if let Some(ts) = segment.timestamp {
        // Two no-ops first keep it 4-byte aligned (RFC 7323 Appendix A).
        options = TcpOption::NoOperation.emit(options);
        options = TcpOption::NoOperation.emit(options);
        options = TcpOption::TimeStamp {
            tsval: ts.value,
            tsecr: ts.echo,
        }
        .emit(options);
    }
    if segment.sack_permitted && segment.flags.syn {
        options = TcpOption::SackPermitted.emit(options);
    }
    let sack_blocks = sack_blocks_that_fit(segment);
    if sack_blocks > 0 {
        let mut ranges = [None; 3];
        let blocks = segment.sack.iter().take(sack_blocks);
        for (slot, block) in ranges.iter_mut().zip(blocks) {
            *slot = Some((block.left.0, block.right.0));
        }
        options = TcpOption::NoOperation.emit(options);
        options = TcpOption::NoOperation.emit(options);
        options = TcpOption::SackRange(ranges).emit(options);
    }
    if !options.is_empty() {
        // Pads with end-of-list bytes.
        TcpOption::EndOfList.emit(options);
    }
    packet.payload_mut().copy_from_slice(segment.payload);
    packet.fill_checksum(&IpAddress::Ipv4(src_ip), &IpAddress::Ipv4(dst_ip));
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    fn built(segment: &Segment<'_>) -> Vec<u8> {
        let mut buf = vec![0; header_len(segment) + segment.payload.len()];
        assert_eq!(emit(&mut buf, A, 4000, B, 80, segment), Some(buf.len()));
        buf
    }

    fn syn() -> Segment<'static> {
        Segment {
            seq: Seq(0xfffffff0),
            ack: None,
            flags: Flags {
                syn: true,
                ..Flags::default()
            },
            window: 65535,
            mss: Some(1460),
            window_scale: Some(7),
            timestamp: None,
            sack_permitted: true,
            sack: SackBlocks::NONE,
            payload: &[],
        }
    }

    fn data(payload: &[u8]) -> Segment<'_> {
        Segment {
            seq: Seq(7),
            ack: Some(Seq(0x8000_0001)),
            flags: Flags {
                psh: true,
                fin: true,
                ..Flags::default()
            },
            window: 1234,
            mss: None,
            window_scale: None,
            timestamp: None,
            sack_permitted: false,
            sack: SackBlocks::NONE,
            payload,
        }
    }

    /// Recomputes the checksum after an edit on purpose (RFC 1071 by hand).
    fn fix_checksum(bytes: &mut [u8]) {
        bytes[16..18].fill(0);
        let mut sum: u32 = 0;
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&A.octets());
        pseudo.extend_from_slice(&B.octets());
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        for chunk in pseudo.chunks(2).chain(bytes.chunks(2)) {
            sum += u32::from(u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        bytes[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    }

    #[test]
    fn syn_and_data_round_trip() {
        for segment in [syn(), data(b"hello, world"), data(b"")] {
            let bytes = built(&segment);
            let parsed = parse(&bytes, A, B).unwrap();
            assert_eq!(parsed.src_port, 4000);
            assert_eq!(parsed.dst_port, 80);
            assert_eq!(parsed.segment, segment);
        }
        assert_eq!(header_len(&syn()), 32);
        assert_eq!(header_len(&data(b"")), 20);
    }

    #[test]
    fn sack_blocks_round_trip_beside_timestamps_within_forty_bytes() {
        let mut s = data(b"x");
        s.timestamp = Some(Timestamp { value: 1, echo: 2 });
        s.sack = [(100, 200), (300, 400), (u32::MAX - 5, 10)]
            .into_iter()
            .map(|(l, r)| SackBlock {
                left: Seq(l),
                right: Seq(r),
            })
            .collect();
        assert_eq!(header_len(&s), MAX_TCP_HEADER_LEN);
        let bytes = built(&s);
        assert_eq!(parse(&bytes, A, B).unwrap().segment, s);
        // SACK-permitted goes on SYNs only; on a SYN with every other
        // option, one block fits.
        s.sack_permitted = true;
        let bytes = built(&s);
        assert!(!parse(&bytes, A, B).unwrap().segment.sack_permitted);
        let mut full = syn();
        full.timestamp = s.timestamp;
        full.sack = s.sack;
        assert_eq!(
            header_len(&full),
            56,
            "21 bytes of others and one 12-byte block, padded"
        );
        let bytes = built(&full);
        let parsed = parse(&bytes, A, B).unwrap().segment;
        assert_eq!(parsed.sack.len(), 1);
        assert!(parsed.sack_permitted);
    }

    #[test]
    fn emit_refuses_a_buffer_of_the_wrong_length() {
        let mut buf = [0u8; 64];
        assert_eq!(emit(&mut buf, A, 1, B, 2, &syn()), None);
    }

    #[test]
    fn each_bad_header_is_refused_for_its_reason() {
        let good = built(&data(b"payload"));
        let edit = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = good.clone();
            f(&mut bytes);
            parse(&bytes, A, B).unwrap_err()
        };
        assert_eq!(
            parse(&good[..19], A, B).unwrap_err(),
            WireError::Truncated {
                needed: 20,
                available: 19
            }
        );
        assert_eq!(
            edit(&|b| b[12] = 0x40),
            WireError::BadDataOffset { header_len: 16 }
        );
        assert_eq!(
            edit(&|b| {
                b.truncate(24);
                b[12] = 0xf0;
            }),
            WireError::Truncated {
                needed: 60,
                available: 24
            }
        );
        assert_eq!(edit(&|b| b[25] ^= 1), WireError::BadChecksum);
        assert_eq!(edit(&|b| b[4] ^= 1), WireError::BadChecksum);
        assert_eq!(
            edit(&|b| {
                b[13] |= 0x06; // SYN+RST on top of FIN
                fix_checksum(b);
            }),
            WireError::BadFlags {
                syn: true,
                fin: true,
                rst: true
            }
        );
        assert_eq!(
            edit(&|b| {
                b[0..2].fill(0);
                fix_checksum(b);
            }),
            WireError::PortZero {
                src_port: 0,
                dst_port: 80
            }
        );
        // A 24-byte header whose MSS option claims 4 bytes from offset 22.
        let options = |opts: [u8; 4]| {
            move |b: &mut Vec<u8>| {
                b.splice(20..20, opts);
                b[12] = 0x60;
                fix_checksum(b);
            }
        };
        assert_eq!(
            edit(&options([1, 1, 2, 4])),
            WireError::BadOptions { offset: 22 }
        );
        assert_eq!(
            edit(&options([8, 12, 0, 0])),
            WireError::BadOptions { offset: 20 }
        );
        assert_eq!(
            edit(&options([2, 3, 5, 0])),
            WireError::BadOptions { offset: 20 }
        );
        assert_eq!(
            edit(&options([9, 0, 0, 0])),
            WireError::BadOptions { offset: 20 }
        );
        // An unknown option that fits is skipped; the payload is intact.
        let mut ok = good.clone();
        options([30, 4, 1, 2])(&mut ok);
        assert_eq!(parse(&ok, A, B).unwrap().segment.payload, b"payload");
    }

    #[test]
    fn options_mean_something_on_syns_only_and_scale_is_capped() {
        let mut s = syn();
        s.window_scale = Some(20);
        let bytes = built(&s);
        let parsed = parse(&bytes, A, B).unwrap().segment;
        assert_eq!(parsed.window_scale, Some(MAX_WINDOW_SCALE));
        let mut not_syn = syn();
        not_syn.flags.syn = false;
        let bytes = built(&not_syn);
        let parsed = parse(&bytes, A, B).unwrap().segment;
        assert_eq!((parsed.mss, parsed.window_scale), (None, None));
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = parse(&bytes, A, B);
        }

        #[test]
        fn parse_inverts_emit(
            seq in any::<u32>(),
            ack in proptest::option::of(any::<u32>()),
            syn in any::<bool>(),
            fin in any::<bool>(),
            psh in any::<bool>(),
            window in any::<u16>(),
            mss in proptest::option::of(any::<u16>()),
            scale in proptest::option::of(0..=14u8),
            ts in proptest::option::of(any::<(u32, u32)>()),
            sack in proptest::collection::vec(any::<(u32, u32)>(), 0..=3),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let segment = Segment {
                seq: Seq(seq),
                ack: ack.map(Seq),
                flags: Flags { syn, fin: fin && !syn, rst: false, psh },
                window,
                mss: mss.filter(|_| syn),
                window_scale: scale.filter(|_| syn),
                timestamp: ts.map(|(value, echo)| Timestamp { value, echo }),
                sack_permitted: syn,
                // What fits beside the other options (no option room is
                // left for a third block on a SYN with all of them).
                sack: sack.iter().take({
                    let others = 4 * usize::from(mss.is_some() && syn) + 3 * usize::from(scale.is_some() && syn)
                        + 12 * usize::from(ts.is_some()) + 2 * usize::from(syn);
                    (40 - others - 4) / 8
                })
                    .map(|&(l, r)| SackBlock { left: Seq(l), right: Seq(r) }).collect(),
                payload: &payload,
            };
            let bytes = built(&segment);
            prop_assert_eq!(parse(&bytes, A, B).unwrap().segment, segment);
        }
    }
}
