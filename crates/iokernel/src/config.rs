//! iokerneld's configuration: a TOML file, overridden by command-line flags,
//! then validated against the CPUs this process may use.
//!
//! ```toml
//! cores = "1-3"            # managed cores (list or "a-b,c" string)
//! core = 0                 # iokerneld's own core (pinned)
//! interval = "5us"         # allocation pass period
//! policy = "shenango"      # shenango | static | slow
//! slow_period = "1ms"      # period of the `slow` policy
//! socket = "/run/user/1000/ginza/iokerneld.sock"
//! spin = false             # true: busy-poll even while idle (benchmarks)
//! self_wake = false        # true: a parked direct-path kthread may wake
//!                          # itself for a frame on its own socket
//! idle_after = "2ms"       # idle this long, then sleep until an event
//! idle_sleep = "1ms"       # where it cannot sleep until an event: nap
//! preempt_deadline = "1ms" # then a preempted kthread is moved off its core
//! min_residency = "100us"  # a latency-critical core kept before another
//!                          # latency-critical application takes it
//! nic = "software"         # or "af_packet:IFNAME", "af_xdp:IFNAME",
//!                          # "af_xdp:IFNAME,direct" (docs/direct-path.md)
//! yield_after_nic_tx = true # sched_yield at the first idle turn after a
//!                          # NIC transmit (a thread it woke on this CPU runs)
//! yield_while_idle = true  # on its own core, sched_yield after 1 ms of
//!                          # turns that moved no frame (a thread waiting
//!                          # for this CPU runs)
//! steering = "rss-mod"     # rss-mod | flow-affinity | indirection
//! flow_table = 8192        # flow-affinity: flows per application's table
//! flow_prepopulate = false # flow-affinity: hash ranges assigned in advance
//! flow_warm_up = "0s"      # flow-affinity: round-robin for every other new
//!                          # flow during this long after registration
//! steering_buckets = 512   # indirection: buckets per application
//! local_wake = "5us"       # local wakes, iokerneld's wait ("0": off)
//! idle_victim_grace = "10ms" # a SCHED_IDLE kthread whose core went to
//!                          # another is signalled only after this
//! metrics = "127.0.0.1:9464" # Prometheus metrics at http://ADDR/metrics
//!                          # (docs/metrics.md; default: not served)
//!
//! [[faults]]               # fault injection in the switch (repeatable,
//! port = "trunk"           # at most 4 rules; docs/fault-injection.md):
//! drop = "5%"              # the keys of `--faults`, values as strings
//! reorder = "2%"           # or numbers
//! seed = 42
//! ```

use std::path::PathBuf;
use std::time::Duration;

pub use crate::nic::faults::{FaultRule, FaultRuleError, MAX_FAULT_RULES};
use ginza_policy::steer::{SteeringKind, SteeringOptions};
use ginza_proto::{parse_duration, user_socket_path};
use ginza_sys::{affinity, cpulist};
use serde::Deserialize;

/// Which core allocator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Shenango: congestion detection every interval.
    Shenango,
    /// ZygOS-like fixed cores.
    Static,
    /// Arachne-like utilization-based, every `period`.
    Slow { period: Duration },
}

