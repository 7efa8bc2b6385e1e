//! The packet steering harness (docs/simulator.md, "Steering
//! measurements"): the end-to-end test (`tests/steering.rs`) and `ginza
//! bench steering` both run it.
//!
//! iokerneld runs on a thread with the recording actuator, managing as many
//! cores as the application has kthreads, whether or not the machine has
//! them (grants are bookkeeping, no thread is woken): with 4 kthreads a
//! change of the active set is 4 ⇄ 3, where `rss-mod` moves most flows and
//! the consistent policies about a quarter. Its generator sends UDP spin
//! requests (0 ns of work: the figures are steering, not service) of many
//! flows, each flow numbering its requests, to a [`RawApp`] whose kthreads
//! one thread plays as a runtime would: every two phases one kthread parks
//! (gives its core back) and the next phase it is granted one again. A
//! phase lasts `phase`, and until iokerneld's stats show its change made
//! (a park: one more change of the active set than when it was asked for;
//! a grant: every kthread holding a core), so that on a loaded machine,
//! where iokerneld may lose its CPU for longer than a phase, a park is
//! never undone before iokerneld saw it. The
//! thread echoes every ring; a parked kthread's ring is stolen from, the
//! reply leaving by the thief's egress ring, and the thief counts a steal
//! in its queue line as a runtime does, so iokerneld's stats report steals.
//!
//! The queue lines are played as a runtime writes them: a parked kthread
//! holds no core; one with an item queued for a pass makes the application
//! congested, and iokerneld grants it a core.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_net::{Interface, Ipv4Addr, MacAddr, Packet};
use ginza_policy::steer::SteeringKind;
use ginza_proto::messages::{AppStats, NetStats, SteeringStats};
use ginza_proto::{client, StatsReport};
use ginza_shm::LineFlags;

use crate::nic::ServiceTime;
use crate::raw_app::RawApp;
use crate::{
    Config, GeneratorHandle, Iokerneld, LoadReport, LoadRun, RecordingActuator, StopHandle,
};

/// One run of the harness.
#[derive(Clone, Debug)]
pub struct SteeringRun {
    pub policy: SteeringKind,
    /// Kthreads of the application (and cores iokerneld manages).
    pub kthreads: usize,
    /// Flows of the generator (source address and port pairs, up to
    /// `nic::generator::MAX_FLOWS`; docs in `nic/generator.rs`).
    pub flows: u32,
    /// Requests per second.
    pub rate: f64,
    /// How long the generator sends.
    pub sending: Duration,
    /// How long a kthread stays parked, and how long all hold a core
    /// between two parks (longer while iokerneld has not made the change).
    pub phase: Duration,
    /// `flow-affinity`'s table: flows it holds (iokerneld's
    /// `flow_table_capacity`).
    pub flow_table_capacity: usize,
    /// Whether kthreads park at all (without: the active set never
    /// changes after the start).
    pub parks: bool,
    pub seed: u64,
}

impl SteeringRun {
    /// 1,000 flows at 20,000 requests/s for 720 ms to 4 kthreads, phases of
    /// 60 ms (a flow's requests are 50 ms apart on average, so most flows
    /// send a packet in each phase).
    pub fn new(policy: SteeringKind) -> Self {
        SteeringRun {
            policy,
            kthreads: 4,
            flows: 1_000,
            rate: 20_000.0,
            sending: Duration::from_millis(720),
            phase: Duration::from_millis(60),
            flow_table_capacity: ginza_policy::steer::DEFAULT_FLOW_TABLE_CAPACITY,
            parks: true,
            seed: 11,
        }
    }
}

/// What one run measured.
#[derive(Debug)]
pub struct SteeringOutcome {
    /// The generator's report (replies, out-of-order replies, latency).
    pub report: LoadReport,
    /// iokerneld's totals for the policy (one application: its own).
    pub steering: SteeringStats,
    /// iokerneld's view of the application after the run.
    pub app: AppStats,
    pub net: NetStats,
    /// Datagrams the application echoed, and of those, taken from a parked
    /// kthread's ring.
    pub echoed: u64,
    pub stolen: u64,
    /// Datagrams received whose echo found the egress ring full (lost: on a
    /// loaded machine iokerneld may not drain it in time).
    pub unsent: u64,
    /// Times a kthread parked.
    pub parks: usize,
}

/// iokerneld on a thread, managing `cores` cores that need not exist.
struct Daemon {
    stop: StopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
    socket: PathBuf,
    generator: GeneratorHandle,
    dir: PathBuf,
}

