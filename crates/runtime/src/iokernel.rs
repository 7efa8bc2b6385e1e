//! The runtime's side of iokerneld (DESIGN.md, "Processes", "Shared memory
//! between iokerneld and a runtime"): registration, the per-kthread queue
//! line and command rings, the grant latencies a kthread observes, and
//! parking under iokerneld (`park_with_iokernel`, `wait_for_grant`).
//!
//! In this mode a kthread holds a core only while iokerneld has granted it
//! one: it starts parked, parks by telling iokerneld (`Parked`, with its
//! next timer), answers a preemption with `Yielded`, and runs again only
//! when iokerneld writes its eventfd. The runtime never wakes its own
//! kthreads; iokerneld sees queued work in the queue lines (congestion
//! detection) and grants cores.

use std::cell::UnsafeCell;
use std::sync::atomic::{
    fence,
    Ordering::{Acquire, Relaxed, SeqCst},
};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ginza_proto::client::{self, Connection};
use ginza_proto::messages::Registration;
use ginza_shm::{
    CmdRx, CmdTx, LineFlags, LineRef, Region, RegionConfig, RuntimeEnd, ToIokernel, ToKthread,
};

use crate::config::IokernelConfig;
use crate::net::{KNet, Stack};
use crate::sched::{bump, eventfd_try_read, eventfd_wait, Owner, PARKED, REVOKED, RUNNING};

/// Samples kept per kthread and kind of grant (a bench reads them).
const MAX_SAMPLES: usize = 1 << 20;

/// Decision → running latencies of the grants one kthread received.
#[derive(Default)]
pub(crate) struct GrantSamples {
    /// The kthread was blocked on its eventfd.
    pub(crate) from_blocked: Vec<u32>,
    /// The kthread was still lingering after `Parked`.
    pub(crate) while_lingering: Vec<u32>,
}

/// One kthread's end of the shared region.
pub(crate) struct KLink {
    pub(crate) line: LineRef,
    /// Owner kthread only.
    tx: UnsafeCell<CmdTx<ToIokernel>>,
    /// Owner kthread only.
    rx: UnsafeCell<CmdRx<ToKthread>>,
    pub(crate) samples: Mutex<GrantSamples>,
    /// The packet rings, with networking.
    pub(crate) net: Option<KNet>,
}

// SAFETY: `tx`/`rx` are used only by the owning kthread's thread (callers'
// contract on every method that touches them); the line is atomics.
unsafe impl Sync for KLink {}

impl KLink {
    /// Sends a command to iokerneld. A full or corrupt ring is reported;
    /// iokerneld disconnects a runtime whose ring is corrupt, and the
    /// watcher then falls back to standalone mode.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn send(&self, m: ToIokernel) {
        // SAFETY: owner-only (caller's contract).
        if let Err(e) = unsafe { &mut *self.tx.get() }.send(m) {
            log::warn!("command {m:?} to iokerneld not sent: {e}");
        }
    }

    /// Drains iokerneld's commands; returns the decision time of the last
    /// `Wake`. `Preempt` messages need no action here: the queue line's
    /// `PREEMPT_PENDING` flag (and the signal) carry the request, and a
    /// `Preempt` read while parked is stale.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn drain(&self) -> Option<u64> {
        // SAFETY: owner-only (caller's contract).
        let rx = unsafe { &mut *self.rx.get() };
        let mut decided = None;
        loop {
            match rx.recv() {
                Ok(Some(ToKthread::Wake { decided_ns, .. })) => decided = Some(decided_ns),
                Ok(Some(ToKthread::Preempt { .. })) => {}
                Ok(None) => return decided,
                Err(e) => {
                    log::warn!("iokerneld's command ring: {e}");
                    return decided;
                }
            }
        }
    }

    pub(crate) fn preempt_pending(&self) -> bool {
        self.line.flags().contains(LineFlags::PREEMPT_PENDING)
    }

    pub(crate) fn record(&self, latency_ns: u64, lingering: bool) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let v = if lingering {
            &mut s.while_lingering
        } else {
            &mut s.from_blocked
        };
        if v.len() < MAX_SAMPLES {
            v.push(latency_ns.min(u32::MAX as u64) as u32);
        }
    }
}

