//! Shinjuku mode: preemptive request scheduling inside an application,
//! without Dune.
//!
//! One dispatcher thread (never running application code) owns the request
//! queues — the `ginza-policy` [`Dispatcher`], the same object the simulator
//! runs — and hands request contexts to worker kthreads through per-worker
//! cache-line mailboxes. A worker runs one request at a time and reports,
//! through its mailbox, whether it completed, was preempted, or blocked.
//!
//! Preemption on a stock Linux VM: a signal costs microseconds, too much for
//! a 5 µs quantum, so the default is cooperative — the dispatcher sets the
//! worker's flag and the request yields at its next [`crate::preempt_point`]
//! (or runtime call) — with a signal as the backstop for a request that
//! reaches no preemption point in time. Deferred sections
//! ([`crate::without_preemption`], allocation, runtime internals) hold off
//! both.
//!
//! Requests in flight (admitted and not completed: queued, running,
//! preempted or blocked) are bounded by [`ShinjukuConfig::max_in_flight`]:
//! each holds a stack, mapped when it is admitted. A request over the
//! bound, or one whose stack cannot be mapped, is refused at arrival —
//! its payload dropped, counted in [`ServeReport::rejected`] — instead of
//! aborting the process.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_deque::Steal;
pub use ginza_policy::sched::{ClassConfig, Placement, SchedPolicy};
use ginza_policy::sched::{Dispatcher, Request};
use ginza_sys::affinity::pin_current_thread;
use ginza_sys::cpulist;
use ginza_sys::sched_stat::SchedStat;

use crate::config::Config;
use crate::error::{ConfigError, JoinError, RuntimeError};
use crate::sched::{self, KthreadBody, Owner, Shared, SpareContext, URef};
use crate::task::{unqueued, unqueued_on, JoinHandle};
use worker::{Mailbox, Posted, Report, WorkerClock};

pub mod dispatched;
mod worker;

/// How the dispatcher preempts a request whose quantum is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preemption {
    /// Set the worker's flag; the request yields at its next preemption
    /// point. If it has not yielded `backstop` later, send a signal.
    Cooperative { backstop: Option<Duration> },
    /// Send the preemption signal at once.
    Signal,
}

impl Default for Preemption {
    fn default() -> Self {
        Preemption::Cooperative {
            backstop: Some(Duration::from_micros(50)),
        }
    }
}

/// Configuration of a Shinjuku-mode application.
#[derive(Clone, Debug)]
pub struct ShinjukuConfig {
    /// Worker kthreads (one request at a time each).
    pub workers: usize,
    /// Cores of the workers (worker `i` on `worker_cores[i % len]`); `None`:
    /// every allowed CPU.
    pub worker_cores: Option<Vec<usize>>,
    /// Core of the dispatcher thread; `None`: unpinned.
    pub dispatcher_core: Option<usize>,
    /// Queueing policy; times (quantum, SLOs) in nanoseconds.
    pub policy: SchedPolicy,
    pub preemption: Preemption,
    /// Usable bytes of each request's stack.
    pub stack_size: usize,
    /// How long an idle worker spins before it parks.
    pub idle_spin: Duration,
    /// Keep a [`PreemptionSample`] for every preemption (for benchmarks).
    pub record_preemptions: bool,
    /// The workers time their own cooperative preemptions on their TSC
    /// ([`ServeReport::worker_spans`]; a few TSC reads per preemption, so
    /// off by default and apart from runs that measure the loss).
    pub record_worker_spans: bool,
    /// Most requests in flight (admitted, not completed); an arrival over
    /// it is refused and counted in [`ServeReport::rejected`]. Must be > 0.
    pub max_in_flight: usize,
    /// Pre-assign the next request to a busy worker (the mailbox's second
    /// slot) when no worker is idle, so that it starts without waiting for
    /// the dispatcher's round trip (docs/runtime.md, "Shinjuku mode").
    pub pre_assign: bool,
    /// When the dispatcher asks a worker's request to yield, it puts the
    /// request the policy runs next in that worker's second slot at once
    /// (where the choice does not depend on the preempted request:
    /// `Dispatcher::next_behind_preempted`), so that the worker switches
    /// straight into it instead of idling through the round trip of its
    /// report and the next assignment (docs/runtime.md, "Shinjuku mode").
    pub pre_assign_on_preempt: bool,
    /// The dispatcher, with nothing running and no arrival for 10,000
    /// passes, gives its CPU away (`sched_yield`) before it polls again.
    /// Polite on a CPU shared with other programs, but there a yield may
    /// hand the CPU over for a scheduler slice (milliseconds) while
    /// requests arrive unseen; off, the dispatcher owns its CPU as in
    /// Shinjuku (benchmarks).
    pub yield_when_idle: bool,
}

impl Default for ShinjukuConfig {
    fn default() -> Self {
        ShinjukuConfig {
            workers: 1,
            worker_cores: None,
            dispatcher_core: None,
            policy: SchedPolicy::CPreSq {
                quantum: 10_000,
                placement: Placement::Tail,
            },
            preemption: Preemption::default(),
            stack_size: 64 * 1024,
            idle_spin: Duration::from_micros(50),
            record_preemptions: false,
            record_worker_spans: false,
            max_in_flight: 4096,
            pre_assign: false,
            pre_assign_on_preempt: true,
            yield_when_idle: true,
        }
    }
}

