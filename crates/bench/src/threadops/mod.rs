//! `ginza bench threadops`: the cost of thread operations for Ginza uthreads,
//! pthreads (`std::thread`), Tokio tasks, Go goroutines and a C program's
//! pthreads (glibc's, and the same binary's through Ginza's preload library
//! under `ginza run`), measured in one run on one CPU.
//!
//! Operations, defined the same way for every system:
//!
//! * `spawn_join`: spawn a thread/task/goroutine that returns a value and wait
//!   for that value, one at a time; one op = one spawn + join.
//! * `yield_pingpong`: the measuring thread and one partner alternate on a
//!   shared turn variable, yielding while it is not their turn; one op = one
//!   hand-off (one switch).
//! * `condvar_pingpong`: the same hand-off through a mutex-guarded turn and a
//!   condition variable (Tokio has none: `tokio::sync::Mutex` + one
//!   `tokio::sync::Notify` per side); one op = one hand-off.
//! * `mutex`: uncontended lock, increment of the guarded value, unlock.
//!
//! Each operation runs one discarded warm-up sample, then `--samples` samples
//! of `--iters` operations; each sample gives ns/op from a monotonic clock and
//! a run's figure is the median over samples. The systems take turns in
//! `--rounds` rounds (ginza, pthread, tokio, go, c-glibc, c-ginza, then again),
//! so a slow phase of a shared machine falls on all of them rather than on
//! one; the reported figure is the median over rounds. Everything runs on the
//! CPU given by `--core` (default: the last CPU this process may use): the
//! measuring pthreads pin themselves (threads they spawn inherit the mask),
//! Tokio's current-thread runtime runs on such a pinned thread, Ginza gets one
//! kthread pinned there by its `Config`, and the external programs (the Go
//! peer with GOMAXPROCS=1, the C program alone and under `ginza run
//! --kthreads 1`) have the mask set in the child between fork and exec, so all
//! of their threads inherit it.
//!
//! `c_library` compares `c-ginza` with native Ginza (the ns the C ABI adds; the
//! aim is under [`AIM_NS`] for the blocking ops, yield and condvar ping-pong)
//! and with `c-glibc`.

use crate::harness::figures::allowed_cpus;
use crate::harness::figures::emit;
use crate::harness::figures::median;

mod c;
mod ginza;
mod go;
mod peer;
mod pthread;
mod stats;
mod tokio_tasks;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use ginza_sys::affinity;
use serde::{Deserialize, Serialize};

/// Kthreads of the native Ginza column, and `--kthreads` of `c-ginza`: the
/// two must match for their difference to be the library's cost.
pub(crate) const GINZA_KTHREADS: usize = 1;

/// What a blocking call through the preload library may cost over the same
/// call through the native API (issue 30's aim), in ns.
const AIM_NS: f64 = 100.0;

/// Arguments of `ginza bench threadops`.
#[derive(clap::Args, Debug)]
pub struct ThreadopsArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Operations per sample.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Samples per operation, system and round; a round's figure is their median.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    samples: u64,
    /// Rounds: the systems take turns this many times; the median over rounds is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    rounds: u64,
    /// CPU every system runs on (default: the last CPU this process may use).
    #[arg(long)]
    core: Option<usize>,
    /// Systems to leave out (reported as null), e.g. `--skip go,tokio`.
    #[arg(long, value_enum, value_delimiter = ',')]
    skip: Vec<System>,
}

/// A system under test.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum System {
    Ginza,
    Pthread,
    Tokio,
    Go,
    /// bench/c/threadops.c on glibc's pthreads.
    #[value(name = "c-glibc")]
    CGlibc,
    /// The same binary under `ginza run`.
    #[value(name = "c-ginza")]
    CGinza,
}

impl System {
    const ALL: [System; 6] = [
        System::Ginza,
        System::Pthread,
        System::Tokio,
        System::Go,
        System::CGlibc,
        System::CGinza,
    ];

    /// The name in the table, on stderr and in `--skip`.
    fn name(self) -> &'static str {
        match self {
            System::Ginza => "ginza",
            System::Pthread => "pthread",
            System::Tokio => "tokio",
            System::Go => "go",
            System::CGlibc => "c-glibc",
            System::CGinza => "c-ginza",
        }
    }

    /// The key in the JSON report (snake case, like its other keys).
    fn key(self) -> &'static str {
        match self {
            System::CGlibc => "c_glibc",
            System::CGinza => "c_ginza",
            other => other.name(),
        }
    }
}