impl PolicyKind {
    pub fn name(&self) -> &'static str {
        match self {
            PolicyKind::Shenango => "shenango",
            PolicyKind::Static => "static",
            PolicyKind::Slow { .. } => "slow",
        }
    }
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Managed cores (Linux CPU numbers), in the order the allocator indexes
    /// them.
    pub cores: Vec<usize>,
    /// iokerneld's own core; `None`: not pinned (tests, laptops).
    pub own_core: Option<usize>,
    /// Allocation pass period.
    pub interval: Duration,
    pub policy: PolicyKind,
    /// Control socket path.
    pub socket: PathBuf,
    /// Busy-poll even while idle: never sleep until an event
    /// (docs/iokernel-idle.md). Benchmarks that compare against
    /// busy-polling Linux set it.
    pub spin: bool,
    /// Without `spin`: after this long with nothing runnable and no
    /// traffic, the loop sleeps until an event (a frame on the NIC, an
    /// application's bell, the control socket, a deadline it owes).
    pub idle_after: Duration,
    /// A parked kthread of an application with its own AF_XDP socket may
    /// wake itself for a frame there and take the core of the CPU it is
    /// pinned to, where that core is free or lent to a `SCHED_IDLE`
    /// kthread and its application is under its maximum; iokerneld counts
    /// it granted at its next pass, or revokes it (docs/direct-path.md,
    /// "The self-woken kthread"). Off by default.
    pub self_wake: bool,
    /// Where the loop cannot sleep until an event (`spin`, or an
    /// application registered without a bell): nap this long in `ppoll`
    /// (woken early by the control socket) when nothing is runnable;
    /// `None`: spin.
    pub idle_sleep: Option<Duration>,
    /// Stop after this long (tests, benchmarks); `None`: run until stopped.
    pub run_for: Option<Duration>,
    /// How often the control socket and connections are polled while
    /// spinning (a syscall, so not every pass).
    pub control_interval: Duration,
    /// A preempted kthread that has not given its core back after this
    /// long is moved off the core and reported; its core is handed over.
    pub preempt_deadline: Duration,
    /// `shenango`: a latency-critical kthread keeps a core it runs on at
    /// least this long before another latency-critical application takes
    /// it (batch is preempted at once); zero: Algorithm 2 as published
    /// (docs/design.md, "Minimum residency").
    pub min_residency: Duration,
    /// A core taken from a kthread that runs under `SCHED_IDLE` goes to
    /// the kthread granted it at once, before the victim gives it back:
    /// the kernel runs the woken kthread before the victim on that CPU,
    /// and the victim answers when it next runs; it is never moved off
    /// for missing `preempt_deadline` (docs/runtime.md, "Batch kthreads
    /// run SCHED_IDLE"). `false`: every hand-over waits for the victim.
    pub handover_from_idle_at_once: bool,
    /// With `handover_from_idle_at_once`: a `SCHED_IDLE` victim of a
    /// hand-over is not signalled for this long. If the kthread granted its
    /// core gives it back first (a latency-critical kthread that served a
    /// request and parked), the preemption is withdrawn and the victim,
    /// which the kernel ran again as soon as the core was free, keeps the
    /// core without ever handling a signal, yielding or waiting for a grant;
    /// past it the victim is signalled and yields as before. Zero: the
    /// signal follows the receiver's wake at once (docs/runtime.md,
    /// "Preemptions withdrawn").
    pub idle_victim_grace: Duration,
    /// [`LOCAL_WAKE_WAIT`] by default (docs/runtime.md, "Local wakes"): with
    /// `handover_from_idle_at_once`, a kthread sleeping on the wake page,
    /// woken onto a core that a `SCHED_IDLE` kthread of an application
    /// mapping the page holds, is woken by that kthread (its queue line's
    /// doorbell, taken at its preemption points: a wake on the same CPU, no
    /// inter-processor interrupt), in any process; iokerneld wakes it
    /// itself if nobody took the doorbell within this wait, so a victim
    /// that seldom reaches a preemption point delays each such wake by the
    /// whole wait. `None`: off.
    pub local_wake_wait: Option<Duration>,
    /// Seed of the allocator's random victim choice.
    pub seed: u64,
    /// The link besides the software switch: `software` (none),
    /// `af_packet:IFNAME`, `af_xdp:IFNAME` or `af_xdp:IFNAME,direct`
    /// (ready for applications' own sockets: docs/direct-path.md).
    pub nic: String,
    /// At the first loop turn without NIC traffic after a NIC transmit,
    /// `sched_yield`: a thread the transmit woke on iokerneld's own CPU (a
    /// veth peer's receiver) runs now instead of at the scheduler's next
    /// tick (`daemon::tx_yield`).
    pub yield_after_nic_tx: bool,
    /// Pinned to `own_core`, after 1 ms of loop turns that moved no frame,
    /// `sched_yield` once per 5 µs of them: a thread waiting for
    /// iokerneld's CPU (a veth peer's sender beside it) runs instead of
    /// the spin (`daemon::idle_yield`).
    pub yield_while_idle: bool,
    /// Packet steering of an application whose registration asks for none.
    pub steering: SteeringKind,
    /// Sizes of every application's steering policy (`warm_up_until` is
    /// not used: see `flow_warm_up`).
    pub steering_options: SteeringOptions,
    /// `flow-affinity`: the warm-up after each registration.
    pub flow_warm_up: Duration,
    /// Fault injection in the software switch (`--faults`), at most
    /// [`MAX_FAULT_RULES`]; empty: none.
    pub faults: Vec<FaultRule>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (docs/metrics.md);
    /// `None`: not served.
    pub metrics: Option<std::net::SocketAddr>,
}

/// Largest flow table per application (24 bytes a flow: 96 MiB).
pub const MAX_FLOW_TABLE: usize = 1 << 22;
/// Most indirection buckets per application.
pub const MAX_STEERING_BUCKETS: usize = 1 << 16;

/// Bounds that make an interval sensible.
/// How long iokerneld leaves a local-wake doorbell to the `SCHED_IDLE`
/// kthread on the CPU before it wakes the slot itself: a Rust batch
/// application reaches a preemption point every few hundred ns; measured
/// on the development VM, it took 3.5-48 µs off kv-server's p50 beside
/// batch and gave batch 3-17 % more (docs/results.md, "Session 20:
/// memcached on the direct path").
pub const LOCAL_WAKE_WAIT: Duration = Duration::from_micros(5);
pub const MIN_INTERVAL: Duration = Duration::from_micros(1);
pub const MAX_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_SLOW_PERIOD: Duration = Duration::from_secs(60);
pub const MAX_IDLE_SLEEP: Duration = Duration::from_secs(1);
/// `Config::idle_after` by default: 400 passes of the default interval, so
/// that the gaps of a request-response exchange (tens of µs) never put the
/// loop to sleep, while an idle iokerneld spins for 2 ms a few times a
/// second at most (docs/iokernel-idle.md).
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_millis(2);
/// Bounds of `Config::idle_after`.
pub const MIN_IDLE_AFTER: Duration = Duration::from_micros(10);
pub const MAX_IDLE_AFTER: Duration = Duration::from_secs(10);
/// `Config::idle_victim_grace` by default: longer than a latency-critical
/// kthread's stay on a core for a few requests, including the wait for
/// iokerneld to ask an idle poller back (which on a 2-vCPU VM whose
/// iokerneld shares its CPU with the load generator took up to
/// milliseconds), so that nearly every hand-over is withdrawn; a receiver
/// that keeps the core still lets the victim yield within a scheduler
/// tick or two. It was 100 µs until session 24: then at 10k–20k
/// memcached requests/s most victims were signalled, parked and waited
/// for a wake, and batch got 0.5–0.8× what it got with 2 or 10 ms
/// (docs/results.md, "Session 24").
pub const DEFAULT_IDLE_VICTIM_GRACE: Duration = Duration::from_millis(10);
/// `Config::min_residency` by default: about five hand-overs' cost here
/// (a preemption signal, the holder's `Yielded` and a wake: some 20 µs at
/// p50), so that a contested core spends at most a sixth of its time
/// changing hands (docs/design.md, "Minimum residency").
pub const DEFAULT_MIN_RESIDENCY: Duration = Duration::from_micros(100);

