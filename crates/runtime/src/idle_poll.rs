//! Polling while idle under iokerneld (docs/idle-poll.md): a kthread of a
//! latency-critical application that runs out of work keeps its core and
//! polls, rather than parking, while no other application wants the core.
//! The next request then finds it running (no grant, no wake from halt).
//!
//! The kthread says so on its queue line (`LineFlags::IDLE_POLLING`);
//! iokerneld's allocator hands such a core to anyone who wants one, at once,
//! by setting `PREEMPT_PENDING`, which the polling loop reads on every turn
//! (the preemption signal is only the backstop). At most one kthread per
//! application polls; after `IokernelConfig::poll_while_idle` without
//! arrivals (packets, work from outside, stolen work: a timer of its own is
//! not one), it parks as before, so a host with no traffic does not burn
//! the core for ever.
//!
//! The take-back is decided on one atomic word, the line's flags:
//! iokerneld sets `PREEMPT_PENDING` and reads, in the same step, whether
//! `IDLE_POLLING` was still set; the kthread clears `IDLE_POLLING` and
//! reads, in the same step, whether `PREEMPT_PENDING` was set. If iokerneld
//! came first it has already given the core to someone else, believing the
//! kthread runs nothing: the kthread then runs nothing, whatever it found
//! meanwhile (it stays queued for its next grant), and gives the core back.
//! If the kthread came first, iokerneld preempts a kthread that runs work,
//! as any other.
//!
//! Where another application waits for the core, iokerneld says so on the
//! line (`LineFlags::CORE_WANTED`) when it grants or preempts, and the
//! kthread parks at once: beside batch, polling would only hold the core
//! until the next pass took it back.
//!
//! iokerneld sees only Ginza applications; a client, a build or a kernel
//! worker on the same CPU would wait behind the poller until Linux's time
//! slice ran out, for every request it makes. So the poller reads how long
//! Linux kept it waiting, runnable, for its CPU (the kernel's run-queue
//! wait: a hypervisor that stole the vCPU does not count) and how often
//! Linux switched it out, over windows of [`SHARE_WINDOW`]. When it waited
//! [`SHARE_LOST`] of a window or more, [`SLICE_WAIT`] or more per switch
//! (time slices, not a woken client's moment), the CPU has another taker:
//! the kthread parks, and does not poll again for [`YIELD_BACKOFF`] (it
//! parks as without the option). The wait counts wherever it fell, also
//! where the taker is what brings the poller its work: there each time
//! Linux gives the poller its CPU back its first turn finds work, and the
//! gaps between idle turns that the poller counted before never showed
//! the loss (docs/results.md, "Session 45").
//!
//! A kthread that polls does not keep a sleeping iokerneld awake
//! (docs/iokernel-idle.md); one that runs work does. So each change of the
//! flag is followed by the bell's check: iokerneld announces its sleep,
//! fences, then reads the flags; the runtime changes the flag, fences, then
//! reads the announcement. One of the two sees the other.
//!
//! **Blocked on the own socket** (`IokernelConfig::block_while_idle`, the
//! direct path only): once its polling bound is over, the idle kthread
//! keeps its core and blocks in `poll` on the application's own AF_XDP
//! socket and its eventfd, until its next timer, instead of parking. It
//! says so with `IDLE_BLOCKED` beside `IDLE_POLLING`. A frame wakes it
//! through the kernel, as Linux's blocked server thread is woken: no
//! iokerneld, no grant on the way. Whoever else has something for it
//! clears `IDLE_BLOCKED` and, if it was set, writes the eventfd: iokerneld
//! taking the core back (with `PREEMPT_PENDING`, decided on the same
//! word), iokerneld delivering to its ingress ring, work injected from
//! outside the runtime (`KThread::wake_if_blocked`). The kthread sets the flag, then
//! looks for work once more; its wakers publish, then read the flag: one
//! of the two sees the other.
//!
//! **The bell held.** On the direct path the kthread's frames never use
//! the egress ring, so while a sleeping iokerneld believes it idle it owes
//! iokerneld nothing for a short request: from its idle state until it has
//! run what the arrival brought, its own runqueue pushes do not ring the
//! bell (`KThread::bell_held`), nor does leaving the state. If it then goes
//! back to idle, iokerneld's belief is true again and nothing was missed;
//! if it finds more work without going idle, it is busy, and rings
//! (`KThread::release_bell`). Commands (`Parked`, `Yielded`) always ring.
//! A frame after a quiet spell thus wakes one CPU, the kthread's, not
//! iokerneld's as well.

