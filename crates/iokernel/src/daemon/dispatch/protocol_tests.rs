//! The dispatch protocol between iokerneld and a dispatched application's
//! workers, message by message (docs/colocate.md, "The worker state
//! machine"): [`AppDispatch`] driven as the daemon drives it (hand-backs
//! and parks read from the command rings, grants with their `Wake`, the
//! dispatch step), and the workers played by a model of the runtime's
//! rules (`runtime/src/link.rs`, `shinjuku/dispatched.rs`): a `Run` read
//! before the `Wake` that follows the worker's `Parked`/`Yielded` is stale.
//!
//! With pre-assignment a busy worker may get a `RunNext`: it starts it
//! once it hands its request back completed, and drops it (iokerneld takes
//! it back) when it hands its request back preempted.
//!
//! Each `Wake` carries a grant number and each `Parked`/`Yielded` the
//! number of the last `Wake` its worker read; iokerneld ignores one that
//! answers a grant already answered (`daemon/pass.rs::GrantNumbers`). A
//! worker may also wake with no grant (a stray wake-up) and park again.
//!
//! After every event the model checks that each request iokerneld counts
//! on a worker is owed to that worker — held by it, read and kept, on its
//! ring where it will be kept, or about to be taken back because the
//! worker's park crossed it — so no request waits in iokerneld's queue
//! while a worker holds a core and no `Run` is on its way to it; and at
//! the end that every request completed exactly once with no hand-back
//! refused.

use std::collections::VecDeque;

use ginza_policy::rng::SplitMix64;
use ginza_policy::sched::{Placement, SchedPolicy};
use ginza_shm::{
    LineFlags, PacketDesc, PreemptReason, Region, RegionConfig, RuntimeEnd, ToIokernel, ToKthread,
};
use proptest::prelude::*;

use super::super::pass::GrantNumbers;
use super::{AppDispatch, IokernelEnd};

/// iokerneld's view of one kthread (the daemon's `Kthread`, reduced).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct IoView {
    core: bool,
    parked: bool,
    preempting: bool,
    /// Granted, its `Wake` not sent yet (a hand-over waiting for the end
    /// of the pass, `daemon/pass.rs`).
    wake_pending: bool,
    grants: GrantNumbers,
}

/// One worker as the runtime runs it.
#[derive(Clone, Debug, Default)]
struct Worker {
    /// It runs (granted, or woken some other way); parked otherwise.
    running: bool,
    /// No `Wake` read since it gave its core back (`KLink::expect_wake`).
    awaiting_wake: bool,
    /// `Run`s read and kept, not started, each with whether it was
    /// pre-assigned (`RunNext`).
    runs: VecDeque<(u64, bool)>,
    /// It handed a request back preempted and has read no plain `Run`
    /// since: `RunNext`s are dropped (`KLink::handing_back_preempted`).
    drop_pre: bool,
    holding: Option<u64>,
    /// Commands iokerneld sent it, not read yet.
    inbox: VecDeque<ToKthread>,
    /// The grant numbers of its `Parked`/`Yielded` on the ring, unread by
    /// iokerneld (oldest first).
    parks_unread: VecDeque<u16>,
    /// The number of the last `Wake` it read.
    grant: u16,
    /// Requests it handed back (and whether completed), the hand-back
    /// unread by iokerneld.
    returned: Vec<(u64, bool)>,
    /// A grant's eventfd (or word) is waiting for it.
    woken: bool,
}

struct Model {
    _region: Region,
    io: Vec<IokernelEnd>,
    rt: Vec<RuntimeEnd>,
    d: AppDispatch,
    view: Vec<IoView>,
    w: Vec<Worker>,
    now: u64,
    arrived: u64,
    done: Vec<u32>,
    /// `Run`s that reached a worker after their request was taken back
    /// and that it kept (would run a request twice).
    kept_stale: u64,
    /// Parks iokerneld ignored: they answered a grant already answered.
    stale_parks: u64,
}