/// What one measurement run is given.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub iters: u64,
    pub samples: usize,
    pub core: usize,
}

/// Median ns/op of the four operations for one system.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Medians {
    pub spawn_join: f64,
    pub yield_pingpong: f64,
    pub condvar_pingpong: f64,
    pub mutex: f64,
}

impl Medians {
    /// Each operation's median over `rounds`; `None` when there are none.
    fn over(rounds: &[Medians]) -> Option<Medians> {
        let of = |f: fn(&Medians) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
        Some(Medians {
            spawn_join: of(|m| m.spawn_join)?,
            yield_pingpong: of(|m| m.yield_pingpong)?,
            condvar_pingpong: of(|m| m.condvar_pingpong)?,
            mutex: of(|m| m.mutex)?,
        })
    }
}

/// One operation's median ns/op per system; `None` (null) when a system was
/// skipped or could not run.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Row {
    ginza: Option<f64>,
    pthread: Option<f64>,
    tokio: Option<f64>,
    go: Option<f64>,
    c_glibc: Option<f64>,
    c_ginza: Option<f64>,
}

impl Row {
    fn slot(&mut self, system: System) -> &mut Option<f64> {
        match system {
            System::Ginza => &mut self.ginza,
            System::Pthread => &mut self.pthread,
            System::Tokio => &mut self.tokio,
            System::Go => &mut self.go,
            System::CGlibc => &mut self.c_glibc,
            System::CGinza => &mut self.c_ginza,
        }
    }

    fn set(&mut self, system: System, value: Option<f64>) {
        *self.slot(system) = value.map(round_tenth);
    }

    fn get(&self, system: System) -> Option<f64> {
        let mut row = *self;
        *row.slot(system)
    }
}

fn round_tenth(ns: f64) -> f64 {
    (ns * 10.0).round() / 10.0
}

fn round_hundredth(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Ops {
    spawn_join: Row,
    yield_pingpong: Row,
    condvar_pingpong: Row,
    mutex: Row,
}

impl Ops {
    fn record(&mut self, system: System, medians: Option<Medians>) {
        self.spawn_join.set(system, medians.map(|m| m.spawn_join));
        self.yield_pingpong
            .set(system, medians.map(|m| m.yield_pingpong));
        self.condvar_pingpong
            .set(system, medians.map(|m| m.condvar_pingpong));
        self.mutex.set(system, medians.map(|m| m.mutex));
    }

    /// (name, row, Shenango anchors uthread / Go / pthread)
    fn rows(&self) -> [(&'static str, &Row, &'static str); 4] {
        [
            ("spawn_join", &self.spawn_join, "148 / 462 / 12,996"),
            ("yield_pingpong", &self.yield_pingpong, "52 / 109 / 593"),
            (
                "condvar_pingpong",
                &self.condvar_pingpong,
                "100 / 281 / 1,900",
            ),
            ("mutex", &self.mutex, "37 / 24 / 30"),
        ]
    }
}

/// The operations that block (hand the CPU to another thread), which the aim
/// is about.
const BLOCKING_OPS: [&str; 2] = ["yield_pingpong", "condvar_pingpong"];

/// `c-ginza` against native Ginza and against `c-glibc`, for one operation;
/// null where either side is.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Versus {
    /// What the library adds to the native call, ns/op.
    c_ginza_minus_ginza_ns: Option<f64>,
    c_ginza_over_ginza: Option<f64>,
    c_ginza_over_c_glibc: Option<f64>,
}

impl Versus {
    fn of(row: &Row) -> Versus {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(round_hundredth(a / b)),
            _ => None,
        };
        Versus {
            c_ginza_minus_ginza_ns: row.c_ginza.zip(row.ginza).map(|(c, g)| round_tenth(c - g)),
            c_ginza_over_ginza: ratio(row.c_ginza, row.ginza),
            c_ginza_over_c_glibc: ratio(row.c_ginza, row.c_glibc),
        }
    }
}

