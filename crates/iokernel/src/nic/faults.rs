//! Fault injection in the software switch (docs/fault-injection.md): seeded,
//! per-port drop, duplication, reordering, delay and corruption of frames,
//! so that tests can put a real TCP peer behind loss without `netem`.
//!
//! # Rules
//!
//! A [`FaultRule`] is written `key=value,key=value,...` (iokerneld's
//! `--faults`, repeatable, or a `[[faults]]` table of its TOML file with the
//! same keys):
//!
//! | key         | value                                   | default |
//! |-------------|-----------------------------------------|---------|
//! | `drop`      | probability, e.g. `5%`                  | `0%`    |
//! | `duplicate` | probability: the frame is sent twice    | `0%`    |
//! | `reorder`   | probability: the frame is held back until `gap` later frames passed it (or 1 ms more than `delay`) | `0%` |
//! | `corrupt`   | probability: one byte past the Ethernet header is flipped | `0%` |
//! | `delay`     | duration every frame is held, e.g. `200us` (at most 1 s) | `0s` |
//! | `gap`       | frames that overtake a reordered one, 1 to 16 | `1` |
//! | `hold`      | most frames held (delayed or reordered) at once per port and direction, 1 to 4096; beyond, frames are dropped and counted as `held_overflow` | `128` |
//! | `seed`      | seed of the decisions                  | `1`     |
//! | `port`      | `all`, `trunk` (the real NIC), `generator`, a MAC (`02:00:00:00:00:01`) or `app:NAME` | `all` |
//! | `dir`       | `in` (frames the switch delivers to the port), `out` (frames the port sends), `both` | `both`; `out` for `port=all` |
//! | `proto`     | which frames are subject: `any`, `ip`, `tcp`, `udp` (others pass untouched and uncounted) | `any` |
//!
//! Probabilities must be written with `%` (`drop=1` is refused rather than
//! read as 100 %). A rule must name at least one fault. `port=all` subjects
//! every frame once, as it enters the switch (`dir=out`); `dir=both` is
//! refused there because every frame would be subject twice.
//!
//! A port takes, per direction, the first rule that names it (so put rules
//! naming one port before a `port=all` rule).
//!
//! # The injector
//!
//! [`FaultInjector`] is the decision logic of one port and direction, with
//! no clock and no switch: a frame and the current time go in
//! ([`FaultInjector::offer`]), the frames that leave now come out through a
//! callback, and held frames leave on a later offer or
//! [`FaultInjector::release`]. Its random stream is seeded from the rule's
//! seed and the port (its MAC and direction), so a run is the same for the
//! same seed whatever order applications registered in. Held frames are
//! copies in buffers the injector recycles; there are at most `hold` of
//! them, so it cannot grow.
//!
//! Decisions per frame, in order: drop (nothing else), duplicate (the copy
//! follows at once, same fate), corrupt, then reorder or delay (hold), else
//! it passes at once. A delayed frame leaves `delay` after its offer, in
//! offer order; a reordered one after `gap` frames offered after it have
//! left, or `delay` + [`REORDER_TIMEOUT`] after its offer if fewer come.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use ginza_net::{MacAddr, ETHERNET_HEADER_LEN};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

pub use ginza_proto::messages::MAX_FAULT_RULES;

/// Longest `delay`.
pub const MAX_DELAY: Duration = Duration::from_secs(1);
/// Most frames `hold` allows.
pub const MAX_HOLD: usize = 4096;
/// Default `hold`.
pub const DEFAULT_HOLD: usize = 128;
/// Largest `gap`.
pub const MAX_GAP: u32 = 16;
/// A reordered frame that `gap` later frames did not overtake leaves this
/// long after its delay anyway (the end of a burst must not stall).
pub const REORDER_TIMEOUT: Duration = Duration::from_millis(1);
/// Default `seed`.
pub const DEFAULT_SEED: u64 = 1;

/// The keys a rule may have, for error messages.
const KEYS: &str = "drop, duplicate, reorder, corrupt, delay, gap, hold, seed, port, dir, proto";

/// A probability, in parts per billion (exact for the percentages people
/// write, down to 0.0000001 %).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Probability(u32);

const PPB_ONE: u32 = 1_000_000_000;

impl Probability {
    pub const ZERO: Probability = Probability(0);
    pub const ONE: Probability = Probability(PPB_ONE);

    /// `percent` (0 to 100), or `None` outside that range.
    pub fn from_percent(percent: f64) -> Option<Probability> {
        if !(0.0..=100.0).contains(&percent) {
            return None;
        }
        Some(Probability((percent * 1e7).round() as u32))
    }

    pub fn percent(self) -> f64 {
        f64::from(self.0) / 1e7
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The threshold a uniform `u32` must be below: `p × 2³²`.
    fn threshold(self) -> u64 {
        (u64::from(self.0) << 32) / u64::from(PPB_ONE)
    }
}

impl fmt::Display for Probability {
    /// `5%`, `0.1%`, `12.5%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 10_000_000;
        let frac = self.0 % 10_000_000;
        if frac == 0 {
            return write!(f, "{whole}%");
        }
        let digits = format!("{frac:07}");
        write!(f, "{whole}.{}%", digits.trim_end_matches('0'))
    }
}

