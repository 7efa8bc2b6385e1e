//! Core allocation between applications (Shenango §4.1): congestion
//! detection (Algorithm 1), core and kthread selection (Algorithm 2), and the
//! `static` and `slow` baselines, all behind [`CoreAllocator`].
//!
//! The caller (iokerneld, or the simulator) builds an [`AppSnap`] per
//! application from the per-kthread shared-memory lines, calls
//! [`CoreAllocator::pass`], and carries out the [`Decision`]s. Applications
//! and kthreads are named by their index in the snapshot slices; an
//! application's `key` must stay stable across passes (congestion detection
//! remembers the previous pass per key).
//!
//! How iokerneld drives it (times in ns here):
//!
//! ```
//! use ginza_policy::alloc::*;
//!
//! let topo = Topology::paired(4); // cores 0/1 and 2/3 are hyperthread pairs
//! let mut alloc = Shenango::new(5_000, 42); // pass every 5 µs, victim seed 42
//! let app = AppSnap {
//!     key: 1,
//!     class: AppClass::LatencyCritical,
//!     guaranteed: 0,
//!     max_cores: 2,
//!     kthreads: vec![
//!         // Runs on core 0; two threads queued (pushed 5, taken 3).
//!         KthreadSnap {
//!             core: Some(0),
//!             counters: QueueCounters { rq_head: 3, rq_tail: 5, ..Default::default() },
//!             ..Default::default()
//!         },
//!         KthreadSnap { parked: true, ..Default::default() },
//!     ],
//!     next_timer: None,
//!     last_yielded_core: None,
//!     netstack: None,
//!     granted_lately: false,
//! };
//! let mut out = Vec::new();
//! alloc.pass(0, &topo, std::slice::from_ref(&app), &mut out);
//! assert!(out.is_empty()); // first sight of those items
//! let congested = alloc.pass(5_000, &topo, std::slice::from_ref(&app), &mut out);
//! // Still queued 5 µs later: congested; the sibling of core 0 is granted.
//! assert_eq!(congested, [0]);
//! assert_eq!(out, vec![Decision::Grant { app: 0, kthread: 1, core: 1 }]);
//! ```

mod wanted;
use std::collections::HashMap;
pub use wanted::wanted_elsewhere;

use crate::rng::SplitMix64;
use crate::Time;

mod residency;
use residency::Residency;

pub type CoreId = usize;

/// The counters of one kthread's queue line. Each is a free-running
/// sequence number: `tail` counts items ever pushed, `head` items ever taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounters {
    pub rq_head: u32,
    pub rq_tail: u32,
    pub in_head: u32,
    pub in_tail: u32,
}

/// `a` is strictly before `b` in wrapping sequence space.
fn seq_before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

impl QueueCounters {
    /// Something is queued now (runqueue or ingress).
    pub fn has_items(&self) -> bool {
        self.rq_head != self.rq_tail || self.in_head != self.in_tail
    }

    /// An item that was already queued at the previous pass is still queued:
    /// the consumer has not reached the producer's previous position.
    pub fn congested_since(&self, prev: &QueueCounters) -> bool {
        seq_before(self.rq_head, prev.rq_tail) || seq_before(self.in_head, prev.in_tail)
    }
}

/// One kthread as iokerneld sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KthreadSnap {
    pub counters: QueueCounters,
    /// The core it holds (runs on, or has been granted and is waking on).
    pub core: Option<CoreId>,
    /// Parked: holds no core and waits for a grant (only parked kthreads can
    /// be woken; one being preempted is neither active nor parked).
    pub parked: bool,
    /// When it parked; Algorithm 2 wakes the one parked longest.
    pub parked_since: Time,
    /// The core it last ran on.
    pub last_core: Option<CoreId>,
    /// Cumulative useful (busy) time, for the utilization-based `slow` policy.
    pub busy_time: Time,
    /// Holds its core with no work and polls (docs/idle-poll.md): the core
    /// is nobody's need, so any other application may have it at once
    /// (batch included, guaranteed cores included), before an idle core is
    /// considered missing and before any busy core is preempted.
    pub idle_polling: bool,
    /// Granted its core, which a preempted kthread still holds: it waits
    /// for that kthread to give the core back and has not run yet. Nobody
    /// takes such a core (the holder gives it back within the preemption
    /// deadline): taken, the grant would be undone before it ran, and
    /// applications taking one core from each other could keep a third
    /// from ever running (issue 35).
    pub handover_pending: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppClass {
    /// May preempt bursting cores of other applications.
    LatencyCritical,
    /// Best effort: takes idle cores only, never preempts.
    Batch,
}

/// One application as iokerneld sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AppSnap {
    /// Stable identity across passes.
    pub key: u64,
    pub class: AppClass,
    /// Cores never preempted (the sum over apps must not exceed the cores).
    pub guaranteed: usize,
    pub max_cores: usize,
    pub kthreads: Vec<KthreadSnap>,
    /// Earliest pending timer of a parked application.
    pub next_timer: Option<Time>,
    /// The core this application most recently gave up.
    pub last_yielded_core: Option<CoreId>,
    /// Protected mode: the key of the netstack its TCP/IP stack runs in.
    /// That netstack never takes a core from it (docs/protected.md, "A
    /// protected application beside batch"): serving one request takes
    /// turns of both on a core, and a preemption in between interrupts the
    /// very request the netstack waits for. The application may still take
    /// its netstack's core, as any latency-critical one takes a bursting
    /// one's.
    pub netstack: Option<u64>,
    /// It was granted a core lately (iokerneld: within `RECENT_GRANT_NS`, a millisecond). A
    /// latency-critical application that was will likely want one again
    /// soon: its requests come and go, each needing a grant
    /// ([`wanted_elsewhere`]).
    pub granted_lately: bool,
}

impl AppSnap {
    fn active(&self) -> usize {
        self.kthreads.iter().filter(|k| k.core.is_some()).count()
    }
}

/// Cores managed by the allocator: `0..n_cores`, with hyperthread siblings.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    pub n_cores: usize,
    pub sibling: Vec<Option<CoreId>>,
}

impl Topology {
    /// No hyperthreads.
    pub fn flat(n_cores: usize) -> Self {
        Self {
            n_cores,
            sibling: vec![None; n_cores],
        }
    }

    /// Cores `2i` and `2i+1` are siblings.
    pub fn paired(n_cores: usize) -> Self {
        let sibling = (0..n_cores)
            .map(|c| Some(c ^ 1).filter(|&s| s < n_cores))
            .collect();
        Self { n_cores, sibling }
    }
}

/// What the caller must do. A `Preempt` followed by a `Grant` of the same
/// core means: take the core from the victim, then hand it over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Grant {
        app: usize,
        kthread: usize,
        core: CoreId,
    },
    Preempt {
        app: usize,
        kthread: usize,
        core: CoreId,
    },
}

/// A core allocation policy.
pub trait CoreAllocator {
    /// How often the caller should run [`CoreAllocator::pass`].
    fn interval(&self) -> Time;

    /// Whether its passes read the kthreads' busy time
    /// ([`KthreadSnap::busy_time`]). Where none does, runtimes are told not
    /// to keep it: two clock reads and a write to the shared line around
    /// every run of a uthread, for nobody.
    fn reads_busy_time(&self) -> bool {
        false
    }

    /// One allocation pass; decisions are appended to `out`. Returns the
    /// applications (indices into `apps`, ascending) this pass found
    /// congested (see [`Congestion`]), whatever it decided for them.
    fn pass(
        &mut self,
        now: Time,
        topo: &Topology,
        apps: &[AppSnap],
        out: &mut Vec<Decision>,
    ) -> &[usize];

