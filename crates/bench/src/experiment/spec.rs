//! The schema of `bench/experiments/*.toml` (docs/experiments.md): what an
//! experiment file may say, checked while it is read so that a bad file is
//! refused with its line and key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

/// One experiment file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub experiment: Meta,
    /// The applications, the latency-critical one first.
    #[serde(default, rename = "app")]
    pub apps: Vec<App>,
    /// The system under test.
    pub system: System,
    /// Systems run beside it in the same run, rounds interleaved.
    #[serde(default, rename = "baseline")]
    pub baselines: Vec<System>,
    pub load: Load,
    #[serde(default)]
    pub plot: Plot,
}

/// What the experiment is.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// Its name: `results/<name>/` holds its outputs.
    pub name: Name,
    /// The paper figure it reproduces (cited on every plot).
    pub reproduces: String,
    #[serde(default)]
    pub description: String,
    /// Rounds: each runs every system once per load point, in turn.
    #[serde(default = "one")]
    pub rounds: Count,
    /// Whether `ginza bench all` runs it.
    #[serde(default = "yes")]
    pub in_all: bool,
}

/// An application of the experiment.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `name` is for the reader and the JSON of runners to come
pub struct App {
    pub name: String,
    pub program: Program,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub scheduling: Scheduling,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    SpinServer,
    ScanServer,
    KvServer,
    HttpServer,
    Echo,
    Batch,
}

impl Program {
    pub fn name(self) -> &'static str {
        match self {
            Program::SpinServer => "spin-server",
            Program::ScanServer => "scan-server",
            Program::KvServer => "kv-server",
            Program::HttpServer => "http-server",
            Program::Echo => "echo",
            Program::Batch => "batch",
        }
    }
}

/// In the application's process, or behind the protected netstack (DLibOS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    InProcess,
    Protected,
}

/// How the application runs its requests.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Scheduling {
    #[default]
    RunToCompletion,
    Shinjuku {
        policy: SchedPolicy,
        quantum: Dur,
    },
}

/// A request-scheduling policy (Shinjuku's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SchedPolicy {
    #[serde(rename = "d-FCFS")]
    DFcfs,
    #[serde(rename = "c-FCFS")]
    CFcfs,
    #[serde(rename = "PS")]
    Ps,
    #[serde(rename = "c-PRE-SQ")]
    CPreSq,
    #[serde(rename = "c-PRE-MQ")]
    CPreMq,
}

impl SchedPolicy {
    pub fn name(self) -> &'static str {
        match self {
            SchedPolicy::DFcfs => "d-FCFS",
            SchedPolicy::CFcfs => "c-FCFS",
            SchedPolicy::Ps => "PS",
            SchedPolicy::CPreSq => "c-PRE-SQ",
            SchedPolicy::CPreMq => "c-PRE-MQ",
        }
    }
}

/// Where a preempted request goes back in its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    Head,
    Tail,
}

/// A system: the one under test, or a baseline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    /// Its name in the CSV, the legend and the JSON (spanned: a problem with
    /// the system is reported at this line).
    pub label: Spanned<String>,
    pub kind: SystemKind,
    /// Ginza's core allocator (iokerneld) or the simulated one.
    pub allocator: Option<Allocator>,
    /// iokerneld's packet steering.
    pub steering: Option<Steering>,
    /// Overrides the latency-critical application's mode (in-process or
    /// protected): one file compares both.
    pub mode: Option<Mode>,
    /// Overrides the applications' Shinjuku policy.
    pub policy: Option<SchedPolicy>,
    /// Overrides the applications' quantum.
    pub quantum: Option<Dur>,
    pub placement: Option<Placement>,
    /// Simulator: time from a grant to the kthread running.
    pub grant_latency: Option<Dur>,
    /// Simulator: cores (or workers).
    pub cores: Option<Count>,
    /// Simulator (steering): flow table warmed up before the run.
    #[serde(default)]
    pub warm_table: bool,
}