impl FromStr for Probability {
    type Err = String;

    fn from_str(s: &str) -> Result<Probability, String> {
        let Some(number) = s.trim().strip_suffix('%') else {
            return Err("write a probability as a percentage, e.g. 5%".into());
        };
        let percent: f64 = number
            .trim()
            .parse()
            .map_err(|_| "a probability is a number of percent, e.g. 5% or 0.1%".to_string())?;
        Probability::from_percent(percent)
            .ok_or_else(|| "a probability must be between 0 % and 100 %".to_string())
    }
}

/// Which ports a rule applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortSelector {
    All,
    /// The port towards the real NIC (`--nic af_packet:…`/`af_xdp:…`).
    Trunk,
    /// The traffic generator's port.
    Generator,
    /// The port with this MAC (an application's address).
    Mac(MacAddr),
    /// The port of the application registered under this name.
    App(String),
}

impl fmt::Display for PortSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSelector::All => f.write_str("all"),
            PortSelector::Trunk => f.write_str("trunk"),
            PortSelector::Generator => f.write_str("generator"),
            PortSelector::Mac(mac) => write!(f, "{mac}"),
            PortSelector::App(name) => write!(f, "app:{name}"),
        }
    }
}

impl FromStr for PortSelector {
    type Err = String;

    fn from_str(s: &str) -> Result<PortSelector, String> {
        match s {
            "all" => Ok(PortSelector::All),
            "trunk" => Ok(PortSelector::Trunk),
            "generator" => Ok(PortSelector::Generator),
            _ => {
                if let Some(name) = s.strip_prefix("app:") {
                    if name.is_empty() || name.len() > ginza_proto::messages::MAX_NAME {
                        return Err(format!(
                            "an application name has 1 to {} bytes",
                            ginza_proto::messages::MAX_NAME
                        ));
                    }
                    return Ok(PortSelector::App(name.to_string()));
                }
                s.parse::<MacAddr>().map(PortSelector::Mac).map_err(|_| {
                    "a port is all, trunk, generator, a MAC (02:00:00:00:00:01) or app:NAME"
                        .to_string()
                })
            }
        }
    }
}

/// What a port is, for matching rules against it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortIdentity<'a> {
    Trunk(MacAddr),
    Generator(MacAddr),
    App { name: &'a str, mac: MacAddr },
}

impl PortIdentity<'_> {
    pub fn mac(&self) -> MacAddr {
        match *self {
            PortIdentity::Trunk(mac) | PortIdentity::Generator(mac) => mac,
            PortIdentity::App { mac, .. } => mac,
        }
    }
}

impl PortSelector {
    pub fn matches(&self, port: &PortIdentity<'_>) -> bool {
        match (self, port) {
            (PortSelector::All, _) => true,
            (PortSelector::Trunk, PortIdentity::Trunk(_)) => true,
            (PortSelector::Generator, PortIdentity::Generator(_)) => true,
            (PortSelector::Mac(mac), port) => port.mac() == *mac,
            (PortSelector::App(want), PortIdentity::App { name, .. }) => want == name,
            _ => false,
        }
    }
}

/// Which frames of a port a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Frames the switch delivers to the port.
    In,
    /// Frames the port sends into the switch.
    Out,
    Both,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
            Direction::Both => "both",
        }
    }

    /// Whether it covers `other` (`In` or `Out`).
    pub fn covers(self, other: Direction) -> bool {
        self == Direction::Both || self == other
    }
}

/// Which frames are subject to a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoFilter {
    Any,
    /// IPv4 or IPv6.
    Ip,
    /// TCP over IPv4 or IPv6 (no extension headers).
    Tcp,
    Udp,
}

impl ProtoFilter {
    pub fn name(self) -> &'static str {
        match self {
            ProtoFilter::Any => "any",
            ProtoFilter::Ip => "ip",
            ProtoFilter::Tcp => "tcp",
            ProtoFilter::Udp => "udp",
        }
    }

    /// Whether `frame` (an Ethernet frame) is one it selects. Short or
    /// odd frames are not IP.
    pub fn selects(self, frame: &[u8]) -> bool {
        const IPV4: [u8; 2] = [0x08, 0x00];
        const IPV6: [u8; 2] = [0x86, 0xdd];
        let ip_protocol = || match frame.get(12..14) {
            Some(t) if t == IPV4 => frame.get(ETHERNET_HEADER_LEN + 9).copied(),
            Some(t) if t == IPV6 => frame.get(ETHERNET_HEADER_LEN + 6).copied(),
            _ => None,
        };
        match self {
            ProtoFilter::Any => true,
            ProtoFilter::Ip => matches!(frame.get(12..14), Some(t) if t == IPV4 || t == IPV6),
            ProtoFilter::Tcp => ip_protocol() == Some(6),
            ProtoFilter::Udp => ip_protocol() == Some(17),
        }
    }
}

