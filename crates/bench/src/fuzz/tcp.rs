//! Target `tcp`: the sans-IO TCP connection (`ginza_net::tcp::Connection`)
//! driven into one of its eleven states (SYN-SENT to CLOSED, some with
//! data in flight both ways), then fed random segments — mostly near the
//! window, some anywhere in the sequence space, with every flag and option
//! — interleaved with timers and the application's calls.
//!
//! Checked after every step: SND.UNA ≤ SND.NXT; the receive, reassembly
//! and send buffers within their bounds; the congestion window at least
//! one MSS; the RTO within its bounds and the peer's window within what
//! 16 bits and a 14-bit shift can say; no timer in CLOSED, none past the
//! longest timeout, none left due after `on_timer`; CLOSED and TIME-WAIT
//! never left for a live state; every segment sent well-formed (payload
//! within the MSS, not SYN and RST together, data within what was sent)
//! and `poll_transmit` ending; and the bytes read always the peer's, in
//! order (each byte the peer sends is a function of its sequence number).

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use ginza_net::tcp::{Connection, Flags, Instant, Segment, Seq, State, TcpConfig, Timestamp};
use ginza_net::{Endpoint, Ipv4Addr};

use super::{describe, List, Outcome};

const CLIENT: Endpoint = Endpoint::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
const SERVER: Endpoint = Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), 80);
/// Our initial sequence number wraps soon: the modular arithmetic is
/// exercised in every case.
const ISS: u32 = 0xffff_ff00;
const PEER_ISS: u32 = 0x7fff_ff00;
/// The largest window 16 bits and RFC 7323's largest shift can say.
const MAX_PEER_WINDOW: u64 = 65535 << 14;

#[derive(Debug, Arbitrary)]
struct Input {
    /// Which of the eleven starting points (`reach`), modulo 11.
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

/// Every byte the peer sends is a function of its sequence number, so the
/// bytes read can be checked for order whatever segments carried them.
fn byte_at(seq: Seq) -> u8 {
    (seq.0.wrapping_mul(2_654_435_761) >> 24) as u8
}

fn peer_bytes(seq: Seq, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte_at(seq + i)).collect()
}

/// Small buffers, so that the bounds are reached in a few segments.
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

fn at_ms(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

fn seg(seq: u32) -> Segment<'static> {
    let mut s = Segment::new(Seq(seq));
    s.window = 65535;
    s
}

fn with_ack(mut s: Segment<'_>, ack: u32) -> Segment<'_> {
    s.ack = Some(Seq(ack));
    s
}

/// The peer's clock for timestamps: 1 per millisecond.
fn peer_ts(now: Instant, echo: u32) -> Timestamp {
    Timestamp {
        value: (now.as_nanos() / 1_000_000) as u32 + 1,
        echo,
    }
}

fn drain(conn: &mut Connection, now: Instant) {
    let mut n = 0;
    while conn.poll_transmit(now).is_some() {
        n += 1;
        assert!(n < 10_000, "poll_transmit never ends");
    }
}

/// The peer's segment at `now`, with a timestamp when they are on.
fn stamp<'a>(mut s: Segment<'a>, ts: bool, now: Instant) -> Segment<'a> {
    if ts {
        s.timestamp = Some(peer_ts(now, 0));
    }
    s
}

fn established(config: &TcpConfig, ts: bool) -> Connection {
    let mut syn = seg(PEER_ISS);
    syn.flags.syn = true;
    syn.mss = Some(500);
    syn.window_scale = Some(1);
    let syn = stamp(syn, ts, at_ms(0));
    let mut conn = Connection::accept(config, SERVER, CLIENT, &syn, Seq(ISS), at_ms(0));
    drain(&mut conn, at_ms(0));
    let ack = stamp(with_ack(seg(PEER_ISS + 1), ISS + 1), ts, at_ms(1));
    conn.on_segment(&ack, at_ms(1));
    assert_eq!(conn.state(), State::Established, "the handshake completes");
    conn
}

