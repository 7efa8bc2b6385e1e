//! `ginza demo`: iokerneld, a latency-critical UDP server and a batch
//! application on this machine, under the Shenango allocator (5 µs), the
//! `slow` one (1 ms) and `static` cores, over a sweep of offered loads and
//! three service-time distributions (Shenango's Fig. 4 on this machine).
//!
//! Per service distribution, policy and load point, everything starts
//! fresh (points are independent):
//!
//! * iokerneld on a thread of this process, pinned to its own CPU and
//!   spinning, managing the other CPUs, with the software NIC;
//! * `lc`, latency-critical: `spin-server` on a Ginza runtime with its own
//!   MAC and IP: each UDP request carries its service time; a uthread per
//!   request spins for it and echoes the request back;
//! * `batch`: one uthread per kthread prices a European call by Monte
//!   Carlo in chunks of about 25 µs, yielding between chunks;
//! * load: iokerneld's traffic generator, on the switch beside the
//!   applications, sends requests with Poisson arrivals at the point's rate
//!   and matches the replies (open loop: latency is reply − injection, as
//!   seen by iokerneld's loop; a late loop shows as lag, not fewer
//!   requests). First a warm-up run, then the measured run.
//!
//! During the measured run, iokerneld's stats are sampled every 10 ms for the
//! cores each application holds; counters read at both ends give batch
//! paths/s and reallocations/s (cores moved from one application to the
//! other). Achieved load is the service time the server spent in the run
//! over the run × managed cores.

mod phases;
mod plot;
mod quiet;
pub(crate) mod report;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use ginza_apps::request_trace::RequestTrace;
use ginza_apps::spin_server::{self, SpinStats};
use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::{
    Config as IokConfig, DaemonError, InProcess, LoadReport, LoadRun, PolicyKind, GENERATOR_IP,
    GENERATOR_MAC,
};
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_proto::{client, parse_duration, StatsReport};
use ginza_runtime::net::NetConfig;
use ginza_runtime::{Class, Config as RtConfig, IokernelConfig, RuntimeError};
use ginza_sys::cpulist;
use serde::Serialize;

use report::Row;

/// Arguments of `ginza demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Managed cores, e.g. `1-3` [default: every CPU this process may use
    /// but iokerneld's].
    #[arg(long, value_parser = parse_core_list)]
    cores: Option<CoreList>,
    /// iokerneld's own CPU [default: the first allowed CPU that is not
    /// managed].
    #[arg(long)]
    iokernel_core: Option<usize>,
    /// Offered loads, as fractions of the managed cores' capacity.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.1, 0.3, 0.5, 0.7, 0.9],
          value_parser = parse_load)]
    points: Vec<f64>,
    /// Measured time per point (e.g. 1s, 500ms).
    #[arg(long, default_value = "300ms", value_parser = parse_window)]
    duration: Duration,
    /// Warm-up per point, before the measured time.
    #[arg(long, default_value = "100ms", value_parser = parse_warmup)]
    warmup: Duration,
    /// Service-time distributions of the requests (mean 10 µs each):
    /// exponential, constant, bimodal (90 % 5 µs, 10 % 55 µs).
    #[arg(long, value_delimiter = ',', default_values_t = vec![Service::Exponential, Service::Constant, Service::Bimodal],
          value_parser = parse_service)]
    services: Vec<Service>,
    /// Directory for demo.csv and demo.png.
    #[arg(long, default_value = "results/demo")]
    out: PathBuf,
    /// Core allocators to compare, in this order: shenango, slow, static.
    #[arg(long, value_delimiter = ',', default_values_t = vec![Policy::Shenango, Policy::Slow, Policy::Static],
          value_parser = parse_policy)]
    policies: Vec<Policy>,
    /// Seed of the arrivals, service times and iokerneld's victim choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also print the rows as one JSON object on stdout (the table then
    /// goes to stderr).
    #[arg(long)]
    json: bool,
    /// The park/wake mechanisms before `SCHED_IDLE` batch kthreads: batch
    /// at Linux's default class, no lingering, every hand-over waits for
    /// the preempted kthread, no local wakes (to compare with the default
    /// in one binary).
    #[arg(long)]
    classic: bool,
    /// `lc`'s spin for work before it parks [default: the runtime's
    /// `spin_before_park`].
    #[arg(long, value_parser = parse_tuning)]
    lc_spin: Option<Duration>,
    /// How long `lc` polls for a grant after parking [default: the
    /// runtime's, zero for a latency-critical application].
    #[arg(long, value_parser = parse_tuning)]
    lc_linger: Option<Duration>,
    /// How long `batch` polls for a grant after giving its core back
    /// [default: the runtime's `BATCH_LINGER`; zero with --classic].
    #[arg(long, value_parser = parse_tuning)]
    batch_linger: Option<Duration>,
    /// How long iokerneld waits before signalling a SCHED_IDLE batch
    /// kthread whose core went to lc; if lc gives the core back first,
    /// the preemption is withdrawn [default: iokerneld's; 0: signal at once,
    /// the mechanism before].
    #[arg(long, value_parser = parse_tuning)]
    idle_victim_grace: Option<Duration>,
    /// Local wakes: batch's kthread on the core wakes lc there (a wake on
    /// the same CPU, no inter-processor interrupt), taking iokerneld's
    /// doorbell at its preemption points; iokerneld wakes lc itself if the
    /// doorbell is still there after this wait [default: 5us; 0: off, as
    /// with --classic] (docs/runtime.md, "Local wakes").
    #[arg(long, value_parser = parse_tuning)]
    local_wake: Option<Duration>,
}

fn parse_tuning(s: &str) -> Result<Duration, String> {
    parse_bounded(s, Duration::ZERO, Duration::from_millis(10))
}

/// A `--cores` value (a newtype: clap takes a bare `Vec` for a repeated flag).
#[derive(Clone, Debug)]
struct CoreList(Vec<usize>);

fn parse_core_list(s: &str) -> Result<CoreList, String> {
    let v = cpulist::parse(s).map_err(|e| e.to_string())?;
    if v.is_empty() {
        return Err("no cores listed".into());
    }
    Ok(CoreList(v))
}

fn parse_load(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    // Past 2× capacity the point only measures how fast the backlog grows.
    if !(v > 0.0 && v <= 2.0) {
        return Err(format!("offered load {v} is out of range (0, 2]"));
    }
    Ok(v)
}

fn parse_bounded(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(min..=max).contains(&d) {
        return Err(format!("{s:?} is out of range {min:?}..={max:?}"));
    }
    Ok(d)
}

fn parse_window(s: &str) -> Result<Duration, String> {
    // Under 50 ms a 1 ms allocator gets a few dozen periods: no measurement.
    parse_bounded(s, Duration::from_millis(50), Duration::from_secs(600))
}

