//! Target `netstack`: an application's command ring into the protected
//! netstack (`ginza_netstack::Netstack`), everything on it untrusted:
//! commands built right with any ids, ranges and ports (ids the netstack
//! handed out, and others), the same with one word changed, and raw slots;
//! beside them peers that connect and send, and raw frames. A second
//! application shares the netstack, to show that one's garbage does not
//! reach the other.
//!
//! Checked: no panic; every event decodes and names ranges inside its
//! pool; the bytes `new_data` names are the peer's, in order; every frame
//! the netstack sends parses (zero-touch frames once assembled from the tx
//! pool, which their gather lists must lie in); an application cut off
//! gets `disconnected` and is detached; the connections stay within the
//! limit, and detaching both applications leaves none.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use arbitrary::{Arbitrary, Unstructured};
use ginza_net::tcp::{Connection, Instant, Seq, TcpConfig};
use ginza_net::{parse, tx, Endpoint, Interface, MacAddr, Packet, MAX_FRAME_LEN};
use ginza_netstack::{Attachment, Netstack, NetstackConfig, OutFrame};
use ginza_proto::netstack::{Command, ConnId, Event, ListenId, Ranges, SendFlags};
use ginza_shm::netstack::{
    assemble, AppPair, Channel, Range, RxPoolView, Slot, TxPool, TxPoolView, SLOT_WORDS,
};

use super::{describe, List, Outcome};

const US: Interface = Interface {
    mac: MacAddr([2, 0, 0, 0, 0, 2]),
    ip: Ipv4Addr::new(10, 0, 0, 2),
};
const OTHER: Interface = Interface {
    mac: MacAddr([2, 0, 0, 0, 0, 3]),
    ip: Ipv4Addr::new(10, 0, 0, 3),
};
const PEER: Interface = Interface {
    mac: MacAddr([2, 0, 0, 0, 0, 9]),
    ip: Ipv4Addr::new(10, 0, 0, 9),
};
const TX_POOL: u64 = 1 << 14;
const RX_CHUNKS: u32 = 8;
const MAX_CONNECTIONS: u32 = 8;

#[derive(Debug, Arbitrary)]
struct Input {
    kthreads: bool,
    zero_touch: bool,
    ops: List<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    /// A command of application `app % 2` on ring pair `pair`.
    Command {
        app: u8,
        pair: u8,
        cmd: Cmd,
    },
    /// The same, one word then changed.
    Mangled {
        app: u8,
        cmd: Cmd,
        word: u8,
        value: u32,
    },
    /// Any slot.
    Raw {
        app: u8,
        words: [u32; SLOT_WORDS],
    },
    /// A peer connects to one of our ports.
    PeerConnect {
        port: u8,
    },
    PeerSend {
        peer: u8,
        len: u16,
    },
    PeerClose {
        peer: u8,
    },
    PeerAbort {
        peer: u8,
    },
    /// Any frame to our address.
    Frame(List<u8>),
    /// The application hangs up (then attaches again).
    Reattach {
        app: u8,
    },
}

/// A command, its ids picked from those the application was given (or
/// any).
#[derive(Debug, Arbitrary)]
enum Cmd {
    Listen {
        cookie: u32,
        port: u8,
        backlog: u16,
    },
    Accept {
        conn: Id,
        listener: Id,
    },
    Connect {
        cookie: u32,
        to_peer: bool,
        port: u16,
    },
    Send {
        conn: Id,
        ranges: List<(u16, u16)>,
        more: bool,
    },
    /// Give back what `new_data` lent (`honest`), or made-up ranges.
    RecvDone {
        conn: Id,
        honest: bool,
        ranges: List<(u16, u16)>,
    },
    Shutdown {
        conn: Id,
    },
    Close {
        conn: Id,
    },
    Unlisten {
        listener: Id,
    },
}

#[derive(Debug, Arbitrary)]
enum Id {
    Known(u8),
    Any(u32),
}

/// The ports peers connect to: the first few (applications listen there).
fn port(p: u8) -> u16 {
    80 + u16::from(p % 4)
}

/// The peer's byte at stream offset `i` of the connection from `port`.
fn peer_byte(port: u16, i: u64) -> u8 {
    (i.wrapping_mul(31).wrapping_add(u64::from(port) * 7) % 251) as u8
}