use std::sync::atomic::{fence, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use ginza_shm::LineFlags;

use crate::link::KLink;
use crate::own_socket::OwnSocket;
use crate::sched::{bump, KThread, PollShare, TurnClock};

/// The window over which a poller counts the time it waited for its CPU.
const SHARE_WINDOW: Duration = Duration::from_millis(100);

/// The share of a window lost to other tasks that makes a poller park:
/// a task that contends for the CPU gets about half of it from Linux.
const SHARE_LOST: f64 = 0.25;

/// A wait for the CPU, per switch, long enough to be another task's time
/// slice rather than a woken task's moment: a blocking client beside its
/// server, woken, preempts the poller for the few microseconds of its send
/// and loses nothing to it.
const SLICE_WAIT: Duration = Duration::from_micros(50);

/// How long a poller that was switched out for another task parks
/// instead of polling: long enough that a task contending for the CPU
/// (which waited a time slice for it) loses little, as on a CPU shared
/// with a client that connects and sends all the time.
const YIELD_BACKOFF: Duration = Duration::from_secs(1);

/// One look-for-work loop's polling state; dropping it leaves the state.
pub(crate) struct IdlePoll<'a> {
    k: &'a KThread,
    io: &'a KLink,
    pollers: &'a AtomicUsize,
    bound: Duration,
    /// The application's own socket, where the kthread blocks once
    /// `bound` is over (`block_while_idle` on the direct path).
    own: Option<&'a OwnSocket>,
    /// On the direct path (an own socket): the bell is held (module doc).
    direct: bool,
    on: bool,
}