fn parse_warmup(s: &str) -> Result<Duration, String> {
    parse_bounded(s, Duration::ZERO, Duration::from_secs(60))
}

/// A core allocator under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    Shenango,
    Slow,
    Static,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    match s.trim() {
        "shenango" => Ok(Policy::Shenango),
        "slow" => Ok(Policy::Slow),
        "static" => Ok(Policy::Static),
        other => Err(format!("unknown policy {other:?} (shenango, slow, static)")),
    }
}

/// A service-time distribution of the latency-critical requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Service {
    Exponential,
    Constant,
    Bimodal,
}

/// Mean service time of every distribution.
const MEAN_SERVICE: Duration = Duration::from_micros(10);

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Exponential => "exponential",
            Service::Constant => "constant",
            Service::Bimodal => "bimodal",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Service::Exponential => "exponential service times, mean 10 µs",
            Service::Constant => "constant service times, 10 µs",
            Service::Bimodal => "bimodal service times: 90 % 5 µs, 10 % 55 µs (mean 10 µs)",
        }
    }

    pub(crate) fn distribution(self) -> ServiceTime {
        match self {
            Service::Exponential => ServiceTime::Exponential {
                mean_ns: MEAN_SERVICE.as_nanos() as f64,
            },
            Service::Constant => ServiceTime::Constant {
                ns: MEAN_SERVICE.as_nanos() as u64,
            },
            Service::Bimodal => ServiceTime::Bimodal {
                p: 0.9,
                a_ns: 5_000,
                b_ns: 55_000,
            },
        }
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn parse_service(s: &str) -> Result<Service, String> {
    match s.trim() {
        "exponential" | "exp" => Ok(Service::Exponential),
        "constant" => Ok(Service::Constant),
        "bimodal" => Ok(Service::Bimodal),
        other => Err(format!(
            "unknown service distribution {other:?}: expected exponential, constant or bimodal"
        )),
    }
}

/// Shenango's allocation interval.
const INTERVAL: Duration = Duration::from_micros(5);
/// Period of the `slow` allocator.
const SLOW_PERIOD: Duration = Duration::from_millis(1);

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Shenango => "shenango",
            Policy::Slow => "slow",
            Policy::Static => "static",
        }
    }

    fn kind(self) -> PolicyKind {
        match self {
            Policy::Shenango => PolicyKind::Shenango,
            Policy::Slow => PolicyKind::Slow {
                period: SLOW_PERIOD,
            },
            Policy::Static => PolicyKind::Static,
        }
    }

    fn describe(self, n: usize) -> String {
        match self {
            Policy::Shenango => {
                "Shenango allocator: congestion detection every 5 µs, cores move on demand".into()
            }
            Policy::Slow => "slow allocator: cores from utilization every 1 ms; in between \
                 each application keeps and spins on the cores it holds (Arachne-like)"
                .into(),
            Policy::Static => format!(
                "static: lc is provisioned all {n} managed core(s) and spins on them (ZygOS-like); \
                 batch gets none"
            ),
        }
    }

    /// Under `static` and `slow` an application keeps the cores it holds
    /// while idle (spinning): only the allocator takes them back. Under
    /// `shenango` an idle kthread gives its core back within microseconds.
    fn keeps_cores(self) -> bool {
        self != Policy::Shenango
    }

    /// `static` provisions the latency-critical application for its peak:
    /// every managed core guaranteed, kept while idle.
    fn lc_guaranteed(self, n: usize) -> u32 {
        match self {
            Policy::Static => u32::try_from(n).unwrap_or(u32::MAX),
            _ => 0,
        }
    }
}

/// Time between two samples of iokerneld's stats in the window: each
/// costs iokerneld's loop tens of µs (a JSON reply), which the traffic
/// generator on the same loop feels as lag.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// How long an application may take to register with iokerneld.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// After the last arrival of a load run, how long the generator waits for
/// replies (a backlog past saturation drains meanwhile, or is lost).
const DRAIN: Duration = Duration::from_millis(100);
/// The latency-critical server's addresses, and the generator's IP.
const LC_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x01, 0x01]);
const LC_IP: Ipv4Addr = Ipv4Addr::new(10, 47, 1, 1);
const LC_PORT: u16 = 7;

/// What the whole run uses.
pub(crate) struct Setup {
    allowed: Vec<usize>,
    managed: Vec<usize>,
    iokernel_core: usize,
    sockets: TempDir,
    warmup: Duration,
    duration: Duration,
    seed: u64,
    /// How the applications park and iokerneld hands cores over
    /// (`Tuning::default()`: the runtime's and iokerneld's defaults).
    pub(crate) tuning: Tuning,
}

/// The park/wake mechanisms of one run, so the same binary can compare
/// them (docs/results.md, "The demo"): each defaults to what the runtime
/// and iokerneld do by default, but for local wakes, which are on (its
/// batch reaches a preemption point every 0.3 µs).
#[derive(Clone, Debug)]
pub(crate) struct Tuning {
    /// `lc`'s look for work before it parks (`Config::spin_before_park`).
    pub(crate) lc_spin: Duration,
    /// `lc` polls for a grant this long after parking
    /// (`IokernelConfig::linger_after_park`).
    pub(crate) lc_linger: Duration,
    /// `batch` runs under `SCHED_IDLE` (`IokernelConfig::sched_idle`).
    pub(crate) batch_sched_idle: bool,
    /// `batch` polls for a grant this long after giving its core back.
    pub(crate) batch_linger: Duration,
    /// iokerneld wakes the receiver of a core taken from a `SCHED_IDLE`
    /// kthread at once (`Config::handover_from_idle_at_once`).
    pub(crate) handover_at_once: bool,
    /// iokerneld's `Config::idle_victim_grace`.
    pub(crate) idle_victim_grace: Duration,
    /// iokerneld's `Config::local_wake_wait` (batch then takes doorbells).
    pub(crate) local_wake: Option<Duration>,
}

impl Default for Tuning {
    fn default() -> Tuning {
        let lc = IokernelConfig::new("lc", Class::LatencyCritical);
        let batch = IokernelConfig::new("batch", Class::Batch);
        Tuning {
            lc_spin: RtConfig::default().spin_before_park,
            lc_linger: lc.linger_after_park,
            batch_sched_idle: batch.sched_idle,
            batch_linger: batch.linger_after_park,
            handover_at_once: IokConfig::new(Vec::new()).handover_from_idle_at_once,
            idle_victim_grace: IokConfig::new(Vec::new()).idle_victim_grace,
            local_wake: Some(LOCAL_WAKE_WAIT),
        }
    }
}

/// The demo's wait for a local wake before iokerneld writes the eventfd
/// itself (batch takes a doorbell within ~0.3 µs: it reaches a preemption
/// point every `batch::PATHS_PER_POINT` paths).
const LOCAL_WAKE_WAIT: Duration = Duration::from_micros(5);

