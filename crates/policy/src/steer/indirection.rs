//! Indirection steering (docs/design.md, "Packet steering"; after RSS++): a
//! fixed table of buckets, bucket → kthread, `hash % buckets` picking the
//! bucket. A change of the active set moves only the buckets that must move
//! (the lost kthread's, or a fair share for the new one taken from the
//! kthreads holding most), so flows of kthreads that stay active stay put.
//! Each bucket remembers its home kthread (the last it was given to by a
//! fair share or a rebalance): a kthread that comes back takes its fair
//! share from the buckets whose home it is first, so a core lost and
//! regained moves the same flows away and back rather than a fresh share
//! each time;
//! [`Steering::rebalance`] moves hot buckets off the most loaded kthread,
//! a bounded number per call, by the packets each bucket steered since the
//! previous look (it looks once enough packets were steered to tell).

use super::{modulo, MoveCounter, SteerStats, Steering};
use crate::alloc::KthreadSnap;
use crate::Time;

/// Buckets of [`Indirection::new`]'s default table.
pub const DEFAULT_BUCKETS: usize = 512;

/// Buckets one [`Steering::rebalance`] moves at most by default.
pub const DEFAULT_MAX_MOVES_PER_REBALANCE: usize = 8;

/// No owner yet.
const NONE: u32 = u32::MAX;

/// Rebalancing starts when the hottest kthread steered this many packets
/// more than the coldest since the previous call (too few to matter below)…
const MIN_IMBALANCE_PACKETS: u64 = 32;

/// …and more than this fraction (1/4) of the coldest's packets.
const IMBALANCE_SHIFT: u32 = 2;

/// A rebalance looks at the buckets only once this many packets per bucket
/// were steered since the last look: iokerneld offers one every allocation
/// pass (5 µs), far too few packets apart to tell a hot bucket, and a look
/// costs a pass over the table.
const REBALANCE_PACKETS_PER_BUCKET: u64 = 8;

/// The bucket table; see the module docs.
#[derive(Clone, Debug)]
pub struct Indirection {
    /// Bucket → kthread (`NONE` before the first activation).
    owner: Box<[u32]>,
    /// Bucket → the kthread it returns to when that one is active
    /// (`NONE`: none yet).
    home: Box<[u32]>,
    /// Packets per bucket since the previous rebalance.
    packets: Box<[u32]>,
    /// Per kthread: the buckets it owns, whether it is active, and scratch
    /// for rebalance's load sums (grown on notices, never per packet).
    owned: Vec<u32>,
    is_active: Vec<bool>,
    load: Vec<u64>,
    max_moves: usize,
    /// Packets steered since the last look at the buckets.
    since_rebalance: u64,
    moves: MoveCounter,
    stats: SteerStats,
}

impl Indirection {
    /// A table of `buckets` (`> 0`) buckets, rebalancing at most
    /// [`DEFAULT_MAX_MOVES_PER_REBALANCE`] buckets per call.
    pub fn new(buckets: usize) -> Self {
        assert!(buckets > 0, "an indirection table of zero buckets");
        let owner = vec![NONE; buckets].into_boxed_slice();
        let packets = vec![0u32; buckets].into_boxed_slice();
        let home = owner.clone();
        let stats = SteerStats {
            table_bytes: (std::mem::size_of_val(&*owner)
                + std::mem::size_of_val(&*home)
                + std::mem::size_of_val(&*packets)) as u64,
            ..Default::default()
        };
        Indirection {
            owner,
            home,
            packets,
            owned: Vec::new(),
            is_active: Vec::new(),
            load: Vec::new(),
            max_moves: DEFAULT_MAX_MOVES_PER_REBALANCE,
            since_rebalance: 0,
            moves: MoveCounter::new(),
            stats,
        }
    }

    /// Moves at most `max_moves` buckets per rebalance (0: never rebalances).
    pub fn max_moves_per_rebalance(mut self, max_moves: usize) -> Self {
        self.max_moves = max_moves;
        self
    }

    /// The kthread owning each bucket (`None` before any activation).
    pub fn owners(&self) -> impl Iterator<Item = Option<usize>> + '_ {
        self.owner
            .iter()
            .map(|&k| (k != NONE).then_some(k as usize))
    }

    fn know(&mut self, kthread: usize) {
        if self.owned.len() <= kthread {
            self.owned.resize(kthread + 1, 0);
            self.is_active.resize(kthread + 1, false);
            self.load.resize(kthread + 1, 0);
        }
    }

    fn owner_active(&self, k: u32) -> bool {
        k != NONE && self.is_active.get(k as usize) == Some(&true)
    }

    /// [`Indirection::give`], making `to` the bucket's home.
    fn settle(&mut self, bucket: usize, to: usize) {
        self.home[bucket] = to as u32;
        self.give(bucket, to);
    }

    fn give(&mut self, bucket: usize, to: usize) {
        let from = self.owner[bucket];
        if from == to as u32 {
            return;
        }
        if from != NONE {
            self.owned[from as usize] -= 1;
            self.stats.buckets_moved += 1;
        }
        self.owner[bucket] = to as u32;
        self.owned[to] += 1;
    }

    /// The active kthread owning fewest buckets.
    fn least_owned(&self, active: &[usize]) -> usize {
        *active
            .iter()
            .min_by_key(|&&k| self.owned[k])
            .expect("an active kthread")
    }
}