/// One attached application, as seen from its side.
struct App {
    id: u64,
    pairs: Vec<AppPair>,
    _channel: Channel,
    tx: TxPool,
    rx: RxPoolView,
    conns: Vec<u32>,
    listeners: Vec<u32>,
    /// Per connection: the peer's port, the stream offset read, and the
    /// ranges lent and not given back.
    streams: HashMap<u32, (u16, u64, Vec<Range>)>,
    disconnected: bool,
}

fn attach(ns: &mut Netstack, name: &str, iface: Interface, kthreads: u32) -> App {
    let mut tx = TxPool::create(name, TX_POOL).expect("tx pool");
    // The application's payload: a function of the offset.
    static PAYLOAD: std::sync::LazyLock<Vec<u8>> =
        std::sync::LazyLock::new(|| (0..TX_POOL).map(|i| (i % 253) as u8).collect());
    let all = tx
        .get_mut(Range::new(0, TX_POOL as u32))
        .expect("whole pool");
    all.copy_from_slice(&PAYLOAD);
    let view = TxPoolView::map(tx.fd().try_clone_to_owned().expect("dup")).expect("tx view");
    let g = ns
        .attach(Attachment {
            name: name.into(),
            pid: std::process::id() as i32,
            interface: iface,
            kthreads,
            tx_pool: view,
            doorbells: Vec::new(),
        })
        .expect("attach");
    let channel = Channel::attach(g.channel).expect("channel");
    let pairs = (0..g.pairs)
        .map(|p| channel.app_pair(p).expect("pair"))
        .collect();
    let rx = RxPoolView::map(g.rx_pool, g.rx_pool_bytes).expect("rx view");
    App {
        id: g.app_id,
        pairs,
        _channel: channel,
        tx,
        rx,
        conns: Vec::new(),
        listeners: Vec::new(),
        streams: HashMap::new(),
        disconnected: false,
    }
}

fn pick(id: &Id, known: &[u32]) -> u32 {
    match id {
        Id::Known(i) if !known.is_empty() => known[usize::from(*i) % known.len()],
        Id::Known(i) => u32::from(*i),
        Id::Any(v) => *v,
    }
}

fn ranges(rs: &[(u16, u16)]) -> Option<Ranges> {
    let v: Vec<Range> = rs
        .iter()
        .take(6)
        .map(|&(o, l)| Range::new(u32::from(o), u32::from(l).max(1)))
        .collect();
    Ranges::from_slice(&v)
}

/// The slot of `cmd` from `app`, if it makes one.
fn slot(cmd: &Cmd, app: &App) -> Option<Slot> {
    let conn = |id: &Id| ConnId::new(pick(id, &app.conns));
    let listener = |id: &Id| ListenId::new(pick(id, &app.listeners));
    let c = match cmd {
        Cmd::Listen {
            cookie,
            port: p,
            backlog,
        } => Command::Listen {
            cookie: *cookie,
            port: port(*p),
            backlog: *backlog,
        },
        Cmd::Accept {
            conn: c,
            listener: l,
        } => Command::Accept {
            conn: conn(c)?,
            listener: listener(l)?,
        },
        Cmd::Connect {
            cookie,
            to_peer,
            port,
        } => Command::Connect {
            cookie: *cookie,
            remote: SocketAddrV4::new(
                if *to_peer {
                    PEER.ip
                } else {
                    Ipv4Addr::new(10, 9, 9, 9)
                },
                (*port).max(1),
            ),
        },
        Cmd::Send {
            conn: c,
            ranges: rs,
            more,
        } => Command::Send {
            conn: conn(c)?,
            ranges: ranges(rs)?,
            flags: SendFlags { more: *more },
        },
        Cmd::RecvDone {
            conn: c,
            honest,
            ranges: rs,
        } => {
            let id = conn(c)?;
            let lent = app.streams.get(&id.get()).map(|s| &s.2);
            let rs = match lent {
                Some(l) if *honest && !l.is_empty() => Ranges::from_slice(&l[..l.len().min(6)])?,
                _ => ranges(rs)?,
            };
            Command::RecvDone {
                conn: id,
                ranges: rs,
            }
        }
        Cmd::Shutdown { conn: c } => Command::Shutdown { conn: conn(c)? },
        Cmd::Close { conn: c } => Command::Close { conn: conn(c)? },
        Cmd::Unlisten { listener: l } => Command::Unlisten {
            listener: listener(l)?,
        },
    };
    Some(c.encode())
}