    /// Work just arrived on the dataplane for the applications `wanting`
    /// (indices into `apps`) while they hold no core. Shenango grants each
    /// one a core at once; this does not count as a congestion-detection
    /// pass (the previous-pass counters are left alone). Other policies wait
    /// for their next pass. Decisions are appended to `out`.
    fn on_work_for(
        &mut self,
        now: Time,
        topo: &Topology,
        apps: &[AppSnap],
        wanting: &[usize],
        out: &mut Vec<Decision>,
    ) {
        let _ = (now, topo, apps, wanting, out);
    }
}

/// Congestion detection (Shenango Algorithm 1), remembering each
/// application's queue counters from one pass to the next by its key.
///
/// An application that holds a core is congested when an item that was
/// queued at the previous pass (on any of its kthreads: items left on a
/// parked kthread's queue wait as surely as those of a busy one) is still
/// queued; one that holds no core is congested when anything is queued.
#[derive(Debug, Default)]
pub struct Congestion {
    prev: HashMap<u64, Vec<QueueCounters>>,
    congested: Vec<usize>,
}

impl Congestion {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a pass: forgets the previous pass's verdicts.
    fn begin(&mut self) {
        self.congested.clear();
    }

    /// Algorithm 1 for application `a` (index into `apps`), which holds a
    /// core if `has_core`; remembers its counters for the next pass and
    /// the verdict for [`Congestion::congested`].
    fn check(&mut self, apps: &[AppSnap], a: usize, has_core: bool) -> bool {
        let app = &apps[a];
        let prev = self.prev.entry(app.key).or_default();
        prev.resize(app.kthreads.len(), QueueCounters::default());
        let congested = if has_core {
            app.kthreads
                .iter()
                .zip(prev.iter())
                .any(|(k, p)| k.counters.congested_since(p))
        } else {
            app.kthreads.iter().any(|k| k.counters.has_items())
        };
        for (p, k) in prev.iter_mut().zip(&app.kthreads) {
            *p = k.counters;
        }
        if congested {
            self.congested.push(a);
        }
        congested
    }

    /// Ends a pass: forgets applications that are gone.
    fn end(&mut self, apps: &[AppSnap]) {
        if self.prev.len() > apps.len() {
            self.prev
                .retain(|key, _| apps.iter().any(|a| a.key == *key));
        }
    }

    /// One pass over every application, each judged by whether it holds a
    /// core in its snapshot; returns the congested ones.
    pub fn detect(&mut self, apps: &[AppSnap]) -> &[usize] {
        self.begin();
        for (a, app) in apps.iter().enumerate() {
            self.check(apps, a, app.active() > 0);
        }
        self.end(apps);
        &self.congested
    }

    /// The applications the last pass found congested, ascending.
    pub fn congested(&self) -> &[usize] {
        &self.congested
    }
}

/// Whether application `netstack` runs application `app`'s stack
/// (protected mode): it never preempts `app` ([`AppSnap::netstack`]).
fn serves(apps: &[AppSnap], netstack: usize, app: usize) -> bool {
    apps[app].netstack == Some(apps[netstack].key)
}

/// Working state of one pass: who owns which core, updated as decisions are
/// made so two grants in a pass never pick the same core. A policy that
/// runs every few microseconds keeps one and rebuilds it in place, so a
/// pass allocates nothing once the application table stopped growing.
#[derive(Debug, Default)]
struct Board {
    owner: Vec<Option<(usize, usize)>>,
    /// Per core: its owner polls while idle ([`KthreadSnap::idle_polling`]).
    polling: Vec<bool>,
    /// Per core: its owner has not run on it yet (its hand-over waits,
    /// [`KthreadSnap::handover_pending`], or it was granted in this pass):
    /// nobody takes it.
    pending: Vec<bool>,
    /// Per core: its owner has held it for less than the minimum residency
    /// ([`Shenango::with_min_residency`]): no other latency-critical
    /// application takes it yet (a batch owner is preempted at once).
    fresh: Vec<bool>,
    /// Per application: since when it has wanted a core and found none it
    /// may take (`None`: not waiting). The one waiting longest takes a
    /// latency-critical application's core first.
    waiting_since: Vec<Option<Time>>,
    /// Whether the minimum residency and its queue apply (`fresh`,
    /// `waiting_since`): `false` is Algorithm 2 as the paper has it.
    residency: bool,
    /// The time of this pass (when a wait began).
    now: Time,
    active: Vec<usize>,
    taken: Vec<Vec<bool>>,
}

impl Board {
    fn build(topo: &Topology, apps: &[AppSnap]) -> Board {
        let mut b = Board::default();
        b.rebuild(topo, apps);
        b
    }

    /// This pass's board, reusing the previous pass's memory.
    fn rebuild(&mut self, topo: &Topology, apps: &[AppSnap]) {
        let b = self;
        b.owner.clear();
        b.owner.resize(topo.n_cores, None);
        b.polling.clear();
        b.polling.resize(topo.n_cores, false);
        b.pending.clear();
        b.pending.resize(topo.n_cores, false);
        b.fresh.clear();
        b.fresh.resize(topo.n_cores, false);
        b.waiting_since.clear();
        b.waiting_since.resize(apps.len(), None);
        b.residency = false;
        b.active.clear();
        b.taken.truncate(apps.len());
        b.taken.resize_with(apps.len(), Vec::new);
        for (a, app) in apps.iter().enumerate() {
            b.active.push(app.active());
            b.taken[a].clear();
            b.taken[a].resize(app.kthreads.len(), false);
            for (k, kt) in app.kthreads.iter().enumerate() {
                if let Some(c) = kt.core {
                    if c < topo.n_cores {
                        b.owner[c] = Some((a, k));
                        b.polling[c] = kt.idle_polling;
                        b.pending[c] = kt.handover_pending;
                    }
                }
            }
        }
    }

    /// Cores nobody needs: free, or held by a kthread that polls while idle.
    fn n_idle(&self) -> usize {
        (0..self.owner.len())
            .filter(|&c| self.owner[c].is_none() || self.polling[c])
            .count()
    }

    /// A core whose owner polls while idle that `req` may take at once:
    /// not its own, and not of an application whose netstack `req` is.
    fn polled_by_other(&self, apps: &[AppSnap], req: usize, core: CoreId) -> bool {
        matches!(self.owner.get(core), Some(Some((a, _))) if *a != req && self.polling[core] && !serves(apps, req, *a))
    }

    fn bursting(&self, apps: &[AppSnap], a: usize) -> bool {
        self.active[a] > apps[a].guaranteed
    }

    /// Algorithm 2, CANBEALLOCATED, for requester `req`.
    fn can_be_allocated(&self, apps: &[AppSnap], req: usize, core: CoreId) -> bool {
        match self.owner.get(core) {
            None => false,
            Some(None) => true,
            Some(Some(_)) if self.polled_by_other(apps, req, core) => true,
            Some(Some(_)) => {
                apps[req].class == AppClass::LatencyCritical
                    && self.n_idle() == 0
                    && self.takable(apps, req, core)
            }
        }
    }

    /// A busy core latency-critical `req` may preempt: another
    /// application's, bursting, not one `req` is the netstack of, whose
    /// owner has run on it, and — a latency-critical owner — has held it
    /// for the minimum residency with no application waiting longer for
    /// it, unless it is `req`'s own netstack (it works for `req`) or `req`
    /// is below its guaranteed cores (a promise, kept at once).
    fn takable(&self, apps: &[AppSnap], req: usize, core: CoreId) -> bool {
        let Some((a, _)) = self.owner[core] else {
            return false;
        };
        a != req
            && !self.pending[core]
            && self.bursting(apps, a)
            && !serves(apps, req, a)
            && (apps[a].class == AppClass::Batch
                || !self.residency
                || serves(apps, a, req)
                || self.active[req] < apps[req].guaranteed
                || (!self.fresh[core] && self.first_in_line(apps, req, a)))
    }

