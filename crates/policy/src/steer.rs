//! Packet steering (docs/design.md, "Packet steering"): which of an
//! application's kthreads receives a packet, given the packet's flow hash.
//!
//! A policy implements [`Steering`]; [`AppSteering`] keeps one application's
//! set of active kthreads in step with it and is what iokerneld's dataplane
//! and the simulator call. Flow hashes come from the wire layer
//! (`ginza_net::flow`); here a hash is just a number.
//!
//! Implemented: [`RssMod`] (Shenango: `active[hash % active.len()]`),
//! [`FlowAffinity`] (Calisto: a bounded flow → kthread table) and
//! [`Indirection`] (after RSS++: buckets → kthread, moved consistently);
//! [`SteeringKind`] names them for configuration.

use crate::alloc::KthreadSnap;
use crate::Time;

mod affinity;
mod indirection;

pub use affinity::{FlowAffinity, AFFINITY_WAYS, DEFAULT_FLOW_TABLE_CAPACITY};
pub use indirection::{Indirection, DEFAULT_BUCKETS, DEFAULT_MAX_MOVES_PER_REBALANCE};

/// Flows remembered by [`MoveCounter`] (a power of two): with 1,000 live
/// flows, 88 % have a slot of their own.
pub const MOVE_COUNTER_SLOTS: usize = 8192;

/// Flows an [`AppSteering`] tracks to count the flows each change of the
/// active set remaps (a power of two; with more live flows, a sample).
pub const TRACKED_FLOWS: usize = 4096;

/// Spreads a flow hash over a table's slots (Fibonacci hashing: the top
/// bits of the product depend on every bit of the hash).
pub(crate) fn mix(hash: u64) -> u64 {
    hash.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A steering policy for one application.
///
/// Kthreads are named by their index in the application (0-based). The
/// caller tells the policy every change of the active set (the kthreads that
/// hold a core) before the next [`Steering::pick`], and may ask it to look
/// at the queues once per allocation pass ([`Steering::rebalance`]). A
/// policy that remembers flows (a flow table, buckets) keeps that state
/// itself, sized when it is built: nothing here allocates per packet.
pub trait Steering {
    /// The policy's name, as configuration and reports spell it.
    fn name(&self) -> &'static str;

    /// The kthread for a packet of the flow hashing to `hash`: one of
    /// `active` (ascending, never empty). Called once per packet.
    fn pick(&mut self, hash: u64, active: &[usize], now: Time) -> usize;

    /// [`Steering::pick`] for each of `hashes` in turn, into `out` (cleared
    /// first): the same decisions and counts, one call per burst of
    /// packets (iokerneld's dataplane steers a burst at a time).
    fn pick_burst(&mut self, hashes: &[u64], active: &[usize], now: Time, out: &mut Vec<usize>) {
        out.clear();
        out.extend(hashes.iter().map(|&hash| self.pick(hash, active, now)));
    }

    /// Where a packet of the flow `hash` would go now, changing nothing (no
    /// insertion, no count), `active` as for [`Steering::pick`]; `None` when
    /// the policy decides only at the flow's next packet (a flow table's
    /// unknown flow, or one whose kthread lost its core). [`AppSteering`]
    /// asks it after each change of the active set, to count the flows the
    /// change remapped; the default knows nothing.
    fn route(&self, hash: u64, active: &[usize]) -> Option<usize> {
        let _ = (hash, active);
        None
    }

    /// `kthread` became active; `active` is the set that now includes it.
    fn activated(&mut self, kthread: usize, active: &[usize], now: Time);

    /// `kthread` became inactive; `active` is the set without it (it may
    /// be empty).
    fn deactivated(&mut self, kthread: usize, active: &[usize], now: Time);

    /// A periodic look at the application's queues (`kthreads`, indexed
    /// like the kthreads), for a policy that moves load between kthreads.
    /// Called once per allocation pass; the default does nothing.
    fn rebalance(&mut self, now: Time, active: &[usize], kthreads: &[KthreadSnap]) {
        let _ = (now, active, kthreads);
    }

    /// Flows moved from one kthread to another so far (docs/design.md: "flows
    /// moved per core change").
    fn flows_moved(&self) -> u64;

    /// The policy's counters so far; the default knows only
    /// [`Steering::flows_moved`].
    fn stats(&self) -> SteerStats {
        SteerStats {
            flows_moved: self.flows_moved(),
            ..Default::default()
        }
    }
}

/// What a policy counted (zero where it keeps no such state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerStats {
    /// Flows moved from one kthread to another.
    pub flows_moved: u64,
    /// Flows entered into a flow table.
    pub table_inserts: u64,
    /// Packets whose flow the table knew.
    pub table_hits: u64,
    /// Flows evicted from a full table to make room for a new one.
    pub table_evictions: u64,
    /// New flows left out of a table whose set held only busy flows.
    pub table_full: u64,
    /// Memory of the policy's table(s), fixed at construction.
    pub table_bytes: u64,
    /// Buckets moved from one kthread to another (indirection).
    pub buckets_moved: u64,
}

