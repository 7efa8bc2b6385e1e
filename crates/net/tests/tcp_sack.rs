//! RFC 2018 SACK and RFC 6675 SACK-based loss recovery: negotiation, the
//! receiver's blocks, the sender's recovery of several holes in one window
//! without a timeout and without resending SACKed data, and blocks from
//! the network that make no sense.

mod tcp_support;

use ginza_net::tcp::{Connection, SackBlock, SackBlocks, Segment, Seq, State, TcpConfig};
use tcp_support::*;

const ISS: u32 = 1000;
const PEER: u32 = 5000;
const MSS: u32 = 1000;

fn config() -> TcpConfig {
    TcpConfig {
        delayed_ack: None,
        mss: MSS as u16,
        ..TcpConfig::default()
    }
}

fn blocks(pairs: &[(u32, u32)]) -> SackBlocks {
    pairs
        .iter()
        .map(|&(l, r)| SackBlock {
            left: Seq(l),
            right: Seq(r),
        })
        .collect()
}

/// The SYN-ACK a peer sends, offering SACK or not.
fn syn_ack(sack: bool) -> Segment<'static> {
    let mut s = seg(PEER)
        .syn()
        .ack(ISS + 1)
        .options(Some(MSS as u16), Some(7));
    s.sack_permitted = sack;
    s
}

/// An active connection whose peer answered with `sack`.
fn active(config: &TcpConfig, sack: bool) -> Connection {
    let mut conn = Connection::connect(config, CLIENT, SERVER, Seq(ISS), at_ms(0));
    let syn = drain(&mut conn, at_ms(0));
    assert_eq!(syn[0].header.sack_permitted, config.sack);
    conn.on_segment(&syn_ack(sack), at_ms(1));
    assert_eq!(conn.state(), State::Established);
    drain(&mut conn, at_ms(1));
    conn
}

/// A passive connection whose peer's SYN offered `sack`.
fn passive(config: &TcpConfig, sack: bool) -> (Connection, bool) {
    let mut syn = seg(PEER).syn().options(Some(MSS as u16), Some(7));
    syn.sack_permitted = sack;
    let mut conn = Connection::accept(config, SERVER, CLIENT, &syn, Seq(ISS), at_ms(0));
    let synack = drain(&mut conn, at_ms(0));
    let offered = synack[0].header.sack_permitted;
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1), at_ms(1));
    assert_eq!(conn.state(), State::Established);
    (conn, offered)
}

#[test]
fn sack_is_used_only_when_both_syns_permit_it() {
    assert!(active(&config(), true).sack_enabled());
    assert!(
        !active(&config(), false).sack_enabled(),
        "peer did not offer"
    );
    let off = TcpConfig {
        sack: false,
        ..config()
    };
    let conn = active(&off, true);
    assert!(
        !conn.sack_enabled(),
        "turned off here (our SYN offered none)"
    );

    let (conn, offered) = passive(&config(), true);
    assert!(offered && conn.sack_enabled());
    let (conn, offered) = passive(&config(), false);
    assert!(
        !offered && !conn.sack_enabled(),
        "no offer, none in the SYN-ACK"
    );
    let (conn, offered) = passive(&off, true);
    assert!(
        !offered && !conn.sack_enabled(),
        "turned off: the SYN-ACK offers none"
    );
}

#[test]
fn without_sack_no_blocks_are_sent_or_taken() {
    let (mut conn, _) = passive(&config(), false);
    let payload = [1u8; MSS as usize];
    conn.on_segment(
        &seg(PEER + 1 + 2 * MSS).ack(ISS + 1).data(&payload),
        at_ms(2),
    );
    let out = drain(&mut conn, at_ms(2));
    assert_eq!(out.len(), 1);
    assert!(out[0].header.sack.is_empty());
    assert_eq!(conn.stats().sack_blocks_sent, 0);
}

