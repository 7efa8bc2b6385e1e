//! For the engine's unit tests: our address and a peer's, an application
//! attached by hand, frames from the peer and the segments the engine sent.

use std::net::Ipv4Addr;

use ginza_net::tcp::{Connection, Instant, Segment, Seq, TcpConfig};
use ginza_net::{parse, tx, Endpoint, Interface, MacAddr, Packet, MAX_FRAME_LEN};
use ginza_proto::netstack::{Command, Event};
use ginza_shm::netstack::{AppPair, Channel, TxPool, TxPoolView};

use super::{Attachment, Netstack};

pub(super) const US: Interface = Interface {
    mac: MacAddr([2, 0, 0, 0, 0, 2]),
    ip: Ipv4Addr::new(10, 0, 0, 2),
};
pub(super) const PEER: Interface = Interface {
    mac: MacAddr([2, 0, 0, 0, 0, 9]),
    ip: Ipv4Addr::new(10, 0, 0, 9),
};

/// An application attached by hand; the netstack's end is in `Netstack`.
pub(super) struct App {
    pub(super) id: u64,
    pub(super) pair: AppPair,
    _channel: Channel,
    _tx: TxPool,
}

/// What an application at `iface` with `kthreads` brings to attach, and
/// its tx pool.
pub(super) fn attachment(name: &str, iface: Interface, kthreads: u32) -> (Attachment, TxPool) {
    let tx = TxPool::create(name, 1 << 16).unwrap();
    let view = TxPoolView::map(tx.fd().try_clone_to_owned().unwrap()).unwrap();
    let a = Attachment {
        name: name.into(),
        pid: std::process::id() as i32,
        interface: iface,
        kthreads,
        tx_pool: view,
        doorbells: Vec::new(),
    };
    (a, tx)
}

impl App {
    pub(super) fn attach(ns: &mut Netstack, name: &str) -> App {
        let (a, tx) = attachment(name, US, 1);
        let g = ns.attach(a).unwrap();
        let channel = Channel::attach(g.channel).unwrap();
        App {
            id: g.app_id,
            pair: channel.app_pair(0).unwrap(),
            _channel: channel,
            _tx: tx,
        }
    }

    /// The events on the ring now.
    /// Listens on port 80 with `backlog` (cookie 1).
    pub(super) fn listen_on_80(&self, ns: &mut Netstack, backlog: u16) {
        let listen = Command::Listen {
            cookie: 1,
            port: 80,
            backlog,
        };
        ns.on_command(self.id, 0, listen);
    }

    pub(super) fn events(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(s) = self.pair.events.pop().unwrap() {
            out.push(Event::decode(&s).unwrap());
        }
        out
    }
}

/// A TCP client on the peer's side, at virtual time 0.
pub(super) fn client(port: u16, to: u16) -> Connection {
    Connection::connect(
        &TcpConfig::default(),
        Endpoint::new(PEER.ip, port),
        Endpoint::new(US.ip, to),
        Seq(5000),
        Instant(0),
    )
}

/// `seg` from the peer's `port` to our `to`, as a frame.
pub(super) fn frame_of(seg: &Segment<'_>, port: u16, to: u16) -> Vec<u8> {
    let mut b = vec![0u8; MAX_FRAME_LEN];
    let n = tx::tcp_segment(&mut b, &PEER, US.mac, port, Endpoint::new(US.ip, to), seg).unwrap();
    b.truncate(n);
    b
}

/// Every segment `from` wants to send, handed to the netstack.
pub(super) fn deliver(ns: &mut Netstack, from: &mut Connection) {
    let (port, to) = (from.local().port, from.remote().port);
    while let Some(seg) = from.poll_transmit(Instant(0)) {
        let f = frame_of(&seg, port, to);
        ns.on_frame(&f);
    }
}

/// The TCP segments the netstack sent (to whom, and the segment), and
/// the number of its other frames.
pub(super) fn sent(ns: &mut Netstack) -> (Vec<(Endpoint, Segment<'static>)>, usize) {
    let (mut tcp, mut other) = (Vec::new(), 0);
    while let Some(f) = ns.pop_frame() {
        match parse(&f.bytes, &PEER) {
            Ok(Packet::Tcp(t)) => tcp.push((t.dst, t.segment.to_owned_payload().0)),
            _ => other += 1,
        }
    }
    (tcp, other)
}
