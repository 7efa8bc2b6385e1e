//! Request scheduling on n cores: d-FCFS, c-FCFS, processor sharing and
//! Shinjuku's c-PRE-SQ / c-PRE-MQ. The centralized policies are run by the
//! `ginza_policy::sched::Dispatcher`, the object the runtime uses.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use ginza_net::flow::mix64;
use ginza_policy::sched::{ClassConfig, Dispatcher, Placement, Request, SchedPolicy};
use ginza_policy::steer::{AppSteering, Steered};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::dist::{Arrivals, LoadStep, Service};
use crate::stats::Stats;
use crate::steering::SteeringSpec;
use crate::{ps_to_us, us_to_ps};

/// Where preempted requests go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    Head,
    Tail,
}

impl From<Place> for Placement {
    fn from(p: Place) -> Self {
        match p {
            Place::Head => Placement::Head,
            Place::Tail => Placement::Tail,
        }
    }
}

/// A request-scheduling policy to simulate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Sched {
    /// Per-core FIFO queues, requests steered by `hash(connection) % n`.
    /// `conns = None`: every request is its own connection (uniform spread,
    /// the idealized RSS of Shinjuku Fig. 1).
    DFcfs {
        conns: Option<u64>,
    },
    CFcfs,
    /// Processor sharing with quantum → 0 (each of k jobs on n cores runs at
    /// rate min(1, n/k)).
    Ps,
    CPreSq {
        quantum_us: f64,
        place: Place,
    },
    /// One queue per service-time class (mode); SLOs per class in µs.
    CPreMq {
        quantum_us: f64,
        slo_us: Vec<f64>,
        place: Place,
    },
}

impl Sched {
    pub fn label(&self) -> String {
        match self {
            Sched::DFcfs { .. } => "d-FCFS".into(),
            Sched::CFcfs => "c-FCFS".into(),
            Sched::Ps => "PS".into(),
            Sched::CPreSq { quantum_us, .. } => format!("c-PRE-SQ (q={quantum_us}us)"),
            Sched::CPreMq { quantum_us, .. } => format!("c-PRE-MQ (q={quantum_us}us)"),
        }
    }
}

/// Offered load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Load {
    /// Utilization ρ = λ·E[S]/cores.
    Rho(f64),
    Steps(Vec<LoadStep>),
}

/// One request-scheduling simulation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReqSim {
    pub cores: usize,
    pub sched: Sched,
    pub service: Service,
    pub load: Load,
    /// Measured requests (after the warm-up ones).
    pub requests: u64,
    #[serde(default)]
    pub warmup: u64,
    #[serde(default)]
    pub seed: u64,
    /// Extra worker time after a preemption, µs.
    #[serde(default)]
    pub preempt_cost_us: f64,
    /// Worker time to switch to a request, µs (every start, preempted or not).
    #[serde(default)]
    pub ctx_switch_us: f64,
    /// P(W > t) is counted for these t (µs).
    #[serde(default)]
    pub wait_thresholds_us: Vec<f64>,
    /// Keep latency histograms (percentiles); off for mean-only checks.
    #[serde(default = "yes")]
    pub histograms: bool,
    /// d-FCFS: the steering policy over the cores (the flows are the
    /// connections, `Sched::DFcfs::conns`; its `flows` is not used here).
    #[serde(default)]
    pub steering: SteeringSpec,
    /// Spans of the arrival clock, µs (start, length), in which the whole
    /// server stops: no request makes progress, none starts or is
    /// preempted, arrivals queue. They replay the stalls a real run
    /// measured (`ginza bench shinjuku`, `sim_p99_us_with_stalls`). Modelled
    /// for the dispatcher's policies (c-FCFS, c-PRE-SQ, c-PRE-MQ) only.
    #[serde(default)]
    pub outages_us: Vec<(f64, f64)>,
}

fn yes() -> bool {
    true
}

