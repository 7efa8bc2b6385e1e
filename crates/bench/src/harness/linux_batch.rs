//! Linux's batch peer: the pricing loop of Ginza's batch application on a
//! thread at SCHED_IDLE, and setting a thread's policy with `chrt`.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context as _;
use ginza_sys::task_group::IdleGroup;

/// Sets thread `tid`'s scheduling policy and priority with `chrt`; false
/// if it failed.
pub(crate) fn set_policy(tid: i32, (policy, priority): (&str, &str)) -> bool {
    Command::new("chrt")
        .args([policy, "-p", priority, &tid.to_string()])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The Linux batch thread's name (for its CPU time, `cpu_split.rs`).
pub(crate) const LINUX_BATCH_THREAD: &str = "linux-batch";

/// The Linux batch thread's loop: chunks of `batch::PATHS_PER_CHUNK`
/// paths, nothing between them, until `stop`; paths done are added to
/// `paths` as chunks complete. Returns the price (a check that the work
/// was real).
pub(crate) fn price_chunks(seed: u64, paths: &AtomicU64, stop: &AtomicBool) -> f64 {
    use ginza_apps::batch::{payoff_sum, price, PATHS_PER_CHUNK};
    use rand::SeedableRng as _;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let (mut sum, mut n) = (0.0, 0u64);
    while !stop.load(Relaxed) {
        sum += std::hint::black_box(payoff_sum(&mut rng, PATHS_PER_CHUNK));
        n += PATHS_PER_CHUNK;
        paths.fetch_add(PATHS_PER_CHUNK, Relaxed);
    }
    price(sum, n)
}

/// The idle cgroup both systems' batch goes into where it can
/// (`ginza_sys::task_group::IdleGroup`): Linux's best users run batch so,
/// and in the bench's own task group an always-runnable batch thread
/// beside the busy generator or iokerneld starves the kernel's threads on
/// the server CPU (docs/runtime.md, "Task groups").
pub(crate) const BATCH_CGROUP: &str = "ginza-batch";

/// Linux's batch: the same pricing loop on a thread pinned to `cpu` at
/// SCHED_IDLE (nice 19 when that cannot be set), in the idle cgroup
/// [`BATCH_CGROUP`] where there is one; says which it got.
pub(crate) fn linux_batch(
    cpu: usize,
    paths: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> anyhow::Result<(std::thread::JoinHandle<f64>, String)> {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(LINUX_BATCH_THREAD.into())
        .spawn(move || {
            let pinned = ginza_sys::affinity::pin_current_thread(cpu);
            let _ = tid_tx.send(pinned.map(|()| ginza_sys::process::gettid()));
            price_chunks(seed, &paths, &stop)
        })
        .context("starting the batch thread")?;
    let tid = tid_rx
        .recv()
        .context("the batch thread")?
        .with_context(|| format!("pinning the batch thread to CPU {cpu}"))?;
    let grouped = IdleGroup::open(BATCH_CGROUP)
        .and_then(|group| group.add_thread(tid))
        .is_ok();
    let in_group = if grouped { " in an idle cgroup" } else { "" };
    if set_policy(tid, ("--idle", "0")) {
        return Ok((thread, format!("SCHED_IDLE{in_group}")));
    }
    let niced = Command::new("renice")
        .args(["-n", "19", "-p", &tid.to_string()])
        .output()
        .is_ok_and(|o| o.status.success());
    anyhow::ensure!(
        niced,
        "neither SCHED_IDLE (chrt) nor nice 19 (renice) could be set on the batch thread"
    );
    Ok((thread, format!("nice 19{in_group}")))
}
