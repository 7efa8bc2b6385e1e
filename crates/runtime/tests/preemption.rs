//! Preemption by signal: a uthread that never yields is taken off its
//! kthread, resumes elsewhere with its full register state, and finishes
//! with the right result; deferred sections hold the signal back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_runtime::{current_kthread_id, run, sleep, spawn, without_preemption, Config, Handle};

/// A computation that keeps its state in registers; returns (x, iterations).
fn mix(x: u64, i: u64) -> u64 {
    x.wrapping_mul(6364136223846793005)
        .wrapping_add(i ^ (x >> 29))
}

#[test]
fn a_spinning_uthread_is_preempted_and_finishes_on_another_kthread() {
    let (first, moved_to, iters, x, preemptions) = run(Config::with_kthreads(2), || {
        let handle = Handle::current().unwrap();
        let started_on = Arc::new(AtomicUsize::new(usize::MAX));
        let started = started_on.clone();
        let spinner = spawn(move || {
            let first = current_kthread_id().unwrap();
            started.store(first, SeqCst);
            let deadline = Instant::now() + Duration::from_secs(20);
            let (mut x, mut i) = (1u64, 0u64);
            let moved_to = loop {
                x = mix(x, i);
                i += 1;
                if i % 4096 == 0 {
                    let now_on = current_kthread_id().unwrap();
                    if now_on != first {
                        break Some(now_on);
                    }
                    if Instant::now() > deadline {
                        break None;
                    }
                }
            };
            (first, moved_to, i, x)
        });
        while started_on.load(SeqCst) == usize::MAX {
            sleep(Duration::from_micros(100));
        }
        let victim = started_on.load(SeqCst);
        handle.revoke(victim).unwrap();
        let (first, moved_to, iters, x) = spinner.join().unwrap();
        handle.grant(victim).unwrap();
        (
            first,
            moved_to,
            iters,
            x,
            handle.stats()[victim].preemptions,
        )
    })
    .unwrap();
    assert!(moved_to.is_some(), "the spinner was never preempted");
    assert_ne!(moved_to, Some(first));
    assert!(preemptions >= 1);
    let expected = (0..iters).fold(1u64, mix);
    assert_eq!(
        x, expected,
        "register state was corrupted across the preemption"
    );
}

#[test]
fn a_preemption_inside_a_deferred_section_waits_for_its_end() {
    let (stayed_inside, first, after, preemptions_before, preemptions_after) =
        run(Config::with_kthreads(2), || {
            let handle = Handle::current().unwrap();
            let h = handle.clone();
            let result = spawn(move || {
                let first = current_kthread_id().unwrap();
                let before = h.stats()[first].preemptions;
                let stayed = without_preemption(|| {
                    // The signal is delivered to this very thread right here.
                    h.revoke(first).unwrap();
                    let end = Instant::now() + Duration::from_millis(20);
                    let mut stayed = true;
                    while Instant::now() < end {
                        stayed &= current_kthread_id() == Some(first);
                    }
                    stayed
                });
                // The section is over: the pending preemption moves us.
                let after = current_kthread_id().unwrap();
                (stayed, first, after, before, h.stats()[first].preemptions)
            })
            .join()
            .unwrap();
            handle.grant(result.1).unwrap();
            result
        })
        .unwrap();
    assert!(stayed_inside, "preempted inside without_preemption");
    assert_ne!(after, first, "the deferred preemption was never applied");
    assert!(preemptions_after > preemptions_before);
}

#[test]
fn results_stay_exact_under_a_storm_of_revocations() {
    const TASKS: u64 = 12;
    const ITERS: u64 = 300_000;
    let (results, preemptions) = run(Config::with_kthreads(3), || {
        let handle = Handle::current().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        // An ordinary thread plays iokerneld: it takes cores away and gives
        // them back, always leaving kthread 0 running.
        let storm = {
            let (handle, stop) = (handle.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut k = 1;
                while !stop.load(SeqCst) {
                    handle.revoke(k).unwrap();
                    std::thread::sleep(Duration::from_micros(300));
                    handle.grant(k).unwrap();
                    k = if k == 1 { 2 } else { 1 };
                }
            })
        };
        let hs: Vec<_> = (0..TASKS)
            .map(|t| {
                spawn(move || {
                    let mut x = t;
                    let mut trail = Vec::new();
                    for i in 0..ITERS {
                        x = mix(x, i);
                        if i % 10_000 == 0 {
                            trail.push(x); // allocation: a deferred section
                        }
                    }
                    (x, trail.len())
                })
            })
            .collect();
        let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, SeqCst);
        storm.join().unwrap();
        let preemptions: u64 = handle.stats().iter().map(|s| s.preemptions).sum();
        (results, preemptions)
    })
    .unwrap();
    for (t, &(x, trail)) in results.iter().enumerate() {
        assert_eq!(x, (0..ITERS).fold(t as u64, mix), "task {t}");
        assert_eq!(trail as u64, ITERS.div_ceil(10_000));
    }
    assert!(preemptions > 0, "the storm never preempted anything");
}

