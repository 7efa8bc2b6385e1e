//! The wire layer of Ginza's network stack: pure code, no I/O.
//!
//! * [`parse`] classifies a received Ethernet frame into what the stack acts
//!   on ([`Packet`]: an ARP request/reply, an ICMP echo request, a UDP
//!   datagram, a TCP segment) or says why it was dropped ([`Drop`], counted by
//!   [`DropCounters`]).
//! * The builders in [`tx`] write ARP requests/replies, ICMP echo replies and
//!   UDP datagrams and TCP segments into a caller-provided buffer, without allocating.
//! * [`flow`] names a frame's flow for steering: the 5-tuple and its hash.
//! * [`ArpTable`] maps IPv4 addresses to MAC addresses: static entries from
//!   configuration, learned entries that expire, and a bounded queue of
//!   datagrams per address that is still being resolved.
//!
//! Header layouts and checksums come from `smoltcp::wire`; which frames we
//! accept, the order of the checks and the ARP policy are ours.
#![forbid(unsafe_code)]

mod addr;
pub mod arp;
pub mod flow;
pub mod rx;
pub mod tcp;
pub mod tx;

pub use addr::{Endpoint, Interface, MacAddr, MacAddrParseError};
pub use arp::{ArpConfig, ArpCounters, ArpTable, Resolution, StaticArpEntry};
pub use rx::{
    parse, ArpMessage, ArpOperation, Drop, DropCounters, DropKind, EchoRequest, Layer, Packet,
    UdpDatagram,
};
pub use std::net::Ipv4Addr;
pub use tcp::TcpFrame;
pub use tx::BuildError;

/// The largest IPv4 packet we send or accept, in bytes (standard Ethernet).
pub const MTU: usize = 1500;
/// Ethernet II header: destination MAC, source MAC, ethertype.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// The largest frame we accept: an MTU-sized packet behind an Ethernet header
/// (the frame check sequence is stripped by the NIC).
pub const MAX_FRAME_LEN: usize = ETHERNET_HEADER_LEN + MTU;
/// IPv4 header without options, which is all we emit.
pub const IPV4_HEADER_LEN: usize = 20;
/// UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Where a UDP payload starts in a frame we build: callers that assemble the
/// payload in place write it here and call [`tx::write_udp_headers`].
pub const UDP_PAYLOAD_OFFSET: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
/// The largest UDP payload that fits in one unfragmented datagram.
pub const MAX_UDP_PAYLOAD: usize = MTU - IPV4_HEADER_LEN - UDP_HEADER_LEN;
/// An ARP packet for IPv4 over Ethernet.
pub const ARP_PACKET_LEN: usize = 28;
/// An Ethernet frame carrying an ARP packet (before padding to 60 bytes, which
/// the NIC adds).
pub const ARP_FRAME_LEN: usize = ETHERNET_HEADER_LEN + ARP_PACKET_LEN;