    /// No other latency-critical application that could take a core of
    /// `holder` has waited longer than `req` (ties: the lower index, which
    /// this pass served first).
    fn first_in_line(&self, apps: &[AppSnap], req: usize, holder: usize) -> bool {
        let mine = self.waiting_since[req].unwrap_or(Time::MAX);
        !(0..apps.len()).any(|w| {
            w != req
                && w != holder
                && apps[w].class == AppClass::LatencyCritical
                && !serves(apps, w, holder)
                && self.waiting_since[w].is_some_and(|t| t < mine || (t == mine && w < req))
        })
    }

    /// Algorithm 2, SELECTCORE.
    fn select_core(
        &self,
        topo: &Topology,
        apps: &[AppSnap],
        req: usize,
        rng: &mut SplitMix64,
    ) -> Option<CoreId> {
        for (c, o) in self.owner.iter().enumerate() {
            if matches!(o, Some((a, _)) if *a == req) {
                if let Some(s) = topo.sibling.get(c).copied().flatten() {
                    if self.can_be_allocated(apps, req, s) {
                        return Some(s);
                    }
                }
            }
        }
        if let Some(r) = apps[req].last_yielded_core {
            if self.can_be_allocated(apps, req, r) {
                return Some(r);
            }
        }
        if let Some(c) = self.owner.iter().position(|o| o.is_none()) {
            return Some(c);
        }
        // A core nobody needs before a busy one: any class may take it.
        if let Some(c) = (0..self.owner.len()).find(|&c| self.polled_by_other(apps, req, c)) {
            return Some(c);
        }
        if apps[req].class != AppClass::LatencyCritical {
            return None;
        }
        // A random bursting application, then a random core of it that
        // may be taken; counted and picked without collecting (no
        // allocation in the pass).
        let n_cores = self.owner.len();
        let of = |v: usize, c: &usize| {
            matches!(self.owner[*c], Some((a, _)) if a == v) && self.takable(apps, req, *c)
        };
        let is_victim = |a: &usize| (0..n_cores).any(|c| of(*a, &c));
        let n_victims = (0..apps.len()).filter(is_victim).count();
        if n_victims == 0 {
            return None;
        }
        let v = (0..apps.len())
            .filter(is_victim)
            .nth(rng.below(n_victims))?;
        let of_v = |c: &usize| of(v, c);
        let n_of_v = (0..n_cores).filter(of_v).count();
        if n_of_v == 0 {
            return None;
        }
        (0..n_cores).filter(of_v).nth(rng.below(n_of_v))
    }

    /// Algorithm 2, kthread choice, among the parked kthreads with work
    /// queued on their own rings if there are any (else among all parked
    /// ones): the one that last ran on `core`, else the one parked longest.
    ///
    /// Work first: a kthread that parks can find a packet steered to its
    /// ingress ring just after its last look (iokerneld reads its `Parked`
    /// later). A runtime's other kthreads would steal it, but the
    /// netstack's kthreads serve only their own ring: woken instead of
    /// the owner, a sibling found nothing, parked, and was woken again for
    /// the same packet, every pass, while the owner never ran (the
    /// netstack under iokerneld kept a core for ever, its connections
    /// hung).
    fn select_kthread(&self, apps: &[AppSnap], req: usize, core: CoreId) -> Option<usize> {
        let eligible = |k: &usize| {
            let kt = &apps[req].kthreads[*k];
            kt.parked && kt.core.is_none() && !self.taken[req][*k]
        };
        let ks = 0..apps[req].kthreads.len();
        let with_work = |k: &usize| apps[req].kthreads[*k].counters.has_items();
        let any_work = ks.clone().filter(eligible).any(|k| with_work(&k));
        let candidate = |k: &usize| eligible(k) && (!any_work || with_work(k));
        ks.clone()
            .filter(candidate)
            .find(|&k| apps[req].kthreads[k].last_core == Some(core))
            .or_else(|| {
                ks.filter(candidate)
                    .min_by_key(|&k| apps[req].kthreads[k].parked_since)
            })
    }

    /// Tries to give `req` one more core; records the decisions.
    fn grant_one(
        &mut self,
        topo: &Topology,
        apps: &[AppSnap],
        req: usize,
        rng: &mut SplitMix64,
        out: &mut Vec<Decision>,
    ) -> bool {
        if self.active[req] >= apps[req].max_cores {
            self.waiting_since[req] = None;
            return false;
        }
        let Some(core) = self.select_core(topo, apps, req, rng) else {
            // It waits for a core only with a kthread to put on one.
            let can_use = self.select_kthread(apps, req, 0).is_some();
            let since = self.waiting_since[req].unwrap_or(self.now);
            self.waiting_since[req] = can_use.then_some(since);
            return false;
        };
        let Some(k) = self.select_kthread(apps, req, core) else {
            return false;
        };
        self.waiting_since[req] = None;
        if let Some((va, vk)) = self.owner[core] {
            out.push(Decision::Preempt {
                app: va,
                kthread: vk,
                core,
            });
            self.active[va] -= 1;
            self.polling[core] = false;
        }
        out.push(Decision::Grant {
            app: req,
            kthread: k,
            core,
        });
        self.owner[core] = Some((req, k));
        // Not run yet: no later grant of this pass takes it back.
        self.pending[core] = true;
        self.fresh[core] = true;
        self.taken[req][k] = true;
        self.active[req] += 1;
        true
    }
}

/// Shenango's allocator: Algorithm 1 every `interval`, Algorithm 2 to choose.
#[derive(Debug)]
pub struct Shenango {
    interval: Time,
    rng: SplitMix64,
    congestion: Congestion,
    board: Board,
    residency: Residency,
}

/// [`Shenango::new`]'s minimum residency, in passes: 100 µs at the 5 µs
/// interval (docs/design.md, "Minimum residency").
pub const DEFAULT_MIN_RESIDENCY_PASSES: Time = 20;

impl Shenango {
    /// `interval`: congestion-detection period (Shenango: 5 µs); `seed`
    /// drives the random choice of a bursting victim. The minimum
    /// residency is [`DEFAULT_MIN_RESIDENCY_PASSES`] intervals.
    pub fn new(interval: Time, seed: u64) -> Self {
        Self {
            interval,
            rng: SplitMix64::new(seed),
            congestion: Congestion::new(),
            board: Board::default(),
            residency: Residency::new(interval.saturating_mul(DEFAULT_MIN_RESIDENCY_PASSES)),
        }
    }

    /// A latency-critical application keeps a core it runs on for at
    /// least `min` (same unit as the interval) before another
    /// latency-critical one takes it, and the core then goes to the one
    /// that has waited longest (`alloc/residency.rs`). 0: Algorithm 2 as
    /// the paper has it, every pass.
    pub fn with_min_residency(mut self, min: Time) -> Self {
        self.residency = Residency::new(min);
        self
    }

    /// This pass's board: the snapshot's owners, and each core's residency.
    fn begin(&mut self, now: Time, topo: &Topology, apps: &[AppSnap]) {
        let b = &mut self.board;
        b.rebuild(topo, apps);
        b.now = now;
        b.residency = self.residency.min() > 0;
        self.residency.observe(
            now,
            apps,
            residency::View {
                owner: &b.owner,
                pending: &b.pending,
                fresh: &mut b.fresh,
                waiting_since: &mut b.waiting_since,
            },
        );
    }
}

