//! How one point of an experiment runs, per kind of system: each runner is
//! a thin adapter over code that already exists (the simulator's models,
//! `ginza demo`'s point, `bench steering`'s run, Shinjuku mode), so every
//! benchmark shares this one sweep engine (docs/experiments.md).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ginza_apps::scan_server::{self, Request, Store};
use ginza_iokernel::nic::ServiceTime;
use ginza_policy::steer::SteeringKind;
use ginza_runtime::shinjuku::{self, Arrival, Preemption, Source};
use ginza_sim::allocsim::{AllocPolicy, AllocSim};
use ginza_sim::dist::{Arrivals, LoadStep, Service};
use ginza_sim::reqsim::{Place, ReqSim, Sched};
use ginza_sim::steering::SteeringSpec;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

use super::row::Row;
use super::spec::{
    Allocator, Generator, LoadUnit, Loaded, Mode, Placement, Program, Protocol, SchedPolicy,
    Scheduling, ServiceDist, Steering, System, SystemKind,
};
use crate::colocate;
use crate::demo;
use crate::harness::figures::{allowed_cpus, percentile};
use crate::harness::work::{makespan_ns, Cores};
use crate::memcached;

/// What runs the points of one system.
#[derive(Clone, Debug)]
pub enum Runner {
    /// Shenango §2's bound for a 1 ms allocator: fewest cores meeting a
    /// p99.9 of 100 µs (simulated).
    SimSlowBound,
    /// The 5 µs allocator, simulated, with a grant latency in µs.
    SimAllocator { grant_us: f64 },
    /// Request scheduling, simulated (Shinjuku's figures).
    SimRequests { sched: Sched, cores: usize },
    /// Steering under the 5 µs allocator, simulated (Calisto's figures).
    SimSteering {
        kind: SteeringKind,
        warm: bool,
        cores: usize,
    },
    /// iokerneld + spin-server + batch on this machine (`ginza demo`'s point).
    SpinBatch { allocator: Allocator },
    /// The same under load steps: cores over time (`demo::run_steps`).
    SpinBatchSteps { allocator: Allocator },
    /// scan-server's store in Shinjuku mode, in process, one worker.
    ScanShinjuku {
        policy: SchedPolicy,
        quantum: Duration,
        placement: Placement,
    },
    /// iokerneld's steering harness (`ginza bench steering`'s run).
    Steering { kind: SteeringKind },
    /// `ginza bench memcached`'s point: kv-server and batch under iokerneld
    /// (Ginza) or Debian's memcached and a SCHED_IDLE batch thread (Linux),
    /// loadgen over a veth pair.
    Memcached {
        system: memcached::System,
        /// Ginza's allocator (unused for Linux).
        allocator: Allocator,
    },
    /// `ginza bench colocate`'s point: a Shinjuku-mode spin server
    /// dispatched on iokerneld's core, beside batch.
    Colocate {
        sched: colocate::Sched,
        alloc: colocate::Alloc,
        quantum: Duration,
    },
    /// spin-server's Linux peer beside batch at SCHED_IDLE, loadgen over
    /// loopback (`linux_spin.rs`).
    LinuxSpin,
    /// `ginza bench oneway`'s round over one path: 64-byte messages
    /// ping-ponged on one TCP connection (DLibOS Fig. 5).
    Oneway { path: OnewayPath },
    /// `ginza bench oneway`'s throughput step: http-server in process or
    /// protected under loadgen's HTTP load through iokerneld's switch
    /// (DLibOS Fig. 6).
    Http { protected: bool },
    /// Not available on this branch yet: why.
    Unavailable(String),
}

/// The three servers of `ginza bench oneway` (docs/protected.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnewayPath {
    /// echo-server with the in-process stack, run to completion.
    Rtc,
    /// echo-server protected, the stack in netstackd.
    Protected,
    /// A Linux echo server over loopback.
    Linux,
}

impl OnewayPath {
    fn describe(self) -> &'static str {
        match self {
            OnewayPath::Rtc => {
                "Ginza client -> iokerneld's software switch -> echo-server (in-process stack)"
            }
            OnewayPath::Protected => {
                "Ginza client -> iokerneld's software switch -> netstackd -> rings -> \
                 echo-server --protected"
            }
            OnewayPath::Linux => "Linux client -> kernel TCP over loopback -> Linux echo server",
        }
    }
}

impl Runner {
    pub fn available(&self) -> bool {
        !matches!(self, Runner::Unavailable(_))
    }
}

/// The resolved knobs of a run (tiny mode shrinks them).
#[derive(Clone, Debug)]
pub struct Settings {
    pub duration: Duration,
    pub warmup: Duration,
    pub requests: u64,
    pub seed: u64,
    pub tiny: bool,
}

/// State shared by the points of one run (made on first use).
#[derive(Default)]
pub struct Context {
    demo: Option<demo::Setup>,
    scan_store: Option<Arc<Store>>,
    /// The veth pair of the memcached points: made once per run, as
    /// `ginza bench memcached` does.
    netns: Option<ginza_iokernel::netns::NetNs>,
}

fn steering_kind(s: Steering) -> SteeringKind {
    match s {
        Steering::RssMod => SteeringKind::RssMod,
        Steering::FlowAffinity => SteeringKind::FlowAffinity,
        Steering::Indirection => SteeringKind::Indirection,
    }
}

/// The simulator's service distribution (µs).
pub fn sim_service(d: &ServiceDist) -> Service {
    let us = |d: &super::spec::Dur| d.0.as_secs_f64() * 1e6;
    match d {
        ServiceDist::Exponential { mean } => Service::Exp { mean: us(mean) },
        ServiceDist::Constant { value } => Service::Constant(us(value)),
        ServiceDist::Bimodal { p, short, long } => {
            Service::Modes(vec![(p.0, us(short)), (1.0 - p.0, us(long))])
        }
        ServiceDist::Lognormal { mean, sd } => Service::LogNormal {
            mean: us(mean),
            sd: us(sd),
        },
    }
}

