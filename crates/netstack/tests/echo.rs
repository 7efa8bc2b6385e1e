//! End to end in one process: a remote TCP peer ⇄ frames ⇄ the netstack
//! engine ⇄ command/event rings and pools (real memfds) ⇄ a raw protected
//! application that echoes.

mod common;

use common::*;
use ginza_proto::netstack::{Command, Event, Ranges, SendFlags};

#[test]
fn handshake_and_echo_through_the_rings() {
    let mut ns = netstack();
    let mut app = RawApp::attach(&mut ns, "echo", app_iface());
    let mut peer = Peer::connect(40000, APP_IP, 7);
    let (conn, _) = accept_one(&mut ns, &mut app, &mut peer);
    assert!(peer.tcb.state() == ginza_net::tcp::State::Established);

    let message: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    peer.tcb.send(&message).unwrap();
    let mut echoed_to_tx = 0u32;
    let mut acked = 0u64;
    let mut recv_done = 0u64;
    until(&mut ns, &mut [&mut peer], "the echo", |_, peers| {
        for e in app.events() {
            match e {
                Event::NewData { conn: c, ranges } => {
                    assert_eq!(c, conn);
                    // Echo: copy each range into the tx pool, send it, give
                    // the rx range back.
                    let mut out = Ranges::default();
                    for r in ranges.as_slice() {
                        let bytes = app.rx.get(*r).unwrap().to_vec();
                        let t = range(echoed_to_tx, r.len);
                        app.tx.get_mut(t).unwrap().copy_from_slice(&bytes);
                        echoed_to_tx += r.len;
                        out.push(t);
                    }
                    app.cmd(Command::Send {
                        conn,
                        ranges: out,
                        flags: SendFlags::default(),
                    });
                    app.cmd(Command::RecvDone { conn, ranges });
                    recv_done += ranges.bytes();
                }
                Event::DataAcked { conn: c, ranges } => {
                    assert_eq!(c, conn);
                    acked += ranges.bytes();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        peers[0].got.len() == message.len() && acked == message.len() as u64
    });
    assert_eq!(peer.got, message, "the echo came back intact");
    assert_eq!(recv_done, message.len() as u64);
    assert_eq!(ns.rx_lent(app.id), Some(0), "every rx chunk came back");
    let st = ns.stats();
    assert_eq!(st.tx_bytes_copied, message.len() as u64);
    assert_eq!(st.rx_bytes_delivered, message.len() as u64);

    // The peer closes: remote_closed; the app closes: cleanup.
    peer.tcb.close();
    let mut remote_closed = false;
    until(&mut ns, &mut [&mut peer], "remote_closed", |_, _| {
        remote_closed |= app.events().contains(&Event::RemoteClosed { conn });
        remote_closed
    });
    app.cmd(Command::Close { conn });
    let mut cleaned = false;
    until(&mut ns, &mut [&mut peer], "cleanup", |ns, peers| {
        cleaned |= app.events().contains(&Event::Cleanup { conn });
        cleaned
            && peers[0].tcb.state() == ginza_net::tcp::State::TimeWait
            && ns.stats().connections == 0
    });
    // The id is dead now.
    app.cmd(Command::Shutdown { conn });
    ns.poll();
    assert!(matches!(
        app.events().as_slice(),
        [Event::Refused {
            conn: Some(c),
            reason: ginza_proto::netstack::Reason::NoSuchConnection,
            ..
        }] if *c == conn
    ));
}

#[test]
fn connect_out_and_refused_connect() {
    let mut ns = ginza_netstack::Netstack::new(ginza_netstack::NetstackConfig {
        static_arp: vec![(PEER_IP, PEER_MAC)],
        ..Default::default()
    });
    let mut app = RawApp::attach(&mut ns, "client", app_iface());
    // A peer that answers our SYN with RST: nobody listens on port 9.
    app.cmd(Command::Connect {
        cookie: 5,
        remote: std::net::SocketAddrV4::new(PEER_IP, 9),
    });
    ns.poll();
    let syn = ns.pop_frame().expect("a SYN").bytes;
    let t = match ginza_net::parse(&syn, &peer_iface()).unwrap() {
        ginza_net::Packet::Tcp(t) => t,
        other => panic!("{other:?}"),
    };
    assert!(t.segment.flags.syn);
    let rst = ginza_net::tcp::reset_for(&t.segment).unwrap();
    let mut b = vec![0u8; ginza_net::MAX_FRAME_LEN];
    let n = ginza_net::tx::tcp_segment(&mut b, &peer_iface(), APP_MAC, 9, t.src, &rst).unwrap();
    ns.on_frame(&b[..n]);
    ns.poll();
    assert!(matches!(
        app.events().as_slice(),
        [Event::Refused {
            conn: None,
            cookie: 5,
            reason: ginza_proto::netstack::Reason::ConnectionRefused,
            ..
        }]
    ));
    assert_eq!(ns.stats().connections, 0);
}

/// Two rx chunks (4 KiB) for 40 kB: the netstack delivers what fits, the
/// rest waits in the TCP connection (its window closes) until `recv_done`
/// gives chunks back; everything arrives, in order.
#[test]
fn few_rx_chunks_are_flow_control_not_loss() {
    let mut ns = ginza_netstack::Netstack::new(ginza_netstack::NetstackConfig {
        rx_chunks: 2,
        ..Default::default()
    });
    let mut app = RawApp::attach(&mut ns, "small", app_iface());
    let mut peer = Peer::connect(40020, APP_IP, 7);
    let (conn, _) = accept_one(&mut ns, &mut app, &mut peer);
    let message: Vec<u8> = (0..40_000u32).map(|i| (i % 241) as u8).collect();
    let mut sent = 0;
    let mut got = Vec::new();
    until(
        &mut ns,
        &mut [&mut peer],
        "40 kB through 2 chunks",
        |ns, peers| {
            if sent < message.len() {
                sent += peers[0].tcb.send(&message[sent..]).unwrap_or(0);
            }
            assert!(ns.rx_lent(app.id).unwrap() <= 2);
            for e in app.events() {
                if let Event::NewData { conn: c, ranges } = e {
                    assert_eq!(c, conn);
                    for r in ranges.as_slice() {
                        got.extend_from_slice(app.rx.get(*r).unwrap());
                    }
                    app.cmd(Command::RecvDone { conn, ranges });
                }
            }
            got.len() == message.len()
        },
    );
    assert_eq!(got, message);
}

/// `reply_due` (the daemon's longer spin, docs/protected.md, "Where the
/// one-way time goes"): not while the application has events unread (it
/// is not running), yes once it took them and holds received data, no
/// again once it gave the data back.
#[test]
fn a_reply_is_due_while_the_application_holds_what_it_took() {
    let mut ns = netstack();
    let mut app = RawApp::attach(&mut ns, "echo", app_iface());
    let mut peer = Peer::connect(40001, APP_IP, 7);
    let (conn, _) = accept_one(&mut ns, &mut app, &mut peer);
    assert!(!ns.reply_due(), "nothing delivered yet");
    peer.tcb.send(b"ping").unwrap();
    until(
        &mut ns,
        &mut [&mut peer],
        "new_data on the ring",
        |ns, _| ns.stats().rx_bytes_delivered == 4,
    );
    assert!(!ns.reply_due(), "the event waits unread");
    let ranges = app
        .events()
        .into_iter()
        .find_map(|e| match e {
            Event::NewData { conn: c, ranges } if c == conn => Some(ranges),
            _ => None,
        })
        .expect("new_data");
    assert!(ns.reply_due(), "taken, and the data held");
    app.cmd(Command::RecvDone { conn, ranges });
    ns.poll();
    assert!(!ns.reply_due(), "the data came back");
}
