//! The per-kthread queue line: one cache line of counters that the runtime
//! writes and iokerneld polls for congestion detection (Shenango
//! Algorithm 1).
//!
//! All fields are atomics, so any bytes a runtime leaves there are valid; a
//! snapshot is a plain copy that iokerneld may use without further checks
//! (the counters are free-running sequence numbers, compared in wrapping
//! arithmetic by the policy, so no value is out of range).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use ginza_policy::alloc::{KthreadSnap, QueueCounters};

use crate::wake_word::WakeWord;

/// Flag bits of a queue line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LineFlags(pub u32);

impl LineFlags {
    /// The kthread is parked (blocked on its eventfd, holding no core).
    /// Written by the runtime.
    pub const PARKED: LineFlags = LineFlags(1 << 0);
    /// The kthread is looking for work (stealing) before it parks. Written
    /// by the runtime.
    pub const SPINNING: LineFlags = LineFlags(1 << 1);
    /// Preemption is deferred (the kthread is in a critical section).
    /// Written by the runtime.
    pub const PREEMPT_DEFERRED: LineFlags = LineFlags(1 << 2);
    /// The kthread has no work and keeps its core, polling (docs/idle-poll.md):
    /// iokerneld may take the core for anyone at once by setting
    /// [`LineFlags::PREEMPT_PENDING`], which the polling loop reads. Written
    /// by the runtime; after each change it rings its bell if iokerneld
    /// sleeps (a kthread that polls does not keep iokerneld awake, one that
    /// runs does).
    pub const IDLE_POLLING: LineFlags = LineFlags(1 << 3);
    /// With [`LineFlags::IDLE_POLLING`]: the idle kthread is blocked in
    /// `poll` on its application's own AF_XDP socket and its eventfd
    /// (docs/idle-poll.md, "Blocked on the own socket"), not spinning. A
    /// frame on the socket wakes it through the kernel; whoever else gives
    /// it work or takes its core back (iokerneld) clears this flag and,
    /// if it was set, writes the kthread's eventfd. Set by the runtime,
    /// cleared by either side.
    pub const IDLE_BLOCKED: LineFlags = LineFlags(1 << 4);
    /// The parked kthread sleeps in `poll` on its eventfd and its
    /// application's own AF_XDP socket, not on the wake page, and may wake
    /// itself for a frame there (docs/direct-path.md, "The self-woken
    /// kthread"): iokerneld delivers its grants by the eventfd. Set by the
    /// runtime before its `Parked`/`Yielded`, cleared when it runs.
    pub const SELF_WAKE_ARMED: LineFlags = LineFlags(1 << 5);
    /// The parked kthread woke itself for a frame on its own socket and
    /// runs on the CPU it is pinned to; its `SelfWoken` follows on the
    /// command ring. Set by the runtime in the atomic step that reads
    /// [`LineFlags::GRANTING`] (and taken back at once if that was set);
    /// cleared by it before its next park. iokerneld reads it, not
    /// [`LineFlags::SELF_WAKE_ARMED`] (gone as soon as the kthread runs),
    /// to tell that a kthread it books parked woke itself.
    pub const SELF_WOKEN: LineFlags = LineFlags(1 << 6);
    /// iokerneld is granting the parked kthread a core: set in the atomic
    /// step that reads [`LineFlags::SELF_WOKEN`], so exactly one of a grant
    /// and a self-wake goes ahead. Set by iokerneld, cleared by the runtime
    /// before its next park.
    pub const GRANTING: LineFlags = LineFlags(1 << 7);
    /// iokerneld asks the kthread to give its core back at its next
    /// preemption point. Set by iokerneld, cleared by the runtime.
    pub const PREEMPT_PENDING: LineFlags = LineFlags(1 << 8);
    /// Dispatch by iokerneld (docs/colocate.md): the request running on
    /// the kthread has used its quantum while others wait; it yields at
    /// its next preemption point and is handed back. Set by iokerneld,
    /// cleared by the runtime.
    pub const YIELD_REQUEST: LineFlags = LineFlags(1 << 9);
    /// iokerneld is asleep (docs/iokernel-idle.md): work the runtime makes
    /// visible to it now must be followed by a ring of the application's
    /// bell ([`crate::iokernel_bell`]). Set by iokerneld on every line of
    /// the application before it sleeps, cleared when it wakes.
    pub const IOKERNEL_ASLEEP: LineFlags = LineFlags(1 << 10);
    /// Another application is left wanting a core that only this
    /// kthread's could give it now (docs/idle-poll.md, "Poll only where
    /// nobody waits"): when the kthread runs out of work it parks at once
    /// instead of polling while idle. Set and cleared by iokerneld after
    /// each allocation pass, on the kthreads that hold a core; a runtime
    /// that does not know it polls and is taken back as before.
    pub const CORE_WANTED: LineFlags = LineFlags(1 << 11);