/// Peers: TCP clients on the other end of the wire.
struct Peer {
    conn: Connection,
    sent: u64,
}

struct World {
    ns: Netstack,
    apps: [App; 2],
    peers: Vec<Peer>,
    tx_views: [TxPoolView; 2],
    next_port: u16,
    frames_out: u64,
}

impl World {
    fn push(&mut self, a: usize, pair: usize, s: Slot) {
        let app = &mut self.apps[a];
        let p = pair % app.pairs.len();
        // A full ring is back-pressure: the slot is not sent.
        let _ = app.pairs[p].commands.push(s);
    }

    /// Polls the netstack and moves everything until nothing moves.
    fn settle(&mut self) {
        for _ in 0..64 {
            self.ns.poll();
            for (id, why) in self.ns.take_doomed() {
                let a = self
                    .apps
                    .iter()
                    .position(|a| a.id == id)
                    .expect("a known app");
                assert!(!why.is_empty(), "cut off without a reason");
                self.events(a);
                assert!(self.apps[a].disconnected, "cut off without `disconnected`");
            }
            self.events(0);
            self.events(1);
            let moved = self.frames();
            if !moved {
                break;
            }
        }
        assert!(self.ns.stats().connections <= u64::from(MAX_CONNECTIONS));
    }

    /// The application's events: each decodes and makes sense.
    fn events(&mut self, a: usize) {
        let app = &mut self.apps[a];
        for p in 0..app.pairs.len() {
            loop {
                let slot = match app.pairs[p].events.pop() {
                    Ok(Some(s)) => s,
                    Ok(None) => break,
                    Err(e) => panic!("the netstack corrupted an event ring: {e:?}"),
                };
                let ev = Event::decode(&slot).unwrap_or_else(|e| {
                    panic!("the netstack wrote an undecodable event: {e} ({slot:?})")
                });
                assert!(!app.disconnected, "an event after `disconnected`: {ev:?}");
                on_event(app, ev);
            }
        }
    }

    /// Frames out to the peers, the peers' answers back in. Whether any
    /// frame moved.
    fn frames(&mut self) -> bool {
        let mut moved = false;
        while let Some(f) = self.ns.pop_frame() {
            moved = true;
            self.frames_out += 1;
            let bytes = self.assemble(f);
            // To the peer, or (an ARP request, a SYN) to an address the
            // application named: it parses there.
            let packet = match parse(&bytes, &PEER) {
                Err(ginza_net::Drop::NotOurIp { dst }) => {
                    parse(&bytes, &Interface { ip: dst, ..PEER })
                }
                p => p,
            }
            .unwrap_or_else(|d| panic!("the netstack sent a frame that does not parse: {d}"));
            if let Packet::Tcp(t) = packet {
                if let Some(peer) = self
                    .peers
                    .iter_mut()
                    .find(|p| p.conn.local().port == t.dst.port && p.conn.remote() == t.src)
                {
                    peer.conn.on_segment(&t.segment, Instant(0));
                }
            }
        }
        for i in 0..self.peers.len() {
            let (port, to) = (self.peers[i].conn.local().port, self.peers[i].conn.remote());
            let mut out = Vec::new();
            while let Some(s) = self.peers[i].conn.poll_transmit(Instant(0)) {
                let mut b = vec![0u8; MAX_FRAME_LEN];
                let n = tx::tcp_segment(&mut b, &PEER, US.mac, port, to, &s).expect("fits");
                b.truncate(n);
                out.push(b);
                assert!(out.len() < 10_000, "a peer never stops sending");
            }
            for f in out {
                moved = true;
                self.ns.on_frame(&f);
            }
        }
        moved
    }

