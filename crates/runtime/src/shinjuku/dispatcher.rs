//! The dispatcher of Shinjuku mode (docs/runtime.md, "Shinjuku mode"): a
//! [`Dispatch`] holds the queues and what each worker runs, and its loop's
//! phases are its methods; [`ThreadClock`] counts the CPU the dispatcher
//! and the workers get.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_deque::Steal;
use ginza_policy::sched::{Dispatcher, Request};
use ginza_sys::sched_stat::SchedStat;

use super::worker::{Mailbox, Posted, Report, WorkerClock};
use super::{
    policy_error, Completion, Context, Contexts, HandlerRef, InFlight, Preemption,
    PreemptionSample, Running, Served, ShinjukuConfig, Source, ThreadTimes, DISPATCHER_STALL_NS,
    MAX_STALL_SPANS,
};
use crate::error::RuntimeError;
use crate::sched::{self, Shared, URef};

/// Shortest interval between two preemption signals to one worker.
const RESEND_MIN_NS: u64 = 50_000;

/// The CPU Linux gives the dispatcher and the workers, counted from the
/// dispatcher's first pass ([`ThreadTimes`]).
struct ThreadClock {
    started_ns: u64,
    dispatcher: Option<SchedStat>,
    /// Each worker's baseline, read once its thread id is known (outer
    /// `None`: not yet; inner `None`: unreadable — never read again, so a
    /// pass does no file I/O after the start).
    workers: Vec<Option<Option<SchedStat>>>,
    last_pass_ns: u64,
    times: ThreadTimes,
}

impl ThreadClock {
    fn new(rt: &Shared, now: u64) -> ThreadClock {
        let mut clock = ThreadClock {
            started_ns: now,
            dispatcher: SchedStat::of_current().ok(),
            workers: vec![None; rt.kthreads.len()],
            last_pass_ns: now,
            times: ThreadTimes::default(),
        };
        clock.find_workers(rt);
        clock
    }

    /// Reads the baseline of the workers whose threads have started.
    fn find_workers(&mut self, rt: &Shared) {
        for (base, k) in self.workers.iter_mut().zip(rt.kthreads.iter()) {
            let tid = k.tid.load(Relaxed);
            if base.is_none() && tid != 0 {
                *base = Some(SchedStat::of_thread(tid).ok());
            }
        }
    }

    /// One pass of the dispatcher's loop, at `now`.
    fn pass(&mut self, rt: &Shared, now: u64) {
        let t = &mut self.times;
        t.dispatcher_passes += 1;
        let gap = now.saturating_sub(self.last_pass_ns);
        self.last_pass_ns = now;
        if gap > DISPATCHER_STALL_NS {
            t.dispatcher_stalls += 1;
            t.dispatcher_stalled_ns += gap;
            t.dispatcher_longest_stall_ns = t.dispatcher_longest_stall_ns.max(gap);
            if t.dispatcher_stall_spans.len() < MAX_STALL_SPANS {
                t.dispatcher_stall_spans.push((now - gap, gap));
            }
        }
        if self.workers.iter().any(Option::is_none) {
            self.find_workers(rt);
        }
    }

    fn finish(mut self, rt: &Shared) -> ThreadTimes {
        let since = |base: Option<SchedStat>, now: std::io::Result<SchedStat>| {
            Some(now.ok()?.since(&base?))
        };
        self.times.wall_ns = self.last_pass_ns.saturating_sub(self.started_ns);
        self.times.dispatcher = since(self.dispatcher, SchedStat::of_current());
        self.times.workers = self
            .workers
            .iter()
            .zip(rt.kthreads.iter())
            .map(|(&base, k)| since(base.flatten(), SchedStat::of_thread(k.tid.load(Relaxed))))
            .collect();
        self.times
    }
}

