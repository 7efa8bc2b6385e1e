//! Two connections over a simulated link exchange data and close.

mod tcp_support;

use ginza_net::tcp::{State, TcpConfig, TcpError};
use std::time::Duration;
use tcp_support::*;

/// Deterministic bytes: position-dependent so any misplaced byte shows.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add((i >> 8) as u8 ^ salt)
        })
        .collect()
}

/// Moves `to_send` from `from` through the link into `received`, reading
/// and writing as an application would, until both directions are done or
/// the virtual-time budget runs out.
fn exchange(net: &mut Net, a_data: &[u8], b_data: &[u8], budget: Duration) -> (Vec<u8>, Vec<u8>) {
    let (mut a_sent, mut b_sent) = (0, 0);
    let (mut a_got, mut b_got) = (Vec::new(), Vec::new());
    let deadline = net.now + budget;
    let mut buf = vec![0; 64 * 1024];
    loop {
        if net.a.state() == State::Established || net.a.state() == State::CloseWait {
            if let Ok(n) = net.a.send(&a_data[a_sent..]) {
                a_sent += n;
            }
        }
        if net.b.state() == State::Established || net.b.state() == State::CloseWait {
            if let Ok(n) = net.b.send(&b_data[b_sent..]) {
                b_sent += n;
            }
        }
        while let Ok(n @ 1..) = net.a.recv(&mut buf) {
            a_got.extend_from_slice(&buf[..n]);
        }
        while let Ok(n @ 1..) = net.b.recv(&mut buf) {
            b_got.extend_from_slice(&buf[..n]);
        }
        if a_got.len() == b_data.len() && b_got.len() == a_data.len() {
            return (a_got, b_got);
        }
        assert!(
            net.now < deadline,
            "transfer stalled: a got {} of {}, b got {} of {} (a {:?} {:?}, b {:?} {:?})",
            a_got.len(),
            b_data.len(),
            b_got.len(),
            a_data.len(),
            net.a.state(),
            net.a.stats(),
            net.b.state(),
            net.b.stats()
        );
        assert!(
            net.step(),
            "idle before the transfer finished at {:?} ({:?}/{:?}): a {:?} {:?} queued {} wnd {} cwnd {}, b {:?} {:?} queued {} wnd {} cwnd {}",
            net.now, net.a.error(), net.b.error(), net.a.state(), net.a.sequence_state(), net.a.send_queued(), net.a.peer_window(), net.a.congestion_window(),
            net.b.state(), net.b.sequence_state(), net.b.send_queued(), net.b.peer_window(), net.b.congestion_window(),
        );
    }
}

/// Runs the link until both sides are closed (or the budget runs out).
fn close_both(net: &mut Net, budget: Duration) {
    let deadline = net.now + budget;
    let mut buf = [0; 1024];
    while !(net.a.is_finished() && net.b.is_finished()) {
        // Each side closes once it saw the other's FIN or closed itself.
        if net.b.state() == State::CloseWait && net.b.recv(&mut buf) == Ok(0) {
            net.b.close();
        }
        assert!(
            net.now < deadline,
            "close stalled: a {:?}, b {:?}",
            net.a.state(),
            net.b.state()
        );
        assert!(
            net.step(),
            "idle before closed: a {:?}, b {:?}",
            net.a.state(),
            net.b.state()
        );
    }
}