#[test]
fn the_receiver_reports_out_of_order_data_latest_block_first() {
    let (mut conn, _) = passive(&config(), true);
    let payload = [7u8; MSS as usize];
    let at = |n: u32| PEER + 1 + n * MSS;
    let mut deliver = |n: u32| {
        conn.on_segment(&seg(at(n)).ack(ISS + 1).data(&payload), at_ms(2));
        let out = drain(&mut conn, at_ms(2));
        assert_eq!(out.len(), 1, "one ACK at once: {out:?}");
        (out[0].header.ack.unwrap().0, out[0].header.sack.to_pairs())
    };
    assert_eq!(deliver(0), (at(1), vec![]));
    // Segment 1 is missing; 2, 4 and 6 arrive: each ACK names the latest
    // block first, then the ones reported before.
    assert_eq!(deliver(2), (at(1), vec![(at(2), at(3))]));
    assert_eq!(deliver(4), (at(1), vec![(at(4), at(5)), (at(2), at(3))]));
    assert_eq!(
        deliver(6),
        (at(1), vec![(at(6), at(7)), (at(4), at(5)), (at(2), at(3))])
    );
    // A fourth block does not fit: the three most recent are sent.
    assert_eq!(
        deliver(8),
        (at(1), vec![(at(8), at(9)), (at(6), at(7)), (at(4), at(5))])
    );
    // 3 joins 2 and 4 into one block; 5 and 7 join the rest.
    assert_eq!(
        deliver(3),
        (at(1), vec![(at(2), at(5)), (at(8), at(9)), (at(6), at(7))])
    );
    assert_eq!(deliver(7), (at(1), vec![(at(6), at(9)), (at(2), at(5))]));
    assert_eq!(deliver(5), (at(1), vec![(at(2), at(9))]));
    // The hole filled: everything acknowledged, no blocks left.
    assert_eq!(deliver(1), (at(9), vec![]));
    let mut buf = vec![0; 16 * MSS as usize];
    assert_eq!(conn.recv(&mut buf), Ok(9 * MSS as usize));
    assert_eq!(conn.stats().sack_blocks_sent, 15);
}

#[test]
fn data_segments_carrying_blocks_stay_within_the_mss() {
    let (mut conn, _) = passive(&config(), true);
    let payload = [7u8; MSS as usize];
    conn.on_segment(
        &seg(PEER + 1 + 2 * MSS).ack(ISS + 1).data(&payload),
        at_ms(2),
    );
    conn.on_segment(
        &seg(PEER + 1 + 4 * MSS).ack(ISS + 1).data(&payload),
        at_ms(2),
    );
    drain(&mut conn, at_ms(2));
    assert_eq!(conn.send(&[9u8; 3000]), Ok(3000));
    let out = drain(&mut conn, at_ms(3));
    for s in &out {
        let options = ginza_net::tcp::wire::header_len(&s.view()) - 20;
        assert_eq!(s.header.sack.len(), 2);
        assert!(
            s.payload.len() + options <= MSS as usize,
            "{} payload bytes + {options} option bytes",
            s.payload.len()
        );
    }
}

/// The peer's ACK of everything before `ack`, with SACK blocks.
fn sack_ack(ack: u32, pairs: &[(u32, u32)]) -> Segment<'static> {
    let mut s = seg(PEER + 1).ack(ack);
    s.sack = blocks(pairs);
    s
}

/// A client and a server connected by a link that loses the first copy
/// of each segment in `lose` (by segment number) and delivers everything
/// else in order, a round trip a millisecond; returns the client's data
/// segments' numbers in the order sent, and what the server read.
fn transfer_losing(segments: u32, lose: &[u32]) -> (Connection, Connection, Vec<u32>, Vec<u8>) {
    let mut client = Connection::connect(&config(), CLIENT, SERVER, Seq(ISS), at_ms(0));
    let syn = drain(&mut client, at_ms(0)).remove(0);
    let mut server =
        Connection::accept(&config(), SERVER, CLIENT, &syn.view(), Seq(PEER), at_ms(0));
    let data: Vec<u8> = (0..segments * MSS).map(|i| (i % 251) as u8).collect();
    let (mut sent, mut read, mut lost) = (Vec::new(), Vec::new(), Vec::new());
    let mut buf = vec![0; 64 * 1024];
    let mut queued = 0;
    for round in 0..400u64 {
        let now = at_ms(round);
        for conn in [&mut client, &mut server] {
            if conn.next_deadline().is_some_and(|d| d <= now) {
                conn.on_timer(now);
            }
        }
        if client.state() == State::Established && queued < data.len() {
            queued += client.send(&data[queued..]).unwrap_or(0);
        }
        for s in drain(&mut client, now) {
            if !s.payload.is_empty() {
                let n = (s.header.seq.0 - ISS - 1) / MSS;
                sent.push(n);
                if lose.contains(&n) && !lost.contains(&n) {
                    lost.push(n);
                    continue;
                }
            }
            server.on_segment(&s.view(), now);
        }
        while let Ok(n) = server.recv(&mut buf) {
            if n == 0 {
                break;
            }
            read.extend_from_slice(&buf[..n]);
        }
        for s in drain(&mut server, now) {
            client.on_segment(&s.view(), now);
        }
        if read.len() == data.len() {
            assert!(read == data, "bytes intact");
            return (client, server, sent, read);
        }
    }
    panic!("transfer stalled: {:?}", client.sequence_state());
}

