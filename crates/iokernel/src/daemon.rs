//! iokerneld's main loop: the control socket, the table of registered
//! applications, and the allocation pass.
//!
//! Everything runs on one thread. The control socket and the connections
//! are non-blocking and polled with a zero-timeout `ppoll` every
//! `control_interval` (50 µs by default), not every pass: registration is
//! rare and a `ppoll` costs about a microsecond, so checking every 5 µs pass
//! would spend a fifth of the core on it. A separate control thread would
//! need a lock or a channel around the application table that the pass
//! reads every 5 µs, and a hang-up would reach the allocator one hand-over
//! later; on one thread, a closed socket removes the application before the
//! next pass, with no synchronization at all. Registration itself (fstat,
//! mmap, a few /proc reads) takes tens of microseconds, once per
//! application.
//!
//! When `idle_sleep` is set and nothing is runnable (no application, or no
//! kthread holds a core and nothing is queued), the loop sleeps in `ppoll`
//! on the sockets instead of spinning, so a new connection still wakes it
//! at once.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ginza_policy::alloc::{
    AppSnap, CoreAllocator, Decision, KthreadSnap, Shenango, Slow, Static, Topology,
};
use ginza_shm::{
    IokernelEnd, LineFlags, PreemptReason, RecvError, Region, SendError, ToIokernel, ToKthread,
};
use hdrhistogram::Histogram;
use log::{debug, info, warn};

use crate::actuator::{CoreActuator, Target};
use crate::config::{format_cores, Config, PolicyKind};
use crate::dataplane::{AppNet, Dataplane, GeneratorHandle};
use crate::proto::{
    decode_request, encode, AllocStats, AppStats, Class, Latency, Registration, Removal, Request,
    Response, StatsReport, MAX_NAME, MAX_REQUEST,
};
use crate::sys;

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
/// Registered applications, at most.
pub const MAX_APPS: usize = 256;
/// Target utilization of the `slow` policy.
pub const SLOW_TARGET_UTIL: f64 = 0.8;
/// Longest duration the cost histograms tell apart; longer samples count
/// as this, so recording never resizes (allocates) in the loop. A
/// hand-over ends by the preemption deadline (at most 10 s).
pub const HIST_MAX_NS: u64 = 60_000_000_000;
/// Significant digits of the cost histograms: 0.1 %, about 220 KiB each.
const HIST_SIGFIG: u8 = 3;

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
    tid: Option<i32>,
    /// Deadline it reported when it parked.
    timer: Option<u64>,
    /// Asked to give its core back; neither active nor parked.
    preempting: bool,
    /// When it was asked.
    preempt_since: u64,
    /// Moved off its core after missing the preemption deadline.
    evicted: bool,
    /// The grant that waits for this kthread to give its core back.
    handover: Option<Handover>,
    /// Granted a core still held by a preempted kthread (this application
    /// id, kthread): not woken yet, so it cannot answer a preemption.
    awaiting: Option<(u64, usize)>,
    /// It parked or yielded since its egress ring was last found empty:
    /// drain the ring once more (only active kthreads' rings are polled).
    drain_egress: bool,
}

/// A grant whose core is still held by a preempted kthread: carried out
/// when that kthread reports `Yielded`/`Parked`, misses its deadline, or
/// its application goes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Handover {
    app_id: u64,
    kthread: usize,
    core: usize,
    /// When the victim was preempted (CLOCK_MONOTONIC).
    preempted_ns: u64,
}

/// A cost histogram (ns).
fn histogram() -> Histogram<u64> {
    // Constant bounds, checked by a unit test.
    Histogram::new_with_bounds(1, HIST_MAX_NS, HIST_SIGFIG).expect("valid histogram bounds")
}

/// The summary of a cost histogram that goes into the stats.
pub fn summarize(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency::default();
    }
    Latency {
        count: h.len(),
        p50_ns: h.value_at_quantile(0.5),
        p99_ns: h.value_at_quantile(0.99),
        max_ns: h.max(),
        mean_ns: h.mean().round() as u64,
    }
}

/// The allocator's counts and costs over the current stats window
/// ([`AllocStats`]).
struct Meter {
    since_ns: u64,
    since_cpu_ns: u64,
    grants: u64,
    preemptions: u64,
    reallocations: u64,
    handovers: u64,
    handovers_abandoned: u64,
    /// Wakes, preemptions and evictions carried out (never reset): a pass
    /// that changed it acted.
    actions: u64,
    grant_cost: Histogram<u64>,
    pass_acted: Histogram<u64>,
    pass_idle: Histogram<u64>,
    handover: Histogram<u64>,
}

impl Meter {
    fn new(now: u64, cpu: u64) -> Self {
        Meter {
            since_ns: now,
            since_cpu_ns: cpu,
            grants: 0,
            preemptions: 0,
            reallocations: 0,
            handovers: 0,
            handovers_abandoned: 0,
            actions: 0,
            grant_cost: histogram(),
            pass_acted: histogram(),
            pass_idle: histogram(),
            handover: histogram(),
        }
    }

    /// Starts a new window (in place: no allocation).
    fn reset(&mut self, now: u64, cpu: u64) {
        self.since_ns = now;
        self.since_cpu_ns = cpu;
        self.grants = 0;
        self.preemptions = 0;
        self.reallocations = 0;
        self.handovers = 0;
        self.handovers_abandoned = 0;
        self.grant_cost.reset();
        self.pass_acted.reset();
        self.pass_idle.reset();
        self.handover.reset();
    }

