//! `ginza bench soak`: minutes to hours of load on kv-servers under
//! iokerneld while faults are injected all along, with a client that
//! checks every answer against a model of what it was acknowledged
//! (docs/soak.md; issue #35).
//!
//! Over a veth pair (iokerneld on its host end, AF_XDP else AF_PACKET; the
//! clients on Linux sockets in the namespace), each in a process of its own
//! ([`roles`], watched by [`procs`]):
//!
//! * `kv-rtc`: kv-server on the in-process stack, never killed;
//! * `netstack` and `kv-protected`: the netstack daemon and kv-server
//!   protected through it;
//! * `kv-victim`: a second in-process kv-server, killed and restarted;
//! * `batch`: the batch application beside them, killed and restarted.
//!
//! Load: loadgen's kernel backend, open loop at `--load-rps` on kv-rtc,
//! one run per latency window; the verifying client ([`verifier`]) on all
//! three kv-servers; a client that cuts `set`s off with a reset. Faults
//! ([`schedule`]): iokerneld's frame faults (drop, duplicate, reorder,
//! corrupt) all along at a low rate with storms, and SIGKILLs of batch,
//! kv-victim and the netstack. After `--duration` the frame faults stop
//! and every key is read once more.

mod model;
mod procs;
mod report;
mod roles;
mod schedule;
mod verifier;
mod wire;

pub use procs::Crash;
pub use report::{SoakReport, VerifierCounts, Window, FDS_FLAT, RSS_FLAT_MIB};
pub use roles::{role_main, run_role, Launcher, RoleArgs};

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::InProcess;
use ginza_loadgen::protocol::memcached::{Memcached, Mix};
use ginza_loadgen::protocol::{Transport, Workload};
use ginza_loadgen::schedule::{parse_rate, Arrivals, Process};
use ginza_loadgen::RunConfig;
use ginza_proto::parse_duration;
use ginza_sys::task_group::start_own_session;

use crate::harness::figures::allowed_cpus;
use crate::harness::iokerneld::{with_iokerneld_on_veth, Cpus};
use model::KeyModel;
use procs::{Proc, Sampler};
use report::{growth, growth_span, percentiles_json};
use schedule::{Event, BACKGROUND, STORM};
use verifier::{Server, Shared, Worker, FINAL};

/// Arguments of `ginza bench soak`.
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// How long the load and the faults last, e.g. 30s, 10m, 1h.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
    /// Seed of the fault schedule, the frame faults and the clients.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// loadgen's open-loop rate on kv-rtc, requests/s.
    #[arg(long, default_value = "2k", value_parser = parse_rate)]
    load_rps: f64,
    /// The verifying client's rate over all three kv-servers, requests/s.
    #[arg(long, default_value = "1500", value_parser = parse_rate)]
    verify_rps: f64,
    /// Keys of the verifying client per kv-server.
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u64).range(8..=1_000_000))]
    keys: u64,
    /// Connections of the verifying client per kv-server.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    connections: u64,
    /// Mean gap between requests cut off by a reset.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    reset_every: Duration,
    /// iokerneld's minimum residency of a latency-critical core (default:
    /// iokerneld's, 100us; 0s: Algorithm 2 as published; docs/design.md).
    #[arg(long, value_parser = parse_duration)]
    min_residency: Option<Duration>,
    /// Also write the JSON to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What [`soak`] runs.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub duration: Duration,
    pub seed: u64,
    pub load_rps: f64,
    pub verify_rps: f64,
    pub keys: u64,
    pub connections: usize,
    pub reset_every: Duration,
    /// iokerneld's `min_residency`; `None`: its default.
    pub min_residency: Option<Duration>,
}

impl From<&SoakArgs> for SoakConfig {
    fn from(a: &SoakArgs) -> SoakConfig {
        SoakConfig {
            duration: a.duration,
            seed: a.seed,
            load_rps: a.load_rps,
            verify_rps: a.verify_rps,
            keys: a.keys,
            connections: a.connections as usize,
            reset_every: a.reset_every,
            min_residency: a.min_residency,
        }
    }
}

