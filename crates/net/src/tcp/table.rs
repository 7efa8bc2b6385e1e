//! The socket table a TCP driver keeps: connections by 4-tuple, listeners
//! by local endpoint, the choice of ephemeral ports, and where a received
//! segment goes ([`Table::demux`]). Generic over what it stores (the
//! runtime keeps `Arc`s of locked connections, the netstack slab handles),
//! so both drivers share it and it is tested without either.

use std::collections::HashMap;

use super::conn::reset_for;
use super::{Segment, TcpFrame};
use crate::Endpoint;
use std::net::Ipv4Addr;

/// The first port of the ephemeral range (IANA's dynamic ports,
/// 49152-65535) that `connect` and `listen` on port 0 pick from.
pub const EPHEMERAL_FIRST: u16 = 49152;

/// A connection's identity: our end and the peer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FourTuple {
    pub local: Endpoint,
    pub remote: Endpoint,
}

impl FourTuple {
    pub fn new(local: Endpoint, remote: Endpoint) -> FourTuple {
        FourTuple { local, remote }
    }

    /// The connection a received segment belongs to: its destination is
    /// our end.
    pub fn of(frame: &TcpFrame<'_>) -> FourTuple {
        FourTuple {
            local: frame.dst,
            remote: frame.src,
        }
    }
}

/// Where a received segment goes.
#[derive(Debug)]
pub enum Demux<C, L> {
    /// To the connection of its 4-tuple.
    Connection(C),
    /// A SYN (no ACK, no RST) for a listening endpoint, with no connection
    /// yet: the listener decides ([`Listener::admit_syn`]).
    ///
    /// [`Listener::admit_syn`]: super::Listener::admit_syn
    Listener(L),
    /// An ACK (no SYN, no RST) for a listening endpoint, with no
    /// connection: perhaps the end of a handshake answered with a SYN
    /// cookie. The listener checks it ([`Listener::admit_cookie`]); if it
    /// is none, it is answered as at a closed port
    /// ([`reset_for`](super::reset_for)).
    ///
    /// [`Listener::admit_cookie`]: super::Listener::admit_cookie
    ListenerAck(L),
    /// Nowhere (RFC 9293 §3.10.7.1, a closed port): answer with `reset`,
    /// unless the segment was itself a RST (`None`).
    NoSocket { reset: Option<Segment<'static>> },
}

impl<C: Clone, L: Clone> Demux<&C, &L> {
    /// The connection or listener cloned (a driver whose table is behind
    /// a lock keeps `Arc`s, and lets the lock go before acting).
    pub fn cloned(self) -> Demux<C, L> {
        match self {
            Demux::Connection(c) => Demux::Connection(c.clone()),
            Demux::Listener(l) => Demux::Listener(l.clone()),
            Demux::ListenerAck(l) => Demux::ListenerAck(l.clone()),
            Demux::NoSocket { reset } => Demux::NoSocket { reset },
        }
    }
}

/// Connections by 4-tuple, listeners by local endpoint.
#[derive(Debug)]
pub struct Table<C, L> {
    conns: HashMap<FourTuple, C>,
    listeners: HashMap<Endpoint, L>,
    /// Connections per local endpoint (an ephemeral port is free when none).
    port_use: HashMap<Endpoint, u32>,
    next_ephemeral: u16,
}

impl<C, L> Default for Table<C, L> {
    fn default() -> Self {
        Table::new()
    }
}

impl<C, L> Table<C, L> {
    pub fn new() -> Self {
        Table {
            conns: HashMap::new(),
            listeners: HashMap::new(),
            port_use: HashMap::new(),
            next_ephemeral: EPHEMERAL_FIRST,
        }
    }

    /// Where a segment for `key` goes: its connection, else (a SYN, or an
    /// ACK that may carry a SYN cookie) the listener on `key.local`, else
    /// nowhere, with the RST to answer.
    pub fn demux(&self, key: &FourTuple, segment: &Segment<'_>) -> Demux<&C, &L> {
        if let Some(c) = self.conns.get(key) {
            return Demux::Connection(c);
        }
        let flags = segment.flags;
        if !flags.rst {
            if let Some(l) = self.listeners.get(&key.local) {
                match (flags.syn, segment.ack.is_some()) {
                    (true, false) => return Demux::Listener(l),
                    (false, true) => return Demux::ListenerAck(l),
                    _ => {}
                }
            }
        }
        Demux::NoSocket {
            reset: reset_for(segment),
        }
    }

