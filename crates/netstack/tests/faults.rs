//! Faults and bad input from protected applications (docs/protected.md):
//! each is refused or cut off with its reason, and the netstack and the
//! other applications go on.

mod common;

use std::net::Ipv4Addr;

use common::*;
use ginza_net::tcp::State;
use ginza_net::{Interface, MacAddr};
use ginza_netstack::{Netstack, NetstackConfig};
use ginza_proto::netstack::{Command, ConnId, Event, Ranges, Reason, SendFlags};
use ginza_shm::netstack::Slot;

fn one(r: ginza_proto::netstack::Range) -> Ranges {
    Ranges::one(r).unwrap()
}

fn send(conn: ConnId, r: ginza_proto::netstack::Range) -> Command {
    Command::Send {
        conn,
        ranges: one(r),
        flags: SendFlags::default(),
    }
}

fn refused(evs: &[Event]) -> Vec<(Option<ConnId>, Reason)> {
    evs.iter()
        .filter_map(|e| match e {
            Event::Refused { conn, reason, .. } => Some((*conn, *reason)),
            _ => None,
        })
        .collect()
}

/// The application sends `bytes` from the start of its tx pool and waits
/// for the peer to have them.
fn send_and_check(
    ns: &mut Netstack,
    app: &mut RawApp,
    peer: &mut Peer,
    conn: ConnId,
    bytes: &[u8],
) {
    let before = peer.got.len();
    app.tx
        .get_mut(range(0, bytes.len() as u32))
        .unwrap()
        .copy_from_slice(bytes);
    app.cmd(send(conn, range(0, bytes.len() as u32)));
    until(ns, &mut [peer], "the peer to receive", |_, p| {
        p[0].got.len() == before + bytes.len()
    });
    assert_eq!(&peer.got[before..], bytes);
}

#[test]
fn send_outside_the_tx_pool_is_refused_and_the_connection_goes_on() {
    let mut ns = netstack();
    let mut app = RawApp::attach(&mut ns, "a", app_iface());
    let mut peer = Peer::connect(40001, APP_IP, 80);
    let (conn, _) = accept_one(&mut ns, &mut app, &mut peer);
    let pool = app.tx.len() as u32;
    for bad in [
        range(pool - 1, 2),
        range(pool, 1),
        range(u32::MAX, u32::MAX),
    ] {
        app.cmd(send(conn, bad));
        ns.poll();
        assert_eq!(
            refused(&app.events()),
            [(Some(conn), Reason::OutsideTxPool)],
            "{bad:?}"
        );
    }
    // A mixed send (one good, one bad range) is refused whole.
    app.cmd(Command::Send {
        conn,
        ranges: Ranges::from_slice(&[range(0, 4), range(pool, 4)]).unwrap(),
        flags: SendFlags::default(),
    });
    ns.poll();
    assert_eq!(
        refused(&app.events()),
        [(Some(conn), Reason::OutsideTxPool)]
    );
    assert!(peer.got.is_empty(), "nothing of a refused send went out");
    send_and_check(&mut ns, &mut app, &mut peer, conn, b"still fine");
    assert!(ns.stats().refused >= 4);
}

#[test]
fn recv_done_for_data_never_given_is_refused() {
    let mut ns = netstack();
    let mut app = RawApp::attach(&mut ns, "a", app_iface());
    let mut peer = Peer::connect(40002, APP_IP, 80);
    let (conn, _) = accept_one(&mut ns, &mut app, &mut peer);
    // Nothing was delivered yet.
    app.cmd(Command::RecvDone {
        conn,
        ranges: one(range(0, 10)),
    });
    ns.poll();
    assert_eq!(refused(&app.events()), [(Some(conn), Reason::NotDelivered)]);
    // Deliver something, then give back a wrong length, a wrong offset,
    // the same range twice, and finally the right one.
    peer.tcb.send(b"hello").unwrap();
    let mut got = None;
    until(&mut ns, &mut [&mut peer], "new_data", |_, _| {
        for e in app.events() {
            if let Event::NewData { ranges, .. } = e {
                got = Some(ranges.as_slice()[0]);
            }
        }
        got.is_some()
    });
    let r = got.unwrap();
    assert_eq!(app.rx.get(r).unwrap(), b"hello");
    for bad in [
        one(range(r.offset, r.len + 1)),
        one(range(r.offset + 1, r.len)),
        Ranges::from_slice(&[r, r]).unwrap(),
    ] {
        app.cmd(Command::RecvDone { conn, ranges: bad });
        ns.poll();
        assert_eq!(
            refused(&app.events()),
            [(Some(conn), Reason::NotDelivered)],
            "{bad:?}"
        );
    }
    assert_eq!(ns.rx_lent(app.id), Some(1));
    app.cmd(Command::RecvDone {
        conn,
        ranges: one(r),
    });
    ns.poll();
    assert!(refused(&app.events()).is_empty());
    assert_eq!(ns.rx_lent(app.id), Some(0));
    // Given back once: a second time is refused.
    app.cmd(Command::RecvDone {
        conn,
        ranges: one(r),
    });
    ns.poll();
    assert_eq!(refused(&app.events()), [(Some(conn), Reason::NotDelivered)]);
}