impl Steering for Indirection {
    fn name(&self) -> &'static str {
        "indirection"
    }

    fn pick(&mut self, hash: u64, active: &[usize], _now: Time) -> usize {
        // A mask for a power-of-two table (the default): once per packet.
        let bucket = modulo(hash, self.owner.len());
        self.packets[bucket] = self.packets[bucket].saturating_add(1);
        self.since_rebalance += 1;
        let owner = self.owner[bucket];
        let k = if self.owner_active(owner) {
            owner as usize
        } else {
            // Not reached through `AppSteering` (every change is noticed);
            // a direct caller still gets an active kthread.
            active[(hash % active.len() as u64) as usize]
        };
        self.moves.saw(hash, k);
        k
    }

    fn route(&self, hash: u64, active: &[usize]) -> Option<usize> {
        let owner = self.owner[modulo(hash, self.owner.len())];
        Some(if self.owner_active(owner) {
            owner as usize
        } else {
            active[(hash % active.len() as u64) as usize]
        })
    }

    fn activated(&mut self, kthread: usize, active: &[usize], _now: Time) {
        for &k in active {
            self.know(k);
        }
        self.is_active[kthread] = true;
        // Buckets without an active owner (none yet, or all kthreads were
        // inactive) go to the active kthreads owning fewest.
        for b in 0..self.owner.len() {
            if !self.owner_active(self.owner[b]) {
                let to = if active.len() == 1 {
                    kthread
                } else {
                    self.least_owned(active)
                };
                if self.home[b] == NONE {
                    self.settle(b, to);
                } else {
                    self.give(b, to);
                }
            }
        }
        // The newcomer's fair share, taken one bucket at a time from the
        // kthread owning most (`load` counts what each gives); the rest stay.
        let share = self.owner.len() / active.len();
        for &k in active {
            self.load[k] = 0;
        }
        let mut taken = self.owned[kthread] as usize;
        while taken < share {
            let donor = *active
                .iter()
                .filter(|&&k| k != kthread)
                .max_by_key(|&&k| u64::from(self.owned[k]) - self.load[k])
                .expect("another active kthread");
            if u64::from(self.owned[donor]) - self.load[donor] <= taken as u64 + 1 {
                break;
            }
            self.load[donor] += 1;
            taken += 1;
        }
        // Which buckets each donor gives: first those whose home is the
        // newcomer (they come back), then any.
        for homecoming in [true, false] {
            for b in 0..self.owner.len() {
                let from = self.owner[b] as usize;
                if from != kthread
                    && self.load[from] > 0
                    && (!homecoming || self.home[b] == kthread as u32)
                {
                    self.load[from] -= 1;
                    self.settle(b, kthread);
                }
            }
        }
    }

    fn deactivated(&mut self, kthread: usize, active: &[usize], _now: Time) {
        self.know(kthread);
        self.is_active[kthread] = false;
        if active.is_empty() {
            return; // its buckets wait for the next activation
        }
        for b in 0..self.owner.len() {
            if self.owner[b] == kthread as u32 {
                let to = self.least_owned(active);
                self.give(b, to);
            }
        }
    }

    fn rebalance(&mut self, _now: Time, active: &[usize], _kthreads: &[KthreadSnap]) {
        if self.since_rebalance < REBALANCE_PACKETS_PER_BUCKET * self.owner.len() as u64 {
            return; // too few packets yet to tell hot buckets (and cheap)
        }
        self.since_rebalance = 0;
        if active.len() >= 2 && self.max_moves > 0 {
            for &k in active {
                self.know(k);
                self.load[k] = 0;
            }
            for (b, &k) in self.owner.iter().enumerate() {
                if self.owner_active(k) {
                    self.load[k as usize] += u64::from(self.packets[b]);
                }
            }
            for _ in 0..self.max_moves {
                let hot = *active.iter().max_by_key(|&&k| self.load[k]).unwrap();
                let cold = *active.iter().min_by_key(|&&k| self.load[k]).unwrap();
                let (h, c) = (self.load[hot], self.load[cold]);
                if h < c + MIN_IMBALANCE_PACKETS || h - c <= c >> IMBALANCE_SHIFT {
                    break;
                }
                // The hot kthread's busiest bucket that narrows the gap:
                // lighter than the gap, so the cold one does not overtake.
                let gap = h - c;
                let best = (0..self.owner.len())
                    .filter(|&b| self.owner[b] == hot as u32)
                    .map(|b| (b, u64::from(self.packets[b])))
                    .filter(|&(_, p)| p > 0 && p < gap)
                    .max_by_key(|&(_, p)| p);
                let Some((b, p)) = best else { break };
                self.settle(b, cold);
                self.load[hot] -= p;
                self.load[cold] += p;
            }
        }
        self.packets.fill(0);
    }

    fn flows_moved(&self) -> u64 {
        self.moves.moved()
    }

    fn stats(&self) -> SteerStats {
        SteerStats {
            flows_moved: self.moves.moved(),
            ..self.stats
        }
    }
}