/// The thread ids of this process's `count` kthreads (named `ginza-k<N>`
/// by themselves once they start, so looked for until all are).
fn kthread_tids(count: usize) -> Vec<libc::pid_t> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tids: Vec<libc::pid_t> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| {
                let task = task.ok()?;
                let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
                let id = comm.trim_end().strip_prefix("ginza-k")?;
                id.parse::<usize>().ok()?;
                task.file_name().to_str()?.parse().ok()
            })
            .collect();
        if tids.len() == count {
            return tids;
        }
        assert!(Instant::now() < deadline, "kthreads found: {tids:?}");
        std::thread::yield_now();
    }
}

/// Preemption signals sent to both kthreads without pause, as fast as one
/// thread can, while contexts hand tokens back and forth across them. A
/// signal that arrives while the handler of the last one runs must wait
/// for it to defer the uthread (else handlers nest until the stack
/// overflows, or an inner one moves the uthread under the outer), and one
/// that reaches a kthread just as a uthread it leaves is resumed elsewhere
/// must not land on that uthread's stack. Every context's running result
/// and a canary on its stack stay exact.
#[test]
fn contexts_stay_intact_under_a_flood_of_preemption_signals() {
    const PAIRS: u64 = 3;
    const ROUNDS: u64 = 100_000;
    let (finished, signals, preemptions) = run(Config::with_kthreads(2), || {
        let handle = Handle::current().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let sender = {
            let (stop, sent) = (stop.clone(), sent.clone());
            // Named: an unnamed thread would inherit its creator's name.
            std::thread::Builder::new()
                .name("signaller".into())
                .spawn(move || {
                    let tids = kthread_tids(2);
                    while !stop.load(SeqCst) {
                        for &tid in &tids {
                            // SAFETY: tgkill has no memory arguments; SIGURG
                            // is the runtime's preemption signal.
                            unsafe {
                                libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGURG)
                            };
                            sent.fetch_add(1, SeqCst);
                        }
                    }
                })
                .unwrap()
        };
        let players: Vec<_> = (0..PAIRS)
            .flat_map(|_| {
                // Whose turn it is: player 0 moves on even counts.
                let token = Arc::new((
                    ginza_runtime::Mutex::new(0u64),
                    ginza_runtime::Condvar::new(),
                ));
                (0..2u64).map(move |me| {
                    let token = token.clone();
                    spawn(move || {
                        let canary = [me.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1; 64];
                        let mut x = me;
                        let (turns, moved) = &*token;
                        for round in 0..ROUNDS {
                            let mut turn = turns.lock();
                            while *turn % 2 != me {
                                turn = moved.wait(turn);
                            }
                            *turn += 1;
                            moved.notify_one();
                            drop(turn);
                            x = mix(x, round);
                            let canary = std::hint::black_box(&canary);
                            assert!(
                                canary.iter().all(|&c| c == canary[0]),
                                "a stack canary changed in round {round}"
                            );
                        }
                        x
                    })
                })
            })
            .collect();
        let mut finished = 0;
        for (i, player) in players.into_iter().enumerate() {
            let x = player.join().expect("a player died");
            assert_eq!(x, (0..ROUNDS).fold((i % 2) as u64, mix), "player {i}");
            finished += 1;
        }
        stop.store(true, SeqCst);
        sender.join().unwrap();
        let preemptions: u64 = handle.stats().iter().map(|s| s.preemptions).sum();
        (finished, sent.load(SeqCst), preemptions)
    })
    .unwrap();
    assert_eq!(finished, 2 * PAIRS);
    assert!(
        preemptions > 0,
        "{signals} signals sent, none preempted a uthread"
    );
    eprintln!("{signals} signals sent, {preemptions} preemptions");
}
