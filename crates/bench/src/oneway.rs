//! `ginza bench oneway`: one-way latency of 64-byte messages, DLibOS's
//! Figs. 5–7 on this machine, and the throughput of `http-server` in both
//! modes at one p99 bound (issue #15; docs/protected.md, "Benchmark").
//!
//! **Latency**, NetPIPE-style: a client sends 64 bytes on one persistent
//! TCP connection and waits for their echo before the next; the one-way
//! latency is half of each round trip. Three servers, each answering over
//! its own path, no root needed:
//!
//! * `rtc`: `echo-server` on a Ginza runtime with the in-process stack
//!   (run to completion), a Ginza client (in-process stack), both under
//!   one iokerneld, frames through its software switch;
//! * `protected`: the same `echo-server` protected (its runtime's
//!   protected backend, registered with iokerneld for cores only), the
//!   TCP/IP stack in `netstackd` (the netstack daemon, an application
//!   under the same iokerneld), the same Ginza client through the same
//!   switch;
//! * `linux`: a Linux echo server (a thread per connection blocked in
//!   `read`) and a Linux client, kernel sockets over loopback (`127.0.0.1`):
//!   no NIC, as for the two others (the switch is a memory copy too);
//! * `linux_busy_poll`: Linux as its best users would run it for latency,
//!   over the same loopback: the echo server one thread spinning over
//!   non-blocking sockets pinned to the CPU Ginza's applications use, the
//!   client spinning too, pinned to the CPU iokerneld uses in the Ginza
//!   rounds (`SO_BUSY_POLL` on both): no sleep or wake-up on either side.
//!
//! Each round starts its own iokerneld (no NIC) and ends it. Rounds are
//! interleaved (rtc, protected, linux, linux_busy_poll, rtc, …); p50 and
//! p99 are the medians
//! over rounds of each round's percentiles.
//!
//! **Throughput**: `http-server` (the same code in both modes) under the
//! same iokerneld, offered open-loop `GET /` load (Poisson, keep-alive
//! connections) by `ginza loadgen`'s Ginza backend, itself a runtime
//! application behind the same switch. The offered load is swept upwards;
//! at each step both modes run, interleaved (rtc, protected, rtc, …), each
//! on a fresh iokerneld. A mode's figure is the highest achieved rate among
//! its steps whose p99 (median over the step's rounds) stays within one
//! bound shared by both modes (`throughput_p99_bound_us`), whose generator
//! kept up and which lost no request; a mode stops climbing after two
//! steps over the bound.
//!
//! [`measure`] runs it all from a plain [`OnewayConfig`] and returns the
//! [`OnewayReport`] (the JSON of `--json`), for the experiment engine.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use ginza_apps::echo_client;
use ginza_apps::echo_server::{self, EchoStats, Protocols};
use ginza_apps::http_server::{self, HttpStats};
use ginza_iokernel::netns::tcp::{self as linux, ClientWait, EchoMode};
use ginza_iokernel::InProcess;
use ginza_loadgen::ginza::GinzaConfig;
use ginza_loadgen::protocol::http::Http;
use ginza_loadgen::protocol::{Transport, Workload};
use ginza_loadgen::report::Report as LoadReport;
use ginza_loadgen::schedule::{parse_rate, Arrivals, Process};
use ginza_loadgen::RunConfig;
use ginza_net::{Interface, MacAddr};
use ginza_netstack::daemon::{Daemon, DaemonConfig};
use ginza_proto::parse_duration;
use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::{Class, Config as RtConfig};
use ginza_sys::hops::{self, Hop};
use serde::Serialize;

use crate::harness::app::{runtime_config, App};
use crate::harness::figures::{allowed_cpus, emit, median};
use crate::harness::iokerneld::{start_on, Cpus, Iokerneld};
use crate::harness::rtt::{quantiles, retry_refused, Quantiles, IO_TIMEOUT, PAYLOAD, WARMUP};

/// Arguments of `ginza bench oneway`.
#[derive(clap::Args, Debug)]
pub struct OnewayArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Interleaved latency rounds; each figure is the median over them.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Length of one ping-pong series (after its warm-up), e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    duration: Duration,
    /// Offered loads of the throughput sweep, requests/s, ascending,
    /// comma-separated (e.g. 5k,10k,20k).
    #[arg(long, value_delimiter = ',', value_parser = parse_rate,
          default_value = "5k,10k,20k,30k,40k,60k")]
    tput_loads: Vec<f64>,
    /// Measured length of each throughput step (after its warm-up).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    tput_duration: Duration,
    /// Load offered before each step's measured part.
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    tput_warmup: Duration,
    /// Times each (mode, load) step runs; its figures are medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    tput_rounds: u32,
    /// Keep-alive connections of the generator.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    tput_connections: u64,
    /// The p99 both modes' throughput is measured at (see docs/protected.md,
    /// "Benchmark", for the choice).
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    p99_bound: Duration,
    /// After the listed loads, keep raising the load by half while a mode
    /// stays within the bound (at most 12 more steps), so that a machine
    /// with cores to spare reports a capacity, not the sweep's top.
    #[arg(long)]
    tput_extend: bool,
    /// Latency only: `throughput_krps` is null.
    #[arg(long)]
    no_throughput: bool,
    /// CPUs iokerneld manages for the applications. With 1 (the 2-CPU
    /// layout) iokerneld's loop shares the two CPUs with them; with more,
    /// its loop busy-polls on a CPU of its own and the client, the server
    /// and netstackd can each get a core (DLibOS's setting).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    app_cpus: u32,
    /// How long the client's, the server's and netstackd's idle kthreads
    /// look for work before they park, e.g. 50us (default: the runtime's
    /// and netstackd's own). Spinning on a core of its own is what a
    /// latency-first user does with `--app-cpus 3` or more.
    #[arg(long, value_parser = parse_duration)]
    spin_before_park: Option<Duration>,
    /// The client's and the server's idle kthreads park instead of
    /// polling (`poll_while_idle` = 0: the behaviour before idle polling,
    /// docs/idle-poll.md), as `ginza bench tcp --park`.
    #[arg(long)]
    park: bool,
}

/// What [`measure`] runs.
#[derive(Clone, Debug)]
pub struct OnewayConfig {
    /// Interleaved latency rounds (at least one).
    pub rounds: u32,
    /// Length of one ping-pong series, after its warm-up.
    pub duration: Duration,
    /// The throughput sweep; `None`: not run (`throughput_krps` null).
    pub throughput: Option<ThroughputConfig>,
    /// CPUs iokerneld manages for the applications (at least one).
    pub app_cpus: usize,
    /// The parties' spin before parking; `None`: their defaults.
    pub spin_before_park: Option<Duration>,
    /// The client's and the server's kthreads park when idle instead of
    /// polling.
    pub park: bool,
}

