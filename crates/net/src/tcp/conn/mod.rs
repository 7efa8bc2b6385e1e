//! One TCP connection (the transmission control block) as a sans-IO state
//! machine (docs/tcp.md).
//!
//! One small module per mechanism:
//! * [`input`]: segment arrival (RFC 9293 §3.10.7, RFC 5961).
//! * [`output`]: what to send next (data, FIN, ACKs, probes; Nagle).
//! * [`send_buffer`]: unacknowledged and unsent bytes.
//! * [`reassembly`]: in-order bytes for the reader, bounded out-of-order set.
//! * [`rtt`]: RFC 6298 retransmission timeout, Karn's rule, back-off.
//! * [`congestion`]: NewReno (RFC 5681, RFC 6582).
//! * [`sack`]: RFC 2018 SACK: the receiver's blocks, the sender's scoreboard.
//! * [`loss_recovery`]: RFC 6675 SACK-based loss recovery.
//! * [`rack`]: time-ordered loss detection (RACK's idea, RFC 8985 §6).
//! * [`keepalive`]: keep-alive probes (RFC 1122 §4.2.3.6).
//! * [`paws`]: RFC 7323 §5 PAWS.
//! * [`challenge`]: RFC 5961 challenge ACKs and their rate limit.
//! * [`cookie`]: the passive open without state (SYN cookies): the
//!   stateless SYN-ACK, the connection made from the returning ACK.

mod challenge;
mod congestion;
mod cookie;
mod input;
mod keepalive;
mod loss_recovery;
mod output;
mod paws;
mod rack;
mod reassembly;
mod rtt;
mod sack;
mod send_buffer;

pub use keepalive::KeepAlive;

use super::segment::Flags;
use super::{Instant, Segment, Seq};
use crate::Endpoint;
use challenge::ChallengeLimiter;
use congestion::NewReno;
use keepalive::{KeepAliveAction, KeepAliveTimer};
use loss_recovery::SackRecovery;
use paws::RecentTimestamp;
use rack::TransmitLog;
use reassembly::ReceiveBuffer;
use rtt::RttEstimator;
use sack::{ReceiverReport, Scoreboard};
use send_buffer::SendBuffer;
use std::time::Duration;

/// RFC 9293 §3.3.2's states, less LISTEN (a listening port is a
/// [`Listener`](super::listen::Listener), not a connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    SynSent,
    SynReceived,
    Established,
    FinWait1,
    FinWait2,
    CloseWait,
    Closing,
    LastAck,
    TimeWait,
    Closed,
}

/// Why an operation on a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TcpError {
    /// Nothing to read yet / no room to send yet: wait for an event.
    #[error("operation would block")]
    WouldBlock,
    /// Our SYN was answered by a RST.
    #[error("connection refused by the peer")]
    Refused,
    /// The peer reset an established connection.
    #[error("connection reset by the peer")]
    Reset,
    /// Retransmissions (or the SYN's) gave up.
    #[error("connection timed out: the peer stopped acknowledging")]
    TimedOut,
    /// Sending after our own shutdown or close.
    #[error("connection closed for sending")]
    Closed,
    /// Sending or receiving before the handshake completed.
    #[error("connection not established yet")]
    NotConnected,
}

/// Tunables of one connection. `Default` gives what a datacenter RPC
/// server wants (see each field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// The MSS we advertise and the largest payload we send.
    pub mss: u16,
    /// Receive buffer, in bytes: the window we advertise at most.
    pub recv_buffer: usize,
    /// Send buffer, in bytes: `send` accepts no more than this unacknowledged.
    pub send_buffer: usize,
    /// Out-of-order bytes held for reassembly at most; later segments beyond
    /// this are dropped (and retransmitted by the peer).
    pub reassembly_limit: usize,
    /// Disable Nagle's algorithm (on by default: RPC latency).
    pub nodelay: bool,
    /// RFC 6298 bounds and the initial value.
    pub rto_initial: Duration,
    pub rto_min: Duration,
    pub rto_max: Duration,
    /// Retransmissions of one segment before the connection gives up with
    /// [`TcpError::TimedOut`].
    pub max_retransmissions: u32,
    /// SYN retransmissions before a connect gives up.
    pub max_syn_retransmissions: u32,
    /// Time spent in TIME-WAIT (2 × MSL).
    pub time_wait: Duration,
    /// Delay before a lone ACK is sent (`None`: ACK every segment at once).
    pub delayed_ack: Option<Duration>,
    /// Offer and accept RFC 2018 SACK (used when both SYNs carry
    /// SACK-permitted).
    pub sack: bool,
    /// Answer the in-order segments of one receive burst once, at its end
    /// ([`Connection::may_answer_after_burst`]; on by default).
    pub answer_after_burst: bool,
    /// Keep-alive probes (`None`, the default: off, as on Linux).
    pub keepalive: Option<KeepAlive>,
}

