//! Shinjuku mode's bound on requests in flight (docs/runtime.md, "Shinjuku
//! mode"): a request over the bound, or one whose stack cannot be mapped
//! when a worker is to run it first, is refused and counted; the others complete; nothing aborts. A binary of
//! its own: the stack-failure hook is process-wide.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ginza_runtime::shinjuku::{
    serve, testing, Arrival, Placement, Preemption, SchedPolicy, ShinjukuConfig, Source,
};

/// The tests here run one at a time (the hook is process-wide).
static SERIAL: Mutex<()> = Mutex::new(());

/// `n` requests (payload = index), all in the first dispatcher pass.
struct Burst {
    next: u64,
    n: u64,
}

impl Source<u64> for Burst {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<u64>> {
        if self.next == self.n {
            return None;
        }
        self.next += 1;
        Some(Arrival {
            class: 0,
            at_ns: now_ns,
            payload: self.next - 1,
        })
    }
    fn is_done(&self) -> bool {
        self.next == self.n
    }
}

fn config(max_in_flight: usize) -> ShinjukuConfig {
    ShinjukuConfig {
        workers: 1,
        policy: SchedPolicy::CPreSq {
            quantum: 20_000,
            placement: Placement::Tail,
        },
        preemption: Preemption::default(),
        max_in_flight,
        ..ShinjukuConfig::default()
    }
}

#[test]
fn requests_over_the_bound_are_refused_and_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ran = Arc::new(AtomicU64::new(0));
    let r = ran.clone();
    // The admitted requests block (sleep): blocked requests stay in flight,
    // so every arrival after the first two is over the bound.
    let report = serve(config(2), Burst { next: 0, n: 7 }, move |i| {
        ginza_runtime::sleep(Duration::from_millis(2));
        r.fetch_add(1, SeqCst);
        i * 10
    })
    .unwrap();
    assert_eq!(report.rejected, 5, "7 arrivals, a bound of 2");
    assert_eq!(report.rejected_no_stack, 0);
    assert_eq!(report.completions.len(), 2);
    assert_eq!(ran.load(SeqCst), 2, "a refused request never runs");
    let mut got: Vec<u64> = report
        .completions
        .iter()
        .map(|c| *c.result.as_ref().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        vec![0, 10],
        "the first two arrivals are the admitted ones"
    );
}

#[test]
fn a_stack_that_cannot_be_mapped_refuses_the_request() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A fresh runtime has no spare stacks: the first requests given to the
    // worker map one each, and the first three mappings fail.
    testing::fail_next_stack_maps(3);
    let report = serve(config(4096), Burst { next: 0, n: 8 }, |i| i + 1);
    testing::fail_next_stack_maps(0);
    let report = report.unwrap();
    assert_eq!(report.rejected, 3);
    assert_eq!(report.rejected_no_stack, 3);
    let mut got: Vec<u64> = report
        .completions
        .iter()
        .map(|c| *c.result.as_ref().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        (4..=8).collect::<Vec<_>>(),
        "arrivals 3..8 ran, once each"
    );
}

#[test]
fn a_bound_of_zero_is_a_clear_error() {
    let err = serve(config(0), Burst { next: 0, n: 1 }, |i| i).unwrap_err();
    assert!(err.to_string().contains("max_in_flight"), "{err}");
}
