//! Shinjuku and Shenango in one system (docs/colocate.md): a Shinjuku-mode
//! application whose worker cores a core allocator grants and revokes,
//! beside a batch application that takes every core it is given.
//!
//! Runs the very objects iokerneld runs: the `ginza_policy::alloc`
//! allocator (Shenango every `interval_us`, or static cores) and the
//! `ginza_policy::sched::colocated` dispatcher (c-FCFS, c-PRE-SQ). The
//! dispatcher's queues are the application's queued work (kthread 0's
//! runqueue counters, as iokerneld reports them); an idle worker with an
//! empty queue parks after `park_spin_us`; a revoked worker hands its
//! request back (preempted); a preemption costs `preempt_cost_us` of the
//! worker's time.

use std::collections::HashMap;

use ginza_policy::alloc::{
    AppClass, AppSnap, CoreAllocator, Decision, KthreadSnap, QueueCounters, Shenango, Static,
    Topology,
};
use ginza_policy::sched::colocated::{Action, ColocatedDispatcher, HandBack};
use ginza_policy::sched::{Placement, Request, SchedPolicy};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::dist::{Arrivals, Service};
use crate::stats::Stats;
use crate::{ps_to_us, us_to_ps};

/// The core allocator of a colocation run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ColocateAlloc {
    /// Congestion detection every `interval_us`.
    Shenango { interval_us: f64 },
    /// The Shinjuku application keeps `guaranteed` cores, spinning.
    Static,
}

/// One colocation simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct ColocateSim {
    /// Cores the allocator manages.
    pub cores: usize,
    /// Worker kthreads of the Shinjuku application (its most cores).
    pub workers: usize,
    /// Its guaranteed cores (static: the cores it spins on).
    pub guaranteed: usize,
    pub alloc: ColocateAlloc,
    /// c-FCFS or c-PRE-SQ (times in µs; converted here).
    pub quantum_us: Option<f64>,
    pub service: Service,
    /// Requests per µs.
    pub rate_per_us: f64,
    pub park_spin_us: f64,
    /// From a grant decision to the worker running, µs.
    pub grant_latency_us: f64,
    /// Worker time one preemption costs, µs.
    pub preempt_cost_us: f64,
    pub duration_us: f64,
    pub warmup_us: f64,
    pub seed: u64,
}

/// What a colocation run measured.
#[derive(Clone, Debug)]
pub struct ColocateResult {
    pub stats: Stats,
    /// Mean cores held by the Shinjuku application, and by batch.
    pub lc_cores: f64,
    pub batch_cores: f64,
    pub preemptions: u64,
    pub revoked_mid_request: u64,
    /// Revocations that left the application below its guaranteed cores
    /// (the allocator must make none).
    pub guaranteed_taken: u64,
}

struct Req {
    arrival: u64,
    service: u64,
    left: u64,
    class: usize,
}

#[derive(Clone, Copy, Default)]
struct Worker {
    core: Option<usize>,
    /// Runs from here (a grant's latency first).
    ready_at: u64,
    /// Running request and when its current slice's progress was counted.
    running: Option<(u64, u64)>,
    /// A preemption was asked: the request stops at this time.
    stop_at: Option<u64>,
    idle_since: Option<u64>,
    parked_since: u64,
    last_core: Option<usize>,
}

impl ColocateSim {
    fn allocator(&self) -> Box<dyn CoreAllocator> {
        match self.alloc {
            ColocateAlloc::Shenango { interval_us } => {
                Box::new(Shenango::new(us_to_ps(interval_us), self.seed ^ 0x5eed))
            }
            ColocateAlloc::Static => Box::new(Static::new(us_to_ps(5.0))),
        }
    }

    fn policy(&self) -> SchedPolicy {
        match self.quantum_us {
            None => SchedPolicy::CFcfs,
            Some(q) => SchedPolicy::CPreSq {
                quantum: us_to_ps(q).max(1),
                placement: Placement::Tail,
            },
        }
    }