impl System {
    pub fn label(&self) -> &str {
        self.label.get_ref()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemKind {
    /// Ginza on this machine.
    Ginza,
    /// Linux on this machine (kernel sockets, threads).
    Linux,
    /// The discrete-event simulator (`crates/sim`): a model, not a
    /// measurement.
    Simulator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Allocator {
    /// Congestion detection every 5 µs.
    Shenango,
    /// Cores provisioned for the peak, kept.
    Static,
    /// Cores from utilisation every 1 ms.
    Slow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Steering {
    RssMod,
    FlowAffinity,
    Indirection,
}

/// The load: generator, workload and sweep.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
// `protocol`, `connections` and `steps` are read by the runners that the
// loadgen and load-step harnesses will add (docs/experiments.md).
#[allow(dead_code)]
pub struct Load {
    pub generator: Generator,
    #[serde(default)]
    pub protocol: Protocol,
    /// Service times the requests carry (spin) or the model draws.
    pub service: Option<ServiceDist>,
    /// scan-server's GET/SCAN mix.
    pub mix: Option<ScanMix>,
    #[serde(default = "one")]
    pub connections: Count,
    /// Flows (source ports) of the requests.
    #[serde(default = "one")]
    pub flows: Count,
    /// The sweep: offered loads, in `unit`.
    #[serde(default)]
    pub offered: Vec<Positive>,
    #[serde(default)]
    pub unit: LoadUnit,
    /// Load steps (a time series instead of a sweep).
    #[serde(default)]
    pub steps: Vec<LoadStep>,
    /// Measured time per point.
    pub duration: Option<Dur>,
    #[serde(default)]
    pub warmup: Option<Dur>,
    /// Measured requests per point (simulator, in-process Shinjuku).
    pub requests: Option<Count>,
    #[serde(default = "one_u64")]
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Generator {
    /// iokerneld's traffic generator on its software switch (in process).
    Builtin,
    /// `ginza loadgen` (docs/loadgen.md).
    Loadgen,
    /// Requests drawn in advance and replayed inside the process (Shinjuku
    /// mode in-process).
    InProcess,
    /// The simulator's own arrivals.
    Simulated,
    /// Closed loop, NetPIPE-style: one TCP connection, the next message
    /// sent when the last one's echo is back (`ginza bench oneway`).
    PingPong,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    #[default]
    Udp,
    Tcp,
    MemcachedUdp,
    MemcachedTcp,
    Http,
}

/// The unit of `offered`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadUnit {
    /// Fraction of the cores' capacity (1 / mean service time per core).
    #[default]
    Capacity,
    /// Cores' worth of work.
    Cores,
    /// Requests per second.
    Rps,
    /// Message size, bytes (ping-pong: no rate is offered).
    Bytes,
}

impl LoadUnit {
    pub fn name(self) -> &'static str {
        match self {
            LoadUnit::Capacity => "capacity",
            LoadUnit::Cores => "cores",
            LoadUnit::Rps => "rps",
            LoadUnit::Bytes => "bytes",
        }
    }
}

/// A service-time distribution.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum ServiceDist {
    Exponential {
        mean: Dur,
    },
    Constant {
        value: Dur,
    },
    /// `short` with probability `p`, else `long`.
    Bimodal {
        p: Probability,
        short: Dur,
        long: Dur,
    },
    Lognormal {
        mean: Dur,
        sd: Dur,
    },
}

impl ServiceDist {
    pub fn mean_us(&self) -> f64 {
        let us = |d: &Dur| d.0.as_secs_f64() * 1e6;
        match self {
            ServiceDist::Exponential { mean } | ServiceDist::Lognormal { mean, .. } => us(mean),
            ServiceDist::Constant { value } => us(value),
            ServiceDist::Bimodal { p, short, long } => p.0 * us(short) + (1.0 - p.0) * us(long),
        }
    }
}

/// scan-server's GET/SCAN mix (Shinjuku §5's RocksDB workload).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScanMix {
    /// Share of GETs; the rest are SCANs.
    pub get: Probability,
    /// Keys a SCAN walks.
    pub scan_keys: Count,
    /// Keys in the map.
    pub keys: Count,
    /// c-PRE-MQ's SLO for GETs and for SCANs.
    pub get_slo: Dur,
    pub scan_slo: Dur,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // see `Load`
pub struct LoadStep {
    pub offered: Positive,
    pub duration: Dur,
}

/// What to plot.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plot {
    /// CSV columns on the y axis, one PNG each.
    #[serde(default = "default_y")]
    pub y: Vec<Column>,
    #[serde(default)]
    pub log_y: bool,
    /// Clip latencies past saturation.
    pub y_max: Option<f64>,
}

impl Default for Plot {
    fn default() -> Self {
        Plot {
            y: default_y(),
            log_y: false,
            y_max: None,
        }
    }
}

fn default_y() -> Vec<Column> {
    vec![Column("p99_us".into())]
}

/// A metric column of the CSV (checked against [`super::row::METRICS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column(pub String);

impl<'de> Deserialize<'de> for Column {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if !super::row::METRICS.contains(&s.as_str()) {
            return Err(serde::de::Error::custom(format!(
                "unknown column {s:?}: expected one of {}",
                super::row::METRICS.join(", ")
            )));
        }
        Ok(Column(s))
    }
}