    fn report(&self, now: u64, cpu: u64) -> AllocStats {
        AllocStats {
            window_ns: now.saturating_sub(self.since_ns),
            window_cpu_ns: cpu.saturating_sub(self.since_cpu_ns),
            grants: self.grants,
            preemptions: self.preemptions,
            reallocations: self.reallocations,
            handovers: self.handovers,
            handovers_abandoned: self.handovers_abandoned,
            grant_cost: summarize(&self.grant_cost),
            pass_cost_with_decisions: summarize(&self.pass_acted),
            pass_cost_idle: summarize(&self.pass_idle),
            handover: summarize(&self.handover),
        }
    }
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
    kt: Vec<Kthread>,
    last_yielded_core: Option<usize>,
    grants: u64,
    preemptions: u64,
    congestion: u64,
    ring_full: u64,
    preempt_overdue: u64,
    /// Set when the application must be removed, with the reason.
    doomed: Option<String>,
    /// Its address, port and ingress pool, if it registered one.
    net: Option<AppNet>,
}

impl App {
    fn doom(&mut self, reason: String) {
        if self.doomed.is_none() {
            self.doomed = Some(reason);
        }
    }

    fn cores(&self) -> Vec<usize> {
        self.kt.iter().filter_map(|k| k.core).collect()
    }
}

struct Pending {
    sock: OwnedFd,
    pid: i32,
    since: u64,
}

/// A handle that stops a running iokerneld from another thread.
#[derive(Clone, Debug, Default)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    pub fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Set by SIGINT/SIGTERM once [`Iokerneld::stop_on_signals`] installed the
/// handler.
static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: i32) {
    TERMINATE.store(true, Ordering::Release);
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
    snaps: Vec<AppSnap>,
    decisions: Vec<Decision>,
    /// Hand-overs whose core is free now.
    ready: Vec<Handover>,
    pollfds: Vec<libc::pollfd>,
    /// From the last pass: something holds a core or is queued.
    busy: bool,
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
}

/// What an allocation pass asks of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PassKind {
    /// The periodic pass ([`CoreAllocator::pass`]).
    Interval,
    /// Packets reached applications with no core
    /// ([`CoreAllocator::on_work_for`]).
    WorkArrived,
}

/// Hyperthread siblings among the managed cores, from sysfs (flat if
/// unknown).
pub fn topology(cores: &[usize]) -> Topology {
    let mut t = Topology::flat(cores.len());
    for (i, &c) in cores.iter().enumerate() {
        let p = format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list");
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        let Ok(sibs) = crate::config::parse_cores(text.trim()) else {
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
        PolicyKind::Shenango => Box::new(Shenango::new(iv, cfg.seed)),
        PolicyKind::Static => Box::new(Static::new(iv)),
        PolicyKind::Slow { period } => Box::new(Slow::new(
            period.as_nanos() as u64,
            SLOW_TARGET_UTIL,
            cfg.seed,
        )),
    }
}

fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "application name must be 1 to {MAX_NAME} bytes, got {}",
            name.len()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    {
        return Err(format!(
            "application name {name:?} may only use ASCII letters, digits and - _ . :"
        ));
    }
    Ok(())
}