    /// The allocator's view: the Shinjuku application (its dispatch
    /// queues counted as kthread 0's runqueue) and batch, always queued.
    fn fill_snaps(
        &self,
        snaps: &mut Vec<AppSnap>,
        (taken, pushed): (u32, u32),
        w: &[Worker],
        batch: &[Option<usize>],
        batch_last: &[Option<usize>],
        passes: u32,
    ) {
        snaps.clear();
        snaps.push(AppSnap {
            key: 1,
            class: AppClass::LatencyCritical,
            guaranteed: self.guaranteed,
            max_cores: self.workers,
            kthreads: w
                .iter()
                .enumerate()
                .map(|(i, x)| KthreadSnap {
                    counters: if i == 0 {
                        QueueCounters {
                            rq_head: taken,
                            rq_tail: pushed,
                            ..Default::default()
                        }
                    } else {
                        QueueCounters::default()
                    },
                    core: x.core,
                    idle_polling: false,
                    handover_pending: false,
                    parked: x.core.is_none(),
                    parked_since: x.parked_since,
                    last_core: x.last_core,
                    busy_time: 0,
                })
                .collect(),
            next_timer: None,
            last_yielded_core: None,
            netstack: None,
            granted_lately: false,
        });
        snaps.push(AppSnap {
            key: 2,
            class: AppClass::Batch,
            guaranteed: 0,
            max_cores: self.cores,
            kthreads: batch
                .iter()
                .zip(batch_last)
                .map(|(c, l)| KthreadSnap {
                    counters: QueueCounters {
                        rq_head: passes,
                        rq_tail: passes.wrapping_add(2),
                        ..Default::default()
                    },
                    core: *c,
                    idle_polling: false,
                    handover_pending: false,
                    parked: c.is_none(),
                    parked_since: 0,
                    last_core: *l,
                    busy_time: 0,
                })
                .collect(),
            next_timer: None,
            last_yielded_core: None,
            netstack: None,
            granted_lately: false,
        });
    }