/// Wake-ups accumulated since the last [`Connection::take_events`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Events {
    /// Bytes or the peer's FIN became readable, or an error is pending.
    pub readable: bool,
    /// Send-buffer space was freed, or an error is pending.
    pub writable: bool,
    /// The handshake completed (or failed: see [`Connection::error`]).
    pub connected: bool,
    /// The connection reached CLOSED.
    pub closed: bool,
}

/// What happened on one connection, for stats and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectionStats {
    pub segments_in: u64,
    pub segments_out: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub fast_retransmits: u64,
    pub out_of_order_segments: u64,
    pub duplicate_segments: u64,
    pub challenge_acks: u64,
    pub zero_window_probes: u64,
    /// Segments dropped as unacceptable (outside the window, bad ACK, …).
    pub dropped: u64,
    /// SACK blocks we sent (as receiver).
    pub sack_blocks_sent: u64,
    /// SACK blocks from the peer taken into the scoreboard.
    pub sack_blocks_received: u64,
    /// SACK blocks from the peer ignored (outside SND.UNA..SND.MAX, empty).
    pub sack_blocks_ignored: u64,
    /// RFC 6675 loss-recovery episodes entered.
    pub sack_recoveries: u64,
    /// Retransmissions chosen by SACK loss recovery (holes, and data
    /// skipped over SACKed ranges after a timeout).
    pub sack_retransmissions: u64,
    /// Keep-alive probes sent.
    pub keepalive_probes: u64,
    /// Segments dropped by PAWS (a TSval older than TS.Recent).
    pub paws_drops: u64,
    /// Tail loss probes sent (RFC 8985 §7).
    pub loss_probes: u64,
}

impl Default for TcpConfig {
    /// Datacenter defaults: Ethernet's MSS, 256 KiB buffers (a 100 Gbit/s ×
    /// 20 µs bandwidth-delay product with room for loss), RFC 6298's initial
    /// RTO of 1 s and Linux's 200 ms floor, Nagle off, and a short delayed
    /// ACK: 500 µs is far below any peer's RTO floor (200 ms) and the Nagle
    /// stall it could cause is 500 µs, not 40 ms, while a reply written
    /// within it carries the ACK, so request/response traffic sends one
    /// segment per message instead of two.
    fn default() -> TcpConfig {
        TcpConfig {
            mss: 1460,
            recv_buffer: 256 * 1024,
            send_buffer: 256 * 1024,
            reassembly_limit: 256 * 1024,
            nodelay: true,
            rto_initial: Duration::from_secs(1),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(60),
            max_retransmissions: 15,
            max_syn_retransmissions: 6,
            time_wait: Duration::from_secs(60),
            delayed_ack: Some(Duration::from_micros(500)),
            sack: true,
            answer_after_burst: true,
            keepalive: None,
        }
    }
}

/// Unanswered loss probes before only the retransmission timer is left
/// (RFC 8985 sends one; a lost probe or a lost answer to it would then cost
/// a 200 ms timeout where a few more milliseconds of probing do).
const MAX_LOSS_PROBES: u32 = 3;
/// RFC 8985 §7.2's WCDelAckT: how long a peer may hold the ACK of a lone
/// segment (its delayed-ACK timer; Linux's is at most 200 ms).
const PEER_DELAYED_ACK_MAX: Duration = Duration::from_millis(200);

/// RFC 9293 §3.7.1: the MSS to assume when the peer's SYN carries none.
const DEFAULT_PEER_MSS: u16 = 536;
/// RFC 7323 §2.3: the largest window-scale shift.
const MAX_WINDOW_SCALE: u8 = 14;

/// One connection: see the module documentation.
#[derive(Debug)]
pub struct Connection {
    local: Endpoint,
    remote: Endpoint,
    config: TcpConfig,
    state: State,
    error: Option<TcpError>,
    /// Opened by [`Connection::accept`] (an RST in SYN-RECEIVED then means
    /// the peer gave up, not that it refused us).
    passive: bool,