/// The steering policies, as configuration names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SteeringKind {
    /// [`RssMod`].
    #[default]
    RssMod,
    /// [`FlowAffinity`].
    FlowAffinity,
    /// [`Indirection`].
    Indirection,
}

impl SteeringKind {
    /// Every policy, in a stable order.
    pub const ALL: [SteeringKind; 3] = [
        SteeringKind::RssMod,
        SteeringKind::FlowAffinity,
        SteeringKind::Indirection,
    ];

    /// The name configuration and reports use.
    pub fn name(self) -> &'static str {
        match self {
            SteeringKind::RssMod => "rss-mod",
            SteeringKind::FlowAffinity => "flow-affinity",
            SteeringKind::Indirection => "indirection",
        }
    }

    /// A small number for the wire (`0` is `rss-mod`).
    pub fn code(self) -> u8 {
        match self {
            SteeringKind::RssMod => 0,
            SteeringKind::FlowAffinity => 1,
            SteeringKind::Indirection => 2,
        }
    }

    /// The kind [`SteeringKind::code`] gave `code`.
    pub fn from_code(code: u8) -> Option<SteeringKind> {
        SteeringKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The policy for an application of `kthreads` kthreads.
    pub fn build(self, kthreads: usize, options: &SteeringOptions) -> Box<dyn Steering + Send> {
        match self {
            SteeringKind::RssMod => Box::new(RssMod::new()),
            SteeringKind::FlowAffinity => {
                let mut table = FlowAffinity::new(options.flow_table_capacity)
                    .warm_up_round_robin(options.warm_up_until)
                    .min_idle(options.flow_min_idle);
                if options.prepopulate {
                    table = table.prepopulated(kthreads);
                }
                Box::new(table)
            }
            SteeringKind::Indirection => Box::new(
                Indirection::new(options.buckets).max_moves_per_rebalance(options.max_bucket_moves),
            ),
        }
    }
}

impl std::fmt::Display for SteeringKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SteeringKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        SteeringKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown steering policy {s:?} (rss-mod, flow-affinity, indirection)")
            })
    }
}

/// The sizes and options [`SteeringKind::build`] gives a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SteeringOptions {
    /// `flow-affinity`: flows the table holds.
    pub flow_table_capacity: usize,
    /// `flow-affinity`: hash ranges pre-assigned, no warm-up.
    pub prepopulate: bool,
    /// `flow-affinity`: round-robin for every other new flow before this time.
    pub warm_up_until: Time,
    /// `flow-affinity`: flows seen within this are never evicted.
    pub flow_min_idle: Time,
    /// `indirection`: buckets of the table.
    pub buckets: usize,
    /// `indirection`: buckets moved per rebalance at most.
    pub max_bucket_moves: usize,
}

impl Default for SteeringOptions {
    fn default() -> Self {
        SteeringOptions {
            flow_table_capacity: DEFAULT_FLOW_TABLE_CAPACITY,
            prepopulate: false,
            warm_up_until: 0,
            flow_min_idle: 0,
            buckets: DEFAULT_BUCKETS,
            max_bucket_moves: DEFAULT_MAX_MOVES_PER_REBALANCE,
        }
    }
}

/// Shenango's (and plain RSS's) steering: kthread `active[hash %
/// active.len()]`. Stateless, so every change of the active set moves most
/// flows; a [`MoveCounter`] counts the moves it sees.
#[derive(Clone, Debug)]
pub struct RssMod {
    moves: MoveCounter,
}