    pub fn run(&self) -> ColocateResult {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let sampler = self.service.sampler();
        let mut arrivals = Arrivals::poisson(self.rate_per_us);
        let mut alloc = self.allocator();
        let interval = alloc.interval();
        let topo = Topology::flat(self.cores);
        let spin = us_to_ps(self.park_spin_us);
        let grant_latency = us_to_ps(self.grant_latency_us);
        let preempt_cost = us_to_ps(self.preempt_cost_us);
        let end = us_to_ps(self.duration_us);
        let warmup = us_to_ps(self.warmup_us);
        let keep_cores = self.alloc == ColocateAlloc::Static;

        let mut d: ColocatedDispatcher<()> = ColocatedDispatcher::new(self.policy(), self.workers);
        let mut reqs: HashMap<u64, Req> = HashMap::new();
        let mut w = vec![
            Worker {
                parked_since: 0,
                ..Default::default()
            };
            self.workers
        ];
        // Batch: one kthread per core, always with work queued.
        let mut batch: Vec<Option<usize>> = vec![None; self.cores];
        let mut batch_last: Vec<Option<usize>> = vec![None; self.cores];
        let mut stats = Stats::new(1, &[], true);
        let (mut lc_core_ps, mut batch_core_ps) = (0u128, 0u128);
        let (mut preemptions, mut revoked, mut guaranteed_taken) = (0u64, 0u64, 0u64);
        let mut next_id = 0u64;
        let mut now = 0u64;
        let mut next_arrival = arrivals.next(&mut rng);
        let mut next_pass = 0u64;
        let mut passes = 0u32;
        let mut stalls = 0u32;
        let mut out = Vec::new();
        let mut actions = Vec::new();
        let mut snaps: Vec<AppSnap> = Vec::new();

        while now < end {
            // The next event: an arrival, a pass, a request's end or stop,
            // a quantum's end, an idle worker's park.
            let t = next_event(
                &d,
                &w,
                &reqs,
                next_arrival.min(next_pass).min(end),
                now,
                spin,
                keep_cores,
            );
            // Same-time events are handled in one go; should one not
            // change anything, time still moves on.
            let t = if t <= now {
                stalls += 1;
                if stalls > 2 {
                    now + 1
                } else {
                    now
                }
            } else {
                stalls = 0;
                t
            };
            // Progress and accounting up to t.
            let dt = u128::from(t - now);
            if now >= warmup {
                lc_core_ps += dt * w.iter().filter(|x| x.core.is_some()).count() as u128;
                batch_core_ps += dt * batch.iter().filter(|c| c.is_some()).count() as u128;
            }
            for x in w.iter_mut() {
                if let Some((id, since)) = &mut x.running {
                    let start = (*since).max(x.ready_at);
                    if t > start {
                        let r = reqs.get_mut(id).expect("running request");
                        r.left = r.left.saturating_sub(t - start);
                        *since = t;
                    }
                }
            }
            now = t;

            // Requests that finished, or stopped after a preemption.
            preemptions += hand_back_stopped(&mut d, &mut w, &mut reqs, &mut stats, now, warmup);
            // Idle workers past their spin park (unless cores are kept).
            for x in w.iter_mut() {
                if !keep_cores && x.running.is_none() && d.queued() == 0 {
                    if let (Some(s), Some(c)) = (x.idle_since, x.core) {
                        if now >= s + spin {
                            x.last_core = Some(c);
                            x.core = None;
                            x.idle_since = None;
                            x.parked_since = now;
                        }
                    }
                }
            }
            let mut work_arrived = false;
            while next_arrival <= now {
                let (svc_us, _) = sampler.sample(&mut rng);
                let service = us_to_ps(svc_us).max(1);
                reqs.insert(
                    next_id,
                    Req {
                        arrival: next_arrival,
                        service,
                        left: service,
                        class: 0,
                    },
                );
                d.arrive(
                    Request {
                        id: next_id,
                        class: 0,
                        arrival: next_arrival,
                        payload: (),
                    },
                    now,
                );
                next_id += 1;
                next_arrival = arrivals.next(&mut rng);
                work_arrived = true;
            }
            let pass_due = now >= next_pass;
            if pass_due || (work_arrived && w.iter().all(|x| x.core.is_none())) {
                self.fill_snaps(
                    &mut snaps,
                    d.queue_counters(),
                    &w,
                    &batch,
                    &batch_last,
                    passes,
                );
                out.clear();
                if pass_due {
                    passes = passes.wrapping_add(1);
                    alloc.pass(now, &topo, &snaps, &mut out);
                    next_pass = now + interval;
                } else {
                    alloc.on_work_for(now, &topo, &snaps, &[0], &mut out);
                }
                for dec in &out {
                    match *dec {
                        Decision::Preempt {
                            app: 0, kthread, ..
                        } => {
                            if w.iter().filter(|x| x.core.is_some()).count() <= self.guaranteed {
                                guaranteed_taken += 1;
                            }
                            let x = &mut w[kthread];
                            x.last_core = x.core.take();
                            x.parked_since = now;
                            x.idle_since = None;
                            if let Some((id, _)) = x.running.take() {
                                // A revoked worker hands its request back.
                                d.set_granted(kthread, false);
                                d.hand_back(kthread, id, HandBack::Preempted, (), now)
                                    .expect("the worker's own request");
                                revoked += 1;
                                x.stop_at = None;
                            }
                        }
                        Decision::Preempt { kthread, .. } => {
                            batch_last[kthread] = batch[kthread].take();
                        }
                        Decision::Grant {
                            app: 0,
                            kthread,
                            core,
                        } => {
                            let x = &mut w[kthread];
                            x.core = Some(core);
                            x.ready_at = now + grant_latency;
                            x.idle_since = Some(now);
                        }
                        Decision::Grant { kthread, core, .. } => batch[kthread] = Some(core),
                    }
                }
            }
            dispatch_step(&mut d, &mut w, &mut actions, now, preempt_cost);
        }
        let span = u128::from(end.saturating_sub(warmup)).max(1);
        ColocateResult {
            stats,
            lc_cores: lc_core_ps as f64 / span as f64,
            batch_cores: batch_core_ps as f64 / span as f64,
            preemptions,
            revoked_mid_request: revoked,
            guaranteed_taken,
        }
    }
}

/// The time of the next event no later than `t`: a request's end or stop,
/// a quantum's end, an idle worker's park.
fn next_event(
    d: &ColocatedDispatcher<()>,
    w: &[Worker],
    reqs: &HashMap<u64, Req>,
    mut t: u64,
    now: u64,
    spin: u64,
    keep_cores: bool,
) -> u64 {
    for (i, x) in w.iter().enumerate() {
        if let Some((id, since)) = x.running {
            let start = since.max(x.ready_at);
            t = t.min(start + reqs[&id].left);
            if let Some(s) = x.stop_at {
                t = t.min(s);
            }
            // A quantum already spent with nobody waiting matters
            // at the next arrival, an event of its own.
            if let Some(q) = d.quantum_ends(i).filter(|&q| q > now) {
                t = t.min(q);
            }
        } else if let (Some(s), Some(_)) = (x.idle_since, x.core) {
            if !keep_cores {
                t = t.min(s + spin);
            }
        }
    }
    t
}

