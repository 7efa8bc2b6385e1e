//! One TCP connection (the transmission control block) as a sans-IO state
//! machine.

use super::{Instant, Segment, Seq};
use crate::Endpoint;
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
}

/// One connection: see the module documentation.
#[derive(Debug)]
pub struct Connection {
    local: Endpoint,
    remote: Endpoint,
}

impl Connection {
    /// An active open: the connection starts in SYN-SENT with a SYN to send.
    pub fn connect(
        config: &TcpConfig,
        local: Endpoint,
        remote: Endpoint,
        iss: Seq,
        now: Instant,
    ) -> Connection {
        let _ = (config, iss, now);
        Connection { local, remote }
    }

    /// A passive open: `syn` (SYN set, no ACK, no RST) arrived for a
    /// listening port; the connection starts in SYN-RECEIVED with a SYN-ACK
    /// to send.
    pub fn accept(
        config: &TcpConfig,
        local: Endpoint,
        remote: Endpoint,
        syn: &Segment<'_>,
        iss: Seq,
        now: Instant,
    ) -> Connection {
        let _ = (config, syn, iss, now);
        Connection { local, remote }
    }

    pub fn local(&self) -> Endpoint {
        self.local
    }

    pub fn remote(&self) -> Endpoint {
        self.remote
    }

    pub fn state(&self) -> State {
        todo!()
    }

    /// The error that ended the connection, if one did.
    pub fn error(&self) -> Option<TcpError> {
        todo!()
    }

    /// Processes one received segment (RFC 9293 §3.10.7).
    pub fn on_segment(&mut self, segment: &Segment<'_>, now: Instant) {
        let _ = (segment, now);
        todo!()
    }

    /// Fires whatever timers are due at `now` (retransmission, persist,
    /// delayed ACK, TIME-WAIT).
    pub fn on_timer(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// When [`on_timer`](Self::on_timer) must next be called; `None`: no
    /// timer is armed.
    pub fn next_deadline(&self) -> Option<Instant> {
        todo!()
    }

    /// The next segment to send now, if any; call until `None`. The payload
    /// borrows the send buffer.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Segment<'_>> {
        let _ = now;
        todo!()
    }

    /// Wake-ups since the last call.
    pub fn take_events(&mut self) -> Events {
        todo!()
    }

    /// Copies received bytes into `buf`. `Ok(0)`: the peer sent FIN and
    /// everything before it was read. `Err(WouldBlock)`: nothing yet.
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, TcpError> {
        let _ = buf;
        todo!()
    }

    /// Queues bytes for sending; `Ok(n)` with `n > 0`, or `Err(WouldBlock)`
    /// when the send buffer is full.
    pub fn send(&mut self, data: &[u8]) -> Result<usize, TcpError> {
        let _ = data;
        todo!()
    }

    /// Bytes ready for [`recv`](Self::recv).
    pub fn recv_available(&self) -> usize {
        todo!()
    }

    /// Room left in the send buffer.
    pub fn send_capacity(&self) -> usize {
        todo!()
    }

    /// Sends FIN after the queued data (half-close; reading goes on).
    pub fn shutdown(&mut self) {
        todo!()
    }

    /// The application is done with the connection: FIN after queued data,
    /// or RST if received data was left unread (RFC 9293 §3.10.4).
    pub fn close(&mut self) {
        todo!()
    }

    /// Sends RST and goes to CLOSED at once.
    pub fn abort(&mut self) {
        todo!()
    }

    pub fn set_nodelay(&mut self, nodelay: bool) {
        let _ = nodelay;
        todo!()
    }

    pub fn nodelay(&self) -> bool {
        todo!()
    }

    /// CLOSED with nothing left to transmit: the driver may forget it.
    pub fn is_finished(&self) -> bool {
        todo!()
    }

    pub fn stats(&self) -> ConnectionStats {
        todo!()
    }
}

/// The reply RFC 9293 §3.10.7.1 prescribes for a segment that reached no
/// connection (a closed port): a RST, unless the segment is itself a RST.
pub fn reset_for(segment: &Segment<'_>) -> Option<Segment<'static>> {
    let _ = segment;
    todo!()
}
