//! `ginza bench memcached`: Shenango's Fig. 3 on this machine — a
//! memcached server sharing its core with a batch application, Ginza
//! against Linux, in one run.
//!
//! Over a veth pair whose far end is in a network namespace (as `ginza
//! bench tcp`), `ginza loadgen`'s kernel-socket backend in the namespace
//! offers the same open-loop USR load (99.8 % gets of 20-byte keys,
//! 2-byte values; Poisson arrivals, TCP) to:
//!
//! * **ginza**: `kv-server` (one kthread) on a Ginza runtime behind
//!   iokerneld (AF_XDP on the veth, else AF_PACKET), with `batch` (one
//!   kthread) registered beside it as a second, best-effort runtime
//!   application; iokerneld manages the server CPU and gives it to
//!   whichever of the two needs it (docs/runtime.md). kv-server and
//!   iokerneld run in the bench's process; batch is a process of its own
//!   (`batch_process.rs`), as deployed, unless `--batch-in-process`.
//! * **ginza-direct**: the same kv-server and batch, kv-server on the
//!   direct path (docs/direct-path.md): its own AF_XDP socket on a queue
//!   (1 to 63 in turn) of a 64-queue veth, iokerneld on
//!   `af_xdp:IF,direct`, the namespace transmitting on that queue (XPS)
//!   during its points (`harness::direct`).
//!   Its points fail unless most of kv-server's frames crossed its own
//!   socket (`direct_frames`). **ginza-direct-kick-per-frame** (not in the
//!   default `--systems`): the same with a `sendto` per frame sent, as
//!   before the runtime batched its kicks, to compare.
//!   **memcached-ginza-direct** (not in the default `--systems`): the
//!   memcached of memcached-ginza under `ginza run --direct IF:QUEUE`;
//!   asked to exit (SIGTERM) at the end of each point, it writes its own
//!   socket's counts to a file (`GINZA_NET_STATS`), and its points fail
//!   unless that socket carried every request and reply and iokerneld's
//!   NIC saw under a tenth as many frames as there were requests.
//! * **ginza-protected** (not in the default `--systems`; DLibOS Fig. 7):
//!   the same kv-server in protected mode, its TCP/IP stack in the
//!   netstack daemon (`netstackd`, docs/protected.md) registered under the
//!   same iokerneld as a third application; iokerneld steers kv-server's
//!   address to the netstack (an alias on its switch port).
//! * **linux**: Debian's `memcached` (`-t 1`, pinned to the server CPU,
//!   listening on an address of the veth's host end) with the same batch
//!   work (`ginza_apps::batch`) on a thread pinned to the same CPU at
//!   `SCHED_IDLE` (nice 19 if that fails) in the idle cgroup
//!   `ginza-batch` where there is one: Linux's best way to run background
//!   work under a latency-critical server. Ginza's batch process starts in
//!   the same cgroup (`harness::linux_batch::BATCH_CGROUP`: in the bench's
//!   own task group, batch beside the busy generator or iokerneld starved
//!   the kernel's threads on the server CPU; Linux's p99 fell from
//!   114–268 µs to 83–105 µs without it, docs/results.md, session 37).
//! * **memcached-ginza**: the same memcached binary with the same flags
//!   under `ginza run` (its pthreads uthreads, its sockets Ginza sockets
//!   through the preload library), one kthread under the same iokerneld,
//!   with the same `batch` beside it as kv-server has. Beside **ginza** it
//!   shows what the preload library and memcached's own protocol engine
//!   add to kv-server's request path; beside **linux**, the same binary on
//!   both systems. It needs `libginza_preload.so` next to `ginza` (or
//!   `$GINZA_PRELOAD`); without it the default sweep skips it and says so.
//!
//! Each point also says where a request's CPU goes: every component's
//! thread run time (iokerneld's loop, the server's threads, batch, the
//! generator) over the measured part, per answered request, for Ginza and
//! Linux alike (`harness/cpu_split.rs`); the server's and iokerneld's also
//! in user space and in the kernel, which tells Linux's TCP in the kernel
//! from Ginza's in the runtime.
//!
//! After the sweep, with memcached-ginza, [`library_cost`] measures the
//! preload library apart from memcached: a C echo server under `ginza run`
//! against the same echo on the native API (`--library-rounds`).
//!
//! CPUs (this machine has two): the generator is pinned to the first,
//! the servers and batch to the second in both systems; Ginza's
//! iokerneld also sits on the first (Shenango dedicates a core to it; here
//! it shares the generator's). The generator sleeps until each send
//! (loadgen's `spin` 0) at SCHED_FIFO, so its sends go ahead of
//! iokerneld's polling loop and it leaves the rest of that CPU. In
//! Linux's points nothing else runs there, and on a VM a wake of a thread
//! on a halted vCPU can take milliseconds, so a SCHED_IDLE spinner keeps
//! that CPU awake (`--keep-generator-cpu-busy`, `harness/cpu_keeper.rs`);
//! in Ginza's points iokerneld's loop does. The bench
//! itself (iokerneld, the runtimes' kthreads, memcached) runs at nice -10,
//! and its session (autogroup) too (`--session-nice`,
//! `harness/autogroup.rs`): without that, under autogroups, another
//! session's compiler got as much of the server CPU as kv-server did. The load points are swept with systems
//! interleaved (ginza, linux, memcached-ginza, ginza, …), each point `--rounds`
//! times; a point's figures are medians over its rounds. A round whose
//! generator fell behind its schedule (`generator_saturated`) reports no
//! latency: its latencies would be the generator's.
//!
//! [`run_point`] runs one point for one system from a plain
//! [`PointConfig`]; the sweep is a loop over it (so an experiment engine
//! can call it directly).

mod batch_process;
mod ginza_run;
mod library_cost;

pub use batch_process::{batch_role_main, BatchRoleArgs};
pub use ginza_run::GinzaRun;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use ginza_apps::echo_server::Protocols;
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::Kv;
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::{Config as IokConfig, InProcess, PolicyKind};
use ginza_loadgen::protocol::memcached::{Memcached, Mix};
use ginza_loadgen::protocol::{Transport, Workload};
use ginza_loadgen::report::Report as LoadReport;
use ginza_loadgen::schedule::{parse_rate, Arrivals, Process};
use ginza_loadgen::RunConfig;
use ginza_net::{Interface, MacAddr};
use ginza_netstack::daemon::{Daemon, DaemonConfig};
use ginza_proto::parse_duration;
use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::net::NetConfig;
use ginza_runtime::Class;
use ginza_sim::plot::{line_chart, write_csv, Chart, Series};
use serde::Serialize;

use crate::harness::app::{runtime_config, App};
use crate::harness::autogroup::{spawn_in_own_session, AutogroupNice};
use crate::harness::build_kind;
use crate::harness::cpu_keeper::CpuKeeper;
use crate::harness::cpu_split::{Meter, Select};
use crate::harness::direct::{self, DirectFrames};
use crate::harness::figures::{allowed_cpus, emit, median};
use crate::harness::iokerneld::{with_iokerneld_on_veth, Cpus as IokCpus};
use crate::harness::linux_batch::{linux_batch, set_policy, LINUX_BATCH_THREAD};
use batch_process::BatchProcess;