fn bind(path: &std::path::Path) -> Result<OwnedFd, DaemonError> {
    let err = |op, source| DaemonError::Socket {
        op,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| err("create directory for", e))?;
        }
    }
    if path.exists() {
        // A live iokerneld answers a connect; a stale socket file does not.
        if sys::connect_seqpacket(path).is_ok() {
            return Err(DaemonError::AlreadyRunning(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(|e| err("remove stale socket", e))?;
    }
    sys::listen_seqpacket(path, 64).map_err(|e| err("listen on", e))
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
        let listener = bind(&cfg.socket)?;
        info!(
            "iokerneld: listening on {}, managing cores {}, policy {}, interval {:?}",
            cfg.socket.display(),
            format_cores(&cfg.cores),
            cfg.policy.name(),
            cfg.interval
        );
        let start_ns = sys::monotonic_ns();
        Ok(Iokerneld {
            topo: topology(&cfg.cores),
            core_holder: vec![None; cfg.cores.len()],
            // The first window is iokerneld's life: its CPU time is all of
            // `loop_cpu_ns` (the loop thread's, which may not be this one).
            meter: Meter::new(start_ns, 0),
            alloc: make_policy(&cfg),
            cfg,
            listener,
            pending: Vec::new(),
            apps: Vec::new(),
            next_id: 1,
            actuator,
            stop: StopHandle::default(),
            watch_signals: false,
            start_ns,
            passes: 0,
            refused: 0,
            disconnected: 0,
            removals: VecDeque::new(),
            snaps: Vec::new(),
            decisions: Vec::new(),
            ready: Vec::new(),
            pollfds: Vec::new(),
            busy: false,
            next_timer: None,
            dp: Dataplane::new(nic),
            work_arrived: Vec::new(),
            work_arrived_at: Vec::new(),
        })
    }

    /// Runs loads on the software NIC's traffic generator.
    pub fn generator(&self) -> GeneratorHandle {
        self.dp.generator_handle()
    }

    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Makes SIGINT and SIGTERM stop the loop (the binary does this).
    pub fn stop_on_signals(&mut self) -> io::Result<()> {
        sys::install_handler(libc::SIGINT, on_terminate)?;
        sys::install_handler(libc::SIGTERM, on_terminate)?;
        self.watch_signals = true;
        Ok(())
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Runs until stopped (or `run_for` elapsed); returns the final stats.
    pub fn run(mut self) -> Result<StatsReport, DaemonError> {
        if let Some(core) = self.cfg.own_core {
            sys::set_affinity(0, core).map_err(|source| DaemonError::Pin { core, source })?;
            info!("iokerneld: pinned to core {core}");
        }
        let iv = self.cfg.interval.as_nanos() as u64;
        let ci = self.cfg.control_interval.as_nanos() as u64;
        let start = sys::monotonic_ns();
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
            let now = sys::monotonic_ns();
            if end.is_some_and(|e| now >= e) {
                break;
            }
            let control_due = now >= next_control;
            if control_due {
                self.control(Some(Duration::ZERO), now)?;
                next_control = now + ci;
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
            }
            match self.cfg.idle_sleep {
                Some(sleep) if !self.busy && !self.dp.busy() => {
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
                    self.control(Some(Duration::from_nanos(wait)), now)?;
                    let now = sys::monotonic_ns();
                    next_control = now + ci;
                    next_pass = next_pass.min(now);
                }
                _ => std::hint::spin_loop(),
            }
        }
        let report = self.report(sys::monotonic_ns());
        let ids: Vec<u64> = self.apps.iter().map(|a| a.id).collect();
        for id in ids {
            self.remove(id, "iokerneld stopped".into());
        }
        info!("iokerneld: stopped after {} passes", report.passes);
        Ok(report)
    }

    // ----- control socket -----

    /// Polls the listener and every connection (waiting at most `timeout`)
    /// and handles what is ready.
    fn control(&mut self, timeout: Option<Duration>, now: u64) -> Result<(), DaemonError> {
        let ev = libc::POLLIN;
        self.pollfds.clear();
        self.pollfds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: ev,
            revents: 0,
        });
        for p in &self.pending {
            self.pollfds.push(libc::pollfd {
                fd: p.sock.as_raw_fd(),
                events: ev,
                revents: 0,
            });
        }
        for a in &self.apps {
            self.pollfds.push(libc::pollfd {
                fd: a.sock.as_raw_fd(),
                events: ev,
                revents: 0,
            });
        }
        let n = sys::poll(&mut self.pollfds, timeout).map_err(DaemonError::Poll)?;
        let now = if timeout.is_some_and(|t| !t.is_zero()) {
            sys::monotonic_ns()
        } else {
            now
        };
        if n > 0 {
            let np = self.pending.len();
            let ready: Vec<bool> = self.pollfds.iter().map(|p| p.revents != 0).collect();
            // Apps first (indices stay valid: removal happens after).
            for (i, _) in ready[1 + np..].iter().enumerate().filter(|(_, r)| **r) {
                self.app_readable(i);
            }
            let mut keep = Vec::with_capacity(np);
            let pending = std::mem::take(&mut self.pending);
            for (p, r) in pending.into_iter().zip(&ready[1..1 + np]) {
                if *r {
                    if let Some(p) = self.pending_readable(p, now) {
                        keep.push(p);
                    }
                } else {
                    keep.push(p);
                }
            }
            self.pending = keep;
            if ready[0] {
                self.accept(now);
            }
            self.reap();
            self.complete_handovers();
        }
        // Silent connections do not hold a slot forever.
        let limit = PENDING_TIMEOUT.as_nanos() as u64;
        self.pending.retain(|p| {
            let keep = now.saturating_sub(p.since) < limit;
            if !keep {
                debug!(
                    "closing a connection from pid {} that sent nothing for {PENDING_TIMEOUT:?}",
                    p.pid
                );
            }
            keep
        });
        Ok(())
    }

    fn accept(&mut self, now: u64) {
        for _ in 0..16 {
            match sys::accept(self.listener.as_fd()) {
                Ok(Some(sock)) => {
                    let pid = sys::peer_pid(sock.as_fd()).unwrap_or(0);
                    if self.pending.len() >= MAX_PENDING {
                        warn!("refusing a connection from pid {pid}: {MAX_PENDING} connections already pending");
                        self.refused += 1;
                        continue;
                    }
                    self.pending.push(Pending {
                        sock,
                        pid,
                        since: now,
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    warn!("accept on the control socket: {e}");
                    break;
                }
            }
        }
    }

    /// Sends a reply; false if the peer is gone or not reading.
    fn reply(sock: &OwnedFd, r: &Response) -> bool {
        Self::reply_with_fds(sock, r, &[])
    }

    fn reply_with_fds(sock: &OwnedFd, r: &Response, fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
        match sys::send_with_fds(sock.as_fd(), &encode(r), fds) {
            Ok(()) => true,
            Err(e) => {
                debug!("reply not sent: {e}");
                false
            }
        }
    }

    /// A pending connection is readable: a request, garbage or a hang-up.
    /// Returns the connection if it stays open (a stats reader).
    fn pending_readable(&mut self, p: Pending, now: u64) -> Option<Pending> {
        let mut buf = [0u8; MAX_REQUEST];
        let max_fds = 1 + MAX_KTHREADS as usize;
        let r = match sys::recv_with_fds(p.sock.as_fd(), &mut buf, max_fds, true) {
            Ok(Some(r)) => r,
            Ok(None) => return Some(p),
            Err(e) => {
                debug!("connection from pid {}: {e}", p.pid);
                return None;
            }
        };
        if r.closed {
            return None;
        }
        let refuse = |me: &mut Self, reason: String| {
            warn!("registration from pid {} refused: {reason}", p.pid);
            me.refused += 1;
            Self::reply(&p.sock, &Response::Refused { reason });
            None
        };
        if r.truncated {
            return refuse(self, format!("request longer than {MAX_REQUEST} bytes"));
        }
        if r.fds_truncated {
            return refuse(self, format!("more than {max_fds} descriptors attached"));
        }
        let req = match decode_request(&buf[..r.len]) {
            Ok(req) => req,
            Err(e) => return refuse(self, e.to_string()),
        };
        match req {
            Request::Stats | Request::ResetStats => {
                let rep = self.stats_answer(&req, now);
                Self::reply(&p.sock, &rep).then_some(p)
            }
            Request::Register(reg) => match self.admit(&reg, r.fds, p.pid) {
                Ok((region, ends, eventfds)) => {
                    let id = self.next_id;
                    let net = match reg
                        .net
                        .map(|iface| self.attach_net(&reg.name, iface, &region))
                    {
                        None => None,
                        Some(Ok(net)) => Some(net),
                        Some(Err(reason)) => return refuse(self, reason),
                    };
                    let accepted = Response::Accepted {
                        app_id: id,
                        ingress_buffers: net.as_ref().map_or(0, |n| n.pool().count()),
                    };
                    let fds: Vec<_> = net.iter().map(|n| n.pool().fd()).collect();
                    let sent = Self::reply_with_fds(&p.sock, &accepted, &fds);
                    if !sent {
                        if let Some(net) = &net {
                            self.dp.detach(net);
                        }
                        info!(
                            "app {:?} from pid {} left before its acceptance",
                            reg.name, p.pid
                        );
                        return None;
                    }
                    self.next_id += 1;
                    info!(
                        "app {:?} registered: id {id}, pid {}, {:?}, {} kthreads, guaranteed {}, max {}",
                        reg.name, p.pid, reg.class, reg.kthreads, reg.guaranteed, reg.max_cores
                    );
                    let n = reg.kthreads as usize;
                    self.apps.push(App {
                        id,
                        name: reg.name,
                        class: reg.class,
                        guaranteed: reg.guaranteed,
                        max_cores: reg.max_cores,
                        pid: p.pid,
                        sock: p.sock,
                        _region: region,
                        ends,
                        eventfds,
                        kt: vec![
                            Kthread {
                                parked: true,
                                parked_since: now,
                                ..Default::default()
                            };
                            n
                        ],
                        last_yielded_core: None,
                        grants: 0,
                        preemptions: 0,
                        congestion: 0,
                        ring_full: 0,
                        preempt_overdue: 0,
                        doomed: None,
                        net,
                    });
                    None
                }
                Err(reason) => refuse(self, reason),
            },
        }
    }

    /// Checks a registration and its descriptors; on success the attached
    /// region, iokerneld's ends of it and the eventfds.
    #[allow(clippy::type_complexity)]
    fn admit(
        &self,
        reg: &Registration,
        fds: Vec<OwnedFd>,
        pid: i32,
    ) -> Result<(Region, Vec<IokernelEnd>, Vec<OwnedFd>), String> {
        valid_name(&reg.name)?;
        if self.apps.len() >= MAX_APPS {
            return Err(format!("{MAX_APPS} applications are already registered"));
        }
        if self.apps.iter().any(|a| a.name == reg.name) {
            return Err(format!(
                "an application named {:?} is already registered",
                reg.name
            ));
        }
        if reg.kthreads == 0 || reg.kthreads > MAX_KTHREADS {
            return Err(format!(
                "kthread count {} is not in 1..={MAX_KTHREADS}",
                reg.kthreads
            ));
        }
        if reg.max_cores == 0 || reg.guaranteed > reg.max_cores || reg.max_cores > reg.kthreads {
            return Err(format!(
                "need 0 <= guaranteed ({}) <= max_cores ({}) <= kthreads ({}) and max_cores >= 1",
                reg.guaranteed, reg.max_cores, reg.kthreads
            ));
        }
        let managed = self.cfg.cores.len() as u64;
        let taken: u64 = self.apps.iter().map(|a| u64::from(a.guaranteed)).sum();
        if taken + u64::from(reg.guaranteed) > managed {
            return Err(format!(
                "guaranteed cores oversubscribed: {} asked, {taken} of the {managed} managed cores already guaranteed",
                reg.guaranteed
            ));
        }
        let want = 1 + reg.kthreads as usize;
        if fds.len() != want {
            return Err(format!(
                "expected {want} descriptors (the region memfd and {} eventfds), got {}",
                reg.kthreads,
                fds.len()
            ));
        }
        let mut fds = fds.into_iter();
        let memfd = fds.next().ok_or("no region memfd")?;
        let eventfds: Vec<OwnedFd> = fds.collect();
        for (k, e) in eventfds.iter().enumerate() {
            if !sys::is_eventfd(e.as_fd()) {
                let what = sys::fd_target(e.as_fd())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|e| e.to_string());
                return Err(format!(
                    "descriptor {} (kthread {k}'s eventfd) is not an eventfd but {what}",
                    k + 1
                ));
            }
        }
        let region =
            Region::attach(memfd).map_err(|e| format!("descriptor 0 (the region memfd): {e}"))?;
        if region.n_kthreads() != reg.kthreads {
            return Err(format!(
                "the region has {} kthreads, the registration says {}",
                region.n_kthreads(),
                reg.kthreads
            ));
        }
        let ends = (0..reg.kthreads)
            .map(|k| region.iokernel_end(k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        if pid <= 0 {
            return Err("cannot tell the peer's pid (SO_PEERCRED)".into());
        }
        Ok((region, ends, eventfds))
    }

    /// A port and an ingress pool for an application that registered an
    /// address; its IP must be unique (the switch checks the MAC).
    fn attach_net(
        &mut self,
        name: &str,
        iface: ginza_net::Interface,
        region: &Region,
    ) -> Result<AppNet, String> {
        if let Some(other) = self
            .apps
            .iter()
            .find(|a| a.net.as_ref().is_some_and(|n| n.interface.ip == iface.ip))
        {
            return Err(format!(
                "IP {} is already the address of application {:?}",
                iface.ip, other.name
            ));
        }
        self.dp
            .attach(
                name,
                iface,
                region.layout().done.capacity,
                region.n_kthreads() as usize,
            )
            .map_err(|e| format!("network interface {} / {}: {e}", iface.mac, iface.ip))
    }

    /// A registered application's socket is readable: normally a hang-up.
    fn app_readable(&mut self, i: usize) {
        let now = sys::monotonic_ns();
        let mut buf = [0u8; MAX_REQUEST];
        let app = &mut self.apps[i];
        match sys::recv_with_fds(app.sock.as_fd(), &mut buf, 0, true) {
            Ok(None) => {}
            Ok(Some(r)) if r.closed => app.doom("connection closed".into()),
            Ok(Some(r)) => match decode_request(&buf[..r.len.min(MAX_REQUEST)]) {
                Ok(req @ (Request::Stats | Request::ResetStats)) => {
                    let rep = self.stats_answer(&req, now);
                    let app = &mut self.apps[i];
                    if !Self::reply(&app.sock, &rep) {
                        app.doom("stats reply could not be sent".into());
                    }
                }
                Ok(Request::Register(_)) => {
                    let reason = format!("already registered as app {}", app.id);
                    Self::reply(&app.sock, &Response::Refused { reason });
                }
                Err(e) => {
                    let reason = e.to_string();
                    Self::reply(
                        &app.sock,
                        &Response::Refused {
                            reason: reason.clone(),
                        },
                    );
                    warn!(
                        "app {:?}: bad request on its connection: {reason}",
                        app.name
                    );
                }
            },
            Err(e) => app.doom(format!("connection error: {e}")),
        }
    }

    /// Removes every doomed application.
    fn reap(&mut self) {
        while let Some(i) = self.apps.iter().position(|a| a.doomed.is_some()) {
            let id = self.apps[i].id;
            let reason = self.apps[i].doomed.take().unwrap_or_default();
            self.remove(id, reason);
        }
    }

    fn remove(&mut self, id: u64, reason: String) {
        let Some(i) = self.apps.iter().position(|a| a.id == id) else {
            return;
        };
        let app = self.apps.remove(i);
        if let Some(net) = &app.net {
            self.dp.detach(net);
        }
        // Cores it was still giving back are free now.
        self.ready.extend(app.kt.iter().filter_map(|k| k.handover));
        let cores: Vec<usize> = app.cores().iter().map(|&c| self.cfg.cores[c]).collect();
        info!(
            "app {:?} (id {}, pid {}) removed: {reason}; cores reclaimed: [{}]",
            app.name,
            app.id,
            app.pid,
            format_cores(&cores)
        );
        self.disconnected += 1;
        self.actuator.app_removed(app.id, &app.name);
        if self.removals.len() == RECENT_REMOVALS {
            self.removals.pop_front();
        }
        self.removals.push_back(Removal {
            app_id: app.id,
            name: app.name,
            reason,
        });
        // Dropping `app` closes its socket and eventfds and unmaps the
        // region.
    }

    // ----- allocation pass -----

    /// Drains one kthread's command ring.
    fn drain(app: &mut App, k: usize, now: u64, ready: &mut Vec<Handover>) {
        let cap = app.ends[k].from_kthread.raw().capacity();
        for _ in 0..cap {
            let msg = match app.ends[k].from_kthread.recv() {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(RecvError::Corrupt(e)) => {
                    return app.doom(format!("kthread {k}'s command ring is corrupt: {e}"));
                }
                Err(RecvError::Decode(e)) => {
                    return app.doom(format!("kthread {k} sent an undecodable command: {e}"));
                }
            };
            let kt = &mut app.kt[k];
            match msg {
                ToIokernel::Started { tid } => {
                    let ok = i32::try_from(tid).is_ok_and(|t| t > 0)
                        && std::path::Path::new(&format!("/proc/{}/task/{tid}", app.pid)).exists();
                    if !ok {
                        return app.doom(format!(
                            "kthread {k} reported tid {tid}, which is not a thread of pid {}",
                            app.pid
                        ));
                    }
                    kt.tid = Some(tid as i32);
                }
                ToIokernel::Parked { next_deadline_ns }
                | ToIokernel::Yielded { next_deadline_ns } => {
                    // Either way the kthread gave its core back and waits
                    // to be woken, at the latest for its timer.
                    if let Some(c) = kt.core.take() {
                        kt.last_core = Some(c);
                        app.last_yielded_core = Some(c);
                    }
                    kt.parked = true;
                    kt.preempting = false;
                    kt.evicted = false;
                    kt.parked_since = now;
                    kt.timer = next_deadline_ns;
                    kt.drain_egress = true;
                    kt.awaiting = None;
                    ready.extend(kt.handover.take());
                    app.ends[k].line.remove_flags(LineFlags::PREEMPT_PENDING);
                }
            }
        }
    }

    // ----- dataplane -----

    /// Moves packets: links, then each application's port, egress rings
    /// (kthreads holding a core, or parked since their ring was last
    /// empty) and done rings. A packet for an application with no core
    /// is reported to the policy at once.
    fn dataplane(&mut self, now: u64, check_handle: bool) {
        self.dp.poll_links(now, check_handle);
        for app in &mut self.apps {
            let Some(net) = &mut app.net else { continue };
            if app.doomed.is_some() {
                continue;
            }
            net.steering
                .sync(app.kt.iter().map(|k| k.core.is_some()), now);
            match self.dp.deliver(net, &mut app.ends, now) {
                Ok(true) if !self.work_arrived.contains(&app.id) => {
                    self.work_arrived.push(app.id);
                }
                Ok(_) => {}
                Err(reason) => {
                    app.doom(reason);
                    continue;
                }
            }
            for (k, kt) in app.kt.iter_mut().enumerate() {
                let end = &mut app.ends[k];
                let mut moved = Ok(());
                if kt.core.is_some() || kt.preempting || kt.drain_egress {
                    moved = self.dp.transmit(net, end, k).map(|n| {
                        if n == 0 {
                            kt.drain_egress = false;
                        }
                    });
                }
                if let Err(reason) = moved.and_then(|()| self.dp.take_back(net, end, k)) {
                    // A corrupt ring: the application is not followed.
                    app.doomed.get_or_insert(reason);
                    break;
                }
            }
        }
    }

    /// One allocation pass, timed into the stats.
    fn pass(&mut self, now: u64, kind: PassKind) {
        // Not `now`: a control poll may have run since it was read.
        let t0 = sys::monotonic_ns();
        let actions = self.meter.actions;
        self.pass_inner(now, kind);
        let t1 = sys::monotonic_ns();
        let m = &mut self.meter;
        let h = if !self.decisions.is_empty() || m.actions != actions {
            &mut m.pass_acted
        } else {
            &mut m.pass_idle
        };
        h.saturating_record(t1.saturating_sub(t0));
    }

    fn pass_inner(&mut self, now: u64, kind: PassKind) {
        self.passes += 1;
        for app in &mut self.apps {
            for k in 0..app.kt.len() {
                if app.doomed.is_some() {
                    break;
                }
                Self::drain(app, k, now, &mut self.ready);
            }
        }
        self.reap();
        self.check_overdue(now);
        self.complete_handovers();

        let mut busy = false;
        let mut next_timer: Option<u64> = None;
        self.snaps.resize_with(self.apps.len(), || AppSnap {
            key: 0,
            class: ginza_policy::alloc::AppClass::Batch,
            guaranteed: 0,
            max_cores: 0,
            kthreads: Vec::new(),
            next_timer: None,
            last_yielded_core: None,
        });
        self.snaps.truncate(self.apps.len());
        for (app, snap) in self.apps.iter_mut().zip(self.snaps.iter_mut()) {
            snap.key = app.id;
            snap.class = app.class.into();
            snap.guaranteed = app.guaranteed as usize;
            snap.max_cores = app.max_cores as usize;
            snap.last_yielded_core = app.last_yielded_core;
            snap.kthreads.clear();
            let mut app_timer: Option<u64> = None;
            for (k, kt) in app.kt.iter().enumerate() {
                let line = app.ends[k].line.snapshot();
                let mut ks = KthreadSnap {
                    core: kt.core,
                    parked: kt.parked,
                    parked_since: kt.parked_since,
                    last_core: kt.last_core,
                    ..Default::default()
                };
                line.update(&mut ks);
                // Packets waiting on the ingress ring: iokerneld is its
                // producer, so it knows the tail and reads the head.
                let ring = &mut app.ends[k].ingress;
                let waiting = ring.free().map_or(0, |free| ring.capacity() - free);
                ks.counters.in_tail = ring.next_seq();
                ks.counters.in_head = ks.counters.in_tail.wrapping_sub(waiting);
                busy |=
                    kt.core.is_some() || (kt.preempting && !kt.evicted) || ks.counters.has_items();
                if kt.parked {
                    if let Some(t) = kt.timer {
                        app_timer = Some(app_timer.map_or(t, |x: u64| x.min(t)));
                    }
                }
                snap.kthreads.push(ks);
            }
            snap.next_timer = app_timer;
            if let Some(t) = app_timer {
                busy |= t <= now;
                next_timer = Some(next_timer.map_or(t, |x: u64| x.min(t)));
            }
        }
        self.busy = busy;
        self.next_timer = next_timer;

        self.decisions.clear();
        match kind {
            PassKind::Interval => {
                let congested = self
                    .alloc
                    .pass(now, &self.topo, &self.snaps, &mut self.decisions);
                for &a in congested {
                    self.apps[a].congestion += 1;
                }
                for (app, snap) in self.apps.iter_mut().zip(&self.snaps) {
                    if let Some(net) = &mut app.net {
                        net.steering
                            .sync(app.kt.iter().map(|k| k.core.is_some()), now);
                        net.steering.rebalance(now, &snap.kthreads);
                    }
                }
            }
            PassKind::WorkArrived => {
                self.work_arrived_at.clear();
                for id in &self.work_arrived {
                    self.work_arrived_at
                        .extend(self.apps.iter().position(|a| a.id == *id));
                }
                self.alloc.on_work_for(
                    now,
                    &self.topo,
                    &self.snaps,
                    &self.work_arrived_at,
                    &mut self.decisions,
                );
            }
        }
        // An interval pass sees the waiting packets too.
        self.work_arrived.clear();
        let decisions = std::mem::take(&mut self.decisions);
        // A preemption whose core the next decision grants (and when it
        // was made): that grant waits for the victim to give the core back.
        let mut victim: Option<(usize, usize, usize, u64)> = None;
        for (i, d) in decisions.iter().enumerate() {
            match *d {
                Decision::Grant { app, kthread, core } => {
                    let t0 = sys::monotonic_ns();
                    if !self.assign(app, kthread, core) {
                        continue;
                    }
                    // The application is awake now: whichever kthread runs
                    // fires every due timer of the runtime, so due timers
                    // other parked kthreads reported must not wake it again.
                    for kt in self.apps[app].kt.iter_mut().filter(|k| k.parked) {
                        kt.timer = kt.timer.filter(|&t| t > now);
                    }
                    match victim.take() {
                        Some((va, vk, vc, preempted_ns)) if vc == core => {
                            let h = Handover {
                                app_id: self.apps[app].id,
                                kthread,
                                core,
                                preempted_ns,
                            };
                            let victim_id = self.apps.get(va).map(|a| a.id);
                            match self.apps.get_mut(va).and_then(|a| a.kt.get_mut(vk)) {
                                Some(v) if v.preempting && !v.evicted => {
                                    v.handover = Some(h);
                                    self.apps[app].kt[kthread].awaiting =
                                        victim_id.map(|id| (id, vk));
                                }
                                _ => self.ready.push(h),
                            }
                        }
                        _ => {
                            self.wake(app, kthread, core, Some(t0));
                        }
                    }
                }
                Decision::Preempt { app, kthread, core } => {
                    let handed_over = matches!(decisions.get(i + 1), Some(Decision::Grant { core: c, .. }) if *c == core);
                    let reason = if handed_over {
                        PreemptReason::CoreNeeded
                    } else {
                        PreemptReason::Shrink
                    };
                    let since = handed_over.then(sys::monotonic_ns);
                    let (va, vk) = self.preempt(app, kthread, core, reason, now);
                    victim = since.map(|t| (va, vk, core, t));
                }
            }
        }
        self.decisions = decisions;
        if !self.decisions.is_empty() {
            self.busy = true;
        }
        self.reap();
        self.complete_handovers();
    }

    /// Preempted kthreads that missed the deadline are moved off their core
    /// and reported; their hand-overs go ahead.
    fn check_overdue(&mut self, now: u64) {
        let deadline = self.cfg.preempt_deadline.as_nanos() as u64;
        for app in &mut self.apps {
            for k in 0..app.kt.len() {
                let kt = &mut app.kt[k];
                if !kt.preempting || kt.evicted || now.saturating_sub(kt.preempt_since) < deadline {
                    continue;
                }
                kt.evicted = true;
                let cpu = kt.last_core.and_then(|c| self.cfg.cores.get(c).copied());
                self.ready.extend(kt.handover.take());
                app.preempt_overdue += 1;
                self.meter.actions += 1;
                warn!(
                    "app {:?} kthread {k} (tid {:?}) did not give cpu {cpu:?} back within {:?} of its preemption; moving it off",
                    app.name, kt.tid, self.cfg.preempt_deadline
                );
                if let Some(cpu) = cpu {
                    if let Err(e) = self.actuator.evict(&Self::target(app, k), cpu) {
                        warn!("moving app {:?} kthread {k} off cpu {cpu}: {e}", app.name);
                    }
                }
            }
        }
    }

    /// Carries out the hand-overs whose core is free.
    fn complete_handovers(&mut self) {
        while let Some(h) = self.ready.pop() {
            // Only if the receiver still holds the core (it may have been
            // preempted or gone in between).
            let woke = self
                .apps
                .iter()
                .position(|a| a.id == h.app_id)
                .filter(|&a| {
                    let kt = &self.apps[a].kt[h.kthread];
                    kt.core == Some(h.core) && !kt.preempting
                })
                .and_then(|a| self.wake(a, h.kthread, h.core, None));
            match woke {
                Some(end) => {
                    self.meter.handovers += 1;
                    self.meter
                        .handover
                        .saturating_record(end.saturating_sub(h.preempted_ns));
                }
                None => self.meter.handovers_abandoned += 1,
            }
        }
    }

    fn target<'a>(app: &'a App, k: usize) -> Target<'a> {
        Target {
            app_id: app.id,
            app_name: &app.name,
            kthread: k,
            pid: app.pid,
            tid: app.kt[k].tid,
            eventfd: app.eventfds[k].as_fd(),
        }
    }

    /// Bookkeeping of a grant: the kthread holds `core` from now on (the
    /// policy sees it so), whether or not it can be woken yet.
    fn assign(&mut self, a: usize, k: usize, core: usize) -> bool {
        if core >= self.cfg.cores.len() {
            return false;
        }
        let Some(app) = self.apps.get_mut(a) else {
            return false;
        };
        let Some(kt) = app.kt.get_mut(k) else {
            return false;
        };
        kt.core = Some(core);
        kt.parked = false;
        kt.preempting = false;
        kt.timer = None;
        app.grants += 1;
        self.meter.grants += 1;
        let prev = self.core_holder[core].replace(app.id);
        if prev.is_some_and(|p| p != app.id) {
            self.meter.reallocations += 1;
        }
        true
    }

    /// Wakes a kthread on the core it was assigned: the command ring, then
    /// the actuator (affinity, eventfd). `started`: when the grant's
    /// bookkeeping began, if it is part of this wake's cost. Returns when
    /// the wake was done, `None` if it could not be.
    fn wake(&mut self, a: usize, k: usize, core: usize, started: Option<u64>) -> Option<u64> {
        let &cpu = self.cfg.cores.get(core)?;
        let app = self.apps.get_mut(a)?;
        if k >= app.kt.len() {
            return None;
        }
        app.kt[k].awaiting = None;
        // One clock read serves as the decision time and the cost's start.
        let t0 = started.unwrap_or_else(sys::monotonic_ns);
        match app.ends[k].to_kthread.send(ToKthread::Wake {
            core: cpu as u32,
            decided_ns: t0,
        }) {
            Ok(()) => {}
            Err(SendError::Full) => app.ring_full += 1,
            Err(SendError::Corrupt(e)) => {
                app.doom(format!("kthread {k}'s wake ring is corrupt: {e}"));
                return None;
            }
        }
        debug!("grant: app {:?} kthread {k} → cpu {cpu}", app.name);
        if let Err(e) = self.actuator.grant(&Self::target(app, k), cpu) {
            warn!("grant of cpu {cpu} to app {:?} kthread {k}: {e}", app.name);
        }
        let end = sys::monotonic_ns();
        self.meter.actions += 1;
        self.meter
            .grant_cost
            .saturating_record(end.saturating_sub(t0));
        Some(end)
    }

    /// Asks kthread `k` of application `a` to give `core` back. Returns
    /// who holds the core now: the kthread itself, or — for a kthread that
    /// was granted the core but not woken yet (its hand-over pending) — the
    /// preempted kthread it was waiting for; that one's hand-over now goes
    /// to whoever is granted the core next.
    fn preempt(
        &mut self,
        a: usize,
        k: usize,
        core: usize,
        reason: PreemptReason,
        now: u64,
    ) -> (usize, usize) {
        let Some(&cpu) = self.cfg.cores.get(core) else {
            return (a, k);
        };
        let Some(app) = self.apps.get_mut(a) else {
            return (a, k);
        };
        if k >= app.kt.len() {
            return (a, k);
        }
        let kt = &mut app.kt[k];
        if let Some((victim_app, victim_k)) = kt.awaiting.take() {
            // Never ran on the core: it goes back to parked, silently.
            kt.core = None;
            kt.parked = true;
            kt.parked_since = now;
            let holder = self.apps.iter().position(|x| x.id == victim_app);
            if let Some(v) = holder.and_then(|i| self.apps[i].kt.get_mut(victim_k)) {
                if v.handover.take().is_some() {
                    self.meter.handovers_abandoned += 1;
                }
            }
            return holder.map_or((a, k), |i| (i, victim_k));
        }
        if let Some(c) = kt.core.take() {
            kt.last_core = Some(c);
        }
        kt.preempting = true;
        kt.evicted = false;
        kt.preempt_since = now;
        app.preemptions += 1;
        self.meter.preemptions += 1;
        self.meter.actions += 1;
        app.ends[k].line.insert_flags(LineFlags::PREEMPT_PENDING);
        match app.ends[k].to_kthread.send(ToKthread::Preempt { reason }) {
            Ok(()) => {}
            Err(SendError::Full) => app.ring_full += 1,
            Err(SendError::Corrupt(e)) => {
                app.doom(format!("kthread {k}'s command ring is corrupt: {e}"));
                return (a, k);
            }
        }
        debug!(
            "preempt: app {:?} kthread {k} off cpu {cpu} ({reason:?})",
            app.name
        );
        if let Err(e) = self.actuator.preempt(&Self::target(app, k), cpu, reason) {
            warn!(
                "preempting app {:?} kthread {k} on cpu {cpu}: {e}",
                app.name
            );
        }
        (a, k)
    }

    // ----- stats -----

    fn report(&self, now: u64) -> StatsReport {
        let cpu = sys::thread_cpu_ns();
        StatsReport {
            policy: self.cfg.policy.name().into(),
            managed_cores: self.cfg.cores.clone(),
            interval_ns: self.cfg.interval.as_nanos() as u64,
            uptime_ns: now.saturating_sub(self.start_ns),
            loop_cpu_ns: cpu,
            passes: self.passes,
            registrations_refused: self.refused,
            apps_disconnected: self.disconnected,
            apps: self
                .apps
                .iter()
                .map(|a| AppStats {
                    app_id: a.id,
                    name: a.name.clone(),
                    pid: a.pid,
                    class: a.class,
                    cores_now: a.kt.iter().filter(|k| k.core.is_some()).count() as u32,
                    guaranteed: a.guaranteed,
                    max_cores: a.max_cores,
                    kthreads: a.kt.len() as u32,
                    parked_kthreads: a.kt.iter().filter(|k| k.parked).count() as u32,
                    grants: a.grants,
                    preemptions: a.preemptions,
                    congestion_events: a.congestion,
                    ring_full: a.ring_full,
                    preempt_overdue: a.preempt_overdue,
                    net: a.net.as_ref().map(|n| n.stats),
                })
                .collect(),
            recent_removals: self.removals.iter().cloned().collect(),
            alloc: self.meter.report(now, cpu),
            dataplane: self.dp.stats(),
        }
    }

    /// The stats answer; for `ResetStats` the window it reports ends and a
    /// new one starts.
    fn stats_answer(&mut self, req: &Request, now: u64) -> Response {
        let rep = Response::Stats(self.report(now));
        if *req == Request::ResetStats {
            // `now` may be older than the samples already in the window.
            let t = sys::monotonic_ns().max(now);
            self.meter.reset(t, sys::thread_cpu_ns());
        }
        rep
    }
}