/// Hands back the requests that finished (recorded past `warmup`) or
/// stopped after a preemption; returns how many stopped.
fn hand_back_stopped(
    d: &mut ColocatedDispatcher<()>,
    w: &mut [Worker],
    reqs: &mut HashMap<u64, Req>,
    stats: &mut Stats,
    now: u64,
    warmup: u64,
) -> u64 {
    let mut preemptions = 0;
    for (i, x) in w.iter_mut().enumerate() {
        let Some((id, _)) = x.running else { continue };
        if reqs[&id].left == 0 {
            let r = reqs.remove(&id).expect("running request");
            d.hand_back(i, id, HandBack::Completed, (), now)
                .expect("the worker's own request");
            if r.arrival >= warmup {
                stats.record(ps_to_us(now - r.arrival), ps_to_us(r.service), r.class);
            }
            x.running = None;
            x.stop_at = None;
            x.idle_since = Some(now);
        } else if x.stop_at.is_some_and(|s| s <= now) {
            d.hand_back(i, id, HandBack::Preempted, (), now)
                .expect("the worker's own request");
            preemptions += 1;
            x.running = None;
            x.stop_at = None;
            x.idle_since = Some(now);
        }
    }
    preemptions
}

/// The dispatch step at `now`: workers that hold a core may run requests;
/// a preempted request stops `preempt_cost` later.
fn dispatch_step(
    d: &mut ColocatedDispatcher<()>,
    w: &mut [Worker],
    actions: &mut Vec<Action<()>>,
    now: u64,
    preempt_cost: u64,
) {
    for (i, x) in w.iter().enumerate() {
        d.set_granted(i, x.core.is_some());
    }
    actions.clear();
    d.step(now, actions);
    for a in actions.drain(..) {
        match a {
            Action::Run { worker, request } => {
                let x = &mut w[worker];
                x.running = Some((request.id, now));
                x.idle_since = None;
                d.started(worker, now.max(x.ready_at));
            }
            Action::Preempt { worker, .. } => {
                w[worker].stop_at = Some(now + preempt_cost);
            }
            // Simulated requests always reach a preemption point
            // (no backstop is set here).
            Action::Signal { .. } => {}
            // The simulated dispatcher does not pre-assign.
            Action::PreAssign { .. } => {
                unreachable!("pre-assignment is off in the simulator")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(alloc: ColocateAlloc, quantum_us: Option<f64>, load: f64) -> ColocateSim {
        let service = Service::parse("Bimodal(99.5-0.5, 0.5-500)").unwrap();
        ColocateSim {
            cores: 2,
            workers: 2,
            guaranteed: if alloc == ColocateAlloc::Static { 2 } else { 0 },
            alloc,
            quantum_us,
            rate_per_us: load * 2.0 / service.mean(),
            service,
            park_spin_us: 2.0,
            grant_latency_us: 5.0,
            preempt_cost_us: 0.2,
            duration_us: 200_000.0,
            warmup_us: 20_000.0,
            seed: 3,
        }
    }

    #[test]
    fn preemption_cuts_the_tail_under_the_allocator_and_batch_gets_the_rest() {
        let shenango = ColocateAlloc::Shenango { interval_us: 5.0 };
        let fcfs = sim(shenango, None, 0.5).run();
        let pre = sim(shenango, Some(5.0), 0.5).run();
        let fixed = sim(ColocateAlloc::Static, Some(5.0), 0.5).run();
        let p99 = |r: &ColocateResult| r.stats.latency_pct_us(99.0);
        assert!(pre.preemptions > 0);
        assert!(
            p99(&pre) * 3.0 < p99(&fcfs),
            "c-PRE-SQ {} vs c-FCFS {}",
            p99(&pre),
            p99(&fcfs)
        );
        // Batch gets the cores the Shinjuku application does not use;
        // on static cores it gets none.
        assert!(pre.batch_cores > 0.5, "{}", pre.batch_cores);
        assert!(fixed.batch_cores < 0.01, "{}", fixed.batch_cores);
        assert!((fixed.lc_cores - 2.0).abs() < 0.01);
        assert!(pre.lc_cores + pre.batch_cores <= 2.0 + 1e-9);
    }

    #[test]
    fn guaranteed_cores_are_never_taken() {
        // A second, bursting Shinjuku worker is revoked when batch needs
        // the core back; the guaranteed one never is.
        let mut s = sim(ColocateAlloc::Shenango { interval_us: 5.0 }, Some(5.0), 0.7);
        s.guaranteed = 1;
        let r = s.run();
        assert!(r.stats.n > 1000);
        assert_eq!(r.guaranteed_taken, 0);
    }
}
