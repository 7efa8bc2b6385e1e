//! The checked-in corpus of malformed frames in tests/corpus/: each line is
//! `<drop-kind> <frame as hex>`, and `parse` must drop the frame for exactly
//! that reason. The files are written by `regenerate_corpus` (run it with
//! `cargo test -p ginza-net --test corpus -- --ignored` after a deliberate
//! change) and double as seeds for the fuzz target.

mod common;

use common::*;
use ginza_net::{parse, DropKind};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

#[test]
fn every_corpus_frame_drops_for_its_reason() {
    let mut seen = BTreeMap::new();
    let mut entries: Vec<_> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
    {
        let text = std::fs::read_to_string(path).unwrap();
        for (number, line) in text.lines().enumerate() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let location = format!("{}:{}", path.display(), number + 1);
            let (name, hex) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("{location}: expected `<kind> <hex>`"));
            let expected = DropKind::from_name(name)
                .unwrap_or_else(|| panic!("{location}: unknown drop kind {name}"));
            let frame = from_hex(hex);
            match parse(&frame, &US) {
                Err(drop) => assert_eq!(drop.kind(), expected, "{location}: dropped as `{drop}`"),
                Ok(packet) => panic!("{location}: accepted as {packet:?}, expected {expected}"),
            }
            *seen.entry(expected.name()).or_insert(0) += 1;
        }
    }
    let missing: Vec<_> = DropKind::ALL
        .iter()
        .filter(|k| !seen.contains_key(k.name()))
        .collect();
    assert!(missing.is_empty(), "no corpus frame for {missing:?}");
}

/// One corpus file: a header comment and `(kind, frame)` lines.
struct CorpusFile {
    name: &'static str,
    about: &'static str,
    frames: Vec<(DropKind, Vec<u8>)>,
}

fn edited(frame: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut frame = frame.to_vec();
    edit(&mut frame);
    frame
}

fn set_total_len(frame: &mut [u8], total_len: u16) {
    frame[IP + 2..IP + 4].copy_from_slice(&total_len.to_be_bytes());
    fix_ip_checksum(frame);
}

