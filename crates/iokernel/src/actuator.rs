//! Carrying out the allocator's decisions on Linux threads.
//!
//! [`CoreActuator`] is what iokerneld calls after it has updated its own
//! bookkeeping and written the command ring: [`LinuxActuator`] pins the
//! kthread and grants through its grant word, writing its eventfd only if
//! the kthread sleeps (docs/runtime.md, "Grants without a system call"),
//! or signals it (revoke);
//! [`RecordingActuator`] only records, for tests and dry runs.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};

use ginza_shm::{GrantDelivery, PreemptReason, QueueLine, WakePage, WakeWord};

use ginza_sys::hops::{self, Hop};
use ginza_sys::sched_class::{self, Policy};
use ginza_sys::{affinity, eventfd, signal};

/// The signal that asks a kthread to give its core back.
pub const PREEMPT_SIGNAL: i32 = libc::SIGURG;

/// The kthread a decision is about.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub app_id: u64,
    pub app_name: &'a str,
    pub kthread: usize,
    /// The registering process (SO_PEERCRED).
    pub pid: i32,
    /// The kthread's Linux thread id, once it reported `Started`.
    pub tid: Option<i32>,
    /// Its application is batch: an eviction with no shared core lowers it
    /// to `SCHED_IDLE` (a latency-critical one is left as it is).
    pub batch: bool,
    /// The CPU iokerneld last pinned this thread to, if nothing has moved
    /// it since (an eviction or a failed grant forgets it): a grant to that
    /// CPU needs no `sched_setaffinity` (docs/results.md, "Core allocation").
    pub pinned: Option<usize>,
    pub eventfd: BorrowedFd<'a>,
    /// The grant word in the kthread's queue line.
    pub wake: &'a WakeWord,
    /// The wake page and the kthread's slot, if it sleeps there rather
    /// than on its eventfd (`Registration::wake_page`).
    pub wake_slot: Option<(&'a WakePage, u32)>,
    /// A kthread running on the granted core, to be asked to wake this one
    /// if it sleeps on the wake page (its queue line;
    /// `Config::local_wake_wait`).
    pub doorbell: Option<&'a QueueLine>,
}