fn other_iface() -> Interface {
    Interface {
        mac: MacAddr([2, 0, 0, 0, 0, 3]),
        ip: Ipv4Addr::new(10, 0, 0, 3),
    }
}

#[test]
fn commands_for_connections_the_app_does_not_own_are_refused() {
    let mut ns = netstack();
    let mut a = RawApp::attach(&mut ns, "a", app_iface());
    let mut b = RawApp::attach(&mut ns, "b", other_iface());
    let mut peer = Peer::connect(40003, APP_IP, 80);
    let (conn, listener) = accept_one(&mut ns, &mut a, &mut peer);
    // b names a's connection: every kind of command.
    for cmd in [
        send(conn, range(0, 1)),
        Command::RecvDone {
            conn,
            ranges: one(range(0, 1)),
        },
        Command::Shutdown { conn },
        Command::Close { conn },
        Command::Accept { conn, listener },
    ] {
        b.cmd(cmd);
        ns.poll();
        assert_eq!(
            refused(&b.events()),
            [(Some(conn), Reason::NotOwner)],
            "{cmd:?}"
        );
    }
    b.cmd(Command::Unlisten { listener });
    ns.poll();
    assert_eq!(refused(&b.events()), [(None, Reason::NotOwner)]);
    // Invented and stale-looking ids find nothing.
    for forged in [conn.get() ^ (1 << 20), conn.get() + 1, 0xfff0_0001] {
        let f = ConnId::new(forged).unwrap();
        b.cmd(Command::Close { conn: f });
        ns.poll();
        assert_eq!(refused(&b.events()), [(Some(f), Reason::NoSuchConnection)]);
    }
    // a noticed nothing: its connection works.
    assert!(a.events().is_empty());
    send_and_check(&mut ns, &mut a, &mut peer, conn, b"a is fine");
    // b listening on a's port of its own address is fine; on the same
    // address as a's listener it would not be (ports are per address).
    b.cmd(Command::Listen {
        cookie: 1,
        port: 80,
        backlog: 1,
    });
    ns.poll();
    assert!(matches!(
        b.events().as_slice(),
        [Event::Listening { cookie: 1, .. }]
    ));
}

#[test]
fn garbage_in_the_command_ring_cuts_the_app_off_and_resets_its_connections() {
    let mut ns = netstack();
    let mut bad = RawApp::attach(&mut ns, "bad", app_iface());
    let mut good = RawApp::attach(&mut ns, "good", other_iface());
    let mut bad_peer = Peer::connect(40004, APP_IP, 80);
    let mut good_peer = Peer::connect(40005, other_iface().ip, 80);
    let _ = accept_one(&mut ns, &mut bad, &mut bad_peer);
    let (good_conn, _) = accept_one(&mut ns, &mut good, &mut good_peer);
    let garbage = Slot {
        words: [0xdead_beef; 16],
    };
    bad.pair.commands.push(garbage).unwrap();
    ns.poll();
    let doomed = ns.take_doomed();
    assert_eq!(doomed.len(), 1);
    assert_eq!(doomed[0].0, bad.id);
    assert!(
        doomed[0].1.contains("undecodable command"),
        "{}",
        doomed[0].1
    );
    assert_eq!(
        bad.events(),
        [Event::Disconnected {
            reason: Reason::BadCommand
        }]
    );
    // Its peer is reset; the other application goes on.
    until(
        &mut ns,
        &mut [&mut bad_peer, &mut good_peer],
        "the reset",
        |_, p| p[0].tcb.state() == State::Closed,
    );
    assert_eq!(bad_peer.tcb.error(), Some(ginza_net::tcp::TcpError::Reset));
    send_and_check(
        &mut ns,
        &mut good,
        &mut good_peer,
        good_conn,
        b"good goes on",
    );
    assert_eq!(ns.app_ids(), vec![good.id]);
    assert_eq!(ns.rx_lent(bad.id), None, "the cut-off app's pool is gone");
}

#[test]
fn a_corrupt_ring_index_cuts_the_app_off() {
    let mut ns = netstack();
    let mut app = RawApp::attach(&mut ns, "a", app_iface());
    // Forge the command ring's tail through the channel mapping: a
    // producer that claims more messages than the ring holds.
    for _ in 0..3 {
        app.cmd(Command::Shutdown {
            conn: ConnId::new(1).unwrap(),
        });
    }
    ns.poll();
    let _ = app.events();
    let (pending, _) = app.channel.pending(0).unwrap();
    assert_eq!(pending, 0);
    // A tail far ahead of the head: written by the app's own hand.
    forge::forge_tail(&app);
    ns.poll();
    let doomed = ns.take_doomed();
    assert_eq!(doomed.len(), 1, "{doomed:?}");
    assert!(doomed[0].1.contains("corrupt"), "{}", doomed[0].1);
}