/// Why a configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error("{what}: {msg}")]
    Value { what: &'static str, msg: String },
    #[error("no managed cores given (set `cores` in the file or --cores)")]
    NoCores,
    #[error("managed core {0} is listed twice")]
    DuplicateCore(usize),
    #[error("core {core} is unknown: this process may use cores {allowed}")]
    UnknownCore { core: usize, allowed: String },
    #[error("iokerneld's own core {0} is also a managed core; it must be dedicated")]
    OwnCoreManaged(usize),
    #[error("{what} {got:?} is out of range {min:?}..={max:?}")]
    OutOfRange {
        what: &'static str,
        got: Duration,
        min: Duration,
        max: Duration,
    },
}

/// A `--cores` value (a newtype: clap would take a bare `Vec` for a
/// repeated flag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreArg(pub Vec<usize>);

fn parse_core_arg(s: &str) -> Result<CoreArg, String> {
    cpulist::parse(s).map(CoreArg).map_err(|e| e.to_string())
}

fn parse_fault_rule(s: &str) -> Result<FaultRule, String> {
    s.parse().map_err(|e: FaultRuleError| e.to_string())
}

/// `[[faults]]` tables of the file → rules, through the flag's parser (so
/// keys, values and messages are the same); numbers are taken as their
/// text (`seed = 42`, `gap = 2`).
fn file_fault_rules(tables: &[toml::Table]) -> Result<Vec<FaultRule>, ConfigError> {
    tables
        .iter()
        .enumerate()
        .map(|(i, table)| {
            let bad = |msg: String| ConfigError::Value {
                what: "faults",
                msg: format!("rule {} ([[faults]] table {}): {msg}", i + 1, i + 1),
            };
            let mut pairs = Vec::new();
            for (key, value) in table {
                let text = match value {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(n) => n.to_string(),
                    toml::Value::Float(x) => x.to_string(),
                    other => {
                        return Err(bad(format!(
                            "{key} = {other}: expected a string or a number"
                        )))
                    }
                };
                pairs.push((key.as_str(), text));
            }
            FaultRule::from_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())))
                .map_err(|e| bad(e.to_string()))
        })
        .collect()
}

fn parse_policy(s: &str) -> Result<String, String> {
    match s {
        "shenango" | "static" | "slow" => Ok(s.to_string()),
        _ => Err(format!("unknown policy {s:?} (shenango, static, slow)")),
    }
}

/// A core list in a file: `[1, 2]` or `"1-2"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CoreList {
    List(Vec<usize>),
    Text(String),
}

/// The TOML file: every field optional (flags and defaults fill in).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    cores: Option<CoreList>,
    core: Option<usize>,
    interval: Option<String>,
    policy: Option<String>,
    slow_period: Option<String>,
    socket: Option<PathBuf>,
    spin: Option<bool>,
    self_wake: Option<bool>,
    idle_after: Option<String>,
    idle_sleep: Option<String>,
    run_for: Option<String>,
    control_interval: Option<String>,
    preempt_deadline: Option<String>,
    min_residency: Option<String>,
    seed: Option<u64>,
    nic: Option<String>,
    yield_after_nic_tx: Option<bool>,
    yield_while_idle: Option<bool>,
    steering: Option<String>,
    flow_table: Option<usize>,
    flow_prepopulate: Option<bool>,
    flow_warm_up: Option<String>,
    steering_buckets: Option<usize>,
    local_wake: Option<String>,
    idle_victim_grace: Option<String>,
    metrics: Option<String>,
    #[serde(default)]
    faults: Vec<toml::Table>,
}

