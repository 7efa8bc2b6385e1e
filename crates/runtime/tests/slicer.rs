//! The time slicer (`Config::time_slice`): it dozes while the runtime is
//! idle, and still slices a uthread that never yields once work waits
//! behind it. One runtime in this binary, so that its slicer is the only
//! thread of that name.

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

        // While it dozes with no timer due, a thread outside the runtime
        // queues a uthread that spins until a second one, queued behind
        // it on the only kthread, runs: only a time slice lets that one
        // run, and the push must end the doze.
        let handle = Handle::current().unwrap();
        let finished = Arc::new(WaitGroup::new());
        finished.add(1);
        let outside = {
            let finished = Arc::clone(&finished);
            std::thread::spawn(move || {
                until_the_slicer_dozes();
                let start = Instant::now();
                let done = Arc::new(AtomicBool::new(false));
                let spinning = Arc::clone(&done);
                let (made_way, sliced) = std::sync::mpsc::channel();
                handle.spawn(move || {
                    while !spinning.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    let _ = made_way.send(());
                    finished.done();
                });
                handle.spawn(move || done.store(true, SeqCst));
                // The runtime's main uthread waits for the spinner: a
                // spinner never sliced would hang the test, so it ends here.
                if sliced.recv_timeout(Duration::from_secs(10)).is_err() {
                    eprintln!("the spinning uthread was not sliced within 10 s");
                    std::process::exit(1);
                }
                start
            })
        };
        finished.wait();
        let start = outside.join().unwrap();
        (idle_wakes, start.elapsed())
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
        let handle = Handle::current().unwrap();
        let finished = Arc::new(WaitGroup::new());
        finished.add(1);
        let outside = {
            let finished = Arc::clone(&finished);
            std::thread::spawn(move || {
                let done = Arc::new(AtomicBool::new(false));
                let waiting = Arc::clone(&done);
                let (made_way, yielded) = std::sync::mpsc::channel();
                handle.spawn(move || {
                    let mut yields = 0u64;
                    while !waiting.load(SeqCst) {
                        ginza_runtime::yield_now();
                        yields += 1;
                    }
                    let _ = made_way.send(yields);
                    finished.done();
                });
                handle.spawn(move || done.store(true, SeqCst));
                // As above: a yielder that never lets the other run would
                // hang the test.
                match yielded.recv_timeout(Duration::from_secs(10)) {
                    Ok(yields) => yields,
                    Err(_) => {
                        eprintln!("the queued uthread did not run within 10 s of yields");
                        std::process::exit(1);
                    }
                }
            })
        };
        finished.wait();
        (outside.join().unwrap(), ())
    })
    .unwrap();
    println!("the yielding uthread yielded {yields} times before the other ran");
}
