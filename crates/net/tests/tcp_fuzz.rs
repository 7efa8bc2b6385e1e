//! Property test: random segments (biased towards the window), timers and
//! application calls driven into a connection in every state. No panic, and
//! the invariants hold after every step.

mod tcp_support;

use ginza_net::tcp::testing::{fuzz_config, peer_bytes, Call, Fuzzed, Peer, Stamps, STARTS};
use ginza_net::tcp::{SackBlock, Seq, Timestamp};
use proptest::prelude::*;
use std::time::Duration;
use tcp_support::{flags, seg, Craft};

/// The peer offers SACK and timestamps on its SYN (as Linux's does), so
/// random SACK blocks and TSvals reach the scoreboard, loss recovery and
/// PAWS.
const PEER: Peer = Peer {
    sack: true,
    stamps: Stamps::Syn,
};

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
    /// Any call but a segment.
    Call(Call<'static>),
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
        2 => (0u64..2_000_000).prop_map(|us| Op::Call(Call::Time(Duration::from_micros(us)))),
        2 => Just(Op::Call(Call::NextDeadline)),
        2 => (1usize..3000).prop_map(|len| Op::Call(Call::Send(len))),
        2 => (1usize..3000).prop_map(|max| Op::Call(Call::Recv(max))),
        1 => Just(Op::Call(Call::Shutdown)),
        1 => Just(Op::Call(Call::Close)),
        1 => Just(Op::Call(Call::Abort)),
    ]
}

fn run(which: u8, delayed_ack: bool, nodelay: bool, ops: Vec<Op>) {
    let mut fuzzed = Fuzzed::new(which, &fuzz_config(delayed_ack, nodelay), &PEER);
    for op in ops {
        let payload;
        let call = match op {
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
                let (una, _, rcv_nxt) = fuzzed.conn.sequence_state();
                let seq = match seq_offset {
                    Some(offset) => Seq(rcv_nxt.0.wrapping_add_signed(offset)),
                    None => Seq(rand_u32(len as u64 ^ u64::from(window))),
                };
                let ack = match ack_offset {
                    Some(offset) => Seq(una.0.wrapping_add_signed(offset)),
                    None => Seq(rand_u32(u64::from(window) << 7)),
                };
                payload = peer_bytes(seq + usize::from(syn), len);
                let mut segment = seg(seq.0).window(window).data(&payload);
                segment.flags = flags(syn, fin, rst);
                segment.ack = has_ack.then_some(ack);
                segment.sack = sack
                    .iter()
                    .map(|&(left, len)| {
                        let left = Seq(una.0.wrapping_add_signed(left));
                        SackBlock {
                            left,
                            right: Seq(left.0.wrapping_add_signed(len)),
                        }
                    })
                    .collect();
                segment.timestamp = tsval.map(|value| Timestamp { value, echo: 0 });
                if syn {
                    segment.mss = Some(window % 2000);
                    segment.window_scale = Some((len % 20) as u8);
                }
                Call::Segment(segment)
            }
            Op::Call(call) => call,
        };
        fuzzed.step(call);
    }
    fuzzed.finish();
}

/// A fixed scramble for "anywhere" numbers (proptest shrinks the inputs).
fn rand_u32(x: u64) -> u32 {
    tcp_support::Rng::new(x).next_u64() as u32
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_segments_in_every_state(
        which in 0..STARTS,
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
    for which in 0..STARTS {
        for round in 0..4 {
            let ops = (0..300)
                .map(|_| match rng.below(10) {
                    0 => Op::Call(Call::Time(Duration::from_micros(rng.below(300_000)))),
                    1 => Op::Call(Call::Recv(rng.below(2000) as usize + 1)),
                    2 => Op::Call(Call::Send(rng.below(2000) as usize + 1)),
                    3 => Op::Call(Call::NextDeadline),
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
