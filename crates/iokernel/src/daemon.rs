//! iokerneld's main loop: the control socket, the table of registered
//! applications, and the allocation pass.
//!
//! This module holds the loop and the state it shares; each mechanism has
//! its own submodule:
//! * [`control`]: the control socket, registration and its refusals,
//!   removal;
//! * [`packets`]: the dataplane's turn in the loop;
//! * [`pass`]: the allocation pass, its decisions carried out, hand-overs;
//! * [`stats`]: counts, cost histograms and the stats report;
//! * [`publish`]: the figures the metrics endpoint serves, refreshed every
//!   [`crate::metrics::PUBLISH_EVERY`] (docs/metrics.md).
//!
//! Everything runs on one thread. The control socket and the connections
//! are non-blocking and polled with a zero-timeout `ppoll` every
//! `control_interval` (50 µs by default), not every pass: registration is
//! rare and a `ppoll` costs about a microsecond, so checking every 5 µs pass
//! would spend a fifth of the core on it. Polls that find nothing ready
//! double the gap to the next, up to [`MAX_CONTROL_GAP`] (1 ms), and one
//! that finds something brings it back: a busy control plane is served
//! every 50 µs, a quiet one costs the loop one `ppoll` per millisecond. A separate control thread would
//! need a lock or a channel around the application table that the pass
//! reads every 5 µs, and a hang-up would reach the allocator one hand-over
//! later; on one thread, a closed socket removes the application before the
//! next pass, with no synchronization at all. Registration itself (fstat,
//! mmap, a few /proc reads) takes tens of microseconds, once per
//! application.
//!
//! Once nothing has been runnable for `idle_after` (no kthread holds a
//! core, nothing is queued, no traffic), the loop sleeps until an event
//! ([`idle`], docs/iokernel-idle.md) unless `spin` is set. Where it cannot
//! (an application registered without a bell, a protected-mode channel,
//! a load run), `idle_sleep`, when set, naps in `ppoll` on the sockets
//! instead of spinning, so a new connection still wakes it at once.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ginza_policy::alloc::{AppSnap, CoreAllocator, Decision, Shenango, Slow, Static, Topology};
use ginza_shm::{IokernelEnd, Region, WakePage};
use log::info;

use crate::actuator::CoreActuator;
use crate::config::{Config, PolicyKind};
use crate::dataplane::{AppNet, Dataplane, FaultsHandle, GeneratorHandle};
use ginza_proto::messages::{Class, Removal, StatsReport};
use ginza_sys::tsc_clock::TscClock;
use ginza_sys::{affinity, clock, cpulist, signal, topology};

mod control;
mod dispatch;
mod idle;
mod idle_yield;
mod own_socket;
mod packets;
mod pass;
mod protected;
mod publish;
mod self_wake;
mod stats;
mod tx_yield;

use idle_yield::IdleYield;
use pass::{Handover, PassKind};
use stats::Meter;
pub use stats::{summarize, HIST_MAX_NS};
use tx_yield::TxYield;

/// Most kthreads per application (the region's limit).
pub const MAX_KTHREADS: u32 = ginza_shm::region::MAX_KTHREADS;
/// Buffers of a real NIC's pool.
const NIC_BUFFERS: usize = 4096;
/// Connections that have not registered yet, at most.
pub const MAX_PENDING: usize = 64;
/// A connection that sends nothing this long is closed.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(5);
/// Removals remembered for stats.
const RECENT_REMOVALS: usize = 16;
/// The longest gap between two control polls of a spinning loop: polls
/// that find nothing ready double the gap from `control_interval` up to
/// this (docs/results.md, "Dataplane": a `ppoll` was 5 % of a forwarding
/// loop's time at one per 50 µs).
pub const MAX_CONTROL_GAP: Duration = Duration::from_millis(1);
/// Target utilization of the `slow` policy.
pub const SLOW_TARGET_UTIL: f64 = 0.8;