/// iokerneld's generator's service distribution, if it has one.
fn generator_service(d: &ServiceDist) -> Option<ServiceTime> {
    let ns = |d: &super::spec::Dur| d.0.as_nanos().min(u64::MAX as u128) as u64;
    Some(match d {
        ServiceDist::Exponential { mean } => ServiceTime::Exponential {
            mean_ns: ns(mean) as f64,
        },
        ServiceDist::Constant { value } => ServiceTime::Constant { ns: ns(value) },
        ServiceDist::Bimodal { p, short, long } => ServiceTime::Bimodal {
            p: p.0,
            a_ns: ns(short),
            b_ns: ns(long),
        },
        ServiceDist::Lognormal { .. } => return None,
    })
}

/// Picks the runner of `sys` in experiment `l`; an error names the line
/// and key of a file that asks for something that cannot be.
pub fn choose(l: &Loaded, sys: &System) -> anyhow::Result<Runner> {
    let spec = &l.spec;
    let lc = spec.apps.first();
    let program = lc.map(|a| a.program);
    let load = &spec.load;
    let steps_ok = sys.kind == SystemKind::Ginza
        && program == Some(Program::SpinServer)
        && load.generator == Generator::Builtin
        && sys.allocator.is_some();
    if !load.steps.is_empty() && !steps_ok {
        return Ok(Runner::Unavailable(
            "load steps run only for a Ginza spin-server with an allocator under iokerneld's \
             generator (docs/experiments.md)"
                .into(),
        ));
    }
    let shinjuku = lc.and_then(|a| match &a.scheduling {
        Scheduling::Shinjuku { policy, quantum } => Some((*policy, quantum.0)),
        Scheduling::RunToCompletion => None,
    });
    let policy = sys.policy.or(shinjuku.map(|s| s.0));
    let quantum = sys.quantum.map(|q| q.0).or(shinjuku.map(|s| s.1));
    let mode = sys.mode.or(lc.map(|a| a.mode)).unwrap_or_default();
    if load.generator == Generator::PingPong {
        return oneway_runner(l, sys, program, mode);
    }
    match sys.kind {
        SystemKind::Simulator => simulator_runner(l, sys, policy, quantum),
        SystemKind::Linux => Ok(Runner::Unavailable(match program {
            Some(Program::KvServer) => {
                return memcached_runner(l, sys, memcached::System::Linux);
            }
            Some(Program::SpinServer) => return linux_spin_runner(l, sys),
            Some(p) => format!(
                "no Linux {p:?} peer in this harness yet (iokerneld's generator reaches \
                 only applications on its software switch; a Linux peer needs loadgen over veth)"
            ),
            None => "a Linux system needs an [[app]]".into(),
        })),
        SystemKind::Ginza => ginza_runner(l, sys, program, mode, (policy, quantum)),
    }
}

/// The simulator's runner for `sys`: the steering, scheduling or
/// allocator model, by what it names.
fn simulator_runner(
    l: &Loaded,
    sys: &System,
    policy: Option<SchedPolicy>,
    quantum: Option<Duration>,
) -> anyhow::Result<Runner> {
    let load = &l.spec.load;
    let at = sys.label.span().start;
    let err =
        |key: &str, msg: &str| l.error_at(at, key, &format!("system {:?}: {msg}", sys.label()));
    if load.generator != Generator::Simulated {
        return Err(err(
            "kind",
            "a simulator system needs [load] generator = \"simulated\"",
        ));
    }
    if let Some(st) = sys.steering {
        if load.unit != LoadUnit::Rps {
            return Err(err(
                "steering",
                "the steering model takes offered loads in unit = \"rps\"",
            ));
        }
        return Ok(Runner::SimSteering {
            kind: steering_kind(st),
            warm: sys.warm_table,
            cores: sys.cores.map_or(10, |c| c.0 as usize),
        });
    }
    if let Some(p) = policy {
        let Some(svc) = &load.service else {
            return Err(err("policy", "a scheduling model needs [load] service"));
        };
        if load.unit != LoadUnit::Capacity {
            return Err(err(
                "policy",
                "the scheduling model takes offered loads in unit = \"capacity\"",
            ));
        }
        let q = quantum.map_or(5.0, |q| q.as_secs_f64() * 1e6);
        let place = match sys.placement {
            Some(Placement::Head) => Place::Head,
            _ => Place::Tail,
        };
        let modes: Vec<f64> = match sim_service(svc) {
            Service::Modes(m) => m.iter().map(|&(_, v)| v).collect(),
            other => vec![other.mean()],
        };
        let sched = match p {
            SchedPolicy::DFcfs => Sched::DFcfs { conns: None },
            SchedPolicy::CFcfs => Sched::CFcfs,
            SchedPolicy::Ps => Sched::Ps,
            SchedPolicy::CPreSq => Sched::CPreSq {
                quantum_us: q,
                place,
            },
            SchedPolicy::CPreMq => Sched::CPreMq {
                quantum_us: q,
                slo_us: modes.iter().map(|v| 10.0 * v).collect(),
                place,
            },
        };
        return Ok(Runner::SimRequests {
            sched,
            cores: sys.cores.map_or(16, |c| c.0 as usize),
        });
    }
    if load.unit != LoadUnit::Cores {
        return Err(err(
            "allocator",
            "the allocator model takes offered loads in unit = \"cores\"",
        ));
    }
    match sys.allocator {
        Some(Allocator::Slow) => Ok(Runner::SimSlowBound),
        Some(Allocator::Shenango) => Ok(Runner::SimAllocator {
            grant_us: sys.grant_latency.map_or(0.0, |g| g.0.as_secs_f64() * 1e6),
        }),
        Some(Allocator::Static) => Err(err(
            "allocator",
            "the simulator models the shenango and slow allocators",
        )),
        None => Err(err(
            "kind",
            "a simulator system needs an allocator, a policy or a steering",
        )),
    }
}

