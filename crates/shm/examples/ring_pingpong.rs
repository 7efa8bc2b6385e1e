//! One ring hop, measured: two pinned threads bounce a packet descriptor
//! over a pair of rings, each spinning on its ring until the message
//! arrives, as iokerneld and a spinning kthread do. Prints the median and
//! the 99th percentile of the round trip (two hops) over batches.
//!
//! `cargo run --release -p ginza-shm --example ring_pingpong [CPU_A CPU_B]`

use std::time::Instant;

use ginza_shm::{heap_ring, PacketDesc};

const TRIPS: u32 = 200_000;
const BATCH: u32 = 1_000;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let cpu_a = args.next().transpose().expect("CPU_A").unwrap_or(0);
    let cpu_b = args.next().transpose().expect("CPU_B").unwrap_or(1);
    let (mut to_b, mut at_b) = heap_ring::<PacketDesc>(1024).expect("ring");
    let (mut to_a, mut at_a) = heap_ring::<PacketDesc>(1024).expect("ring");
    let echo = std::thread::spawn(move || {
        ginza_sys::affinity::pin_current_thread(cpu_b).expect("pin B");
        for _ in 0..TRIPS {
            let d = loop {
                if let Some(d) = at_b.pop() {
                    break d;
                }
                std::hint::spin_loop();
            };
            to_a.push(d).expect("push");
        }
    });
    ginza_sys::affinity::pin_current_thread(cpu_a).expect("pin A");
    let mut per_trip_ns = Vec::new();
    let mut start = Instant::now();
    for i in 0..TRIPS {
        let d = PacketDesc {
            buf: i,
            len: 64,
            ..PacketDesc::default()
        };
        to_b.push(d).expect("push");
        let back = loop {
            if let Some(d) = at_a.pop() {
                break d;
            }
            std::hint::spin_loop();
        };
        assert_eq!(back.buf, i, "the echo answered another message");
        if (i + 1) % BATCH == 0 {
            per_trip_ns.push(start.elapsed().as_nanos() as f64 / f64::from(BATCH));
            start = Instant::now();
        }
    }
    echo.join().expect("echo thread");
    per_trip_ns.sort_by(f64::total_cmp);
    let at = |q: f64| per_trip_ns[((per_trip_ns.len() - 1) as f64 * q) as usize];
    println!(
        "round trip (two ring hops), CPUs {cpu_a} and {cpu_b}: median {:.0} ns, p99 {:.0} ns over {} batches of {BATCH}",
        at(0.5),
        at(0.99),
        per_trip_ns.len()
    );
}
