//! Classifying received frames.
//!
//! Every check reads through bounds we have established first, so no input
//! makes [`parse`] panic; smoltcp's accessors index without checking, which is
//! why each layer's length is validated here before its `Packet` view is made.

use crate::tcp::wire::{self, WireError};
use crate::tcp::TcpFrame;
use crate::{Endpoint, Interface, MacAddr, ETHERNET_HEADER_LEN, MAX_FRAME_LEN, UDP_HEADER_LEN};
use crate::{ARP_PACKET_LEN, IPV4_HEADER_LEN};
use smoltcp::wire::{
    ArpHardware, ArpOperation as WireArpOperation, ArpPacket, EthernetFrame, EthernetProtocol,
    Icmpv4Message, Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, UdpPacket,
};
use std::fmt;
use std::net::Ipv4Addr;

/// ICMP header: type, code, checksum, identifier, sequence number.
const ICMP_HEADER_LEN: usize = 8;

/// A frame the stack has to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    Arp(ArpMessage),
    IcmpEchoRequest(EchoRequest<'a>),
    Udp(UdpDatagram<'a>),
    Tcp(TcpFrame<'a>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    Request,
    Reply,
}

/// An ARP request or reply for IPv4 over Ethernet whose target is our IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpMessage {
    pub operation: ArpOperation,
    pub sender_mac: MacAddr,
    pub sender_ip: Ipv4Addr,
    pub target_mac: MacAddr,
    pub target_ip: Ipv4Addr,
}

/// An ICMP echo request ("ping") addressed to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoRequest<'a> {
    /// The Ethernet source, where the reply goes.
    pub src_mac: MacAddr,
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    pub ident: u16,
    pub seq_no: u16,
    pub payload: &'a [u8],
}

/// A UDP datagram addressed to us; `payload` borrows from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// The Ethernet source: the next hop a reply can go back to.
    pub src_mac: MacAddr,
    pub src: Endpoint,
    pub dst: Endpoint,
    pub payload: &'a [u8],
}

/// The header a [`Drop::Truncated`] frame ran out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Ethernet,
    Arp,
    Ipv4,
    Icmp,
    Udp,
    Tcp,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Ethernet => "Ethernet",
            Layer::Arp => "ARP",
            Layer::Ipv4 => "IPv4",
            Layer::Icmp => "ICMP",
            Layer::Udp => "UDP",
            Layer::Tcp => "TCP",
        })
    }
}

/// Why a received frame was dropped. The fields say what was seen, so a log
/// line is enough to tell a peer's bug from ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// The frame ends before the `layer` header does.
    Truncated {
        layer: Layer,
        needed: usize,
        available: usize,
    },
    /// Larger than an MTU-sized packet behind an Ethernet header.
    Oversized {
        len: usize,
    },
    /// Unicast to another MAC, or multicast (we join no groups).
    NotOurMac {
        dst: MacAddr,
    },
    /// An IPv4 packet, or an ARP packet's target, for another address.
    NotOurIp {
        dst: Ipv4Addr,
    },
    UnsupportedEtherType {
        ethertype: u16,
    },
    /// ARP for something other than IPv4 over Ethernet, or an operation
    /// other than request/reply.
    UnsupportedArp {
        hardware: u16,
        protocol: u16,
        hardware_len: u8,
        protocol_len: u8,
        operation: u16,
    },
    UnsupportedIpVersion {
        version: u8,
    },
    /// IHL below 5 words: the header cannot even hold its own fixed fields.
    BadIpHeaderLength {
        header_len: usize,
    },
    /// The IPv4 total length is smaller than the IPv4 header.
    IpTotalLengthBelowHeader {
        total_len: usize,
        header_len: usize,
    },
    /// The IPv4 total length claims more bytes than the frame holds (a
    /// truncated frame or a lying length field: they look the same).
    IpTotalLengthBeyondFrame {
        total_len: usize,
        available: usize,
    },
    BadIpChecksum,
    /// A fragment: we send with DF set and do not reassemble.
    Fragment {
        more_fragments: bool,
        offset: usize,
    },
    UnsupportedIpProtocol {
        protocol: u8,
    },
    /// ICMP other than echo request.
    UnsupportedIcmp {
        message_type: u8,
        code: u8,
    },
    BadIcmpChecksum,
    /// The UDP length field is below the UDP header or beyond the IPv4 payload.
    BadUdpLength {
        udp_len: usize,
        ip_payload_len: usize,
    },
    BadUdpChecksum,
    /// The TCP data offset is below the 20-byte fixed header.
    BadTcpDataOffset {
        header_len: usize,
    },
    /// A TCP option overruns the header or has an impossible length.
    BadTcpOptions {
        offset: usize,
    },
    BadTcpChecksum,
    /// More than one of SYN, FIN and RST.
    BadTcpFlags {
        syn: bool,
        fin: bool,
        rst: bool,
    },
    /// A TCP source or destination port of 0.
    TcpPortZero {
        src_port: u16,
        dst_port: u16,
    },
}

