//! `parse` must return on any input; an accepted frame's builders must not
//! fail on what it produced. Seeds: the frames in ../tests/corpus (hex).
#![no_main]

use ginza_net::{parse, tx, Interface, MacAddr, Packet};
use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;

const US: Interface = Interface { mac: MacAddr([0x02, 0, 0, 0, 0, 0x01]), ip: Ipv4Addr::new(10, 0, 0, 1) };

fuzz_target!(|frame: &[u8]| {
    let mut reply = [0u8; ginza_net::MAX_FRAME_LEN];
    match parse(frame, &US) {
        Ok(Packet::Arp(message)) => {
            tx::arp_reply(&mut reply, &US, &message).expect("an ARP reply fits any frame buffer");
        }
        Ok(Packet::IcmpEchoRequest(request)) => {
            tx::icmp_echo_reply(&mut reply, &US, &request).expect("a reply is as long as its accepted request");
        }
        Ok(Packet::Udp(_)) | Err(_) => {}
    }
});
