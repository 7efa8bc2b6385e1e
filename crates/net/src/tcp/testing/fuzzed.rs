//! A connection under random calls, its invariants checked after every
//! step: SND.UNA ≤ SND.NXT; the receive, reassembly and send buffers
//! within their bounds; the congestion window at least one MSS; the RTO
//! within its bounds and the peer's window within what 16 bits and a
//! 14-bit shift can say; no timer in CLOSED, none past the longest
//! timeout, none left due after `on_timer`; CLOSED and TIME-WAIT never left
//! for a live state; every segment sent well-formed (payload within the
//! MSS, not SYN and RST together, data within what was sent) and
//! `poll_transmit` ending; and the bytes read always the peer's, in order.

use std::time::Duration;

use super::{at_ms, peer_bytes, reach, Peer};
use crate::tcp::{Connection, Instant, Segment, Seq, State, TcpConfig};

/// The largest window 16 bits and RFC 7323's largest shift can say.
const MAX_PEER_WINDOW: u64 = 65535 << 14;

/// One step of a run.
#[derive(Debug, Clone)]
pub enum Call<'a> {
    /// The peer's segment.
    Segment(Segment<'a>),
    /// Advance the clock by this much and fire what timers are due.
    Time(Duration),
    /// Advance to the next deadline, if any, and fire it.
    NextDeadline,
    /// The application sends this many bytes.
    Send(usize),
    /// The application reads up to this many bytes (checked: the peer's,
    /// in order).
    Recv(usize),
    Shutdown,
    Close,
    Abort,
}

/// A connection from a starting point ([`reach`]) and the clock of its run.
pub struct Fuzzed {
    pub conn: Connection,
    pub now: Instant,
    start: State,
    checker: Checker,
}

impl Fuzzed {
    /// Starting point `which`, the clock at 2 ms, the invariants checked.
    pub fn new(which: u8, config: &TcpConfig, peer: &Peer) -> Fuzzed {
        let conn = reach(which, config, peer);
        let (_, snd_nxt, _) = conn.sequence_state();
        let mut fuzzed = Fuzzed {
            start: conn.state(),
            conn,
            now: at_ms(2),
            checker: Checker {
                config: config.clone(),
                read_seq: None,
                snd_max: snd_nxt,
            },
        };
        fuzzed.checker.invariants(&fuzzed.conn, fuzzed.now);
        fuzzed
    }

    /// Makes `call`, takes what the connection sends, and checks.
    pub fn step(&mut self, call: Call<'_>) {
        let conn = &mut self.conn;
        let before = conn.state();
        match call {
            Call::Segment(segment) => conn.on_segment(&segment, self.now),
            Call::Time(by) => {
                self.now = self.now + by;
                conn.on_timer(self.now);
                if let Some(deadline) = conn.next_deadline() {
                    assert!(deadline > self.now, "a due timer survived on_timer");
                }
            }
            Call::NextDeadline => {
                if let Some(deadline) = conn.next_deadline() {
                    self.now = self.now.max(deadline);
                    conn.on_timer(self.now);
                }
            }
            Call::Send(len) => {
                let _ = conn.send(&vec![0x5a; len]);
            }
            Call::Recv(max) => self.checker.read(conn, max),
            Call::Shutdown => conn.shutdown(),
            Call::Close => conn.close(),
            Call::Abort => conn.abort(),
        }
        self.checker.transmit(conn, self.now);
        self.checker.invariants(conn, self.now);
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
    }

    /// Reads what is left (whatever happened, it is in order); the states
    /// the run started and ended in.
    pub fn finish(mut self) -> (State, State) {
        self.checker.read(&mut self.conn, 10_000);
        (self.start, self.conn.state())
    }
}

/// The invariants, and the reader's position in the peer's bytes.
struct Checker {
    config: TcpConfig,
    /// The sequence number of the next byte `recv` must return.
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
                // move it (conn/output.rs).
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
