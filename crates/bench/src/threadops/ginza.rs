//! Ginza uthreads: all four operations measured inside one `ginza_runtime::run`
//! with one kthread pinned to the benchmark CPU, mirroring `pthread.rs`
//! operation for operation (a partner uthread, a shared turn, the measuring
//! uthread times the hand-offs).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_runtime::{spawn, yield_now, Condvar, Config, JoinHandle, Mutex};

use super::stats::median_ns;
use super::{Medians, Params, GINZA_KTHREADS};

pub(super) fn measure(p: Params) -> anyhow::Result<Medians> {
    let cfg = Config {
        kthreads: GINZA_KTHREADS,
        cores: Some(vec![p.core]),
        ..Config::default()
    };
    ginza_runtime::run(cfg, move || Medians {
        spawn_join: median_ns(p.samples, || spawn_join(p.iters)),
        yield_pingpong: median_ns(p.samples, || yield_pingpong(p.iters)),
        condvar_pingpong: median_ns(p.samples, || condvar_pingpong(p.iters)),
        mutex: median_ns(p.samples, || mutex(p.iters)),
    })
    .map_err(|e| anyhow::anyhow!("{e}"))
    .context("ginza_runtime::run")
}

fn spawn_join(n: u64) -> (Duration, u64) {
    let start = Instant::now();
    for i in 0..n {
        let v = spawn(move || black_box(i))
            .join()
            .expect("uthread panicked");
        black_box(v);
    }
    (start.elapsed(), n)
}

/// Spawns `partner`, which must set the flag it is given once it runs, and
/// yields until it has, so the timed part holds hand-offs only.
fn start_partner(partner: impl FnOnce(&AtomicBool) + Send + 'static) -> JoinHandle<()> {
    let ready = Arc::new(AtomicBool::new(false));
    let flag = ready.clone();
    let h = spawn(move || partner(&flag));
    while !ready.load(Ordering::Acquire) {
        yield_now();
    }
    h
}

fn yield_pingpong(n: u64) -> (Duration, u64) {
    let rounds = n.div_ceil(2);
    let turn = Arc::new(AtomicU32::new(0));
    let t = turn.clone();
    let partner = start_partner(move |ready| {
        ready.store(true, Ordering::Release);
        for _ in 0..rounds {
            while t.load(Ordering::Acquire) != 1 {
                yield_now();
            }
            t.store(0, Ordering::Release);
        }
    });
    let start = Instant::now();
    for _ in 0..rounds {
        turn.store(1, Ordering::Release);
        while turn.load(Ordering::Acquire) != 0 {
            yield_now();
        }
    }
    let elapsed = start.elapsed();
    partner.join().expect("partner panicked");
    (elapsed, 2 * rounds)
}

fn condvar_pingpong(n: u64) -> (Duration, u64) {
    let rounds = n.div_ceil(2);
    let shared = Arc::new((Mutex::new(0u32), Condvar::new()));
    let s = shared.clone();
    let partner = start_partner(move |ready| {
        let (m, cv) = &*s;
        ready.store(true, Ordering::Release);
        for _ in 0..rounds {
            let mut turn = m.lock();
            while *turn != 1 {
                turn = cv.wait(turn);
            }
            *turn = 0;
            cv.notify_one();
        }
    });
    let (m, cv) = &*shared;
    let start = Instant::now();
    for _ in 0..rounds {
        let mut turn = m.lock();
        *turn = 1;
        cv.notify_one();
        while *turn != 0 {
            turn = cv.wait(turn);
        }
    }
    let elapsed = start.elapsed();
    partner.join().expect("partner panicked");
    (elapsed, 2 * rounds)
}

fn mutex(n: u64) -> (Duration, u64) {
    let m = Mutex::new(0u64);
    let start = Instant::now();
    for _ in 0..n {
        let mut g = m.lock();
        *g += 1;
        black_box(&mut *g);
    }
    let elapsed = start.elapsed();
    black_box(*m.lock());
    (elapsed, n)
}
