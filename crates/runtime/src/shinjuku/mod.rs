//! Shinjuku mode: preemptive request scheduling inside an application,
//! without Dune.
//!
//! One dispatcher thread (never running application code) owns the request
//! queues — the `ginza-policy`
//! [`Dispatcher`](ginza_policy::sched::Dispatcher), the same object the
//! simulator runs — and hands request contexts to worker kthreads through
//! per-worker cache-line mailboxes. A worker runs one request at a time and
//! reports, through its mailbox, whether it completed, was preempted, or
//! blocked.
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

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_policy::sched::Request;
pub use ginza_policy::sched::{ClassConfig, Placement, SchedPolicy};
use ginza_sys::affinity::pin_current_thread;
use ginza_sys::cpulist;

use crate::config::Config;
use crate::error::{ConfigError, JoinError, RuntimeError};
use crate::sched::{self, KthreadBody, Owner, Shared, SpareContext, URef};
use crate::task::{unqueued, unqueued_on, JoinHandle};
use dispatcher::Dispatch;
use worker::Mailbox;

pub mod dispatched;
mod dispatcher;
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
                Dispatch::new(rt, &mailboxes, config, n_classes, &mut source, handler_ref).run()
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
    /// The identity the next context gets (see `Dispatch::blocked`).
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