impl<A: CoreActuator> Drop for Iokerneld<A> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.cfg.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_of_cost_histograms() {
        let mut h = histogram();
        assert_eq!(summarize(&h), Latency::default());
        // 1 µs .. 1 ms.
        for us in 1..=1000u64 {
            h.saturating_record(us * 1000);
        }
        let s = summarize(&h);
        assert_eq!(s.count, 1000);
        // Upper ends of 0.1 % buckets: never below the value.
        let near = |got: u64, want: u64| got >= want && got <= want + want / 1000;
        assert!(near(s.p50_ns, 500_000), "{s:?}");
        assert!(near(s.p99_ns, 990_000), "{s:?}");
        assert!(near(s.max_ns, 1_000_000), "{s:?}");
        assert!(s.mean_ns.abs_diff(500_500) <= 500, "{s:?}");
        // Out of range: clamped, not lost, nothing allocated.
        h.saturating_record(u64::MAX);
        h.saturating_record(0);
        let s = summarize(&h);
        assert_eq!(s.count, 1002);
        assert!(s.max_ns >= HIST_MAX_NS && s.max_ns <= HIST_MAX_NS + HIST_MAX_NS / 1000);
    }

    #[test]
    fn a_reset_starts_a_new_window() {
        let mut m = Meter::new(1_000, 0);
        m.grants = 3;
        m.preemptions = 2;
        m.reallocations = 1;
        m.handovers = 1;
        m.handovers_abandoned = 1;
        m.actions = 9;
        for h in [
            &mut m.grant_cost,
            &mut m.pass_acted,
            &mut m.pass_idle,
            &mut m.handover,
        ] {
            h.saturating_record(5_000);
        }
        let r = m.report(11_000, 500);
        assert_eq!((r.window_ns, r.window_cpu_ns), (10_000, 500));
        assert_eq!((r.grants, r.handover.count), (3, 1));
        m.reset(20_000, 700);
        let r = m.report(25_000, 800);
        assert_eq!(
            r,
            AllocStats {
                window_ns: 5_000,
                window_cpu_ns: 100,
                ..Default::default()
            }
        );
        // Not a window count: passes compare it before and after.
        assert_eq!(m.actions, 9);
    }
}