impl CoreAllocator for Shenango {
    fn interval(&self) -> Time {
        self.interval
    }

    fn pass(
        &mut self,
        now: Time,
        topo: &Topology,
        apps: &[AppSnap],
        out: &mut Vec<Decision>,
    ) -> &[usize] {
        self.begin(now, topo, apps);
        let b = &mut self.board;
        self.congestion.begin();
        for (a, app) in apps.iter().enumerate() {
            // Judged by the cores it holds now: a grant to an earlier
            // application may have preempted one of them.
            let has_core = b.active[a] > 0;
            let congested = self.congestion.check(apps, a, has_core);
            // No core: queued work or an expired timer gets one at once.
            let want = congested || (!has_core && app.next_timer.is_some_and(|t| t <= now));
            if want {
                b.grant_one(topo, apps, a, &mut self.rng, out);
            } else {
                b.waiting_since[a] = None;
            }
        }
        self.residency.remember(apps, &b.waiting_since);
        self.congestion.end(apps);
        self.congestion.congested()
    }

    fn on_work_for(
        &mut self,
        now: Time,
        topo: &Topology,
        apps: &[AppSnap],
        wanting: &[usize],
        out: &mut Vec<Decision>,
    ) {
        self.begin(now, topo, apps);
        let b = &mut self.board;
        for &app in wanting {
            if app < apps.len() && b.active[app] == 0 {
                b.grant_one(topo, apps, app, &mut self.rng, out);
            }
        }
        self.residency.remember(apps, &b.waiting_since);
    }
}

/// ZygOS-like static provisioning: each application gets `guaranteed`
/// spinning cores once and keeps them; batch applications then soak up any
/// core left idle (up to their maximum) and keep it too.
#[derive(Debug)]
pub struct Static {
    interval: Time,
    rng: SplitMix64,
    /// Decides nothing here; reported for the caller's statistics.
    congestion: Congestion,
}

impl Static {
    pub fn new(interval: Time) -> Self {
        Self {
            interval,
            rng: SplitMix64::new(0),
            congestion: Congestion::new(),
        }
    }
}

impl CoreAllocator for Static {
    fn interval(&self) -> Time {
        self.interval
    }

    fn pass(
        &mut self,
        _now: Time,
        topo: &Topology,
        apps: &[AppSnap],
        out: &mut Vec<Decision>,
    ) -> &[usize] {
        self.congestion.detect(apps);
        let mut b = Board::build(topo, apps);
        for a in 0..apps.len() {
            while b.active[a] < apps[a].guaranteed && b.n_idle() > 0 {
                if !b.grant_one(topo, apps, a, &mut self.rng, out) {
                    break;
                }
            }
        }
        for a in (0..apps.len()).filter(|&a| apps[a].class == AppClass::Batch) {
            while b.n_idle() > 0 {
                if !b.grant_one(topo, apps, a, &mut self.rng, out) {
                    break;
                }
            }
        }
        self.congestion.congested()
    }
}

/// Arachne-like slow allocator: every `period`, sets each application's
/// cores to `ceil(utilization / target_util)` (between guaranteed and max),
/// from the busy time it used in the last period. Latency-critical
/// applications are served first and may take bursting cores of others.
#[derive(Debug)]
pub struct Slow {
    period: Time,
    target_util: f64,
    last: Option<Time>,
    prev_busy: HashMap<u64, Time>,
    rng: SplitMix64,
    /// Decides nothing here; reported for the caller's statistics.
    congestion: Congestion,
}

impl Slow {
    pub fn new(period: Time, target_util: f64, seed: u64) -> Self {
        assert!(target_util > 0.0 && target_util <= 1.0);
        Self {
            period,
            target_util,
            last: None,
            prev_busy: HashMap::new(),
            rng: SplitMix64::new(seed),
            congestion: Congestion::new(),
        }
    }

    fn want(&self, app: &AppSnap, busy: Time, elapsed: Time, now: Time) -> usize {
        let used = busy as f64 / elapsed.max(1) as f64;
        let mut want = (used / self.target_util).ceil() as usize;
        // Queued work or a due timer needs at least one core (at this
        // allocator's pace: the next period).
        if app.kthreads.iter().any(|k| k.counters.has_items())
            || app.next_timer.is_some_and(|t| t <= now)
        {
            want = want.max(1);
        }
        want.clamp(app.guaranteed, app.max_cores.max(app.guaranteed))
    }
}

impl CoreAllocator for Slow {
    fn interval(&self) -> Time {
        self.period
    }

    fn reads_busy_time(&self) -> bool {
        true
    }

