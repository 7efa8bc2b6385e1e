//! Ginza's batch application as a process of its own, as it is deployed
//! (the `batch` binary beside a server): `ginza bench batch-role`, started
//! by the bench, registers with the bench's iokerneld as a batch
//! application and prices until its stdin closes. Each line the bench
//! writes on its stdin is answered with the paths done so far; at the end
//! it writes the price it computed (a check that the work was real).
//!
//! Why not a thread of the bench: a batch runtime inside the bench's
//! process, beside the in-process iokerneld, kv-server's runtime and the
//! generator, did 2.5× less work per CPU-second than the same loop on a
//! Linux thread on a quiet machine, a loss no deployment has
//! (docs/results.md, "Session 18: batch's work per CPU-second").

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use ginza_iokernel::InProcess;
use ginza_runtime::{Class, Config, IokernelConfig};
use ginza_sys::task_group::IdleGroup;

use crate::harness::linux_batch::BATCH_CGROUP;

/// The child's flags (`ginza bench batch-role --help`).
#[derive(clap::Args, Debug)]
pub struct BatchRoleArgs {
    /// iokerneld's control socket.
    #[arg(long)]
    socket: PathBuf,
    /// The application's name at iokerneld.
    #[arg(long, default_value = "batch")]
    name: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Keep granted cores while idle (`IokernelConfig::keep_cores_when_idle`).
    #[arg(long)]
    keep_cores_when_idle: bool,
}

/// The child's body: prices under iokerneld until stdin closes, answering
/// each line read with the paths done so far, then prints `price P`.
pub fn batch_role_main(args: BatchRoleArgs) -> anyhow::Result<()> {
    let mut io = IokernelConfig::new(args.name.clone(), Class::Batch);
    io.socket = Some(args.socket.clone());
    io.keep_cores_when_idle = args.keep_cores_when_idle;
    let config = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(1)
    };
    let paths = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (p, s, seed) = (paths.clone(), stop.clone(), args.seed);
    let runtime = std::thread::Builder::new()
        .name("batch-runtime".into())
        .spawn(move || {
            ginza_runtime::run(config, move || {
                ginza_apps::batch::price_until_stopped(1, p, s, seed)
            })
        })
        .context("starting the runtime's thread")?;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        line.context("reading stdin")?;
        writeln!(out, "{}", paths.load(Relaxed))?;
        out.flush()?;
    }
    stop.store(true, Relaxed);
    let price = runtime
        .join()
        .map_err(|_| anyhow!("{}: the runtime's thread panicked", args.name))?
        .with_context(|| format!("{}: running the runtime", args.name))?;
    writeln!(out, "price {price}")?;
    out.flush()?;
    Ok(())
}

/// The pipes to a running child.
struct Pipes {
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
}

/// A batch child of the bench; killed on drop if still running.
pub(super) struct BatchProcess {
    name: String,
    pid: i32,
    child: Mutex<Child>,
    pipes: Mutex<Pipes>,
}

