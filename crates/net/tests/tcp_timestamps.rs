//! RFC 7323 timestamps towards a peer that offers them (Linux does), and
//! the loss-recovery case they exist for here: a sender without SACK takes
//! no RTT sample from the ACK of a retransmission (Karn's rule) unless that
//! ACK echoes the retransmission's timestamp, so without them its backed-off
//! RTO is never reset on a lossy path and grows to minutes (docs/results.md,
//! the lossy `ginza bench tcp` run).

mod tcp_support;

use ginza_net::tcp::{wire, Connection, Seq, State, TcpConfig, Timestamp};
use std::net::Ipv4Addr;
use tcp_support::*;

const ISS: u32 = 1000;
const PEER: u32 = 5000;

fn ts(value: u32, echo: u32) -> Option<Timestamp> {
    Some(Timestamp { value, echo })
}

/// Every ACK at once (delayed ACKs are not what this is about).
fn config() -> TcpConfig {
    TcpConfig {
        delayed_ack: None,
        ..TcpConfig::default()
    }
}

/// A passive connection whose peer offered MSS 1460, window scale 10 and
/// timestamps (its clock at 100), as Linux's SYN does.
fn passive_with_timestamps() -> Connection {
    let mut syn = seg(PEER).syn().options(Some(1460), Some(10));
    syn.timestamp = ts(100, 0);
    let mut conn = Connection::accept(&config(), SERVER, CLIENT, &syn, Seq(ISS), at_ms(5));
    let synack = drain(&mut conn, at_ms(5));
    assert_eq!(synack.len(), 1);
    let h = synack[0].header;
    assert!(h.flags.syn && h.ack == Some(Seq(PEER + 1)));
    let echoed = h.timestamp.expect("the SYN-ACK answers the offer");
    assert_eq!(echoed.echo, 100, "TSecr is the SYN's TSval");
    let mut ack = seg(PEER + 1).ack(ISS + 1);
    ack.timestamp = ts(101, echoed.value);
    conn.on_segment(&ack, at_ms(6));
    assert_eq!(conn.state(), State::Established);
    assert!(drain(&mut conn, at_ms(6)).is_empty());
    conn
}

/// The peer's data segment `n` (0-based, 1448 bytes: 1460 less the option).
fn data(n: u32, tsval: u32, payload: &[u8]) -> ginza_net::tcp::Segment<'_> {
    let mut s = seg(PEER + 1 + n * 1448).ack(ISS + 1).data(payload);
    s.timestamp = ts(tsval, 0);
    s
}

#[test]
fn the_ack_of_a_retransmission_that_fills_a_hole_echoes_its_timestamp() {
    let mut conn = passive_with_timestamps();
    let payload = [7u8; 1448];
    // Segment 0 arrives, 1 is lost, 2 and 3 arrive: duplicate ACKs echo
    // the timestamp of segment 0, the last one in order (RFC 7323 §4.3).
    conn.on_segment(&data(0, 200, &payload), at_ms(10));
    let acks = drain(&mut conn, at_ms(10));
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].header.ack, Some(Seq(PEER + 1 + 1448)));
    assert_eq!(acks[0].header.timestamp.map(|t| t.echo), Some(200));
    for (n, tsval) in [(2, 202), (3, 203)] {
        conn.on_segment(&data(n, tsval, &payload), at_ms(11));
        let dup = drain(&mut conn, at_ms(11));
        assert_eq!(dup.len(), 1);
        assert_eq!(
            dup[0].header.ack,
            Some(Seq(PEER + 1 + 1448)),
            "duplicate ACK"
        );
        assert_eq!(
            dup[0].header.timestamp.map(|t| t.echo),
            Some(200),
            "an out-of-order segment does not move TS.Recent"
        );
    }
    // The retransmission of segment 1, sent by the peer's (backed-off)
    // retransmission timer with its clock at 900, fills the hole: the ACK
    // covers segments 1 to 3 and echoes 900, so the sender measures that
    // round trip and resets its RTO back-off.
    conn.on_segment(&data(1, 900, &payload), at_ms(900));
    let acks = drain(&mut conn, at_ms(900));
    assert_eq!(acks.len(), 1);
    let h = acks[0].header;
    assert_eq!(h.ack, Some(Seq(PEER + 1 + 4 * 1448)));
    let t = h.timestamp.expect("every segment carries the option");
    assert_eq!(t.echo, 900);
    assert!(t.value >= 900, "our clock in ms: {t:?}");
    let mut buf = vec![0; 8 * 1448];
    assert_eq!(conn.recv(&mut buf), Ok(4 * 1448));
}

#[test]
fn our_segments_leave_room_for_the_option_within_the_mss() {
    let mut conn = passive_with_timestamps();
    let bytes = vec![3u8; 5000];
    assert_eq!(conn.send(&bytes), Ok(5000));
    let out = drain(&mut conn, at_ms(20));
    let sizes: Vec<usize> = out.iter().map(|s| s.payload.len()).collect();
    assert_eq!(sizes[0], 1448, "{sizes:?}");
    let (a, b) = (Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 1));
    for s in &out {
        let t = s.header.timestamp.expect("timestamps on every segment");
        assert_eq!(t.echo, 101, "the handshake's ACK is the latest in order");
        // 20 bytes of IPv4 header: one Ethernet MTU at most.
        let segment = s.view();
        let len = wire::header_len(&segment) + segment.payload.len();
        assert!(20 + len <= 1500, "{len}");
        let mut buf = vec![0; len];
        assert_eq!(wire::emit(&mut buf, a, 80, b, 40000, &segment), Some(len));
        let parsed = wire::parse(&buf, a, b).expect("parses back");
        assert_eq!(parsed.segment, segment);
    }
}

#[test]
fn no_timestamps_unless_the_peer_offers_them() {
    let syn = seg(PEER).syn().options(Some(1460), Some(7));
    let mut conn = Connection::accept(&config(), SERVER, CLIENT, &syn, Seq(ISS), at_ms(0));
    let synack = drain(&mut conn, at_ms(0));
    assert_eq!(synack[0].header.timestamp, None);
    // Our own SYN offers none either (Ginza ⇄ Ginza stays as it was).
    let mut active = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), at_ms(0));
    let syn = drain(&mut active, at_ms(0));
    assert_eq!(syn[0].header.timestamp, None);
}