/// A request that has arrived.
#[derive(Debug)]
pub struct Arrival<Req> {
    /// Request class (the queue under c-PRE-MQ; 0 otherwise).
    pub class: usize,
    /// When it arrived, in ns since the start of [`serve`] (its latency is
    /// measured from here, so a generator passes the scheduled time).
    pub at_ns: u64,
    pub payload: Req,
}

/// Where requests come from: polled by the dispatcher on every pass.
pub trait Source<Req> {
    /// A request that has arrived by `now_ns` (ns since the start of
    /// [`serve`]), if any.
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<Req>>;
    /// True once no request will ever arrive again.
    fn is_done(&self) -> bool;
    /// Told of each admitted request that completed, once, by its id (as in
    /// [`Completion::id`], ids counting admitted requests from 0), as the
    /// dispatcher takes its worker's report. A source that bounds the
    /// requests it has outstanding counts completions here, on the
    /// dispatcher's thread, rather than in the handler, whose count every
    /// worker would write and the dispatcher read on every poll.
    fn completed(&mut self, id: u64) {
        let _ = id;
    }
}

/// A source whose requests are put in classes by a classifier (c-PRE-MQ's
/// queues): the class the inner source gave is replaced by `classify(&req)`.
pub struct Classified<S, C> {
    source: S,
    classify: C,
}

/// Wraps `source` so that each request's class is `classify(&request)`.
pub fn classify<Req, S, C>(source: S, classify: C) -> Classified<S, C>
where
    S: Source<Req>,
    C: FnMut(&Req) -> usize,
{
    Classified { source, classify }
}

impl<Req, S, C> Source<Req> for Classified<S, C>
where
    S: Source<Req>,
    C: FnMut(&Req) -> usize,
{
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<Req>> {
        let mut arrival = self.source.poll(now_ns)?;
        arrival.class = (self.classify)(&arrival.payload);
        Some(arrival)
    }
    fn is_done(&self) -> bool {
        self.source.is_done()
    }
    fn completed(&mut self, id: u64) {
        self.source.completed(id);
    }
}

/// One served request.
#[derive(Debug)]
pub struct Completion<Resp> {
    pub id: u64,
    pub class: usize,
    pub arrival_ns: u64,
    /// When the dispatcher took it from its source (ns since the start):
    /// `admitted_ns - arrival_ns` is how late the source was polled (a
    /// dispatcher that lost its CPU, or fell behind).
    pub admitted_ns: u64,
    /// When its worker reported it finished (ns since the start).
    pub finish_ns: u64,
    /// How many times it was preempted.
    pub preemptions: u32,
    /// Time it ran on a worker: from each switch into it to the report
    /// that it stopped, summed (ns). The rest of its latency it waited:
    /// queued, pre-assigned, or handed over.
    pub on_core_ns: u64,
    /// The handler's value, or its panic.
    pub result: Result<Resp, JoinError>,
}

impl<Resp> Completion<Resp> {
    pub fn latency_ns(&self) -> u64 {
        self.finish_ns.saturating_sub(self.arrival_ns)
    }
}

/// One preemption as the dispatcher saw it.
#[derive(Clone, Copy, Debug)]
pub struct PreemptionSample {
    /// The request was handed back after a signal (else after the flag alone).
    pub by_signal: bool,
    /// Dispatcher time spent asking: the flag store, or the flag store and
    /// `tgkill` (ns, the clock's own overhead subtracted).
    pub dispatcher_ns: u64,
    /// From the last ask (flag set, or signal sent) to the worker's report
    /// that the request is off its core (ns).
    pub handback_ns: u64,
    /// How late the dispatcher asked: from the end of the request's
    /// quantum to the first ask (ns; the dispatcher's pass, and a quantum
    /// spent while nothing waited).
    pub late_ns: u64,
    /// From the worker's report that the request is off its core to its
    /// switch into the next request (ns): the round trip through the
    /// dispatcher, or the hand-over of a pre-assigned request. `None` if
    /// the worker ran nothing next on this worker before the end.
    pub resume_ns: Option<u64>,
    /// The worker switched straight into a request pre-assigned behind
    /// this one.
    pub took_next: bool,
}

/// What [`serve`] did.
#[derive(Debug)]
pub struct ServeReport<Resp> {
    /// Every request, in completion order.
    pub completions: Vec<Completion<Resp>>,
    /// Preemptions taken at preemption points.
    pub coop_preemptions: u64,
    /// Preemptions applied by the signal handler (or at the end of a
    /// deferred section the signal arrived in).
    pub signal_preemptions: u64,
    /// Signals the dispatcher sent.
    pub signals_sent: u64,
    /// With `record_preemptions`: one sample per preemption.
    pub preemption_samples: Vec<PreemptionSample>,
    /// Requests refused (their payloads dropped, never run): at arrival,
    /// over `max_in_flight`, or when a worker was first to run them and no
    /// stack could be mapped for them.
    pub rejected: u64,
    /// Of `rejected`: those refused because no stack could be mapped.
    pub rejected_no_stack: u64,
    /// Stacks the dispatcher mapped for requests; the others reused the
    /// stack of a completed one. A request gets its stack when a worker
    /// first runs it, and up to `max_in_flight` spares are kept, so this is
    /// at most the most requests ever started and unfinished at once.
    pub stacks_mapped: u64,
    /// With `pre_assign`: requests put in a worker's second slot, and those
    /// of them the dispatcher took back before the worker took them.
    pub pre_assigned: u64,
    pub taken_back: u64,
    /// Of `pre_assigned`: those put behind a request being preempted
    /// (`pre_assign_on_preempt`).
    pub pre_assigned_on_preempt: u64,
    /// Preemptions the dispatcher never asked for: the worker reported a
    /// request preempted whose run it had neither flagged nor signalled (a
    /// request calling `yield_now` itself counts here too).
    pub unasked_preemptions: u64,
    /// With `record_worker_spans`: where the workers' cooperative
    /// preemptions took their time, from the workers' own TSC.
    pub worker_spans: Option<WorkerSpans>,
    /// What Linux gave the dispatcher and the workers while requests were
    /// served: CPU time, time runnable but waiting for a CPU, and the
    /// dispatcher's own view of the gaps in its loop.
    pub threads: ThreadTimes,
    pub elapsed: Duration,
}

