//! The verifying client: workers on Linux sockets in the namespace, each
//! owning a share of one server's keys with one request in flight, keeping
//! the [`KeyModel`] of each and judging every answer against it; and the
//! client that cuts requests off with a reset.
//!
//! A request that got no answer leaves its connection reset (SO_LINGER 0)
//! and its key alone for [`QUARANTINE`]: bytes of it still in flight can
//! land in that time, not after (the socket that would retransmit them is
//! gone). A server's restart is announced by its generation, bumped once
//! the old process has exited: a worker then forgets the models of its
//! keys (the data went with the process), and an answer to a request that
//! straddled the bump is not judged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::model::{key_name, KeyModel, Kind, Verdict};
use super::wire::{half_request_then_reset, Answer, Conn, Failed};

/// How long a key whose request got no answer is left alone.
pub(crate) const QUARANTINE: Duration = Duration::from_secs(2);
/// A request unanswered this long is given up.
const IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause between tries to reach a server that is away (restarting).
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);
/// How long the final read pass may take per key before it gives up.
const FINAL_DEADLINE: Duration = Duration::from_secs(60);
/// Examples of findings kept for the report.
const EXAMPLES: usize = 20;

/// One kv-server as the clients see it.
pub(crate) struct Server {
    pub(crate) name: &'static str,
    pub(crate) addr: SocketAddr,
    /// Bumped once a process of it has exited (killed or crashed).
    pub(crate) generation: AtomicU64,
}

/// Where the workers are: serving load, reading every key once, done.
pub(crate) const RUN: u8 = 0;
pub(crate) const FINAL: u8 = 1;

/// What every worker adds to.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) phase: AtomicU8,
    pub(crate) answered: AtomicU64,
    pub(crate) unanswered: AtomicU64,
    pub(crate) not_judged: AtomicU64,
    pub(crate) connects_failed: AtomicU64,
    pub(crate) lost_writes: AtomicU64,
    pub(crate) wrong_answers: AtomicU64,
    pub(crate) models_forgotten: AtomicU64,
    pub(crate) final_keys_read: AtomicU64,
    pub(crate) final_keys_unread: AtomicU64,
    pub(crate) resets_sent: AtomicU64,
    pub(crate) resets_failed: AtomicU64,
    pub(crate) examples: Mutex<Vec<String>>,
    /// Answered requests' latency by window.
    pub(crate) latency: Mutex<WindowLatency>,
}

/// Windows a record may still arrive for, behind the newest one: a
/// request's latency is bounded by the workers' time-outs, well under
/// this many windows.
const OPEN_WINDOWS: usize = 4;

/// Answered requests' latency (µs) by window index: a histogram for each
/// window still open, percentiles for the others, so that the soak's own
/// memory does not grow with the run's length.
#[derive(Default)]
pub(crate) struct WindowLatency {
    open: BTreeMap<usize, Histogram<u64>>,
    closed: BTreeMap<usize, Percentiles>,
    /// Records for a window already closed (none expected).
    pub(crate) late: u64,
}

impl WindowLatency {
    fn record(&mut self, window: usize, latency_us: u64) {
        if self.closed.contains_key(&window) {
            self.late += 1;
            return;
        }
        let h = self
            .open
            .entry(window)
            .or_insert_with(|| Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"));
        let _ = h.record(latency_us.clamp(1, 60_000_000));
        let newest = *self.open.keys().next_back().expect("one was just added");
        while let Some(entry) = self.open.first_entry() {
            if *entry.key() + OPEN_WINDOWS >= newest {
                break;
            }
            let (k, h) = entry.remove_entry();
            self.closed.insert(k, Percentiles::of(&h));
        }
    }

    /// The percentiles of window `k`, if anything was recorded in it.
    pub(crate) fn of(&self, k: usize) -> Option<Percentiles> {
        self.open
            .get(&k)
            .map(Percentiles::of)
            .or_else(|| self.closed.get(&k).cloned())
    }
}

impl Shared {
    fn finding(&self, server: &str, key: &str, verdict: Verdict) {
        let (counter, kind, what) = match verdict {
            Verdict::Ok => return,
            Verdict::LostWrite(w) => (&self.lost_writes, "lost write", w),
            Verdict::WrongAnswer(w) => (&self.wrong_answers, "wrong answer", w),
        };
        counter.fetch_add(1, Relaxed);
        let mut examples = self.examples.lock().expect("no panics while held");
        if examples.len() < EXAMPLES {
            examples.push(format!("{kind}: {server} {key}: {what}"));
        }
    }

