//! One test per RFC rule: crafted segments in (with a virtual clock), the
//! exact segments, states and errors out.

mod tcp_support;

use ginza_net::tcp::{reset_for, Connection, Instant, Seq, State, TcpConfig, TcpError};
use std::time::Duration;
use tcp_support::*;

/// Our initial sequence number and the peer's.
const ISS: u32 = 1000;
const PEER: u32 = 5000;

/// Default configuration, but every segment ACKed at once (delayed ACKs
/// have their own test).
fn config() -> TcpConfig {
    TcpConfig {
        delayed_ack: None,
        ..TcpConfig::default()
    }
}

fn t(ms: u64) -> Instant {
    at_ms(ms)
}

/// Exactly one segment to send.
fn one(conn: &mut Connection, now: Instant) -> Owned {
    let out = drain(conn, now);
    assert_eq!(out.len(), 1, "expected one segment, got {out:#?}");
    out.into_iter().next().unwrap()
}

fn nothing(conn: &mut Connection, now: Instant) {
    let out = drain(conn, now);
    assert!(out.is_empty(), "expected nothing, got {out:#?}");
}

fn is_ack(segment: &Owned, seq: u32, ack: u32) -> bool {
    let h = segment.header;
    h.seq == Seq(seq) && h.ack == Some(Seq(ack)) && !h.flags.syn && !h.flags.fin && !h.flags.rst
}

/// A passive connection past a crafted handshake (the peer sent no window
/// scale, so windows are unscaled; MSS 1460 both ways).
fn passive(config: &TcpConfig) -> Connection {
    let syn = seg(PEER).syn().options(Some(1460), None);
    let mut conn = Connection::accept(config, SERVER, CLIENT, &syn, Seq(ISS), t(0));
    let synack = one(&mut conn, t(0));
    assert!(synack.header.flags.syn);
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1), t(0));
    assert_eq!(conn.state(), State::Established);
    nothing(&mut conn, t(0));
    conn.take_events();
    conn
}

// ---- RFC 9293 §3.5: opening -------------------------------------------

#[test]
fn active_open_sends_syn_with_options_and_acks_the_syn_ack() {
    let mut conn = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), t(0));
    assert_eq!(conn.state(), State::SynSent);
    let syn = one(&mut conn, t(0));
    assert_eq!(syn.header.seq, Seq(ISS));
    assert_eq!(syn.header.ack, None);
    assert!(syn.header.flags.syn);
    assert_eq!(syn.header.mss, Some(1460));
    assert_eq!(
        syn.header.window_scale,
        Some(3),
        "256 KiB needs a shift of 3"
    );
    assert_eq!(conn.send(b"early"), Err(TcpError::NotConnected));
    assert!(conn.next_deadline() == Some(t(1000)), "initial RTO 1 s");
    conn.on_segment(
        &seg(PEER)
            .syn()
            .ack(ISS + 1)
            .options(Some(1400), Some(2))
            .window(1000),
        t(10),
    );
    assert_eq!(conn.state(), State::Established);
    assert!(is_ack(&one(&mut conn, t(10)), ISS + 1, PEER + 1));
    let events = conn.take_events();
    assert!(events.connected && events.writable);
    assert_eq!(conn.send_mss(), 1400, "min of both MSS options");
    assert_eq!(
        conn.peer_window(),
        1000,
        "the SYN-ACK's window is not scaled"
    );
    assert_eq!(conn.smoothed_rtt(), Some(ms(10)), "the SYN was timed");
    assert_eq!(conn.next_deadline(), None);
    // Later windows are scaled by the peer's shift.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(1000), t(11));
    assert_eq!(conn.peer_window(), 4000);
}

#[test]
fn passive_open_answers_syn_ack_with_options() {
    let syn = seg(PEER).syn().options(Some(1200), Some(7));
    let mut conn = Connection::accept(&config(), SERVER, CLIENT, &syn, Seq(ISS), t(0));
    assert_eq!(conn.state(), State::SynReceived);
    let synack = one(&mut conn, t(0));
    assert_eq!(synack.header.seq, Seq(ISS));
    assert_eq!(synack.header.ack, Some(Seq(PEER + 1)));
    assert!(synack.header.flags.syn);
    assert_eq!(synack.header.mss, Some(1460));
    assert_eq!(synack.header.window_scale, Some(3));
    assert_eq!(synack.header.window, 65535, "unscaled in a SYN");
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(10), t(1));
    assert_eq!(conn.state(), State::Established);
    assert!(conn.take_events().connected);
    assert_eq!(conn.peer_window(), 10 << 7);
    assert_eq!(conn.send_mss(), 1200);
    // Our windows are now scaled by 3: 256 KiB >> 3.
    conn.send(b"x").unwrap();
    let data = one(&mut conn, t(1));
    assert_eq!(data.header.window, ((256 * 1024) >> 3) as u16);
    assert_eq!(data.header.window_scale, None);
}

#[test]
fn window_scale_is_off_unless_both_syns_carry_it() {
    let syn = seg(PEER).syn().options(None, None);
    let mut conn = Connection::accept(&config(), SERVER, CLIENT, &syn, Seq(ISS), t(0));
    let synack = one(&mut conn, t(0));
    assert_eq!(synack.header.window_scale, None);
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(100), t(0));
    assert_eq!(conn.peer_window(), 100);
    assert_eq!(conn.send_mss(), 536, "RFC 9293 §3.7.1 default MSS");
    conn.send(&[7; 2000]).unwrap();
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(60000), t(0));
    let out = drain(&mut conn, t(0));
    assert_eq!(
        out.iter().map(|s| s.payload.len()).collect::<Vec<_>>(),
        [536, 536, 536, 392]
    );
    assert_eq!(
        out[0].header.window, 65535,
        "unscaled window, capped at the field"
    );
}

#[test]
fn syn_data_is_not_accepted() {
    let syn = seg(PEER).syn().options(Some(1460), None).data(b"hello");
    let mut conn = Connection::accept(&config(), SERVER, CLIENT, &syn, Seq(ISS), t(0));
    let synack = one(&mut conn, t(0));
    assert_eq!(
        synack.header.ack,
        Some(Seq(PEER + 1)),
        "only the SYN is acknowledged"
    );
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1), t(0));
    assert_eq!(conn.recv_available(), 0);
    // The peer sends it again after the handshake; now it counts.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"hello"), t(0));
    assert_eq!(conn.recv_available(), 5);
}