impl RssMod {
    pub fn new() -> Self {
        RssMod {
            moves: MoveCounter::new(),
        }
    }
}

impl Default for RssMod {
    fn default() -> Self {
        Self::new()
    }
}

/// `hash % n` (n > 0), without the division where `n` is a power of two
/// (one active kthread, two, four …): a 64-bit division is a few ns, and
/// this runs once per packet on iokerneld's forwarding path.
pub(crate) fn modulo(hash: u64, n: usize) -> usize {
    if n.is_power_of_two() {
        (hash & (n as u64 - 1)) as usize
    } else {
        (hash % n as u64) as usize
    }
}

impl Steering for RssMod {
    fn name(&self) -> &'static str {
        "rss-mod"
    }

    fn pick(&mut self, hash: u64, active: &[usize], _now: Time) -> usize {
        let kthread = active[modulo(hash, active.len())];
        self.moves.saw(hash, kthread);
        kthread
    }

    fn route(&self, hash: u64, active: &[usize]) -> Option<usize> {
        Some(active[modulo(hash, active.len())])
    }

    // The modulo needs no notice: the next packet of each flow lands where
    // the new set says, and the move counter sees it there.
    fn activated(&mut self, _kthread: usize, _active: &[usize], _now: Time) {}

    fn deactivated(&mut self, _kthread: usize, _active: &[usize], _now: Time) {}

    fn flows_moved(&self) -> u64 {
        self.moves.moved()
    }
}

/// Counts flows whose packet went to another kthread than the flow's
/// previous packet, for policies that keep no flow table of their own.
///
/// It remembers the last kthread of recently seen flows in a fixed table of
/// [`MOVE_COUNTER_SLOTS`] slots indexed by the hash (sized once; a flow whose
/// slot another flow took is forgotten, so with more live flows than slots
/// the count is a lower bound).
#[derive(Clone, Debug)]
pub struct MoveCounter {
    /// Per slot: the flow's hash and its last kthread + 1 (0: empty).
    slots: Box<[(u64, u32)]>,
    moved: u64,
    /// The last packet seen, as its slot now holds it (kthread + 1; 0:
    /// none): a packet of the same flow to the same kthread changes
    /// nothing, and a burst of one flow is mostly such packets.
    last: (u64, u32),
}

impl MoveCounter {
    pub fn new() -> Self {
        MoveCounter {
            slots: vec![(0, 0); MOVE_COUNTER_SLOTS].into_boxed_slice(),
            moved: 0,
            last: (0, 0),
        }
    }

    /// A packet of the flow `hash` went to `kthread`.
    pub fn saw(&mut self, hash: u64, kthread: usize) {
        let now = kthread as u32 + 1;
        // Only `saw` writes the slots: the last packet's slot still holds
        // it, and this one would not count and write the same.
        if self.last == (hash, now) {
            return;
        }
        // Mixed: the wire hash may carry little entropy in its low bits,
        // and flows sharing a slot forget each other.
        let slot = &mut self.slots[Self::slot(hash)];
        if slot.0 == hash && slot.1 != 0 && slot.1 != now {
            self.moved += 1;
        }
        *slot = (hash, now);
        self.last = (hash, now);
    }

    /// The slot of flow `hash`: the top bits of the mixed hash.
    fn slot(hash: u64) -> usize {
        (mix(hash) >> (64 - MOVE_COUNTER_SLOTS.trailing_zeros())) as usize
    }

    /// Moves seen so far.
    pub fn moved(&self) -> u64 {
        self.moved
    }
}

impl Default for MoveCounter {
    fn default() -> Self {
        Self::new()
    }
}

/// The flows an [`AppSteering`] saw lately and the kthread each is mapped
/// to, for counting remapped flows: [`TRACKED_FLOWS`] slots indexed by the
/// flow's hash (a flow whose slot another took is forgotten).
#[derive(Clone, Debug)]
struct RemapTracker {
    /// Per slot: the flow's hash and its kthread + 1 (0: empty).
    slots: Box<[(u64, u32)]>,
    remapped: u64,
    /// The last packet seen, as its slot still holds it (kthread + 1; 0:
    /// none), as in [`MoveCounter`]; forgotten when `remap` writes slots.
    last: (u64, u32),
}