/// The runtime-wide part: the region and the registration.
pub(crate) struct Link {
    pub(crate) cfg: IokernelConfig,
    pub(crate) region: Region,
    /// CLOCK_MONOTONIC ns at the runtime's epoch (timers are kept relative
    /// to the epoch; iokerneld speaks CLOCK_MONOTONIC).
    pub(crate) monotonic_at_epoch: u64,
    pub(crate) conn: Mutex<Option<Connection>>,
    /// The network stack, once iokerneld has sent the ingress pool.
    pub(crate) net: OnceLock<Stack>,
}

impl Link {
    /// Creates the shared region for `n` kthreads and each kthread's end.
    pub(crate) fn new(
        cfg: &IokernelConfig,
        n: usize,
        epoch: Instant,
    ) -> Result<(Link, Vec<KLink>), String> {
        let n32 = u32::try_from(n).map_err(|_| format!("{n} kthreads are too many"))?;
        if let Some(net) = &cfg.net {
            net.check()?;
        }
        let region = Region::create(&cfg.name, &RegionConfig::new(n32))
            .map_err(|e| format!("cannot create the shared region: {e}"))?;
        let mut ends = Vec::with_capacity(n);
        for k in 0..n32 {
            let RuntimeEnd {
                line,
                to_iokernel,
                from_iokernel,
                ingress,
                done,
                egress,
                egress_buffers,
            } = region
                .runtime_end(k)
                .map_err(|e| format!("shared region, kthread {k}: {e}"))?;
            line.insert_flags(LineFlags::PARKED);
            ends.push(KLink {
                line,
                tx: UnsafeCell::new(to_iokernel),
                rx: UnsafeCell::new(from_iokernel),
                samples: Mutex::new(GrantSamples::default()),
                net: cfg
                    .net
                    .is_some()
                    .then(|| KNet::new(ingress, done, egress, egress_buffers)),
            });
        }
        let monotonic_at_epoch =
            ginza_sys::clock::monotonic_ns().saturating_sub(epoch.elapsed().as_nanos() as u64);
        Ok((
            Link {
                cfg: cfg.clone(),
                region,
                monotonic_at_epoch,
                conn: Mutex::new(None),
                net: OnceLock::new(),
            },
            ends,
        ))
    }

    /// Registers with iokerneld, passing the region and the eventfds.
    pub(crate) fn register<F: std::os::fd::AsFd>(&self, eventfds: &[F]) -> Result<u64, String> {
        let socket = match &self.cfg.socket {
            Some(p) => p.clone(),
            None => client::default_socket_path(),
        };
        let n = eventfds.len() as u32;
        let reg = Registration {
            name: self.cfg.name.clone(),
            class: self.cfg.class,
            guaranteed: self.cfg.guaranteed,
            max_cores: self.cfg.max_cores.unwrap_or(n),
            kthreads: n,
            net: self.cfg.net.as_ref().map(|c| c.interface),
        };
        let mut conn = client::register_region(&socket, &reg, &self.region, eventfds)
            .map_err(|e| e.to_string())?;
        let id = conn.app_id();
        if let Some(net) = &self.cfg.net {
            let pool = conn.take_ingress_pool().ok_or_else(|| {
                format!(
                    "iokerneld at {} accepted {:?} with networking ({} {}) but sent no ingress pool \
                     (an iokerneld without a dataplane?)",
                    socket.display(),
                    self.cfg.name,
                    net.interface.mac,
                    net.interface.ip
                )
            })?;
            // Set once: `register` runs once per runtime.
            let _ = self.net.set(Stack::new(net, pool));
        }
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
        Ok(id)
    }

