//! A listening port: SYNs become half-open connections, completed handshakes
//! wait in a bounded accept backlog (docs/design.md, "The runtime" →
//! Networking). Bounded so a SYN flood cannot grow memory without limit.
//!
//! The listener does not own the connections: the driver keeps them in its
//! socket table (so segments, timers and transmission work the same for every
//! connection) and tells the listener what happened to them by key (the
//! remote endpoint, as the local one is the listener's). The listener decides
//! admission and holds the order:
//! * [`Listener::on_syn`]: a SYN for a new remote. Beyond
//!   [`ListenConfig::half_open`] the **oldest** half-open connection is
//!   evicted to make room (the driver forgets it without a word, as its
//!   peer never completed the handshake). Under a flood of spoofed SYNs the
//!   flood's own entries are the oldest, so a genuine client's handshake
//!   still completes if its ACK comes back within the time the flood takes
//!   to send `half_open` SYNs; dropping new SYNs instead would shut genuine
//!   clients out until the flood's entries time out.
//! * [`Listener::established`]: the handshake completed; the connection
//!   moves to the backlog, or, when [`ListenConfig::backlog`] are already
//!   waiting, it is refused (the driver resets it) and counted.
//! * [`Listener::accept`] takes the oldest established connection.
//! * [`Listener::forget`]: a half-open or waiting connection ended.
//!
//! Two steps every driver takes the same way are here too:
//! [`Listener::admit_syn`] (a SYN's admission, then the passive open) and
//! [`Listener::step`] (after any change to a connection not accepted yet:
//! ended, still waiting, into the backlog, or refused).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;

use super::conn::{Connection, State, TcpConfig};
use super::table::FourTuple;
use super::{Instant, IsnGenerator, Segment};
use crate::Endpoint;

/// Bounds of one listening port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenConfig {
    /// Half-open connections (SYN received, handshake not complete) at most.
    pub half_open: usize,
    /// Established connections waiting for `accept` at most.
    pub backlog: usize,
}

impl Default for ListenConfig {
    /// Linux's defaults (`tcp_max_syn_backlog`, `somaxconn`) in spirit.
    fn default() -> Self {
        ListenConfig {
            half_open: 1024,
            backlog: 1024,
        }
    }
}

/// What to do with a SYN for a new remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission<K> {
    /// Make the connection; it is half-open.
    Admit,
    /// Make the connection, after forgetting this older half-open one.
    AdmitEvicting(K),
    /// This remote is already half-open or waiting (a retransmitted SYN:
    /// the driver's table has it) — nothing new to make.
    Known,
}

/// A SYN a listener admitted ([`Listener::admit_syn`]).
#[derive(Debug)]
pub struct Opened {
    /// The new connection, half-open (SYN-RECEIVED, its SYN-ACK to send):
    /// for the driver's table.
    pub tcb: Connection,
    /// An older half-open connection the SYN pushed out: the driver
    /// forgets it without a word.
    pub evicted: Option<FourTuple>,
}

/// Where a connection not accepted yet stands ([`Listener::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backlog {
    /// Still half-open, or already waiting in the backlog: nothing to do.
    Waiting,
    /// It ended (reset, timed out) and the listener forgot it: the driver
    /// drops its link to the listener.
    Ended,
    /// Its handshake just completed and it now waits for `accept`: the
    /// driver tells whoever accepts.
    Queued,
    /// Its handshake completed with the backlog full: the listener counted
    /// it and the connection is aborted (its RST is to send), so the peer
    /// learns at once rather than sending into a void.
    Refused,
}

/// What a listener has seen, for stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListenStats {
    pub syns: u64,
    /// Half-open connections evicted by newer SYNs.
    pub evicted: u64,
    /// Handshakes completed while the backlog was full (reset).
    pub overflows: u64,
    pub accepted: u64,
}

