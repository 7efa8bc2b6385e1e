//! Target `frames`: Ethernet frames into `ginza_net::parse`, as random
//! bytes or as valid frames of every kind (built by `ginza_net::tx`) with
//! a few mutations and, often, their checksums made right again so that
//! the mutation reaches the checks behind them.
//!
//! Checked: `parse` returns; what it borrows lies inside the frame; a
//! frame the builders made parses back to what they were given; and a
//! parsed UDP datagram or TCP segment, built again, parses to the same.

use arbitrary::{Arbitrary, Unstructured};
use ginza_net::tcp::{Flags, Segment, Seq, Timestamp};
use ginza_net::{parse, tx, Endpoint, Interface, Ipv4Addr, MacAddr, Packet};
use ginza_net::{MAX_FRAME_LEN, MAX_UDP_PAYLOAD};

use super::{describe, List, Outcome};

const US: Interface = Interface {
    mac: MacAddr([0x02, 0, 0, 0, 0, 0x01]),
    ip: Ipv4Addr::new(10, 0, 0, 1),
};
const PEER: Interface = Interface {
    mac: MacAddr([0x02, 0, 0, 0, 0, 0x02]),
    ip: Ipv4Addr::new(10, 0, 0, 2),
};
/// Where the IPv4 header and the layer-4 header start in the frames built.
const IP: usize = 14;
const L4: usize = IP + 20;

#[derive(Debug, Arbitrary)]
enum Input {
    /// Bytes; behind a valid Ethernet header to us and the first byte of
    /// an IPv4 header (checksums made right) when `behind_headers`, so
    /// that most reach the IPv4 and layer-4 checks.
    Raw {
        behind_headers: bool,
        bytes: List<u8>,
    },
    Built {
        kind: Kind,
        mutations: List<Mutation>,
        fix_checksums: bool,
    },
}

#[derive(Debug, Arbitrary)]
enum Kind {
    Udp {
        src_port: u16,
        dst_port: u16,
        payload: List<u8>,
    },
    Tcp {
        src_port: u16,
        dst_port: u16,
        seq: u32,
        ack: Option<u32>,
        syn: bool,
        fin: bool,
        rst: bool,
        psh: bool,
        window: u16,
        mss: Option<u16>,
        window_scale: Option<u8>,
        timestamp: Option<(u32, u32)>,
        payload: List<u8>,
    },
    ArpRequest {
        /// Ours most of the time (low bit clear): a request for another
        /// address is dropped before anything else is read.
        target: u8,
    },
    EchoRequest {
        ident: u16,
        seq_no: u16,
        payload: List<u8>,
    },
}

#[derive(Debug, Arbitrary)]
enum Mutation {
    SetByte {
        at: u16,
        value: u8,
    },
    /// A 16-bit field: the IPv4 total length, UDP length, TCP offset and
    /// flags sit at these offsets; anything else too.
    SetWord {
        at: Field,
        value: u16,
    },
    Truncate {
        len: u16,
    },
    Extend {
        bytes: List<u8>,
    },
}

#[derive(Debug, Arbitrary)]
enum Field {
    IpVersionIhl,
    IpTotalLength,
    IpFragment,
    IpProtocol,
    L4Length,
    TcpOffsetFlags,
    Anywhere(u16),
}

impl Field {
    fn offset(&self) -> usize {
        match *self {
            Field::IpVersionIhl => IP,
            Field::IpTotalLength => IP + 2,
            Field::IpFragment => IP + 6,
            Field::IpProtocol => IP + 8,
            Field::L4Length => L4 + 4,
            Field::TcpOffsetFlags => L4 + 12,
            Field::Anywhere(at) => usize::from(at % 128),
        }
    }
}

pub(super) fn case(u: &mut Unstructured<'_>, out: &mut Option<String>) -> Outcome {
    let Ok(input) = Input::arbitrary(u) else {
        return "no-input".into();
    };
    describe(out, &input);
    let frame = match &input {
        Input::Raw {
            behind_headers: false,
            bytes,
        } => bytes.to_vec(),
        Input::Raw {
            behind_headers: true,
            bytes,
        } => {
            let mut f = Vec::with_capacity(15 + bytes.len());
            f.extend_from_slice(&US.mac.0);
            f.extend_from_slice(&PEER.mac.0);
            f.extend_from_slice(&[0x08, 0x00, 0x45]);
            f.extend_from_slice(bytes);
            if f.len() >= L4 {
                f[IP + 16..IP + 20].copy_from_slice(&US.ip.octets());
            }
            fix(&mut f);
            f
        }
        Input::Built {
            kind,
            mutations,
            fix_checksums,
        } => {
            let Some(mut frame) = build(kind) else {
                return "unbuildable".into();
            };
            for m in mutations {
                apply(&mut frame, m);
            }
            if *fix_checksums {
                fix(&mut frame);
            }
            frame
        }
    };
    check(&frame)
}

