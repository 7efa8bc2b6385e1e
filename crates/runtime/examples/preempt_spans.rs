//! One cooperative-preemption configuration of `ginza bench preempt`, alone,
//! for a profiler: long requests under c-PRE-SQ at a 5 µs quantum on one
//! worker (CPU 1) with the dispatcher on CPU 0, or the never-preempted
//! c-FCFS baseline. Prints the worker's CPU time and the per-preemption
//! spans (docs/results.md, "Preemption").
//!
//! `cargo run --release -p ginza-runtime --example preempt_spans -- \
//!   [preassign|roundtrip|fcfs] [requests] [ms of work each]`
//! e.g. under `perf record -e cpu-clock -t <worker tid>` or
//! `perf record -e cpu-clock --per-thread`.

use std::hint::black_box;

use ginza_runtime::preempt_point;
use ginza_runtime::shinjuku::{
    serve, Arrival, Placement, Preemption, SchedPolicy, ShinjukuConfig, Source,
};
use ginza_sys::clock;

struct AllAtOnce {
    left: u64,
}

impl Source<u64> for AllAtOnce {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<u64>> {
        (self.left > 0 && now_ns > 1_000_000).then(|| {
            self.left -= 1;
            Arrival {
                class: 0,
                at_ns: now_ns,
                payload: self.left,
            }
        })
    }
    fn is_done(&self) -> bool {
        self.left == 0
    }
}

/// The bench's work: xorshift steps, a preemption point every 64.
#[inline(never)]
fn chain(iters: u64, seed: u64, poll: bool) -> u64 {
    let mut x = seed | 1;
    let mut left = iters;
    while left > 0 {
        let n = left.min(64);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        left -= n;
        if poll {
            preempt_point();
        }
    }
    x
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "preassign".into());
    let requests: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let ms: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100.0);
    let t = std::time::Instant::now();
    black_box(chain(black_box(10_000_000), 1, false));
    let ns_per_iter = t.elapsed().as_nanos() as f64 / 1e7;
    let iters = (ms * 1e6 / ns_per_iter) as u64;
    let (policy, pre_assign_on_preempt) = match mode.as_str() {
        "fcfs" => (SchedPolicy::CFcfs, false),
        "roundtrip" => (
            SchedPolicy::CPreSq {
                quantum: 5_000,
                placement: Placement::Tail,
            },
            false,
        ),
        _ => (
            SchedPolicy::CPreSq {
                quantum: 5_000,
                placement: Placement::Tail,
            },
            true,
        ),
    };
    let poll = mode != "fcfs";
    let config = ShinjukuConfig {
        workers: 1,
        dispatcher_core: Some(0),
        worker_cores: Some(vec![1]),
        policy,
        preemption: Preemption::Cooperative { backstop: None },
        record_preemptions: true,
        record_worker_spans: true,
        pre_assign_on_preempt,
        max_in_flight: requests as usize,
        ..ShinjukuConfig::default()
    };
    let report = serve(config, AllAtOnce { left: requests }, move |seed| {
        let start = clock::thread_cpu_ns();
        black_box(chain(iters, seed, poll));
        (start, clock::thread_cpu_ns())
    })
    .expect("serve");
    let first = report
        .completions
        .iter()
        .filter_map(|c| c.result.as_ref().ok().map(|r| r.0))
        .min()
        .unwrap_or(0);
    let last = report
        .completions
        .iter()
        .filter_map(|c| c.result.as_ref().ok().map(|r| r.1))
        .max()
        .unwrap_or(0);
    let preemptions: u64 = report
        .completions
        .iter()
        .map(|c| u64::from(c.preemptions))
        .sum();
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let s = &report.preemption_samples;
    println!(
        "{mode}: worker cpu {:.3} ms, {preemptions} preemptions; medians ns: late {} \
         ask->off {} off->next {}; took next {}/{}; worker's own spans {:?}",
        (last - first) as f64 / 1e6,
        median(s.iter().map(|x| x.late_ns).collect()),
        median(s.iter().map(|x| x.handback_ns).collect()),
        median(s.iter().filter_map(|x| x.resume_ns).collect()),
        s.iter().filter(|x| x.took_next).count(),
        s.len(),
        report.worker_spans,
    );
}
