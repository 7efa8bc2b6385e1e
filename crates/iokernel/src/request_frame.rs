//! What iokerneld reads of a frame for an application it dispatches
//! (docs/colocate.md): a request is a UDP datagram, its class a byte of
//! the payload. The dataplane holds such frames for the dispatcher and the
//! dispatcher reads their class; both ask here.

use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, UdpPacket};

/// The UDP payload of an Ethernet/IPv4/UDP frame; `None` for any other.
pub(crate) fn udp_payload(frame: &[u8]) -> Option<&[u8]> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Udp {
        return None;
    }
    let ip_payload = ip.payload();
    let udp = UdpPacket::new_checked(ip_payload).ok()?;
    let len = udp.payload().len();
    // Borrow from the frame, not from the wrapper.
    let start = ip_payload.len() - len;
    ip_payload.get(start..)
}

/// Whether `frame` is a request for a dispatched application (UDP to it).
pub(crate) fn is_request(frame: &[u8]) -> bool {
    udp_payload(frame).is_some()
}
