//! The one way the benchmarks and the demo start iokerneld: on a thread of
//! this process ([`Iokerneld`]), or with grants only recorded
//! ([`Recording`]); and the layouts they use (an application CPU beside
//! iokerneld's, a veth's host end tried with AF_XDP, then AF_PACKET).

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::anyhow;
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::{
    Config as IokConfig, DaemonError, InProcess, Iokerneld as Loop, RecordingActuator, StopHandle,
};
use ginza_proto::StatsReport;

/// iokerneld's CPU and the application's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cpus {
    pub(crate) iokernel: usize,
    pub(crate) app: usize,
}

/// A fresh directory name for iokerneld's socket in the temp dir (unix
/// socket paths are limited to 107 bytes, so not under an output dir):
/// `ginza-TAG-PID-N`, unique within this process.
pub(crate) fn socket_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "ginza-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// iokerneld on a thread of this process; stopped and joined on drop (and
/// the directory it was given then removed), on every path. It derefs to
/// the running [`InProcess`] (socket, stats, generator, faults).
pub(crate) struct Iokerneld {
    /// `None` only once [`Iokerneld::stop`] or drop took it.
    running: Option<InProcess>,
    dir: Option<PathBuf>,
}

impl Iokerneld {
    /// Binds `cfg.socket` and starts the loop (pinned to `cfg.own_core`).
    /// `cfg` must be validated.
    pub(crate) fn start(cfg: IokConfig) -> Result<Iokerneld, DaemonError> {
        Ok(Iokerneld {
            running: Some(InProcess::start(cfg)?),
            dir: None,
        })
    }

    /// Removes `dir` (its socket's directory) once it has stopped.
    pub(crate) fn removing(mut self, dir: PathBuf) -> Iokerneld {
        self.dir = Some(dir);
        self
    }

    /// The directory of its socket (for other sockets beside it).
    pub(crate) fn dir(&self) -> &Path {
        self.socket().parent().unwrap_or(Path::new("."))
    }

    /// Stops the loop; its final stats, or why it failed.
    pub(crate) fn stop(mut self) -> Result<StatsReport, DaemonError> {
        let running = self.running.take().expect("taken only by stop and drop");
        running.stop()
    }
}

impl Deref for Iokerneld {
    type Target = InProcess;

    fn deref(&self) -> &InProcess {
        self.running.as_ref().expect("taken only by stop and drop")
    }
}

impl Drop for Iokerneld {
    fn drop(&mut self) {
        drop(self.running.take());
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// iokerneld on `nic` ("" for none) managing the application's CPU, its
/// loop on its own; `configure` adjusts the configuration (allocation
/// policy, faults) before it starts. Its socket's directory is its own.
pub(crate) fn start_on(
    nic: &str,
    cpus: Cpus,
    configure: impl FnOnce(&mut IokConfig) -> anyhow::Result<()>,
) -> anyhow::Result<Iokerneld> {
    let dir = socket_dir("bench-iokerneld");
    let mut cfg = if nic.is_empty() {
        let mut cfg = IokConfig::new(vec![cpus.iokernel, cpus.app]);
        cfg.idle_sleep = Some(Duration::from_millis(1));
        cfg
    } else {
        let mut cfg = IokConfig::new(vec![cpus.app]);
        cfg.own_core = Some(cpus.iokernel);
        cfg.nic = nic.to_string();
        cfg
    };
    cfg.socket = dir.join("iokerneld.sock");
    configure(&mut cfg)?;
    let iokerneld = Iokerneld::start(cfg).map_err(|e| anyhow!("iokerneld on {nic:?}: {e}"))?;
    Ok(iokerneld.removing(dir))
}

/// iokerneld's fault injection (`--faults RULE`).
pub(crate) fn set_faults(cfg: &mut IokConfig, faults: &str) -> anyhow::Result<()> {
    let rule = faults
        .parse()
        .map_err(|e| anyhow!("the fault rule {faults:?}: {e}"))?;
    cfg.faults = vec![rule];
    Ok(())
}

/// The NIC backends tried on a veth's host end, best first.
pub(crate) const VETH_BACKENDS: [&str; 2] = ["af_xdp", "af_packet"];

/// iokerneld on the veth's host end (AF_XDP, else AF_PACKET), its
/// configuration adjusted by `configure`; `run` runs while it serves, given
/// the backend that opened. Returns that backend and what `run` returned.
pub(crate) fn with_iokerneld_on_veth<R>(
    ns: &NetNs,
    cpus: Cpus,
    configure: impl Fn(&mut IokConfig) -> anyhow::Result<()>,
    run: impl FnOnce(&InProcess, &str) -> anyhow::Result<R>,
) -> anyhow::Result<(String, R)> {
    let mut failures = Vec::new();
    for backend in VETH_BACKENDS {
        let nic = format!("{backend}:{}", ns.host_if);
        let iokerneld = match start_on(&nic, cpus, &configure) {
            Ok(d) => d,
            Err(e) => {
                failures.push(format!("{e:#}"));
                continue;
            }
        };
        let result = run(&iokerneld, backend);
        drop(iokerneld);
        return Ok((backend.to_string(), result?));
    }
    Err(anyhow!("no NIC backend opened: {}", failures.join("; ")))
}

/// iokerneld whose grants and revocations are recorded, never carried out,
/// its loop on a thread pinned to `cpu` (iokerneld's CPU may then also be a
/// managed one: nothing is granted for real). Stopped and joined, and its
/// socket's directory removed, on drop.
pub(crate) struct Recording {
    stop: StopHandle,
    thread: Option<JoinHandle<Result<(), DaemonError>>>,
    dir: PathBuf,
}

impl Recording {
    /// Binds `cfg.socket` (in `dir`, removed on drop) and starts the loop.
    pub(crate) fn start(cfg: IokConfig, cpu: usize, dir: PathBuf) -> anyhow::Result<Recording> {
        let daemon = Loop::bind(cfg, RecordingActuator::new())?;
        let stop = daemon.stop_handle();
        let thread = std::thread::Builder::new()
            .name("iokerneld-recording".into())
            .spawn(move || {
                let _ = ginza_sys::affinity::pin_current_thread(cpu);
                daemon.run().map(drop)
            })
            .expect("a thread can be spawned");
        Ok(Recording {
            stop,
            thread: Some(thread),
            dir,
        })
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
