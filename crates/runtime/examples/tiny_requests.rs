//! Shinjuku mode with empty requests: how many requests per second one
//! dispatcher and one worker get through (c-FCFS, open loop at full rate).
//!
//! `cargo run --release -p ginza-runtime --example tiny_requests [N]`

use ginza_runtime::shinjuku::{serve, Arrival, SchedPolicy, ShinjukuConfig, Source};

struct Burst {
    left: u64,
}

impl Source<u64> for Burst {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<u64>> {
        (self.left > 0).then(|| {
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

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let cpus = ginza_cpus();
    let config = ShinjukuConfig {
        workers: 1,
        dispatcher_core: cpus.first().copied(),
        worker_cores: cpus.get(1).map(|&c| vec![c]),
        policy: SchedPolicy::CFcfs,
        ..ShinjukuConfig::default()
    };
    let report = serve(config, Burst { left: n }, |x| x).expect("serve");
    let secs = report.elapsed.as_secs_f64();
    println!(
        "{} requests in {:.3} s: {:.2} M requests/s (1 dispatcher + 1 worker)",
        report.completions.len(),
        secs,
        report.completions.len() as f64 / secs / 1e6
    );
}

/// The CPUs this process may use, from its affinity mask.
fn ginza_cpus() -> Vec<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .map(|list| {
            list.split(',')
                .flat_map(|part| match part.split_once('-') {
                    Some((a, b)) => {
                        (a.parse().unwrap_or(0)..=b.parse().unwrap_or(0)).collect::<Vec<_>>()
                    }
                    None => part.parse().ok().into_iter().collect(),
                })
                .collect()
        })
        .unwrap_or_default()
}
