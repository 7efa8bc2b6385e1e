//! Request scheduling inside an application (Shinjuku): c-FCFS, c-PRE-SQ and
//! c-PRE-MQ as one queue-owning dispatcher object.
//!
//! The dispatcher owns the pending requests; the caller (the Shinjuku-mode
//! runtime, or the simulator) owns the workers and asks: which request should
//! an idle worker run, should a running one be preempted, where does a
//! preempted one go.

use std::collections::VecDeque;

use crate::Time;

pub mod colocated;

/// Where a preempted request goes back into its queue. Shinjuku §3.4: the
/// tail approximates processor sharing, the head approximates c-FCFS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Head,
    Tail,
}

/// The request-scheduling policy of a dispatcher.
#[derive(Clone, Debug, PartialEq)]
pub enum SchedPolicy {
    /// Centralized FCFS, run to completion (never preempts).
    CFcfs,
    /// Shinjuku single queue: preempt after `quantum` if anything waits.
    CPreSq { quantum: Time, placement: Placement },
    /// Shinjuku multi-queue: one queue per request class, each with its own
    /// SLO (same time unit) and placement; idle workers take the head of the
    /// queue whose head has waited longest relative to its SLO.
    CPreMq {
        quantum: Time,
        classes: Vec<ClassConfig>,
    },
}

/// Per-class settings of c-PRE-MQ.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassConfig {
    /// Target latency (e.g. p99) of this class; must be > 0.
    pub slo: Time,
    pub placement: Placement,
}

/// A request as the dispatcher sees it; `payload` is the caller's (a uthread
/// handle in the runtime, remaining work in the simulator).
#[derive(Clone, Debug, PartialEq)]
pub struct Request<T> {
    pub id: u64,
    /// Class index (queue for c-PRE-MQ; ignored by single-queue policies
    /// except that it must be < 1 there too if you rely on `len_class`).
    pub class: usize,
    /// When the request entered the system; c-PRE-MQ's queueing-time ratio
    /// is measured from here, preemptions do not reset it.
    pub arrival: Time,
    pub payload: T,
}

/// The dispatcher: pending requests plus the policy that orders them.
#[derive(Debug)]
pub struct Dispatcher<T> {
    policy: SchedPolicy,
    queues: Vec<VecDeque<Request<T>>>,
    pending: usize,
}

impl<T> Dispatcher<T> {
    pub fn new(policy: SchedPolicy) -> Self {
        let nq = match &policy {
            SchedPolicy::CPreMq { classes, .. } => {
                assert!(!classes.is_empty(), "c-PRE-MQ needs at least one class");
                assert!(classes.iter().all(|c| c.slo > 0), "SLOs must be > 0");
                classes.len()
            }
            _ => 1,
        };
        Self {
            policy,
            queues: (0..nq).map(|_| VecDeque::new()).collect(),
            pending: 0,
        }
    }

    pub fn policy(&self) -> &SchedPolicy {
        &self.policy
    }

    /// The preemption quantum, `None` for run-to-completion policies.
    pub fn quantum(&self) -> Option<Time> {
        match self.policy {
            SchedPolicy::CFcfs => None,
            SchedPolicy::CPreSq { quantum, .. } | SchedPolicy::CPreMq { quantum, .. } => {
                Some(quantum)
            }
        }
    }