/// The runner of a Ginza system, by its program and mode.
fn ginza_runner(
    l: &Loaded,
    sys: &System,
    program: Option<Program>,
    mode: Mode,
    (policy, quantum): (Option<SchedPolicy>, Option<Duration>),
) -> anyhow::Result<Runner> {
    let load = &l.spec.load;
    let at = sys.label.span().start;
    let err =
        |key: &str, msg: &str| l.error_at(at, key, &format!("system {:?}: {msg}", sys.label()));
    if mode == Mode::Protected && !matches!(program, Some(Program::KvServer | Program::HttpServer))
    {
        return Ok(Runner::Unavailable(format!(
            "{} in protected mode under load is not wired into experiments yet \
                 (protected runners: echo under ping-pong, kv-server under loadgen)",
            program.map_or("an application", Program::name)
        )));
    }
    match program {
        Some(Program::SpinServer) if policy.is_none() => {
            if load.generator != Generator::Builtin {
                return Ok(Runner::Unavailable(
                    "spin-server with batch is driven by iokerneld's generator \
                         (generator = \"builtin\"); loadgen over veth is not wired yet"
                        .into(),
                ));
            }
            if sys.steering.is_some() {
                return Ok(Runner::Steering {
                    kind: steering_kind(sys.steering.unwrap_or(Steering::RssMod)),
                });
            }
            let Some(allocator) = sys.allocator else {
                return Err(err(
                    "allocator",
                    "a Ginza spin-server system needs an allocator",
                ));
            };
            match &load.service {
                Some(s) if generator_service(s).is_some() => {}
                _ => {
                    return Err(l.error_at(
                        at,
                        "service",
                        "spin-server under iokerneld's generator needs [load] service \
                             = exponential, constant or bimodal",
                    ))
                }
            }
            if load.unit != LoadUnit::Capacity {
                return Err(err("unit", "spin-server points take unit = \"capacity\""));
            }
            if !load.steps.is_empty() {
                return Ok(Runner::SpinBatchSteps { allocator });
            }
            Ok(Runner::SpinBatch { allocator })
        }
        Some(Program::Echo) => match sys.steering {
            Some(st) => {
                if load.unit != LoadUnit::Rps {
                    return Err(err("steering", "the steering harness takes unit = \"rps\""));
                }
                Ok(Runner::Steering {
                    kind: steering_kind(st),
                })
            }
            None => Ok(Runner::Unavailable(
                "echo without a steering policy: see `ginza bench forward`/`tcp`".into(),
            )),
        },
        Some(Program::ScanServer) => {
            let Some(policy) = policy else {
                return Ok(Runner::Unavailable(
                    "scan-server run to completion under load: loadgen has no scan \
                         protocol yet"
                        .into(),
                ));
            };
            if load.generator != Generator::InProcess {
                return Ok(Runner::Unavailable(
                    "scan-server in Shinjuku mode under iokerneld (issue #16) is not \
                         available on this branch; use generator = \"in-process\""
                        .into(),
                ));
            }
            if load.mix.is_none() {
                return Err(err("mix", "scan-server needs [load.mix]"));
            }
            if load.unit != LoadUnit::Rps {
                return Err(err("unit", "scan-server points take unit = \"rps\""));
            }
            if matches!(policy, SchedPolicy::DFcfs | SchedPolicy::Ps) {
                return Err(err(
                    "policy",
                    "Shinjuku mode runs c-FCFS, c-PRE-SQ or c-PRE-MQ",
                ));
            }
            Ok(Runner::ScanShinjuku {
                policy,
                quantum: quantum.unwrap_or(Duration::from_micros(5)),
                placement: sys.placement.unwrap_or(Placement::Tail),
            })
        }
        Some(Program::KvServer) => memcached_runner(
            l,
            sys,
            match mode {
                Mode::InProcess => memcached::System::Ginza,
                Mode::Protected => memcached::System::GinzaProtected,
            },
        ),
        Some(Program::HttpServer) => Ok(Runner::Http {
            protected: mode == Mode::Protected,
        }),
        Some(Program::SpinServer) => {
            colocate_runner(l, sys, policy.unwrap_or(SchedPolicy::CFcfs), quantum)
        }
        Some(Program::Batch) | None => Err(err(
            "kind",
            "a Ginza system needs a latency-critical [[app]] first",
        )),
    }
}

/// spin-server's Linux peer, or why it cannot run here.
fn linux_spin_runner(l: &Loaded, sys: &System) -> anyhow::Result<Runner> {
    let load = &l.spec.load;
    let at = sys.label.span().start;
    let err =
        |key: &str, msg: &str| l.error_at(at, key, &format!("system {:?}: {msg}", sys.label()));
    if sys.allocator.is_some() || sys.policy.is_some() || sys.steering.is_some() {
        return Err(err(
            "kind",
            "a Linux system has no allocator, policy or steering",
        ));
    }
    if load.unit != LoadUnit::Capacity {
        return Err(err("unit", "spin-server points take unit = \"capacity\""));
    }
    if load
        .service
        .as_ref()
        .and_then(super::linux_spin::loadgen_service)
        .is_none()
    {
        return Err(err(
            "service",
            "the Linux spin peer needs [load] service = exponential, constant or bimodal",
        ));
    }
    match allowed_cpus() {
        Ok(c) if c.len() >= 2 => Ok(Runner::LinuxSpin),
        Ok(c) => Ok(Runner::Unavailable(format!(
            "the Linux spin peer needs two CPUs (the generator; the server), this process \
             may use {c:?}"
        ))),
        Err(e) => Ok(Runner::Unavailable(format!(
            "the CPUs this process may use: {e:#}"
        ))),
    }
}