/// Acts on decisions. `cpu` is a Linux CPU number (already mapped from the
/// policy's core index).
pub trait CoreActuator {
    /// The kthread now owns `cpu`: let it run there. On success with a
    /// known tid the thread is pinned to `cpu` (the caller remembers it as
    /// [`Target::pinned`]). Says how the grant was delivered.
    fn grant(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<GrantDelivery>;
    /// The kthread, granted `cpu` before it reported its tid (so the grant
    /// pinned nothing), has reported it: pin it there now.
    fn pin(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<()>;
    /// The kthread must give `cpu` back.
    fn preempt(&mut self, t: &Target<'_>, cpu: usize, reason: PreemptReason) -> io::Result<()>;
    /// The kthread did not give `cpu` back in time: move it off the core,
    /// or at least behind the kthread the core goes to.
    fn evict(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<()>;
    /// The kthread holds a core again without a grant (it woke itself,
    /// docs/direct-path.md): give back what an eviction took from it, as
    /// a grant does.
    fn reinstate(&mut self, t: &Target<'_>) -> io::Result<()> {
        let _ = t;
        Ok(())
    }
    /// The request iokerneld dispatched to the kthread was asked to yield
    /// and has not (docs/colocate.md, the backstop): interrupt it. The
    /// kthread keeps its core. Does nothing unless the actuator acts on
    /// threads.
    fn interrupt_request(&mut self, t: &Target<'_>) -> io::Result<()> {
        let _ = t;
        Ok(())
    }
    /// The application is gone (informational).
    fn app_removed(&mut self, app_id: u64, name: &str) {
        let _ = (app_id, name);
    }
}

/// Grants by `sched_setaffinity` (skipped when the thread is still pinned
/// to that CPU: the system call costs about a microsecond of iokerneld's
/// time, more than the rest of a grant) + the grant word, and an eventfd
/// write only to a kthread that sleeps (waking a sleeping thread is most of
/// a grant's cost); revokes by [`PREEMPT_SIGNAL`]
/// through `tgkill` (so a tid reused by another process is never hit);
/// evicts by moving the thread's affinity to the shared (unmanaged) cores,
/// or, where there are none, by lowering it to `SCHED_IDLE` until its next
/// grant, so that whoever got its core runs ahead of it.
#[derive(Debug, Default)]
pub struct LinuxActuator {
    shared: Vec<usize>,
    /// Kthreads lowered to `SCHED_IDLE` by an eviction: (application,
    /// tid, the policy to give back at its next grant).
    demoted: Vec<(u64, i32, Policy)>,
}

impl LinuxActuator {
    /// `shared`: the cores an evicted kthread is moved to.
    pub fn new(shared: Vec<usize>) -> Self {
        LinuxActuator {
            shared,
            demoted: Vec::new(),
        }
    }

    /// An evicted kthread with no shared core to go to: lowered to
    /// `SCHED_IDLE` (from a time-sharing class; one under a real-time
    /// policy, or already idle, is left as it is).
    fn demote(&mut self, t: &Target<'_>, tid: i32) -> io::Result<()> {
        let policy = sched_class::policy_of(tid)?;
        if !matches!(policy, Policy::Normal | Policy::Batch) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("no shared core to move it to, and its policy ({policy:?}) is not lowered"),
            ));
        }
        sched_class::set_policy(tid, Policy::Idle)?;
        self.demoted.push((t.app_id, tid, policy));
        Ok(())
    }

    /// Gives a kthread lowered by an eviction its policy back (it holds a
    /// core again).
    fn give_policy_back(&mut self, t: &Target<'_>, tid: i32) -> io::Result<()> {
        let Some(i) = self
            .demoted
            .iter()
            .position(|&(app, d, _)| app == t.app_id && d == tid)
        else {
            return Ok(());
        };
        let (_, _, policy) = self.demoted.swap_remove(i);
        sched_class::set_policy(tid, policy)
    }

    /// Shared cores = the ones this process may use, minus the managed cores
    /// and iokerneld's own.
    pub fn for_config(cfg: &crate::Config) -> io::Result<Self> {
        let mut shared = affinity::allowed_cpus()?;
        shared.retain(|c| !cfg.cores.contains(c) && cfg.own_core != Some(*c));
        Ok(Self::new(shared))
    }
}

impl CoreActuator for LinuxActuator {
    fn grant(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<GrantDelivery> {
        hops::stamp(Hop::Granted);
        // The affinity first, so the thread wakes up on its core. Before the
        // kthread reported its tid there is nothing to pin; the wake still
        // goes out. A managed kthread never changes its own affinity
        // (docs/runtime.md), so one still pinned to `cpu` needs no call.
        let pinned = match t.tid {
            Some(_) if t.pinned == Some(cpu) => Ok(()),
            Some(tid) => {
                if !self.demoted.is_empty() {
                    if let Err(e) = self.give_policy_back(t, tid) {
                        log::warn!(
                            "app {:?} kthread {}: its policy before an eviction not given back: {e}",
                            t.app_name,
                            t.kthread
                        );
                    }
                }
                affinity::pin_thread(tid, cpu)
            }
            None => Ok(()),
        };
        // The word after the affinity: a lingering kthread that sees it
        // runs at once, on its core.
        let mut delivery = t.wake.grant();
        if delivery == GrantDelivery::Eventfd {
            match t.wake_slot {
                Some((page, slot)) => {
                    page.bump(slot);
                    match t.doorbell {
                        // The same CPU's kthread wakes it there: no
                        // inter-processor interrupt (docs/runtime.md,
                        // "Local wakes").
                        Some(line) if line.ring_doorbell(slot) => {
                            delivery = GrantDelivery::Doorbell;
                        }
                        _ => drop(page.wake(slot)?),
                    }
                }
                None => eventfd::write(t.eventfd, 1)?,
            }
        }
        // Without a core of its own, iokerneld's loop may be running on
        // the very core it just granted: it then steps aside, or the woken
        // kthread waits behind the (busy-polling) loop until the kernel's
        // next tick, 4 ms on a HZ=250 kernel (docs/protected.md, "Why the
        // throughput was null"). A pinned loop never is on a managed core.
        if rustix::thread::sched_getcpu() == cpu {
            rustix::thread::sched_yield();
        }
        pinned.map(|()| delivery)
    }

    fn pin(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<()> {
        match t.tid {
            Some(tid) => affinity::pin_thread(tid, cpu),
            None => Ok(()),
        }
    }

    fn preempt(&mut self, t: &Target<'_>, _cpu: usize, _reason: PreemptReason) -> io::Result<()> {
        match t.tid {
            Some(tid) => signal::tgkill(t.pid, tid, PREEMPT_SIGNAL),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "kthread has not reported its tid yet",
            )),
        }
    }

