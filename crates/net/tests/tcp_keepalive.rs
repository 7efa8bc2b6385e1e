//! Keep-alive as Linux does it: off by default; after `idle` with nothing
//! heard, a probe at SND.UNA − 1 without data every `interval`; `count`
//! unanswered probes end the connection with `TimedOut` (and a RST); any
//! answer starts the idle time over.

mod tcp_support;

use ginza_net::tcp::{Connection, KeepAlive, Seq, State, TcpConfig, TcpError};
use std::time::Duration;
use tcp_support::*;

const ISS: u32 = 1000;
const PEER: u32 = 5000;

fn settings() -> KeepAlive {
    KeepAlive {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(1),
        count: 3,
    }
}

/// An established active connection, its handshake done at 1 ms.
fn established(keepalive: Option<KeepAlive>) -> Connection {
    let config = TcpConfig {
        delayed_ack: None,
        keepalive,
        ..TcpConfig::default()
    };
    let mut conn = Connection::connect(&config, CLIENT, SERVER, Seq(ISS), at_ms(0));
    drain(&mut conn, at_ms(0));
    conn.on_segment(
        &seg(PEER).syn().ack(ISS + 1).options(Some(1460), None),
        at_ms(1),
    );
    assert_eq!(conn.state(), State::Established);
    drain(&mut conn, at_ms(1));
    conn
}

/// Fires the timer at `now` and returns what it sent.
fn fire(conn: &mut Connection, now_ms: u64) -> Vec<Owned> {
    assert_eq!(conn.next_deadline(), Some(at_ms(now_ms)), "deadline");
    conn.on_timer(at_ms(now_ms));
    drain(conn, at_ms(now_ms))
}

fn assert_probe(out: &[Owned]) {
    assert_eq!(out.len(), 1, "{out:?}");
    let h = out[0].header;
    assert_eq!(h.seq, Seq(ISS), "SND.UNA − 1");
    assert_eq!(h.ack, Some(Seq(PEER + 1)));
    assert!(out[0].payload.is_empty() && !h.flags.rst && !h.flags.fin);
}

#[test]
fn off_by_default_no_timer_on_an_idle_connection() {
    let conn = established(None);
    assert_eq!(conn.next_deadline(), None);
    assert_eq!(conn.keepalive(), None);
}

#[test]
fn probes_after_idle_then_every_interval_then_gives_up_with_timed_out() {
    let mut conn = established(Some(settings()));
    assert_probe(&fire(&mut conn, 10_001));
    assert_probe(&fire(&mut conn, 11_001));
    assert_probe(&fire(&mut conn, 12_001));
    assert_eq!(conn.stats().keepalive_probes, 3);
    // The third probe went unanswered for an interval: a RST, ETIMEDOUT.
    let out = fire(&mut conn, 13_001);
    assert_eq!(out.len(), 1);
    assert!(out[0].header.flags.rst);
    assert_eq!(conn.state(), State::Closed);
    assert_eq!(conn.error(), Some(TcpError::TimedOut));
    let mut buf = [0; 8];
    assert_eq!(conn.recv(&mut buf), Err(TcpError::TimedOut));
    assert_eq!(conn.next_deadline(), None);
}

#[test]
fn an_answer_starts_the_idle_time_over() {
    let mut conn = established(Some(settings()));
    assert_probe(&fire(&mut conn, 10_001));
    assert_probe(&fire(&mut conn, 11_001));
    // The peer answers the probe with an ACK (as Linux does: the probe
    // lies left of its window).
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1), at_ms(11_002));
    assert!(drain(&mut conn, at_ms(11_002)).is_empty());
    assert_probe(&fire(&mut conn, 21_002));
    assert_eq!(conn.stats().keepalive_probes, 3);
    assert_eq!(conn.state(), State::Established);
}

#[test]
fn a_connection_with_data_outstanding_is_not_probed() {
    let mut conn = established(Some(settings()));
    assert_eq!(conn.send(b"hello"), Ok(5));
    drain(&mut conn, at_ms(2));
    // The retransmission timer watches the data; keep-alive stays quiet
    // while it is outstanding, whatever the RTO does.
    let mut now = at_ms(2);
    for _ in 0..8 {
        now = conn.next_deadline().expect("a timer");
        conn.on_timer(now);
        for s in drain(&mut conn, now) {
            assert!(!s.payload.is_empty(), "only retransmissions: {s:?}");
        }
    }
    assert_eq!(conn.stats().keepalive_probes, 0);
    assert!(now >= at_ms(10_001), "past the idle time: {now:?}");
}

#[test]
fn set_keepalive_turns_it_on_and_off() {
    let mut conn = established(None);
    conn.set_keepalive(Some(settings()), at_ms(5_000));
    assert_eq!(conn.keepalive(), Some(settings()));
    assert_eq!(conn.next_deadline(), Some(at_ms(15_000)));
    conn.set_keepalive(None, at_ms(6_000));
    assert_eq!(conn.next_deadline(), None);
}
