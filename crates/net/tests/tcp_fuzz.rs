//! Property test: random segments (biased towards the window), timers and
//! application calls driven into a connection in every state. No panic, and
//! the invariants hold after every step.

mod tcp_support;

use ginza_net::tcp::{Connection, Instant, Seq, State, TcpConfig};
use proptest::prelude::*;
use std::time::Duration;
use tcp_support::*;

const ISS: u32 = 0xffff_ff00; // wraps soon: the arithmetic is exercised
const PEER: u32 = 0x7fff_ff00;

/// Every byte the peer sends is a function of its sequence number, so the
/// bytes the reader gets can be checked for order whatever segments made
/// them.
fn byte_at(seq: Seq) -> u8 {
    (seq.0.wrapping_mul(2_654_435_761) >> 24) as u8
}

fn peer_bytes(seq: Seq, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte_at(seq + i)).collect()
}

fn config(delayed_ack: bool, nodelay: bool) -> TcpConfig {
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

fn t(ms: u64) -> Instant {
    at_ms(ms)
}

/// Established with SACK and timestamps on (the peer's SYN offers both,
/// as Linux's does), so random SACK blocks and TSvals reach the scoreboard,
/// loss recovery and PAWS.
fn established(config: &TcpConfig) -> Connection {
    let mut syn = seg(PEER).syn().options(Some(500), Some(1));
    syn.sack_permitted = true;
    syn.timestamp = Some(ginza_net::tcp::Timestamp { value: 1, echo: 0 });
    let mut conn = Connection::accept(config, SERVER, CLIENT, &syn, Seq(ISS), t(0));
    drain(&mut conn, t(0));
    conn.on_segment(&seg(PEER + 1).ack(ISS + 1), t(1));
    assert_eq!(conn.state(), State::Established);
    conn
}

/// A connection in state number `which` (all ten reachable states, some
/// with data in flight both ways).
fn reach(which: u8, config: &TcpConfig) -> Connection {
    let now = t(1);
    let data = peer_bytes(Seq(PEER + 1), 300);
    let with_data = |conn: &mut Connection| {
        conn.send(&[0xab; 1200]).unwrap();
        drain(conn, now);
        conn.on_segment(&seg(PEER + 1).ack(ISS + 1).data(&data), now);
        drain(conn, now);
    };
    let mut conn;
    match which {
        0 => {
            conn = Connection::connect(config, CLIENT, SERVER, Seq(ISS), t(0));
            drain(&mut conn, t(0));
        }
        1 => {
            let syn = seg(PEER).syn();
            conn = Connection::accept(config, SERVER, CLIENT, &syn, Seq(ISS), t(0));
            drain(&mut conn, t(0));
        }
        2 => conn = established(config),
        3 => {
            conn = established(config);
            with_data(&mut conn);
        }
        4 => {
            // FIN-WAIT-1 with data and FIN unacknowledged.
            conn = established(config);
            with_data(&mut conn);
            conn.shutdown();
            drain(&mut conn, now);
        }
        5 => {
            // FIN-WAIT-2.
            conn = established(config);
            conn.shutdown();
            drain(&mut conn, now);
            conn.on_segment(&seg(PEER + 1).ack(ISS + 2), now);
        }
        6 => {
            // CLOSE-WAIT with unread data.
            conn = established(config);
            with_data(&mut conn);
            conn.on_segment(&seg(PEER + 301).ack(ISS + 1).fin(), now);
            drain(&mut conn, now);
        }
        7 => {
            // CLOSING.
            conn = established(config);
            conn.shutdown();
            drain(&mut conn, now);
            conn.on_segment(&seg(PEER + 1).ack(ISS + 1).fin(), now);
            drain(&mut conn, now);
        }
        8 => {
            // LAST-ACK.
            conn = established(config);
            conn.on_segment(&seg(PEER + 1).ack(ISS + 1).fin(), now);
            conn.shutdown();
            drain(&mut conn, now);
        }
        9 => {
            // TIME-WAIT.
            conn = established(config);
            conn.shutdown();
            drain(&mut conn, now);
            conn.on_segment(&seg(PEER + 1).ack(ISS + 2).fin(), now);
            drain(&mut conn, now);
        }
        _ => {
            conn = established(config);
            conn.abort();
            drain(&mut conn, now);
        }
    }
    let expected = [
        State::SynSent,
        State::SynReceived,
        State::Established,
        State::Established,
        State::FinWait1,
        State::FinWait2,
        State::CloseWait,
        State::Closing,
        State::LastAck,
        State::TimeWait,
        State::Closed,
    ];
    assert_eq!(conn.state(), expected[usize::from(which.min(10))]);
    conn
}

#[derive(Debug, Clone)]
enum Op {
    Segment {
        syn: bool,
        fin: bool,
        rst: bool,
        has_ack: bool,
        /// `None`: anywhere in the sequence space.
        seq_offset: Option<i32>,
        ack_offset: Option<i32>,
        window: u16,
        len: usize,
        /// SACK blocks as (left − SND.UNA, length), any of them bogus.
        sack: Vec<(i32, i32)>,
        /// The TSval, when the segment carries timestamps.
        tsval: Option<u32>,
    },
    /// Advance the clock by this many microseconds and fire timers.
    Time(u64),
    /// Advance to the next deadline and fire it.
    NextDeadline,
    Send(usize),
    Recv(usize),
    Shutdown,
    Close,
    Abort,
}

fn op() -> impl Strategy<Value = Op> {
    let offset = prop_oneof![
        3 => (-600i32..4500).prop_map(Some),
        1 => Just(None),
    ];
    let segment = (
        any::<[bool; 4]>(),
        prop::bool::weighted(0.9),
        offset.clone(),
        offset,
        prop_oneof![Just(0u16), Just(65535), any::<u16>(), 0u16..4000],
        prop_oneof![Just(0usize), 1usize..600, 0usize..1600],
        prop::collection::vec((-600i32..4500, -100i32..3000), 0..4),
        prop_oneof![
            Just(None),
            (0u32..8).prop_map(Some),
            any::<u32>().prop_map(Some)
        ],
    )
        .prop_map(
            |(bits, has_ack, seq_offset, ack_offset, window, len, sack, tsval)| Op::Segment {
                syn: bits[0] && bits[1] && bits[2],
                fin: bits[1] && !bits[3],
                rst: bits[2] && bits[3] && bits[0],
                has_ack,
                seq_offset,
                ack_offset,
                window,
                len,
                sack,
                tsval,
            },
        );
    prop_oneof![
        12 => segment,
        2 => (0u64..2_000_000).prop_map(Op::Time),
        2 => Just(Op::NextDeadline),
        2 => (1usize..3000).prop_map(Op::Send),
        2 => (1usize..3000).prop_map(Op::Recv),
        1 => Just(Op::Shutdown),
        1 => Just(Op::Close),
        1 => Just(Op::Abort),
    ]
}

/// Checks the invariants and that every outgoing segment is well-formed.
struct Checker {
    config: TcpConfig,
    /// The sequence number of the next byte `recv` must return.
    read_seq: Option<Seq>,
}

impl Checker {
    fn invariants(&self, conn: &Connection, now: Instant) {
        let (una, nxt, _) = conn.sequence_state();
        assert!(una.le(nxt), "SND.UNA {una} ≤ SND.NXT {nxt}");
        assert!(conn.recv_available() <= self.config.recv_buffer);
        assert!(conn.reassembly_held() <= self.config.reassembly_limit);
        assert!(conn.send_queued() <= self.config.send_buffer);
        assert!(conn.congestion_window() >= u32::from(conn.send_mss()));
        match conn.next_deadline() {
            None => {}
            Some(_) if conn.state() == State::Closed => panic!("a timer armed in CLOSED"),
            Some(deadline) => {
                let horizon = self.config.rto_max.max(self.config.time_wait) * 2;
                assert!(
                    deadline <= now + horizon,
                    "deadline {deadline:?} too far from {now:?}"
                );
            }
        }
    }

    fn transmit(&self, conn: &mut Connection, now: Instant) {
        let mss = usize::from(conn.send_mss());
        let mut count = 0;
        while let Some(segment) = conn.poll_transmit(now) {
            count += 1;
            assert!(count < 1000, "poll_transmit never ends");
            assert!(segment.payload.len() <= mss, "payload beyond the MSS");
            assert!(!(segment.flags.syn && segment.flags.rst));
        }
    }

    fn read(&mut self, conn: &mut Connection, max: usize) {
        let mut buf = vec![0; max];
        if let Ok(n @ 1..) = conn.recv(&mut buf) {
            let (_, irs) = conn.initial_sequence_numbers();
            let start = *self.read_seq.get_or_insert(irs + 1u32);
            assert_eq!(buf[..n], peer_bytes(start, n)[..], "bytes out of order");
            self.read_seq = Some(start + n);
        }
    }
}

fn run(which: u8, delayed_ack: bool, nodelay: bool, ops: Vec<Op>) {
    let config = config(delayed_ack, nodelay);
    let mut conn = reach(which, &config);
    let mut checker = Checker {
        config: config.clone(),
        read_seq: None,
    };
    let mut now = t(2);
    checker.invariants(&conn, now);
    for op in ops {
        match op {
            Op::Segment {
                syn,
                fin,
                rst,
                has_ack,
                seq_offset,
                ack_offset,
                window,
                len,
                sack,
                tsval,
            } => {
                let (una, _, rcv_nxt) = conn.sequence_state();
                let seq = match seq_offset {
                    Some(offset) => Seq(rcv_nxt.0.wrapping_add_signed(offset)),
                    None => Seq(rand_u32(len as u64 ^ u64::from(window))),
                };
                let ack = match ack_offset {
                    Some(offset) => Seq(una.0.wrapping_add_signed(offset)),
                    None => Seq(rand_u32(u64::from(window) << 7)),
                };
                let payload = peer_bytes(seq + usize::from(syn), len);
                let mut segment = seg(seq.0).window(window).data(&payload);
                segment.flags = flags(syn, fin, rst);
                segment.ack = has_ack.then_some(ack);
                segment.sack = sack
                    .iter()
                    .map(|&(left, len)| {
                        let left = Seq(una.0.wrapping_add_signed(left));
                        ginza_net::tcp::SackBlock {
                            left,
                            right: Seq(left.0.wrapping_add_signed(len)),
                        }
                    })
                    .collect();
                segment.timestamp = tsval.map(|value| ginza_net::tcp::Timestamp { value, echo: 0 });
                if syn {
                    segment.mss = Some(window % 2000);
                    segment.window_scale = Some((len % 20) as u8);
                }
                conn.on_segment(&segment, now);
            }
            Op::Time(us) => {
                now = now + Duration::from_micros(us);
                conn.on_timer(now);
                if let Some(deadline) = conn.next_deadline() {
                    assert!(deadline > now, "a due timer survived on_timer");
                }
            }
            Op::NextDeadline => {
                if let Some(deadline) = conn.next_deadline() {
                    now = now.max(deadline);
                    conn.on_timer(now);
                }
            }
            Op::Send(len) => {
                let _ = conn.send(&vec![0x5a; len]);
            }
            Op::Recv(max) => checker.read(&mut conn, max),
            Op::Shutdown => conn.shutdown(),
            Op::Close => conn.close(),
            Op::Abort => conn.abort(),
        }
        checker.transmit(&mut conn, now);
        checker.invariants(&conn, now);
        let _ = conn.take_events();
    }
    // Whatever happened, reading drains in order.
    checker.read(&mut conn, 10_000);
}

/// A fixed scramble for "anywhere" numbers (proptest shrinks the inputs).
fn rand_u32(x: u64) -> u32 {
    tcp_support::Rng::new(x).next_u64() as u32
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_segments_in_every_state(
        which in 0u8..11,
        delayed_ack: bool,
        nodelay: bool,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(which, delayed_ack, nodelay, ops);
    }
}

/// Every state, a long in-window sequence: deterministic, so the run
/// covers every state whatever proptest draws.
#[test]
fn every_state_survives_a_long_random_run() {
    let mut rng = tcp_support::Rng::new(12);
    for which in 0..11 {
        for round in 0..4 {
            let ops = (0..300)
                .map(|_| match rng.below(10) {
                    0 => Op::Time(rng.below(300_000)),
                    1 => Op::Recv(rng.below(2000) as usize + 1),
                    2 => Op::Send(rng.below(2000) as usize + 1),
                    3 => Op::NextDeadline,
                    _ => Op::Segment {
                        syn: rng.below(30) == 0,
                        fin: rng.below(8) == 0,
                        rst: rng.below(30) == 0,
                        has_ack: rng.below(10) != 0,
                        seq_offset: Some(rng.below(4000) as i32 - 500),
                        ack_offset: Some(rng.below(3000) as i32 - 300),
                        window: rng.below(5000) as u16,
                        len: rng.below(700) as usize,
                        sack: (0..rng.below(4))
                            .map(|_| (rng.below(3000) as i32 - 100, rng.below(2000) as i32))
                            .collect(),
                        tsval: (rng.below(3) != 0).then(|| rng.below(6) as u32),
                    },
                })
                .collect();
            run(which, round % 2 == 0, round < 2, ops);
        }
    }
}