/// Where iokerneld and the applications run, and how they wait.
#[derive(Clone, Debug)]
pub struct Setup {
    /// iokerneld's CPU and the first it manages; the Linux peers' client and
    /// server spin on these two.
    pub cpus: Cpus,
    /// Further CPUs iokerneld manages. With none, iokerneld's loop is
    /// unpinned and sleeps when idle, so that it shares two CPUs with the
    /// applications; with some, it busy-polls on `cpus.iokernel` alone.
    pub more_app_cpus: Vec<usize>,
    /// The client's, the server's and netstackd's spin before parking;
    /// `None`: their defaults.
    pub spin_before_park: Option<Duration>,
    /// The client's and the server's kthreads park when idle instead of
    /// polling (`poll_while_idle` = 0).
    pub park: bool,
}

impl Setup {
    /// The 2-CPU layout.
    pub fn shared(cpus: Cpus) -> Setup {
        Setup {
            cpus,
            more_app_cpus: Vec::new(),
            spin_before_park: None,
            park: false,
        }
    }

    /// iokerneld on the first allowed CPU, `app_cpus` managed ones after it.
    fn from_allowed(cfg: &OnewayConfig) -> anyhow::Result<Setup> {
        let app_cpus = cfg.app_cpus;
        let allowed = allowed_cpus()?;
        anyhow::ensure!(
            app_cpus >= 1 && allowed.len() > app_cpus,
            "ginza bench oneway needs {} CPUs (iokerneld and {app_cpus} for the applications), this process may use {allowed:?}",
            app_cpus + 1
        );
        Ok(Setup {
            cpus: Cpus {
                iokernel: allowed[0],
                app: allowed[1],
            },
            more_app_cpus: allowed[2..=app_cpus].to_vec(),
            spin_before_park: cfg.spin_before_park,
            park: cfg.park,
        })
    }

    fn describe(&self) -> String {
        let mut spin = match self.spin_before_park {
            Some(d) => format!(", idle kthreads spin {d:?} before parking"),
            None => String::new(),
        };
        if self.park {
            spin += ", the client and the server park when idle";
        }
        let cpus = if self.more_app_cpus.is_empty() {
            format!(
                "iokerneld manages CPUs {} and {} (its loop unpinned)",
                self.cpus.iokernel, self.cpus.app
            )
        } else {
            format!(
                "iokerneld busy-polls on CPU {} and manages CPUs {:?}",
                self.cpus.iokernel,
                self.app_cores()
            )
        };
        cpus + &spin
    }

    /// Its spin and whether to poll while idle, on a runtime's
    /// configuration.
    fn tune(&self, config: &mut RtConfig) {
        if let Some(spin) = self.spin_before_park {
            config.spin_before_park = spin;
        }
        if let (true, Some(io)) = (self.park, config.iokernel.as_mut()) {
            io.poll_while_idle = Duration::ZERO;
        }
    }

    /// Its spin, on netstackd's: idle, and while an application owes an
    /// answer (never shorter than the idle one).
    fn tune_netstack(&self, config: &mut DaemonConfig) {
        if let Some(spin) = self.spin_before_park {
            config.spin = spin;
            config.reply_spin = config.reply_spin.max(spin);
        }
    }

    fn app_cores(&self) -> Vec<usize> {
        std::iter::once(self.cpus.app)
            .chain(self.more_app_cpus.iter().copied())
            .collect()
    }

    /// A fresh iokerneld on the software switch laid out so.
    fn start_iokerneld(&self) -> anyhow::Result<Iokerneld> {
        start_on("", self.cpus, |cfg| {
            if !self.more_app_cpus.is_empty() {
                cfg.cores = self.app_cores();
                cfg.own_core = Some(self.cpus.iokernel);
                cfg.idle_sleep = None;
                cfg.spin = true;
            }
            Ok(())
        })
    }
}

/// The throughput sweep of [`measure`].
#[derive(Clone, Debug)]
pub struct ThroughputConfig {
    /// Offered loads, requests/s, ascending.
    pub loads_rps: Vec<f64>,
    /// Measured part of each step.
    pub duration: Duration,
    /// Load offered before it, not measured.
    pub warmup: Duration,
    /// Times each (mode, load) step runs (at least one).
    pub rounds: u32,
    /// Keep-alive TCP connections of the generator.
    pub connections: usize,
    /// The p99 both figures are taken at.
    pub p99_bound: Duration,
    /// Whether the loads go on past the list, by half each step, while a
    /// mode stays within the bound.
    pub extend: bool,
}

/// The default sweep, as `ginza bench oneway` runs it.
impl Default for ThroughputConfig {
    fn default() -> ThroughputConfig {
        ThroughputConfig {
            loads_rps: vec![5e3, 10e3, 20e3, 30e3, 40e3, 60e3],
            duration: Duration::from_secs(1),
            warmup: Duration::from_millis(200),
            rounds: 1,
            connections: 16,
            p99_bound: Duration::from_millis(5),
            extend: false,
        }
    }
}

impl OnewayArgs {
    fn config(&self) -> OnewayConfig {
        OnewayConfig {
            rounds: self.rounds,
            duration: self.duration,
            throughput: (!self.no_throughput).then(|| ThroughputConfig {
                loads_rps: self.tput_loads.clone(),
                duration: self.tput_duration,
                warmup: self.tput_warmup,
                rounds: self.tput_rounds,
                connections: self.tput_connections as usize,
                extend: self.tput_extend,
                p99_bound: self.p99_bound,
            }),
            app_cpus: self.app_cpus as usize,
            spin_before_park: self.spin_before_park,
            park: self.park,
        }
    }
}

const ECHO_PORT: u16 = 7;
const HTTP_PORT: u16 = 80;
const SERVER: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x15, 0x01]),
    Ipv4Addr::new(10, 47, 15, 1),
);
const CLIENT: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x15, 0x02]),
    Ipv4Addr::new(10, 47, 15, 2),
);
/// The netstack's own address in the protected rounds; the server asks
/// for `SERVER` (iokerneld steers it to the netstack).
const NETSTACK: (MacAddr, Ipv4Addr) = (
    MacAddr([0x02, 0x47, 0x5a, 0x00, 0x15, 0x03]),
    Ipv4Addr::new(10, 47, 15, 3),
);
/// A request unanswered this long after its scheduled send times out.
const TPUT_TIMEOUT: Duration = Duration::from_secs(1);
/// Steps over the bound after which a mode stops climbing.
const STEPS_OVER_BOUND: usize = 2;

/// Steps `ThroughputConfig::extend` adds at most past the listed loads.
const EXTRA_STEPS: usize = 12;
/// How often iokerneld's counts are read during a throughput run.
const STATS_SAMPLE: Duration = Duration::from_millis(20);

