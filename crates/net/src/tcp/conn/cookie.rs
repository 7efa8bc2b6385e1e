//! The passive open without state, for SYN cookies (`tcp/syncookie.rs`):
//! the SYN-ACK a listener sends and forgets, and the connection made when
//! the peer's ACK brings the cookie back.
//!
//! A cookie carries the peer's MSS and nothing else, so the SYN-ACK offers
//! no option it could not honour later: no window scale, no SACK-permitted,
//! no timestamps (docs/tcp.md, "SYN cookies").

use super::{Connection, TcpConfig};
use crate::tcp::{Instant, Segment, Seq};
use crate::Endpoint;

/// The window of a stateless SYN-ACK: unscaled, so at most 64 KiB.
fn stateless_window(config: &TcpConfig) -> u16 {
    config.recv_buffer.min(usize::from(u16::MAX)) as u16
}

impl Connection {
    /// The SYN-ACK answering `syn` with the initial sequence number `iss`
    /// (a SYN cookie), made without a connection: our MSS and an unscaled
    /// window, no other option.
    pub fn stateless_syn_ack(config: &TcpConfig, syn: &Segment<'_>, iss: Seq) -> Segment<'static> {
        let mut syn_ack = Segment::new(iss);
        syn_ack.ack = Some(syn.seq + 1u32);
        syn_ack.flags.syn = true;
        syn_ack.window = stateless_window(config);
        syn_ack.mss = Some(config.mss);
        syn_ack
    }

    /// The connection whose SYN was answered by
    /// [`stateless_syn_ack`](Connection::stateless_syn_ack) with `iss`,
    /// now that `ack` (SEG.ACK = `iss` + 1, no SYN, no RST) completes the
    /// handshake; `peer_mss` is what the cookie carried. `ack` is processed
    /// as in SYN-RECEIVED: the connection is ESTABLISHED and whatever data
    /// or FIN `ack` carries is taken.
    pub fn accept_cookie(
        config: &TcpConfig,
        local: Endpoint,
        remote: Endpoint,
        ack: &Segment<'_>,
        iss: Seq,
        peer_mss: u16,
        now: Instant,
    ) -> Connection {
        // The SYN as the cookie remembers it: its sequence number and MSS;
        // no window scale, SACK or timestamps (our SYN-ACK offered none).
        let mut syn = Segment::new(ack.seq - 1u32);
        syn.flags.syn = true;
        syn.window = ack.window;
        syn.mss = Some(peer_mss);
        let mut conn = Connection::accept(config, local, remote, &syn, iss, now);
        // Our SYN-ACK went out: SYN-RECEIVED with it unacknowledged, no RTT
        // sample (when it was sent is not known) and no timer for it.
        conn.snd_nxt = iss + 1u32;
        conn.snd_max = conn.snd_nxt;
        conn.rcv_adv = conn.rcv_nxt + u32::from(stateless_window(config));
        conn.stats.segments_out += 1;
        conn.on_segment(ack, now);
        conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::{State, TcpError};
    use std::net::Ipv4Addr;

    const LOCAL: Endpoint = Endpoint::new(Ipv4Addr::new(10, 0, 0, 1), 80);
    const REMOTE: Endpoint = Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), 40000);

    fn syn_with_every_option() -> Segment<'static> {
        let mut syn = Segment::new(Seq(5000));
        syn.flags.syn = true;
        syn.window = 64240;
        syn.mss = Some(1460);
        syn.window_scale = Some(7);
        syn.sack_permitted = true;
        syn.timestamp = Some(crate::tcp::Timestamp { value: 77, echo: 0 });
        syn
    }

    #[test]
    fn the_stateless_syn_ack_offers_only_the_mss() {
        let config = TcpConfig::default();
        let s = Connection::stateless_syn_ack(&config, &syn_with_every_option(), Seq(9000));
        assert_eq!((s.seq, s.ack), (Seq(9000), Some(Seq(5001))));
        assert!(s.flags.syn && !s.flags.rst && !s.flags.fin);
        assert_eq!(s.window, u16::MAX, "256 KiB unscaled: 64 KiB");
        assert_eq!(s.mss, Some(1460));
        assert_eq!(s.window_scale, None);
        assert!(!s.sack_permitted);
        assert_eq!(s.timestamp, None);
    }

    #[test]
    fn the_returning_ack_makes_an_established_connection_with_its_data() {
        let config = TcpConfig::default();
        let iss = Seq(9000);
        let mut ack = Segment::new(Seq(5001));
        ack.ack = Some(iss + 1u32);
        ack.window = 502;
        ack.payload = b"GET / HTTP/1.0\r\n\r\n";
        let now = Instant(1_000_000);
        let mut conn = Connection::accept_cookie(&config, LOCAL, REMOTE, &ack, iss, 1300, now);
        assert_eq!(conn.state(), State::Established);
        assert_eq!((conn.local(), conn.remote()), (LOCAL, REMOTE));
        assert_eq!(conn.send_mss(), 1300, "the MSS the cookie carried");
        assert!(!conn.sack_enabled() && !conn.timestamps_enabled());
        assert_eq!(conn.peer_window(), 502, "unscaled");
        let events = conn.take_events();
        assert!(events.connected && events.readable);
        let mut buf = [0u8; 64];
        let n = conn.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.0\r\n\r\n");
        assert_eq!(conn.recv(&mut buf), Err(TcpError::WouldBlock));
        // The data is acknowledged (now, or at the delayed-ACK deadline);
        // nothing else goes out: no SYN-ACK again.
        conn.on_timer(now + std::time::Duration::from_millis(1));
        let out = conn.poll_transmit(now + std::time::Duration::from_millis(1));
        let out = out.expect("the ACK of the data");
        assert!(!out.flags.syn);
        assert_eq!((out.seq, out.ack), (iss + 1u32, Some(Seq(5001 + 18))));
        assert_eq!(out.window_scale, None);
        // The application's reply goes out as on any connection.
        assert_eq!(conn.send(b"HTTP/1.0 200 OK\r\n\r\n"), Ok(19));
        let reply = conn.poll_transmit(now).expect("the reply");
        assert_eq!(reply.payload, b"HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!(reply.seq, iss + 1u32);
        assert!(conn.next_deadline().is_some(), "its retransmission timer");
    }
}