/// One listening port's half-open set and accept backlog, keyed by `K`
/// (the remote endpoint, for a driver).
#[derive(Debug)]
pub struct Listener<K> {
    config: ListenConfig,
    /// Admission order → key, oldest first; and key → admission order.
    half_open_order: BTreeMap<u64, K>,
    half_open: HashMap<K, u64>,
    next_order: u64,
    backlog: VecDeque<K>,
    stats: ListenStats,
}

impl<K: Copy + Eq + Hash> Listener<K> {
    /// A listener with `config`'s bounds (a bound of 0 is taken as 1).
    pub fn new(config: ListenConfig) -> Listener<K> {
        Listener {
            config: ListenConfig {
                half_open: config.half_open.max(1),
                backlog: config.backlog.max(1),
            },
            half_open_order: BTreeMap::new(),
            half_open: HashMap::new(),
            next_order: 0,
            backlog: VecDeque::new(),
            stats: ListenStats::default(),
        }
    }

    pub fn config(&self) -> ListenConfig {
        self.config
    }

    /// A SYN from `key`, which has no connection yet.
    pub fn on_syn(&mut self, key: K) -> Admission<K> {
        self.stats.syns += 1;
        if self.half_open.contains_key(&key) || self.backlog.contains(&key) {
            return Admission::Known;
        }
        let evicted = if self.half_open.len() >= self.config.half_open {
            self.half_open_order.pop_first().map(|(_, old)| {
                self.half_open.remove(&old);
                self.stats.evicted += 1;
                old
            })
        } else {
            None
        };
        let order = self.next_order;
        self.next_order += 1;
        self.half_open_order.insert(order, key);
        self.half_open.insert(key, order);
        match evicted {
            Some(old) => Admission::AdmitEvicting(old),
            None => Admission::Admit,
        }
    }

    /// `key`'s handshake completed: true if it now waits for `accept`;
    /// false if the backlog is full (the driver resets it; counted) or it
    /// was not half-open here.
    pub fn established(&mut self, key: K) -> bool {
        let Some(order) = self.half_open.remove(&key) else {
            return false;
        };
        self.half_open_order.remove(&order);
        if self.backlog.len() >= self.config.backlog {
            self.stats.overflows += 1;
            return false;
        }
        self.backlog.push_back(key);
        true
    }

    /// The oldest connection waiting for `accept`.
    pub fn accept(&mut self) -> Option<K> {
        let key = self.backlog.pop_front()?;
        self.stats.accepted += 1;
        Some(key)
    }

    /// `key` ended before it was accepted; true if it was here.
    pub fn forget(&mut self, key: K) -> bool {
        if let Some(order) = self.half_open.remove(&key) {
            self.half_open_order.remove(&order);
            return true;
        }
        let before = self.backlog.len();
        self.backlog.retain(|k| *k != key);
        self.backlog.len() != before
    }

    /// Whether `key` is half-open here.
    pub fn is_half_open(&self, key: K) -> bool {
        self.half_open.contains_key(&key)
    }

    pub fn half_open_len(&self) -> usize {
        self.half_open.len()
    }

    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// Takes every half-open and waiting key (the listener is closing: the
    /// driver resets them).
    pub fn drain(&mut self) -> Vec<K> {
        self.half_open.clear();
        let mut keys: Vec<K> = std::mem::take(&mut self.half_open_order)
            .into_values()
            .collect();
        keys.extend(self.backlog.drain(..));
        keys
    }

    pub fn stats(&self) -> ListenStats {
        self.stats
    }

    /// The backlog step, after any change to `tcb`, the connection of
    /// `key` that this listener admitted and nobody has accepted yet
    /// (`queued`: it waits in the backlog already).
    pub fn step(&mut self, key: K, tcb: &mut Connection, queued: bool) -> Backlog {
        if tcb.error().is_some() || tcb.state() == State::Closed {
            self.forget(key);
            return Backlog::Ended;
        }
        if queued || tcb.state() == State::SynReceived {
            return Backlog::Waiting;
        }
        if self.established(key) {
            Backlog::Queued
        } else {
            tcb.abort();
            Backlog::Refused
        }
    }
}

