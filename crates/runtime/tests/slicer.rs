//! The time slicer (`Config::time_slice`) dozes while the runtime is
//! idle, and still slices a uthread that never yields once work waits
//! behind it; work queued from outside the kthreads runs behind a uthread
//! that spins or yields for ever. One runtime of this binary has time
//! slices, so that its slicer is the only thread of that name.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_runtime::{run, sleep, Config, Handle, WaitGroup};

const PERIOD: Duration = Duration::from_millis(1);

/// Voluntary context switches of the runtime's slicer thread: one per
/// wake-up of its sleep.
fn slicer_wakes() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    let slicer = tasks
        .map(|t| t.unwrap().path())
        .find(|t| std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim() == "ginza-slicer"))
        .expect("no ginza-slicer thread");
    let status = std::fs::read_to_string(slicer.join("status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Returns once the slicer has not woken for ten periods: it dozes.
fn until_the_slicer_dozes() {
    let mut last = (slicer_wakes(), Instant::now());
    loop {
        std::thread::sleep(PERIOD);
        let now = slicer_wakes();
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= 10 * PERIOD {
            return;
        }
    }
}

/// From a thread outside the runtime (after `first`), queues a uthread
/// that runs `wait_for` until a second uthread, queued behind it, sets
/// the flag; returns what `wait_for` returned and the time from the
/// queueing to its return. Called from the runtime's main uthread, which
/// waits meanwhile on the runtime's only kthread. A second uthread that
/// never runs would hang the test: it ends the test binary after 10 s.
fn behind_one_queued_from_outside<T: Send + 'static>(
    first: fn(),
    wait_for: fn(&AtomicBool) -> T,
) -> (T, Duration) {
    let handle = Handle::current().unwrap();
    let finished = Arc::new(WaitGroup::new());
    finished.add(1);
    let outside = {
        let finished = Arc::clone(&finished);
        std::thread::spawn(move || {
            first();
            let start = Instant::now();
            let done = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&done);
            let (returned, waited) = std::sync::mpsc::channel();
            handle.spawn(move || {
                let _ = returned.send(wait_for(&flag));
                finished.done();
            });
            handle.spawn(move || done.store(true, SeqCst));
            match waited.recv_timeout(Duration::from_secs(10)) {
                Ok(t) => (t, start.elapsed()),
                Err(_) => {
                    eprintln!("the uthread queued second did not run within 10 s");
                    std::process::exit(1);
                }
            }
        })
    };
    finished.wait();
    outside.join().unwrap()
}

#[test]
fn the_slicer_dozes_while_idle_and_still_slices_a_uthread_that_never_yields() {
    const IDLE: Duration = Duration::from_millis(300);
    let mut config = Config::with_kthreads(1);
    config.time_slice = Some(PERIOD);
    let (idle_wakes, sliced_after) = run(config, || {
        // Idle: the only uthread sleeps and the kthread parks. Looking
        // every period, the slicer would wake about 300 times.
        sleep(Duration::from_millis(20));
        let before = slicer_wakes();
        sleep(IDLE);
        let idle_wakes = slicer_wakes() - before;
        // While it dozes with no timer due, a uthread that spins: only a
        // time slice lets the second one run, and the push must end the
        // doze.
        let ((), sliced_after) = behind_one_queued_from_outside(until_the_slicer_dozes, |flag| {
            while !flag.load(SeqCst) {
                std::hint::spin_loop();
            }
        });
        (idle_wakes, sliced_after)
    })
    .unwrap();
    println!(
        "slicer wake-ups over {IDLE:?} idle: {idle_wakes}; \
         the spinning uthread made way {sliced_after:?} after it was queued"
    );
    assert!(
        idle_wakes < IDLE.as_millis() as u64 / 5,
        "the idle runtime's slicer woke {idle_wakes} times in {IDLE:?} at a {PERIOD:?} period"
    );
}

/// No time slices here: a uthread that yields in a loop switches all the
/// time, so the slicer would never ask it anything. Work queued from
/// outside the runtime must still get its turn.
#[test]
fn a_uthread_that_yields_in_a_loop_lets_work_queued_from_outside_run() {
    let (yields, _) = run(Config::with_kthreads(1), || {
        behind_one_queued_from_outside(
            || {},
            |flag| {
                let mut yields = 0u64;
                while !flag.load(SeqCst) {
                    ginza_runtime::yield_now();
                    yields += 1;
                }
                yields
            },
        )
    })
    .unwrap();
    println!("the yielding uthread yielded {yields} times before the other ran");
}
