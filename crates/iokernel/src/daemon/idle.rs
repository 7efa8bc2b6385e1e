//! Sleeping while idle (docs/iokernel-idle.md): after `Config::idle_after`
//! with nothing runnable and no traffic, the loop blocks in one `ppoll`
//! until something needs it, then busy-polls again from the first event.
//!
//! What it waits on, and why that is everything that can need it:
//! * the real NIC's socket (AF_PACKET's, or AF_XDP's, readable while its
//!   rx ring holds a frame);
//! * each application's bell: the runtime rings it after queuing work
//!   while its lines say iokerneld sleeps (`ginza_shm::iokernel_bell`);
//! * each application's own AF_XDP socket (the direct path), readable
//!   while frames wait on its rx ring;
//!   nothing else an application does can need iokerneld while none of
//!   its kthreads holds a core, or only one that polls while idle (it
//!   rings when it leaves that state; docs/idle-poll.md);
//! * the control socket, pending connections and registered ones;
//! * the in-process handles' eventfd ([`crate::loop_waker`]);
//! * a time-out at the earliest deadline it owes: a parked kthread's
//!   timer, a pending connection's time-out, `run_for`.
//!
//! It does not sleep while an application registered without a bell, a
//! protected-mode netstack relays for one (its channel rings have no
//! bell), a load run is on the generator (whose schedule is its timer),
//! a fault injector holds frames back, or the NIC cannot be waited on: it
//! spins (or naps, with `idle_sleep`) as before.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Duration;

use ginza_proto::messages::IdleStats;
use ginza_shm::iokernel_bell::announce_asleep;
use ginza_sys::hops::{self, Hop};

use super::{DaemonError, Iokerneld, PassKind, PENDING_TIMEOUT};
use crate::actuator::CoreActuator;

/// Without an eventfd for the in-process handles, a sleep lasts at most
/// this long, so that a stop or a load run is still seen.
const HANDLE_POLL_CAP: Duration = Duration::from_millis(10);

/// After a wake that brought no NIC traffic (a parked kthread's timer, a
/// bell, a stats request), the loop sleeps again once quiet this long
/// rather than `idle_after`: the long spin keeps the gaps between a
/// client's requests inside busy-polling, which a timer firing in an idle
/// server does not need. Measured: an idle UDP echo server's runtime
/// wakes iokerneld some 80 times a second for its timers, and a 2 ms spin
/// after each was 15 % of a core (docs/results.md, "Session 15").
const RESLEEP_AFTER: Duration = Duration::from_micros(50);

/// What a descriptor of the sleep's poll set stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Handle,
    Nic,
    Bell,
    Control,
}

/// Why an idle loop keeps spinning.
enum KeptAwake {
    NoBell,
    Protected,
    Dataplane,
}

/// The loop's idle state and its counts.
pub(super) struct Idle {
    enabled: bool,
    after_ns: u64,
    /// Since when the loop has found itself idle, turn after turn.
    since: Option<u64>,
    /// The NIC's (rx, tx) frame counts when the last sleep ended: until
    /// they move, the loop goes back to sleep after [`RESLEEP_AFTER`].
    woke_at_frames: Option<(u64, u64)>,
    stats: IdleStats,
    fds: Vec<libc::pollfd>,
    sources: Vec<Source>,
}

impl Idle {
    pub(super) fn new(enabled: bool, after: Duration) -> Idle {
        Idle {
            enabled,
            after_ns: after.as_nanos() as u64,
            since: None,
            woke_at_frames: None,
            stats: IdleStats {
                enabled,
                ..IdleStats::default()
            },
            fds: Vec::new(),
            sources: Vec::new(),
        }
    }

    pub(super) fn report(&self) -> IdleStats {
        self.stats.clone()
    }

    fn push(&mut self, fd: BorrowedFd<'_>, source: Source) {
        self.fds.push(libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        self.sources.push(source);
    }
}

impl<A: CoreActuator> Iokerneld<A> {
    /// Nothing runnable, nothing queued, nothing in flight that the loop
    /// must carry forward by itself.
    fn quiet(&self) -> bool {
        !self.busy
            && self.work_arrived.is_empty()
            && !self.handover_waiting
            && self.doorbells.is_empty()
            && self.ready.is_empty()
            && self.signal_after_wakes.is_empty()
    }

    fn kept_awake(&self) -> Option<KeptAwake> {
        if self.apps.iter().any(|a| a.bell.is_none()) {
            return Some(KeptAwake::NoBell);
        }
        if !self.protected_pids.is_empty() || self.apps.iter().any(|a| !a.protects.is_empty()) {
            return Some(KeptAwake::Protected);
        }
        if self.dp.keeps_awake() || self.dp.nic_fd().is_err() {
            return Some(KeptAwake::Dataplane);
        }
        None
    }

    /// Marks (or unmarks) every queue line: iokerneld sleeps.
    fn announce(&self, asleep: bool) {
        announce_asleep(
            self.apps
                .iter()
                .flat_map(|a| a.ends.iter().map(|e| &*e.line)),
            asleep,
        );
    }

