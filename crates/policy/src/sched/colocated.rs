//! The dispatch step of a Shinjuku-mode application whose worker cores come
//! and go (docs/colocate.md): the [`Dispatcher`]'s queues plus what each
//! worker kthread runs, for a caller that does not own the workers' cores.
//!
//! iokerneld runs it on its own core for every opted-in application (it
//! steers the request packets and grants the cores already); the simulator
//! runs it beside a core allocator. The caller says which workers hold a
//! core ([`ColocatedDispatcher::set_granted`]), hands in arrivals, and
//! carries out the [`Action`]s of each [`ColocatedDispatcher::step`]: run
//! a request on a worker, or ask a worker's request to yield its core.
//!
//! Of several idle workers holding a core, the one that became idle last
//! gets the next request: an idle worker spins only a short while before
//! it parks and gives its core back, so the one idle longest is the one
//! whose `Run` most likely crosses its park (docs/colocate.md, "Several
//! workers").
//!
//! Pre-assignment ([`ColocatedDispatcher::with_pre_assign`], preemptive
//! policies only): when no granted worker is idle and requests wait, a
//! busy worker whose request has not been asked to yield gets the next
//! one in a second slot ([`Action::PreAssign`]), which it starts as soon
//! as it hands its request back completed — without waiting for the
//! caller to hear of the hand-back and send the next run. A preempted
//! hand-back takes the pre-assigned request back first
//! ([`ColocatedDispatcher::take_back_next`]: the head of its queue, as if
//! never taken), so the policy places it and the preempted one as without
//! pre-assignment, and chooses again. A request with one pre-assigned
//! behind it is asked to yield when its quantum is spent, as if that one
//! waited in the queue.
//!
//! A request is in exactly one place at any time: a queue, or one worker's
//! slot (its running one or its pre-assigned one). It leaves a slot only by that worker's hand-back
//! ([`ColocatedDispatcher::hand_back`]): completed (gone), or preempted
//! (queued again by the policy's placement). A worker whose core is revoked
//! keeps its request until it hands it back — the runtime does that before
//! it gives the core up — so a revocation never loses a request nor lets
//! two workers run it.

use crate::Time;

use super::{Dispatcher, Request, SchedPolicy};

/// What the caller must do after a [`ColocatedDispatcher::step`].
#[derive(Clone, Debug, PartialEq)]
pub enum Action<T> {
    /// Run `request` on `worker` (which holds a core and ran nothing).
    Run { worker: usize, request: Request<T> },
    /// Pre-assign `request` to `worker` (which holds a core and runs a
    /// request): the worker starts it when it hands its request back
    /// completed, and drops it when it hands it back preempted.
    PreAssign { worker: usize, request: Request<T> },
    /// The request on `worker` has used its quantum while others wait: ask
    /// it to yield (once per run; it answers with a hand-back).
    Preempt { worker: usize, request_id: u64 },
    /// The request on `worker` was asked to yield the backstop's time ago
    /// and still runs (it reached no preemption point, or its worker lost
    /// the CPU before it read the ask): signal the worker (once per ask;
    /// [`ColocatedDispatcher::with_backstop`]).
    Signal { worker: usize, request_id: u64 },
}

/// How a worker's request gave the worker back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandBack {
    /// It finished: it leaves the system.
    Completed,
    /// It was preempted (its quantum was spent, or its worker's core was
    /// revoked): it is queued again.
    Preempted,
}

/// Why a hand-back was refused (the caller counts it: the worker lied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandBackError {
    #[error("worker {worker} does not exist")]
    NoSuchWorker { worker: usize },
    #[error("worker {worker} runs no request, but handed back request {request_id}")]
    NotRunning { worker: usize, request_id: u64 },
    #[error("worker {worker} runs request {running}, but handed back request {request_id}")]
    WrongRequest {
        worker: usize,
        running: u64,
        request_id: u64,
    },
}

/// What one worker slot holds.
#[derive(Clone, Debug)]
struct Slot {
    granted: bool,
    running: Option<Running>,
    /// The request pre-assigned behind `running` (see the module docs).
    next: Option<Running>,
    /// When it last became idle (granted, or its request gone), as a
    /// sequence number: the idle worker with the largest gets the next
    /// request.
    idle_seq: u64,
}

#[derive(Clone, Copy, Debug)]
struct Running {
    id: u64,
    class: usize,
    arrival: Time,
    /// When the worker started it (its quantum counts from here); `None`
    /// until the caller says so ([`ColocatedDispatcher::started`]).
    since: Option<Time>,
    /// When a preemption was asked for, if it was.
    asked: Option<Time>,
    /// The backstop signal has been sent for that ask.
    signalled: bool,
}

