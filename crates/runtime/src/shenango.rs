//! The Shenango scheduler loop of a kthread (docs/runtime.md, "Scheduling
//! (Shenango mode)"): run what is local, else look for work — its timers,
//! its packets, the shared queue, the hyperthread sibling, a random
//! kthread, all of them, the other kthreads' packets and timers — for
//! `spin_before_park`, then park (with iokerneld, or on its eventfd).
//! A revoked kthread parks until it is granted again.
//!
//! Every function takes the scheduler context's [`Owner`] token: this is
//! owner-only work on the kthread's runqueue, and safe code.

use std::sync::atomic::{
    fence,
    Ordering::{Acquire, Relaxed, SeqCst},
};
use std::time::{Duration, Instant};

use crate::idle_poll::IdlePoll;
use crate::iokernel::park_with_iokernel;
use crate::sched::{
    bump, eventfd_wait, finish_switch, fire_timers, fire_timers_locally, flush_own_tx, poll_events,
    poll_net, switch_to, Owner, TurnClock, URef, PARKED, REVOKED, RUNNING, SPINNING,
};

/// The Shenango scheduler: find work, run it, park when there is none.
pub(crate) fn scheduler_loop(owner: &mut Owner<'_>) {
    let k = owner.kthread();
    let rt = k.rt();
    loop {
        if rt.shutdown.load(Acquire) {
            break;
        }
        k.sched.preempt.pending.store(false, Relaxed);
        crate::iokernel::answer_doorbell(k);
        if !k.revoke_requested.load(Acquire) {
            k.preempt_ask.clear();
        }
        if k.revoke_requested.load(Acquire) {
            park_revoked(owner);
            continue;
        }
        match find_work(owner) {
            Some(u) => {
                rt.watch_timers_of(k);
                k.start_busy();
                let from = k.sched_ptr();
                // SAFETY: `u` was dequeued; we are in the scheduler context,
                // which resumes on this kthread.
                unsafe { switch_to(owner, from, u.ptr()) };
                finish_switch();
                // The uthreads run since are done for now: what they sent
                // on the direct path leaves in one kick.
                flush_own_tx(k);
                k.publish_busy(false);
            }
            None => park_idle(owner),
        }
    }
}

/// Local runqueue, then timers, then stealing (shared queue, hyperthread
/// sibling, a random kthread, all of them) for up to `spin_before_park`;
/// then, under iokerneld, maybe polling on while idle (`idle_poll.rs`).
fn find_work(owner: &mut Owner<'_>) -> Option<URef> {
    let k = owner.kthread();
    if let Some(u) = owner.pop() {
        // More than the arrival brought: busy (idle_poll.rs, the bell held).
        k.release_bell();
        return Some(u);
    }
    let rt = k.rt();
    let mut idle_poll = IdlePoll::new(k);
    let mut spin = Spin::new(crate::self_wake::spin_before_park(k, rt.spin));
    k.state.store(SPINNING, Relaxed);
    rt.n_spinning.fetch_add(1, SeqCst);
    let found = loop {
        let mut clock = TurnClock::default();
        if rt.shutdown.load(Relaxed) || k.revoke_requested.load(Relaxed) {
            break None;
        }
        if idle_poll.as_ref().is_some_and(IdlePoll::taken_back) {
            break None;
        }
        if fire_timers_locally(owner, k, || clock.ns(rt)) > 0 {
            if let Some(u) = owner.pop() {
                break Some(u);
            }
        }
        // Packets on our own ingress ring first.
        if k.io.is_some() && poll_net(owner, k) > 0 {
            // More are likely: keep looking.
            spin.restart();
            IdlePoll::arrival(k);
            if let Some(u) = owner.pop() {
                break Some(u);
            }
        }
        // The netstack's events (protected mode).
        if poll_events(k) > 0 {
            spin.restart();
            IdlePoll::arrival(k);
            if let Some(u) = owner.pop() {
                break Some(u);
            }
        }
        if let Some(u) = steal_once(owner) {
            k.count_steal();
            IdlePoll::arrival(k);
            break Some(u);
        }
        // Then the packets of kthreads that are busy (or parked).
        if k.io.is_some() {
            let (processed, u) = steal_packets(owner);
            if processed > 0 {
                spin.restart();
                IdlePoll::arrival(k);
            }
            if u.is_some() {
                break u;
            }
        }
        // Timers of kthreads that are revoked or busy.
        for other in rt.kthreads.iter().filter(|o| o.id != k.id) {
            fire_timers_locally(owner, other, || clock.ns(rt));
        }
        if let Some(u) = owner.pop() {
            break Some(u);
        }
        if spin.over(&mut clock)
            && !idle_poll
                .as_mut()
                .is_some_and(|p| p.keep_polling(&mut clock))
        {
            break None;
        }
        std::hint::spin_loop();
    };
    // Out of the polling state before anything runs or parks. Taken back
    // while it still polled, it runs nothing it found (idle_poll.rs): that
    // waits on the runqueue, counted, for its next grant.
    let idled = idle_poll.as_ref().is_some_and(IdlePoll::is_on);
    let found = match found {
        Some(u) if idle_poll.as_mut().is_some_and(IdlePoll::leave) => {
            u.note_taken();
            owner.push(u);
            None
        }
        found => found,
    };
    drop(idle_poll);
    match (&found, idled) {
        // Parking or giving the core back: its command rings the bell.
        (None, _) => {
            k.bell_held.set(false);
            k.bell_owed.set(false);
        }
        // Work found without going idle first: busy, iokerneld must see it.
        (Some(_), false) => k.release_bell(),
        // What the arrival brought: the bell stays held (idle_poll.rs).
        (Some(_), true) => {}
    }
    rt.n_spinning.fetch_sub(1, SeqCst);
    k.state.store(RUNNING, Relaxed);
    if found.is_some() && !owner.runqueue().is_empty() {
        // We took a batch: let a parked kthread help with the rest.
        rt.notify_one();
    }
    found
}