#[test]
fn the_sender_recovers_several_holes_in_one_window_without_a_timeout() {
    let (client, server, sent, _) = transfer_losing(60, &[12, 15, 17]);
    assert!(client.sack_enabled() && server.sack_enabled());
    let mut resent = Vec::new();
    let mut highest = None;
    for &n in &sent {
        if highest.is_some_and(|h| n <= h) {
            resent.push(n);
        }
        highest = highest.max(Some(n));
    }
    assert_eq!(
        resent,
        vec![12, 15, 17],
        "each hole once, nothing SACKed resent"
    );
    let stats = client.stats();
    assert_eq!(stats.timeouts, 0, "{stats:?}");
    assert_eq!(stats.retransmissions, 3);
    assert_eq!(stats.sack_retransmissions, 3);
    assert_eq!(stats.sack_recoveries, 1, "one episode for the three holes");
    assert!(stats.sack_blocks_received >= 3);
    assert!(server.stats().sack_blocks_sent >= 3);
    assert!(!client.in_fast_recovery());
}

#[test]
fn a_lost_tail_is_found_by_a_loss_probe_not_the_timer() {
    // The last two segments of the transfer are lost: nothing follows them
    // to be SACKed, so only a probe (RFC 8985 §7) can tell, two round trips
    // on, instead of the 200 ms retransmission timer.
    let (client, _, sent, _) = transfer_losing(10, &[8, 9]);
    let stats = client.stats();
    assert_eq!(stats.timeouts, 0, "{stats:?}");
    assert!(stats.loss_probes >= 1, "{stats:?}");
    let resent: Vec<u32> = sent[10..].to_vec();
    assert!(
        resent.contains(&8) && resent.contains(&9),
        "both resent: {resent:?}"
    );
}

#[test]
fn a_lone_reply_whose_ack_the_peer_delays_is_not_probed() {
    // An RPC: the peer sends a request, we answer with one segment, and
    // the peer holds its ACK for its next request (its delayed ACK), a few
    // ms on. RFC 8985 §7.2 adds the peer's worst-case delayed ACK to the
    // probe timeout of a lone segment: no probe (and no timer wake-up of
    // ours) before that ACK, however many round trips pass.
    let (mut conn, _) = passive(&config(), true);
    assert!(conn.sack_enabled());
    let mut peer_seq = PEER + 1;
    let mut t = 1;
    for _ in 0..20 {
        let ack = conn.sequence_state().1 .0;
        conn.on_segment(&seg(peer_seq).ack(ack).data(b"get k\r\n"), at_ms(t));
        peer_seq += 7;
        assert_eq!(conn.send(b"VALUE k 0 1\r\nv\r\nEND\r\n"), Ok(21));
        let out = drain(&mut conn, at_ms(t));
        assert_eq!(out.len(), 1, "the reply, carrying the ACK");
        let deadline = conn.next_deadline().expect("the reply is unacknowledged");
        assert!(
            deadline >= at_ms(t) + conn.rto(),
            "next timer {deadline:?} before the retransmission timer ({:?} after {:?})",
            conn.rto(),
            at_ms(t)
        );
        t += 5;
    }
    assert_eq!(conn.stats().loss_probes, 0);
}