/// Why iokerneld could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("another iokerneld is already listening on {0}")]
    AlreadyRunning(PathBuf),
    #[error("{op} {path}: {source}")]
    Socket {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot pin iokerneld to core {core}: {source}")]
    Pin {
        core: usize,
        #[source]
        source: io::Error,
    },
    #[error("polling the control socket: {0}")]
    Poll(#[source] io::Error),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("opening NIC {spec}: {source}")]
    Nic {
        spec: String,
        #[source]
        source: crate::nic::linux::NicError,
    },
}

/// iokerneld's bookkeeping for one kthread.
#[derive(Clone, Debug, Default)]
struct Kthread {
    /// Policy core index it holds (granted, not yet given back).
    core: Option<usize>,
    parked: bool,
    parked_since: u64,
    last_core: Option<usize>,
    /// From its `Started`. Until then a kthread on the wake page is not
    /// granted (`Iokerneld::pass_inner`: its grant could be lost).
    tid: Option<i32>,
    /// The CPU its thread was last pinned to by a grant, while nothing can
    /// have moved it ([`crate::actuator::Target::pinned`]).
    pinned: Option<usize>,
    /// Its `Started` came while it held a core granted before its tid was
    /// known (so not pinned): pinned after the drains
    /// (`Iokerneld::pin_started`).
    started_unpinned: bool,
    /// Deadline it reported when it parked.
    timer: Option<u64>,
    /// Asked to give its core back; neither active nor parked.
    preempting: bool,
    /// When it was asked (for a kthread preempted while it polled, when
    /// it was last seen polling: `check_overdue`).
    preempt_since: u64,
    /// Moved off its core after missing the preemption deadline.
    evicted: bool,
    /// Runs under `SCHED_IDLE` (read when it reported its tid): a core it
    /// is asked to give back can go to its receiver at once
    /// (`Config::handover_from_idle_at_once`).
    idle_class: bool,
    /// Preempted while it polled while idle (docs/idle-poll.md): its queue
    /// line said so in the atomic step that set `PREEMPT_PENDING`, so it
    /// runs nothing before it gives the core back; the core goes to the
    /// receiver at once, and `preempt_deadline` counts from the first pass
    /// that saw its line no longer say it polls (`left_polling_seen`).
    preempted_polling: bool,
    /// A pass has seen the kthread preempted while it polled out of the
    /// polling state (`check_overdue`).
    left_polling_seen: bool,
    /// `LineFlags::CORE_WANTED` as last written on its line.
    core_wanted: bool,
    /// `LineFlags::SELF_WAKE_ALLOWED` as last written on its line.
    self_wake_allowed: bool,
    /// Frames on the own socket while it is left to wake itself: the rx
    /// ring's consumer index and when a pass first saw them wait there
    /// (`own_socket::counted`).
    own_rx_waiting: Option<(u32, u64)>,
    /// Its `SelfWoken` was read this pass and not yet accounted (granted
    /// the core of the CPU it runs on, or revoked: `self_wake.rs`).
    self_woke: bool,
    /// The grant that waits for this kthread to give its core back.
    handover: Option<Handover>,
    /// A `SCHED_IDLE` victim not signalled yet: when it will be, unless
    /// the core comes back first and the preemption is withdrawn
    /// (`Config::idle_victim_grace`).
    signal_due: Option<u64>,
    /// Granted a core still held by a preempted kthread (this application
    /// id, kthread): not woken yet, so it cannot answer a preemption.
    awaiting: Option<(u64, usize)>,
    /// It parked or yielded since its egress ring was last found empty:
    /// drain the ring once more (only active kthreads' rings are polled).
    drain_egress: bool,
    /// Its steals, from its queue line.
    steals: stats::StealCount,
    /// Its requests' latency as its runtime reports it (untrusted; read at
    /// each metrics publication).
    latency: ginza_shm::LatencyTally,
    /// Its grants' numbers: which `Parked`/`Yielded` answers the current
    /// one.
    grants: pass::GrantNumbers,
}

struct App {
    id: u64,
    name: String,
    class: Class,
    guaranteed: u32,
    max_cores: u32,
    pid: i32,
    sock: OwnedFd,
    _region: Region,
    ends: Vec<IokernelEnd>,
    eventfds: Vec<OwnedFd>,
    /// The eventfd it rings when it gives a sleeping iokerneld work
    /// (`Registration::bell`, docs/iokernel-idle.md); without one,
    /// iokerneld does not sleep while it is registered.
    bell: Option<OwnedFd>,
    /// The wake page and the slot of kthread 0, if it sleeps on the page
    /// (`Registration::wake_page`): it is woken there, not by its eventfd,
    /// and its kthreads can answer local wakes.
    wake: Option<(Arc<WakePage>, u32)>,
    kt: Vec<Kthread>,
    last_yielded_core: Option<usize>,
    /// When a pass last granted it a core (`AppSnap::granted_lately`).
    last_granted_ns: Option<u64>,
    grants: u64,
    preemptions: u64,
    congestion: u64,
    /// `Parked` messages taken.
    parks: u64,
    ring_full: u64,
    preempt_overdue: u64,
    /// `Parked`/`Yielded` that answered a grant already answered: ignored.
    stale_parks: u64,
    /// Set when the application must be removed, with the reason.
    doomed: Option<String>,
    /// Its address, port and ingress pool, if it registered one.
    net: Option<AppNet>,
    /// A protected-mode netstack's channels (docs/protected.md).
    protects: Vec<protected::ProtectLink>,
    /// Its request queues, when iokerneld dispatches its requests.
    dispatch: Option<dispatch::AppDispatch>,
}

impl App {
    fn doom(&mut self, reason: String) {
        if self.doomed.is_none() {
            self.doomed = Some(reason);
        }
    }

    /// A call on kthread `k`'s thread (a signal, its affinity) failed with
    /// `e`. `ESRCH` says the thread no longer exists: the kthread can
    /// neither give its core back nor run again, so the application is
    /// removed at the next reap, once, rather than asked again every
    /// deadline (a SIGKILLed process whose connection had not closed yet
    /// was signalled once a millisecond for minutes, a warning each time;
    /// docs/results.md, "Session 36"). Any other failure is logged as
    /// `what` (made only then) says.
    fn thread_call_failed(&mut self, k: usize, e: &std::io::Error, what: impl FnOnce() -> String) {
        if e.raw_os_error() != Some(libc::ESRCH) {
            log::warn!("{}: {e}", what());
            return;
        }
        let tid = self.kt.get(k).and_then(|kt| kt.tid);
        let reason = format!(
            "kthread {k}'s thread (tid {}) no longer exists",
            tid.map_or_else(|| "?".to_string(), |t| t.to_string())
        );
        if self.doomed.is_none() {
            log::warn!("app {:?}: {reason}; removing it", self.name);
        }
        self.doom(reason);
    }

    fn cores(&self) -> Vec<usize> {
        self.kt.iter().filter_map(|k| k.core).collect()
    }

    /// Steals of its kthreads (as far as believed).
    fn steals(&self) -> u64 {
        self.kt.iter().map(|k| k.steals.total).sum()
    }
}

struct Pending {
    sock: OwnedFd,
    pid: i32,
    since: u64,
}

/// A handle that stops a running iokerneld from another thread (waking
/// it if it sleeps).
#[derive(Clone, Debug, Default)]
pub struct StopHandle(Arc<AtomicBool>, crate::loop_waker::LoopWaker);

impl StopHandle {
    pub fn stop(&self) {
        self.0.store(true, Ordering::Release);
        self.1.wake();
    }
}

/// Set by SIGINT/SIGTERM once [`Iokerneld::stop_on_signals`] installed the
/// handler.
static TERMINATE: AtomicBool = AtomicBool::new(false);
/// The loop waker's eventfd while a loop watches the signals (-1: none): a
/// signal that lands just before the loop's `ppoll` would not interrupt
/// it, so the handler rings the waker too.
static TERMINATE_WAKER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_terminate(_: i32) {
    TERMINATE.store(true, Ordering::Release);
    let fd = TERMINATE_WAKER.load(Ordering::Acquire);
    if fd >= 0 {
        ginza_sys::eventfd::write_from_signal_handler(fd);
    }
}

/// A bound iokerneld, ready to [`Iokerneld::run`].
pub struct Iokerneld<A: CoreActuator> {
    cfg: Config,
    listener: OwnedFd,
    pending: Vec<Pending>,
    apps: Vec<App>,
    next_id: u64,
    alloc: Box<dyn CoreAllocator + Send>,
    topo: Topology,
    actuator: A,
    stop: StopHandle,
    watch_signals: bool,
    start_ns: u64,
    passes: u64,
    refused: u64,
    disconnected: u64,
    removals: VecDeque<Removal>,
    /// Every netstack channel by its protected application.
    protected_pids: Vec<protected::ProtectedApp>,
    snaps: Vec<AppSnap>,
    decisions: Vec<Decision>,
    /// Per application of `snaps`: another one is left wanting a core
    /// only this one's could give (`ginza_policy::alloc::wanted_elsewhere`).
    wanted: Vec<bool>,
    /// Hand-overs whose core is free now.
    ready: Vec<Handover>,
    /// Some preempted kthread's hand-over waits for its `Yielded`: the loop
    /// reads those kthreads' rings every turn, not only at passes.
    handover_waiting: bool,
    /// Preemption signals to `SCHED_IDLE` victims whose core went on at
    /// once: sent after the pass's wakes, so the receiver's wake does not
    /// wait behind them (application id, kthread, CPU).
    signal_after_wakes: Vec<(u64, usize, usize)>,
    /// Local wakes asked of `SCHED_IDLE` victims (`Config::local_wake_wait`):
    /// the victim (application id, kthread), the woken kthread (application
    /// id, kthread) and when iokerneld wakes it itself.
    doorbells: Vec<pass::Doorbell>,
    /// The futex words kthreads of applications that ask for it sleep on
    /// (docs/runtime.md, "Local wakes"); none if it could not be made.
    wake_page: Option<Arc<WakePage>>,
    pollfds: Vec<libc::pollfd>,
    /// From the last pass: something holds a core or is queued.
    busy: bool,
    /// From the last pass: a kthread holds a core and polls while idle. It
    /// rings the bell of a loop that announced its sleep, never of one that
    /// naps (`idle_sleep`), so the loop does not nap while one polls.
    polled: bool,
    /// From the last pass: earliest timer of a parked kthread.
    next_timer: Option<u64>,
    /// Per policy core index: the application that was last granted it.
    core_holder: Vec<Option<u64>>,
    meter: Meter,
    dp: Dataplane,
    /// Applications (ids) that were sent a packet while holding no core:
    /// the policy hears of them at once ([`CoreAllocator::on_work_for`]).
    work_arrived: Vec<u64>,
    /// Their indices in `apps` at the pass that tells the policy (scratch).
    work_arrived_at: Vec<usize>,
    /// The loop's clock: the TSC where the kernel trusts it (one read per
    /// turn; `clock_gettime` cost 9–19 % of a spinning loop here,
    /// docs/results.md, "Dataplane").
    clock: TscClock,
    /// When to hand the CPU over after a NIC transmit.
    tx_yield: TxYield,
    idle_yield: IdleYield,
    /// The metrics endpoint (`--metrics`), if served.
    metrics: Option<crate::metrics::Endpoint>,
    /// Sleeping while idle, and its counts.
    idle: idle::Idle,
}

/// Hyperthread siblings among the managed cores, from sysfs (flat if
/// unknown).
pub fn topology(cores: &[usize]) -> Topology {
    let mut t = Topology::flat(cores.len());
    for (i, &c) in cores.iter().enumerate() {
        let Ok(sibs) = topology::thread_siblings(c) else {
            continue;
        };
        t.sibling[i] = sibs
            .iter()
            .filter(|&&s| s != c)
            .find_map(|s| cores.iter().position(|x| x == s));
    }
    t
}

fn make_policy(cfg: &Config) -> Box<dyn CoreAllocator + Send> {
    let iv = cfg.interval.as_nanos() as u64;
    match cfg.policy {
        PolicyKind::Shenango => Box::new(
            Shenango::new(iv, cfg.seed).with_min_residency(cfg.min_residency.as_nanos() as u64),
        ),
        PolicyKind::Static => Box::new(Static::new(iv)),
        PolicyKind::Slow { period } => Box::new(Slow::new(
            period.as_nanos() as u64,
            SLOW_TARGET_UTIL,
            cfg.seed,
        )),
    }
}

impl<A: CoreActuator> Iokerneld<A> {
    /// Binds the control socket of an already validated configuration.
    pub fn bind(cfg: Config, actuator: A) -> Result<Self, DaemonError> {
        // The NIC first: a refusal leaves no socket file behind.
        let nic = match crate::nic::linux::NicSpec::parse(&cfg.nic) {
            Ok(crate::nic::linux::NicSpec::Software) => None,
            _ => {
                let link = crate::nic::linux::open(
                    &cfg.nic,
                    NIC_BUFFERS,
                    ginza_shm::PKT_BUFFER_SIZE as usize,
                )
                .map_err(|source| DaemonError::Nic {
                    spec: cfg.nic.clone(),
                    source,
                })?;
                info!("iokerneld: NIC {}", cfg.nic);
                Some((cfg.nic.clone(), link))
            }
        };
        // Before the control socket too: a refusal leaves no socket file.
        let metrics = match cfg.metrics {
            None => None,
            Some(addr) => {
                let ep = crate::metrics::Endpoint::bind(addr)
                    .map_err(|source| DaemonError::Metrics { addr, source })?;
                info!("iokerneld: metrics at http://{}/metrics", ep.local_addr());
                Some(ep)
            }
        };
        let listener = control::bind(&cfg.socket)?;
        info!(
            "iokerneld: listening on {}, managing cores {}, policy {}, interval {:?}, steering {}",
            cfg.socket.display(),
            cpulist::format(&cfg.cores),
            cfg.policy.name(),
            cfg.interval,
            cfg.steering
        );
        let start_ns = clock::monotonic_ns();
        let mut dp = Dataplane::new(nic);
        dp.set_steering_options(cfg.steering_options.clone(), cfg.flow_warm_up);
        if !cfg.faults.is_empty() {
            for rule in &cfg.faults {
                info!("iokerneld: fault injection {rule}");
            }
            dp.set_faults(cfg.faults.clone());
        }
        // Without it, every application is woken by its eventfd.
        let wake_page = WakePage::create()
            .map_err(|e| log::warn!("iokerneld: no wake page ({e}): kthreads are woken by their eventfds, no local wakes"))
            .ok()
            .map(Arc::new);
        Ok(Iokerneld {
            topo: topology(&cfg.cores),
            core_holder: vec![None; cfg.cores.len()],
            // The first window is iokerneld's life: its CPU time is all of
            // `loop_cpu_ns` (the loop thread's, which may not be this one).
            meter: Meter::new(start_ns, 0),
            alloc: make_policy(&cfg),
            tx_yield: TxYield::new(cfg.yield_after_nic_tx),
            // Only on a core of its own: a kthread granted iokerneld's CPU
            // would take it for a time slice while waiting for frames that
            // only the loop moves (daemon::idle_yield).
            idle_yield: IdleYield::new(cfg.yield_while_idle && cfg.own_core.is_some()),
            idle: idle::Idle::new(!cfg.spin, cfg.idle_after),
            stop: StopHandle(Arc::default(), dp.waker().clone()),
            cfg,
            listener,
            pending: Vec::new(),
            apps: Vec::new(),
            next_id: 1,
            actuator,
            watch_signals: false,
            start_ns,
            passes: 0,
            refused: 0,
            disconnected: 0,
            removals: VecDeque::new(),
            protected_pids: Vec::new(),
            snaps: Vec::new(),
            decisions: Vec::new(),
            wanted: Vec::new(),
            ready: Vec::new(),
            handover_waiting: false,
            signal_after_wakes: Vec::new(),
            doorbells: Vec::new(),
            wake_page,
            pollfds: Vec::new(),
            busy: false,
            polled: false,
            next_timer: None,
            dp,
            work_arrived: Vec::new(),
            work_arrived_at: Vec::new(),
            clock: TscClock::new(),
            metrics,
        })
    }

    /// Runs loads on the software NIC's traffic generator.
    pub fn generator(&self) -> GeneratorHandle {
        self.dp.generator_handle()
    }

    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Changes the fault injection of the running loop (`--faults`).
    pub fn faults_handle(&self) -> FaultsHandle {
        self.dp.faults_handle()
    }

    /// Makes SIGINT and SIGTERM stop the loop (the binary does this).
    pub fn stop_on_signals(&mut self) -> io::Result<()> {
        signal::install_handler(libc::SIGINT, on_terminate)?;
        signal::install_handler(libc::SIGTERM, on_terminate)?;
        if let Some(fd) = self.dp.waker().fd() {
            use std::os::fd::AsRawFd;
            TERMINATE_WAKER.store(fd.as_raw_fd(), Ordering::Release);
        }
        self.watch_signals = true;
        Ok(())
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Where the metrics are served (`--metrics`; the port the kernel chose
    /// for port 0), if they are.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|m| m.local_addr())
    }

    /// Runs until stopped (or `run_for` elapsed); returns the final stats.
    pub fn run(mut self) -> Result<StatsReport, DaemonError> {
        if let Some(core) = self.cfg.own_core {
            affinity::pin_current_thread(core)
                .map_err(|source| DaemonError::Pin { core, source })?;
            info!("iokerneld: pinned to core {core}");
        }
        if let Some(m) = &mut self.metrics {
            m.loop_tid = ginza_sys::process::gettid();
        }
        let iv = self.cfg.interval.as_nanos() as u64;
        let ci = self.cfg.control_interval.as_nanos() as u64;
        // Polls that find nothing double the gap to the next, up to
        // `MAX_CONTROL_GAP`; anything found brings it back to `ci`.
        let max_gap = ci.max(MAX_CONTROL_GAP.as_nanos() as u64);
        let mut control_gap = ci;
        let start = self.clock.now_ns();
        let end = self
            .cfg
            .run_for
            .map(|d| start.saturating_add(d.as_nanos() as u64));
        let mut next_pass = start;
        let mut next_control = start;
        loop {
            if self.stop.0.load(Ordering::Acquire)
                || (self.watch_signals && TERMINATE.load(Ordering::Acquire))
            {
                break;
            }
            let now = self.clock.now_ns();
            if end.is_some_and(|e| now >= e) {
                break;
            }
            let control_due = now >= next_control;
            if control_due {
                control_gap = if self.control(Some(Duration::ZERO), now)? {
                    ci
                } else {
                    (control_gap * 2).min(max_gap)
                };
                next_control = now + control_gap;
            }
            // A compare per turn; the copy every `PUBLISH_EVERY`.
            if self.metrics.as_ref().is_some_and(|m| m.due(now)) {
                self.publish_metrics(now);
            }
            self.dataplane(now, control_due);
            if now >= next_pass {
                self.pass(now, PassKind::Interval);
                next_pass += iv;
                if next_pass <= now {
                    next_pass = now + iv;
                }
            } else if !self.work_arrived.is_empty() {
                self.pass(now, PassKind::WorkArrived);
            } else if self.handover_waiting {
                self.poll_handovers(now);
            }
            if !self.doorbells.is_empty() {
                self.answer_doorbells(now, false);
            }
            if self.idle_turn(now, end)? {
                // Whatever woke it is handled from the next turn on: the
                // sockets polled, a pass run, the links polled.
                let now = self.clock.now_ns();
                control_gap = ci;
                next_control = now;
                next_pass = next_pass.min(now);
                continue;
            }
            match self.cfg.idle_sleep {
                Some(sleep) if !self.busy && !self.polled && !self.dp.busy() => {
                    // A load run asked for while idle is seen here, or
                    // after at most one sleep.
                    self.dp.poll_links(now, true);
                    if self.dp.busy() {
                        continue;
                    }
                    let mut wait = sleep.as_nanos() as u64;
                    if let Some(t) = self.next_timer {
                        wait = wait.min(t.saturating_sub(now));
                    }
                    if let Some(e) = end {
                        wait = wait.min(e.saturating_sub(now));
                    }
                    if let Some(due) = self.finish_publication(now) {
                        wait = wait.min(due.saturating_sub(now));
                    }
                    self.control(Some(Duration::from_nanos(wait)), now)?;
                    let now = self.clock.now_ns();
                    control_gap = ci;
                    next_control = now + ci;
                    next_pass = next_pass.min(now);
                }
                _ => {
                    let (rx, tx) = self.dp.nic_frames();
                    let after_tx = self.tx_yield.after_turn(rx, tx);
                    if after_tx || self.yield_after_idle_turn((rx, tx), now) {
                        ginza_sys::sched_class::yield_cpu();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        let report = self.report(clock::monotonic_ns());
        let ids: Vec<u64> = self.apps.iter().map(|a| a.id).collect();
        for id in ids {
            self.remove(id, "iokerneld stopped".into());
        }
        info!("iokerneld: stopped after {} passes", report.passes);
        Ok(report)
    }
}

impl<A: CoreActuator> Drop for Iokerneld<A> {
    fn drop(&mut self) {
        if self.watch_signals {
            TERMINATE_WAKER.store(-1, Ordering::Release);
        }
        let _ = std::fs::remove_file(&self.cfg.socket);
    }
}
