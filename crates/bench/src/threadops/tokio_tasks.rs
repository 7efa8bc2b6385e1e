//! Tokio tasks on a current-thread runtime (one OS thread, pinned by the
//! caller). The measuring code itself runs in a spawned task, like the Ginza
//! side runs in a uthread and the Go side in a goroutine.
//!
//! Tokio has no condition variable: the condvar ping-pong guards the turn with
//! `tokio::sync::Mutex` and wakes the other side with its own
//! `tokio::sync::Notify` (whose stored permit means no wake-up is lost between
//! releasing the mutex and waiting).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::{Mutex, Notify};
use tokio::task::{yield_now, JoinHandle};

use super::stats::{median, ns_per_op};
use super::{Medians, Params};

pub(super) fn measure(p: Params) -> anyhow::Result<Medians> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("building the Tokio runtime")?;
    rt.block_on(async move { tokio::spawn(measure_all(p)).await })
        .context("the Tokio measuring task failed")
}

async fn measure_all(p: Params) -> Medians {
    Medians {
        spawn_join: median_of(p, spawn_join).await,
        yield_pingpong: median_of(p, yield_pingpong).await,
        condvar_pingpong: median_of(p, condvar_pingpong).await,
        mutex: median_of(p, mutex).await,
    }
}

/// Async twin of `stats::median_ns`: one discarded warm-up, then the samples.
async fn median_of<F, Fut>(p: Params, one: F) -> f64
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = (Duration, u64)>,
{
    let _ = one(p.iters).await;
    let mut per_op = Vec::with_capacity(p.samples);
    for _ in 0..p.samples.max(1) {
        let (elapsed, ops) = one(p.iters).await;
        per_op.push(ns_per_op(elapsed, ops));
    }
    median(&per_op).expect("at least one sample")
}

async fn spawn_join(n: u64) -> (Duration, u64) {
    let start = Instant::now();
    for i in 0..n {
        let v = tokio::spawn(async move { black_box(i) })
            .await
            .expect("task panicked");
        black_box(v);
    }
    (start.elapsed(), n)
}

/// Spawns `partner` and waits until it has run, so the timed part holds
/// hand-offs only.
async fn start_partner<F>(partner: impl FnOnce(Arc<AtomicBool>) -> F) -> JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let ready = Arc::new(AtomicBool::new(false));
    let h = tokio::spawn(partner(ready.clone()));
    while !ready.load(Ordering::Acquire) {
        yield_now().await;
    }
    h
}

async fn yield_pingpong(n: u64) -> (Duration, u64) {
    let rounds = n.div_ceil(2);
    let turn = Arc::new(AtomicU32::new(0));
    let t = turn.clone();
    let partner = start_partner(move |ready| async move {
        ready.store(true, Ordering::Release);
        for _ in 0..rounds {
            while t.load(Ordering::Acquire) != 1 {
                yield_now().await;
            }
            t.store(0, Ordering::Release);
        }
    })
    .await;
    let start = Instant::now();
    for _ in 0..rounds {
        turn.store(1, Ordering::Release);
        while turn.load(Ordering::Acquire) != 0 {
            yield_now().await;
        }
    }
    let elapsed = start.elapsed();
    partner.await.expect("partner panicked");
    (elapsed, 2 * rounds)
}

struct Token {
    turn: Mutex<u32>,
    /// `wake[i]` wakes side `i` (0 = measuring task, 1 = partner).
    wake: [Notify; 2],
}

impl Token {
    /// Waits until the turn is `me`, then hands it to the other side.
    async fn take_and_pass(&self, me: u32) {
        loop {
            let mut turn = self.turn.lock().await;
            if *turn == me {
                *turn = 1 - me;
                drop(turn);
                self.wake[(1 - me) as usize].notify_one();
                return;
            }
            drop(turn);
            self.wake[me as usize].notified().await;
        }
    }
}

async fn condvar_pingpong(n: u64) -> (Duration, u64) {
    let rounds = n.div_ceil(2);
    let token = Arc::new(Token {
        turn: Mutex::new(0),
        wake: [Notify::new(), Notify::new()],
    });
    let t = token.clone();
    let partner = start_partner(move |ready| async move {
        ready.store(true, Ordering::Release);
        for _ in 0..rounds {
            t.take_and_pass(1).await;
        }
    })
    .await;
    let start = Instant::now();
    for _ in 0..rounds {
        token.take_and_pass(0).await;
    }
    // The last hand-off back to us: wait for the turn to come home.
    loop {
        if *token.turn.lock().await == 0 {
            break;
        }
        token.wake[0].notified().await;
    }
    let elapsed = start.elapsed();
    partner.await.expect("partner panicked");
    (elapsed, 2 * rounds)
}

async fn mutex(n: u64) -> (Duration, u64) {
    let m = Mutex::new(0u64);
    let start = Instant::now();
    for _ in 0..n {
        let mut g = m.lock().await;
        *g += 1;
        black_box(&mut *g);
    }
    let elapsed = start.elapsed();
    black_box(m.into_inner());
    (elapsed, n)
}