#[test]
fn syn_ack_data_is_accepted() {
    let mut conn = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), t(0));
    one(&mut conn, t(0));
    conn.on_segment(&seg(PEER).syn().ack(ISS + 1).data(b"hi").fin(), t(1));
    assert_eq!(conn.state(), State::CloseWait);
    assert!(is_ack(&one(&mut conn, t(1)), ISS + 1, PEER + 4));
    let mut buf = [0; 8];
    assert_eq!(conn.recv(&mut buf), Ok(2));
    assert_eq!(&buf[..2], b"hi");
    assert_eq!(conn.recv(&mut buf), Ok(0));
}

#[test]
fn syn_sent_rst_with_acceptable_ack_is_refused() {
    let mut conn = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), t(0));
    one(&mut conn, t(0));
    // A RST whose ACK does not cover our SYN is ignored (§3.10.7.3).
    conn.on_segment(&seg(0).rst().ack(ISS + 5), t(1));
    conn.on_segment(&seg(0).rst(), t(1));
    assert_eq!(conn.state(), State::SynSent);
    nothing(&mut conn, t(1));
    conn.on_segment(&seg(0).rst().ack(ISS + 1), t(1));
    assert_eq!(conn.state(), State::Closed);
    assert_eq!(conn.error(), Some(TcpError::Refused));
    let events = conn.take_events();
    assert!(events.connected && events.closed);
    let mut buf = [0; 4];
    assert_eq!(conn.recv(&mut buf), Err(TcpError::Refused));
    assert_eq!(conn.send(b"x"), Err(TcpError::Refused));
    assert!(conn.is_finished());
}

#[test]
fn syn_sent_bad_ack_gets_a_reset() {
    let mut conn = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), t(0));
    one(&mut conn, t(0));
    conn.on_segment(&seg(PEER).ack(ISS + 100), t(1));
    let rst = one(&mut conn, t(1));
    assert_eq!(rst.header.seq, Seq(ISS + 100));
    assert!(rst.header.flags.rst && rst.header.ack.is_none());
    assert_eq!(conn.state(), State::SynSent);
    // An ACK without SYN that is acceptable is still dropped.
    conn.on_segment(&seg(PEER).ack(ISS + 1), t(1));
    assert_eq!(conn.state(), State::SynSent);
    nothing(&mut conn, t(1));
}

#[test]
fn syn_received_bad_ack_gets_a_reset_and_a_repeated_syn_its_syn_ack() {
    let syn = seg(PEER).syn();
    let mut conn = Connection::accept(&config(), SERVER, CLIENT, &syn, Seq(ISS), t(0));
    one(&mut conn, t(0));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 9), t(1));
    let rst = one(&mut conn, t(1));
    assert!(rst.header.flags.rst);
    assert_eq!(rst.header.seq, Seq(ISS + 9));
    assert_eq!(conn.state(), State::SynReceived);
    conn.on_segment(&syn, t(2));
    let again = one(&mut conn, t(2));
    assert!(again.header.flags.syn && again.header.ack == Some(Seq(PEER + 1)));
    assert_eq!(conn.stats().retransmissions, 1);
}

#[test]
fn simultaneous_open() {
    let now = t(0);
    let mut a = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), now);
    let mut b = Connection::connect(&config(), SERVER, CLIENT, Seq(PEER), now);
    let syn_a = one(&mut a, now);
    let syn_b = one(&mut b, now);
    // The SYNs cross.
    a.on_segment(&syn_b.view(), t(1));
    b.on_segment(&syn_a.view(), t(1));
    assert_eq!(
        (a.state(), b.state()),
        (State::SynReceived, State::SynReceived)
    );
    let synack_a = one(&mut a, t(1));
    let synack_b = one(&mut b, t(1));
    assert!(synack_a.header.flags.syn && synack_a.header.ack == Some(Seq(PEER + 1)));
    assert_eq!(synack_a.header.seq, Seq(ISS));
    a.on_segment(&synack_b.view(), t(2));
    b.on_segment(&synack_a.view(), t(2));
    assert_eq!(
        (a.state(), b.state()),
        (State::Established, State::Established)
    );
    assert!(a.take_events().connected && b.take_events().connected);
    // Data flows.
    a.send(b"ping").unwrap();
    let data = one(&mut a, t(3));
    assert_eq!(data.header.seq, Seq(ISS + 1));
    b.on_segment(&data.view(), t(3));
    assert_eq!(b.recv_available(), 4);
}

// ---- RFC 9293 §3.6: closing --------------------------------------------

#[test]
fn active_close_through_time_wait() {
    let mut conn = passive(&config());
    conn.shutdown();
    assert_eq!(conn.state(), State::FinWait1);
    let fin = one(&mut conn, t(1));
    assert!(fin.header.flags.fin && fin.header.seq == Seq(ISS + 1));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2), t(2));
    assert_eq!(conn.state(), State::FinWait2);
    // Reading goes on in FIN-WAIT-2 (half-close).
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2).data(b"late"), t(3));
    assert!(is_ack(&one(&mut conn, t(3)), ISS + 2, PEER + 5));
    conn.on_segment(&seg(PEER + 5).ack(ISS + 2).fin(), t(4));
    assert_eq!(conn.state(), State::TimeWait);
    assert!(is_ack(&one(&mut conn, t(4)), ISS + 2, PEER + 6));
    assert_eq!(conn.next_deadline(), Some(t(60_004)));
    // A retransmitted FIN is ACKed again and restarts the 2 MSL wait.
    conn.on_segment(&seg(PEER + 5).ack(ISS + 2).fin(), t(1000));
    assert!(is_ack(&one(&mut conn, t(1000)), ISS + 2, PEER + 6));
    assert_eq!(conn.next_deadline(), Some(t(61_000)));
    conn.on_timer(t(60_999));
    assert_eq!(conn.state(), State::TimeWait);
    conn.on_timer(t(61_000));
    assert_eq!(conn.state(), State::Closed);
    assert!(conn.is_finished() && conn.take_events().closed);
    assert_eq!(conn.error(), None);
    assert_eq!(conn.next_deadline(), None);
    // A segment for the closed connection gets RFC 9293 §3.10.7.1's reset.
    conn.on_segment(&seg(PEER + 6).ack(ISS + 2), t(61_001));
    let rst = one(&mut conn, t(61_001));
    assert!(rst.header.flags.rst && rst.header.seq == Seq(ISS + 2));
}

