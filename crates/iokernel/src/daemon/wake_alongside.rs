//! Waking the server's core alongside iokerneld (docs/iokernel-idle.md,
//! "The first request after a quiet spell").
//!
//! A sleeping iokerneld is woken by the NIC's socket; it takes the frame,
//! delivers it and, in its pass, grants the parked latency-critical kthread
//! a core, whose thread then wakes on a CPU that has halted meanwhile. On a
//! VM each halted vCPU's wake costs tens of microseconds, and they come one
//! after the other. So when a frame ends a sleep while such a kthread is
//! parked, iokerneld first rings a companion thread of its own, pinned to
//! the core that kthread would be granted, then takes the frame: that
//! CPU's wake overlaps iokerneld's work up to the grant. The companion
//! keeps its CPU from halting again (it spins under `SCHED_IDLE`, so the
//! kthread, when its grant comes, runs there at once) until iokerneld's
//! first pass after the wake is over, at most [`SPIN_CAP`].
//!
//! (A companion waiting on the NIC's socket itself would wake with
//! iokerneld, but a `poll` re-checks readiness before it returns, and
//! iokerneld has usually taken the frame by then: tried, its wakes were
//! lost.)
//!
//! It is rung only when a frame ended one of iokerneld's sleeps — a loaded
//! iokerneld never sleeps — and only for a core nobody holds.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ginza_sys::{affinity, eventfd, sched_class};

/// The longest the companion keeps its CPU awake after a frame, waiting
/// for iokerneld's first pass: several halted-vCPU wakes on this VM.
pub const SPIN_CAP: Duration = Duration::from_micros(300);

/// No CPU chosen yet.
const NO_CPU: usize = usize::MAX;

/// What iokerneld and its companion share.
struct Shared {
    /// Rung by iokerneld when a frame ends its sleep (and to stop it).
    ring: OwnedFd,
    /// The CPU to wake (`NO_CPU`: none).
    cpu: AtomicUsize,
    stop: AtomicBool,
    /// iokerneld sleeps, or has woken and not run its first pass since.
    waking: AtomicBool,
    /// Frames that woke the companion, and the time it spun after them.
    wakes: AtomicU64,
    spin_ns: AtomicU64,
}

/// iokerneld's handle on its companion thread (started at the first sleep
/// that has a core to wake).
pub(crate) struct WakeAlongside {
    shared: Option<Arc<Shared>>,
    thread: Option<JoinHandle<()>>,
    /// The CPU to wake if a frame ends this sleep.
    target: Option<usize>,
    /// A sleep has ended and its first pass has not run yet.
    pass_pending: bool,
}

impl WakeAlongside {
    pub(crate) fn new() -> WakeAlongside {
        WakeAlongside {
            shared: None,
            thread: None,
            target: None,
            pass_pending: false,
        }
    }

    /// Before a sleep: the CPU to wake if a frame ends it (`None`: none),
    /// starting the companion the first time there is one.
    pub(crate) fn before_sleep(&mut self, cpu: Option<usize>) {
        self.target = cpu;
        let Some(cpu) = cpu else {
            return;
        };
        if self.shared.is_none() {
            if let Err(e) = self.start() {
                log::warn!("iokerneld: no companion to wake a core alongside: {e}");
                self.target = None;
                return;
            }
        }
        if let Some(s) = &self.shared {
            s.cpu.store(cpu, SeqCst);
            s.waking.store(true, SeqCst);
        }
    }

    /// A sleep ended, by a frame on the NIC or not: ring the companion
    /// (first thing, so that its CPU's wake overlaps iokerneld's work); its
    /// first pass is still to come.
    pub(crate) fn after_sleep(&mut self, by_nic: bool) {
        self.pass_pending = true;
        if let (true, Some(_), Some(s)) = (by_nic, self.target, &self.shared) {
            let _ = eventfd::write(s.ring.as_fd(), 1);
        }
    }

    /// After a pass: the first after a sleep ends the companion's spin
    /// (a grant it made has put the kthread on the companion's CPU).
    pub(crate) fn after_pass(&mut self) {
        if std::mem::take(&mut self.pass_pending) {
            if let Some(s) = &self.shared {
                s.waking.store(false, SeqCst);
            }
        }
    }

    /// Rings that woke the companion, and its time spent spinning, ns.
    pub(crate) fn counts(&self) -> (u64, u64) {
        self.shared
            .as_ref()
            .map_or((0, 0), |s| (s.wakes.load(Relaxed), s.spin_ns.load(Relaxed)))
    }

    fn start(&mut self) -> std::io::Result<()> {
        let shared = Arc::new(Shared {
            ring: eventfd::new()?,
            cpu: AtomicUsize::new(NO_CPU),
            stop: AtomicBool::new(false),
            waking: AtomicBool::new(false),
            wakes: AtomicU64::new(0),
            spin_ns: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("iokerneld-wake".into())
            .spawn(move || companion(&s))?;
        self.shared = Some(shared);
        self.thread = Some(thread);
        Ok(())
    }
}

impl Drop for WakeAlongside {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.stop.store(true, SeqCst);
            let _ = eventfd::write(s.ring.as_fd(), 1);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The companion's loop: wait for a ring; on its CPU (moved there first if
/// the target changed), spin until iokerneld's first pass after the wake.
fn companion(s: &Shared) {
    if let Err(e) = sched_class::set_current_idle() {
        log::warn!("iokerneld's wake companion: cannot run under SCHED_IDLE: {e}");
        return;
    }
    let mut pinned = NO_CPU;
    loop {
        if eventfd::wait(s.ring.as_fd(), None).is_err() {
            return;
        }
        let _ = eventfd::read(s.ring.as_fd());
        if s.stop.load(SeqCst) {
            return;
        }
        let t0 = Instant::now();
        let cpu = s.cpu.load(SeqCst);
        if cpu != pinned {
            if let Err(e) = affinity::pin_current_thread(cpu) {
                log::warn!("iokerneld's wake companion: cannot run on CPU {cpu}: {e}");
                continue;
            }
            pinned = cpu;
        }
        while s.waking.load(Relaxed) && t0.elapsed() < SPIN_CAP {
            std::hint::spin_loop();
        }
        s.wakes.fetch_add(1, Relaxed);
        s.spin_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    }
}