/// The C program through the preload library, compared (`c_library` in JSON).
#[derive(Clone, Debug, Serialize)]
struct CLibrary {
    spawn_join: Versus,
    yield_pingpong: Versus,
    condvar_pingpong: Versus,
    mutex: Versus,
    /// The ops the aim is about.
    blocking_ops: [&'static str; 2],
    /// The most a blocking op may cost through the library over the native API.
    aim_ns: f64,
    /// Whether every blocking op stays under `aim_ns`; null without both columns.
    aim_met: Option<bool>,
}

impl CLibrary {
    fn of(ops: &Ops) -> CLibrary {
        let yield_pingpong = Versus::of(&ops.yield_pingpong);
        let condvar_pingpong = Versus::of(&ops.condvar_pingpong);
        let aim_met = [yield_pingpong, condvar_pingpong]
            .iter()
            .map(|v| v.c_ginza_minus_ginza_ns.map(|d| d < AIM_NS))
            .collect::<Option<Vec<bool>>>()
            .map(|met| met.iter().all(|&m| m));
        CLibrary {
            spawn_join: Versus::of(&ops.spawn_join),
            yield_pingpong,
            condvar_pingpong,
            mutex: Versus::of(&ops.mutex),
            blocking_ops: BLOCKING_OPS,
            aim_ns: AIM_NS,
            aim_met,
        }
    }

    fn rows(&self) -> [(&'static str, &Versus); 4] {
        [
            ("spawn_join", &self.spawn_join),
            ("yield_pingpong", &self.yield_pingpong),
            ("condvar_pingpong", &self.condvar_pingpong),
            ("mutex", &self.mutex),
        ]
    }
}

#[derive(Clone, Debug, Serialize)]
struct Meta {
    iters: u64,
    samples: usize,
    rounds: usize,
    core: usize,
    ginza_kthreads: usize,
    host_cpus: usize,
    allowed_cpus: usize,
    unit: &'static str,
    statistic: &'static str,
}

/// The JSON document: `{"ops": {...}, "c_library": {...}, "rounds": [...],
/// "meta": {...}}`; `rounds` holds each round's medians per system (null when
/// skipped or failed).
#[derive(Clone, Debug, Serialize)]
struct Report {
    ops: Ops,
    c_library: CLibrary,
    rounds: Vec<BTreeMap<&'static str, Option<Medians>>>,
    meta: Meta,
}

/// Runs `ginza bench threadops`.
pub fn run(args: ThreadopsArgs) -> anyhow::Result<()> {
    let allowed = allowed_cpus()?;
    let core = match args.core {
        Some(core) => {
            anyhow::ensure!(
                allowed.contains(&core),
                "--core {core}: this process may only run on CPUs {allowed:?}"
            );
            core
        }
        None => *allowed
            .last()
            .context("no CPU in this process's affinity mask")?,
    };
    let params = Params {
        iters: args.iters,
        samples: usize::try_from(args.samples).context("--samples too large")?,
        core,
    };
    let rounds = usize::try_from(args.rounds).context("--rounds too large")?;
    eprintln!(
        "threadops: {rounds} rounds of {} samples x {} ops per operation and system, all on CPU {core}",
        params.samples, params.iters
    );
    let report = measure(params, rounds, &args.skip, allowed.len());
    let table = render_table(&report);
    emit(args.json, &table, &report)
}

/// The external programs, built or compiled once before the rounds.
struct Peers {
    go: Option<PathBuf>,
    c: Option<c::Program>,
}

impl Peers {
    fn prepare(skip: &[System]) -> Peers {
        let go = if skip.contains(&System::Go) {
            None
        } else {
            go::build().unwrap_or_else(|e| {
                eprintln!("threadops: go: {e:#}: skipping Go peer");
                None
            })
        };
        let c = if skip.contains(&System::CGlibc) && skip.contains(&System::CGinza) {
            None
        } else {
            c::compile()
        };
        Peers { go, c }
    }

    /// Whether `system` can run (its program, if it needs one, is there).
    fn has(&self, system: System) -> bool {
        match system {
            System::Go => self.go.is_some(),
            System::CGlibc | System::CGinza => self.c.is_some(),
            System::Ginza | System::Pthread | System::Tokio => true,
        }
    }