#[test]
fn data_both_ways_then_close() {
    let config = TcpConfig::default();
    let mut net = Net::handshake(&config, LinkConfig::clean(Duration::from_micros(50)), 1);
    while net.a.state() != State::Established || net.b.state() != State::Established {
        assert!(net.step());
    }
    let events = net.a.take_events();
    assert!(events.connected && events.writable);
    assert!(net.b.take_events().connected);
    assert_eq!(net.a.send_mss(), 1460);
    let a_data = pattern(1_000_000, 1);
    let b_data = pattern(300_000, 2);
    let (a_got, b_got) = exchange(&mut net, &a_data, &b_data, Duration::from_secs(5));
    assert!(a_got == b_data, "client received the server's bytes intact");
    assert!(b_got == a_data, "server received the client's bytes intact");
    // Clean link: nothing retransmitted, nothing out of order.
    for stats in [net.a.stats(), net.b.stats()] {
        assert_eq!(stats.retransmissions, 0, "{stats:?}");
        assert_eq!(stats.out_of_order_segments, 0, "{stats:?}");
    }
    net.a.close();
    assert_eq!(net.a.send(b"x"), Err(TcpError::Closed));
    assert_eq!(net.a.state(), State::FinWait1);
    close_both(&mut net, Duration::from_secs(120));
    assert!(net.b.take_events().closed);
    assert_eq!(net.a.error(), None);
    assert_eq!(net.b.error(), None);
    // The client went through TIME-WAIT: 60 s of virtual time.
    assert!(net.now >= at_ms(60_000), "closed at {:?}", net.now);
}

fn lossy_link() -> LinkConfig {
    LinkConfig {
        loss: 0.10,
        duplicate: 0.02,
        reorder: 0.10,
        reorder_delay: Duration::from_micros(300),
        delay: Duration::from_micros(100),
    }
}

/// The acceptance test: 10 % loss, reordering, duplication and
/// delay; 10 MB one way and 1 MB back, byte-exact, within a bounded virtual
/// time; then both sides close cleanly.
#[test]
fn lossy_link_transfers_ten_megabytes_byte_exact() {
    let config = TcpConfig::default();
    let mut net = Net::handshake(&config, lossy_link(), 7);
    let a_data = pattern(10_000_000, 3);
    let b_data = pattern(1_000_000, 4);
    let (a_got, b_got) = exchange(&mut net, &a_data, &b_data, Duration::from_secs(300));
    assert!(b_got == a_data, "10 MB arrived intact");
    assert!(a_got == b_data, "1 MB came back intact");
    let transfer_time = net.now;
    let (a, b) = (net.a.stats(), net.b.stats());
    eprintln!("transfer done at {transfer_time:?}; a {a:?}; b {b:?}");
    // The link really was lossy and the recovery machinery really ran.
    assert!(
        a.retransmissions > 500 && a.fast_retransmits > 20 && a.timeouts > 0,
        "{a:?}"
    );
    assert!(
        b.out_of_order_segments > 500 && b.duplicate_segments > 0,
        "{b:?}"
    );
    net.a.close();
    close_both(&mut net, Duration::from_secs(600));
    assert_eq!((net.a.error(), net.b.error()), (None, None));
}

/// Several seeds, smaller transfers: different loss patterns each.
#[test]
fn lossy_link_other_seeds() {
    let config = TcpConfig::default();
    for seed in [8, 9, 10] {
        let mut net = Net::handshake(&config, lossy_link(), seed);
        let a_data = pattern(500_000, seed as u8);
        let b_data = pattern(500_000, !seed as u8);
        let (a_got, b_got) = exchange(&mut net, &a_data, &b_data, Duration::from_secs(300));
        assert!(
            a_got == b_data && b_got == a_data,
            "seed {seed}: bytes intact"
        );
        net.b.close();
        let deadline = net.now + Duration::from_secs(600);
        let mut buf = [0; 64];
        while !(net.a.is_finished() && net.b.is_finished()) {
            if net.a.state() == State::CloseWait && net.a.recv(&mut buf) == Ok(0) {
                net.a.close();
            }
            assert!(
                net.now < deadline && net.step(),
                "seed {seed}: close stalled"
            );
        }
    }
}

