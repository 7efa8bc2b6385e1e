//! `ginza bench colocate`: Shinjuku and Shenango in one system
//! (docs/colocate.md). Bimodal(99.5-0.5, 0.5-500) UDP requests from
//! iokerneld's generator to a Shinjuku-mode spin server (dispatch on
//! iokerneld's core) beside the `batch` application, sweeping load. In one
//! run, point by point (the three configurations of a load one after the
//! other):
//!
//! * `c-fcfs` / `shenango`: run to completion, cores moved by the 5 µs
//!   allocator;
//! * `c-pre-sq` / `shenango`: preemptive at `--quantum-us`, same allocator;
//! * `c-pre-sq` / `static`: preemptive on cores the server keeps (spinning).
//!
//! Per point: p50/p99 of the generator's round trip, batch's throughput
//! (M paths/s) over the load window, the server's mean cores (sampled from
//! iokerneld's stats every millisecond), and the simulator's p99 for the
//! same system (`ginza_sim::colocate`; its grant latency and preemption
//! cost are assumptions, named in the JSON). CSV and PNG in `--out`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_apps::spin_server::{answer_preemptible, SpinStats};
use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::{Config as IokConfig, LoadRun, PolicyKind, GENERATOR_IP, GENERATOR_MAC};
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_proto::client;
use ginza_proto::messages::{DispatchSpec, DispatchStats, SojournBand};
use ginza_runtime::net::NetConfig;
use ginza_runtime::shinjuku::dispatched::{self, DispatchedConfig};
use ginza_runtime::{Class, IokernelConfig};
use ginza_sim::colocate::{ColocateAlloc, ColocateSim};
use ginza_sim::dist::Service;
use ginza_sim::plot::{line_chart, write_csv, Chart, Series};
use ginza_sys::sched_stat::{threads_named, SchedStat};
use serde::Serialize;

use crate::harness::app::{app_config, App};
use crate::harness::figures::{allowed_cpus, emit};
use crate::harness::iokerneld::{socket_dir, Iokerneld};

/// Arguments of `ginza bench colocate`.
#[derive(clap::Args, Debug)]
pub struct ColocateArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Offered loads, as fractions of the managed cores' capacity.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.3,0.5,0.7,0.9")]
    loads: Vec<f64>,
    /// How long each point's load lasts.
    #[arg(long, default_value = "1s", value_parser = ginza_proto::parse_duration)]
    duration: Duration,
    /// c-PRE-SQ's quantum, µs.
    #[arg(long, default_value_t = 5.0)]
    quantum_us: f64,
    /// How long an idle worker of the server spins for its next request
    /// before it parks and gives its core back (default:
    /// `DispatchedConfig::idle_spin_for`: 5 µs; it was 50 µs for more than
    /// one worker before docs/results.md's idle-spin measurements).
    #[arg(long, value_parser = ginza_proto::parse_duration)]
    idle_spin: Option<Duration>,
    /// iokerneld's CPU (default: the first allowed CPU).
    #[arg(long)]
    iokernel_core: Option<usize>,
    /// How many CPUs iokerneld manages, the first allowed ones beside its
    /// own, e.g. 4 (default: every allowed CPU but iokerneld's).
    #[arg(long, value_name = "COUNT")]
    cores: Option<usize>,
    /// The server's worker kthreads (default: one per managed core). More
    /// workers than cores shows the dispatch of several workers on a
    /// machine with few CPUs (docs/colocate.md, "Several workers").
    #[arg(long)]
    workers: Option<usize>,
    /// iokerneld pre-assigns the server's next request to a busy worker
    /// (`true`/`false`; default: `DispatchSpec::PRE_ASSIGN_DEFAULT`;
    /// docs/colocate.md, "Pre-assignment").
    #[arg(long)]
    pre_assign: Option<bool>,
    /// Simulated time per point of the simulator's prediction, ms.
    #[arg(long, default_value_t = 1000.0)]
    sim_ms: f64,
    /// Where the CSV and PNG go.
    #[arg(long, default_value = "bench-results/colocate")]
    out: PathBuf,
}