    /// Whether iokerneld has gone away (or removed this application).
    pub(crate) fn lost(&self) -> bool {
        self.conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|c| c.closed_by_iokerneld())
    }

    /// Deregisters (closing the socket gives the cores back).
    pub(crate) fn deregister(&self) {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// A deadline relative to the epoch, in iokerneld's clock.
    pub(crate) fn to_monotonic(&self, since_epoch_ns: u64) -> Option<u64> {
        (since_epoch_ns != u64::MAX).then(|| self.monotonic_at_epoch.saturating_add(since_epoch_ns))
    }
}

// ---- parking and grants under iokerneld --------------------------------------

/// Gives the core back to iokerneld (`Parked` when out of work, `Yielded`
/// in answer to a preemption, both with the earliest timer of any kthread:
/// a busy one cannot fire its own) and waits for the next grant. What is
/// left on the runqueue (a preempted uthread) stays counted on the queue
/// line, where iokerneld sees it wait.
pub(crate) fn park_with_iokernel(owner: &Owner<'_>, io: &KLink, preempted: bool) {
    let k = owner.kthread();
    let rt = k.rt();
    let link = rt.link.as_ref().expect("managed runtime without a link");
    if !preempted && (link.cfg.keep_cores_when_idle || rt.work_visible(k)) {
        return; // keep spinning; or work arrived after the last look
    }
    k.state
        .store(if preempted { REVOKED } else { PARKED }, SeqCst);
    io.line.insert_flags(ginza_shm::LineFlags::PARKED);
    if let (false, Some(net)) = (preempted, &io.net) {
        // A frame that landed after the look above, before iokerneld could
        // see us parked: take it rather than leave it waiting for a grant.
        fence(SeqCst);
        if net.ingress_pending() {
            io.line.remove_flags(ginza_shm::LineFlags::PARKED);
            k.state.store(RUNNING, SeqCst);
            return;
        }
    }
    let next_deadline_ns = link.to_monotonic(rt.earliest_deadline());
    owner.send_to_iokernel(if preempted {
        ginza_shm::ToIokernel::Yielded { next_deadline_ns }
    } else {
        bump(&k.stats.parks);
        ginza_shm::ToIokernel::Parked { next_deadline_ns }
    });
    wait_for_grant(owner, io);
}

/// Blocks until iokerneld grants this kthread a core (its eventfd), the
/// runtime shuts down, or iokerneld is lost.
pub(crate) fn wait_for_grant(owner: &Owner<'_>, io: &KLink) {
    let k = owner.kthread();
    let rt = k.rt();
    let linger = rt
        .link
        .as_ref()
        .map_or(Duration::ZERO, |l| l.cfg.linger_after_park);
    let mut lingering = false;
    let mut granted = false;
    if !linger.is_zero() {
        let start = Instant::now();
        while start.elapsed() < linger && !rt.shutdown.load(Relaxed) {
            if eventfd_try_read(k) {
                granted = true;
                lingering = true;
                break;
            }
            std::hint::spin_loop();
        }
    }
    while !granted && !rt.shutdown.load(Acquire) && rt.managed() {
        // A preemption signal that raced with our `Parked` interrupts the
        // wait; only the eventfd means a grant.
        granted = eventfd_wait(k, u64::MAX);
    }
    let decided = owner.drain_from_iokernel();
    if granted {
        bump(&k.stats.grants);
        if let Some(d) = decided {
            io.record(
                ginza_sys::clock::monotonic_ns().saturating_sub(d),
                lingering,
            );
        }
    }
    io.line.remove_flags(ginza_shm::LineFlags::PARKED);
    // A late signal may have set this while we were parked; iokerneld
    // clears the flag when it reads our Parked/Yielded, so after a grant
    // the flag is set only by a new preemption.
    k.revoke_requested
        .store(rt.managed() && io.preempt_pending(), SeqCst);
    k.state.store(RUNNING, SeqCst);
}