#[test]
fn passive_close_through_last_ack() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"bye").fin(), t(1));
    assert_eq!(conn.state(), State::CloseWait);
    assert!(is_ack(&one(&mut conn, t(1)), ISS + 1, PEER + 5));
    assert!(conn.take_events().readable);
    let mut buf = [0; 8];
    assert_eq!(conn.recv(&mut buf), Ok(3));
    assert_eq!(conn.recv(&mut buf), Ok(0), "end of stream");
    // Still writable in CLOSE-WAIT.
    assert_eq!(conn.send(b"ok"), Ok(2));
    conn.close();
    assert_eq!(conn.state(), State::LastAck);
    let out = one(&mut conn, t(2));
    assert_eq!(out.payload, b"ok");
    assert!(out.header.flags.fin, "the FIN rides on the last data");
    conn.on_segment(&seg(PEER + 5).ack(ISS + 4), t(3));
    assert_eq!(conn.state(), State::Closed);
    assert!(conn.is_finished());
    assert_eq!(conn.error(), None);
}

#[test]
fn peek_leaves_the_bytes_and_reports_the_fin_and_shutdown() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"hello").fin(), t(1));
    assert!(conn.fin_received());
    assert!(!conn.send_shut());
    let mut buf = [0; 3];
    assert_eq!(conn.peek(&mut buf), Ok(3));
    assert_eq!(&buf, b"hel");
    assert_eq!(conn.recv_available(), 5, "peeking consumes nothing");
    let mut all = [0; 8];
    assert_eq!(conn.recv(&mut all), Ok(5));
    assert_eq!(&all[..5], b"hello");
    assert_eq!(conn.peek(&mut all), Ok(0), "end of stream");
    conn.shutdown();
    assert!(conn.send_shut());
}

#[test]
fn simultaneous_close_through_closing() {
    let mut conn = passive(&config());
    conn.shutdown();
    let fin = one(&mut conn, t(1));
    assert!(fin.header.flags.fin);
    // The peer's FIN crosses ours (it has not seen our FIN).
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).fin(), t(2));
    assert_eq!(conn.state(), State::Closing);
    assert!(is_ack(&one(&mut conn, t(2)), ISS + 2, PEER + 2));
    conn.on_segment(&seg(PEER + 2).ack(ISS + 2), t(3));
    assert_eq!(conn.state(), State::TimeWait);
    conn.on_timer(t(60_003));
    assert_eq!(conn.state(), State::Closed);
}

#[test]
fn fin_acked_with_peer_fin_goes_straight_to_time_wait() {
    let mut conn = passive(&config());
    conn.shutdown();
    one(&mut conn, t(1));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2).fin(), t(2));
    assert_eq!(conn.state(), State::TimeWait);
}

#[test]
fn orphaned_fin_wait_2_times_out() {
    let mut conn = passive(&config());
    conn.close();
    one(&mut conn, t(1));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2), t(2));
    assert_eq!(conn.state(), State::FinWait2);
    assert_eq!(conn.next_deadline(), Some(t(60_002)));
    conn.on_timer(t(60_002));
    assert_eq!(conn.state(), State::Closed);
    // After shutdown() alone the application still reads: no such timer.
    let mut conn = passive(&config());
    conn.shutdown();
    one(&mut conn, t(1));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2), t(2));
    assert_eq!(
        (conn.state(), conn.next_deadline()),
        (State::FinWait2, None)
    );
}

/// What a driver about to stop waits for: from the close until the peer
/// acknowledged the FIN (the data before it too), and a reset until it
/// went out; never for a connection the application left open.
#[test]
fn the_end_is_owed_from_the_close_until_the_fin_is_acknowledged() {
    let mut conn = passive(&config());
    assert!(
        !conn.owes_peer_its_end(),
        "open: the application did not end it"
    );
    conn.send(b"last").unwrap();
    conn.close();
    assert!(conn.owes_peer_its_end(), "data and FIN queued");
    let out = one(&mut conn, t(1));
    assert!(out.header.flags.fin && out.payload == b"last");
    assert!(conn.owes_peer_its_end(), "sent, not acknowledged");
    conn.on_segment(&seg(PEER + 1).ack(ISS + 5), t(2));
    assert!(
        conn.owes_peer_its_end(),
        "the data acknowledged, not the FIN"
    );
    conn.on_segment(&seg(PEER + 1).ack(ISS + 6), t(3));
    assert_eq!(conn.state(), State::FinWait2);
    assert!(!conn.owes_peer_its_end());
    // The passive side: from its close in CLOSE-WAIT until the last ACK.
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).fin(), t(1));
    one(&mut conn, t(1));
    assert!(!conn.owes_peer_its_end());
    conn.close();
    assert!(conn.owes_peer_its_end());
    one(&mut conn, t(2));
    conn.on_segment(&seg(PEER + 2).ack(ISS + 2), t(3));
    assert!(conn.is_finished() && !conn.owes_peer_its_end());
    // A reset is owed until it is sent.
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"unread"), t(1));
    one(&mut conn, t(1));
    conn.close();
    assert!(conn.owes_peer_its_end());
    assert!(one(&mut conn, t(2)).header.flags.rst);
    assert!(!conn.owes_peer_its_end());
}

#[test]
fn close_with_unread_data_resets() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"unread"), t(1));
    one(&mut conn, t(1));
    conn.close();
    assert_eq!(conn.state(), State::Closed);
    let rst = one(&mut conn, t(2));
    assert!(rst.header.flags.rst && rst.header.seq == Seq(ISS + 1));
    assert!(conn.is_finished());
}

#[test]
fn data_after_close_resets() {
    let mut conn = passive(&config());
    conn.close();
    one(&mut conn, t(1)); // FIN
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2).data(b"more"), t(2));
    assert_eq!(conn.state(), State::Closed);
    assert!(one(&mut conn, t(2)).header.flags.rst);
}