    /// A frame as iokerneld would send it: zero-touch ones assembled from
    /// the application's tx pool, their checksum filled.
    fn assemble(&self, f: OutFrame) -> Vec<u8> {
        let Some(list) = &f.gather else {
            return f.bytes;
        };
        let mut out = vec![0u8; MAX_FRAME_LEN];
        let n = self
            .tx_views
            .iter()
            .find_map(|v| assemble(&f.bytes, list, v, &mut out).ok())
            .unwrap_or_else(|| panic!("a gather list outside the tx pools: {list:?}"));
        out.truncate(n);
        if f.fill_checksum {
            super::frames::fix(&mut out);
        }
        out
    }
}

fn on_event(app: &mut App, ev: Event) {
    let rx_len = app.rx.len();
    match ev {
        Event::Listening { listener, .. } => app.listeners.push(listener.get()),
        Event::NewConn { conn, remote, .. } => {
            assert_eq!(*remote.ip(), PEER.ip, "a connection from nowhere");
            app.conns.push(conn.get());
            app.streams
                .insert(conn.get(), (remote.port(), 0, Vec::new()));
        }
        Event::Connected { conn, .. } => app.conns.push(conn.get()),
        Event::NewData { conn, ranges } => {
            let stream = app
                .streams
                .get_mut(&conn.get())
                .unwrap_or_else(|| panic!("new_data for connection {conn:?} never announced"));
            for r in ranges.as_slice() {
                assert!(r.end() <= rx_len, "new_data range {r:?} beyond the rx pool");
                let bytes = app.rx.get(*r).expect("inside the pool");
                for (k, b) in bytes.iter().enumerate() {
                    let want = peer_byte(stream.0, stream.1 + k as u64);
                    assert_eq!(
                        *b,
                        want,
                        "received byte {} is not the peer's",
                        stream.1 + k as u64
                    );
                }
                stream.1 += u64::from(r.len);
                stream.2.push(*r);
            }
        }
        Event::DataAcked { ranges, .. } => {
            for r in ranges.as_slice() {
                assert!(
                    r.end() <= TX_POOL,
                    "data_acked range {r:?} beyond the tx pool"
                );
            }
        }
        Event::Cleanup { conn } => {
            app.conns.retain(|&c| c != conn.get());
            app.streams.remove(&conn.get());
        }
        Event::RemoteClosed { .. } | Event::Refused { .. } => {}
        Event::Disconnected { .. } => app.disconnected = true,
    }
}

/// Taking back what `recv_done` returned: the ranges the application no
/// longer holds.
fn returned(app: &mut App, cmd: &Cmd) {
    if let Cmd::RecvDone {
        conn, honest: true, ..
    } = cmd
    {
        let id = pick(conn, &app.conns);
        if let Some(s) = app.streams.get_mut(&id) {
            let n = s.2.len().min(6);
            s.2.drain(..n);
        }
    }
}

fn small_tcp() -> TcpConfig {
    TcpConfig {
        mss: 536,
        recv_buffer: 4096,
        send_buffer: 4096,
        reassembly_limit: 4096,
        ..TcpConfig::default()
    }
}

pub(super) fn case(u: &mut Unstructured<'_>, out: &mut Option<String>) -> Outcome {
    let Ok(input) = Input::arbitrary(u) else {
        return "no-input".into();
    };
    describe(out, &input);
    let mut ns = Netstack::new(NetstackConfig {
        tcp: small_tcp(),
        ring_capacity: 16,
        rx_chunks: RX_CHUNKS,
        send_queue_bytes: 8192,
        max_connections: MAX_CONNECTIONS,
        max_pairs: 2,
        command_budget: 8,
        max_backlog: 4,
        static_arp: vec![(PEER.ip, PEER.mac)],
    });
    let kthreads = if input.kthreads { 2 } else { 1 };
    let a = attach(&mut ns, "ginza-fuzz-a", US, kthreads);
    let b = attach(&mut ns, "ginza-fuzz-b", OTHER, 1);
    if input.zero_touch {
        ns.set_zero_touch(a.id);
    }
    let view = |app: &App| TxPoolView::map(app.tx.fd().try_clone_to_owned().expect("dup"));
    let tx_views = [view(&a).expect("view"), view(&b).expect("view")];
    let mut w = World {
        ns,
        apps: [a, b],
        peers: Vec::new(),
        tx_views,
        next_port: 40000,
        frames_out: 0,
    };
    for op in &input.ops {
        step(&mut w, op);
        w.settle();
    }
    let cut_off = w.apps.iter().filter(|a| a.disconnected).count();
    let conns = w.ns.stats().connections;
    let (ida, idb) = (w.apps[0].id, w.apps[1].id);
    w.ns.detach(ida);
    w.ns.detach(idb);
    assert_eq!(w.ns.stats().apps, 0);
    // TIME-WAIT connections outlive their application; nothing else does.
    assert!(
        w.ns.stats().connections <= conns,
        "detaching made connections"
    );
    format!(
        "{} conns, {} cut off, frames {}",
        conns.min(3),
        cut_off,
        if w.frames_out > 0 { "out" } else { "none" }
    )
    .into()
}