impl RemapTracker {
    fn new() -> Self {
        RemapTracker {
            slots: vec![(0, 0); TRACKED_FLOWS].into_boxed_slice(),
            remapped: 0,
            last: (0, 0),
        }
    }

    /// A packet of `hash` went to `kthread`: a known flow that went
    /// elsewhere than it was mapped to moved without a change of the active
    /// set telling (a lazy policy's move at the flow's next packet, a
    /// rebalance).
    fn saw(&mut self, hash: u64, kthread: usize) {
        let now = kthread as u32 + 1;
        if self.last == (hash, now) {
            return;
        }
        let slot = &mut self.slots[(mix(hash) >> (64 - TRACKED_FLOWS.trailing_zeros())) as usize];
        if slot.0 == hash && slot.1 != 0 && slot.1 != now {
            self.remapped += 1;
        }
        *slot = (hash, now);
        self.last = (hash, now);
    }

    /// After a change of the active set: every tracked flow the policy now
    /// routes to another kthread is remapped.
    fn remap(&mut self, policy: &dyn Steering, active: &[usize]) {
        self.last = (0, 0);
        for slot in self.slots.iter_mut().filter(|s| s.1 != 0) {
            if let Some(k) = policy.route(slot.0, active) {
                let now = k as u32 + 1;
                if slot.1 != now {
                    slot.1 = now;
                    self.remapped += 1;
                }
            }
        }
    }
}

/// Where [`AppSteering::steer`] sends a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steered {
    /// To this active kthread (the policy's pick).
    Active(usize),
    /// The application has no active kthread: to this parked kthread
    /// (`hash % kthreads`), and the caller tells the core allocator that
    /// work arrived (`CoreAllocator::on_work_for`).
    Parked(usize),
}

/// One application's steering: its policy and its set of active kthreads,
/// kept in step (every change reaches the policy as a notice).
pub struct AppSteering {
    policy: Box<dyn Steering + Send>,
    kthreads: usize,
    /// Ascending.
    active: Vec<usize>,
    /// Changes of the active set told to the policy.
    changes: u64,
    /// Counts remapped flows, when asked for ([`AppSteering::track_remaps`]).
    tracker: Option<RemapTracker>,
}

impl AppSteering {
    /// Steering over `kthreads` kthreads (`> 0`), none active yet.
    pub fn new(policy: Box<dyn Steering + Send>, kthreads: usize) -> Self {
        assert!(kthreads > 0, "steering over zero kthreads");
        AppSteering {
            policy,
            kthreads,
            active: Vec::with_capacity(kthreads),
            changes: 0,
            tracker: None,
        }
    }

    /// Also counts the flows each change of the active set remaps
    /// ([`AppSteering::flows_remapped`]): [`TRACKED_FLOWS`] slots of the
    /// flows seen lately (64 KiB), one slot write per packet, and after
    /// each change one [`Steering::route`] per tracked flow.
    pub fn track_remaps(mut self) -> Self {
        self.tracker = Some(RemapTracker::new());
        self
    }

    /// Brings the active set up to date: `is_active` says, for kthreads
    /// `0..kthreads` in order, whether each holds a core. Each kthread that
    /// changed is reported to the policy, in ascending order. Allocates
    /// nothing.
    pub fn sync(&mut self, is_active: impl IntoIterator<Item = bool>, now: Time) {
        let changes = self.changes;
        let mut at = 0; // position of kthread `k` in `active`, if there
        for (k, on) in is_active.into_iter().take(self.kthreads).enumerate() {
            let was = self.active.get(at) == Some(&k);
            match (was, on) {
                (true, true) => at += 1,
                (false, false) => {}
                (false, true) => {
                    self.active.insert(at, k);
                    at += 1;
                    self.changes += 1;
                    self.policy.activated(k, &self.active, now);
                }
                (true, false) => {
                    self.active.remove(at);
                    self.changes += 1;
                    self.policy.deactivated(k, &self.active, now);
                }
            }
        }
        if let Some(t) = &mut self.tracker {
            if self.changes != changes && !self.active.is_empty() {
                t.remap(&*self.policy, &self.active);
            }
        }
    }

    /// The kthreads that hold a core, ascending.
    pub fn active(&self) -> &[usize] {
        &self.active
    }

