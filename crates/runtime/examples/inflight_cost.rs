//! Scratch: time on core of tiny requests against how many are in flight.
use ginza_runtime::shinjuku::{serve, Arrival, SchedPolicy, ShinjukuConfig, Source};

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
    for n in [200u64, 1000, 1100, 2000, 4000] {
        let config = ShinjukuConfig {
            workers: 1,
            dispatcher_core: Some(0),
            worker_cores: Some(vec![1]),
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
        let mut oc: Vec<u64> = report
            .completions
            .iter()
            .filter(|c| c.id >= n)
            .map(|c| c.on_core_ns)
            .collect();
        oc.sort_unstable();
        let p = |q: f64| oc[((oc.len() - 1) as f64 * q) as usize];
        let w = report.threads.workers[0].unwrap_or_default();
        println!(
            "n {n}: {} done, {} rejected, on core p50 {} p90 {} p99 {} ns, {:.1} ms wall, worker cpu {:.1} ms wait {:.1} ms",
            oc.len(),
            report.rejected,
            p(0.5),
            p(0.9),
            p(0.99),
            report.elapsed.as_secs_f64() * 1e3,
            w.on_cpu_ns as f64 / 1e6,
            w.runnable_waiting_ns as f64 / 1e6
        );
    }
}
