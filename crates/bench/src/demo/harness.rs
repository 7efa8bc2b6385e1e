//! The process harness of one demo point: iokerneld with the point's
//! policy, then `lc` (spin-server) and `batch` on it, registered and
//! holding their guarantees; stopping them in order, and on every path.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use ginza_apps::request_trace::RequestTrace;
use ginza_apps::spin_server::{self, SpinStats};
use ginza_iokernel::{Config as IokConfig, DaemonError, GENERATOR_IP, GENERATOR_MAC};
use ginza_net::{Ipv4Addr, MacAddr};
use ginza_proto::{client, StatsReport};
use ginza_runtime::net::NetConfig;
use ginza_runtime::{Class, Config as RtConfig, IokernelConfig};
use ginza_sys::cpulist;

use super::args::{Policy, Workload, INTERVAL};
use super::sample::app_cores;
use crate::harness::app::{app_config as registered, App};
use crate::harness::iokerneld::Iokerneld;

/// How long an application may take to register with iokerneld.
pub(super) const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// The latency-critical server's addresses, and the generator's IP.
pub(super) const LC_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x01, 0x01]);

pub(super) const LC_IP: Ipv4Addr = Ipv4Addr::new(10, 47, 1, 1);

pub(super) const LC_PORT: u16 = 7;

/// What the whole run uses.
pub(crate) struct Setup {
    pub(super) allowed: Vec<usize>,
    pub(super) managed: Vec<usize>,
    pub(super) iokernel_core: usize,
    pub(super) sockets: TempDir,
    pub(super) warmup: Duration,
    pub(super) duration: Duration,
    pub(super) seed: u64,
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
    pub(super) fn classic() -> Tuning {
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
pub(super) struct TempDir(PathBuf);

impl TempDir {
    pub(super) fn new() -> anyhow::Result<TempDir> {
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

/// Requests whose stamps one point keeps (docs/results.md, "Where a
/// request's time goes"): 56 bytes each; enough for 0.7 s of 300,000
/// requests/s, the warm-up included (more are counted, not traced).
const TRACE_CAPACITY: usize = 1 << 18;

/// The flags and counters shared with the applications of one point.
#[derive(Clone, Default)]
pub(super) struct PointFlags {
    pub(super) stop_lc: Arc<AtomicBool>,
    pub(super) spin: Arc<SpinStats>,
    pub(super) stop_batch: Arc<AtomicBool>,
    pub(super) batch_paths: Arc<AtomicU64>,
}

/// Everything one point started. Dropping it stops it all, whatever state
/// it is in: flags first (applications return by themselves), then, for
/// any that does not, iokerneld (the runtimes go on standalone and return).
pub(super) struct PointRun {
    pub(super) shared: PointFlags,
    pub(super) lc: Option<App<std::io::Result<()>>>,
    pub(super) batch: Option<App<f64>>,
    /// iokerneld; `None` once stopped.
    pub(super) daemon: Option<Iokerneld>,
    pub(super) socket: PathBuf,
}

/// How long a stopping application is given before iokerneld is stopped
/// under it, and then again before it is abandoned.
pub(super) const STOP_WAIT: Duration = Duration::from_secs(3);

impl PointRun {
    pub(super) fn stats(&self) -> anyhow::Result<StatsReport> {
        client::stats(&self.socket)
            .with_context(|| format!("asking iokerneld at {}", self.socket.display()))
    }

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
            match self.stats() {
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
    pub(super) fn stop_lc(&mut self) -> anyhow::Result<()> {
        self.shared.stop_lc.store(true, Relaxed);
        let lc = self.lc.as_mut().context("lc was started")?;
        if !lc.wait_until(Instant::now() + STOP_WAIT) {
            stop(&mut self.daemon);
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
            stop(&mut self.daemon);
            if !self.apps_done(Instant::now() + STOP_WAIT) {
                log::error!("an application of the demo did not stop; leaving it behind");
            }
        }
    }
}

/// Stops iokerneld (idempotent); the loop's error, if it failed.
fn stop(daemon: &mut Option<Iokerneld>) -> Option<DaemonError> {
    daemon.take().and_then(|d| d.stop().err())
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
    let mut cfg = registered(socket, name, class, n);
    if let Some(io) = cfg.iokernel.as_mut() {
        io.guaranteed = guaranteed;
        io.keep_cores_when_idle = keep;
    }
    cfg
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

/// iokerneld, `lc` and `batch` of one point, started and registered.
pub(super) struct Started {
    pub(super) run: PointRun,
    pub(super) generator: ginza_iokernel::GeneratorHandle,
    pub(super) socket: PathBuf,
    /// The arrivals' seed: the same for every policy at a given load.
    pub(super) seed: u64,
}

/// Starts one point: iokerneld with `policy`, then `lc`, then `batch`.
pub(super) fn start_point(
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
    // Spinning (`--spin`): a sleep while idle would add iokerneld's own
    // wake-up to the first grant after a quiet spell, which the Linux
    // schedulers it is compared with do not pay (docs/iokernel-idle.md).
    cfg.spin = true;
    cfg.idle_sleep = None;
    cfg.seed = setup.seed;
    cfg.handover_from_idle_at_once = setup.tuning.handover_at_once;
    cfg.idle_victim_grace = setup.tuning.idle_victim_grace;
    cfg.local_wake_wait = setup.tuning.local_wake;
    cfg.validate(&setup.allowed)
        .context("iokerneld's configuration")?;
    let daemon = Iokerneld::start(cfg).context("starting iokerneld")?;
    let generator = daemon.generator().clone();
    let shared = PointFlags {
        spin: Arc::new(SpinStats {
            trace: RequestTrace::with_capacity(TRACE_CAPACITY),
            ..SpinStats::default()
        }),
        ..PointFlags::default()
    };
    let mut run = PointRun {
        shared: shared.clone(),
        lc: None,
        batch: None,
        daemon: Some(daemon),
        socket: socket.clone(),
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
    run.lc = Some(App::spawn("lc", lc_cfg, move || {
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
    run.batch = Some(App::spawn("batch", batch_cfg, move || {
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
    pub(super) fn stop_all(&mut self) -> anyhow::Result<()> {
        self.stop_lc()?;
        self.stop_batch_and_daemon()
    }

    /// With `lc` stopped: waits until `batch` holds all `n` managed cores,
    /// then counts its paths for [`BATCH_ALONE`]; paths per second, or
    /// `None` if batch did not get the cores back in time (a `SCHED_IDLE`
    /// kthread answers its last preemption only when it gets to run: on a
    /// CPU another process keeps busy, that can take seconds).
    pub(super) fn batch_alone(&mut self, n: usize) -> anyhow::Result<Option<f64>> {
        let t0 = Instant::now();
        loop {
            if self.batch.as_mut().and_then(App::returned).is_some() {
                bail!("batch returned before it was stopped");
            }
            if app_cores(&self.stats()?, "batch") as usize >= n {
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
    pub(super) fn stop_batch_and_daemon(&mut self) -> anyhow::Result<()> {
        self.shared.stop_batch.store(true, Relaxed);
        let batch = self.batch.as_mut().context("batch was started")?;
        if !batch.wait_until(Instant::now() + STOP_WAIT) {
            stop(&mut self.daemon);
            if !batch.wait_until(Instant::now() + STOP_WAIT) {
                bail!("batch did not stop");
            }
        }
        let price = batch.take()?;
        log::debug!("batch priced the call at {price:.4} (Black-Scholes: 8.0214)");
        if let Some(e) = stop(&mut self.daemon) {
            return Err(anyhow!(e).context("iokerneld failed during the point"));
        }
        Ok(())
    }
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
}
