//! Waking the server's core alongside iokerneld (docs/iokernel-idle.md,
//! "The first request after a quiet spell").
//!
//! A sleeping iokerneld is woken by the NIC's socket; it takes the frame,
//! delivers it and, in its pass, grants the parked latency-critical kthread
//! a core, whose thread then wakes on a CPU that has halted meanwhile. On a
//! VM each halted vCPU's wake costs tens of microseconds, and the two come
//! one after the other. So while iokerneld sleeps, a companion thread of
//! its own waits on the same socket, pinned to the core the parked
//! kthread would be granted: the frame wakes both CPUs at once, and the
//! companion keeps its CPU from halting again (it spins under
//! `SCHED_IDLE`, so the kthread, when its grant comes, runs there at once)
//! until iokerneld's first pass after the wake is over, at most
//! [`SPIN_CAP`].
//!
//! It spins only after a frame ended one of iokerneld's sleeps — a loaded
//! iokerneld never sleeps, and never arms it — and only on a core nobody
//! holds.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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
    /// Rung by iokerneld to arm the companion (and to stop it).
    arm: OwnedFd,
    /// The NIC's socket, the companion's own descriptor of it.
    nic: OwnedFd,
    /// The CPU to wake (`NO_CPU`: none).
    cpu: AtomicUsize,
    /// Armed, not yet woken by a frame.
    armed: AtomicBool,
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
    /// A sleep has ended and its first pass has not run yet.
    pass_pending: bool,
}

impl WakeAlongside {
    pub(crate) fn new() -> WakeAlongside {
        WakeAlongside {
            shared: None,
            thread: None,
            pass_pending: false,
        }
    }

    /// Before a sleep: arm the companion on `cpu` (starting it with its
    /// own descriptor of `nic` the first time), or leave it unarmed.
    pub(crate) fn before_sleep(&mut self, cpu: Option<usize>, nic: std::os::fd::BorrowedFd<'_>) {
        let Some(cpu) = cpu else {
            return;
        };
        if self.shared.is_none() {
            match self.start(nic) {
                Ok(()) => {}
                Err(e) => {
                    log::warn!("iokerneld: no companion to wake a core alongside: {e}");
                    return;
                }
            }
        }
        let Some(s) = &self.shared else {
            return;
        };
        s.waking.store(true, SeqCst);
        let moved = s.cpu.swap(cpu, SeqCst) != cpu;
        if !s.armed.swap(true, SeqCst) || moved {
            let _ = eventfd::write(s.arm.as_fd(), 1);
        }
    }

    /// After a sleep: its first pass is still to come.
    pub(crate) fn after_sleep(&mut self) {
        self.pass_pending = true;
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

    /// Frames that woke the companion, and its time spent spinning, ns.
    pub(crate) fn counts(&self) -> (u64, u64) {
        self.shared
            .as_ref()
            .map_or((0, 0), |s| (s.wakes.load(Relaxed), s.spin_ns.load(Relaxed)))
    }

    fn start(&mut self, nic: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
        let shared = Arc::new(Shared {
            arm: eventfd::new()?,
            nic: nic.try_clone_to_owned()?,
            cpu: AtomicUsize::new(NO_CPU),
            armed: AtomicBool::new(false),
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
            let _ = eventfd::write(s.arm.as_fd(), 1);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The companion's loop: wait to be armed; then for a frame (or a new
/// arming); after a frame, spin until iokerneld's first pass.
fn companion(s: &Shared) {
    if let Err(e) = sched_class::set_current_idle() {
        log::warn!("iokerneld's wake companion: cannot run under SCHED_IDLE: {e}");
        return;
    }
    let mut pinned = NO_CPU;
    while !s.stop.load(SeqCst) {
        if eventfd::wait(s.arm.as_fd(), None).is_err() {
            return;
        }
        let _ = eventfd::read(s.arm.as_fd());
        'armed: loop {
            if s.stop.load(SeqCst) {
                return;
            }
            let cpu = s.cpu.load(SeqCst);
            if cpu != pinned {
                if let Err(e) = affinity::pin_current_thread(cpu) {
                    log::warn!("iokerneld's wake companion: cannot run on CPU {cpu}: {e}");
                    s.armed.store(false, SeqCst);
                    break 'armed;
                }
                pinned = cpu;
            }
            let mut fds = [pollfd(s.nic.as_raw_fd()), pollfd(s.arm.as_fd().as_raw_fd())];
            if ginza_sys::poll::poll_raw(&mut fds, None).is_err() {
                return;
            }
            if fds[1].revents != 0 {
                // Armed again (maybe for another CPU), or stopped.
                let _ = eventfd::read(s.arm.as_fd());
                continue 'armed;
            }
            if fds[0].revents != 0 {
                // Unarmed before the spin: an arming from now on rings.
                s.armed.store(false, SeqCst);
                let t0 = Instant::now();
                while s.waking.load(Relaxed) && t0.elapsed() < SPIN_CAP {
                    std::hint::spin_loop();
                }
                s.wakes.fetch_add(1, Relaxed);
                s.spin_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
                break 'armed;
            }
        }
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}