/// Counters of a [`ColocatedDispatcher`] (totals since it was made).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ColocatedStats {
    pub arrived: u64,
    pub completed: u64,
    /// Hand-backs of preempted requests (quantum or revocation).
    pub preempted: u64,
    pub preempt_asked: u64,
    /// Requests handed back by a worker whose core had been revoked.
    pub revoked_mid_request: u64,
    /// Backstop signals asked for ([`Action::Signal`]).
    pub backstops: u64,
    /// Requests pre-assigned ([`Action::PreAssign`]).
    pub pre_assigned: u64,
    /// Of those, taken back unrun ([`ColocatedDispatcher::take_back_next`]).
    pub pre_taken_back: u64,
}

/// The queues and worker slots of one application (see the module docs).
#[derive(Debug)]
pub struct ColocatedDispatcher<T> {
    queues: Dispatcher<T>,
    slots: Vec<Slot>,
    /// Free-running counts of requests put in / taken out of the queues:
    /// the queue's counters for congestion detection.
    pushed: u32,
    taken: u32,
    /// The last [`Slot::idle_seq`] given.
    idle_seq: u64,
    /// How long an asked request may keep running before its worker is
    /// signalled; `None`: never signalled.
    backstop: Option<Time>,
    /// Pre-assignment is on (and the policy preempts).
    pre_assign: bool,
    stats: ColocatedStats,
}

impl<T> ColocatedDispatcher<T> {
    /// `workers` worker kthreads, none holding a core yet.
    pub fn new(policy: SchedPolicy, workers: usize) -> Self {
        ColocatedDispatcher {
            queues: Dispatcher::new(policy),
            slots: vec![
                Slot {
                    granted: false,
                    running: None,
                    next: None,
                    idle_seq: 0,
                };
                workers
            ],
            pushed: 0,
            taken: 0,
            idle_seq: 0,
            backstop: None,
            pre_assign: false,
            stats: ColocatedStats::default(),
        }
    }

    /// Pre-assigns the next request to busy workers (see the module docs).
    /// Ignored for a policy that never preempts: a pre-assigned request
    /// would wait behind a long one for its whole service time, and no
    /// take-back rule could move it to a worker that becomes idle.
    pub fn with_pre_assign(mut self, on: bool) -> Self {
        self.pre_assign = on && self.queues.quantum().is_some();
        self
    }

    /// Whether pre-assignment is on.
    pub fn pre_assigns(&self) -> bool {
        self.pre_assign
    }

    /// The request pre-assigned to `worker`, if any.
    pub fn pre_assigned_on(&self, worker: usize) -> Option<u64> {
        self.slots.get(worker)?.next.map(|r| r.id)
    }

    /// A request asked to yield that still runs `backstop` later gets an
    /// [`Action::Signal`] (as the in-process dispatcher's
    /// `Preemption::Cooperative { backstop }`, docs/colocate.md).
    pub fn with_backstop(mut self, backstop: Option<Time>) -> Self {
        self.backstop = backstop;
        self
    }

    pub fn policy(&self) -> &SchedPolicy {
        self.queues.policy()
    }

    pub fn workers(&self) -> usize {
        self.slots.len()
    }

    pub fn stats(&self) -> ColocatedStats {
        self.stats
    }

    /// Requests waiting in the queues (new and preempted).
    pub fn queued(&self) -> usize {
        self.queues.len()
    }

    /// Requests on workers (running, or preempted and not yet handed back,
    /// or pre-assigned).
    pub fn on_workers(&self) -> usize {
        self.slots
            .iter()
            .map(|s| usize::from(s.running.is_some()) + usize::from(s.next.is_some()))
            .sum()
    }

    /// The request `worker` holds, if any.
    pub fn running_on(&self, worker: usize) -> Option<u64> {
        self.slots.get(worker)?.running.map(|r| r.id)
    }

    /// The queues as a free-running (taken, pushed) pair, like a queue
    /// line's head and tail: congestion detection sees a request that was
    /// queued at its previous pass and still is (`head` before the old
    /// `tail`), as for a runqueue.
    pub fn queue_counters(&self) -> (u32, u32) {
        (self.taken, self.pushed)
    }

    /// Whether `worker` holds a core (idle workers with one get requests).
    pub fn set_granted(&mut self, worker: usize, granted: bool) {
        if let Some(s) = self.slots.get_mut(worker) {
            if granted && !s.granted {
                self.idle_seq += 1;
                s.idle_seq = self.idle_seq;
            }
            s.granted = granted;
        }
    }

    /// `worker`'s slot has just become free: it is the freshest idle worker.
    fn freed(&mut self, worker: usize) {
        if let Some(s) = self.slots.get_mut(worker) {
            self.idle_seq += 1;
            s.idle_seq = self.idle_seq;
        }
    }