    fn record(&self, window: usize, latency: Duration) {
        self.latency
            .lock()
            .expect("no panics while held")
            .record(window, latency.as_micros() as u64);
    }
}

/// Percentiles of one window, µs.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Percentiles {
    pub(crate) count: u64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) max_us: u64,
}

impl Percentiles {
    pub(crate) fn of(h: &Histogram<u64>) -> Percentiles {
        Percentiles {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// One worker's share.
pub(crate) struct Worker {
    pub(crate) server: Arc<Server>,
    pub(crate) keys: Vec<KeyModel>,
    /// Requests per second it offers (paced, closed loop).
    pub(crate) rate: f64,
    pub(crate) seed: u64,
    pub(crate) start: Instant,
    pub(crate) window: Duration,
}

/// What one request did to the model.
enum Outcome {
    Judged(Verdict),
    /// No answer: the model took both outcomes.
    Unknown(String),
}

impl Worker {
    /// Serves requests until the phase turns to FINAL, then reads every key
    /// once and returns.
    pub(crate) fn run(mut self, shared: &Shared) {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let mut quarantine: Vec<Option<Instant>> = vec![None; self.keys.len()];
        let mut conn: Option<Conn> = None;
        let mut generation = self.server.generation.load(Relaxed);
        let gap = Duration::from_secs_f64(1.0 / self.rate.max(0.1));
        let mut next = Instant::now();
        while shared.phase.load(Relaxed) == RUN {
            let now = Instant::now();
            if now < next {
                std::thread::sleep(next - now);
            }
            next = (next + gap).max(Instant::now() - gap * 4);
            if self.forget_if_restarted(&mut generation, &mut conn, shared) {
                quarantine.iter_mut().for_each(|q| *q = None);
            }
            let Some(c) = self.connected(&mut conn, shared, generation) else {
                continue;
            };
            let Some(i) = pick(&mut rng, &quarantine) else {
                continue;
            };
            let t0 = Instant::now();
            let outcome = self.request(c, i, &mut rng);
            if self.server.generation.load(Relaxed) != generation {
                // The server restarted under the request: not judged.
                shared.not_judged.fetch_add(1, Relaxed);
                continue;
            }
            match outcome {
                Outcome::Judged(v) => {
                    shared.answered.fetch_add(1, Relaxed);
                    shared.record(self.window_of(t0), t0.elapsed());
                    let key = key_name(self.server.name, self.keys[i].index);
                    shared.finding(self.server.name, &key, v);
                }
                Outcome::Unknown(why) => {
                    log::debug!("soak: {} unanswered: {why}", self.server.name);
                    shared.unanswered.fetch_add(1, Relaxed);
                    quarantine[i] = Some(Instant::now() + QUARANTINE);
                    if let Some(c) = conn.take() {
                        c.abort();
                    }
                }
            }
        }
        self.final_pass(&mut conn, &mut generation, &quarantine, shared);
    }

    fn window_of(&self, t: Instant) -> usize {
        (t.saturating_duration_since(self.start).as_nanos() / self.window.as_nanos().max(1))
            as usize
    }

    /// Forgets every model when the server's generation moved; true then.
    fn forget_if_restarted(
        &mut self,
        generation: &mut u64,
        conn: &mut Option<Conn>,
        shared: &Shared,
    ) -> bool {
        let now = self.server.generation.load(Relaxed);
        if now == *generation {
            return false;
        }
        *generation = now;
        self.keys.iter_mut().for_each(KeyModel::reset);
        shared
            .models_forgotten
            .fetch_add(self.keys.len() as u64, Relaxed);
        if let Some(c) = conn.take() {
            c.abort();
        }
        true
    }

    /// The connection, made if need be. One that was opened while the
    /// server's generation moved is reset unused: it may reach the new
    /// process, whose keys this worker has not forgotten yet.
    fn connected<'c>(
        &self,
        conn: &'c mut Option<Conn>,
        shared: &Shared,
        generation: u64,
    ) -> Option<&'c mut Conn> {
        if conn.is_none() {
            match Conn::connect(self.server.addr, IO_TIMEOUT) {
                Ok(c) if self.server.generation.load(Relaxed) != generation => {
                    c.abort();
                    return None;
                }
                Ok(c) => *conn = Some(c),
                Err(_) => {
                    shared.connects_failed.fetch_add(1, Relaxed);
                    std::thread::sleep(RECONNECT_PAUSE);
                    return None;
                }
            }
        }
        conn.as_mut()
    }

    /// One request on key `i`, chosen by its kind.
    fn request(&mut self, c: &mut Conn, i: usize, rng: &mut SmallRng) -> Outcome {
        let key = key_name(self.server.name, self.keys[i].index);
        let m = &mut self.keys[i];
        let roll: u32 = rng.random_range(0..100);
        match (m.kind, roll) {
            (_, 0..45) => read(c, m, &key),
            (Kind::Blob, 45..75) | (Kind::Counter, 45..55) => {
                let len = rng.random_range(16..600);
                let v = m.fresh_value(len);
                match c.set(&key, &v) {
                    Ok(Answer::Stored) => {
                        m.acked_write(Some(v));
                        Outcome::Judged(Verdict::Ok)
                    }
                    Ok(other) => {
                        m.unknown_write(Some(v));
                        Outcome::Judged(unexpected("set", &other))
                    }
                    Err(Failed(why)) => {
                        m.unknown_write(Some(v));
                        Outcome::Unknown(why)
                    }
                }
            }
            (Kind::Blob, 75..85) | (Kind::Counter, 55..65) => match c.delete(&key) {
                Ok(Answer::Deleted) => Outcome::Judged(m.deleted(true)),
                Ok(Answer::NotFound) => Outcome::Judged(m.deleted(false)),
                Ok(other) => {
                    m.unknown_write(None);
                    Outcome::Judged(unexpected("delete", &other))
                }
                Err(Failed(why)) => {
                    m.unknown_write(None);
                    Outcome::Unknown(why)
                }
            },
            (Kind::Blob, _) => {
                let len = rng.random_range(16..600);
                cas(c, m, &key, len)
            }
            (Kind::Counter, _) => {
                let delta = rng.random_range(1..1000);
                match c.incr(&key, delta) {
                    Ok(Answer::Number(n)) => Outcome::Judged(m.incr_answered(delta, Some(n))),
                    Ok(Answer::NotFound) => Outcome::Judged(m.incr_answered(delta, None)),
                    Ok(other) => {
                        m.incr_unknown(delta);
                        Outcome::Judged(unexpected("incr", &other))
                    }
                    Err(Failed(why)) => {
                        m.incr_unknown(delta);
                        Outcome::Unknown(why)
                    }
                }
            }
        }
    }

    /// Reads every key once (after the quarantines are over), retrying a
    /// read that gets no answer: each acknowledged write must be visible.
    fn final_pass(
        &mut self,
        conn: &mut Option<Conn>,
        generation: &mut u64,
        quarantine: &[Option<Instant>],
        shared: &Shared,
    ) {
        if let Some(until) = quarantine.iter().flatten().max() {
            let left = until.saturating_duration_since(Instant::now());
            std::thread::sleep(left);
        }
        let deadline = Instant::now() + FINAL_DEADLINE;
        let mut i = 0;
        while i < self.keys.len() {
            self.forget_if_restarted(generation, conn, shared);
            if Instant::now() > deadline {
                shared
                    .final_keys_unread
                    .fetch_add((self.keys.len() - i) as u64, Relaxed);
                return;
            }
            let Some(c) = self.connected(conn, shared, *generation) else {
                continue;
            };
            let key = key_name(self.server.name, self.keys[i].index);
            let before = *generation;
            match read(c, &mut self.keys[i], &key) {
                Outcome::Judged(v) if self.server.generation.load(Relaxed) == before => {
                    shared.final_keys_read.fetch_add(1, Relaxed);
                    shared.finding(self.server.name, &key, v);
                    i += 1;
                }
                Outcome::Judged(_) => {}
                Outcome::Unknown(_) => {
                    if let Some(c) = conn.take() {
                        c.abort();
                    }
                }
            }
        }
    }
}

/// A random key not in quarantine (a few tries; `None` if all were).
fn pick(rng: &mut SmallRng, quarantine: &[Option<Instant>]) -> Option<usize> {
    let now = Instant::now();
    (0..8)
        .map(|_| rng.random_range(0..quarantine.len()))
        .find(|&i| quarantine[i].is_none_or(|until| now >= until))
}

fn read(c: &mut Conn, m: &mut KeyModel, key: &str) -> Outcome {
    match c.get(key, false) {
        Ok(Answer::Value(v)) => Outcome::Judged(m.read(v.map(|(bytes, _)| bytes))),
        Ok(other) => Outcome::Judged(unexpected("get", &other)),
        Err(Failed(why)) => Outcome::Unknown(why),
    }
}

/// `gets`, then `cas` with its unique: the only writer of the key, the
/// client must see STORED.
fn cas(c: &mut Conn, m: &mut KeyModel, key: &str, len: usize) -> Outcome {
    let unique = match c.get(key, true) {
        Ok(Answer::Value(Some((bytes, Some(unique))))) => {
            let verdict = m.read(Some(bytes));
            if verdict != Verdict::Ok {
                return Outcome::Judged(verdict);
            }
            unique
        }
        Ok(Answer::Value(None)) => return Outcome::Judged(m.read(None)),
        Ok(other) => return Outcome::Judged(unexpected("gets", &other)),
        Err(Failed(why)) => return Outcome::Unknown(why),
    };
    let v = m.fresh_value(len);
    match c.cas(key, &v, unique) {
        Ok(Answer::Stored) => {
            m.acked_write(Some(v));
            Outcome::Judged(Verdict::Ok)
        }
        Ok(Answer::NotFound) => {
            let verdict = m.read(None);
            Outcome::Judged(if verdict == Verdict::Ok {
                Verdict::WrongAnswer("cas: NOT_FOUND right after gets found it".into())
            } else {
                verdict
            })
        }
        Ok(Answer::Exists) => Outcome::Judged(Verdict::WrongAnswer(
            "cas: EXISTS, yet nobody else writes the key".into(),
        )),
        Ok(other) => {
            m.unknown_write(Some(v));
            Outcome::Judged(unexpected("cas", &other))
        }
        Err(Failed(why)) => {
            m.unknown_write(Some(v));
            Outcome::Unknown(why)
        }
    }
}

fn unexpected(verb: &str, answer: &Answer) -> Verdict {
    Verdict::WrongAnswer(format!("{verb} answered {answer:?}"))
}

/// Cuts a `set` off mid-way with a reset, then checks on a new connection
/// that its key is absent; every `mean_gap` on average until the phase
/// leaves RUN.
pub(crate) fn resets(servers: &[Arc<Server>], mean_gap: Duration, seed: u64, shared: &Shared) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut n = 0u64;
    while shared.phase.load(Relaxed) == RUN {
        let u: f64 = rng.random_range(0.0..1.0);
        std::thread::sleep(mean_gap.mul_f64(-(1.0 - u).ln()).min(mean_gap * 5));
        let server = &servers[rng.random_range(0..servers.len())];
        n += 1;
        let key = format!("soakr:{}:{n}", server.name);
        let generation = server.generation.load(Relaxed);
        if half_request_then_reset(server.addr, &key, IO_TIMEOUT).is_err() {
            shared.resets_failed.fetch_add(1, Relaxed);
            continue;
        }
        shared.resets_sent.fetch_add(1, Relaxed);
        let Ok(mut c) = Conn::connect(server.addr, IO_TIMEOUT) else {
            continue;
        };
        if let Ok(Answer::Value(Some(_))) = c.get(&key, false) {
            if server.generation.load(Relaxed) == generation {
                shared.finding(
                    server.name,
                    &key,
                    Verdict::WrongAnswer("a set cut off by a reset was stored".into()),
                );
            }
        }
        c.abort();
    }
}