    pub fn get(&self, key: &FourTuple) -> Option<&C> {
        self.conns.get(key)
    }

    pub fn contains(&self, key: &FourTuple) -> bool {
        self.conns.contains_key(key)
    }

    /// Adds a connection; `false` (and nothing changed) if the 4-tuple is
    /// taken.
    pub fn insert(&mut self, key: FourTuple, conn: C) -> bool {
        if self.conns.contains_key(&key) {
            return false;
        }
        self.conns.insert(key, conn);
        *self.port_use.entry(key.local).or_default() += 1;
        true
    }

    pub fn remove(&mut self, key: &FourTuple) -> Option<C> {
        let conn = self.conns.remove(key)?;
        if let Some(n) = self.port_use.get_mut(&key.local) {
            *n -= 1;
            if *n == 0 {
                self.port_use.remove(&key.local);
            }
        }
        Some(conn)
    }

    /// Connections in the table.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn conns(&self) -> impl Iterator<Item = &C> {
        self.conns.values()
    }

    pub fn listener(&self, local: &Endpoint) -> Option<&L> {
        self.listeners.get(local)
    }

    pub fn is_listening(&self, local: &Endpoint) -> bool {
        self.listeners.contains_key(local)
    }

    /// Makes `local` a listening endpoint; gives `listener` back if it is
    /// one already. Connections on it do not count (as with
    /// `SO_REUSEADDR`, which std sets on Unix).
    pub fn listen(&mut self, local: Endpoint, listener: L) -> Result<(), L> {
        if self.listeners.contains_key(&local) {
            return Err(listener);
        }
        self.listeners.insert(local, listener);
        Ok(())
    }

    /// Stops listening on `local` if `is_it` says the listener there is
    /// the one closing.
    pub fn unlisten(&mut self, local: &Endpoint, is_it: impl FnOnce(&L) -> bool) -> Option<L> {
        if self.listeners.get(local).is_some_and(is_it) {
            return self.listeners.remove(local);
        }
        None
    }

    /// A port of `local_ip` for a connection to `remote`: an ephemeral one
    /// that no listener and no connection uses, or, when all are used, one
    /// whose 4-tuple with `remote` is still free; `None` when none is.
    /// Picked round-robin, so a port just freed is not reused at once (its
    /// old connection's segments may still be about).
    pub fn ephemeral_port(&mut self, local_ip: Ipv4Addr, remote: Endpoint) -> Option<u16> {
        let n = u32::from(u16::MAX - EPHEMERAL_FIRST) + 1;
        let start = u32::from(self.next_ephemeral - EPHEMERAL_FIRST);
        let candidates = (0..n).map(|i| EPHEMERAL_FIRST + ((start + i) % n) as u16);
        let at = |p| Endpoint::new(local_ip, p);
        let unused = candidates
            .clone()
            .find(|&p| !self.listeners.contains_key(&at(p)) && !self.port_use.contains_key(&at(p)));
        let port = unused.or_else(|| {
            candidates.clone().find(|&p| {
                !self.listeners.contains_key(&at(p))
                    && !self.conns.contains_key(&FourTuple::new(at(p), remote))
            })
        })?;
        self.next_ephemeral = port.checked_add(1).unwrap_or(EPHEMERAL_FIRST);
        Some(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::{Flags, Seq};

    const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    fn key(local: u16, remote_port: u16) -> FourTuple {
        FourTuple::new(
            Endpoint::new(US, local),
            Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), remote_port),
        )
    }