#[test]
fn abort_sends_reset() {
    let mut conn = passive(&config());
    conn.send(b"abc").unwrap();
    one(&mut conn, t(1));
    conn.abort();
    let rst = one(&mut conn, t(1));
    assert!(rst.header.flags.rst);
    assert_eq!(rst.header.seq, Seq(ISS + 4));
    assert_eq!(conn.state(), State::Closed);
    assert_eq!(conn.send(b"x"), Err(TcpError::Closed));
}

// ---- RFC 9293 §3.10.7.4 and RFC 5961: validation ------------------------

#[test]
fn rst_exactly_at_rcv_nxt_resets() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).rst(), t(1));
    assert_eq!(conn.state(), State::Closed);
    assert_eq!(conn.error(), Some(TcpError::Reset));
    let mut buf = [0; 4];
    assert_eq!(conn.recv(&mut buf), Err(TcpError::Reset));
    assert_eq!(conn.send(b"x"), Err(TcpError::Reset));
    let events = conn.take_events();
    assert!(events.readable && events.writable && events.closed);
    nothing(&mut conn, t(1));
}

#[test]
fn bytes_that_arrived_before_a_reset_are_still_read_then_the_reset() {
    // As Linux does (programs are written against it); RFC 9293 would
    // flush them.
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"hello"), t(1));
    conn.on_segment(&seg(PEER + 6).rst(), t(1));
    assert_eq!(conn.error(), Some(TcpError::Reset));
    let mut buf = [0; 16];
    assert_eq!(conn.recv(&mut buf), Ok(5));
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(conn.recv(&mut buf), Err(TcpError::Reset));
}

#[test]
fn rst_in_window_gets_a_challenge_ack() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 100).rst(), t(1));
    assert_eq!(conn.state(), State::Established);
    assert!(is_ack(&one(&mut conn, t(1)), ISS + 1, PEER + 1));
    assert_eq!(conn.stats().challenge_acks, 1);
}

#[test]
fn rst_outside_window_is_dropped() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER).rst(), t(1));
    conn.on_segment(&seg(PEER + 1 + 70_000).rst(), t(1));
    assert_eq!(conn.state(), State::Established);
    nothing(&mut conn, t(1));
    assert_eq!(conn.stats().dropped, 2);
}

#[test]
fn syn_in_established_gets_a_rate_limited_challenge_ack() {
    let mut conn = passive(&config());
    for i in 0..15 {
        conn.on_segment(&seg(PEER + 1 + i).syn(), t(1));
    }
    assert_eq!(conn.state(), State::Established);
    let out = drain(&mut conn, t(1));
    assert_eq!(out.len(), 1, "one ACK answers them all");
    assert!(is_ack(&out[0], ISS + 1, PEER + 1));
    assert_eq!(conn.stats().challenge_acks, 10, "ten per second at most");
    conn.on_segment(&seg(PEER).syn(), t(1001));
    assert_eq!(conn.stats().challenge_acks, 11, "a new second");
}

#[test]
fn ack_of_unsent_data_is_acked_and_dropped() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 50).data(b"data"), t(1));
    assert!(is_ack(&one(&mut conn, t(1)), ISS + 1, PEER + 1));
    assert_eq!(conn.recv_available(), 0, "the segment was dropped");
    assert_eq!(conn.sequence_state().0, Seq(ISS + 1));
}

#[test]
fn ack_older_than_any_window_is_challenged() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS.wrapping_sub(100_000)), t(1));
    assert_eq!(conn.stats().challenge_acks, 1);
    one(&mut conn, t(1));
    // An old ACK within the window is ignored, its data taken.
    conn.on_segment(&seg(PEER + 1).ack(ISS - 10).data(b"ok"), t(1));
    assert_eq!(conn.recv_available(), 2);
}

#[test]
fn segment_outside_the_window_is_acked_and_dropped() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1 + 100_000).ack(ISS + 1).data(b"far"), t(1));
    assert!(is_ack(&one(&mut conn, t(1)), ISS + 1, PEER + 1));
    assert_eq!(conn.stats().dropped, 1);
    // An old duplicate: ACKed, counted, not delivered again.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"abc"), t(2));
    one(&mut conn, t(2));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"abc"), t(3));
    assert!(is_ack(&one(&mut conn, t(3)), ISS + 1, PEER + 4));
    assert_eq!(conn.recv_available(), 3);
    assert_eq!(conn.stats().duplicate_segments, 1);
    // No ACK bit: dropped silently.
    conn.on_segment(&seg(PEER + 4).data(b"x"), t(4));
    nothing(&mut conn, t(4));
    assert_eq!(conn.recv_available(), 3);
}

#[test]
fn data_beyond_the_window_is_trimmed() {
    let config = TcpConfig {
        recv_buffer: 10,
        ..config()
    };
    let mut conn = passive(&config);
    conn.on_segment(
        &seg(PEER + 1).ack(ISS + 1).data(b"0123456789abc").fin(),
        t(1),
    );
    assert_eq!(conn.recv_available(), 10);
    let ack = one(&mut conn, t(1));
    assert!(
        is_ack(&ack, ISS + 1, PEER + 11),
        "FIN beyond the window dropped"
    );
    assert_eq!(ack.header.window, 0);
    assert_eq!(conn.state(), State::Established);
}

// ---- Reassembly -----------------------------------------------------------

#[test]
fn out_of_order_segments_are_resequenced() {
    let mut conn = passive(&config());
    let a = seg(PEER + 1).ack(ISS + 1).data(b"aaaa");
    let b = seg(PEER + 5).ack(ISS + 1).data(b"bbbb");
    let c = seg(PEER + 9).ack(ISS + 1).data(b"cc").fin();
    conn.on_segment(&c, t(1));
    assert!(
        is_ack(&one(&mut conn, t(1)), ISS + 1, PEER + 1),
        "immediate duplicate ACK"
    );
    conn.on_segment(&b, t(1));
    assert!(is_ack(&one(&mut conn, t(1)), ISS + 1, PEER + 1));
    assert_eq!(conn.recv_available(), 0);
    assert_eq!(conn.reassembly_held(), 6);
    conn.on_segment(&a, t(2));
    assert!(
        is_ack(&one(&mut conn, t(2)), ISS + 1, PEER + 12),
        "gap filled, FIN in order"
    );
    assert_eq!(conn.state(), State::CloseWait);
    let mut buf = [0; 32];
    assert_eq!(conn.recv(&mut buf), Ok(10));
    assert_eq!(&buf[..10], b"aaaabbbbcc");
    assert_eq!(conn.recv(&mut buf), Ok(0));
    assert_eq!(conn.stats().out_of_order_segments, 2);
}