/// The CPU the dispatcher and the workers got from Linux over the
/// dispatcher's loop (docs/runtime.md, "Shinjuku mode"). A thread that
/// shares its CPU with another program runs only part of the wall time;
/// these tell the runtime's delays from the machine's.
#[derive(Clone, Debug, Default)]
pub struct ThreadTimes {
    /// Wall time of the dispatcher's loop, ns.
    pub wall_ns: u64,
    /// The dispatcher's counters over its loop (`None`: unreadable).
    pub dispatcher: Option<ginza_sys::sched_stat::SchedStat>,
    /// Each worker's counters over the same span.
    pub workers: Vec<Option<ginza_sys::sched_stat::SchedStat>>,
    /// Passes of the dispatcher's loop.
    pub dispatcher_passes: u64,
    /// Gaps of more than [`DISPATCHER_STALL_NS`] between two passes (the
    /// thread was descheduled, or a pass was slow), their total and the
    /// longest, ns.
    pub dispatcher_stalls: u64,
    pub dispatcher_stalled_ns: u64,
    pub dispatcher_longest_stall_ns: u64,
    /// The stalls themselves, (start, length) in ns since the start of
    /// [`serve`] (the arrivals' clock), the first [`MAX_STALL_SPANS`]: a
    /// simulator can replay them (`ginza bench shinjuku`).
    pub dispatcher_stall_spans: Vec<(u64, u64)>,
    /// Times the dispatcher, with nothing running and no arrival for
    /// 10,000 passes, gave its CPU away (`sched_yield`,
    /// `ShinjukuConfig::yield_when_idle`), and of them those it got back
    /// only after a stall, with their total, ns.
    pub dispatcher_yields: u64,
    pub dispatcher_yield_stalls: u64,
    pub dispatcher_yield_stalled_ns: u64,
}

/// A gap between two passes of the dispatcher's loop longer than this
/// counts as a stall (a pass takes well under a µs).
pub const DISPATCHER_STALL_NS: u64 = 20_000;

/// Stalls kept with their times ([`ThreadTimes::dispatcher_stall_spans`]).
pub const MAX_STALL_SPANS: usize = 65_536;

/// Cooperative preemptions as the workers timed them with their own TSC
/// (`ShinjukuConfig::record_worker_spans`), all workers together
/// (docs/results.md, "Where a cooperative preemption's time goes"). The
/// worker's direct loss per preemption is `yield_out + handover +
/// switch_in`; `observe` is useful work (up to the next preemption point)
/// plus the ask's cache-line transfer.
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkerSpans {
    /// The dispatcher's store of the ask → found at a preemption point
    /// (two CPUs' TSCs).
    pub observe: Span,
    /// The ask found → the worker loop (the yield path, the switch out).
    pub yield_out: Span,
    /// The worker loop → switching into the next request (the report, the
    /// second slot, the stamps), for preemptions handed straight over.
    pub handover: Span,
    /// Switching into a request → its code runs again.
    pub switch_in: Span,
}

/// One span of a preemption over a run: the median is read from buckets
/// of a few ns; spans beyond the buckets' range (a few µs: the thread was
/// descheduled, most likely) are only counted, in `over`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Span {
    /// Spans in range.
    pub count: u64,
    pub median_ns: Option<f64>,
    /// Mean of the spans in range.
    pub mean_ns: Option<f64>,
    pub over: u64,
}

impl Span {
    fn of(
        rt: &Shared,
        hist: fn(&sched::WorkerSpans) -> &sched::SpanHistogram,
        ns_per_tick: f64,
    ) -> Span {
        let mut buckets = vec![0u64; sched::SpanHistogram::BUCKETS];
        let mut over = 0;
        for k in rt.kthreads.iter() {
            let (b, o) = hist(&k.spans).counts();
            for (sum, n) in buckets.iter_mut().zip(b) {
                *sum += u64::from(n);
            }
            over += o;
        }
        let count: u64 = buckets.iter().sum();
        let width = sched::SpanHistogram::WIDTH as f64 * ns_per_tick;
        // A bucket's spans are taken at its middle.
        let at = |i: usize| (i as f64 + 0.5) * width;
        let mut seen = 0;
        let median = (count > 0)
            .then(|| {
                buckets.iter().position(|&n| {
                    seen += n;
                    seen * 2 >= count
                })
            })
            .flatten()
            .map(at);
        let mean = (count > 0).then(|| {
            buckets
                .iter()
                .enumerate()
                .map(|(i, &n)| at(i) * n as f64)
                .sum::<f64>()
                / count as f64
        });
        Span {
            count,
            median_ns: median,
            mean_ns: mean,
            over,
        }
    }
}

impl WorkerSpans {
    fn sum(rt: &Shared, ns_per_tick: f64) -> WorkerSpans {
        WorkerSpans {
            observe: Span::of(rt, |s| &s.observe, ns_per_tick),
            yield_out: Span::of(rt, |s| &s.yield_out, ns_per_tick),
            handover: Span::of(rt, |s| &s.handover, ns_per_tick),
            switch_in: Span::of(rt, |s| &s.switch_in, ns_per_tick),
        }
    }

