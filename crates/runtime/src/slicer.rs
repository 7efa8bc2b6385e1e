//! Time slices: a uthread that has run a whole period while other
//! uthreads wait is asked, by the preemption signal, to make way. Off by
//! default (Shenango runs a uthread to completion); `Config::time_slice`
//! turns it on — the preload library does, because C programs count on
//! Linux to share a CPU among threads that never block.
//!
//! A thread of its own looks once a period: a kthread that is running
//! uthreads, has made no context switch since the last look, while work
//! waits in some runqueue or the shared queue, or a sleeper's time has
//! come, gets the signal. The
//! handler requeues the uthread (at the back: stealable) and the kthread
//! goes on with the next one; under iokerneld the kthread keeps its core.
//!
//! While nothing happens (no kthread switched, nothing waits, for
//! [`QUIET_LOOKS`] looks in a row) the slicer dozes instead of looking
//! every period: an idle program under `ginza run` woke it a thousand
//! times a second (1 ms periods) for nothing. Any push onto a runqueue
//! ends the doze ([`SlicerDoze::end`], one relaxed load while the slicer
//! is awake), and it never outlasts the earliest timer or [`DOZE_CAP`]
//! periods: the bound on the one wake-up a push racing the doze's start
//! can miss.
//!
//! [`SlicerDoze::end`]: crate::sched::SlicerDoze::end

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Duration;

use crate::sched::{Shared, RUNNING};

/// How often an ask that the handler could not honour yet (the uthread
/// was somewhere it must not be switched away from) is repeated within a
/// period, and how many times at most.
const RETRY: Duration = Duration::from_micros(50);
const RETRIES: u32 = 16;

/// Looks that found nothing to do before the slicer dozes.
const QUIET_LOOKS: u32 = 8;
/// The longest doze, in periods.
const DOZE_CAP: u32 = 32;

pub(crate) fn start(rt: Arc<Shared>, period: Duration) {
    let spawned = std::thread::Builder::new()
        .name("ginza-slicer".into())
        .spawn(move || {
            rt.slicer_doze.set_slicer(std::thread::current());
            let mut last = vec![u64::MAX; rt.kthreads.len()];
            let mut quiet = 0;
            while !rt.shutdown.load(Relaxed) {
                if quiet >= QUIET_LOOKS {
                    doze(&rt, period, &last);
                } else {
                    std::thread::sleep(period);
                }
                let now_ns = rt.now_ns();
                // Queued uthreads, or sleepers whose time has come (a
                // kthread fires its timers only between uthreads).
                let waiting = !rt.injector.is_empty()
                    || rt
                        .kthreads
                        .iter()
                        .any(|k| !k.stealer.is_empty() || k.timers.next_deadline() <= now_ns);
                let mut asked = false;
                let mut switched = false;
                for (k, seen) in rt.kthreads.iter().zip(last.iter_mut()) {
                    let now = k.stats.switches.load(Relaxed);
                    let stuck = now == *seen && k.state.load(Relaxed) == RUNNING;
                    switched |= now != *seen;
                    *seen = now;
                    if stuck && waiting && ask(k) {
                        asked = true;
                    }
                }
                quiet = if switched || waiting { 0 } else { quiet + 1 };
                // An ask the handler could not take (the uthread was in the
                // C library, say) stays set: ask again soon, while the
                // kthread has still not switched.
                for _ in 0..RETRIES {
                    if !asked {
                        break;
                    }
                    std::thread::sleep(RETRY);
                    asked = false;
                    for (k, seen) in rt.kthreads.iter().zip(last.iter()) {
                        if k.slice_asked.load(Relaxed)
                            && k.stats.switches.load(Relaxed) == *seen
                            && ask(k)
                        {
                            asked = true;
                        }
                    }
                }
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the time slicer: {e}; uthreads run to completion");
    }
}

/// Sleeps until a push ends the doze, the earliest timer of any kthread,
/// or [`DOZE_CAP`] periods; not at all if a kthread switched since the
/// last look (`last`).
fn doze(rt: &Shared, period: Duration, last: &[u64]) {
    rt.slicer_doze.begin();
    let switched = rt
        .kthreads
        .iter()
        .zip(last)
        .any(|(k, seen)| k.stats.switches.load(SeqCst) != *seen);
    if !switched && !rt.shutdown.load(SeqCst) {
        let timer = rt
            .kthreads
            .iter()
            .map(|k| k.timers.next_deadline())
            .min()
            .unwrap_or(u64::MAX)
            .saturating_sub(rt.now_ns());
        let cap = period * DOZE_CAP;
        std::thread::park_timeout(cap.min(Duration::from_nanos(timer)));
    }
    rt.slicer_doze.over();
}

/// Asks `k`'s running uthread to make way; false if `k` has no thread.
fn ask(k: &crate::sched::KThread) -> bool {
    let tid = k.tid.load(Relaxed);
    if tid == 0 {
        return false;
    }
    k.slice_asked.store(true, SeqCst);
    crate::signals::send_preempt(tid).is_ok()
}
