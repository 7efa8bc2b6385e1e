//! Test support, not API: what the TCP property test (`tests/tcp_fuzz.rs`)
//! and the fuzz target (`ginza fuzz tcp`) share, so that both drive the
//! same connections and check the same invariants.
//!
//! * here: a peer whose every byte is a function of its sequence number
//!   ([`peer_bytes`]), small buffers ([`fuzz_config`]) and a connection
//!   driven into each of its eleven starting points ([`reach`]);
//! * [`fuzzed`]: a connection under random calls ([`Fuzzed`]), its
//!   invariants checked after every step.

pub mod fuzzed;

pub use fuzzed::{Call, Fuzzed};

use std::time::Duration;

use super::{Connection, Instant, Segment, Seq, State, TcpConfig, Timestamp};
use crate::{Endpoint, Ipv4Addr};

pub const CLIENT: Endpoint = Endpoint::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
pub const SERVER: Endpoint = Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), 80);
/// Our initial sequence number wraps soon: the modular arithmetic is
/// exercised in every case.
pub const ISS: u32 = 0xffff_ff00;
pub const PEER_ISS: u32 = 0x7fff_ff00;
/// How many starting points [`reach`] knows (`0..STARTS`).
pub const STARTS: u8 = 11;

/// Every byte the peer sends is a function of its sequence number, so the
/// bytes read can be checked for order whatever segments carried them.
pub fn byte_at(seq: Seq) -> u8 {
    (seq.0.wrapping_mul(2_654_435_761) >> 24) as u8
}

/// The peer's `len` bytes from `seq` on.
pub fn peer_bytes(seq: Seq, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte_at(seq + i)).collect()
}

/// Small buffers, so that the bounds are reached in a few segments.
pub fn fuzz_config(delayed_ack: bool, nodelay: bool) -> TcpConfig {
    TcpConfig {
        mss: 500,
        recv_buffer: 4000,
        send_buffer: 5000,
        reassembly_limit: 3000,
        nodelay,
        max_retransmissions: 4,
        max_syn_retransmissions: 2,
        delayed_ack: delayed_ack.then(|| Duration::from_micros(500)),
        ..TcpConfig::default()
    }
}

pub fn at_ms(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

/// A crafted segment at `seq`, offering the largest unscaled window.
pub fn seg(seq: u32) -> Segment<'static> {
    let mut s = Segment::new(Seq(seq));
    s.window = 65535;
    s
}

fn with_ack(mut s: Segment<'_>, ack: u32) -> Segment<'_> {
    s.ack = Some(Seq(ack));
    s
}

/// Where the peer puts RFC 7323 timestamps while a starting point is
/// reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamps {
    None,
    /// On the handshake's SYN only: later segments come without.
    Syn,
    /// On every segment, the peer's clock at 1 per millisecond.
    Every,
}

/// What the peer offers while a starting point is reached.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// Its handshake's SYN offers SACK.
    pub sack: bool,
    pub stamps: Stamps,
}

impl Peer {
    /// `s` as the peer sends it at `now`: stamped when it stamps every
    /// segment.
    pub fn stamp<'a>(&self, mut s: Segment<'a>, now: Instant) -> Segment<'a> {
        if self.stamps == Stamps::Every {
            s.timestamp = Some(peer_timestamp(now));
        }
        s
    }

    /// The SYN of a handshake that completes: MSS, window scale, and SACK
    /// and timestamps as offered.
    fn handshake_syn(&self) -> Segment<'static> {
        let mut syn = seg(PEER_ISS);
        syn.flags.syn = true;
        syn.mss = Some(500);
        syn.window_scale = Some(1);
        syn.sack_permitted = self.sack;
        if self.stamps != Stamps::None {
            syn.timestamp = Some(peer_timestamp(at_ms(0)));
        }
        syn
    }
}

/// The peer's timestamp at `now`: its clock counts 1 per millisecond.
fn peer_timestamp(now: Instant) -> Timestamp {
    Timestamp {
        value: (now.as_nanos() / 1_000_000) as u32 + 1,
        echo: 0,
    }
}

/// Sends nothing anywhere: what the connection wants to send now is
/// dropped.
fn discard_transmit(conn: &mut Connection, now: Instant) {
    let mut n = 0;
    while conn.poll_transmit(now).is_some() {
        n += 1;
        assert!(n < 10_000, "poll_transmit never ends");
    }
}

