//! Build → parse round trips and hand-made frames for each builder and parser.

mod common;

use common::*;
use ginza_net::{
    parse, tx, ArpOperation, BuildError, Drop, Endpoint, MacAddr, Packet, MAX_UDP_PAYLOAD,
};
use std::net::Ipv4Addr;

#[test]
fn udp_round_trip() {
    let frame = udp_frame(b"hello");
    assert_eq!(frame.len(), 14 + 20 + 8 + 5);
    match parse(&frame, &US) {
        Ok(Packet::Udp(datagram)) => {
            assert_eq!(datagram.src_mac, PEER.mac);
            assert_eq!(datagram.src, Endpoint::new(PEER.ip, 5000));
            assert_eq!(datagram.dst, Endpoint::new(US.ip, 7));
            assert_eq!(datagram.payload, b"hello");
        }
        other => panic!("expected a UDP datagram, got {other:?}"),
    }
}

#[test]
fn udp_headers_match_an_independent_encoding() {
    let frame = udp_frame(b"hi");
    assert_eq!(&frame[0..6], &US.mac.0);
    assert_eq!(&frame[6..12], &PEER.mac.0);
    assert_eq!(&frame[12..14], &[0x08, 0x00]);
    // version/IHL, DSCP, total length 30, ident 0, DF, TTL 64, UDP
    assert_eq!(
        &frame[IP..IP + 10],
        &[0x45, 0, 0, 30, 0, 0, 0x40, 0, 64, 17]
    );
    assert_eq!(internet_checksum(&frame[IP..L4]), 0, "IPv4 header checksum");
    assert_eq!(&frame[L4..L4 + 6], &[0x13, 0x88, 0, 7, 0, 10]);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&frame[IP + 12..IP + 20]);
    pseudo.extend_from_slice(&[0, 17, 0, 10]);
    pseudo.extend_from_slice(&frame[L4..]);
    assert_eq!(
        internet_checksum(&pseudo),
        0,
        "UDP checksum over the pseudo-header"
    );
}

#[test]
fn udp_with_zero_checksum_is_accepted_and_padding_ignored() {
    let mut frame = udp_frame(b"abc");
    frame[L4 + 6..L4 + 8].fill(0);
    frame.resize(60, 0); // Ethernet minimum-size padding
    let Ok(Packet::Udp(datagram)) = parse(&frame, &US) else {
        panic!("padded datagram with no checksum")
    };
    assert_eq!(datagram.payload, b"abc");
}

#[test]
fn udp_in_place_headers_avoid_the_copy() {
    let mut buf = [0u8; 128];
    buf[ginza_net::UDP_PAYLOAD_OFFSET..][..4].copy_from_slice(b"ping");
    let len =
        tx::write_udp_headers(&mut buf, &PEER, US.mac, 9, Endpoint::new(US.ip, 10), 4).unwrap();
    assert_eq!(&buf[..len], &udp_frame_from(9, 10, b"ping")[..]);
}

fn udp_frame_from(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0; 200];
    let len = tx::udp_datagram(
        &mut buf,
        &PEER,
        US.mac,
        src_port,
        Endpoint::new(US.ip, dst_port),
        payload,
    )
    .unwrap();
    buf.truncate(len);
    buf
}

#[test]
fn builders_refuse_small_buffers_and_large_payloads() {
    let mut small = [0u8; 41];
    assert_eq!(
        tx::udp_datagram(&mut small, &US, PEER.mac, 1, Endpoint::new(PEER.ip, 2), &[]),
        Err(BuildError::BufferTooSmall {
            needed: 42,
            available: 41
        })
    );
    let mut big = vec![0u8; 4096];
    let payload = vec![0u8; MAX_UDP_PAYLOAD + 1];
    assert_eq!(
        tx::udp_datagram(
            &mut big,
            &US,
            PEER.mac,
            1,
            Endpoint::new(PEER.ip, 2),
            &payload
        ),
        Err(BuildError::PayloadTooLarge {
            len: MAX_UDP_PAYLOAD + 1,
            max: MAX_UDP_PAYLOAD
        })
    );
    let full = vec![7u8; MAX_UDP_PAYLOAD];
    let len = tx::udp_datagram(&mut big, &PEER, US.mac, 1, Endpoint::new(US.ip, 2), &full).unwrap();
    assert_eq!(len, ginza_net::MAX_FRAME_LEN);
    assert!(matches!(parse(&big[..len], &US), Ok(Packet::Udp(d)) if d.payload == &full[..]));
    assert!(tx::arp_request(&mut small[..41], &US, PEER.ip).is_err());
}