/// Arguments of `ginza bench memcached`.
#[derive(clap::Args, Debug)]
pub struct MemcachedArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Offered loads, requests/s, comma-separated (e.g. 10k,50k,100k).
    #[arg(long, value_delimiter = ',', value_parser = parse_rate,
          default_value = "10k,20k,30k,40k,60k,80k")]
    loads: Vec<f64>,
    /// Measured length of each point (after its warm-up), e.g. 2s.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    duration: Duration,
    /// Load offered before each point's measured part.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    warmup: Duration,
    /// Times each (system, load) point runs; its figures are medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// TCP connections of the generator.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    connections: u64,
    /// Keys in the population (all set before each point).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    keys: u64,
    /// The generator's p99 send lag beyond which a run is marked
    /// generator-saturated (its latencies then not reported). Latency counts
    /// from the scheduled send, so a late send is inside the figures of
    /// both systems alike; the bound catches a generator that cannot keep up.
    #[arg(long, default_value = "500us", value_parser = parse_duration)]
    max_lag: Duration,
    /// The systems to run, comma-separated, in the order each point runs
    /// them [default: ginza,linux,memcached-ginza; memcached-ginza skipped
    /// with a message when the preload library is missing, an error when
    /// named here].
    #[arg(long, value_delimiter = ',', value_enum)]
    systems: Option<Vec<System>>,
    /// Rounds of the library's cost per request (a 64-byte echo through
    /// the preload library against the same echo on the native API,
    /// interleaved; after the sweep, with memcached-ginza); 0: none.
    #[arg(long, default_value_t = 3)]
    library_rounds: u32,
    /// Length of each of those echo series (after its warm-up).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    library_duration: Duration,
    /// Where the CSV and PNGs go.
    #[arg(long, default_value = "results/memcached")]
    out: PathBuf,
    /// Ginza: local wakes (iokerneld's `--local-wake`): batch's kthread on
    /// the server CPU wakes kv-server there, no inter-processor interrupt;
    /// iokerneld wakes it itself after this wait [default: iokerneld's,
    /// 5us; 0: off] (docs/runtime.md, "Local wakes").
    #[arg(long, value_parser = parse_duration)]
    local_wake: Option<Duration>,
    /// Ginza: iokerneld busy-polls even while idle (`--spin`). By default
    /// it may sleep when idle, as the Linux server it is compared with
    /// blocks (docs/iokernel-idle.md); under load it never does, since
    /// batch holds the server core whenever kv-server does not.
    #[arg(long)]
    iokernel_spin: bool,
    /// Ginza: iokerneld's `self_wake` (`--self-wake`): a parked direct-path
    /// server wakes itself for a frame on its own socket
    /// (docs/direct-path.md, "The self-woken kthread") [default:
    /// iokerneld's].
    #[arg(long)]
    self_wake: Option<bool>,
    /// Ginza: iokerneld's `yield_while_idle` (docs/iokernel-idle.md,
    /// "Yielding at idle turns") [default: iokerneld's].
    #[arg(long)]
    idle_yield: Option<bool>,
    /// Ginza: iokerneld's `idle_victim_grace`: how long a `SCHED_IDLE`
    /// batch kthread whose core went to kv-server stays unsignalled, and
    /// keeps the core if kv-server gives it back first (docs/runtime.md,
    /// "Preemptions withdrawn") [default: iokerneld's, 10ms].
    #[arg(long, value_parser = parse_duration)]
    idle_victim_grace: Option<Duration>,
    /// Ginza: kv-server's kthread parks when idle instead of polling
    /// (`poll_while_idle` = 0: the behaviour before idle polling,
    /// docs/idle-poll.md), for a before/after comparison.
    #[arg(long)]
    kv_park: bool,
    /// The nice of this bench's session (its autogroup), for its life:
    /// with autogroups on, Linux shares a CPU between sessions before it
    /// looks at a thread's own nice, so the bench's nice -10 counts against
    /// another session's programs only through this
    /// (`harness/autogroup.rs`); 0 leaves it as it is.
    #[arg(long, default_value_t = -10, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    session_nice: i32,
    /// Ginza: run batch on a thread of this bench, beside the in-process
    /// iokerneld and kv-server, instead of as a process of its own (the
    /// default, as deployed); for a before/after comparison (docs/results.md,
    /// "Session 18: batch's work per CPU-second").
    #[arg(long)]
    batch_in_process: bool,
    /// Linux: keep the generator's CPU from halting with a spinning
    /// SCHED_IDLE thread (`harness/cpu_keeper.rs`): on a VM a generator
    /// asleep on a halted vCPU wakes milliseconds late. Ginza's systems
    /// need none: iokerneld's loop shares that CPU and keeps it awake (a
    /// spinner beside it would take the turns its idle yields give away).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    keep_generator_cpu_busy: bool,
    /// Options added to memcached's own, the same on Linux and under
    /// `ginza run` (split at spaces), e.g. "-o no_lru_maintainer".
    #[arg(long, allow_hyphen_values = true, value_delimiter = ' ')]
    memcached_args: Vec<String>,
}

/// The servers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// kv-server and batch under iokerneld.
    Ginza,
    /// Debian's memcached and a SCHED_IDLE batch thread.
    Linux,
    /// kv-server protected (its stack in netstackd) and batch under
    /// iokerneld.
    GinzaProtected,
    /// Debian's memcached under `ginza run` and batch under iokerneld.
    MemcachedGinza,
    /// kv-server on the direct path (its own AF_XDP socket on a queue of
    /// the veth, iokerneld on `af_xdp:IF,direct`; docs/direct-path.md)
    /// and batch under iokerneld.
    GinzaDirect,
    /// The same, its tx ring kicked once per frame sent (as before
    /// batching): not in the default sweep, for the comparison.
    GinzaDirectKickPerFrame,
    /// memcached under `ginza run --direct` (its own AF_XDP socket
    /// through the preload library) and batch under iokerneld.
    MemcachedGinzaDirect,
}

impl System {
    pub const ALL: [System; 7] = [
        System::Ginza,
        System::GinzaDirect,
        System::GinzaDirectKickPerFrame,
        System::Linux,
        System::MemcachedGinza,
        System::MemcachedGinzaDirect,
        System::GinzaProtected,
    ];

    pub fn name(self) -> &'static str {
        match self {
            System::Ginza => "ginza",
            System::Linux => "linux",
            System::GinzaProtected => "ginza-protected",
            System::MemcachedGinza => "memcached-ginza",
            System::GinzaDirect => "ginza-direct",
            System::GinzaDirectKickPerFrame => "ginza-direct-kick-per-frame",
            System::MemcachedGinzaDirect => "memcached-ginza-direct",
        }
    }

    /// Whether its server is on the direct path.
    pub fn direct(self) -> bool {
        matches!(
            self,
            System::GinzaDirect | System::GinzaDirectKickPerFrame | System::MemcachedGinzaDirect
        )
    }
}

/// Which CPU does what.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Cpus {
    /// The load generator's worker thread.
    pub generator: usize,
    /// iokerneld's own (polling) core.
    pub iokernel: usize,
    /// The server and the batch work (iokerneld's one managed core).
    pub server: usize,
}

/// One point: one system at one offered load.
#[derive(Clone, Debug)]
pub struct PointConfig {
    pub system: System,
    /// Requests/s offered (Poisson).
    pub offered_rps: f64,
    /// The measured part of the run.
    pub duration: Duration,
    /// Load offered before it, not measured.
    pub warmup: Duration,
    pub connections: usize,
    pub keys: u64,
    /// Seed of the arrivals and of the key choice.
    pub seed: u64,
    pub cpus: Cpus,
    /// See `--max-lag`.
    pub max_lag: Duration,
    /// Ginza: iokerneld's core allocator (`bench memcached` runs
    /// shenango). Under `static` kv-server is guaranteed the managed core
    /// and keeps it while idle; under `slow` both applications keep the
    /// cores they hold while idle (as `ginza demo` runs them).
    pub allocator: PolicyKind,
    /// Ginza: iokerneld's `local_wake_wait` (None: iokerneld's default;
    /// zero: off).
    pub local_wake: Option<Duration>,
    /// memcached-ginza: `ginza` and the preload library.
    pub ginza_run: Option<GinzaRun>,
    /// Ginza: iokerneld's `spin` (never sleep while idle).
    pub iokernel_spin: bool,
    /// Ginza: iokerneld's `self_wake` (None: its default).
    pub self_wake: Option<bool>,
    /// Ginza: iokerneld's `yield_while_idle` (None: its default).
    pub idle_yield: Option<bool>,
    /// Ginza: iokerneld's `idle_victim_grace` (None: its default).
    pub idle_victim_grace: Option<Duration>,
    /// Ginza: kv-server parks when idle (`poll_while_idle` = 0).
    pub kv_park: bool,
    /// Ginza: batch on a thread of the bench, not a process of its own.
    pub batch_in_process: bool,
    /// Linux: a spinning SCHED_IDLE thread on the generator's CPU during
    /// the load (see `--keep-generator-cpu-busy`).
    pub keep_generator_cpu_busy: bool,
    /// linux, memcached-ginza(-direct): options added to memcached's own.
    pub memcached_args: Vec<String>,
}

/// What one point measured.
#[derive(Clone, Debug, Serialize)]
pub struct PointResult {
    pub system: System,
    pub offered_krps: f64,
    /// Good answers per second to the requests of the measured part.
    pub achieved_krps: f64,
    /// Latency from each request's scheduled send time; `None` when the
    /// generator was saturated.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    /// Batch paths (ops) per second over the measured part.
    pub batch_ops_per_s: f64,
    /// Batch paths per CPU-second of its threads (the kthreads, or Linux's
    /// thread): its work per CPU time, whatever share of the CPU it got
    /// (docs/results.md, "Session 18: batch's work per CPU-second").
    pub batch_ops_per_cpu_s: Option<f64>,
    pub generator_saturated: bool,
    pub saturation_reason: Option<String>,
    /// Requests unanswered within the timeout, and broken ones.
    pub timeouts: u64,
    pub errors: u64,
    /// What the errors were.
    pub error_kinds: std::collections::BTreeMap<String, u64>,
    /// The generator's CPU utilisation (1.0: its worker always busy).
    pub generator_cpu_util: f64,
    /// The NIC backend (Ginza) or the server program (Linux).
    pub server: String,
    /// Ginza: iokerneld's core grants and preemptions per application
    /// over the point (setup and preload included).
    pub iokerneld: Option<String>,
    /// Ginza: the CPU time of iokerneld's loop thread over the measured
    /// part, ms, and as a share of that time (%; it polls, so near 100
    /// unless it sleeps).
    pub iokerneld_cpu_ms: Option<f64>,
    pub iokerneld_cpu_pct: Option<f64>,
    /// µs of CPU per answered request over the measured part, per
    /// component (iokerneld's loop, the server's threads, batch, the
    /// generator; `harness/cpu_split.rs`); the server's and iokerneld's
    /// also split into "…: in user space" and "…: in the kernel".
    pub cpu_us_per_request: BTreeMap<String, f64>,
    /// How many threads each of those components had.
    pub cpu_threads: BTreeMap<String, usize>,
    /// The direct path: frames kv-server received and sent on its own
    /// socket, its tx ring's kicks, and iokerneld's NIC's frames, over the
    /// point (setup and preload included). memcached-ginza-direct: its own
    /// socket's counts are those its process wrote as it exited
    /// (`GINZA_NET_STATS`).
    pub direct_frames: Option<DirectFrames>,
}

/// A point's figures over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct MedianPoint {
    pub system: System,
    pub offered_krps: f64,
    pub achieved_krps: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub batch_ops_per_s: f64,
    /// Paths per CPU-second of batch's threads, median over the rounds.
    pub batch_ops_per_cpu_s: Option<f64>,
    /// Ginza systems: iokerneld's loop CPU time over the measured part, %
    /// of that time (median over the rounds).
    pub iokerneld_cpu_pct: Option<f64>,
    /// µs of CPU per request per component, median over the rounds.
    pub cpu_us_per_request: BTreeMap<String, f64>,
    /// True when most of its rounds were generator-saturated: the
    /// latencies (then null) would be the generator's, not the server's.
    pub generator_saturated: bool,
    pub saturated_rounds: usize,
    pub rounds: usize,
}