    /// Where a packet of the flow `hash` goes.
    pub fn steer(&mut self, hash: u64, now: Time) -> Steered {
        if self.active.is_empty() {
            return Steered::Parked((hash % self.kthreads as u64) as usize);
        }
        let k = self.policy.pick(hash, &self.active, now);
        if let Some(t) = &mut self.tracker {
            t.saw(hash, k);
        }
        Steered::Active(k)
    }

    /// [`AppSteering::steer`] for each of `hashes` in turn, with the same
    /// decisions and counts, one policy call per burst: the kthreads into
    /// `out` (cleared first); returns whether they are parked ones (no
    /// kthread is active: each packet goes to `hash % kthreads` and the
    /// caller tells the core allocator).
    pub fn steer_burst(&mut self, hashes: &[u64], now: Time, out: &mut Vec<usize>) -> bool {
        out.clear();
        if self.active.is_empty() {
            let n = self.kthreads as u64;
            out.extend(hashes.iter().map(|&hash| (hash % n) as usize));
            return true;
        }
        self.policy.pick_burst(hashes, &self.active, now, out);
        // The tracker after the policy: neither reads the other's state.
        if let Some(t) = &mut self.tracker {
            for (&hash, &k) in hashes.iter().zip(out.iter()) {
                t.saw(hash, k);
            }
        }
        false
    }

    /// Once per allocation pass: the policy's look at the queues.
    pub fn rebalance(&mut self, now: Time, kthreads: &[KthreadSnap]) {
        self.policy.rebalance(now, &self.active, kthreads);
    }

    /// Changes of the active set so far: each kthread that gained or lost
    /// its core counts one (docs/design.md: "flows moved per core change"
    /// is [`AppSteering::flows_moved`] over this).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Flows the policy moved so far, as it counts them: a packet of a flow
    /// that went to another kthread than the flow's previous packet (a flow
    /// with no packet while its kthread was away is not counted).
    pub fn flows_moved(&self) -> u64 {
        self.policy.flows_moved()
    }

    /// With [`AppSteering::track_remaps`]: flows remapped so far, among the
    /// tracked flows (docs/simulator.md, "Steering measurements"): after
    /// each change of the active set, those the policy's own mapping
    /// ([`Steering::route`]) sends to another kthread than before, whether
    /// or not a packet arrives before the next change; plus moves made at
    /// a flow's next packet (a lazy policy's, a rebalance's).
    pub fn flows_remapped(&self) -> Option<u64> {
        self.tracker.as_ref().map(|t| t.remapped)
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// The policy's counters.
    pub fn stats(&self) -> SteerStats {
        self.policy.stats()
    }
}

impl std::fmt::Debug for AppSteering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppSteering")
            .field("policy", &self.policy.name())
            .field("kthreads", &self.kthreads)
            .field("active", &self.active)
            .field("flows_moved", &self.policy.flows_moved())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn rss_mod_picks_the_modulo_of_the_active_set() {
        let mut rss = RssMod::new();
        for active in [&[3usize][..], &[0, 1], &[1, 4, 6], &[0, 2, 5, 7, 9]] {
            for hash in (0..500u64).chain([u64::MAX, u64::MAX - 7, 1 << 40]) {
                let want = active[(hash % active.len() as u64) as usize];
                assert_eq!(rss.pick(hash, active, 0), want, "{hash} over {active:?}");
            }
        }
        assert_eq!(rss.name(), "rss-mod");
    }

    /// Flows `0..300` (distinct move-counter slots) over every set change:
    /// each lands where the modulo of the new set says, and the counter
    /// counts exactly the flows whose kthread changed.
    #[test]
    fn rss_mod_moves_flows_as_the_modulo_says() {
        let mut st = AppSteering::new(Box::new(RssMod::new()), 4);
        let flows = 0..300u64;
        let sets: [[bool; 4]; 5] = [
            [true, true, true, false],
            [true, false, true, false],
            [true, false, true, true],
            [false, false, false, true],
            [true, true, true, true],
        ];
        let mut before: Vec<usize> = Vec::new();
        let mut moved = 0;
        for set in sets {
            st.sync(set, 0);
            let active: Vec<usize> = (0..4).filter(|&k| set[k]).collect();
            assert_eq!(st.active(), active);
            let now: Vec<usize> = flows
                .clone()
                .map(|h| match st.steer(h, 0) {
                    Steered::Active(k) => k,
                    s => panic!("{s:?}"),
                })
                .collect();
            for (h, &k) in flows.clone().zip(&now) {
                assert_eq!(k, active[h as usize % active.len()]);
            }
            moved += before.iter().zip(&now).filter(|(a, b)| a != b).count() as u64;
            assert_eq!(st.flows_moved(), moved);
            before = now;
        }
        // From 3 to 2 kthreads alone, most flows moved (Calisto Figs. 2-3).
        assert!(moved > 300, "{moved}");
    }