/// `bench oneway`'s rounds: the echo application ping-ponged.
fn oneway_runner(
    l: &Loaded,
    sys: &System,
    program: Option<Program>,
    mode: Mode,
) -> anyhow::Result<Runner> {
    let load = &l.spec.load;
    let at = sys.label.span().start;
    let err =
        |key: &str, msg: &str| l.error_at(at, key, &format!("system {:?}: {msg}", sys.label()));
    if program != Some(Program::Echo) {
        return Err(err(
            "program",
            "generator = \"ping-pong\" runs the echo application",
        ));
    }
    if load.unit != LoadUnit::Bytes {
        return Err(err("unit", "ping-pong points take unit = \"bytes\""));
    }
    let payload = crate::harness::rtt::PAYLOAD as f64;
    if load.offered.iter().any(|o| o.0 != payload) {
        return Err(l.error_at(
            l.text.find("offered").unwrap_or(0),
            "offered",
            &format!("`ginza bench oneway` measures {payload}-byte messages only"),
        ));
    }
    let path = match (sys.kind, mode) {
        (SystemKind::Simulator, _) => {
            return Err(err("kind", "ping-pong is measured, not simulated"));
        }
        (SystemKind::Linux, _) => OnewayPath::Linux,
        (SystemKind::Ginza, Mode::InProcess) => OnewayPath::Rtc,
        (SystemKind::Ginza, Mode::Protected) => OnewayPath::Protected,
    };
    match allowed_cpus() {
        Ok(c) if c.len() >= 2 => Ok(Runner::Oneway { path }),
        Ok(c) => Ok(Runner::Unavailable(format!(
            "ping-pong needs two CPUs (iokerneld; the applications), this process may use {c:?}"
        ))),
        Err(e) => Ok(Runner::Unavailable(format!(
            "the CPUs this process may use: {e:#}"
        ))),
    }
}

/// `bench memcached`'s point for `system`, or why it cannot run here.
fn memcached_runner(l: &Loaded, sys: &System, system: memcached::System) -> anyhow::Result<Runner> {
    let load = &l.spec.load;
    let at = sys.label.span().start;
    let err =
        |key: &str, msg: &str| l.error_at(at, key, &format!("system {:?}: {msg}", sys.label()));
    if load.generator != Generator::Loadgen {
        return Err(err(
            "generator",
            "kv-server is measured with loadgen over veth ([load] generator = \"loadgen\")",
        ));
    }
    if load.unit != LoadUnit::Rps {
        return Err(err("unit", "memcached points take unit = \"rps\""));
    }
    if load.protocol != Protocol::MemcachedTcp {
        return Ok(Runner::Unavailable(
            "`ginza bench memcached` speaks memcached's text protocol over TCP only: \
             use protocol = \"memcached-tcp\""
                .into(),
        ));
    }
    if system != memcached::System::Linux && (sys.policy.is_some() || sys.steering.is_some()) {
        return Err(err(
            "policy",
            "kv-server runs to completion under iokerneld's default steering",
        ));
    }
    if let Some(why) = memcached_missing(system) {
        return Ok(Runner::Unavailable(why));
    }
    Ok(Runner::Memcached {
        system,
        allocator: sys.allocator.unwrap_or(Allocator::Shenango),
    })
}

/// What this host lacks for a memcached point of `system`, if anything.
fn memcached_missing(system: memcached::System) -> Option<String> {
    match allowed_cpus() {
        Ok(c) if c.len() >= 2 => {}
        Ok(c) => {
            return Some(format!(
                "the memcached points need two CPUs (the generator and iokerneld; the \
                 servers), this process may use {c:?}"
            ))
        }
        Err(e) => return Some(format!("the CPUs this process may use: {e:#}")),
    }
    if let Some(why) = ginza_iokernel::netns::missing_prerequisite() {
        return Some(format!("the memcached points run over a veth pair: {why}"));
    }
    if system == memcached::System::Linux {
        if let Err(e) = memcached::memcached_available() {
            return Some(format!("Debian's memcached: {e:#}"));
        }
    }
    None
}

/// `bench colocate`'s point: a Shinjuku-mode spin server under iokerneld.
fn colocate_runner(
    l: &Loaded,
    sys: &System,
    policy: SchedPolicy,
    quantum: Option<Duration>,
) -> anyhow::Result<Runner> {
    let load = &l.spec.load;
    let at = sys.label.span().start;
    let err =
        |key: &str, msg: &str| l.error_at(at, key, &format!("system {:?}: {msg}", sys.label()));
    if load.generator != Generator::Builtin {
        return Err(err(
            "generator",
            "a Shinjuku-mode spin-server under iokerneld is driven by its generator \
             (generator = \"builtin\")",
        ));
    }
    if load.unit != LoadUnit::Capacity {
        return Err(err("unit", "spin-server points take unit = \"capacity\""));
    }
    match &load.service {
        Some(s) if generator_service(s).is_some() => {}
        _ => {
            return Err(err(
                "service",
                "spin-server under iokerneld's generator needs [load] service = exponential, \
                 constant or bimodal",
            ))
        }
    }
    let sched = match policy {
        SchedPolicy::CFcfs => colocate::Sched::CFcfs,
        SchedPolicy::CPreSq => colocate::Sched::CPreSq,
        SchedPolicy::CPreMq => {
            return Ok(Runner::Unavailable(
                "c-PRE-MQ under iokerneld: `ginza bench colocate` runs c-FCFS and c-PRE-SQ \
                 (its classes come from the request's class byte, which the generator does \
                 not set)"
                    .into(),
            ))
        }
        SchedPolicy::DFcfs | SchedPolicy::Ps => {
            return Err(err(
                "policy",
                "dispatch on iokerneld's core runs c-FCFS or c-PRE-SQ",
            ))
        }
    };
    let alloc = match sys.allocator {
        Some(Allocator::Shenango) | None => colocate::Alloc::Shenango,
        Some(Allocator::Static) => colocate::Alloc::Static,
        Some(Allocator::Slow) => {
            return Ok(Runner::Unavailable(
                "`ginza bench colocate` runs the shenango and static allocators; the slow \
                 (1 ms) allocator is not passed through to it yet"
                    .into(),
            ))
        }
    };
    Ok(Runner::Colocate {
        sched,
        alloc,
        quantum: quantum.unwrap_or(Duration::from_micros(5)),
    })
}

fn demo_setup<'a>(ctx: &'a mut Context, settings: &Settings) -> anyhow::Result<&'a demo::Setup> {
    if ctx.demo.is_none() {
        ctx.demo = Some(demo::Setup::new(
            None,
            None,
            settings.warmup,
            settings.duration,
            settings.seed,
        )?);
    }
    ctx.demo.as_ref().context("the demo's setup")
}