const WORKLOAD: &str = "Bimodal(99.5-0.5, 0.5-500)";
const PORT: u16 = 7;
/// The dispatched server's backstop (docs/colocate.md): as the standalone
/// Shinjuku mode's default.
const BACKSTOP_NS: u64 = 50_000;
/// The simulator's assumptions (not measured here).
const SIM_GRANT_LATENCY_US: f64 = 5.0;
const SIM_PREEMPT_COST_US: f64 = 0.2;
const SIM_PARK_SPIN_US: f64 = 5.0;

/// The server's request scheduling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sched {
    CFcfs,
    CPreSq,
}

/// iokerneld's core allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Alloc {
    Shenango,
    Static,
}

/// One point's figures (`measure_point`; the simulator's are NaN there).
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub sched: Sched,
    pub alloc: Alloc,
    pub load: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub batch_mpaths_per_s: f64,
    pub lc_cores: f64,
    pub sim_p99_us: f64,
    pub sim_lc_cores: f64,
    pub sent: u64,
    pub replies: u64,
    /// The server's own counts: requests run to completion, preemptions
    /// (quantum or revocation), new requests refused (too many in flight).
    pub served: u64,
    pub preempted: u64,
    pub rejected: u64,
    /// Requests iokerneld dropped for want of an ingress buffer or ring room.
    pub dropped_ingress: u64,
    /// iokerneld's dispatch counters of the server over the point
    /// (`AppStats::dispatch`, docs/colocate.md).
    pub dispatch: Option<DispatchStats>,
    /// `Parked`/`Yielded` iokerneld ignored as answering a grant already
    /// answered, server and batch together (`StatsReport::stale_parks`).
    pub stale_parks: u64,
    /// Where the requests' time in iokerneld went (packet held → completed
    /// hand-back): all of them, and the tail (those in the sojourn bands
    /// from the one holding iokerneld's p99 up; `tail_from_us` is that
    /// band's lower end).
    pub all: Option<Breakdown>,
    pub tail: Option<Breakdown>,
    pub tail_from_us: f64,
    /// What Linux kept from the threads that spin during the load.
    pub cpu_waited: Option<CpuWaited>,
}

/// Time iokerneld's thread and the server's workers were runnable but
/// waited for their CPU during the load, and how often Linux took the CPU
/// from them (`/proc` schedstat). Every request queued behind such a wait
/// waits as long: when it is milliseconds, the tail is the machine's CPU
/// sharing, not the dispatch (docs/colocate.md, "What the tail is made of").
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CpuWaited {
    pub iokerneld_ms: f64,
    pub iokerneld_preemptions: u64,
    pub workers_ms: f64,
    pub workers_preemptions: u64,
}

/// How often the server's cores are sampled during the load: each sample
/// is a stats request iokerneld answers on its loop, from a thread that
/// takes a spinning thread's CPU while it runs (every millisecond, it made
/// a thousand such interruptions a second).
const CORES_SAMPLED_EVERY: Duration = Duration::from_millis(10);

/// The counters of the threads that spin during the load, by thread id:
/// iokerneld's loop and the server's workers.
struct Spinning {
    iokerneld: Vec<(i32, SchedStat)>,
    workers: Vec<(i32, SchedStat)>,
}

impl Spinning {
    /// Their counters now; `None` when `/proc` cannot tell or either has
    /// no thread (then nothing is reported rather than a wait of zero).
    fn now() -> Option<Spinning> {
        let named = |name: &str| threads_named(name).ok().filter(|t| !t.is_empty());
        Some(Spinning {
            iokerneld: named("iokerneld")?,
            workers: named("ginza-dw")?,
        })
    }
}

impl CpuWaited {
    /// What the threads of `before` waited until `after` (threads in both):
    /// ns runnable but waiting, and times preempted.
    fn between(before: &Spinning, after: &Spinning) -> Self {
        let sum = |b: &[(i32, SchedStat)], a: &[(i32, SchedStat)]| {
            a.iter()
                .filter_map(|(tid, now)| {
                    let then = b.iter().find(|(t, _)| t == tid)?;
                    Some(now.since(&then.1))
                })
                .fold((0u64, 0u64), |(ns, n), d| {
                    (ns + d.runnable_waiting_ns, n + d.involuntary_switches)
                })
        };
        let (io_ns, io_n) = sum(&before.iokerneld, &after.iokerneld);
        let (wk_ns, wk_n) = sum(&before.workers, &after.workers);
        CpuWaited {
            iokerneld_ms: io_ns as f64 / 1e6,
            iokerneld_preemptions: io_n,
            workers_ms: wk_ns as f64 / 1e6,
            workers_preemptions: wk_n,
        }
    }
}