/// Per system the sweep ran, by its name with `_` for `-` (`ginza`,
/// `memcached_ginza_direct`, …): the highest achieved rate among its points
/// whose p99 stayed within the bound, or none (null) if no point did.
type MaxKrps = BTreeMap<String, Option<f64>>;

/// `System::name` as a JSON key.
fn json_key(system: System) -> String {
    system.name().replace('-', "_")
}

/// At one load, memcached-ginza's p50 less kv-server's (both under the
/// same iokerneld, same batch, same run): what the preload library and
/// memcached's own event loop and protocol engine add to a request over
/// kv-server on the native API.
#[derive(Serialize, Debug)]
struct LibraryAndProtocol {
    offered_krps: f64,
    memcached_ginza_p50_us: f64,
    ginza_kv_server_p50_us: f64,
    added_p50_us: f64,
}

#[derive(Serialize, Debug)]
struct Report {
    points: Vec<MedianPoint>,
    /// Per load where both ran unsaturated: memcached-ginza p50 − ginza
    /// (kv-server) p50.
    library_and_protocol_us: Vec<LibraryAndProtocol>,
    /// The preload library's own cost per request (an echo through it
    /// against the same echo on the native API), when measured.
    library_cost: Option<library_cost::LibraryCost>,
    /// Why that measurement failed, if it did (the sweep's figures stand).
    #[serde(skip_serializing_if = "Option::is_none")]
    library_cost_error: Option<String>,
    /// Per system, the highest achieved rate among the points whose p99
    /// stayed within 200 µs (and whose generator kept up).
    max_krps_at_p99_200us: MaxKrps,
    cpus: Cpus,
    duration_s: f64,
    warmup_s: f64,
    connections: usize,
    keys: u64,
    /// Every round of every point, in the order they ran.
    runs: Vec<PointResult>,
    csv: String,
    /// How this binary was built: debug, release or profile-guided
    /// release ([`build_kind`]).
    build: &'static str,
    /// The machine's load averages (1, 5, 15 min) before and after the
    /// sweep: anything else running shares the CPUs of both systems.
    loadavg_before: Option<String>,
    loadavg_after: Option<String>,
    /// The bench's niceness (servers, iokerneld, kthreads), if it could be
    /// set.
    bench_nice: Option<String>,
    /// The nice of the bench's autogroup (session) during the sweep, if
    /// it was set (`--session-nice`).
    session_nice: Option<i32>,
    /// The generator's scheduling policy (chrt's arguments).
    generator_policy: String,
    /// Whether a SCHED_IDLE spinner kept the generator's CPU busy in
    /// Linux's points.
    generator_cpu_kept_busy: bool,
    /// `--memcached-args`: options memcached got beyond its own, on both
    /// systems.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    memcached_args: Vec<String>,
}

/// The p99 bound of `max_krps_at_p99_200us`.
const P99_BOUND_US: f64 = 200.0;
const PORT: u16 = 11211;
/// The host end's address for memcached's turns (`.3`).
const LINUX_HOST_OCTET: u8 = 3;
const KV_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0d, 0x01]);
/// The netstack daemon's own address in the protected points (`.4` of the
/// veth's subnet); kv-server keeps `peer_ip`, steered to the netstack.
const NETSTACK_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0d, 0x02]);
const NETSTACK_OCTET: u8 = 4;
/// Item memory of both servers, MiB.
const MEMORY_MB: usize = 64;
/// A request unanswered this long after its scheduled send times out.
const TIMEOUT: Duration = Duration::from_secs(1);
/// The longest a server may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest kv-server may take to return once told to stop (it looks
/// at its stop flag every few ms).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(args: MemcachedArgs) -> anyhow::Result<()> {
    let allowed = allowed_cpus()?;
    anyhow::ensure!(
        allowed.len() >= 2,
        "ginza bench memcached needs two CPUs (the generator and iokerneld; the servers), this process may use {allowed:?}"
    );
    anyhow::ensure!(
        !args.loads.is_empty() && args.loads.iter().all(|&l| l > 0.0),
        "--loads: give at least one positive rate"
    );
    anyhow::ensure!(!args.duration.is_zero(), "--duration must be positive");
    let cpus = Cpus {
        generator: allowed[0],
        iokernel: allowed[0],
        server: allowed[1],
    };
    let (systems, ginza_run) = systems_to_run(args.systems.as_deref())?;
    let ns = if systems.iter().any(|s| s.direct()) {
        direct::namespace()
    } else {
        NetNs::create()
    };
    let ns = ns.context("ginza bench memcached runs over a veth pair")?;
    memcached_available()?;
    let loadavg_before = crate::harness::figures::loadavg();
    let reniced = renice_self(BENCH_NICE);
    let session = (args.session_nice != 0)
        .then(|| AutogroupNice::set(args.session_nice))
        .flatten();
    // Rounds outermost, systems innermost (ginza, linux, ginza, …), through
    // the experiments' sweep loop (docs/experiments.md).
    let mut plan = Vec::new();
    for round in 0..args.rounds {
        for (i, &load) in args.loads.iter().enumerate() {
            for &system in &systems {
                plan.push((round, i, load, system));
            }
        }
    }
    let runs = crate::harness::sweep::sweep(
        &plan,
        |&(round, _, load, system)| {
            format!("round {round}: {} at {load:.0} requests/s", system.name())
        },
        |_, &(round, i, load, system)| {
            let cfg = PointConfig {
                system,
                offered_rps: load,
                duration: args.duration,
                warmup: args.warmup,
                connections: args.connections as usize,
                keys: args.keys,
                // Both systems get the same arrivals at a point.
                seed: 1 + u64::from(round) * 1000 + i as u64,
                cpus,
                max_lag: args.max_lag,
                allocator: PolicyKind::Shenango,
                local_wake: args.local_wake.filter(|w| !w.is_zero()),
                ginza_run: ginza_run.clone(),
                iokernel_spin: args.iokernel_spin,
                self_wake: args.self_wake,
                idle_yield: args.idle_yield,
                idle_victim_grace: args.idle_victim_grace,
                kv_park: args.kv_park,
                batch_in_process: args.batch_in_process,
                keep_generator_cpu_busy: args.keep_generator_cpu_busy,
                memcached_args: args.memcached_args.clone(),
            };
            let r = run_point(&ns, &cfg)?;
            eprintln!("{}", row(&r));
            Ok(r)
        },
    )?;
    let library_cost = match &ginza_run {
        Some(run) if args.library_rounds > 0 => {
            let iok_cpus = IokCpus {
                iokernel: cpus.iokernel,
                app: cpus.server,
            };
            let direct = systems.contains(&System::MemcachedGinzaDirect);
            let measured = library_cost::measure(
                &ns,
                iok_cpus,
                run,
                (args.library_rounds, direct),
                args.library_duration,
            );
            Some(measured.map_err(|e| format!("{e:#}")))
        }
        _ => None,
    };
    let points = medians(&runs, &args.loads);
    let csv = args.out.join("memcached.csv");
    write_outputs(&args.out, &csv, &points)?;
    let report = Report {
        max_krps_at_p99_200us: max_krps_by_system(&points, &systems),
        library_and_protocol_us: library_and_protocol(&points),
        library_cost: library_cost.as_ref().and_then(|r| r.as_ref().ok().cloned()),
        library_cost_error: library_cost.and_then(Result::err),
        points,
        cpus,
        duration_s: args.duration.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        connections: args.connections as usize,
        keys: args.keys,
        runs,
        csv: csv.display().to_string(),
        build: build_kind(),
        loadavg_before,
        loadavg_after: crate::harness::figures::loadavg(),
        bench_nice: reniced.then(|| BENCH_NICE.to_string()),
        session_nice: session.as_ref().map(|s| s.now),
        generator_policy: format!("{} {}", GENERATOR_POLICY.0, GENERATOR_POLICY.1),
        generator_cpu_kept_busy: args.keep_generator_cpu_busy,
        memcached_args: args.memcached_args.clone(),
    };
    emit(args.json, &render(&report), &report)
}

/// The systems of the sweep, and `ginza run`'s paths when memcached-ginza
/// is among them. By default memcached-ginza runs when the preload library
/// is found, and is dropped with a message when not; named in `--systems`,
/// a missing library is an error.
fn systems_to_run(asked: Option<&[System]>) -> anyhow::Result<(Vec<System>, Option<GinzaRun>)> {
    let mut systems = asked.map_or_else(
        || {
            vec![
                System::Ginza,
                System::GinzaDirect,
                System::Linux,
                System::MemcachedGinza,
            ]
        },
        <[System]>::to_vec,
    );
    anyhow::ensure!(!systems.is_empty(), "--systems: name at least one system");
    let under_ginza_run = [System::MemcachedGinza, System::MemcachedGinzaDirect];
    if !systems.iter().any(|s| under_ginza_run.contains(s)) {
        return Ok((systems, None));
    }
    match ginza_run::locate() {
        Ok(run) => Ok((systems, Some(run))),
        Err(e) if asked.is_some() => Err(e.context("--systems names memcached-ginza")),
        Err(e) => {
            eprintln!("skipping memcached-ginza (memcached under `ginza run`): {e:#}");
            systems.retain(|s| !under_ginza_run.contains(s));
            Ok((systems, None))
        }
    }
}

