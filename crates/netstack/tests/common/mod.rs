//! A netstack engine with one remote TCP peer (the same sans-IO state
//! machine, on the "wire" side) and raw protected applications on the
//! channel, all in one process: frames are handed over by hand.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use ginza_net::tcp::{Connection, Seq, TcpConfig};
use ginza_net::{parse, tx, Endpoint, Interface, MacAddr, Packet, MAX_FRAME_LEN};
use ginza_netstack::{Attachment, Netstack, NetstackConfig, OutFrame};
use ginza_proto::netstack::{Command, ConnId, Event, ListenId, Range};
use ginza_shm::netstack::{gather, AppPair, Channel, RxPoolView, TxPool, TxPoolView};
use ginza_shm::PushError;

pub mod under_iokerneld;

pub const APP_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const APP_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
pub const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);

pub fn app_iface() -> Interface {
    Interface {
        mac: APP_MAC,
        ip: APP_IP,
    }
}

pub fn peer_iface() -> Interface {
    Interface {
        mac: PEER_MAC,
        ip: PEER_IP,
    }
}

/// A protected application driven by hand.
pub struct RawApp {
    pub id: u64,
    pub pair: AppPair,
    pub rx: RxPoolView,
    pub tx: TxPool,
    pub channel: Channel,
}

impl RawApp {
    pub fn attach(ns: &mut Netstack, name: &str, iface: Interface) -> RawApp {
        let tx = TxPool::create(name, 1 << 16).unwrap();
        let view = TxPoolView::map(tx.fd().try_clone_to_owned().unwrap()).unwrap();
        let g = ns
            .attach(Attachment {
                name: name.into(),
                pid: std::process::id() as i32,
                interface: iface,
                kthreads: 1,
                tx_pool: view,
                doorbells: Vec::new(),
            })
            .unwrap();
        let channel = Channel::attach(g.channel).unwrap();
        let rx = RxPoolView::map(g.rx_pool, g.rx_pool_bytes).unwrap();
        RawApp {
            id: g.app_id,
            pair: channel.app_pair(0).unwrap(),
            rx,
            tx,
            channel,
        }
    }

    pub fn cmd(&mut self, c: Command) {
        match self.pair.commands.push(c.encode()) {
            Ok(()) => {}
            Err(PushError::Full(_)) => panic!("command ring full in a test"),
            Err(PushError::Corrupt(e)) => panic!("{e}"),
        }
    }

    pub fn events(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(s) = self.pair.events.pop().unwrap() {
            out.push(Event::decode(&s).unwrap());
        }
        out
    }
}

/// The remote end: one TCP connection on the wire side.
pub struct Peer {
    /// The MAC of the address it talks to (tests give address `a.b.c.d`
    /// the MAC `02:00:00:00:00:d`).
    pub dst_mac: MacAddr,
    pub tcb: Connection,
    pub local: Endpoint,
    pub remote: Endpoint,
    pub got: Vec<u8>,
    epoch: Instant,
}

impl Peer {
    pub fn connect(port: u16, to: Ipv4Addr, to_port: u16) -> Peer {
        let epoch = Instant::now();
        let local = Endpoint::new(PEER_IP, port);
        let remote = Endpoint::new(to, to_port);
        let tcb = Connection::connect(
            &TcpConfig::default(),
            local,
            remote,
            Seq(12345),
            ginza_net::tcp::Instant::from_nanos(0),
        );
        Peer {
            dst_mac: MacAddr([2, 0, 0, 0, 0, to.octets()[3]]),
            tcb,
            local,
            remote,
            got: Vec::new(),
            epoch,
        }
    }