#[test]
fn reassembly_is_bounded() {
    let config = TcpConfig {
        reassembly_limit: 8,
        ..config()
    };
    let mut conn = passive(&config);
    conn.on_segment(&seg(PEER + 2).ack(ISS + 1).data(b"0123456789"), t(1));
    assert_eq!(conn.reassembly_held(), 8);
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"x"), t(1));
    assert_eq!(conn.recv_available(), 9, "the bytes beyond the limit wait");
    conn.on_segment(&seg(PEER + 10).ack(ISS + 1).data(b"89"), t(1));
    let mut buf = [0; 32];
    assert_eq!(conn.recv(&mut buf), Ok(11));
    assert_eq!(&buf[..11], b"x0123456789");
}

// ---- RFC 6298: retransmission timeout -------------------------------------

#[test]
fn retransmission_timeout_backs_off_and_gives_up() {
    let config = TcpConfig {
        max_retransmissions: 3,
        ..config()
    };
    let mut conn = passive(&config);
    conn.send(b"hello").unwrap();
    let first = one(&mut conn, t(0));
    // The handshake's sample (0 ms) put the RTO at its 200 ms floor.
    assert_eq!(conn.next_deadline(), Some(t(200)));
    let mut now = 200;
    for (i, next) in [(1, 400), (2, 800), (3, 1600)] {
        conn.on_timer(t(now));
        let again = one(&mut conn, t(now));
        assert_eq!(again, first, "retransmission {i} is the same segment");
        now += next;
        assert_eq!(conn.next_deadline(), Some(t(now)), "doubled RTO");
    }
    assert_eq!(conn.stats().retransmissions, 3);
    conn.on_timer(t(now));
    assert_eq!(conn.state(), State::Closed);
    assert_eq!(conn.error(), Some(TcpError::TimedOut));
    assert_eq!(conn.send(b"x"), Err(TcpError::TimedOut));
    nothing(&mut conn, t(now));
}

#[test]
fn syn_retransmissions_give_up() {
    let config = TcpConfig {
        max_syn_retransmissions: 2,
        ..config()
    };
    let mut conn = Connection::connect(&config, CLIENT, SERVER, Seq(ISS), t(0));
    let syn = one(&mut conn, t(0));
    conn.on_timer(t(1000));
    assert_eq!(one(&mut conn, t(1000)), syn);
    conn.on_timer(t(3000));
    assert_eq!(one(&mut conn, t(3000)), syn);
    conn.on_timer(t(7000));
    assert_eq!(conn.error(), Some(TcpError::TimedOut));
    assert!(conn.take_events().connected, "the connect waiter wakes");
}

#[test]
fn rtt_samples_follow_karn() {
    let mut conn = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), t(0));
    one(&mut conn, t(0));
    conn.on_segment(&seg(PEER).syn().ack(ISS + 1), t(40));
    one(&mut conn, t(40));
    // First sample: SRTT 40, RTTVAR 20: 40 + 80 = 120 ms, raised to the floor.
    assert_eq!(conn.smoothed_rtt(), Some(ms(40)));
    assert_eq!(conn.rto(), ms(200));
    // A retransmitted segment yields no sample.
    conn.send(b"b").unwrap();
    one(&mut conn, t(100));
    conn.on_timer(t(300));
    one(&mut conn, t(300));
    assert_eq!(conn.rto(), ms(400), "backed off");
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2), t(900));
    assert_eq!(
        conn.smoothed_rtt(),
        Some(ms(40)),
        "no sample across a retransmission"
    );
    assert_eq!(conn.rto(), ms(400), "back-off kept until a new sample");
    conn.send(b"c").unwrap();
    one(&mut conn, t(1000));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 3), t(1080));
    // SRTT 7/8·40 + 1/8·80 = 45; RTTVAR 3/4·20 + 1/4·40 = 25: 145 → 200.
    assert_eq!(conn.smoothed_rtt(), Some(ms(45)));
    assert_eq!(conn.rto(), ms(200));
}

// ---- RFC 9293 §3.8.6: flow control ----------------------------------------

#[test]
fn zero_window_probes_back_off_until_the_window_opens() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(0), t(0));
    conn.send(b"blocked").unwrap();
    nothing(&mut conn, t(0));
    assert_eq!(
        conn.next_deadline(),
        Some(t(200)),
        "persist timer at one RTO"
    );
    conn.on_timer(t(200));
    let probe = one(&mut conn, t(200));
    assert_eq!(probe.header.seq, Seq(ISS + 1));
    assert_eq!(probe.payload, b"b");
    assert_eq!(conn.next_deadline(), Some(t(600)), "backed off");
    // The peer still has no room: ACKs the old number, window 0.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(0), t(201));
    conn.on_timer(t(600));
    assert_eq!(one(&mut conn, t(600)).payload, b"b");
    assert_eq!(conn.next_deadline(), Some(t(1400)));
    assert_eq!(conn.stats().zero_window_probes, 2);
    assert_eq!(
        conn.state(),
        State::Established,
        "probes never time out while answered"
    );
    // The window opens (a window update): everything goes.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(100), t(601));
    let data = one(&mut conn, t(601));
    assert_eq!(
        (data.header.seq, data.payload.as_slice()),
        (Seq(ISS + 1), &b"blocked"[..])
    );
}

#[test]
fn probe_accepted_by_the_peer_moves_on() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(0), t(0));
    conn.send(b"xy").unwrap();
    nothing(&mut conn, t(0));
    conn.on_timer(t(200));
    one(&mut conn, t(200));
    // The peer took the probe's byte and has room for one more.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2).window(1), t(1001));
    let next = one(&mut conn, t(1001));
    assert_eq!(
        (next.header.seq, next.payload.as_slice()),
        (Seq(ISS + 2), &b"y"[..])
    );
}