fn step(w: &mut World, op: &Op) {
    match op {
        Op::Command { app, pair, cmd } => {
            let a = usize::from(*app % 2);
            if let Some(s) = slot(cmd, &w.apps[a]) {
                w.push(a, usize::from(*pair), s);
                returned(&mut w.apps[a], cmd);
            }
        }
        Op::Mangled {
            app,
            cmd,
            word,
            value,
        } => {
            let a = usize::from(*app % 2);
            if let Some(mut s) = slot(cmd, &w.apps[a]) {
                s.words[usize::from(*word) % SLOT_WORDS] = *value;
                round_trip(&s);
                w.push(a, 0, s);
            }
        }
        Op::Raw { app, words } => {
            let a = usize::from(*app % 2);
            let s = Slot { words: *words };
            round_trip(&s);
            w.push(a, 0, s);
        }
        Op::PeerConnect { port: p } => {
            if w.peers.len() < 6 {
                w.next_port += 1;
                let conn = Connection::connect(
                    &small_tcp(),
                    Endpoint::new(PEER.ip, w.next_port),
                    Endpoint::new(US.ip, port(*p)),
                    Seq(u32::from(w.next_port) << 16),
                    Instant(0),
                );
                w.peers.push(Peer { conn, sent: 0 });
            }
        }
        Op::PeerSend { peer, len } => {
            if let Some(pe) = nth(&mut w.peers, *peer) {
                let port = pe.conn.local().port;
                let data: Vec<u8> = (0..u64::from(*len % 3000))
                    .map(|i| peer_byte(port, pe.sent + i))
                    .collect();
                if let Ok(n) = pe.conn.send(&data) {
                    pe.sent += n as u64;
                }
            }
        }
        Op::PeerClose { peer } => {
            if let Some(pe) = nth(&mut w.peers, *peer) {
                pe.conn.shutdown();
            }
        }
        Op::PeerAbort { peer } => {
            if let Some(pe) = nth(&mut w.peers, *peer) {
                pe.conn.abort();
            }
        }
        Op::Frame(bytes) => {
            let mut f = bytes.to_vec();
            // Addressed to us, so that it gets past the first check.
            if f.len() >= 14 {
                f[..6].copy_from_slice(&US.mac.0);
            }
            if f.len() >= 34 {
                f[30..34].copy_from_slice(&US.ip.octets());
                super::frames::fix(&mut f);
            }
            w.ns.on_frame(&f);
        }
        Op::Reattach { app } => {
            let a = usize::from(*app % 2);
            let old = w.apps[a].id;
            w.ns.detach(old);
            let (name, iface) = if a == 0 {
                ("ginza-fuzz-a", US)
            } else {
                ("ginza-fuzz-b", OTHER)
            };
            w.apps[a] = attach(&mut w.ns, name, iface, 1);
            w.tx_views[a] = TxPoolView::map(w.apps[a].tx.fd().try_clone_to_owned().expect("dup"))
                .expect("view");
        }
    }
}

/// A slot that decodes is the encoding of what it decodes to (every word
/// a message does not use must be zero: no two slots mean the same).
fn round_trip(s: &Slot) {
    if let Ok(c) = Command::decode(s) {
        assert_eq!(c.encode(), *s, "{c:?} re-encodes to another slot");
    }
    if let Ok(e) = Event::decode(s) {
        assert_eq!(e.encode(), *s, "{e:?} re-encodes to another slot");
    }
}

fn nth(peers: &mut [Peer], i: u8) -> Option<&mut Peer> {
    if peers.is_empty() {
        return None;
    }
    let n = peers.len();
    peers.get_mut(usize::from(i) % n)
}
