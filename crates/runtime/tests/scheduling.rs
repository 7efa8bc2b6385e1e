//! Work stealing, parking and timers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_runtime::{
    current_kthread_id, run, sleep, sleep_until, spawn, yield_now, Config, Handle, Mutex,
};

fn spin_for(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

#[test]
fn work_pushed_on_one_kthread_is_stolen_by_others() {
    let per_kthread = run(Config::with_kthreads(4), || {
        let home = current_kthread_id().unwrap();
        // Everything is spawned from here, so it all lands on `home`'s runqueue.
        let hs: Vec<_> = (0..400)
            .map(|_| {
                spawn(|| {
                    spin_for(Duration::from_micros(50));
                    current_kthread_id().unwrap()
                })
            })
            .collect();
        let mut counts = vec![0usize; 4];
        for h in hs {
            counts[h.join().unwrap()] += 1;
        }
        (home, counts)
    })
    .unwrap();
    let (home, counts) = per_kthread;
    assert_eq!(counts.iter().sum::<usize>(), 400);
    let helpers = counts
        .iter()
        .enumerate()
        .filter(|&(k, &n)| k != home && n > 0)
        .count();
    assert!(helpers >= 1, "no other kthread stole work: {counts:?}");
}

/// Kthreads with nothing to run park: with one uthread for three
/// kthreads, at least two do (waited for, up to a bound far past the
/// spin before a park).
#[test]
fn idle_kthreads_park() {
    let stats = run(Config::with_kthreads(3), || {
        let h = Handle::current().unwrap();
        let start = Instant::now();
        loop {
            let stats = h.stats();
            let parked = stats.iter().filter(|s| s.parks > 0).count();
            if parked >= 2 || start.elapsed() > Duration::from_secs(10) {
                break stats;
            }
            yield_now();
        }
    })
    .unwrap();
    assert!(
        stats.iter().filter(|s| s.parks > 0).count() >= 2,
        "{stats:?}"
    );
}

#[test]
fn many_sleeps_wake_in_deadline_order() {
    // One kthread: its timer heap alone decides the order. Absolute
    // deadlines, so a kthread descheduled by Linux between two sleeps
    // (tests run in parallel) cannot reorder them.
    let order = run(Config::with_kthreads(1), || {
        let order = Arc::new(Mutex::new(Vec::new()));
        let base = Instant::now() + Duration::from_millis(20);
        // Spawned in scrambled order so FIFO spawn order cannot fake the result.
        let delays: Vec<u64> = (0..50).map(|i| (i * 37) % 50).collect();
        let hs: Vec<_> = delays
            .iter()
            .map(|&d| {
                let order = order.clone();
                spawn(move || {
                    sleep_until(base + Duration::from_micros(d * 100));
                    order.lock().push(d);
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let v = order.lock().clone();
        v
    })
    .unwrap();
    assert_eq!(order, (0..50).collect::<Vec<_>>());
}

#[test]
fn sleeps_on_several_kthreads_never_wake_early() {
    let early = run(Config::with_kthreads(2), || {
        let hs: Vec<_> = (0..100u64)
            .map(|i| {
                spawn(move || {
                    let d = Duration::from_micros(50 + i * 13);
                    let t0 = Instant::now();
                    sleep(d);
                    t0.elapsed() < d
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&e| e)
            .count()
    })
    .unwrap();
    assert_eq!(early, 0);
}

#[test]
fn a_sleep_on_a_parked_kthread_still_fires() {
    let (parks_before, parks_after, slept) = run(Config::with_kthreads(1), || {
        let h = Handle::current().unwrap();
        let before = h.stats()[0].parks;
        let t0 = Instant::now();
        // The only uthread sleeps: the only kthread has nothing to do and
        // parks with the timer as its deadline.
        sleep(Duration::from_millis(5));
        (before, h.stats()[0].parks, t0.elapsed())
    })
    .unwrap();
    assert!(
        parks_after > parks_before,
        "kthread never parked during the sleep"
    );
    assert!(slept >= Duration::from_millis(5));
    assert!(slept < Duration::from_secs(2), "woke after {slept:?}");
}
