//! The runtime's side of iokerneld (docs/design.md, "Processes", "Shared memory
//! between iokerneld and a runtime"): registration, the per-kthread queue
//! line and command rings, the grant latencies a kthread observes, and
//! parking under iokerneld (`park_with_iokernel`, `wait_for_grant`).
//!
//! In this mode a kthread holds a core only while iokerneld has granted it
//! one: it starts parked, parks by telling iokerneld (`Parked`, with its
//! next timer), answers a preemption with `Yielded`, and runs again only
//! when iokerneld grants it a core: through the grant word in its queue
//! line while it lingers after parking, through its eventfd once it sleeps
//! (docs/runtime.md, "Grants without a system call"). The runtime never
//! wakes its own kthreads; iokerneld sees queued work in the queue lines
//! (congestion detection) and grants cores.

use std::sync::atomic::{
    fence, AtomicBool,
    Ordering::{Acquire, Relaxed, SeqCst},
};
use std::time::{Duration, Instant};

use ginza_shm::{BeforeSleep, ToIokernel};

use crate::link::KLink;
use crate::own_socket::OwnSocket;
use crate::sched::{bump, eventfd_wait, Owner, PARKED, REVOKED, RUNNING};
use crate::self_wake::Woken;

// ---- parking and grants under iokerneld --------------------------------------

/// The start of a kthread's body under iokerneld (`runtime::start` puts it
/// first): tell iokerneld the kthread's thread id, then wait parked until
/// it grants a core; iokerneld counts every kthread parked until then.
/// Standalone it does nothing.
pub(crate) fn wait_for_first_grant(owner: &Owner<'_>) {
    let k = owner.kthread();
    if let Some(io) = &k.io {
        let rt = k.rt();
        if rt.link.as_ref().is_some_and(|l| l.cfg.sched_idle) {
            // Before `Started`: iokerneld reads the class by the tid it
            // is told (docs/runtime.md, "Batch kthreads run SCHED_IDLE").
            if let Err(e) = ginza_sys::sched_class::set_current_idle() {
                log::warn!("kthread {}: cannot run under SCHED_IDLE: {e}", k.id);
            }
        }
        // From here a grant may come in the word (iokerneld only grants
        // once it has read `Started`).
        io.line.wake().begin_park();
        owner.send_to_iokernel(ToIokernel::Started {
            tid: k.tid.load(SeqCst) as u32,
        });
        wait_for_grant(owner, io);
    }
}

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
    // Before iokerneld can read the `Parked`/`Yielded` below: it then
    // delivers a grant by the eventfd, which the armed sleep polls.
    let armed = crate::self_wake::arm(k, io);
    // Before iokerneld can read the `Parked`/`Yielded` below: its grant
    // may come in the word from then on.
    io.line.wake().begin_park();
    let next_deadline_ns = link.to_monotonic(rt.earliest_deadline());
    // Dispatch by iokerneld: a `Run` read from here to the next `Wake`
    // crossed this `Parked`/`Yielded` (docs/colocate.md).
    // The park answers the grant of the last `Wake` read: iokerneld
    // ignores it if that grant was answered already (a wake-up that was no
    // grant), so it cannot take a later grant's core or requests.
    let grant = owner.expect_wake_from_iokernel();
    owner.send_to_iokernel(if preempted {
        ginza_shm::ToIokernel::Yielded {
            next_deadline_ns,
            grant,
        }
    } else {
        bump(&k.stats.parks);
        ginza_shm::ToIokernel::Parked {
            next_deadline_ns,
            grant,
        }
    });
    wait_for_grant_or_frame(owner, io, armed);
}

/// Blocks until iokerneld grants this kthread a core (the grant word, after
/// a wake on the wake page or the eventfd), the runtime shuts down, or
/// iokerneld is lost.
pub(crate) fn wait_for_grant(owner: &Owner<'_>, io: &KLink) {
    wait_for_grant_or_frame(owner, io, None)
}