impl fmt::Display for Drop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Drop::Truncated { layer, needed, available } => {
                write!(f, "truncated {layer} header: need {needed} bytes, {available} present")
            }
            Drop::Oversized { len } => {
                write!(f, "oversized frame: {len} bytes, more than {MAX_FRAME_LEN} (MTU {})", crate::MTU)
            }
            Drop::NotOurMac { dst } => write!(f, "not for us: destination MAC {dst}"),
            Drop::NotOurIp { dst } => write!(f, "not for us: destination IP {dst}"),
            Drop::UnsupportedEtherType { ethertype } => write!(f, "unsupported ethertype 0x{ethertype:04x}"),
            Drop::UnsupportedArp { hardware, protocol, hardware_len, protocol_len, operation } => write!(
                f,
                "unsupported ARP: hardware {hardware} (len {hardware_len}), protocol 0x{protocol:04x} \
                 (len {protocol_len}), operation {operation}; only IPv4-over-Ethernet request/reply"
            ),
            Drop::UnsupportedIpVersion { version } => write!(f, "unsupported IP version {version}"),
            Drop::BadIpHeaderLength { header_len } => {
                write!(f, "bad IPv4 header length {header_len} bytes (minimum {IPV4_HEADER_LEN})")
            }
            Drop::IpTotalLengthBelowHeader { total_len, header_len } => {
                write!(f, "bad IPv4 total length {total_len}: smaller than its {header_len}-byte header")
            }
            Drop::IpTotalLengthBeyondFrame { total_len, available } => write!(
                f,
                "bad IPv4 total length {total_len}: only {available} bytes present (truncated frame or bad length)"
            ),
            Drop::BadIpChecksum => f.write_str("bad IPv4 header checksum"),
            Drop::Fragment { more_fragments, offset } => write!(
                f,
                "IPv4 fragment (offset {offset}, more fragments: {more_fragments}); reassembly is not supported"
            ),
            Drop::UnsupportedIpProtocol { protocol } => write!(f, "unsupported IP protocol {protocol}"),
            Drop::UnsupportedIcmp { message_type, code } => {
                write!(f, "unsupported ICMP message type {message_type} code {code}; only echo request")
            }
            Drop::BadIcmpChecksum => f.write_str("bad ICMP checksum"),
            Drop::BadUdpLength { udp_len, ip_payload_len } => write!(
                f,
                "bad UDP length {udp_len}: must be between {UDP_HEADER_LEN} and the IPv4 payload ({ip_payload_len})"
            ),
            Drop::BadUdpChecksum => f.write_str("bad UDP checksum"),
            Drop::BadTcpDataOffset { header_len } => WireError::BadDataOffset { header_len }.fmt(f),
            Drop::BadTcpOptions { offset } => WireError::BadOptions { offset }.fmt(f),
            Drop::BadTcpChecksum => WireError::BadChecksum.fmt(f),
            Drop::BadTcpFlags { syn, fin, rst } => WireError::BadFlags { syn, fin, rst }.fmt(f),
            Drop::TcpPortZero { src_port, dst_port } => WireError::PortZero { src_port, dst_port }.fmt(f),
        }
    }
}

impl std::error::Error for Drop {}

macro_rules! drop_kinds {
    ($($kind:ident => $name:literal,)*) => {
        /// A [`Drop`] reason without its details: what counters are kept by.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DropKind {
            $($kind,)*
        }

        impl DropKind {
            pub const ALL: &'static [DropKind] = &[$(DropKind::$kind,)*];

            /// A stable name for counters, logs and the test corpus.
            pub fn name(self) -> &'static str {
                match self {
                    $(DropKind::$kind => $name,)*
                }
            }

            pub fn from_name(name: &str) -> Option<DropKind> {
                Self::ALL.iter().copied().find(|kind| kind.name() == name)
            }
        }
    };
}

