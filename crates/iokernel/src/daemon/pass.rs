//! The allocation pass and hand-overs: each kthread's command ring, the
//! snapshots the policy reads, its decisions carried out (grants, wakes,
//! preemptions), a core handed over once its preempted holder gives it
//! back, and kthreads that miss the preemption deadline.

use std::os::fd::AsFd;
use std::time::Duration;

use ginza_policy::alloc::{AppSnap, Decision, KthreadSnap};
use ginza_shm::{
    next_grant, LineFlags, PreemptReason, RecvError, SendError, ToIokernel, ToKthread,
    UNNUMBERED_GRANT,
};
use log::{debug, warn};

use super::{App, Iokerneld};
use crate::actuator::{CoreActuator, Target};
use ginza_sys::clock;

/// How long a kthread polling while idle has to see its queue line's
/// `PREEMPT_PENDING` and yield before the signal is sent (docs/idle-poll.md):
/// it looks on every turn of its loop, well under a microsecond apart unless
/// Linux runs another thread on its CPU.
const POLLER_GRACE: Duration = Duration::from_micros(20);

/// A latency-critical application granted a core this recently is taken
/// to want one again (`AppSnap::granted_lately`, docs/idle-poll.md,
/// "Wanted again soon"): other applications' kthreads park rather than
/// poll. A millisecond: requests 1,000 a second or more apart that each
/// need a grant.
const RECENT_GRANT_NS: u64 = 1_000_000;

/// What an allocation pass asks of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PassKind {
    /// The periodic pass ([`ginza_policy::alloc::CoreAllocator::pass`]).
    Interval,
    /// Packets reached applications with no core
    /// ([`ginza_policy::alloc::CoreAllocator::on_work_for`]).
    WorkArrived,
}

/// One kthread's grant numbers (docs/colocate.md, "Grant numbers"): each
/// `Wake` carries the next number, and the kthread's `Parked`/`Yielded`
/// carries back the number of the last `Wake` it read — the grant it
/// answers. A park with an older number, or a second one for the same
/// grant, was sent after a wake-up that was no grant: taken, it would
/// take the current grant's core and requests from a kthread that runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct GrantNumbers {
    /// The number of the last `Wake` put on the kthread's ring.
    last: u16,
    /// That grant has not been answered yet.
    open: bool,
}

impl GrantNumbers {
    /// The number the next grant's `Wake` carries.
    pub(super) fn next(&self) -> u16 {
        next_grant(self.last)
    }

    /// A grant was made: `sent` its `Wake` carrying `number`, or `None`
    /// when the `Wake` did not fit the ring — then the kthread, which reads
    /// every `Wake` before it first, answers with the last one's number.
    pub(super) fn granted(&mut self, sent: Option<u16>) {
        if let Some(n) = sent {
            self.last = n;
        }
        self.open = true;
    }

    /// Whether a `Parked`/`Yielded` carrying `grant` answers the open
    /// grant (then it is closed); `false`: stale, to be ignored.
    /// [`UNNUMBERED_GRANT`] (a client that does not number its parks) is
    /// always taken.
    pub(super) fn answers(&mut self, grant: u16) -> bool {
        if grant == UNNUMBERED_GRANT || (self.open && grant == self.last) {
            self.open = false;
            return true;
        }
        false
    }

    /// Whether a grant is open (for the log).
    pub(super) fn is_open(&self) -> bool {
        self.open
    }

    pub(super) fn last(&self) -> u16 {
        self.last
    }
}

/// A grant whose core is still held by a preempted kthread: carried out
/// when that kthread reports `Yielded`/`Parked`, misses its deadline, or
/// its application goes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Handover {
    app_id: u64,
    kthread: usize,
    core: usize,
    /// When the victim was preempted (CLOCK_MONOTONIC).
    preempted_ns: u64,
}

/// A local wake asked of a `SCHED_IDLE` kthread (`Config::local_wake_wait`;
/// docs/runtime.md, "Local wakes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Doorbell {
    /// The kthread asked (application id, kthread): its queue line holds
    /// the doorbell.
    victim: (u64, usize),
    /// The kthread to wake (application id, kthread).
    woken: (u64, usize),
    /// When iokerneld writes the eventfd itself if the doorbell is still
    /// there (CLOCK_MONOTONIC ns).
    due: u64,
}