/// A connection in starting point `which`.
fn reach(which: u8, config: &TcpConfig, ts: bool) -> Connection {
    let now = at_ms(1);
    let data = peer_bytes(Seq(PEER_ISS + 1), 300);
    let with_data = |conn: &mut Connection| {
        conn.send(&[0xab; 1200]).expect("room to send");
        drain(conn, now);
        let mut s = with_ack(seg(PEER_ISS + 1), ISS + 1);
        s.payload = &data;
        conn.on_segment(&stamp(s, ts, now), now);
        drain(conn, now);
    };
    let fin = |seq: u32, ack: u32| {
        let mut s = with_ack(seg(seq), ack);
        s.flags.fin = true;
        s
    };
    let mut conn;
    let expected = match which {
        0 => {
            conn = Connection::connect(config, CLIENT, SERVER, Seq(ISS), at_ms(0));
            drain(&mut conn, at_ms(0));
            State::SynSent
        }
        1 => {
            let mut syn = seg(PEER_ISS);
            syn.flags.syn = true;
            conn = Connection::accept(
                config,
                SERVER,
                CLIENT,
                &stamp(syn, ts, now),
                Seq(ISS),
                at_ms(0),
            );
            drain(&mut conn, at_ms(0));
            State::SynReceived
        }
        2 => {
            conn = established(config, ts);
            State::Established
        }
        3 => {
            conn = established(config, ts);
            with_data(&mut conn);
            State::Established
        }
        4 => {
            conn = established(config, ts);
            with_data(&mut conn);
            conn.shutdown();
            drain(&mut conn, now);
            State::FinWait1
        }
        5 => {
            conn = established(config, ts);
            conn.shutdown();
            drain(&mut conn, now);
            conn.on_segment(&stamp(with_ack(seg(PEER_ISS + 1), ISS + 2), ts, now), now);
            State::FinWait2
        }
        6 => {
            conn = established(config, ts);
            with_data(&mut conn);
            conn.on_segment(&stamp(fin(PEER_ISS + 301, ISS + 1), ts, now), now);
            drain(&mut conn, now);
            State::CloseWait
        }
        7 => {
            conn = established(config, ts);
            conn.shutdown();
            drain(&mut conn, now);
            conn.on_segment(&stamp(fin(PEER_ISS + 1, ISS + 1), ts, now), now);
            drain(&mut conn, now);
            State::Closing
        }
        8 => {
            conn = established(config, ts);
            conn.on_segment(&stamp(fin(PEER_ISS + 1, ISS + 1), ts, now), now);
            conn.shutdown();
            drain(&mut conn, now);
            State::LastAck
        }
        9 => {
            conn = established(config, ts);
            conn.shutdown();
            drain(&mut conn, now);
            conn.on_segment(&stamp(fin(PEER_ISS + 1, ISS + 2), ts, now), now);
            drain(&mut conn, now);
            State::TimeWait
        }
        _ => {
            conn = established(config, ts);
            conn.abort();
            drain(&mut conn, now);
            State::Closed
        }
    };
    assert_eq!(conn.state(), expected, "starting point {which}");
    conn
}

/// The invariants, and the reader's position in the peer's bytes.
struct Checker {
    config: TcpConfig,
    read_seq: Option<Seq>,
    /// SND.MAX: the highest sequence number sent (SND.NXT, or one past
    /// it after a zero-window probe).
    snd_max: Seq,
}

impl Checker {
    fn invariants(&mut self, conn: &Connection, now: Instant) {
        let (una, nxt, _) = conn.sequence_state();
        assert!(una.le(nxt), "SND.UNA {una} ≤ SND.NXT {nxt}");
        self.snd_max = self.snd_max.max(nxt);
        let c = &self.config;
        assert!(
            conn.recv_available() <= c.recv_buffer,
            "receive buffer over its bound"
        );
        assert!(
            conn.reassembly_held() <= c.reassembly_limit,
            "reassembly over its bound"
        );
        assert!(
            conn.send_queued() <= c.send_buffer,
            "send buffer over its bound"
        );
        assert!(
            conn.congestion_window() >= u32::from(conn.send_mss()),
            "cwnd below one MSS"
        );
        assert!(
            conn.send_mss() >= 1 && conn.send_mss() <= c.mss,
            "send MSS {}",
            conn.send_mss()
        );
        let rto = conn.rto();
        assert!(
            rto >= c.rto_min && rto <= c.rto_max,
            "RTO {rto:?} out of its bounds"
        );
        assert!(
            u64::from(conn.peer_window()) <= MAX_PEER_WINDOW,
            "peer window too large"
        );
        match conn.next_deadline() {
            None => {}
            Some(_) if conn.state() == State::Closed => panic!("a timer armed in CLOSED"),
            Some(deadline) => {
                let horizon = c.rto_max.max(c.time_wait) * 2;
                assert!(
                    deadline <= now + horizon,
                    "deadline {deadline:?} too far from {now:?}"
                );
            }
        }
    }