drop_kinds! {
    TruncatedEthernet => "truncated-ethernet",
    TruncatedArp => "truncated-arp",
    TruncatedIpv4 => "truncated-ipv4",
    TruncatedIcmp => "truncated-icmp",
    TruncatedUdp => "truncated-udp",
    TruncatedTcp => "truncated-tcp",
    Oversized => "oversized",
    NotOurMac => "not-our-mac",
    NotOurIp => "not-our-ip",
    UnsupportedEtherType => "unsupported-ethertype",
    UnsupportedArp => "unsupported-arp",
    UnsupportedIpVersion => "unsupported-ip-version",
    BadIpHeaderLength => "bad-ip-header-length",
    IpTotalLengthBelowHeader => "ip-total-length-below-header",
    IpTotalLengthBeyondFrame => "ip-total-length-beyond-frame",
    BadIpChecksum => "bad-ip-checksum",
    Fragment => "fragment",
    UnsupportedIpProtocol => "unsupported-ip-protocol",
    UnsupportedIcmp => "unsupported-icmp",
    BadIcmpChecksum => "bad-icmp-checksum",
    BadUdpLength => "bad-udp-length",
    BadUdpChecksum => "bad-udp-checksum",
    BadTcpDataOffset => "bad-tcp-data-offset",
    BadTcpOptions => "bad-tcp-options",
    BadTcpChecksum => "bad-tcp-checksum",
    BadTcpFlags => "bad-tcp-flags",
    TcpPortZero => "tcp-port-zero",
}

impl fmt::Display for DropKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Drop {
    pub fn kind(&self) -> DropKind {
        match self {
            Drop::Truncated { layer, .. } => match layer {
                Layer::Ethernet => DropKind::TruncatedEthernet,
                Layer::Arp => DropKind::TruncatedArp,
                Layer::Ipv4 => DropKind::TruncatedIpv4,
                Layer::Icmp => DropKind::TruncatedIcmp,
                Layer::Udp => DropKind::TruncatedUdp,
                Layer::Tcp => DropKind::TruncatedTcp,
            },
            Drop::Oversized { .. } => DropKind::Oversized,
            Drop::NotOurMac { .. } => DropKind::NotOurMac,
            Drop::NotOurIp { .. } => DropKind::NotOurIp,
            Drop::UnsupportedEtherType { .. } => DropKind::UnsupportedEtherType,
            Drop::UnsupportedArp { .. } => DropKind::UnsupportedArp,
            Drop::UnsupportedIpVersion { .. } => DropKind::UnsupportedIpVersion,
            Drop::BadIpHeaderLength { .. } => DropKind::BadIpHeaderLength,
            Drop::IpTotalLengthBelowHeader { .. } => DropKind::IpTotalLengthBelowHeader,
            Drop::IpTotalLengthBeyondFrame { .. } => DropKind::IpTotalLengthBeyondFrame,
            Drop::BadIpChecksum => DropKind::BadIpChecksum,
            Drop::Fragment { .. } => DropKind::Fragment,
            Drop::UnsupportedIpProtocol { .. } => DropKind::UnsupportedIpProtocol,
            Drop::UnsupportedIcmp { .. } => DropKind::UnsupportedIcmp,
            Drop::BadIcmpChecksum => DropKind::BadIcmpChecksum,
            Drop::BadUdpLength { .. } => DropKind::BadUdpLength,
            Drop::BadUdpChecksum => DropKind::BadUdpChecksum,
            Drop::BadTcpDataOffset { .. } => DropKind::BadTcpDataOffset,
            Drop::BadTcpOptions { .. } => DropKind::BadTcpOptions,
            Drop::BadTcpChecksum => DropKind::BadTcpChecksum,
            Drop::BadTcpFlags { .. } => DropKind::BadTcpFlags,
            Drop::TcpPortZero { .. } => DropKind::TcpPortZero,
        }
    }
}

/// One counter per [`DropKind`]. Plain integers: each receive path owns its
/// counters and whoever reports them sums copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropCounters {
    counts: [u64; DropKind::ALL.len()],
}

impl Default for DropCounters {
    fn default() -> Self {
        DropCounters {
            counts: [0; DropKind::ALL.len()],
        }
    }
}

impl DropCounters {
    pub fn record(&mut self, drop: &Drop) {
        self.counts[drop.kind() as usize] += 1;
    }

    pub fn get(&self, kind: DropKind) -> u64 {
        self.counts[kind as usize]
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Every reason with its count, zeros included, in a stable order.
    pub fn iter(&self) -> impl Iterator<Item = (DropKind, u64)> + '_ {
        DropKind::ALL.iter().map(|&kind| (kind, self.get(kind)))
    }