#[test]
fn arp_request_reply_round_trip() {
    let mut buf = [0u8; 64];
    let len = tx::arp_request(&mut buf, &PEER, US.ip).unwrap();
    assert_eq!(len, 42);
    assert_eq!(&buf[..6], &[0xff; 6], "requests are broadcast");
    let request = match parse(&buf[..len], &US) {
        Ok(Packet::Arp(message)) => message,
        other => panic!("expected ARP, got {other:?}"),
    };
    assert_eq!(request.operation, ArpOperation::Request);
    assert_eq!((request.sender_mac, request.sender_ip), (PEER.mac, PEER.ip));
    assert_eq!(
        (request.target_mac, request.target_ip),
        (MacAddr::ZERO, US.ip)
    );

    let mut reply_buf = [0u8; 64];
    let len = tx::arp_reply(&mut reply_buf, &US, &request).unwrap();
    assert_eq!(
        &reply_buf[..6],
        &PEER.mac.0,
        "replies are unicast to the asker"
    );
    let reply = match parse(&reply_buf[..len], &PEER) {
        Ok(Packet::Arp(message)) => message,
        other => panic!("expected ARP, got {other:?}"),
    };
    assert_eq!(reply.operation, ArpOperation::Reply);
    assert_eq!((reply.sender_mac, reply.sender_ip), (US.mac, US.ip));
    assert_eq!((reply.target_mac, reply.target_ip), (PEER.mac, PEER.ip));
}

#[test]
fn arp_hand_made_request() {
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&PEER.mac.0);
    frame.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    frame.extend_from_slice(&PEER.mac.0);
    frame.extend_from_slice(&[10, 0, 0, 2]);
    frame.extend_from_slice(&[0; 6]);
    frame.extend_from_slice(&[10, 0, 0, 1]);
    frame.resize(60, 0);
    let Ok(Packet::Arp(request)) = parse(&frame, &US) else {
        panic!("hand-made ARP request")
    };
    assert_eq!(request.sender_ip, PEER.ip);
    // The same request for someone else is not ours to answer.
    let other = ginza_net::Interface {
        ip: Ipv4Addr::new(10, 0, 0, 9),
        ..US
    };
    assert_eq!(parse(&frame, &other), Err(Drop::NotOurIp { dst: US.ip }));
    // Operation 3 (RARP request) is not ARP as we speak it.
    frame[14 + 7] = 3;
    assert!(matches!(
        parse(&frame, &US),
        Err(Drop::UnsupportedArp { operation: 3, .. })
    ));
}

#[test]
fn icmp_echo_round_trip() {
    let frame = echo_request_frame(0x1234, 7, b"abcdefgh");
    let request = match parse(&frame, &US) {
        Ok(Packet::IcmpEchoRequest(request)) => request,
        other => panic!("expected an echo request, got {other:?}"),
    };
    assert_eq!(
        (request.ident, request.seq_no, request.payload),
        (0x1234, 7, &b"abcdefgh"[..])
    );
    assert_eq!(
        (request.src_mac, request.src_ip, request.dst_ip),
        (PEER.mac, PEER.ip, US.ip)
    );

    let mut buf = [0u8; 128];
    let len = tx::icmp_echo_reply(&mut buf, &US, &request).unwrap();
    let reply = &buf[..len];
    assert_eq!(len, frame.len());
    assert_eq!(&reply[..6], &PEER.mac.0);
    assert_eq!(internet_checksum(&reply[IP..L4]), 0);
    assert_eq!(internet_checksum(&reply[L4..]), 0);
    assert_eq!(reply[L4], 0, "echo reply type");
    assert_eq!(
        &reply[L4 + 4..],
        &frame[L4 + 4..],
        "ident, sequence and payload are echoed"
    );
    // Our reply is not an echo request, so the peer's parser says so.
    assert_eq!(
        parse(reply, &PEER),
        Err(Drop::UnsupportedIcmp {
            message_type: 0,
            code: 0
        })
    );
}

#[test]
fn ip_options_are_skipped() {
    // Rebuild a datagram with a 4-byte option (NOP NOP NOP EOL) in the header.
    let plain = udp_frame(b"opt");
    let mut frame = plain[..L4].to_vec();
    frame[IP] = 0x46;
    frame.extend_from_slice(&[1, 1, 1, 0]);
    frame.extend_from_slice(&plain[L4..]);
    let total_len = (frame.len() - IP) as u16;
    frame[IP + 2..IP + 4].copy_from_slice(&total_len.to_be_bytes());
    fix_ip_checksum(&mut frame);
    let Ok(Packet::Udp(datagram)) = parse(&frame, &US) else {
        panic!("datagram with IP options")
    };
    assert_eq!(datagram.payload, b"opt");
}

#[test]
fn broadcast_and_foreign_macs() {
    let mut frame = udp_frame(b"x");
    frame[..6].copy_from_slice(&[0xff; 6]);
    assert!(parse(&frame, &US).is_ok(), "broadcast frames are looked at");
    frame[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x09]);
    assert_eq!(
        parse(&frame, &US),
        Err(Drop::NotOurMac {
            dst: MacAddr([2, 0, 0, 0, 0, 9])
        })
    );
    frame[..6].copy_from_slice(&[0x01, 0, 0x5e, 0, 0, 1]);
    assert!(matches!(parse(&frame, &US), Err(Drop::NotOurMac { .. })));
}

#[test]
fn drop_reasons_display_what_was_wrong() {
    let mut frame = udp_frame(b"x");
    frame[IP + 2..IP + 4].copy_from_slice(&200u16.to_be_bytes());
    fix_ip_checksum(&mut frame);
    let drop = parse(&frame, &US).unwrap_err();
    assert_eq!(
        drop.to_string(),
        "bad IPv4 total length 200: only 29 bytes present (truncated frame or bad length)"
    );
    assert_eq!(
        parse(&frame[..10], &US).unwrap_err().to_string(),
        "truncated Ethernet header: need 14 bytes, 10 present"
    );
}