/// The two Ginza modes.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The in-process stack, run to completion.
    Rtc,
    /// The stack in `netstackd`, the application on rings.
    Protected,
    /// The throughput sweep's peer: the same HTTP session code on kernel
    /// sockets over loopback.
    Linux,
}

impl Mode {
    /// What the throughput sweep runs at each step, in this order.
    const SWEPT: [Mode; 3] = [Mode::Rtc, Mode::Protected, Mode::Linux];

    fn name(self) -> &'static str {
        match self {
            Mode::Rtc => "rtc",
            Mode::Protected => "protected",
            Mode::Linux => "linux",
        }
    }
}

#[derive(Serialize, Debug)]
pub struct OnewaySet {
    pub rtc: Quantiles,
    pub protected: Quantiles,
    pub linux: Quantiles,
    pub linux_busy_poll: Quantiles,
}

#[derive(Serialize, Debug, Default)]
pub struct Throughput {
    pub rtc: Option<f64>,
    pub protected: Option<f64>,
    /// The peer: `http_server::Session` on kernel sockets, loopback.
    pub linux: Option<f64>,
}

/// One round's one-way latencies (µs), for the record, and what
/// iokerneld did for each Ginza series.
#[derive(Serialize, Debug)]
pub struct Round {
    pub rtc: Option<Quantiles>,
    pub protected: Option<Quantiles>,
    pub linux: Option<Quantiles>,
    pub linux_busy_poll: Option<Quantiles>,
    pub rtc_wakes: Option<Wakes>,
    pub protected_wakes: Option<Wakes>,
    /// Where the protected round trip's time went, hop by hop, from a
    /// stamped series after the round's unstamped one (whose round trips
    /// give the figures).
    pub protected_hops: Option<Hops>,
}

/// The protected round trip cut at its hops (TSC stamps,
/// `ginza_sys::hops`; docs/protected.md, "Where the one-way time goes"):
/// for each stretch between two consecutive hops, its p50 and p99 over the
/// round trips in which every hop was seen, µs.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Hops {
    /// Round trips stamped at every hop (the others are left out).
    pub complete: usize,
    /// Round trips measured.
    pub round_trips: usize,
    /// Of them, stamped at each hop, in path order: a hop seen in fewer
    /// round trips is one a round trip need not pass.
    pub seen: Vec<(&'static str, usize)>,
    /// Round trips stamped at every hop but not in path order.
    pub out_of_order: usize,
    /// Each stretch between consecutive hops, in path order.
    pub stretches: Vec<Stretch>,
}