impl Listener<Endpoint> {
    /// A SYN for this listener's endpoint (`key.local`) from a remote with
    /// no connection ([`Demux::Listener`](super::Demux::Listener)): its
    /// admission, then the passive open with an RFC 6528 initial sequence
    /// number. `None` if the remote is half-open or waiting already (a
    /// retransmitted SYN: the driver's table has it, or another thread is
    /// making it right now).
    pub fn admit_syn(
        &mut self,
        key: FourTuple,
        syn: &Segment<'_>,
        config: &TcpConfig,
        isn: &IsnGenerator,
        now: Instant,
    ) -> Option<Opened> {
        let evicted = match self.on_syn(key.remote) {
            Admission::Known => return None,
            Admission::Admit => None,
            Admission::AdmitEvicting(old) => Some(FourTuple::new(key.local, old)),
        };
        let iss = isn.isn(key.local, key.remote, now);
        let tcb = Connection::accept(config, key.local, key.remote, syn, iss, now);
        Some(Opened { tcb, evicted })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(half_open: usize, backlog: usize) -> Listener<u32> {
        Listener::new(ListenConfig { half_open, backlog })
    }

    #[test]
    fn handshakes_complete_into_the_backlog_in_order() {
        let mut l = listener(4, 4);
        assert_eq!(l.on_syn(1), Admission::Admit);
        assert_eq!(l.on_syn(2), Admission::Admit);
        assert_eq!(l.on_syn(1), Admission::Known, "a retransmitted SYN");
        assert!(l.established(2));
        assert!(l.established(1));
        assert!(!l.established(3), "never half-open");
        assert_eq!(l.on_syn(2), Admission::Known, "waiting for accept");
        assert_eq!(
            (l.accept(), l.accept(), l.accept()),
            (Some(2), Some(1), None)
        );
        assert_eq!(l.stats().accepted, 2);
    }

    #[test]
    fn beyond_the_half_open_bound_the_oldest_is_evicted() {
        let mut l = listener(3, 4);
        for k in 0..3 {
            assert_eq!(l.on_syn(k), Admission::Admit);
        }
        assert!(l.forget(1));
        assert_eq!(l.on_syn(3), Admission::Admit, "1 left room");
        assert_eq!(l.on_syn(4), Admission::AdmitEvicting(0));
        assert_eq!(l.on_syn(5), Admission::AdmitEvicting(2));
        assert_eq!(l.half_open_len(), 3);
        assert!(!l.is_half_open(0) && l.is_half_open(3));
        assert_eq!(l.stats().evicted, 2);
    }

    #[test]
    fn a_full_backlog_refuses_and_counts() {
        let mut l = listener(8, 2);
        for k in 0..3 {
            l.on_syn(k);
        }
        assert!(l.established(0) && l.established(1));
        assert!(!l.established(2));
        assert_eq!(l.stats().overflows, 1);
        assert_eq!(
            l.half_open_len(),
            0,
            "the refused one is not half-open any more"
        );
        assert!(l.forget(0), "a waiting connection that was reset");
        assert_eq!(l.accept(), Some(1));
    }

    #[test]
    fn a_syn_flood_stays_within_the_bounds() {
        let mut l = listener(64, 16);
        l.on_syn(u32::MAX);
        assert!(l.established(u32::MAX));
        for k in 0..100_000 {
            l.on_syn(k);
            assert!(l.half_open_len() <= 64);
            assert_eq!(l.half_open_order.len(), l.half_open.len());
        }
        assert_eq!(l.accept(), Some(u32::MAX), "the established one survived");
        assert_eq!(l.stats().evicted, 100_000 - 64);
    }

    #[test]
    fn drain_gives_every_key_once() {
        let mut l = listener(4, 4);
        for k in 0..4 {
            l.on_syn(k);
        }
        l.established(2);
        let mut keys = l.drain();
        keys.sort();
        assert_eq!(keys, vec![0, 1, 2, 3]);
        assert_eq!((l.half_open_len(), l.backlog_len()), (0, 0));
    }

    mod driver_steps {
        use super::*;
        use crate::tcp::{Flags, Seq};
        use std::net::Ipv4Addr;

        const LOCAL: Endpoint = Endpoint::new(Ipv4Addr::new(10, 0, 0, 1), 80);

        fn remote(port: u16) -> Endpoint {
            Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), port)
        }