    fn measure(&self, system: System, params: Params) -> anyhow::Result<Medians> {
        let missing = || anyhow::anyhow!("{} has no program", system.name());
        match system {
            System::Ginza => measure_ginza(params),
            System::Pthread => run_pinned(params.core, move || Ok(pthread::measure(params))),
            System::Tokio => run_pinned(params.core, move || tokio_tasks::measure(params)),
            System::Go => go::measure(params, self.go.as_deref().ok_or_else(missing)?),
            System::CGlibc => c::measure_glibc(params, self.c.as_ref().ok_or_else(missing)?),
            System::CGinza => c::measure_ginza(params, self.c.as_ref().ok_or_else(missing)?),
        }
    }
}

/// Measures every system not in `skip`, `rounds` times in turn; a system that
/// fails is reported on stderr, left out of later rounds and left null (a
/// figure from fewer rounds would not be comparable).
fn measure(params: Params, rounds: usize, skip: &[System], allowed_cpus: usize) -> Report {
    for system in skip {
        eprintln!("threadops: {}: skipped (--skip)", system.name());
    }
    let peers = Peers::prepare(skip);
    let mut active: Vec<System> = System::ALL
        .into_iter()
        .filter(|s| !skip.contains(s) && peers.has(*s))
        .collect();
    let mut per_system: BTreeMap<&'static str, Vec<Medians>> = BTreeMap::new();
    let mut per_round = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let mut this_round: BTreeMap<&'static str, Option<Medians>> =
            System::ALL.iter().map(|s| (s.key(), None)).collect();
        for system in active.clone() {
            eprintln!(
                "threadops: round {round}/{rounds}: {}: measuring...",
                system.name()
            );
            match peers.measure(system, params) {
                Ok(m) => {
                    eprintln!(
                        "threadops: round {round}/{rounds}: {}: spawn_join {:.1} ns, \
                         yield_pingpong {:.1} ns, condvar_pingpong {:.1} ns, mutex {:.1} ns",
                        system.name(),
                        m.spawn_join,
                        m.yield_pingpong,
                        m.condvar_pingpong,
                        m.mutex
                    );
                    this_round.insert(system.key(), Some(m));
                    per_system.entry(system.key()).or_default().push(m);
                }
                Err(e) => {
                    eprintln!(
                        "threadops: {}: failed: {e:#} (left out of the other rounds)",
                        system.name()
                    );
                    active.retain(|s| *s != system);
                    per_system.remove(system.key());
                }
            }
        }
        per_round.push(this_round);
    }
    let mut ops = Ops::default();
    for system in System::ALL {
        let medians = if active.contains(&system) {
            per_system.get(system.key()).and_then(|r| Medians::over(r))
        } else {
            None
        };
        ops.record(system, medians);
    }
    Report {
        c_library: CLibrary::of(&ops),
        ops,
        rounds: per_round,
        meta: Meta {
            iters: params.iters,
            samples: params.samples,
            rounds,
            core: params.core,
            ginza_kthreads: GINZA_KTHREADS,
            host_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            allowed_cpus,
            unit: "ns/op",
            statistic: "median over rounds of the median over samples",
        },
    }
}

fn measure_ginza(params: Params) -> anyhow::Result<Medians> {
    // Run on a thread of its own so a panic inside the runtime is reported, not
    // fatal; not pinned: the runtime pins its kthread itself (Config::cores).
    std::thread::Builder::new()
        .name("threadops-ginza".into())
        .spawn(move || ginza::measure(params))
        .context("spawning the Ginza measuring thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the Ginza measurement panicked"))?
}