/// Mean time of a set of completed requests, by where it went (µs), and
/// their mean runs (1 + preemptions + `Run`s taken back); from iokerneld's
/// sojourn bands (`client::dispatch_breakdown`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Breakdown {
    pub count: u64,
    /// In iokerneld: held packet → completed hand-back.
    pub sojourn_us: f64,
    /// In a queue (new or preempted).
    pub queued_us: f64,
    /// Of that, while none of the server's workers held a core.
    pub queued_no_core_us: f64,
    /// `Run` sent → the worker seen running it.
    pub pickup_us: f64,
    /// Seen running → handed back (service, preempted time on a core the
    /// worker lost to Linux, the hand-back's trip).
    pub on_core_us: f64,
    pub runs: f64,
}

impl Breakdown {
    fn of<'a>(bands: impl Iterator<Item = &'a SojournBand>) -> Option<Breakdown> {
        let mut sum = SojournBand::default();
        for b in bands {
            sum.count += b.count;
            sum.sojourn_ns += b.sojourn_ns;
            sum.queued_ns += b.queued_ns;
            sum.no_core_ns += b.no_core_ns;
            sum.pickup_ns += b.pickup_ns;
            sum.on_core_ns += b.on_core_ns;
            sum.runs += b.runs;
        }
        let n = sum.count as f64;
        let us = |ns: u64| ns as f64 / n / 1e3;
        (sum.count > 0).then(|| Breakdown {
            count: sum.count,
            sojourn_us: us(sum.sojourn_ns),
            queued_us: us(sum.queued_ns),
            queued_no_core_us: us(sum.no_core_ns),
            pickup_us: us(sum.pickup_ns),
            on_core_us: us(sum.on_core_ns),
            runs: sum.runs as f64 / n,
        })
    }

    /// All of `bands`, and the tail: the bands from the one that holds the
    /// 99th percentile up (with that band's lower end, µs).
    fn split(bands: &[SojournBand]) -> (Option<Breakdown>, Option<Breakdown>, f64) {
        let total: u64 = bands.iter().map(|b| b.count).sum();
        let mut seen = 0;
        let from = bands
            .iter()
            .position(|b| {
                seen += b.count;
                seen as f64 >= 0.99 * total as f64
            })
            .unwrap_or(0);
        (
            Self::of(bands.iter()),
            Self::of(bands[from.min(bands.len())..].iter()),
            bands.get(from).map_or(f64::NAN, |b| b.from_ns as f64 / 1e3),
        )
    }
}

#[derive(Debug, Serialize)]
struct Report {
    points: Vec<Point>,
    workload: &'static str,
    quantum_us: f64,
    /// The server's idle spin before parking, µs.
    idle_spin_us: f64,
    managed_cores: usize,
    /// The server's worker kthreads.
    workers: usize,
    /// Whether iokerneld pre-assigned the server's requests (c-PRE-SQ).
    pre_assign: bool,
    iokernel_cpu: usize,
    duration_s: f64,
    sim_grant_latency_us: f64,
    sim_preempt_cost_us: f64,
}

