//! Flow identification for packet steering (docs/design.md, "Packet steering"):
//! a frame's flow key and its hash. What a hash steers to is a policy
//! decision (`ginza_policy::steer`); this is only the wire side.

use smoltcp::wire::ArpPacket;
use std::net::Ipv4Addr;

/// A flow identifier: the IPv4 5-tuple (ports 0 for protocols without).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src_ip: u32,
    pub dst_ip: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
}

/// Mixes a flow key into a well-spread 64-bit hash. NIC RSS uses a Toeplitz
/// hash; any hash with good avalanche gives the same balance statistics,
/// which is all `hash % n` steering depends on.
pub fn flow_hash(key: &FlowKey) -> u64 {
    let a = (u64::from(key.src_ip) << 32) | u64::from(key.dst_ip);
    let b = (u64::from(key.src_port) << 24) | (u64::from(key.dst_port) << 8) | u64::from(key.proto);
    mix64(a ^ mix64(b))
}

/// A strong 64-bit finalizer (the SplitMix64 one).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How iokerneld steers a frame that reached the port of the application
/// at `ip`: `None` for an ARP packet for another IP (a broadcast request
/// reaches every port; only the application with that IP keeps it), else
/// the flow hash (the low 32 bits of [`flow_hash`]) — the IPv4 5-tuple of
/// UDP and TCP frames, the IP pair of other IPv4 frames, 0 for the rest
/// (the runtime judges those).
#[inline]
pub fn steer_key(frame: &[u8], ip: Ipv4Addr) -> Option<u32> {
    // Fixed offsets, not smoltcp's wire types: this runs once per frame on
    // iokerneld's forwarding path, where the typed parse was a tenth of the
    // per-frame cost (docs/results.md, "Dataplane"). Same checks and same
    // hashes (the tests compare the two).
    const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
    const ETHERTYPE_ARP: [u8; 2] = [0x08, 0x06];
    let (Some(ethertype), Some(payload)) = (frame.get(12..14), frame.get(14..)) else {
        return Some(0);
    };
    match [ethertype[0], ethertype[1]] {
        ETHERTYPE_IPV4 => Some(ipv4_flow_hash(payload)),
        ETHERTYPE_ARP => {
            let for_other = ArpPacket::new_checked(payload)
                .is_ok_and(|arp| arp.target_protocol_addr() != ip.octets());
            (!for_other).then_some(0)
        }
        _ => Some(0),
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The 5-tuple hash of an IPv4 packet: the length checks of smoltcp's
/// `Ipv4Packet`, `UdpPacket` and `TcpPacket::new_checked` (0 for a packet
/// that fails the IP ones, ports 0 for a transport header that fails its
/// own), by hand.
fn ipv4_flow_hash(packet: &[u8]) -> u32 {
    const UDP: u8 = 17;
    const TCP: u8 = 6;
    let len = packet.len();
    if len < 20 {
        return 0;
    }
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    let total_len = usize::from(be16(packet, 2));
    if len < header_len || header_len > total_len || len < total_len {
        return 0;
    }
    let payload = &packet[header_len..total_len];
    let proto = packet[9];
    let ports_ok = match proto {
        UDP => {
            payload.len() >= 8 && {
                let field_len = usize::from(be16(payload, 4));
                payload.len() >= field_len && field_len >= 8
            }
        }
        TCP => {
            payload.len() >= 20 && {
                let tcp_header_len = usize::from(payload[12] >> 4) * 4;
                payload.len() >= tcp_header_len && tcp_header_len >= 20
            }
        }
        _ => false,
    };
    let (src_port, dst_port) = if ports_ok {
        (be16(payload, 0), be16(payload, 2))
    } else {
        (0, 0)
    };
    let key = FlowKey {
        src_ip: be32(packet, 12),
        dst_ip: be32(packet, 16),
        src_port,
        dst_port,
        proto,
    };
    flow_hash(&key) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{tx, Endpoint, Interface, MacAddr};

    fn udp_frame(src_port: u16) -> Vec<u8> {
        let mut buf = vec![0u8; 256];
        let me = Interface {
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            ip: Ipv4Addr::new(10, 0, 0, 1),
        };
        let dst = Endpoint {
            ip: Ipv4Addr::new(10, 0, 0, 2),
            port: 7,
        };
        let n = tx::udp_datagram(
            &mut buf,
            &me,
            MacAddr([2, 0, 0, 0, 0, 2]),
            src_port,
            dst,
            b"hi",
        )
        .unwrap();
        buf.truncate(n);
        buf
    }

    /// `steer_key` as it was written on smoltcp's typed parse: the
    /// reference the hand-written offsets must agree with.
    fn typed_steer_key(frame: &[u8], ip: Ipv4Addr) -> Option<u32> {
        use smoltcp::wire::{
            EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
        };
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return Some(0);
        };
        match eth.ethertype() {
            EthernetProtocol::Arp => {
                let for_other = ArpPacket::new_checked(eth.payload())
                    .is_ok_and(|arp| arp.target_protocol_addr() != ip.octets());
                (!for_other).then_some(0)
            }
            EthernetProtocol::Ipv4 => {
                let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                    return Some(0);
                };
                let ports = match ip.next_header() {
                    IpProtocol::Udp => UdpPacket::new_checked(ip.payload())
                        .map(|u| (u.src_port(), u.dst_port()))
                        .ok(),
                    IpProtocol::Tcp => TcpPacket::new_checked(ip.payload())
                        .map(|t| (t.src_port(), t.dst_port()))
                        .ok(),
                    _ => None,
                };
                let (src_port, dst_port) = ports.unwrap_or((0, 0));
                let key = FlowKey {
                    src_ip: u32::from_be_bytes(ip.src_addr().octets()),
                    dst_ip: u32::from_be_bytes(ip.dst_addr().octets()),
                    src_port,
                    dst_port,
                    proto: u8::from(ip.next_header()),
                };
                Some(flow_hash(&key) as u32)
            }
            _ => Some(0),
        }
    }

    #[test]
    fn the_offsets_agree_with_the_typed_parse() {
        let ip = Ipv4Addr::new(10, 0, 0, 2);
        let mut tcp = udp_frame(4242);
        tcp[23] = 6; // IP protocol: TCP
        let mut frames = vec![udp_frame(1000), tcp];
        frames[1].resize(14 + 20 + 40, 0);
        // Every byte of the headers set to a few telling values (lengths,
        // protocol numbers, header lengths), each frame cut everywhere.
        let mut cases = Vec::new();
        for base in &frames {
            for at in 0..base.len().min(14 + 20 + 24) {
                for v in [0u8, 1, 5, 6, 8, 17, 0x45, 0x4f, 0x50, 0xf0, 0xff] {
                    let mut f = base.clone();
                    f[at] = v;
                    cases.push(f);
                }
            }
        }
        for f in cases {
            for cut in 0..=f.len() {
                assert_eq!(
                    steer_key(&f[..cut], ip),
                    typed_steer_key(&f[..cut], ip),
                    "frame {:02x?}",
                    &f[..cut]
                );
            }
        }
    }

    #[test]
    fn flow_hash_is_stable() {
        let k = FlowKey {
            src_ip: 1,
            dst_ip: 2,
            src_port: 3,
            dst_port: 4,
            proto: 17,
        };
        assert_eq!(flow_hash(&k), flow_hash(&k));
        assert_ne!(flow_hash(&k), flow_hash(&FlowKey { src_port: 5, ..k }));
    }

    #[test]
    fn flow_hash_follows_the_five_tuple() {
        let frame_flow_hash = |f: &[u8]| steer_key(f, Ipv4Addr::new(10, 0, 0, 2)).unwrap();
        assert_eq!(
            frame_flow_hash(&udp_frame(1000)),
            frame_flow_hash(&udp_frame(1000))
        );
        let distinct: std::collections::HashSet<u32> = (1000..1064)
            .map(|p| frame_flow_hash(&udp_frame(p)))
            .collect();
        assert!(
            distinct.len() > 60,
            "{} distinct hashes of 64 flows",
            distinct.len()
        );
        // Truncated, non-IP, garbage: no panic, hash 0.
        let f = udp_frame(1);
        for cut in 0..f.len() {
            let _ = frame_flow_hash(&f[..cut]);
        }
        assert_eq!(frame_flow_hash(&[0xff; 10]), 0);
        // An ARP request is kept only by the port of its target IP.
        let mut arp = vec![0u8; 64];
        let me = Interface {
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            ip: Ipv4Addr::new(10, 0, 0, 1),
        };
        let n = tx::arp_request(&mut arp, &me, Ipv4Addr::new(10, 0, 0, 2)).unwrap();
        assert_eq!(steer_key(&arp[..n], Ipv4Addr::new(10, 0, 0, 2)), Some(0));
        assert_eq!(steer_key(&arp[..n], Ipv4Addr::new(10, 0, 0, 3)), None);
    }
}