/// The generator's scheduling (chrt's arguments): its wake-ups go ahead
/// of iokerneld's loop on the CPU they share, and of other programs on the
/// machine; asleep between sends, it leaves the rest of the CPU.
const GENERATOR_POLICY: (&str, &str) = ("--fifo", "1");
/// The niceness of the bench's own threads (iokerneld, the runtimes'
/// kthreads) and of memcached: both systems ahead of whatever else runs on
/// this machine.
const BENCH_NICE: &str = "-10";

/// Renices this thread (threads and processes started from it inherit
/// it); false if it failed (not root).
fn renice_self(nice: &str) -> bool {
    let tid = ginza_sys::process::gettid().to_string();
    Command::new("renice")
        .args(["-n", nice, "-p", &tid])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs one point: starts `cfg.system`'s server and batch work, offers the
/// load from the namespace, stops them.
pub fn run_point(ns: &NetNs, cfg: &PointConfig) -> anyhow::Result<PointResult> {
    match cfg.system {
        System::Linux => linux_point(ns, cfg),
        _ => ginza_point(ns, cfg),
    }
}

/// An error unless Debian's memcached can be started.
pub fn memcached_available() -> anyhow::Result<()> {
    let out = Command::new("memcached")
        .arg("-V")
        .output()
        .context("running `memcached -V` (Debian package memcached)")?;
    anyhow::ensure!(out.status.success(), "`memcached -V` failed: {out:?}");
    Ok(())
}

/// The loadgen run of a point against `target`.
fn load_config(cfg: &PointConfig, target: SocketAddr) -> RunConfig {
    RunConfig {
        target,
        transport: Transport::Tcp,
        workload: Workload::Memcached(Memcached {
            mix: Mix::Usr,
            keys: cfg.keys,
            // Set by `measure` before the batch window starts.
            preload: false,
        }),
        arrivals: Arrivals::steady(Process::Poisson, cfg.offered_rps, cfg.warmup + cfg.duration),
        warmup: cfg.warmup,
        connections: cfg.connections,
        threads: 1,
        timeout: TIMEOUT,
        max_lag: cfg.max_lag,
        // Asleep until each send: the generator shares its CPU with
        // iokerneld's polling loop, which a spinning generator would take
        // turns with (milliseconds of lag).
        spin: Duration::ZERO,
        seed: cfg.seed,
        cpus: vec![cfg.cpus.generator],
        connect_timeout: Duration::from_secs(5),
    }
}

/// Sets the keys from the namespace, then offers the load while counting
/// the batch work done in the measured part.
fn measure(
    ns: &NetNs,
    cfg: &PointConfig,
    target: SocketAddr,
    batch_ops: BatchCount,
    iokerneld: Option<&InProcess>,
    server: String,
    mut meter: Meter,
) -> anyhow::Result<PointResult> {
    let load = load_config(cfg, target);
    let keys = cfg.keys;
    ns.run_in(move || -> anyhow::Result<()> {
        // A server registers (and is reported started) before it listens,
        // and a protected one's address is answered by netstackd, which may
        // not have had a core for the kernel's ARP tries yet: refusals and
        // an unreachable host are retried for a while.
        let t0 = Instant::now();
        let s = loop {
            match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
                Ok(s) => break s,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::HostUnreachable
                    ) && t0.elapsed() < START_TIMEOUT =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("connecting to {target} to set the keys"))
                }
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let m = Memcached {
            mix: Mix::Usr,
            keys,
            preload: true,
        };
        let stored = m
            .preload_on(&s, 256)
            .with_context(|| format!("setting {keys} keys on {target}"))?;
        anyhow::ensure!(stored == keys, "{stored} of {keys} keys were stored");
        Ok(())
    })??;
    // The batch count over the measured part: from the end of the warm-up
    // to the end of the schedule (the generator's start is a few ms after
    // `start`: its threads and connections).
    // iokerneld's loop CPU time over the same window, from its stats.
    let (warmup, duration) = (cfg.warmup, cfg.duration);
    let socket = iokerneld.map(|i| i.socket().to_path_buf());
    let loop_cpu = move || {
        let s = socket.as_deref()?;
        ginza_proto::client::stats(s).ok().map(|r| r.loop_cpu_ns)
    };
    let keeper = (cfg.keep_generator_cpu_busy && iokerneld.is_none())
        .then(|| CpuKeeper::start(cfg.cpus.generator))
        .transpose()
        .context("--keep-generator-cpu-busy (false runs without it)")?;
    let start = Instant::now();
    let counter = std::thread::spawn(move || {
        std::thread::sleep(warmup);
        let (t0, n0, c0, m0) = (Instant::now(), batch_ops.read(), loop_cpu(), meter.read());
        std::thread::sleep(duration);
        let (t1, n1, c1, m1) = (Instant::now(), batch_ops.read(), loop_cpu(), meter.read());
        let secs = (t1 - t0).as_secs_f64();
        let cpu_ms = c0.zip(c1).map(|(a, b)| b.saturating_sub(a) as f64 / 1e6);
        (
            n0.and_then(|n0| Ok(n1?.saturating_sub(n0) as f64 / secs)),
            cpu_ms,
            cpu_ms.map(|ms| ms / 10.0 / secs),
            move |requests_per_s: f64| {
                let split = meter.per_request(&m0, &m1, requests_per_s * secs);
                (split, meter.threads())
            },
        )
    });
    let report: LoadReport = ns.run_in(move || {
        // Its workers inherit the policy (see `GENERATOR_POLICY`).
        anyhow::ensure!(
            set_policy(ginza_sys::process::gettid(), GENERATOR_POLICY),
            "chrt {GENERATOR_POLICY:?} failed on the generator's thread"
        );
        ginza_loadgen::kernel::run(&load)
    })??;
    drop(keeper);
    let (batch, cpu_ms, cpu_pct, split) = counter
        .join()
        .map_err(|_| anyhow!("the batch counter panicked"))?;
    let batch = batch.context("counting batch's paths")?;
    anyhow::ensure!(
        start.elapsed() >= warmup + duration,
        "the generator returned before its schedule was over"
    );
    let mut r = point_result(cfg, &report, batch, server);
    r.iokerneld_cpu_ms = cpu_ms;
    r.iokerneld_cpu_pct = cpu_pct;
    (r.cpu_us_per_request, r.cpu_threads) = split(report.achieved_rps);
    r.batch_ops_per_cpu_s = per_cpu_second(&r, report.achieved_rps);
    Ok(r)
}

/// Batch's paths per CPU-second of its threads: the split's µs per request
/// times the requests per second is the CPU-seconds per second they ran.
fn per_cpu_second(r: &PointResult, requests_per_s: f64) -> Option<f64> {
    let us = r
        .cpu_us_per_request
        .iter()
        .find_map(|(k, v)| k.starts_with("batch").then_some(*v))?;
    let cpu_s_per_s = us * requests_per_s / 1e6;
    (cpu_s_per_s > 0.0).then(|| r.batch_ops_per_s / cpu_s_per_s)
}

fn point_result(cfg: &PointConfig, r: &LoadReport, batch: f64, server: String) -> PointResult {
    // No latency from a run with no answer, or whose generator fell behind.
    let latency = |v: f64| (!r.generator_saturated && r.completed > 0).then_some(v);
    PointResult {
        system: cfg.system,
        offered_krps: cfg.offered_rps / 1e3,
        achieved_krps: r.achieved_rps / 1e3,
        p50_us: latency(r.latency.p50_us),
        p99_us: latency(r.latency.p99_us),
        p999_us: latency(r.latency.p999_us),
        batch_ops_per_s: batch,
        batch_ops_per_cpu_s: None,
        generator_saturated: r.generator_saturated,
        saturation_reason: r.saturation_reason.clone(),
        timeouts: r.timeouts,
        errors: r.errors + r.error_answers + r.unmatched,
        error_kinds: r.error_kinds.clone(),
        generator_cpu_util: r.generator_cpu_util,
        server,
        iokerneld: None,
        iokerneld_cpu_ms: None,
        iokerneld_cpu_pct: None,
        cpu_us_per_request: BTreeMap::new(),
        cpu_threads: BTreeMap::new(),
        direct_frames: None,
    }
}

/// kv-server and batch under iokerneld on the veth (AF_XDP, else
/// AF_PACKET).
fn ginza_point(ns: &NetNs, cfg: &PointConfig) -> anyhow::Result<PointResult> {
    let cpus = IokCpus {
        iokernel: cfg.cpus.iokernel,
        app: cfg.cpus.server,
    };
    let configure = |icfg: &mut IokConfig| {
        icfg.policy = cfg.allocator;
        if let Some(w) = cfg.local_wake {
            icfg.local_wake_wait = (!w.is_zero()).then_some(w);
        }
        icfg.spin = cfg.iokernel_spin;
        if let Some(w) = cfg.self_wake {
            icfg.self_wake = w;
        }
        if let Some(y) = cfg.idle_yield {
            icfg.yield_while_idle = y;
        }
        if let Some(g) = cfg.idle_victim_grace {
            icfg.idle_victim_grace = g;
        }
        Ok(())
    };
    if cfg.system.direct() {
        return direct::with_iokerneld_direct(ns, cpus, configure, |iokerneld, queue| {
            ginza_serving(ns, cfg, iokerneld, ("af_xdp,direct", Some(queue)))
        });
    }
    let (_, result) = with_iokerneld_on_veth(ns, cpus, configure, |iokerneld, backend| {
        ginza_serving(ns, cfg, iokerneld, (backend, None))
    })?;
    Ok(result)
}

