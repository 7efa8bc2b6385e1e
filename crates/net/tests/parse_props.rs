//! Properties: `parse` returns (never panics) on any input, and whatever the
//! builders write parses back to what was built.

mod common;

use common::*;
use ginza_net::{parse, tx, Endpoint, Interface, MacAddr, Packet, MAX_UDP_PAYLOAD};
use proptest::prelude::*;
use std::net::Ipv4Addr;

/// Valid frames of every kind we accept, to mutate.
fn seeds() -> Vec<Vec<u8>> {
    let mut arp = vec![0u8; 64];
    let len = tx::arp_request(&mut arp, &PEER, US.ip).unwrap();
    arp.truncate(len);
    vec![
        udp_frame(b"seed payload"),
        udp_frame(b""),
        echo_request_frame(9, 9, b"ping ping"),
        arp,
        tcp_frame(b"seed segment"),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    SetByte {
        at: usize,
        value: u8,
    },
    Truncate {
        len: usize,
    },
    Extend {
        bytes: Vec<u8>,
    },
    /// Overwrite a 16-bit field where length fields live (IPv4 total length,
    /// UDP length) or anywhere else.
    SetWord {
        at: usize,
        value: u16,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (0..64usize, any::<u8>()).prop_map(|(at, value)| Mutation::SetByte { at, value }),
        1 => (0..64usize).prop_map(|len| Mutation::Truncate { len }),
        1 => proptest::collection::vec(any::<u8>(), 0..32).prop_map(|bytes| Mutation::Extend { bytes }),
        2 => (prop_oneof![Just(IP + 2), Just(L4 + 4), 0..64usize], any::<u16>())
            .prop_map(|(at, value)| Mutation::SetWord { at, value }),
    ]
}

fn apply(frame: &mut Vec<u8>, mutation: &Mutation) {
    match mutation {
        Mutation::SetByte { at, value } => {
            if let Some(byte) = frame.get_mut(*at) {
                *byte = *value;
            }
        }
        Mutation::Truncate { len } => frame.truncate(*len),
        Mutation::Extend { bytes } => frame.extend_from_slice(bytes),
        Mutation::SetWord { at, value } => {
            if let Some(word) = frame.get_mut(*at..*at + 2) {
                word.copy_from_slice(&value.to_be_bytes());
            }
        }
    }
}

/// Whatever `parse` borrows must come from inside the frame.
fn check_borrows_within(frame: &[u8], packet: &Packet<'_>) {
    let payload = match packet {
        Packet::Udp(datagram) => datagram.payload,
        Packet::IcmpEchoRequest(request) => request.payload,
        Packet::Tcp(tcp) => tcp.segment.payload,
        Packet::Arp(_) => return,
    };
    let range = frame.as_ptr_range();
    let inner = payload.as_ptr_range();
    assert!(range.start <= inner.start && inner.end <= range.end);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..1600)) {
        if let Ok(packet) = parse(&frame, &US) {
            check_borrows_within(&frame, &packet);
        }
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        seed in 0..5usize,
        mutations in proptest::collection::vec(mutation(), 1..6),
        fix_checksum in any::<bool>(),
    ) {
        let mut frame = seeds().swap_remove(seed);
        for m in &mutations {
            apply(&mut frame, m);
        }
        // Without this most IP-level mutations would stop at the checksum
        // and never reach the length and protocol checks behind it.
        if fix_checksum && frame.len() >= L4 && frame[IP] >> 4 == 4 && frame[IP] & 0x0f >= 5 {
            let header_end = IP + usize::from(frame[IP] & 0x0f) * 4;
            if header_end <= frame.len() {
                fix_ip_checksum(&mut frame);
            }
        }
        if fix_checksum && seed == 4 && frame.len() >= L4 + 20 && frame[IP] == 0x45 {
            fix_tcp_checksum(&mut frame);
        }
        if let Ok(packet) = parse(&frame, &US) {
            check_borrows_within(&frame, &packet);
        }
    }

    #[test]
    fn tcp_build_parse_round_trip(
        src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
        src_port in 1..=u16::MAX, dst_port in 1..=u16::MAX,
        seq in any::<u32>(), ack in proptest::option::of(any::<u32>()),
        syn in any::<bool>(), window in any::<u16>(),
        payload in proptest::collection::vec(any::<u8>(), 0..=1452), // fits beside SYN options
    ) {
        use ginza_net::tcp::{Flags, Segment, Seq};
        let sender = Interface { mac: MacAddr([2, 1, 2, 3, 4, 5]), ip: Ipv4Addr::from(src) };
        let receiver = Interface { mac: MacAddr([2, 9, 8, 7, 6, 5]), ip: Ipv4Addr::from(dst) };
        let segment = Segment {
            seq: Seq(seq),
            ack: ack.map(Seq),
            flags: Flags { syn, psh: !payload.is_empty(), ..Flags::default() },
            window,
            mss: syn.then_some(1460),
            window_scale: syn.then_some(7),
            timestamp: None,
            sack_permitted: false,
            sack: ginza_net::tcp::SackBlocks::NONE,
            payload: &payload,
        };
        let mut buf = [0u8; ginza_net::MAX_FRAME_LEN];
        let len = tx::tcp_segment(&mut buf, &sender, receiver.mac, src_port, Endpoint::new(receiver.ip, dst_port), &segment).unwrap();
        prop_assert_eq!(len, tx::tcp_frame_len(&segment));
        match parse(&buf[..len], &receiver) {
            Ok(Packet::Tcp(tcp)) => {
                prop_assert_eq!(tcp.src, Endpoint::new(sender.ip, src_port));
                prop_assert_eq!(tcp.dst, Endpoint::new(receiver.ip, dst_port));
                prop_assert_eq!(tcp.src_mac, sender.mac);
                prop_assert_eq!(tcp.segment, segment);
            }
            other => prop_assert!(false, "expected TCP, got {:?}", other),
        }
    }

    #[test]
    fn udp_build_parse_round_trip(
        src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
        src_port in any::<u16>(), dst_port in any::<u16>(),
        payload in proptest::collection::vec(any::<u8>(), 0..=MAX_UDP_PAYLOAD),
    ) {
        let sender = Interface { mac: MacAddr([2, 1, 2, 3, 4, 5]), ip: Ipv4Addr::from(src) };
        let receiver = Interface { mac: MacAddr([2, 9, 8, 7, 6, 5]), ip: Ipv4Addr::from(dst) };
        let mut buf = [0u8; ginza_net::MAX_FRAME_LEN];
        let len = tx::udp_datagram(&mut buf, &sender, receiver.mac, src_port, Endpoint::new(receiver.ip, dst_port), &payload).unwrap();
        match parse(&buf[..len], &receiver) {
            Ok(Packet::Udp(datagram)) => {
                prop_assert_eq!(datagram.src, Endpoint::new(sender.ip, src_port));
                prop_assert_eq!(datagram.dst, Endpoint::new(receiver.ip, dst_port));
                prop_assert_eq!(datagram.src_mac, sender.mac);
                prop_assert_eq!(datagram.payload, &payload[..]);
            }
            other => prop_assert!(false, "expected UDP, got {:?}", other),
        }
    }
}