impl Tuning {
    /// Before `SCHED_IDLE` batch kthreads (docs/results.md, "The demo"):
    /// batch at the default class, no lingering, every hand-over waits
    /// for the victim, no local wakes.
    fn classic() -> Tuning {
        Tuning {
            batch_sched_idle: false,
            batch_linger: Duration::ZERO,
            handover_at_once: false,
            local_wake: None,
            ..Tuning::default()
        }
    }
}

impl Setup {
    /// iokerneld's CPU and the managed ones (as `ginza demo` picks them),
    /// checked against this process's affinity, and a socket directory.
    pub(crate) fn new(
        cores: Option<&[usize]>,
        iokernel_core: Option<usize>,
        warmup: Duration,
        duration: Duration,
        seed: u64,
    ) -> anyhow::Result<Setup> {
        let allowed =
            ginza_sys::affinity::allowed_cpus().context("reading this process's CPU affinity")?;
        let (iokernel_core, managed) = choose_cores(&allowed, cores, iokernel_core)?;
        // Checked once here for a clear message before anything starts.
        let mut probe = IokConfig::new(managed.clone());
        probe.own_core = Some(iokernel_core);
        probe
            .validate(&allowed)
            .context("the cores given to ginza demo")?;
        Ok(Setup {
            allowed,
            managed,
            iokernel_core,
            sockets: TempDir::new()?,
            warmup,
            duration,
            seed,
            tuning: Tuning::default(),
        })
    }
}

/// A directory removed on drop (the sockets' home: unix socket paths are
/// limited to 107 bytes, so it lives in the temp dir, not under `--out`).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("ginza-demo-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the socket directory {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Picks iokerneld's CPU and the managed ones.
fn choose_cores(
    allowed: &[usize],
    cores: Option<&[usize]>,
    iokernel_core: Option<usize>,
) -> anyhow::Result<(usize, Vec<usize>)> {
    if allowed.len() < 2 {
        bail!(
            "ginza demo needs at least 2 CPUs (one for iokerneld, one or more for the \
             applications); this process may use only CPU {}",
            cpulist::format(allowed)
        );
    }
    let own = match (iokernel_core, cores) {
        (Some(c), _) => c,
        (None, Some(m)) => *allowed
            .iter()
            .find(|c| !m.contains(c))
            .ok_or_else(|| anyhow!("every allowed CPU is managed: none is left for iokerneld"))?,
        (None, None) => allowed[0],
    };
    let managed = match cores {
        Some(m) => m.to_vec(),
        None => allowed.iter().copied().filter(|&c| c != own).collect(),
    };
    if managed.is_empty() {
        bail!("no CPU is left to manage besides iokerneld's CPU {own}");
    }
    Ok((own, managed))
}

/// iokerneld on a thread of this process; stopped and joined on drop
/// (`InProcess` does that), on every path.
struct Daemon {
    running: Option<InProcess>,
    socket: PathBuf,
}

impl Daemon {
    fn start(cfg: IokConfig) -> anyhow::Result<Daemon> {
        let socket = cfg.socket.clone();
        Ok(Daemon {
            running: Some(InProcess::start(cfg)?),
            socket,
        })
    }

    /// Stops iokerneld (idempotent); the loop's error, if it failed.
    fn stop(&mut self) -> Option<DaemonError> {
        self.running.take().and_then(|d| d.stop().err())
    }

    fn stats(&self) -> anyhow::Result<StatsReport> {
        client::stats(&self.socket)
            .with_context(|| format!("asking iokerneld at {}", self.socket.display()))
    }
}

/// One application's runtime on its own OS thread (`ginza_runtime::run`
/// blocks until the main uthread returns); its result arrives on a channel
/// so it can be awaited with a deadline.
struct App<T> {
    name: &'static str,
    rx: Receiver<Result<T, RuntimeError>>,
    result: Option<Result<T, RuntimeError>>,
}

impl<T: Send + 'static> App<T> {
    fn start<F>(name: &'static str, cfg: RtConfig, main: F) -> anyhow::Result<App<T>>
    where
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("demo-{name}"))
            .spawn(move || {
                let _ = tx.send(ginza_runtime::run(cfg, main));
            })
            .with_context(|| format!("starting the thread of {name}"))?;
        Ok(App {
            name,
            rx,
            result: None,
        })
    }

    /// Waits until `deadline` for the application to return; `true` if it
    /// has.
    fn wait_until(&mut self, deadline: Instant) -> bool {
        if self.result.is_some() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(r) => {
                self.result = Some(r);
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => {
                self.result = Some(Err(RuntimeError::Start(format!(
                    "the thread of {} ended without a result",
                    self.name
                ))));
                true
            }
        }
    }

    fn done(&mut self) -> bool {
        self.wait_until(Instant::now())
    }

    /// `Some` if the application has returned: its error, or `Ok` with
    /// the value dropped.
    fn returned(&mut self) -> Option<anyhow::Result<()>> {
        self.done().then(|| self.take().map(drop))
    }

    fn take(&mut self) -> anyhow::Result<T> {
        match self.result.take() {
            Some(r) => r.with_context(|| format!("application {}", self.name)),
            None => Err(anyhow!("application {} has not finished", self.name)),
        }
    }
}

/// Requests whose stamps one point keeps (docs/results.md, "Where a
/// request's time goes"): 56 bytes each; enough for 0.7 s of 300,000
/// requests/s, the warm-up included (more are counted, not traced).
const TRACE_CAPACITY: usize = 1 << 18;

/// The flags and counters shared with the applications of one point.
#[derive(Clone, Default)]
struct Shared {
    stop_lc: Arc<AtomicBool>,
    spin: Arc<SpinStats>,
    stop_batch: Arc<AtomicBool>,
    batch_paths: Arc<AtomicU64>,
}

/// Everything one point started. Dropping it stops it all, whatever state
/// it is in: flags first (applications return by themselves), then, for
/// any that does not, iokerneld (the runtimes go on standalone and return).
struct PointRun {
    shared: Shared,
    lc: Option<App<std::io::Result<()>>>,
    batch: Option<App<f64>>,
    daemon: Daemon,
}

/// How often the sampler checks for cancellation while it waits.
const MONITOR_EVERY: Duration = Duration::from_millis(10);
/// How long a stopping application is given before iokerneld is stopped
/// under it, and then again before it is abandoned.
const STOP_WAIT: Duration = Duration::from_secs(3);

impl PointRun {
    fn apps_done(&mut self, deadline: Instant) -> bool {
        let lc = self.lc.as_mut().is_none_or(|a| a.wait_until(deadline));
        let batch = self.batch.as_mut().is_none_or(|a| a.wait_until(deadline));
        lc && batch
    }

