//! Starting and stopping a runtime, and the handle to control a running one.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
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
    let managed = config.iokernel.is_some();
    if plan.oversubscribed && !managed && !OVERSUBSCRIPTION_SAID.swap(true, Relaxed) {
        log::warn!(
            "{} kthreads on {} cores: Linux will multiplex them (fine for tests, not for latency)",
            plan.cores.len(),
            plan.cores
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
    }
    let shared = start(
        &plan,
        sched::Mode::Shenango,
        "ginza-k",
        config.iokernel.as_ref(),
        Arc::new(crate::shenango::scheduler_loop),
    )?;
    if let Some(p) = &config.protected {
        // Before the main uthread: its first socket finds the attachment.
        if let Err(e) = crate::net::protected::attach(&shared.rt, p) {
            shared.stop();
            return Err(RuntimeError::Netstack(e));
        }
    }
    if let Some(period) = config.time_slice {
        crate::slicer::start(Arc::clone(&shared.rt), period);
    }
    // The caller's thread waits on the main uthread's handle like any joiner.
    let result = spawn_on(Arc::as_ptr(&shared.rt), main).join();
    crate::net::linger_at_exit(&shared.rt);
    shared.stop();
    result.map_err(|JoinError::Panicked { message, .. }| RuntimeError::MainPanicked(message))
}

/// A runtime's shared state and the threads of its kthreads.
pub(crate) struct Started {
    pub(crate) rt: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Notices when iokerneld goes away (managed runtimes only).
    watcher: Option<std::thread::JoinHandle<()>>,
    /// Written by [`Started::stop`] to end the watcher's wait.
    watch_stop: Option<OwnedFd>,
}

/// Installs the signal handlers, builds the shared state and starts one
/// thread per kthread of `plan`, named `<name_prefix><id>`: pinned in
/// standalone mode, registered with iokerneld (and pinned by its grants)
/// when `iokernel` is given.
pub(crate) fn start(
    plan: &Plan,
    mode: sched::Mode,
    name_prefix: &str,
    iokernel: Option<&crate::config::IokernelConfig>,
    body: sched::KthreadBody,
) -> Result<Started, RuntimeError> {
    crate::preempt::install()
        .map_err(|e| RuntimeError::Start(format!("cannot install signal handlers: {e}")))?;
    let rt = Shared::new(plan, mode, iokernel).map_err(RuntimeError::Start)?;
    let body: sched::KthreadBody = Arc::new(move |owner: &mut sched::Owner<'_>| {
        crate::iokernel::wait_for_first_grant(owner);
        body(owner)
    });
    let mut started = Started {
        rt,
        threads: Vec::with_capacity(plan.cores.len()),
        watcher: None,
        watch_stop: None,
    };
    for id in 0..plan.cores.len() {
        let rt = Arc::clone(&started.rt);
        let body = body.clone();
        match std::thread::Builder::new()
            .name(format!("{name_prefix}{id}"))
            .spawn(move || sched::kthread_main(rt, id, body))
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
    if started.rt.link.is_some() {
        if let Err(e) = started.register() {
            started.stop();
            return Err(e);
        }
    }
    Ok(started)
}

/// The longest a managed runtime's watcher waits between two looks at the
/// shutdown flag (a safety net: [`Started::stop`] wakes it at once).
const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Blocks until iokerneld hangs up `connection` (`true`; also on a failed
/// poll), `stop` is written or [`WATCH_PERIOD`] passes (`false`). No
/// periodic wake-up: a watcher that polled every few milliseconds put
/// timer interrupts and context switches on the CPUs of the round trips it
/// shares them with (docs/results.md, "Dataplane": where the round trips'
/// tail comes from).
fn wait_for_hangup(connection: BorrowedFd<'_>, stop: BorrowedFd<'_>) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: connection.as_raw_fd(),
            events: 0,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    match ginza_sys::poll::poll_raw(&mut fds, Some(WATCH_PERIOD)) {
        Ok(_) => fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0,
        Err(_) => true,
    }
}