fn demo_policy(a: Allocator) -> demo::Policy {
    match a {
        Allocator::Shenango => demo::Policy::Shenango,
        Allocator::Static => demo::Policy::Static,
        Allocator::Slow => demo::Policy::Slow,
    }
}

/// Runs one point of `runner` at offered load `x`: the rows it measured
/// (one, or one per sample for load steps), filled in from `template`.
#[allow(clippy::too_many_arguments)] // the point's coordinates, spelled out
pub fn run_point(
    ctx: &mut Context,
    l: &Loaded,
    runner: &Runner,
    settings: &Settings,
    x: f64,
    load_index: usize,
    round: u64,
    template: Row,
) -> anyhow::Result<Vec<Row>> {
    if let Runner::SpinBatchSteps { allocator } = runner {
        return steps_point(ctx, l, *allocator, settings, template);
    }
    let mut row = template;
    run_one(ctx, l, runner, settings, x, load_index, round, &mut row)?;
    Ok(vec![row])
}

/// Load steps under iokerneld: a row per 10 ms sample.
fn steps_point(
    ctx: &mut Context,
    l: &Loaded,
    allocator: Allocator,
    settings: &Settings,
    template: Row,
) -> anyhow::Result<Vec<Row>> {
    let dist = l
        .spec
        .load
        .service
        .as_ref()
        .and_then(generator_service)
        .context("[load] service")?;
    let steps: Vec<(f64, Duration)> = l
        .spec
        .load
        .steps
        .iter()
        .map(|s| {
            let d = if settings.tiny {
                s.duration.0.min(Duration::from_millis(20))
            } else {
                s.duration.0
            };
            (s.offered.0, d)
        })
        .collect();
    let setup = demo_setup(ctx, settings)?;
    let r = demo::run_steps(
        setup,
        demo::Workload {
            name: "steps",
            dist,
        },
        demo_policy(allocator),
        &steps,
    )?;
    Ok(r.samples
        .iter()
        .map(|s| {
            let step = &r.steps[s.step];
            // No reply in the step: no latency (not 0).
            let lat = |v: f64| (step.answered > 0).then_some(v);
            Row {
                offered: step.load,
                t_ms: Some(s.at.as_secs_f64() * 1e3),
                p50_us: lat(step.p50_us),
                p99_us: lat(step.p99_us),
                p999_us: lat(step.p999_us),
                lc_cores: Some(s.lc_cores as f64),
                batch_cores: Some(s.batch_cores as f64),
                batch_ops_per_s: Some(s.batch_paths_per_s),
                sent: Some(step.sent as f64),
                answered: Some(step.answered as f64),
                note: step.note.clone(),
                ..template.clone()
            }
        })
        .collect())
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    ctx: &mut Context,
    l: &Loaded,
    runner: &Runner,
    settings: &Settings,
    x: f64,
    load_index: usize,
    round: u64,
    row: &mut Row,
) -> anyhow::Result<()> {
    let spec = &l.spec;
    let seed = settings.seed.wrapping_add(round.wrapping_mul(0x9e37_79b9));
    match runner {
        Runner::Unavailable(why) => anyhow::bail!("{why}"),
        Runner::SpinBatchSteps { .. } => anyhow::bail!("load steps run through run_point"),
        Runner::SimSlowBound => {
            let (n, p999) = ginza_sim::figs::slow_bound_cores(x, seed, settings.tiny);
            row.lc_cores = Some(n as f64);
            row.efficiency = Some(x / n as f64);
            row.p999_us = Some(p999);
        }
        Runner::SimAllocator { grant_us } => {
            let r = ginza_sim::figs::shenango_point(x, *grant_us, seed, settings.tiny);
            row.lc_cores = Some(r.mean_cores);
            row.efficiency = Some(r.efficiency);
            row.p50_us = Some(r.stats.latency_pct_us(50.0));
            row.p99_us = Some(r.stats.latency_pct_us(99.0));
            row.p999_us = Some(r.stats.latency_pct_us(99.9));
            row.answered = Some(r.stats.n as f64);
        }
        Runner::SimRequests { sched, cores } => {
            let svc = sim_service(spec.load.service.as_ref().context("[load] service")?);
            let s = ReqSim::new(
                *cores,
                sched.clone(),
                svc.clone(),
                x,
                settings.requests,
                seed,
            )
            .run();
            row.p50_us = Some(s.latency_pct_us(50.0));
            row.p99_us = Some(s.latency_pct_us(99.0));
            row.p999_us = Some(s.latency_pct_us(99.9));
            if svc.classes() > 1 {
                row.p99_class0_us = Some(s.class_pct_us(0, 99.0));
                row.p99_class1_us = Some(s.class_pct_us(1, 99.0));
            }
            row.answered = Some(s.n as f64);
        }
        Runner::SimSteering { kind, warm, cores } => {
            sim_steering_point(spec, settings, (*kind, *warm, *cores), x, seed, row)
        }
        Runner::SpinBatch { allocator } => {
            let setup = demo_setup(ctx, settings)?;
            let dist = spec
                .load
                .service
                .as_ref()
                .and_then(generator_service)
                .context("[load] service")?;
            let r = demo::run_point(
                setup,
                demo::Workload {
                    name: "experiment",
                    dist,
                },
                demo_policy(*allocator),
                x,
                load_index,
            )?;
            row.achieved = Some(r.achieved_load);
            row.p50_us = Some(r.p50_us);
            row.p99_us = Some(r.p99_us);
            row.p999_us = Some(r.p999_us);
            row.batch_ops_per_s = Some(r.batch_mpaths_per_s * 1e6);
            row.lc_cores = Some(r.lc_cores);
            row.batch_cores = Some(r.batch_cores);
            row.reallocations_per_s = Some(r.reallocations_per_s);
            row.sent = Some(r.lc_requests_sent as f64);
            row.answered = Some(r.lc_requests_answered as f64);
            row.note = r.note;
        }
        Runner::ScanShinjuku {
            policy,
            quantum,
            placement,
        } => scan_point(
            ctx, l, *policy, *quantum, *placement, settings, x, seed, row,
        )?,
        Runner::Steering { kind } => steering_point(l, *kind, settings, x, round, row)?,
        Runner::Memcached { system, allocator } => memcached_point(
            ctx, l, *system, *allocator, settings, x, load_index, round, row,
        )?,
        Runner::Oneway { path } => oneway_point(*path, settings, row)?,
        Runner::Http { protected } => http_point(
            if *protected {
                crate::oneway::Mode::Protected
            } else {
                crate::oneway::Mode::Rtc
            },
            settings,
            spec.load.connections.0.clamp(1, 1024) as usize,
            x,
            seed.wrapping_add(load_index as u64),
            row,
        )?,
        Runner::LinuxSpin => {
            let svc = spec.load.service.as_ref().context("[load] service")?;
            let p = super::linux_spin::run_point(
                svc,
                x,
                settings.warmup,
                settings.duration,
                spec.load.connections.0.clamp(1, 1024) as usize,
                seed.wrapping_add(load_index as u64),
            )?;
            row.achieved = Some(p.achieved_load);
            row.p50_us = p.p50_us;
            row.p99_us = p.p99_us;
            row.p999_us = p.p999_us;
            row.batch_ops_per_s = Some(p.batch_ops_per_s);
            row.sent = Some(p.sent as f64);
            row.answered = Some(p.answered as f64);
            row.note = p.note;
        }
        Runner::Colocate {
            sched,
            alloc,
            quantum,
        } => colocate_point(spec, settings, (*sched, *alloc, *quantum), x, row)?,
    }
    Ok(())
}

