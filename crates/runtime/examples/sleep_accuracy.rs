//! How late `ginza_runtime::sleep` wakes on an idle machine: one kthread,
//! one uthread that sleeps repeatedly (so the kthread parks with the timer
//! as its deadline); prints the median and p99 overshoot for a few lengths.
//!
//! `cargo run --release -p ginza-runtime --example sleep_accuracy`

use std::time::{Duration, Instant};

fn main() {
    let rounds = 2_000;
    let rows = ginza_runtime::run(ginza_runtime::Config::with_kthreads(1), move || {
        [10u64, 100, 1_000]
            .into_iter()
            .map(|us| {
                let d = Duration::from_micros(us);
                let mut late: Vec<f64> = (0..rounds)
                    .map(|_| {
                        let t = Instant::now();
                        ginza_runtime::sleep(d);
                        (t.elapsed() - d).as_secs_f64() * 1e6
                    })
                    .collect();
                late.sort_by(f64::total_cmp);
                (us, late[late.len() / 2], late[late.len() * 99 / 100])
            })
            .collect::<Vec<_>>()
    })
    .expect("runtime");
    println!("sleep   overshoot p50   p99   ({rounds} sleeps each, µs)");
    for (us, p50, p99) in rows {
        println!("{us:>5}µs {p50:>13.1} {p99:>6.1}");
    }
}