/// Command-line flags of `iokerneld` (they override the file).
#[derive(Debug, Default, clap::Parser)]
#[command(
    name = "iokerneld",
    about = "Ginza iokerneld: core allocation between applications"
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Managed cores, e.g. `1-3,5`.
    #[arg(long, value_parser = parse_core_arg)]
    pub cores: Option<CoreArg>,
    /// iokerneld's own (dedicated) core.
    #[arg(long)]
    pub core: Option<usize>,
    /// Do not pin iokerneld to its core even if one is configured.
    #[arg(long)]
    pub no_pin: bool,
    /// Allocation interval (default 5us).
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// shenango | static | slow.
    #[arg(long, value_parser = parse_policy)]
    pub policy: Option<String>,
    /// Period of the slow policy (default 1ms).
    #[arg(long, value_parser = parse_duration)]
    pub slow_period: Option<Duration>,
    /// Control socket path.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Busy-poll even while idle (benchmarks against busy-polling
    /// systems); by default iokerneld sleeps until an event once idle.
    #[arg(long)]
    pub spin: bool,
    /// Idle this long before sleeping until an event (default 2ms).
    #[arg(long, value_parser = parse_duration)]
    pub idle_after: Option<Duration>,
    /// A parked kthread with its own AF_XDP socket may wake itself for a
    /// frame there (default false; docs/direct-path.md).
    #[arg(long)]
    pub self_wake: Option<bool>,
    /// Where it cannot sleep until an event (`--spin`, an application
    /// without a bell): nap this long instead of spinning while idle.
    #[arg(long, value_parser = parse_duration)]
    pub idle_sleep: Option<Duration>,
    /// Exit after this long.
    #[arg(long, value_parser = parse_duration)]
    pub run_for: Option<Duration>,
    /// Time a preempted kthread has to give its core back (default 1ms).
    #[arg(long, value_parser = parse_duration)]
    pub preempt_deadline: Option<Duration>,
    /// A latency-critical core kept before another latency-critical
    /// application takes it (default 100us; 0: every pass).
    #[arg(long, value_parser = parse_duration)]
    pub min_residency: Option<Duration>,
    /// Seed of the allocator's random choices.
    #[arg(long)]
    pub seed: Option<u64>,
    /// NIC: software (the built-in switch and traffic generator only),
    /// af_packet:IFNAME or af_xdp:IFNAME (a real interface, root);
    /// af_xdp:IFNAME,direct also takes applications' own AF_XDP sockets
    /// (the direct path, docs/direct-path.md).
    #[arg(long)]
    pub nic: Option<String>,
    /// Keep spinning after a NIC transmit instead of yielding the CPU once
    /// at the next idle turn (`yield_after_nic_tx = false`).
    #[arg(long)]
    pub no_yield_after_nic_tx: bool,
    /// Spin through loop turns that move no frame instead of yielding the
    /// CPU after 1 ms of them (`yield_while_idle = false`).
    #[arg(long)]
    pub no_yield_while_idle: bool,
    /// Packet steering of applications that do not ask for one: rss-mod
    /// (default), flow-affinity or indirection.
    #[arg(long)]
    pub steering: Option<SteeringKind>,
    /// flow-affinity: flows each application's table holds (default 8192).
    #[arg(long)]
    pub flow_table: Option<usize>,
    /// flow-affinity: assign hash ranges in advance (no warm-up).
    #[arg(long)]
    pub flow_prepopulate: bool,
    /// flow-affinity: round-robin for every other new flow during this
    /// long after an application registers.
    #[arg(long, value_parser = parse_duration)]
    pub flow_warm_up: Option<Duration>,
    /// indirection: buckets per application (default 512).
    #[arg(long)]
    pub steering_buckets: Option<usize>,
    /// Local wakes (docs/runtime.md, "Local wakes"): a kthread sleeping on
    /// the wake page, given the core of a `SCHED_IDLE` kthread, is woken by
    /// that kthread from the core's CPU (no inter-processor interrupt);
    /// iokerneld wakes it itself after this wait [default: 5us; 0: off].
    #[arg(long, value_parser = parse_duration)]
    pub local_wake: Option<Duration>,
    /// How long a `SCHED_IDLE` (batch) kthread whose core went to another
    /// application's kthread keeps running behind it unsignalled; if the
    /// core comes back first the preemption is withdrawn
    /// (docs/runtime.md, "Preemptions withdrawn") [default: 10ms].
    #[arg(long, value_parser = parse_duration)]
    pub idle_victim_grace: Option<Duration>,
    /// Fault injection in the software switch, e.g.
    /// `drop=5%,reorder=2%,port=trunk` (repeatable, at most 4; replaces the
    /// file's `[[faults]]`). Keys: drop, duplicate, reorder, corrupt
    /// (probabilities with %), delay (e.g. 200us), gap (frames overtaking a
    /// reordered one, default 1), hold (frames held at most, default 128),
    /// seed, port (all by default, trunk, generator, a MAC, app:NAME), dir
    /// (in, out, both; by default both, out for port=all), proto (any, ip,
    /// tcp, udp). See docs/fault-injection.md.
    #[arg(long = "faults", value_name = "RULE", value_parser = parse_fault_rule)]
    pub faults: Vec<FaultRule>,
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR/metrics, e.g.
    /// 127.0.0.1:9464 (docs/metrics.md). Scrapes are answered by a thread
    /// of their own from figures the loop publishes every 100 ms.
    #[arg(long, value_name = "ADDR", value_parser = ginza_metrics::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,
}

fn dur(what: &'static str, v: Option<&String>) -> Result<Option<Duration>, ConfigError> {
    v.map(|s| parse_duration(s).map_err(|msg| ConfigError::Value { what, msg }))
        .transpose()
}

fn check_range(
    what: &'static str,
    got: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if got < min || got > max {
        return Err(ConfigError::OutOfRange {
            what,
            got,
            min,
            max,
        });
    }
    Ok(())
}

impl Config {
    /// Defaults for `cores`, unvalidated (tests adjust fields, then
    /// [`Config::validate`]).
    pub fn new(cores: Vec<usize>) -> Config {
        Config {
            cores,
            own_core: None,
            interval: Duration::from_micros(5),
            policy: PolicyKind::Shenango,
            socket: user_socket_path(),
            spin: false,
            idle_after: DEFAULT_IDLE_AFTER,
            self_wake: false,
            idle_sleep: None,
            run_for: None,
            control_interval: Duration::from_micros(50),
            preempt_deadline: Duration::from_millis(1),
            min_residency: DEFAULT_MIN_RESIDENCY,
            handover_from_idle_at_once: true,
            idle_victim_grace: DEFAULT_IDLE_VICTIM_GRACE,
            local_wake_wait: Some(LOCAL_WAKE_WAIT),
            seed: 0x5eed,
            nic: "software".into(),
            yield_after_nic_tx: true,
            yield_while_idle: true,
            steering: SteeringKind::RssMod,
            steering_options: SteeringOptions::default(),
            flow_warm_up: Duration::ZERO,
            faults: Vec::new(),
            metrics: None,
        }
    }