    /// The loop's turn when it would otherwise spin: once idle for
    /// `idle_after`, announces the sleep, looks at everything once more,
    /// and sleeps until an event or its next deadline. Returns whether it
    /// slept (the caller then polls the control socket at once).
    pub(super) fn idle_turn(&mut self, now: u64, end: Option<u64>) -> Result<bool, DaemonError> {
        if !self.idle.enabled {
            return Ok(false);
        }
        if !self.quiet() {
            self.idle.since = None;
            return Ok(false);
        }
        if let Some(why) = self.kept_awake() {
            let s = &mut self.idle.stats;
            match why {
                KeptAwake::NoBell => s.kept_awake_no_bell += 1,
                KeptAwake::Protected => s.kept_awake_protected += 1,
                KeptAwake::Dataplane => s.kept_awake_dataplane += 1,
            }
            self.idle.since = None;
            return Ok(false);
        }
        let since = *self.idle.since.get_or_insert(now);
        let frames = self.dp.nic_frames();
        let after = match self.idle.woke_at_frames {
            Some(at_wake) if at_wake == frames => {
                self.idle.after_ns.min(RESLEEP_AFTER.as_nanos() as u64)
            }
            _ => {
                self.idle.woke_at_frames = None;
                self.idle.after_ns
            }
        };
        if now.saturating_sub(since) < after {
            return Ok(false);
        }
        // From here a runtime that queues work rings its bell; what it
        // queued before is seen by the look below (the fences of
        // `announce_asleep` and `IokernelBell::ring_if_asleep`).
        self.announce(true);
        self.dataplane(now, true);
        self.pass(now, PassKind::Interval);
        if !self.quiet() || self.kept_awake().is_some() || self.dp.nic_frames() != frames {
            self.announce(false);
            self.idle.stats.sleeps_abandoned += 1;
            self.idle.since = None;
            return Ok(false);
        }
        let timeout = self.sleep_timeout(now, end);
        self.sleep(timeout)?;
        self.announce(false);
        self.idle.since = None;
        self.idle.woke_at_frames = Some(self.dp.nic_frames());
        Ok(true)
    }

    /// Until the earliest deadline iokerneld owes (`None`: none).
    fn sleep_timeout(&self, now: u64, end: Option<u64>) -> Option<Duration> {
        let pending = PENDING_TIMEOUT.as_nanos() as u64;
        let deadline = [self.next_timer, end]
            .into_iter()
            .flatten()
            .chain(self.pending.iter().map(|p| p.since.saturating_add(pending)))
            .min();
        let mut timeout = deadline.map(|d| Duration::from_nanos(d.saturating_sub(now)));
        if self.dp.waker().fd().is_none() {
            timeout = Some(timeout.map_or(HANDLE_POLL_CAP, |t| t.min(HANDLE_POLL_CAP)));
        }
        timeout
    }

    /// One `ppoll` on everything that can need the loop; counts the sleep
    /// and what ended it.
    fn sleep(&mut self, timeout: Option<Duration>) -> Result<(), DaemonError> {
        let mut idle = std::mem::replace(&mut self.idle, Idle::new(false, Duration::ZERO));
        idle.fds.clear();
        idle.sources.clear();
        if let Some(fd) = self.dp.waker().fd() {
            idle.push(fd, Source::Handle);
        }
        if let Ok(Some(fd)) = self.dp.nic_fd() {
            idle.push(fd, Source::Nic);
        }
        for a in &self.apps {
            if let Some(b) = &a.bell {
                idle.push(b.as_fd(), Source::Bell);
            }
            // An own socket (the direct path) is readable while frames
            // wait on its rx ring: work for the application, like a bell.
            // Not while a kthread of the application holds a core: only a
            // poller can while iokerneld sleeps, and it takes the frames
            // itself, spinning or blocked on that very socket
            // (docs/idle-poll.md); waking here too would cost the CPU
            // iokerneld shares a wake for nothing. When the poller parks,
            // its `Parked` rings the bell and the next sleep waits on the
            // socket again (readable at once if a frame came meanwhile).
            // Nor while its parked kthread sleeps on the socket itself and
            // may wake for it (`self_wake.rs`): the kernel wakes it, and its
            // runqueue's bell or its next park wakes iokerneld.
            let held = a.kt.iter().any(|k| k.core.is_some()) || Self::left_to_self_wake(a);
            if let (Some(own), false) = (a.net.as_ref().and_then(|n| n.own_socket.as_ref()), held) {
                idle.push(own.fd(), Source::Bell);
            }
        }
        idle.push(self.listener.as_fd(), Source::Control);
        for p in &self.pending {
            idle.push(p.sock.as_fd(), Source::Control);
        }
        for a in &self.apps {
            idle.push(a.sock.as_fd(), Source::Control);
        }
        let t0 = self.clock.now_ns();
        idle.stats.sleeps += 1;
        let polled = ginza_sys::poll::poll_raw(&mut idle.fds, timeout);
        hops::stamp(Hop::IokernelWoke);
        let t1 = self.clock.now_ns();
        idle.stats.slept_ns += t1.saturating_sub(t0);
        let result = match polled {
            Ok(n) => {
                let ready = |s: Source| {
                    idle.fds
                        .iter()
                        .zip(&idle.sources)
                        .any(|(f, src)| *src == s && f.revents != 0)
                };
                let (handle, nic, bell, control) = (
                    ready(Source::Handle),
                    ready(Source::Nic),
                    ready(Source::Bell),
                    ready(Source::Control),
                );
                let s = &mut idle.stats;
                s.wakes_handle += u64::from(handle);
                s.wakes_nic += u64::from(nic);
                s.wakes_app += u64::from(bell);
                s.wakes_control += u64::from(control);
                // Nothing ready and the time-out over (not a signal, which
                // the loop reads next).
                let timed_out =
                    timeout.is_some_and(|t| t1.saturating_sub(t0) >= t.as_nanos() as u64);
                s.wakes_timer += u64::from(n == 0 && timed_out);
                if handle {
                    self.dp.waker().clear();
                }
                if bell {
                    // Reset the bells that rang: the look that follows
                    // (the next pass) finds their work.
                    for a in &self.apps {
                        if let Some(b) = &a.bell {
                            let _ = ginza_sys::eventfd::read(b.as_fd());
                        }
                    }
                }
                Ok(())
            }
            Err(e) => Err(DaemonError::Poll(e)),
        };
        self.idle = idle;
        result
    }
}