impl BatchProcess {
    /// Starts `ginza bench batch-role` (this executable) on `iokerneld`
    /// and returns once iokerneld lists it as `name`.
    pub(super) fn start(
        iokerneld: &InProcess,
        name: &str,
        seed: u64,
        keep_cores_when_idle: bool,
    ) -> anyhow::Result<Arc<BatchProcess>> {
        let exe = std::env::current_exe().context("locating this executable")?;
        let mut cmd = command(&exe, iokerneld.socket(), name, seed);
        if keep_cores_when_idle {
            cmd.arg("--keep-cores-when-idle");
        }
        // As Linux's batch thread (`linux_batch::BATCH_CGROUP`); said once
        // where it cannot be.
        if let Err(e) = IdleGroup::open(BATCH_CGROUP).and_then(|g| g.start_child_in(&mut cmd)) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| eprintln!("warning: batch stays in the bench's task group ({e})"));
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {} bench batch-role", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("the batch child's pipes were not set up");
        };
        let batch = Arc::new(BatchProcess {
            name: name.to_string(),
            pid: child.id() as i32,
            child: Mutex::new(child),
            pipes: Mutex::new(Pipes {
                stdin: Some(stdin),
                stdout: Some(BufReader::new(stdout)),
            }),
        });
        batch.wait_registered(iokerneld)?;
        Ok(batch)
    }

    fn wait_registered(&self, iokerneld: &InProcess) -> anyhow::Result<()> {
        let t0 = Instant::now();
        while !iokerneld
            .stats()
            .is_ok_and(|s| s.apps.iter().any(|a| a.name == self.name))
        {
            if let Some(status) = self.lock_child().try_wait()? {
                anyhow::bail!("{} exited ({status}) before it registered", self.name);
            }
            anyhow::ensure!(
                t0.elapsed() < super::START_TIMEOUT,
                "{} did not register with iokerneld within {:?}",
                self.name,
                super::START_TIMEOUT
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// The child's process id (its kthreads' CPU time is read from /proc).
    pub(super) fn pid(&self) -> i32 {
        self.pid
    }

    /// The paths the child has done so far.
    pub(super) fn paths(&self) -> anyhow::Result<u64> {
        let mut pipes = self.lock_pipes();
        let Pipes {
            stdin: Some(stdin),
            stdout: Some(stdout),
        } = &mut *pipes
        else {
            anyhow::bail!("{} was stopped already", self.name);
        };
        writeln!(stdin)
            .and_then(|()| stdin.flush())
            .with_context(|| format!("asking {} for its count (it may have exited)", self.name))?;
        let line = read_line(stdout, &self.name)?;
        line.trim()
            .parse()
            .with_context(|| format!("{} answered {line:?}, not a count of paths", self.name))
    }

    /// Stops it (closes its stdin) and waits up to `START_TIMEOUT` for its
    /// price: 0 if it did no path.
    pub(super) fn finish(&self) -> anyhow::Result<f64> {
        let mut pipes = self.lock_pipes();
        drop(pipes.stdin.take());
        let mut stdout = pipes
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{} was stopped already", self.name))?;
        drop(pipes);
        let (tx, rx) = std::sync::mpsc::channel();
        let name = self.name.clone();
        // Read on a thread of its own so that a child that never answers
        // is killed at the deadline instead of hanging the bench.
        std::thread::spawn(move || {
            let _ = tx.send(read_line(&mut stdout, &name));
        });
        let line = match rx.recv_timeout(super::START_TIMEOUT) {
            Ok(line) => line?,
            Err(_) => {
                self.kill();
                anyhow::bail!(
                    "{} did not stop within {:?} of its stop",
                    self.name,
                    super::START_TIMEOUT
                );
            }
        };
        let status = self.lock_child().wait()?;
        anyhow::ensure!(status.success(), "{} exited with {status}", self.name);
        line.trim()
            .strip_prefix("price ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| anyhow!("{} ended with {line:?}, not its price", self.name))
    }

    fn kill(&self) {
        let mut child = self.lock_child();
        let _ = child.kill();
        let _ = child.wait();
    }

    fn lock_child(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_pipes(&self) -> std::sync::MutexGuard<'_, Pipes> {
        self.pipes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for BatchProcess {
    fn drop(&mut self) {
        if matches!(self.lock_child().try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// `EXE bench batch-role …`: its stdin and stdout piped to the bench, its
/// warnings on the bench's stderr.
fn command(exe: &Path, socket: &Path, name: &str, seed: u64) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "batch-role", "--socket"])
        .arg(socket)
        .args(["--name", name, "--seed", &seed.to_string()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// One line from the child; an error if it closed its stdout first.
fn read_line(stdout: &mut BufReader<ChildStdout>, name: &str) -> anyhow::Result<String> {
    let mut line = String::new();
    let n = stdout
        .read_line(&mut line)
        .with_context(|| format!("reading {name}'s answer"))?;
    anyhow::ensure!(n > 0, "{name} closed its stdout (it exited)");
    Ok(line)
}