    /// The remap count is the policy's mapping, not the traffic: flows
    /// that send nothing during a short shrink are counted all the same,
    /// and the consistent policies remap about a quarter of rss-mod's.
    #[test]
    fn remapped_flows_are_counted_from_the_policy_mapping() {
        let build = |kind: SteeringKind| {
            AppSteering::new(kind.build(4, &SteeringOptions::default()), 4).track_remaps()
        };
        let flows = 0..1000u64;
        let mut remapped = Vec::new();
        for kind in SteeringKind::ALL {
            let mut st = build(kind);
            st.sync([true; 4], 0);
            for h in flows.clone() {
                st.steer(h, 1);
            }
            let tracked = st
                .tracker
                .as_ref()
                .unwrap()
                .slots
                .iter()
                .filter(|s| s.1 != 0)
                .count() as u64;
            assert!(tracked > 800, "{tracked}");
            assert_eq!(st.flows_remapped(), Some(0));
            // Kthread 3 away and back, no packet in between.
            st.sync([true, true, true, false], 2);
            let away = st.flows_remapped().unwrap();
            st.sync([true; 4], 3);
            let back = st.flows_remapped().unwrap() - away;
            eprintln!("{kind}: tracked {tracked}, away {away}, back {back}");
            match kind {
                // Every flow not on kthread 0 or whose modulo changed: most.
                SteeringKind::RssMod => {
                    assert!(away * 2 > tracked && back * 2 > tracked, "{away} {back}")
                }
                // Kthread 3's flows move away, and back to it.
                SteeringKind::Indirection => {
                    assert!(away * 5 < tracked * 2 && away * 6 > tracked, "{away}");
                    assert_eq!(back, away);
                }
                // Kthread 3's flows would move at their next packet: not
                // yet, and never back once moved.
                SteeringKind::FlowAffinity => assert_eq!((away, back), (0, 0)),
            }
            // Packets after the change follow the mapping: nothing more to
            // count, except flow-affinity's moves at the next packet.
            st.sync([true, true, true, false], 4);
            let before = st.flows_remapped().unwrap();
            for h in flows.clone() {
                st.steer(h, 5);
            }
            let lazy = st.flows_remapped().unwrap() - before;
            if kind == SteeringKind::FlowAffinity {
                assert!(lazy * 6 > tracked && lazy * 5 < tracked * 2, "{lazy}");
            } else {
                assert_eq!(lazy, 0, "{kind}");
            }
            remapped.push(st.flows_remapped().unwrap());
        }
        // Without tracking: nothing counted.
        assert_eq!(
            AppSteering::new(Box::new(RssMod::new()), 2).flows_remapped(),
            None
        );
        assert!(remapped[2] * 2 < remapped[0], "{remapped:?}");
        assert!(remapped[1] * 2 < remapped[0], "{remapped:?}");
    }