/// The spin before parking: how long the kthread has looked for work
/// since it last found some. No clock read where the spin is zero (a
/// kthread that sleeps on its own socket, `self_wake.rs`): there each
/// request's look for work read it.
struct Spin {
    length: Duration,
    since: Option<Instant>,
}

impl Spin {
    fn new(length: Duration) -> Spin {
        let mut spin = Spin {
            length,
            since: None,
        };
        spin.restart();
        spin
    }

    fn restart(&mut self) {
        if !self.length.is_zero() {
            self.since = Some(Instant::now());
        }
    }

    fn over(&self, clock: &mut TurnClock) -> bool {
        self.since
            .is_none_or(|s| clock.now().saturating_duration_since(s) >= self.length)
    }
}

fn steal_once(owner: &Owner<'_>) -> Option<URef> {
    let k = owner.kthread();
    let rt = k.rt();
    if let Some(u) = owner.take_injected() {
        return Some(u);
    }
    for &s in &k.siblings {
        let v = &rt.kthreads[s];
        if let Some(u) = owner.steal_batch(|local| v.stealer.steal_batch_and_pop(local), v) {
            return Some(u);
        }
    }
    let n = rt.kthreads.len();
    if n < 2 {
        return None;
    }
    let start = (k.next_random() % n as u64) as usize;
    (0..n)
        .map(|i| (start + i) % n)
        .filter(|&v| v != k.id)
        .find_map(|v| {
            let v = &rt.kthreads[v];
            owner.steal_batch(|local| v.stealer.steal_batch_and_pop(local), v)
        })
}

/// Steals packet processing from the other kthreads' ingress rings, from a
/// random one on: the frames processed, and a uthread they woke, if any.
fn steal_packets(owner: &mut Owner<'_>) -> (usize, Option<URef>) {
    let k = owner.kthread();
    let rt = k.rt();
    let n = rt.kthreads.len();
    if n < 2 {
        return (0, None);
    }
    let first = (k.next_random() % n as u64) as usize;
    let mut processed = 0;
    for v in (0..n).map(|i| (first + i) % n).filter(|&v| v != k.id) {
        let got = poll_net(owner, &rt.kthreads[v]);
        if got > 0 {
            k.count_steal();
            processed += got;
            if let Some(u) = owner.pop() {
                return (processed, Some(u));
            }
        }
    }
    (processed, None)
}

/// Parks an idle kthread until work is pushed for it or its next timer is due.
fn park_idle(owner: &Owner<'_>) {
    let k = owner.kthread();
    let rt = k.rt();
    if k.revoke_requested.load(Acquire) {
        return; // taken back while polling: the loop gives the core back
    }
    if let (true, Some(io)) = (rt.managed(), &k.io) {
        return park_with_iokernel(owner, io, false);
    }
    k.state.store(PARKED, SeqCst);
    if rt.last_event_poller(k) {
        // Protected mode: keep polling the netstack's events.
        k.state.store(RUNNING, SeqCst);
        return;
    }
    rt.n_parked.fetch_add(1, SeqCst);
    fence(SeqCst);
    if !(rt.work_visible(k) || rt.shutdown.load(SeqCst) || k.revoke_requested.load(SeqCst)) {
        bump(&k.stats.parks);
        // Wake for the earliest timer of any kthread: one that is busy
        // running a long uthread cannot fire its own.
        eventfd_wait(k, rt.earliest_deadline());
    }
    if k.state.swap(RUNNING, SeqCst) == PARKED {
        rt.n_parked.fetch_sub(1, SeqCst);
    }
}

/// Parks a revoked kthread until it is granted again. Its timers still fire:
/// the uthreads they wake go to the shared queue for the active kthreads.
fn park_revoked(owner: &Owner<'_>) {
    let k = owner.kthread();
    let rt = k.rt();
    bump(&k.stats.revocations);
    if let (true, Some(io)) = (rt.managed(), &k.io) {
        return park_with_iokernel(owner, io, true);
    }
    k.state.store(REVOKED, SeqCst);
    // What is left on our runqueue (the uthread we were running, at least)
    // must be stolen by a kthread that still has a core.
    if !k.stealer.is_empty() {
        rt.notify_one();
    }
    while k.revoke_requested.load(Acquire) && !rt.shutdown.load(Acquire) {
        eventfd_wait(k, k.live_next_deadline());
        if fire_timers(k, || rt.now_ns(), |u| rt.push_injector(u)) > 0 {
            rt.notify_one();
        }
    }
    k.state.store(RUNNING, SeqCst);
}