/// The median cost of reading the clock twice, to subtract from short timings.
fn clock_overhead_ns() -> u64 {
    let mut samples: Vec<u64> = (0..1001)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// The dispatcher's loop ([`Dispatch::run`]): arrivals in, decisions out,
/// no application code. Each pass runs the phases in order: admit
/// arrivals, take requests runnable again, read the workers' reports, ask
/// for preemptions, give idle workers a request, pre-assign the next
/// request to busy ones.
pub(super) struct Dispatch<'a, Req, Resp, S, H> {
    rt: &'a Arc<Shared>,
    mailboxes: &'a [Mailbox],
    config: &'a ShinjukuConfig,
    n_classes: usize,
    source: &'a mut S,
    handler: HandlerRef<H>,
    queues: Dispatcher<InFlight<Req, Resp>>,
    running: Vec<Option<Running<Req, Resp>>>,
    /// Pre-assigned behind the running request (only where one runs).
    pending: Vec<Option<Request<InFlight<Req, Resp>>>>,
    /// Keyed by the serial the dispatcher gives each context, not by its
    /// address: a finished request's address is reused by the next one.
    blocked: HashMap<u64, Request<InFlight<Req, Resp>>>,
    woken_early: HashSet<u64>,
    next_id: u64,
    /// Requests admitted and not completed (spawned uthreads not counted:
    /// their spawner holds them).
    in_flight: usize,
    /// Per worker: the sample of the preemption it last reported, and
    /// when, until the worker's next start fills in its `resume_ns`.
    resume_of: Vec<Option<(usize, u64)>>,
    clock_overhead: u64,
    clock: WorkerClock,
    thread_clock: ThreadClock,
    contexts: Contexts,
    /// The counts and completions so far (`threads` filled at the end).
    served: Served<Resp>,
    idle_passes: u32,
}