/// One `--faults` rule, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub drop: Probability,
    pub duplicate: Probability,
    pub reorder: Probability,
    pub corrupt: Probability,
    pub delay: Duration,
    pub gap: u32,
    pub hold: usize,
    pub seed: u64,
    pub port: PortSelector,
    pub dir: Direction,
    pub proto: ProtoFilter,
}

/// Why a rule was refused: the `key=value` at fault and what is wrong
/// (`drop=150%: a probability must be between 0 % and 100 %`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FaultRuleError(pub String);

impl FaultRule {
    /// A rule with no fault yet on every port (set fields, then use it;
    /// tests do). [`FaultRule::from_pairs`] is the checked way.
    pub fn new() -> FaultRule {
        FaultRule {
            drop: Probability::ZERO,
            duplicate: Probability::ZERO,
            reorder: Probability::ZERO,
            corrupt: Probability::ZERO,
            delay: Duration::ZERO,
            gap: 1,
            hold: DEFAULT_HOLD,
            seed: DEFAULT_SEED,
            port: PortSelector::All,
            dir: Direction::Out,
            proto: ProtoFilter::Any,
        }
    }

    /// Whether it does anything to a frame.
    pub fn has_fault(&self) -> bool {
        !(self.drop.is_zero()
            && self.duplicate.is_zero()
            && self.reorder.is_zero()
            && self.corrupt.is_zero()
            && self.delay.is_zero())
    }

    /// A rule from `(key, value)` pairs (the flag's text split at `,` and
    /// `=`, or a TOML table), checked.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<FaultRule, FaultRuleError> {
        let mut rule = FaultRule::new();
        let mut seen: Vec<&str> = Vec::new();
        let mut dir = None;
        let mut fault_given = false;
        for (key, value) in pairs {
            let (key, value) = (key.trim(), value.trim());
            let bad = |msg: String| FaultRuleError(format!("{key}={value}: {msg}"));
            if seen.contains(&key) {
                return Err(bad(format!("{key} is given twice")));
            }
            seen.push(key);
            match key {
                "drop" | "duplicate" | "reorder" | "corrupt" => {
                    let p: Probability = value.parse().map_err(bad)?;
                    *match key {
                        "drop" => &mut rule.drop,
                        "duplicate" => &mut rule.duplicate,
                        "reorder" => &mut rule.reorder,
                        _ => &mut rule.corrupt,
                    } = p;
                    fault_given = true;
                }
                "delay" => {
                    let d = ginza_proto::parse_duration(value).map_err(bad)?;
                    if d > MAX_DELAY {
                        return Err(bad(format!("at most {MAX_DELAY:?}")));
                    }
                    rule.delay = d;
                    fault_given = true;
                }
                "gap" => {
                    rule.gap = value
                        .parse()
                        .ok()
                        .filter(|g| (1..=MAX_GAP).contains(g))
                        .ok_or_else(|| bad(format!("a gap is 1 to {MAX_GAP} frames")))?;
                }
                "hold" => {
                    rule.hold = value
                        .parse()
                        .ok()
                        .filter(|h| (1..=MAX_HOLD).contains(h))
                        .ok_or_else(|| bad(format!("hold is 1 to {MAX_HOLD} frames")))?;
                }
                "seed" => {
                    rule.seed = value
                        .parse()
                        .map_err(|_| bad("a seed is a number from 0 to 2^64-1".into()))?;
                }
                "port" => rule.port = value.parse().map_err(bad)?,
                "dir" => {
                    dir = Some(match value {
                        "in" => Direction::In,
                        "out" => Direction::Out,
                        "both" => Direction::Both,
                        _ => return Err(bad("a direction is in, out or both".into())),
                    });
                }
                "proto" => {
                    rule.proto = match value {
                        "any" => ProtoFilter::Any,
                        "ip" => ProtoFilter::Ip,
                        "tcp" => ProtoFilter::Tcp,
                        "udp" => ProtoFilter::Udp,
                        _ => return Err(bad("proto is any, ip, tcp or udp".into())),
                    };
                }
                "" => return Err(FaultRuleError("an empty key (expected key=value)".into())),
                _ => return Err(bad(format!("unknown key {key:?} (keys: {KEYS})"))),
            }
        }
        if !fault_given {
            return Err(FaultRuleError(
                "no fault given: name at least one of drop=, duplicate=, reorder=, corrupt=, delay="
                    .into(),
            ));
        }
        rule.dir = match (dir, &rule.port) {
            (Some(Direction::Both), PortSelector::All) => {
                return Err(FaultRuleError(
                    "port=all,dir=both: every frame would be subject twice (once leaving its \
                     port, once entering the next); use dir=out (the default) or dir=in"
                        .into(),
                ))
            }
            (Some(d), _) => d,
            (None, PortSelector::All) => Direction::Out,
            (None, _) => Direction::Both,
        };
        Ok(rule)
    }
}

