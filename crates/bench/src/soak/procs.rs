//! The soak's children, watched: started by role, killed when the schedule
//! says (an asked death), reaped without being asked (a crash, with its
//! status and the end of its stderr), and sampled from /proc (resident
//! memory, open descriptors).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use serde::Serialize;

use super::roles::Launcher;

/// Of a crashed child's stderr, the end kept for the report.
const STDERR_TAIL: u64 = 2048;

/// One role's process, restarted as the soak asks.
pub(crate) struct Proc {
    pub(crate) name: String,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
    pub(crate) starts: u32,
    pub(crate) kills: u32,
}

/// A child that died unasked.
#[derive(Serialize, Debug, Clone)]
pub struct Crash {
    pub process: String,
    pub at_s: f64,
    pub status: String,
    pub stderr_tail: String,
}

/// One reading of a process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) rss_kib: u64,
    /// `None` where /proc/PID/fd cannot be read (the netstack makes itself
    /// non-dumpable; without CAP_SYS_PTRACE even root may not list it).
    pub(crate) fds: Option<u64>,
}

impl Proc {
    /// A role not yet started; its stderr goes to `dir/NAME.log`.
    pub(crate) fn new(name: &str, args: Vec<String>, dir: &std::path::Path) -> Proc {
        Proc {
            name: name.to_string(),
            args,
            child: None,
            log: dir.join(format!("{name}.log")),
            starts: 0,
            kills: 0,
        }
    }

    pub(crate) fn start(&mut self, launcher: &Launcher) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "{} is running already", self.name);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = launcher
            .command(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} ({:?})", self.name, launcher.program))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL and reap (an asked death).
    pub(crate) fn kill(&mut self) -> anyhow::Result<()> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow!("{} is not running", self.name))?;
        let _ = child.kill();
        child
            .wait()
            .with_context(|| format!("reaping {}", self.name))?;
        self.kills += 1;
        Ok(())
    }

    /// Its exit status, if it has exited (reaped then).
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    /// Waits up to `limit` for it to exit by itself.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if self.child.is_none() || Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The crash record of an exit nobody asked for.
    pub(crate) fn crash(&self, status: ExitStatus, at_s: f64) -> Crash {
        Crash {
            process: self.name.clone(),
            at_s,
            status: status.to_string(),
            stderr_tail: tail(&self.log),
        }
    }

    /// Each thread's stack, by gdb if it is installed, into `path` (for a
    /// process that hangs); whether it was written.
    pub(crate) fn dump_stacks(&self, path: &std::path::Path) -> bool {
        let Some(pid) = self.pid() else { return false };
        let out = std::process::Command::new("gdb")
            .args([
                "-p",
                &pid.to_string(),
                "-batch",
                "-ex",
                "thread apply all bt",
            ])
            .stdin(Stdio::null())
            .output();
        out.is_ok_and(|o| std::fs::write(path, [o.stdout, o.stderr].concat()).is_ok())
    }
}

/// Resident memory and open descriptors of `pid`, from /proc.
pub(crate) fn sample_pid(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.count() as u64);
    Some(Sample {
        at: Instant::now(),
        rss_kib,
        fds,
    })
}

/// The end of a log file, lossily.
fn tail(path: &std::path::Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(STDERR_TAIL)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reads every process it is told of from /proc each `every`, on a thread
/// of its own (so that a blocked main loop does not leave holes).
pub(crate) struct Sampler {
    pids: Arc<Mutex<BTreeMap<String, u32>>>,
    samples: Arc<Mutex<BTreeMap<String, Vec<Sample>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    pub(crate) fn start(every: Duration) -> Sampler {
        let pids: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let samples: Arc<Mutex<BTreeMap<String, Vec<Sample>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s, st) = (pids.clone(), samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now();
            while !st.load(Relaxed) {
                let now: Vec<(String, u32)> = p
                    .lock()
                    .expect("no panics while held")
                    .iter()
                    .map(|(n, pid)| (n.clone(), *pid))
                    .collect();
                for (name, pid) in now {
                    if let Some(sample) = sample_pid(pid) {
                        let mut all = s.lock().expect("no panics while held");
                        all.entry(name).or_default().push(sample);
                    }
                }
                next += every;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        Sampler {
            pids,
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// `name` runs as `pid` from now on (`None`: not running).
    pub(crate) fn set(&self, name: &str, pid: Option<u32>) {
        let mut pids = self.pids.lock().expect("no panics while held");
        match pid {
            Some(pid) => pids.insert(name.to_string(), pid),
            None => pids.remove(name),
        };
    }

    /// Stops and gives every sample taken, by process.
    pub(crate) fn finish(mut self) -> BTreeMap<String, Vec<Sample>> {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().expect("no panics while held"))
    }
}
