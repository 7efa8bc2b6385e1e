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
//!   [`ListenConfig::half_open`], with [`ListenConfig::syn_cookies`] on
//!   (the default), the SYN is answered with a SYN cookie and nothing is
//!   kept ([`SynAnswer::Cookie`]); the peer's ACK brings the cookie back
//!   and [`Listener::admit_cookie`] makes the connection then. So genuine
//!   clients are served during a flood of spoofed SYNs however fast it
//!   comes, as on Linux with `tcp_syncookies=1`. With cookies off, the
//!   **oldest** half-open connection is evicted to make room (the driver
//!   forgets it without a word): a genuine client's handshake then
//!   completes only if its ACK comes back within the time the flood takes
//!   to send `half_open` SYNs.
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
use super::syncookie::{SynCookies, MAX_AGE, TICK};
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
    /// With the half-open set full, answer SYNs with SYN cookies (on by
    /// default, as Linux's `tcp_syncookies=1`); off: evict the oldest
    /// half-open connection.
    pub syn_cookies: bool,
}

impl Default for ListenConfig {
    /// Linux's defaults (`tcp_max_syn_backlog`, `somaxconn`) in spirit.
    fn default() -> Self {
        ListenConfig {
            half_open: 1024,
            backlog: 1024,
            syn_cookies: true,
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
    /// The half-open set is full: answer with a SYN cookie, keep nothing.
    Cookie,
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

/// A listener's answer to a SYN ([`Listener::admit_syn`]).
// The connection moves at once into the driver's table; boxing it would
// cost an allocation per connection for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum SynAnswer {
    /// Admitted: a half-open connection.
    Opened(Opened),
    /// The half-open set is full: send this SYN-ACK, whose initial sequence
    /// number is a SYN cookie, to the SYN's source, and keep nothing.
    Cookie(Segment<'static>),
    /// The remote is half-open or waiting already (a retransmitted SYN:
    /// the driver's table has it, or another thread is making it right
    /// now): nothing to do.
    Known,
}

/// A listener's answer to an ACK for a remote with no connection
/// ([`Listener::admit_cookie`]).
// The connection moves at once into the driver's table; boxing it would
// cost an allocation per connection for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum CookieAnswer {
    /// Its SYN cookie checked: the connection, ESTABLISHED, half-open here
    /// until the next [`Listener::step`] queues it.
    Opened(Connection),
    /// The remote is half-open or waiting here already: its connection is
    /// being made by another thread right now (the driver finds it in its
    /// table, or drops the segment; the peer sends it again).
    Known,
    /// Not a cookie of ours (none out, or it did not check): answer as a
    /// closed port would ([`reset_for`](super::reset_for)).
    NotACookie,
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
    /// SYNs answered with a SYN cookie (the half-open set full).
    pub cookies_sent: u64,
    /// ACKs whose cookie checked: connections made from them.
    pub cookies_accepted: u64,
    /// ACKs to the listener, while cookies were out, whose cookie did not
    /// check (forged, expired, or a stray segment): answered with a RST.
    pub cookies_rejected: u64,
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
    /// When the last SYN cookie was sent: ACKs are checked as cookies only
    /// while one may still be valid.
    last_cookie: Option<Instant>,
    stats: ListenStats,
}

impl<K: Copy + Eq + Hash> Listener<K> {
    /// A listener with `config`'s bounds (a bound of 0 is taken as 1).
    pub fn new(config: ListenConfig) -> Listener<K> {
        Listener {
            config: ListenConfig {
                half_open: config.half_open.max(1),
                backlog: config.backlog.max(1),
                syn_cookies: config.syn_cookies,
            },
            half_open_order: BTreeMap::new(),
            half_open: HashMap::new(),
            next_order: 0,
            backlog: VecDeque::new(),
            last_cookie: None,
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
        let full = self.half_open.len() >= self.config.half_open;
        if full && self.config.syn_cookies {
            return Admission::Cookie;
        }
        let evicted = if full {
            self.half_open_order.pop_first().map(|(_, old)| {
                self.half_open.remove(&old);
                self.stats.evicted += 1;
                old
            })
        } else {
            None
        };
        self.add_half_open(key);
        match evicted {
            Some(old) => Admission::AdmitEvicting(old),
            None => Admission::Admit,
        }
    }

    /// Takes `key` into the half-open set (no bound: it leaves it at the
    /// next [`Listener::step`]).
    fn add_half_open(&mut self, key: K) {
        let order = self.next_order;
        self.next_order += 1;
        self.half_open_order.insert(order, key);
        self.half_open.insert(key, order);
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
    /// number, or, with the half-open set full, a SYN-ACK carrying a SYN
    /// cookie and no state.
    pub fn admit_syn(
        &mut self,
        key: FourTuple,
        syn: &Segment<'_>,
        config: &TcpConfig,
        isn: &IsnGenerator,
        cookies: &SynCookies,
        now: Instant,
    ) -> SynAnswer {
        let evicted = match self.on_syn(key.remote) {
            Admission::Known => return SynAnswer::Known,
            Admission::Admit => None,
            Admission::AdmitEvicting(old) => Some(FourTuple::new(key.local, old)),
            Admission::Cookie => {
                self.stats.cookies_sent += 1;
                self.last_cookie = Some(now);
                let cookie = cookies.make(key, syn.seq, syn.mss, now);
                return SynAnswer::Cookie(Connection::stateless_syn_ack(config, syn, cookie));
            }
        };
        let iss = isn.isn(key.local, key.remote, now);
        let tcb = Connection::accept(config, key.local, key.remote, syn, iss, now);
        SynAnswer::Opened(Opened { tcb, evicted })
    }

    /// An ACK (no SYN, no RST) for this listener's endpoint from a remote
    /// with no connection ([`Demux::ListenerAck`](super::Demux::ListenerAck)):
    /// perhaps the end of a handshake answered with a SYN cookie. If SYN
    /// cookies went out recently and `ack`'s checks, the connection, made
    /// ESTABLISHED with `ack` processed and counted as half-open here: the
    /// driver puts it in its table and takes the [`Listener::step`] as for
    /// an [`Opened`] one, which moves it into the backlog (or refuses it
    /// when the backlog is full).
    pub fn admit_cookie(
        &mut self,
        key: FourTuple,
        ack: &Segment<'_>,
        config: &TcpConfig,
        cookies: &SynCookies,
        now: Instant,
    ) -> CookieAnswer {
        if self.half_open.contains_key(&key.remote) || self.backlog.contains(&key.remote) {
            // Two segments of one handshake on two threads at once: the
            // first made the connection, which is not in the table yet.
            return CookieAnswer::Known;
        }
        let valid_for = TICK * (MAX_AGE + 1);
        let cookies_out = self
            .last_cookie
            .is_some_and(|at| now.saturating_since(at) < valid_for);
        let flags = ack.flags;
        let Some(ack_number) = ack.ack.filter(|_| cookies_out && !flags.syn && !flags.rst) else {
            return CookieAnswer::NotACookie;
        };
        let (iss, peer_isn) = (ack_number - 1u32, ack.seq - 1u32);
        match cookies.check(key, peer_isn, iss, now) {
            Ok(peer_mss) => {
                self.stats.cookies_accepted += 1;
                self.add_half_open(key.remote);
                CookieAnswer::Opened(Connection::accept_cookie(
                    config, key.local, key.remote, ack, iss, peer_mss, now,
                ))
            }
            Err(_) => {
                self.stats.cookies_rejected += 1;
                CookieAnswer::NotACookie
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that evicts (no SYN cookies: these tests are of the
    /// bounds alone).
    fn listener(half_open: usize, backlog: usize) -> Listener<u32> {
        Listener::new(ListenConfig {
            half_open,
            backlog,
            syn_cookies: false,
        })
    }

    impl CookieAnswer {
        fn opened(self) -> Option<Connection> {
            match self {
                CookieAnswer::Opened(tcb) => Some(tcb),
                _ => None,
            }
        }

        fn is_not_a_cookie(&self) -> bool {
            matches!(self, CookieAnswer::NotACookie)
        }
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

        fn answer(l: &mut Listener<Endpoint>, port: u16, now: Instant) -> SynAnswer {
            let isn = IsnGenerator::new();
            let key = FourTuple::new(LOCAL, remote(port));
            l.admit_syn(key, &syn(), &TcpConfig::default(), &isn, &COOKIES, now)
        }

        fn admit(l: &mut Listener<Endpoint>, port: u16) -> Option<Opened> {
            match answer(l, port, Instant(0)) {
                SynAnswer::Opened(opened) => Some(opened),
                SynAnswer::Known => None,
                SynAnswer::Cookie(_) => panic!("a cookie where a SYN was to be admitted"),
            }
        }

        static COOKIES: std::sync::LazyLock<SynCookies> =
            std::sync::LazyLock::new(|| SynCookies::with_key((11, 12)));

        fn config(half_open: usize, backlog: usize, syn_cookies: bool) -> ListenConfig {
            ListenConfig {
                half_open,
                backlog,
                syn_cookies,
            }
        }

        /// The peer's ACK of a stateless SYN-ACK, with `payload`.
        fn cookie_ack(syn_ack: &Segment<'_>, payload: &'static [u8]) -> Segment<'static> {
            let mut ack = Segment::new(Seq(7001));
            ack.ack = Some(syn_ack.seq + 1u32);
            ack.window = 1000;
            ack.payload = payload;
            ack
        }

        fn cookie(answer: SynAnswer) -> Segment<'static> {
            match answer {
                SynAnswer::Cookie(syn_ack) => syn_ack,
                other => panic!("no cookie: {other:?}"),
            }
        }

        #[test]
        fn with_the_half_open_set_full_a_syn_gets_a_cookie_and_nothing_is_kept() {
            let mut l = Listener::new(config(2, 4, true));
            let t = Instant(1_000_000_000);
            assert!(admit(&mut l, 1).is_some() && admit(&mut l, 2).is_some());
            let syn_ack = cookie(answer(&mut l, 3, t));
            assert!(syn_ack.flags.syn);
            assert_eq!(syn_ack.ack, Some(Seq(7001)));
            assert_eq!(syn_ack.mss, Some(TcpConfig::default().mss));
            assert_eq!(
                (syn_ack.window_scale, syn_ack.sack_permitted),
                (None, false)
            );
            let key = FourTuple::new(LOCAL, remote(3));
            assert_eq!(
                COOKIES.check(key, Seq(7000), syn_ack.seq, t),
                Ok(536),
                "the SYN had no MSS option"
            );
            assert_eq!(l.half_open_len(), 2, "no eviction, nothing kept");
            assert!(l.is_half_open(remote(1)) && !l.is_half_open(remote(3)));
            assert_eq!(l.stats().cookies_sent, 1);
            assert_eq!(l.stats().evicted, 0);
            // Its SYN again gets the same cookie (no state to find).
            assert_eq!(cookie(answer(&mut l, 3, t)).seq, syn_ack.seq);
        }

        #[test]
        fn the_cookie_returning_makes_a_connection_that_is_queued_for_accept() {
            let mut l = Listener::new(config(1, 4, true));
            let t = Instant(1_000_000_000);
            let _first = admit(&mut l, 1).unwrap();
            let syn_ack = cookie(answer(&mut l, 2, t));
            let key = FourTuple::new(LOCAL, remote(2));
            let ack = cookie_ack(&syn_ack, b"hello");
            let cfg = TcpConfig::default();
            let later = t + std::time::Duration::from_millis(40);
            let mut tcb = l
                .admit_cookie(key, &ack, &cfg, &COOKIES, later)
                .opened()
                .expect("the cookie checks");
            assert_eq!(tcb.state(), State::Established);
            assert_eq!(tcb.send_mss(), 536);
            let mut buf = [0u8; 8];
            assert_eq!(tcb.recv(&mut buf), Ok(5), "the ACK's data is taken");
            assert_eq!(&buf[..5], b"hello");
            // The same ACK again, had it reached the listener before the
            // connection was in the driver's table (another thread): known,
            // half-open and then waiting.
            let again =
                |l: &mut Listener<Endpoint>| l.admit_cookie(key, &ack, &cfg, &COOKIES, later);
            assert!(matches!(again(&mut l), CookieAnswer::Known));
            assert_eq!(l.step(remote(2), &mut tcb, false), Backlog::Queued);
            assert!(matches!(again(&mut l), CookieAnswer::Known));
            assert_eq!(l.accept(), Some(remote(2)));
            assert_eq!(l.stats().cookies_accepted, 1);
            assert_eq!(l.half_open_len(), 1);
        }

        #[test]
        fn a_bad_or_late_cookie_is_refused_and_counted() {
            let mut l = Listener::new(config(1, 4, true));
            let t = Instant(1_000_000_000);
            let _first = admit(&mut l, 1).unwrap();
            let syn_ack = cookie(answer(&mut l, 2, t));
            let cfg = TcpConfig::default();
            let ack = cookie_ack(&syn_ack, b"");
            // From another port: not its cookie.
            let other = FourTuple::new(LOCAL, remote(9));
            assert!(l
                .admit_cookie(other, &ack, &cfg, &COOKIES, t)
                .is_not_a_cookie());
            // Off by one.
            let mut forged = ack;
            forged.ack = Some(syn_ack.seq + 2u32);
            let key = FourTuple::new(LOCAL, remote(2));
            assert!(l
                .admit_cookie(key, &forged, &cfg, &COOKIES, t)
                .is_not_a_cookie());
            // Too late: more than two ticks after the cookie was made.
            let late = t + crate::tcp::syncookie::TICK * 2;
            let _again = answer(&mut l, 3, late); // keeps cookies "out"
            assert!(l
                .admit_cookie(key, &ack, &cfg, &COOKIES, late)
                .is_not_a_cookie());
            assert_eq!(l.stats().cookies_rejected, 3);
            assert_eq!(l.stats().cookies_accepted, 0);
            assert_eq!(l.half_open_len(), 1);
        }

        #[test]
        fn acks_are_not_taken_for_cookies_while_none_are_out() {
            let mut l = Listener::new(config(1, 4, true));
            let t = Instant(1_000_000_000);
            let _first = admit(&mut l, 1).unwrap();
            let key = FourTuple::new(LOCAL, remote(2));
            let cfg = TcpConfig::default();
            // A valid cookie that this listener never sent (none went out).
            let made = COOKIES.make(key, Seq(7000), Some(1460), t);
            let mut ack = Segment::new(Seq(7001));
            ack.ack = Some(made + 1u32);
            assert!(l
                .admit_cookie(key, &ack, &cfg, &COOKIES, t)
                .is_not_a_cookie());
            assert_eq!(l.stats().cookies_rejected, 0, "not even checked");
            // Once one went out, the same ACK checks; but not once the
            // cookies sent are all too old to check.
            let _ = cookie(answer(&mut l, 3, t));
            let valid_for = crate::tcp::syncookie::TICK * 2;
            assert!(l
                .admit_cookie(key, &ack, &cfg, &COOKIES, t + valid_for)
                .is_not_a_cookie());
            assert!(l
                .admit_cookie(key, &ack, &cfg, &COOKIES, t)
                .opened()
                .is_some());
        }

        #[test]
        fn a_cookie_connection_beyond_the_backlog_is_refused() {
            let mut l = Listener::new(config(1, 1, true));
            let t = Instant(1_000_000_000);
            let mut first = admit(&mut l, 1).unwrap().tcb;
            let ack = ack_of(&mut first);
            first.on_segment(&ack, t);
            assert_eq!(l.step(remote(1), &mut first, false), Backlog::Queued);
            // The half-open set (1) is empty again; fill it.
            let _second = admit(&mut l, 2).unwrap();
            let syn_ack = cookie(answer(&mut l, 3, t));
            let key = FourTuple::new(LOCAL, remote(3));
            let cfg = TcpConfig::default();
            let mut tcb = l
                .admit_cookie(key, &cookie_ack(&syn_ack, b""), &cfg, &COOKIES, t)
                .opened()
                .unwrap();
            assert_eq!(l.step(remote(3), &mut tcb, false), Backlog::Refused);
            assert!(tcb.poll_transmit(t).is_some_and(|s| s.flags.rst));
            assert_eq!(l.stats().overflows, 1);
            assert!(!l.is_half_open(remote(3)));
        }

        #[test]
        fn an_admitted_syn_opens_a_half_open_connection_once() {
            let mut l = Listener::new(config(1, 4, false));
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
            let mut l = Listener::new(config(8, 1, true));
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