impl<'a> IdlePoll<'a> {
    /// `None` where `k` may not poll while idle: standalone, the option
    /// off, or keeping its cores anyway (`keep_cores_when_idle`).
    pub(crate) fn new(k: &'a KThread) -> Option<IdlePoll<'a>> {
        let rt = k.rt();
        let io = k.io.as_ref()?;
        let cfg = &rt.link.as_ref()?.cfg;
        let socket = k.knet().and_then(|n| n.own_socket.get()).map(|o| &**o);
        let own = socket.filter(|_| cfg.block_while_idle);
        if !rt.managed()
            || (cfg.poll_while_idle.is_zero() && own.is_none())
            || cfg.keep_cores_when_idle
        {
            return None;
        }
        Some(IdlePoll {
            k,
            io,
            pollers: &rt.idle_pollers,
            bound: cfg.poll_while_idle,
            own,
            direct: socket.is_some(),
            on: false,
        })
    }

    /// Whether the kthread is in the idle state now.
    pub(crate) fn is_on(&self) -> bool {
        self.on
    }

    /// The kthread found an arrival: the bound counts from now.
    pub(crate) fn arrival(k: &KThread) {
        k.quiet_since.set(None);
    }

    /// Called when the spin before parking is over with no work found:
    /// whether to keep polling (entering the state if needed) rather than
    /// park. Past the polling bound, with an own socket to block on, it
    /// blocks once (until an arrival, its timer, or a waker) and says true.
    pub(crate) fn keep_polling(&mut self, clock: &mut TurnClock) -> bool {
        // Another application waits for this core: parked at once, with no
        // clock read (the self-woken server beside batch looks here after
        // every request).
        if !self.on && self.core_wanted() {
            return false;
        }
        let now = clock.now();
        let quiet_since = self.k.quiet_since.get().unwrap_or(now);
        self.k.quiet_since.set(Some(quiet_since));
        let block = if now.duration_since(quiet_since) >= self.bound {
            match self.own {
                Some(own) => Some(own),
                None => return false,
            }
        } else {
            None
        };
        if self.on {
            // Blocked, it takes no CPU from anyone: only a spinning
            // poller counts its share.
            if block.is_none() && self.switched_out(now) {
                return false;
            }
        } else if !self.enter(now, block.is_some()) {
            return false;
        }
        if let Some(own) = block {
            self.block(own);
        }
        true
    }

    /// Enters the idle state (polling, or about to block): false where it
    /// is to park instead.
    fn enter(&mut self, now: Instant, blocking: bool) -> bool {
        if !blocking && self.k.poll_yielded_until.get().is_some_and(|t| now < t) {
            return false;
        }
        if self.core_wanted() {
            return false;
        }
        // One poller per application: the others park.
        if self.pollers.compare_exchange(0, 1, SeqCst, SeqCst).is_err() {
            return false;
        }
        let was = self.io.line.insert_flags(LineFlags::IDLE_POLLING);
        if was.contains(LineFlags::PREEMPT_PENDING) {
            // Preempted before it polled, as a kthread that runs work:
            // it gives the core back as such (iokerneld waits for it).
            self.io.line.remove_flags(LineFlags::IDLE_POLLING);
            self.pollers.fetch_sub(1, SeqCst);
            self.k.revoke_requested.store(true, SeqCst);
            return false;
        }
        self.on = true;
        bump(&self.k.stats.idle_polls);
        if self.direct {
            // The bell held (module doc): what it ran since it left the
            // idle state needed nothing of iokerneld.
            self.k.bell_held.set(true);
            self.k.bell_owed.set(false);
        }
        self.ring();
        if self.k.poll_share.get().window_start.is_none() {
            self.k.poll_share.set(PollShare::started(now));
        }
        // No `sched_yield` here: it hands the CPU to any other thread
        // runnable there for a whole time slice (milliseconds), during which
        // the flag goes unread and the batch kthread that is to get the
        // core, under SCHED_IDLE, cannot run either (docs/idle-poll.md).
        true
    }

    /// Another application waits for this core (iokerneld's mark): it is
    /// theirs now, not at the pass that would take it back. Once polling,
    /// iokerneld's take-back answers that instead.
    fn core_wanted(&self) -> bool {
        self.io.line.flags().contains(LineFlags::CORE_WANTED)
    }

    /// The bell's check after a change of the flag, unless the bell is
    /// held (module doc).
    fn ring(&self) {
        if !self.k.bell_held.get() {
            self.io.wake_iokernel();
        }
    }

    /// Blocks in `poll` on the own socket and the kthread's eventfd until
    /// a frame, a waker (`KThread::wake_if_blocked`, iokerneld) or the earliest timer
    /// of any kthread (a busy one cannot fire its own), holding the core.
    fn block(&mut self, own: &OwnSocket) {
        let (k, line) = (self.k, &self.io.line);
        let rt = k.rt();
        let was = line.insert_flags(LineFlags::IDLE_BLOCKED);
        // Against the wakers: they publish, fence, then read the flag.
        fence(SeqCst);
        // The socket is retired only once no kthread runs (the runtime's
        // stop), so its number stays its own while we block on it.
        let wanted = was.contains(LineFlags::PREEMPT_PENDING)
            || rt.work_visible(k)
            || rt.shutdown.load(SeqCst)
            || k.revoke_requested.load(SeqCst);
        let own_fd = own.with_fd(|fd| std::os::fd::AsRawFd::as_raw_fd(&fd));
        let Some(own_fd) = own_fd.filter(|_| !wanted) else {
            line.remove_flags(LineFlags::IDLE_BLOCKED);
            return;
        };
        let deadline = rt.earliest_deadline();
        let timeout = (deadline != u64::MAX)
            .then(|| Duration::from_nanos(deadline.saturating_sub(rt.now_ns())));
        bump(&k.stats.idle_blocks);
        let mut fds = [
            libc::pollfd {
                fd: own_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&k.eventfd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // An error is a signal (iokerneld's preemption backstop): the loop
        // looks at its flags next.
        let woken = ginza_sys::poll::poll_raw(&mut fds, timeout);
        if matches!(woken, Ok(0)) {
            bump(&k.stats.idle_block_timeouts);
        }
        let still = line
            .remove_flags(LineFlags::IDLE_BLOCKED)
            .contains(LineFlags::IDLE_BLOCKED);
        if fds[0].revents != 0 {
            bump(&k.stats.idle_block_frames);
            ginza_sys::hops::stamp(ginza_sys::hops::Hop::KthreadRuns);
        }
        if !still || fds[1].revents & libc::POLLIN != 0 {
            // A waker cleared the flag: its write comes (if it has not yet,
            // this blocking read waits the moment until it does). Or a
            // write without the flag (shutdown). Either way consumed here,
            // so no later wait on the eventfd (a grant's, without the wake
            // page) takes it for one.
            let _ = ginza_sys::eventfd::read(k.eventfd());
        }
    }

    /// Whether, over the window that ends now, another task took
    /// [`SHARE_LOST`] of the CPU from the poller in time slices: then it is
    /// to park, and not poll for [`YIELD_BACKOFF`].
    fn switched_out(&self, now: Instant) -> bool {
        let share = self.k.poll_share.get();
        let Some(start) = share.window_start else {
            self.k.poll_share.set(PollShare::started(now));
            return false;
        };
        let window = now.saturating_duration_since(start);
        if window < SHARE_WINDOW {
            return false;
        }
        let next = PollShare::started(now);
        self.k.poll_share.set(next);
        let (Some(w0), Some(w1), Some(s0), Some(s1)) = (
            share.waited_ns,
            next.waited_ns,
            share.switches,
            next.switches,
        ) else {
            return false;
        };
        let waited_ns = w1.saturating_sub(w0);
        let lost = waited_ns as f64 >= window.as_nanos() as f64 * SHARE_LOST
            && waited_ns / s1.saturating_sub(s0).max(1) >= SLICE_WAIT.as_nanos() as u64;
        if !lost {
            return false;
        }
        bump(&self.k.stats.idle_poll_yields);
        self.k.poll_yielded_until.set(Some(now + YIELD_BACKOFF));
        true
    }

    /// Whether iokerneld has taken the core back (one load of the
    /// kthread's own line, on every turn). The caller then stops looking
    /// and leaves the state ([`IdlePoll::leave`]), which confirms it.
    pub(crate) fn taken_back(&self) -> bool {
        self.on && self.io.preempt_pending()
    }

    /// Leaves the polling state (before anything runs or parks): whether
    /// iokerneld had taken the core back while the kthread still polled.
    /// Then it has given the core to someone else already, and the kthread
    /// must run nothing, not even what it found on this last turn: it is
    /// marked revoked and gives the core back.
    pub(crate) fn leave(&mut self) -> bool {
        if !self.on {
            return false;
        }
        self.on = false;
        let was = self.io.line.remove_flags(LineFlags::IDLE_POLLING);
        // Running work (or parking) needs iokerneld awake: its egress
        // ring, its `Parked` (which rings by itself). On the direct path
        // the bell is held until the kthread proves busy (module doc).
        self.ring();
        self.pollers.fetch_sub(1, SeqCst);
        let taken = was.contains(LineFlags::PREEMPT_PENDING);
        if taken {
            bump(&self.k.stats.idle_poll_takebacks);
            self.k.revoke_requested.store(true, SeqCst);
        }
        taken
    }
}

impl Drop for IdlePoll<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}