impl Default for FaultRule {
    fn default() -> FaultRule {
        FaultRule::new()
    }
}

impl FromStr for FaultRule {
    type Err = FaultRuleError;

    /// `drop=5%,reorder=2%,port=trunk`.
    fn from_str(s: &str) -> Result<FaultRule, FaultRuleError> {
        if s.trim().is_empty() {
            return Err(FaultRuleError(
                "an empty rule (expected key=value,..., e.g. drop=5%,port=trunk)".into(),
            ));
        }
        let mut pairs = Vec::new();
        for item in s.split(',') {
            let Some((key, value)) = item.split_once('=') else {
                return Err(FaultRuleError(format!(
                    "{:?}: expected key=value (keys: {KEYS})",
                    item.trim()
                )));
            };
            pairs.push((key, value));
        }
        FaultRule::from_pairs(pairs)
    }
}

/// A duration as a rule writes it: `200us`, `1ms`, `1500ns`.
fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    match ns {
        0 => "0s".into(),
        n if n % 1_000_000_000 == 0 => format!("{}s", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

impl fmt::Display for FaultRule {
    /// The canonical text, which parses back to the same rule: the faults
    /// given, then the other keys where not their defaults, then `port` and
    /// `dir`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (key, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !p.is_zero() {
                parts.push(format!("{key}={p}"));
            }
        }
        if !self.delay.is_zero() {
            parts.push(format!("delay={}", fmt_duration(self.delay)));
        }
        if parts.is_empty() {
            parts.push("drop=0%".into());
        }
        if self.gap != 1 {
            parts.push(format!("gap={}", self.gap));
        }
        if self.hold != DEFAULT_HOLD {
            parts.push(format!("hold={}", self.hold));
        }
        if self.seed != DEFAULT_SEED {
            parts.push(format!("seed={}", self.seed));
        }
        if self.proto != ProtoFilter::Any {
            parts.push(format!("proto={}", self.proto.name()));
        }
        parts.push(format!("port={}", self.port));
        parts.push(format!("dir={}", self.dir.name()));
        f.write_str(&parts.join(","))
    }
}

/// What an injector did (totals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Frames offered that the rule's `proto` selects.
    pub frames: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub delayed: u64,
    pub corrupted: u64,
    /// Frames to hold when `hold` frames already were: dropped.
    pub held_overflow: u64,
}

impl std::ops::AddAssign for FaultCounters {
    fn add_assign(&mut self, o: FaultCounters) {
        self.frames += o.frames;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.delayed += o.delayed;
        self.corrupted += o.corrupted;
        self.held_overflow += o.held_overflow;
    }
}

impl FaultCounters {
    /// The stats entry of a rule whose ports are `port`.
    pub fn report(&self, port: String) -> ginza_proto::messages::FaultStats {
        ginza_proto::messages::FaultStats {
            port,
            frames: self.frames,
            dropped: self.dropped,
            duplicated: self.duplicated,
            reordered: self.reordered,
            delayed: self.delayed,
            corrupted: self.corrupted,
            held_overflow: self.held_overflow,
        }
    }
}

/// A frame held back.
#[derive(Debug)]
struct Held {
    /// Its place among the frames offered (those not dropped).
    seq: u64,
    /// When it leaves at the latest (ns).
    due_ns: u64,
    /// 2 when duplicated.
    copies: u8,
    bytes: Vec<u8>,
}

/// The faults of one port in one direction (see the module doc).
#[derive(Debug)]
pub struct FaultInjector {
    rule: FaultRule,
    /// The index of its rule in the configuration (for counting per rule).
    tag: usize,
    rng: SmallRng,
    /// Offer order = due order (the delay is constant).
    delayed: VecDeque<Held>,
    /// Offer order = due order (the timeout is constant).
    reordered: VecDeque<Held>,
    /// Buffers of frames that left, for the next held ones.
    spare: Vec<Vec<u8>>,
    /// For a corrupted copy.
    scratch: Vec<u8>,
    /// Frames offered and not dropped so far (the last one's `seq`).
    offered: u64,
    /// `seq` of the newest frame that left in offer order (not a reordered
    /// one).
    departed: u64,
    counters: FaultCounters,
}

/// SplitMix64's finalizer: spreads a seed and a port over the whole seed.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The random stream of a port and direction: its MAC and `In`/`Out`.
pub fn stream_of(mac: MacAddr, dir: Direction) -> u64 {
    let mut m = [0u8; 8];
    m[..6].copy_from_slice(&mac.0);
    (u64::from_le_bytes(m) << 2) | matches!(dir, Direction::In) as u64
}

