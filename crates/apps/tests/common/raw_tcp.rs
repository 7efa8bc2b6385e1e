//! A TCP peer made of raw frames: a [`RawApp`] on iokerneld's software
//! switch that writes every segment itself, so that tests can send what no
//! well-behaved stack sends (bad checksums, bad data offsets, SYNs with
//! data, segments far outside the window, floods of SYNs) on the 4-tuple of
//! a connection it established by hand.

use std::path::Path;
use std::time::{Duration, Instant};

use ginza_iokernel::raw_app::RawApp;
use ginza_net::tcp::{Flags, Segment, Seq};
use ginza_net::{tx, Endpoint, Interface, MacAddr, Packet};

/// A segment received, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: Option<u32>,
    pub flags: Flags,
    pub window: u16,
    pub payload: Vec<u8>,
}

pub struct RawTcpPeer {
    pub app: RawApp,
    /// The Ginza server's MAC and address.
    pub server_mac: MacAddr,
    pub server: Endpoint,
    /// Its SYNs offer SACK (as Linux's do), which lets the server send
    /// loss probes (RFC 8985). Off unless a test sets it.
    pub offer_sack: bool,
}

/// One connection the peer established by hand.
#[derive(Debug, Clone, Copy)]
pub struct RawConn {
    pub port: u16,
    /// Our next sequence number.
    pub snd_nxt: u32,
    /// The next sequence number we expect from the server.
    pub rcv_nxt: u32,
}

/// How long the server may take to answer before the test fails: a
/// deadline only a broken server reaches, even on a loaded 2-CPU machine.
pub const WAIT: Duration = Duration::from_secs(30);
/// How long a segment goes unanswered before it is sent again.
pub const RESEND: Duration = Duration::from_millis(200);

impl RawTcpPeer {
    pub fn register(
        socket: &Path,
        name: &str,
        interface: Interface,
        server_mac: MacAddr,
        server: Endpoint,
    ) -> RawTcpPeer {
        let app = RawApp::register(socket, name, interface, 1).expect("registering the raw peer");
        app.stay_busy(0);
        RawTcpPeer {
            app,
            server_mac,
            server,
            offer_sack: false,
        }
    }

