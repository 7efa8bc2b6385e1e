//! Shared by the `tcp_*` tests: crafted segments, a seeded RNG and a
//! simulated link between two connections driven by virtual time.
#![allow(dead_code, unused_imports)]

use ginza_net::tcp::{Connection, Flags, Instant, Segment, Seq, TcpConfig};
use std::time::Duration;

pub use ginza_net::tcp::testing::{at_ms, seg, CLIENT, SERVER};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A segment as the tests keep it: header plus owned payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    pub header: Segment<'static>,
    pub payload: Vec<u8>,
}

impl Owned {
    pub fn from(segment: &Segment<'_>) -> Owned {
        let (header, payload) = segment.to_owned_payload();
        Owned { header, payload }
    }

    pub fn view(&self) -> Segment<'_> {
        Segment {
            payload: &self.payload,
            ..self.header
        }
    }
}

/// Everything a connection wants to send now.
pub fn drain(conn: &mut Connection, now: Instant) -> Vec<Owned> {
    let mut out = Vec::new();
    while let Some(segment) = conn.poll_transmit(now) {
        out.push(Owned::from(&segment));
        assert!(out.len() < 100_000, "poll_transmit never returns None");
    }
    out
}

/// A crafted segment: `seg(seq).ack(n).syn().fin()...` ([`seg`] from
/// `ginza_net::tcp::testing`).
pub trait Craft<'a> {
    fn ack(self, ack: u32) -> Segment<'a>;
    fn syn(self) -> Segment<'a>;
    fn fin(self) -> Segment<'a>;
    fn rst(self) -> Segment<'a>;
    fn window(self, window: u16) -> Segment<'a>;
    fn data<'b>(self, payload: &'b [u8]) -> Segment<'b>
    where
        'a: 'b;
    fn options(self, mss: Option<u16>, window_scale: Option<u8>) -> Segment<'a>;
}

impl<'a> Craft<'a> for Segment<'a> {
    fn ack(mut self, ack: u32) -> Segment<'a> {
        self.ack = Some(Seq(ack));
        self
    }
    fn syn(mut self) -> Segment<'a> {
        self.flags.syn = true;
        self
    }
    fn fin(mut self) -> Segment<'a> {
        self.flags.fin = true;
        self
    }
    fn rst(mut self) -> Segment<'a> {
        self.flags.rst = true;
        self
    }
    fn window(mut self, window: u16) -> Segment<'a> {
        self.window = window;
        self
    }
    fn data<'b>(self, payload: &'b [u8]) -> Segment<'b>
    where
        'a: 'b,
    {
        Segment { payload, ..self }
    }
    fn options(mut self, mss: Option<u16>, window_scale: Option<u8>) -> Segment<'a> {
        self.mss = mss;
        self.window_scale = window_scale;
        self
    }
}

pub fn flags(syn: bool, fin: bool, rst: bool) -> Flags {
    Flags {
        syn,
        fin,
        rst,
        psh: false,
    }
}

/// SplitMix64: small, seeded, good enough for loss decisions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The simulated link's behaviour, the same both ways.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub loss: f64,
    pub duplicate: f64,
    /// Probability that a segment is held back by up to `reorder_delay`.
    pub reorder: f64,
    pub reorder_delay: Duration,
    /// One-way propagation delay.
    pub delay: Duration,
}

impl LinkConfig {
    pub fn clean(delay: Duration) -> LinkConfig {
        LinkConfig {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            delay,
        }
    }
}

struct InFlight {
    at: Instant,
    order: u64,
    to_server: bool,
    segment: Owned,
}

/// Decides whether a segment is lost: `(towards the server, segment)`.
pub type DropFilter = Box<dyn FnMut(bool, &Owned) -> bool>;

/// Two connections (client `a`, server `b`) over a simulated link.
pub struct Net {
    pub a: Connection,
    pub b: Connection,
    pub now: Instant,
    link: LinkConfig,
    rng: Rng,
    queue: Vec<InFlight>,
    order: u64,
    pub delivered: u64,
    /// Chooses segments to lose on purpose (`true`: dropped), before the
    /// link's random loss: `(towards the server, segment)`.
    pub drop_filter: Option<DropFilter>,
}

impl Net {
    /// The client's SYN is sent and the server accepts it (as a listener
    /// would): both connections exist from the start.
    pub fn handshake(config: &TcpConfig, link: LinkConfig, seed: u64) -> Net {
        let now = Instant::from_nanos(0);
        let mut a = Connection::connect(config, CLIENT, SERVER, Seq(0xffff_f000), now);
        let syn = drain(&mut a, now);
        assert_eq!(syn.len(), 1);
        let b = Connection::accept(config, SERVER, CLIENT, &syn[0].view(), Seq(7_000_000), now);
        Net {
            a,
            b,
            now,
            link,
            rng: Rng::new(seed),
            queue: Vec::new(),
            order: 0,
            delivered: 0,
            drop_filter: None,
        }
    }

    fn send(&mut self, to_server: bool, segment: Owned) {
        if let Some(filter) = &mut self.drop_filter {
            if filter(to_server, &segment) {
                return;
            }
        }
        if self.rng.chance(self.link.loss) {
            return;
        }
        let copies = if self.rng.chance(self.link.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = self.now + self.link.delay;
            if self.rng.chance(self.link.reorder) {
                let extra = self
                    .rng
                    .below(self.link.reorder_delay.as_nanos() as u64 + 1);
                at = at + Duration::from_nanos(extra);
            }
            self.order += 1;
            self.queue.push(InFlight {
                at,
                order: self.order,
                to_server,
                segment: segment.clone(),
            });
        }
    }

    /// Puts whatever both sides want to send on the link.
    pub fn flush(&mut self) {
        for segment in drain(&mut self.a, self.now) {
            self.send(true, segment);
        }
        for segment in drain(&mut self.b, self.now) {
            self.send(false, segment);
        }
    }

    /// Advances virtual time to the next arrival or timer and processes it.
    /// Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.step_within(None)
    }

    /// [`step`](Self::step), but virtual time moves on by `most` at most
    /// (an application that acts at a time of its own gets to run then);
    /// with `most`, time passes even when nothing else would happen.
    pub fn step_within(&mut self, most: Option<Duration>) -> bool {
        self.flush();
        let next = [
            self.queue.iter().map(|f| f.at).min(),
            self.a.next_deadline(),
            self.b.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min();
        let next = match (next, most) {
            (Some(next), Some(most)) => next.min(self.now + most),
            (Some(next), None) => next,
            // Nothing on the link or armed: only the applications' time
            // passes.
            (None, Some(most)) => self.now + most,
            (None, None) => return false,
        };
        if next > self.now {
            self.now = next;
        }
        let now = self.now;
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].at <= now {
                due.push(self.queue.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|f| (f.at, f.order));
        for f in due {
            self.delivered += 1;
            let conn = if f.to_server {
                &mut self.b
            } else {
                &mut self.a
            };
            conn.on_segment(&f.segment.view(), now);
        }
        if self.a.next_deadline().is_some_and(|d| d <= now) {
            self.a.on_timer(now);
        }
        if self.b.next_deadline().is_some_and(|d| d <= now) {
            self.b.on_timer(now);
        }
        true
    }

    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}
