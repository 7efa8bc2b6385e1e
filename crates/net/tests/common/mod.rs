//! Frames and addresses shared by the integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use ginza_net::{tx, Endpoint, Interface, MacAddr};
use std::net::Ipv4Addr;

pub const US: Interface = Interface {
    mac: MacAddr([0x02, 0, 0, 0, 0, 0x01]),
    ip: Ipv4Addr::new(10, 0, 0, 1),
};
pub const PEER: Interface = Interface {
    mac: MacAddr([0x02, 0, 0, 0, 0, 0x02]),
    ip: Ipv4Addr::new(10, 0, 0, 2),
};

/// Offsets into an Ethernet + IPv4 (no options) frame.
pub const IP: usize = 14;
pub const L4: usize = IP + 20;

/// A UDP datagram from PEER:5000 to US:7 as PEER would send it.
pub fn udp_frame(payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0; 1514];
    let len = tx::udp_datagram(
        &mut buf,
        &PEER,
        US.mac,
        5000,
        Endpoint::new(US.ip, 7),
        payload,
    )
    .unwrap();
    buf.truncate(len);
    buf
}

/// A TCP segment (ACK, PSH) from PEER:5000 to US:80 as PEER would send it.
pub fn tcp_frame(payload: &[u8]) -> Vec<u8> {
    let segment = ginza_net::tcp::Segment {
        ack: Some(ginza_net::tcp::Seq(2000)),
        flags: ginza_net::tcp::Flags {
            psh: true,
            ..Default::default()
        },
        window: 4096,
        payload,
        ..ginza_net::tcp::Segment::new(ginza_net::tcp::Seq(1000))
    };
    let mut buf = vec![0; 1514];
    let len = tx::tcp_segment(
        &mut buf,
        &PEER,
        US.mac,
        5000,
        Endpoint::new(US.ip, 80),
        &segment,
    )
    .unwrap();
    buf.truncate(len);
    buf
}

/// Recomputes the TCP checksum of an Ethernet + IPv4 (no options) + TCP
/// frame after a test has edited the segment on purpose.
pub fn fix_tcp_checksum(frame: &mut [u8]) {
    let tcp_len = frame.len() - L4;
    frame[L4 + 16..L4 + 18].fill(0);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&frame[IP + 12..IP + 20]);
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(tcp_len as u16).to_be_bytes());
    pseudo.extend_from_slice(&frame[L4..]);
    let checksum = internet_checksum(&pseudo);
    frame[L4 + 16..L4 + 18].copy_from_slice(&checksum.to_be_bytes());
}

/// An ICMP echo request from PEER to US, written byte by byte.
pub fn echo_request_frame(ident: u16, seq_no: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&US.mac.0);
    frame.extend_from_slice(&PEER.mac.0);
    frame.extend_from_slice(&[0x08, 0x00]);
    let total_len = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0];
    ip[2..4].copy_from_slice(&total_len.to_be_bytes());
    ip.extend_from_slice(&PEER.ip.octets());
    ip.extend_from_slice(&US.ip.octets());
    let checksum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    frame.extend_from_slice(&ip);
    let mut icmp = vec![8, 0, 0, 0];
    icmp.extend_from_slice(&ident.to_be_bytes());
    icmp.extend_from_slice(&seq_no.to_be_bytes());
    icmp.extend_from_slice(payload);
    let checksum = internet_checksum(&icmp);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());
    frame.extend_from_slice(&icmp);
    frame
}

/// RFC 1071, written out independently of smoltcp so the tests check the
/// crate's use rather than reuse it.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Recomputes the IPv4 header checksum of an Ethernet + IPv4 frame after a
/// test has edited the header on purpose.
pub fn fix_ip_checksum(frame: &mut [u8]) {
    let header_len = usize::from(frame[IP] & 0x0f) * 4;
    frame[IP + 10..IP + 12].fill(0);
    let checksum = internet_checksum(&frame[IP..IP + header_len]);
    frame[IP + 10..IP + 12].copy_from_slice(&checksum.to_be_bytes());
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(text: &str) -> Vec<u8> {
    assert!(text.len() % 2 == 0, "odd-length hex");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}