/// The time from one hop to the next, µs.
#[derive(Serialize, Debug, Clone)]
pub struct Stretch {
    pub from: &'static str,
    pub to: &'static str,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// iokerneld's work per round trip of an echo series (warm-up and set-up
/// included in the counts, so slightly above the true figure): where a
/// round trip's time can go besides the two stacks.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Wakes {
    /// Round trips the client made (warm-up included).
    pub round_trips: u64,
    /// Core grants (a parked kthread woken) per round trip, per
    /// application.
    pub grants_per_round_trip: BTreeMap<String, f64>,
    /// Preemptions (a core taken back) per round trip, per application.
    pub preemptions_per_round_trip: BTreeMap<String, f64>,
    /// iokerneld's time per grant: bookkeeping, `sched_setaffinity` and
    /// the eventfd write (median, µs).
    pub grant_cost_p50_us: f64,
    /// CPU time of iokerneld's loop per round trip, µs.
    pub iokerneld_cpu_us_per_round_trip: f64,
}

/// One throughput run: one mode at one offered load.
#[derive(Serialize, Clone, Debug)]
pub struct TputRun {
    pub mode: Mode,
    pub offered_krps: f64,
    /// Good answers per second to the requests of the measured part.
    pub achieved_krps: f64,
    /// From each request's scheduled send (the generator's lag
    /// included); `None` if nothing was answered.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub generator_saturated: bool,
    pub saturation_reason: Option<String>,
    /// Timeouts, broken connections, error answers, unmatched answers.
    pub failed: u64,
    /// The latency's far tail, µs (`None` if nothing was answered).
    pub p999_us: Option<f64>,
    pub max_us: Option<f64>,
    /// How late the generator sent against its schedule: p99 and max, µs
    /// (inside the latencies above, which count from the schedule).
    pub send_lag_p99_us: f64,
    pub send_lag_max_us: f64,
    /// What iokerneld did during a Ginza run (`None` for the Linux peer).
    pub iokerneld: Option<TputIokerneld>,
}

/// iokerneld's work during one throughput run, per request answered (from
/// its last snapshot before the generator left, so slightly short of the
/// run's totals): where a request's time can go besides the two stacks
/// (docs/protected.md, "Why the throughput was null").
#[derive(Serialize, Clone, Debug, Default)]
pub struct TputIokerneld {
    /// Core grants (a parked kthread woken) per request, per application.
    pub grants_per_request: BTreeMap<String, f64>,
    /// Preemptions (a core taken back) per request, per application.
    pub preemptions_per_request: BTreeMap<String, f64>,
    /// Preempted kthreads that kept their core past the 1 ms deadline and
    /// were moved off it (then sharing a CPU under Linux's scheduler), per
    /// application.
    pub preempt_overdue: BTreeMap<String, u64>,
    /// Frames dropped on their way into or out of each application.
    pub frame_drops: BTreeMap<String, u64>,
    /// CPU time of iokerneld's loop per request, µs.
    pub loop_cpu_us_per_request: f64,
}

/// A (mode, load) step's medians over its rounds.
#[derive(Serialize, Clone, Debug)]
pub struct TputPoint {
    pub mode: Mode,
    pub offered_krps: f64,
    pub achieved_krps: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Whether this step counts for `throughput_krps`: p99 within the
    /// bound, the generator kept up (most rounds), nothing failed.
    pub within_bound: bool,
    /// Whether most rounds' generator kept its schedule (p99 send lag
    /// within the bound).
    pub generator_kept_up: bool,
    pub rounds: usize,
}

#[derive(Serialize, Debug)]
pub struct OnewayReport {
    /// Half of each 64-byte round trip, µs: medians over rounds of each
    /// round's p50 and p99.
    pub oneway_us: OnewaySet,
    /// The highest achieved krps of `http-server` per mode among the steps
    /// whose p99 stayed within `throughput_p99_bound_us`; null if none did
    /// (or the sweep did not run).
    pub throughput_krps: Throughput,
    pub throughput_p99_bound_us: Option<f64>,
    /// The sweep's steps, medians over rounds, in the order run.
    pub throughput_points: Vec<TputPoint>,
    /// Every throughput run, in the order run.
    pub throughput_runs: Vec<TputRun>,
    pub payload_bytes: usize,
    /// The path each figure took.
    pub paths: Paths,
    pub rounds: Vec<Round>,
    pub notes: Vec<String>,
    /// Whether this binary was built without optimisations.
    pub debug_build: bool,
    /// The machine's load averages (1, 5, 15 min) before and after.
    pub loadavg_before: Option<String>,
    pub loadavg_after: Option<String>,
}

#[derive(Serialize, Debug)]
pub struct Paths {
    pub rtc: &'static str,
    pub protected: &'static str,
    pub linux: &'static str,
    pub linux_busy_poll: &'static str,
    pub throughput: &'static str,
}

const PATHS: Paths = Paths {
    rtc: "Ginza client (in-process stack) -> iokerneld software switch -> echo-server (in-process stack, run to completion); no NIC",
    protected: "Ginza client (in-process stack) -> iokerneld software switch -> netstackd -> rings -> echo-server --protected; no NIC",
    linux: "Linux client -> kernel TCP over loopback 127.0.0.1 -> Linux echo server (thread blocked in read)",
    linux_busy_poll: "Linux client spinning on a non-blocking socket, pinned to iokerneld's CPU of the Ginza rounds -> kernel TCP over loopback 127.0.0.1 -> Linux echo server spinning over non-blocking sockets, pinned to the applications' CPU (SO_BUSY_POLL both)",
    throughput: "rtc, protected: ginza loadgen (Ginza backend, HTTP GET /, Poisson) -> iokerneld software switch -> http-server (rtc: in-process stack; protected: via netstackd and rings), no NIC; linux: ginza loadgen (kernel backend) -> loopback -> http-server's Session on kernel sockets, a thread per connection",
};

pub fn run(args: OnewayArgs) -> anyhow::Result<()> {
    let report = measure(&args.config())?;
    emit(args.json, &render(&report), &report)
}

/// Runs the benchmark `cfg` describes (the latency rounds, then the
/// throughput sweep) and returns its report.
pub fn measure(cfg: &OnewayConfig) -> anyhow::Result<OnewayReport> {
    anyhow::ensure!(cfg.rounds >= 1, "at least one latency round is needed");
    let setup = Setup::from_allowed(cfg)?;
    let cpus = setup.cpus;
    let loadavg_before = crate::harness::figures::loadavg();
    let mut rounds = Vec::new();
    for r in 0..cfg.rounds {
        let rtc = echo_round(Mode::Rtc, &setup, cfg.duration)
            .with_context(|| format!("round {r}, rtc"))?;
        let protected = echo_round(Mode::Protected, &setup, cfg.duration)
            .with_context(|| format!("round {r}, protected"))?;
        let linux = linux_round(cfg.duration).with_context(|| format!("round {r}, linux"))?;
        let busy = linux_busy_poll_round(cpus, cfg.duration)
            .with_context(|| format!("round {r}, linux_busy_poll"))?;
        rounds.push(Round {
            rtc: Some(half(rtc.0)),
            protected: Some(half(protected.0)),
            linux: Some(half(linux)),
            linux_busy_poll: Some(half(busy)),
            rtc_wakes: Some(rtc.1),
            protected_wakes: Some(protected.1),
            protected_hops: protected.2,
        });
    }
    let med = |pick: fn(&Round) -> Option<Quantiles>| -> anyhow::Result<Quantiles> {
        let qs: Vec<Quantiles> = rounds.iter().filter_map(pick).collect();
        let p50: Vec<f64> = qs.iter().map(|q| q.p50).collect();
        let p99: Vec<f64> = qs.iter().map(|q| q.p99).collect();
        Ok(Quantiles {
            p50: median(&p50).ok_or_else(|| anyhow!("no round measured"))?,
            p99: median(&p99).ok_or_else(|| anyhow!("no round measured"))?,
        })
    };
    let mut notes = vec![format!(
        "one way = half of each round trip; {} interleaved rounds of {:?} each after {WARMUP} warm-up round trips; {}, every application's kthread runs on a core it grants",
        cfg.rounds,
        cfg.duration,
        setup.describe()
    )];
    let (throughput_krps, bound, points, runs) = match &cfg.throughput {
        None => {
            notes.push("throughput_krps: not_measured (the sweep was not asked for)".into());
            (Throughput::default(), None, Vec::new(), Vec::new())
        }
        Some(t) => {
            let (points, runs) = sweep(&setup, t)?;
            let best = |mode| max_within_bound(&points, mode);
            let tput = Throughput {
                rtc: best(Mode::Rtc),
                protected: best(Mode::Protected),
                linux: best(Mode::Linux),
            };
            let bound_us = t.p99_bound.as_secs_f64() * 1e6;
            notes.push(format!(
                "throughput_krps: highest achieved rate of http-server among the load steps whose p99 (median of {} round(s) of {:?} after {:?} warm-up, {} connections) stayed within {bound_us} µs with nothing lost",
                t.rounds, t.duration, t.warmup, t.connections
            ));
            for mode in Mode::SWEPT {
                if best(mode).is_none() {
                    notes.push(format!(
                        "throughput_krps.{}: null, no load step stayed within the bound",
                        mode.name()
                    ));
                }
            }
            (tput, Some(bound_us), points, runs)
        }
    };
    Ok(OnewayReport {
        oneway_us: OnewaySet {
            rtc: med(|r| r.rtc)?,
            protected: med(|r| r.protected)?,
            linux: med(|r| r.linux)?,
            linux_busy_poll: med(|r| r.linux_busy_poll)?,
        },
        throughput_krps,
        throughput_p99_bound_us: bound,
        throughput_points: points,
        throughput_runs: runs,
        payload_bytes: PAYLOAD,
        paths: PATHS,
        rounds,
        notes,
        debug_build: cfg!(debug_assertions),
        loadavg_before,
        loadavg_after: crate::harness::figures::loadavg(),
    })
}

/// One way = half the round trip.
fn half(q: Quantiles) -> Quantiles {
    Quantiles {
        p50: q.p50 / 2.0,
        p99: q.p99 / 2.0,
    }
}

/// Whether `e` says a connection was refused (a server registered with
/// iokerneld before it listens).
fn refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// The Ginza client's round trips to `target` on `iokerneld`; retries a
/// refused connection (the server may still be setting up its listener)
/// for up to `IO_TIMEOUT`.
fn ginza_client(
    iokerneld: &InProcess,
    setup: &Setup,
    target: SocketAddrV4,
    duration: Duration,
) -> anyhow::Result<Vec<u64>> {
    let tune = |c: &mut RtConfig| setup.tune(c);
    let mut client = App::start_tuned(iokerneld, "oneway-client", CLIENT, tune, move || {
        retry_refused(IO_TIMEOUT, ginza_runtime::sleep, || {
            echo_client::rtt_for(target, WARMUP, duration, PAYLOAD, IO_TIMEOUT)
        })
    })?;
    client.join()?.context("the Ginza client's round trips")
}

fn tcp_only() -> Protocols {
    Protocols {
        udp: false,
        tcp: true,
    }
}

/// A server's main: serves until its stop flag is set.
type ServerMain = Box<dyn FnOnce(Arc<AtomicBool>) -> std::io::Result<()> + Send>;

/// A fresh iokerneld, a server on it in `mode` at `SERVER` running `main`,
/// and `measure` while it serves; everything stopped afterwards. A server
/// that failed explains a failed measurement, so its error comes first.
fn with_server<R>(
    mode: Mode,
    setup: &Setup,
    main: ServerMain,
    measure: impl FnOnce(&InProcess) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let iokerneld = setup.start_iokerneld()?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let result = match mode {
        Mode::Rtc => {
            let tune = |c: &mut RtConfig| setup.tune(c);
            App::start_tuned(&iokerneld, "server", SERVER, tune, move || main(s2)).and_then(
                |mut server| {
                    let measured = measure(&iokerneld);
                    stop.store(true, Ordering::Relaxed);
                    let served = server.join().and_then(|r| r.context("the server"));
                    first_error(measured, served)
                },
            )
        }
        Mode::Protected => protected_server(&iokerneld, setup, stop, main, measure),
        Mode::Linux => Err(anyhow!("the Linux peer runs without iokerneld")),
    };
    drop(iokerneld);
    result
}

fn first_error<R>(measured: anyhow::Result<R>, served: anyhow::Result<()>) -> anyhow::Result<R> {
    match (measured, served) {
        (Ok(m), Ok(())) => Ok(m),
        (Err(m), Err(s)) => Err(s.context(format!("(the measurement: {m:#})"))),
        (Err(e), Ok(())) | (Ok(_), Err(e)) => Err(e),
    }
}

/// The netstack daemon under `iokerneld` and the server run protected, as
/// `--protected` configures an application (`AppArgs::runtime_config`:
/// cores from iokerneld, no `net`, the stack in the netstack); `measure`
/// once the server listens.
fn protected_server<R>(
    iokerneld: &Iokerneld,
    setup: &Setup,
    stop: Arc<AtomicBool>,
    main: ServerMain,
    measure: impl FnOnce(&InProcess) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let mut ns_cfg = DaemonConfig::new(Interface {
        mac: NETSTACK.0,
        ip: NETSTACK.1,
    });
    ns_cfg.iokernel_socket = iokerneld.socket().to_path_buf();
    ns_cfg.attach_socket = iokerneld.dir().join("netstack.sock");
    ns_cfg.kthreads = 1;
    setup.tune_netstack(&mut ns_cfg);
    let netstack = Daemon::start(ns_cfg.clone()).context("the netstack daemon")?;
    let me = Interface {
        mac: SERVER.0,
        ip: SERVER.1,
    };
    let mut config = runtime_config(iokerneld, "server", Class::LatencyCritical);
    config.protected = Some(ProtectedConfig::new(
        ns_cfg.attach_socket.clone(),
        "server",
        me,
    ));
    setup.tune(&mut config);
    let s2 = stop.clone();
    let mut server = App::spawn("server", config, move || main(s2))?;
    // Its `listen` went through: the netstack answered it.
    let t0 = Instant::now();
    let listening = loop {
        if netstack.stats().events >= 1 {
            break Ok(());
        }
        if server.is_finished() || t0.elapsed() > IO_TIMEOUT {
            break Err(anyhow!(
                "the protected server did not listen within {IO_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let measured = listening.and_then(|()| measure(iokerneld));
    stop.store(true, Ordering::Relaxed);
    let served = server
        .join()
        .and_then(|r| r.context("the protected server"));
    drop(netstack);
    first_error(measured, served)
}

/// Round trips (µs) to echo-server in `mode`, and what iokerneld did for
/// them.
pub(super) fn echo_round(
    mode: Mode,
    setup: &Setup,
    duration: Duration,
) -> anyhow::Result<(Quantiles, Wakes, Option<Hops>)> {
    let main: ServerMain = Box::new(|stop| {
        echo_server::serve(ECHO_PORT, tcp_only(), stop, Arc::new(EchoStats::default()))
    });
    // Every party is a thread of this process: the hop stamps line up.
    let traced = mode == Mode::Protected;
    let (rtts, wakes, stamps) = with_server(mode, setup, main, |iokerneld| {
        let target = SocketAddrV4::new(SERVER.1, ECHO_PORT);
        // The figures come from round trips with stamping off: a stamp
        // costs each party a cache line shared with the others, which the
        // other systems' rounds do not pay. The hops come from a stamped
        // series after them, on the same server.
        let rtts = ginza_client(iokerneld, setup, target, duration)?;
        let stats = iokerneld.stats()?;
        let wakes = wakes(&stats, (rtts.len() + WARMUP) as u64);
        let stamps = if traced {
            hops::enable(true);
            let stamped = ginza_client(iokerneld, setup, target, duration / 4);
            hops::enable(false);
            stamped?;
            hops::take()
        } else {
            Vec::new()
        };
        Ok((rtts, wakes, stamps))
    })?;
    let hops = traced.then(|| hop_stretches(&stamps, hops::ticks_per_us(Duration::from_millis(5))));
    Ok((quantiles(rtts)?, wakes, hops))
}

/// The stretches between consecutive hops of the round trips stamped at
/// every hop (`per_us`: stamp units per µs).
fn hop_stretches(stamps: &[hops::Stamps], per_us: f64) -> Hops {
    let path = Hop::PROTECTED;
    let on_path: Vec<[u64; 9]> = stamps.iter().map(|s| path.map(|h| s[h as usize])).collect();
    let all_seen = |s: &&[u64; 9]| s.iter().all(|&t| t > 0);
    let in_order = |s: &&[u64; 9]| s.windows(2).all(|w| w[0] <= w[1]);
    let complete: Vec<&[u64; 9]> = on_path.iter().filter(all_seen).filter(in_order).collect();
    let out_of_order = on_path.iter().filter(all_seen).count() - complete.len();
    let seen = path
        .iter()
        .enumerate()
        .map(|(i, h)| (h.name(), on_path.iter().filter(|s| s[i] > 0).count()))
        .collect();
    let stretches = (1..path.len())
        .filter_map(|b| {
            let a = b - 1;
            let ns: Vec<u64> = complete
                .iter()
                .map(|s| ((s[b] - s[a]) as f64 * 1e3 / per_us) as u64)
                .collect();
            let q = quantiles(ns).ok()?;
            Some(Stretch {
                from: path[a].name(),
                to: path[b].name(),
                p50_us: q.p50,
                p99_us: q.p99,
            })
        })
        .collect();
    Hops {
        complete: complete.len(),
        round_trips: stamps.len(),
        seen,
        out_of_order,
        stretches,
    }
}

fn wakes(s: &ginza_proto::messages::StatsReport, round_trips: u64) -> Wakes {
    let per = |v: u64| v as f64 / round_trips.max(1) as f64;
    Wakes {
        round_trips,
        grants_per_round_trip: s
            .apps
            .iter()
            .map(|a| (a.name.clone(), per(a.grants)))
            .collect(),
        preemptions_per_round_trip: s
            .apps
            .iter()
            .map(|a| (a.name.clone(), per(a.preemptions)))
            .collect(),
        grant_cost_p50_us: s.alloc.grant_cost.p50_ns as f64 / 1e3,
        iokerneld_cpu_us_per_round_trip: per(s.loop_cpu_ns) / 1e3,
    }
}

/// Round trips (µs) between Linux sockets over loopback.
pub(super) fn linux_round(duration: Duration) -> anyhow::Result<Quantiles> {
    let server = linux::echo_server(
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        EchoMode::Blocking,
    )?;
    let report = linux::rtt_probe_for(
        server.addr(),
        WARMUP,
        duration,
        PAYLOAD,
        IO_TIMEOUT,
        ClientWait::Blocking,
    );
    server.stop()?;
    let report = report.context("the Linux client's round trips")?;
    anyhow::ensure!(!report.histogram.is_empty(), "no Linux round trip");
    Ok(Quantiles {
        p50: report.quantile_us(0.5),
        p99: report.quantile_us(0.99),
    })
}

/// Round trips (µs) between busy-polling Linux sockets over loopback: the
/// server spinning on `cpus.app`, the client spinning on `cpus.iokernel`.
fn linux_busy_poll_round(cpus: Cpus, duration: Duration) -> anyhow::Result<Quantiles> {
    let server = linux::echo_server(
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        EchoMode::BusyPoll {
            cpu: Some(cpus.app),
        },
    )?;
    let target = server.addr();
    let client = std::thread::Builder::new()
        .name("linux-busy-client".into())
        .spawn(move || -> anyhow::Result<_> {
            ginza_sys::affinity::pin_current_thread(cpus.iokernel)?;
            Ok(linux::rtt_probe_for(
                target,
                WARMUP,
                duration,
                PAYLOAD,
                IO_TIMEOUT,
                ClientWait::Spinning,
            )?)
        })?;
    let report = client
        .join()
        .map_err(|_| anyhow!("the busy-polling Linux client panicked"));
    server.stop()?;
    let report = report?.context("the busy-polling Linux client's round trips")?;
    anyhow::ensure!(!report.histogram.is_empty(), "no Linux round trip");
    Ok(Quantiles {
        p50: report.quantile_us(0.5),
        p99: report.quantile_us(0.99),
    })
}

/// The throughput sweep: loads ascending, at each both modes interleaved
/// for `t.rounds` rounds; a mode drops out after `STEPS_OVER_BOUND` steps
/// over the bound.
fn sweep(setup: &Setup, t: &ThroughputConfig) -> anyhow::Result<(Vec<TputPoint>, Vec<TputRun>)> {
    anyhow::ensure!(
        !t.loads_rps.is_empty() && t.loads_rps.iter().all(|&l| l > 0.0),
        "the throughput sweep needs at least one positive load"
    );
    anyhow::ensure!(t.rounds >= 1, "at least one throughput round is needed");
    anyhow::ensure!(!t.duration.is_zero(), "the step duration must be positive");
    let mut runs = Vec::new();
    let mut points = Vec::new();
    let mut climbing: Vec<(Mode, usize)> = Mode::SWEPT.iter().map(|&m| (m, 0)).collect();
    let mut loads = t.loads_rps.clone();
    let mut step = 0;
    while step < loads.len() && !climbing.is_empty() {
        let load = loads[step];
        let mut this: Vec<TputRun> = Vec::new();
        for round in 0..t.rounds {
            for &(mode, _) in &climbing {
                // Both modes get the same arrivals at a step.
                let seed = 1 + u64::from(round) * 1000 + step as u64;
                let r = http_run(mode, setup, t, load, seed).with_context(|| {
                    format!(
                        "throughput round {round}: {} at {load:.0} requests/s",
                        mode.name()
                    )
                })?;
                this.push(r);
            }
        }
        for (mode, over) in climbing.iter_mut() {
            let of: Vec<&TputRun> = this.iter().filter(|r| r.mode == *mode).collect();
            let p = point(*mode, load, &of, t.p99_bound);
            *over = if p.within_bound { 0 } else { *over + 1 };
            points.push(p);
        }
        climbing.retain(|&(_, over)| over < STEPS_OVER_BOUND);
        runs.append(&mut this);
        step += 1;
        if step == loads.len() {
            loads.extend(extra_load(t, &loads));
        }
    }
    Ok((points, runs))
}

/// The step after the last of `loads` when the sweep extends past
/// `t.loads_rps` (half as much again, at most `EXTRA_STEPS` times).
fn extra_load(t: &ThroughputConfig, loads: &[f64]) -> Option<f64> {
    let last = *loads.last()?;
    (t.extend && loads.len() < t.loads_rps.len() + EXTRA_STEPS).then_some(last * 1.5)
}

/// A step's medians over its rounds, and whether it counts.
fn point(mode: Mode, load: f64, of: &[&TputRun], bound: Duration) -> TputPoint {
    // Most rounds must have kept up for the step to count.
    let kept_up = of.iter().filter(|r| !r.generator_saturated).count() * 2 > of.len();
    let lat = |f: fn(&TputRun) -> Option<f64>| {
        median(&of.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
    };
    let p99_us = lat(|r| r.p99_us);
    let bound_us = bound.as_secs_f64() * 1e6;
    let failed = of.iter().any(|r| r.failed > 0);
    TputPoint {
        mode,
        offered_krps: load / 1e3,
        achieved_krps: median(&of.iter().map(|r| r.achieved_krps).collect::<Vec<_>>())
            .unwrap_or(0.0),
        p50_us: lat(|r| r.p50_us),
        p99_us,
        within_bound: kept_up && !failed && p99_us.is_some_and(|v| v <= bound_us),
        generator_kept_up: kept_up,
        rounds: of.len(),
    }
}

/// The highest achieved rate of `mode` among its steps within the bound.
fn max_within_bound(points: &[TputPoint], mode: Mode) -> Option<f64> {
    points
        .iter()
        .filter(|p| p.mode == mode && p.within_bound)
        .map(|p| p.achieved_krps)
        .max_by(f64::total_cmp)
}

/// `http-server` in `mode` offered `load` requests/s by loadgen's Ginza
/// backend through the same switch.
pub(super) fn http_run(
    mode: Mode,
    setup: &Setup,
    t: &ThroughputConfig,
    load: f64,
    seed: u64,
) -> anyhow::Result<TputRun> {
    let target = SocketAddrV4::new(SERVER.1, HTTP_PORT);
    let run = RunConfig {
        target: SocketAddr::V4(target),
        transport: Transport::Tcp,
        workload: Workload::Http(
            Http::new("/", &SERVER.1.to_string()).map_err(anyhow::Error::msg)?,
        ),
        arrivals: Arrivals::steady(Process::Poisson, load, t.warmup + t.duration),
        warmup: t.warmup,
        connections: t.connections,
        threads: 1,
        timeout: TPUT_TIMEOUT,
        // Latency counts from the scheduled send, so a late send is inside
        // both modes' figures alike; a generator whose p99 lag alone
        // exceeds the bound makes the step fail the bound anyway.
        max_lag: t.p99_bound,
        spin: Duration::ZERO,
        seed,
        cpus: Vec::new(),
        connect_timeout: Duration::from_secs(5),
    };
    if mode == Mode::Linux {
        let server = LinuxHttp::start()?;
        let run = RunConfig {
            target: server.addr,
            ..run
        };
        let report = ginza_loadgen::kernel::run(&run).context("loadgen's kernel backend");
        server.stop()?;
        return Ok(tput_run(mode, load, &report?, None));
    }
    let main: ServerMain =
        Box::new(|stop| http_server::serve(HTTP_PORT, stop, Arc::new(HttpStats::default())));
    let (report, iokerneld) = with_server(mode, setup, main, |iokerneld| {
        let generator = GinzaConfig {
            mac: CLIENT.0,
            ip: CLIENT.1,
            socket: Some(iokerneld.socket().to_path_buf()),
            name: "oneway-loadgen".into(),
        };
        // iokerneld's counts, the generator's included: sampled while it
        // runs, since it leaves iokerneld's table when it stops.
        let socket = iokerneld.socket().to_path_buf();
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let sampler = scope.spawn(|| {
                let mut last = None;
                while !done.load(Ordering::Relaxed) {
                    if let Ok(s) = ginza_proto::client::stats(&socket) {
                        if s.apps.iter().any(|a| a.name == generator.name) {
                            last = Some(s);
                        }
                    }
                    std::thread::sleep(STATS_SAMPLE);
                }
                last
            });
            // The server may register before it listens: a refused
            // connection is retried for a while.
            let t0 = Instant::now();
            let report = loop {
                match ginza_loadgen::ginza::run(&run, &generator) {
                    Err(e) if refused(&e) && t0.elapsed() < IO_TIMEOUT => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    other => break other.context("loadgen's Ginza backend"),
                }
            };
            done.store(true, Ordering::Relaxed);
            let sampled = sampler.join().ok().flatten();
            report.map(|r| {
                let counts = sampled.as_ref().map(|s| tput_iokerneld(s, &r));
                (r, counts)
            })
        })
    })?;
    Ok(tput_run(mode, load, &report, iokerneld))
}

/// The Linux peer of the sweep: `http_server::Session` (the protocol code
/// of `http-server`) on kernel sockets over loopback, a thread per
/// connection blocked in `read`.
struct LinuxHttp {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: std::thread::JoinHandle<()>,
}

impl LinuxHttp {
    fn start() -> anyhow::Result<LinuxHttp> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let acceptor = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let s3 = s2.clone();
                std::thread::spawn(move || {
                    let _ = linux_http_connection(stream, &s3);
                });
            }
        });
        Ok(LinuxHttp {
            addr,
            stop,
            acceptor,
        })
    }