/// Lays out `lines` (the first is the header, underlined) in columns: the
/// first left-aligned, the others right-aligned, except that with
/// `free_last` the last one is left as it is (a note, not a figure).
fn grid(lines: &[Vec<String>], free_last: bool) -> String {
    let cols = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let mut text = String::new();
        for (c, cell) in line.iter().enumerate() {
            let w = widths[c];
            if c == 0 || (free_last && c + 1 == cols) {
                let _ = write!(text, "{cell:<w$}");
            } else {
                let _ = write!(text, "{cell:>w$}");
            }
            if c + 1 < cols {
                text.push_str("  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
        if i == 0 {
            let total = widths.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

fn render_table(report: &Report) -> String {
    let mut lines: Vec<Vec<String>> = vec![std::iter::once("op")
        .chain(System::ALL.map(System::name))
        .chain(["Shenango anchor (uthread / Go / pthread)"])
        .map(String::from)
        .collect()];
    for (name, row, anchor) in report.ops.rows() {
        let mut line = vec![name.to_string()];
        line.extend(System::ALL.map(|s| row.get(s).map_or("-".to_string(), |v| format!("{v:.1}"))));
        line.push(anchor.to_string());
        lines.push(line);
    }
    let mut out = grid(&lines, true);
    let _ = writeln!(
        out,
        "median over {} rounds of the median ns/op over {} samples of {} ops, CPU {}",
        report.meta.rounds, report.meta.samples, report.meta.iters, report.meta.core
    );

    let lib = &report.c_library;
    out.push('\n');
    let _ = writeln!(
        out,
        "C through the preload library (c-ginza, `ginza run --kthreads {}`) against the \
         native API (ginza) and glibc (c-glibc):",
        report.meta.ginza_kthreads
    );
    let mut lines: Vec<Vec<String>> = vec![[
        "op",
        "c-ginza - ginza (ns)",
        "c-ginza / ginza",
        "c-ginza / c-glibc",
        "",
    ]
    .map(String::from)
    .to_vec()];
    for (name, v) in lib.rows() {
        let aim = match v.c_ginza_minus_ginza_ns {
            Some(d) if BLOCKING_OPS.contains(&name) => {
                let verdict = if d < lib.aim_ns { "met" } else { "NOT met" };
                format!("blocking: aim < {:.0} ns {verdict}", lib.aim_ns)
            }
            _ => String::new(),
        };
        lines.push(vec![
            name.to_string(),
            v.c_ginza_minus_ginza_ns
                .map_or("-".into(), |d| format!("{d:+.1}")),
            v.c_ginza_over_ginza
                .map_or("-".into(), |r| format!("{r:.2}x")),
            v.c_ginza_over_c_glibc
                .map_or("-".into(), |r| format!("{r:.2}x")),
            aim,
        ]);
    }
    out.push_str(&grid(&lines, true));
    let verdict = match lib.aim_met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured (c-ginza or ginza missing)",
    };
    let _ = writeln!(
        out,
        "aim: a blocking call (yield, condvar ping-pong) costs < {:.0} ns more through the \
         library than through the native API: {verdict}",
        lib.aim_ns
    );
    out
}

/// A CPU set holding `core` only.
pub(crate) fn cpu_set_of(core: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if core < 8 * std::mem::size_of_val(&set) {
        // SAFETY: CPU_SET writes one bit of `set`, and `core` is below its size.
        unsafe { libc::CPU_SET(core, &mut set) };
    }
    set
}

/// Runs `f` on a new thread pinned to `core` (threads it spawns inherit the
/// mask) and returns its result.
fn run_pinned<T: Send + 'static>(
    core: usize,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    std::thread::Builder::new()
        .name("threadops".into())
        .spawn(move || {
            affinity::pin_current_thread(core).with_context(|| format!("pinning to CPU {core}"))?;
            f()
        })
        .context("spawning the measuring thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the measurement panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_exact_shape() {
        let allowed = allowed_cpus().unwrap();
        let params = Params {
            iters: 20,
            samples: 3,
            core: *allowed.last().unwrap(),
        };
        // The external programs are left out (they need `go`, `cc` and the
        // `ginza` binary: crates/cli/tests/bench_threadops.rs runs the C
        // columns); Ginza, pthreads and Tokio are measured in two rounds, with
        // counts small enough for a debug build.
        let skip = [System::Go, System::CGlibc, System::CGinza];
        let report = measure(params, 2, &skip, allowed.len());
        let v: serde_json::Value = serde_json::to_value(&report).unwrap();
        let top = v.as_object().unwrap();
        let mut keys: Vec<&str> = top.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["c_library", "meta", "ops", "rounds"]);
        let ops = top["ops"].as_object().unwrap();
        let mut op_names: Vec<&str> = ops.keys().map(String::as_str).collect();
        op_names.sort_unstable();
        assert_eq!(
            op_names,
            ["condvar_pingpong", "mutex", "spawn_join", "yield_pingpong"]
        );
        for (name, row) in ops {
            let row = row.as_object().unwrap();
            let mut systems: Vec<&str> = row.keys().map(String::as_str).collect();
            systems.sort_unstable();
            assert_eq!(
                systems,
                ["c_ginza", "c_glibc", "ginza", "go", "pthread", "tokio"],
                "{name}"
            );
            for s in ["go", "c_glibc", "c_ginza"] {
                assert!(row[s].is_null(), "{name}.{s}: skipped → null");
            }
            for s in ["ginza", "pthread", "tokio"] {
                let ns = row[s]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{name}.{s} is {}, not a number", row[s]));
                // Every operation takes time: a zero would mean nothing ran.
                assert!(ns.is_finite() && ns > 0.0, "{name}.{s} = {ns}");
            }
            // Without c-ginza there is nothing to compare.
            let versus = &top["c_library"][name];
            assert!(versus["c_ginza_minus_ginza_ns"].is_null(), "{versus}");
        }
        assert!(top["c_library"]["aim_met"].is_null());
        assert_eq!(top["c_library"]["aim_ns"], 100.0);
        let rounds = top["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 2);
        for r in rounds {
            assert!(r["ginza"]["yield_pingpong"].as_f64().is_some(), "{r}");
            assert!(r["c_ginza"].is_null(), "{r}");
        }
        assert_eq!(top["meta"]["rounds"], 2);
        // The serialized text parses back as one object.
        let text = serde_json::to_string(&report).unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(&text)
            .unwrap()
            .is_object());
        let table = render_table(&report);
        assert!(table.contains("spawn_join"), "{table}");
        assert!(
            table.contains("c-glibc") && table.contains("c-ginza"),
            "{table}"
        );
    }

    #[test]
    fn c_library_compares_c_ginza_with_ginza_and_glibc() {
        let mut ops = Ops::default();
        let m = |spawn_join, yield_pingpong, condvar_pingpong, mutex| Medians {
            spawn_join,
            yield_pingpong,
            condvar_pingpong,
            mutex,
        };
        ops.record(System::Ginza, Some(m(100.0, 20.0, 50.0, 10.0)));
        ops.record(System::CGlibc, Some(m(20_000.0, 1000.0, 4000.0, 10.0)));
        ops.record(System::CGinza, Some(m(1200.0, 60.0, 170.0, 12.5)));
        let lib = CLibrary::of(&ops);
        assert_eq!(lib.yield_pingpong.c_ginza_minus_ginza_ns, Some(40.0));
        assert_eq!(lib.yield_pingpong.c_ginza_over_ginza, Some(3.0));
        assert_eq!(lib.yield_pingpong.c_ginza_over_c_glibc, Some(0.06));
        assert_eq!(lib.condvar_pingpong.c_ginza_minus_ginza_ns, Some(120.0));
        // condvar adds 120 ns: over the aim, whatever yield does.
        assert_eq!(lib.aim_met, Some(false));
        ops.record(System::CGinza, Some(m(1200.0, 60.0, 140.0, 12.5)));
        assert_eq!(CLibrary::of(&ops).aim_met, Some(true));
        let report = Report {
            c_library: CLibrary::of(&ops),
            ops,
            rounds: Vec::new(),
            meta: Meta {
                iters: 1,
                samples: 1,
                rounds: 1,
                core: 0,
                ginza_kthreads: GINZA_KTHREADS,
                host_cpus: 1,
                allowed_cpus: 1,
                unit: "ns/op",
                statistic: "median",
            },
        };
        let table = render_table(&report);
        assert!(table.contains("+90.0"), "{table}");
        assert!(table.contains("aim < 100 ns met"), "{table}");
    }

    #[test]
    fn medians_over_rounds_take_each_ops_median() {
        let m = |x: f64| Medians {
            spawn_join: x,
            yield_pingpong: 2.0 * x,
            condvar_pingpong: 3.0 * x,
            mutex: 4.0 * x,
        };
        let over = Medians::over(&[m(1.0), m(9.0), m(2.0)]).unwrap();
        assert_eq!(over, m(2.0));
        assert_eq!(Medians::over(&[]), None);
    }

    #[test]
    fn peer_output_parses_into_medians() {
        // The Go peer's line; the C program prints the same shape.
        let line =
            r#"{"condvar_pingpong":157.2,"mutex":5.2,"spawn_join":417.9,"yield_pingpong":78.3}"#;
        let m: Medians = serde_json::from_str(line).unwrap();
        assert_eq!(m.spawn_join, 417.9);
        assert_eq!(m.mutex, 5.2);
    }
}