/// [`wait_for_grant`], or, `armed` with the application's own socket, for
/// a frame there too (`self_wake.rs`): then the kthread takes its core
/// itself and tells iokerneld before it runs anything.
fn wait_for_grant_or_frame(owner: &Owner<'_>, io: &KLink, armed: Option<&OwnSocket>) {
    let k = owner.kthread();
    let rt = k.rt();
    let linger = rt
        .link
        .as_ref()
        .map_or(Duration::ZERO, |l| l.cfg.linger_after_park);
    let word = io.line.wake();
    let mut lingering = false;
    let mut granted = false;
    if !linger.is_zero() {
        // Polls the grant word, not the eventfd: no system call per look,
        // and iokerneld writes no eventfd while we linger.
        let start = Instant::now();
        while start.elapsed() < linger && !rt.shutdown.load(Relaxed) && rt.managed() {
            if word.take_grant() {
                granted = true;
                lingering = true;
                break;
            }
            std::hint::spin_loop();
        }
    }
    if !granted && word.before_sleep() == BeforeSleep::Granted {
        // The grant came just as the linger ended (or before a zero one).
        granted = true;
        lingering = true;
    }
    let link = rt.link.as_ref().expect("managed runtime without a link");
    let mut by_eventfd = false;
    let mut self_woken = false;
    let mut watch_socket = true;
    while !granted && !rt.shutdown.load(Acquire) && rt.managed() {
        if let Some(own) = armed {
            match crate::self_wake::sleep(owner, io, own, &mut watch_socket) {
                Woken::Granted => (granted, by_eventfd) = (true, true),
                Woken::ByFrame => (granted, self_woken) = (true, true),
                Woken::Nothing => {}
            }
            continue;
        }
        granted = match link.wake_slot(k.id) {
            Some((page, slot)) => sleep_on_wake_page(io, rt, page, slot),
            // Before registration ends (the kthreads start first), or an
            // iokerneld without a wake page. The registration's kick that
            // sends a kthread to the page is no grant: then only the word
            // says one came.
            None => {
                by_eventfd = eventfd_wait(k, u64::MAX)
                    && (link.wake_slot(k.id).is_none() || word.take_grant());
                by_eventfd
            }
        };
    }
    word.awake();
    if granted {
        ginza_sys::hops::stamp(ginza_sys::hops::Hop::KthreadRuns);
    }
    if self_woken {
        // Before anything runs: iokerneld counts the core of this CPU as
        // granted by this wake (its next pass), and the next park answers
        // it as it answers a grant.
        owner.send_to_iokernel(ginza_shm::ToIokernel::SelfWoken {
            grant: owner.last_grant_from_iokernel(),
        });
        bump(&k.stats.self_wakes);
    }
    let decided = owner.drain_from_iokernel();
    if granted && !self_woken {
        bump(&k.stats.grants);
        if by_eventfd {
            bump(&k.stats.grants_by_eventfd);
        }
        if let Some(d) = decided {
            let running = ginza_sys::clock::monotonic_ns();
            io.record(running.saturating_sub(d), lingering);
            io.last_wake[0].store(d, Relaxed);
            io.last_wake[1].store(running, Relaxed);
        }
    }
    io.line
        .remove_flags(ginza_shm::LineFlags::PARKED | ginza_shm::LineFlags::SELF_WAKE_ARMED);
    settle_revocation(&k.revoke_requested, || rt.managed() && io.preempt_pending());
    k.state.store(RUNNING, SeqCst);
}