    fn segment(flags: Flags, ack: Option<Seq>) -> Segment<'static> {
        let mut s = Segment::new(Seq(1000));
        s.flags = flags;
        s.ack = ack;
        s
    }

    fn syn() -> Flags {
        Flags {
            syn: true,
            ..Flags::default()
        }
    }

    #[test]
    fn connections_are_found_by_their_four_tuple() {
        let mut t: Table<u32, ()> = Table::new();
        assert!(t.insert(key(80, 1000), 1));
        assert!(t.insert(key(80, 1001), 2));
        assert!(!t.insert(key(80, 1000), 3), "a 4-tuple is taken once");
        assert_eq!(t.get(&key(80, 1000)), Some(&1));
        assert_eq!(t.get(&key(81, 1000)), None);
        assert_eq!(t.remove(&key(80, 1000)), Some(1));
        assert_eq!(t.remove(&key(80, 1000)), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn an_endpoint_listens_once() {
        let mut t: Table<(), u32> = Table::new();
        let at = Endpoint::new(US, 80);
        t.listen(at, 1).unwrap();
        assert_eq!(t.listen(at, 2), Err(2));
        assert_eq!(t.unlisten(&at, |l| *l == 2), None, "not the one listening");
        assert_eq!(t.unlisten(&at, |l| *l == 1), Some(1));
        t.listen(at, 2).unwrap();
        assert_eq!(t.listener(&at), Some(&2));
        let elsewhere = Endpoint::new(Ipv4Addr::new(10, 0, 0, 9), 80);
        t.listen(elsewhere, 3).unwrap();
        assert_eq!(t.listener(&elsewhere), Some(&3), "another address");
    }

    #[test]
    fn a_segment_goes_to_its_connection_then_a_listener_else_is_reset() {
        let mut t: Table<u32, &str> = Table::new();
        t.listen(Endpoint::new(US, 80), "web").unwrap();
        t.insert(key(80, 1000), 7);
        let ack = segment(Flags::default(), Some(Seq(5)));
        assert!(matches!(
            t.demux(&key(80, 1000), &ack),
            Demux::Connection(7)
        ));
        assert!(matches!(
            t.demux(&key(80, 1001), &segment(syn(), None)),
            Demux::Listener(&"web")
        ));
        // An ACK for the listener: perhaps a SYN cookie returning.
        assert!(matches!(
            t.demux(&key(80, 1001), &ack),
            Demux::ListenerAck(&"web")
        ));
        // A stray ACK for a port nobody listens on is answered with a RST
        // at its acknowledgement number.
        let Demux::NoSocket { reset: Some(rst) } = t.demux(&key(81, 1001), &ack) else {
            panic!("a reset");
        };
        assert!(rst.flags.rst && rst.seq == Seq(5));
        // A SYN-ACK or a SYN with RST is not a new connection.
        let syn_ack = segment(syn(), Some(Seq(1)));
        assert!(matches!(
            t.demux(&key(80, 1001), &syn_ack),
            Demux::NoSocket { reset: Some(_) }
        ));
        let rst = segment(
            Flags {
                syn: true,
                rst: true,
                ..Flags::default()
            },
            None,
        );
        assert!(matches!(
            t.demux(&key(80, 1001), &rst),
            Demux::NoSocket { reset: None }
        ));
        // A SYN for a port nobody listens on.
        assert!(matches!(
            t.demux(&key(81, 1001), &segment(syn(), None)),
            Demux::NoSocket { reset: Some(_) }
        ));
    }

    #[test]
    fn ephemeral_ports_skip_used_ones_and_wrap() {
        let mut t: Table<(), ()> = Table::new();
        let remote = key(0, 7).remote;
        t.listen(Endpoint::new(US, EPHEMERAL_FIRST), ()).unwrap();
        t.insert(key(EPHEMERAL_FIRST + 1, 9), ());
        assert_eq!(t.ephemeral_port(US, remote), Some(EPHEMERAL_FIRST + 2));
        assert_eq!(t.ephemeral_port(US, remote), Some(EPHEMERAL_FIRST + 3));
        t.next_ephemeral = u16::MAX;
        assert_eq!(t.ephemeral_port(US, remote), Some(u16::MAX));
        assert_eq!(
            t.ephemeral_port(US, remote),
            Some(EPHEMERAL_FIRST + 2),
            "wrapped"
        );
    }

    #[test]
    fn ports_are_counted_per_local_address() {
        let mut t: Table<(), ()> = Table::new();
        let other_ip = Ipv4Addr::new(10, 0, 0, 9);
        t.listen(Endpoint::new(other_ip, EPHEMERAL_FIRST), ())
            .unwrap();
        t.insert(
            FourTuple::new(
                Endpoint::new(other_ip, EPHEMERAL_FIRST + 1),
                key(0, 7).remote,
            ),
            (),
        );
        assert_eq!(
            t.ephemeral_port(US, key(0, 7).remote),
            Some(EPHEMERAL_FIRST),
            "another address's listener and connection leave US's ports free"
        );
    }

    #[test]
    fn with_every_ephemeral_port_used_a_free_four_tuple_is_reused() {
        let mut t: Table<(), ()> = Table::new();
        for p in EPHEMERAL_FIRST..=u16::MAX {
            assert!(t.insert(key(p, 7), ()));
        }
        let other = key(0, 8).remote;
        let p = t.ephemeral_port(US, other).unwrap();
        assert!(t.insert(FourTuple::new(Endpoint::new(US, p), other), ()));
        let same = key(0, 7).remote;
        assert_eq!(t.ephemeral_port(US, same), None);
    }
}