/// kv-server (or memcached) and batch on `iokerneld`; the server on its own
/// socket on queue `direct`, if given.
fn ginza_serving(
    ns: &NetNs,
    cfg: &PointConfig,
    iokerneld: &InProcess,
    (backend, direct): (&str, Option<u32>),
) -> anyhow::Result<PointResult> {
    if matches!(
        cfg.system,
        System::MemcachedGinza | System::MemcachedGinzaDirect
    ) {
        return memcached_ginza_serving(ns, cfg, iokerneld, (backend, direct));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let keeps = cfg.allocator != PolicyKind::Shenango;
    let guaranteed = u32::from(cfg.allocator == PolicyKind::Static);
    let mut server_cfg = runtime_config(iokerneld, "kv-server", Class::LatencyCritical);
    if let Some(io) = server_cfg.iokernel.as_mut() {
        io.poll_while_idle = if cfg.kv_park {
            Duration::ZERO
        } else {
            ginza_runtime::POLL_WHILE_IDLE
        };
    }
    let me = Interface {
        mac: KV_MAC,
        ip: ns.peer_ip,
    };
    let mut netstack = if cfg.system == System::GinzaProtected {
        let [a, b, c, _] = ns.peer_ip.octets();
        let mut ns_cfg = DaemonConfig::new(Interface {
            mac: NETSTACK_MAC,
            ip: Ipv4Addr::new(a, b, c, NETSTACK_OCTET),
        });
        ns_cfg.iokernel_socket = iokerneld.socket().to_path_buf();
        ns_cfg.attach_socket = iokerneld.socket().with_file_name("netstack.sock");
        ns_cfg.kthreads = 1;
        // As `--protected` configures an application (`AppArgs::
        // runtime_config`): cores from iokerneld, the stack in netstackd.
        server_cfg.protected = Some(ProtectedConfig::new(
            ns_cfg.attach_socket.clone(),
            "kv-server",
            me,
        ));
        Some(Daemon::start(ns_cfg).context("the netstack daemon")?)
    } else {
        if let Some(io) = server_cfg.iokernel.as_mut() {
            io.net = Some(NetConfig::new(me.mac, me.ip));
        }
        if let Some(queue) = direct {
            let kick_per_frame = cfg.system == System::GinzaDirectKickPerFrame;
            direct::enable(&mut server_cfg, ns, queue, kick_per_frame);
        }
        None
    };
    if let Some(io) = server_cfg.iokernel.as_mut() {
        io.guaranteed = guaranteed;
        io.keep_cores_when_idle = keeps;
    }
    let server_name = if netstack.is_some() {
        "kv-server --protected, its stack in netstackd"
    } else {
        "kv-server"
    };
    let store = Store::new(
        StoreConfig::new(MEMORY_MB << 20, 1 << 20),
        Arc::new(SystemClock),
    );
    let kv = Kv::new(store);
    let s2 = stop.clone();
    let mut server = App::start_configured(iokerneld, "kv-server", server_cfg, move || {
        let served = ginza_apps::kv::server::serve(
            PORT,
            Protocols {
                udp: false,
                tcp: true,
            },
            kv,
            s2,
        );
        (served, ginza_runtime::net::stats())
    })?;
    let nic_before = iokerneld.stats()?;
    let server_kthreads = kthreads_here();
    // kv-server holds its guarantee before batch arrives: `static` never
    // takes a core back.
    let held = wait_for_cores(iokerneld, "kv-server", guaranteed);
    let batch = held.and_then(|()| GinzaBatch::start(iokerneld, cfg));
    let measured = batch.and_then(|mut batch| {
        let target = SocketAddr::V4(SocketAddrV4::new(ns.peer_ip, PORT));
        let label = format!("{server_name} ({backend}){}", batch.label());
        let mut meter = common_meter(cfg);
        meter.add("batch kthreads", batch.kthreads(&server_kthreads));
        meter.add_split("server: kv-server kthreads", Select::Tids(server_kthreads));
        let m = measure_beside(ns, cfg, target, &batch, iokerneld, label, meter);
        batch.stop();
        // The server first: under `static` it keeps the one managed core
        // while idle, and batch sees its stop only once it runs.
        stop.store(true, Relaxed);
        if netstack.is_some() {
            // Protected: the netstack leaves iokerneld once kv-server has
            // detached, so that batch gets the managed core to see its stop
            // (with the netstack still registered it waited for a grant).
            let t0 = Instant::now();
            while !server.is_finished() && t0.elapsed() < START_TIMEOUT {
                std::thread::sleep(Duration::from_millis(5));
            }
            drop(netstack.take());
        }
        check_price(batch.finish()?)?;
        m
    });
    stop.store(true, Relaxed);
    let nic_after = iokerneld.stats();
    // Bounded: a server that never stops (session 35: iokerneld booked its
    // kthread running while it slept, so the timer that sees the stop
    // flag never fired) fails the point rather than hanging the sweep.
    let served = server
        .join_within(STOP_TIMEOUT)
        .and_then(|(r, net)| r.context("kv-server").map(|()| net));
    // After kv-server: it detaches from the netstack first.
    drop(netstack);
    let mut m = match (measured, served) {
        (Ok(m), Ok(net)) => (m, net),
        (Err(m), Err(s)) => return Err(s.context(format!("(the measurement: {m:#})"))),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(e),
    };
    if cfg.system.direct() {
        let frames = DirectFrames::of(m.1.as_ref(), &nic_before, &nic_after?)?;
        // Most of kv-server's frames took its own socket: a miss of the XDP
        // program (before the socket is in its maps) falls back to the
        // switch path, which would then be what was measured.
        anyhow::ensure!(
            frames.own_rx > frames.iokernel_nic_rx && frames.own_tx > frames.iokernel_nic_tx,
            "kv-server on the direct path: {frames:?}: most frames went through iokerneld"
        );
        m.0.direct_frames = Some(frames);
    }
    Ok(m.0)
}

/// The batch application beside a Ginza server: a process of its own, as
/// deployed (`batch_process.rs`), or with `--batch-in-process` a runtime
/// on a thread of the bench, as before session 18 (for comparison).
enum GinzaBatch {
    Process(Arc<BatchProcess>),
    InProcess {
        app: App<f64>,
        paths: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
    },
}

impl GinzaBatch {
    /// Starts it; registered with iokerneld when this returns.
    fn start(iokerneld: &InProcess, cfg: &PointConfig) -> anyhow::Result<GinzaBatch> {
        let keep_cores = cfg.allocator != PolicyKind::Shenango;
        if !cfg.batch_in_process {
            return BatchProcess::start(iokerneld, "batch", cfg.seed, keep_cores)
                .map(GinzaBatch::Process);
        }
        let paths = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p2, b2, seed) = (paths.clone(), stop.clone(), cfg.seed);
        let mut batch_cfg = runtime_config(iokerneld, "batch", Class::Batch);
        if let Some(io) = batch_cfg.iokernel.as_mut() {
            io.keep_cores_when_idle = keep_cores;
        }
        let app = App::start_configured(iokerneld, "batch", batch_cfg, move || {
            ginza_apps::batch::price_until_stopped(1, p2, b2, seed)
        })?;
        Ok(GinzaBatch::InProcess { app, paths, stop })
    }

    /// How the measurement reads its paths.
    fn count(&self) -> BatchCount {
        match self {
            GinzaBatch::Process(p) => BatchCount::Process(p.clone()),
            GinzaBatch::InProcess { paths, .. } => BatchCount::Thread(paths.clone()),
        }
    }

    /// Its kthreads, for their CPU time: the child's, or this process's
    /// other than the server's (`server_kthreads`).
    fn kthreads(&self, server_kthreads: &[i32]) -> Select {
        match self {
            GinzaBatch::Process(p) => Select::Named {
                pid: p.pid(),
                name: "ginza-k*",
            },
            GinzaBatch::InProcess { .. } => Select::Tids(
                kthreads_here()
                    .into_iter()
                    .filter(|t| !server_kthreads.contains(t))
                    .collect(),
            ),
        }
    }

    /// What the server's label says of it.
    fn label(&self) -> &'static str {
        match self {
            GinzaBatch::Process(_) => "",
            GinzaBatch::InProcess { .. } => ", batch in the bench's process",
        }
    }

    /// Asks it to stop (an in-process one sees the flag once it runs).
    fn stop(&self) {
        if let GinzaBatch::InProcess { stop, .. } = self {
            stop.store(true, Relaxed);
        }
    }

    /// Stops it and waits for its price.
    fn finish(&mut self) -> anyhow::Result<f64> {
        self.stop();
        match self {
            GinzaBatch::Process(p) => p.finish(),
            GinzaBatch::InProcess { app, .. } => app.join(),
        }
    }
}

/// How a point reads the batch paths done so far.
enum BatchCount {
    /// A counter this process's batch adds to.
    Thread(Arc<AtomicU64>),
    /// Ask the batch child.
    Process(Arc<BatchProcess>),
}

impl BatchCount {
    fn read(&self) -> anyhow::Result<u64> {
        match self {
            BatchCount::Thread(paths) => Ok(paths.load(Relaxed)),
            BatchCount::Process(p) => p.paths(),
        }
    }
}

/// An error unless batch's result is the price its real work computes (0
/// when it did no path at all).
fn check_price(price: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        price == 0.0 || (price - 8.0214).abs() < 1.0,
        "batch priced the call at {price}: its work was not real"
    );
    Ok(())
}