impl<'a, Req, Resp, S, H> Dispatch<'a, Req, Resp, S, H>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    S: Source<Req>,
    H: Fn(Req) -> Resp + Send + Sync + 'static,
{
    pub(super) fn new(
        rt: &'a Arc<Shared>,
        mailboxes: &'a [Mailbox],
        config: &'a ShinjukuConfig,
        n_classes: usize,
        source: &'a mut S,
        handler: HandlerRef<H>,
    ) -> Self {
        let workers = rt.kthreads.len();
        let clock_overhead = if config.record_preemptions {
            clock_overhead_ns()
        } else {
            0
        };
        let mut clock = WorkerClock::new(rt);
        let thread_clock = ThreadClock::new(rt, clock.now_ns());
        Dispatch {
            rt,
            mailboxes,
            config,
            n_classes,
            source,
            handler,
            queues: Dispatcher::new(config.policy.clone()),
            running: (0..workers).map(|_| None).collect(),
            pending: (0..workers).map(|_| None).collect(),
            blocked: HashMap::new(),
            woken_early: HashSet::new(),
            next_id: 0,
            in_flight: 0,
            resume_of: vec![None; workers],
            clock_overhead,
            clock,
            thread_clock,
            contexts: Contexts::new(config.max_in_flight),
            served: Served {
                completions: Vec::new(),
                signals_sent: 0,
                samples: Vec::new(),
                rejected: 0,
                rejected_no_stack: 0,
                pre_assigned: 0,
                taken_back: 0,
                pre_assigned_on_preempt: 0,
                unasked_preemptions: 0,
                threads: ThreadTimes::default(),
            },
            idle_passes: 0,
        }
    }

    /// Passes until the source is done and every request has completed.
    pub(super) fn run(mut self) -> Result<Served<Resp>, RuntimeError> {
        loop {
            let now = self.clock.now_ns();
            self.thread_clock.pass(self.rt, now);
            let mut progress = self.admit(now)?;
            progress |= self.take_runnable(now);
            progress |= self.read_reports(now);
            self.ask_preemptions(now);
            progress |= self.assign_idle_workers(now);
            if self.config.pre_assign {
                progress |= self.pre_assign(now);
            }
            if self.source.is_done()
                && self.queues.is_empty()
                && self.blocked.is_empty()
                && self.running.iter().all(Option::is_none)
            {
                return Ok(self.finish());
            }
            self.after_pass(progress);
        }
    }

    fn finish(self) -> Served<Resp> {
        let mut served = self.served;
        served.rejected += self.contexts.refused;
        served.rejected_no_stack = self.contexts.refused;
        served.threads = self.thread_clock.finish(self.rt);
        served
    }

    /// `request` with its context made, or `None` if it was refused for
    /// want of a stack (then no longer in flight).
    fn make(
        &mut self,
        request: Request<InFlight<Req, Resp>>,
    ) -> Option<(Request<InFlight<Req, Resp>>, URef)> {
        let made = self
            .contexts
            .make(request, Arc::as_ptr(self.rt), self.handler);
        if made.is_none() {
            self.in_flight -= 1;
        }
        made
    }

    /// Takes the source's arrivals into the queues, refusing those beyond
    /// `max_in_flight`. Whether any came.
    fn admit(&mut self, now: u64) -> Result<bool, RuntimeError> {
        let mut progress = false;
        while let Some(arrival) = self.source.poll(now) {
            if arrival.class >= self.n_classes {
                return Err(policy_error(format!(
                    "request {} has class {}, but the policy has {} class(es)",
                    self.next_id, arrival.class, self.n_classes
                )));
            }
            progress = true;
            if self.in_flight >= self.config.max_in_flight {
                self.served.rejected += 1;
                continue;
            }
            self.in_flight += 1;
            let request = Request {
                id: self.next_id,
                class: arrival.class,
                arrival: arrival.at_ns,
                payload: InFlight {
                    context: Context::Unmade(arrival.payload),
                    preemptions: 0,
                    on_core_ns: 0,
                    admitted_ns: now,
                },
            };
            self.queues.enqueue(request, now);
            self.next_id += 1;
        }
        Ok(progress)
    }

    /// Queues the requests that blocked and are runnable again (woken, or
    /// their sleep ended), and the uthreads requests spawned. Whether any
    /// came.
    fn take_runnable(&mut self, now: u64) -> bool {
        let rt = self.rt;
        if !rt.timers_only_at_switch_checks.load(Relaxed) {
            // The look at each worker's next deadline is inline (its own
            // line, shared while no timer changes); the call only if one is set.
            for k in rt.kthreads.iter().filter(|k| k.timers.any()) {
                sched::fire_timers_to_dispatcher(k);
            }
        }
        let mut progress = false;
        // Looked at first: a steal from an empty queue costs a full fence.
        while !rt.injector.is_empty() {
            let Steal::Success(u) = rt.injector.steal() else {
                continue;
            };
            let key = u.serial();
            if let Some(request) = self.blocked.remove(&key) {
                self.queues.enqueue(request, now);
            } else if u.never_ran() {
                debug_assert_eq!(key, 0, "a spawned uthread seen twice before it ran");
                u.set_serial(self.contexts.serial());
                // Spawned by a request: scheduled like one, in class 0.
                let spawned = Request {
                    id: u64::MAX,
                    class: 0,
                    arrival: now,
                    payload: InFlight {
                        context: Context::Made {
                            uthread: u,
                            handle: None,
                        },
                        preemptions: 0,
                        on_core_ns: 0,
                        admitted_ns: now,
                    },
                };
                self.queues.enqueue(spawned, now);
            } else {
                // Woken before its worker's report reached us.
                self.woken_early.insert(key);
            }
            progress = true;
        }
        progress
    }

    /// Reads each worker's report, if it posted one. Whether any had.
    fn read_reports(&mut self, now: u64) -> bool {
        let mut progress = false;
        for w in 0..self.mailboxes.len() {
            if let Some(posted) = self.mailboxes[w].take_report() {
                self.on_report(w, posted, now);
                progress = true;
            }
        }
        progress
    }

    /// Worker `w`'s report: its run ends (completed, preempted or
    /// blocked), and its pre-assigned request is its next run or goes
    /// back to the queue.
    fn on_report(&mut self, w: usize, posted: Posted, now: u64) {
        let Posted {
            report,
            at: finished_at,
            started_at,
            took_next,
            spare,
        } = posted;
        if let Some(spare) = spare {
            self.contexts.keep(spare);
        }
        let run = self.running[w]
            .take()
            .expect("a worker reported without an assignment");
        // This request's start ends the gap after the worker's last
        // preemption.
        if let Some((i, off)) = self.resume_of[w].take() {
            if let Some(sample) = self.served.samples.get_mut(i) {
                sample.resume_ns = Some(started_at.saturating_sub(off));
            }
        }
        // The pre-assigned request, if any, is the worker's next if it
        // took it as it reported. Otherwise (it looked before the
        // request was put there, or it was preempted unasked and left
        // an ordinary pre-assignment alone) the request goes back to
        // the head of its queue before the stopped one is requeued, and
        // the policy chooses again.
        if let Some(next) = self.pending[w].take() {
            if took_next {
                let mut next_run = Running::new(next);
                if run.flagged && run.asked_stamp != started_at {
                    // The start read for the ask was already the next
                    // run's (the report came in after it): the ask
                    // names that run, so it counts as asked.
                    next_run.flagged = true;
                    next_run.flagged_at = run.flagged_at;
                    next_run.asked_stamp = run.asked_stamp;
                }
                self.running[w] = Some(next_run);
            } else {
                self.mailboxes[w]
                    .take_back()
                    .expect("a pre-assigned request left its slot unreported");
                self.queues.put_back(next);
                self.served.taken_back += 1;
            }
        } else {
            debug_assert!(!took_next, "a worker took a request never pre-assigned");
        }
        let mut request = run.request;
        request.payload.on_core_ns += finished_at.saturating_sub(started_at);
        match report {
            Report::Completed => self.completed(request, finished_at),
            Report::Preempted => {
                if !run.flagged && run.signaled_at.is_none() {
                    self.served.unasked_preemptions += 1;
                }
                if self.config.record_preemptions {
                    self.resume_of[w] = Some((self.served.samples.len(), finished_at));
                    self.served.samples.push(PreemptionSample {
                        by_signal: run.signaled_at.is_some(),
                        dispatcher_ns: run.ask_ns,
                        handback_ns: finished_at.saturating_sub(run.asked_at),
                        late_ns: run.late_ns,
                        resume_ns: None,
                        took_next,
                    });
                }
                request.payload.preemptions += 1;
                self.queues.requeue_preempted(request, now);
            }
            Report::Blocked => {
                let key = request.payload.made().serial();
                if self.woken_early.remove(&key) {
                    self.queues.enqueue(request, now);
                } else {
                    self.blocked.insert(key, request);
                }
            }
        }
    }

    /// A request's completion, told to the source and recorded (a
    /// uthread a request spawned is neither: its spawner joins it).
    fn completed(&mut self, request: Request<InFlight<Req, Resp>>, finished_at: u64) {
        let InFlight {
            context,
            preemptions,
            on_core_ns,
            admitted_ns,
        } = request.payload;
        if let Context::Made {
            handle: Some(handle),
            ..
        } = context
        {
            self.in_flight -= 1;
            self.source.completed(request.id);
            self.served.completions.push(Completion {
                id: request.id,
                class: request.class,
                arrival_ns: request.arrival,
                admitted_ns,
                finish_ns: finished_at,
                preemptions,
                on_core_ns,
                result: handle.join(),
            });
        }
    }

    /// Asks each worker whose request is past its quantum while others
    /// wait to yield it (the flag, then signals as configured).
    fn ask_preemptions(&mut self, now: u64) {
        for w in 0..self.running.len() {
            if self.running[w].is_some() {
                self.ask_preemption(w, now);
            }
        }
    }

    fn ask_preemption(&mut self, w: usize, now: u64) {
        // Nothing to preempt for (no quantum, nothing waiting): the
        // worker's line is not read.
        if self.queues.quantum().is_none() || (self.queues.is_empty() && self.pending[w].is_none())
        {
            return;
        }
        let started = self.mailboxes[w].started_ns();
        let spent = |q: u64| now.saturating_sub(started) >= q;
        if started == 0
            || !(self.queues.should_preempt(started, now)
                || (self.pending[w].is_some() && self.queues.quantum().is_some_and(spent)))
        {
            return;
        }
        let run = self.running[w].as_ref().expect("a running request");
        let (flagged, class, arrival) = (run.flagged, run.request.class, run.request.arrival);
        // The request pre-assigned here goes back to the queue, so the
        // policy places it and the preempted one (docs/runtime.md).
        if !flagged && self.pending[w].is_some() && self.mailboxes[w].take_back().is_some() {
            if let Some(request) = self.pending[w].take() {
                self.queues.put_back(request);
                self.served.taken_back += 1;
            }
        }
        let signal_now = self.signal_due(w, now);
        // The request the policy runs next goes to the worker's second
        // slot before the flag is set, so that the worker finds it
        // however fast it yields (docs/runtime.md, pre-assignment at
        // the ask).
        if !flagged && self.config.pre_assign_on_preempt && self.pending[w].is_none() {
            self.pre_assign_behind_preempted(w, class, arrival, now);
        }
        if flagged && !signal_now {
            return;
        }
        let asking = self.config.record_preemptions.then(Instant::now);
        let k = &self.rt.kthreads[w];
        let run = self.running[w].as_mut().expect("a running request");
        if !run.flagged {
            // The ask names this run by its start stamp: should the
            // worker have switched to its next run meanwhile, that run
            // finds an ask for another and drops it (`PreemptAsk`), so no
            // later run yields for it.
            let ticks = if self.config.record_worker_spans {
                ginza_sys::tsc_clock::ticks()
            } else {
                0
            };
            k.preempt_ask.ask_run(started, ticks);
            run.asked_stamp = started;
            run.flagged = true;
            run.flagged_at = now;
            run.late_ns =
                now.saturating_sub(started.saturating_add(self.queues.quantum().unwrap_or(0)));
        }
        if signal_now {
            let tid = k.tid.load(Relaxed);
            if tid != 0 && crate::signals::send_preempt(tid).is_ok() {
                self.served.signals_sent += 1;
            }
            run.signaled_at = Some(now);
        }
        if let Some(t) = asking {
            run.ask_ns += (t.elapsed().as_nanos() as u64).saturating_sub(self.clock_overhead);
            run.asked_at = self.clock.now_ns();
        }
    }

    /// Whether worker `w`, whose request is to be preempted, gets a
    /// preemption signal now.
    fn signal_due(&self, w: usize, now: u64) -> bool {
        // A signal can land where it cannot act (the worker was
        // descheduled before switching into the request, say), so one
        // is sent again each `period` until the request is handed back;
        // never faster than RESEND_MIN_NS, since a delivery alone costs
        // microseconds and a flood would nest handlers without end.
        let (period, first_after) = match self.config.preemption {
            Preemption::Signal => (
                self.queues.quantum().unwrap_or(u64::MAX).max(RESEND_MIN_NS),
                0,
            ),
            Preemption::Cooperative { backstop: None } => (u64::MAX, u64::MAX),
            Preemption::Cooperative { backstop: Some(b) } => {
                let b = b.as_nanos().min(u64::MAX as u128) as u64;
                (b.max(RESEND_MIN_NS), b)
            }
        };
        let run = self.running[w].as_ref().expect("a running request");
        match run.signaled_at {
            None => {
                first_after != u64::MAX
                    && (first_after == 0
                        || (run.flagged && now.saturating_sub(run.flagged_at) >= first_after))
            }
            Some(at) => now.saturating_sub(at) >= period,
        }
    }

    /// Puts the request the policy would run after worker `w`'s preempted
    /// one (of `class`, arrived at `arrival`) in its second slot.
    fn pre_assign_behind_preempted(&mut self, w: usize, class: usize, arrival: u64, now: u64) {
        let behind = loop {
            let Some(request) = self.queues.next_behind_preempted(class, arrival, now) else {
                break None;
            };
            if let Some(made) = self.make(request) {
                break Some(made);
            }
        };
        if let Some((request, uthread)) = behind {
            self.mailboxes[w].pre_assign_behind_preempted(uthread);
            self.pending[w] = Some(request);
            self.served.pre_assigned += 1;
            self.served.pre_assigned_on_preempt += 1;
        }
    }

    /// Gives each idle worker the queue's head, else a request
    /// pre-assigned to a busy worker that has not taken it yet. Whether
    /// any got one.
    fn assign_idle_workers(&mut self, now: u64) -> bool {
        let mut progress = false;
        for w in 0..self.running.len() {
            if self.running[w].is_some() {
                continue;
            }
            let next = loop {
                let request = match self.queues.next_for_idle_worker(now) {
                    Some(request) => Some(request),
                    None => self.take_back_pre_assigned(),
                };
                let Some(request) = request else {
                    break None;
                };
                if let Some(made) = self.make(request) {
                    break Some(made);
                }
            };
            let Some((request, uthread)) = next else {
                break;
            };
            self.mailboxes[w].assign(&self.rt.kthreads[w], uthread);
            self.running[w] = Some(Running::new(request));
            progress = true;
        }
        progress
    }

    /// The first request pre-assigned to a worker that has not taken it
    /// yet, taken back from its slot.
    fn take_back_pre_assigned(&mut self) -> Option<Request<InFlight<Req, Resp>>> {
        for v in 0..self.mailboxes.len() {
            if self.pending[v].is_some() && self.mailboxes[v].take_back().is_some() {
                self.served.taken_back += 1;
                return self.pending[v].take();
            }
        }
        None
    }

    /// Puts the queue's next requests in the second slot of busy workers
    /// that have none. Whether any was taken from the queue.
    fn pre_assign(&mut self, now: u64) -> bool {
        let mut progress = false;
        for w in 0..self.pending.len() {
            // Not behind a request being preempted: the policy places
            // it beside the others once it is back (the take-back above).
            if self.pending[w].is_some() || self.running[w].as_ref().is_none_or(|r| r.flagged) {
                continue;
            }
            let Some(request) = self.queues.next_for_idle_worker(now) else {
                break;
            };
            progress = true;
            let Some((request, uthread)) = self.make(request) else {
                continue;
            };
            self.mailboxes[w].pre_assign(uthread);
            self.pending[w] = Some(request);
            self.served.pre_assigned += 1;
        }
        progress
    }

    /// Between passes: spin, or after long idleness with nothing in
    /// flight, yield the core (when configured).
    fn after_pass(&mut self, progress: bool) {
        if progress {
            self.idle_passes = 0;
            return;
        }
        self.idle_passes = self.idle_passes.saturating_add(1);
        if self.config.yield_when_idle
            && self.idle_passes > 10_000
            && self.running.iter().all(Option::is_none)
        {
            // Nothing in flight: let other threads have this core.
            let rt = self.rt;
            let before = rt.now_ns();
            std::thread::yield_now();
            let t = &mut self.thread_clock.times;
            t.dispatcher_yields += 1;
            let away = rt.now_ns().saturating_sub(before);
            if away > DISPATCHER_STALL_NS {
                t.dispatcher_yield_stalls += 1;
                t.dispatcher_yield_stalled_ns += away;
            }
        } else {
            std::hint::spin_loop();
        }
    }
}
