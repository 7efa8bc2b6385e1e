//! Shinjuku mode under load: a worker stops a request only when its
//! dispatcher asked (docs/runtime.md, "Shinjuku mode", the ask names its
//! run). Threads spinning beside the runtime (as `stress` would) make Linux
//! deschedule the dispatcher and the workers at any point, the interleavings
//! a quiet machine never shows. A binary of its own: its spinners would
//! disturb the timing of other tests.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_runtime::preempt_point;
use ginza_runtime::shinjuku::{
    serve, Arrival, Placement, Preemption, SchedPolicy, ShinjukuConfig, Source,
};

/// Busy work with a preemption point every 16 steps.
fn work(iters: u64, seed: u64) -> u64 {
    let mut x = seed | 1;
    for i in 0..iters {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        if i % 16 == 15 {
            preempt_point();
        }
    }
    x
}

/// `n` requests of mixed lengths, released a few at a time.
struct Mixed {
    next: u64,
    n: u64,
}

impl Source<u64> for Mixed {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<u64>> {
        (self.next < self.n).then(|| {
            self.next += 1;
            Arrival {
                class: 0,
                at_ns: now_ns,
                payload: self.next - 1,
            }
        })
    }
    fn is_done(&self) -> bool {
        self.next == self.n
    }
}

/// Threads that spin until dropped: more runnable threads than CPUs.
struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn start(n: usize) -> Spinners {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 1u64;
                    while !stop.load(Relaxed) {
                        for _ in 0..1000 {
                            x = std::hint::black_box(x.wrapping_mul(3).wrapping_add(1));
                        }
                    }
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Requests preempted at a 5 µs quantum, with and without pre-assignment,
/// one and two workers, the backstop signal on, while threads spin beside
/// them: every preemption the workers report was asked for, and every
/// request runs once with its right value.
#[test]
#[ignore = "fails in about 1 run of 3 under load: a run yields to an ask naming its own \
            stamp that the dispatcher recorded against no run (docs/results.md, the unasked \
            preemption); \
            before the stamped ask it failed in both runs tried"]
fn under_load_no_request_is_preempted_unasked() {
    let cpus = ginza_sys::affinity::allowed_cpus().unwrap().len();
    let _spin = Spinners::start(cpus + 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rounds = 0;
    let mut preemptions = 0;
    for round in 0.. {
        if round >= 8 && Instant::now() > deadline {
            break;
        }
        let (workers, pre_assign) = [(1, true), (2, true), (1, false), (2, false)][round % 4];
        let report = serve(
            ShinjukuConfig {
                workers,
                policy: SchedPolicy::CPreSq {
                    quantum: 5_000,
                    placement: if round % 8 < 4 {
                        Placement::Tail
                    } else {
                        Placement::Head
                    },
                },
                preemption: Preemption::Cooperative {
                    backstop: Some(Duration::from_micros(50)),
                },
                pre_assign,
                idle_spin: Duration::from_micros(20),
                ..ShinjukuConfig::default()
            },
            Mixed { next: 0, n: 200 },
            |i| work(if i % 4 == 0 { 20_000 } else { 2_000 }, i),
        )
        .unwrap();
        assert_eq!(report.completions.len(), 200, "round {round}");
        for c in &report.completions {
            let i = c.id;
            let want = work(if i % 4 == 0 { 20_000 } else { 2_000 }, i);
            assert_eq!(
                *c.result.as_ref().unwrap(),
                want,
                "round {round}: request {i}"
            );
        }
        assert_eq!(
            report.unasked_preemptions, 0,
            "round {round} ({workers} worker(s), pre-assignment {pre_assign}): preempted \
             without an ask; coop {}, signal {}, signals sent {}",
            report.coop_preemptions, report.signal_preemptions, report.signals_sent
        );
        rounds += 1;
        preemptions += report.coop_preemptions + report.signal_preemptions;
    }
    assert!(preemptions > 0, "{rounds} rounds and not one preemption");
}