impl ReqSim {
    pub fn new(
        cores: usize,
        sched: Sched,
        service: Service,
        rho: f64,
        requests: u64,
        seed: u64,
    ) -> Self {
        Self {
            cores,
            sched,
            service,
            load: Load::Rho(rho),
            requests,
            warmup: requests / 10,
            seed,
            preempt_cost_us: 0.0,
            ctx_switch_us: 0.0,
            wait_thresholds_us: Vec::new(),
            histograms: true,
            steering: SteeringSpec::default(),
            outages_us: Vec::new(),
        }
    }

    fn arrivals(&self) -> Arrivals {
        match &self.load {
            Load::Rho(rho) => Arrivals::poisson(rho * self.cores as f64 / self.service.mean()),
            Load::Steps(s) => Arrivals::steps(s),
        }
    }

    /// Runs the simulation to the end and returns its statistics.
    pub fn run(&self) -> Stats {
        assert!(self.cores > 0, "need at least one core");
        let mut st = Stats::new(
            self.service.classes(),
            &self.wait_thresholds_us,
            self.histograms,
        );
        let mut src = Source {
            rng: SmallRng::seed_from_u64(self.seed),
            arrivals: self.arrivals(),
            sampler: self.service.sampler(),
            left: self.warmup + self.requests,
            next_id: 0,
        };
        assert!(
            self.outages_us.is_empty() || !matches!(self.sched, Sched::DFcfs { .. } | Sched::Ps),
            "outages are modelled for c-FCFS, c-PRE-SQ and c-PRE-MQ only"
        );
        match &self.sched {
            Sched::DFcfs { conns } => run_dfcfs(self, *conns, &mut src, &mut st),
            Sched::Ps => run_ps(self, &mut src, &mut st),
            Sched::CFcfs => run_dispatch(self, SchedPolicy::CFcfs, &mut src, &mut st),
            Sched::CPreSq { quantum_us, place } => {
                let p = SchedPolicy::CPreSq {
                    quantum: us_to_ps(*quantum_us).max(1),
                    placement: (*place).into(),
                };
                run_dispatch(self, p, &mut src, &mut st)
            }
            Sched::CPreMq {
                quantum_us,
                slo_us,
                place,
            } => {
                assert_eq!(
                    slo_us.len(),
                    self.service.classes(),
                    "c-PRE-MQ needs one SLO per service class"
                );
                let classes = slo_us
                    .iter()
                    .map(|&s| ClassConfig {
                        slo: us_to_ps(s).max(1),
                        placement: (*place).into(),
                    })
                    .collect();
                let p = SchedPolicy::CPreMq {
                    quantum: us_to_ps(*quantum_us).max(1),
                    classes,
                };
                run_dispatch(self, p, &mut src, &mut st)
            }
        }
        st
    }
}

/// One arrival: id, time, service (ps) and class.
struct Arrival {
    id: u64,
    at: u64,
    service: u64,
    class: usize,
}

struct Source {
    rng: SmallRng,
    arrivals: Arrivals,
    sampler: crate::dist::Sampler,
    left: u64,
    next_id: u64,
}

impl Source {
    fn next(&mut self) -> Option<Arrival> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let at = self.arrivals.next(&mut self.rng);
        if at == u64::MAX {
            return None;
        }
        let (s, class) = self.sampler.sample(&mut self.rng);
        let id = self.next_id;
        self.next_id += 1;
        Some(Arrival {
            id,
            at,
            service: us_to_ps(s).max(1),
            class,
        })
    }
}

fn record(
    cfg: &ReqSim,
    st: &mut Stats,
    id: u64,
    arrival: u64,
    done: u64,
    service: u64,
    class: usize,
) {
    debug_assert!(
        done - arrival >= service,
        "request {id} finished faster than its service time"
    );
    if id >= cfg.warmup {
        st.record(ps_to_us(done - arrival), ps_to_us(service), class);
    }
}