        fn syn() -> Segment<'static> {
            let mut s = Segment::new(Seq(7000));
            s.flags = Flags {
                syn: true,
                ..Flags::default()
            };
            s.window = 65535;
            s
        }

        /// The peer's ACK of our SYN-ACK: the handshake completes.
        fn ack_of(tcb: &mut Connection) -> Segment<'static> {
            let syn_ack = tcb.poll_transmit(Instant(0)).expect("a SYN-ACK");
            assert!(syn_ack.flags.syn);
            let mut ack = Segment::new(Seq(7001));
            ack.ack = Some(syn_ack.seq + 1u32);
            ack.window = 65535;
            ack
        }

        fn admit(l: &mut Listener<Endpoint>, port: u16) -> Option<Opened> {
            let isn = IsnGenerator::new();
            let key = FourTuple::new(LOCAL, remote(port));
            l.admit_syn(key, &syn(), &TcpConfig::default(), &isn, Instant(0))
        }

        #[test]
        fn an_admitted_syn_opens_a_half_open_connection_once() {
            let mut l = Listener::new(ListenConfig {
                half_open: 1,
                backlog: 4,
            });
            let first = admit(&mut l, 1000).expect("admitted");
            assert_eq!(first.tcb.state(), State::SynReceived);
            assert_eq!(
                (first.tcb.local(), first.tcb.remote()),
                (LOCAL, remote(1000))
            );
            assert_eq!(first.evicted, None);
            assert!(admit(&mut l, 1000).is_none(), "a retransmitted SYN");
            let second = admit(&mut l, 1001).expect("admitted");
            assert_eq!(
                second.evicted,
                Some(FourTuple::new(LOCAL, remote(1000))),
                "the oldest half-open one made room"
            );
        }

        #[test]
        fn the_backlog_step_queues_waits_ends_and_refuses() {
            let mut l = Listener::new(ListenConfig {
                half_open: 8,
                backlog: 1,
            });
            let mut a = admit(&mut l, 1).unwrap().tcb;
            let mut b = admit(&mut l, 2).unwrap().tcb;
            let mut c = admit(&mut l, 3).unwrap().tcb;
            assert_eq!(l.step(remote(1), &mut a, false), Backlog::Waiting);
            let ack = ack_of(&mut a);
            a.on_segment(&ack, Instant(1));
            assert_eq!(a.state(), State::Established);
            assert_eq!(l.step(remote(1), &mut a, false), Backlog::Queued);
            assert_eq!(l.step(remote(1), &mut a, true), Backlog::Waiting);
            // The backlog (1) is full: b is refused and aborted.
            let ack = ack_of(&mut b);
            b.on_segment(&ack, Instant(1));
            assert_eq!(l.step(remote(2), &mut b, false), Backlog::Refused);
            assert_eq!(b.state(), State::Closed);
            assert!(b.poll_transmit(Instant(1)).is_some_and(|s| s.flags.rst));
            assert_eq!(l.stats().overflows, 1);
            // A half-open one that ends is forgotten.
            c.abort();
            assert_eq!(l.step(remote(3), &mut c, false), Backlog::Ended);
            assert!(!l.is_half_open(remote(3)));
            // So is a waiting one.
            a.abort();
            assert_eq!(l.step(remote(1), &mut a, true), Backlog::Ended);
            assert_eq!(l.accept(), None);
        }
    }
}