    pub fn now(&self) -> ginza_net::tcp::Instant {
        ginza_net::tcp::Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// The peer's segments, as frames to the netstack.
    pub fn frames(&mut self) -> Vec<Vec<u8>> {
        let now = self.now();
        let mut out = Vec::new();
        while let Some(seg) = self.tcb.poll_transmit(now) {
            let mut b = vec![0u8; MAX_FRAME_LEN];
            let n = tx::tcp_segment(
                &mut b,
                &peer_iface(),
                self.dst_mac,
                self.local.port,
                self.remote,
                &seg,
            )
            .unwrap();
            b.truncate(n);
            out.push(b);
        }
        out
    }

    /// A frame from the netstack; true if it was a segment for this peer.
    pub fn on_frame(&mut self, f: &[u8]) -> bool {
        let now = self.now();
        match parse(f, &peer_iface()) {
            Ok(Packet::Tcp(t)) if t.dst == self.local && t.src == self.remote => {
                self.tcb.on_segment(&t.segment, now);
                let mut buf = [0u8; 65536];
                while let Ok(n) = self.tcb.recv(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    self.got.extend_from_slice(&buf[..n]);
                }
                true
            }
            _ => false,
        }
    }

    pub fn endpoint(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.local.ip, self.local.port)
    }
}

/// One round of the "wire": frames both ways, the netstack polled.
/// Returns the frames the netstack sent that no peer took.
pub fn step(ns: &mut Netstack, peers: &mut [&mut Peer]) -> Vec<Vec<u8>> {
    step_with(ns, peers, None)
}

/// As [`step`]; zero-touch frames are assembled from `tx` (the sending
/// application's tx pool) and their checksum filled in, as iokerneld does.
pub fn step_with(
    ns: &mut Netstack,
    peers: &mut [&mut Peer],
    tx: Option<&TxPoolView>,
) -> Vec<Vec<u8>> {
    for p in peers.iter_mut() {
        for f in p.frames() {
            ns.on_frame(&f);
        }
    }
    ns.poll();
    let mut stray = Vec::new();
    while let Some(f) = ns.pop_frame() {
        let f = on_the_wire(f, tx);
        if !peers.iter_mut().any(|p| p.on_frame(&f)) {
            stray.push(f);
        }
    }
    for p in peers.iter_mut() {
        let now = p.now();
        if p.tcb.next_deadline().is_some_and(|d| d <= now) {
            p.tcb.on_timer(now);
        }
    }
    stray
}

/// A frame the netstack sent, as it leaves iokerneld: a zero-touch frame
/// assembled from `tx` (the sending application's tx pool) with its
/// checksum filled in.
pub fn on_the_wire(f: OutFrame, tx: Option<&TxPoolView>) -> Vec<u8> {
    match (&f.gather, tx) {
        (None, _) => f.bytes,
        (Some(list), Some(pool)) => {
            let mut frame = vec![0u8; MAX_FRAME_LEN];
            let n = gather::assemble(&f.bytes, list, pool, &mut frame).unwrap();
            frame.truncate(n);
            assert!(ginza_iokernel::offload::fill_l4_checksum(&mut frame));
            frame
        }
        (Some(_), None) => panic!("zero-touch frames need iokerneld"),
    }
}

/// Steps until `done` says so, or fails after a generous deadline.
pub fn until(
    ns: &mut Netstack,
    peers: &mut [&mut Peer],
    what: &str,
    mut done: impl FnMut(&mut Netstack, &mut [&mut Peer]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        step(ns, peers);
        if done(ns, peers) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
    }
}

pub fn netstack() -> Netstack {
    Netstack::new(NetstackConfig {
        rx_chunks: 64,
        ..NetstackConfig::default()
    })
}

pub fn range(offset: u32, len: u32) -> Range {
    Range::new(offset, len)
}

/// Listens, accepts the peer's connection, returns (conn, listener).
pub fn accept_one(
    ns: &mut ginza_netstack::Netstack,
    app: &mut RawApp,
    peer: &mut Peer,
) -> (ConnId, ListenId) {
    app.cmd(Command::Listen {
        cookie: 41,
        port: peer.remote.port,
        backlog: 8,
    });
    ns.poll();
    let listener = match app.events().as_slice() {
        [Event::Listening {
            cookie: 41,
            listener,
        }] => *listener,
        other => panic!("expected listening, got {other:?}"),
    };
    let mut announced = None;
    until(ns, &mut [peer], "new_conn", |_, _| {
        for e in app.events() {
            match e {
                Event::NewConn {
                    conn,
                    listener: l,
                    remote,
                } => {
                    assert_eq!(l, listener);
                    assert_eq!(remote.ip(), &PEER_IP);
                    announced = Some(conn);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        announced.is_some()
    });
    let conn = announced.unwrap();
    app.cmd(Command::Accept { conn, listener });
    (conn, listener)
}