/// Both windows zero: the peer (as Linux does) refuses our probe's byte,
/// and every segment we send that occupies no sequence number (ACKs, the
/// window update after a read, the answer to the peer's own probe, a RST)
/// is numbered at the peer's RCV.NXT, the only number its zero window
/// accepts (RFC 9293 §3.10.7.4), not one past it at the probe's end.
#[test]
fn acks_stay_inside_a_zero_window_after_a_refused_probe() {
    let config = TcpConfig {
        recv_buffer: 4000,
        ..config()
    };
    let mut conn = passive(&config);
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(0), t(0));
    conn.send(b"blocked").unwrap();
    // The peer fills our window too.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(0).data(&[7; 4000]), t(1));
    let ack = one(&mut conn, t(1));
    assert!(is_ack(&ack, ISS + 1, PEER + 4001));
    assert_eq!(ack.header.window, 0);
    assert_eq!(conn.next_deadline(), Some(t(201)), "the persist timer");
    conn.on_timer(t(201));
    let probe = one(&mut conn, t(201));
    assert_eq!((probe.header.seq, probe.payload.len()), (Seq(ISS + 1), 1));
    // Refused: the peer's RCV.NXT stays at ISS + 1.
    conn.on_segment(&seg(PEER + 4001).ack(ISS + 1).window(0), t(202));
    nothing(&mut conn, t(202));
    // The peer's zero-window probe (Linux: no data, SND.UNA − 1) is
    // answered at once.
    conn.on_segment(&seg(PEER + 4000).ack(ISS + 1).window(0), t(250));
    let answer = one(&mut conn, t(250));
    assert!(is_ack(&answer, ISS + 1, PEER + 4001), "{answer:?}");
    // Our reader drains the buffer: the window update.
    let mut buf = [0; 4000];
    assert_eq!(conn.recv(&mut buf), Ok(4000));
    let update = one(&mut conn, t(300));
    assert!(is_ack(&update, ISS + 1, PEER + 4001), "{update:?}");
    assert_eq!(update.header.window, 4000);
    // And the peer's next probe gets the open window.
    conn.on_segment(&seg(PEER + 4000).ack(ISS + 1).window(0), t(400));
    let answer = one(&mut conn, t(400));
    assert!(is_ack(&answer, ISS + 1, PEER + 4001), "{answer:?}");
    assert_eq!(answer.header.window, 4000);
    conn.abort();
    let rst = one(&mut conn, t(500));
    assert!(rst.header.flags.rst);
    assert_eq!(rst.header.seq, Seq(ISS + 1), "the RST lands too");
}

/// The answers to refused probes (ACK = SND.UNA, window zero, while the
/// probe's byte is outstanding) are no duplicate ACKs (RFC 5681 §2): three
/// of them must not fast-retransmit a segment into the zero window.
#[test]
fn refused_probes_are_no_duplicate_acks() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(0), t(0));
    conn.send(&[3; 5000]).unwrap();
    nothing(&mut conn, t(0));
    let mut now = 0;
    for _ in 0..4 {
        now = conn.next_deadline().expect("the persist timer").as_nanos() / 1_000_000;
        conn.on_timer(t(now));
        let probe = one(&mut conn, t(now));
        assert_eq!((probe.header.seq, probe.payload.len()), (Seq(ISS + 1), 1));
        conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(0), t(now + 1));
        nothing(&mut conn, t(now + 1));
    }
    assert_eq!(conn.stats().fast_retransmits, 0);
    assert_eq!(conn.congestion_window(), 10 * 1460, "no loss was inferred");
    // The window opens: the data goes from SND.UNA.
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(3000), t(now + 2));
    let out = drain(&mut conn, t(now + 2));
    assert_eq!(out[0].header.seq, Seq(ISS + 1));
    assert_eq!(out.iter().map(|s| s.payload.len()).sum::<usize>(), 2920);
}

#[test]
fn reading_sends_a_window_update() {
    let config = TcpConfig {
        recv_buffer: 4000,
        ..config()
    };
    let mut conn = passive(&config);
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(&[1; 4000]), t(1));
    let ack = one(&mut conn, t(1));
    assert_eq!(ack.header.window, 0);
    let mut buf = [0; 1000];
    conn.recv(&mut buf).unwrap();
    nothing(&mut conn, t(2)); // 1000 < one MSS: silly window avoidance
    conn.recv(&mut buf).unwrap();
    let update = one(&mut conn, t(2));
    assert!(is_ack(&update, ISS + 1, PEER + 4001));
    assert_eq!(update.header.window, 2000);
    // Receiver SWS avoidance: a small read moves no edge, even on an ACK
    // sent for other reasons.
    conn.recv(&mut buf[..100]).unwrap();
    conn.on_segment(&seg(PEER + 4001).ack(ISS + 1).data(b"x"), t(3));
    let ack = one(&mut conn, t(3));
    assert_eq!(ack.header.window, 1999, "the old edge, not 2099");
}

/// A request/response exchange (the echo of `ginza bench tcp`): each
/// 64-byte request is read and answered at once, and the answer carries
/// the ACK and any window update. One segment out per request: no lone
/// ACK, not even when the reads have opened the window by an MSS.
#[test]
fn an_answered_request_costs_one_segment_even_when_the_window_opens() {
    let config = TcpConfig::default(); // delayed ACK on
    let mut conn = passive(&config);
    let (mut rcv, mut snd) = (PEER + 1, ISS + 1);
    let mut buf = [0u8; 64];
    let mut lone_acks = 0;
    for i in 0..200u64 {
        let now = Instant::from_nanos(1_000_000 + i * 20_000);
        conn.on_segment(&seg(rcv).ack(snd).data(&[7; 64]), now);
        rcv += 64;
        assert_eq!(conn.recv(&mut buf).unwrap(), 64);
        lone_acks += drain(&mut conn, now).len();
        conn.send(&buf).unwrap();
        let out = drain(&mut conn, now);
        assert_eq!(out.len(), 1, "request {i}: {out:#?}");
        assert_eq!(out[0].payload.len(), 64);
        assert_eq!(out[0].header.ack, Some(Seq(rcv)));
        snd += 64;
    }
    assert_eq!(
        lone_acks, 0,
        "lone ACKs (window updates) before the answers"
    );
    // The answers moved the window's edge as the reads freed the buffer.
    conn.on_segment(&seg(rcv).ack(snd).data(&[7; 64]), t(100));
    assert_eq!(conn.recv(&mut buf).unwrap(), 64);
    conn.send(&buf).unwrap();
    let out = drain(&mut conn, t(100));
    assert!(
        out[0].header.window >= u16::MAX - 1460,
        "{:?}",
        out[0].header
    );
}