    /// The granted idle worker that became idle last, if any.
    fn freshest_idle(&self) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.granted && s.running.is_none())
            .max_by_key(|(_, s)| s.idle_seq)
            .map(|(w, _)| w)
    }

    /// Sets every worker's core (`false`: the application is going away).
    pub fn set_all_granted(&mut self, granted: bool) {
        for s in &mut self.slots {
            s.granted = granted;
        }
    }

    /// Takes a queued request out of the system without running it (the
    /// application is going away), in the order an idle worker would.
    pub fn take_queued(&mut self) -> Option<Request<T>> {
        let r = self.queues.next_for_idle_worker(Time::MAX)?;
        self.taken = self.taken.wrapping_add(1);
        Some(r)
    }

    pub fn is_granted(&self, worker: usize) -> bool {
        self.slots.get(worker).is_some_and(|s| s.granted)
    }

    /// A new request arrives. Its class must be one the policy has (check
    /// with [`ColocatedDispatcher::classes`] first).
    pub fn arrive(&mut self, request: Request<T>, now: Time) {
        self.stats.arrived += 1;
        self.pushed = self.pushed.wrapping_add(1);
        self.queues.enqueue(request, now);
    }

    /// Request classes the policy has (1 for single-queue policies).
    pub fn classes(&self) -> usize {
        match self.queues.policy() {
            SchedPolicy::CPreMq { classes, .. } => classes.len(),
            _ => 1,
        }
    }

    /// `worker` gave its request back. A preempted request is queued again
    /// with `payload` (what resumes it: the caller's token). A hand-back
    /// that does not match the worker's request is refused and changes
    /// nothing. A completed hand-back makes the request pre-assigned to the
    /// worker its running one; before a preempted one the caller takes that
    /// request back ([`ColocatedDispatcher::take_back_next`]).
    pub fn hand_back(
        &mut self,
        worker: usize,
        request_id: u64,
        how: HandBack,
        payload: T,
        now: Time,
    ) -> Result<(), HandBackError> {
        let slot = self
            .slots
            .get_mut(worker)
            .ok_or(HandBackError::NoSuchWorker { worker })?;
        let run = match slot.running {
            None => return Err(HandBackError::NotRunning { worker, request_id }),
            Some(r) if r.id != request_id => {
                return Err(HandBackError::WrongRequest {
                    worker,
                    running: r.id,
                    request_id,
                })
            }
            Some(r) => r,
        };
        slot.running = None;
        if !slot.granted && how == HandBack::Preempted {
            self.stats.revoked_mid_request += 1;
        }
        debug_assert!(
            how == HandBack::Completed || slot.next.is_none(),
            "a preempted hand-back with a request pre-assigned behind it"
        );
        // The worker starts its pre-assigned request at once.
        slot.running = slot.next.take();
        if slot.running.is_none() {
            self.freed(worker);
        }
        match how {
            HandBack::Completed => self.stats.completed += 1,
            HandBack::Preempted => {
                self.stats.preempted += 1;
                self.pushed = self.pushed.wrapping_add(1);
                self.queues.requeue_preempted(
                    Request {
                        id: run.id,
                        class: run.class,
                        arrival: run.arrival,
                        payload,
                    },
                    now,
                );
            }
        }
        Ok(())
    }

    /// The caller could not start the request of an [`Action::Run`] on
    /// `worker` (its command ring was full): it goes back to the head of
    /// its queue, and the worker is idle again.
    pub fn not_started(&mut self, worker: usize, request: Request<T>) {
        if let Some(slot) = self.slots.get_mut(worker) {
            if slot.next.is_some_and(|r| r.id == request.id) {
                slot.next = None;
                self.stats.pre_taken_back += 1;
            } else {
                if slot.running.is_some_and(|r| r.id == request.id) {
                    slot.running = None;
                }
                self.freed(worker);
            }
        }
        self.taken = self.taken.wrapping_sub(1);
        self.queues.put_back(request);
    }

    /// The request pre-assigned to `worker` goes back to the head of its
    /// queue with `payload`, as if never taken: the worker's request is
    /// being handed back preempted (the worker drops the pre-assigned one
    /// then), or the worker gave its core up. Take it back before the
    /// preempted request is queued again, and before the worker's running
    /// one is withdrawn, so each lands where it would have without
    /// pre-assignment. Its id, if there was one.
    pub fn take_back_next(&mut self, worker: usize, payload: T) -> Option<u64> {
        let run = self.slots.get_mut(worker)?.next.take()?;
        self.stats.pre_taken_back += 1;
        self.taken = self.taken.wrapping_sub(1);
        self.queues.put_back(Request {
            id: run.id,
            class: run.class,
            arrival: run.arrival,
            payload,
        });
        Some(run.id)
    }

    /// `worker` never saw the request it was given (the caller's command
    /// crossed the worker giving its core up): the request goes back to
    /// the head of its queue with `payload`, as if never taken. Its id, if
    /// the worker had one.
    pub fn withdraw(&mut self, worker: usize, payload: T) -> Option<u64> {
        let run = self.slots.get_mut(worker)?.running.take()?;
        self.not_started(
            worker,
            Request {
                id: run.id,
                class: run.class,
                arrival: run.arrival,
                payload,
            },
        );
        Some(run.id)
    }

    /// One dispatch step at `now`: asks for the preemption of requests
    /// whose quantum is spent while others wait, then gives the queued
    /// requests to idle workers that hold a core. Actions are appended.
    pub fn step(&mut self, now: Time, out: &mut Vec<Action<T>>) {
        for (w, slot) in self.slots.iter_mut().enumerate() {
            let Some(run) = &mut slot.running else {
                continue;
            };
            let Some(since) = run.since else { continue };
            // A pre-assigned request waits behind this one as if queued.
            let spent = |q: Time| now.saturating_sub(since) >= q;
            let behind = slot.next.is_some() && self.queues.quantum().is_some_and(spent);
            match run.asked {
                None if behind || self.queues.should_preempt(since, now) => {
                    run.asked = Some(now);
                    self.stats.preempt_asked += 1;
                    out.push(Action::Preempt {
                        worker: w,
                        request_id: run.id,
                    });
                }
                Some(at)
                    if !run.signalled
                        && self.backstop.is_some_and(|b| now.saturating_sub(at) >= b) =>
                {
                    run.signalled = true;
                    self.stats.backstops += 1;
                    out.push(Action::Signal {
                        worker: w,
                        request_id: run.id,
                    });
                }
                _ => {}
            }
        }
        // The freshest idle worker first (see the module docs).
        while let Some(w) = self.freshest_idle() {
            let Some(request) = self.queues.next_for_idle_worker(now) else {
                break;
            };
            self.taken = self.taken.wrapping_add(1);
            self.slots[w].running = Some(Running {
                id: request.id,
                class: request.class,
                arrival: request.arrival,
                since: None,
                asked: None,
                signalled: false,
            });
            out.push(Action::Run { worker: w, request });
        }
        if !self.pre_assign || self.queues.is_empty() {
            return;
        }
        // No granted worker is idle now: pre-assign behind busy ones whose
        // request is not being asked to yield (that hand-back would take
        // it back at once).
        for (w, slot) in self.slots.iter_mut().enumerate() {
            let busy = slot.running.is_some_and(|r| r.asked.is_none());
            if !slot.granted || !busy || slot.next.is_some() {
                continue;
            }
            let Some(request) = self.queues.next_for_idle_worker(now) else {
                break;
            };
            self.taken = self.taken.wrapping_add(1);
            self.stats.pre_assigned += 1;
            slot.next = Some(Running {
                id: request.id,
                class: request.class,
                arrival: request.arrival,
                since: None,
                asked: None,
                signalled: false,
            });
            out.push(Action::PreAssign { worker: w, request });
        }
    }

    /// `worker` has switched into the request it was given (at `now`):
    /// its quantum counts from here, so a worker slow to pick a request up
    /// does not see it preempted before it ran (docs/colocate.md).
    pub fn started(&mut self, worker: usize, now: Time) {
        if let Some(Some(r)) = self.slots.get_mut(worker).map(|s| &mut s.running) {
            r.since.get_or_insert(now);
        }
    }

    /// Whether `worker`'s request has started (see [`Self::started`]).
    pub fn has_started(&self, worker: usize) -> bool {
        self.slots
            .get(worker)
            .and_then(|s| s.running)
            .is_some_and(|r| r.since.is_some())
    }

    /// When `worker`'s request will have used its quantum, if it runs one
    /// that has started and the policy preempts (the simulator's next event).
    pub fn quantum_ends(&self, worker: usize) -> Option<Time> {
        let q = self.queues.quantum()?;
        let r = self.slots.get(worker)?.running?;
        r.asked.is_none().then_some(r.since?.saturating_add(q))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::super::{ClassConfig, Placement};
    use super::*;
    use crate::rng::SplitMix64;

    fn req(id: u64, class: usize, arrival: Time) -> Request<u64> {
        Request {
            id,
            class,
            arrival,
            payload: 0,
        }
    }

    fn sq(quantum: Time, placement: Placement) -> SchedPolicy {
        SchedPolicy::CPreSq { quantum, placement }
    }

    fn runs(out: &[Action<u64>]) -> Vec<(usize, u64)> {
        out.iter()
            .filter_map(|a| match a {
                Action::Run { worker, request } => Some((*worker, request.id)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn only_granted_workers_get_requests() {
        let mut d = ColocatedDispatcher::new(SchedPolicy::CFcfs, 3);
        d.arrive(req(1, 0, 0), 0);
        d.arrive(req(2, 0, 0), 0);
        let mut out = Vec::new();
        d.step(1, &mut out);
        assert!(out.is_empty(), "no worker holds a core");
        assert_eq!(d.queue_counters(), (0, 2));
        d.set_granted(2, true);
        d.step(2, &mut out);
        assert_eq!(runs(&out), [(2, 1)]);
        assert_eq!(d.queued(), 1);
        assert_eq!(d.queue_counters(), (1, 2));
    }

    /// Of several idle workers, the one that became idle last gets the
    /// next request: the one idle longest is the closest to parking, and
    /// a `Run` sent as it parks waits for another grant (docs/colocate.md,
    /// "Several workers").
    #[test]
    fn the_freshest_idle_worker_gets_the_next_request() {
        let mut d = ColocatedDispatcher::new(SchedPolicy::CFcfs, 3);
        for w in 0..3 {
            d.set_granted(w, true);
        }
        let mut out = Vec::new();
        d.arrive(req(1, 0, 0), 0);
        d.step(0, &mut out);
        assert_eq!(runs(&out), [(2, 1)], "granted last");
        d.arrive(req(2, 0, 1), 1);
        d.arrive(req(3, 0, 1), 1);
        out.clear();
        d.step(1, &mut out);
        assert_eq!(runs(&out), [(1, 2), (0, 3)]);
        // Worker 0 finishes, then worker 2: worker 2 is the freshest.
        d.hand_back(0, 3, HandBack::Completed, 0, 2).unwrap();
        d.hand_back(2, 1, HandBack::Completed, 0, 3).unwrap();
        d.arrive(req(4, 0, 4), 4);
        out.clear();
        d.step(4, &mut out);
        assert_eq!(runs(&out), [(2, 4)]);
        // Regranted after losing its core: freshest again.
        d.set_granted(0, false);
        d.set_granted(0, true);
        d.arrive(req(5, 0, 5), 5);
        out.clear();
        d.step(5, &mut out);
        assert_eq!(runs(&out), [(0, 5)]);
    }

    #[test]
    fn a_revoked_worker_hands_its_request_back_and_another_resumes_it() {
        let mut d = ColocatedDispatcher::new(sq(5, Placement::Head), 2);
        d.set_granted(0, true);
        d.arrive(req(7, 0, 0), 0);
        let mut out = Vec::new();
        d.step(0, &mut out);
        assert_eq!(runs(&out), [(0, 7)]);
        // Core revoked mid-request: the request stays the worker's until
        // it is handed back; nobody else may run it meanwhile.
        d.set_granted(0, false);
        d.set_granted(1, true);
        out.clear();
        d.step(1, &mut out);
        assert!(runs(&out).is_empty());
        assert_eq!(d.running_on(0), Some(7));
        d.hand_back(0, 7, HandBack::Preempted, 99, 2).unwrap();
        assert_eq!(d.stats().revoked_mid_request, 1);
        d.step(3, &mut out);
        let resumed = out
            .iter()
            .find_map(|a| match a {
                Action::Run { worker: 1, request } => Some(request.clone()),
                _ => None,
            })
            .expect("worker 1 resumes the request");
        assert_eq!((resumed.id, resumed.payload, resumed.arrival), (7, 99, 0));
    }

    #[test]
    fn lying_hand_backs_are_refused_and_change_nothing() {
        let mut d = ColocatedDispatcher::new(sq(5, Placement::Tail), 2);
        d.set_granted(0, true);
        d.arrive(req(1, 0, 0), 0);
        let mut out = Vec::new();
        d.step(0, &mut out);
        assert_eq!(
            d.hand_back(1, 1, HandBack::Completed, 0, 1),
            Err(HandBackError::NotRunning {
                worker: 1,
                request_id: 1
            })
        );
        assert_eq!(
            d.hand_back(0, 2, HandBack::Completed, 0, 1),
            Err(HandBackError::WrongRequest {
                worker: 0,
                running: 1,
                request_id: 2
            })
        );
        assert_eq!(
            d.hand_back(5, 1, HandBack::Completed, 0, 1),
            Err(HandBackError::NoSuchWorker { worker: 5 })
        );
        assert_eq!(d.running_on(0), Some(1));
        d.hand_back(0, 1, HandBack::Completed, 0, 1).unwrap();
        // A duplicate of a good hand-back is a lie too.
        assert!(d.hand_back(0, 1, HandBack::Completed, 0, 1).is_err());
        assert_eq!(d.stats().completed, 1);
    }

    #[test]
    fn preemption_is_asked_once_after_the_quantum_and_only_with_waiters() {
        let mut d = ColocatedDispatcher::new(sq(10, Placement::Tail), 1);
        d.set_granted(0, true);
        d.arrive(req(1, 0, 0), 0);
        let mut out = Vec::new();
        d.step(0, &mut out);
        out.clear();
        d.arrive(req(2, 0, 1), 1);
        d.step(30, &mut out);
        assert!(out.is_empty(), "not started yet: no quantum runs");
        d.started(0, 40);
        d.step(45, &mut out);
        assert!(out.is_empty(), "quantum not spent");
        d.step(55, &mut out);
        assert_eq!(
            out,
            [Action::Preempt {
                worker: 0,
                request_id: 1
            }]
        );
        out.clear();
        d.step(60, &mut out);
        assert!(out.is_empty(), "asked once");
        // Tail placement: the waiting request runs before the preempted one.
        d.hand_back(0, 1, HandBack::Preempted, 0, 61).unwrap();
        d.step(61, &mut out);
        assert_eq!(runs(&out), [(0, 2)]);
    }

    #[test]
    fn the_backstop_signals_once_an_ask_unanswered_for_its_time() {
        let mut d = ColocatedDispatcher::new(sq(10, Placement::Tail), 2).with_backstop(Some(50));
        d.set_granted(0, true);
        d.arrive(req(1, 0, 0), 0);
        let mut out = Vec::new();
        d.step(0, &mut out);
        d.started(0, 0);
        d.arrive(req(2, 0, 1), 1);
        out.clear();
        d.step(10, &mut out);
        assert_eq!(
            out,
            [Action::Preempt {
                worker: 0,
                request_id: 1
            }]
        );
        out.clear();
        d.step(59, &mut out);
        assert!(out.is_empty(), "the backstop's time has not passed");
        d.step(60, &mut out);
        assert_eq!(
            out,
            [Action::Signal {
                worker: 0,
                request_id: 1
            }]
        );
        out.clear();
        d.step(1_000, &mut out);
        assert!(out.is_empty(), "signalled once per ask");
        assert_eq!(d.stats().backstops, 1);
        // Answered: the next run of the request is asked (and signalled) anew.
        d.hand_back(0, 1, HandBack::Preempted, 0, 1_001).unwrap();
        d.step(1_001, &mut out);
        assert_eq!(runs(&out), [(0, 2)]);
        // Without a backstop, never a signal.
        let mut d = ColocatedDispatcher::new(sq(10, Placement::Tail), 1);
        d.set_granted(0, true);
        d.arrive(req(1, 0, 0), 0);
        d.arrive(req(2, 0, 0), 0);
        out.clear();
        d.step(0, &mut out);
        d.started(0, 0);
        d.step(10, &mut out);
        d.step(1_000_000, &mut out);
        assert!(!out.iter().any(|a| matches!(a, Action::Signal { .. })));
    }

    #[test]
    fn a_withdrawn_request_goes_back_to_the_head_uncounted() {
        let mut d = ColocatedDispatcher::new(sq(5, Placement::Tail), 2);
        d.set_granted(0, true);
        d.arrive(req(1, 0, 0), 0);
        d.arrive(req(2, 0, 0), 0);
        let mut out = Vec::new();
        d.step(0, &mut out);
        assert_eq!(d.queue_counters(), (1, 2));
        d.set_granted(0, false);
        assert_eq!(d.withdraw(0, 42), Some(1));
        assert_eq!(d.withdraw(0, 42), None);
        assert_eq!(d.queue_counters(), (0, 2));
        assert_eq!(d.stats().preempted, 0);
        d.set_granted(1, true);
        out.clear();
        d.step(1, &mut out);
        assert_eq!(runs(&out), [(1, 1)]);
        assert!(matches!(&out[0], Action::Run { request, .. } if request.payload == 42));
    }

    #[test]
    fn cfcfs_never_asks_for_a_preemption() {
        let mut d = ColocatedDispatcher::new(SchedPolicy::CFcfs, 1);
        d.set_granted(0, true);
        for i in 0..3 {
            d.arrive(req(i, 0, 0), 0);
        }
        let mut out = Vec::new();
        d.step(0, &mut out);
        d.step(1_000_000, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(d.quantum_ends(0), None);
    }

    /// Crafted arrivals: a long request, then short ones, one worker, head
    /// placement vs tail placement (Shinjuku §3.4).
    #[test]
    fn order_on_crafted_arrivals() {
        for (placement, expect) in [
            (Placement::Tail, vec![1, 2, 3, 1]),
            (Placement::Head, vec![1, 1, 2, 3]),
        ] {
            let mut d = ColocatedDispatcher::new(sq(10, placement), 1);
            d.set_granted(0, true);
            let mut order = Vec::new();
            let mut out = Vec::new();
            d.arrive(req(1, 0, 0), 0);
            d.step(0, &mut out);
            d.arrive(req(2, 0, 3), 3);
            d.arrive(req(3, 0, 4), 4);
            d.step(10, &mut out);
            // Request 1 is preempted at its quantum.
            d.hand_back(0, 1, HandBack::Preempted, 0, 11).unwrap();
            d.step(11, &mut out);
            for a in &out {
                if let Action::Run { request, .. } = a {
                    order.push(request.id);
                }
            }
            out.clear();
            // Everything else runs to completion in the order given.
            while let Some(id) = d.running_on(0) {
                d.hand_back(0, id, HandBack::Completed, 0, 12).unwrap();
                d.step(12, &mut out);
                for a in out.drain(..) {
                    if let Action::Run { request, .. } = a {
                        order.push(request.id);
                    }
                }
            }
            assert_eq!(order, expect, "{placement:?}");
        }
    }

    #[test]
    fn mq_serves_the_class_furthest_past_its_slo_first() {
        let classes = vec![
            ClassConfig {
                slo: 10,
                placement: Placement::Tail,
            },
            ClassConfig {
                slo: 1000,
                placement: Placement::Tail,
            },
        ];
        let mut d = ColocatedDispatcher::new(
            SchedPolicy::CPreMq {
                quantum: 5,
                classes,
            },
            1,
        );
        d.arrive(req(1, 1, 0), 0);
        d.arrive(req(2, 0, 90), 90);
        d.set_granted(0, true);
        let mut out = Vec::new();
        d.step(100, &mut out);
        assert_eq!(runs(&out), [(0, 2)]);
    }

    /// Drives the dispatcher as iokerneld does while an allocator grants
    /// and revokes cores at random and workers finish or get preempted at
    /// random; every request completes exactly once, and a worker only
    /// ever runs what it was given.
    fn churn(requests: u64, workers: usize, guaranteed: usize, seed: u64, pre_assign: bool) {
        let mut rng = SplitMix64::new(seed);
        let mut d: ColocatedDispatcher<u64> =
            ColocatedDispatcher::new(sq(3, Placement::Tail), workers)
                .with_backstop(Some(2))
                .with_pre_assign(pre_assign);
        // What each request's context last said (the caller's token).
        let mut token: HashMap<u64, u64> = HashMap::new();
        let mut done = vec![0u8; requests as usize];
        let mut given: Vec<Option<u64>> = vec![None; workers];
        // Pre-assigned, with the token it came with.
        let mut behind: Vec<Option<(u64, u64)>> = vec![None; workers];
        for w in 0..guaranteed {
            d.set_granted(w, true);
        }
        let (mut next, mut now) = (0u64, 0u64);
        let mut out = Vec::new();
        while d.stats().completed < requests {
            now += 1;
            for _ in 0..rng.next_u64() % 3 {
                if next < requests {
                    d.arrive(req(next, 0, now), now);
                    next += 1;
                }
            }
            // The allocator: bursting workers come and go; guaranteed ones stay.
            let w = (rng.next_u64() % workers as u64) as usize;
            if w >= guaranteed && rng.next_u64().is_multiple_of(4) {
                d.set_granted(w, !d.is_granted(w));
            }
            for w in 0..guaranteed {
                assert!(d.is_granted(w), "guaranteed worker {w} lost its core");
            }
            out.clear();
            d.step(now, &mut out);
            for a in out.drain(..) {
                match a {
                    Action::Run { worker, request } => {
                        assert!(d.is_granted(worker), "ran on a worker with no core");
                        assert!(given[worker].is_none(), "worker {worker} given two");
                        assert_eq!(
                            token.get(&request.id).copied().unwrap_or(0),
                            request.payload
                        );
                        given[worker] = Some(request.id);
                        d.started(worker, now);
                    }
                    Action::PreAssign { worker, request } => {
                        assert!(
                            d.is_granted(worker),
                            "pre-assigned to a worker with no core"
                        );
                        assert!(given[worker].is_some(), "pre-assigned to an idle worker");
                        assert!(behind[worker].is_none(), "worker {worker} pre-assigned two");
                        assert_eq!(
                            token.get(&request.id).copied().unwrap_or(0),
                            request.payload
                        );
                        behind[worker] = Some((request.id, request.payload));
                    }
                    Action::Preempt { worker, request_id }
                    | Action::Signal { worker, request_id } => {
                        assert_eq!(given[worker], Some(request_id));
                    }
                }
            }
            // Workers: finish, yield (asked, or revoked), or keep running.
            for (w, g) in given.iter_mut().enumerate() {
                let Some(id) = *g else { continue };
                let roll = rng.next_u64() % 8;
                let how = if roll == 0 {
                    HandBack::Completed
                } else if roll < 3 || !d.is_granted(w) {
                    HandBack::Preempted
                } else {
                    continue;
                };
                let t = rng.next_u64();
                if how == HandBack::Preempted {
                    // The worker drops its pre-assigned request.
                    if let Some((next, was)) = behind[w].take() {
                        assert_eq!(d.take_back_next(w, was), Some(next));
                    }
                }
                d.hand_back(w, id, how, t, now).unwrap();
                if how == HandBack::Completed {
                    done[id as usize] += 1;
                } else {
                    token.insert(id, t);
                }
                // The worker starts its pre-assigned request at once, if
                // it still holds a core; else it gives the core up and the
                // request goes back.
                *g = None;
                if let Some((next, was)) = behind[w].take() {
                    if d.is_granted(w) {
                        assert_eq!(d.running_on(w), Some(next));
                        d.started(w, now);
                        *g = Some(next);
                    } else {
                        assert_eq!(d.withdraw(w, was), Some(next));
                    }
                }
            }
            assert_eq!(
                d.queued() + d.on_workers() + d.stats().completed as usize,
                next as usize,
                "every arrived request is queued, on a worker, or done"
            );
        }
        assert!(
            done.iter().all(|&n| n == 1),
            "each request done exactly once"
        );
        assert!(d.stats().revoked_mid_request > 0 || workers == guaranteed);
    }

    #[test]
    fn no_request_lost_or_run_twice_under_core_churn() {
        churn(20_000, 4, 1, 1, false);
        churn(20_000, 4, 1, 1, true);
    }

    /// A million requests (about 8 s in a debug build).
    #[test]
    fn a_million_requests_under_core_churn() {
        churn(1_000_000, 4, 1, 7, false);
        churn(1_000_000, 4, 1, 7, true);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn churn_holds_for_any_seed(
            seed in any::<u64>(),
            workers in 1usize..6,
            g in 0usize..3,
            pre_assign in any::<bool>(),
        ) {
            churn(2_000, workers, g.min(workers), seed, pre_assign);
        }
    }

    fn pre_assigned(out: &[Action<u64>]) -> Vec<(usize, u64)> {
        out.iter()
            .filter_map(|a| match a {
                Action::PreAssign { worker, request } => Some((*worker, request.id)),
                _ => None,
            })
            .collect()
    }

    /// A busy worker gets the next request in its second slot while
    /// requests wait and no worker is idle; it becomes the worker's
    /// running request when the worker hands its own back completed.
    #[test]
    fn a_pre_assigned_request_runs_when_the_worker_completes_its_own() {
        let mut d = ColocatedDispatcher::new(sq(5, Placement::Tail), 2).with_pre_assign(true);
        d.set_granted(0, true);
        for id in 1..=4 {
            d.arrive(req(id, 0, 0), 0);
        }
        let mut out = Vec::new();
        d.step(0, &mut out);
        assert_eq!(runs(&out), [(0, 1)]);
        assert_eq!(pre_assigned(&out), [(0, 2)]);
        assert_eq!(d.on_workers(), 2);
        assert_eq!(d.queue_counters(), (2, 4));
        d.started(0, 1);
        d.hand_back(0, 1, HandBack::Completed, 0, 2).unwrap();
        assert_eq!(d.running_on(0), Some(2));
        assert_eq!(d.pre_assigned_on(0), None);
        // A newly granted idle worker gets the queue's head before anyone
        // is pre-assigned again.
        d.set_granted(1, true);
        out.clear();
        d.step(3, &mut out);
        assert_eq!(runs(&out), [(1, 3)]);
        assert_eq!(pre_assigned(&out), [(0, 4)]);
        assert_eq!(d.stats().pre_assigned, 2);
    }

    /// A preempted hand-back takes the pre-assigned request back to the
    /// head of its queue before the preempted one is placed, so the policy
    /// chooses as without pre-assignment: head placement resumes the
    /// preempted request first, tail placement runs the other one.
    #[test]
    fn a_preempted_hand_back_takes_the_pre_assigned_request_back() {
        for (placement, order) in [(Placement::Head, [1, 2]), (Placement::Tail, [2, 1])] {
            let mut d = ColocatedDispatcher::new(sq(5, placement), 1).with_pre_assign(true);
            d.set_granted(0, true);
            d.arrive(req(1, 0, 0), 0);
            d.arrive(req(2, 0, 0), 0);
            let mut out = Vec::new();
            d.step(0, &mut out);
            assert_eq!(pre_assigned(&out), [(0, 2)]);
            d.started(0, 0);
            // The queue is empty, but request 2 waits behind request 1.
            out.clear();
            d.step(5, &mut out);
            assert!(matches!(
                out[..],
                [Action::Preempt {
                    worker: 0,
                    request_id: 1
                }]
            ));
            assert_eq!(d.take_back_next(0, 0), Some(2));
            d.hand_back(0, 1, HandBack::Preempted, 0, 6).unwrap();
            assert_eq!(d.stats().pre_taken_back, 1);
            out.clear();
            d.step(6, &mut out);
            assert_eq!(runs(&out), [(0, order[0])]);
            assert_eq!(pre_assigned(&out), [(0, order[1])]);
        }
    }

    /// Nothing is pre-assigned behind a request asked to yield, and a
    /// policy that never preempts never pre-assigns.
    #[test]
    fn no_pre_assignment_behind_an_ask_nor_without_preemption() {
        let mut d = ColocatedDispatcher::new(sq(5, Placement::Tail), 1).with_pre_assign(true);
        d.set_granted(0, true);
        d.arrive(req(1, 0, 0), 0);
        let mut out = Vec::new();
        d.step(0, &mut out);
        d.started(0, 0);
        d.arrive(req(2, 0, 1), 1);
        out.clear();
        d.step(5, &mut out);
        assert!(matches!(
            out[..],
            [Action::Preempt {
                worker: 0,
                request_id: 1
            }]
        ));
        assert!(pre_assigned(&out).is_empty());
        let mut f = ColocatedDispatcher::new(SchedPolicy::CFcfs, 1).with_pre_assign(true);
        assert!(!f.pre_assigns());
        f.set_granted(0, true);
        f.arrive(req(1, 0, 0), 0);
        f.arrive(req(2, 0, 0), 0);
        out.clear();
        f.step(0, &mut out);
        assert_eq!(runs(&out), [(0, 1)]);
        assert!(pre_assigned(&out).is_empty());
    }
}
