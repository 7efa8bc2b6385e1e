//! Shinjuku mode: what a short request (~0.5 µs of work) costs its worker
//! when a burst of N requests is in flight, measured on a second burst of
//! N that arrives after the first has drained (so on reused stacks), and
//! how many stacks the two bursts mapped (docs/results.md, "Shinjuku
//! policies": without spare stacks kept for every request in flight, a
//! burst over 1024 unmapped and remapped a stack per request).
//!
//! `cargo run --release -p ginza-runtime --example inflight_cost`
//! (dispatcher on the first allowed CPU, the worker on the second).
use ginza_runtime::shinjuku::{serve, Arrival, SchedPolicy, ShinjukuConfig, Source};

/// `n` requests at once, then `n` more 500 ms later.
struct Burst {
    left: u64,
    n: u64,
}

impl Source<u64> for Burst {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<u64>> {
        let at_ns = if self.left > self.n { 0 } else { 500_000_000 };
        (self.left > 0 && now_ns >= at_ns).then(|| {
            self.left -= 1;
            Arrival {
                class: 0,
                at_ns,
                payload: self.left,
            }
        })
    }
    fn is_done(&self) -> bool {
        self.left == 0
    }
}

fn main() {
    let cpus = ginza_sys::affinity::allowed_cpus().expect("the allowed CPUs");
    for n in [200u64, 1000, 1100, 2000, 4000] {
        let config = ShinjukuConfig {
            workers: 1,
            dispatcher_core: cpus.first().copied(),
            worker_cores: cpus.get(1).map(|&c| vec![c]),
            policy: SchedPolicy::CFcfs,
            ..ShinjukuConfig::default()
        };
        let report = serve(config, Burst { left: 2 * n, n }, |x| {
            let mut v = x | 1;
            for _ in 0..300 {
                v ^= v << 13;
                v ^= v >> 7;
                v ^= v << 17;
            }
            std::hint::black_box(v)
        })
        .expect("serve");
        let on_core = |second: bool| {
            let mut v: Vec<u64> = report
                .completions
                .iter()
                .filter(|c| (c.id >= n) == second)
                .map(|c| c.on_core_ns)
                .collect();
            v.sort_unstable();
            v
        };
        let (first, oc) = (on_core(false), on_core(true));
        let p = |q: f64| oc[((oc.len() - 1) as f64 * q) as usize];
        let w = report.threads.workers[0].unwrap_or_default();
        println!(
            "burst of {n}: first burst on core p50 {} ns; second p50 {} p90 {} p99 {} ns; \
             {} stacks mapped for both, {} rejected; {:.1} ms wall, worker on CPU {:.1} ms, \
             waiting for it {:.1} ms",
            first[first.len() / 2],
            p(0.5),
            p(0.9),
            p(0.99),
            report.stacks_mapped,
            report.rejected,
            report.elapsed.as_secs_f64() * 1e3,
            w.on_cpu_ns as f64 / 1e6,
            w.runnable_waiting_ns as f64 / 1e6
        );
    }
}