#[test]
fn a_retransmission_lost_again_is_resent_before_the_timer() {
    let mut conn = active(&config(), true);
    let data = vec![5u8; 60 * MSS as usize];
    assert_eq!(conn.send(&data), Ok(data.len()));
    drain(&mut conn, at_ms(2));
    let at = |n: u32| ISS + 1 + n * MSS;
    // Segment 0 is lost; 1..10 are SACKed one by one.
    let mut sent = Vec::new();
    for n in 1..10 {
        conn.on_segment(&sack_ack(at(0), &[(at(1), at(n + 1))]), at_ms(3));
        sent.extend(drain(&mut conn, at_ms(3)));
    }
    let resends = |sent: &[Owned]| sent.iter().filter(|s| s.header.seq == Seq(at(0))).count();
    assert_eq!(resends(&sent), 1);
    let high = sent
        .iter()
        .map(|s| s.header.seq.0 + s.payload.len() as u32)
        .max()
        .unwrap();
    // The retransmission of 0 is lost too: the data sent after it arrives.
    let mut n = 10;
    while at(n) < high && resends(&sent) < 2 {
        n += 1;
        conn.on_segment(&sack_ack(at(0), &[(at(1), at(n))]), at_ms(4));
        sent.extend(drain(&mut conn, at_ms(4)));
    }
    assert_eq!(resends(&sent), 2, "resent again once overtaken: {n}");
    assert_eq!(conn.stats().timeouts, 0);
}

#[test]
fn blocks_that_make_no_sense_are_ignored() {
    let mut conn = active(&config(), true);
    let data = vec![5u8; 10 * MSS as usize];
    assert_eq!(conn.send(&data), Ok(data.len()));
    drain(&mut conn, at_ms(2));
    let max = ISS + 1 + 10 * MSS;
    let bogus = [
        // Beyond anything sent, at or below SND.UNA, reversed, empty,
        // and far away in the sequence space.
        &[
            (max, max + MSS),
            (ISS.wrapping_sub(5000), ISS + 1),
            (ISS + 3001, ISS + 2001),
        ][..],
        &[(ISS + 2001, ISS + 2001), (max + 1_000_000, max + 2_000_000)][..],
        &[(0x8000_0000, 0x8000_1000), (max - 10, max + 10)][..],
    ];
    for _ in 0..3 {
        for pairs in bogus {
            conn.on_segment(&sack_ack(ISS + 1, pairs), at_ms(3));
            let out = drain(&mut conn, at_ms(3));
            assert!(
                out.iter().all(|s| s.header.seq.0 >= max),
                "nothing resent: {out:?}"
            );
        }
    }
    let stats = conn.stats();
    assert_eq!(stats.sack_blocks_received, 0);
    assert_eq!(stats.sack_blocks_ignored, 3 * 7);
    assert!(conn.sacked_ranges().is_empty());
    assert!(
        !conn.in_fast_recovery(),
        "no hole made up by a forged block"
    );
    assert_eq!(stats.retransmissions, 0);
}

#[test]
fn after_a_timeout_go_back_n_skips_what_was_sacked() {
    let mut conn = active(&config(), true);
    let data = vec![5u8; 10 * MSS as usize];
    assert_eq!(conn.send(&data), Ok(data.len()));
    drain(&mut conn, at_ms(2));
    let at = |n: u32| ISS + 1 + n * MSS;
    // 0 and 1 lost; only 4..6 SACKed (too little for recovery: two
    // segments above a hole make no DupThresh).
    conn.on_segment(&sack_ack(at(0), &[(at(4), at(6))]), at_ms(3));
    drain(&mut conn, at_ms(3));
    assert!(!conn.in_fast_recovery());
    let rto = conn.next_deadline().unwrap();
    conn.on_timer(rto);
    let mut resent: Vec<u32> = Vec::new();
    let mut now = rto;
    for _ in 0..20 {
        for s in drain(&mut conn, now) {
            if !s.payload.is_empty() && s.header.seq.0 < at(10) {
                resent.push((s.header.seq.0 - ISS - 1) / MSS);
                // The peer ACKs each retransmission at once (with 4..6
                // still SACKed while it is above SND.UNA).
                let ack = s.header.seq.0 + s.payload.len() as u32;
                let sack = if ack < at(4) {
                    vec![(at(4), at(6))]
                } else {
                    vec![]
                };
                let ack = if ack == at(4) { at(6) } else { ack };
                conn.on_segment(&sack_ack(ack, &sack), now);
            }
        }
        now = now + ms(1);
    }
    assert_eq!(resent, vec![0, 1, 2, 3, 6, 7, 8, 9], "4 and 5 were SACKed");
}
