//! Both windows closed at once (docs/tcp.md, "Zero windows both ways"): a
//! client writes and reads against an echo peer that, like a blocking Linux
//! echo thread, reads its next chunk only once the previous one is sent. When
//! the client's reader falls behind, the peer's sends block, it stops
//! reading, and its window closes too; both sides then probe each other's
//! zero window. The client must come out of it once its reader reads again,
//! whatever the link lost.

mod tcp_support;

use ginza_net::tcp::{Connection, Instant, State, TcpConfig};
use std::time::Duration;
use tcp_support::*;

/// Deterministic bytes: position-dependent so any misplaced byte shows.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(29)
                .wrapping_add((i >> 9) as u8 ^ salt)
        })
        .collect()
}

/// An echo peer with a blocking `send`: it reads at most `chunk` bytes, and
/// reads again only after all of them were queued for sending.
struct BlockingEcho {
    pending: Vec<u8>,
    sent: usize,
    chunk: usize,
}

impl BlockingEcho {
    fn new(chunk: usize) -> BlockingEcho {
        BlockingEcho {
            pending: Vec::new(),
            sent: 0,
            chunk,
        }
    }

    fn run(&mut self, conn: &mut Connection) {
        loop {
            if self.sent == self.pending.len() {
                let mut buf = vec![0; self.chunk];
                match conn.recv(&mut buf) {
                    Ok(n @ 1..) => {
                        self.pending = buf[..n].to_vec();
                        self.sent = 0;
                    }
                    _ => return,
                }
            }
            match conn.send(&self.pending[self.sent..]) {
                Ok(n @ 1..) => self.sent += n,
                _ => return,
            }
        }
    }
}

/// The client sends `data` and reads the echo whenever `reading(now, got)`
/// says its reader runs; the peer echoes. Returns what came back, or why it
/// stalled within `budget` of virtual time.
fn echo(
    net: &mut Net,
    data: &[u8],
    reading: impl Fn(Instant, usize) -> bool,
    budget: Duration,
) -> Result<Vec<u8>, String> {
    let deadline = net.now + budget;
    let mut echo = BlockingEcho::new(64 * 1024);
    let (mut sent, mut got) = (0, Vec::new());
    let mut buf = vec![0; 64 * 1024];
    loop {
        if net.a.state() == State::Established {
            if let Ok(n) = net.a.send(&data[sent..]) {
                sent += n;
            }
        }
        if reading(net.now, got.len()) {
            while let Ok(n @ 1..) = net.a.recv(&mut buf) {
                got.extend_from_slice(&buf[..n]);
            }
        }
        if net.b.state() == State::Established {
            echo.run(&mut net.b);
        }
        if got.len() == data.len() {
            return Ok(got);
        }
        let stalled = |net: &Net, why: &str| {
            format!(
                "{why} at {:?}: client got {} of {} (sent {sent}); client {:?} (una, nxt, rcv_nxt) {:?} \
                 peer window {} queued {} {:?}; peer {:?} {:?} peer window {} queued {} {:?}",
                net.now,
                got.len(),
                data.len(),
                net.a.state(),
                net.a.sequence_state(),
                net.a.peer_window(),
                net.a.send_queued(),
                net.a.stats(),
                net.b.state(),
                net.b.sequence_state(),
                net.b.peer_window(),
                net.b.send_queued(),
                net.b.stats(),
            )
        };
        if net.now >= deadline {
            return Err(stalled(net, "stalled"));
        }
        // The reader runs at least every millisecond (it may resume between
        // events).
        net.step_within(Some(ms(1)));
    }
}

/// 60 000-byte buffers: no window scale, so a full buffer advertises
/// exactly zero, as Linux's does (a scaled window rounds a few bytes of room
/// down to zero and still takes a probe's byte).
fn unscaled() -> TcpConfig {
    TcpConfig {
        recv_buffer: 60_000,
        send_buffer: 60_000,
        ..TcpConfig::default()
    }
}