    fn pass(
        &mut self,
        now: Time,
        topo: &Topology,
        apps: &[AppSnap],
        out: &mut Vec<Decision>,
    ) -> &[usize] {
        // Every pass, not only at the end of a period: Algorithm 1 compares
        // consecutive passes.
        self.congestion.detect(apps);
        let elapsed = match self.last {
            Some(l) if now.saturating_sub(l) < self.period => return self.congestion.congested(),
            Some(l) => now - l,
            None => self.period,
        };
        self.last = Some(now);
        let mut wants = Vec::with_capacity(apps.len());
        for app in apps {
            let busy: Time = app.kthreads.iter().map(|k| k.busy_time).sum();
            let prev = self.prev_busy.insert(app.key, busy);
            let w = match prev {
                Some(p) => self.want(app, busy.saturating_sub(p), elapsed, now),
                // First look: start from whatever demand is visible.
                None => self.want(app, 0, elapsed, now).max(app.active()),
            };
            wants.push(w);
        }
        let mut b = Board::build(topo, apps);
        // Release surplus first so that others can take idle cores.
        for (a, app) in apps.iter().enumerate() {
            let mut extra = b.active[a].saturating_sub(wants[a]);
            for (k, kt) in app.kthreads.iter().enumerate().rev() {
                if extra == 0 {
                    break;
                }
                if let Some(core) = kt.core {
                    out.push(Decision::Preempt {
                        app: a,
                        kthread: k,
                        core,
                    });
                    b.owner[core] = None;
                    b.polling[core] = false;
                    b.active[a] -= 1;
                    extra -= 1;
                }
            }
        }
        let mut order: Vec<usize> = (0..apps.len()).collect();
        order.sort_by_key(|&a| apps[a].class != AppClass::LatencyCritical);
        for a in order {
            while b.active[a] < wants[a] {
                if !b.grant_one(topo, apps, a, &mut self.rng, out) {
                    break;
                }
            }
        }
        self.congestion.congested()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(since: Time, last: Option<CoreId>) -> KthreadSnap {
        KthreadSnap {
            parked: true,
            parked_since: since,
            last_core: last,
            ..Default::default()
        }
    }

    fn running(core: CoreId) -> KthreadSnap {
        KthreadSnap {
            core: Some(core),
            last_core: Some(core),
            ..Default::default()
        }
    }

    fn app(key: u64, class: AppClass, guaranteed: usize, kthreads: Vec<KthreadSnap>) -> AppSnap {
        let max_cores = kthreads.len();
        AppSnap {
            key,
            class,
            guaranteed,
            max_cores,
            kthreads,
            next_timer: None,
            last_yielded_core: None,
            netstack: None,
            granted_lately: false,
        }
    }

    fn lc(key: u64, kthreads: Vec<KthreadSnap>) -> AppSnap {
        app(key, AppClass::LatencyCritical, 0, kthreads)
    }

    fn queued(mut k: KthreadSnap, rq: (u32, u32), inq: (u32, u32)) -> KthreadSnap {
        k.counters = QueueCounters {
            rq_head: rq.0,
            rq_tail: rq.1,
            in_head: inq.0,
            in_tail: inq.1,
        };
        k
    }

    fn two_passes(
        alloc: &mut Shenango,
        topo: &Topology,
        first: &[AppSnap],
        second: &[AppSnap],
    ) -> Vec<Decision> {
        let mut out = Vec::new();
        alloc.pass(0, topo, first, &mut out);
        out.clear();
        alloc.pass(5, topo, second, &mut out);
        out
    }

    #[test]
    fn seq_wraps() {
        let prev = QueueCounters {
            rq_head: u32::MAX - 1,
            rq_tail: 1,
            ..Default::default()
        };
        let now = QueueCounters {
            rq_head: u32::MAX,
            rq_tail: 3,
            ..Default::default()
        };
        assert!(now.congested_since(&prev));
        let now = QueueCounters {
            rq_head: 1,
            rq_tail: 3,
            ..Default::default()
        };
        assert!(!now.congested_since(&prev));
    }

    #[test]
    fn alg1_item_present_two_passes_grants_one_core() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let a1 = [lc(
            1,
            vec![queued(running(0), (10, 12), (0, 0)), parked(0, None)],
        )];
        let a2 = [lc(
            1,
            vec![queued(running(0), (11, 13), (0, 0)), parked(0, None)],
        )];
        // Head 11 < previous tail 12: an item waited a full interval.
        let out = two_passes(&mut s, &topo, &a1, &a2);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 1,
                core: 1
            }]
        );
    }

    #[test]
    fn alg1_queue_drained_between_passes_is_not_congestion() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let a1 = [lc(
            1,
            vec![queued(running(0), (10, 12), (0, 0)), parked(0, None)],
        )];
        // Everything seen at the first pass was consumed; new items arrived.
        let a2 = [lc(
            1,
            vec![queued(running(0), (12, 15), (0, 0)), parked(0, None)],
        )];
        assert!(two_passes(&mut s, &topo, &a1, &a2).is_empty());
    }

    #[test]
    fn alg1_ingress_queue_counts_too() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let a1 = [lc(
            1,
            vec![queued(running(0), (0, 0), (3, 4)), parked(0, None)],
        )];
        let a2 = [lc(
            1,
            vec![queued(running(0), (0, 0), (3, 6)), parked(0, None)],
        )];
        assert_eq!(two_passes(&mut s, &topo, &a1, &a2).len(), 1);
    }

    #[test]
    fn alg1_items_stranded_on_a_parked_kthread_count() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        // kthread 0 runs with an empty queue; parked kthread 1 holds an
        // item (say, the uthread it was running when it was preempted).
        let stranded = || {
            [lc(
                1,
                vec![
                    queued(running(0), (4, 4), (0, 0)),
                    queued(parked(0, None), (7, 8), (0, 0)),
                ],
            )]
        };
        let out = two_passes(&mut s, &topo, &stranded(), &stranded());
        assert_eq!(out.len(), 1, "{out:?}");
        // Taken between the passes (stolen by kthread 0): no congestion.
        let mut s = Shenango::new(5, 1);
        let taken = [lc(
            1,
            vec![
                queued(running(0), (4, 4), (0, 0)),
                queued(parked(0, None), (8, 8), (0, 0)),
            ],
        )];
        assert!(two_passes(&mut s, &topo, &stranded(), &taken).is_empty());
    }

    #[test]
    fn alg1_first_pass_never_congested_for_active_app() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let mut out = Vec::new();
        s.pass(
            0,
            &topo,
            &[lc(
                1,
                vec![queued(running(0), (0, 5), (0, 0)), parked(0, None)],
            )],
            &mut out,
        );
        assert!(out.is_empty(), "nothing was seen before");
    }

    #[test]
    fn alg1_zero_cores_with_work_granted_at_once() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let mut out = Vec::new();
        s.pass(
            0,
            &topo,
            &[lc(
                1,
                vec![queued(parked(3, None), (0, 0), (0, 1)), parked(1, None)],
            )],
            &mut out,
        );
        // The packet waits on kthread 0's ring: kthread 0, though
        // kthread 1 has parked longer (since 1).
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 0,
                core: 0
            }]
        );
    }

    #[test]
    fn work_for_coreless_app_is_granted_without_a_pass() {
        let topo = Topology::flat(2);
        // No minimum residency: app 1's core is taken at the next pass.
        let mut s = Shenango::new(5, 1).with_min_residency(0);
        let apps = [
            lc(1, vec![queued(running(0), (0, 3), (0, 0)), parked(0, None)]),
            lc(2, vec![parked(0, None)]),
        ];
        let mut out = Vec::new();
        s.pass(0, &topo, &apps, &mut out);
        assert!(out.is_empty());
        s.on_work_for(1, &topo, &apps, &[1], &mut out);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 1,
                kthread: 0,
                core: 1
            }]
        );
        // An app that already runs gets nothing from the fast path.
        out.clear();
        s.on_work_for(1, &topo, &apps, &[0], &mut out);
        assert!(out.is_empty());
        // The fast path did not disturb congestion detection: app 0's item
        // seen at pass 0 is still there at the next pass, so app 0 is
        // congested and takes the (bursting) core of app 1.
        let apps = [apps[0].clone(), lc(2, vec![running(1)])];
        s.pass(5, &topo, &apps, &mut out);
        assert_eq!(
            out,
            vec![
                Decision::Preempt {
                    app: 1,
                    kthread: 0,
                    core: 1
                },
                Decision::Grant {
                    app: 0,
                    kthread: 1,
                    core: 1
                }
            ]
        );
    }

    #[test]
    fn alg1_expired_timer_wakes_parked_app() {
        let topo = Topology::flat(2);
        let mut s = Shenango::new(5, 1);
        let mut a = lc(1, vec![parked(0, None)]);
        a.next_timer = Some(100);
        let mut out = Vec::new();
        s.pass(99, &topo, std::slice::from_ref(&a), &mut out);
        assert!(out.is_empty(), "timer not yet due");
        s.pass(100, &topo, std::slice::from_ref(&a), &mut out);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 0,
                core: 0
            }]
        );
    }

    #[test]
    fn alg1_idle_app_without_work_gets_nothing() {
        let topo = Topology::flat(2);
        let mut s = Shenango::new(5, 1);
        let mut out = Vec::new();
        s.pass(0, &topo, &[lc(1, vec![parked(0, None)])], &mut out);
        s.pass(5, &topo, &[lc(1, vec![parked(0, None)])], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn alg1_max_cores_caps_grants() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let mut a = lc(1, vec![queued(running(0), (0, 2), (0, 0)), parked(0, None)]);
        a.max_cores = 1;
        let out = two_passes(
            &mut s,
            &topo,
            std::slice::from_ref(&a),
            std::slice::from_ref(&a),
        );
        assert!(out.is_empty());
    }

    fn congested_app(key: u64, cores: &[CoreId], spare: usize) -> AppSnap {
        let mut ks: Vec<KthreadSnap> = cores
            .iter()
            .map(|&c| queued(running(c), (0, 4), (0, 0)))
            .collect();
        ks.extend((0..spare).map(|i| parked(i as Time, None)));
        lc(key, ks)
    }

    #[test]
    fn alg2_prefers_hyperthread_sibling() {
        let topo = Topology::paired(4);
        let mut s = Shenango::new(5, 1);
        let mut a = congested_app(1, &[2], 1);
        a.last_yielded_core = Some(0);
        let out = two_passes(
            &mut s,
            &topo,
            std::slice::from_ref(&a),
            std::slice::from_ref(&a),
        );
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 1,
                core: 3
            }]
        );
    }

    #[test]
    fn alg2_then_most_recently_yielded_core() {
        let topo = Topology::paired(4);
        let mut s = Shenango::new(5, 1);
        // Sibling 3 is busy with another (non-bursting) app.
        let other = app(2, AppClass::LatencyCritical, 1, vec![running(3)]);
        let mut a = congested_app(1, &[2], 1);
        a.last_yielded_core = Some(1);
        let apps = [a, other];
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 1,
                core: 1
            }]
        );
    }

    #[test]
    fn alg2_then_any_idle_core() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let other = app(2, AppClass::LatencyCritical, 0, vec![running(0)]);
        let mut a = congested_app(1, &[1], 1);
        a.last_yielded_core = Some(0); // taken by `other`, which cannot be preempted while cores idle
        let apps = [a, other];
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 1,
                core: 2
            }]
        );
    }

    #[test]
    fn alg2_preempts_bursting_app_when_no_idle_core() {
        let topo = Topology::flat(3);
        let mut s = Shenango::new(5, 7);
        let a = congested_app(1, &[0], 1);
        let batch = app(2, AppClass::Batch, 0, vec![running(1), running(2)]);
        let apps = [a, batch];
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert_eq!(out.len(), 2);
        let Decision::Preempt { app: 1, core, .. } = out[0] else {
            panic!("{out:?}")
        };
        assert!(core == 1 || core == 2);
        assert_eq!(
            out[1],
            Decision::Grant {
                app: 0,
                kthread: 1,
                core
            }
        );
    }

    #[test]
    fn a_core_waiting_for_its_hand_over_is_not_taken() {
        // One core: app 0's kthread was granted it and waits for the
        // preempted holder to give it back; app 1 has work and no core.
        let topo = Topology::flat(1);
        for residency in [0, 100] {
            let mut s = Shenango::new(5, 7).with_min_residency(residency);
            let waiting = lc(
                1,
                vec![KthreadSnap {
                    handover_pending: true,
                    ..running(0)
                }],
            );
            let wanting = lc(2, vec![queued(parked(0, None), (0, 1), (0, 0))]);
            let apps = [waiting, wanting.clone()];
            let mut out = Vec::new();
            for now in (0..1000).step_by(5) {
                s.pass(now, &topo, &apps, &mut out);
            }
            assert!(out.is_empty(), "{out:?}");
            // Once it runs, it is bursting as any holder: taken after its
            // residency.
            let apps = [lc(1, vec![running(0)]), wanting];
            s.pass(1000, &topo, &apps, &mut out);
            assert_eq!(out.is_empty(), residency > 0, "{out:?}");
            if residency > 0 {
                s.pass(1000 + residency, &topo, &apps, &mut out);
            }
            assert!(
                matches!(
                    out[..],
                    [
                        Decision::Preempt {
                            app: 0,
                            core: 0,
                            ..
                        },
                        Decision::Grant {
                            app: 1,
                            core: 0,
                            ..
                        }
                    ]
                ),
                "{out:?}"
            );
        }
    }

    #[test]
    fn a_core_granted_in_a_pass_is_not_taken_back_in_the_same_pass() {
        // One core held by a bursting batch application; two
        // latency-critical ones, coreless, both with work: the first gets
        // it, the second waits (Algorithm 2 as published, too).
        let topo = Topology::flat(1);
        let wants = |key| lc(key, vec![queued(parked(0, None), (0, 1), (0, 0))]);
        let apps = [
            app(1, AppClass::Batch, 0, vec![running(0)]),
            wants(2),
            wants(3),
        ];
        for residency in [0, 100] {
            let mut s = Shenango::new(5, 7).with_min_residency(residency);
            let mut out = Vec::new();
            s.pass(0, &topo, &apps, &mut out);
            assert_eq!(
                out,
                [
                    Decision::Preempt {
                        app: 0,
                        kthread: 0,
                        core: 0
                    },
                    Decision::Grant {
                        app: 1,
                        kthread: 0,
                        core: 0
                    }
                ]
            );
        }
    }

    #[test]
    fn a_batch_holder_is_preempted_at_once_a_latency_critical_one_after_its_residency() {
        let topo = Topology::flat(1);
        let wanting = lc(2, vec![queued(parked(0, None), (0, 1), (0, 0))]);
        for (class, at) in [(AppClass::Batch, 0), (AppClass::LatencyCritical, 100)] {
            let mut s = Shenango::new(5, 7).with_min_residency(100);
            let apps = [app(1, class, 0, vec![running(0)]), wanting.clone()];
            let mut out = Vec::new();
            let mut now = 0;
            while out.is_empty() {
                assert!(now <= 1000, "{class:?}: never taken");
                s.pass(now, &topo, &apps, &mut out);
                now += 5;
            }
            // Coreless with work, the requester wants a core from the
            // first pass on; the holder's residency counts from that pass.
            assert_eq!(now - 5, at, "{class:?}: {out:?}");
        }
    }

    #[test]
    fn the_application_waiting_longest_takes_a_latency_critical_core_first() {
        // One core held by app 0 (latency-critical); app 2 has waited since
        // time 0, app 1 only since 50: when the residency ends, app 2 gets
        // the core although app 1 comes first in the table.
        let topo = Topology::flat(1);
        let mut s = Shenango::new(5, 7).with_min_residency(100);
        let holder = lc(1, vec![running(0)]);
        let wants = |key| lc(key, vec![queued(parked(0, None), (0, 1), (0, 0))]);
        let idle = |key| lc(key, vec![parked(0, None)]);
        let mut out = Vec::new();
        for now in (0..50).step_by(5) {
            s.pass(now, &topo, &[holder.clone(), idle(2), wants(3)], &mut out);
        }
        let apps = [holder, wants(2), wants(3)];
        let mut now = 50;
        while out.is_empty() {
            assert!(now <= 1000, "never taken");
            s.pass(now, &topo, &apps, &mut out);
            now += 5;
        }
        assert!(
            matches!(
                out[..],
                [
                    Decision::Preempt { app: 0, .. },
                    Decision::Grant { app: 2, .. }
                ]
            ),
            "{out:?}"
        );
    }

    #[test]
    fn an_application_below_its_guarantee_takes_a_bursting_core_at_once() {
        let topo = Topology::flat(1);
        let mut s = Shenango::new(5, 7).with_min_residency(1_000);
        let owed = app(
            2,
            AppClass::LatencyCritical,
            1,
            vec![queued(parked(0, None), (0, 1), (0, 0))],
        );
        let apps = [lc(1, vec![running(0)]), owed];
        let mut out = Vec::new();
        s.pass(0, &topo, &apps, &mut out);
        assert!(
            matches!(
                out[..],
                [
                    Decision::Preempt { app: 0, .. },
                    Decision::Grant { app: 1, .. }
                ]
            ),
            "{out:?}"
        );
    }

    #[test]
    fn a_protected_application_takes_its_netstacks_core_at_once() {
        // The netstack works for it: no residency between the two.
        let topo = Topology::flat(1);
        let mut s = Shenango::new(5, 7).with_min_residency(1_000);
        let mut waiting = lc(1, vec![queued(parked(0, None), (0, 1), (0, 0))]);
        waiting.netstack = Some(2);
        let apps = [waiting, lc(2, vec![running(0)])];
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert!(
            matches!(
                out[..],
                [
                    Decision::Preempt { app: 1, .. },
                    Decision::Grant { app: 0, .. }
                ]
            ),
            "{out:?}"
        );
    }

    #[test]
    fn a_netstack_never_preempts_its_protected_application() {
        // One core, held by the protected application (key 1); its
        // netstack (key 2) has work and no core.
        let topo = Topology::flat(1);
        let mut s = Shenango::new(5, 7);
        let mut protected = lc(1, vec![running(0)]);
        protected.netstack = Some(2);
        let netstack = lc(2, vec![queued(parked(0, None), (0, 1), (0, 0))]);
        let apps = [protected.clone(), netstack.clone()];
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert!(out.is_empty(), "{out:?}");
        // Another latency-critical application in the netstack's place
        // takes the core, as Algorithm 2 says (the holder's minimum
        // residency aside, which this test is not about).
        let mut s = Shenango::new(5, 7).with_min_residency(0);
        let mut unrelated = protected.clone();
        unrelated.netstack = Some(9);
        let apps = [unrelated, netstack.clone()];
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert!(
            matches!(
                out[..],
                [
                    Decision::Preempt {
                        app: 0,
                        core: 0,
                        ..
                    },
                    Decision::Grant {
                        app: 1,
                        core: 0,
                        ..
                    }
                ]
            ),
            "{out:?}"
        );
        // The other way round, the application takes its netstack's core.
        let mut s = Shenango::new(5, 7);
        let mut waiting = lc(1, vec![queued(parked(0, None), (0, 1), (0, 0))]);
        waiting.netstack = Some(2);
        let apps = [waiting, lc(2, vec![running(0)])];
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert!(
            matches!(
                out[..],
                [
                    Decision::Preempt {
                        app: 1,
                        core: 0,
                        ..
                    },
                    Decision::Grant {
                        app: 0,
                        core: 0,
                        ..
                    }
                ]
            ),
            "{out:?}"
        );
    }

    #[test]
    fn alg2_guaranteed_cores_never_preempted() {
        let topo = Topology::flat(3);
        let mut s = Shenango::new(5, 7);
        let a = congested_app(1, &[0], 1);
        let other = app(
            2,
            AppClass::LatencyCritical,
            2,
            vec![running(1), running(2)],
        );
        let apps = [a, other];
        assert!(two_passes(&mut s, &topo, &apps, &apps).is_empty());
    }

    #[test]
    fn alg2_sibling_of_bursting_app_taken_only_without_idle_cores() {
        let topo = Topology::paired(4);
        let mut s = Shenango::new(5, 7);
        let a = congested_app(1, &[0], 1);
        let burst = app(2, AppClass::Batch, 0, vec![running(1)]);
        let apps = [a.clone(), burst.clone()];
        // Idle cores 2 and 3 exist: do not preempt the sibling.
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 1,
                core: 2
            }]
        );
        // All other cores busy: the sibling of a bursting app is fair game.
        let filler = app(
            3,
            AppClass::LatencyCritical,
            2,
            vec![running(2), running(3)],
        );
        let apps = [a, burst, filler];
        let mut s = Shenango::new(5, 7);
        let out = two_passes(&mut s, &topo, &apps, &apps);
        assert_eq!(
            out[0],
            Decision::Preempt {
                app: 1,
                kthread: 0,
                core: 1
            }
        );
        assert_eq!(
            out[1],
            Decision::Grant {
                app: 0,
                kthread: 1,
                core: 1
            }
        );
    }

    #[test]
    fn alg2_batch_never_preempts() {
        let topo = Topology::flat(2);
        let mut s = Shenango::new(5, 7);
        let b = app(
            1,
            AppClass::Batch,
            0,
            vec![queued(running(0), (0, 1), (0, 0)), parked(0, None)],
        );
        let l = lc(2, vec![running(1)]);
        let apps = [b, l];
        assert!(two_passes(&mut s, &topo, &apps, &apps).is_empty());
    }

    #[test]
    fn alg2_kthread_that_last_ran_on_core_preferred() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let mut a = congested_app(1, &[0], 0);
        a.kthreads.push(parked(0, Some(3))); // parked longest but ran elsewhere
        a.kthreads.push(parked(10, Some(1)));
        a.max_cores = 3;
        a.last_yielded_core = Some(1);
        let out = two_passes(
            &mut s,
            &topo,
            std::slice::from_ref(&a),
            std::slice::from_ref(&a),
        );
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 2,
                core: 1
            }]
        );
    }

    /// A packet steered to a kthread as it parked is served by that
    /// kthread: it is woken, not the sibling that last ran on the core
    /// (which, in the netstack, would not take the packet from a ring not
    /// its own, park, and be woken again for ever).
    #[test]
    fn alg2_the_parked_kthread_with_work_on_its_own_rings_is_woken() {
        let topo = Topology::flat(2);
        let mut s = Shenango::new(5, 1);
        // Kthread 1 last ran on core 1, the core it gave back; kthread 0
        // ran on core 0 and a packet waits on its ingress ring.
        let mut a = lc(
            1,
            vec![
                queued(parked(10, Some(0)), (0, 0), (3, 4)),
                parked(0, Some(1)),
            ],
        );
        a.last_yielded_core = Some(1);
        let mut out = Vec::new();
        s.pass(0, &topo, std::slice::from_ref(&a), &mut out);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 0,
                core: 1
            }]
        );
        // Without work anywhere, the kthread that last ran on the core.
        let mut s = Shenango::new(5, 1);
        let mut a = lc(1, vec![parked(10, Some(0)), parked(0, Some(1))]);
        a.last_yielded_core = Some(1);
        a.next_timer = Some(0);
        let mut out = Vec::new();
        s.pass(0, &topo, std::slice::from_ref(&a), &mut out);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 1,
                core: 1
            }]
        );
    }

    #[test]
    fn alg2_else_kthread_parked_longest() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let mut a = congested_app(1, &[0], 0);
        a.kthreads.push(parked(50, Some(3)));
        a.kthreads.push(parked(10, Some(2)));
        a.max_cores = 3;
        // Core 1 is the first idle one; nobody ran there: parked longest (since 10).
        let out = two_passes(
            &mut s,
            &topo,
            std::slice::from_ref(&a),
            std::slice::from_ref(&a),
        );
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 2,
                core: 1
            }]
        );
    }

    #[test]
    fn alg2_no_parked_kthread_no_grant() {
        let topo = Topology::flat(4);
        let mut s = Shenango::new(5, 1);
        let a = congested_app(1, &[0, 1], 0);
        assert!(two_passes(
            &mut s,
            &topo,
            std::slice::from_ref(&a),
            std::slice::from_ref(&a)
        )
        .is_empty());
    }

    #[test]
    fn victim_choice_is_seeded() {
        let topo = Topology::flat(4);
        let a = congested_app(1, &[0], 1);
        let b1 = app(2, AppClass::Batch, 0, vec![running(1)]);
        let b2 = app(3, AppClass::Batch, 0, vec![running(2), running(3)]);
        let apps = [a, b1, b2];
        let run = |seed| two_passes(&mut Shenango::new(5, seed), &topo, &apps, &apps);
        assert_eq!(run(42), run(42));
        let cores: std::collections::HashSet<_> = (0..32)
            .map(|seed| match run(seed)[0] {
                Decision::Preempt { core, .. } => core,
                d => panic!("{d:?}"),
            })
            .collect();
        assert!(cores.len() > 1, "random victims: {cores:?}");
    }

    #[test]
    fn a_pass_reports_the_congested_applications() {
        let topo = Topology::flat(8);
        let mut s = Shenango::new(5, 1);
        let mut timer_only = lc(3, vec![parked(0, None)]);
        timer_only.next_timer = Some(0);
        let apps = |busy_head: u32| {
            [
                // Runs; its queue advanced past what the last pass saw, or not.
                lc(
                    1,
                    vec![queued(running(0), (busy_head, 9), (0, 0)), parked(0, None)],
                ),
                // No core, a packet waiting.
                lc(2, vec![queued(parked(0, None), (0, 0), (4, 5))]),
                // No core, only a due timer: woken, but not congested.
                timer_only.clone(),
                // Runs with nothing queued.
                lc(4, vec![running(1)]),
            ]
        };
        let mut out = Vec::new();
        assert_eq!(s.pass(0, &topo, &apps(2), &mut out), [1]);
        assert_eq!(out.len(), 2, "grants for the packet and the timer: {out:?}");
        out.clear();
        // App 0's items seen at pass 0 are still queued: congested.
        assert_eq!(s.pass(5, &topo, &apps(3), &mut out), [0, 1]);
        out.clear();
        // Taken since (head 9 reached the tail seen before): not congested.
        assert_eq!(s.pass(10, &topo, &apps(9), &mut out), [1]);

        // The baselines report the same verdicts, though they do not act
        // on them; `slow` reports at every pass, not only once a period.
        let mut st = Static::new(5);
        let mut sl = Slow::new(1000, 0.8, 1);
        let mut alone = Congestion::new();
        for (now, head, want) in [(0, 2, &[1][..]), (5, 3, &[0, 1]), (10, 9, &[1])] {
            assert_eq!(alone.detect(&apps(head)), want, "{now}");
            assert_eq!(st.pass(now, &topo, &apps(head), &mut out), want, "{now}");
            assert_eq!(sl.pass(now, &topo, &apps(head), &mut out), want, "{now}");
        }
    }

    #[test]
    fn work_for_several_coreless_apps_never_grants_one_core_twice() {
        let topo = Topology::flat(2);
        let mut s = Shenango::new(5, 1);
        // Guaranteed a core each: a granted one is not bursting, so the
        // third application finds no core (not the second one's again).
        let guaranteed = |key| app(key, AppClass::LatencyCritical, 1, vec![parked(0, None)]);
        let apps = [guaranteed(1), guaranteed(2), guaranteed(3)];
        let mut out = Vec::new();
        s.on_work_for(0, &topo, &apps, &[0, 1, 2], &mut out);
        assert_eq!(
            out,
            vec![
                Decision::Grant {
                    app: 0,
                    kthread: 0,
                    core: 0
                },
                Decision::Grant {
                    app: 1,
                    kthread: 0,
                    core: 1
                },
            ]
        );
    }

    #[test]
    fn static_fills_guaranteed_and_keeps_them() {
        let topo = Topology::flat(4);
        let mut st = Static::new(1000);
        let a = app(
            1,
            AppClass::LatencyCritical,
            2,
            vec![parked(0, None), parked(0, None), parked(0, None)],
        );
        let mut out = Vec::new();
        st.pass(0, &topo, std::slice::from_ref(&a), &mut out);
        assert_eq!(out.len(), 2);
        let a = app(
            1,
            AppClass::LatencyCritical,
            2,
            vec![running(0), running(1), parked(0, None)],
        );
        out.clear();
        st.pass(1000, &topo, std::slice::from_ref(&a), &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn static_batch_takes_leftover_cores() {
        let topo = Topology::flat(4);
        let mut st = Static::new(1000);
        let l = app(
            1,
            AppClass::LatencyCritical,
            2,
            vec![parked(0, None), parked(0, None)],
        );
        let b = app(
            2,
            AppClass::Batch,
            0,
            (0..4).map(|_| parked(0, None)).collect(),
        );
        let mut out = Vec::new();
        st.pass(0, &topo, &[l, b], &mut out);
        let lc = out
            .iter()
            .filter(|d| matches!(d, Decision::Grant { app: 0, .. }))
            .count();
        let batch = out
            .iter()
            .filter(|d| matches!(d, Decision::Grant { app: 1, .. }))
            .count();
        assert_eq!((lc, batch), (2, 2));
    }

    /// Only the utilization-based allocator reads busy time, so only its
    /// runtimes are asked to keep it.
    #[test]
    fn only_the_slow_allocator_reads_busy_time() {
        assert!(Slow::new(1000, 0.5, 1).reads_busy_time());
        assert!(!Shenango::new(5, 1).reads_busy_time());
        assert!(!Static::new(5).reads_busy_time());
    }

    #[test]
    fn slow_follows_utilization_every_period() {
        let topo = Topology::flat(8);
        let mut sl = Slow::new(1000, 0.5, 1);
        let mut ks = vec![running(0)];
        ks.extend((0..5).map(|_| parked(0, None)));
        let mut a = lc(1, ks);
        let mut out = Vec::new();
        sl.pass(0, &topo, std::slice::from_ref(&a), &mut out);
        assert!(out.is_empty(), "first look keeps the current core");
        // One core fully busy for the period at 50 % target: want 2.
        a.kthreads[0].busy_time = 1000;
        sl.pass(500, &topo, std::slice::from_ref(&a), &mut out);
        assert!(out.is_empty(), "before the period ends nothing changes");
        sl.pass(1000, &topo, std::slice::from_ref(&a), &mut out);
        assert_eq!(out.len(), 1);
        assert!(matches!(out[0], Decision::Grant { app: 0, .. }));
        // Idle for a period: back to 0 cores (guaranteed 0).
        out.clear();
        sl.pass(2000, &topo, std::slice::from_ref(&a), &mut out);
        assert_eq!(
            out,
            vec![Decision::Preempt {
                app: 0,
                kthread: 0,
                core: 0
            }]
        );
    }

    #[test]
    fn slow_wakes_an_idle_app_for_its_due_timer_at_the_next_period() {
        let topo = Topology::flat(2);
        let mut sl = Slow::new(1000, 0.8, 1);
        let mut a = lc(1, vec![parked(0, Some(0))]);
        let mut out = Vec::new();
        sl.pass(0, &topo, std::slice::from_ref(&a), &mut out);
        assert!(out.is_empty(), "idle, no timer");
        a.next_timer = Some(1500);
        sl.pass(1000, &topo, std::slice::from_ref(&a), &mut out);
        assert!(out.is_empty(), "timer not due yet");
        sl.pass(1700, &topo, std::slice::from_ref(&a), &mut out);
        assert!(out.is_empty(), "due, but the period has not ended");
        sl.pass(2000, &topo, std::slice::from_ref(&a), &mut out);
        assert_eq!(
            out,
            vec![Decision::Grant {
                app: 0,
                kthread: 0,
                core: 0
            }]
        );
    }

    #[test]
    fn a_reused_board_decides_as_a_fresh_one_while_the_table_changes() {
        // Shenango keeps its pass board between passes: passes over a table
        // that shrinks and grows must decide exactly what a fresh allocator
        // (same seed) decides for each table.
        let topo = Topology::flat(2);
        let bursting = |key| {
            app(
                key,
                AppClass::Batch,
                0,
                vec![running(0), running(1), parked(0, None)],
            )
        };
        let wants = |key| lc(key, vec![queued(parked(3, None), (0, 1), (0, 0))]);
        let tables: [Vec<AppSnap>; 4] = [
            vec![bursting(1), wants(2), wants(3)],
            vec![wants(4)],
            vec![bursting(5), wants(6)],
            vec![wants(7), bursting(8), wants(9)],
        ];
        let mut reused = Shenango::new(5, 7);
        for (i, apps) in tables.iter().enumerate() {
            let mut fresh = Shenango::new(5, 7);
            let (mut got, mut want) = (Vec::new(), Vec::new());
            // The fresh one draws what the reused one drew before this table.
            for earlier in &tables[..i] {
                fresh.pass(0, &topo, earlier, &mut Vec::new());
            }
            fresh.pass(0, &topo, apps, &mut want);
            reused.pass(0, &topo, apps, &mut got);
            assert_eq!(got, want, "table {i}");
            assert!(!got.is_empty(), "table {i}: something was decided");
        }
    }
}