/// A duration written as a string with a unit (`"10us"`, `"300ms"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ginza_proto::parse_duration(&s)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

/// A positive, finite number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Positive(pub f64);

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(v.is_finite() && v > 0.0) {
            return Err(serde::de::Error::custom(format!(
                "{v} must be a positive number"
            )));
        }
        Ok(Positive(v))
    }
}

/// A probability in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probability(pub f64);

impl<'de> Deserialize<'de> for Probability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(serde::de::Error::custom(format!(
                "{v} is not a probability (0 to 1)"
            )));
        }
        Ok(Probability(v))
    }
}

/// A count of at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        if v < 1 {
            return Err(serde::de::Error::custom(format!("{v} must be at least 1")));
        }
        Ok(Count(v as u64))
    }
}

/// An experiment's name: letters, digits, `-` and `_` (it names a folder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(pub String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(serde::de::Error::custom(format!(
                "{s:?} is not a name (1 to 64 of a-z, 0-9, - and _)"
            )));
        }
        Ok(Name(s))
    }
}

fn one() -> Count {
    Count(1)
}
fn one_u64() -> u64 {
    1
}
fn yes() -> bool {
    true
}

/// An experiment read from a file.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub text: String,
    pub spec: Experiment,
}

impl Loaded {
    /// `path:line: key `k`: message` for a problem found after parsing, at
    /// the byte offset `at` of the file.
    pub fn error_at(&self, at: usize, key: &str, message: &str) -> anyhow::Error {
        let (line, _) = line_col(&self.text, at);
        anyhow::anyhow!("{}:{line}: key `{key}`: {message}", self.path.display())
    }
}

/// Line and column (1-based) of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(at, |i| at - i - 1) + 1;
    (line, col)
}

/// The key written on the line at `at` (the text before its `=`), or the
/// table header (`[load]`) when the line is one.
fn key_on_line(text: &str, at: usize) -> Option<String> {
    let at = at.min(text.len());
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line = text[start..end].trim();
    if let Some((k, _)) = line.split_once('=') {
        let k = k.trim();
        if !k.is_empty() && !k.starts_with('#') {
            return Some(k.to_string());
        }
    }
    line.starts_with('[').then(|| line.to_string())
}

/// Parses `text` (from `path`); a bad file gives `path:line:col: key `k`:
/// message`.
pub fn parse(path: &Path, text: &str) -> anyhow::Result<Loaded> {
    match toml::from_str::<Experiment>(text) {
        Ok(spec) => Ok(Loaded {
            path: path.to_path_buf(),
            text: text.to_string(),
            spec,
        }),
        Err(e) => {
            let message = e.message().trim().to_string();
            let Some(span) = e.span() else {
                anyhow::bail!("{}: {message}", path.display());
            };
            let (line, col) = line_col(text, span.start);
            let key = key_on_line(text, span.start)
                .map(|k| format!("key `{k}`: "))
                .unwrap_or_default();
            anyhow::bail!("{}:{line}:{col}: {key}{message}", path.display())
        }
    }
}

/// Reads and parses the experiment file at `path`.
pub fn load(path: &Path) -> anyhow::Result<Loaded> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    parse(path, &text)
}