impl Started {
    /// Registers with iokerneld once every kthread has reported its tid on
    /// its command ring (iokerneld needs it before its first grant), then
    /// watches the connection.
    fn register(&mut self) -> Result<(), RuntimeError> {
        let rt = &self.rt;
        let link = rt.link.as_ref().expect("checked by the caller");
        let t0 = std::time::Instant::now();
        while rt.kthreads.iter().any(|k| k.tid.load(Relaxed) == 0) {
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                return Err(RuntimeError::Start(
                    "kthreads did not start within 5 s".into(),
                ));
            }
            std::thread::yield_now();
        }
        let eventfds: Vec<_> = rt.kthreads.iter().map(|k| k.eventfd()).collect();
        let id = link
            .register(&eventfds, |cfg, pool, own| {
                Box::new(crate::net::Stack::new(cfg, pool, own))
            })
            .map_err(RuntimeError::Iokernel)?;
        if let Some(own) = link.own_socket.get() {
            // Every kthread sends on the own socket from now on.
            for k in rt.kthreads.iter() {
                if let Some(net) = k.knet() {
                    let _ = net.own_socket.set(Arc::clone(own));
                }
            }
        }
        if link.wake_slot(0).is_some() {
            // Kthreads that went to sleep on their eventfds before the
            // page came move to it (their wait says why: `wait_for_grant`).
            for k in rt.kthreads.iter() {
                let _ = ginza_sys::eventfd::write(k.eventfd(), 1);
            }
        }
        log::info!(
            "registered with iokerneld as {:?} (app {id}, {} kthreads)",
            link.cfg.name,
            rt.kthreads.len()
        );
        let start_error = |what: &str, e: std::io::Error| {
            RuntimeError::Start(format!("cannot start the iokerneld watcher: {what}: {e}"))
        };
        let connection = link
            .connection_fd()
            .expect("registered just above")
            .map_err(|e| start_error("dup of the connection", e))?;
        let stop = ginza_sys::eventfd::new().map_err(|e| start_error("eventfd", e))?;
        let stop_seen = stop
            .try_clone()
            .map_err(|e| start_error("dup of the eventfd", e))?;
        let watched = Arc::clone(rt);
        let watcher = std::thread::Builder::new()
            .name("ginza-watch".into())
            .spawn(move || {
                let link = watched.link.as_ref().expect("managed runtime");
                while !watched.shutdown.load(Relaxed) {
                    if wait_for_hangup(connection.as_fd(), stop_seen.as_fd())
                        && !watched.shutdown.load(Relaxed)
                    {
                        log::error!(
                            "iokerneld closed the connection of {:?}: its kthreads run standalone from now on",
                            link.cfg.name
                        );
                        watched.fall_back_to_standalone();
                        return;
                    }
                }
            })
            .map_err(|e| start_error("thread", e))?;
        self.watch_stop = Some(stop);
        self.watcher = Some(watcher);
        Ok(())
    }
}