    fn stop(self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the acceptor blocked in `accept`.
        let _ = std::net::TcpStream::connect(self.addr);
        self.acceptor
            .join()
            .map_err(|_| anyhow!("the Linux HTTP acceptor panicked"))
    }
}

fn linux_http_connection(stream: std::net::TcpStream, stop: &AtomicBool) -> std::io::Result<()> {
    use std::io::{Read as _, Write as _};
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(echo_server::STOP_POLL))?;
    let (mut session, mut buf, mut out) = (http_server::Session::new(), [0u8; 4096], Vec::new());
    while !stop.load(Ordering::Relaxed) && !session.is_closed() {
        let n = match (&stream).read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        session.set_date(std::time::SystemTime::now());
        let responses = session.feed(&buf[..n]);
        http_server::write_responses(&responses, &mut out, |b| (&stream).write_all(b))?;
        (&stream).write_all(&out)?;
        out.clear();
    }
    Ok(())
}

fn tput_run(mode: Mode, load: f64, r: &LoadReport, iokerneld: Option<TputIokerneld>) -> TputRun {
    // Kept when the generator fell behind: latency counts from the
    // scheduled send, so its lag is in the figure (and the step fails).
    let latency = |v: f64| (r.completed > 0).then_some(v);
    TputRun {
        mode,
        offered_krps: load / 1e3,
        achieved_krps: r.achieved_rps / 1e3,
        p50_us: latency(r.latency.p50_us),
        p99_us: latency(r.latency.p99_us),
        generator_saturated: r.generator_saturated,
        saturation_reason: r.saturation_reason.clone(),
        failed: r.timeouts + r.errors + r.error_answers + r.unmatched,
        p999_us: latency(r.latency.p999_us),
        max_us: latency(r.latency.max_us),
        send_lag_p99_us: r.send_lag.p99_us,
        send_lag_max_us: r.send_lag.max_us,
        iokerneld,
    }
}