/// [`measure`] of a Ginza server beside Ginza's batch, with iokerneld's
/// grants and preemptions per application.
fn measure_beside(
    ns: &NetNs,
    cfg: &PointConfig,
    target: SocketAddr,
    batch: &GinzaBatch,
    iokerneld: &InProcess,
    label: String,
    meter: Meter,
) -> anyhow::Result<PointResult> {
    let mut m = measure(
        ns,
        cfg,
        target,
        batch.count(),
        Some(iokerneld),
        label,
        meter,
    )?;
    m.iokerneld = grants_summary(iokerneld);
    Ok(m)
}

/// iokerneld's grants and preemptions per application, one line, and its
/// self-wakes where there were any (`--self-wake`: the evidence that they
/// happened at this point).
fn grants_summary(iokerneld: &InProcess) -> Option<String> {
    iokerneld.stats().ok().map(|s| {
        let mut parts: Vec<String> = s
            .apps
            .iter()
            .map(|a| {
                format!(
                    "{}: {} grants, {} preemptions, {} overdue",
                    a.name, a.grants, a.preemptions, a.preempt_overdue
                )
            })
            .collect();
        if s.alloc.self_wakes > 0 {
            parts.push(format!(
                "self-wakes: {} ({} revoked)",
                s.alloc.self_wakes, s.alloc.self_wakes_revoked
            ));
        }
        // Preemptions of a `SCHED_IDLE` kthread that did not reach it:
        // the rest of batch's preemptions were signals it yielded to.
        parts.push(format!(
            "preemptions withdrawn: {}",
            s.alloc.preemptions_withdrawn
        ));
        // Parks that answered a grant already answered: each a wake-up
        // that was no grant, or a grant crossing a self-wake.
        parts.push(format!("stale parks: {}", s.stale_parks));
        parts.join("; ")
    })
}

/// Debian's memcached under `ginza run` and batch under iokerneld: as
/// kv-server's point, the server a process of its own.
fn memcached_ginza_serving(
    ns: &NetNs,
    cfg: &PointConfig,
    iokerneld: &InProcess,
    (backend, direct): (&str, Option<u32>),
) -> anyhow::Result<PointResult> {
    let run = cfg.ginza_run.as_ref().context(
        "memcached-ginza needs `ginza` and the preload library (PointConfig::ginza_run)",
    )?;
    let addr = SocketAddrV4::new(ns.peer_ip, PORT);
    let direct = direct.map(|queue| format!("{}:{queue}", ns.host_if));
    // On the direct path its own socket's counts are in the child: it
    // writes them here as it exits (`GINZA_NET_STATS`).
    let net_stats = direct
        .as_ref()
        .map(|_| crate::harness::iokerneld::socket_dir("memcached-net-stats"));
    let nic_before = iokerneld.stats()?;
    let at = ginza_run::Placement {
        mac: KV_MAC,
        ip: ns.peer_ip,
        direct: direct.as_deref(),
        net_stats: net_stats.as_deref(),
    };
    let mut server = ginza_run::start(
        run,
        iokerneld,
        at,
        ginza_run::MEMCACHED,
        (
            Path::new("memcached"),
            &memcached_args(addr, &cfg.memcached_args),
        ),
    )?;
    let batch = GinzaBatch::start(iokerneld, cfg);
    let measured = batch.and_then(|mut batch| {
        let label = format!(
            "memcached -t 1 under ginza run ({backend}){}",
            batch.label()
        );
        let pid = server.0.id() as i32;
        let mut meter = common_meter(cfg);
        meter.add_split(
            "server: memcached, all threads",
            Select::Named { pid, name: "*" },
        );
        meter.add(
            "  of which kthreads",
            Select::Named {
                pid,
                name: "ginza-k*",
            },
        );
        meter.add(
            "  of which the blocking pool",
            Select::Named {
                pid,
                name: "ginza-blocking",
            },
        );
        meter.add(
            "  of which epoll watchers",
            Select::Named {
                pid,
                name: "ginza-epwatch",
            },
        );
        meter.add("batch kthreads", batch.kthreads(&[]));
        let target = SocketAddr::V4(addr);
        let m = measure_beside(ns, cfg, target, &batch, iokerneld, label, meter);
        batch.stop();
        // Still running? A crash during the run is the measurement's error.
        let alive = match server.0.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(anyhow!(
                "memcached under ginza run exited ({status}) during the point: {}",
                server.stderr()
            )),
            Err(e) => Err(e.into()),
        };
        // The server goes first: batch sees its stop once it has the core.
        // On the direct path it is asked to exit (SIGTERM), so that it
        // writes its counters.
        let exited = match &net_stats {
            Some(_) => server.terminate(MEMCACHED_EXIT),
            None => {
                server.stop();
                Ok(())
            }
        };
        check_price(batch.finish()?)?;
        alive?;
        exited?;
        m
    });
    server.stop();
    let mut measured = measured?;
    if let Some(path) = net_stats {
        let counters = ginza_run::read_net_stats(&path);
        let _ = std::fs::remove_file(&path);
        let frames = memcached_direct_frames(&counters?, &nic_before, &iokerneld.stats()?);
        let requests = (measured.achieved_krps * 1e3 * cfg.duration.as_secs_f64()) as u64;
        // Its requests and replies crossed its own socket, and iokerneld's
        // NIC saw (almost) none of them.
        anyhow::ensure!(
            frames.own_rx >= requests
                && frames.own_tx >= requests
                && frames.iokernel_nic_rx < requests / 10,
            "memcached on the direct path: {frames:?} for {requests} requests: \
             they did not take its own socket"
        );
        measured.direct_frames = Some(frames);
    }
    Ok(measured)
}

/// How long memcached under `ginza run` may take to exit after SIGTERM
/// (its main loop looks at the signal's flag at least once a second).
const MEMCACHED_EXIT: Duration = Duration::from_secs(5);

/// memcached's own socket's counts (`GINZA_NET_STATS`, written as it
/// exited) and iokerneld's NIC's over its life.
fn memcached_direct_frames(
    counters: &BTreeMap<String, u64>,
    before: &ginza_proto::StatsReport,
    after: &ginza_proto::StatsReport,
) -> DirectFrames {
    let get = |name: &str| counters.get(name).copied().unwrap_or(0);
    let own = ["direct_rx_packets", "direct_tx_packets", "direct_tx_kicks"].map(get);
    DirectFrames::with_nic(own, before, after)
}

/// The library's cost on one path, three lines of the report.
fn path_cost_lines(c: &library_cost::PathCost) -> String {
    format!(
        "  native API                     p50 {:>7.1} µs  p99 {:>8.1} µs\n  \
         C, blocking, under ginza run   p50 {:>7.1} µs  p99 {:>8.1} µs  (the library adds {:+.1} µs)\n  \
         C, epoll, under ginza run      p50 {:>7.1} µs  p99 {:>8.1} µs  (the library adds {:+.1} µs)",
        c.native_api_p50_us,
        c.native_api_p99_us,
        c.c_under_ginza_run_p50_us,
        c.c_under_ginza_run_p99_us,
        c.added_p50_us,
        c.c_epoll_under_ginza_run_p50_us,
        c.c_epoll_under_ginza_run_p99_us,
        c.added_with_epoll_p50_us
    )
}

/// The components every system has: the generator's threads and, under
/// Ginza, iokerneld's loop (both threads of this process).
fn common_meter(cfg: &PointConfig) -> Meter {
    let me = std::process::id() as i32;
    let mut m = Meter::new(&[cfg.cpus.generator, cfg.cpus.server]);
    m.add(
        "generator",
        Select::Named {
            pid: me,
            name: "loadgen-*",
        },
    );
    if cfg.system != System::Linux {
        m.add_split(
            "iokerneld loop",
            Select::Named {
                pid: me,
                name: "iokerneld",
            },
        );
    }
    m
}

/// The runtime kthreads of this process now (kv-server's, batch's).
fn kthreads_here() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir(format!("/proc/{me}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/{me}/task/{tid}/comm"))
                .is_ok_and(|c| c.starts_with("ginza-k"))
        })
        .collect()
}