impl<A: CoreActuator> Iokerneld<A> {
    /// Drains one kthread's command ring.
    pub(super) fn drain(app: &mut App, k: usize, now: u64, ready: &mut Vec<Handover>) {
        let cap = app.ends[k].from_kthread.raw().capacity();
        for _ in 0..cap {
            let msg = match app.ends[k].from_kthread.recv() {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(RecvError::Corrupt(e)) => {
                    return app.doom(format!("kthread {k}'s command ring is corrupt: {e}"));
                }
                Err(RecvError::Decode(e)) => {
                    return app.doom(format!("kthread {k} sent an undecodable command: {e}"));
                }
            };
            let kt = &mut app.kt[k];
            match msg {
                ToIokernel::Started { tid } => {
                    let ok = i32::try_from(tid).is_ok_and(|t| t > 0)
                        && std::path::Path::new(&format!("/proc/{}/task/{tid}", app.pid)).exists();
                    if !ok {
                        return app.doom(format!(
                            "kthread {k} reported tid {tid}, which is not a thread of pid {}",
                            app.pid
                        ));
                    }
                    kt.tid = Some(tid as i32);
                    kt.started_unpinned = kt.core.is_some() && kt.pinned.is_none();
                    kt.idle_class = matches!(
                        ginza_sys::sched_class::policy_of(tid as i32),
                        Ok(ginza_sys::sched_class::Policy::Idle)
                    );
                }
                ToIokernel::HandBack { request, completed } => {
                    let told = match &mut app.dispatch {
                        Some(d) => d.hand_back(k, request, completed, now),
                        None => Err(format!(
                            "kthread {k} handed back request {request}, but iokerneld dispatches none of its requests"
                        )),
                    };
                    if let Err(reason) = told {
                        return app.doom(reason);
                    }
                }
                ToIokernel::Refused { request } => {
                    let told = match &mut app.dispatch {
                        Some(d) => d.refused(k, request, now),
                        None => Err(format!(
                            "kthread {k} refused request {request}, but iokerneld dispatches none of its requests"
                        )),
                    };
                    if let Err(reason) = told {
                        return app.doom(reason);
                    }
                }
                ToIokernel::SelfWoken { grant } => {
                    // Taken as a grant of the core it runs on, accounted
                    // after the drains (`self_wake.rs`); its next park
                    // answers it. Not where a grant of iokerneld's crossed
                    // it (the kthread woke itself, ran and parked again
                    // before this read, and iokerneld granted it since:
                    // that grant is the one it runs on, and this park
                    // is stale too), nor from a kthread not parked.
                    let answers_last = grant == UNNUMBERED_GRANT || grant == kt.grants.last();
                    if !kt.parked || kt.grants.is_open() || !answers_last {
                        debug!(
                            "app {:?} kthread {k}: a self-wake answering grant {grant} ignored",
                            app.name
                        );
                        continue;
                    }
                    kt.grants.granted(None);
                    kt.parked = false;
                    kt.self_woke = true;
                }
                ToIokernel::Parked {
                    next_deadline_ns,
                    grant,
                }
                | ToIokernel::Yielded {
                    next_deadline_ns,
                    grant,
                } => {
                    if !kt.grants.answers(grant) {
                        // It answers a grant already answered: sent after
                        // a wake-up that was no grant. Taken, it would
                        // take the current grant's core and its requests
                        // from a kthread that runs (docs/colocate.md,
                        // "Grant numbers").
                        app.stale_parks += 1;
                        debug!(
                            "app {:?} kthread {k}: a park answering grant {grant} ignored (grant {} is {})",
                            app.name,
                            kt.grants.last(),
                            if kt.grants.is_open() { "open" } else { "answered" }
                        );
                        continue;
                    }
                    let parked = matches!(msg, ToIokernel::Parked { .. });
                    app.parks += u64::from(parked);
                    if let Some(d) = &mut app.dispatch {
                        d.gave_core_back(k, parked, now);
                    }
                    // Either way the kthread gave its core back and waits
                    // to be woken, at the latest for its timer.
                    if let Some(c) = kt.core.take() {
                        kt.last_core = Some(c);
                        app.last_yielded_core = Some(c);
                    }
                    kt.parked = true;
                    kt.self_woke = false;
                    kt.preempting = false;
                    kt.evicted = false;
                    kt.parked_since = now;
                    kt.timer = next_deadline_ns;
                    kt.drain_egress = true;
                    kt.awaiting = None;
                    kt.signal_due = None;
                    ready.extend(kt.handover.take());
                    app.ends[k].line.remove_flags(LineFlags::PREEMPT_PENDING);
                }
            }
        }
    }

    /// One allocation pass, timed into the stats.
    pub(super) fn pass(&mut self, now: u64, kind: PassKind) {
        // Not `now`: a control poll may have run since it was read.
        let t0 = self.clock.now_ns();
        let actions = self.meter.actions;
        self.pass_inner(now, kind);
        // A kthread granted now gets its request at once, not one loop
        // later: it looks for one only briefly before it parks again.
        self.dispatch_step(now);
        let t1 = self.clock.now_ns();
        let acted = !self.decisions.is_empty() || self.meter.actions != actions;
        self.meter.record_pass(t1.saturating_sub(t0), acted);
    }

    fn pass_inner(&mut self, now: u64, kind: PassKind) {
        self.passes += 1;
        for app in &mut self.apps {
            for k in 0..app.kt.len() {
                if app.doomed.is_some() {
                    break;
                }
                Self::drain(app, k, now, &mut self.ready);
            }
        }
        self.reap();
        self.pin_started();
        self.check_overdue(now);
        self.complete_handovers();
        // Before the self-wakes read are booked: a self-woken kthread whose
        // park and next self-wake came in one drain gave its core back in
        // between, and the `SCHED_IDLE` victim ran there meanwhile; its
        // preemption is withdrawn first, and the new self-wake preempts it
        // afresh, with a grace of its own. Booked the other way round, the
        // grace ran from the first of a train of short stays, and the victim
        // was signalled (docs/direct-path.md, "The self-woken server's cost").
        self.withdraw_or_signal(now);
        self.account_self_wakes(now);

        self.snapshot(now);
        self.decide(now, kind);
        ginza_policy::alloc::wanted_elsewhere(
            &self.topo,
            &self.snaps,
            &self.decisions,
            &mut self.wanted,
        );
        self.carry_out(now);
        self.mark_wanted_cores();
        self.mark_self_wake();
        self.reap();
        self.complete_handovers();
        self.send_deferred_signals();
    }