/// The hostile application's hand on its own channel memfd.
mod forge {
    use super::*;

    pub fn forge_tail(app: &RawApp) {
        // Reopen the channel memfd and write a bogus tail (offset of the
        // first command ring's tail word: after the 64-byte header and one
        // 64-byte pair line, the ring's head line, then its tail line).
        use std::os::unix::fs::FileExt;
        let fd = app.channel.fd().try_clone_to_owned().unwrap();
        let f = std::fs::File::from(fd);
        let tail_at = 64 + 64 + 64;
        f.write_at(&1_000_000u32.to_le_bytes(), tail_at).unwrap();
    }
}

#[test]
fn an_app_killed_mid_transfer_gets_its_connections_reset_and_buffers_freed() {
    let mut ns = netstack();
    let mut app = RawApp::attach(&mut ns, "victim", app_iface());
    let mut other = RawApp::attach(&mut ns, "other", other_iface());
    let mut peer = Peer::connect(40006, APP_IP, 80);
    let mut other_peer = Peer::connect(40007, other_iface().ip, 80);
    let (conn, _) = accept_one(&mut ns, &mut app, &mut peer);
    let (other_conn, _) = accept_one(&mut ns, &mut other, &mut other_peer);
    // Mid-transfer: data delivered and held, a send in flight.
    peer.tcb.send(&[7u8; 5000]).unwrap();
    until(
        &mut ns,
        &mut [&mut peer],
        "data held by the app",
        |ns, _| ns.rx_lent(app.id).unwrap() >= 2,
    );
    app.tx.get_mut(range(0, 3000)).unwrap().fill(1);
    app.cmd(send(conn, range(0, 3000)));
    ns.poll();
    let id = app.id;
    drop(app); // killed: the daemon sees its socket close and detaches
    ns.detach(id);
    until(
        &mut ns,
        &mut [&mut peer, &mut other_peer],
        "the reset",
        |_, p| p[0].tcb.state() == State::Closed,
    );
    assert_eq!(peer.tcb.error(), Some(ginza_net::tcp::TcpError::Reset));
    assert_eq!(ns.rx_lent(id), None);
    assert_eq!(ns.stats().connections, 1, "only the other app's connection");
    send_and_check(
        &mut ns,
        &mut other,
        &mut other_peer,
        other_conn,
        b"unaffected",
    );
}

#[test]
fn a_full_event_ring_is_back_pressure_not_loss() {
    let mut ns = Netstack::new(NetstackConfig {
        ring_capacity: 4,
        rx_chunks: 64,
        ..NetstackConfig::default()
    });
    let mut app = RawApp::attach(&mut ns, "slow", app_iface());
    // 12 listens → 12 `listening` events through rings of 4, read by a
    // slow application (one event per round).
    let mut next = 1u16;
    let mut cookies = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while cookies.len() < 12 {
        while next <= 12 {
            let c = Command::Listen {
                cookie: u32::from(next),
                port: next,
                backlog: 1,
            };
            if app.pair.commands.push(c.encode()).is_err() {
                break; // back-pressure on the command ring too
            }
            next += 1;
        }
        ns.poll();
        if let Some(s) = app.pair.events.pop().unwrap() {
            match Event::decode(&s).unwrap() {
                Event::Listening { cookie, .. } => cookies.push(cookie),
                other => panic!("{other:?}"),
            }
        }
        assert!(std::time::Instant::now() < deadline, "got {cookies:?}");
    }
    assert_eq!(
        cookies,
        (1..=12).collect::<Vec<u32>>(),
        "none lost, in order"
    );
    assert!(ns.stats().event_ring_full > 0, "the full ring was counted");
    assert!(app.pair.line.full_counts().1 > 0);
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(64))]

    /// Fuzz-style: any slots in the command ring (valid commands naming
    /// random ids and ranges, or garbage) never panic the netstack; the
    /// sender is refused or cut off, and another application goes on.
    #[test]
    fn random_command_slots_never_hurt_the_netstack(slots in proptest::collection::vec(proptest::array::uniform16(0u32..6), 1..40)) {
        let mut ns = netstack();
        let mut fuzz = RawApp::attach(&mut ns, "fuzz", app_iface());
        let mut good = RawApp::attach(&mut ns, "good", other_iface());
        let mut peer = Peer::connect(40010, other_iface().ip, 80);
        let (conn, _) = accept_one(&mut ns, &mut good, &mut peer);
        for words in slots {
            let s = Slot { words };
            if fuzz.pair.commands.push(s).is_err() {
                break;
            }
            ns.poll();
            let _ = fuzz.events();
        }
        let doomed = ns.take_doomed();
        proptest::prop_assert!(doomed.iter().all(|(id, _)| *id == fuzz.id));
        send_and_check(&mut ns, &mut good, &mut peer, conn, b"unhurt");
    }
}
