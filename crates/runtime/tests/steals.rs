//! Steals reach iokerneld: each kthread counts its steals in its queue line
//! (`ginza_shm::QueueLine`), and iokerneld's stats report the application's
//! total (docs/runtime.md).

#[allow(dead_code)] // child processes are not used here
mod common;

use std::time::{Duration, Instant};

use ginza_proto::client;
use ginza_runtime::{Class, Handle};

use common::{cores, lock, Daemon};

fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The runtime's own count, over its kthreads.
fn runtime_steals() -> u64 {
    Handle::current()
        .expect("inside the runtime")
        .stats()
        .iter()
        .map(|k| k.steals)
        .sum()
}

#[test]
fn iokerneld_reports_the_steals_the_runtime_counts() {
    let _g = lock();
    let n = cores().len();
    if n < 2 {
        ginza_iokernel::testing::skip("stealing needs two managed cores");
        return;
    }
    let d = Daemon::start(|_| {});
    let socket = d.socket.clone();
    let (before, seen, after) =
        ginza_runtime::run(d.app("thief", Class::LatencyCritical, 0, n), move || {
            // Bursts queued on this kthread: the others, granted cores for
            // the congestion, steal them.
            for _ in 0..3 {
                let hs: Vec<_> = (0..40)
                    .map(|_| ginza_runtime::spawn(|| spin_for(Duration::from_micros(300))))
                    .collect();
                for h in hs {
                    h.join().unwrap();
                }
            }
            let before = runtime_steals();
            // iokerneld reads the lines every pass: it catches up.
            let deadline = Instant::now() + Duration::from_secs(10);
            let seen = loop {
                let st = client::stats(&socket).unwrap();
                let seen = st.apps.iter().find(|a| a.name == "thief").unwrap().steals;
                if seen >= before || Instant::now() > deadline {
                    break seen;
                }
                ginza_runtime::sleep(Duration::from_millis(1));
            };
            (before, seen, runtime_steals())
        })
        .unwrap();
    assert!(before > 0, "nothing was stolen");
    assert!(
        before <= seen && seen <= after,
        "iokerneld reports {seen} steals, the runtime counted {before} then {after}"
    );
}