/// Segments of one connection handled by different kthreads arrive in any
/// order: a burst delivered shuffled (data and ACKs both ways) still reads
/// in order, with no byte lost or repeated.
#[test]
fn stolen_segments_are_resequenced() {
    let config = TcpConfig::default();
    let mut net = Net::handshake(&config, LinkConfig::clean(Duration::from_micros(10)), 3);
    while net.a.state() != State::Established || net.b.state() != State::Established {
        assert!(net.step());
    }
    let mut rng = Rng::new(99);
    let a_data = pattern(200_000, 5);
    let b_data = pattern(200_000, 6);
    let (mut a_sent, mut b_sent) = (0, 0);
    let (mut a_got, mut b_got) = (Vec::new(), Vec::new());
    let mut buf = vec![0; 65536];
    let mut now = net.now;
    for _ in 0..10_000 {
        if a_got.len() == b_data.len() && b_got.len() == a_data.len() {
            break;
        }
        a_sent += net.a.send(&a_data[a_sent..]).unwrap_or(0);
        b_sent += net.b.send(&b_data[b_sent..]).unwrap_or(0);
        // Everything in flight, both ways, delivered in a random order.
        let mut burst: Vec<(bool, Owned)> = drain(&mut net.a, now)
            .into_iter()
            .map(|s| (true, s))
            .chain(drain(&mut net.b, now).into_iter().map(|s| (false, s)))
            .collect();
        for i in (1..burst.len()).rev() {
            burst.swap(i, rng.below(i as u64 + 1) as usize);
        }
        now = now + Duration::from_micros(20);
        for (to_b, segment) in &burst {
            let conn = if *to_b { &mut net.b } else { &mut net.a };
            conn.on_segment(&segment.view(), now);
        }
        for conn in [&mut net.a, &mut net.b] {
            if conn.next_deadline().is_some_and(|d| d <= now) {
                conn.on_timer(now);
            }
        }
        if burst.is_empty() {
            // Only timers (delayed ACKs) can move things on.
            let next = [net.a.next_deadline(), net.b.next_deadline()]
                .into_iter()
                .flatten()
                .min();
            now = now.max(next.expect("stalled with nothing armed"));
            net.a.on_timer(now);
            net.b.on_timer(now);
        }
        while let Ok(n @ 1..) = net.a.recv(&mut buf) {
            a_got.extend_from_slice(&buf[..n]);
        }
        while let Ok(n @ 1..) = net.b.recv(&mut buf) {
            b_got.extend_from_slice(&buf[..n]);
        }
    }
    assert!(
        a_got == b_data && b_got == a_data,
        "bytes intact and in order"
    );
    assert!(
        net.b.stats().out_of_order_segments > 10,
        "{:?}",
        net.b.stats()
    );
    assert_eq!(
        net.a.stats().timeouts + net.b.stats().timeouts,
        0,
        "no loss, no timeout"
    );
}

/// The same lossy transfer with SACK (both ends offer it by default) and
/// without: RFC 6675 recovery repairs several holes a round trip and
/// resends no SACKed data, so it ends sooner in virtual time and sends
/// fewer segments.
#[test]
fn sack_recovers_the_lossy_transfer_sooner_than_newreno() {
    let mut results = Vec::new();
    for sack in [false, true] {
        let config = TcpConfig {
            sack,
            ..TcpConfig::default()
        };
        let mut net = Net::handshake(&config, lossy_link(), 7);
        let a_data = pattern(10_000_000, 3);
        let b_data = pattern(1_000_000, 4);
        let (a_got, b_got) = exchange(&mut net, &a_data, &b_data, Duration::from_secs(300));
        assert!(b_got == a_data && a_got == b_data, "sack {sack}: intact");
        assert_eq!((net.a.sack_enabled(), net.b.sack_enabled()), (sack, sack));
        let a = net.a.stats();
        eprintln!("sack {sack}: done at {:?}; {a:?}", net.now);
        results.push((net.now, a));
    }
    let (newreno, sack) = (&results[0], &results[1]);
    assert_eq!(newreno.1.sack_retransmissions, 0);
    assert!(
        sack.1.sack_recoveries > 100 && sack.1.sack_blocks_received > 1000,
        "{:?}",
        sack.1
    );
    assert!(
        sack.0.as_nanos() * 2 < newreno.0.as_nanos(),
        "SACK {:?} vs NewReno {:?}",
        sack.0,
        newreno.0
    );
}