    /// The worker's direct loss per preemption, ns: the medians of the
    /// yield out, the hand-over and the switch in.
    pub fn direct_ns_per_preemption(&self) -> Option<f64> {
        Some(self.yield_out.median_ns? + self.handover.median_ns? + self.switch_in.median_ns?)
    }
}

struct InFlight<Req, Resp> {
    context: Context<Req, Resp>,
    preemptions: u32,
    /// Time on a worker so far (ns).
    on_core_ns: u64,
    /// When the dispatcher took it from the source (ns since the start).
    admitted_ns: u64,
}

/// A request's execution context. It is made when a worker first gets the
/// request, not at admission: a queue of thousands then holds payloads, not
/// thousands of mapped stacks, and the dispatcher maps none while a burst
/// arrives.
enum Context<Req, Resp> {
    /// Admitted, never given to a worker: its payload.
    Unmade(Req),
    Made {
        uthread: URef,
        /// None for a uthread a request spawned: its spawner holds the
        /// handle, and it is scheduled like a request but not reported as
        /// one.
        handle: Option<JoinHandle<Resp>>,
    },
}

impl<Req, Resp> InFlight<Req, Resp> {
    /// The context of a request that has been given to a worker.
    fn made(&self) -> URef {
        match &self.context {
            Context::Made { uthread, .. } => *uthread,
            Context::Unmade(_) => unreachable!("a request given to a worker has its context"),
        }
    }
}

struct Running<Req, Resp> {
    request: Request<InFlight<Req, Resp>>,
    /// Dispatcher ns spent asking for the preemption, and when it last asked.
    ask_ns: u64,
    asked_at: u64,
    /// The stamp the ask named (the run's start as last read).
    asked_stamp: u64,
    flagged: bool,
    flagged_at: u64,
    /// When the last preemption signal went out, if any.
    signaled_at: Option<u64>,
    /// From the end of its quantum to the first ask (ns).
    late_ns: u64,
}

impl<Req, Resp> Running<Req, Resp> {
    fn new(request: Request<InFlight<Req, Resp>>) -> Self {
        Running {
            request,
            ask_ns: 0,
            asked_at: 0,
            asked_stamp: 0,
            flagged: false,
            flagged_at: 0,
            signaled_at: None,
            late_ns: 0,
        }
    }
}

fn policy_error(message: String) -> RuntimeError {
    RuntimeError::Config(ConfigError::Policy(message))
}

fn check_policy(policy: &SchedPolicy) -> Result<(), RuntimeError> {
    match policy {
        SchedPolicy::CFcfs => Ok(()),
        SchedPolicy::CPreSq { quantum, .. } if *quantum == 0 => {
            Err(policy_error("c-PRE-SQ quantum must be > 0 ns".into()))
        }
        SchedPolicy::CPreSq { .. } => Ok(()),
        SchedPolicy::CPreMq { quantum, classes } => {
            if *quantum == 0 {
                return Err(policy_error("c-PRE-MQ quantum must be > 0 ns".into()));
            }
            if classes.is_empty() {
                return Err(policy_error(
                    "c-PRE-MQ needs at least one request class".into(),
                ));
            }
            if let Some(i) = classes.iter().position(|c| c.slo == 0) {
                return Err(policy_error(format!(
                    "c-PRE-MQ class {i} has an SLO of 0 ns"
                )));
            }
            Ok(())
        }
    }
}

