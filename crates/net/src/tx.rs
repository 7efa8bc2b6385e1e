//! Building frames into caller-provided buffers.
//!
//! Each builder writes a complete Ethernet frame at the start of `buf` and
//! returns its length. Nothing allocates: these run on the transmit path.
//! Frames shorter than the 60-byte Ethernet minimum are not padded here; the
//! NIC (or iokerneld's software switch) pads.

use crate::rx::{ArpMessage, EchoRequest};
use crate::tcp::{wire, Segment};
use crate::{Endpoint, Interface, MacAddr, ARP_FRAME_LEN, ETHERNET_HEADER_LEN, IPV4_HEADER_LEN};
use crate::{MAX_UDP_PAYLOAD, MTU, UDP_HEADER_LEN, UDP_PAYLOAD_OFFSET};
use smoltcp::wire::{
    ArpHardware, ArpOperation, ArpPacket, EthernetFrame, EthernetProtocol, Icmpv4Message,
    Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, UdpPacket,
};
use std::net::Ipv4Addr;

const ICMP_HEADER_LEN: usize = 8;
/// What Linux uses; nothing we send needs to cross many routers.
const DEFAULT_TTL: u8 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("buffer too small: the frame needs {needed} bytes, the buffer has {available}")]
    BufferTooSmall { needed: usize, available: usize },
    #[error("payload of {len} bytes does not fit one unfragmented packet (at most {max})")]
    PayloadTooLarge { len: usize, max: usize },
}

fn frame_of(buf: &mut [u8], len: usize) -> Result<&mut [u8], BuildError> {
    let available = buf.len();
    buf.get_mut(..len).ok_or(BuildError::BufferTooSmall {
        needed: len,
        available,
    })
}

fn write_ethernet(frame: &mut [u8], dst: MacAddr, src: MacAddr, ethertype: EthernetProtocol) {
    let mut ethernet = EthernetFrame::new_unchecked(frame);
    ethernet.set_dst_addr(dst.to_wire());
    ethernet.set_src_addr(src.to_wire());
    ethernet.set_ethertype(ethertype);
}

/// Writes a 20-byte IPv4 header (no options) with its checksum at the start
/// of `packet`, which must be exactly the IPv4 packet.
fn write_ipv4(packet: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, protocol: IpProtocol) {
    let total_len = u16::try_from(packet.len()).expect("callers bound packets by the MTU");
    let mut ip = Ipv4Packet::new_unchecked(packet);
    ip.set_version(4);
    ip.set_header_len(IPV4_HEADER_LEN as u8);
    ip.set_dscp(0);
    ip.set_ecn(0);
    ip.set_total_len(total_len);
    // DF set and never fragmented, so the identification is unused (RFC 6864).
    ip.set_ident(0);
    ip.clear_flags();
    ip.set_dont_frag(true);
    ip.set_frag_offset(0);
    ip.set_hop_limit(DEFAULT_TTL);
    ip.set_next_header(protocol);
    ip.set_src_addr(src);
    ip.set_dst_addr(dst);
    ip.fill_checksum();
}

fn write_arp(
    buf: &mut [u8],
    iface: &Interface,
    operation: ArpOperation,
    eth_dst: MacAddr,
    target_mac: MacAddr,
    target_ip: Ipv4Addr,
) -> Result<usize, BuildError> {
    let frame = frame_of(buf, ARP_FRAME_LEN)?;
    write_ethernet(frame, eth_dst, iface.mac, EthernetProtocol::Arp);
    let mut arp = ArpPacket::new_unchecked(&mut frame[ETHERNET_HEADER_LEN..]);
    arp.set_hardware_type(ArpHardware::Ethernet);
    arp.set_protocol_type(EthernetProtocol::Ipv4);
    arp.set_hardware_len(6);
    arp.set_protocol_len(4);
    arp.set_operation(operation);
    arp.set_source_hardware_addr(&iface.mac.0);
    arp.set_source_protocol_addr(&iface.ip.octets());
    arp.set_target_hardware_addr(&target_mac.0);
    arp.set_target_protocol_addr(&target_ip.octets());
    Ok(ARP_FRAME_LEN)
}

/// A broadcast "who has `target_ip`? tell `iface.ip`".
pub fn arp_request(
    buf: &mut [u8],
    iface: &Interface,
    target_ip: Ipv4Addr,
) -> Result<usize, BuildError> {
    write_arp(
        buf,
        iface,
        ArpOperation::Request,
        MacAddr::BROADCAST,
        MacAddr::ZERO,
        target_ip,
    )
}

/// The reply to `request` (whose target [`crate::parse`] has checked is us),
/// unicast to its sender.
pub fn arp_reply(
    buf: &mut [u8],
    iface: &Interface,
    request: &ArpMessage,
) -> Result<usize, BuildError> {
    write_arp(
        buf,
        iface,
        ArpOperation::Reply,
        request.sender_mac,
        request.sender_mac,
        request.sender_ip,
    )
}