    /// Adds another path's counters to these.
    pub fn merge(&mut self, other: &DropCounters) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
    }
}

fn need(layer: Layer, needed: usize, available: usize) -> Result<(), Drop> {
    if available < needed {
        Err(Drop::Truncated {
            layer,
            needed,
            available,
        })
    } else {
        Ok(())
    }
}

/// Classifies a received Ethernet frame (without FCS) for `iface`.
///
/// Accepts frames unicast to our MAC or broadcast; ARP requests/replies whose
/// target is our IP; unfragmented IPv4 to our IP carrying an ICMP echo request
/// UDP or TCP. Anything else is a [`Drop`] saying why.
pub fn parse<'a>(frame: &'a [u8], iface: &Interface) -> Result<Packet<'a>, Drop> {
    need(Layer::Ethernet, ETHERNET_HEADER_LEN, frame.len())?;
    if frame.len() > MAX_FRAME_LEN {
        return Err(Drop::Oversized { len: frame.len() });
    }
    let ethernet = EthernetFrame::new_unchecked(frame);
    let dst_mac = MacAddr(ethernet.dst_addr().0);
    if dst_mac != iface.mac && !dst_mac.is_broadcast() {
        return Err(Drop::NotOurMac { dst: dst_mac });
    }
    let src_mac = MacAddr(ethernet.src_addr().0);
    let payload = ethernet.payload();
    match ethernet.ethertype() {
        EthernetProtocol::Arp => parse_arp(payload, iface).map(Packet::Arp),
        EthernetProtocol::Ipv4 => parse_ipv4(payload, src_mac, iface),
        other => Err(Drop::UnsupportedEtherType {
            ethertype: u16::from(other),
        }),
    }
}

fn parse_arp(bytes: &[u8], iface: &Interface) -> Result<ArpMessage, Drop> {
    need(Layer::Arp, ARP_PACKET_LEN, bytes.len())?;
    let arp = ArpPacket::new_unchecked(bytes);
    let operation = match arp.operation() {
        WireArpOperation::Request => Some(ArpOperation::Request),
        WireArpOperation::Reply => Some(ArpOperation::Reply),
        WireArpOperation::Unknown(_) => None,
    };
    let ipv4_over_ethernet = arp.hardware_type() == ArpHardware::Ethernet
        && arp.protocol_type() == EthernetProtocol::Ipv4
        && arp.hardware_len() == 6
        && arp.protocol_len() == 4;
    let operation = match operation {
        Some(operation) if ipv4_over_ethernet => operation,
        _ => {
            return Err(Drop::UnsupportedArp {
                hardware: u16::from(arp.hardware_type()),
                protocol: u16::from(arp.protocol_type()),
                hardware_len: arp.hardware_len(),
                protocol_len: arp.protocol_len(),
                operation: u16::from(arp.operation()),
            })
        }
    };
    // With the lengths checked to be 6 and 4, the address fields lie within
    // the 28 bytes established above.
    let ipv4 = |field: &[u8]| -> Ipv4Addr {
        <[u8; 4]>::try_from(field)
            .map(Ipv4Addr::from)
            .unwrap_or(Ipv4Addr::UNSPECIFIED)
    };
    let message = ArpMessage {
        operation,
        sender_mac: MacAddr::from_slice(arp.source_hardware_addr()).unwrap_or(MacAddr::ZERO),
        sender_ip: ipv4(arp.source_protocol_addr()),
        target_mac: MacAddr::from_slice(arp.target_hardware_addr()).unwrap_or(MacAddr::ZERO),
        target_ip: ipv4(arp.target_protocol_addr()),
    };
    if message.target_ip != iface.ip {
        return Err(Drop::NotOurIp {
            dst: message.target_ip,
        });
    }
    Ok(message)
}

