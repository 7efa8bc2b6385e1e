//! RFC 7323 §5 PAWS with timestamps on: an old duplicate (TSval older than
//! TS.Recent) is dropped and answered with an ACK, counted; comparisons
//! wrap modulo 2³²; TS.Recent idle for more than 24 days is no longer a
//! reference; a RST is not subject to PAWS.

mod tcp_support;

use ginza_net::tcp::{Connection, Seq, State, TcpConfig, TcpError, Timestamp};
use tcp_support::*;

const ISS: u32 = 1000;
const PEER: u32 = 5000;

fn ts(value: u32) -> Option<Timestamp> {
    Some(Timestamp { value, echo: 0 })
}

/// A passive connection whose peer offered timestamps with its clock at
/// `tsval`, as Linux's SYN does; the handshake's ACK carries `tsval + 1`.
fn passive(tsval: u32) -> Connection {
    let config = TcpConfig {
        delayed_ack: None,
        ..TcpConfig::default()
    };
    let mut syn = seg(PEER).syn().options(Some(1460), None);
    syn.timestamp = ts(tsval);
    let mut conn = Connection::accept(&config, SERVER, CLIENT, &syn, Seq(ISS), at_ms(0));
    drain(&mut conn, at_ms(0));
    let mut ack = seg(PEER + 1).ack(ISS + 1);
    ack.timestamp = ts(tsval.wrapping_add(1));
    conn.on_segment(&ack, at_ms(1));
    assert_eq!(conn.state(), State::Established);
    assert!(conn.timestamps_enabled());
    conn
}

/// Delivers `payload` at `offset` bytes past the peer's ISN + 1 with
/// `tsval`; returns the ACKs sent back.
fn deliver(conn: &mut Connection, offset: u32, tsval: u32, payload: &[u8], now: u64) -> Vec<Owned> {
    let mut s = seg(PEER + 1 + offset).ack(ISS + 1).data(payload);
    s.timestamp = ts(tsval);
    conn.on_segment(&s, at_ms(now));
    drain(conn, at_ms(now))
}

#[test]
fn an_old_duplicate_is_dropped_acked_and_counted() {
    let mut conn = passive(100);
    let acks = deliver(&mut conn, 0, 200, b"hello", 2);
    assert_eq!(acks[0].header.ack, Some(Seq(PEER + 6)));
    // A segment of an earlier incarnation of the sequence space: new
    // sequence numbers (inside the window), but a TSval older than 200.
    let acks = deliver(&mut conn, 5, 150, b"stale", 3);
    assert_eq!(acks.len(), 1, "answered with an ACK");
    assert_eq!(acks[0].header.ack, Some(Seq(PEER + 6)), "not taken");
    assert_eq!(acks[0].header.timestamp.map(|t| t.echo), Some(200));
    assert_eq!(conn.stats().paws_drops, 1);
    assert_eq!(conn.recv_available(), 5);
    // The same bytes with a current TSval are taken.
    let acks = deliver(&mut conn, 5, 201, b"fresh", 4);
    assert_eq!(acks[0].header.ack, Some(Seq(PEER + 11)));
    let mut buf = [0; 16];
    assert_eq!(conn.recv(&mut buf), Ok(10));
    assert_eq!(&buf[..10], b"hellofresh");
    assert_eq!(conn.stats().paws_drops, 1);
}

#[test]
fn timestamps_compare_modulo_two_to_the_thirty_two() {
    // TS.Recent just below the wrap; the peer's clock wraps to small
    // values, which are newer.
    let mut conn = passive(u32::MAX - 10);
    let acks = deliver(&mut conn, 0, 5, b"after the wrap", 2);
    assert_eq!(acks[0].header.ack, Some(Seq(PEER + 15)));
    assert_eq!(acks[0].header.timestamp.map(|t| t.echo), Some(5));
    // Now a value from before the wrap is the old one.
    deliver(&mut conn, 14, u32::MAX - 3, b"old", 3);
    assert_eq!(conn.stats().paws_drops, 1);
    assert_eq!(conn.recv_available(), 14);
}

#[test]
fn ts_recent_idle_for_more_than_24_days_is_not_a_reference() {
    let mut conn = passive(1_000_000);
    deliver(&mut conn, 0, 1_000_001, b"a", 2);
    // Within 24 days an older TSval is refused ...
    let day = 24 * 3600 * 1000;
    deliver(&mut conn, 1, 10, b"b", 23 * day);
    assert_eq!(conn.stats().paws_drops, 1);
    assert_eq!(conn.recv_available(), 1);
    // ... after 24 days idle, the peer's clock may have wrapped past half
    // its range: the segment is taken and its TSval becomes TS.Recent.
    let acks = deliver(&mut conn, 1, 10, b"b", 25 * day);
    assert_eq!(acks[0].header.ack, Some(Seq(PEER + 3)));
    assert_eq!(acks[0].header.timestamp.map(|t| t.echo), Some(10));
    assert_eq!(conn.stats().paws_drops, 1);
}

#[test]
fn a_reset_is_not_subject_to_paws() {
    let mut conn = passive(100);
    deliver(&mut conn, 0, 200, b"x", 2);
    let mut rst = seg(PEER + 2).rst();
    rst.timestamp = ts(1);
    conn.on_segment(&rst, at_ms(3));
    assert_eq!(conn.state(), State::Closed);
    assert_eq!(conn.error(), Some(TcpError::Reset));
    assert_eq!(conn.stats().paws_drops, 0);
}

#[test]
fn without_timestamps_there_is_no_paws() {
    let config = TcpConfig {
        delayed_ack: None,
        ..TcpConfig::default()
    };
    let syn = seg(PEER).syn().options(Some(1460), None);
    let mut conn = Connection::accept(&config, SERVER, CLIENT, &syn, Seq(ISS), at_ms(0));
    drain(&mut conn, at_ms(0));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1), at_ms(1));
    // A peer that did not negotiate them sends one anyway: ignored.
    let mut s = seg(PEER + 1).ack(ISS + 1).data(b"abc");
    s.timestamp = ts(0);
    conn.on_segment(&s, at_ms(2));
    assert_eq!(conn.recv_available(), 3);
    assert_eq!(conn.stats().paws_drops, 0);
}