/// One point of the steering model at `x` requests/s.
fn sim_steering_point(
    spec: &super::spec::Experiment,
    settings: &Settings,
    (kind, warm, cores): (SteeringKind, bool, usize),
    x: f64,
    seed: u64,
    row: &mut Row,
) {
    let flows = spec.load.flows.0;
    let mean_us = spec.load.service.as_ref().map_or(10.0, |s| s.mean_us());
    let r = AllocSim {
        cores,
        policy: AllocPolicy::Shenango { interval_us: 5.0 },
        service: Service::Exp { mean: mean_us },
        load: vec![LoadStep {
            duration_us: f64::INFINITY,
            rate_per_us: x / 1e6,
        }],
        kthreads: cores,
        guaranteed: 0,
        batch: false,
        hyperthreads: false,
        grant_latency_us: 1.0,
        preempt_latency_us: 1.0,
        park_spin_us: 2.0,
        idle_poll_us: 0.0,
        duration_us: settings.duration.as_secs_f64() * 1e6,
        warmup_us: 0.0,
        seed,
        steering: SteeringSpec {
            flows,
            flow_table_capacity: (flows as usize).next_power_of_two().max(1024),
            ..SteeringSpec::of(kind)
        },
        table_insert_us: 0.5,
        migration_us: 1.0,
        warm_table: warm,
    }
    .run();
    row.p50_us = Some(r.stats.latency_pct_us(50.0));
    row.p99_us = Some(r.stats.latency_pct_us(99.0));
    row.p999_us = Some(r.stats.latency_pct_us(99.9));
    row.lc_cores = Some(r.mean_cores);
    row.flows_moved = Some(r.steering.flows_moved as f64);
    row.answered = Some(r.stats.n as f64);
}

/// One point of the Shinjuku-mode spin server beside batch at `x` of the
/// managed cores' capacity.
fn colocate_point(
    spec: &super::spec::Experiment,
    settings: &Settings,
    (sched, alloc, quantum): (colocate::Sched, colocate::Alloc, Duration),
    x: f64,
    row: &mut Row,
) -> anyhow::Result<()> {
    let allowed = allowed_cpus()?;
    let (&io_cpu, managed) = allowed
        .split_first()
        .context("no CPU this process may use")?;
    anyhow::ensure!(
        !managed.is_empty(),
        "the colocate points need a CPU beside iokerneld's, this process may use \
         {allowed:?}"
    );
    let svc = spec.load.service.as_ref().context("[load] service")?;
    let service = generator_service(svc).context("[load] service")?;
    let p = colocate::measure_point(&colocate::PointRun {
        io_cpu,
        managed,
        sched,
        alloc,
        quantum_us: quantum.as_secs_f64() * 1e6,
        service,
        // `x` of the managed cores' capacity.
        rate_per_s: x * managed.len() as f64 / (svc.mean_us() * 1e-6),
        duration: settings.duration,
        idle_spin: None,
        workers: None,
        pre_assign: None,
    })?;
    row.p50_us = Some(p.p50_us);
    row.p99_us = Some(p.p99_us);
    row.batch_ops_per_s = Some(p.batch_mpaths_per_s * 1e6);
    row.lc_cores = Some(p.lc_cores);
    row.sent = Some(p.sent as f64);
    row.answered = Some(p.replies as f64);
    row.note = format!(
        "served {}, preempted {}, rejected {}, dropped at ingress {}",
        p.served, p.preempted, p.rejected, p.dropped_ingress
    );
    Ok(())
}

/// One round of `ginza bench oneway` over `path`: p50 and p99 of the one-way
/// latency (half of each round trip).
fn oneway_point(path: OnewayPath, settings: &Settings, row: &mut Row) -> anyhow::Result<()> {
    use crate::oneway::{self, Mode};
    let duration = settings.duration.max(Duration::from_millis(1));
    let rtt = match path {
        OnewayPath::Rtc => {
            oneway::echo_round(Mode::Rtc, &oneway::Setup::shared(two_cpus()?), duration)?.0
        }
        OnewayPath::Protected => {
            oneway::echo_round(
                Mode::Protected,
                &oneway::Setup::shared(two_cpus()?),
                duration,
            )?
            .0
        }
        OnewayPath::Linux => oneway::linux_round(duration)?,
    };
    row.p50_us = Some(rtt.p50 / 2.0);
    row.p99_us = Some(rtt.p99 / 2.0);
    row.note = format!(
        "one way = half the round trip of {}-byte messages on one TCP connection; {}",
        crate::harness::rtt::PAYLOAD,
        path.describe()
    );
    Ok(())
}

