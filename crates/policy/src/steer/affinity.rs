//! Calisto's flow-affinity steering (docs/design.md, "Packet steering"): a
//! bounded flow → kthread table. The first packet of a flow picks a kthread
//! round-robin over the active ones and later packets follow it; when that
//! kthread holds no core, the flow gets the next round-robin kthread and the
//! move is counted.
//!
//! The table is set-associative ([`AFFINITY_WAYS`] entries per set, sets a
//! power of two), sized once: a packet costs one set lookup and at most one
//! insertion, never an allocation. A new flow whose set is full evicts the
//! flow of that set seen longest ago, so a flood of new flows (a SYN flood, a
//! port scan) can only evict idle flows first and the table never grows.

use super::{SteerStats, Steering};
use crate::Time;

/// Entries per set of [`FlowAffinity`]'s table.
pub const AFFINITY_WAYS: usize = 4;

/// Flows [`FlowAffinity::new`] remembers by default.
pub const DEFAULT_FLOW_TABLE_CAPACITY: usize = 8192;

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    hash: u64,
    /// When the flow's last packet was steered.
    seen: Time,
    /// The flow's kthread + 1; 0: the entry is empty.
    kthread: u32,
}

// `mix` spreads a flow hash over the table's sets and the pre-assigned
// ranges (the wire hash may carry little entropy in its low bits).
use super::mix;

/// Calisto's flow → kthread table; see the module docs.
#[derive(Clone, Debug)]
pub struct FlowAffinity {
    entries: Box<[Entry]>,
    /// `log2` of the number of sets.
    set_bits: u32,
    /// Next round-robin position over the active kthreads.
    round_robin: usize,
    /// Pre-populated: every flow's first kthread is fixed by its hash range
    /// over this many kthreads, so a flow needs an entry only once it must
    /// leave that kthread (`None`: plain Calisto, every new flow inserted).
    prepopulated_over: Option<usize>,
    /// Until this time, every other new flow is steered round-robin without
    /// an insertion (Calisto's future work: cheaper warm-up).
    warm_up_until: Time,
    warm_up_skip: bool,
    /// An entry seen more recently than this is not evicted; a new flow that
    /// finds its set full of such entries goes uninserted, by hash.
    min_idle: Time,
    stats: SteerStats,
}

impl FlowAffinity {
    /// A table of at least `capacity` flows (rounded up to a power of two,
    /// at least one set).
    pub fn new(capacity: usize) -> Self {
        let sets = capacity.div_ceil(AFFINITY_WAYS).max(1).next_power_of_two();
        let entries = vec![Entry::default(); sets * AFFINITY_WAYS].into_boxed_slice();
        let stats = SteerStats {
            table_bytes: std::mem::size_of_val(&*entries) as u64,
            ..Default::default()
        };
        FlowAffinity {
            entries,
            set_bits: sets.trailing_zeros(),
            round_robin: 0,
            prepopulated_over: None,
            warm_up_until: 0,
            warm_up_skip: false,
            min_idle: 0,
            stats,
        }
    }

    /// Pre-populated (Calisto's future work): hash ranges are assigned to
    /// `kthreads` kthreads in advance, so a flow whose range's kthread is
    /// active costs one lookup and no insertion — there is no warm-up.
    pub fn prepopulated(mut self, kthreads: usize) -> Self {
        self.prepopulated_over = Some(kthreads.max(1));
        self
    }

    /// Round-robin while the table warms up (Calisto's future work): before
    /// `until`, every other new flow is not inserted and its packet goes to
    /// the next kthread round-robin (its later packets may land elsewhere).
    pub fn warm_up_round_robin(mut self, until: Time) -> Self {
        self.warm_up_until = until;
        self
    }

    /// Entries seen within `min_idle` are never evicted (0: plain LRU).
    pub fn min_idle(mut self, min_idle: Time) -> Self {
        self.min_idle = min_idle;
        self
    }

    /// Flows the table can hold.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    fn next_round_robin(&mut self, active: &[usize]) -> usize {
        let k = active[self.round_robin % active.len()];
        self.round_robin = self.round_robin.wrapping_add(1);
        k
    }

    /// The kthread a pre-populated table assigns to `hash`, if any.
    fn prepopulated_kthread(&self, hash: u64) -> Option<usize> {
        let n = self.prepopulated_over?;
        Some(((u128::from(mix(hash)) * n as u128) >> 64) as usize)
    }
}

impl Steering for FlowAffinity {
    fn name(&self) -> &'static str {
        "flow-affinity"
    }

    fn pick(&mut self, hash: u64, active: &[usize], now: Time) -> usize {
        let set = match self.set_bits {
            0 => 0,
            bits => (mix(hash) >> (64 - bits)) as usize,
        };
        let first = set * AFFINITY_WAYS;
        // A known flow follows its kthread, or moves if it lost its core.
        if let Some(i) = (first..first + AFFINITY_WAYS)
            .find(|&i| self.entries[i].kthread != 0 && self.entries[i].hash == hash)
        {
            self.stats.table_hits += 1;
            let k = (self.entries[i].kthread - 1) as usize;
            let k = if active.binary_search(&k).is_ok() {
                k
            } else {
                self.stats.flows_moved += 1;
                let to = self.next_round_robin(active);
                self.entries[i].kthread = to as u32 + 1;
                to
            };
            self.entries[i].seen = now;
            return k;
        }
        // A new flow (or one the table forgot).
        let k = match self.prepopulated_kthread(hash) {
            Some(k) if active.binary_search(&k).is_ok() => return k,
            _ => self.next_round_robin(active),
        };
        if now < self.warm_up_until {
            self.warm_up_skip = !self.warm_up_skip;
            if self.warm_up_skip {
                return k;
            }
        }
        let ways = &mut self.entries[first..first + AFFINITY_WAYS];
        let victim = match ways.iter().position(|e| e.kthread == 0) {
            Some(empty) => empty,
            None => {
                let (lru, oldest) = ways
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, e)| e.seen)
                    .map(|(i, e)| (i, e.seen))
                    .expect("a set has ways");
                if now.saturating_sub(oldest) < self.min_idle {
                    // Every flow of the set is busy: leave them, steer this
                    // one by its hash (stable while the active set is).
                    self.stats.table_full += 1;
                    return active[(hash % active.len() as u64) as usize];
                }
                self.stats.table_evictions += 1;
                lru
            }
        };
        ways[victim] = Entry {
            hash,
            seen: now,
            kthread: k as u32 + 1,
        };
        self.stats.table_inserts += 1;
        k
    }

    fn route(&self, hash: u64, active: &[usize]) -> Option<usize> {
        let set = match self.set_bits {
            0 => 0,
            bits => (mix(hash) >> (64 - bits)) as usize,
        };
        let first = set * AFFINITY_WAYS;
        let known = self.entries[first..first + AFFINITY_WAYS]
            .iter()
            .find(|e| e.kthread != 0 && e.hash == hash)
            .map(|e| (e.kthread - 1) as usize)
            .or_else(|| self.prepopulated_kthread(hash))?;
        // A flow whose kthread lost its core moves at its next packet, to
        // whichever kthread round-robin then gives.
        active.binary_search(&known).is_ok().then_some(known)
    }

    // Lazy: a flow whose kthread lost its core moves at its next packet.
    fn activated(&mut self, _kthread: usize, _active: &[usize], _now: Time) {}

    fn deactivated(&mut self, _kthread: usize, _active: &[usize], _now: Time) {}

    fn flows_moved(&self) -> u64 {
        self.stats.flows_moved
    }

    fn stats(&self) -> SteerStats {
        self.stats
    }
}