fn run_dfcfs(cfg: &ReqSim, conns: Option<u64>, src: &mut Source, st: &mut Stats) {
    let n = cfg.cores;
    let mut queues: Vec<VecDeque<Arrival>> = (0..n).map(|_| VecDeque::new()).collect();
    // Per core: the request running and when it finishes.
    let mut running: Vec<Option<(Arrival, u64)>> = (0..n).map(|_| None).collect();
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let cs = us_to_ps(cfg.ctx_switch_us);
    // iokerneld's steering over the cores, all active (a NIC's RSS).
    let mut steering = AppSteering::new(cfg.steering.build(n), n);
    steering.sync(std::iter::repeat_n(true, n), 0);
    let mut next = src.next();
    loop {
        let t_core = heap.peek().map(|r| r.0 .0);
        match (&next, t_core) {
            (None, None) => break,
            (Some(a), t) if t.is_none_or(|t| a.at <= t) => {
                let a = next.take().expect("matched Some");
                let conn = match conns {
                    Some(c) => src.rng.random_range(0..c.max(1)),
                    None => src.rng.random(),
                };
                let Steered::Active(q) = steering.steer(mix64(conn), a.at) else {
                    unreachable!("every core is active");
                };
                if running[q].is_none() {
                    let done = a.at + cs + a.service;
                    heap.push(Reverse((done, q)));
                    running[q] = Some((a, done));
                } else {
                    queues[q].push_back(a);
                }
                next = src.next();
            }
            _ => {
                let Reverse((now, q)) = heap.pop().expect("peeked");
                let (a, done) = running[q].take().expect("core event without request");
                record(cfg, st, a.id, a.at, done, a.service, a.class);
                if let Some(b) = queues[q].pop_front() {
                    let done = now + cs + b.service;
                    heap.push(Reverse((done, q)));
                    running[q] = Some((b, done));
                }
            }
        }
    }
}

/// Exact processor sharing on n cores via virtual time: every job in the
/// system has received the same service V(t) since its arrival offset, so
/// each job finishes when V reaches (V at arrival + its size).
fn run_ps(cfg: &ReqSim, src: &mut Source, st: &mut Stats) {
    let n = cfg.cores as f64;
    // (finish virtual time as ordered bits, index into `jobs`).
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut jobs: Vec<Arrival> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut v = 0.0f64; // virtual time, ps of service per job
    let mut last = 0u64;
    let mut next = src.next();
    let rate = |k: usize| if k == 0 { 0.0 } else { (n / k as f64).min(1.0) };
    loop {
        let k = heap.len();
        let t_dep = heap.peek().map(|r| {
            let fin = f64::from_bits(r.0 .0);
            last + ((fin - v).max(0.0) / rate(k)).ceil() as u64
        });
        match (&next, t_dep) {
            (None, None) => break,
            (Some(a), t) if t.is_none_or(|t| a.at <= t) => {
                let a = next.take().expect("matched Some");
                v += (a.at - last) as f64 * rate(k);
                last = a.at;
                // Non-negative f64 bit patterns order like the numbers.
                let fin = v + a.service as f64;
                let idx = match free.pop() {
                    Some(i) => {
                        jobs[i] = a;
                        i
                    }
                    None => {
                        jobs.push(a);
                        jobs.len() - 1
                    }
                };
                heap.push(Reverse((fin.to_bits(), idx)));
                next = src.next();
            }
            (_, Some(t)) => {
                v += (t - last) as f64 * rate(k);
                last = t;
                // Everything whose finish tag is reached leaves (ties, rounding).
                while let Some(&Reverse((fb, i))) = heap.peek() {
                    if f64::from_bits(fb) > v + 1e-3 {
                        break;
                    }
                    heap.pop();
                    let a = &jobs[i];
                    record(
                        cfg,
                        st,
                        a.id,
                        a.at,
                        t.max(a.at + a.service),
                        a.service,
                        a.class,
                    );
                    free.push(i);
                }
            }
            (Some(_), None) => unreachable!("covered by the arrival arm"),
        }
    }
}

struct Job {
    service: u64,
    remaining: u64,
}