    /// A burst's decisions and counts are those of its packets steered
    /// one by one, for every policy, across changes of the active set
    /// (none active included), with flows repeated back to back (the move
    /// counters' shortcut) and interleaved.
    #[test]
    fn a_burst_steers_as_its_packets_one_by_one() {
        let sets: [[bool; 4]; 6] = [
            [true; 4],
            [true, true, true, false],
            [false; 4],
            [false, true, false, true],
            [true, false, false, false],
            [true; 4],
        ];
        let flows: Vec<u64> = (0..40u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9) ^ (i << 40))
            .collect();
        for kind in SteeringKind::ALL {
            let build =
                || AppSteering::new(kind.build(4, &SteeringOptions::default()), 4).track_remaps();
            let (mut one, mut burst) = (build(), build());
            let (mut seed, mut last) = (7u64, 0u64);
            let mut out = Vec::new();
            for (t, set) in sets.iter().enumerate() {
                let now = t as Time * 1_000;
                one.sync(*set, now);
                burst.sync(*set, now);
                for _ in 0..40 {
                    let hashes: Vec<u64> = (0..32)
                        .map(|_| {
                            seed = seed
                                .wrapping_mul(6_364_136_223_846_793_005)
                                .wrapping_add(1_442_695_040_888_963_407);
                            if (seed >> 60) >= 6 {
                                last = flows[(seed >> 33) as usize % flows.len()];
                            }
                            last
                        })
                        .collect();
                    let parked = burst.steer_burst(&hashes, now, &mut out);
                    assert_eq!(out.len(), hashes.len());
                    for (&hash, &k) in hashes.iter().zip(&out) {
                        match one.steer(hash, now) {
                            Steered::Active(want) => assert!(!parked && want == k, "{kind}"),
                            Steered::Parked(want) => assert!(parked && want == k, "{kind}"),
                        }
                    }
                    assert_eq!(one.stats(), burst.stats(), "{kind}");
                    assert_eq!(one.flows_remapped(), burst.flows_remapped(), "{kind}");
                }
            }
            // Not vacuous: flows moved and were remapped.
            assert!(burst.flows_remapped().unwrap() > 0, "{kind}");
            if kind != SteeringKind::FlowAffinity {
                assert!(burst.flows_moved() > 0, "{kind}");
            }
        }
    }

    #[test]
    fn the_move_counter_forgets_a_flow_whose_slot_was_taken() {
        let mut c = MoveCounter::new();
        let other = (6..)
            .find(|&h| MoveCounter::slot(h) == MoveCounter::slot(5))
            .unwrap();
        c.saw(5, 1);
        c.saw(5, 1);
        assert_eq!(c.moved(), 0);
        c.saw(5, 2);
        assert_eq!(c.moved(), 1);
        c.saw(other, 0);
        c.saw(5, 3); // forgotten: a first sight, not a move
        assert_eq!(c.moved(), 1);
    }

    /// A notice: `+` or `-`, the kthread, the active set after it.
    type Notice = (char, usize, Vec<usize>);

    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Notice>>>);

    impl Steering for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn pick(&mut self, _hash: u64, active: &[usize], _now: Time) -> usize {
            active[0]
        }
        fn activated(&mut self, kthread: usize, active: &[usize], _now: Time) {
            self.0.lock().unwrap().push(('+', kthread, active.to_vec()));
        }
        fn deactivated(&mut self, kthread: usize, active: &[usize], _now: Time) {
            self.0.lock().unwrap().push(('-', kthread, active.to_vec()));
        }
        fn flows_moved(&self) -> u64 {
            0
        }
    }

    #[test]
    fn every_change_of_the_active_set_is_told_once() {
        let rec = Recorder::default();
        let mut st = AppSteering::new(Box::new(rec.clone()), 4);
        st.sync([false, true, false, true], 0);
        st.sync([false, true, false, true], 1);
        st.sync([true, false, true, true], 2);
        st.sync([false; 4], 3);
        let log = rec.0.lock().unwrap().clone();
        assert_eq!(st.changes(), log.len() as u64);
        assert_eq!(
            log,
            vec![
                ('+', 1, vec![1]),
                ('+', 3, vec![1, 3]),
                ('+', 0, vec![0, 1, 3]),
                ('-', 1, vec![0, 3]),
                ('+', 2, vec![0, 2, 3]),
                ('-', 0, vec![2, 3]),
                ('-', 2, vec![3]),
                ('-', 3, vec![]),
            ]
        );
    }

    #[test]
    fn with_no_active_kthread_a_packet_goes_to_a_parked_one() {
        let mut st = AppSteering::new(Box::new(RssMod::new()), 3);
        assert_eq!(st.steer(7, 0), Steered::Parked(1));
        assert_eq!(st.steer(9, 0), Steered::Parked(0));
        st.sync([false, false, true], 0);
        assert_eq!(st.steer(7, 0), Steered::Active(2));
        // A longer list than the kthreads is cut, a shorter one leaves the
        // rest as they were.
        st.sync([true, true, true, true, true], 0);
        assert_eq!(st.active(), [0, 1, 2]);
        st.sync([false], 0);
        assert_eq!(st.active(), [1, 2]);
    }
}