/// Waits until application `name` holds at least `cores` cores.
fn wait_for_cores(iokerneld: &InProcess, name: &str, cores: u32) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while !iokerneld.stats().is_ok_and(|s| {
        s.apps
            .iter()
            .any(|a| a.name == name && a.cores_now >= cores)
    }) {
        anyhow::ensure!(
            t0.elapsed() < START_TIMEOUT,
            "{name} did not get its {cores} guaranteed core(s) within {START_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// A process this bench started, killed on drop.
struct Started(Child);

impl Started {
    /// Kills it (if still running) and reaps it.
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// Asks it to exit (SIGTERM) and waits for it up to `within`; killed
    /// and an error if it is still running then, or if it exited with a
    /// failure.
    fn terminate(&mut self, within: Duration) -> anyhow::Result<()> {
        let pid = rustix::process::Pid::from_child(&self.0);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .context("SIGTERM to the server")?;
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait()? {
                anyhow::ensure!(
                    status.success(),
                    "the server exited with {status} after SIGTERM: {}",
                    self.stderr()
                );
                return Ok(());
            }
            if t0.elapsed() > within {
                self.stop();
                bail!("the server was still running {within:?} after SIGTERM: killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What it wrote on stderr (once it has exited).
    fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        err
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        self.stop();
    }
}

/// memcached's flags in both systems: `addr`, no UDP; one worker thread
/// for the one server CPU (more would only time-share it); 4096
/// connections; room for the keys; as root, a user to become (memcached
/// refuses to run as root without one); then `extra` (`--memcached-args`).
fn memcached_args(addr: SocketAddrV4, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "-l",
        &addr.ip().to_string(),
        "-p",
        &addr.port().to_string(),
        "-U",
        "0",
        "-t",
        "1",
        "-c",
        "4096",
        "-m",
        &MEMORY_MB.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if ginza_sys::process::geteuid() == 0 {
        args.extend(["-u".to_string(), "root".to_string()]);
    }
    args.extend(extra.iter().cloned());
    args
}

/// Debian's memcached, one worker thread, pinned to the server CPU.
fn start_memcached(addr: SocketAddrV4, cpu: usize, extra: &[String]) -> anyhow::Result<Started> {
    let mut command = Command::new("taskset");
    command
        .args(["-c", &cpu.to_string(), "memcached"])
        .args(memcached_args(addr, extra))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = Started(
        spawn_in_own_session(&mut command)
            .context("starting `taskset … memcached` (Debian packages util-linux, memcached)")?,
    );
    let t0 = Instant::now();
    loop {
        if TcpStream::connect_timeout(&SocketAddr::V4(addr), Duration::from_millis(200)).is_ok() {
            return Ok(child);
        }
        if let Some(status) = child.0.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            bail!("memcached exited ({status}) before it listened on {addr}: {err}");
        }
        anyhow::ensure!(
            t0.elapsed() < START_TIMEOUT,
            "memcached did not listen on {addr} within {START_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn linux_point(ns: &NetNs, cfg: &PointConfig) -> anyhow::Result<PointResult> {
    let host = ns.add_host_address(LINUX_HOST_OCTET)?;
    let addr = SocketAddrV4::new(host.ip, PORT);
    let server = start_memcached(addr, cfg.cpus.server, &cfg.memcached_args)?;
    let paths = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (batch, priority) = linux_batch(cfg.cpus.server, paths.clone(), stop.clone(), cfg.seed)?;
    let mut meter = common_meter(cfg);
    let pid = server.0.id() as i32;
    meter.add_split(
        "server: memcached, all threads",
        Select::Named { pid, name: "*" },
    );
    meter.add(
        "batch thread",
        Select::Named {
            pid: std::process::id() as i32,
            name: LINUX_BATCH_THREAD,
        },
    );
    let m = measure(
        ns,
        cfg,
        SocketAddr::V4(addr),
        BatchCount::Thread(paths),
        None,
        format!("memcached -t 1, batch at {priority}"),
        meter,
    );
    stop.store(true, Relaxed);
    let price = batch
        .join()
        .map_err(|_| anyhow!("the batch thread panicked"))?;
    drop(server);
    drop(host);
    let m = m?;
    check_price(price)?;
    Ok(m)
}

/// Medians per (system, load) over the rounds, in sweep order.
pub fn medians(runs: &[PointResult], loads: &[f64]) -> Vec<MedianPoint> {
    let mut out = Vec::new();
    for &load in loads {
        for system in System::ALL {
            let of: Vec<&PointResult> = runs
                .iter()
                .filter(|r| r.system == system && (r.offered_krps - load / 1e3).abs() < 1e-9)
                .collect();
            if of.is_empty() {
                continue;
            }
            let valid: Vec<&PointResult> = of
                .iter()
                .copied()
                .filter(|r| !r.generator_saturated)
                .collect();
            let saturated_rounds = of.len() - valid.len();
            let generator_saturated = saturated_rounds * 2 > of.len();
            let lat = |f: fn(&PointResult) -> Option<f64>| {
                if generator_saturated {
                    return None;
                }
                median(&valid.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            let all = |f: fn(&PointResult) -> f64| {
                median(&of.iter().map(|r| f(r)).collect::<Vec<_>>()).unwrap_or(0.0)
            };
            out.push(MedianPoint {
                system,
                offered_krps: load / 1e3,
                achieved_krps: all(|r| r.achieved_krps),
                p50_us: lat(|r| r.p50_us),
                p99_us: lat(|r| r.p99_us),
                p999_us: lat(|r| r.p999_us),
                batch_ops_per_s: all(|r| r.batch_ops_per_s),
                batch_ops_per_cpu_s: median(
                    &of.iter()
                        .filter_map(|r| r.batch_ops_per_cpu_s)
                        .collect::<Vec<_>>(),
                ),
                iokerneld_cpu_pct: median(
                    &of.iter()
                        .filter_map(|r| r.iokerneld_cpu_pct)
                        .collect::<Vec<_>>(),
                ),
                cpu_us_per_request: median_split(&of),
                generator_saturated,
                saturated_rounds,
                rounds: of.len(),
            });
        }
    }
    out
}

/// Per component, the median of the rounds' µs per request.
fn median_split(rounds: &[&PointResult]) -> BTreeMap<String, f64> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in rounds {
        for (k, v) in &r.cpu_us_per_request {
            by.entry(k.clone()).or_default().push(*v);
        }
    }
    by.into_iter()
        .filter_map(|(k, v)| Some((k, median(&v)?)))
        .collect()
}

/// The highest achieved rate of `system` among its points with p99 within
/// [`P99_BOUND_US`]; `None` if there is none.
pub fn max_krps(points: &[MedianPoint], system: System) -> Option<f64> {
    points
        .iter()
        .filter(|p| p.system == system && p.p99_us.is_some_and(|v| v <= P99_BOUND_US))
        .map(|p| p.achieved_krps)
        .max_by(f64::total_cmp)
}

/// [`max_krps`] of each of `systems`, by [`json_key`].
fn max_krps_by_system(points: &[MedianPoint], systems: &[System]) -> MaxKrps {
    systems
        .iter()
        .map(|&system| (json_key(system), max_krps(points, system)))
        .collect()
}

/// Per load where kv-server and memcached-ginza both have a p50, the
/// difference.
fn library_and_protocol(points: &[MedianPoint]) -> Vec<LibraryAndProtocol> {
    let p50 = |system, load: f64| {
        points
            .iter()
            .find(|p| p.system == system && p.offered_krps == load)
            .and_then(|p| p.p50_us)
    };
    points
        .iter()
        .filter(|p| p.system == System::MemcachedGinza)
        .filter_map(|p| {
            let mine = p.p50_us?;
            let kv = p50(System::Ginza, p.offered_krps)?;
            Some(LibraryAndProtocol {
                offered_krps: p.offered_krps,
                memcached_ginza_p50_us: mine,
                ginza_kv_server_p50_us: kv,
                added_p50_us: mine - kv,
            })
        })
        .collect()
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

fn row(r: &PointResult) -> String {
    format!(
        "{:<27} offered {:>7.1} krps  achieved {:>7.1}  p50 {:>8}  p99 {:>8}  p99.9 {:>8} µs  batch {:>6.2} M ops/s ({:>5} M per CPU-s)  iokerneld CPU {:>5} %{}  ({})",
        r.system.name(),
        r.offered_krps,
        r.achieved_krps,
        opt(r.p50_us),
        opt(r.p99_us),
        opt(r.p999_us),
        r.batch_ops_per_s / 1e6,
        opt(r.batch_ops_per_cpu_s.map(|v| v / 1e6)),
        opt(r.iokerneld_cpu_pct),
        if r.generator_saturated {
            "  generator saturated"
        } else {
            ""
        },
        r.server
    ) + &r.direct_frames.map_or(String::new(), |f| {
        format!(
            "  own socket {} in, {} out in {} kicks; iokerneld's NIC {} in, {} out",
            f.own_rx, f.own_tx, f.own_tx_kicks, f.iokernel_nic_rx, f.iokernel_nic_tx
        )
    }) + &r
        .iokerneld
        .as_ref()
        .map_or(String::new(), |l| format!("  iokerneld: {l}"))
}

fn write_outputs(dir: &Path, csv: &Path, points: &[MedianPoint]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let o = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.2}"));
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.system.name().to_string(),
                format!("{:.3}", p.offered_krps),
                format!("{:.3}", p.achieved_krps),
                o(p.p50_us),
                o(p.p99_us),
                o(p.p999_us),
                format!("{:.0}", p.batch_ops_per_s),
                o(p.iokerneld_cpu_pct),
                p.generator_saturated.to_string(),
                p.batch_ops_per_cpu_s
                    .map_or_else(String::new, |v| format!("{v:.0}")),
            ]
        })
        .collect();
    write_csv(
        csv,
        &[
            "system",
            "offered_krps",
            "achieved_krps",
            "p50_us",
            "p99_us",
            "p999_us",
            "batch_ops_per_s",
            "iokerneld_cpu_pct",
            "generator_saturated",
            "batch_ops_per_cpu_s",
        ],
        &rows,
    )?;
    let series = |y: fn(&MedianPoint) -> Option<f64>| -> Vec<Series> {
        System::ALL
            .iter()
            .filter(|&&s| points.iter().any(|p| p.system == s))
            .map(|&s| Series {
                name: s.name().to_string(),
                points: points
                    .iter()
                    .filter(|p| p.system == s)
                    .filter_map(|p| Some((p.achieved_krps, y(p)?)))
                    .collect(),
            })
            .collect()
    };
    for (file, title, y_label, data, log_y) in [
        (
            "p99.png",
            "memcached USR: p99 latency against achieved load",
            "p99 (us)",
            series(|p| p.p99_us),
            true,
        ),
        (
            "batch.png",
            "Batch work beside the server against achieved load",
            "batch ops/s",
            series(|p| Some(p.batch_ops_per_s)),
            false,
        ),
    ] {
        line_chart(
            &dir.join(file),
            &Chart {
                title,
                x_label: "achieved krps",
                y_label,
                series: &data,
                log_y,
                y_max: None,
                legend_lower_right: false,
            },
        )?;
    }
    Ok(())
}

fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "memcached USR over veth, {} connections, {} keys; medians of {} round(s) of {:.1} s (+{:.1} s warm-up); generator on CPU {}{}, iokerneld on CPU {}, servers and batch on CPU {}{}:",
        r.connections,
        r.keys,
        r.points.first().map_or(0, |p| p.rounds),
        r.duration_s,
        r.warmup_s,
        r.cpus.generator,
        if r.generator_cpu_kept_busy {
            " (kept busy at SCHED_IDLE in Linux's points)"
        } else {
            ""
        },
        r.cpus.iokernel,
        r.cpus.server,
        if r.build == crate::harness::DEBUG_BUILD { " (DEBUG build)" } else { "" }
    );
    if !r.memcached_args.is_empty() {
        let _ = writeln!(s, "memcached also ran with: {}", r.memcached_args.join(" "));
    }
    let _ = writeln!(
        s,
        "  system           offered  achieved   p50 µs   p99 µs  p99.9 µs  batch Mops/s  per CPU-s  iokerneld CPU %"
    );
    for p in &r.points {
        let _ = writeln!(
            s,
            "  {:<15} {:>8.1} {:>9.1} {:>8} {:>8} {:>9} {:>13.2} {:>10} {:>16}{}",
            p.system.name(),
            p.offered_krps,
            p.achieved_krps,
            opt(p.p50_us),
            opt(p.p99_us),
            opt(p.p999_us),
            p.batch_ops_per_s / 1e6,
            opt(p.batch_ops_per_cpu_s.map(|v| v / 1e6)),
            opt(p.iokerneld_cpu_pct),
            if p.generator_saturated {
                "  generator saturated"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(
        s,
        "CPU per answered request, µs (thread run time over the measured part; medians):"
    );
    for p in &r.points {
        let parts: Vec<String> = p
            .cpu_us_per_request
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "  {:<15} {:>6.1} krps: {}",
            p.system.name(),
            p.offered_krps,
            parts.join("; ")
        );
    }
    let max: Vec<String> = r
        .max_krps_at_p99_200us
        .iter()
        .map(|(system, krps)| format!("{} {}", system.replace('_', "-"), opt(*krps)))
        .collect();
    let _ = writeln!(s, "max krps at p99 ≤ {P99_BOUND_US} µs: {}", max.join("  "));
    if !r.library_and_protocol_us.is_empty() {
        let _ = writeln!(
            s,
            "preload library + memcached's event loop and protocol engine, over kv-server on the \
             native API (memcached-ginza p50 − ginza p50, same iokerneld and batch):"
        );
        for d in &r.library_and_protocol_us {
            let _ = writeln!(
                s,
                "  at {:>6.1} krps: {:>7.1} − {:>7.1} = {:>+7.1} µs",
                d.offered_krps, d.memcached_ginza_p50_us, d.ginza_kv_server_p50_us, d.added_p50_us
            );
        }
    }
    if let Some(c) = &r.library_cost {
        let _ = writeln!(
            s,
            "preload library alone, {}-byte echo round trips from the namespace, medians of {} round(s):\n{}",
            c.payload_bytes,
            c.rounds.iter().filter(|r| !r.direct).count() / 3,
            path_cost_lines(&c.switch_path)
        );
        if let Some(d) = &c.direct_path {
            let _ = writeln!(
                s,
                "  the same on the direct path (each server its own AF_XDP socket):\n{}",
                path_cost_lines(d)
            );
        }
    }
    if let Some(e) = &r.library_cost_error {
        let _ = writeln!(s, "the library's cost was not measured: {e}");
    }
    let _ = writeln!(
        s,
        "load average before {} after {}; the bench's session nice {}; build: {}",
        r.loadavg_before.as_deref().unwrap_or("?"),
        r.loadavg_after.as_deref().unwrap_or("?"),
        r.session_nice
            .map_or_else(|| "unchanged".to_string(), |n| n.to_string()),
        r.build
    );
    let _ = writeln!(s, "CSV: {} (PNGs beside it)", r.csv);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(system: System, p99: Option<f64>, achieved: f64, saturated: bool) -> PointResult {
        PointResult {
            system,
            offered_krps: 10.0,
            achieved_krps: achieved,
            p50_us: p99.map(|v| v / 2.0),
            p99_us: p99,
            p999_us: p99.map(|v| v * 2.0),
            batch_ops_per_s: 1e6,
            batch_ops_per_cpu_s: None,
            generator_saturated: saturated,
            saturation_reason: None,
            timeouts: 0,
            errors: 0,
            error_kinds: Default::default(),
            generator_cpu_util: 0.5,
            server: String::new(),
            iokerneld: None,
            iokerneld_cpu_ms: None,
            iokerneld_cpu_pct: None,
            cpu_us_per_request: BTreeMap::new(),
            cpu_threads: BTreeMap::new(),
            direct_frames: None,
        }
    }

    #[test]
    fn a_point_is_saturated_when_most_rounds_are() {
        let runs = vec![
            result(System::Ginza, Some(50.0), 10.0, false),
            result(System::Ginza, None, 9.0, true),
            result(System::Ginza, Some(70.0), 9.5, false),
            result(System::Linux, None, 9.0, true),
            result(System::Linux, None, 9.0, true),
            result(System::Linux, Some(60.0), 9.0, false),
        ];
        let points = medians(&runs, &[10_000.0]);
        assert_eq!(points.len(), 2);
        let (g, l) = (&points[0], &points[1]);
        assert_eq!(g.system, System::Ginza);
        assert!(!g.generator_saturated);
        assert_eq!(g.saturated_rounds, 1);
        assert_eq!(g.p99_us, Some(60.0));
        assert_eq!(g.achieved_krps, 9.5);
        assert!(l.generator_saturated);
        assert_eq!(l.p99_us, None);
        assert_eq!(max_krps(&points, System::Ginza), Some(9.5));
        assert_eq!(max_krps(&points, System::Linux), None);
    }

    #[test]
    fn the_highest_load_within_the_bound_is_named_for_every_system_that_ran() {
        let runs = [
            result(System::Linux, Some(100.0), 10.0, false),
            result(System::MemcachedGinzaDirect, Some(150.0), 10.0, false),
            result(System::GinzaDirect, Some(900.0), 10.0, false),
        ];
        let points = medians(&runs, &[10_000.0]);
        let systems = [
            System::Linux,
            System::GinzaDirect,
            System::MemcachedGinzaDirect,
        ];
        let max = max_krps_by_system(&points, &systems);
        assert_eq!(max.len(), 3, "{max:?}");
        assert_eq!(max["linux"], Some(10.0));
        assert_eq!(max["memcached_ginza_direct"], Some(10.0));
        // Ran, but never within the bound: null, not left out.
        assert_eq!(max["ginza_direct"], None);
        assert!(!max.contains_key("ginza"), "{max:?}");
    }

    #[test]
    fn memcached_gets_the_extra_options_after_its_own_on_both_systems() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: MemcachedArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "bench",
            "--memcached-args",
            "-o no_lru_maintainer,no_lru_crawler",
        ])
        .unwrap();
        let extra = cli.args.memcached_args;
        assert_eq!(extra, ["-o", "no_lru_maintainer,no_lru_crawler"]);
        let args = memcached_args(SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 11211), &extra);
        assert_eq!(args[..2], ["-l", "10.0.0.1"]);
        assert_eq!(args[args.len() - 2..], extra[..]);
        let none = <Cli as clap::Parser>::try_parse_from(["bench"]).unwrap();
        assert!(none.args.memcached_args.is_empty());
    }

    #[test]
    fn the_library_and_protocol_difference_is_per_load_where_both_have_a_p50() {
        let mut runs = vec![
            result(System::Ginza, Some(200.0), 10.0, false),
            result(System::MemcachedGinza, Some(260.0), 10.0, false),
            result(System::Linux, Some(100.0), 10.0, false),
        ];
        // At 20 krps memcached-ginza's generator fell behind: no p50.
        for (system, saturated) in [(System::Ginza, false), (System::MemcachedGinza, true)] {
            let mut r = result(system, Some(300.0), 20.0, saturated);
            r.offered_krps = 20.0;
            runs.push(r);
        }
        runs[0].iokerneld_cpu_pct = Some(40.0);
        let points = medians(&runs, &[10_000.0, 20_000.0]);
        let d = library_and_protocol(&points);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].offered_krps, 10.0);
        assert_eq!(d[0].memcached_ginza_p50_us, 130.0);
        assert_eq!(d[0].ginza_kv_server_p50_us, 100.0);
        assert_eq!(d[0].added_p50_us, 30.0);
        // iokerneld's CPU where a round had it, none for Linux.
        assert_eq!(points[0].iokerneld_cpu_pct, Some(40.0));
        assert_eq!(points[1].system, System::Linux);
        assert_eq!(points[1].iokerneld_cpu_pct, None);
        assert_eq!(points[2].system, System::MemcachedGinza);
    }

    #[test]
    fn systems_named_without_memcached_ginza_need_no_library() {
        let (systems, run) = systems_to_run(Some(&[System::Linux, System::Ginza])).unwrap();
        assert_eq!(systems, [System::Linux, System::Ginza]);
        assert!(run.is_none());
        assert!(systems_to_run(Some(&[])).is_err());
    }

    #[test]
    fn max_krps_keeps_only_points_within_the_bound() {
        let runs = [
            result(System::Ginza, Some(100.0), 10.0, false),
            result(System::Ginza, Some(900.0), 20.0, false),
        ];
        let mut points = medians(&runs[..1], &[10_000.0]);
        let mut second = medians(&runs[1..], &[10_000.0]);
        second[0].offered_krps = 20.0;
        points.append(&mut second);
        assert_eq!(max_krps(&points, System::Ginza), Some(10.0));
    }
}
