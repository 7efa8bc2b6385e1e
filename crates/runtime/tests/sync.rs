//! Mutex, Condvar and WaitGroup between uthreads on several kthreads.

use std::sync::atomic::{
    AtomicBool, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_runtime::{run, spawn, yield_now, Condvar, Config, Handle, Mutex, WaitGroup};

#[test]
fn contended_mutex_counter_is_exact_across_four_kthreads() {
    const WORKERS: usize = 16;
    const ROUNDS: usize = 5_000;
    let (count, kthreads_seen) = run(Config::with_kthreads(4), || {
        let counter = Arc::new(Mutex::new(0usize));
        let seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
        let hs: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (counter, seen) = (counter.clone(), seen.clone());
                spawn(move || {
                    for i in 0..ROUNDS {
                        let mut g = counter.lock();
                        // A read-modify-write that tears if two holders overlap.
                        let v = *g;
                        if i % 64 == 0 {
                            yield_now(); // hold the lock across a switch now and then
                        }
                        *g = v + 1;
                        drop(g);
                        seen.lock()
                            .insert(ginza_runtime::current_kthread_id().unwrap());
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let n = *counter.lock();
        let k = seen.lock().len();
        (n, k)
    })
    .unwrap();
    assert_eq!(count, WORKERS * ROUNDS);
    assert!(
        kthreads_seen >= 2,
        "work ran on only {kthreads_seen} kthread(s)"
    );
}

#[test]
fn a_contended_lock_is_handed_to_the_uthread_waiting_for_it() {
    // One kthread and no preemption: a uthread runs until it blocks or
    // yields, so the interleaving below is forced, not hoped for.
    let (handed_over, order) = run(Config::with_kthreads(1), || {
        let m = Arc::new(Mutex::new(Vec::new()));
        let trying = Arc::new(AtomicBool::new(false));
        let mut g = m.lock();
        let waiter = {
            let (m, trying) = (m.clone(), trying.clone());
            spawn(move || {
                trying.store(true, Release);
                m.lock().push("waiter");
            })
        };
        // The waiter sets `trying` and goes straight into `lock`; this
        // uthread runs again only once the waiter is suspended there.
        while !trying.load(Acquire) {
            yield_now();
        }
        g.push("holder");
        drop(g);
        // Unlocking with a waiter hands the lock over (it stays locked, now
        // the waiter's): the waiting path was taken, and no barging.
        let handed_over = m.try_lock().is_none();
        waiter.join().unwrap();
        let order = m.lock().clone();
        (handed_over, order)
    })
    .unwrap();
    assert!(
        handed_over,
        "the lock was free after unlocking with a waiter"
    );
    assert_eq!(order, ["holder", "waiter"]);
}

#[test]
fn condvar_ping_pong_alternates_strictly() {
    const ROUNDS: usize = 2_000;
    let trace = run(Config::with_kthreads(2), || {
        // (whose turn: 0 or 1, trace of who ran)
        let state = Arc::new((Mutex::new((0usize, Vec::new())), Condvar::new()));
        let hs: Vec<_> = (0..2usize)
            .map(|me| {
                let state = state.clone();
                spawn(move || {
                    let (lock, cv) = &*state;
                    for _ in 0..ROUNDS {
                        let mut g = cv.wait_while(lock.lock(), |s| s.0 != me);
                        g.1.push(me);
                        g.0 = 1 - me;
                        cv.notify_one();
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let t = state.0.lock().1.clone();
        t
    })
    .unwrap();
    assert_eq!(trace.len(), 2 * ROUNDS);
    assert!(trace.iter().enumerate().all(|(i, &who)| who == i % 2));
}

#[test]
fn waitgroup_waits_for_every_task() {
    let (finished, seen_at_wait) = run(Config::with_kthreads(3), || {
        let wg = Arc::new(WaitGroup::new());
        let finished = Arc::new(AtomicUsize::new(0));
        wg.add(200);
        for i in 0..200u64 {
            let (wg, finished) = (wg.clone(), finished.clone());
            // Detached: only the WaitGroup tells us they are done.
            drop(spawn(move || {
                ginza_runtime::sleep(std::time::Duration::from_micros(i % 7 * 50));
                finished.fetch_add(1, Relaxed);
                wg.done();
            }));
        }
        wg.wait();
        let at_wait = finished.load(Relaxed);
        wg.wait(); // count is zero: returns at once
        (finished.load(Relaxed), at_wait)
    })
    .unwrap();
    assert_eq!(seen_at_wait, 200);
    assert_eq!(finished, 200);
}

#[test]
fn mutex_works_from_an_ordinary_thread_too() {
    let m = Arc::new(Mutex::new(1));
    let m2 = m.clone();
    let v = run(Config::with_kthreads(1), move || {
        // An ordinary thread finds the lock held by a uthread: `try_lock`
        // fails (the uthread lets go only after the thread has seen that),
        // then `lock` gets it once the uthread lets go.
        let g = m2.lock();
        let refused = Arc::new(AtomicBool::new(false));
        let outside = {
            let (m3, refused) = (m2.clone(), refused.clone());
            std::thread::spawn(move || {
                assert!(m3.try_lock().is_none(), "the uthread holds the lock");
                refused.store(true, Release);
                *m3.lock() += 10;
            })
        };
        while !refused.load(Acquire) {
            yield_now();
        }
        drop(g);
        outside.join().unwrap();
        let v = *m2.lock();
        v
    })
    .unwrap();
    assert_eq!(v, 11);
    assert_eq!(*m.lock(), 11);
}

#[test]
fn a_uthread_waits_for_a_lock_an_ordinary_thread_holds() {
    // The only uthread blocks on a lock an ordinary thread holds: its
    // kthread, with nothing else to run, parks. The thread sees that park
    // (so the uthread is known to be waiting, suspended, not spinning), then
    // unlocks: the wake comes from outside the runtime.
    let m = Arc::new(Mutex::new(0u32));
    let held = m.lock();
    let handle_tx = std::sync::mpsc::channel::<(Handle, u64)>();
    let (tx, rx) = handle_tx;
    let m2 = m.clone();
    let locker = std::thread::spawn(move || {
        run(Config::with_kthreads(1), move || {
            let h = Handle::current().unwrap();
            // Parks so far; the kthread parks again only once this uthread
            // is suspended in `lock` (nothing else runs here).
            let parks = h.stats()[0].parks;
            tx.send((h, parks)).unwrap();
            let mut g = m2.lock();
            *g += 1;
            *g
        })
        .unwrap()
    });
    let (h, parks_before) = rx.recv().unwrap();
    let t0 = Instant::now();
    while h.stats()[0].parks == parks_before {
        assert!(
            t0.elapsed() < Duration::from_secs(10) && !locker.is_finished(),
            "the kthread never parked: {:?}",
            h.stats()
        );
        std::thread::yield_now();
    }
    let mut held = held;
    *held = 10;
    drop(held);
    assert_eq!(locker.join().unwrap(), 11);
}

/// Uthreads on two kthreads that keep waking each other while they park:
/// one is often woken, and popped by the other kthread, before it has
/// finished switching out. A uthread switching straight to such a one
/// used to wait for it with its own registers unsaved; two kthreads each
/// doing so for the other's uthread waited forever (a whole `ginza run`
/// server stopped). Now only a scheduler context waits, and debug builds
/// assert that no uthread does (`switch_to`), so this test fails fast if
/// one ever does again.
#[test]
fn uthreads_woken_while_switching_out_never_deadlock_two_kthreads() {
    const PAIRS: usize = 4;
    const ROUNDS: usize = 50_000;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        let handed = run(Config::with_kthreads(2), || {
            let hs: Vec<_> = (0..PAIRS)
                .flat_map(|_| {
                    let turn = Arc::new((Mutex::new(0usize), Condvar::new()));
                    (0..2usize).map(move |me| {
                        let turn = turn.clone();
                        spawn(move || {
                            let (lock, cv) = &*turn;
                            for _ in 0..ROUNDS {
                                let mut t = cv.wait_while(lock.lock(), |t| *t % 2 != me);
                                *t += 1;
                                cv.notify_one();
                            }
                        })
                    })
                })
                .collect();
            let n = hs.len();
            hs.into_iter().for_each(|h| h.join().unwrap());
            n * ROUNDS
        });
        let _ = done_tx.send(handed);
    });
    let handed = done_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the ping-pong did not end within 120 s: kthreads stuck");
    runner.join().unwrap();
    assert_eq!(handed.unwrap(), 2 * PAIRS * ROUNDS);
}