    /// Waits for `name` to register (and `ready` to hold for its stats),
    /// noticing an application that failed or an iokerneld that stopped.
    fn wait_registered(
        &mut self,
        name: &str,
        ready: impl Fn(&ginza_proto::AppStats) -> bool,
    ) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let mut last_error = None;
        loop {
            let returned = match name {
                "lc" => self.lc.as_mut().and_then(App::returned),
                _ => self.batch.as_mut().and_then(App::returned),
            };
            match returned {
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => bail!("application {name} returned before it was started"),
                None => {}
            }
            match self.daemon.stats() {
                Ok(st) if st.apps.iter().any(|a| a.name == name && ready(a)) => return Ok(()),
                Ok(_) => {}
                Err(e) => last_error = Some(e),
            }
            if t0.elapsed() > REGISTER_TIMEOUT {
                let err = anyhow!(
                    "application {name} was not running under iokerneld within {REGISTER_TIMEOUT:?}"
                );
                return Err(match last_error {
                    Some(e) => e.context(err),
                    None => err,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops `lc` (it checks its flag every 10 ms) and returns its result.
    fn stop_lc(&mut self) -> anyhow::Result<()> {
        self.shared.stop_lc.store(true, Relaxed);
        let lc = self.lc.as_mut().context("lc was started")?;
        if !lc.wait_until(Instant::now() + STOP_WAIT) {
            self.daemon.stop();
            if !lc.wait_until(Instant::now() + STOP_WAIT) {
                bail!("lc did not stop");
            }
        }
        lc.take()?.context("spin-server")
    }
}

impl Drop for PointRun {
    fn drop(&mut self) {
        self.shared.stop_lc.store(true, Relaxed);
        self.shared.stop_batch.store(true, Relaxed);
        if !self.apps_done(Instant::now() + STOP_WAIT) {
            self.daemon.stop();
            if !self.apps_done(Instant::now() + STOP_WAIT) {
                log::error!("an application of the demo did not stop; leaving it behind");
            }
        }
    }
}

/// What the sampler read in the window.
struct Samples {
    first: StatsReport,
    last: StatsReport,
    /// Batch paths at the first and last reading, and the time between.
    paths: (u64, u64),
    paths_window: Duration,
    lc_cores: Vec<u32>,
    batch_cores: Vec<u32>,
    /// When each sample was read (since the window start), and batch's
    /// paths then.
    at: Vec<Duration>,
    paths_at: Vec<u64>,
    /// Failed stats requests in the window.
    errors: u32,
}

fn app_cores(st: &StatsReport, name: &str) -> u32 {
    st.apps
        .iter()
        .find(|a| a.name == name)
        .map_or(0, |a| a.cores_now)
}

/// Preemptions not answered within iokerneld's deadline so far.
fn overdue(st: &StatsReport) -> u64 {
    st.apps.iter().map(|a| a.preempt_overdue).sum()
}

/// Cores moved between applications so far: iokerneld's own count.
fn reallocations(st: &StatsReport) -> u64 {
    st.alloc.reallocations
}

/// Samples iokerneld from `from` to `to` on iokerneld's CPU (a
/// monitoring thread there disturbs the managed cores least); returns
/// early, with an error, if `cancel` is set.
fn sample(
    socket: PathBuf,
    cpu: usize,
    (from, to): (Instant, Instant),
    paths: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
) -> std::thread::JoinHandle<anyhow::Result<Samples>> {
    std::thread::spawn(move || {
        if let Err(e) = ginza_sys::affinity::pin_current_thread(cpu) {
            log::warn!("the stats sampler runs unpinned (CPU {cpu}: {e})");
        }
        let sleep_until = |t: Instant| -> anyhow::Result<()> {
            while Instant::now() < t {
                if cancel.load(Relaxed) {
                    bail!("sampling canceled");
                }
                std::thread::sleep(
                    t.saturating_duration_since(Instant::now())
                        .min(MONITOR_EVERY),
                );
            }
            Ok(())
        };
        sleep_until(from)?;
        let first =
            client::stats(&socket).context("reading iokerneld's stats at the window start")?;
        let p0 = paths.load(Relaxed);
        let t0 = Instant::now();
        let (mut lc_cores, mut batch_cores, mut errors) = (Vec::new(), Vec::new(), 0);
        let (mut at, mut paths_at) = (Vec::new(), Vec::new());
        let mut next = Instant::now() + SAMPLE_EVERY;
        while next < to {
            sleep_until(next)?;
            match client::stats(&socket) {
                Ok(st) => {
                    lc_cores.push(app_cores(&st, "lc"));
                    batch_cores.push(app_cores(&st, "batch"));
                    at.push(from.elapsed());
                    paths_at.push(paths.load(Relaxed));
                }
                Err(_) => errors += 1,
            }
            next += SAMPLE_EVERY;
        }
        sleep_until(to)?;
        let last = client::stats(&socket).context("reading iokerneld's stats at the window end")?;
        let p1 = paths.load(Relaxed);
        Ok(Samples {
            first,
            last,
            paths: (p0, p1),
            paths_window: t0.elapsed(),
            lc_cores,
            batch_cores,
            at,
            paths_at,
            errors,
        })
    })
}

/// A runtime registered with this point's iokerneld.
fn app_config(
    socket: &Path,
    name: &str,
    class: Class,
    n: usize,
    guaranteed: u32,
    keep: bool,
) -> RtConfig {
    let mut io = IokernelConfig::new(name, class);
    io.socket = Some(socket.to_path_buf());
    io.guaranteed = guaranteed;
    io.keep_cores_when_idle = keep;
    RtConfig {
        iokernel: Some(io),
        ..RtConfig::with_kthreads(n)
    }
}

/// `cfg` with the park/wake settings of `tuning` for `lc` or `batch`.
fn tuned(mut cfg: RtConfig, tuning: &Tuning, lc: bool) -> RtConfig {
    if let Some(io) = cfg.iokernel.as_mut() {
        if lc {
            cfg.spin_before_park = tuning.lc_spin;
            io.linger_after_park = tuning.lc_linger;
        } else {
            io.sched_idle = tuning.batch_sched_idle;
            io.linger_after_park = tuning.batch_linger;
        }
    }
    cfg
}

/// A load run of the generator against `lc`: Poisson arrivals at `rate`
/// per second for `duration`.
fn load_run(service: ServiceTime, rate: f64, duration: Duration, seed: u64) -> LoadRun {
    let lc = Interface {
        mac: LC_MAC,
        ip: LC_IP,
    };
    let mut run = LoadRun::poisson(lc, LC_PORT, rate, service, duration);
    run.config.seed = seed;
    run.drain = DRAIN;
    run
}

/// A service-time distribution with its name (the CSV's `service`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workload {
    pub(crate) name: &'static str,
    pub(crate) dist: ServiceTime,
}

impl From<Service> for Workload {
    fn from(s: Service) -> Workload {
        Workload {
            name: s.name(),
            dist: s.distribution(),
        }
    }
}

/// iokerneld, `lc` and `batch` of one point, started and registered.
struct Started {
    run: PointRun,
    generator: ginza_iokernel::GeneratorHandle,
    socket: PathBuf,
    /// The arrivals' seed: the same for every policy at a given load.
    seed: u64,
}

/// Starts one point: iokerneld with `policy`, then `lc`, then `batch`.
fn start_point(
    setup: &Setup,
    service: Workload,
    policy: Policy,
    load_index: usize,
) -> anyhow::Result<Started> {
    let n = setup.managed.len();
    let socket = setup.sockets.0.join(format!(
        "{}-{}-{load_index}.sock",
        service.name,
        policy.name()
    ));
    let mut cfg = IokConfig::new(setup.managed.clone());
    cfg.socket = socket.clone();
    cfg.own_core = Some(setup.iokernel_core);
    cfg.policy = policy.kind();
    cfg.interval = INTERVAL;
    // Spinning, as in production: idle sleeps would add their wake-up to
    // every grant.
    cfg.idle_sleep = None;
    cfg.seed = setup.seed;
    cfg.handover_from_idle_at_once = setup.tuning.handover_at_once;
    cfg.idle_victim_grace = setup.tuning.idle_victim_grace;
    cfg.local_wake_wait = setup.tuning.local_wake;
    cfg.validate(&setup.allowed)
        .context("iokerneld's configuration")?;
    let daemon = Daemon::start(cfg).context("starting iokerneld")?;
    let generator = daemon
        .running
        .as_ref()
        .context("iokerneld was started")?
        .generator()
        .clone();
    let shared = Shared {
        spin: Arc::new(SpinStats {
            trace: RequestTrace::with_capacity(TRACE_CAPACITY),
            ..SpinStats::default()
        }),
        ..Shared::default()
    };
    let mut run = PointRun {
        shared: shared.clone(),
        lc: None,
        batch: None,
        daemon,
    };

    let guaranteed = policy.lc_guaranteed(n);
    let mut lc_cfg = tuned(
        app_config(
            &socket,
            "lc",
            Class::LatencyCritical,
            n,
            guaranteed,
            policy.keeps_cores(),
        ),
        &setup.tuning,
        true,
    );
    if let Some(io) = lc_cfg.iokernel.as_mut() {
        // The generator answers no ARP.
        io.net = Some(NetConfig::new(LC_MAC, LC_IP).with_static_arp(GENERATOR_IP, GENERATOR_MAC));
    }
    let (stop, spin) = (Arc::clone(&shared.stop_lc), Arc::clone(&shared.spin));
    run.lc = Some(App::start("lc", lc_cfg, move || {
        spin_server::serve(LC_PORT, stop, spin)
    })?);
    // lc first, holding its guarantee before batch arrives: `static` never
    // takes a core back, so batch must not soak it up first.
    run.wait_registered("lc", |a| a.cores_now >= guaranteed)?;
    let batch_cfg = tuned(
        app_config(&socket, "batch", Class::Batch, n, 0, policy.keeps_cores()),
        &setup.tuning,
        false,
    );
    let (paths, stop) = (
        Arc::clone(&shared.batch_paths),
        Arc::clone(&shared.stop_batch),
    );
    // The same arrivals for every policy at a given load.
    let seed = setup.seed ^ (load_index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    run.batch = Some(App::start("batch", batch_cfg, move || {
        ginza_apps::batch::price_until_stopped(n, paths, stop, seed)
    })?);
    run.wait_registered("batch", |_| true)?;
    Ok(Started {
        run,
        generator,
        socket,
        seed,
    })
}

/// How long `batch` runs alone on the managed cores at the end of a point
/// (its throughput alone on them, the yardstick of `batch_share_of_spare`).
const BATCH_ALONE: Duration = Duration::from_millis(100);

impl PointRun {
    /// Stops `lc`, then `batch`, then iokerneld; the first failure.
    fn stop_all(&mut self) -> anyhow::Result<()> {
        self.stop_lc()?;
        self.stop_batch_and_daemon()
    }

    /// With `lc` stopped: waits until `batch` holds all `n` managed cores,
    /// then counts its paths for [`BATCH_ALONE`]; paths per second, or
    /// `None` if batch did not get the cores back in time (a `SCHED_IDLE`
    /// kthread answers its last preemption only when it gets to run: on a
    /// CPU another process keeps busy, that can take seconds).
    fn batch_alone(&mut self, n: usize) -> anyhow::Result<Option<f64>> {
        let t0 = Instant::now();
        loop {
            if self.batch.as_mut().and_then(App::returned).is_some() {
                bail!("batch returned before it was stopped");
            }
            if app_cores(&self.daemon.stats()?, "batch") as usize >= n {
                break;
            }
            if t0.elapsed() > REGISTER_TIMEOUT {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let (p0, t) = (self.shared.batch_paths.load(Relaxed), Instant::now());
        std::thread::sleep(BATCH_ALONE);
        let done = self.shared.batch_paths.load(Relaxed).saturating_sub(p0);
        Ok(Some(done as f64 / t.elapsed().as_secs_f64()))
    }

    /// Stops `batch`, then iokerneld; the first failure.
    fn stop_batch_and_daemon(&mut self) -> anyhow::Result<()> {
        self.shared.stop_batch.store(true, Relaxed);
        let batch = self.batch.as_mut().context("batch was started")?;
        if !batch.wait_until(Instant::now() + STOP_WAIT) {
            self.daemon.stop();
            if !batch.wait_until(Instant::now() + STOP_WAIT) {
                bail!("batch did not stop");
            }
        }
        let price = batch.take()?;
        log::debug!("batch priced the call at {price:.4} (Black-Scholes: 8.0214)");
        if let Some(e) = self.daemon.stop() {
            return Err(anyhow!(e).context("iokerneld failed during the point"));
        }
        Ok(())
    }
}

/// Runs one policy at one load (a fraction of the managed cores' capacity)
/// with one service distribution: the point `ginza demo` and `ginza bench
/// run` (docs/experiments.md) share.
pub(crate) fn run_point(
    setup: &Setup,
    service: Workload,
    policy: Policy,
    load: f64,
    load_index: usize,
) -> anyhow::Result<Row> {
    let n = setup.managed.len();
    let Started {
        mut run,
        generator,
        socket,
        seed,
    } = start_point(setup, service, policy, load_index)?;
    let shared = run.shared.clone();
    let rate = load * n as f64 * 1e9 / service.dist.mean_ns();
    let mut notes = Vec::new();
    if !setup.warmup.is_zero() {
        generator
            .run(
                load_run(service.dist, rate, setup.warmup, seed ^ 1),
                STOP_WAIT,
            )
            .map_err(|e| anyhow!(e))
            .context("the warm-up run")?;
    }
    let busy0 = shared.spin.busy_ns.load(Relaxed);
    let cpus_before = quiet::snapshot();
    let from = Instant::now();
    let from_ns = ginza_sys::clock::monotonic_ns();
    let cancel = Arc::new(AtomicBool::new(false));
    let sampler = sample(
        socket.clone(),
        setup.iokernel_core,
        (from, from + setup.duration),
        Arc::clone(&shared.batch_paths),
        Arc::clone(&cancel),
    );
    let measured = generator
        .run(
            load_run(service.dist, rate, setup.duration, seed),
            STOP_WAIT,
        )
        .map_err(|e| anyhow!(e));
    let run_ns = from.elapsed().as_nanos() as u64;
    let to_ns = ginza_sys::clock::monotonic_ns();
    let ours: Vec<usize> = setup
        .managed
        .iter()
        .copied()
        .chain([setup.iokernel_core])
        .collect();
    let competition = cpus_before
        .zip(quiet::snapshot())
        .and_then(|(a, b)| quiet::measure(&a, &b, &ours));
    if measured.is_err() {
        cancel.store(true, Relaxed);
    }
    let samples = sampler
        .join()
        .map_err(|_| anyhow!("the stats sampler panicked"))?;
    // A run that failed while other processes held the CPUs says so: the
    // competition, not the allocator, is the likely cause (an application
    // starved past its stop deadline too: SCHED_IDLE batch gets no CPU
    // beside a spinning program).
    let blame = |e: anyhow::Error| match competition.and_then(|q| q.warning()) {
        Some(w) => e.context(w),
        None => e,
    };
    let report: LoadReport = measured.context("the measured run").map_err(blame)?;
    let busy_ns = shared.spin.busy_ns.load(Relaxed) - busy0;
    run.stop_lc().map_err(blame)?;
    // lc has returned: its trace is complete.
    let phases = phases::breakdown(
        &shared.spin.trace.records(),
        (from_ns, to_ns),
        shared.spin.trace.dropped(),
        &report.reply_transit,
    );
    let batch_alone = run.batch_alone(n).context("measuring batch alone")?;
    run.stop_batch_and_daemon().map_err(blame)?;
    if batch_alone.is_none() {
        notes.push(format!(
            "batch did not get the managed cores back within {REGISTER_TIMEOUT:?} of lc's end: not measured alone"
        ));
    }
    let batch_alone = batch_alone.unwrap_or(f64::NAN);

    let r3 = report::round3;
    let st = report.stats;
    let samples = samples.with_context(|| format!("{} at load {load}", policy.name()))?;
    if samples.errors > 0 {
        notes.push(format!("{} stats samples failed", samples.errors));
    }
    if st.lost() > 0 {
        notes.push(format!("{} requests unanswered", st.lost()));
    }
    let lag_p99_us = report.lag.value_at_quantile(0.99) as f64 / 1e3;
    if lag_p99_us > 50.0 {
        notes.push(format!("generator p99 lag {lag_p99_us:.0} µs"));
    }
    let (p50, p99, p999) = report::percentiles_us(&report.latency);
    let window_ns = samples
        .last
        .uptime_ns
        .saturating_sub(samples.first.uptime_ns);
    let paths_ns = u64::try_from(samples.paths_window.as_nanos()).unwrap_or(u64::MAX);
    let batch_paths_per_s = report::per_second(samples.paths.0, samples.paths.1, paths_ns);
    let achieved_load = report::achieved_load(busy_ns, run_ns, n);
    let mut row = Row {
        service: service.name,
        policy: policy.name(),
        offered_load: load,
        achieved_load: r3(achieved_load),
        p50_us: r3(p50),
        p99_us: r3(p99),
        p999_us: r3(p999),
        batch_mpaths_per_s: r3(batch_paths_per_s / 1e6),
        batch_alone_mpaths_per_s: r3(batch_alone / 1e6),
        batch_share_of_spare: r3(report::share_of_spare(
            batch_paths_per_s,
            batch_alone,
            achieved_load,
        )),
        p50_vs_static: f64::NAN,
        lc_cores: r3(report::mean(&samples.lc_cores)),
        batch_cores: r3(report::mean(&samples.batch_cores)),
        reallocations_per_s: r3(report::per_second(
            reallocations(&samples.first),
            reallocations(&samples.last),
            window_ns,
        )),
        withdrawn_per_s: r3(report::per_second(
            samples.first.alloc.preemptions_withdrawn,
            samples.last.alloc.preemptions_withdrawn,
            window_ns,
        )),
        local_wakes_per_s: r3(report::per_second(
            samples.first.alloc.local_wakes,
            samples.last.alloc.local_wakes,
            window_ns,
        )),
        local_wakes_by_iokernel_per_s: r3(report::per_second(
            samples.first.alloc.local_wakes_by_iokernel,
            samples.last.alloc.local_wakes_by_iokernel,
            window_ns,
        )),
        overdue_preemptions: overdue(&samples.last).saturating_sub(overdue(&samples.first)),
        lc_requests_sent: st.sent,
        lc_requests_answered: st.replies,
        foreign_cpu_pct: competition.map_or(f64::NAN, |q| r3(q.foreign_cpu_pct)),
        steal_pct: competition.map_or(f64::NAN, |q| r3(q.steal_pct)),
        quiet: match competition.map(|q| q.is_quiet()) {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        },
        note: String::new(),
        phases: Some(phases),
    };
    if let Some(w) = competition.and_then(|q| q.warning()) {
        log::warn!("{} at load {load}: {w}", policy.name());
    }
    if row.overdue_preemptions > 0 {
        notes.push(format!(
            "{} preemption(s) not answered within 1 ms",
            row.overdue_preemptions
        ));
    }
    row.note = notes.join("; ");
    Ok(row)
}

/// One sample of a load-steps run (Shenango Fig. 5-like).
#[derive(Clone, Debug)]
pub(crate) struct StepSample {
    /// Since the first step began.
    pub(crate) at: Duration,
    /// The step running then.
    pub(crate) step: usize,
    pub(crate) lc_cores: u32,
    pub(crate) batch_cores: u32,
    /// Batch paths/s since the previous sample.
    pub(crate) batch_paths_per_s: f64,
}

/// One step's latency, as iokerneld's generator measured it.
#[derive(Clone, Debug)]
pub(crate) struct StepFigures {
    pub(crate) load: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) sent: u64,
    pub(crate) answered: u64,
    pub(crate) note: String,
}

/// A load-steps run: cores over time, and each step's latency.
pub(crate) struct StepsReport {
    pub(crate) samples: Vec<StepSample>,
    pub(crate) steps: Vec<StepFigures>,
}

/// Runs `steps` (load as a fraction of capacity, for how long) back to back
/// on one iokerneld with `lc` and `batch`, sampling the cores each holds
/// every 10 ms: latency and cores over time under load steps (Shenango
/// Fig. 5 on this machine). The generator starts each step when the
/// previous one's replies are in (a gap of a few hundred µs).
pub(crate) fn run_steps(
    setup: &Setup,
    service: Workload,
    policy: Policy,
    steps: &[(f64, Duration)],
) -> anyhow::Result<StepsReport> {
    anyhow::ensure!(!steps.is_empty(), "no load steps");
    let n = setup.managed.len();
    let Started {
        mut run,
        generator,
        socket,
        seed,
    } = start_point(setup, service, policy, 0)?;
    let shared = run.shared.clone();
    let rate = |load: f64| load * n as f64 * 1e9 / service.dist.mean_ns();
    if !setup.warmup.is_zero() {
        generator
            .run(
                load_run(service.dist, rate(steps[0].0), setup.warmup, seed ^ 1),
                STOP_WAIT,
            )
            .map_err(|e| anyhow!(e))
            .context("the warm-up run")?;
    }
    let total: Duration = steps.iter().map(|s| s.1).sum();
    let from = Instant::now();
    let cancel = Arc::new(AtomicBool::new(false));
    let sampler = sample(
        socket.clone(),
        setup.iokernel_core,
        // Each step's drain adds a little: sample past the planned end.
        (from, from + total + DRAIN),
        Arc::clone(&shared.batch_paths),
        Arc::clone(&cancel),
    );
    let mut figures = Vec::new();
    let mut ends = Vec::new();
    for (i, &(load, duration)) in steps.iter().enumerate() {
        let mut r = load_run(
            service.dist,
            rate(load),
            duration,
            seed.wrapping_add(i as u64),
        );
        r.drain = Duration::from_millis(20);
        let report = match generator.run(r, STOP_WAIT).map_err(|e| anyhow!(e)) {
            Ok(r) => r,
            Err(e) => {
                cancel.store(true, Relaxed);
                let _ = sampler.join();
                return Err(e.context(format!("load step {i}")));
            }
        };
        ends.push(from.elapsed());
        let (p50, p99, p999) = report::percentiles_us(&report.latency);
        let st = report.stats;
        let mut notes = Vec::new();
        if st.lost() > 0 {
            notes.push(format!("{} requests unanswered", st.lost()));
        }
        let lag_p99_us = report.lag.value_at_quantile(0.99) as f64 / 1e3;
        if lag_p99_us > 50.0 {
            notes.push(format!("generator p99 lag {lag_p99_us:.0} µs"));
        }
        figures.push(StepFigures {
            load,
            p50_us: report::round3(p50),
            p99_us: report::round3(p99),
            p999_us: report::round3(p999),
            sent: st.sent,
            answered: st.replies,
            note: notes.join("; "),
        });
    }
    let samples = sampler
        .join()
        .map_err(|_| anyhow!("the stats sampler panicked"))?
        .context("sampling iokerneld during the steps")?;
    run.stop_all()?;
    let mut out = Vec::new();
    let mut prev = (Duration::ZERO, samples.paths.0);
    for (k, &at) in samples.at.iter().enumerate() {
        let step = ends
            .iter()
            .position(|&e| at <= e)
            .unwrap_or(steps.len() - 1);
        let paths = samples.paths_at[k];
        let dt = at.saturating_sub(prev.0).as_secs_f64();
        out.push(StepSample {
            at,
            step,
            lc_cores: samples.lc_cores[k],
            batch_cores: samples.batch_cores[k],
            batch_paths_per_s: if dt > 0.0 {
                paths.saturating_sub(prev.1) as f64 / dt
            } else {
                0.0
            },
        });
        prev = (at, paths);
    }
    Ok(StepsReport {
        samples: out,
        steps: figures,
    })
}

/// `v` without repeats, in first-seen order.
fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for x in v {
        if !out.contains(x) {
            out.push(*x);
        }
    }
    out
}

/// The JSON output.
#[derive(Serialize)]
struct Report<'a> {
    iokernel_core: usize,
    managed_cores: &'a [usize],
    mean_service_us: f64,
    warmup_ms: f64,
    duration_ms: f64,
    seed: u64,
    /// The park/wake settings of the run.
    lc_spin_us: f64,
    lc_linger_us: f64,
    batch_sched_idle: bool,
    batch_linger_us: f64,
    handover_at_once: bool,
    idle_victim_grace_us: f64,
    /// `--local-wake`'s wait, µs (absent: off).
    local_wake_us: Option<f64>,
    csv: String,
    png: String,
    rows: &'a [Row],
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.policies.is_empty() || args.points.is_empty() || args.services.is_empty() {
        bail!("nothing to run: give at least one policy, service distribution and load point");
    }
    let policies = dedup(&args.policies);
    let services = dedup(&args.services);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the output directory {}", args.out.display()))?;
    let mut setup = Setup::new(
        args.cores.as_ref().map(|c| c.0.as_slice()),
        args.iokernel_core,
        args.warmup,
        args.duration,
        args.seed,
    )?;
    let mut tuning = if args.classic {
        Tuning::classic()
    } else {
        Tuning::default()
    };
    tuning.lc_spin = args.lc_spin.unwrap_or(tuning.lc_spin);
    tuning.lc_linger = args.lc_linger.unwrap_or(tuning.lc_linger);
    tuning.batch_linger = args.batch_linger.unwrap_or(tuning.batch_linger);
    tuning.idle_victim_grace = args.idle_victim_grace.unwrap_or(tuning.idle_victim_grace);
    tuning.local_wake = match args.local_wake {
        Some(off) if off.is_zero() => None,
        Some(wait) => Some(wait),
        None => tuning.local_wake,
    };
    setup.tuning = tuning;
    let iokernel_core = setup.iokernel_core;
    let n = setup.managed.len();
    let mut head = format!(
        "ginza demo: iokerneld on CPU {iokernel_core} (spinning), {n} managed core(s) (CPU {}) \
         shared by lc (latency-critical) and batch\n",
        cpulist::format(&setup.managed)
    );
    if n == 1 {
        head.push_str(
            "  only one managed core on this machine: the two applications take turns on it\n",
        );
    }
    head.push_str(&format!(
        "  lc: spin-server (UDP, a uthread per request spinning for the time the request carries); \
         batch: Monte Carlo option pricing; load: iokerneld's generator, Poisson arrivals; \
         {:?} warm-up + {:?} measured per point\n",
        setup.warmup, setup.duration
    ));
    head.push_str(
        "  latency: reply − injection at iokerneld (open loop); achieved: LC service time spent \
         / capacity;\n  realloc/s: cores moved between lc and batch; LC ans/sent: requests \
         answered / sent\n",
    );
    let t = &setup.tuning;
    head.push_str(&format!(
        "  parking: lc spins {:?} before parking, lingers {:?}; batch {}, lingers {:?}; \
         iokerneld {}\n  ×static: p50 over static's at the same load; batch/spare: batch's \
         paths/s over its paths/s alone on the managed cores (measured after each point) × \
         (1 − achieved)\n",
        t.lc_spin,
        t.lc_linger,
        if t.batch_sched_idle {
            "under SCHED_IDLE"
        } else {
            "at the default Linux class"
        },
        t.batch_linger,
        if t.handover_at_once {
            format!(
                "wakes lc at once on a core taken from a SCHED_IDLE kthread, signals that \
                 kthread after {:?} unless lc gave the core back (withdrawn)",
                t.idle_victim_grace
            )
        } else {
            "waits for every preempted kthread before waking lc".to_string()
        }
    ));
    if let Some(w) = t.local_wake {
        head.push_str(&format!(
            "  local wakes: batch's kthread on the core wakes lc (iokerneld's doorbell, taken at \
             batch's preemption points); iokerneld wakes lc itself after {w:?}\n"
        ));
    }

    // The sweep engine of `ginza bench run` (docs/experiments.md).
    let mut points = Vec::new();
    for &service in &services {
        for &policy in &policies {
            for (i, &load) in args.points.iter().enumerate() {
                points.push((service, policy, i, load));
            }
        }
    }
    let mut rows = crate::experiment::sweep::sweep(
        &points,
        |(service, policy, _, load)| format!("{service} {policy} @ {load:.2}"),
        |_, &(service, policy, i, load)| {
            run_point(&setup, service.into(), policy, load, i).with_context(|| {
                format!("{service} service, policy {policy} at offered load {load}")
            })
        },
    )?;
    report::fill_p50_vs_static(&mut rows);

    let csv = args.out.join("demo.csv");
    let png = args.out.join("demo.png");
    report::write_csv(&csv, &rows)?;
    let names: Vec<&str> = policies.iter().map(|p| p.name()).collect();
    let service_names: Vec<&str> = services.iter().map(|s| s.name()).collect();
    plot::write_png(
        &png,
        &rows,
        &service_names,
        &names,
        &format!(
            "ginza demo: {n} managed core(s), UDP spin-server (mean 10 µs) + batch, {:?} per point",
            setup.duration
        ),
    )?;
    let described: Vec<(&'static str, String)> =
        policies.iter().map(|p| (p.name(), p.describe(n))).collect();
    let service_described: Vec<(&'static str, String)> = services
        .iter()
        .map(|s| (s.name(), s.describe().to_string()))
        .collect();
    let mut table = head;
    table.push_str(&report::render_table(&rows, &service_described, &described));
    table.push_str("\nwhere the requests' time went (p50s, µs; `phases` in the JSON):\n");
    for r in &rows {
        if let Some(p) = &r.phases {
            table.push_str(&format!(
                "  {} {} @ {:.2}: {}\n",
                r.service,
                r.policy,
                r.offered_load,
                phases::describe(p)
            ));
        }
    }
    let noisy = rows.iter().filter(|r| r.quiet == "no").count();
    if noisy > 0 {
        table.push_str(&format!(
            "\nWARNING: {noisy} of {} points ran while other processes competed for the demo's CPUs \
             (rows marked NOT QUIET; `quiet` in the CSV/JSON, over {:.0} % foreign or stolen time): \
             their latencies are not a result of the allocator; rerun on a quiet machine\n",
            rows.len(),
            quiet::NOT_QUIET_PCT
        ));
    }
    table.push_str(&format!(
        "\nwrote {} and {}\n",
        csv.display(),
        png.display()
    ));
    if args.json {
        eprint!("{table}");
        let report = Report {
            iokernel_core,
            managed_cores: &setup.managed,
            mean_service_us: MEAN_SERVICE.as_secs_f64() * 1e6,
            warmup_ms: setup.warmup.as_secs_f64() * 1e3,
            duration_ms: setup.duration.as_secs_f64() * 1e3,
            seed: setup.seed,
            lc_spin_us: setup.tuning.lc_spin.as_secs_f64() * 1e6,
            lc_linger_us: setup.tuning.lc_linger.as_secs_f64() * 1e6,
            batch_sched_idle: setup.tuning.batch_sched_idle,
            batch_linger_us: setup.tuning.batch_linger.as_secs_f64() * 1e6,
            handover_at_once: setup.tuning.handover_at_once,
            idle_victim_grace_us: setup.tuning.idle_victim_grace.as_secs_f64() * 1e6,
            local_wake_us: setup.tuning.local_wake.map(|w| w.as_secs_f64() * 1e6),
            csv: csv.display().to_string(),
            png: png.display().to_string(),
            rows: &rows,
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{table}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_default_to_iokerneld_on_the_first_and_the_rest_managed() {
        assert_eq!(choose_cores(&[0, 1], None, None).unwrap(), (0, vec![1]));
        assert_eq!(
            choose_cores(&[2, 3, 5], None, None).unwrap(),
            (2, vec![3, 5])
        );
        assert_eq!(
            choose_cores(&[0, 1, 2], Some(&[0, 1]), None).unwrap(),
            (2, vec![0, 1])
        );
        assert_eq!(
            choose_cores(&[0, 1, 2], None, Some(1)).unwrap(),
            (1, vec![0, 2])
        );
        let e = choose_cores(&[3], None, None).unwrap_err().to_string();
        assert!(e.contains("at least 2 CPUs") && e.contains("CPU 3"), "{e}");
        let e = choose_cores(&[0, 1], Some(&[0, 1]), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("none is left for iokerneld"), "{e}");
    }

    #[test]
    fn argument_parsers_refuse_nonsense() {
        assert_eq!(parse_load("0.5"), Ok(0.5));
        assert!(parse_load("0").is_err());
        assert!(parse_load("nan").is_err());
        assert!(parse_load("3").is_err());
        assert_eq!(parse_policy("slow"), Ok(Policy::Slow));
        assert_eq!(parse_service("bimodal"), Ok(Service::Bimodal));
        assert!(parse_service("uniform")
            .unwrap_err()
            .contains("expected exponential"));
        assert_eq!(Service::Bimodal.distribution().mean_ns(), 10_000.0);
        assert!(parse_policy("fast").is_err());
        assert!(parse_window("10ms").is_err());
        assert_eq!(parse_window("200ms"), Ok(Duration::from_millis(200)));
        assert!(parse_core_list("").is_err());
        assert!(parse_core_list("1-").is_err());
    }
}