    pub fn len(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    fn queue_of(&self, class: usize) -> usize {
        if self.queues.len() == 1 {
            0
        } else {
            assert!(
                class < self.queues.len(),
                "request class {class} has no queue"
            );
            class
        }
    }

    /// A new request arrives (at the tail of its queue).
    pub fn enqueue(&mut self, req: Request<T>, _now: Time) {
        let q = self.queue_of(req.class);
        self.queues[q].push_back(req);
        self.pending += 1;
    }

    /// Puts back, at the head of its queue, a request just taken by
    /// [`Dispatcher::next_for_idle_worker`] that could not be started.
    pub fn put_back(&mut self, req: Request<T>) {
        let q = self.queue_of(req.class);
        self.queues[q].push_front(req);
        self.pending += 1;
    }

    /// The request an idle worker should run now, if any.
    pub fn next_for_idle_worker(&mut self, now: Time) -> Option<Request<T>> {
        let q = self.select_queue(now)?;
        self.pending -= 1;
        self.queues[q].pop_front()
    }

    /// The request an idle worker would get once a running request of
    /// `class` that arrived at `arrival` is preempted and requeued
    /// ([`Dispatcher::requeue_preempted`]), taken now — if that choice does
    /// not depend on the preempted request. Then the caller can start it
    /// behind the preempted one without waiting for the preempted one to be
    /// handed back (docs/runtime.md, "Shinjuku mode", pre-assignment): the
    /// order is the same as if it had waited.
    ///
    /// `None` when nothing waits, under c-FCFS (never preempts), and where
    /// the preempted request would be the choice itself or change it: head
    /// placement (it goes back in front), or under c-PRE-MQ a tail-placed
    /// request whose queue is empty and whose ratio would beat every other
    /// queue's head.
    pub fn next_behind_preempted(
        &mut self,
        class: usize,
        arrival: Time,
        now: Time,
    ) -> Option<Request<T>> {
        if self.pending == 0 {
            return None;
        }
        let q = self.queue_of(class);
        let independent = match &self.policy {
            SchedPolicy::CFcfs => false,
            SchedPolicy::CPreSq { placement, .. } => *placement == Placement::Tail,
            SchedPolicy::CPreMq { classes, .. } => {
                classes[q].placement == Placement::Tail
                    && (!self.queues[q].is_empty()
                        || self.select_queue_with(now, Some((q, arrival))) != Some(q))
            }
        };
        if independent {
            self.next_for_idle_worker(now)
        } else {
            None
        }
    }

    /// Shinjuku's queue selection: the non-empty queue whose head has the
    /// largest (now − arrival) / SLO. Ties go to the lower class index.
    fn select_queue(&self, now: Time) -> Option<usize> {
        self.select_queue_with(now, None)
    }

    /// [`Dispatcher::select_queue`], as if queue `extra.0`, empty, had a
    /// head that arrived at `extra.1`.
    fn select_queue_with(&self, now: Time, extra: Option<(usize, Time)>) -> Option<usize> {
        match &self.policy {
            SchedPolicy::CPreMq { classes, .. } => {
                let mut best: Option<(usize, f64)> = None;
                for (i, q) in self.queues.iter().enumerate() {
                    let head = q
                        .front()
                        .map(|h| h.arrival)
                        .or_else(|| extra.filter(|&(e, _)| e == i).map(|(_, a)| a));
                    if let Some(arrival) = head {
                        let ratio = now.saturating_sub(arrival) as f64 / classes[i].slo as f64;
                        if best.is_none_or(|(_, b)| ratio > b) {
                            best = Some((i, ratio));
                        }
                    }
                }
                best.map(|(i, _)| i)
            }
            _ => (!self.queues[0].is_empty()).then_some(0),
        }
    }

    /// Whether a worker that has run its current request since
    /// `running_since` should be preempted now: the quantum is spent and
    /// something else waits.
    pub fn should_preempt(&self, running_since: Time, now: Time) -> bool {
        match self.quantum() {
            Some(q) => self.pending > 0 && now.saturating_sub(running_since) >= q,
            None => false,
        }
    }

    /// Puts a preempted request back, at the head or the tail of its queue
    /// according to the policy.
    pub fn requeue_preempted(&mut self, req: Request<T>, _now: Time) {
        let q = self.queue_of(req.class);
        let placement = match &self.policy {
            SchedPolicy::CFcfs => Placement::Head,
            SchedPolicy::CPreSq { placement, .. } => *placement,
            SchedPolicy::CPreMq { classes, .. } => classes[q].placement,
        };
        match placement {
            Placement::Head => self.queues[q].push_front(req),
            Placement::Tail => self.queues[q].push_back(req),
        }
        self.pending += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u64, class: usize, arrival: Time) -> Request<()> {
        Request {
            id,
            class,
            arrival,
            payload: (),
        }
    }

    #[test]
    fn cfcfs_is_fifo_and_never_preempts() {
        let mut d = Dispatcher::new(SchedPolicy::CFcfs);
        d.enqueue(req(1, 0, 0), 0);
        d.enqueue(req(2, 0, 1), 1);
        assert!(!d.should_preempt(0, 1_000_000));
        assert_eq!(d.next_for_idle_worker(5).unwrap().id, 1);
        assert_eq!(d.next_for_idle_worker(5).unwrap().id, 2);
        assert!(d.next_for_idle_worker(5).is_none());
    }

    #[test]
    fn sq_preempts_only_after_quantum_with_waiters() {
        let mut d = Dispatcher::new(SchedPolicy::CPreSq {
            quantum: 10,
            placement: Placement::Tail,
        });
        assert!(!d.should_preempt(0, 100), "empty queue: keep running");
        d.enqueue(req(1, 0, 0), 0);
        assert!(!d.should_preempt(0, 9));
        assert!(d.should_preempt(0, 10));
    }

    #[test]
    fn sq_tail_and_head_placement() {
        let mut d = Dispatcher::new(SchedPolicy::CPreSq {
            quantum: 10,
            placement: Placement::Tail,
        });
        d.enqueue(req(1, 0, 0), 0);
        d.requeue_preempted(req(9, 0, 0), 5);
        assert_eq!(d.next_for_idle_worker(5).unwrap().id, 1);
        let mut d = Dispatcher::new(SchedPolicy::CPreSq {
            quantum: 10,
            placement: Placement::Head,
        });
        d.enqueue(req(1, 0, 0), 0);
        d.requeue_preempted(req(9, 0, 0), 5);
        assert_eq!(d.next_for_idle_worker(5).unwrap().id, 9);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn mq_picks_largest_wait_to_slo_ratio() {
        let classes = vec![
            ClassConfig {
                slo: 10,
                placement: Placement::Head,
            },
            ClassConfig {
                slo: 1000,
                placement: Placement::Head,
            },
        ];
        let mut d = Dispatcher::new(SchedPolicy::CPreMq {
            quantum: 5,
            classes,
        });
        d.enqueue(req(1, 1, 0), 0); // long class, waited 100 → ratio 0.1
        d.enqueue(req(2, 0, 95), 95); // short class, waited 5 → ratio 0.5
        assert_eq!(d.next_for_idle_worker(100).unwrap().id, 2);
        d.enqueue(req(3, 0, 99), 99); // ratio at 2000: 190.1 vs long 2.0
        assert_eq!(d.next_for_idle_worker(2000).unwrap().id, 3);
        // Only the long class left: it is served whatever its ratio.
        assert_eq!(d.next_for_idle_worker(2000).unwrap().id, 1);
        assert!(d.is_empty());
    }

    #[test]
    fn mq_aging_eventually_serves_long_class() {
        let classes = vec![
            ClassConfig {
                slo: 10,
                placement: Placement::Tail,
            },
            ClassConfig {
                slo: 100,
                placement: Placement::Tail,
            },
        ];
        let mut d = Dispatcher::new(SchedPolicy::CPreMq {
            quantum: 5,
            classes,
        });
        d.enqueue(req(1, 1, 0), 0); // waited 1000 at t=1000 → ratio 10
        d.enqueue(req(2, 0, 950), 950); // waited 50 → ratio 5
        assert_eq!(d.next_for_idle_worker(1000).unwrap().id, 1);
    }

    #[test]
    fn mq_per_class_placement() {
        let classes = vec![
            ClassConfig {
                slo: 10,
                placement: Placement::Head,
            },
            ClassConfig {
                slo: 10,
                placement: Placement::Tail,
            },
        ];
        let mut d = Dispatcher::new(SchedPolicy::CPreMq {
            quantum: 5,
            classes,
        });
        d.enqueue(req(1, 0, 0), 0);
        d.requeue_preempted(req(2, 0, 0), 1);
        d.enqueue(req(3, 1, 0), 0);
        d.requeue_preempted(req(4, 1, 0), 1);
        // Class 0 head placement: preempted 2 goes first.
        let first = d.next_for_idle_worker(10).unwrap();
        assert_eq!(first.id, 2);
        // Class 1 tail placement: 3 stays ahead of 4.
        let order: Vec<u64> = std::iter::from_fn(|| d.next_for_idle_worker(10))
            .map(|r| r.id)
            .collect();
        assert!(order.iter().position(|&x| x == 3) < order.iter().position(|&x| x == 4));
    }

    /// The request taken behind a preempted one is, whenever one is given,
    /// the one an idle worker would get after the preempted one had been
    /// requeued; and one is given under c-PRE-SQ with tail placement
    /// whenever anything waits.
    #[test]
    fn next_behind_preempted_is_what_requeueing_would_choose() {
        use crate::rng::SplitMix64;
        let mq = |a: Placement, b: Placement| SchedPolicy::CPreMq {
            quantum: 5,
            classes: vec![
                ClassConfig {
                    slo: 10,
                    placement: a,
                },
                ClassConfig {
                    slo: 1000,
                    placement: b,
                },
            ],
        };
        let policies = [
            SchedPolicy::CFcfs,
            SchedPolicy::CPreSq {
                quantum: 5,
                placement: Placement::Tail,
            },
            SchedPolicy::CPreSq {
                quantum: 5,
                placement: Placement::Head,
            },
            mq(Placement::Tail, Placement::Tail),
            mq(Placement::Head, Placement::Tail),
        ];
        let mut rng = SplitMix64::new(7);
        let mut given = 0;
        for policy in policies {
            let classes = if matches!(policy, SchedPolicy::CPreMq { .. }) {
                2
            } else {
                1
            };
            for _ in 0..2000 {
                let mut d = Dispatcher::new(policy.clone());
                let now = 10_000;
                for id in 0..rng.below(4) as u64 {
                    let arrival = rng.below(10_000) as Time;
                    d.enqueue(req(id, rng.below(classes), arrival), arrival);
                }
                let preempted = req(100, rng.below(classes), rng.below(10_000) as Time);
                let mut reference = Dispatcher::new(policy.clone());
                reference.queues = d.queues.clone();
                reference.pending = d.pending;
                reference.requeue_preempted(preempted.clone(), now);
                let expected = reference.next_for_idle_worker(now).map(|r| r.id);
                let before = d.len();
                match d.next_behind_preempted(preempted.class, preempted.arrival, now) {
                    Some(r) => {
                        given += 1;
                        assert_eq!(Some(r.id), expected, "{policy:?}");
                        assert_eq!(d.len(), before - 1);
                    }
                    None => {
                        assert_eq!(d.len(), before, "nothing taken when none is given");
                        if policy
                            == (SchedPolicy::CPreSq {
                                quantum: 5,
                                placement: Placement::Tail,
                            })
                        {
                            assert_eq!(before, 0, "c-PRE-SQ tail: given whenever one waits");
                        }
                    }
                }
            }
        }
        assert!(
            given > 1000,
            "only {given} requests taken behind a preempted one"
        );
    }
}