/// iokerneld's CPU and the applications' CPU for the switch-based points.
fn two_cpus() -> anyhow::Result<crate::harness::iokerneld::Cpus> {
    let allowed = allowed_cpus()?;
    let [iokernel, app, ..] = allowed[..] else {
        anyhow::bail!("this point needs two CPUs, this process may use {allowed:?}");
    };
    Ok(crate::harness::iokerneld::Cpus { iokernel, app })
}

/// One load step of `ginza bench oneway`'s throughput sweep: `http-server`
/// in `mode` under loadgen's HTTP load through iokerneld's switch (DLibOS
/// Fig. 6).
fn http_point(
    mode: crate::oneway::Mode,
    settings: &Settings,
    connections: usize,
    rps: f64,
    seed: u64,
    row: &mut Row,
) -> anyhow::Result<()> {
    use crate::oneway::{self, ThroughputConfig};
    let t = ThroughputConfig {
        loads_rps: vec![rps],
        duration: settings.duration,
        warmup: settings.warmup,
        rounds: 1,
        connections,
        ..ThroughputConfig::default()
    };
    let run = oneway::http_run(mode, &oneway::Setup::shared(two_cpus()?), &t, rps, seed)?;
    row.achieved = Some(run.achieved_krps * 1e3);
    row.p50_us = run.p50_us;
    row.p99_us = run.p99_us;
    row.note = match (&run.saturation_reason, run.failed) {
        (Some(why), _) => format!("the generator fell behind: {why}"),
        (None, 0) => String::new(),
        (None, n) => format!("{n} requests failed (timeouts, broken connections, bad answers)"),
    };
    Ok(())
}

/// One point of `ginza bench memcached` (`memcached::run_point`) on the
/// run's veth pair.
#[allow(clippy::too_many_arguments)]
fn memcached_point(
    ctx: &mut Context,
    l: &Loaded,
    system: memcached::System,
    allocator: Allocator,
    settings: &Settings,
    rps: f64,
    load_index: usize,
    round: u64,
    row: &mut Row,
) -> anyhow::Result<()> {
    let allowed = allowed_cpus()?;
    anyhow::ensure!(
        allowed.len() >= 2,
        "the memcached points need two CPUs, this process may use {allowed:?}"
    );
    if ctx.netns.is_none() {
        ctx.netns = Some(
            ginza_iokernel::netns::NetNs::create()
                .context("the memcached points run over a veth pair")?,
        );
    }
    let ns = ctx.netns.as_ref().context("the veth pair")?;
    let cfg = memcached::PointConfig {
        system,
        offered_rps: rps,
        duration: settings.duration,
        warmup: settings.warmup,
        connections: l.spec.load.connections.0.clamp(1, 10_000) as usize,
        keys: if settings.tiny { 500 } else { 10_000 },
        // Both systems get the same arrivals at a point (as `bench
        // memcached` seeds them).
        seed: settings
            .seed
            .wrapping_add(round.wrapping_mul(1000))
            .wrapping_add(load_index as u64),
        cpus: memcached::Cpus {
            generator: allowed[0],
            iokernel: allowed[0],
            server: allowed[1],
        },
        max_lag: Duration::from_micros(500),
        allocator: match allocator {
            Allocator::Shenango => ginza_iokernel::PolicyKind::Shenango,
            Allocator::Static => ginza_iokernel::PolicyKind::Static,
            // `ginza demo`'s slow allocator: cores from utilisation every 1 ms.
            Allocator::Slow => ginza_iokernel::PolicyKind::Slow {
                period: Duration::from_millis(1),
            },
        },
        // As iokerneld runs by default.
        local_wake: None,
        // The experiments run kv-server and Linux's memcached only.
        ginza_run: None,
        // As `bench memcached` by default: iokerneld may sleep while idle.
        iokernel_spin: false,
        // As iokerneld runs by default.
        self_wake: None,
        idle_yield: None,
        idle_victim_grace: None,
        // As the runtime runs by default: kv-server polls while idle.
        kv_park: false,
        // As deployed: batch a process of its own.
        batch_in_process: false,
        // As `ginza bench memcached` runs by default.
        keep_generator_cpu_busy: true,
        memcached_args: Vec::new(),
    };
    let r = memcached::run_point(ns, &cfg)?;
    row.achieved = Some(r.achieved_krps * 1e3);
    row.p50_us = r.p50_us;
    row.p99_us = r.p99_us;
    row.p999_us = r.p999_us;
    row.batch_ops_per_s = Some(r.batch_ops_per_s);
    let mut note = vec![r.server.clone()];
    if let Some(why) = &r.saturation_reason {
        note.push(format!("generator saturated: {why}"));
    }
    if r.timeouts > 0 || r.errors > 0 {
        note.push(format!("{} timeouts, {} errors", r.timeouts, r.errors));
    }
    row.note = note.join("; ");
    Ok(())
}

/// A request of the scan mix drawn in advance.
struct Planned {
    at_ns: u64,
    request: Request,
}

/// When the first request arrives, ns after the start of `serve`.
const START_NS: u64 = 1_000_000;

struct Replay<'a> {
    plan: &'a [Planned],
    next: usize,
    policy: ginza_runtime::shinjuku::SchedPolicy,
}

impl Source<Request> for Replay<'_> {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<Request>> {
        let p = self.plan.get(self.next)?;
        if p.at_ns > now_ns {
            return None;
        }
        self.next += 1;
        Some(Arrival {
            class: scan_server::class_under(&self.policy, &p.request),
            at_ns: p.at_ns,
            payload: p.request,
        })
    }
    fn is_done(&self) -> bool {
        self.next >= self.plan.len()
    }
}

