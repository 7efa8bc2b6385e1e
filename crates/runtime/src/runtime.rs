//! Starting and stopping a runtime, and the handle to control a running one.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crate::config::{Config, Plan};
use crate::error::{JoinError, RuntimeError};
use crate::sched::{self, Shared};
use crate::task::{spawn_on, JoinHandle};

static OVERSUBSCRIPTION_SAID: AtomicBool = AtomicBool::new(false);

/// Starts a runtime (standalone mode: a fixed set of kthreads, no
/// iokerneld), runs `main` as its first uthread, and returns its value once
/// it finishes. uthreads still queued then are dropped.
pub fn run<F, T>(config: Config, main: F) -> Result<T, RuntimeError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let plan = config.plan()?;
    if plan.oversubscribed && !OVERSUBSCRIPTION_SAID.swap(true, Relaxed) {
        log::warn!(
            "{} kthreads on {} cores: Linux will multiplex them (fine for tests, not for latency)",
            plan.cores.len(),
            plan.cores
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
    }
    let shared = start(&plan, sched::Mode::Shenango, "ginza-k")?;
    // The caller's thread waits on the main uthread's handle like any joiner.
    let result = spawn_on(Arc::as_ptr(&shared.rt), main).join();
    shared.stop();
    result.map_err(|JoinError::Panicked { message, .. }| RuntimeError::MainPanicked(message))
}

/// A runtime's shared state and the threads of its kthreads.
pub(crate) struct Started {
    pub(crate) rt: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Installs the signal handlers, builds the shared state and starts one
/// pinned thread per kthread of `plan`, named `<name_prefix><id>`.
pub(crate) fn start(
    plan: &Plan,
    mode: sched::Mode,
    name_prefix: &str,
) -> Result<Started, RuntimeError> {
    crate::signals::install()
        .map_err(|e| RuntimeError::Start(format!("cannot install signal handlers: {e}")))?;
    let rt = Shared::new(plan, mode)
        .map_err(|e| RuntimeError::Start(format!("cannot create kthread eventfds: {e}")))?;
    let mut started = Started {
        rt,
        threads: Vec::with_capacity(plan.cores.len()),
    };
    for id in 0..plan.cores.len() {
        let rt = Arc::clone(&started.rt);
        match std::thread::Builder::new()
            .name(format!("{name_prefix}{id}"))
            .spawn(move || sched::kthread_main(rt, id))
        {
            Ok(t) => started.threads.push(t),
            Err(e) => {
                started.stop();
                return Err(RuntimeError::Start(format!(
                    "cannot start kthread {id}: {e}"
                )));
            }
        }
    }
    Ok(started)
}

impl Started {
    /// Stops every kthread (each finishes the uthread it runs, if any) and
    /// frees what is still queued.
    pub(crate) fn stop(self) {
        self.rt.wake_all_for_shutdown();
        for t in self.threads {
            let _ = t.join();
        }
        self.rt.drain_after_shutdown();
    }
}

/// Controls a running runtime from inside it or from another thread.
#[derive(Clone)]
pub struct Handle {
    rt: Arc<Shared>,
}

/// One kthread's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KthreadStats {
    pub id: usize,
    pub core: usize,
    /// "running", "spinning", "parked" or "revoked".
    pub state: &'static str,
    pub preemptions: u64,
    pub steals: u64,
    pub parks: u64,
    pub revocations: u64,
}

impl Handle {
    /// The runtime of the calling uthread.
    pub fn current() -> Option<Handle> {
        let rt = sched::current_runtime()?;
        // SAFETY: a kthread's runtime is alive while the kthread runs.
        unsafe { (*rt).arc() }.map(|rt| Handle { rt })
    }

    pub fn kthreads(&self) -> usize {
        self.rt.kthreads.len()
    }

    /// Spawns a uthread from any thread.
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        spawn_on(Arc::as_ptr(&self.rt), f)
    }

    /// Takes kthread `id`'s core away, as iokerneld does to a bursting
    /// application: a preemption signal makes the kthread save its running
    /// uthread where other kthreads steal it, and park until [`Handle::grant`].
    pub fn revoke(&self, id: usize) -> std::io::Result<()> {
        self.check(id)?;
        sched::revoke(&self.rt, id)
    }

    /// Gives kthread `id` its core back.
    pub fn grant(&self, id: usize) -> std::io::Result<()> {
        self.check(id)?;
        sched::grant(&self.rt, id);
        Ok(())
    }

    fn check(&self, id: usize) -> std::io::Result<()> {
        if id >= self.rt.kthreads.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "no kthread {id}: this runtime has {}",
                    self.rt.kthreads.len()
                ),
            ));
        }
        if self.rt.shutdown.load(Relaxed) {
            return Err(std::io::Error::other("the runtime has shut down"));
        }
        Ok(())
    }

    pub fn stats(&self) -> Vec<KthreadStats> {
        self.rt
            .kthreads
            .iter()
            .map(|k| KthreadStats {
                id: k.id,
                core: k.core,
                state: sched::kthread_state_name(&self.rt, k.id),
                preemptions: k.stats.preemptions.load(Relaxed),
                steals: k.stats.steals.load(Relaxed),
                parks: k.stats.parks.load(Relaxed),
                revocations: k.stats.revocations.load(Relaxed),
            })
            .collect()
    }
}