    /// The frame of `segment` from our `src_port` to the server.
    pub fn frame(&self, src_port: u16, segment: &Segment<'_>) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        let len = tx::tcp_segment(
            &mut buf,
            &self.app.interface,
            self.server_mac,
            src_port,
            self.server,
            segment,
        )
        .expect("a segment that fits a frame");
        buf.truncate(len);
        buf
    }

    /// Queues `frame`, waiting while the egress ring is full.
    pub fn send_frame(&mut self, frame: &[u8]) {
        let t0 = Instant::now();
        while !self.app.send_frame(0, frame) {
            assert!(t0.elapsed() < WAIT, "the raw peer's egress ring stays full");
            std::hint::spin_loop();
        }
    }

    pub fn send(&mut self, src_port: u16, segment: &Segment<'_>) {
        let frame = self.frame(src_port, segment);
        self.send_frame(&frame);
    }

    /// The next TCP segment for us, if one comes before `deadline`; other
    /// frames are given back unread.
    pub fn recv_until(&mut self, deadline: Instant) -> Option<Received> {
        loop {
            if let Some((bytes, desc)) = self.app.recv(0) {
                self.app.give_back(0, desc.buf);
                if let Ok(Packet::Tcp(t)) = ginza_net::parse(&bytes, &self.app.interface) {
                    return Some(Received {
                        src_port: t.src.port,
                        dst_port: t.dst.port,
                        seq: t.segment.seq.0,
                        ack: t.segment.ack.map(|a| a.0),
                        flags: t.segment.flags,
                        window: t.segment.window,
                        payload: t.segment.payload.to_vec(),
                    });
                }
                continue;
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::hint::spin_loop();
        }
    }

    /// Segments for `port` only (others, e.g. SYN-ACKs to a flood, are
    /// skipped).
    pub fn recv_for(&mut self, port: u16, deadline: Instant) -> Option<Received> {
        loop {
            let r = self.recv_until(deadline)?;
            if r.dst_port == port {
                return Some(r);
            }
        }
    }

    /// Gives back every frame waiting; returns how many.
    pub fn drain(&mut self) -> usize {
        self.app.drop_received(0, usize::MAX)
    }

    /// A SYN from `port` with sequence number `iss`.
    pub fn syn(&mut self, port: u16, iss: u32, payload: &[u8]) {
        self.send(
            port,
            &Segment {
                flags: Flags {
                    syn: true,
                    ..Flags::default()
                },
                window: 65535,
                mss: Some(1460),
                sack_permitted: self.offer_sack,
                payload,
                ..Segment::new(Seq(iss))
            },
        );
    }

    /// The three-way handshake from `port` to the server. Like a TCP
    /// client, it sends the SYN again while no SYN-ACK comes (every
    /// [`RESEND`]), also after a reset: a server registered with iokerneld
    /// may not be listening yet.
    pub fn connect(&mut self, port: u16, iss: u32) -> RawConn {
        let deadline = Instant::now() + WAIT;
        let mut last = None;
        let synack = 'handshake: loop {
            assert!(
                Instant::now() < deadline,
                "no SYN-ACK from the server within {WAIT:?}; the last answer: {last:?}"
            );
            self.syn(port, iss, &[]);
            let resend = (Instant::now() + RESEND).min(deadline);
            while let Some(r) = self.recv_for(port, resend) {
                if r.flags.syn && !r.flags.rst {
                    break 'handshake r;
                }
                last = Some(r);
            }
        };
        assert!(
            synack.flags.syn && synack.ack == Some(iss.wrapping_add(1)),
            "{synack:?}"
        );
        let conn = RawConn {
            port,
            snd_nxt: iss.wrapping_add(1),
            rcv_nxt: synack.seq.wrapping_add(1),
        };
        self.ack(&conn);
        conn
    }

    /// A bare ACK of everything received on `conn`.
    pub fn ack(&mut self, conn: &RawConn) {
        self.data(conn, &[]);
    }

    /// Closes `conn` from our side (FIN), waits for the server's FIN and
    /// acknowledges it.
    pub fn fin(&mut self, conn: &mut RawConn) {
        let mut fin = conn.segment(conn.snd_nxt, &[]);
        fin.flags.fin = true;
        self.send(conn.port, &fin);
        conn.snd_nxt = conn.snd_nxt.wrapping_add(1);
        let deadline = Instant::now() + WAIT;
        loop {
            let r = self
                .recv_for(conn.port, deadline)
                .expect("the server's FIN");
            if r.flags.fin {
                conn.rcv_nxt = r.seq.wrapping_add(r.payload.len() as u32 + 1);
                self.ack(conn);
                return;
            }
        }
    }

    /// A segment carrying `payload` at `snd_nxt`, acknowledging `rcv_nxt`.
    pub fn data(&mut self, conn: &RawConn, payload: &[u8]) {
        self.send(conn.port, &conn.segment(conn.snd_nxt, payload));
    }

    /// Sends `payload` on `conn` and reads its echo back (ACKing what
    /// comes), failing the test if it does not come whole within [`WAIT`].
    /// Like any sender, it sends the data again while nothing comes back
    /// (a busy server may have dropped it).
    pub fn echo(&mut self, conn: &mut RawConn, payload: &[u8]) -> Vec<u8> {
        let first_seq = conn.snd_nxt;
        self.send(conn.port, &conn.segment(first_seq, payload));
        conn.snd_nxt = conn.snd_nxt.wrapping_add(payload.len() as u32);
        let mut echoed = Vec::new();
        let deadline = Instant::now() + WAIT;
        let mut sent_at = Instant::now();
        while echoed.len() < payload.len() {
            let Some(r) = self.recv_for(conn.port, (sent_at + RESEND).min(deadline)) else {
                assert!(
                    Instant::now() < deadline,
                    "{} of {} bytes echoed on port {}",
                    echoed.len(),
                    payload.len(),
                    conn.port
                );
                if echoed.is_empty() {
                    self.send(conn.port, &conn.segment(first_seq, payload));
                } else {
                    self.ack(conn);
                }
                sent_at = Instant::now();
                continue;
            };
            assert!(!r.flags.rst, "the server reset the connection: {r:?}");
            // In-order data only (a retransmission of what we have is
            // skipped; the server resends what we did not ACK).
            if r.seq == conn.rcv_nxt && !r.payload.is_empty() {
                echoed.extend_from_slice(&r.payload);
                conn.rcv_nxt = conn.rcv_nxt.wrapping_add(r.payload.len() as u32);
                self.ack(conn);
            }
        }
        echoed
    }
}

impl RawConn {
    /// An ACK segment at `seq` with `payload`.
    pub fn segment<'a>(&self, seq: u32, payload: &'a [u8]) -> Segment<'a> {
        Segment {
            ack: Some(Seq(self.rcv_nxt)),
            flags: Flags {
                psh: !payload.is_empty(),
                ..Flags::default()
            },
            window: 65535,
            payload,
            ..Segment::new(Seq(seq))
        }
    }
}