/// After a wait: `revoke_requested` says whether a preemption is pending
/// (`preempt_pending`, read from the queue line). A late signal may have
/// set it while the kthread was parked; iokerneld clears the line's flag
/// when it reads our Parked/Yielded, so after a grant the flag is set only
/// by a new preemption. Cleared first and the flag read after: stored as
/// one read's result, a preemption signalled between the read and the
/// store had its mark overwritten, the kthread never gave the core back,
/// and iokerneld, which signals once, waited for it for good (session 26:
/// an application left with no core and no parked kthread).
fn settle_revocation(revoke_requested: &AtomicBool, preempt_pending: impl FnOnce() -> bool) {
    revoke_requested.store(false, SeqCst);
    if preempt_pending() {
        revoke_requested.store(true, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preemption_signalled_while_the_flag_is_read_is_kept() {
        // A late signal left its mark while the kthread was parked. Then
        // the handler runs while the flag is read: the line said nothing
        // yet, then iokerneld set it and signalled.
        let revoke = AtomicBool::new(true);
        settle_revocation(&revoke, || {
            revoke.store(true, SeqCst);
            false
        });
        assert!(revoke.load(SeqCst), "the signal's mark was overwritten");
    }

    #[test]
    fn a_late_signal_from_the_park_is_forgotten_and_a_pending_flag_is_not() {
        let revoke = AtomicBool::new(true);
        settle_revocation(&revoke, || false);
        assert!(!revoke.load(SeqCst));
        settle_revocation(&revoke, || true);
        assert!(revoke.load(SeqCst));
    }
}

/// Sleeps on kthread `io`'s slot of the wake page until its grant word
/// says it was granted (true), or the runtime shuts down or loses
/// iokerneld (false). A wake from anyone else (another application may
/// wake any slot) finds no grant and sleeps again.
fn sleep_on_wake_page(
    io: &KLink,
    rt: &crate::sched::Shared,
    page: &ginza_shm::WakePage,
    slot: u32,
) -> bool {
    let word = io.line.wake();
    // SeqCst against the flags below: `Shared::wake_page_sleepers`, which
    // sets them first, sees this and wakes us until we have left.
    io.sleeping_on_page.store(true, SeqCst);
    let granted = loop {
        // Read before the look: iokerneld bumps it after a grant, so a
        // grant after the look ends the sleep at once.
        let seen = page.seen(slot);
        if word.take_grant() {
            break true;
        }
        if rt.shutdown.load(SeqCst) || !rt.managed() {
            break false;
        }
        if let Err(e) = page.wait(slot, seen) {
            log::warn!("kthread sleeping on wake slot {slot}: {e}");
            std::thread::yield_now();
        }
    };
    io.sleeping_on_page.store(false, SeqCst);
    granted
}

/// Answers a local-wake doorbell rung on this kthread's queue line
/// (docs/runtime.md, "Local wakes"): wakes the wake-page slot it names,
/// where a kthread of any application sleeps for a grant of the core this
/// one runs on — from the same CPU, so without an inter-processor
/// interrupt; the kernel then runs that kthread before this `SCHED_IDLE`
/// one. Cheap when none is rung: one load.
#[inline]
pub(crate) fn answer_doorbell(k: &crate::sched::KThread) {
    if let Some(io) = &k.io {
        if io.line.doorbell_rung() {
            answer_doorbell_slow(k, io);
        }
    }
}

#[cold]
fn answer_doorbell_slow(k: &crate::sched::KThread, io: &KLink) {
    // iokerneld rings only kthreads that map the page.
    let Some((page, _)) = k.rt().link.as_ref().and_then(|l| l.wake_slot(k.id)) else {
        return;
    };
    // A preemption between taking the ask and the wake would leave the
    // woken kthread waiting until this uthread runs again: deferred.
    let _deferred = crate::deferral::Guard::new();
    if let Some(slot) = io.line.take_doorbell() {
        if let Err(e) = page.wake(slot) {
            log::debug!("local wake of slot {slot}: {e}");
        }
    }
}

/// The last grant the caller's kthread ran after, under iokerneld: when
/// iokerneld decided it and when the kthread ran, CLOCK_MONOTONIC ns
/// (docs/results.md, "Where a request's time goes"). `None` outside a
/// managed kthread or before its first grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakeStamps {
    pub decided_ns: u64,
    pub running_ns: u64,
}

/// See [`WakeStamps`]: two relaxed loads, cheap enough per request.
pub fn last_wake() -> Option<WakeStamps> {
    let k = crate::sched::current_kthread_ref()?;
    let io = k.io.as_ref()?;
    let running_ns = io.last_wake[1].load(Relaxed);
    (running_ns != 0).then(|| WakeStamps {
        decided_ns: io.last_wake[0].load(Relaxed),
        running_ns,
    })
}