fn corpus() -> Vec<CorpusFile> {
    use DropKind::*;
    let udp = udp_frame(b"corpus!");
    let tcp = tcp_frame(b"corpus!");
    // A header edit that keeps the checksum right, so the edit is what is seen.
    let tcp_edited = |edit: &dyn Fn(&mut Vec<u8>)| {
        edited(&tcp, |f| {
            edit(f);
            fix_tcp_checksum(f);
        })
    };
    // Four option bytes inserted after the fixed header (data offset 6).
    let tcp_options = |options: [u8; 4]| {
        tcp_edited(&|f| {
            f.splice(L4 + 20..L4 + 20, options);
            f[L4 + 12] = 0x60;
            let total_len = (f.len() - IP) as u16;
            f[IP + 2..IP + 4].copy_from_slice(&total_len.to_be_bytes());
            fix_ip_checksum(f);
        })
    };
    let echo = echo_request_frame(1, 1, b"ping");
    let mut arp = vec![0u8; 64];
    let arp_len = ginza_net::tx::arp_request(&mut arp, &PEER, US.ip).unwrap();
    arp.truncate(arp_len);

    let truncated_udp = (0..udp.len())
        .map(|len| {
            let kind = match len {
                0..14 => TruncatedEthernet,
                14..34 => TruncatedIpv4,
                _ => IpTotalLengthBeyondFrame,
            };
            (kind, udp[..len].to_vec())
        })
        .collect();
    let truncated_other = vec![
        (TruncatedArp, arp[..arp_len - 1].to_vec()),
        (TruncatedArp, arp[..14].to_vec()),
        (
            TruncatedIcmp,
            edited(&echo[..L4 + 4], |f| set_total_len(f, 24)),
        ),
        (
            TruncatedUdp,
            edited(&udp[..L4 + 7], |f| set_total_len(f, 27)),
        ),
        // IHL says 24 bytes of header, the frame holds 20.
        (TruncatedIpv4, edited(&udp[..L4], |f| f[IP] = 0x46)),
    ];
    let tcp_file = CorpusFile {
        name: "tcp",
        about: "TCP headers cut short, with bad data offsets, overrunning options, bad checksums, flags or ports",
        frames: vec![
            (TruncatedTcp, edited(&tcp[..L4 + 19], |f| set_total_len(f, 39))),
            (TruncatedTcp, tcp_edited(&|f| f[L4 + 12] = 0xf0)),
            (BadTcpDataOffset, tcp_edited(&|f| f[L4 + 12] = 0x40)),
            (BadTcpDataOffset, tcp_edited(&|f| f[L4 + 12] = 0x00)),
            (BadTcpOptions, tcp_options([1, 1, 2, 4])),
            (BadTcpOptions, tcp_options([8, 12, 0, 0])),
            (BadTcpOptions, tcp_options([2, 3, 5, 0])),
            (BadTcpChecksum, edited(&tcp, |f| f[L4 + 20] ^= 1)),
            (BadTcpChecksum, edited(&tcp, |f| f[L4 + 4] ^= 0x80)),
            (BadTcpFlags, tcp_edited(&|f| f[L4 + 13] = 0x03)),
            (BadTcpFlags, tcp_edited(&|f| f[L4 + 13] = 0x06)),
            (BadTcpFlags, tcp_edited(&|f| f[L4 + 13] = 0x15)),
            (TcpPortZero, tcp_edited(&|f| f[L4..L4 + 2].fill(0))),
            (TcpPortZero, tcp_edited(&|f| f[L4 + 2..L4 + 4].fill(0))),
        ],
    };
    vec![
        tcp_file,
        CorpusFile { name: "truncated_udp", about: "a valid UDP frame cut at every length", frames: truncated_udp },
        CorpusFile { name: "truncated_other", about: "ARP, ICMP and UDP headers cut short", frames: truncated_other },
        CorpusFile {
            name: "bad_checksums",
            about: "one bit flipped in each checksummed header",
            frames: vec![
                (BadIpChecksum, edited(&udp, |f| f[IP + 8] ^= 1)),
                (BadIpChecksum, edited(&udp, |f| f[IP + 10] ^= 0x80)),
                (BadUdpChecksum, edited(&udp, |f| f[L4 + 8] ^= 1)),
                (BadUdpChecksum, edited(&udp, |f| f[L4 + 6] ^= 1)),
                (BadIcmpChecksum, edited(&echo, |f| f[L4 + 8] ^= 1)),
            ],
        },
        CorpusFile {
            name: "bad_lengths",
            about: "IHL below 5, IPv4 total length beyond the frame or below the header, UDP length out of range",
            frames: (0..5u8)
                .map(|ihl| (BadIpHeaderLength, edited(&udp, |f| f[IP] = 0x40 | ihl)))
                .chain([
                    (IpTotalLengthBeyondFrame, edited(&udp, |f| set_total_len(f, (udp.len() - IP + 1) as u16))),
                    (IpTotalLengthBeyondFrame, edited(&udp, |f| set_total_len(f, u16::MAX))),
                    (IpTotalLengthBelowHeader, edited(&udp, |f| set_total_len(f, 19))),
                    (IpTotalLengthBelowHeader, edited(&udp, |f| set_total_len(f, 0))),
                    (BadUdpLength, edited(&udp, |f| f[L4 + 4..L4 + 6].copy_from_slice(&7u16.to_be_bytes()))),
                    (BadUdpLength, edited(&udp, |f| f[L4 + 4..L4 + 6].copy_from_slice(&16u16.to_be_bytes()))),
                ])
                .collect(),
        },
        CorpusFile {
            name: "fragments",
            about: "first, middle and last fragments",
            frames: vec![
                (Fragment, edited(&udp, |f| { f[IP + 6] = 0x20; fix_ip_checksum(f) })),
                (Fragment, edited(&udp, |f| { f[IP + 6..IP + 8].copy_from_slice(&[0x20, 0x10]); fix_ip_checksum(f) })),
                (Fragment, edited(&udp, |f| { f[IP + 6..IP + 8].copy_from_slice(&[0x00, 0xb9]); fix_ip_checksum(f) })),
            ],
        },
        CorpusFile {
            name: "unsupported",
            about: "ethertypes, IP versions, protocols, ICMP and ARP variants we do not handle",
            frames: vec![
                (UnsupportedEtherType, edited(&udp, |f| f[12..14].copy_from_slice(&[0x86, 0xdd]))),
                (UnsupportedEtherType, edited(&udp, |f| f[12..14].copy_from_slice(&[0x81, 0x00]))),
                (UnsupportedEtherType, edited(&udp, |f| f[12..14].fill(0))),
                (UnsupportedIpVersion, edited(&udp, |f| f[IP] = 0x65)),
                (UnsupportedIpProtocol, edited(&udp, |f| { f[IP + 9] = 47; fix_ip_checksum(f) })),
                (UnsupportedIcmp, edited(&echo, |f| { f[L4] = 0; f[L4 + 2] = f[L4 + 2].wrapping_add(8) })),
                (UnsupportedArp, edited(&arp, |f| f[14 + 1] = 6)),
                (UnsupportedArp, edited(&arp, |f| f[14 + 4] = 8)),
                (UnsupportedArp, edited(&arp, |f| f[14 + 7] = 3)),
            ],
        },
        CorpusFile {
            name: "not_for_us",
            about: "frames for another MAC or IP, and frames over the MTU",
            frames: vec![
                (NotOurMac, edited(&udp, |f| f[5] = 0x77)),
                (NotOurMac, edited(&udp, |f| f[0] = 0x01)),
                (NotOurIp, edited(&udp, |f| { f[IP + 19] = 0x77; fix_ip_checksum(f) })),
                (NotOurIp, edited(&arp, |f| f[14 + 27] = 0x77)),
                (Oversized, edited(&udp, |f| f.resize(ginza_net::MAX_FRAME_LEN + 1, 0))),
                (Oversized, edited(&udp, |f| f.resize(9018, 0))),
            ],
        },
    ]
}

#[test]
#[ignore = "rewrites tests/corpus; run deliberately"]
fn regenerate_corpus() {
    for file in corpus() {
        let mut text = format!(
            "# {}\n# <drop-kind> <frame hex>, checked by tests/corpus.rs\n",
            file.about
        );
        for (kind, frame) in &file.frames {
            writeln!(text, "{} {}", kind.name(), to_hex(frame)).unwrap();
        }
        std::fs::write(corpus_dir().join(format!("{}.txt", file.name)), text).unwrap();
    }
}