    // Send sequence space (RFC 9293 §3.3.1).
    iss: Seq,
    snd_una: Seq,
    /// The next number to send; moved back to SND.UNA by a timeout
    /// (go-back-N, RFC 5681 §3.1 and RFC 6298 §5.4).
    snd_nxt: Seq,
    /// The highest number sent so far plus one (ACKs beyond it acknowledge
    /// nothing we sent).
    snd_max: Seq,
    /// The peer's window in bytes (scaled).
    snd_wnd: u32,
    max_snd_wnd: u32,
    snd_wl1: Seq,
    snd_wl2: Seq,
    snd_wscale: u8,
    /// The peer's SYN carried the window-scale option.
    peer_window_scale: bool,
    /// RFC 7323 timestamps are on: every segment carries our clock and
    /// echoes [`ts_recent`](Self::ts_recent). A peer without SACK or
    /// timestamps can take no RTT sample from the ACK of a retransmission
    /// (Karn's rule), so its backed-off RTO is not reset after a
    /// loss-recovery episode; on a lossy path that backs off to minutes
    /// (docs/results.md, the lossy `ginza bench tcp` run). With them it
    /// can.
    ts_enabled: bool,
    /// TS.Recent: the peer's timestamp to echo (RFC 7323 §4.3), and PAWS's
    /// reference (§5).
    ts_recent: RecentTimestamp,
    /// The last timestamp we sent (kept monotonic for the peer's PAWS).
    ts_sent: u32,
    /// Last.ACK.sent: the acknowledgement number we sent last.
    last_ack_sent: Seq,
    /// The largest payload we send: min(our MSS, the peer's).
    send_mss: u16,
    send: SendBuffer,
    /// The application shut down sending: a FIN follows the queued bytes.
    fin_queued: bool,
    /// RFC 2018 SACK is on: both SYNs carried SACK-permitted.
    sack_enabled: bool,
    /// What the peer SACKed.
    scoreboard: Scoreboard,
    /// An RFC 6675 loss-recovery episode, while one lasts.
    sack_recovery: Option<SackRecovery>,
    /// Which blocks we report as receiver.
    sack_report: ReceiverReport,
    /// When each outstanding data segment was sent (SACK connections).
    transmit_log: TransmitLog,
    /// When to look for lost segments again.
    rack_at: Option<Instant>,
    /// The tail loss probe's timer (RFC 8985 §7), and its firing.
    probe_timeout_at: Option<Instant>,
    loss_probe_now: bool,
    /// Loss probes sent since the last ACK with news (each waits twice
    /// as long; after [`MAX_LOSS_PROBES`] the retransmission timer decides).
    loss_probes_unanswered: u32,

    // Receive sequence space.
    irs: Seq,
    rcv_nxt: Seq,
    rcv_wscale: u8,
    /// The right edge of the window we advertised last (RFC 9293 §3.8.6.2.2:
    /// never moved left).
    rcv_adv: Seq,
    recv: ReceiveBuffer,
    fin_received: bool,
    /// The application closed (not just shut down): new data gets a RST.
    app_closed: bool,

    // Timers.
    rto_at: Option<Instant>,
    persist_at: Option<Instant>,
    persist_backoff: u32,
    probes_unanswered: u32,
    ack_at: Option<Instant>,
    /// A read opened the window enough for an update that need not go at
    /// once: the next `poll_transmit` arms the delayed ACK for it.
    window_update_later: bool,
    time_wait_at: Option<Instant>,
    keepalive: KeepAliveTimer,
    keepalive_at: Option<Instant>,
    keepalive_probe_now: bool,
    /// Timeouts since the last ACK of new data.
    retries: u32,
    rtt: RttEstimator,
    cc: NewReno,

    // What poll_transmit owes.
    ack_now: bool,
    segments_unacked: u32,
    retransmit_now: bool,
    probe_now: bool,
    pending_rst: Option<Segment<'static>>,
    challenge: ChallengeLimiter,

    events: Events,
    stats: ConnectionStats,
}

/// The window-scale shift that lets `buffer` bytes be advertised.
fn window_scale_for(buffer: usize) -> u8 {
    let mut shift = 0;
    while shift < MAX_WINDOW_SCALE && (buffer >> shift) > usize::from(u16::MAX) {
        shift += 1;
    }
    shift
}

impl Connection {
    fn new(config: &TcpConfig, local: Endpoint, remote: Endpoint, iss: Seq, state: State) -> Self {
        let send_mss = config.mss.max(1);
        Connection {
            local,
            remote,
            config: config.clone(),
            state,
            error: None,
            passive: false,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: Seq(0),
            snd_wl2: iss,
            snd_wscale: 0,
            peer_window_scale: false,
            ts_enabled: false,
            ts_recent: RecentTimestamp::default(),
            ts_sent: 0,
            last_ack_sent: Seq(0),
            send_mss,
            send: SendBuffer::new(config.send_buffer, iss + 1u32),
            fin_queued: false,
            sack_enabled: false,
            scoreboard: Scoreboard::default(),
            sack_recovery: None,
            sack_report: ReceiverReport::default(),
            transmit_log: TransmitLog::default(),
            rack_at: None,
            probe_timeout_at: None,
            loss_probe_now: false,
            loss_probes_unanswered: 0,
            irs: Seq(0),
            rcv_nxt: Seq(0),
            rcv_wscale: window_scale_for(config.recv_buffer),
            rcv_adv: Seq(0),
            recv: ReceiveBuffer::new(config.reassembly_limit),
            fin_received: false,
            app_closed: false,
            rto_at: None,
            persist_at: None,
            persist_backoff: 0,
            probes_unanswered: 0,
            ack_at: None,
            window_update_later: false,
            time_wait_at: None,
            keepalive: KeepAliveTimer::default(),
            keepalive_at: None,
            keepalive_probe_now: false,
            retries: 0,
            rtt: RttEstimator::new(config.rto_initial, config.rto_min, config.rto_max),
            cc: NewReno::new(u32::from(send_mss)),
            ack_now: false,
            segments_unacked: 0,
            retransmit_now: false,
            probe_now: false,
            pending_rst: None,
            challenge: ChallengeLimiter::default(),
            events: Events::default(),
            stats: ConnectionStats::default(),
        }
    }