/// Runs `ginza bench soak`: the JSON on stdout (and `--out`), a line per
/// missed aim on stderr; an error if any aim was missed.
pub fn run(args: SoakArgs) -> anyhow::Result<()> {
    let cfg = SoakConfig::from(&args);
    let report = soak(&cfg, &Launcher::ginza()?)?;
    let json = serde_json::to_string_pretty(&report)?;
    println!("{json}");
    if let Some(out) = &args.out {
        std::fs::write(out, format!("{json}\n"))
            .with_context(|| format!("writing {}", out.display()))?;
    }
    let missed = report.missed_aims();
    anyhow::ensure!(
        missed.is_empty(),
        "the soak missed its aims: {}",
        missed.join("; ")
    );
    Ok(())
}

/// The kv-servers' port.
const PORT: u16 = 11211;
/// How long a (re)started child may take to register with iokerneld.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long kv-protected may take to exit once its netstack is killed.
const DEPENDENT_EXIT: Duration = Duration::from_secs(10);
/// How often the processes are read from /proc.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The main loop's turn.
const TICK: Duration = Duration::from_millis(20);

/// The roles, by name.
const KV_RTC: &str = "kv-rtc";
const KV_PROTECTED: &str = "kv-protected";
const KV_VICTIM: &str = "kv-victim";
const NETSTACK: &str = "netstack";
const BATCH: &str = "batch";
/// This process: iokerneld's loop and the clients.
const SELF: &str = "soak (iokerneld, clients)";

/// Runs the soak with children started by `launcher`.
pub fn soak(cfg: &SoakConfig, launcher: &Launcher) -> anyhow::Result<SoakReport> {
    anyhow::ensure!(
        cfg.duration >= Duration::from_secs(10),
        "--duration must be at least 10s (its schedule needs room)"
    );
    let cpus = allowed_cpus()?;
    anyhow::ensure!(
        cpus.len() >= 2,
        "ginza bench soak needs 2 CPUs, this process may use {cpus:?}"
    );
    let ns = NetNs::create().context("ginza bench soak runs over a veth pair")?;
    let cpus = Cpus {
        iokernel: cpus[0],
        app: cpus[1],
    };
    let seed = cfg.seed;
    let min_residency = cfg
        .min_residency
        .unwrap_or(ginza_iokernel::config::DEFAULT_MIN_RESIDENCY);
    let configure = move |icfg: &mut ginza_iokernel::Config| {
        icfg.faults = vec![format!("{BACKGROUND},seed={seed}")
            .parse()
            .map_err(|e| anyhow!("{BACKGROUND}: {e}"))?];
        icfg.min_residency = min_residency;
        Ok(())
    };
    let (backend, mut report) = with_iokerneld_on_veth(&ns, cpus, configure, |iok, _| {
        Soak::new(cfg, launcher, &ns, iok)?.run()
    })?;
    report.backend = backend;
    report.min_residency_us = min_residency.as_secs_f64() * 1e6;
    Ok(report)
}

/// A soak in progress.
struct Soak<'a> {
    cfg: &'a SoakConfig,
    launcher: &'a Launcher,
    ns: &'a NetNs,
    iok: &'a InProcess,
    dir: PathBuf,
    procs: BTreeMap<&'static str, Proc>,
    sampler: Sampler,
    servers: BTreeMap<&'static str, Arc<Server>>,
    shared: Arc<Shared>,
    faults: BTreeMap<String, u64>,
    report: SoakReport,
    start: Instant,
}