    /// The core allocator's view of every application now (`snaps`), and
    /// whether iokerneld is busy and when its next timer is due.
    fn snapshot(&mut self, now: u64) {
        let (mut busy, mut polled) = (false, false);
        let mut next_timer: Option<u64> = None;
        self.snaps.resize_with(self.apps.len(), || AppSnap {
            key: 0,
            class: ginza_policy::alloc::AppClass::Batch,
            guaranteed: 0,
            max_cores: 0,
            kthreads: Vec::new(),
            next_timer: None,
            last_yielded_core: None,
            netstack: None,
            granted_lately: false,
        });
        self.snaps.truncate(self.apps.len());
        // Frames delivered before this pass, then the kthreads' flags read
        // (a kthread blocked while idle, below).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        for (app, snap) in self.apps.iter_mut().zip(self.snaps.iter_mut()) {
            snap.key = app.id;
            snap.class = app.class.into();
            snap.guaranteed = app.guaranteed as usize;
            snap.max_cores = app.max_cores as usize;
            snap.last_yielded_core = app.last_yielded_core;
            snap.granted_lately = app
                .last_granted_ns
                .is_some_and(|t| now.saturating_sub(t) < RECENT_GRANT_NS);
            snap.netstack = super::protected::netstack_of(&self.protected_pids, app);
            snap.kthreads.clear();
            let mut app_timer: Option<u64> = None;
            let kthreads = app.kt.len();
            // Only an application on the switch has egress rings to drain.
            let has_egress = app.net.is_some() && app.doomed.is_none();
            let on_page = app.wake.is_some();
            let own_rx = super::own_socket::rx_indices(app);
            let left_to_self_wake = Self::left_to_self_wake(app);
            for (k, kt) in app.kt.iter_mut().enumerate() {
                let line = app.ends[k].line.snapshot();
                kt.steals.observe(line.steals, now);
                let mut ks = KthreadSnap {
                    core: kt.core,
                    // On the wake page, only once its `Started` was read
                    // (`tid`): before it, its `begin_park` may still come
                    // and overwrite the grant in its word, and the page,
                    // unlike an eventfd, keeps none. The grant would be
                    // lost with iokerneld believing the core taken.
                    parked: kt.parked && (!on_page || kt.tid.is_some()),
                    parked_since: kt.parked_since,
                    last_core: kt.last_core,
                    // Granted, waiting for a preempted holder's `Yielded`:
                    // not to be taken before it ran (issue 35).
                    handover_pending: kt.awaiting.is_some(),
                    ..Default::default()
                };
                line.update(&mut ks);
                // Its word, believed only while it holds the core: a lie
                // costs the liar its core, no one else anything.
                ks.idle_polling = kt.core.is_some()
                    && !kt.preempting
                    && line.flags.contains(LineFlags::IDLE_POLLING);
                if let (0, Some(d)) = (k, &app.dispatch) {
                    // The dispatch queues are this application's queued
                    // work (docs/colocate.md): counted as kthread 0's
                    // runqueue, which a dispatched application leaves empty.
                    let (taken, pushed) = d.queue_counters();
                    ks.counters.rq_head = ks.counters.rq_head.wrapping_add(taken);
                    ks.counters.rq_tail = ks.counters.rq_tail.wrapping_add(pushed);
                }
                // Packets waiting on the ingress ring: iokerneld is its
                // producer, so it knows the tail and reads the head.
                let ring = &mut app.ends[k].ingress;
                let waiting = ring.free().map_or(0, |free| ring.capacity() - free);
                ks.counters.in_tail = ring.next_seq();
                ks.counters.in_head = ks.counters.in_tail.wrapping_sub(waiting);
                // Blocked on its own socket while idle, it does not see
                // its ingress ring (a frame the switch path delivered):
                // woken (the fence before the loop orders the delivery
                // before this read of its flag).
                if waiting > 0 && ks.idle_polling && line.flags.contains(LineFlags::IDLE_BLOCKED) {
                    super::own_socket::wake_blocked(&app.ends[k].line, app.eventfds[k].as_fd());
                }
                // The direct path: frames on the application's own socket.
                let own_rx = super::own_socket::counted(
                    own_rx,
                    k,
                    left_to_self_wake,
                    &mut kt.own_rx_waiting,
                    now,
                );
                super::own_socket::fold(own_rx, k, &mut ks.counters);
                // Protected mode: channel rings are queued work too.
                if !app.protects.is_empty() || !self.protected_pids.is_empty() {
                    super::protected::fold(
                        &app.protects,
                        kthreads,
                        (app.pid, &app.name),
                        &self.protected_pids,
                        k,
                        &mut ks.counters,
                    );
                }
                // A kthread that parked since its egress ring was last
                // drained may have left frames there (a request sent just
                // before it parked): not idle until the dataplane has
                // moved them, or an idle sleep would hold them up to
                // `idle_sleep` (docs/protected.md, "Benchmark").
                // A kthread polling while idle is no reason to stay awake
                // (docs/idle-poll.md): it rings the bell when it runs work.
                // A nap (`idle_sleep`) has no bell, so it keeps the loop
                // from napping (`polled`).
                polled |= kt.core.is_some() && ks.idle_polling;
                busy |= (kt.core.is_some() && !ks.idle_polling)
                    || (kt.preempting && !kt.evicted)
                    || (has_egress && kt.drain_egress)
                    || ks.counters.has_items();
                if kt.parked {
                    if let Some(t) = kt.timer {
                        app_timer = Some(app_timer.map_or(t, |x: u64| x.min(t)));
                    }
                }
                snap.kthreads.push(ks);
            }
            snap.next_timer = app_timer;
            if let Some(t) = app_timer {
                busy |= t <= now;
                next_timer = Some(next_timer.map_or(t, |x: u64| x.min(t)));
            }
        }
        self.busy = busy;
        self.polled = polled;
        self.next_timer = next_timer;
    }

    /// The core allocator's decisions for this pass (`decisions`).
    fn decide(&mut self, now: u64, kind: PassKind) {
        self.decisions.clear();
        match kind {
            PassKind::Interval => {
                let congested = self
                    .alloc
                    .pass(now, &self.topo, &self.snaps, &mut self.decisions);
                for &a in congested {
                    self.apps[a].congestion += 1;
                }
                for (app, snap) in self.apps.iter_mut().zip(&self.snaps) {
                    if let Some(net) = &mut app.net {
                        net.steering
                            .sync(app.kt.iter().map(|k| k.core.is_some()), now);
                        net.steering.rebalance(now, &snap.kthreads);
                    }
                }
            }
            PassKind::WorkArrived => {
                self.work_arrived_at.clear();
                for id in &self.work_arrived {
                    self.work_arrived_at
                        .extend(self.apps.iter().position(|a| a.id == *id));
                }
                self.alloc.on_work_for(
                    now,
                    &self.topo,
                    &self.snaps,
                    &self.work_arrived_at,
                    &mut self.decisions,
                );
            }
        }
        // An interval pass sees the waiting packets too.
        self.work_arrived.clear();
    }

    /// Tells each kthread that holds a core whether another application
    /// is left wanting it (`LineFlags::CORE_WANTED`): such a kthread parks
    /// when it runs out of work instead of polling while idle
    /// (docs/idle-poll.md, "Poll only where nobody waits"). Written only
    /// when it changes: the line is the kthread's hot cache line.
    fn mark_wanted_cores(&mut self) {
        for (app, &wanted) in self.apps.iter_mut().zip(&self.wanted) {
            for (k, kt) in app.kt.iter_mut().enumerate() {
                if kt.core.is_none() || kt.core_wanted == wanted {
                    continue;
                }
                let line = &app.ends[k].line;
                if wanted {
                    line.insert_flags(LineFlags::CORE_WANTED);
                } else {
                    line.remove_flags(LineFlags::CORE_WANTED);
                }
                kt.core_wanted = wanted;
            }
        }
    }

    /// Carries out the allocator's decisions: grants (or hand-overs
    /// waiting for a victim) and preemptions.
    fn carry_out(&mut self, now: u64) {
        let decisions = std::mem::take(&mut self.decisions);
        // A preemption whose core the next decision grants (and when it
        // was made): that grant waits for the victim to give the core back.
        let mut victim: Option<(usize, usize, usize, u64)> = None;
        for (i, d) in decisions.iter().enumerate() {
            match *d {
                Decision::Grant { app, kthread, core } => {
                    let t0 = clock::monotonic_ns();
                    if !self.assign(app, kthread, core) {
                        continue;
                    }
                    self.apps[app].last_granted_ns = Some(now);
                    // The application is awake now: whichever kthread runs
                    // fires every due timer of the runtime, so due timers
                    // other parked kthreads reported must not wake it again.
                    // The granted kthread keeps the earliest of them: a
                    // grant undone before it ran (`preempt`) must still
                    // wake the application for them.
                    let kts = &mut self.apps[app].kt;
                    let mut due = None;
                    for kt in kts.iter_mut().filter(|k| k.parked) {
                        if let Some(t) = kt.timer.take_if(|t| *t <= now) {
                            due = Some(due.map_or(t, |d: u64| d.min(t)));
                        }
                    }
                    let granted = &mut kts[kthread];
                    granted.timer = earliest(granted.timer, due);
                    match victim.take() {
                        Some((va, vk, vc, preempted_ns)) if vc == core => {
                            let h = Handover {
                                app_id: self.apps[app].id,
                                kthread,
                                core,
                                preempted_ns,
                            };
                            let victim_id = self.apps.get(va).map(|a| a.id);
                            let at_once = self.cfg.handover_from_idle_at_once;
                            match self.apps.get_mut(va).and_then(|a| a.kt.get_mut(vk)) {
                                // A SCHED_IDLE victim cannot hold the core
                                // against the receiver, nor a poller that
                                // runs nothing: no wait for them.
                                Some(v)
                                    if v.preempting
                                        && !v.evicted
                                        && !(at_once && v.idle_class || v.preempted_polling) =>
                                {
                                    v.handover = Some(h);
                                    self.handover_waiting = true;
                                    self.apps[app].kt[kthread].awaiting =
                                        victim_id.map(|id| (id, vk));
                                }
                                _ => self.ready.push(h),
                            }
                        }
                        _ => {
                            self.wake(app, kthread, core, Some(t0));
                        }
                    }
                }
                Decision::Preempt { app, kthread, core } => {
                    let handed_over = matches!(decisions.get(i + 1), Some(Decision::Grant { core: c, .. }) if *c == core);
                    let reason = if handed_over {
                        PreemptReason::CoreNeeded
                    } else {
                        PreemptReason::Shrink
                    };
                    let since = handed_over.then(clock::monotonic_ns);
                    let (va, vk) = self.preempt(app, kthread, core, reason, now);
                    victim = since.map(|t| (va, vk, core, t));
                }
            }
        }
        self.decisions = decisions;
        if !self.decisions.is_empty() {
            self.busy = true;
        }
    }

    /// The preemption signals held back until the receivers were woken.
    fn send_deferred_signals(&mut self) {
        for (app_id, k, cpu) in std::mem::take(&mut self.signal_after_wakes) {
            let Some(app) = self.apps.iter_mut().find(|a| a.id == app_id) else {
                continue;
            };
            if k >= app.kt.len() || !app.kt[k].preempting {
                continue; // it answered or went away meanwhile
            }
            Self::signal_core_needed(&mut self.actuator, app, k, cpu);
        }
    }

    /// `SCHED_IDLE` victims not signalled yet (docs/runtime.md,
    /// "Preemptions withdrawn"): one whose core nobody holds any more (the
    /// receiver gave it back) keeps it — the preemption is withdrawn, its
    /// queue line's flag cleared, and the kernel already runs it there
    /// since the receiver blocked; one whose grace has run out is
    /// signalled and yields as any victim.
    ///
    /// A victim already signalled that has not yielded yet is withdrawn too
    /// once its receiver polls while idle: under `SCHED_IDLE` it cannot run
    /// to yield beside a poller on its CPU, and the poller, holding a core
    /// nobody asked for, would keep it for ever (docs/idle-poll.md).
    fn withdraw_or_signal(&mut self, now: u64) {
        let at_once = self.cfg.handover_from_idle_at_once;
        for a in 0..self.apps.len() {
            for k in 0..self.apps[a].kt.len() {
                let kt = &self.apps[a].kt[k];
                let signalled = kt.signal_due.is_none();
                if signalled && !(at_once && kt.idle_class && kt.preempting) {
                    continue;
                }
                let due = kt.signal_due.unwrap_or(0);
                let core = kt.last_core.filter(|_| kt.preempting && !kt.evicted);
                let Some(core) = core else {
                    self.apps[a].kt[k].signal_due = None;
                    continue;
                };
                let holder = self.apps.iter().enumerate().find_map(|(i, x)| {
                    x.kt.iter()
                        .position(|o| o.core == Some(core))
                        .map(|j| (i, j))
                });
                // A receiver that polls while idle wants the core no more
                // (docs/idle-poll.md): the `SCHED_IDLE` victim, still running
                // there, keeps it, and the poller is asked to give it back.
                let poller = holder
                    .filter(|&(i, j)| self.apps[a].kt[k].idle_class && self.polls_while_idle(i, j));
                if let (Some((i, j)), None) = (poller, &self.apps[a].doomed) {
                    self.preempt(i, j, core, PreemptReason::Shrink, now);
                }
                let held = holder.is_some() && poller.is_none();
                if signalled && (poller.is_none() || self.apps[a].doomed.is_some()) {
                    continue; // it yields when it runs, as any victim
                }
                let app = &mut self.apps[a];
                if !held && app.doomed.is_none() {
                    let kt = &mut app.kt[k];
                    kt.signal_due = None;
                    kt.preempting = false;
                    kt.core = Some(core);
                    app.ends[k].line.remove_flags(LineFlags::PREEMPT_PENDING);
                    self.meter.withdrawn += 1;
                    self.meter.actions += 1;
                    let prev = self.core_holder[core].replace(app.id);
                    if prev.is_some_and(|p| p != app.id) {
                        self.meter.reallocations += 1;
                    }
                    continue;
                }
                if now < due {
                    continue;
                }
                app.kt[k].signal_due = None;
                let Some(&cpu) = self.cfg.cores.get(core) else {
                    continue;
                };
                Self::signal_core_needed(&mut self.actuator, app, k, cpu);
            }
        }
    }

    /// Whether kthread `k` of application `a` holds its core polling while
    /// idle, by its queue line's word (docs/idle-poll.md).
    fn polls_while_idle(&self, a: usize, k: usize) -> bool {
        let app = &self.apps[a];
        app.kt[k].core.is_some()
            && !app.kt[k].preempting
            && app.ends[k].line.flags().contains(LineFlags::IDLE_POLLING)
    }

    /// Pins the kthreads that reported their tid while holding a core
    /// granted before it (the grant had nothing to pin): until their next
    /// grant they would run wherever Linux put them, and an unpinned
    /// kthread is never allowed to wake itself (session 26).
    fn pin_started(&mut self) {
        for app in &mut self.apps {
            for k in 0..app.kt.len() {
                let kt = &mut app.kt[k];
                if !std::mem::take(&mut kt.started_unpinned) || kt.preempting || kt.evicted {
                    continue;
                }
                let Some(cpu) = kt.core.and_then(|c| self.cfg.cores.get(c).copied()) else {
                    continue;
                };
                match self.actuator.pin(&Self::target(app, k), cpu) {
                    Ok(()) => app.kt[k].pinned = Some(cpu),
                    Err(e) => warn!(
                        "pinning app {:?} kthread {k} to cpu {cpu} after its start: {e}",
                        app.name
                    ),
                }
            }
        }
    }

    /// Preempted kthreads that missed the deadline are moved off their core
    /// and reported; their hand-overs go ahead.
    fn check_overdue(&mut self, now: u64) {
        let deadline = self.cfg.preempt_deadline.as_nanos() as u64;
        for app in &mut self.apps {
            for k in 0..app.kt.len() {
                let kt = &mut app.kt[k];
                if !kt.preempting {
                    continue;
                }
                let cpu = kt.last_core.and_then(|c| self.cfg.cores.get(c).copied());
                if kt.evicted {
                    // Still not given back: asked again once a deadline. A
                    // signal, or the mark it leaves, that went astray would
                    // otherwise leave it running without a core for good,
                    // and its application never granted again (it needs a
                    // parked kthread; session 26).
                    if now.saturating_sub(kt.preempt_since) >= deadline {
                        kt.preempt_since = now;
                        debug!("app {:?} kthread {k}: still preempting after its eviction; signalled again", app.name);
                        if let Some(cpu) = cpu {
                            Self::signal_core_needed(&mut self.actuator, app, k, cpu);
                        }
                    }
                    continue;
                }
                if kt.preempted_polling
                    && poller_deadline_held(
                        app.ends[k].line.flags().contains(LineFlags::IDLE_POLLING),
                        &mut kt.left_polling_seen,
                    )
                {
                    // Its core went on at once, and it has not even left
                    // the polling state (or this is the first pass to see
                    // it leave): Linux had not run it (a thread of
                    // another process on that CPU; seen for up to 53 ms on
                    // the loaded 2-vCPU VM). Moving it off would not free
                    // the core any sooner. Once it runs, it leaves the
                    // state and gives the core back within a few
                    // microseconds, running nothing in between (the
                    // take-back's atomic step, `preempt`), so its deadline
                    // counts from the first pass that saw it leave.
                    // Counted from the preemption, a deadline long past
                    // caught it on that way out; counted from the last pass
                    // that saw it poll, a gap between two of iokerneld's
                    // own passes did (iokerneld descheduled on a loaded
                    // machine; docs/idle-poll.md).
                    kt.preempt_since = now;
                    continue;
                }
                if now.saturating_sub(kt.preempt_since) < deadline {
                    continue;
                }
                if kt.idle_class && self.cfg.handover_from_idle_at_once {
                    // Its core went on at once; it holds nobody off it.
                    continue;
                }
                kt.evicted = true;
                // Its next ask, if it still holds on, a deadline from now.
                kt.preempt_since = now;
                // Moved (or maybe moved) off the CPU it was pinned to.
                kt.pinned = None;
                self.ready.extend(kt.handover.take());
                app.preempt_overdue += 1;
                self.meter.actions += 1;
                warn!(
                    "app {:?} kthread {k} (tid {:?}) did not give cpu {cpu:?} back within {:?} of its preemption; moving it off (where no core is shared, a batch kthread is lowered to SCHED_IDLE, a latency-critical one left as it is)",
                    app.name, kt.tid, self.cfg.preempt_deadline
                );
                if let Some(cpu) = cpu {
                    if let Err(e) = self.actuator.evict(&Self::target(app, k), cpu) {
                        let name = app.name.clone();
                        app.thread_call_failed(k, &e, || {
                            format!("moving app {name:?} kthread {k} off cpu {cpu}")
                        });
                    }
                }
            }
        }
    }

    /// Between passes: reads the command rings of the preempted kthreads
    /// whose core a hand-over waits for, and carries out the hand-overs of
    /// those that gave it back. A `Yielded` is acted on when it arrives
    /// instead of at the next pass (up to an interval later), and no other
    /// ring is read (docs/results.md, "Core allocation").
    pub(super) fn poll_handovers(&mut self, now: u64) {
        let mut waiting = false;
        for app in &mut self.apps {
            for k in 0..app.kt.len() {
                if app.doomed.is_some() {
                    break;
                }
                if app.kt[k].handover.is_some() {
                    Self::drain(app, k, now, &mut self.ready);
                    waiting |= app.kt[k].handover.is_some();
                }
            }
        }
        self.handover_waiting = waiting;
        if !self.ready.is_empty() {
            self.complete_handovers();
        }
    }

    /// Carries out the hand-overs whose core is free.
    pub(super) fn complete_handovers(&mut self) {
        while let Some(h) = self.ready.pop() {
            // Only if the receiver still holds the core (it may have been
            // preempted or gone in between).
            let woke = self
                .apps
                .iter()
                .position(|a| a.id == h.app_id)
                .filter(|&a| {
                    let kt = &self.apps[a].kt[h.kthread];
                    kt.core == Some(h.core) && !kt.preempting
                })
                .and_then(|a| {
                    let waker = self.local_waker(a, h.core);
                    self.wake_via(a, h.kthread, h.core, None, waker)
                });
            match woke {
                Some(end) => {
                    self.meter.handovers += 1;
                    self.meter
                        .record_handover(end.saturating_sub(h.preempted_ns));
                }
                None => self.meter.handovers_abandoned += 1,
            }
        }
    }

    /// The preemption signal for a core another kthread needs (held back
    /// until now); a failure is logged, or removes the application if the
    /// kthread's thread is gone.
    fn signal_core_needed(actuator: &mut A, app: &mut App, k: usize, cpu: usize) {
        if let Err(e) = actuator.preempt(&Self::target(app, k), cpu, PreemptReason::CoreNeeded) {
            Self::preempt_failed(app, k, cpu, &e);
        }
    }

    /// A preemption signal that could not be sent.
    fn preempt_failed(app: &mut App, k: usize, cpu: usize, e: &std::io::Error) {
        let name = app.name.clone();
        app.thread_call_failed(k, e, || {
            format!("preempting app {name:?} kthread {k} on cpu {cpu}")
        });
    }

    pub(super) fn target<'a>(app: &'a App, k: usize) -> Target<'a> {
        Target {
            app_id: app.id,
            app_name: &app.name,
            kthread: k,
            pid: app.pid,
            tid: app.kt[k].tid,
            batch: app.class == ginza_proto::messages::Class::Batch,
            pinned: app.kt[k].pinned,
            eventfd: app.eventfds[k].as_fd(),
            wake: app.ends[k].line.wake(),
            wake_slot: app
                .wake
                .as_ref()
                .map(|(page, first)| (&**page, first + k as u32)),
            doorbell: None,
        }
    }

    /// Bookkeeping of a grant: the kthread holds `core` from now on (the
    /// policy sees it so), whether or not it can be woken yet.
    fn assign(&mut self, a: usize, k: usize, core: usize) -> bool {
        if core >= self.cfg.cores.len() {
            return false;
        }
        let Some(app) = self.apps.get_mut(a) else {
            return false;
        };
        let Some(kt) = app.kt.get_mut(k) else {
            return false;
        };
        // Only an armed kthread can wake itself (it armed before the
        // `Parked` that made it parked here): no other line is written.
        // One that did clears `SELF_WAKE_ARMED` as it runs, maybe before
        // its `SelfWoken` is read here; `SELF_WOKEN` stays until it parks
        // again. A grant to it then would reach a running kthread, whose
        // next park answers the grant before and is ignored as stale: it
        // would sleep booked as running, its timers never served.
        let line = &app.ends[k].line;
        let flags = line.flags();
        if kt.parked
            && (flags.contains(LineFlags::SELF_WAKE_ARMED) || flags.contains(LineFlags::SELF_WOKEN))
            && line
                .insert_flags(LineFlags::GRANTING)
                .contains(LineFlags::SELF_WOKEN)
        {
            // It woke itself for a frame on its own socket first: it runs
            // already, and its `SelfWoken` is accounted at the next pass
            // (docs/direct-path.md, "The self-woken kthread").
            return false;
        }
        kt.core = Some(core);
        kt.parked = false;
        kt.preempting = false;
        // `timer` stays until the kthread parks again (it counts only
        // while parked): a grant undone before the kthread ran (`preempt`:
        // "goes back to parked") leaves it waiting for the same deadline,
        // which may be all that would ever wake it (issue 35).
        app.grants += 1;
        self.meter.grants += 1;
        let prev = self.core_holder[core].replace(app.id);
        if prev.is_some_and(|p| p != app.id) {
            self.meter.reallocations += 1;
        }
        true
    }

    /// The kthread that may wake application `a`'s kthread on `core`
    /// (`Config::local_wake_wait`), if `a` sleeps on the wake page: a
    /// `SCHED_IDLE` victim of another application that maps the page,
    /// preempted off `core` and not signalled yet (so still running
    /// there), whose doorbell is free.
    fn local_waker(&self, a: usize, core: usize) -> Option<(usize, usize)> {
        self.cfg.local_wake_wait?;
        self.apps.get(a)?.wake.as_ref()?;
        self.apps.iter().enumerate().find_map(|(i, app)| {
            if i == a || app.wake.is_none() || app.doomed.is_some() {
                return None;
            }
            let k = app.kt.iter().position(|kt| {
                kt.idle_class
                    && kt.preempting
                    && !kt.evicted
                    && kt.signal_due.is_some()
                    && kt.last_core == Some(core)
            })?;
            (!app.ends[k].line.doorbell_rung()).then_some((i, k))
        })
    }

    /// Local wakes not answered yet: a doorbell no longer rung was
    /// answered by the kthread asked (it woke the slot); one still pending
    /// at its due time (or with `all`) iokerneld takes and wakes itself.
    /// Both sides take it by a compare-and-swap: exactly one wakes.
    pub(super) fn answer_doorbells(&mut self, now: u64, all: bool) {
        let mut i = 0;
        while i < self.doorbells.len() {
            let d = self.doorbells[i];
            let victim = self
                .apps
                .iter()
                .find(|x| x.id == d.victim.0)
                .and_then(|x| x.ends.get(d.victim.1));
            let Some(victim) = victim else {
                // Never: a victim's removal answers its doorbells first.
                self.doorbells.swap_remove(i);
                continue;
            };
            if !victim.line.doorbell_rung() {
                self.meter.local_wakes += 1;
                self.doorbells.swap_remove(i);
                continue;
            }
            if !all && now < d.due {
                i += 1;
                continue;
            }
            match victim.line.take_doorbell() {
                Some(slot) => {
                    self.meter.local_wakes_by_iokernel += 1;
                    self.wake_slot(slot, d.woken);
                }
                None => self.meter.local_wakes += 1,
            }
            self.doorbells.swap_remove(i);
        }
    }

    /// Wakes wake-page slot `slot` for the kthread `woken` (application
    /// id, kthread) after a doorbell nobody answered.
    fn wake_slot(&self, slot: u32, woken: (u64, usize)) {
        if let Some(page) = &self.wake_page {
            if let Err(e) = page.wake(slot) {
                warn!("waking app {} kthread {}: {e}", woken.0, woken.1);
            }
        }
    }

    /// Application `id` goes away: its doorbells, and those that would
    /// wake its kthreads, are answered now (the latter by nobody: its
    /// kthreads are gone or no longer wait for grants).
    pub(super) fn forget_doorbells_of(&mut self, id: u64) {
        if self
            .doorbells
            .iter()
            .all(|d| d.victim.0 != id && d.woken.0 != id)
        {
            return;
        }
        let mut keep = Vec::with_capacity(self.doorbells.len());
        for d in std::mem::take(&mut self.doorbells) {
            if d.victim.0 != id && d.woken.0 != id {
                keep.push(d);
                continue;
            }
            let Some(victim) = self
                .apps
                .iter()
                .find(|x| x.id == d.victim.0)
                .and_then(|x| x.ends.get(d.victim.1))
            else {
                continue;
            };
            if let Some(slot) = victim.line.take_doorbell() {
                if d.woken.0 != id {
                    self.wake_slot(slot, d.woken);
                }
            }
        }
        self.doorbells = keep;
    }

    /// Wakes a kthread on the core it was assigned: the command ring, then
    /// the actuator (affinity, eventfd). `started`: when the grant's
    /// bookkeeping began, if it is part of this wake's cost. Returns when
    /// the wake was done, `None` if it could not be.
    fn wake(&mut self, a: usize, k: usize, core: usize, started: Option<u64>) -> Option<u64> {
        self.wake_via(a, k, core, started, None)
    }

    /// [`Self::wake`], where `waker` (application index, kthread), if
    /// any, is asked to write the eventfd if one is needed.
    fn wake_via(
        &mut self,
        a: usize,
        k: usize,
        core: usize,
        started: Option<u64>,
        waker: Option<(usize, usize)>,
    ) -> Option<u64> {
        let &cpu = self.cfg.cores.get(core)?;
        let app = self.apps.get_mut(a)?;
        if k >= app.kt.len() {
            return None;
        }
        app.kt[k].awaiting = None;
        // One clock read serves as the decision time and the cost's start.
        let t0 = started.unwrap_or_else(clock::monotonic_ns);
        let grant = app.kt[k].grants.next();
        let sent = app.ends[k].to_kthread.send(ToKthread::Wake {
            core: cpu as u32,
            decided_ns: t0,
            grant,
        });
        // Its next `Parked`/`Yielded` answers this grant.
        app.kt[k].grants.granted(sent.is_ok().then_some(grant));
        match sent {
            Ok(()) => {
                if let Some(d) = &mut app.dispatch {
                    // `Run`s may follow now (docs/colocate.md).
                    d.woken(k);
                }
            }
            Err(SendError::Full) => app.ring_full += 1,
            Err(SendError::Corrupt(e)) => {
                app.doom(format!("kthread {k}'s wake ring is corrupt: {e}"));
                return None;
            }
        }
        if let Some(d) = &mut app.dispatch {
            // Its first request between the Wake and the eventfd: the
            // kthread finds it as it wakes (docs/colocate.md).
            let granted = super::packets::granted(&app.kt);
            let sent = d.step(t0, granted, &mut app.ends);
            if let Some(net) = &mut app.net {
                net.stats.rx += sent;
            }
        }
        debug!("grant: app {:?} kthread {k} → cpu {cpu}", app.name);
        let kt_tid = app.kt[k].tid;
        let granted = {
            let app = &self.apps[a];
            let mut t = Self::target(app, k);
            let waker = waker.filter(|&(va, _)| va != a && va < self.apps.len());
            t.doorbell = waker.and_then(|(va, vk)| self.apps[va].ends.get(vk).map(|e| &*e.line));
            if app.ends[k]
                .line
                .flags()
                .contains(LineFlags::SELF_WAKE_ARMED)
            {
                // It sleeps in `poll` on its eventfd and its own socket,
                // not on the wake page (a runtime that lies here only gets
                // its own grants by the eventfd).
                t.wake_slot = None;
                t.doorbell = None;
            }
            self.actuator.grant(&t, cpu)
        };
        let app = &mut self.apps[a];
        let delivery = match granted {
            Ok(d) => {
                app.kt[k].pinned = kt_tid.map(|_| cpu);
                Some(d)
            }
            Err(e) => {
                let name = app.name.clone();
                app.thread_call_failed(k, &e, || {
                    format!("grant of cpu {cpu} to app {name:?} kthread {k}")
                });
                app.kt[k].pinned = None;
                None
            }
        };
        if let (Some(ginza_shm::GrantDelivery::Doorbell), Some((va, vk))) = (delivery, waker) {
            let wait = self.cfg.local_wake_wait.unwrap_or_default().as_nanos() as u64;
            self.doorbells.push(Doorbell {
                victim: (self.apps[va].id, vk),
                woken: (self.apps[a].id, k),
                due: clock::monotonic_ns().saturating_add(wait),
            });
        }
        let end = clock::monotonic_ns();
        self.meter.actions += 1;
        self.meter.record_grant(end.saturating_sub(t0), delivery);
        Some(end)
    }

    /// Asks kthread `k` of application `a` to give `core` back. Returns
    /// who holds the core now: the kthread itself, or — for a kthread that
    /// was granted the core but not woken yet (its hand-over pending) — the
    /// preempted kthread it was waiting for; that one's hand-over now goes
    /// to whoever is granted the core next.
    pub(super) fn preempt(
        &mut self,
        a: usize,
        k: usize,
        core: usize,
        reason: PreemptReason,
        now: u64,
    ) -> (usize, usize) {
        let Some(&cpu) = self.cfg.cores.get(core) else {
            return (a, k);
        };
        let Some(app) = self.apps.get_mut(a) else {
            return (a, k);
        };
        if k >= app.kt.len() {
            return (a, k);
        }
        let kt = &mut app.kt[k];
        kt.preempted_polling = false;
        let id = app.id;
        if let Some(i) = self
            .ready
            .iter()
            .position(|h| h.app_id == id && h.kthread == k)
        {
            // Granted earlier in this pass a core nobody held it off (a
            // SCHED_IDLE victim's, an overdue one's), its wake not sent yet:
            // it never ran, so it goes back to parked, silently, with the
            // timer it reported (`assign` keeps it). Preempting it instead
            // would wait for a `Yielded` from a kthread that was never
            // woken, and it would never be granted again.
            self.ready.swap_remove(i);
            kt.core = None;
            kt.parked = true;
            kt.parked_since = now;
            self.meter.handovers_abandoned += 1;
            return (a, k);
        }
        if let Some((victim_app, victim_k)) = kt.awaiting.take() {
            // Never ran on the core: it goes back to parked, silently,
            // with its timer (`assign` keeps it).
            kt.core = None;
            kt.parked = true;
            kt.parked_since = now;
            let holder = self.apps.iter().position(|x| x.id == victim_app);
            if let Some(v) = holder.and_then(|i| self.apps[i].kt.get_mut(victim_k)) {
                if v.handover.take().is_some() {
                    self.meter.handovers_abandoned += 1;
                }
            }
            return holder.map_or((a, k), |i| (i, victim_k));
        }
        if let Some(c) = kt.core.take() {
            kt.last_core = Some(c);
        }
        kt.preempting = true;
        kt.evicted = false;
        kt.preempt_since = now;
        app.preemptions += 1;
        self.meter.preemptions += 1;
        self.meter.actions += 1;
        // Whether it polled while idle, read in the same atomic step that
        // asks for the core: a poller that clears its flag after this step
        // sees the request in its own clearing step and runs nothing
        // (runtime's `IdlePoll::leave`); one that cleared it before runs
        // work and is preempted as any kthread (docs/idle-poll.md).
        let was = app.ends[k].line.insert_flags(LineFlags::PREEMPT_PENDING);
        let polled = was.contains(LineFlags::IDLE_POLLING);
        app.kt[k].preempted_polling = polled;
        app.kt[k].left_polling_seen = false;
        if polled && was.contains(LineFlags::IDLE_BLOCKED) {
            // Blocked on its own socket, it reads no flag until woken.
            super::own_socket::wake_blocked(&app.ends[k].line, app.eventfds[k].as_fd());
        }
        match app.ends[k].to_kthread.send(ToKthread::Preempt { reason }) {
            Ok(()) => {}
            Err(SendError::Full) => app.ring_full += 1,
            Err(SendError::Corrupt(e)) => {
                app.doom(format!("kthread {k}'s command ring is corrupt: {e}"));
                return (a, k);
            }
        }
        debug!(
            "preempt: app {:?} kthread {k} off cpu {cpu} ({reason:?})",
            app.name
        );
        if polled {
            // Polling while idle (docs/idle-poll.md): it reads the flag
            // within a turn of its loop and yields; the signal only if it
            // has not within the grace.
            let grace = POLLER_GRACE.as_nanos() as u64;
            app.kt[k].signal_due = Some(now.saturating_add(grace));
            return (a, k);
        }
        if reason == PreemptReason::CoreNeeded
            && app.kt[k].idle_class
            && self.cfg.handover_from_idle_at_once
        {
            // Its core goes to the receiver at once.
            let grace = self.cfg.idle_victim_grace.as_nanos() as u64;
            if grace > 0 {
                // Not signalled yet: withdrawn if the core comes back first.
                app.kt[k].signal_due = Some(now.saturating_add(grace));
            } else {
                // Signalled once the receiver has been woken.
                self.signal_after_wakes.push((app.id, k, cpu));
            }
            return (a, k);
        }
        if let Err(e) = self.actuator.preempt(&Self::target(app, k), cpu, reason) {
            Self::preempt_failed(app, k, cpu, &e);
        }
        (a, k)
    }
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// For a kthread preempted while it polled, at a pass that sees its line
/// say it still polls (`polling`) or not: whether its preemption deadline
/// is still held back (restarted at this pass). It is while it polls, and
/// at the first pass that sees it out of the polling state
/// (`left_seen`, set then); from the next pass on it runs.
fn poller_deadline_held(polling: bool, left_seen: &mut bool) -> bool {
    if polling {
        return true;
    }
    !std::mem::replace(left_seen, true)
}

#[cfg(test)]
mod tests {
    use super::poller_deadline_held;

    #[test]
    fn a_pollers_deadline_runs_from_the_first_pass_that_sees_it_stop_polling() {
        let mut left_seen = false;
        // Passes that see it poll (Linux has not run it yet) hold it back.
        assert!(poller_deadline_held(true, &mut left_seen));
        assert!(poller_deadline_held(true, &mut left_seen));
        // The first pass that sees it out of the state holds it back once
        // more, however long since the last pass (iokerneld may have been
        // descheduled meanwhile): its way out has a whole deadline.
        assert!(poller_deadline_held(false, &mut left_seen));
        assert!(left_seen);
        // From then on the deadline runs.
        assert!(!poller_deadline_held(false, &mut left_seen));
        assert!(!poller_deadline_held(false, &mut left_seen));
    }
}