struct Worker {
    req: Option<Request<Job>>,
    /// When the current request (re)started making progress (after overheads).
    since: u64,
    done_at: u64,
    /// Bumped at each (re)schedule; stale heap entries are skipped.
    gen: u32,
    /// Ran past its quantum while nothing waited: preempt on next arrival.
    overdue: bool,
}

impl Worker {
    /// When its request next needs the dispatcher: the end of its quantum
    /// if it runs longer (and has not overrun it already), else its end.
    fn next_event(&self, quantum: Option<u64>) -> u64 {
        match quantum {
            Some(q) if !self.overdue && self.done_at - self.since > q => self.since + q,
            _ => self.done_at,
        }
    }
}

/// c-FCFS, c-PRE-SQ and c-PRE-MQ: a centralized dispatcher and n workers.
fn run_dispatch(cfg: &ReqSim, policy: SchedPolicy, src: &mut Source, st: &mut Stats) {
    let mut d: Dispatcher<Job> = Dispatcher::new(policy);
    let quantum = d.quantum();
    let cs = us_to_ps(cfg.ctx_switch_us);
    let pc = us_to_ps(cfg.preempt_cost_us);
    let mut w: Vec<Worker> = (0..cfg.cores)
        .map(|_| Worker {
            req: None,
            since: 0,
            done_at: 0,
            gen: 0,
            overdue: false,
        })
        .collect();
    let mut idle: Vec<usize> = (0..cfg.cores).rev().collect();
    let mut heap: BinaryHeap<Reverse<(u64, usize, u32)>> = BinaryHeap::new();

    // Puts `req` on worker `i` at `now` after `overhead`; schedules its event.
    let start = |w: &mut Worker,
                 i: usize,
                 req: Request<Job>,
                 now: u64,
                 overhead: u64,
                 heap: &mut BinaryHeap<_>| {
        w.since = now + overhead;
        w.done_at = w.since + req.payload.remaining;
        w.overdue = false;
        w.gen = w.gen.wrapping_add(1);
        heap.push(Reverse((w.next_event(quantum), i, w.gen)));
        w.req = Some(req);
    };

    // The outages still to come, and the end of the one under way: a heap
    // entry for worker THAW at that end starts the idle workers again.
    let mut outages: Vec<(u64, u64)> = cfg
        .outages_us
        .iter()
        .map(|&(at, len)| (us_to_ps(at), us_to_ps(len)))
        .filter(|&(_, len)| len > 0)
        .collect();
    outages.sort_unstable();
    let mut outages: VecDeque<(u64, u64)> = outages.into();
    let mut frozen_until = 0u64;
    const THAW: usize = usize::MAX;

    let mut next = src.next();
    loop {
        let t_core = heap.peek().map(|r| r.0 .0);
        // An outage begins before anything else due at its start (and only
        // while something is left to happen).
        if let Some(&(at, len)) = outages.front() {
            let arrival_first = next.as_ref().is_some_and(|a| a.at < at);
            let core_first = t_core.is_some_and(|t| t < at);
            if next.is_none() && t_core.is_none() {
                break;
            }
            if !arrival_first && !core_first {
                outages.pop_front();
                let end = (at + len).max(frozen_until);
                let shift = end - at.max(frozen_until);
                frozen_until = end;
                // Every running request stands still for the outage.
                for (i, wk) in w.iter_mut().enumerate() {
                    if wk.req.is_none() {
                        continue;
                    }
                    wk.since += shift;
                    wk.done_at += shift;
                    wk.gen = wk.gen.wrapping_add(1);
                    heap.push(Reverse((wk.next_event(quantum), i, wk.gen)));
                }
                heap.push(Reverse((end, THAW, 0)));
                continue;
            }
        }
        match (&next, t_core) {
            (None, None) => break,
            (Some(a), t) if t.is_none_or(|t| a.at <= t) => {
                let a = next.take().expect("matched Some");
                let now = a.at;
                let req = Request {
                    id: a.id,
                    class: a.class,
                    arrival: a.at,
                    payload: Job {
                        service: a.service,
                        remaining: a.service,
                    },
                };
                d.enqueue(req, now);
                if now < frozen_until {
                    // Queued during an outage: its end (THAW) starts it.
                } else if let Some(i) = idle.pop() {
                    let r = d.next_for_idle_worker(now).expect("just enqueued");
                    start(&mut w[i], i, r, now, cs, &mut heap);
                } else if quantum.is_some() {
                    // The dispatcher preempts the longest-running overdue worker.
                    let victim = (0..w.len())
                        .filter(|&i| w[i].overdue)
                        .min_by_key(|&i| w[i].since);
                    if let Some(i) = victim {
                        if d.should_preempt(w[i].since, now) {
                            preempt(&mut d, &mut w[i], i, now, cs + pc, &mut heap, &start);
                        }
                    }
                }
                next = src.next();
            }
            _ => {
                let Reverse((now, i, gen)) = heap.pop().expect("peeked");
                if i == THAW {
                    if now < frozen_until {
                        continue; // a later outage extended this one
                    }
                    while let Some(&k) = idle.last() {
                        let Some(r) = d.next_for_idle_worker(now) else {
                            break;
                        };
                        idle.pop();
                        start(&mut w[k], k, r, now, cs, &mut heap);
                    }
                    // Requests still waiting: overdue runs yield to them.
                    for (k, wk) in w.iter_mut().enumerate() {
                        if wk.overdue && d.should_preempt(wk.since, now) {
                            preempt(&mut d, wk, k, now, cs + pc, &mut heap, &start);
                        }
                    }
                    continue;
                }
                if w[i].gen != gen {
                    continue;
                }
                if now >= w[i].done_at {
                    let r = w[i].req.take().expect("event without request");
                    record(cfg, st, r.id, r.arrival, now, r.payload.service, r.class);
                    match d.next_for_idle_worker(now) {
                        Some(r) => start(&mut w[i], i, r, now, cs, &mut heap),
                        None => idle.push(i),
                    }
                } else if d.should_preempt(w[i].since, now) {
                    preempt(&mut d, &mut w[i], i, now, cs + pc, &mut heap, &start);
                } else {
                    w[i].overdue = true;
                    w[i].gen = w[i].gen.wrapping_add(1);
                    heap.push(Reverse((w[i].done_at, i, w[i].gen)));
                }
            }
        }
    }
}