/// Runs the benchmark.
pub fn run(args: ColocateArgs) -> anyhow::Result<()> {
    let allowed = allowed_cpus()?;
    let io_cpu = args.iokernel_core.unwrap_or(allowed[0]);
    let mut managed: Vec<usize> = allowed.iter().copied().filter(|&c| c != io_cpu).collect();
    if let Some(n) = args.cores {
        managed.truncate(n);
    }
    anyhow::ensure!(
        !managed.is_empty(),
        "no CPU left to manage beside iokerneld's"
    );
    anyhow::ensure!(
        args.loads.iter().all(|&l| l > 0.0 && l < 1.5),
        "loads are fractions of capacity (0 < load < 1.5)"
    );
    let service = Service::parse(WORKLOAD)?;
    let n = managed.len();
    let workers = args.workers.unwrap_or(n);
    anyhow::ensure!(workers > 0, "the server needs a worker");
    eprintln!(
        "colocate: iokerneld on CPU {io_cpu}, managed cores {managed:?}, {WORKLOAD}, {:?} per point",
        args.duration
    );
    let configs = [
        (Sched::CFcfs, Alloc::Shenango),
        (Sched::CPreSq, Alloc::Shenango),
        (Sched::CPreSq, Alloc::Static),
    ];
    // Through the experiments' sweep loop (docs/experiments.md).
    let plan: Vec<(f64, Sched, Alloc)> = args
        .loads
        .iter()
        .flat_map(|&load| configs.map(|(sched, alloc)| (load, sched, alloc)))
        .collect();
    let points = crate::harness::sweep::sweep(
        &plan,
        |&(load, sched, alloc)| format!("{sched:?} / {alloc:?} at load {load}"),
        |_, &(load, sched, alloc)| {
            eprintln!("colocate: {sched:?} / {alloc:?} at load {load}");
            let rate = load * n as f64 / service.mean() * 1e6;
            let measured = measure(&args, io_cpu, &managed, sched, alloc, rate)?;
            let sim = ColocateSim {
                cores: n,
                workers,
                guaranteed: if alloc == Alloc::Static { n } else { 0 },
                alloc: match alloc {
                    Alloc::Shenango => ColocateAlloc::Shenango { interval_us: 5.0 },
                    Alloc::Static => ColocateAlloc::Static,
                },
                quantum_us: (sched == Sched::CPreSq).then_some(args.quantum_us),
                service: service.clone(),
                rate_per_us: rate / 1e6,
                park_spin_us: SIM_PARK_SPIN_US,
                grant_latency_us: SIM_GRANT_LATENCY_US,
                preempt_cost_us: SIM_PREEMPT_COST_US,
                duration_us: args.sim_ms * 1e3,
                warmup_us: args.sim_ms * 50.0,
                seed: 11,
            }
            .run();
            Ok(Point {
                sim_p99_us: sim.stats.latency_pct_us(99.0),
                sim_lc_cores: sim.lc_cores,
                ..measured
            }
            .at(load, sched, alloc))
        },
    )?;
    let report = Report {
        points,
        workload: WORKLOAD,
        quantum_us: args.quantum_us,
        idle_spin_us: args
            .idle_spin
            .unwrap_or_else(|| DispatchedConfig::idle_spin_for(workers))
            .as_secs_f64()
            * 1e6,
        managed_cores: n,
        workers,
        pre_assign: args.pre_assign.unwrap_or(DispatchSpec::PRE_ASSIGN_DEFAULT),
        iokernel_cpu: io_cpu,
        duration_s: args.duration.as_secs_f64(),
        sim_grant_latency_us: SIM_GRANT_LATENCY_US,
        sim_preempt_cost_us: SIM_PREEMPT_COST_US,
    };
    write_files(&args.out, &report)?;
    emit(args.json, &render(&report), &report)
}

impl Point {
    fn at(mut self, load: f64, sched: Sched, alloc: Alloc) -> Point {
        self.load = load;
        self.sched = sched;
        self.alloc = alloc;
        self
    }
}

/// One measured point of the benchmark's workload.
fn measure(
    args: &ColocateArgs,
    io_cpu: usize,
    managed: &[usize],
    sched: Sched,
    alloc: Alloc,
    rate_per_s: f64,
) -> anyhow::Result<Point> {
    let service = ServiceTime::Bimodal {
        p: 0.995,
        a_ns: 500,
        b_ns: 500_000,
    };
    let run = PointRun {
        io_cpu,
        managed,
        sched,
        alloc,
        quantum_us: args.quantum_us,
        service,
        rate_per_s,
        duration: args.duration,
        idle_spin: args.idle_spin,
        workers: args.workers,
        pre_assign: args.pre_assign,
    };
    measure_point(&run)
}