impl Started {
    /// Stops every kthread (each finishes the uthread it runs, if any) and
    /// frees what is still queued.
    pub(crate) fn stop(self) {
        self.rt.wake_all_for_shutdown();
        for t in self.threads {
            let _ = t.join();
        }
        if let Some(stop) = &self.watch_stop {
            // The flag is set: the watcher returns at its next look.
            let _ = ginza_sys::eventfd::write(stop.as_fd(), 1);
        }
        if let Some(w) = self.watcher {
            let _ = w.join();
        }
        if let Some(link) = &self.rt.link {
            link.deregister();
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
    /// Times it took work queued for another kthread: a batch of uthreads
    /// (another's runqueue or the shared queue), or packets from another
    /// kthread's ingress ring. Also published in its queue line for
    /// iokerneld's stats.
    pub steals: u64,
    pub parks: u64,
    pub revocations: u64,
    /// Cores granted by iokerneld.
    pub grants: u64,
    /// Of `grants`, those that ended a sleep on the kthread's eventfd (a
    /// runtime without the wake page, or before its registration ended).
    pub grants_by_eventfd: u64,
    /// Times it kept its core and polled while idle instead of parking
    /// (docs/idle-poll.md).
    pub idle_polls: u64,
    /// Of those, the times iokerneld took the core back for another
    /// application.
    pub idle_poll_takebacks: u64,
    /// Of those, the times it parked because another task (of any
    /// program) waited for its CPU.
    pub idle_poll_yields: u64,
    /// Times it blocked on the application's own AF_XDP socket while idle,
    /// keeping its core (`IokernelConfig::block_while_idle`).
    pub idle_blocks: u64,
    /// Of those, the times a frame on the socket woke it.
    pub idle_block_frames: u64,
    /// Of those, the times the earliest timer ended the wait (nothing
    /// else did).
    pub idle_block_timeouts: u64,
    /// Times a frame on the application's own socket woke it while parked
    /// and it ran without iokerneld's grant (`IokernelConfig::self_wake`).
    pub self_wakes: u64,
}

/// Decision → running latencies of iokerneld's grants, in ns, as the
/// kthreads measured them (CLOCK_MONOTONIC, from the decision time carried
/// in the `Wake` command to the kthread's return from its wait).
#[derive(Clone, Debug, Default)]
pub struct GrantLatencies {
    /// The kthread was blocked on its eventfd.
    pub from_blocked_ns: Vec<u32>,
    /// The kthread was still lingering after it parked.
    pub while_lingering_ns: Vec<u32>,
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
        self.check_standalone()?;
        sched::revoke(&self.rt, id)
    }

    /// Gives kthread `id` its core back.
    pub fn grant(&self, id: usize) -> std::io::Result<()> {
        self.check(id)?;
        self.check_standalone()?;
        sched::grant(&self.rt, id);
        Ok(())
    }

    fn check_standalone(&self) -> std::io::Result<()> {
        if self.rt.managed() {
            return Err(std::io::Error::other(
                "iokerneld allocates this runtime's cores; revoke/grant are for standalone runtimes",
            ));
        }
        Ok(())
    }

    /// Whether the runtime is registered with iokerneld and iokerneld is
    /// still there.
    pub fn managed(&self) -> bool {
        self.rt.managed()
    }

    /// Takes the grant latencies the kthreads measured so far (empty in
    /// standalone mode).
    pub fn take_grant_latencies(&self) -> GrantLatencies {
        let mut out = GrantLatencies::default();
        for k in self.rt.kthreads.iter() {
            if let Some(io) = &k.io {
                let mut s = io.samples.lock().unwrap_or_else(|p| p.into_inner());
                out.from_blocked_ns.append(&mut s.from_blocked);
                out.while_lingering_ns.append(&mut s.while_lingering);
            }
        }
        out
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

    /// The network stack's counters; `None` without networking.
    pub fn net_stats(&self) -> Option<crate::net::NetStats> {
        crate::net::stats_of(&self.rt)
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
                grants: k.stats.grants.load(Relaxed),
                grants_by_eventfd: k.stats.grants_by_eventfd.load(Relaxed),
                idle_polls: k.stats.idle_polls.load(Relaxed),
                idle_poll_takebacks: k.stats.idle_poll_takebacks.load(Relaxed),
                idle_poll_yields: k.stats.idle_poll_yields.load(Relaxed),
                idle_blocks: k.stats.idle_blocks.load(Relaxed),
                idle_block_frames: k.stats.idle_block_frames.load(Relaxed),
                idle_block_timeouts: k.stats.idle_block_timeouts.load(Relaxed),
                self_wakes: k.stats.self_wakes.load(Relaxed),
            })
            .collect()
    }
}
