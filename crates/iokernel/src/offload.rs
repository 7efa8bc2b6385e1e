//! What a NIC with checksum offload does, done by iokerneld while it
//! copies a frame out (docs/protected.md, "Transmit"): the netstack builds
//! headers without reading the payload, iokerneld fills in the TCP or UDP
//! checksum of the whole frame.

use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};

/// Fills in the L4 checksum of an Ethernet/IPv4/TCP-or-UDP frame; false
/// (frame untouched) for anything else or a malformed frame.
pub fn fill_l4_checksum(frame: &mut [u8]) -> bool {
    let Ok(mut eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return false;
    }
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload_mut()) else {
        return false;
    };
    let (src, dst, proto) = (ip.src_addr(), ip.dst_addr(), ip.next_header());
    let header_len = usize::from(ip.header_len());
    let total = usize::from(ip.total_len());
    let Some(l4) = ip.into_inner().get_mut(header_len..total) else {
        return false;
    };
    match proto {
        IpProtocol::Tcp => match TcpPacket::new_checked(l4) {
            Ok(mut t) => {
                t.fill_checksum(&src.into(), &dst.into());
                true
            }
            Err(_) => false,
        },
        IpProtocol::Udp => match UdpPacket::new_checked(l4) {
            Ok(mut u) => {
                u.fill_checksum(&src.into(), &dst.into());
                true
            }
            Err(_) => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ginza_net::tcp::{Segment, Seq};
    use ginza_net::{tx, Endpoint, Interface, Ipv4Addr, MacAddr, Packet};

    #[test]
    fn a_zeroed_checksum_is_filled_as_the_builder_would() {
        let me = Interface {
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            ip: Ipv4Addr::new(10, 0, 0, 1),
        };
        let peer = Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), 80);
        let mut seg = Segment::new(Seq(1000));
        seg.ack = Some(Seq(5));
        seg.payload = b"payload bytes";
        let mut buf = [0u8; 200];
        let n = tx::tcp_segment(&mut buf, &me, MacAddr([2, 0, 0, 0, 0, 2]), 7, peer, &seg).unwrap();
        let good = buf[..n].to_vec();
        // TCP checksum at 14 + 20 + 16.
        buf[50] = 0;
        buf[51] = 0;
        assert!(fill_l4_checksum(&mut buf[..n]));
        assert_eq!(&buf[..n], &good[..]);
        let peer_iface = Interface {
            mac: MacAddr([2, 0, 0, 0, 0, 2]),
            ip: peer.ip,
        };
        assert!(matches!(
            ginza_net::parse(&buf[..n], &peer_iface),
            Ok(Packet::Tcp(_))
        ));
        assert!(!fill_l4_checksum(&mut [0u8; 10]));
    }
}