fn parse_ipv4<'a>(
    bytes: &'a [u8],
    src_mac: MacAddr,
    iface: &Interface,
) -> Result<Packet<'a>, Drop> {
    need(Layer::Ipv4, IPV4_HEADER_LEN, bytes.len())?;
    let version = bytes[0] >> 4;
    if version != 4 {
        return Err(Drop::UnsupportedIpVersion { version });
    }
    let ip = Ipv4Packet::new_unchecked(bytes);
    let header_len = usize::from(ip.header_len());
    if header_len < IPV4_HEADER_LEN {
        return Err(Drop::BadIpHeaderLength { header_len });
    }
    need(Layer::Ipv4, header_len, bytes.len())?;
    let total_len = usize::from(ip.total_len());
    if total_len < header_len {
        return Err(Drop::IpTotalLengthBelowHeader {
            total_len,
            header_len,
        });
    }
    if total_len > bytes.len() {
        return Err(Drop::IpTotalLengthBeyondFrame {
            total_len,
            available: bytes.len(),
        });
    }
    // Options (header_len > 20) are covered by the checksum and then skipped:
    // nothing we accept needs them.
    if !ip.verify_checksum() {
        return Err(Drop::BadIpChecksum);
    }
    if ip.more_frags() || ip.frag_offset() != 0 {
        return Err(Drop::Fragment {
            more_fragments: ip.more_frags(),
            offset: usize::from(ip.frag_offset()),
        });
    }
    let dst_ip = ip.dst_addr();
    if dst_ip != iface.ip {
        return Err(Drop::NotOurIp { dst: dst_ip });
    }
    let src_ip = ip.src_addr();
    // Bytes past total_len are Ethernet padding and are not part of the packet.
    let payload = ip.payload();
    match ip.next_header() {
        IpProtocol::Icmp => {
            parse_icmp(payload, src_mac, src_ip, dst_ip).map(Packet::IcmpEchoRequest)
        }
        IpProtocol::Udp => parse_udp(payload, src_mac, src_ip, dst_ip).map(Packet::Udp),
        IpProtocol::Tcp => parse_tcp(payload, src_mac, src_ip, dst_ip).map(Packet::Tcp),
        other => Err(Drop::UnsupportedIpProtocol {
            protocol: u8::from(other),
        }),
    }
}

fn parse_icmp<'a>(
    bytes: &'a [u8],
    src_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
) -> Result<EchoRequest<'a>, Drop> {
    need(Layer::Icmp, ICMP_HEADER_LEN, bytes.len())?;
    let icmp = Icmpv4Packet::new_unchecked(bytes);
    if !icmp.verify_checksum() {
        return Err(Drop::BadIcmpChecksum);
    }
    if icmp.msg_type() != Icmpv4Message::EchoRequest || icmp.msg_code() != 0 {
        return Err(Drop::UnsupportedIcmp {
            message_type: u8::from(icmp.msg_type()),
            code: icmp.msg_code(),
        });
    }
    Ok(EchoRequest {
        src_mac,
        src_ip,
        dst_ip,
        ident: icmp.echo_ident(),
        seq_no: icmp.echo_seq_no(),
        payload: icmp.data(),
    })
}

fn parse_udp<'a>(
    bytes: &'a [u8],
    src_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
) -> Result<UdpDatagram<'a>, Drop> {
    need(Layer::Udp, UDP_HEADER_LEN, bytes.len())?;
    let udp = UdpPacket::new_unchecked(bytes);
    let udp_len = usize::from(udp.len());
    if udp_len < UDP_HEADER_LEN || udp_len > bytes.len() {
        return Err(Drop::BadUdpLength {
            udp_len,
            ip_payload_len: bytes.len(),
        });
    }
    // A zero checksum means the sender computed none (RFC 768); smoltcp's
    // verify_checksum accepts it.
    if !udp.verify_checksum(&IpAddress::Ipv4(src_ip), &IpAddress::Ipv4(dst_ip)) {
        return Err(Drop::BadUdpChecksum);
    }
    Ok(UdpDatagram {
        src_mac,
        src: Endpoint::new(src_ip, udp.src_port()),
        dst: Endpoint::new(dst_ip, udp.dst_port()),
        payload: udp.payload(),
    })
}

fn parse_tcp<'a>(
    bytes: &'a [u8],
    src_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
) -> Result<TcpFrame<'a>, Drop> {
    let header = wire::parse(bytes, src_ip, dst_ip).map_err(|e| match e {
        WireError::Truncated { needed, available } => Drop::Truncated {
            layer: Layer::Tcp,
            needed,
            available,
        },
        WireError::BadDataOffset { header_len } => Drop::BadTcpDataOffset { header_len },
        WireError::BadOptions { offset } => Drop::BadTcpOptions { offset },
        WireError::BadChecksum => Drop::BadTcpChecksum,
        WireError::BadFlags { syn, fin, rst } => Drop::BadTcpFlags { syn, fin, rst },
        WireError::PortZero { src_port, dst_port } => Drop::TcpPortZero { src_port, dst_port },
    })?;
    Ok(TcpFrame {
        src_mac,
        src: Endpoint::new(src_ip, header.src_port),
        dst: Endpoint::new(dst_ip, header.dst_port),
        segment: header.segment,
    })
}