    /// Builds the configuration from the file named by `cli.config` (if
    /// any) and the flags, and validates it.
    pub fn from_cli(cli: &Cli) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.clone(),
                    source,
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| ConfigError::Parse {
                    path: p.clone(),
                    msg: e.to_string(),
                })?
            }
            None => FileConfig::default(),
        };
        let file_cores = match file.cores {
            Some(CoreList::List(v)) => Some(v),
            Some(CoreList::Text(s)) => {
                Some(cpulist::parse(&s).map_err(|e| ConfigError::Value {
                    what: "cores",
                    msg: e.to_string(),
                })?)
            }
            None => None,
        };
        let cores = cli
            .cores
            .clone()
            .map(|c| c.0)
            .or(file_cores)
            .ok_or(ConfigError::NoCores)?;
        let mut c = Config::new(cores);
        c.own_core = if cli.no_pin {
            None
        } else {
            cli.core.or(file.core)
        };
        if let Some(i) = cli.interval.or(dur("interval", file.interval.as_ref())?) {
            c.interval = i;
        }
        let period = cli
            .slow_period
            .or(dur("slow_period", file.slow_period.as_ref())?)
            .unwrap_or(Duration::from_millis(1));
        let policy = cli
            .policy
            .clone()
            .or(file.policy)
            .unwrap_or_else(|| "shenango".into());
        c.policy = match parse_policy(&policy)
            .map_err(|msg| ConfigError::Value {
                what: "policy",
                msg,
            })?
            .as_str()
        {
            "static" => PolicyKind::Static,
            "slow" => PolicyKind::Slow { period },
            _ => PolicyKind::Shenango,
        };
        if let Some(s) = cli.socket.clone().or(file.socket) {
            c.socket = s;
        }
        c.spin = cli.spin || file.spin.unwrap_or(false);
        if let Some(w) = cli.self_wake.or(file.self_wake) {
            c.self_wake = w;
        }
        if let Some(a) = cli
            .idle_after
            .or(dur("idle_after", file.idle_after.as_ref())?)
        {
            c.idle_after = a;
        }
        c.idle_sleep = cli
            .idle_sleep
            .or(dur("idle_sleep", file.idle_sleep.as_ref())?);
        c.run_for = cli.run_for.or(dur("run_for", file.run_for.as_ref())?);
        if let Some(w) = cli
            .local_wake
            .or(dur("local_wake", file.local_wake.as_ref())?)
        {
            c.local_wake_wait = (!w.is_zero()).then_some(w);
        }
        if let Some(g) = cli
            .idle_victim_grace
            .or(dur("idle_victim_grace", file.idle_victim_grace.as_ref())?)
        {
            c.idle_victim_grace = g;
        }
        if let Some(ci) = dur("control_interval", file.control_interval.as_ref())? {
            c.control_interval = ci;
        }
        if let Some(d) = cli
            .preempt_deadline
            .or(dur("preempt_deadline", file.preempt_deadline.as_ref())?)
        {
            c.preempt_deadline = d;
        }
        if let Some(d) = cli
            .min_residency
            .or(dur("min_residency", file.min_residency.as_ref())?)
        {
            c.min_residency = d;
        }
        if let Some(s) = cli.seed.or(file.seed) {
            c.seed = s;
        }
        if let Some(n) = cli.nic.clone().or(file.nic) {
            c.nic = n;
        }
        c.yield_after_nic_tx =
            !cli.no_yield_after_nic_tx && file.yield_after_nic_tx.unwrap_or(true);
        c.yield_while_idle = !cli.no_yield_while_idle && file.yield_while_idle.unwrap_or(true);
        if let Some(kind) = cli.steering {
            c.steering = kind;
        } else if let Some(name) = &file.steering {
            c.steering = name.parse().map_err(|msg| ConfigError::Value {
                what: "steering",
                msg,
            })?;
        }
        if let Some(n) = cli.flow_table.or(file.flow_table) {
            c.steering_options.flow_table_capacity = n;
        }
        c.steering_options.prepopulate =
            cli.flow_prepopulate || file.flow_prepopulate == Some(true);
        if let Some(d) = cli
            .flow_warm_up
            .or(dur("flow_warm_up", file.flow_warm_up.as_ref())?)
        {
            c.flow_warm_up = d;
        }
        if let Some(n) = cli.steering_buckets.or(file.steering_buckets) {
            c.steering_options.buckets = n;
        }
        c.metrics = match (cli.metrics, &file.metrics) {
            (Some(a), _) => Some(a),
            (None, Some(text)) => {
                Some(
                    ginza_metrics::parse_addr(text).map_err(|msg| ConfigError::Value {
                        what: "metrics",
                        msg,
                    })?,
                )
            }
            (None, None) => None,
        };
        c.faults = if cli.faults.is_empty() {
            file_fault_rules(&file.faults)?
        } else {
            cli.faults.clone()
        };
        let allowed = affinity::allowed_cpus().map_err(|e| ConfigError::Value {
            what: "sched_getaffinity",
            msg: e.to_string(),
        })?;
        c.validate(&allowed)?;
        Ok(c)
    }

    /// Checks the configuration against the CPUs this process may use.
    pub fn validate(&self, allowed: &[usize]) -> Result<(), ConfigError> {
        if self.cores.is_empty() {
            return Err(ConfigError::NoCores);
        }
        let allowed_text = || cpulist::format(allowed);
        let mut seen = std::collections::BTreeSet::new();
        for &core in &self.cores {
            if !seen.insert(core) {
                return Err(ConfigError::DuplicateCore(core));
            }
            if !allowed.contains(&core) {
                return Err(ConfigError::UnknownCore {
                    core,
                    allowed: allowed_text(),
                });
            }
        }
        if let Some(own) = self.own_core {
            if self.cores.contains(&own) {
                return Err(ConfigError::OwnCoreManaged(own));
            }
            if !allowed.contains(&own) {
                return Err(ConfigError::UnknownCore {
                    core: own,
                    allowed: allowed_text(),
                });
            }
        }
        check_range("interval", self.interval, MIN_INTERVAL, MAX_INTERVAL)?;
        check_range(
            "control interval",
            self.control_interval,
            MIN_INTERVAL,
            MAX_INTERVAL,
        )?;
        if let PolicyKind::Slow { period } = self.policy {
            check_range("slow period", period, self.interval, MAX_SLOW_PERIOD)?;
        }
        check_range(
            "preempt deadline",
            self.preempt_deadline,
            MIN_INTERVAL,
            MAX_SLOW_PERIOD,
        )?;
        if self.min_residency > MAX_SLOW_PERIOD {
            return Err(ConfigError::Value {
                what: "min_residency",
                msg: format!("{:?}: at most {MAX_SLOW_PERIOD:?}", self.min_residency),
            });
        }
        if self.idle_victim_grace > MAX_SLOW_PERIOD {
            return Err(ConfigError::Value {
                what: "idle_victim_grace",
                msg: format!("{:?}: at most {MAX_SLOW_PERIOD:?}", self.idle_victim_grace),
            });
        }
        let table = self.steering_options.flow_table_capacity;
        if !(1..=MAX_FLOW_TABLE).contains(&table) {
            return Err(ConfigError::Value {
                what: "flow_table",
                msg: format!("{table} flows: 1 to {MAX_FLOW_TABLE}"),
            });
        }
        let buckets = self.steering_options.buckets;
        if !(1..=MAX_STEERING_BUCKETS).contains(&buckets) {
            return Err(ConfigError::Value {
                what: "steering_buckets",
                msg: format!("{buckets} buckets: 1 to {MAX_STEERING_BUCKETS}"),
            });
        }
        if let Some(s) = self.idle_sleep {
            check_range("idle sleep", s, MIN_INTERVAL, MAX_IDLE_SLEEP)?;
        }
        check_range(
            "idle_after",
            self.idle_after,
            MIN_IDLE_AFTER,
            MAX_IDLE_AFTER,
        )?;
        crate::nic::linux::NicSpec::parse(&self.nic).map_err(|e| ConfigError::Value {
            what: "nic",
            msg: e.to_string(),
        })?;
        if self.faults.len() > MAX_FAULT_RULES {
            return Err(ConfigError::Value {
                what: "faults",
                msg: format!(
                    "{} rules: at most {MAX_FAULT_RULES} (one rule may name every port: port=all)",
                    self.faults.len()
                ),
            });
        }
        if self.socket.as_os_str().is_empty() {
            return Err(ConfigError::Value {
                what: "socket",
                msg: "empty path".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn validation_errors_are_clear() {
        let allowed = [0, 1, 2, 3];
        let mut c = Config::new(vec![1, 2]);
        c.own_core = Some(0);
        c.validate(&allowed).unwrap();

        let mut bad = c.clone();
        bad.cores = vec![1, 9];
        let e = bad.validate(&allowed).unwrap_err().to_string();
        assert!(e.contains("core 9 is unknown") && e.contains("0-3"), "{e}");

        let mut bad = c.clone();
        bad.own_core = Some(2);
        let e = bad.validate(&allowed).unwrap_err().to_string();
        assert!(e.contains("own core 2 is also a managed core"), "{e}");

        let mut bad = c.clone();
        bad.interval = Duration::ZERO;
        assert!(bad
            .validate(&allowed)
            .unwrap_err()
            .to_string()
            .contains("interval"));
        bad.interval = Duration::from_secs(3600);
        assert!(bad
            .validate(&allowed)
            .unwrap_err()
            .to_string()
            .contains("out of range"));

        let mut bad = c.clone();
        bad.cores = vec![1, 1];
        assert!(matches!(
            bad.validate(&allowed),
            Err(ConfigError::DuplicateCore(1))
        ));

        let mut bad = c.clone();
        bad.cores.clear();
        assert!(matches!(bad.validate(&allowed), Err(ConfigError::NoCores)));

        let mut bad = c.clone();
        bad.policy = PolicyKind::Slow {
            period: Duration::from_nanos(10),
        };
        assert!(bad
            .validate(&allowed)
            .unwrap_err()
            .to_string()
            .contains("slow period"));
    }

    #[test]
    fn metrics_address_from_the_file_or_the_flag_and_bad_ones_named() {
        let dir = std::env::temp_dir().join(format!("ginza-iok-cfg-m-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let core = affinity::allowed_cpus().unwrap()[0];
        let p = dir.join("iok.toml");
        let parse = |args: &[&str]| Config::from_cli(&Cli::try_parse_from(args).unwrap());
        let with = |text: &str| {
            std::fs::write(&p, format!("cores = [{core}]\n{text}")).unwrap();
            parse(&["iokerneld", "-c", p.to_str().unwrap()])
        };
        assert_eq!(with("").unwrap().metrics, None, "not served unless asked");
        let c = with("metrics = \"127.0.0.1:9464\"\n").unwrap();
        assert_eq!(c.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        let c = with("metrics = \"[::1]:0\"\n").unwrap();
        assert_eq!(c.metrics, Some("[::1]:0".parse().unwrap()));
        // The flag overrides the file.
        let c = parse(&[
            "iokerneld",
            "-c",
            p.to_str().unwrap(),
            "--metrics",
            "0.0.0.0:9500",
        ])
        .unwrap();
        assert_eq!(c.metrics, Some("0.0.0.0:9500".parse().unwrap()));
        for bad in ["9464", "localhost:9464", "127.0.0.1", "127.0.0.1:70000", ""] {
            let e = with(&format!("metrics = \"{bad}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "metrics: \"{bad}\" is not an address to listen on"
                )),
                "{bad:?}: {e}"
            );
            assert!(
                Cli::try_parse_from(["iokerneld", "--metrics", bad]).is_err(),
                "{bad:?}"
            );
        }
        let e = with("metrics = 9464\n").unwrap_err().to_string();
        assert!(e.contains("metrics"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A key no longer known (`wake_alongside`, removed in session 22) is
    /// refused with its name and the file's path, not ignored.
    #[test]
    fn a_removed_key_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("ginza-iok-cfg-r-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("iok.toml");
        std::fs::write(&p, "wake_alongside = true\n").unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(e.contains("wake_alongside"), "{e}");
        assert!(e.contains(p.to_str().unwrap()), "{e}");
        assert!(
            Cli::try_parse_from(["iokerneld", "--wake-alongside", "true"]).is_err(),
            "the flag is gone too"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_then_flags() {
        let dir = std::env::temp_dir().join(format!("ginza-iok-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let allowed = affinity::allowed_cpus().unwrap();
        let core = allowed[0];
        let p = dir.join("iok.toml");
        std::fs::write(
            &p,
            format!(
                "cores = \"{core}\"\ninterval = \"10us\"\npolicy = \"slow\"\nslow_period = \"2ms\"\nsocket = \"/tmp/x.sock\"\nidle_sleep = \"1ms\"\nsteering = \"flow-affinity\"\n"
            ),
        )
        .unwrap();
        let cli =
            Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap(), "--interval", "20us"])
                .unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert_eq!(c.cores, vec![core]);
        assert_eq!(c.interval, Duration::from_micros(20), "flag overrides file");
        assert_eq!(
            c.policy,
            PolicyKind::Slow {
                period: Duration::from_millis(2)
            }
        );
        assert_eq!(c.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(c.idle_sleep, Some(Duration::from_millis(1)));
        assert_eq!(c.steering, SteeringKind::FlowAffinity);
        assert_eq!(
            c.local_wake_wait,
            Some(LOCAL_WAKE_WAIT),
            "on unless turned off"
        );
        let cli = Cli::try_parse_from([
            "iokerneld",
            "-c",
            p.to_str().unwrap(),
            "--steering",
            "indirection",
        ])
        .unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert_eq!(c.steering, SteeringKind::Indirection, "flag overrides file");
        for (flag, wait) in [("5us", Some(Duration::from_micros(5))), ("0", None)] {
            let cli =
                Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap(), "--local-wake", flag])
                    .unwrap();
            assert_eq!(
                Config::from_cli(&cli).unwrap().local_wake_wait,
                wait,
                "--local-wake {flag}"
            );
        }
        assert_eq!(c.idle_victim_grace, DEFAULT_IDLE_VICTIM_GRACE);
        let cli = Cli::try_parse_from([
            "iokerneld",
            "-c",
            p.to_str().unwrap(),
            "--idle-victim-grace",
            "2ms",
        ])
        .unwrap();
        assert_eq!(
            Config::from_cli(&cli).unwrap().idle_victim_grace,
            Duration::from_millis(2)
        );
        let p2 = dir.join("iok-grace.toml");
        std::fs::write(
            &p2,
            format!("cores = \"{core}\"\nidle_victim_grace = \"3ms\"\n"),
        )
        .unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p2.to_str().unwrap()]).unwrap();
        assert_eq!(
            Config::from_cli(&cli).unwrap().idle_victim_grace,
            Duration::from_millis(3),
            "from the file"
        );
        assert!(Cli::try_parse_from(["iokerneld", "--steering", "random"]).is_err());
        assert_eq!(c.steering_options, SteeringOptions::default());
        let cli = Cli::try_parse_from([
            "iokerneld",
            "--cores",
            &core.to_string(),
            "--flow-table",
            "100000",
            "--flow-prepopulate",
            "--flow-warm-up",
            "50ms",
            "--steering-buckets",
            "1024",
        ])
        .unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert_eq!(c.steering_options.flow_table_capacity, 100_000);
        assert!(c.steering_options.prepopulate);
        assert_eq!(c.flow_warm_up, Duration::from_millis(50));
        assert_eq!(c.steering_options.buckets, 1024);
        let cli = Cli::try_parse_from([
            "iokerneld",
            "--cores",
            &core.to_string(),
            "--steering-buckets",
            "0",
        ])
        .unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(e.contains("steering_buckets"), "{e}");

        std::fs::write(&p, format!("cores = [{core}]\nsteering = \"random\"\n")).unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(e.contains("steering"), "{e}");
        let cli = Cli::try_parse_from(["iokerneld", "--cores", &core.to_string()]).unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert_eq!(c.steering, SteeringKind::RssMod);
        assert!(c.yield_after_nic_tx, "on by default");
        std::fs::write(
            &p,
            format!("cores = [{core}]\nyield_after_nic_tx = false\n"),
        )
        .unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        assert!(!Config::from_cli(&cli).unwrap().yield_after_nic_tx);
        let cli = Cli::try_parse_from([
            "iokerneld",
            "--cores",
            &core.to_string(),
            "--no-yield-after-nic-tx",
        ])
        .unwrap();
        assert!(!Config::from_cli(&cli).unwrap().yield_after_nic_tx);
        let cli = Cli::try_parse_from(["iokerneld", "--cores", &core.to_string()]).unwrap();
        assert!(
            Config::from_cli(&cli).unwrap().yield_while_idle,
            "on by default"
        );
        std::fs::write(&p, format!("cores = [{core}]\nyield_while_idle = false\n")).unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        assert!(!Config::from_cli(&cli).unwrap().yield_while_idle);
        let cli = Cli::try_parse_from([
            "iokerneld",
            "--cores",
            &core.to_string(),
            "--no-yield-while-idle",
        ])
        .unwrap();
        assert!(!Config::from_cli(&cli).unwrap().yield_while_idle);

        // Sleeping while idle is the default; `--spin` or `spin = true`
        // turn it off; `idle_after` is bounded.
        let c = Config::from_cli(
            &Cli::try_parse_from(["iokerneld", "--cores", &core.to_string()]).unwrap(),
        )
        .unwrap();
        assert!(!c.spin);
        assert_eq!(c.idle_after, DEFAULT_IDLE_AFTER);
        let cli = Cli::try_parse_from([
            "iokerneld",
            "--cores",
            &core.to_string(),
            "--spin",
            "--idle-after",
            "5ms",
        ])
        .unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert!(c.spin);
        assert_eq!(c.idle_after, Duration::from_millis(5));
        std::fs::write(
            &p,
            format!("cores = [{core}]\nspin = true\nidle_after = \"10ms\"\n"),
        )
        .unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert!(c.spin);
        assert_eq!(c.idle_after, Duration::from_millis(10));
        let cli = Cli::try_parse_from([
            "iokerneld",
            "--cores",
            &core.to_string(),
            "--idle-after",
            "1ns",
        ])
        .unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(e.contains("idle_after"), "{e}");

        std::fs::write(&p, "cores = [0]\nbogus = 1\n").unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");

        assert!(Cli::try_parse_from(["iokerneld", "--policy", "fifo"]).is_err());
        let cli = Cli::try_parse_from(["iokerneld"]).unwrap();
        assert!(matches!(Config::from_cli(&cli), Err(ConfigError::NoCores)));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn fault_rules_from_flags_and_file() {
        use crate::nic::faults::{Direction, PortSelector, Probability};
        let dir = std::env::temp_dir().join(format!("ginza-iok-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let core = affinity::allowed_cpus().unwrap()[0].to_string();
        let p = dir.join("iok.toml");
        std::fs::write(
            &p,
            format!(
                "cores = \"{core}\"\n\n[[faults]]\nport = \"trunk\"\ndrop = \"5%\"\nreorder = \"2%\"\nseed = 42\n\n[[faults]]\nport = \"app:echo\"\ndelay = \"200us\"\ngap = 2\n"
            ),
        )
        .unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert_eq!(c.faults.len(), 2);
        assert_eq!(c.faults[0].port, PortSelector::Trunk);
        assert_eq!(c.faults[0].drop, Probability::from_percent(5.0).unwrap());
        assert_eq!((c.faults[0].seed, c.faults[0].dir), (42, Direction::Both));
        assert_eq!(c.faults[1].port, PortSelector::App("echo".into()));
        assert_eq!(
            (c.faults[1].delay, c.faults[1].gap),
            (Duration::from_micros(200), 2)
        );

        // Flags replace the file's rules.
        let cli = Cli::try_parse_from([
            "iokerneld",
            "-c",
            p.to_str().unwrap(),
            "--faults",
            "drop=1%",
            "--faults",
            "duplicate=3%,port=generator,dir=in",
        ])
        .unwrap();
        let c = Config::from_cli(&cli).unwrap();
        assert_eq!(
            c.faults.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "drop=1%,port=all,dir=out",
                "duplicate=3%,port=generator,dir=in"
            ]
        );

        // A bad flag: clap's error carries the rule's message.
        let e = Cli::try_parse_from(["iokerneld", "--faults", "drop=150%"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--faults")
                && e.contains("drop=150%: a probability must be between 0 % and 100 %"),
            "{e}"
        );
        // A bad table: the rule's number and the key.
        std::fs::write(
            &p,
            format!("cores = \"{core}\"\n[[faults]]\ndrop = \"1%\"\n[[faults]]\nloss = \"5%\"\n"),
        )
        .unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(
            e.starts_with("faults: rule 2 ([[faults]] table 2): loss=5%: unknown key"),
            "{e}"
        );
        std::fs::write(&p, format!("cores = \"{core}\"\n[[faults]]\ndrop = true\n")).unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(
            e.contains("drop = true: expected a string or a number"),
            "{e}"
        );
        std::fs::write(&p, format!("cores = \"{core}\"\n[[faults]]\ndrop = 5\n")).unwrap();
        let cli = Cli::try_parse_from(["iokerneld", "-c", p.to_str().unwrap()]).unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(
            e.contains("drop=5: write a probability as a percentage"),
            "{e}"
        );

        // Too many rules.
        let mut args = vec!["iokerneld".to_string(), "--cores".into(), core.clone()];
        for i in 0..=MAX_FAULT_RULES {
            args.push("--faults".into());
            args.push(format!("drop={i}%"));
        }
        let cli = Cli::try_parse_from(&args).unwrap();
        let e = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(e.contains("faults: 5 rules: at most 4"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