    fn transmit(&mut self, conn: &mut Connection, now: Instant) {
        let mss = usize::from(conn.send_mss());
        let (una, _, _) = conn.sequence_state();
        let (iss, _) = conn.initial_sequence_numbers();
        let mut count = 0;
        while let Some(s) = conn.poll_transmit(now) {
            count += 1;
            assert!(count < 10_000, "poll_transmit never ends");
            let (seq, len, rst) = (s.seq, s.payload.len(), s.flags.rst);
            assert!(len <= mss, "payload beyond the MSS");
            assert!(!(s.flags.syn && rst), "SYN and RST together");
            if len > 0 && !rst {
                // A keep-alive probe may sit one byte below SND.UNA; data
                // never lies beyond what was sent (SND.MAX), but for a
                // zero-window probe: one byte at SND.NXT, which does not
                // move it (crates/net's output.rs).
                let end = seq + len;
                assert!((una - 1u32).le(seq), "data at {seq} below SND.UNA {una}");
                let (_, nxt, _) = conn.sequence_state();
                let max = self.snd_max.max(nxt);
                let probe = len == 1 && seq == nxt;
                assert!(
                    probe || end.le(max),
                    "data up to {end} beyond SND.MAX {max}"
                );
                self.snd_max = max.max(end);
                assert!(iss.lt(seq), "data at {seq} not after ISS {iss}");
            }
        }
    }

    fn read(&mut self, conn: &mut Connection, max: usize) {
        let mut buf = vec![0; max];
        if let Ok(n @ 1..) = conn.recv(&mut buf) {
            let (_, irs) = conn.initial_sequence_numbers();
            let start = *self.read_seq.get_or_insert(irs + 1u32);
            assert_eq!(
                buf[..n],
                peer_bytes(start, n)[..],
                "bytes read out of order"
            );
            self.read_seq = Some(start + n);
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
    let which = input.state % 11;
    let ts = input.timestamps;
    let config = config(input.delayed_ack, input.nodelay);
    let mut conn = reach(which, &config, ts);
    let start = conn.state();
    let (_, nxt, _) = conn.sequence_state();
    let mut checker = Checker {
        config: config.clone(),
        read_seq: None,
        snd_max: nxt,
    };
    let mut now = at_ms(2);
    checker.invariants(&conn, now);
    for op in &input.ops {
        let before = conn.state();
        step(&mut conn, op, &mut now, ts);
        checker.transmit(&mut conn, now);
        checker.invariants(&conn, now);
        let after = conn.state();
        if before == State::Closed {
            assert_eq!(after, State::Closed, "CLOSED left for {after:?}");
        }
        if before == State::TimeWait {
            assert!(
                matches!(after, State::TimeWait | State::Closed),
                "TIME-WAIT left for {after:?}"
            );
        }
        let _ = conn.take_events();
        if let Op::Recv(max) = op {
            checker.read(&mut conn, usize::from(*max % 3000) + 1);
        }
    }
    // Whatever happened, what is left to read is in order.
    checker.read(&mut conn, 10_000);
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
    let (a, b) = (state_index(start), state_index(conn.state()));
    format!("{}->{}", NAMES[a], NAMES[b]).into()
}

fn step(conn: &mut Connection, op: &Op, now: &mut Instant, ts: bool) {
    let (una, _, rcv_nxt) = conn.sequence_state();
    match op {
        Op::Segment(s) => {
            let seq = s.seq.at(rcv_nxt);
            let len = usize::from(s.len % 1601);
            let payload = peer_bytes(seq + usize::from(s.syn), len);
            let mut segment = Segment::new(seq);
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
            conn.on_segment(&segment, *now);
        }
        Op::InWindow {
            offset,
            len,
            ack,
            fin,
            window,
        } => {
            let seq = rcv_nxt + u32::from(*offset % 4000);
            let payload = peer_bytes(seq, usize::from(*len % 1001));
            let (_, nxt, _) = conn.sequence_state();
            // An ACK between SND.UNA and SND.NXT.
            let span = (nxt - una).max(0) as u32;
            let mut segment = with_ack(seg(seq.0), (una + u32::from(*ack) % (span + 1)).0);
            segment.flags.fin = *fin;
            segment.window = *window;
            segment.payload = &payload;
            conn.on_segment(&stamp(segment, ts, *now), *now);
        }
        Op::Time(us) => {
            *now = *now + Duration::from_micros(u64::from(*us % 2_000_000));
            conn.on_timer(*now);
            if let Some(d) = conn.next_deadline() {
                assert!(d > *now, "a due timer survived on_timer");
            }
        }
        Op::NextDeadline => {
            if let Some(d) = conn.next_deadline() {
                *now = (*now).max(d);
                conn.on_timer(*now);
            }
        }
        Op::Send(len) => {
            let _ = conn.send(&vec![0x5a; usize::from(*len % 3000) + 1]);
        }
        // Reading happens in `case`, which knows the reader's position.
        Op::Recv(_) => {}
        Op::Shutdown => conn.shutdown(),
        Op::Close => conn.close(),
        Op::Abort => conn.abort(),
    }
}