fn established(config: &TcpConfig, link: LinkConfig, seed: u64) -> Net {
    let mut net = Net::handshake(config, link, seed);
    while net.a.state() != State::Established || net.b.state() != State::Established {
        assert!(net.step(), "the handshake completes");
    }
    net
}

/// The client's reader stops for two seconds: both windows close, and both
/// sides' persist timers fire and probe. Once the reader reads again, its
/// window update must reach a peer whose own window is still zero: it must
/// be numbered at the peer's RCV.NXT, not at the refused probe's end.
#[test]
fn a_reader_pausing_past_the_persist_timer_does_not_stall_the_echo() {
    let mut net = established(&unscaled(), LinkConfig::clean(Duration::from_micros(50)), 1);
    let data = pattern(2 << 20, 1);
    let resume = at_ms(2_000);
    let got =
        echo(&mut net, &data, |now, _| now >= resume, ms(30_000)).unwrap_or_else(|e| panic!("{e}"));
    assert!(got == data, "the echo came back intact");
    let (a, b) = (net.a.stats(), net.b.stats());
    assert!(
        a.zero_window_probes > 0 && b.zero_window_probes > 0,
        "both sides probed a zero window: client {a:?}, peer {b:?}"
    );
    // The window update lands at once: the rest takes a few hundred round
    // trips of 100 µs, not another persist interval.
    assert!(
        net.now < resume + ms(500),
        "done at {:?}, reader resumed at {resume:?}",
        net.now
    );
    // A clean link: answers to refused probes are no duplicate ACKs, so
    // nothing is fast-retransmitted (into a zero window).
    assert_eq!(a.fast_retransmits + b.fast_retransmits, 0, "{a:?} {b:?}");
    // No ACK answers an ACK: about two segments per data segment, not a
    // ping-pong of ACKs between two zero windows.
    assert!(
        net.delivered < 8_000,
        "{} segments delivered: client {a:?}, peer {b:?}",
        net.delivered
    );
}

/// As above, but the client's window update after its reader resumed is
/// lost: the peer learns of the open window from the answer to its next
/// probe, which must be numbered within its zero window too.
#[test]
fn a_lost_window_update_is_repaired_by_the_peers_probe() {
    let mut net = established(&unscaled(), LinkConfig::clean(Duration::from_micros(50)), 2);
    let resume = at_ms(2_000);
    let dropped = std::rc::Rc::new(std::cell::Cell::new(0));
    let counter = dropped.clone();
    // The client's first segment that opens its window after it had
    // closed: the window update.
    let mut closed = false;
    net.drop_filter = Some(Box::new(move |to_server, segment| {
        if !to_server {
            return false;
        }
        if segment.header.window == 0 {
            closed = true;
            return false;
        }
        if closed && counter.get() == 0 {
            counter.set(1);
            return true;
        }
        false
    }));
    let data = pattern(1 << 20, 2);
    let got =
        echo(&mut net, &data, |now, _| now >= resume, ms(60_000)).unwrap_or_else(|e| panic!("{e}"));
    assert!(got == data, "the echo came back intact");
    assert_eq!(dropped.get(), 1, "the window update was dropped");
}

/// Seeded 5 % loss and 5 % reordering both ways, as in the veth test
/// (docs/tcp.md), with a reader that stops now and then for longer than
/// the persist timer: every seed's echo completes.
#[test]
fn echoes_through_loss_with_a_stalling_reader_complete() {
    let link = LinkConfig {
        loss: 0.05,
        duplicate: 0.0,
        reorder: 0.05,
        reorder_delay: Duration::from_micros(200),
        delay: Duration::from_micros(50),
    };
    for seed in 1..=12 {
        let mut net = established(&unscaled(), link.clone(), seed);
        let data = pattern(512 << 10, seed as u8);
        // Reads for 300 ms, then pauses for 700 ms, and so on.
        let reading = |now: Instant, _| (now.as_nanos() / 1_000_000) % 1_000 < 300;
        let got = echo(&mut net, &data, reading, ms(120_000))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(got == data, "seed {seed}: the echo came back intact");
    }
}