/// The frame `kind` describes, checked to parse back to it.
fn build(kind: &Kind) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    match kind {
        Kind::Udp {
            src_port,
            dst_port,
            payload,
        } => {
            let payload = &payload[..payload.len().min(MAX_UDP_PAYLOAD)];
            let to = Endpoint::new(US.ip, *dst_port);
            let len = tx::udp_datagram(&mut buf, &PEER, US.mac, *src_port, to, payload).ok()?;
            buf.truncate(len);
            match parse(&buf, &US) {
                Ok(Packet::Udp(d)) => {
                    assert_eq!(d.src, Endpoint::new(PEER.ip, *src_port));
                    assert_eq!(d.dst, to);
                    assert_eq!(d.payload, payload, "UDP payload changed on the way");
                }
                other => panic!("built UDP parsed as {other:?}"),
            }
        }
        Kind::Tcp {
            src_port,
            dst_port,
            seq,
            ack,
            syn,
            fin,
            rst,
            psh,
            window,
            mss,
            window_scale,
            timestamp,
            payload,
        } => {
            let mut segment = Segment::new(Seq(*seq));
            segment.ack = ack.map(Seq);
            segment.flags = Flags {
                syn: *syn,
                fin: *fin,
                rst: *rst,
                psh: *psh,
            };
            segment.window = *window;
            segment.mss = *mss;
            segment.window_scale = *window_scale;
            segment.timestamp = timestamp.map(|(value, echo)| Timestamp { value, echo });
            segment.payload = &payload[..payload.len().min(1400)];
            let to = Endpoint::new(US.ip, *dst_port);
            let len = tx::tcp_segment(&mut buf, &PEER, US.mac, *src_port, to, &segment).ok()?;
            assert_eq!(len, tx::tcp_frame_len(&segment));
            buf.truncate(len);
            let valid = *src_port != 0
                && *dst_port != 0
                && u8::from(*syn) + u8::from(*fin) + u8::from(*rst) <= 1;
            match parse(&buf, &US) {
                Ok(Packet::Tcp(t)) => {
                    assert!(valid, "a TCP segment parsed that should be dropped: {t:?}");
                    assert_eq!(t.src, Endpoint::new(PEER.ip, *src_port));
                    assert_eq!(t.dst, to);
                    // The parser keeps MSS and window scale of a SYN only
                    // (RFC 9293 §3.7.1, RFC 7323 §2.2), the shift at most 14.
                    let mut expected = segment;
                    expected.mss = segment.mss.filter(|_| *syn);
                    expected.window_scale =
                        segment.window_scale.filter(|_| *syn).map(|s| s.min(14));
                    assert_eq!(t.segment, expected, "TCP segment changed on the way");
                }
                Err(drop) => assert!(!valid, "built TCP segment dropped: {drop}"),
                Ok(other) => panic!("built TCP parsed as {other:?}"),
            }
        }
        Kind::ArpRequest { target } => {
            let ip = if target & 1 == 0 {
                US.ip
            } else {
                Ipv4Addr::new(10, 0, 0, *target)
            };
            let len = tx::arp_request(&mut buf, &PEER, ip).ok()?;
            buf.truncate(len);
            match parse(&buf, &US) {
                Ok(Packet::Arp(m)) => {
                    assert_eq!(ip, US.ip);
                    assert_eq!((m.sender_mac, m.sender_ip), (PEER.mac, PEER.ip));
                }
                Err(drop) => assert_ne!(ip, US.ip, "our ARP request dropped: {drop}"),
                Ok(other) => panic!("built ARP parsed as {other:?}"),
            }
        }
        Kind::EchoRequest {
            ident,
            seq_no,
            payload,
        } => {
            let frame = echo_request(*ident, *seq_no, &payload[..payload.len().min(1400)]);
            match parse(&frame, &US) {
                Ok(Packet::IcmpEchoRequest(r)) => {
                    assert_eq!((r.ident, r.seq_no), (*ident, *seq_no));
                    assert_eq!(r.payload, &frame[L4 + 8..]);
                }
                other => panic!("built echo request parsed as {other:?}"),
            }
            return Some(frame);
        }
    }
    Some(buf)
}

/// An ICMP echo request from the peer, written byte by byte (the stack
/// builds only replies).
fn echo_request(ident: u16, seq_no: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(L4 + 8 + payload.len());
    f.extend_from_slice(&US.mac.0);
    f.extend_from_slice(&PEER.mac.0);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 1, 0, 0]);
    f.extend_from_slice(&PEER.ip.octets());
    f.extend_from_slice(&US.ip.octets());
    f.extend_from_slice(&[8, 0, 0, 0]);
    f.extend_from_slice(&ident.to_be_bytes());
    f.extend_from_slice(&seq_no.to_be_bytes());
    f.extend_from_slice(payload);
    fix(&mut f);
    f
}

fn apply(frame: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::SetByte { at, value } => {
            if let Some(b) = frame.get_mut(usize::from(*at)) {
                *b = *value;
            }
        }
        Mutation::SetWord { at, value } => {
            let at = at.offset();
            if let Some(w) = frame.get_mut(at..at + 2) {
                w.copy_from_slice(&value.to_be_bytes());
            }
        }
        Mutation::Truncate { len } => frame.truncate(usize::from(*len)),
        Mutation::Extend { bytes } => frame.extend_from_slice(bytes),
    }
}