    /// An active open: the connection starts in SYN-SENT with a SYN to send.
    pub fn connect(
        config: &TcpConfig,
        local: Endpoint,
        remote: Endpoint,
        iss: Seq,
        now: Instant,
    ) -> Connection {
        let mut conn = Connection::new(config, local, remote, iss, State::SynSent);
        conn.keepalive.set(config.keepalive, now);
        conn.update_timers(now);
        conn
    }

    /// A passive open: `syn` (SYN set, no ACK, no RST) arrived for a
    /// listening port; the connection starts in SYN-RECEIVED with a SYN-ACK
    /// to send. Data on the SYN is not accepted (nor acknowledged): the peer
    /// sends it again once the handshake is done (docs/tcp.md, choices).
    pub fn accept(
        config: &TcpConfig,
        local: Endpoint,
        remote: Endpoint,
        syn: &Segment<'_>,
        iss: Seq,
        now: Instant,
    ) -> Connection {
        let mut conn = Connection::new(config, local, remote, iss, State::SynReceived);
        conn.keepalive.set(config.keepalive, now);
        conn.passive = true;
        conn.stats.segments_in += 1;
        conn.irs = syn.seq;
        conn.rcv_nxt = syn.seq + 1u32;
        conn.rcv_adv = conn.rcv_nxt;
        conn.take_syn_options(syn, now);
        conn.update_timers(now);
        conn
    }