impl Model {
    fn new(workers: usize, policy: SchedPolicy, pre_assign: bool) -> Model {
        let n = workers as u32;
        let region = Region::create("dispatch-protocol", &RegionConfig::new(n)).unwrap();
        let io = (0..n).map(|k| region.iokernel_end(k).unwrap()).collect();
        let rt = (0..n).map(|k| region.runtime_end(k).unwrap()).collect();
        Model {
            _region: region,
            io,
            rt,
            d: AppDispatch::new(policy, workers, 0, Some(20), pre_assign),
            view: vec![
                IoView {
                    parked: true,
                    ..IoView::default()
                };
                workers
            ],
            w: vec![
                Worker {
                    awaiting_wake: true,
                    ..Worker::default()
                };
                workers
            ],
            now: 1,
            arrived: 0,
            done: Vec::new(),
            kept_stale: 0,
            stale_parks: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.now += 1;
        self.now
    }

    fn granted(&self) -> Vec<bool> {
        // `daemon/packets.rs::granted`: holds a core, not being revoked,
        // not waiting for a hand-over (a pending wake is none of these).
        self.view.iter().map(|v| v.core && !v.preempting).collect()
    }

    /// Moves what iokerneld put on the command rings to the workers'
    /// inboxes (the ring is only transport; the worker reads the inbox
    /// by the runtime's rules when it runs).
    fn post(&mut self) {
        for (k, w) in self.w.iter_mut().enumerate() {
            while let Some(m) = self.rt[k].from_iokernel.recv().unwrap() {
                w.inbox.push_back(m);
            }
        }
    }

    fn step(&mut self) {
        let now = self.tick();
        let g = self.granted();
        self.d.step(now, g.into_iter(), &mut self.io);
        self.post();
        self.check(true);
    }

    // ---- iokerneld's side

    fn arrive(&mut self) {
        let now = self.tick();
        let f = super::tests::frame(0);
        self.d.arrive(
            PacketDesc {
                buf: (self.arrived % 1024) as u32,
                len: f.len() as u32,
                hash: 0,
                reserved: 0,
            },
            &f,
            now,
        );
        self.arrived += 1;
        self.done.push(0);
    }

    /// The loop's turn: every command ring read (`daemon/pass.rs::drain`),
    /// then the dispatch step (`daemon/packets.rs`).
    fn io_turn(&mut self) {
        for k in 0..self.io.len() {
            while let Some(m) = self.io[k].from_kthread.recv().unwrap() {
                let now = self.tick();
                match m {
                    ToIokernel::HandBack { request, completed } => {
                        self.w[k].returned.retain(|&(r, _)| r != request);
                        self.d.hand_back(k, request, completed, now).unwrap();
                    }
                    ToIokernel::Parked { grant, .. } | ToIokernel::Yielded { grant, .. } => {
                        self.w[k].parks_unread.pop_front();
                        if !self.view[k].grants.answers(grant) {
                            self.stale_parks += 1;
                            continue;
                        }
                        let parked = matches!(m, ToIokernel::Parked { .. });
                        self.d.gave_core_back(k, parked, now);
                        self.view[k] = IoView {
                            parked: true,
                            grants: self.view[k].grants,
                            ..IoView::default()
                        };
                        self.io[k].line.remove_flags(LineFlags::PREEMPT_PENDING);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        self.step();
    }

    /// The allocator grants a parked kthread a core: the `Wake`, then its
    /// first request (`daemon/pass.rs::wake`); with `deferred`, only the
    /// bookkeeping now, the `Wake` at the end of the pass (a hand-over).
    fn grant(&mut self, k: usize, deferred: bool) {
        if !self.view[k].parked {
            return;
        }
        self.view[k] = IoView {
            core: true,
            wake_pending: true,
            grants: self.view[k].grants,
            ..IoView::default()
        };
        if !deferred {
            self.send_wake(k);
        }
    }

    fn send_wake(&mut self, k: usize) {
        if !self.view[k].wake_pending {
            return;
        }
        self.view[k].wake_pending = false;
        let now = self.tick();
        let grant = self.view[k].grants.next();
        self.io[k]
            .to_kthread
            .send(ToKthread::Wake {
                core: 0,
                decided_ns: now,
                grant,
            })
            .unwrap();
        self.view[k].grants.granted(Some(grant));
        self.d.woken(k);
        self.step();
        self.w[k].woken = true;
    }

    /// A kthread granted in this pass, its `Wake` not sent, is preempted
    /// by a later decision of the pass: it goes back to parked silently
    /// (`daemon/pass.rs::preempt`), and iokerneld's dispatch is not told.
    fn cancel(&mut self, k: usize) {
        if self.view[k].wake_pending {
            self.view[k] = IoView {
                parked: true,
                grants: self.view[k].grants,
                ..IoView::default()
            };
        }
    }

    /// Revocation (`daemon/pass.rs::preempt`).
    fn revoke(&mut self, k: usize) {
        let v = self.view[k];
        if !v.core || v.preempting || v.wake_pending {
            return;
        }
        self.view[k].core = false;
        self.view[k].preempting = true;
        self.io[k].line.insert_flags(LineFlags::PREEMPT_PENDING);
        self.io[k]
            .to_kthread
            .send(ToKthread::Preempt {
                reason: PreemptReason::CoreNeeded,
            })
            .unwrap();
        self.post();
        self.check(false);
    }

    // ---- the worker's side (the runtime's rules)

    /// `KLink::drain`.
    fn read(&mut self, k: usize) {
        let w = &mut self.w[k];
        while let Some(m) = w.inbox.pop_front() {
            match m {
                ToKthread::Wake { grant, .. } => {
                    w.runs.clear();
                    w.awaiting_wake = false;
                    w.drop_pre = false;
                    w.grant = grant;
                }
                ToKthread::Run { .. } | ToKthread::RunNext { .. } if w.awaiting_wake => {}
                ToKthread::RunNext { .. } if w.drop_pre => {}
                ToKthread::Run { request, .. } | ToKthread::RunNext { request, .. } => {
                    let pre = matches!(m, ToKthread::RunNext { .. });
                    if !pre {
                        w.drop_pre = false;
                    }
                    let q = &self.d.queues;
                    if q.running_on(k) != Some(request) && q.pre_assigned_on(k) != Some(request) {
                        self.kept_stale += 1;
                    }
                    w.runs.push_back((request, pre));
                }
                ToKthread::Preempt { .. } => {}
            }
        }
    }

    /// One look of worker `k`'s loop (`shinjuku/dispatched.rs::run`).
    fn worker(&mut self, k: usize, roll: u64) {
        if !self.w[k].running {
            // Parked: only a grant wakes it (`iokernel.rs::wait_for_grant`).
            if std::mem::take(&mut self.w[k].woken) {
                self.w[k].running = true;
                self.read(k);
            }
            return;
        }
        let flags = self.rt[k].line.flags();
        let revoked = flags.contains(LineFlags::PREEMPT_PENDING);
        if let Some(id) = self.w[k].holding {
            if roll % 4 == 0 {
                self.finish(k, id, true);
            } else if flags.contains(LineFlags::YIELD_REQUEST) || revoked {
                self.rt[k].line.remove_flags(LineFlags::YIELD_REQUEST);
                self.finish(k, id, false);
            }
            return;
        }
        if revoked {
            return self.park(k, true);
        }
        self.read(k);
        if let Some((id, _)) = self.w[k].runs.pop_front() {
            self.w[k].holding = Some(id);
            self.rt[k].line.set_running_request(Some(id));
        } else if roll % 3 == 0 {
            // Its idle spin is over.
            self.park(k, false);
        }
    }

    fn finish(&mut self, k: usize, id: u64, completed: bool) {
        self.rt[k].line.set_running_request(None);
        let w = &mut self.w[k];
        w.holding = None;
        w.returned.push((id, completed));
        if completed {
            self.done[id as usize] += 1;
            self.rt[k].line.remove_flags(LineFlags::YIELD_REQUEST);
        } else {
            // Its pre-assigned request is taken back.
            w.runs.retain(|&(_, pre)| !pre);
            w.drop_pre = true;
        }
        self.rt[k]
            .to_iokernel
            .send(ToIokernel::HandBack {
                request: id,
                completed,
            })
            .unwrap();
    }

    /// A parked worker wakes with no grant (a stray wake-up: nothing in
    /// the runtime does this under iokerneld, but a park must not be
    /// trusted to answer the current grant because of it).
    fn stray_wake(&mut self, k: usize) {
        if !self.w[k].running {
            self.w[k].woken = true;
        }
    }

    /// `iokernel.rs::park_with_iokernel`.
    fn park(&mut self, k: usize, revoked: bool) {
        let w = &mut self.w[k];
        w.runs.clear();
        w.awaiting_wake = true;
        w.running = false;
        w.parks_unread.push_back(w.grant);
        let grant = w.grant;
        let m = if revoked {
            ToIokernel::Yielded {
                next_deadline_ns: None,
                grant,
            }
        } else {
            ToIokernel::Parked {
                next_deadline_ns: None,
                grant,
            }
        };
        self.rt[k].to_iokernel.send(m).unwrap();
    }

    // ---- the invariants

    /// Every request iokerneld counts on a worker is owed to it; right
    /// after a dispatch step (`stepped`), none waits queued while a woken
    /// worker holds a core and idles.
    fn check(&self, stepped: bool) {
        for (k, w) in self.w.iter().enumerate() {
            let running = self.d.queues.running_on(k);
            let pre = self.d.queues.pre_assigned_on(k);
            for r in running.into_iter().chain(pre) {
                self.check_owed(k, w, r, pre == Some(r));
            }
        }
        self.check_idle(stepped);
    }

    /// `r`, which iokerneld counts on worker `k` (`pre_assigned` behind its
    /// running request, or running), is owed to it.
    fn check_owed(&self, k: usize, w: &Worker, r: u64, pre_assigned: bool) {
        // A park on its way that answers the open grant takes it back.
        let grants = self.view[k].grants;
        let taken_back = w.parks_unread.iter().any(|&g| {
            let mut open = grants;
            open.answers(g)
        });
        // A preempted hand-back on its way takes the pre-assigned one
        // back.
        let running = self.d.queues.running_on(k);
        let dropped = pre_assigned
            && w.returned
                .iter()
                .any(|&(x, done)| Some(x) == running && !done);
        if w.holding == Some(r)
            || w.runs.iter().any(|&(x, _)| x == r)
            || w.returned.iter().any(|&(x, _)| x == r)
            || taken_back
            || dropped
        {
            return;
        }
        // On its ring: kept if a `Wake` comes before it, or if the
        // worker runs and expects none (a `RunNext`: and has not handed
        // its request back preempted since its last plain `Run`).
        let mut awaiting = !w.running || w.awaiting_wake;
        let mut drop_pre = w.drop_pre;
        let mut owed = false;
        for m in &w.inbox {
            match *m {
                ToKthread::Wake { .. } => {
                    awaiting = false;
                    drop_pre = false;
                }
                ToKthread::Run { request, .. } if !awaiting => {
                    drop_pre = false;
                    owed |= request == r;
                }
                ToKthread::RunNext { request, .. } if !awaiting && !drop_pre => {
                    owed |= request == r;
                }
                _ => {}
            }
        }
        assert!(
            owed,
            "request {r} waits on worker {k}, which will never run it: {w:?}, iokerneld sees {:?}",
            self.view[k]
        );
    }

    fn check_idle(&self, stepped: bool) {
        // And so none waits queued while a worker that holds a core and
        // was woken idles with nothing on its way.
        if stepped && self.d.queued() > 0 {
            for (k, v) in self.view.iter().enumerate() {
                let idle = self.d.queues.running_on(k).is_none();
                assert!(
                    !(v.core
                        && !v.preempting
                        && !v.wake_pending
                        && idle
                        && self.w[k].parks_unread.is_empty()),
                    "a request is queued while worker {k} holds a core and idles"
                );
            }
        }
        assert_eq!(self.kept_stale, 0, "a taken-back Run was kept");
        assert!(self.done.iter().all(|&n| n <= 1), "a request ran twice");
    }

    /// No more arrivals: everything is served to the end.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            if self.done.iter().all(|&n| n == 1) {
                break;
            }
            if self.d.queued() > 0 {
                for k in 0..self.w.len() {
                    self.grant(k, false);
                }
            }
            for k in 0..self.w.len() {
                self.worker(k, 0);
            }
            self.io_turn();
        }
        assert!(
            self.done.iter().all(|&n| n == 1),
            "every request completed once: {:?}",
            self.done
        );
        assert_eq!(self.d.counters.lies, 0, "no hand-back refused");
    }
}

fn sq() -> SchedPolicy {
    SchedPolicy::CPreSq {
        quantum: 5,
        placement: Placement::Tail,
    }
}

/// Two grants in one pass, the first one's `Wake` held back until the
/// end of the pass (a hand-over): the second grant's dispatch step must
/// not send the first kthread a `Run` ahead of its `Wake`, which the
/// worker would drop as stale while iokerneld counts it running there.
#[test]
fn a_kthread_granted_but_not_woken_gets_no_run() {
    let mut m = Model::new(3, sq(), false);
    m.arrive();
    m.arrive();
    m.grant(0, true);
    m.grant(1, false);
    m.send_wake(0);
    for _ in 0..4 {
        for k in 0..3 {
            m.worker(k, 1);
        }
        m.io_turn();
    }
    assert!(m.w[0].holding.is_some() && m.w[1].holding.is_some());
    m.settle();
}

/// A `Run` crossing the worker's `Parked`, then a new grant: the request
/// is taken back and runs once, on the new grant.
#[test]
fn a_run_that_crosses_a_park_runs_once_after_the_next_wake() {
    let mut m = Model::new(3, sq(), false);
    m.grant(0, false);
    m.worker(0, 1);
    // The worker looks (nothing), parks; the request arrives and is sent
    // to it before iokerneld reads the Parked.
    m.worker(0, 0);
    assert!(!m.w[0].running);
    m.arrive();
    m.step();
    assert_eq!(m.d.queues.running_on(0), Some(0));
    m.io_turn();
    assert_eq!(m.d.counters.stale_runs, 1);
    assert_eq!(m.d.queued(), 1);
    m.grant(0, false);
    m.worker(0, 1);
    m.worker(0, 1);
    assert_eq!(m.w[0].holding, Some(0));
    m.settle();
}

/// A worker woken with no `Wake` read (its ring was full): it must not
/// keep the `Run` that crossed its last park.
#[test]
fn a_wake_without_its_message_keeps_no_stale_run() {
    let mut m = Model::new(1, sq(), false);
    m.grant(0, false);
    m.worker(0, 1);
    m.worker(0, 0); // parks
    m.arrive();
    m.step(); // the Run crosses the Parked
    m.io_turn(); // taken back
                 // Granted again, but the Wake did not fit: iokerneld marks it woken
                 // only when the Wake is on the ring, so it sends no Run; the worker
                 // wakes by its eventfd and reads the crossed Run alone.
    m.view[0] = IoView {
        core: true,
        wake_pending: true,
        grants: m.view[0].grants,
        ..IoView::default()
    };
    // No `Wake` sent: the park answers with the last one's number.
    m.view[0].grants.granted(None);
    m.w[0].woken = true;
    m.step();
    m.worker(0, 1);
    m.worker(0, 1);
    assert_eq!(m.w[0].holding, None, "the crossed Run is stale");
    m.worker(0, 0); // its spin ends: it parks
    m.io_turn();
    m.settle();
}

/// A worker woken with no grant parks again: its park answers the grant
/// iokerneld has already seen answered. Read after the next grant's `Wake`
/// and `Run`, it must take neither the core nor the request from the
/// worker, which wakes for that grant and runs the request (before grant
/// numbers: the `Run` was taken back and queued again, and the worker,
/// reading it after the `Wake`, ran it too).
#[test]
fn a_park_after_a_stray_wake_takes_nothing_from_the_next_grant() {
    let mut m = Model::new(1, sq(), false);
    m.grant(0, false);
    m.worker(0, 1); // wakes for grant 1
    m.worker(0, 0); // its spin ends: it parks, answering grant 1
    m.io_turn();
    m.stray_wake(0);
    m.worker(0, 1); // runs with no grant: nothing to read
    m.worker(0, 0); // and parks again, answering grant 1 again
    m.arrive();
    m.grant(0, false); // grant 2: its Wake, then request 0's Run
    assert_eq!(m.d.queues.running_on(0), Some(0));
    m.io_turn(); // reads the second park
    assert_eq!(
        m.stale_parks, 1,
        "the park answering grant 1 again is ignored"
    );
    assert_eq!(m.d.counters.stale_runs, 0, "nothing taken back");
    assert_eq!(m.d.queues.running_on(0), Some(0));
    m.worker(0, 1); // wakes for grant 2: its Wake, then the Run
    m.worker(0, 1);
    assert_eq!(m.w[0].holding, Some(0));
    m.check(false);
    m.settle();
}

/// With pre-assignment, a worker that completes its request starts the
/// pre-assigned one before iokerneld has read the hand-back.
#[test]
fn a_pre_assigned_request_starts_as_its_worker_completes_the_one_before() {
    let mut m = Model::new(1, sq(), true);
    m.arrive();
    m.arrive();
    m.arrive();
    m.grant(0, false); // its Wake, request 0's Run, request 1's RunNext
    assert_eq!(m.d.queues.running_on(0), Some(0));
    assert_eq!(m.d.queues.pre_assigned_on(0), Some(1));
    m.worker(0, 1); // wakes, reads all three
    m.worker(0, 1); // starts request 0
    m.worker(0, 0); // completes it
    m.worker(0, 1); // starts request 1 at once
    assert_eq!(m.w[0].holding, Some(1));
    assert_eq!(m.d.queues.running_on(0), Some(0), "the hand-back is unread");
    m.check(false);
    m.io_turn(); // reads it: request 1 runs there, request 2 is pre-assigned
    assert_eq!(m.d.queues.running_on(0), Some(1));
    assert_eq!(m.d.queues.pre_assigned_on(0), Some(2));
    m.settle();
    assert_eq!(m.d.queues.stats().pre_taken_back, 0, "nothing taken back");
}

/// A preempted hand-back takes the pre-assigned request back: the worker
/// drops it (read or not), iokerneld queues it at the head, and the
/// policy places both as without pre-assignment (tail placement: the
/// pre-assigned one runs next, by a plain `Run` the worker keeps).
#[test]
fn a_preempted_hand_back_takes_the_pre_assigned_request_back() {
    let mut m = Model::new(1, sq(), true);
    m.arrive();
    m.arrive();
    m.grant(0, false);
    m.worker(0, 1);
    m.worker(0, 1); // starts request 0, request 1's RunNext read
    assert_eq!(m.w[0].runs, [(1, true)]);
    // Asked to yield (its quantum spent, request 1 waiting behind it).
    for _ in 0..8 {
        m.step();
    }
    assert!(m.rt[0].line.flags().contains(LineFlags::YIELD_REQUEST));
    m.worker(0, 1); // yields: hands request 0 back preempted
    assert!(m.w[0].runs.is_empty(), "the pre-assigned Run is dropped");
    m.check(false);
    m.io_turn();
    assert_eq!(m.d.counters.pre_dropped, 1);
    assert_eq!(m.d.stats().tb, 1, "counted as taken back");
    assert_eq!(m.d.queues.running_on(0), Some(1), "by a plain Run");
    assert_eq!(m.d.queues.pre_assigned_on(0), Some(0));
    m.worker(0, 1);
    assert_eq!(m.w[0].holding, Some(1));
    m.settle();
}

/// Random interleavings of arrivals, grants (at once or at the end of a
/// pass), revocations, stray wake-ups, iokerneld's turns and the workers'
/// looks, for several workers.
fn interleave(seed: u64, workers: usize, events: usize, pre_assign: bool) -> u64 {
    let mut m = Model::new(workers, sq(), pre_assign);
    let mut rng = SplitMix64::new(seed);
    let mut deferred: Vec<usize> = Vec::new();
    for _ in 0..events {
        let k = (rng.next_u64() % workers as u64) as usize;
        match rng.next_u64() % 17 {
            0..=2 => m.arrive(),
            3 => m.grant(k, false),
            4 => {
                m.grant(k, true);
                deferred.push(k);
            }
            5 => {
                // The end of the pass: the held-back wakes go out, or one
                // of them was preempted before its wake.
                let cancel = rng.next_u64() % 4 == 0;
                for k in std::mem::take(&mut deferred) {
                    if cancel {
                        m.cancel(k);
                    } else {
                        m.send_wake(k);
                    }
                }
            }
            6 => m.revoke(k),
            7..=9 => m.io_turn(),
            16 => m.stray_wake(k),
            r => {
                let roll = rng.next_u64();
                m.worker(k, roll ^ r);
            }
        }
    }
    for k in std::mem::take(&mut deferred) {
        m.send_wake(k);
    }
    m.settle();
    m.d.stats().pa
}

#[test]
fn three_workers_under_random_interleavings() {
    for seed in 0..200 {
        interleave(seed, 3, 2_000, false);
    }
}

#[test]
fn three_workers_under_random_interleavings_with_pre_assignment() {
    let mut pre_assigned = 0;
    for seed in 0..200 {
        pre_assigned += interleave(seed, 3, 2_000, true);
    }
    assert!(pre_assigned > 1_000, "{pre_assigned} pre-assigned");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_interleaving_keeps_every_request_owed(
        seed in any::<u64>(),
        workers in 1usize..5,
        events in 10usize..3_000,
        pre_assign in any::<bool>(),
    ) {
        interleave(seed, workers, events, pre_assign);
    }
}