impl<'a> Soak<'a> {
    fn new(
        cfg: &'a SoakConfig,
        launcher: &'a Launcher,
        ns: &'a NetNs,
        iok: &'a InProcess,
    ) -> anyhow::Result<Soak<'a>> {
        let dir = std::env::temp_dir().join(format!("ginza-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let [a, b, c, _] = ns.peer_ip.octets();
        let ip = |d: u8| Ipv4Addr::new(a, b, c, d);
        let mac = |d: u8| format!("02:47:5a:00:35:{d:02x}");
        let sock = iok.socket().display().to_string();
        let attach = dir.join("netstack.sock").display().to_string();
        let kv = |name: &str, d: u8, protected: bool| {
            let mut args = vec![
                "kv".to_string(),
                format!("--port={PORT}"),
                format!("--name={name}"),
                format!("--mac={}", mac(d)),
                format!("--ip={}", ip(d)),
                format!("--socket={sock}"),
                "--kthreads=1".into(),
            ];
            if protected {
                args.push(format!("--protected={attach}"));
            }
            args
        };
        let netstack = vec![
            "netstack".to_string(),
            format!("--ip={}", ip(5)),
            format!("--mac={}", mac(5)),
            "--kthreads=1".into(),
            format!("--iokernel-socket={sock}"),
            format!("--socket={attach}"),
            format!("--name={NETSTACK}"),
        ];
        let batch = vec![
            "batch".to_string(),
            format!("--socket={sock}"),
            format!("--name={BATCH}"),
            format!("--seed={}", cfg.seed),
        ];
        let mut procs = BTreeMap::new();
        for (name, args) in [
            (KV_RTC, kv(KV_RTC, 2, false)),
            (NETSTACK, netstack),
            (KV_PROTECTED, kv(KV_PROTECTED, 3, true)),
            (KV_VICTIM, kv(KV_VICTIM, 4, false)),
            (BATCH, batch),
        ] {
            procs.insert(name, Proc::new(name, args, &dir));
        }
        let servers = [(KV_RTC, 2), (KV_PROTECTED, 3), (KV_VICTIM, 4)]
            .into_iter()
            .map(|(name, d)| {
                let server = Server {
                    name,
                    addr: SocketAddr::V4(SocketAddrV4::new(ip(d), PORT)),
                    generation: AtomicU64::new(0),
                };
                (name, Arc::new(server))
            })
            .collect();
        Ok(Soak {
            cfg,
            launcher,
            ns,
            iok,
            dir,
            procs,
            sampler: Sampler::start(SAMPLE_EVERY),
            servers,
            shared: Arc::new(Shared::default()),
            faults: BTreeMap::new(),
            report: SoakReport::default(),
            start: Instant::now(),
        })
    }

    fn run(mut self) -> anyhow::Result<SoakReport> {
        self.sampler.set(SELF, Some(std::process::id()));
        for name in [KV_RTC, NETSTACK, KV_PROTECTED, KV_VICTIM, BATCH] {
            self.start_role(name)?;
        }
        for server in self.servers.values() {
            wait_reachable(self.ns, server.addr)?;
        }
        self.start = Instant::now();
        let window = window_len(self.cfg.duration);
        let clients = self.start_clients(window)?;
        let loadgen = self.start_loadgen(window)?;
        let result = self.serve_schedule();
        // The faults end; every worker reads its keys once more.
        self.count_faults();
        let _ = self.iok.faults().set(Vec::new());
        self.shared.phase.store(FINAL, Relaxed);
        let mut handles = clients;
        let end = Instant::now();
        while !handles.iter().all(JoinHandle::is_finished) {
            self.watch()?;
            std::thread::sleep(TICK);
        }
        for h in handles.drain(..) {
            h.join()
                .map_err(|_| anyhow!("a verifying client panicked"))?;
        }
        let windows = loadgen
            .join()
            .map_err(|_| anyhow!("the loadgen thread panicked"))?;
        result?;
        self.finish(end, windows)
    }

    /// Starts `name` and waits until it has registered with iokerneld.
    fn start_role(&mut self, name: &'static str) -> anyhow::Result<()> {
        let proc = self.procs.get_mut(name).expect("every role has a Proc");
        proc.start(self.launcher)?;
        self.sampler.set(name, proc.pid());
        let t0 = Instant::now();
        while !registered(self.iok, name) {
            if let Some(status) = proc.exited() {
                return Err(anyhow!(
                    "{name} exited before it registered ({status}): {}",
                    proc.crash(status, 0.0).stderr_tail
                ));
            }
            anyhow::ensure!(
                t0.elapsed() < START_TIMEOUT,
                "{name} did not register with iokerneld within {START_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Waits until iokerneld has let go of `name` (its process is gone).
    fn wait_deregistered(&self, name: &str) -> anyhow::Result<()> {
        let t0 = Instant::now();
        while registered(self.iok, name) {
            anyhow::ensure!(
                t0.elapsed() < START_TIMEOUT,
                "iokerneld still lists {name} {START_TIMEOUT:?} after its process died"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// The verifying workers and the resetting client, in the namespace.
    fn start_clients(&self, window: Duration) -> anyhow::Result<Vec<JoinHandle<()>>> {
        let mut handles = Vec::new();
        let per_worker = self.cfg.verify_rps / (self.servers.len() * self.cfg.connections) as f64;
        for (s, server) in self.servers.values().enumerate() {
            for w in 0..self.cfg.connections {
                let keys = (0..self.cfg.keys)
                    .filter(|k| *k as usize % self.cfg.connections == w)
                    .map(KeyModel::new)
                    .collect();
                let worker = Worker {
                    server: server.clone(),
                    keys,
                    rate: per_worker,
                    seed: self.cfg.seed ^ ((s as u64) << 32 | w as u64),
                    start: self.start,
                    window,
                };
                let shared = self.shared.clone();
                handles.push(self.ns.spawn_in(move || worker.run(&shared))?);
            }
        }
        let servers: Vec<Arc<Server>> = self.servers.values().cloned().collect();
        let (shared, gap, seed) = (self.shared.clone(), self.cfg.reset_every, self.cfg.seed);
        handles.push(
            self.ns
                .spawn_in(move || verifier::resets(&servers, gap, seed ^ 0x5eed, &shared))?,
        );
        Ok(handles)
    }

    /// loadgen on kv-rtc, one run per window until the run's end: each run
    /// offers load until its window's end (a run that waited for late
    /// answers starts the next window late, or skips it when little is
    /// left of it). Each run is a child process in the namespace (the
    /// `load` role): the generator's plans, histograms and threads, new
    /// each window, would otherwise stay in this process's heap as
    /// fragments, and this process's memory is held to the aim.
    fn start_loadgen(&self, window: Duration) -> anyhow::Result<JoinHandle<Vec<LoadWindow>>> {
        let target = self.servers[KV_RTC].addr;
        let (start, duration, rate, seed) = (
            self.start,
            self.cfg.duration,
            self.cfg.load_rps,
            self.cfg.seed,
        );
        let shared = self.shared.clone();
        let mut launch = self.ns.command(&[]);
        launch
            .arg(&self.launcher.program)
            .args(&self.launcher.prefix);
        let (program, args) = (
            launch.get_program().to_owned(),
            launch.get_args().map(ToOwned::to_owned).collect::<Vec<_>>(),
        );
        Ok(std::thread::Builder::new()
            .name("soak-loadgen".into())
            .spawn(move || {
                let mut out = Vec::new();
                // Until the run's end, or its early end on an error.
                while start.elapsed() < duration && shared.phase.load(Relaxed) == verifier::RUN {
                    let index = (start.elapsed().as_nanos() / window.as_nanos().max(1)) as usize;
                    let end = (window * (index as u32 + 1)).min(duration);
                    let len = end.saturating_sub(start.elapsed());
                    if len < window / 4 {
                        std::thread::sleep(len.min(TICK * 10));
                        continue;
                    }
                    let mut child = std::process::Command::new(&program);
                    start_own_session(&mut child).args(&args).args([
                        "load".to_string(),
                        format!("--target={target}"),
                        format!("--rate={rate}"),
                        format!("--duration={}us", len.as_micros()),
                        format!("--seed={}", seed.wrapping_add(index as u64)),
                    ]);
                    out.push(LoadWindow {
                        index,
                        result: run_load_window(child),
                    });
                }
                out
            })?)
    }

    /// The schedule, turn by turn, until the run's duration is over.
    fn serve_schedule(&mut self) -> anyhow::Result<()> {
        let mut events = schedule::plan(self.cfg.duration, self.cfg.seed)
            .into_iter()
            .peekable();
        let mut storm_ends: Option<Instant> = None;
        let mut storms = 0u64;
        while self.start.elapsed() < self.cfg.duration {
            self.watch()?;
            if storm_ends.is_some_and(|t| Instant::now() >= t) {
                storm_ends = None;
                self.set_rule(BACKGROUND, storms)?;
            }
            while let Some((at, event)) = events.next_if(|(at, _)| self.start.elapsed() >= *at) {
                log::info!(
                    "soak: {:.1} s (planned {at:?}): {event:?}",
                    self.start.elapsed().as_secs_f64()
                );
                match event {
                    Event::Storm(len) => {
                        storms += 1;
                        self.set_rule(STORM, storms)?;
                        storm_ends = Some(Instant::now() + len);
                    }
                    Event::KillBatch => self.kill_and_restart(BATCH)?,
                    Event::KillVictim => self.kill_and_restart(KV_VICTIM)?,
                    Event::KillNetstack => self.kill_netstack()?,
                }
                *self.faults.entry(event_name(&event).into()).or_default() += 1;
            }
            std::thread::sleep(TICK);
        }
        Ok(())
    }

    /// Replaces iokerneld's frame-fault rule, counting what the old one did.
    fn set_rule(&mut self, rule: &str, n: u64) -> anyhow::Result<()> {
        self.count_faults();
        let seed = self.cfg.seed.wrapping_mul(1000).wrapping_add(n);
        self.iok
            .faults()
            .set_specs(&[&format!("{rule},seed={seed}")])
            .map_err(|e| anyhow!("setting iokerneld's faults: {e}"))
    }

    /// Adds the current rule's counters (they restart at each change).
    fn count_faults(&mut self) {
        let Ok(stats) = self.iok.stats() else {
            return;
        };
        for f in &stats.dataplane.faults {
            for (k, v) in [
                ("frames_seen", f.frames),
                ("frames_dropped", f.dropped),
                ("frames_duplicated", f.duplicated),
                ("frames_reordered", f.reordered),
                ("frames_corrupted", f.corrupted),
                ("frames_overflowed", f.held_overflow),
            ] {
                *self.faults.entry(k.into()).or_default() += v;
            }
        }
    }

    /// Reaps children that died unasked: a crash each, restarted.
    fn watch(&mut self) -> anyhow::Result<()> {
        let at_s = self.start.elapsed().as_secs_f64();
        let mut died = Vec::new();
        for (name, proc) in self.procs.iter_mut() {
            if let Some(status) = proc.exited() {
                let crash = proc.crash(status, at_s);
                log::warn!("soak: {name} died unasked: {status}: {}", crash.stderr_tail);
                self.report.crash_details.push(crash);
                self.sampler.set(name, None);
                died.push(*name);
            }
        }
        for name in died {
            self.report.crashes += 1;
            self.wait_deregistered(name)?;
            self.forget(name);
            if name == NETSTACK {
                // Its protected application goes with it.
                self.dependent_exit()?;
                self.start_role(NETSTACK)?;
                self.start_role(KV_PROTECTED)?;
            } else {
                self.start_role(name)?;
            }
        }
        Ok(())
    }

    /// The verifier forgets `name`'s keys (its process is gone).
    fn forget(&self, name: &str) {
        if let Some(server) = self.servers.get(name) {
            server.generation.fetch_add(1, Relaxed);
        }
    }

    fn kill_and_restart(&mut self, name: &'static str) -> anyhow::Result<()> {
        self.procs.get_mut(name).expect("a role").kill()?;
        self.sampler.set(name, None);
        self.wait_deregistered(name)?;
        self.forget(name);
        self.start_role(name)
    }

    /// SIGKILL of the netstack: kv-protected, cut off, must exit by itself;
    /// both are started again.
    fn kill_netstack(&mut self) -> anyhow::Result<()> {
        self.procs.get_mut(NETSTACK).expect("a role").kill()?;
        self.sampler.set(NETSTACK, None);
        self.dependent_exit()?;
        self.wait_deregistered(NETSTACK)?;
        self.start_role(NETSTACK)?;
        self.start_role(KV_PROTECTED)
    }

    /// Waits for kv-protected to exit after its netstack died (killed if it
    /// does not), then forgets its keys.
    fn dependent_exit(&mut self) -> anyhow::Result<()> {
        let proc = self.procs.get_mut(KV_PROTECTED).expect("a role");
        if proc.pid().is_some() {
            match proc.wait_exit(DEPENDENT_EXIT) {
                Some(_) => self.report.protected_exits_after_netstack_kill += 1,
                None => {
                    self.report.protected_hangs_after_netstack_kill += 1;
                    let n = self.report.protected_hangs_after_netstack_kill;
                    proc.dump_stacks(&self.dir.join(format!("{KV_PROTECTED}-hang-{n}.stacks")));
                    // What iokerneld believes of its kthreads.
                    let seen = self.iok.stats().map(|s| {
                        let stale = format!("stale parks (all applications): {}\n", s.stale_parks);
                        stale
                            + &s.apps
                                .into_iter()
                                .filter(|a| a.name == KV_PROTECTED)
                                .map(|a| format!("{a:#?}"))
                                .collect::<Vec<_>>()
                                .join("\n")
                    });
                    let file = self.dir.join(format!("{KV_PROTECTED}-hang-{n}.iokerneld"));
                    let _ = std::fs::write(file, format!("{seen:#?}"));
                    proc.kill()?;
                }
            }
        }
        self.sampler.set(KV_PROTECTED, None);
        self.wait_deregistered(KV_PROTECTED)?;
        self.forget(KV_PROTECTED);
        Ok(())
    }

    fn finish(mut self, end: Instant, loads: Vec<LoadWindow>) -> anyhow::Result<SoakReport> {
        let sh = &self.shared;
        let mut r = std::mem::take(&mut self.report);
        r.duration_s = self.cfg.duration.as_secs_f64();
        r.seed = self.cfg.seed;
        r.lost_writes = sh.lost_writes.load(Relaxed);
        r.wrong_answers = sh.wrong_answers.load(Relaxed);
        r.verifier = report::VerifierCounts {
            answered: sh.answered.load(Relaxed),
            unanswered: sh.unanswered.load(Relaxed),
            not_judged: sh.not_judged.load(Relaxed),
            connects_failed: sh.connects_failed.load(Relaxed),
            models_forgotten: sh.models_forgotten.load(Relaxed),
            final_keys_read: sh.final_keys_read.load(Relaxed),
            final_keys_unread: sh.final_keys_unread.load(Relaxed),
            latency_records_late: sh.latency.lock().expect("workers are done").late,
        };
        r.examples = sh.examples.lock().expect("workers are done").clone();
        self.faults
            .insert("mid_request_resets".into(), sh.resets_sent.load(Relaxed));
        r.faults_injected = std::mem::take(&mut self.faults);
        let (span, described) = growth_span(self.cfg.duration);
        r.growth_windows = described;
        let samples = std::mem::replace(&mut self.sampler, Sampler::start(SAMPLE_EVERY)).finish();
        for (name, samples) in &samples {
            let (rss, fds, last) = growth(samples, self.start, end, span);
            r.rss_growth_mib.insert(name.clone(), rss);
            r.fds_growth.insert(name.clone(), fds);
            r.rss_last_mib.insert(name.clone(), last);
        }
        r.restarts.insert(SELF.into(), 0);
        for (name, proc) in &self.procs {
            r.restarts
                .insert(name.to_string(), proc.starts.saturating_sub(1));
        }
        r.windows = self.windows(&loads);
        r.requests_verified = r.verifier.answered + r.verifier.final_keys_read;
        r.requests_loadgen = loads.iter().map(LoadWindow::completed).sum();
        r.requests = r.requests_verified + r.requests_loadgen;
        // The children end, asked; logs are kept only for a failed run.
        for proc in self.procs.values_mut() {
            if proc.pid().is_some() {
                let _ = proc.kill();
            }
        }
        if r.missed_aims().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            r.logs = Some(self.dir.display().to_string());
        }
        Ok(r)
    }

    /// Latency by window: the verifier's and loadgen's.
    fn windows(&self, loads: &[LoadWindow]) -> Vec<Window> {
        let window = window_len(self.cfg.duration);
        let hists = self.shared.latency.lock().expect("workers are done");
        let n = (self.cfg.duration.as_nanos()).div_ceil(window.as_nanos().max(1)) as usize;
        (0..n)
            .map(|k| {
                let (from, to) = (
                    window * k as u32,
                    (window * (k as u32 + 1)).min(self.cfg.duration),
                );
                let loadgen = loads.iter().find(|l| l.index == k).map(LoadWindow::json);
                Window {
                    start_s: from.as_secs_f64(),
                    end_s: to.as_secs_f64(),
                    verifier: hists.of(k).as_ref().map(percentiles_json),
                    loadgen,
                }
            })
            .collect()
    }
}

/// One window's loadgen run: its summary ([`load_summary`]), or why there
/// is none.
struct LoadWindow {
    /// The window it started in.
    index: usize,
    result: Result<serde_json::Value, String>,
}

impl LoadWindow {
    fn json(&self) -> serde_json::Value {
        match &self.result {
            Ok(summary) => summary.clone(),
            Err(e) => serde_json::json!({ "error": e }),
        }
    }

    /// Requests loadgen saw answered in this window.
    fn completed(&self) -> u64 {
        self.result
            .as_ref()
            .ok()
            .and_then(|s| s["completed"].as_u64())
            .unwrap_or(0)
    }
}

/// What the soak keeps of a window's loadgen report.
pub(crate) fn load_summary(r: &ginza_loadgen::report::Report) -> serde_json::Value {
    serde_json::json!({
        "offered_rps": r.offered_rps,
        "achieved_rps": r.achieved_rps,
        "completed": r.completed,
        "timeouts": r.timeouts,
        "errors": r.errors + r.error_answers + r.unmatched,
        "error_kinds": r.error_kinds,
        "unmatched": r.unmatched,
        "p50_us": r.latency.p50_us,
        "p99_us": r.latency.p99_us,
        "p999_us": r.latency.p999_us,
        "generator_saturated": r.generator_saturated,
    })
}

/// Runs one window's `load` role to its end and reads the summary it
/// printed.
fn run_load_window(mut child: std::process::Command) -> Result<serde_json::Value, String> {
    let out = child
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("starting loadgen: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: String = stderr
                .chars()
                .rev()
                .take(400)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!("loadgen ({}) printed no summary: {tail}", out.status)
        })?;
    match summary["error"].as_str() {
        Some(e) => Err(e.to_string()),
        None => Ok(summary),
    }
}

/// A latency window: a minute, or a tenth of a run under 2 minutes.
fn window_len(duration: Duration) -> Duration {
    if duration >= Duration::from_secs(120) {
        Duration::from_secs(60)
    } else {
        duration / 10
    }
}

/// loadgen's run of one window on `target`: USR gets and sets, Poisson.
pub(crate) fn load_config(target: SocketAddr, rate: f64, len: Duration, seed: u64) -> RunConfig {
    RunConfig {
        target,
        transport: Transport::Tcp,
        workload: Workload::Memcached(Memcached {
            mix: Mix::Usr,
            keys: 10_000,
            preload: false,
        }),
        arrivals: Arrivals::steady(Process::Poisson, rate, len),
        warmup: Duration::ZERO,
        connections: 4,
        threads: 1,
        // Longer than a few retransmissions: a frame lost is late, not lost.
        timeout: Duration::from_secs(5),
        max_lag: Duration::from_millis(20),
        spin: Duration::ZERO,
        seed,
        cpus: Vec::new(),
        connect_timeout: Duration::from_secs(5),
    }
}

fn event_name(e: &Event) -> &'static str {
    match e {
        Event::Storm(_) => "frame_fault_storms",
        Event::KillBatch => "sigkill_batch",
        Event::KillVictim => "sigkill_kv_victim",
        Event::KillNetstack => "sigkill_netstack",
    }
}

fn registered(iok: &InProcess, name: &str) -> bool {
    iok.stats()
        .is_ok_and(|s| s.apps.iter().any(|a| a.name == name))
}

/// Waits until a kv-server accepts a connection from the namespace (it
/// registers before it listens; a protected one's address is answered by
/// the netstack).
fn wait_reachable(ns: &NetNs, addr: SocketAddr) -> anyhow::Result<()> {
    ns.run_in(move || {
        let t0 = Instant::now();
        loop {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(_) => return Ok(()),
                Err(e) if t0.elapsed() < START_TIMEOUT => {
                    log::debug!("soak: {addr} not reachable yet: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(anyhow!(
                        "{addr} not reachable within {START_TIMEOUT:?}: {e}"
                    ))
                }
            }
        }
    })?
}