/// A window update while the advertised window is still more than half
/// open waits as a delayed ACK (the next answer would carry it); with
/// nothing written it goes out when the delayed ACK is due. Under half it
/// goes at once.
#[test]
fn a_window_update_waits_as_a_delayed_ack_while_the_window_is_roomy() {
    let config = TcpConfig {
        recv_buffer: 8000,
        ..TcpConfig::default()
    };
    let delay = config.delayed_ack.unwrap();
    let mut conn = passive(&config);
    // Two segments: ACKed at once (every second segment).
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(&[1; 1000]), t(1));
    conn.on_segment(&seg(PEER + 1001).ack(ISS + 1).data(&[1; 1000]), t(1));
    assert_eq!(one(&mut conn, t(1)).header.window, 6000);
    let mut buf = [0; 2000];
    assert_eq!(conn.recv(&mut buf).unwrap(), 2000);
    // 6000 of 8000 still advertised: the update waits.
    nothing(&mut conn, t(1));
    let due = conn.next_deadline().expect("the delayed ACK is armed");
    assert_eq!(due, t(1) + delay);
    conn.on_timer(due);
    let update = one(&mut conn, due);
    assert!(is_ack(&update, ISS + 1, PEER + 2001));
    assert_eq!(update.header.window, 8000);
    // Five more KB in: 3000 advertised, under half; reading them sends the
    // update at once.
    for i in 0..5u32 {
        conn.on_segment(
            &seg(PEER + 2001 + i * 1000).ack(ISS + 1).data(&[1; 1000]),
            t(2),
        );
    }
    let _ = drain(&mut conn, t(2));
    let mut big = [0; 5000];
    assert_eq!(conn.recv(&mut big).unwrap(), 5000);
    let update = one(&mut conn, t(2));
    assert_eq!(update.header.window, 8000);
}

/// `Connection` crosses kthreads inside the runtime's lock.
#[test]
fn connection_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Connection>();
}

#[test]
fn acks_count_while_our_window_is_zero() {
    let config = TcpConfig {
        recv_buffer: 10,
        ..config()
    };
    let mut conn = passive(&config);
    conn.send(b"abc").unwrap();
    one(&mut conn, t(0));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(&[0; 10]), t(1));
    one(&mut conn, t(1));
    // A probe from the peer carries an ACK of our data.
    conn.on_segment(&seg(PEER + 11).ack(ISS + 4).data(b"z"), t(2));
    assert_eq!(conn.sequence_state().0, Seq(ISS + 4));
    assert!(is_ack(&one(&mut conn, t(2)), ISS + 4, PEER + 11));
    assert_eq!(conn.recv_available(), 10);
}

#[test]
fn sends_no_more_than_the_peer_window() {
    let mut conn = passive(&config());
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).window(3000), t(0));
    conn.send(&[9; 10_000]).unwrap();
    let out = drain(&mut conn, t(0));
    // Two full segments; the 80 bytes left of the window wait (sender
    // silly-window avoidance, RFC 9293 §3.8.6.2.1).
    assert_eq!(out.iter().map(|s| s.payload.len()).sum::<usize>(), 2920);
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1 + 1460).window(3000), t(1));
    let out = drain(&mut conn, t(1));
    assert_eq!(out.iter().map(|s| s.payload.len()).sum::<usize>(), 1460);
}

// ---- RFC 5681 / 6582: congestion control ------------------------------------

#[test]
fn slow_start_grows_the_window_per_ack() {
    let mut conn = passive(&config());
    conn.send(&[1; 100_000]).unwrap();
    let out = drain(&mut conn, t(0));
    assert_eq!(out.len(), 10, "RFC 6928 initial window of ten segments");
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1 + 2920), t(1));
    assert_eq!(conn.congestion_window(), 11 * 1460, "one SMSS per ACK");
    assert_eq!(drain(&mut conn, t(1)).len(), 3);
}

#[test]
fn three_duplicate_acks_fast_retransmit_and_newreno_recovery() {
    let mut conn = passive(&config());
    conn.send(&[1; 20 * 1460]).unwrap();
    let out = drain(&mut conn, t(0));
    assert_eq!(out.len(), 10);
    let una = ISS + 1;
    let seq_of = |segment: &Owned| segment.header.seq.0;
    // Segment 0 is lost; 1, 2, 3 arrive: three duplicate ACKs. The first
    // two each let one new segment out (RFC 3042 limited transmit).
    conn.on_segment(&seg(PEER + 1).ack(una), t(1));
    assert_eq!(seq_of(&one(&mut conn, t(1))), una + 10 * 1460);
    conn.on_segment(&seg(PEER + 1).ack(una), t(1));
    assert_eq!(seq_of(&one(&mut conn, t(1))), una + 11 * 1460);
    conn.on_segment(&seg(PEER + 1).ack(una), t(1));
    let retransmit = one(&mut conn, t(1));
    assert_eq!(retransmit, out[0], "fast retransmit of the first segment");
    assert_eq!(conn.stats().fast_retransmits, 1);
    assert!(conn.in_fast_recovery());
    assert_eq!(
        conn.slow_start_threshold(),
        6 * 1460,
        "half the flight of 12"
    );
    assert_eq!(conn.congestion_window(), 9 * 1460, "ssthresh + 3 SMSS");
    // More duplicates inflate the window: new data goes out once it
    // exceeds the flight (RFC 5681 §3.2 step 4).
    for _ in 0..3 {
        conn.on_segment(&seg(PEER + 1).ack(una), t(1));
    }
    nothing(&mut conn, t(1));
    conn.on_segment(&seg(PEER + 1).ack(una), t(1));
    assert_eq!(conn.congestion_window(), 13 * 1460);
    assert_eq!(seq_of(&one(&mut conn, t(1))), una + 12 * 1460);
    // Partial ACK: segments 0..4 acknowledged, 5 lost too: retransmitted.
    conn.on_segment(&seg(PEER + 1).ack(una + 5 * 1460), t(2));
    let partial = drain(&mut conn, t(2));
    assert_eq!(
        partial[0], out[5],
        "RFC 6582 partial ACK retransmits the next hole"
    );
    assert!(conn.in_fast_recovery());
    // Full ACK of all thirteen segments: recovery ends, the window deflates.
    conn.on_segment(&seg(PEER + 1).ack(una + 13 * 1460), t(3));
    assert!(!conn.in_fast_recovery());
    assert_eq!(
        conn.congestion_window(),
        2 * 1460,
        "min(ssthresh, flight + SMSS)"
    );
}