/// Takes the next request for worker `i` first, then requeues the preempted
/// one (so head placement does not hand it straight back to this worker).
fn preempt<F>(
    d: &mut Dispatcher<Job>,
    w: &mut Worker,
    i: usize,
    now: u64,
    overhead: u64,
    heap: &mut BinaryHeap<Reverse<(u64, usize, u32)>>,
    start: &F,
) where
    F: Fn(&mut Worker, usize, Request<Job>, u64, u64, &mut BinaryHeap<Reverse<(u64, usize, u32)>>),
{
    let mut old = w.req.take().expect("preempting an idle worker");
    old.payload.remaining -= now.saturating_sub(w.since).min(old.payload.remaining - 1);
    let next = d
        .next_for_idle_worker(now)
        .expect("should_preempt saw a waiter");
    d.requeue_preempted(old, now);
    start(w, i, next, now, overhead, heap);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(s: &str) -> Service {
        Service::parse(s).unwrap()
    }

    #[test]
    fn deterministic_for_a_seed() {
        let c = ReqSim::new(4, Sched::CFcfs, svc("Exp(1)"), 0.7, 5_000, 9);
        assert_eq!(c.run().mean_sojourn_us(), c.run().mean_sojourn_us());
    }

    #[test]
    fn light_load_latency_is_service_time() {
        for sched in [
            Sched::CFcfs,
            Sched::DFcfs { conns: None },
            Sched::Ps,
            Sched::CPreSq {
                quantum_us: 5.0,
                place: Place::Tail,
            },
        ] {
            let c = ReqSim::new(16, sched.clone(), svc("Constant(2)"), 0.01, 2_000, 1);
            let s = c.run();
            assert!(
                (s.mean_sojourn_us() - 2.0).abs() < 0.05,
                "{sched:?}: {}",
                s.mean_sojourn_us()
            );
        }
    }

    #[test]
    fn an_outage_holds_the_requests_that_arrive_in_it() {
        let mut c = ReqSim::new(1, Sched::CFcfs, svc("Constant(1)"), 0.01, 2_000, 3);
        c.warmup = 0;
        let calm = c.run();
        assert!(calm.latency_pct_us(100.0) < 10.0);
        // The first 50 ms of a ~200 ms run: a quarter of the requests
        // arrive in it and wait for its end; the others do not notice.
        c.outages_us = vec![(0.0, 50_000.0)];
        let held = c.run();
        assert!(
            held.latency_pct_us(100.0) >= 49_000.0,
            "{}",
            held.latency_pct_us(100.0)
        );
        assert!(
            held.latency_pct_us(50.0) < 5.0,
            "{}",
            held.latency_pct_us(50.0)
        );
    }

    #[test]
    fn a_running_request_stands_still_in_an_outage() {
        // The server is out every other 100 µs: a 1 ms request that waits
        // for nothing takes about 2 ms.
        for sched in [
            Sched::CFcfs,
            Sched::CPreSq {
                quantum_us: 5.0,
                place: Place::Tail,
            },
        ] {
            let mut c = ReqSim::new(1, sched.clone(), svc("Constant(1000)"), 0.0005, 20, 5);
            c.warmup = 0;
            c.outages_us = (0..500_000)
                .map(|k| (k as f64 * 200.0 + 100.0, 100.0))
                .collect();
            let mean = c.run().mean_sojourn_us();
            assert!((mean - 2000.0).abs() <= 110.0, "{sched:?}: {mean}");
        }
    }

    #[test]
    fn preemption_conserves_work_across_outages() {
        // Latency >= service time for every request (`record` checks it in
        // debug builds) while outages cut through running and queued ones.
        let mut c = ReqSim::new(
            1,
            Sched::CPreSq {
                quantum_us: 5.0,
                place: Place::Tail,
            },
            svc("Bimodal(50-1, 50-100)"),
            0.8,
            20_000,
            7,
        );
        let calm = c.run().latency_pct_us(99.0);
        c.outages_us = (0..200)
            .map(|k| (k as f64 * 5_000.0 + 777.0, 1_000.0))
            .collect();
        let stalled = c.run().latency_pct_us(99.0);
        assert!(stalled > calm, "{stalled} <= {calm}");
    }

    #[test]
    fn preemption_conserves_work() {
        // Every request finishes with latency >= its service time.
        let mut c = ReqSim::new(
            2,
            Sched::CPreSq {
                quantum_us: 1.0,
                place: Place::Tail,
            },
            svc("Bimodal(50-0.5, 50-10)"),
            0.8,
            20_000,
            3,
        );
        c.ctx_switch_us = 0.1;
        c.preempt_cost_us = 0.2;
        let s = c.run();
        assert_eq!(s.n, 20_000);
        assert!(s.slowdown_pct(0.0) >= 1.0, "{}", s.slowdown_pct(0.0));
    }

    #[test]
    fn mq_runs_one_queue_per_class() {
        let c = ReqSim::new(
            4,
            Sched::CPreMq {
                quantum_us: 2.0,
                slo_us: vec![10.0, 500.0],
                place: Place::Head,
            },
            svc("Bimodal(50-1, 50-100)"),
            0.7,
            20_000,
            5,
        );
        let s = c.run();
        assert!(
            s.class_pct_us(0, 99.0) < s.class_pct_us(1, 99.0),
            "{} {}",
            s.class_pct_us(0, 99.0),
            s.class_pct_us(1, 99.0)
        );
    }
}