impl FaultInjector {
    /// An injector for `rule`, its decisions seeded by the rule's seed and
    /// `stream` (see [`stream_of`]); `tag` is the caller's name for the rule.
    pub fn new(rule: &FaultRule, tag: usize, stream: u64) -> FaultInjector {
        let seed = mix(rule.seed ^ mix(stream.wrapping_add(0x9e37_79b9_7f4a_7c15)));
        FaultInjector {
            rule: rule.clone(),
            tag,
            rng: SmallRng::seed_from_u64(seed),
            delayed: VecDeque::new(),
            reordered: VecDeque::new(),
            spare: Vec::new(),
            scratch: Vec::new(),
            offered: 0,
            departed: 0,
            counters: FaultCounters::default(),
        }
    }

    pub fn rule(&self) -> &FaultRule {
        &self.rule
    }

    pub fn tag(&self) -> usize {
        self.tag
    }

    pub fn counters(&self) -> FaultCounters {
        self.counters
    }

    /// Frames held now.
    pub fn held(&self) -> usize {
        self.delayed.len() + self.reordered.len()
    }

    fn roll(&mut self, p: Probability) -> bool {
        !p.is_zero() && u64::from(self.rng.next_u32()) < p.threshold()
    }

    /// Offers a frame at `now` (ns): `emit` gets, in order, the frames that
    /// leave now (this one, maybe twice, unless dropped or held; then held
    /// ones it let go).
    pub fn offer(&mut self, frame: &[u8], now: u64, emit: &mut impl FnMut(&[u8])) {
        if !self.rule.proto.selects(frame) {
            return emit(frame);
        }
        self.counters.frames += 1;
        if self.roll(self.rule.drop) {
            self.counters.dropped += 1;
            return;
        }
        let copies = if self.roll(self.rule.duplicate) {
            self.counters.duplicated += 1;
            2
        } else {
            1
        };
        let corrupt = frame.len() > ETHERNET_HEADER_LEN && self.roll(self.rule.corrupt);
        let reorder = self.roll(self.rule.reorder);
        let mut scratch = std::mem::take(&mut self.scratch);
        let bytes = if corrupt {
            self.counters.corrupted += 1;
            scratch.clear();
            scratch.extend_from_slice(frame);
            let at = self.rng.random_range(ETHERNET_HEADER_LEN..frame.len());
            scratch[at] ^= self.rng.random_range(1..=255u8);
            &scratch[..]
        } else {
            frame
        };
        self.offered += 1;
        let seq = self.offered;
        let delay_ns = self.rule.delay.as_nanos() as u64;
        if reorder || delay_ns > 0 {
            if self.held() >= self.rule.hold {
                self.counters.held_overflow += 1;
            } else {
                let mut buffer = self.spare.pop().unwrap_or_default();
                buffer.clear();
                buffer.extend_from_slice(bytes);
                let mut held = Held {
                    seq,
                    due_ns: now.saturating_add(delay_ns),
                    copies,
                    bytes: buffer,
                };
                if reorder {
                    self.counters.reordered += 1;
                    held.due_ns = held
                        .due_ns
                        .saturating_add(REORDER_TIMEOUT.as_nanos() as u64);
                    self.reordered.push_back(held);
                } else {
                    self.counters.delayed += 1;
                    self.delayed.push_back(held);
                }
            }
        } else {
            for _ in 0..copies {
                emit(bytes);
            }
            self.depart(seq, emit);
        }
        self.scratch = scratch;
    }

    /// Lets go of the held frames due at `now`, oldest due first.
    pub fn release(&mut self, now: u64, emit: &mut impl FnMut(&[u8])) {
        loop {
            let delayed = self.delayed.front().filter(|h| h.due_ns <= now);
            let reordered = self.reordered.front().filter(|h| h.due_ns <= now);
            let from_delayed = match (delayed, reordered) {
                (None, None) => return,
                (Some(d), Some(r)) => d.due_ns <= r.due_ns,
                (d, _) => d.is_some(),
            };
            let held = if from_delayed {
                self.delayed.pop_front()
            } else {
                self.reordered.pop_front()
            }
            .expect("a front was found");
            let seq = held.seq;
            self.emit_held(held, emit);
            if from_delayed {
                self.depart(seq, emit);
            }
        }
    }

    /// The earliest time a held frame is due, if any is held.
    pub fn next_due(&self) -> Option<u64> {
        let d = self.delayed.front().map(|h| h.due_ns);
        let r = self.reordered.front().map(|h| h.due_ns);
        match (d, r) {
            (Some(d), Some(r)) => Some(d.min(r)),
            (d, r) => d.or(r),
        }
    }

    /// Frame `seq` left in offer order: reordered frames it was the
    /// `gap`-th later frame of leave after it.
    fn depart(&mut self, seq: u64, emit: &mut impl FnMut(&[u8])) {
        self.departed = self.departed.max(seq);
        let gap = u64::from(self.rule.gap);
        while let Some(front) = self.reordered.front() {
            if front.seq + gap > self.departed {
                break;
            }
            let held = self.reordered.pop_front().expect("front exists");
            self.emit_held(held, emit);
        }
    }

