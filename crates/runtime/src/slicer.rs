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

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Duration;

use crate::sched::{Shared, RUNNING};

/// How often an ask that the handler could not honour yet (the uthread
/// was somewhere it must not be switched away from) is repeated within a
/// period, and how many times at most.
const RETRY: Duration = Duration::from_micros(50);
const RETRIES: u32 = 16;

pub(crate) fn start(rt: Arc<Shared>, period: Duration) {
    let spawned = std::thread::Builder::new()
        .name("ginza-slicer".into())
        .spawn(move || {
            let mut last = vec![u64::MAX; rt.kthreads.len()];
            while !rt.shutdown.load(Relaxed) {
                std::thread::sleep(period);
                let now_ns = rt.now_ns();
                // Queued uthreads, or sleepers whose time has come (a
                // kthread fires its timers only between uthreads).
                let waiting = !rt.injector.is_empty()
                    || rt
                        .kthreads
                        .iter()
                        .any(|k| !k.stealer.is_empty() || k.timers.next_deadline() <= now_ns);
                let mut asked = false;
                for (k, seen) in rt.kthreads.iter().zip(last.iter_mut()) {
                    let now = k.stats.switches.load(Relaxed);
                    let stuck = now == *seen && k.state.load(Relaxed) == RUNNING;
                    *seen = now;
                    if stuck && waiting && ask(k) {
                        asked = true;
                    }
                }
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

/// Asks `k`'s running uthread to make way; false if `k` has no thread.
fn ask(k: &crate::sched::KThread) -> bool {
    let tid = k.tid.load(Relaxed);
    if tid == 0 {
        return false;
    }
    k.slice_asked.store(true, SeqCst);
    crate::signals::send_preempt(tid).is_ok()
}
