//! Target `tcp`: the sans-IO TCP connection (`ginza_net::tcp::Connection`)
//! driven into one of its eleven states (SYN-SENT to CLOSED, some with
//! data in flight both ways), then fed random segments — mostly near the
//! window, some anywhere in the sequence space, with every flag and option
//! — interleaved with timers and the application's calls.
//!
//! The starting points and the invariants checked after every step are
//! `ginza_net::tcp::testing`'s, shared with the property test.

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use ginza_net::tcp::testing::{fuzz_config, peer_bytes, seg, Call, Fuzzed, Peer, Stamps, STARTS};
use ginza_net::tcp::{Flags, Seq, State, Timestamp};

use super::{describe, List, Outcome};

#[derive(Debug, Arbitrary)]
struct Input {
    /// Which of the starting points (`testing::reach`), modulo `STARTS`.
    state: u8,
    delayed_ack: bool,
    nodelay: bool,
    /// The peer offers timestamps on its SYN (passive opens only).
    timestamps: bool,
    ops: List<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    /// Any segment.
    Segment(Seg),
    /// A segment with an acceptable ACK and in-window data: gets past the
    /// first checks, so the data, FIN and reassembly paths run.
    InWindow {
        offset: u16,
        len: u16,
        ack: u16,
        fin: bool,
        window: u16,
    },
    /// Advance the clock by this many microseconds and fire timers.
    Time(u32),
    /// Advance to the next deadline and fire it.
    NextDeadline,
    Send(u16),
    Recv(u16),
    Shutdown,
    Close,
    Abort,
}

#[derive(Debug, Arbitrary)]
struct Seg {
    syn: bool,
    fin: bool,
    rst: bool,
    psh: bool,
    seq: Pos,
    ack: Option<Pos>,
    window: u16,
    len: u16,
    mss: Option<u16>,
    window_scale: Option<u8>,
    timestamp: Option<(u32, u32)>,
}

/// A sequence or acknowledgement number: near RCV.NXT (or SND.UNA), or
/// anywhere.
#[derive(Debug, Arbitrary)]
enum Pos {
    Near(i16),
    Anywhere(u32),
}

impl Pos {
    fn at(&self, base: Seq) -> Seq {
        match *self {
            Pos::Near(d) => Seq(base.0.wrapping_add_signed(i32::from(d))),
            Pos::Anywhere(v) => Seq(v),
        }
    }
}

fn state_index(s: State) -> usize {
    match s {
        State::SynSent => 0,
        State::SynReceived => 1,
        State::Established => 2,
        State::FinWait1 => 3,
        State::FinWait2 => 4,
        State::CloseWait => 5,
        State::Closing => 6,
        State::LastAck => 7,
        State::TimeWait => 8,
        State::Closed => 9,
    }
}

pub(super) fn case(u: &mut Unstructured<'_>, out: &mut Option<String>) -> Outcome {
    let Ok(input) = Input::arbitrary(u) else {
        return "no-input".into();
    };
    describe(out, &input);
    let peer = Peer {
        sack: false,
        stamps: if input.timestamps {
            Stamps::Every
        } else {
            Stamps::None
        },
    };
    let config = fuzz_config(input.delayed_ack, input.nodelay);
    let mut fuzzed = Fuzzed::new(input.state % STARTS, &config, &peer);
    for op in &input.ops {
        step(&mut fuzzed, op, &peer);
    }
    let (start, end) = fuzzed.finish();
    const NAMES: [&str; 10] = [
        "syn-sent",
        "syn-received",
        "established",
        "fin-wait-1",
        "fin-wait-2",
        "close-wait",
        "closing",
        "last-ack",
        "time-wait",
        "closed",
    ];
    let (a, b) = (state_index(start), state_index(end));
    format!("{}->{}", NAMES[a], NAMES[b]).into()
}

fn step(fuzzed: &mut Fuzzed, op: &Op, peer: &Peer) {
    let (una, nxt, rcv_nxt) = fuzzed.conn.sequence_state();
    let payload;
    let call = match op {
        Op::Segment(s) => {
            let seq = s.seq.at(rcv_nxt);
            payload = peer_bytes(seq + usize::from(s.syn), usize::from(s.len % 1601));
            let mut segment = seg(seq.0);
            segment.ack = s.ack.as_ref().map(|p| p.at(una));
            segment.flags = Flags {
                syn: s.syn,
                fin: s.fin,
                rst: s.rst,
                psh: s.psh,
            };
            segment.window = s.window;
            segment.mss = s.mss;
            segment.window_scale = s.window_scale;
            segment.timestamp = s.timestamp.map(|(value, echo)| Timestamp { value, echo });
            segment.payload = &payload;
            Call::Segment(segment)
        }
        Op::InWindow {
            offset,
            len,
            ack,
            fin,
            window,
        } => {
            let seq = rcv_nxt + u32::from(*offset % 4000);
            payload = peer_bytes(seq, usize::from(*len % 1001));
            // An ACK between SND.UNA and SND.NXT.
            let span = (nxt - una).max(0) as u32;
            let mut segment = seg(seq.0);
            segment.ack = Some(una + u32::from(*ack) % (span + 1));
            segment.flags.fin = *fin;
            segment.window = *window;
            segment.payload = &payload;
            Call::Segment(peer.stamp(segment, fuzzed.now))
        }
        Op::Time(us) => Call::Time(Duration::from_micros(u64::from(*us % 2_000_000))),
        Op::NextDeadline => Call::NextDeadline,
        Op::Send(len) => Call::Send(usize::from(*len % 3000) + 1),
        Op::Recv(max) => Call::Recv(usize::from(*max % 3000) + 1),
        Op::Shutdown => Call::Shutdown,
        Op::Close => Call::Close,
        Op::Abort => Call::Abort,
    };
    fuzzed.step(call);
}