/// Serves every request `source` produces with `handler`, each in its own
/// uthread context, scheduled by `config.policy`; returns when the source is
/// done and every request has completed.
pub fn serve<Req, Resp, S, H>(
    config: ShinjukuConfig,
    mut source: S,
    handler: H,
) -> Result<ServeReport<Resp>, RuntimeError>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    S: Source<Req> + Send,
    H: Fn(Req) -> Resp + Send + Sync + 'static,
{
    check_policy(&config.policy)?;
    if config.max_in_flight == 0 {
        return Err(policy_error(
            "max_in_flight must be > 0 (no request could ever be admitted)".into(),
        ));
    }
    let n_classes = match &config.policy {
        SchedPolicy::CPreMq { classes, .. } => classes.len(),
        _ => 1,
    };
    let plan = Config {
        kthreads: config.workers,
        cores: config.worker_cores.clone(),
        stack_size: config.stack_size,
        spin_before_park: config.idle_spin,
        iokernel: None,
        protected: None,
        time_slice: None,
    }
    .plan()?;
    if let Some(core) = config.dispatcher_core {
        let allowed = crate::config::allowed_cpus()?;
        if !allowed.contains(&core) {
            return Err(ConfigError::UnknownCore {
                core,
                allowed: cpulist::format(&allowed.into_iter().collect::<Vec<_>>()),
            }
            .into());
        }
    }
    let mailboxes: Arc<[Mailbox]> = (0..plan.cores.len()).map(|_| Mailbox::default()).collect();
    let record_spans = config.record_worker_spans;
    let worker_body: KthreadBody = {
        let mailboxes = Arc::clone(&mailboxes);
        Arc::new(move |owner: &mut Owner<'_>| {
            let id = owner.kthread().id;
            owner.kthread().spans.on.set(record_spans);
            worker::run(owner, &mailboxes[id])
        })
    };
    let ticks_at_start = (
        ginza_sys::tsc_clock::ticks(),
        ginza_sys::clock::monotonic_ns(),
    );
    let started_workers =
        crate::runtime::start(&plan, sched::Mode::Worker, "ginza-w", None, worker_body)?;
    let rt = Arc::clone(&started_workers.rt);
    rt.keep_spare_stacks(config.max_in_flight);
    let handler = KeptHandler::new(handler);
    let handler_ref = handler.reference();
    let started = Instant::now();
    let outcome = std::thread::scope(|scope| {
        let rt = &rt;
        let config = &config;
        std::thread::Builder::new()
            .name("ginza-dispatch".into())
            .spawn_scoped(scope, move || {
                if let Some(core) = config.dispatcher_core {
                    if let Err(e) = pin_current_thread(core) {
                        log::warn!("dispatcher: cannot pin to core {core}: {e}");
                    }
                }
                dispatch(rt, &mailboxes, config, n_classes, &mut source, handler_ref)
            })
            .map_err(|e| RuntimeError::Start(format!("cannot start the dispatcher: {e}")))?
            .join()
            .map_err(|p| RuntimeError::MainPanicked(crate::error::panic_message(&*p)))?
    });
    started_workers.stop();
    handler.workers_stopped();
    let worker_spans = record_spans.then(|| {
        let ticks = ginza_sys::tsc_clock::ticks().wrapping_sub(ticks_at_start.0);
        let ns = ginza_sys::clock::monotonic_ns().saturating_sub(ticks_at_start.1);
        let ns_per_tick = if ticks > 0 {
            ns as f64 / ticks as f64
        } else {
            1.0
        };
        WorkerSpans::sum(&rt, ns_per_tick)
    });
    let Served {
        completions,
        signals_sent,
        samples: preemption_samples,
        rejected,
        rejected_no_stack,
        pre_assigned,
        taken_back,
        pre_assigned_on_preempt,
        unasked_preemptions,
        threads,
    } = outcome?;
    Ok(ServeReport {
        completions,
        preemption_samples,
        rejected,
        rejected_no_stack,
        stacks_mapped: rt.request_stacks_mapped.load(Relaxed),
        pre_assigned,
        taken_back,
        pre_assigned_on_preempt,
        unasked_preemptions,
        worker_spans,
        threads,
        coop_preemptions: rt
            .kthreads
            .iter()
            .map(|k| k.stats.coop_preemptions.load(Relaxed))
            .sum(),
        signal_preemptions: rt
            .kthreads
            .iter()
            .map(|k| k.stats.preemptions.load(Relaxed))
            .sum(),
        signals_sent,
        elapsed: started.elapsed(),
    })
}

/// The handler, kept by [`serve`] until its workers have stopped, so that
/// requests may call it through a plain pointer ([`HandlerRef`]): a
/// reference count raised by the dispatcher and lowered by a worker for
/// every request would move a cache line between them twice a request.
/// Should `serve` unwind before the workers stop, the handler is leaked,
/// never freed under a running request.
struct KeptHandler<H> {
    handler: Option<Box<H>>,
}

impl<H> KeptHandler<H> {
    fn new(handler: H) -> Self {
        KeptHandler {
            handler: Some(Box::new(handler)),
        }
    }

    fn reference(&self) -> HandlerRef<H> {
        HandlerRef(self.handler.as_deref().expect("the handler is kept") as *const H)
    }

    /// No request can run any more: the handler may be freed.
    fn workers_stopped(mut self) {
        drop(self.handler.take());
    }
}

impl<H> Drop for KeptHandler<H> {
    fn drop(&mut self) {
        // Reached with the handler still here only by unwinding, with the
        // workers perhaps still running requests that call it.
        if let Some(handler) = self.handler.take() {
            std::mem::forget(handler);
        }
    }
}

/// A request's way to its handler (see [`KeptHandler`]).
struct HandlerRef<H>(*const H);

impl<H> Clone for HandlerRef<H> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<H> Copy for HandlerRef<H> {}

// SAFETY: it only ever gives out `&H`, and H is Sync (the handler is
// called from every worker at once).
unsafe impl<H: Sync> Send for HandlerRef<H> {}

impl<H> HandlerRef<H> {
    fn call<Req, Resp>(self, request: Req) -> Resp
    where
        H: Fn(Req) -> Resp,
    {
        // SAFETY: `serve` keeps the handler until its workers have stopped
        // (or leaks it), and requests run only on its workers.
        let handler = unsafe { &*self.0 };
        handler(request)
    }
}

/// Makes requests' contexts as workers first get them (see [`Context`]): a
/// completed request's context with its stack, else a fresh one on a spare
/// stack or a new mapping. A request whose stack cannot be mapped is
/// refused (its payload dropped, counted) and the dispatcher goes on.
struct Contexts {
    /// Contexts of completed requests, with their stacks (up to `keep`;
    /// beyond, a context and its stack are freed).
    spare: Vec<SpareContext>,
    keep: usize,
    /// The identity the next context gets (see `blocked` in `dispatch`).
    next_serial: u64,
    /// Requests refused for want of a stack.
    refused: u64,
}

impl Contexts {
    fn new(keep: usize) -> Contexts {
        Contexts {
            spare: Vec::new(),
            keep,
            next_serial: 1,
            refused: 0,
        }
    }

    /// A completed request's context, for the next one.
    fn keep(&mut self, spare: SpareContext) {
        if self.spare.len() < self.keep {
            self.spare.push(spare);
        }
    }