fn established(config: &TcpConfig, peer: &Peer) -> Connection {
    let syn = peer.handshake_syn();
    let mut conn = Connection::accept(config, SERVER, CLIENT, &syn, Seq(ISS), at_ms(0));
    discard_transmit(&mut conn, at_ms(0));
    let ack = peer.stamp(with_ack(seg(PEER_ISS + 1), ISS + 1), at_ms(1));
    conn.on_segment(&ack, at_ms(1));
    assert_eq!(conn.state(), State::Established, "the handshake completes");
    conn
}

/// A connection (the server's side, but for SYN-SENT) in starting point
/// `which` (`0..STARTS`; larger is the last): SYN-SENT, SYN-RECEIVED (from
/// a bare SYN), ESTABLISHED, ESTABLISHED with data in flight both ways,
/// FIN-WAIT-1 with data and FIN unacknowledged, FIN-WAIT-2, CLOSE-WAIT with
/// unread data, CLOSING, LAST-ACK, TIME-WAIT, CLOSED.
pub fn reach(which: u8, config: &TcpConfig, peer: &Peer) -> Connection {
    let now = at_ms(1);
    let data = peer_bytes(Seq(PEER_ISS + 1), 300);
    let with_data = |conn: &mut Connection| {
        conn.send(&[0xab; 1200]).expect("room to send");
        discard_transmit(conn, now);
        let mut s = with_ack(seg(PEER_ISS + 1), ISS + 1);
        s.payload = &data;
        conn.on_segment(&peer.stamp(s, now), now);
        discard_transmit(conn, now);
    };
    // The peer's segment at `now`.
    let from_peer = |conn: &mut Connection, seq: u32, ack: u32, fin: bool| {
        let mut s = with_ack(seg(seq), ack);
        s.flags.fin = fin;
        conn.on_segment(&peer.stamp(s, now), now);
    };
    let mut conn;
    let expected = match which {
        0 => {
            conn = Connection::connect(config, CLIENT, SERVER, Seq(ISS), at_ms(0));
            discard_transmit(&mut conn, at_ms(0));
            State::SynSent
        }
        1 => {
            let mut syn = seg(PEER_ISS);
            syn.flags.syn = true;
            let syn = peer.stamp(syn, now);
            conn = Connection::accept(config, SERVER, CLIENT, &syn, Seq(ISS), at_ms(0));
            discard_transmit(&mut conn, at_ms(0));
            State::SynReceived
        }
        2 => {
            conn = established(config, peer);
            State::Established
        }
        3 => {
            conn = established(config, peer);
            with_data(&mut conn);
            State::Established
        }
        4 => {
            conn = established(config, peer);
            with_data(&mut conn);
            conn.shutdown();
            discard_transmit(&mut conn, now);
            State::FinWait1
        }
        5 => {
            conn = established(config, peer);
            conn.shutdown();
            discard_transmit(&mut conn, now);
            from_peer(&mut conn, PEER_ISS + 1, ISS + 2, false);
            State::FinWait2
        }
        6 => {
            conn = established(config, peer);
            with_data(&mut conn);
            from_peer(&mut conn, PEER_ISS + 301, ISS + 1, true);
            discard_transmit(&mut conn, now);
            State::CloseWait
        }
        7 => {
            conn = established(config, peer);
            conn.shutdown();
            discard_transmit(&mut conn, now);
            from_peer(&mut conn, PEER_ISS + 1, ISS + 1, true);
            discard_transmit(&mut conn, now);
            State::Closing
        }
        8 => {
            conn = established(config, peer);
            from_peer(&mut conn, PEER_ISS + 1, ISS + 1, true);
            conn.shutdown();
            discard_transmit(&mut conn, now);
            State::LastAck
        }
        9 => {
            conn = established(config, peer);
            conn.shutdown();
            discard_transmit(&mut conn, now);
            from_peer(&mut conn, PEER_ISS + 1, ISS + 2, true);
            discard_transmit(&mut conn, now);
            State::TimeWait
        }
        _ => {
            conn = established(config, peer);
            conn.abort();
            discard_transmit(&mut conn, now);
            State::Closed
        }
    };
    assert_eq!(conn.state(), expected, "starting point {which}");
    conn
}