/// RFC 1071 over `bytes`, folded, not complemented.
fn sum(bytes: &[u8], mut acc: u32) -> u32 {
    for chunk in bytes.chunks(2) {
        acc += u32::from(u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

/// Makes the IPv4 header checksum and the ICMP, UDP or TCP checksum right
/// again after a mutation, where the headers say where they are.
pub(super) fn fix(frame: &mut [u8]) {
    if frame.len() < IP + 20 || frame[12..14] != [0x08, 0x00] {
        return;
    }
    let ihl = usize::from(frame[IP] & 0x0f) * 4;
    if ihl < 20 || frame.len() < IP + ihl {
        return;
    }
    frame[IP + 10..IP + 12].fill(0);
    let c = !(sum(&frame[IP..IP + ihl], 0) as u16);
    frame[IP + 10..IP + 12].copy_from_slice(&c.to_be_bytes());
    let total = usize::from(u16::from_be_bytes([frame[IP + 2], frame[IP + 3]]));
    let end = (IP + total).min(frame.len());
    let l4 = IP + ihl;
    if end <= l4 {
        return;
    }
    let (protocol, at) = match frame[IP + 9] {
        1 => (1u8, 2),
        17 => (17, 6),
        6 => (6, 16),
        _ => return,
    };
    if end < l4 + at + 2 {
        return;
    }
    frame[l4 + at..l4 + at + 2].fill(0);
    let mut acc = 0;
    if protocol != 1 {
        let mut pseudo = [0u8; 12];
        pseudo[..8].copy_from_slice(&frame[IP + 12..IP + 20]);
        pseudo[9] = protocol;
        pseudo[10..].copy_from_slice(&((end - l4) as u16).to_be_bytes());
        acc = sum(&pseudo, 0);
    }
    let c = !(sum(&frame[l4..end], acc) as u16);
    frame[l4 + at..l4 + at + 2].copy_from_slice(&c.to_be_bytes());
}

/// Parses `frame` and checks what came out; the outcome is the packet's
/// kind or the drop's.
fn check(frame: &[u8]) -> Outcome {
    let packet = match parse(frame, &US) {
        Ok(p) => p,
        Err(drop) => {
            // The reason must render (it goes to logs) and name a kind.
            let _ = drop.to_string();
            return drop.kind().name().into();
        }
    };
    let inside = |payload: &[u8]| {
        let (outer, inner) = (frame.as_ptr_range(), payload.as_ptr_range());
        assert!(
            outer.start <= inner.start && inner.end <= outer.end,
            "parse borrowed outside the frame"
        );
    };
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    match packet {
        Packet::Arp(m) => {
            // Answering it must work and be understood by the asker.
            let asker = Interface {
                mac: m.sender_mac,
                ip: m.sender_ip,
            };
            let len = tx::arp_reply(&mut buf, &US, &m).expect("ARP reply fits");
            if !m.sender_mac.is_broadcast() && !m.sender_mac.is_multicast() {
                match parse(&buf[..len], &asker) {
                    Ok(Packet::Arp(r)) => assert_eq!((r.sender_mac, r.sender_ip), (US.mac, US.ip)),
                    other => panic!("our ARP reply to {m:?} parsed as {other:?}"),
                }
            }
            "arp".into()
        }
        Packet::IcmpEchoRequest(r) => {
            inside(r.payload);
            let len = tx::icmp_echo_reply(&mut buf, &US, &r).expect("echo reply fits");
            assert!(len <= MAX_FRAME_LEN);
            "icmp-echo".into()
        }
        Packet::Udp(d) => {
            inside(d.payload);
            let sender = Interface {
                mac: d.src_mac,
                ip: d.src.ip,
            };
            let len = tx::udp_datagram(&mut buf, &sender, US.mac, d.src.port, d.dst, d.payload)
                .expect("a parsed UDP payload fits again");
            match parse(&buf[..len], &US) {
                Ok(Packet::Udp(again)) => assert_eq!(again, d, "UDP re-emitted differs"),
                other => panic!("UDP {d:?} re-emitted parsed as {other:?}"),
            }
            "udp".into()
        }
        Packet::Tcp(t) => {
            inside(t.segment.payload);
            let sender = Interface {
                mac: t.src_mac,
                ip: t.src.ip,
            };
            let Ok(len) = tx::tcp_segment(&mut buf, &sender, US.mac, t.src.port, t.dst, &t.segment)
            else {
                return "tcp-options-do-not-fit-again".into();
            };
            match parse(&buf[..len], &US) {
                Ok(Packet::Tcp(again)) => assert_eq!(again, t, "TCP re-emitted differs"),
                other => panic!("TCP {t:?} re-emitted parsed as {other:?}"),
            }
            "tcp".into()
        }
    }
}