    /// iokerneld allows the kthread to wake itself for a frame on its own
    /// socket now (docs/direct-path.md, "The self-woken kthread"): the
    /// CPU it is pinned to is free or lent to a `SCHED_IDLE` kthread, and
    /// its application holds fewer cores than its maximum. Set and cleared
    /// by iokerneld after each allocation pass; advisory only (iokerneld
    /// checks again, and revokes, when it reads the `SelfWoken`).
    pub const SELF_WAKE_ALLOWED: LineFlags = LineFlags(1 << 12);

    pub fn contains(self, other: LineFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for LineFlags {
    type Output = LineFlags;
    fn bitor(self, rhs: LineFlags) -> LineFlags {
        LineFlags(self.0 | rhs.0)
    }
}

/// `next_timer_ns` when no timer is pending.
pub const NO_TIMER: u64 = u64::MAX;

/// One kthread's queue line in shared memory.
#[repr(C, align(64))]
pub struct QueueLine {
    rq_head: AtomicU32,
    rq_tail: AtomicU32,
    in_head: AtomicU32,
    in_tail: AtomicU32,
    flags: AtomicU32,
    /// Steals: times the kthread took work queued for another (a batch of
    /// uthreads, or packets from another kthread's ingress ring). A
    /// free-running count, read by iokerneld for its stats only.
    steals: AtomicU32,
    /// Earliest pending timer, CLOCK_MONOTONIC ns, or [`NO_TIMER`].
    next_timer_ns: AtomicU64,
    /// Cumulative busy (running uthreads) time, ns.
    busy_ns: AtomicU64,
    /// Dispatch by iokerneld (docs/colocate.md): the request the kthread
    /// has switched into, as its id's low 32 bits + 1 (0: none). Quanta
    /// count from when iokerneld sees it, not from the `Run`.
    running: AtomicU32,
    /// How a grant reaches the kthread: this word while it lingers, its
    /// eventfd once it sleeps (docs/runtime.md, "Grants without a system
    /// call").
    wake: WakeWord,
    /// A local wake asked of this kthread (docs/runtime.md, "Local
    /// wakes"): the wake-page slot of the kthread to wake + 1 (0: none).
    /// Whoever takes it first wakes that slot: the kthread on the CPU (no
    /// inter-processor interrupt) or iokerneld after its wait (loom's
    /// atomic under `--cfg loom`: the protocol is model-checked).
    doorbell: crate::sync::AtomicU32,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<QueueLine>() == 64);
const _: () = assert!(std::mem::align_of::<QueueLine>() == 64);

impl std::fmt::Debug for QueueLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueLine")
            .field("snapshot", &self.snapshot())
            .field("wake", &self.wake)
            .field("doorbell_rung", &self.doorbell_rung())
            .finish()
    }
}

impl Default for QueueLine {
    fn default() -> Self {
        Self::new()
    }
}