/// What one measured point runs (`measure_point`).
#[derive(Clone, Debug)]
pub struct PointRun<'a> {
    /// iokerneld's CPU and the cores it manages.
    pub io_cpu: usize,
    pub managed: &'a [usize],
    pub sched: Sched,
    pub alloc: Alloc,
    /// c-PRE-SQ's quantum, µs.
    pub quantum_us: f64,
    /// The service times the generator's requests carry.
    pub service: ServiceTime,
    /// Requests/s offered (Poisson).
    pub rate_per_s: f64,
    /// How long the load lasts.
    pub duration: Duration,
    /// The server's idle spin before parking (`None`: its default).
    pub idle_spin: Option<Duration>,
    /// The server's worker kthreads (`None`: one per managed core).
    pub workers: Option<usize>,
    /// Pre-assignment (`None`: iokerneld's default).
    pub pre_assign: Option<bool>,
}

/// One measured point: a fresh iokerneld, batch, and the server (the
/// simulator's figures left NaN, `load` 0).
pub fn measure_point(run: &PointRun) -> anyhow::Result<Point> {
    let PointRun {
        io_cpu,
        managed,
        sched,
        alloc,
        quantum_us,
        rate_per_s,
        duration,
        ..
    } = *run;
    let n = managed.len();
    let dir = socket_dir("colocate");
    let mut cfg = IokConfig::new(managed.to_vec());
    cfg.own_core = Some(io_cpu);
    cfg.policy = match alloc {
        Alloc::Shenango => PolicyKind::Shenango,
        Alloc::Static => PolicyKind::Static,
    };
    cfg.socket = dir.join("iokerneld.sock");
    cfg.validate(&allowed_cpus()?)
        .context("iokerneld configuration")?;
    let daemon = Iokerneld::start(cfg)
        .context("starting iokerneld")?
        .removing(dir);
    let socket = daemon.socket().to_path_buf();

    let stop = Arc::new(AtomicBool::new(false));
    let paths = Arc::new(AtomicU64::new(0));
    let me = Interface {
        mac: MacAddr([0x02, 0x47, 0x5a, 0x00, 0x16, 0x01]),
        ip: Ipv4Addr::new(10, 47, 16, 1),
    };
    let server = {
        let mut io = IokernelConfig::new("spin-shinjuku", Class::LatencyCritical);
        io.socket = Some(socket.clone());
        io.net = Some(NetConfig::new(me.mac, me.ip).with_static_arp(GENERATOR_IP, GENERATOR_MAC));
        if alloc == Alloc::Static {
            io.guaranteed = n.min(run.workers.unwrap_or(n)) as u32;
            io.keep_cores_when_idle = true;
        }
        let spec = DispatchSpec {
            policy: match sched {
                Sched::CFcfs => "c-fcfs",
                Sched::CPreSq => "c-pre-sq",
            }
            .into(),
            quantum_ns: (quantum_us * 1e3).round() as u64,
            head: false,
            classes: Vec::new(),
            class_offset: 0,
            backstop_ns: Some(BACKSTOP_NS),
            pre_assign: run.pre_assign,
        };
        let mut cfg = DispatchedConfig::new(io, spec, PORT).with_workers(run.workers.unwrap_or(n));
        if let Some(spin) = run.idle_spin {
            cfg.idle_spin = spin;
        }
        let stop = Arc::clone(&stop);
        let stats = Arc::new(SpinStats::default());
        std::thread::spawn(move || {
            dispatched::serve(cfg, move |r| answer_preemptible(r, &stats), &stop)
        })
    };
    // The server registers first: on static cores its guaranteed core is
    // granted before batch can take it. Then batch, then a short settling
    // time.
    let registered = |n: usize| -> anyhow::Result<()> {
        let t0 = Instant::now();
        while client::stats(&socket)?.apps.len() < n {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(10),
                "the applications did not register"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    };
    registered(1)?;
    let mut batch = {
        let config = app_config(&socket, "batch", Class::Batch, n);
        let (paths, stop) = (Arc::clone(&paths), Arc::clone(&stop));
        App::spawn("batch", config, move || {
            ginza_apps::batch::price_until_stopped(n, paths, stop, 5)
        })?
    };
    registered(2)?;
    let t0 = Instant::now();
    loop {
        let s = client::stats(&socket)?;
        if s.apps.len() == 2 {
            break;
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "the applications did not register"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));

    // The server's cores, sampled while the load runs.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (sampling, socket) = (Arc::clone(&sampling), socket.clone());
        std::thread::spawn(move || {
            let (mut sum, mut count) = (0u64, 0u64);
            while sampling.load(Ordering::Acquire) {
                if let Ok(s) = client::stats(&socket) {
                    if let Some(a) = s.apps.iter().find(|a| a.name == "spin-shinjuku") {
                        sum += u64::from(a.cores_now);
                        count += 1;
                    }
                }
                std::thread::sleep(CORES_SAMPLED_EVERY);
            }
            sum as f64 / count.max(1) as f64
        })
    };
    let load = LoadRun::poisson(me, PORT, rate_per_s, run.service, duration);
    let paths0 = paths.load(Ordering::Relaxed);
    let threads_before = Spinning::now();
    let started = Instant::now();
    let result = daemon.generator().run(load, Duration::from_secs(30));
    let window = started.elapsed().as_secs_f64();
    let paths1 = paths.load(Ordering::Relaxed);
    let cpu_waited = threads_before
        .zip(Spinning::now())
        .map(|(before, after)| CpuWaited::between(&before, &after));
    sampling.store(false, Ordering::Release);
    let lc_cores = sampler.join().unwrap_or(f64::NAN);
    let report_now = client::stats(&socket).ok();
    let stale_parks = report_now.as_ref().map_or(0, |s| s.stale_parks);
    let server_stats =
        report_now.and_then(|s| s.apps.into_iter().find(|a| a.name == "spin-shinjuku"));
    let dropped_ingress = server_stats
        .as_ref()
        .and_then(|a| a.net)
        .map_or(0, |n| n.drop_ingress);
    let dispatch = server_stats.and_then(|a| a.dispatch);
    let (all, tail, tail_from_us) = client::dispatch_breakdown(&socket, "spin-shinjuku")
        .map_or((None, None, f64::NAN), |b| Breakdown::split(&b));
    stop.store(true, Ordering::Release);
    let served = server.join();
    let batched = batch.join();
    drop(daemon);
    let report = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    let served = served
        .map_err(|_| anyhow::anyhow!("the server panicked"))?
        .context("the server")?;
    batched.context("batch")?;
    let q = |p: f64| report.latency.value_at_quantile(p) as f64 / 1e3;
    Ok(Point {
        sched,
        alloc,
        load: 0.0,
        p50_us: q(0.5),
        p99_us: q(0.99),
        batch_mpaths_per_s: (paths1 - paths0) as f64 / window / 1e6,
        lc_cores,
        sim_p99_us: f64::NAN,
        sim_lc_cores: f64::NAN,
        sent: report.stats.sent,
        replies: report.stats.replies,
        served: served.served,
        preempted: served.preempted,
        rejected: served.rejected,
        dropped_ingress,
        dispatch,
        stale_parks,
        all,
        tail,
        tail_from_us,
        cpu_waited,
    })
}