/// The echo reply to `request`: same identifier, sequence number and payload,
/// back to the sender's MAC and IP.
pub fn icmp_echo_reply(
    buf: &mut [u8],
    iface: &Interface,
    request: &EchoRequest<'_>,
) -> Result<usize, BuildError> {
    let max = MTU - IPV4_HEADER_LEN - ICMP_HEADER_LEN;
    if request.payload.len() > max {
        return Err(BuildError::PayloadTooLarge {
            len: request.payload.len(),
            max,
        });
    }
    let icmp_len = ICMP_HEADER_LEN + request.payload.len();
    let frame = frame_of(buf, ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + icmp_len)?;
    write_ethernet(frame, request.src_mac, iface.mac, EthernetProtocol::Ipv4);
    let (_, packet) = frame.split_at_mut(ETHERNET_HEADER_LEN);
    let mut icmp = Icmpv4Packet::new_unchecked(&mut packet[IPV4_HEADER_LEN..]);
    icmp.set_msg_type(Icmpv4Message::EchoReply);
    icmp.set_msg_code(0);
    icmp.set_echo_ident(request.ident);
    icmp.set_echo_seq_no(request.seq_no);
    icmp.data_mut().copy_from_slice(request.payload);
    icmp.fill_checksum();
    write_ipv4(packet, iface.ip, request.src_ip, IpProtocol::Icmp);
    Ok(frame.len())
}

/// A UDP datagram from `iface.ip:src_port` to `dst`, sent to `dst_mac` (from
/// the ARP table). The payload is copied; to avoid the copy, write it at
/// [`UDP_PAYLOAD_OFFSET`] and call [`write_udp_headers`].
pub fn udp_datagram(
    buf: &mut [u8],
    iface: &Interface,
    dst_mac: MacAddr,
    src_port: u16,
    dst: Endpoint,
    payload: &[u8],
) -> Result<usize, BuildError> {
    check_udp_fits(buf, payload.len())?;
    buf[UDP_PAYLOAD_OFFSET..UDP_PAYLOAD_OFFSET + payload.len()].copy_from_slice(payload);
    write_udp_headers(buf, iface, dst_mac, src_port, dst, payload.len())
}

fn check_udp_fits(buf: &[u8], payload_len: usize) -> Result<usize, BuildError> {
    if payload_len > MAX_UDP_PAYLOAD {
        return Err(BuildError::PayloadTooLarge {
            len: payload_len,
            max: MAX_UDP_PAYLOAD,
        });
    }
    let needed = UDP_PAYLOAD_OFFSET + payload_len;
    if buf.len() < needed {
        return Err(BuildError::BufferTooSmall {
            needed,
            available: buf.len(),
        });
    }
    Ok(needed)
}

/// Writes the Ethernet, IPv4 and UDP headers (and the UDP checksum) in front
/// of a `payload_len`-byte payload already at [`UDP_PAYLOAD_OFFSET`] in `buf`.
pub fn write_udp_headers(
    buf: &mut [u8],
    iface: &Interface,
    dst_mac: MacAddr,
    src_port: u16,
    dst: Endpoint,
    payload_len: usize,
) -> Result<usize, BuildError> {
    let frame_len = check_udp_fits(buf, payload_len)?;
    let frame = &mut buf[..frame_len];
    write_ethernet(frame, dst_mac, iface.mac, EthernetProtocol::Ipv4);
    let packet = &mut frame[ETHERNET_HEADER_LEN..];
    let mut udp = UdpPacket::new_unchecked(&mut packet[IPV4_HEADER_LEN..]);
    udp.set_src_port(src_port);
    udp.set_dst_port(dst.port);
    udp.set_len((UDP_HEADER_LEN + payload_len) as u16);
    udp.fill_checksum(&IpAddress::Ipv4(iface.ip), &IpAddress::Ipv4(dst.ip));
    write_ipv4(packet, iface.ip, dst.ip, IpProtocol::Udp);
    Ok(frame_len)
}

/// The frame [`tcp_segment`] writes for `segment`, in bytes.
pub fn tcp_frame_len(segment: &Segment<'_>) -> usize {
    ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + wire::header_len(segment) + segment.payload.len()
}

/// A TCP segment from `iface.ip:src_port` to `dst`, sent to `dst_mac`: the
/// Ethernet, IPv4 and TCP headers (checksums included) and the payload,
/// copied once.
pub fn tcp_segment(
    buf: &mut [u8],
    iface: &Interface,
    dst_mac: MacAddr,
    src_port: u16,
    dst: Endpoint,
    segment: &Segment<'_>,
) -> Result<usize, BuildError> {
    let max = MTU - IPV4_HEADER_LEN - wire::header_len(segment);
    if segment.payload.len() > max {
        return Err(BuildError::PayloadTooLarge {
            len: segment.payload.len(),
            max,
        });
    }
    let frame = frame_of(buf, tcp_frame_len(segment))?;
    write_ethernet(frame, dst_mac, iface.mac, EthernetProtocol::Ipv4);
    let packet = &mut frame[ETHERNET_HEADER_LEN..];
    // The length was computed from the same segment: `emit` accepts it.
    let written = wire::emit(
        &mut packet[IPV4_HEADER_LEN..],
        iface.ip,
        src_port,
        dst.ip,
        dst.port,
        segment,
    );
    debug_assert!(written.is_some());
    write_ipv4(packet, iface.ip, dst.ip, IpProtocol::Tcp);
    Ok(frame.len())
}