    fn interrupt_request(&mut self, t: &Target<'_>) -> io::Result<()> {
        // The same signal as a revocation: the runtime's handler tells the
        // two apart by the queue line's flags.
        match t.tid {
            Some(tid) => signal::tgkill(t.pid, tid, PREEMPT_SIGNAL),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "kthread has not reported its tid yet",
            )),
        }
    }

    fn evict(&mut self, t: &Target<'_>, _cpu: usize) -> io::Result<()> {
        let Some(tid) = t.tid else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "kthread has not reported its tid",
            ));
        };
        if self.shared.is_empty() {
            // Every usable core is managed or iokerneld's. A latency-critical
            // kthread is not lowered: overdue, it is most often one the
            // kernel has not run since its signal (the kthread that got its
            // core runs there), or one in a deferred section holding its
            // application's locks; under `SCHED_IDLE` beside a spinning
            // kthread it would not run again to yield or release them, and
            // its application stalled for seconds (docs/results.md,
            // "Session 23"). At Linux's class it gets its share and yields.
            if !t.batch {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "no shared core to move it to, and a latency-critical kthread is not lowered",
                ));
            }
            return self.demote(t, tid);
        }
        affinity::set_thread_affinity(tid, &self.shared)
    }

    fn reinstate(&mut self, t: &Target<'_>) -> io::Result<()> {
        match t.tid {
            Some(tid) if !self.demoted.is_empty() => self.give_policy_back(t, tid),
            _ => Ok(()),
        }
    }

    fn app_removed(&mut self, app_id: u64, _name: &str) {
        self.demoted.retain(|&(app, _, _)| app != app_id);
    }
}

/// One recorded action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Grant {
        app_id: u64,
        app: String,
        kthread: usize,
        cpu: usize,
    },
    /// Pinned to the CPU granted before its tid was known.
    Pin {
        app_id: u64,
        app: String,
        kthread: usize,
        cpu: usize,
    },
    Preempt {
        app_id: u64,
        app: String,
        kthread: usize,
        cpu: usize,
        reason: PreemptReason,
    },
    Evict {
        app_id: u64,
        app: String,
        kthread: usize,
        cpu: usize,
    },
    Removed {
        app_id: u64,
        app: String,
    },
}

/// Records every action in a shared log (clone it to read from another
/// thread).
#[derive(Clone, Debug, Default)]
pub struct RecordingActuator {
    pub log: Arc<Mutex<Vec<Action>>>,
}

impl RecordingActuator {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the actions so far.
    pub fn actions(&self) -> Vec<Action> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    fn push(&self, a: Action) {
        if let Ok(mut l) = self.log.lock() {
            l.push(a);
        }
    }
}