    fn emit_held(&mut self, held: Held, emit: &mut impl FnMut(&[u8])) {
        for _ in 0..held.copies {
            emit(&held.bytes);
        }
        if self.spare.len() < self.rule.hold {
            self.spare.push(held.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> FaultRule {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn err(text: &str) -> String {
        text.parse::<FaultRule>().unwrap_err().to_string()
    }

    /// A UDP-looking Ethernet frame carrying `n` (IPv4, protocol 17).
    fn frame(n: u32) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[12] = 0x08;
        f[14 + 9] = 17;
        f[40..44].copy_from_slice(&n.to_be_bytes());
        f
    }

    fn number(f: &[u8]) -> u32 {
        u32::from_be_bytes(f[40..44].try_into().unwrap())
    }

    /// Offers frames 0..n at 1 µs intervals, then releases everything;
    /// what came out.
    fn run(inj: &mut FaultInjector, n: u32) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut now = 0;
        for i in 0..n {
            inj.release(now, &mut |b| out.push(b.to_vec()));
            inj.offer(&frame(i), now, &mut |b| out.push(b.to_vec()));
            now += 1_000;
        }
        inj.release(u64::MAX, &mut |b| out.push(b.to_vec()));
        out
    }

    #[test]
    fn rules_parse_and_print_back() {
        let r = rule("drop=5%,duplicate=1%,reorder=2%,delay=200us,corrupt=0.1%,seed=42,port=trunk");
        assert_eq!(r.drop, Probability::from_percent(5.0).unwrap());
        assert_eq!(r.corrupt.percent(), 0.1);
        assert_eq!(r.delay, Duration::from_micros(200));
        assert_eq!(
            (r.seed, r.port.clone(), r.dir),
            (42, PortSelector::Trunk, Direction::Both)
        );
        assert_eq!(
            r.to_string(),
            "drop=5%,duplicate=1%,reorder=2%,corrupt=0.1%,delay=200us,seed=42,port=trunk,dir=both"
        );
        assert_eq!(rule(&r.to_string()), r);
        let all = rule("drop=12.5%");
        assert_eq!(
            (all.port.clone(), all.dir),
            (PortSelector::All, Direction::Out)
        );
        assert_eq!(all.to_string(), "drop=12.5%,port=all,dir=out");
        let app = rule(" reorder = 3% , gap=4, hold=16, port=app:echo-server, dir=in, proto=tcp ");
        assert_eq!(app.port, PortSelector::App("echo-server".into()));
        assert_eq!(
            (app.gap, app.hold, app.dir, app.proto),
            (4, 16, Direction::In, ProtoFilter::Tcp)
        );
        assert_eq!(rule(&app.to_string()), app);
        let mac = rule("drop=0%,port=02:00:00:00:00:2a");
        assert_eq!(mac.port, PortSelector::Mac(MacAddr([2, 0, 0, 0, 0, 0x2a])));
        assert_eq!(rule(&mac.to_string()), mac);
        assert!(!mac.has_fault());
        assert_eq!(rule("delay=1500ns").delay, Duration::from_nanos(1500));
        assert_eq!(
            rule("delay=1500ns").to_string(),
            "delay=1500ns,port=all,dir=out"
        );
    }

    #[test]
    fn bad_rules_are_refused_naming_the_key_and_value() {
        let cases = [
            (
                "drop=150%",
                "drop=150%: a probability must be between 0 % and 100 %",
            ),
            (
                "drop=-1%",
                "drop=-1%: a probability must be between 0 % and 100 %",
            ),
            (
                "drop=5",
                "drop=5: write a probability as a percentage, e.g. 5%",
            ),
            (
                "drop=five%",
                "drop=five%: a probability is a number of percent",
            ),
            ("loss=5%", "loss=5%: unknown key \"loss\""),
            ("drop=5%,drop=6%", "drop=6%: drop is given twice"),
            ("drop", "\"drop\": expected key=value"),
            ("", "an empty rule"),
            ("port=trunk", "no fault given"),
            (
                "drop=1%,port=eth0",
                "port=eth0: a port is all, trunk, generator, a MAC",
            ),
            (
                "drop=1%,port=app:",
                "port=app:: an application name has 1 to 64 bytes",
            ),
            ("drop=1%,dir=up", "dir=up: a direction is in, out or both"),
            (
                "drop=1%,dir=both",
                "port=all,dir=both: every frame would be subject twice",
            ),
            ("delay=2s", "delay=2s: at most 1s"),
            ("delay=fast", "delay=fast: \"fast\" is not a duration"),
            ("reorder=1%,gap=0", "gap=0: a gap is 1 to 16 frames"),
            (
                "delay=1ms,hold=100000",
                "hold=100000: hold is 1 to 4096 frames",
            ),
            ("drop=1%,seed=-3", "seed=-3: a seed is a number"),
            (
                "drop=1%,proto=icmp",
                "proto=icmp: proto is any, ip, tcp or udp",
            ),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(got.contains(want), "{text}: got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn the_same_seed_makes_the_same_decisions() {
        let r = rule("drop=10%,duplicate=5%,reorder=5%,corrupt=5%,seed=7");
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let a = run(
            &mut FaultInjector::new(&r, 0, stream_of(mac, Direction::Out)),
            2_000,
        );
        let b = run(
            &mut FaultInjector::new(&r, 0, stream_of(mac, Direction::Out)),
            2_000,
        );
        assert_eq!(a, b);
        // Another port, direction or seed: other decisions.
        let other_port = run(
            &mut FaultInjector::new(
                &r,
                0,
                stream_of(MacAddr([2, 0, 0, 0, 0, 2]), Direction::Out),
            ),
            2_000,
        );
        let other_dir = run(
            &mut FaultInjector::new(&r, 0, stream_of(mac, Direction::In)),
            2_000,
        );
        let reseeded = rule("drop=10%,duplicate=5%,reorder=5%,corrupt=5%,seed=8");
        let other_seed = run(
            &mut FaultInjector::new(&reseeded, 0, stream_of(mac, Direction::Out)),
            2_000,
        );
        assert_ne!(a, other_port);
        assert_ne!(a, other_dir);
        assert_ne!(a, other_seed);
    }

    #[test]
    fn observed_rates_are_near_the_configured_ones() {
        const N: u32 = 100_000;
        let r = rule("drop=5%,duplicate=2%,corrupt=1%,reorder=3%,seed=99");
        let mut inj = FaultInjector::new(&r, 0, 1);
        let out = run(&mut inj, N);
        let c = inj.counters();
        assert_eq!(c.frames, u64::from(N));
        // Binomial: 5 standard deviations around the mean.
        let near = |got: u64, p: f64, n: f64| {
            let sd = (n * p * (1.0 - p)).sqrt();
            (got as f64 - n * p).abs() < 5.0 * sd
        };
        assert!(near(c.dropped, 0.05, f64::from(N)), "{c:?}");
        let kept = f64::from(N) - c.dropped as f64;
        assert!(near(c.duplicated, 0.02, kept), "{c:?}");
        assert!(near(c.corrupted, 0.01, kept), "{c:?}");
        assert!(near(c.reordered, 0.03, kept), "{c:?}");
        assert_eq!(c.held_overflow, 0);
        // Everything not dropped came out, duplicates twice.
        assert_eq!(out.len() as u64, u64::from(N) - c.dropped + c.duplicated);
        // Numbers that never came out are exactly the dropped ones.
        let mut seen = vec![false; N as usize];
        for f in &out {
            if let Some(s) = seen.get_mut(number(f) as usize) {
                *s = true;
            }
        }
        let missing = seen.iter().filter(|s| !**s).count() as u64;
        // A corrupted number may hide a frame: at most `corrupted` more.
        assert!(
            missing >= c.dropped && missing <= c.dropped + c.corrupted,
            "{missing} {c:?}"
        );
    }

    #[test]
    fn reordering_really_changes_the_order() {
        let r = rule("reorder=10%,gap=3,seed=5");
        let mut inj = FaultInjector::new(&r, 0, 0);
        let out: Vec<u32> = run(&mut inj, 1_000).iter().map(|f| number(f)).collect();
        let mut sorted = out.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..1_000).collect::<Vec<_>>(),
            "nothing lost or doubled"
        );
        let late = out.windows(2).filter(|w| w[1] < w[0]).count() as u64;
        let reordered = inj.counters().reordered;
        assert!(late > 50, "{late} frames out of order");
        // Each reordered frame comes late once (two let go together make one
        // descent between them).
        assert!(
            late <= reordered && late >= reordered / 2,
            "{late} {reordered}"
        );
        // A frame held back is overtaken by at most `gap` later ones, most
        // often by exactly `gap`.
        let mut exact = 0;
        for (i, &n) in out.iter().enumerate() {
            let overtaken_by = out[..i].iter().filter(|&&m| m > n).count();
            assert!(overtaken_by <= 3, "{n} overtaken by {overtaken_by}");
            exact += usize::from(overtaken_by == 3);
        }
        assert!(exact as u64 > reordered / 2, "{exact} of {reordered}");
    }

    #[test]
    fn a_reordered_frame_leaves_after_its_timeout_when_nothing_follows() {
        let r = rule("reorder=100%");
        let mut inj = FaultInjector::new(&r, 0, 0);
        let mut out = Vec::new();
        inj.offer(&frame(1), 1_000, &mut |b| out.push(number(b)));
        assert!(out.is_empty());
        let due = 1_000 + REORDER_TIMEOUT.as_nanos() as u64;
        assert_eq!(inj.next_due(), Some(due));
        inj.release(due - 1, &mut |b| out.push(number(b)));
        assert!(out.is_empty());
        inj.release(due, &mut |b| out.push(number(b)));
        assert_eq!(out, [1]);
        assert_eq!(inj.held(), 0);
    }

    #[test]
    fn delay_releases_no_earlier_than_the_delay_and_keeps_the_order() {
        let r = rule("delay=200us");
        let mut inj = FaultInjector::new(&r, 0, 0);
        let mut out: Vec<(u32, u64)> = Vec::new();
        let mut now = 0;
        let mut offered_at = Vec::new();
        for i in 0..100 {
            offered_at.push(now);
            let t = now;
            inj.offer(&frame(i), now, &mut |b| out.push((number(b), t)));
            now += 7_000;
            let t = now;
            inj.release(now, &mut |b| out.push((number(b), t)));
        }
        while inj.held() > 0 {
            now += 7_000;
            let t = now;
            inj.release(now, &mut |b| out.push((number(b), t)));
        }
        assert_eq!(out.len(), 100);
        for (k, &(n, left)) in out.iter().enumerate() {
            assert_eq!(n, k as u32, "in order");
            let waited = left - offered_at[n as usize];
            assert!(
                (200_000..200_000 + 7_000).contains(&waited),
                "frame {n} waited {waited} ns"
            );
        }
        assert_eq!(inj.counters().delayed, 100);
    }

    #[test]
    fn a_corrupted_frame_differs_in_exactly_one_byte_past_the_ethernet_header() {
        let r = rule("corrupt=100%,seed=3");
        let mut inj = FaultInjector::new(&r, 0, 0);
        for i in 0..500 {
            let original = frame(i);
            let mut out = Vec::new();
            inj.offer(&original, 0, &mut |b| out.push(b.to_vec()));
            assert_eq!(out.len(), 1);
            let diff: Vec<usize> = (0..original.len())
                .filter(|&j| out[0][j] != original[j])
                .collect();
            assert_eq!(diff.len(), 1, "{diff:?}");
            assert!(diff[0] >= ETHERNET_HEADER_LEN, "{diff:?}");
        }
        assert_eq!(inj.counters().corrupted, 500);
        // Nothing past the header to flip: passes unchanged.
        let mut out = Vec::new();
        inj.offer(&[7u8; ETHERNET_HEADER_LEN], 0, &mut |b| {
            out.push(b.to_vec())
        });
        assert_eq!(out, [vec![7u8; ETHERNET_HEADER_LEN]]);
    }

    #[test]
    fn duplicates_follow_at_once() {
        let r = rule("duplicate=100%");
        let mut inj = FaultInjector::new(&r, 0, 0);
        let out: Vec<u32> = run(&mut inj, 3).iter().map(|f| number(f)).collect();
        assert_eq!(out, [0, 0, 1, 1, 2, 2]);
        assert_eq!(inj.counters().duplicated, 3);
    }

    #[test]
    fn the_holding_queue_is_bounded() {
        let r = rule("delay=1s,reorder=50%,hold=10");
        let mut inj = FaultInjector::new(&r, 0, 0);
        let mut out = 0;
        for i in 0..1_000 {
            inj.offer(&frame(i), u64::from(i), &mut |_| out += 1);
            assert!(inj.held() <= 10);
        }
        let c = inj.counters();
        assert_eq!(c.held_overflow, 990);
        assert_eq!(c.delayed + c.reordered, 10);
        inj.release(u64::MAX, &mut |_| out += 1);
        assert_eq!(out, 10);
        assert_eq!(inj.held(), 0);
    }

    #[test]
    fn the_proto_filter_lets_other_frames_pass_uncounted() {
        let r = rule("drop=100%,proto=tcp");
        let mut inj = FaultInjector::new(&r, 0, 0);
        let mut out = 0;
        let udp = frame(1);
        let mut tcp = frame(2);
        tcp[14 + 9] = 6;
        let arp = {
            let mut f = frame(3);
            f[12..14].copy_from_slice(&[0x08, 0x06]);
            f
        };
        for f in [&udp, &tcp, &arp] {
            inj.offer(f, 0, &mut |_| out += 1);
        }
        assert_eq!(out, 2);
        assert_eq!((inj.counters().frames, inj.counters().dropped), (1, 1));
        assert!(ProtoFilter::Ip.selects(&udp) && !ProtoFilter::Ip.selects(&arp));
        assert!(ProtoFilter::Udp.selects(&udp) && !ProtoFilter::Udp.selects(&tcp));
        assert!(!ProtoFilter::Tcp.selects(&[0u8; 5]));
    }

    #[test]
    fn selectors_match_their_ports() {
        let mac = MacAddr([2, 0, 0, 0, 0, 9]);
        let app = PortIdentity::App { name: "echo", mac };
        let trunk = PortIdentity::Trunk(MacAddr([2, 0, 0, 0, 0, 1]));
        assert!(PortSelector::All.matches(&app) && PortSelector::All.matches(&trunk));
        assert!(PortSelector::Trunk.matches(&trunk) && !PortSelector::Trunk.matches(&app));
        assert!(PortSelector::Mac(mac).matches(&app) && !PortSelector::Mac(mac).matches(&trunk));
        assert!(PortSelector::App("echo".into()).matches(&app));
        assert!(!PortSelector::App("echo2".into()).matches(&app));
        assert!(!PortSelector::Generator.matches(&app));
    }
}