impl QueueLine {
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        QueueLine {
            rq_head: AtomicU32::new(0),
            rq_tail: AtomicU32::new(0),
            in_head: AtomicU32::new(0),
            in_tail: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            steals: AtomicU32::new(0),
            running: AtomicU32::new(0),
            next_timer_ns: AtomicU64::new(NO_TIMER),
            busy_ns: AtomicU64::new(0),
            wake: WakeWord::new(),
            doorbell: crate::sync::AtomicU32::new(0),
        }
    }

    /// Under loom the wake word is loom's atomic, which has no `const` new.
    #[cfg(loom)]
    pub fn new() -> Self {
        QueueLine {
            rq_head: AtomicU32::new(0),
            rq_tail: AtomicU32::new(0),
            in_head: AtomicU32::new(0),
            in_tail: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            steals: AtomicU32::new(0),
            running: AtomicU32::new(0),
            next_timer_ns: AtomicU64::new(NO_TIMER),
            busy_ns: AtomicU64::new(0),
            wake: WakeWord::new(),
            doorbell: crate::sync::AtomicU32::new(0),
        }
    }

    /// iokerneld: asks the kthread to wake the kthread sleeping on
    /// wake-page slot `slot` for it; false if an earlier ask is still there
    /// (then iokerneld wakes it itself).
    pub fn ring_doorbell(&self, slot: u32) -> bool {
        let Some(v) = slot.checked_add(1) else {
            return false;
        };
        self.doorbell
            .compare_exchange(0, v, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the pending ask, if any: the kthread asked (at its preemption
    /// points), or iokerneld once its wait is over. Of all takers exactly
    /// one gets it, and wakes the slot.
    pub fn take_doorbell(&self) -> Option<u32> {
        let v = self.doorbell.load(Ordering::Relaxed);
        if v == 0 {
            return None; // the common case: no write to the shared line
        }
        self.doorbell
            .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|v| v - 1)
    }

    /// Whether an ask is pending (one load).
    pub fn doorbell_rung(&self) -> bool {
        self.doorbell.load(Ordering::Relaxed) != 0
    }

    /// The grant word (both sides).
    pub fn wake(&self) -> &WakeWord {
        &self.wake
    }

    // Runtime side. Stores are `Relaxed`: iokerneld only samples the line,
    // and a sample that is one update behind just delays a decision by one
    // pass.

    /// Items ever taken from the runqueue.
    pub fn set_rq_head(&self, v: u32) {
        self.rq_head.store(v, Ordering::Relaxed)
    }
    /// Items ever pushed to the runqueue.
    pub fn set_rq_tail(&self, v: u32) {
        self.rq_tail.store(v, Ordering::Relaxed)
    }
    /// `n` more items taken from the runqueue (by its owner or a stealer).
    pub fn add_rq_head(&self, n: u32) {
        self.rq_head.fetch_add(n, Ordering::Relaxed);
    }
    /// `n` more items pushed to the runqueue.
    pub fn add_rq_tail(&self, n: u32) {
        self.rq_tail.fetch_add(n, Ordering::Relaxed);
    }
    /// Packets ever taken from the ingress ring.
    pub fn set_in_head(&self, v: u32) {
        self.in_head.store(v, Ordering::Relaxed)
    }
    /// Packets ever put on the ingress ring (iokerneld may maintain this
    /// one itself, as the ingress producer).
    pub fn set_in_tail(&self, v: u32) {
        self.in_tail.store(v, Ordering::Relaxed)
    }
    pub fn set_next_timer(&self, deadline_ns: Option<u64>) {
        self.next_timer_ns
            .store(deadline_ns.unwrap_or(NO_TIMER), Ordering::Relaxed)
    }
    /// One more steal (owner only; wraps).
    pub fn add_steal(&self) {
        let v = self.steals.load(Ordering::Relaxed);
        self.steals.store(v.wrapping_add(1), Ordering::Relaxed);
    }

    /// Dispatch by iokerneld: the kthread switched into request `id`
    /// (`None`: it runs none).
    pub fn set_running_request(&self, id: Option<u64>) {
        let v = id.map_or(0, |id| (id as u32).wrapping_add(1));
        self.running.store(v, Ordering::Release)
    }
    /// Whether the kthread says it has switched into request `id`.
    pub fn runs_request(&self, id: u64) -> bool {
        self.running.load(Ordering::Acquire) == (id as u32).wrapping_add(1)
    }
    pub fn add_busy_ns(&self, ns: u64) {
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }
    /// Sets `f`; returns the flags as they were just before, read in the
    /// same atomic step (docs/idle-poll.md, "The take-back").
    pub fn insert_flags(&self, f: LineFlags) -> LineFlags {
        LineFlags(self.flags.fetch_or(f.0, Ordering::AcqRel))
    }
    /// Clears `f`; returns the flags as they were just before, read in the
    /// same atomic step.
    pub fn remove_flags(&self, f: LineFlags) -> LineFlags {
        LineFlags(self.flags.fetch_and(!f.0, Ordering::AcqRel))
    }
    pub fn flags(&self) -> LineFlags {
        LineFlags(self.flags.load(Ordering::Acquire))
    }

    /// A copy of the line as it is now (iokerneld side).
    pub fn snapshot(&self) -> LineSnap {
        // Head before tail: a consumer racing ahead can only make the queue
        // look longer than it was, never make a waiting item vanish.
        let rq_head = self.rq_head.load(Ordering::Relaxed);
        let in_head = self.in_head.load(Ordering::Relaxed);
        let rq_tail = self.rq_tail.load(Ordering::Relaxed);
        let in_tail = self.in_tail.load(Ordering::Relaxed);
        let t = self.next_timer_ns.load(Ordering::Relaxed);
        LineSnap {
            counters: QueueCounters {
                rq_head,
                rq_tail,
                in_head,
                in_tail,
            },
            flags: LineFlags(self.flags.load(Ordering::Relaxed)),
            next_timer_ns: (t != NO_TIMER).then_some(t),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            steals: self.steals.load(Ordering::Relaxed),
        }
    }
}

/// A copy of a queue line. Every value is possible (the runtime is
/// untrusted) and harmless to the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineSnap {
    pub counters: QueueCounters,
    pub flags: LineFlags,
    pub next_timer_ns: Option<u64>,
    pub busy_ns: u64,
    /// The runtime's steal count (wrapping; untrusted: iokerneld's stats
    /// take it through a clamp, crates/iokernel/README.md).
    pub steals: u32,
}