fn label(sched: Sched, alloc: Alloc) -> &'static str {
    match (sched, alloc) {
        (Sched::CFcfs, Alloc::Shenango) => "c-FCFS, Shenango allocator",
        (Sched::CPreSq, Alloc::Shenango) => "c-PRE-SQ, Shenango allocator",
        (Sched::CFcfs, Alloc::Static) => "c-FCFS, static cores",
        (Sched::CPreSq, Alloc::Static) => "c-PRE-SQ, static cores",
    }
}

fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "colocate: {} on {} managed core(s), quantum {} us; p50/p99 measured (us), batch M paths/s, server's mean cores, simulator's p99; ms iokerneld / the workers waited for their CPU (times Linux took it)",
        r.workload, r.managed_cores, r.quantum_us
    );
    let _ = writeln!(
        s,
        "{:<30} {:>5} {:>9} {:>9} {:>8} {:>7} {:>9} {:>21} {:>9}  server: served/preempted/rejected, iokerneld drops",
        "config", "load", "p50", "p99", "batch", "cores", "sim p99", "CPU waited", "replies"
    );
    for p in &r.points {
        let waited = p.cpu_waited.map_or("-".into(), |w| {
            format!(
                "{:.1} ({}) / {:.1} ({})",
                w.iokerneld_ms, w.iokerneld_preemptions, w.workers_ms, w.workers_preemptions
            )
        });
        let _ = writeln!(
            s,
            "{:<30} {:>5.2} {:>9.1} {:>9.1} {:>8.2} {:>7.2} {:>9.1} {:>21} {:>4}/{}  {}/{}/{}, {}",
            label(p.sched, p.alloc),
            p.load,
            p.p50_us,
            p.p99_us,
            p.batch_mpaths_per_s,
            p.lc_cores,
            p.sim_p99_us,
            waited,
            p.replies,
            p.sent,
            p.served,
            p.preempted,
            p.rejected,
            p.dropped_ingress
        );
    }
    let _ = writeln!(
        s,
        "\nwhere the time in iokerneld went, mean us per request (all / tail: the sojourn bands from iokerneld's p99 up):\n{:<30} {:>5} {:>6} {:>8} {:>17} {:>17} {:>17} {:>15} {:>15} {:>11}  dispatch: runs/asked/backstops/taken back/parked with work queued/pre-assigned",
        "config", "load", "tail>=", "count", "sojourn", "queued", "no core", "pickup", "on core", "runs"
    );
    for p in &r.points {
        let (Some(a), Some(t)) = (p.all, p.tail) else {
            continue;
        };
        let pair = |x: f64, y: f64| format!("{x:.1}/{y:.1}");
        let d = p.dispatch.unwrap_or_default();
        let _ = writeln!(
            s,
            "{:<30} {:>5.2} {:>6.0} {:>8} {:>17} {:>17} {:>17} {:>15} {:>15} {:>11}  {}/{}/{}/{}/{}/{}",
            label(p.sched, p.alloc),
            p.load,
            p.tail_from_us,
            format!("{}/{}", a.count, t.count),
            pair(a.sojourn_us, t.sojourn_us),
            pair(a.queued_us, t.queued_us),
            pair(a.queued_no_core_us, t.queued_no_core_us),
            pair(a.pickup_us, t.pickup_us),
            pair(a.on_core_us, t.on_core_us),
            format!("{:.2}/{:.2}", a.runs, t.runs),
            d.ru,
            d.ak,
            d.bs,
            d.tb,
            d.pq,
            d.pa,
        );
    }
    s
}