impl CoreActuator for RecordingActuator {
    /// Records only: no word, no eventfd, no wake page (reported as the
    /// eventfd, the delivery that assumes nothing about the kthread); but
    /// a doorbell offered for a kthread on the wake page is rung (its word
    /// bumped), as `LinuxActuator` does for one that sleeps, so that
    /// iokerneld's side of local wakes can be tested.
    fn grant(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<GrantDelivery> {
        self.push(Action::Grant {
            app_id: t.app_id,
            app: t.app_name.to_string(),
            kthread: t.kthread,
            cpu,
        });
        if let (Some((page, slot)), Some(line)) = (t.wake_slot, t.doorbell) {
            if line.ring_doorbell(slot) {
                page.bump(slot);
                return Ok(GrantDelivery::Doorbell);
            }
        }
        Ok(GrantDelivery::Eventfd)
    }

    fn pin(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<()> {
        self.push(Action::Pin {
            app_id: t.app_id,
            app: t.app_name.to_string(),
            kthread: t.kthread,
            cpu,
        });
        Ok(())
    }

    fn preempt(&mut self, t: &Target<'_>, cpu: usize, reason: PreemptReason) -> io::Result<()> {
        self.push(Action::Preempt {
            app_id: t.app_id,
            app: t.app_name.to_string(),
            kthread: t.kthread,
            cpu,
            reason,
        });
        Ok(())
    }

    fn evict(&mut self, t: &Target<'_>, cpu: usize) -> io::Result<()> {
        self.push(Action::Evict {
            app_id: t.app_id,
            app: t.app_name.to_string(),
            kthread: t.kthread,
            cpu,
        });
        Ok(())
    }

    fn app_removed(&mut self, app_id: u64, name: &str) {
        self.push(Action::Removed {
            app_id,
            app: name.to_string(),
        });
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use ginza_sys::process;

    use super::*;

    /// A kthread of this process with `efd` and `word`, not pinned.
    fn test_target<'a>(efd: &'a OwnedFd, word: &'a WakeWord, tid: Option<i32>) -> Target<'a> {
        Target {
            app_id: 1,
            app_name: "t",
            kthread: 0,
            pid: std::process::id() as i32,
            tid,
            batch: true,
            pinned: None,
            eventfd: efd.as_fd(),
            wake: word,
            wake_slot: None,
            doorbell: None,
        }
    }

    #[test]
    fn grant_makes_the_eventfd_readable_and_pins() {
        // On a thread of its own: the pinning ends with it.
        std::thread::spawn(|| {
            let efd = eventfd::new().unwrap();
            let word = WakeWord::new();
            let cpu = *affinity::allowed_cpus().unwrap().last().unwrap();
            let t = test_target(&efd, &word, Some(process::gettid()));
            LinuxActuator::default().grant(&t, cpu).unwrap();
            assert_eq!(affinity::allowed_cpus().unwrap(), vec![cpu]);
            assert_eq!(eventfd::read(efd.as_fd()).unwrap(), Some(1));
            assert_eq!(eventfd::read(efd.as_fd()).unwrap(), None);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_pins_and_wakes_nothing() {
        std::thread::spawn(|| {
            let efd = eventfd::new().unwrap();
            let word = WakeWord::new();
            let cpu = *affinity::allowed_cpus().unwrap().last().unwrap();
            let t = test_target(&efd, &word, Some(process::gettid()));
            LinuxActuator::default().pin(&t, cpu).unwrap();
            assert_eq!(affinity::allowed_cpus().unwrap(), vec![cpu]);
            assert_eq!(eventfd::read(efd.as_fd()).unwrap(), None);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_grant_to_the_cpu_the_thread_is_pinned_to_leaves_its_affinity_alone() {
        let all = affinity::allowed_cpus().unwrap();
        if all.len() < 2 {
            eprintln!("skipped: needs two allowed CPUs, have {all:?}");
            return;
        }
        std::thread::spawn(move || {
            let efd = eventfd::new().unwrap();
            let word = WakeWord::new();
            let (first, last) = (all[0], *all.last().unwrap());
            let t = Target {
                pinned: Some(last),
                ..test_target(&efd, &word, Some(process::gettid()))
            };
            // Told it is still pinned to `last`: no system call, so the
            // affinity this thread really has stays as it was.
            LinuxActuator::default().grant(&t, last).unwrap();
            assert_eq!(affinity::allowed_cpus().unwrap(), all);
            assert_eq!(eventfd::read(efd.as_fd()).unwrap(), Some(1));
            // Pinned elsewhere (or not known): pinned.
            LinuxActuator::default().grant(&t, first).unwrap();
            assert_eq!(affinity::allowed_cpus().unwrap(), vec![first]);
            let t = Target { pinned: None, ..t };
            LinuxActuator::default().grant(&t, last).unwrap();
            assert_eq!(affinity::allowed_cpus().unwrap(), vec![last]);
            assert_eq!(eventfd::read(efd.as_fd()).unwrap(), Some(2));
        })
        .join()
        .unwrap();
    }

    /// A thread that plays an evicted kthread: its tid, and a sender whose
    /// drop ends it.
    fn kthread_thread(
        idle: bool,
    ) -> (
        i32,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            if idle {
                sched_class::set_current_idle().unwrap();
            }
            tx.send(process::gettid()).unwrap();
            let _ = done_rx.recv();
        });
        (rx.recv().unwrap(), done_tx, h)
    }

    /// With no shared core to move it to, an evicted batch kthread is
    /// lowered to `SCHED_IDLE` (whoever gets its core runs ahead of it)
    /// until its next grant (or self-wake) gives its policy back; with one,
    /// it is moved there and its policy is left alone; a kthread already
    /// idle stays so; a latency-critical one is not lowered.
    #[test]
    fn an_eviction_lowers_the_kthread_where_no_core_is_shared_until_its_next_grant() {
        let efd = eventfd::new().unwrap();
        let word = WakeWord::new();
        let all = affinity::allowed_cpus().unwrap();
        let (tid, done, h) = kthread_thread(false);
        let t = test_target(&efd, &word, Some(tid));
        let mut act = LinuxActuator::new(Vec::new());
        act.evict(&t, all[0]).unwrap();
        assert_eq!(sched_class::policy_of(tid).unwrap(), Policy::Idle);
        act.grant(&t, all[0]).unwrap();
        assert_eq!(sched_class::policy_of(tid).unwrap(), Policy::Normal);
        // Given back once: a later grant does not touch it.
        assert!(act.demoted.is_empty());
        // A core taken without a grant (a self-wake) gives it back too.
        act.evict(&t, all[0]).unwrap();
        assert_eq!(sched_class::policy_of(tid).unwrap(), Policy::Idle);
        act.reinstate(&t).unwrap();
        assert_eq!(sched_class::policy_of(tid).unwrap(), Policy::Normal);
        // An application removed: what it left lowered is forgotten.
        act.evict(&t, all[0]).unwrap();
        act.app_removed(t.app_id, t.app_name);
        assert!(act.demoted.is_empty());
        sched_class::set_policy(tid, Policy::Normal).unwrap();
        // A shared core: moved there, its policy untouched.
        let mut act = LinuxActuator::new(vec![*all.last().unwrap()]);
        act.evict(&t, all[0]).unwrap();
        assert_eq!(sched_class::policy_of(tid).unwrap(), Policy::Normal);
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|l| ginza_sys::cpulist::parse(l.trim()).unwrap());
        assert_eq!(cpus, Some(vec![*all.last().unwrap()]));
        drop(done);
        h.join().unwrap();
        // A kthread already under SCHED_IDLE is not lowered, and says why.
        let (tid, done, h) = kthread_thread(true);
        let t = test_target(&efd, &word, Some(tid));
        let mut act = LinuxActuator::new(Vec::new());
        let e = act.evict(&t, all[0]).unwrap_err();
        assert!(e.to_string().contains("not lowered"), "{e}");
        // A latency-critical kthread is not lowered either, and says why.
        let (lc_tid, lc_done, lc_h) = kthread_thread(false);
        let lc = Target {
            batch: false,
            ..test_target(&efd, &word, Some(lc_tid))
        };
        let e = act.evict(&lc, all[0]).unwrap_err();
        assert!(e.to_string().contains("latency-critical"), "{e}");
        assert_eq!(sched_class::policy_of(lc_tid).unwrap(), Policy::Normal);
        drop(lc_done);
        lc_h.join().unwrap();
        act.grant(&t, all[0]).unwrap();
        assert_eq!(sched_class::policy_of(tid).unwrap(), Policy::Idle);
        drop(done);
        h.join().unwrap();
    }

    #[test]
    fn a_grant_to_a_lingering_kthread_writes_no_eventfd() {
        let efd = eventfd::new().unwrap();
        let word = WakeWord::new();
        let t = test_target(&efd, &word, None);
        let mut act = LinuxActuator::default();
        word.begin_park();
        assert_eq!(act.grant(&t, 0).unwrap(), GrantDelivery::Word);
        assert_eq!(eventfd::read(efd.as_fd()).unwrap(), None);
        assert!(word.take_grant());
        // Gone to sleep: the eventfd.
        word.begin_park();
        assert_eq!(word.before_sleep(), ginza_shm::BeforeSleep::Sleep);
        assert_eq!(act.grant(&t, 0).unwrap(), GrantDelivery::Eventfd);
        assert_eq!(eventfd::read(efd.as_fd()).unwrap(), Some(1));
    }

    #[test]
    fn a_grant_to_a_kthread_on_the_wake_page_bumps_its_word_and_asks_the_core_s_kthread() {
        let efd = eventfd::new().unwrap();
        let word = WakeWord::new();
        let page = WakePage::create().unwrap();
        let victim = QueueLine::new();
        let t = Target {
            wake_slot: Some((&page, 7)),
            ..test_target(&efd, &word, None)
        };
        let mut act = LinuxActuator::default();
        // Asleep, no kthread to ask: iokerneld bumps the word and wakes it.
        word.begin_park();
        assert_eq!(word.before_sleep(), ginza_shm::BeforeSleep::Sleep);
        assert_eq!(act.grant(&t, 0).unwrap(), GrantDelivery::Eventfd);
        assert_eq!(page.seen(7), 1);
        assert!(word.take_grant());
        let t = Target {
            doorbell: Some(&victim),
            ..t
        };
        // Lingering: the word alone, the doorbell stays quiet.
        word.begin_park();
        assert_eq!(act.grant(&t, 0).unwrap(), GrantDelivery::Word);
        assert!(!victim.doorbell_rung());
        assert_eq!(page.seen(7), 1);
        assert!(word.take_grant());
        // Asleep: the word bumped, the doorbell names the slot, and the
        // eventfd is never written.
        word.begin_park();
        assert_eq!(word.before_sleep(), ginza_shm::BeforeSleep::Sleep);
        assert_eq!(act.grant(&t, 0).unwrap(), GrantDelivery::Doorbell);
        assert_eq!(page.seen(7), 2);
        assert_eq!(victim.take_doorbell(), Some(7));
        assert_eq!(eventfd::read(efd.as_fd()).unwrap(), None);
    }

    /// The handshake on real threads and a real eventfd: a "kthread" parks
    /// thousands of times with a linger of a few polls, so grants land
    /// while it polls, as it goes to sleep and after; each one must wake it
    /// (a lost grant leaves it blocked: the deadline fails the test).
    #[test]
    fn stress_grants_around_the_sleep_are_never_lost() {
        use std::sync::atomic::AtomicU64;
        const ROUNDS: u64 = 5_000;
        let efd = Arc::new(eventfd::new().unwrap());
        let word = Arc::new(WakeWord::new());
        let parked = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(120);
        let kthread = {
            let (efd, word, parked) = (efd.clone(), word.clone(), parked.clone());
            std::thread::spawn(move || {
                let mut slept = 0u64;
                for round in 1..=ROUNDS {
                    word.begin_park();
                    parked.store(round, Ordering::Release);
                    let polls = (round % 4) * 8;
                    let by_word = (0..polls).any(|_| {
                        let got = word.take_grant();
                        std::hint::spin_loop();
                        got
                    }) || word.before_sleep() == ginza_shm::BeforeSleep::Granted;
                    if !by_word {
                        slept += 1;
                        loop {
                            let left = deadline.saturating_duration_since(Instant::now());
                            assert!(!left.is_zero(), "grant {round} lost");
                            eventfd::wait(efd.as_fd(), Some(left)).unwrap();
                            if eventfd::read(efd.as_fd()).unwrap().is_some() {
                                break;
                            }
                        }
                        word.awake();
                    }
                }
                slept
            })
        };
        let mut act = LinuxActuator::default();
        let mut writes = 0u64;
        for round in 1..=ROUNDS {
            while parked.load(Ordering::Acquire) < round {
                assert!(Instant::now() < deadline, "the kthread stopped at {round}");
                std::hint::spin_loop();
            }
            let t = test_target(&efd, &word, None);
            if act.grant(&t, 0).unwrap() == GrantDelivery::Eventfd {
                writes += 1;
            }
        }
        assert_eq!(
            kthread.join().unwrap(),
            writes,
            "one eventfd write per sleep"
        );
    }

    static GOT: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_urg(_: i32) {
        GOT.store(true, Ordering::SeqCst);
    }

    #[test]
    fn preempt_signals_the_thread() {
        signal::install_handler(PREEMPT_SIGNAL, on_urg).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            tx.send(process::gettid()).unwrap();
            let t0 = Instant::now();
            while !GOT.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
            GOT.load(Ordering::SeqCst)
        });
        let tid = rx.recv().unwrap();
        let efd = eventfd::new().unwrap();
        let word = WakeWord::new();
        let t = test_target(&efd, &word, Some(tid));
        LinuxActuator::default()
            .preempt(&t, 0, PreemptReason::CoreNeeded)
            .unwrap();
        assert!(h.join().unwrap(), "SIGURG reached the target thread");
        // No tid: a clear error, no signal to anyone.
        let t = Target { tid: None, ..t };
        assert!(LinuxActuator::default()
            .preempt(&t, 0, PreemptReason::Shrink)
            .is_err());
    }
}