    fn serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial - 1
    }

    /// `request` with its context made (or as it was, if it had one), and
    /// that context; `None` if it was refused.
    fn make<Req, Resp, H>(
        &mut self,
        mut request: Request<InFlight<Req, Resp>>,
        rt: *const Shared,
        handler: HandlerRef<H>,
    ) -> Option<(Request<InFlight<Req, Resp>>, URef)>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        H: Fn(Req) -> Resp + Send + Sync + 'static,
    {
        let payload = match request.payload.context {
            Context::Made { uthread, .. } => return Some((request, uthread)),
            Context::Unmade(payload) => payload,
        };
        let run = move || handler.call(payload);
        let (uthread, handle) = if let Some(spare) = self.spare.pop() {
            unqueued_on(spare, run)
        } else {
            let stack = if testing::take_stack_map_failure() {
                Err(std::io::Error::from(std::io::ErrorKind::OutOfMemory))
            } else {
                // SAFETY: `rt` is the runtime `serve` keeps alive while it
                // dispatches.
                unsafe { &*rt }.stack_for_request()
            };
            match stack {
                Ok(stack) => {
                    let (uthread, handle) = unqueued(rt, run);
                    uthread.give_stack(stack);
                    (uthread, handle)
                }
                Err(e) => {
                    if self.refused == 0 {
                        log::warn!(
                            "shinjuku: cannot map a request stack ({e}): refusing requests \
                             until one can be (check vm.max_map_count and memory, or lower \
                             max_in_flight)"
                        );
                    }
                    self.refused += 1;
                    return None;
                }
            }
        };
        uthread.set_serial(self.serial());
        request.payload.context = Context::Made {
            uthread,
            handle: Some(handle),
        };
        Some((request, uthread))
    }
}

/// Shortest interval between two preemption signals to one worker.
const RESEND_MIN_NS: u64 = 50_000;

/// What the dispatcher's loop hands back to [`serve`].
struct Served<Resp> {
    completions: Vec<Completion<Resp>>,
    signals_sent: u64,
    samples: Vec<PreemptionSample>,
    rejected: u64,
    rejected_no_stack: u64,
    pre_assigned: u64,
    taken_back: u64,
    pre_assigned_on_preempt: u64,
    unasked_preemptions: u64,
    threads: ThreadTimes,
}

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