impl From<LineSnap> for QueueCounters {
    fn from(s: LineSnap) -> QueueCounters {
        s.counters
    }
}

impl LineSnap {
    /// Updates the fields of the policy's view of a kthread that come from
    /// the line (counters and busy time). Core, parked state and times are
    /// iokerneld's own bookkeeping (from the command rings and its grants),
    /// not the runtime's word, and are left alone.
    pub fn update(&self, k: &mut KthreadSnap) {
        k.counters = self.counters;
        k.busy_time = self.busy_ns;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn snapshot_and_policy_view() {
        let l = QueueLine::new();
        assert_eq!(l.snapshot().next_timer_ns, None);
        l.set_rq_tail(5);
        l.set_rq_head(2);
        l.set_in_tail(9);
        l.set_in_head(9);
        l.set_next_timer(Some(77));
        l.add_busy_ns(10);
        l.add_busy_ns(5);
        l.add_steal();
        l.add_steal();
        l.insert_flags(LineFlags::PARKED | LineFlags::PREEMPT_PENDING);
        l.remove_flags(LineFlags::PREEMPT_PENDING);
        let s = l.snapshot();
        assert_eq!(
            s.counters,
            QueueCounters {
                rq_head: 2,
                rq_tail: 5,
                in_head: 9,
                in_tail: 9
            }
        );
        assert!(s.flags.contains(LineFlags::PARKED));
        assert!(!s.flags.contains(LineFlags::PREEMPT_PENDING));
        assert_eq!(s.next_timer_ns, Some(77));
        assert_eq!(s.steals, 2);
        let mut k = KthreadSnap {
            core: Some(3),
            ..Default::default()
        };
        s.update(&mut k);
        assert_eq!(k.counters, s.counters);
        assert_eq!(k.busy_time, 15);
        assert_eq!(k.core, Some(3));
        assert!(QueueCounters::from(s).has_items());
    }

    #[test]
    fn a_doorbell_is_taken_once() {
        let l = QueueLine::new();
        assert!(!l.doorbell_rung());
        assert_eq!(l.take_doorbell(), None);
        assert!(l.ring_doorbell(0));
        assert!(l.doorbell_rung());
        assert_eq!(l.take_doorbell(), Some(0));
        assert_eq!(l.take_doorbell(), None);
        // An ask not taken yet is not replaced.
        assert!(l.ring_doorbell(41));
        assert!(!l.ring_doorbell(42));
        assert_eq!(l.take_doorbell(), Some(41));
        assert_eq!(l.take_doorbell(), None);
        // A slot that cannot be stored: nothing to ring.
        assert!(!l.ring_doorbell(u32::MAX));
        assert!(!l.doorbell_rung());
    }

    /// iokerneld's take-back of a polled core against the poller leaving
    /// the state (docs/idle-poll.md): each side's one atomic step tells it
    /// what the other did, and they agree — iokerneld believes the
    /// kthread polled exactly when the kthread finds itself taken back.
    #[test]
    fn a_take_back_and_a_poller_leaving_agree() {
        for _ in 0..2000 {
            let l = std::sync::Arc::new(QueueLine::new());
            l.insert_flags(LineFlags::IDLE_POLLING);
            let iokerneld = {
                let l = std::sync::Arc::clone(&l);
                std::thread::spawn(move || {
                    l.insert_flags(LineFlags::PREEMPT_PENDING)
                        .contains(LineFlags::IDLE_POLLING)
                })
            };
            let taken = l
                .remove_flags(LineFlags::IDLE_POLLING)
                .contains(LineFlags::PREEMPT_PENDING);
            assert_eq!(iokerneld.join().unwrap(), taken);
        }
    }

    /// iokerneld's grant of a parked kthread against the kthread waking
    /// itself for a frame on its own socket (docs/direct-path.md, "The
    /// self-woken kthread"): each side's one atomic step tells it whether
    /// the other came first, and exactly one goes ahead.
    #[test]
    fn a_grant_and_a_self_wake_never_both_go_ahead() {
        for _ in 0..2000 {
            let l = std::sync::Arc::new(QueueLine::new());
            l.insert_flags(LineFlags::SELF_WAKE_ARMED | LineFlags::SELF_WAKE_ALLOWED);
            let iokerneld = {
                let l = std::sync::Arc::clone(&l);
                std::thread::spawn(move || {
                    !l.insert_flags(LineFlags::GRANTING)
                        .contains(LineFlags::SELF_WOKEN)
                })
            };
            let self_woken = !l
                .insert_flags(LineFlags::SELF_WOKEN)
                .contains(LineFlags::GRANTING);
            let granted = iokerneld.join().unwrap();
            assert!(
                granted != self_woken,
                "granted {granted}, self-woken {self_woken}"
            );
        }
    }

    #[test]
    fn two_takers_race_and_one_wins() {
        for round in 0..200 {
            let l = std::sync::Arc::new(QueueLine::new());
            assert!(l.ring_doorbell(round));
            // iokerneld's take against the kthread's.
            let takers: Vec<_> = (0..2)
                .map(|_| {
                    let l = std::sync::Arc::clone(&l);
                    std::thread::spawn(move || l.take_doorbell())
                })
                .collect();
            let got: Vec<_> = takers
                .into_iter()
                .filter_map(|t| t.join().unwrap())
                .collect();
            assert_eq!(got, vec![round]);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicU32;
    use loom::sync::Arc;

    /// One ask, taken by the kthread while iokerneld, past its wait, takes
    /// it too and asks the next one (waking that slot itself if the line
    /// still holds the first), then takes what is left: every slot asked
    /// is woken exactly once.
    #[test]
    fn every_ask_is_taken_exactly_once() {
        loom::model(|| {
            let line = Arc::new(QueueLine::new());
            assert!(line.ring_doorbell(5));
            let woken = Arc::new(AtomicU32::new(0));
            let wake = |w: &AtomicU32, slot: u32| {
                w.fetch_add(1 << (slot * 4), Ordering::Relaxed);
            };
            let kthread = {
                let (line, woken) = (line.clone(), woken.clone());
                loom::thread::spawn(move || {
                    if let Some(slot) = line.take_doorbell() {
                        wake(&woken, slot);
                    }
                })
            };
            if let Some(slot) = line.take_doorbell() {
                wake(&woken, slot);
            }
            if !line.ring_doorbell(6) {
                wake(&woken, 6);
            }
            kthread.join().unwrap();
            if let Some(slot) = line.take_doorbell() {
                wake(&woken, slot);
            }
            assert_eq!(woken.load(Ordering::Relaxed), (1 << 20) | (1 << 24));
        });
    }
}