#[test]
fn timeout_resets_the_congestion_window() {
    let mut conn = passive(&config());
    conn.send(&[1; 20 * 1460]).unwrap();
    let out = drain(&mut conn, t(0));
    conn.on_timer(t(1000));
    assert_eq!(conn.congestion_window(), 1460);
    assert_eq!(conn.slow_start_threshold(), 5 * 1460);
    let again = drain(&mut conn, t(1000));
    assert_eq!(again, vec![out[0].clone()], "go back N with one segment");
    assert_eq!(conn.stats().timeouts, 1);
}

// ---- Nagle (RFC 9293 §3.7.4) and delayed ACKs (RFC 5681 §4.2) -------------

#[test]
fn nagle_holds_small_segments_while_one_is_unacknowledged() {
    let config = TcpConfig {
        nodelay: false,
        ..config()
    };
    let mut conn = passive(&config);
    assert!(!conn.nodelay());
    conn.send(b"a").unwrap();
    assert_eq!(one(&mut conn, t(0)).payload, b"a");
    conn.send(b"b").unwrap();
    conn.send(b"c").unwrap();
    nothing(&mut conn, t(0));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 2), t(1));
    assert_eq!(one(&mut conn, t(1)).payload, b"bc");
    // Full segments are never held.
    conn.send(&[0; 3000]).unwrap();
    let out = drain(&mut conn, t(1));
    assert_eq!(
        out.iter().map(|s| s.payload.len()).collect::<Vec<_>>(),
        [1460, 1460]
    );
    // nodelay turns it off: the 80-byte tail goes.
    conn.set_nodelay(true);
    assert_eq!(one(&mut conn, t(1)).payload.len(), 80);
}

#[test]
fn delayed_ack_waits_for_a_second_segment_or_the_timer() {
    let config = TcpConfig {
        delayed_ack: Some(Duration::from_micros(500)),
        ..TcpConfig::default()
    };
    let mut conn = passive(&config);
    let us = |n: u64| Instant::from_nanos(n * 1000);
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(b"1"), us(0));
    nothing(&mut conn, us(0));
    assert_eq!(conn.next_deadline(), Some(us(500)));
    conn.on_timer(us(500));
    assert!(is_ack(&one(&mut conn, us(500)), ISS + 1, PEER + 2));
    conn.on_segment(&seg(PEER + 2).ack(ISS + 1).data(b"2"), us(600));
    conn.on_segment(&seg(PEER + 3).ack(ISS + 1).data(b"3"), us(601));
    assert!(
        is_ack(&one(&mut conn, us(601)), ISS + 1, PEER + 4),
        "every second segment"
    );
    // A reply within the delay carries the ACK.
    conn.on_segment(&seg(PEER + 4).ack(ISS + 1).data(b"4"), us(700));
    conn.send(b"reply").unwrap();
    let reply = one(&mut conn, us(701));
    assert_eq!(reply.header.ack, Some(Seq(PEER + 5)));
    assert_eq!(
        conn.next_deadline(),
        Some(us(701) + ms(200)),
        "only the RTO left"
    );
}

// ---- RFC 9293 §3.10.7.1 ----------------------------------------------------

#[test]
fn reset_for_a_closed_port() {
    let syn = seg(PEER).syn().window(100);
    let rst = reset_for(&syn).unwrap();
    assert!(rst.flags.rst);
    assert_eq!((rst.seq, rst.ack), (Seq(0), Some(Seq(PEER + 1))));
    let data = seg(PEER).ack(77).data(b"abc").fin();
    let rst = reset_for(&data).unwrap();
    assert_eq!((rst.seq, rst.ack), (Seq(77), None));
    assert!(reset_for(&seg(1).rst()).is_none(), "never a RST for a RST");
}

// ---- A sender's own segment boundaries (the protected netstack's gather lists)

/// Segments sent with a limit end at the caller's boundaries (here every
/// 500 bytes of the stream), first sends and retransmissions alike; the
/// FIN rides on the last piece only.
#[test]
fn a_limit_cuts_segments_at_the_callers_boundaries() {
    const EVERY: u32 = 500;
    let mut conn = passive(&config());
    let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    assert_eq!(conn.send(&data), Ok(3000));
    conn.close();
    let first = ISS + 1;
    let limit = |seq: Seq| (EVERY - seq.0.wrapping_sub(first) % EVERY) as usize;
    let sent = |conn: &mut Connection, now| {
        let mut out = Vec::new();
        while let Some(s) = conn.poll_transmit_within(now, limit) {
            out.push(Owned::from(&s));
        }
        out
    };
    let out = sent(&mut conn, t(0));
    let shape: Vec<(u32, usize, bool)> = out
        .iter()
        .map(|s| (s.header.seq.0 - first, s.payload.len(), s.header.flags.fin))
        .collect();
    let want: Vec<(u32, usize, bool)> = (0..6).map(|i| (i * EVERY, 500, i == 5)).collect();
    assert_eq!(shape, want, "six 500-byte segments, the FIN on the last");
    let back: Vec<u8> = out.iter().flat_map(|s| s.payload.clone()).collect();
    assert_eq!(back, data);

    // Nothing acknowledged: the retransmission timeout resends the first
    // unacknowledged segment, cut at the first boundary again.
    let rto = conn.next_deadline().expect("the retransmission timer runs");
    conn.on_timer(rto);
    let again = sent(&mut conn, rto);
    assert!(!again.is_empty(), "a retransmission after the timeout");
    assert_eq!(again[0].header.seq, Seq(first));
    assert_eq!(again[0].payload.len(), 500);

    // Without a limit the same data leaves in MSS-sized segments.
    let mut plain = passive(&config());
    plain.send(&data).unwrap();
    let sizes: Vec<usize> = drain(&mut plain, t(0))
        .iter()
        .map(|s| s.payload.len())
        .collect();
    assert_eq!(sizes, vec![1460, 1460, 80]);
}