/// scan-server's store served in Shinjuku mode by one worker, requests
/// replayed from a plan drawn in advance (the GET/SCAN mix at `rps`,
/// Poisson); latency from each request's planned arrival.
#[allow(clippy::too_many_arguments)]
fn scan_point(
    ctx: &mut Context,
    l: &Loaded,
    policy: SchedPolicy,
    quantum: Duration,
    placement: Placement,
    settings: &Settings,
    rps: f64,
    seed: u64,
    row: &mut Row,
) -> anyhow::Result<()> {
    let mix = l.spec.load.mix.as_ref().context("[load.mix]")?;
    let store_seed = l.spec.load.seed;
    let store = ctx
        .scan_store
        .get_or_insert_with(|| Arc::new(Store::generate(store_seed, mix.keys.0)))
        .clone();
    let place = match placement {
        Placement::Head => ginza_runtime::shinjuku::Placement::Head,
        Placement::Tail => ginza_runtime::shinjuku::Placement::Tail,
    };
    let q = quantum.as_nanos().min(u64::MAX as u128) as u64;
    let runtime_policy = match policy {
        SchedPolicy::CFcfs => ginza_runtime::shinjuku::SchedPolicy::CFcfs,
        SchedPolicy::CPreSq => ginza_runtime::shinjuku::SchedPolicy::CPreSq {
            quantum: q,
            placement: place,
        },
        // scan_server::mq_policy's classes, with the placement asked for.
        SchedPolicy::CPreMq => ginza_runtime::shinjuku::SchedPolicy::CPreMq {
            quantum: q,
            classes: [mix.get_slo.0, mix.scan_slo.0]
                .iter()
                .map(|slo| ginza_runtime::shinjuku::ClassConfig {
                    slo: (slo.as_nanos().min(u64::MAX as u128) as u64).max(1),
                    placement: place,
                })
                .collect(),
        },
        other => anyhow::bail!("{} is not a Shinjuku-mode policy", other.name()),
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut arrivals = Arrivals::poisson(rps / 1e6);
    let n = settings.requests;
    let warmup = (n / 10) as usize;
    let total = n + warmup as u64;
    let plan: Vec<Planned> = (0..total)
        .map(|id| {
            let at_ps = arrivals.next(&mut rng);
            let key = scan_server::key_at(store_seed, rng.random_range(0..mix.keys.0));
            let request = if rng.random_bool(mix.get.0) {
                Request::get(id, key)
            } else {
                Request::scan(id, 0, mix.scan_keys.0.min(u32::MAX as u64) as u32)
            };
            Planned {
                at_ns: START_NS + at_ps / 1000,
                request,
            }
        })
        .collect();
    let cores = Cores::pick(&[])?;
    let source = Replay {
        plan: &plan,
        next: 0,
        policy: runtime_policy.clone(),
    };
    let report = shinjuku::serve(
        cores.config(runtime_policy, Preemption::default()),
        source,
        move |r: Request| store.execute(&r).count,
    )
    .with_context(|| format!("serving the scan mix under {}", policy.name()))?;
    // Requests over the dispatcher's in-flight bound are refused and
    // counted (docs/runtime.md, "Shinjuku mode"); any other shortfall is
    // a lost request.
    let accounted = report.completions.len() as u64 + report.rejected;
    anyhow::ensure!(
        accounted == plan.len() as u64,
        "{} of {} requests completed and {} refused: {} lost",
        report.completions.len(),
        plan.len(),
        report.rejected,
        plan.len() as u64 - accounted.min(plan.len() as u64)
    );
    if report.rejected > 0 {
        row.note = format!(
            "{} of {} requests refused over the dispatcher's in-flight bound (overload)",
            report.rejected,
            plan.len()
        );
    }
    let (mut all, mut gets, mut scans) = (Vec::new(), Vec::new(), Vec::new());
    for c in &report.completions {
        let id = c.id as usize;
        if id < warmup {
            continue;
        }
        let lat = c.latency_ns();
        all.push(lat);
        match plan.get(id).map(|p| p.request.class()) {
            Some(scan_server::CLASS_SCAN) => scans.push(lat),
            _ => gets.push(lat),
        }
    }
    for v in [&mut all, &mut gets, &mut scans] {
        v.sort_unstable();
    }
    let us = |v: &[u64], q: f64| percentile(v, q).map(|ns| ns as f64 / 1e3);
    row.p50_us = us(&all, 50.0);
    row.p99_us = us(&all, 99.0);
    row.p999_us = us(&all, 99.9);
    row.p99_class0_us = us(&gets, 99.0);
    row.p99_class1_us = us(&scans, 99.0);
    row.achieved = Some(report.completions.len() as f64 / makespan_ns(&report).max(1) as f64 * 1e9);
    row.sent = Some(plan.len() as f64);
    row.answered = Some(report.completions.len() as f64);
    Ok(())
}

/// One run of `ginza bench steering`'s harness for one policy at `rps`.
fn steering_point(
    l: &Loaded,
    kind: SteeringKind,
    settings: &Settings,
    rps: f64,
    round: u64,
    row: &mut Row,
) -> anyhow::Result<()> {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        args: crate::steering::SteeringArgs,
    }
    let send_ms = (settings.duration.as_millis() as u64).max(10);
    let phase_ms = (send_ms / 12).max(1);
    let out =
        std::env::temp_dir().join(format!("ginza-experiment-steering-{}", std::process::id()));
    let wrap = Wrap::try_parse_from([
        "steering".to_string(),
        format!("--flows={}", l.spec.load.flows.0.min(20_000)),
        format!("--rate={rps}"),
        format!("--send-ms={send_ms}"),
        format!("--phase-ms={phase_ms}"),
        format!("--out={}", out.display()),
    ])
    .map_err(|e| anyhow::anyhow!("the steering harness's settings: {e}"))?;
    let run = crate::steering::one_run(&wrap.args, round as u32, kind)?;
    let v = serde_json::to_value(&run)?;
    let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    row.p50_us = f("p50_us");
    row.p99_us = f("p99_us");
    row.reordered_pct = f("reordered_pct");
    row.flows_moved = f("flows_moved_per_change");
    row.sent = f("sent");
    row.answered = f("replies");
    Ok(())
}