/// The dispatcher's loop: arrivals in, decisions out, no application code.
fn dispatch<Req, Resp, S, H>(
    rt: &Arc<Shared>,
    mailboxes: &[Mailbox],
    config: &ShinjukuConfig,
    n_classes: usize,
    source: &mut S,
    handler: HandlerRef<H>,
) -> Result<Served<Resp>, RuntimeError>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    S: Source<Req>,
    H: Fn(Req) -> Resp + Send + Sync + 'static,
{
    let rt_ptr = Arc::as_ptr(rt);
    let mut queues: Dispatcher<InFlight<Req, Resp>> = Dispatcher::new(config.policy.clone());
    let mut running: Vec<Option<Running<Req, Resp>>> =
        (0..rt.kthreads.len()).map(|_| None).collect();
    // Pre-assigned behind the running request (only where one runs).
    let mut pending: Vec<Option<Request<InFlight<Req, Resp>>>> =
        (0..rt.kthreads.len()).map(|_| None).collect();
    // Keyed by the serial the dispatcher gives each context, not by its
    // address: a finished request's address is reused by the next one.
    let mut blocked: HashMap<u64, Request<InFlight<Req, Resp>>> = HashMap::new();
    let mut woken_early: HashSet<u64> = HashSet::new();
    let mut completions = Vec::new();
    let mut next_id = 0u64;
    let mut signals_sent = 0u64;
    let mut idle_passes = 0u32;
    let mut samples: Vec<PreemptionSample> = Vec::new();
    // Requests admitted and not completed (spawned uthreads not counted:
    // their spawner holds them), and those refused.
    let mut in_flight = 0usize;
    let mut rejected = 0u64;
    let mut pre_assigned = 0u64;
    let mut taken_back = 0u64;
    let mut pre_assigned_on_preempt = 0u64;
    let mut unasked_preemptions = 0u64;
    // Per worker: the sample of the preemption it last reported, and
    // when, until the worker's next start fills in its `resume_ns`.
    let mut resume_of: Vec<Option<(usize, u64)>> = vec![None; rt.kthreads.len()];
    let clock_overhead = if config.record_preemptions {
        clock_overhead_ns()
    } else {
        0
    };
    let mut clock = WorkerClock::new(rt);
    let mut thread_clock = ThreadClock::new(rt, clock.now_ns());
    let mut contexts = Contexts::new(config.max_in_flight);
    loop {
        let now = clock.now_ns();
        thread_clock.pass(rt, now);
        let mut progress = false;

        while let Some(arrival) = source.poll(now) {
            if arrival.class >= n_classes {
                return Err(policy_error(format!(
                    "request {next_id} has class {}, but the policy has {n_classes} class(es)",
                    arrival.class
                )));
            }
            progress = true;
            if in_flight >= config.max_in_flight {
                rejected += 1;
                continue;
            }
            in_flight += 1;
            let request = Request {
                id: next_id,
                class: arrival.class,
                arrival: arrival.at_ns,
                payload: InFlight {
                    context: Context::Unmade(arrival.payload),
                    preemptions: 0,
                    on_core_ns: 0,
                    admitted_ns: now,
                },
            };
            queues.enqueue(request, now);
            next_id += 1;
        }

        // Requests that blocked and are runnable again (woken, or their sleep ended).
        if !rt.timers_only_at_switch_checks.load(Relaxed) {
            // The look at each worker's next deadline is inline (its own
            // line, shared while no timer changes); the call only if one is set.
            for k in rt.kthreads.iter().filter(|k| k.timers.any()) {
                sched::fire_timers_to_dispatcher(k);
            }
        }
        // Looked at first: a steal from an empty queue costs a full fence.
        while !rt.injector.is_empty() {
            let Steal::Success(u) = rt.injector.steal() else {
                continue;
            };
            let key = u.serial();
            if let Some(request) = blocked.remove(&key) {
                queues.enqueue(request, now);
            } else if u.never_ran() {
                debug_assert_eq!(key, 0, "a spawned uthread seen twice before it ran");
                u.set_serial(contexts.serial());
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
                queues.enqueue(spawned, now);
            } else {
                // Woken before its worker's report reached us.
                woken_early.insert(key);
            }
            progress = true;
        }

        for (w, mailbox) in mailboxes.iter().enumerate() {
            let Some(Posted {
                report,
                at: finished_at,
                started_at,
                took_next,
                spare,
            }) = mailbox.take_report()
            else {
                continue;
            };
            if let Some(spare) = spare {
                contexts.keep(spare);
            }
            let run = running[w]
                .take()
                .expect("a worker reported without an assignment");
            // This request's start ends the gap after the worker's last
            // preemption.
            if let Some((i, off)) = resume_of[w].take() {
                if let Some(sample) = samples.get_mut(i) {
                    sample.resume_ns = Some(started_at.saturating_sub(off));
                }
            }
            // The pre-assigned request, if any, is the worker's next if it
            // took it as it reported. Otherwise (it looked before the
            // request was put there, or it was preempted unasked and left
            // an ordinary pre-assignment alone) the request goes back to
            // the head of its queue before the stopped one is requeued, and
            // the policy chooses again.
            if let Some(next) = pending[w].take() {
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
                    running[w] = Some(next_run);
                } else {
                    mailbox
                        .take_back()
                        .expect("a pre-assigned request left its slot unreported");
                    queues.put_back(next);
                    taken_back += 1;
                }
            } else {
                debug_assert!(!took_next, "a worker took a request never pre-assigned");
            }
            let mut request = run.request;
            request.payload.on_core_ns += finished_at.saturating_sub(started_at);
            match report {
                Report::Completed => {
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
                        in_flight -= 1;
                        source.completed(request.id);
                        completions.push(Completion {
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
                Report::Preempted => {
                    if !run.flagged && run.signaled_at.is_none() {
                        unasked_preemptions += 1;
                    }
                    if config.record_preemptions {
                        resume_of[w] = Some((samples.len(), finished_at));
                        samples.push(PreemptionSample {
                            by_signal: run.signaled_at.is_some(),
                            dispatcher_ns: run.ask_ns,
                            handback_ns: finished_at.saturating_sub(run.asked_at),
                            late_ns: run.late_ns,
                            resume_ns: None,
                            took_next,
                        });
                    }
                    request.payload.preemptions += 1;
                    queues.requeue_preempted(request, now);
                }
                Report::Blocked => {
                    let key = request.payload.made().serial();
                    if woken_early.remove(&key) {
                        queues.enqueue(request, now);
                    } else {
                        blocked.insert(key, request);
                    }
                }
            }
            progress = true;
        }

        for (w, slot) in running.iter_mut().enumerate() {
            let Some(run) = slot else { continue };
            // Nothing to preempt for (no quantum, nothing waiting): the
            // worker's line is not read.
            if queues.quantum().is_none() || (queues.is_empty() && pending[w].is_none()) {
                continue;
            }
            let k = &rt.kthreads[w];
            let started = mailboxes[w].started_ns();
            let spent = |q: u64| now.saturating_sub(started) >= q;
            if started == 0
                || !(queues.should_preempt(started, now)
                    || (pending[w].is_some() && queues.quantum().is_some_and(spent)))
            {
                continue;
            }
            // The request pre-assigned here goes back to the queue, so the
            // policy places it and the preempted one (docs/runtime.md).
            if !run.flagged && pending[w].is_some() && mailboxes[w].take_back().is_some() {
                if let Some(request) = pending[w].take() {
                    queues.put_back(request);
                    taken_back += 1;
                }
            }
            // A signal can land where it cannot act (the worker was
            // descheduled before switching into the request, say), so one
            // is sent again each `period` until the request is handed back;
            // never faster than RESEND_MIN_NS, since a delivery alone costs
            // microseconds and a flood would nest handlers without end.
            let (period, first_after) = match config.preemption {
                Preemption::Signal => (queues.quantum().unwrap_or(u64::MAX).max(RESEND_MIN_NS), 0),
                Preemption::Cooperative { backstop: None } => (u64::MAX, u64::MAX),
                Preemption::Cooperative { backstop: Some(b) } => {
                    let b = b.as_nanos().min(u64::MAX as u128) as u64;
                    (b.max(RESEND_MIN_NS), b)
                }
            };
            let signal_now = match run.signaled_at {
                None => {
                    first_after != u64::MAX
                        && (first_after == 0
                            || (run.flagged && now.saturating_sub(run.flagged_at) >= first_after))
                }
                Some(at) => now.saturating_sub(at) >= period,
            };
            // The request the policy runs next goes to the worker's second
            // slot before the flag is set, so that the worker finds it
            // however fast it yields (docs/runtime.md, pre-assignment at
            // the ask).
            if !run.flagged && config.pre_assign_on_preempt && pending[w].is_none() {
                let behind = loop {
                    let Some(request) =
                        queues.next_behind_preempted(run.request.class, run.request.arrival, now)
                    else {
                        break None;
                    };
                    match contexts.make(request, rt_ptr, handler) {
                        Some(made) => break Some(made),
                        None => in_flight -= 1,
                    }
                };
                if let Some((request, uthread)) = behind {
                    mailboxes[w].pre_assign_behind_preempted(uthread);
                    pending[w] = Some(request);
                    pre_assigned += 1;
                    pre_assigned_on_preempt += 1;
                }
            }
            if !run.flagged || signal_now {
                let asking = config.record_preemptions.then(Instant::now);
                if !run.flagged {
                    // The ask names this run by its start stamp: should
                    // the worker have switched to its next run meanwhile,
                    // that run finds an ask for another and drops it
                    // (`PreemptAsk`), so no later run yields for it.
                    let ticks = if config.record_worker_spans {
                        ginza_sys::tsc_clock::ticks()
                    } else {
                        0
                    };
                    k.preempt_ask.ask_run(started, ticks);
                    run.asked_stamp = started;
                    run.flagged = true;
                    run.flagged_at = now;
                    run.late_ns =
                        now.saturating_sub(started.saturating_add(queues.quantum().unwrap_or(0)));
                }
                if signal_now {
                    let tid = k.tid.load(Relaxed);
                    if tid != 0 && crate::signals::send_preempt(tid).is_ok() {
                        signals_sent += 1;
                    }
                    run.signaled_at = Some(now);
                }
                if let Some(t) = asking {
                    run.ask_ns += (t.elapsed().as_nanos() as u64).saturating_sub(clock_overhead);
                    run.asked_at = clock.now_ns();
                }
            }
        }

        for (w, slot) in running.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            // The queue's head, else a request pre-assigned to a busy
            // worker that has not taken it yet.
            let next = loop {
                let request = queues.next_for_idle_worker(now).or_else(|| {
                    (0..mailboxes.len()).find_map(|v| {
                        if pending[v].is_some() && mailboxes[v].take_back().is_some() {
                            taken_back += 1;
                            pending[v].take()
                        } else {
                            None
                        }
                    })
                });
                let Some(request) = request else {
                    break None;
                };
                match contexts.make(request, rt_ptr, handler) {
                    Some(made) => break Some(made),
                    None => in_flight -= 1,
                }
            };
            let Some((request, uthread)) = next else {
                break;
            };
            mailboxes[w].assign(&rt.kthreads[w], uthread);
            *slot = Some(Running::new(request));
            progress = true;
        }

        if config.pre_assign {
            for (w, slot) in pending.iter_mut().enumerate() {
                // Not behind a request being preempted: the policy places
                // it beside the others once it is back (the take-back above).
                if slot.is_some() || running[w].as_ref().is_none_or(|r| r.flagged) {
                    continue;
                }
                let Some(request) = queues.next_for_idle_worker(now) else {
                    break;
                };
                progress = true;
                let Some((request, uthread)) = contexts.make(request, rt_ptr, handler) else {
                    in_flight -= 1;
                    continue;
                };
                mailboxes[w].pre_assign(uthread);
                *slot = Some(request);
                pre_assigned += 1;
            }
        }

        if source.is_done()
            && queues.is_empty()
            && blocked.is_empty()
            && running.iter().all(Option::is_none)
        {
            return Ok(Served {
                completions,
                signals_sent,
                samples,
                rejected: rejected + contexts.refused,
                rejected_no_stack: contexts.refused,
                pre_assigned,
                taken_back,
                pre_assigned_on_preempt,
                unasked_preemptions,
                threads: thread_clock.finish(rt),
            });
        }
        if progress {
            idle_passes = 0;
        } else {
            idle_passes = idle_passes.saturating_add(1);
            if config.yield_when_idle && idle_passes > 10_000 && running.iter().all(Option::is_none)
            {
                // Nothing in flight: let other threads have this core.
                let before = rt.now_ns();
                std::thread::yield_now();
                let t = &mut thread_clock.times;
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
}

/// Test hooks that force interleavings the dispatcher otherwise wins by
/// speed (for regression tests). Not a stable API.
#[doc(hidden)]
pub mod testing {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    use crate::deferral;
    use crate::sched;

    /// From now on, the timers of the calling request's runtime fire only
    /// at a worker's periodic check in its switch path (every 32nd pass),
    /// neither in the dispatcher nor in an idle worker. A no-op outside a
    /// runtime.
    pub fn fire_timers_only_at_switch_checks() {
        if let Some(rt) = sched::current_shared() {
            rt.timers_only_at_switch_checks.store(true, Relaxed);
        }
    }

    /// Process-wide: stacks the dispatcher is still to fail to map.
    static STACK_MAP_FAILURES: AtomicU64 = AtomicU64::new(0);

    /// Process-wide: the next `n` request stacks any dispatcher maps fail
    /// as if the mapping did (for a test binary of its own: it affects every
    /// runtime in the process).
    pub fn fail_next_stack_maps(n: u64) {
        STACK_MAP_FAILURES.store(n, Relaxed);
    }

    /// Whether this stack mapping is to fail (uses one failure up).
    pub(super) fn take_stack_map_failure() -> bool {
        STACK_MAP_FAILURES.load(Relaxed) != 0
            && STACK_MAP_FAILURES
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }

    /// The calling worker's next pass through its switch path (the request
    /// blocks, yields or returns) takes the periodic check.
    pub fn check_timers_at_next_switch() {
        let _deferred = deferral::Guard::new();
        sched::check_timers_at_next_switch();
    }
}