    /// RFC 9293 §3.7.1 (MSS) and RFC 7323 §2.2 (window scale: used only
    /// when both SYNs carry it). The SYN's own window is never scaled.
    fn take_syn_options(&mut self, syn: &Segment<'_>, now: Instant) {
        let peer_mss = syn.mss.unwrap_or(DEFAULT_PEER_MSS).max(64);
        self.send_mss = self.config.mss.clamp(1, peer_mss);
        self.cc.set_mss(u32::from(self.send_mss));
        match syn.window_scale {
            Some(shift) => {
                self.snd_wscale = shift.min(MAX_WINDOW_SCALE);
                self.peer_window_scale = true;
            }
            None => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        self.snd_wnd = u32::from(syn.window);
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = syn.seq;
        // RFC 7323 §3.2: timestamps are on when both SYNs carry them; we
        // answer a peer's offer (a passive open) and do not offer our own.
        if let Some(ts) = syn.timestamp.filter(|_| self.passive) {
            self.ts_enabled = true;
            self.ts_recent = RecentTimestamp::new(ts.value, now);
        }
        // RFC 2018 §2: SACK when both SYNs permit it.
        self.sack_enabled = self.config.sack && syn.sack_permitted;
    }

    /// The largest payload of one segment: the MSS less the timestamps
    /// option when it is on (RFC 7323 §3.2, RFC 6691) and the SACK blocks
    /// the next segment carries (a data segment with them stays within
    /// the MTU, as Linux's do).
    fn payload_mss(&self) -> usize {
        let options = if self.ts_enabled { 12 } else { 0 };
        let sack = crate::tcp::wire::sack_option_len(&self.sack_blocks_to_send());
        usize::from(self.send_mss)
            .saturating_sub(options + sack)
            .max(1)
    }

    /// The SACK blocks our next segment carries: none unless SACK is on
    /// and out-of-order data is held.
    fn sack_blocks_to_send(&self) -> crate::tcp::SackBlocks {
        if !self.sack_enabled || self.recv.held() == 0 {
            return crate::tcp::SackBlocks::NONE;
        }
        self.sack_report.blocks(&self.recv.held_ranges())
    }

    /// RFC 8985 §7.2's PTO: two smoothed round trips (at least 1 ms, so a
    /// peer's ACK scheduling is not taken for a loss), plus the peer's
    /// worst-case delayed ACK when a single segment is in flight (an RPC's
    /// reply, whose ACK the peer may hold until its next request), no
    /// later than the retransmission timer would fire. Unlike RFC 8985 it
    /// runs in recovery too: there a lost ACK of the last segments sent
    /// leaves nothing to clock the sender but the 200 ms timer.
    fn probe_timeout(&self, now: Instant) -> Instant {
        let srtt = self.rtt.srtt().unwrap_or(self.rtt.rto());
        let mut pto =
            (srtt * 2).max(Duration::from_millis(1)) * (1 << self.loss_probes_unanswered.min(8));
        let flight = self.snd_max.distance_from(self.snd_una) as usize;
        if flight <= self.full_payload_mss() {
            pto += PEER_DELAYED_ACK_MAX;
        }
        let at = now + pto;
        self.rto_at.map_or(at, |rto| at.min(rto))
    }

    /// The segment-sized payload without SACK blocks (congestion control
    /// counts in these).
    fn full_payload_mss(&self) -> usize {
        let options = if self.ts_enabled { 12 } else { 0 };
        usize::from(self.send_mss).saturating_sub(options).max(1)
    }

    pub fn local(&self) -> Endpoint {
        self.local
    }

    pub fn remote(&self) -> Endpoint {
        self.remote
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The error that ended the connection, if one did.
    pub fn error(&self) -> Option<TcpError> {
        self.error
    }

    /// Fires whatever timers are due at `now` (retransmission, persist,
    /// delayed ACK, TIME-WAIT).
    pub fn on_timer(&mut self, now: Instant) {
        if self.time_wait_at.is_some_and(|at| at <= now) {
            // RFC 9293 §3.10.8: the 2 MSL wait is over (or an orphaned
            // FIN-WAIT-2 waited as long for the peer's FIN).
            self.time_wait_at = None;
            self.enter_closed();
        }
        if self.rto_at.is_some_and(|at| at <= now) {
            self.on_retransmission_timeout();
        }
        if self.rack_at.is_some_and(|at| at <= now) {
            self.rack_at = None;
            if self.sack_enabled && self.is_synchronized() {
                self.sack_recovery_step(now);
            }
        }
        if self.probe_timeout_at.is_some_and(|at| at <= now) {
            self.probe_timeout_at = None;
            if self.snd_max != self.snd_una {
                self.loss_probe_now = true;
            }
        }
        if self.keepalive_at.is_some_and(|at| at <= now) {
            self.keepalive_at = None;
            self.on_keepalive_due(now);
        }
        if self.persist_at.is_some_and(|at| at <= now) {
            self.persist_at = None;
            self.probes_unanswered += 1;
            if self.probes_unanswered > self.config.max_retransmissions {
                // The peer stopped answering probes altogether.
                self.fail(TcpError::TimedOut);
            } else {
                self.probe_now = true;
                self.persist_backoff = self.persist_backoff.saturating_add(1);
            }
        }
        if self.ack_at.is_some_and(|at| at <= now) {
            self.ack_at = None;
            self.ack_now = true;
        }
        self.update_timers(now);
    }

    /// The keep-alive timer fired: probe, or give up after `count`
    /// unanswered probes (Linux then sends a RST and reports ETIMEDOUT).
    fn on_keepalive_due(&mut self, now: Instant) {
        let busy = self.snd_max != self.snd_una || self.send.available_from(self.snd_nxt) > 0;
        match self.keepalive.on_due(now, busy) {
            KeepAliveAction::None => {}
            KeepAliveAction::Probe => self.keepalive_probe_now = true,
            KeepAliveAction::GiveUp => {
                let mut rst = Segment::new(self.unoccupied_seq());
                rst.flags.rst = true;
                self.pending_rst = Some(rst);
                self.fail(TcpError::TimedOut);
            }
        }
    }

    /// Turns keep-alive on (or off with `None`); the idle time counts from
    /// `now` or the last segment heard, whichever is later.
    pub fn set_keepalive(&mut self, keepalive: Option<KeepAlive>, now: Instant) {
        self.config.keepalive = keepalive;
        self.keepalive.set(keepalive, now);
        self.keepalive_at = None;
        self.update_timers(now);
    }

    /// The keep-alive settings in force.
    pub fn keepalive(&self) -> Option<KeepAlive> {
        self.keepalive.settings()
    }

    /// RFC 6298 §5.4–5.6: retransmit the earliest unacknowledged segment
    /// with a doubled RTO; RFC 5681 §3.1: ssthresh to half the flight,
    /// cwnd to one segment. Gives up after the configured count.
    fn on_retransmission_timeout(&mut self) {
        self.rto_at = None;
        self.retries += 1;
        self.stats.timeouts += 1;
        let limit = match self.state {
            State::SynSent | State::SynReceived => self.config.max_syn_retransmissions,
            _ => self.config.max_retransmissions,
        };
        if self.retries > limit {
            self.fail(TcpError::TimedOut);
            return;
        }
        self.rtt.back_off();
        if self.is_synchronized() {
            let flight = self.snd_max.distance_from(self.snd_una);
            self.cc.on_timeout(self.snd_max, flight);
        }
        // RFC 6675 §5.1: the episode ends; the scoreboard stays, so the
        // go-back-N below skips what the peer SACKed (a peer that reneged
        // shows it by its cumulative ACK, and the scoreboard lets go).
        self.sack_recovery = None;
        self.transmit_log.clear();
        self.rack_at = None;
        self.probe_timeout_at = None;
        // Go back N: everything after SND.UNA is sent again as the windows
        // allow (SYN-SENT and SYN-RECEIVED resend their SYN this way).
        self.snd_nxt = self.snd_una;
        self.retransmit_now = false;
    }

    /// When [`on_timer`](Self::on_timer) must next be called; `None`: no
    /// timer is armed.
    pub fn next_deadline(&self) -> Option<Instant> {
        [
            self.rto_at,
            self.persist_at,
            self.ack_at,
            self.time_wait_at,
            self.keepalive_at,
            self.rack_at,
            self.probe_timeout_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Re-derives the timers after anything changed (RFC 6298 §5.1–5.3 for
    /// the RTO; RFC 9293 §3.8.6.1 for the persist timer).
    fn update_timers(&mut self, now: Instant) {
        if self.state == State::Closed {
            self.rto_at = None;
            self.persist_at = None;
            self.ack_at = None;
            self.time_wait_at = None;
            self.keepalive_at = None;
            self.rack_at = None;
            self.probe_timeout_at = None;
            return;
        }
        // Keep-alive watches an established connection (or one the peer
        // half-closed) while the application holds it.
        self.keepalive_at = match self.state {
            State::Established | State::CloseWait => self.keepalive.deadline(),
            _ => None,
        };
        // Nothing in flight: no retransmission timer (§5.2). It is armed
        // when a segment goes out (output) and restarted by new ACKs (input).
        if self.snd_nxt == self.snd_una {
            self.rto_at = None;
        }
        if self.snd_max == self.snd_una {
            self.probe_timeout_at = None;
        }
        // FIN-WAIT-2 after close(): nobody reads, and a peer that never
        // sends its FIN must not hold the connection forever; it gets as
        // long as TIME-WAIT would (Linux's tcp_fin_timeout, RFC 9293 leaves
        // this to the implementation).
        if self.state == State::FinWait2 && self.app_closed && self.time_wait_at.is_none() {
            self.time_wait_at = Some(now + self.config.time_wait);
        }
        let persist = self.can_send_data()
            && self.snd_wnd == 0
            && self.snd_nxt == self.snd_una
            && self.send.available_from(self.snd_nxt) > 0
            && !self.probe_now;
        if !persist {
            self.persist_at = None;
        } else if self.persist_at.is_none() {
            let backoff = 1u32 << self.persist_backoff.min(16);
            let interval = self
                .rtt
                .rto()
                .saturating_mul(backoff)
                .min(self.config.rto_max);
            self.persist_at = Some(now + interval);
        }
    }

    /// Wake-ups since the last call.
    pub fn take_events(&mut self) -> Events {
        std::mem::take(&mut self.events)
    }

    /// Copies received bytes into `buf`. `Ok(0)`: the peer sent FIN and
    /// everything before it was read. `Err(WouldBlock)`: nothing yet.
    /// Reading may open the window enough for an update: call
    /// [`poll_transmit`](Self::poll_transmit) afterwards.
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, TcpError> {
        if self.recv.ready() > 0 {
            if buf.is_empty() {
                return Ok(0);
            }
            let n = self.recv.read(buf);
            // RFC 9293 §3.8.6.2.2 (receiver SWS avoidance): announce the
            // opened window once it grew by min(half the buffer, one MSS).
            let grown = self
                .advertisable_window()
                .saturating_sub(self.advertised_window());
            if self.is_synchronized() && grown >= self.window_update_threshold() {
                // While what we advertised is still at least half of what
                // we could, the peer is not held back: the update waits as
                // a delayed ACK, so that the answer the application writes
                // next carries it (an RPC's reply) rather than a lone ACK
                // going out before it. A window under half goes at once.
                let roomy = self.advertised_window() >= self.advertisable_window() / 2;
                if roomy && self.config.delayed_ack.is_some() {
                    self.window_update_later = true;
                } else {
                    self.ack_now = true;
                }
            }
            return Ok(n);
        }
        if self.fin_received {
            return Ok(0);
        }
        if let Some(error) = self.error {
            return Err(error);
        }
        match self.state {
            State::SynSent | State::SynReceived => Err(TcpError::NotConnected),
            State::Closed => Ok(0),
            _ => Err(TcpError::WouldBlock),
        }
    }

    /// [`recv`](Self::recv) without consuming: the same answers, and the
    /// bytes stay for the next read (`MSG_PEEK`).
    pub fn peek(&self, buf: &mut [u8]) -> Result<usize, TcpError> {
        if self.recv.ready() > 0 {
            return Ok(self.recv.peek(buf));
        }
        if self.fin_received {
            return Ok(0);
        }
        if let Some(error) = self.error {
            return Err(error);
        }
        match self.state {
            State::SynSent | State::SynReceived => Err(TcpError::NotConnected),
            State::Closed => Ok(0),
            _ => Err(TcpError::WouldBlock),
        }
    }

    /// The peer's FIN arrived (in order): reads end after the bytes before
    /// it.
    pub fn fin_received(&self) -> bool {
        self.fin_received
    }

    /// Our FIN is queued or sent (shutdown or close): no more sending.
    pub fn send_shut(&self) -> bool {
        self.fin_queued
    }

    /// Queues bytes for sending; `Ok(n)` with `n > 0`, or `Err(WouldBlock)`
    /// when the send buffer is full. `Ok(0)` only for empty `data`.
    pub fn send(&mut self, data: &[u8]) -> Result<usize, TcpError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        match self.state {
            State::SynSent | State::SynReceived if !self.fin_queued => {
                return Err(TcpError::NotConnected)
            }
            State::Established | State::CloseWait if !self.fin_queued => {}
            _ => return Err(TcpError::Closed),
        }
        if data.is_empty() {
            return Ok(0);
        }
        match self.send.push(data) {
            0 => Err(TcpError::WouldBlock),
            n => Ok(n),
        }
    }

    /// Bytes ready for [`recv`](Self::recv).
    pub fn recv_available(&self) -> usize {
        self.recv.ready()
    }

    /// Room left in the send buffer.
    pub fn send_capacity(&self) -> usize {
        if self.fin_queued {
            0
        } else {
            self.send.room()
        }
    }

    /// Sends FIN after the queued data (half-close; reading goes on).
    pub fn shutdown(&mut self) {
        // RFC 9293 §3.10.4 (CLOSE call), per state.
        match self.state {
            State::SynSent => self.enter_closed(),
            State::SynReceived => self.fin_queued = true,
            State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// The application is done with the connection: FIN after queued data,
    /// or RST if received data was left unread (RFC 9293 §3.10.4; RFC 1122
    /// §4.2.2.13). Data arriving afterwards is answered with a RST too.
    pub fn close(&mut self) {
        self.app_closed = true;
        if self.recv.ready() > 0 {
            self.abort();
        } else {
            self.shutdown();
        }
    }

    /// Gives up as the retransmission timer does after its last try
    /// (`TcpError::TimedOut`), for a peer the driver cannot reach at all
    /// (no ARP answer before the SYN could go).
    pub fn time_out(&mut self) {
        self.fail(TcpError::TimedOut);
    }

    /// Sends RST and goes to CLOSED at once.
    pub fn abort(&mut self) {
        // RFC 9293 §3.10.5: a RST from SYN-RECEIVED, ESTABLISHED, FIN-WAIT-1/2
        // and CLOSE-WAIT; the other states just delete the TCB.
        if matches!(
            self.state,
            State::SynReceived
                | State::Established
                | State::FinWait1
                | State::FinWait2
                | State::CloseWait
        ) {
            let mut rst = Segment::new(self.unoccupied_seq());
            rst.flags.rst = true;
            self.pending_rst = Some(rst);
        }
        self.recv.clear();
        self.enter_closed();
    }

    pub fn set_nodelay(&mut self, nodelay: bool) {
        self.config.nodelay = nodelay;
    }

    pub fn nodelay(&self) -> bool {
        self.config.nodelay
    }

    /// The sending side was shut down and the peer has not acknowledged
    /// the FIN yet (or a RST waits to go): a driver that is about to stop
    /// keeps running this connection's timers until it has, so the peer
    /// gets the end of the stream (docs/runtime.md, "Lingering at exit").
    pub fn owes_peer_its_end(&self) -> bool {
        self.pending_rst.is_some()
            || matches!(
                self.state,
                State::FinWait1 | State::Closing | State::LastAck
            )
            || (self.state == State::SynReceived && self.fin_queued)
    }

    /// CLOSED with nothing left to transmit: the driver may forget it.
    pub fn is_finished(&self) -> bool {
        self.state == State::Closed && self.pending_rst.is_none()
    }

    pub fn stats(&self) -> ConnectionStats {
        self.stats
    }

    /// The congestion window in bytes (tests and diagnostics).
    pub fn congestion_window(&self) -> u32 {
        self.cc.window()
    }

    /// The slow-start threshold in bytes (`u32::MAX` until the first loss).
    pub fn slow_start_threshold(&self) -> u32 {
        self.cc.ssthresh()
    }

    /// In NewReno fast recovery or RFC 6675 SACK loss recovery (tests and
    /// diagnostics).
    pub fn in_fast_recovery(&self) -> bool {
        self.cc.in_recovery() || self.sack_recovery.is_some()
    }

    /// Both ends agreed on SACK (RFC 2018).
    pub fn sack_enabled(&self) -> bool {
        self.sack_enabled
    }

    /// RFC 7323 timestamps are on.
    pub fn timestamps_enabled(&self) -> bool {
        self.ts_enabled
    }

    /// The sender's SACK scoreboard: the ranges the peer SACKed beyond
    /// SND.UNA (tests and diagnostics).
    pub fn sacked_ranges(&self) -> Vec<(Seq, Seq)> {
        self.scoreboard.ranges().to_vec()
    }

    /// The current retransmission timeout (tests and diagnostics).
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// The smoothed round-trip time, once sampled.
    pub fn smoothed_rtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// The peer's window in bytes (scaled), as last advertised.
    pub fn peer_window(&self) -> u32 {
        self.snd_wnd
    }

    /// The largest payload this connection sends (min of both MSS options).
    pub fn send_mss(&self) -> u16 {
        self.send_mss
    }

    /// Out-of-order bytes held for reassembly.
    pub fn reassembly_held(&self) -> usize {
        self.recv.held()
    }

    /// Whether the answer to `segment` (its ACK, the reader's wake-up) may
    /// wait until the driver has taken the rest of the burst it came in:
    /// in-order data on an established connection with nothing held out of
    /// order. Answering a burst once is what GRO gives Linux's receivers;
    /// RFC 5681 §4.2 lets an ACK cover several segments, and a segment out
    /// of order, one filling a gap, a FIN or anything else that must be
    /// answered at once is never deferred. Call it before `on_segment`.
    pub fn may_answer_after_burst(&self, segment: &Segment<'_>) -> bool {
        self.config.answer_after_burst
            && self.state == State::Established
            && !segment.payload.is_empty()
            && !(segment.flags.syn || segment.flags.fin || segment.flags.rst)
            && segment.seq == self.rcv_nxt
            && self.recv.held() == 0
    }

    /// SND.UNA, SND.NXT and RCV.NXT (tests and diagnostics).
    pub fn sequence_state(&self) -> (Seq, Seq, Seq) {
        (self.snd_una, self.snd_nxt, self.rcv_nxt)
    }

    /// Our initial sequence number and the peer's (zero until known).
    pub fn initial_sequence_numbers(&self) -> (Seq, Seq) {
        (self.iss, self.irs)
    }

    /// Bytes queued but not acknowledged yet.
    pub fn send_queued(&self) -> usize {
        self.send.len()
    }

    /// Past the handshake (RFC 9293 §3.3.2's synchronized states).
    fn is_synchronized(&self) -> bool {
        !matches!(
            self.state,
            State::SynSent | State::SynReceived | State::Closed
        )
    }

    /// States where our data (new or retransmitted) may go out.
    fn can_send_data(&self) -> bool {
        matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::Closing
                | State::LastAck
        )
    }

    /// The sequence number of a segment that occupies none (a lone ACK, a
    /// RST): SND.MAX, but never beyond the right edge of the peer's window
    /// (SND.WL2 + SND.WND). A zero-window probe takes SND.MAX one byte past
    /// that edge, and a receiver whose window is zero accepts only
    /// SEG.SEQ = RCV.NXT (RFC 9293 §3.10.7.4): numbered at SND.MAX, our
    /// ACKs and the window updates they carry would be dropped until the
    /// peer's window opens, which with both windows closed is never
    /// (docs/tcp.md, "Zero windows both ways").
    fn unoccupied_seq(&self) -> Seq {
        if !self.is_synchronized() {
            return self.snd_max;
        }
        let edge = (self.snd_wl2 + self.snd_wnd).max(self.snd_una);
        self.snd_max.min(edge)
    }

    /// The sequence number of our FIN, once the application shut down.
    fn fin_seq(&self) -> Option<Seq> {
        self.fin_queued.then(|| self.send.end())
    }

    /// Whether the peer acknowledged our FIN.
    fn fin_acked(&self) -> bool {
        self.fin_seq().is_some_and(|fin| self.snd_una.gt(fin))
    }

    /// The window we could advertise now: free receive buffer, rounded down
    /// to what the scale can express, capped by the field's reach.
    fn advertisable_window(&self) -> u32 {
        let free = self.config.recv_buffer.saturating_sub(self.recv.ready());
        let cap = usize::from(u16::MAX) << self.rcv_wscale;
        let free = free.min(cap);
        ((free >> self.rcv_wscale) << self.rcv_wscale) as u32
    }

    /// What the peer may send beyond RCV.NXT as we last told it.
    fn advertised_window(&self) -> u32 {
        if self.rcv_adv.gt(self.rcv_nxt) {
            self.rcv_adv.distance_from(self.rcv_nxt)
        } else {
            0
        }
    }

    /// Receiver silly-window avoidance (RFC 9293 §3.8.6.2.2): the right
    /// edge moves only by min(half the buffer, one MSS) at a time, so a
    /// reader taking a few bytes does not invite a few-byte segment.
    fn window_to_advertise(&self) -> u32 {
        let advertised = self.advertised_window();
        let possible = self.advertisable_window();
        if possible.saturating_sub(advertised) >= self.window_update_threshold() {
            possible
        } else {
            advertised
        }
    }

    fn window_update_threshold(&self) -> u32 {
        let threshold = (self.config.recv_buffer / 2).min(usize::from(self.config.mss));
        threshold.max(1) as u32
    }

    /// RCV.WND: the larger of what we advertised and what we could (both
    /// fit the buffer; the edge never moves left, RFC 9293 §3.8.6.2.2).
    fn receive_window(&self) -> u32 {
        self.advertised_window().max(self.advertisable_window())
    }

    fn enter_closed(&mut self) {
        if self.state != State::Closed {
            self.state = State::Closed;
            self.events.closed = true;
            self.events.readable = true;
            self.events.writable = true;
        }
        self.update_timers(Instant(0));
    }

    /// Ends the connection with an error the application will see.
    fn fail(&mut self, error: TcpError) {
        if matches!(self.state, State::SynSent | State::SynReceived) {
            self.events.connected = true;
        }
        self.error = Some(error);
        self.enter_closed();
    }
}

/// The reply RFC 9293 §3.10.7.1 prescribes for a segment that reached no
/// connection (a closed port): a RST, unless the segment is itself a RST.
pub fn reset_for(segment: &Segment<'_>) -> Option<Segment<'static>> {
    if segment.flags.rst {
        return None;
    }
    let mut rst = match segment.ack {
        // <SEQ=SEG.ACK><CTL=RST>
        Some(ack) => Segment::new(ack),
        // <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>
        None => {
            let mut rst = Segment::new(Seq(0));
            rst.ack = Some(segment.seq + segment.seq_len());
            rst
        }
    };
    rst.flags = Flags {
        rst: true,
        ..Flags::default()
    };
    Some(rst)
}