/// iokerneld's counts in `s` per request answered in `r`.
fn tput_iokerneld(s: &ginza_proto::messages::StatsReport, r: &LoadReport) -> TputIokerneld {
    let per = |v: u64| v as f64 / r.completed.max(1) as f64;
    let by_app = |f: &dyn Fn(&ginza_proto::messages::AppStats) -> f64| {
        s.apps.iter().map(|a| (a.name.clone(), f(a))).collect()
    };
    TputIokerneld {
        grants_per_request: by_app(&|a| per(a.grants)),
        preemptions_per_request: by_app(&|a| per(a.preemptions)),
        preempt_overdue: s
            .apps
            .iter()
            .map(|a| (a.name.clone(), a.preempt_overdue))
            .collect(),
        frame_drops: s
            .apps
            .iter()
            .filter_map(|a| {
                let n = a.net.as_ref()?;
                Some((a.name.clone(), n.drop_ingress + n.drop_egress))
            })
            .collect(),
        loop_cpu_us_per_request: per(s.loop_cpu_ns) / 1e3,
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

fn render(r: &OnewayReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "one-way latency of {}-byte messages (half the round trip), median of {} interleaved rounds, µs:",
        r.payload_bytes,
        r.rounds.len()
    );
    for (name, q, path) in [
        ("rtc", r.oneway_us.rtc, r.paths.rtc),
        ("protected", r.oneway_us.protected, r.paths.protected),
        ("linux", r.oneway_us.linux, r.paths.linux),
        (
            "linux_busy_poll",
            r.oneway_us.linux_busy_poll,
            r.paths.linux_busy_poll,
        ),
    ] {
        let _ = writeln!(
            s,
            "  {name:<15} p50 {:>8.2}  p99 {:>8.2}   ({path})",
            q.p50, q.p99
        );
    }
    let _ = writeln!(
        s,
        "protected round trip hop by hop, p50 µs per round (rounds[].protected_hops):"
    );
    for (i, h) in r
        .rounds
        .iter()
        .filter_map(|r| r.protected_hops.as_ref())
        .enumerate()
    {
        let parts: Vec<String> = h
            .stretches
            .iter()
            .map(|x| format!("{}->{} {:.1}", x.from, x.to, x.p50_us))
            .collect();
        let _ = writeln!(s, "  round {}: {}", i + 1, parts.join(", "));
    }
    match r.throughput_p99_bound_us {
        None => {
            let _ = writeln!(s, "throughput_krps: not measured");
        }
        Some(bound) => {
            let _ = writeln!(s, "http-server throughput sweep ({}):", r.paths.throughput);
            let _ = writeln!(
                s,
                "  mode       offered  achieved   p50 µs   p99 µs  within"
            );
            for p in &r.throughput_points {
                let _ = writeln!(
                    s,
                    "  {:<9} {:>8.1} {:>9.1} {:>8} {:>8}  {}{}",
                    p.mode.name(),
                    p.offered_krps,
                    p.achieved_krps,
                    opt(p.p50_us),
                    opt(p.p99_us),
                    p.within_bound,
                    if p.generator_kept_up {
                        ""
                    } else {
                        "  (generator fell behind)"
                    }
                );
            }
            let _ = writeln!(
                s,
                "throughput_krps at p99 ≤ {bound} µs: rtc {}  protected {}  linux {}",
                opt(r.throughput_krps.rtc),
                opt(r.throughput_krps.protected),
                opt(r.throughput_krps.linux)
            );
        }
    }
    let _ = writeln!(
        s,
        "load average before {} after {}{}",
        r.loadavg_before.as_deref().unwrap_or("?"),
        r.loadavg_after.as_deref().unwrap_or("?"),
        if r.debug_build { " (DEBUG build)" } else { "" }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extended_sweep_goes_on_by_half_for_at_most_twelve_steps() {
        let mut t = ThroughputConfig {
            loads_rps: vec![1e3, 2e3],
            ..ThroughputConfig::default()
        };
        assert_eq!(extra_load(&t, &t.loads_rps), None, "off by default");
        t.extend = true;
        let mut loads = t.loads_rps.clone();
        while let Some(next) = extra_load(&t, &loads) {
            loads.push(next);
        }
        assert_eq!(loads.len(), 2 + EXTRA_STEPS);
        assert_eq!(loads[2], 3e3);
        assert!(loads.windows(2).all(|w| w[1] > w[0]));
    }

    fn run(mode: Mode, p99: Option<f64>, achieved: f64, saturated: bool, failed: u64) -> TputRun {
        TputRun {
            mode,
            offered_krps: 10.0,
            achieved_krps: achieved,
            p50_us: p99.map(|v| v / 2.0),
            p99_us: p99,
            generator_saturated: saturated,
            saturation_reason: None,
            failed,
            p999_us: p99,
            max_us: p99,
            send_lag_p99_us: 0.0,
            send_lag_max_us: 0.0,
            iokerneld: None,
        }
    }

    #[test]
    fn hop_stretches_use_only_round_trips_stamped_everywhere_in_order() {
        let mut full: hops::Stamps = [0; hops::HOPS];
        for (i, h) in Hop::PROTECTED.into_iter().enumerate() {
            full[h as usize] = 10 * (i as u64 + 1);
        }
        let mut missing = full;
        missing[Hop::AppEventIn as usize] = 0;
        let mut backwards = full;
        backwards[Hop::AppSendOut as usize] = 35;
        // 10 units per µs: each stretch of `full` is 1 µs.
        let h = hop_stretches(&[full, missing, backwards, full], 10.0);
        assert_eq!((h.round_trips, h.complete, h.out_of_order), (4, 2, 1));
        assert_eq!(h.stretches.len(), Hop::PROTECTED.len() - 1);
        assert_eq!(h.stretches[0].from, "client_send");
        assert_eq!(h.stretches[7].to, "client_recv");
        assert!(h.stretches.iter().all(|x| (x.p50_us - 1.0).abs() < 1e-9));
        assert_eq!(h.seen[3], ("app_event_in", 3));
    }

    #[test]
    fn a_step_counts_only_within_the_bound_kept_up_and_lossless() {
        let bound = Duration::from_micros(500);
        let ok = run(Mode::Rtc, Some(400.0), 10.0, false, 0);
        assert!(point(Mode::Rtc, 10e3, &[&ok], bound).within_bound);
        let slow = run(Mode::Rtc, Some(600.0), 10.0, false, 0);
        assert!(!point(Mode::Rtc, 10e3, &[&slow], bound).within_bound);
        let lost = run(Mode::Rtc, Some(100.0), 10.0, false, 3);
        assert!(!point(Mode::Rtc, 10e3, &[&lost], bound).within_bound);
        let sat = run(Mode::Rtc, Some(300.0), 10.0, true, 0);
        let p = point(Mode::Rtc, 10e3, &[&sat, &sat, &ok], bound);
        assert!(!p.within_bound && !p.generator_kept_up);
        assert_eq!(p.p99_us, Some(300.0), "the latency is still reported");
        // Medians over rounds.
        let a = run(Mode::Rtc, Some(100.0), 9.0, false, 0);
        let b = run(Mode::Rtc, Some(900.0), 10.0, false, 0);
        let p = point(Mode::Rtc, 10e3, &[&a, &b, &ok], bound);
        assert_eq!(p.p99_us, Some(400.0));
        assert_eq!(p.achieved_krps, 10.0);
        assert!(p.within_bound);
    }

    #[test]
    fn the_figure_is_the_best_step_within_the_bound_per_mode() {
        let bound = Duration::from_micros(500);
        let points = vec![
            point(
                Mode::Rtc,
                5e3,
                &[&run(Mode::Rtc, Some(100.0), 5.0, false, 0)],
                bound,
            ),
            point(
                Mode::Protected,
                5e3,
                &[&run(Mode::Protected, Some(200.0), 4.9, false, 0)],
                bound,
            ),
            point(
                Mode::Rtc,
                10e3,
                &[&run(Mode::Rtc, Some(300.0), 9.8, false, 0)],
                bound,
            ),
            point(
                Mode::Protected,
                10e3,
                &[&run(Mode::Protected, Some(800.0), 9.0, false, 0)],
                bound,
            ),
        ];
        assert_eq!(max_within_bound(&points, Mode::Rtc), Some(9.8));
        assert_eq!(max_within_bound(&points, Mode::Protected), Some(4.9));
        assert_eq!(max_within_bound(&points[..0], Mode::Rtc), None);
    }
}