fn write_files(out: &std::path::Path, r: &Report) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let rows: Vec<Vec<String>> = r
        .points
        .iter()
        .map(|p| {
            vec![
                format!("{:?}", p.sched),
                format!("{:?}", p.alloc),
                p.load.to_string(),
                format!("{:.2}", p.p50_us),
                format!("{:.2}", p.p99_us),
                format!("{:.3}", p.batch_mpaths_per_s),
                format!("{:.3}", p.lc_cores),
                format!("{:.2}", p.sim_p99_us),
                p.sent.to_string(),
                p.replies.to_string(),
            ]
        })
        .collect();
    write_csv(
        &out.join("colocate.csv"),
        &[
            "sched",
            "alloc",
            "load",
            "p50_us",
            "p99_us",
            "batch_mpaths_per_s",
            "lc_cores",
            "sim_p99_us",
            "sent",
            "replies",
        ],
        &rows,
    )?;
    let mut series = Vec::new();
    for (sched, alloc) in [
        (Sched::CFcfs, Alloc::Shenango),
        (Sched::CPreSq, Alloc::Shenango),
        (Sched::CPreSq, Alloc::Static),
    ] {
        let of = |f: fn(&Point) -> f64| -> Vec<(f64, f64)> {
            r.points
                .iter()
                .filter(|p| p.sched == sched && p.alloc == alloc)
                .map(|p| (p.load, f(p)))
                .collect()
        };
        let name = label(sched, alloc);
        series.push(Series {
            name: format!("{name} (measured)"),
            points: of(|p| p.p99_us),
        });
        series.push(Series {
            name: format!("{name} (simulated)"),
            points: of(|p| p.sim_p99_us),
        });
    }
    line_chart(
        &out.join("colocate.png"),
        &Chart {
            title: "Shinjuku-mode server beside batch: p99 vs load",
            x_label: "offered load (fraction of the managed cores)",
            y_label: "p99 latency (us)",
            series: &series,
            log_y: true,
            y_max: None,
            legend_lower_right: false,
        },
    )
}