impl Daemon {
    fn start(cores: usize, flow_table_capacity: usize) -> Result<Daemon, String> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ginza-steering-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        ));
        let socket = dir.join("iokerneld.sock");
        let cores: Vec<usize> = (0..cores).collect();
        let mut cfg = Config::new(cores.clone());
        cfg.socket = socket.clone();
        cfg.idle_sleep = Some(Duration::from_millis(1));
        cfg.steering_options.flow_table_capacity = flow_table_capacity;
        cfg.validate(&cores).map_err(|e| e.to_string())?;
        let d = Iokerneld::bind(cfg, RecordingActuator::new()).map_err(|e| e.to_string())?;
        let stop = d.stop_handle();
        let generator = d.generator();
        let thread = std::thread::spawn(move || {
            if let Err(e) = d.run() {
                log::error!("iokerneld of the steering harness: {e}");
            }
        });
        Ok(Daemon {
            stop,
            thread: Some(thread),
            socket,
            generator,
            dir,
        })
    }

    fn stats(&self) -> Result<StatsReport, String> {
        client::stats(&self.socket).map_err(|e| e.to_string())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The harness's side of the kthreads' queue lines.
struct Lines {
    /// Per kthread: items ever queued (the line's tail).
    queued: Vec<u32>,
}

impl Lines {
    /// Queues one item on `k` that is never taken: iokerneld sees the
    /// application congested and grants `k` a core if it has none.
    fn busy(&mut self, app: &RawApp, k: usize) {
        self.queued[k] += 1;
        let line = &app.ends[k].line;
        line.set_rq_tail(self.queued[k]);
        line.remove_flags(LineFlags::PARKED);
    }

    /// Takes `k`'s queued items: it keeps its core, but wants no more.
    fn settle(&self, app: &RawApp, k: usize) {
        app.ends[k].line.set_rq_head(self.queued[k]);
    }

    /// `k` parks: it gives its core back.
    fn park(&self, app: &mut RawApp, k: usize) {
        self.settle(app, k);
        app.ends[k].line.insert_flags(LineFlags::PARKED);
        app.report_parked(k);
    }
}

/// Echoes every UDP datagram waiting on any kthread's ring back to its
/// sender; a parked kthread's ring is stolen from by the next kthread,
/// whose egress ring the replies leave by and whose queue line counts the
/// steal (one per batch taken, as a runtime counts). Returns how many were
/// echoed, how many of those were stolen, and how many found no room.
fn echo(app: &mut RawApp, parked: Option<usize>) -> (u64, u64, u64) {
    let n = app.ends.len();
    let (mut echoed, mut stolen, mut unsent) = (0, 0, 0);
    for k in 0..n {
        let out = if parked == Some(k) { (k + 1) % n } else { k };
        let mut took = 0u64;
        while let Some((bytes, desc)) = app.recv(k) {
            took += 1;
            if let Ok(Packet::Udp(d)) = ginza_net::parse(&bytes, &app.interface) {
                let (mac, src, port) = (d.src_mac, d.src, d.dst.port);
                let payload = d.payload.to_vec();
                let sent = u64::from(app.send_udp(out, mac, src, port, &payload));
                echoed += sent;
                unsent += 1 - sent;
                if out != k {
                    stolen += sent;
                }
            }
            app.give_back(k, desc.buf);
        }
        if took > 0 && out != k {
            app.ends[out].line.add_steal();
        }
    }
    (echoed, stolen, unsent)
}

/// The application's side of a run, on a thread of its own: echoes every
/// request and, with `parks`, parks its kthreads in turn, one per `phase`
/// (each change waited for in iokerneld's stats before the next).
struct Driver {
    app: RawApp,
    lines: Lines,
    kthreads: usize,
    parks: bool,
    phase: Duration,
    /// The steering policy's code in iokerneld's stats.
    policy: u8,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    /// Set once the load is over: every kthread then gets its core back.
    load_over: Arc<AtomicBool>,
}

impl Driver {
    /// Until `stop`: what was echoed, stolen and left unsent, the parks,
    /// and the application.
    fn run(mut self) -> (u64, u64, u64, usize, RawApp) {
        let (mut echoed, mut stolen, mut unsent) = (0u64, 0u64, 0u64);
        let mut step = 0usize;
        let mut parked: Option<usize> = None;
        // iokerneld's count of changes of the active set (a failed look
        // gives 0: the park then counts as seen at once, as before).
        let changes = || {
            client::stats(&self.socket).ok().and_then(|s| {
                s.dataplane
                    .steering
                    .iter()
                    .find(|st| st.st == self.policy)
                    .map(|st| st.ch)
            })
        };
        // The change asked for and not seen made yet: a park (the count
        // of changes when it was asked for), or a core given back (`None`).
        let mut awaited: Option<Option<u64>> = None;
        let (mut phase_start, mut last_look) = (Instant::now(), Instant::now());
        while !self.stop.load(Ordering::Acquire) {
            let (e, s, u) = echo(&mut self.app, parked);
            echoed += e;
            stolen += s;
            unsent += u;
            if self.load_over.load(Ordering::Acquire) {
                // The load is over: every kthread gets its core back.
                if let Some(k) = parked.take() {
                    self.lines.busy(&self.app, k);
                }
                continue;
            }
            if !self.parks {
                continue;
            }
            if let Some(before) = awaited {
                // iokerneld's stats, at most once a millisecond, until they
                // show the change made.
                if last_look.elapsed() < Duration::from_millis(1) {
                    continue;
                }
                last_look = Instant::now();
                let made = client::stats(&self.socket).is_ok_and(|s| match before {
                    // The park seen: one more change of the active set
                    // (iokerneld may grant the core again at once, for
                    // requests on the kthread's ring).
                    Some(before) => s
                        .dataplane
                        .steering
                        .iter()
                        .any(|st| st.st == self.policy && st.ch > before),
                    // Every kthread holds a core again.
                    None => s
                        .apps
                        .first()
                        .is_some_and(|a| a.cores_now == self.kthreads as u32),
                });
                if made {
                    awaited = None;
                }
                continue;
            }
            if phase_start.elapsed() < self.phase {
                continue;
            }
            phase_start = Instant::now();
            match parked.take() {
                None => {
                    for k in 0..self.kthreads {
                        self.lines.settle(&self.app, k);
                    }
                    let k = step % self.kthreads;
                    let before = changes().unwrap_or(0);
                    self.lines.park(&mut self.app, k);
                    parked = Some(k);
                    step += 1;
                    awaited = Some(Some(before));
                }
                Some(k) => {
                    self.lines.busy(&self.app, k);
                    awaited = Some(None);
                }
            }
        }
        (echoed, stolen, unsent, step, self.app)
    }
}

/// Runs `run` on a fresh iokerneld.
pub fn run_steering(run: &SteeringRun) -> Result<SteeringOutcome, String> {
    if run.kthreads == 0 || !(run.rate.is_finite() && run.rate > 0.0) {
        return Err(format!(
            "kthreads {} and rate {} must be positive",
            run.kthreads, run.rate
        ));
    }
    let kthreads = run.kthreads;
    let d = Daemon::start(kthreads, run.flow_table_capacity)?;
    let me = Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0, 1]),
        ip: Ipv4Addr::new(10, 9, 0, 1),
    };
    let app = RawApp::register_steered(
        &d.socket,
        "steered",
        me,
        kthreads as u32,
        Some(run.policy.name()),
    )
    .map_err(|e| format!("registration: {e}"))?;
    let mut lines = Lines {
        queued: vec![0; kthreads],
    };
    // Every kthread gets a core before the load starts.
    for k in 0..kthreads {
        lines.busy(&app, k);
    }
    let t0 = Instant::now();
    while d
        .stats()?
        .apps
        .first()
        .is_none_or(|a| a.cores_now < kthreads as u32)
    {
        if t0.elapsed() > Duration::from_secs(5) {
            return Err(format!(
                "the application never held {kthreads} cores: {:#?}",
                d.stats()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for k in 0..kthreads {
        lines.settle(&app, k);
    }
    let (stop, load_over) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let driver = Driver {
        app,
        lines,
        kthreads,
        parks: run.parks && kthreads > 1,
        phase: run.phase,
        policy: run.policy.code(),
        socket: d.socket.clone(),
        stop: stop.clone(),
        load_over: load_over.clone(),
    };
    let driver = std::thread::spawn(move || driver.run());
    let mut load = LoadRun::poisson(
        me,
        7,
        run.rate,
        ServiceTime::Constant { ns: 0 },
        run.sending,
    );
    load.config.flows = run.flows;
    load.config.seed = run.seed;
    load.drain = Duration::from_millis(300);
    let report = d.generator.run(load, Duration::from_secs(10));
    load_over.store(true, Ordering::Release);
    if let Ok(report) = &report {
        // Requests still on the application's switch port (a burst moves
        // per turn of the loop) reach its rings while the thread echoes.
        let t0 = Instant::now();
        while !d.stats()?.apps.first().is_some_and(|a| {
            a.net
                .is_some_and(|n| n.rx + n.drop_ingress >= report.stats.sent)
        }) && t0.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Release);
    let (mut echoed, mut stolen, mut unsent, parks, mut app) = driver
        .join()
        .map_err(|_| "the echo thread panicked".to_string())?;
    // Replies the drain did not wait for: echoed so that the application's
    // counts add up (the generator's report is already taken).
    let (e, s, u) = echo(&mut app, None);
    echoed += e;
    stolen += s;
    unsent += u;
    let report = report.map_err(|e| format!("{e}: {:#?}", d.stats()))?;
    // The steals the last echo counted reach the stats at iokerneld's next
    // pass: wait for them (a pass is due within its interval).
    let steals_counted: u64 = app
        .ends
        .iter()
        .map(|e| u64::from(e.line.snapshot().steals))
        .sum();
    let t0 = Instant::now();
    let stats = loop {
        let stats = d.stats()?;
        let seen = stats.apps.first().map_or(0, |a| a.steals);
        if seen >= steals_counted || t0.elapsed() > Duration::from_secs(20) {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    drop(app);
    let app = stats
        .apps
        .first()
        .cloned()
        .ok_or("the application is gone from the stats")?;
    let net = app.net.ok_or("no net stats")?;
    let steering = stats
        .dataplane
        .steering
        .iter()
        .find(|s| s.st == run.policy.code())
        .copied()
        .ok_or_else(|| format!("no steering stats for {}: {stats:#?}", run.policy))?;
    Ok(SteeringOutcome {
        report,
        steering,
        app,
        net,
        echoed,
        stolen,
        unsent,
        parks,
    })
}
