//! `ginza bench threadops`: the cost of thread operations for Ginza uthreads,
//! pthreads (`std::thread`), Tokio tasks and Go goroutines, measured in one run
//! on one CPU.
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
//! the median over samples is reported. Everything runs on the CPU given by
//! `--core` (default: the last CPU this process may use): the measuring
//! pthreads pin themselves (threads they spawn inherit the mask), Tokio's
//! current-thread runtime runs on such a pinned thread, Ginza gets one kthread
//! pinned there by its `Config`, and the Go peer (GOMAXPROCS=1) has the mask
//! set in the child between fork and exec, so all of its OS threads inherit it.

use crate::harness::figures::allowed_cpus;
use crate::harness::figures::emit;

mod ginza;
mod go;
mod pthread;
mod stats;
mod tokio_tasks;

use std::fmt::Write as _;

use anyhow::Context as _;
use ginza_sys::affinity;
use serde::{Deserialize, Serialize};

/// Arguments of `ginza bench threadops`.
#[derive(clap::Args, Debug)]
pub struct ThreadopsArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Operations per sample.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Samples per operation and system; the median is reported.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    samples: u64,
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
}

impl System {
    const ALL: [System; 4] = [System::Ginza, System::Pthread, System::Tokio, System::Go];

    fn name(self) -> &'static str {
        match self {
            System::Ginza => "ginza",
            System::Pthread => "pthread",
            System::Tokio => "tokio",
            System::Go => "go",
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

/// One operation's median ns/op per system; `None` (null) when a system was
/// skipped or could not run.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Row {
    ginza: Option<f64>,
    pthread: Option<f64>,
    tokio: Option<f64>,
    go: Option<f64>,
}

impl Row {
    fn set(&mut self, system: System, value: Option<f64>) {
        let slot = match system {
            System::Ginza => &mut self.ginza,
            System::Pthread => &mut self.pthread,
            System::Tokio => &mut self.tokio,
            System::Go => &mut self.go,
        };
        *slot = value.map(round_tenth);
    }

    fn get(&self, system: System) -> Option<f64> {
        match system {
            System::Ginza => self.ginza,
            System::Pthread => self.pthread,
            System::Tokio => self.tokio,
            System::Go => self.go,
        }
    }
}

fn round_tenth(ns: f64) -> f64 {
    (ns * 10.0).round() / 10.0
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

#[derive(Clone, Debug, Serialize)]
struct Meta {
    iters: u64,
    samples: usize,
    core: usize,
    host_cpus: usize,
    allowed_cpus: usize,
    unit: &'static str,
    statistic: &'static str,
}

/// The JSON document: `{"ops": {...}, "meta": {...}}`.
#[derive(Clone, Debug, Serialize)]
struct Report {
    ops: Ops,
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
    eprintln!(
        "threadops: {} samples x {} ops per operation, all on CPU {core}",
        params.samples, params.iters
    );
    let report = measure(params, &args.skip, allowed.len());
    let table = render_table(&report);
    emit(args.json, &table, &report)
}

/// Measures every system not in `skip`; a system that fails is reported on
/// stderr and left null.
fn measure(params: Params, skip: &[System], allowed_cpus: usize) -> Report {
    let mut ops = Ops::default();
    for system in System::ALL {
        if skip.contains(&system) {
            eprintln!("threadops: {}: skipped (--skip)", system.name());
            continue;
        }
        eprintln!("threadops: {}: measuring...", system.name());
        let result = match system {
            System::Ginza => measure_ginza(params),
            System::Pthread => run_pinned(params.core, move || Ok(pthread::measure(params))),
            System::Tokio => run_pinned(params.core, move || tokio_tasks::measure(params)),
            System::Go => go::measure(params),
        };
        let medians = match result {
            Ok(Some(m)) => {
                eprintln!(
                    "threadops: {}: spawn_join {:.1} ns, yield_pingpong {:.1} ns, \
                     condvar_pingpong {:.1} ns, mutex {:.1} ns",
                    system.name(),
                    m.spawn_join,
                    m.yield_pingpong,
                    m.condvar_pingpong,
                    m.mutex
                );
                Some(m)
            }
            Ok(None) => None,
            Err(e) => {
                eprintln!("threadops: {}: failed: {e:#}", system.name());
                None
            }
        };
        ops.record(system, medians);
    }
    Report {
        ops,
        meta: Meta {
            iters: params.iters,
            samples: params.samples,
            core: params.core,
            host_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            allowed_cpus,
            unit: "ns/op",
            statistic: "median over samples",
        },
    }
}

fn measure_ginza(params: Params) -> anyhow::Result<Option<Medians>> {
    // Run on a thread of its own so a panic inside the runtime is reported, not
    // fatal; not pinned: the runtime pins its kthread itself (Config::cores).
    std::thread::Builder::new()
        .name("threadops-ginza".into())
        .spawn(move || ginza::measure(params))
        .context("spawning the Ginza measuring thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the Ginza measurement panicked"))?
        .map(Some)
}

fn render_table(report: &Report) -> String {
    let header = [
        "op",
        "ginza",
        "pthread",
        "tokio",
        "go",
        "Shenango anchor (uthread / Go / pthread)",
    ];
    let mut lines: Vec<[String; 6]> = vec![header.map(String::from)];
    for (name, row, anchor) in report.ops.rows() {
        let cell = |s: System| row.get(s).map_or("-".to_string(), |v| format!("{v:.1}"));
        lines.push([
            name.to_string(),
            cell(System::Ginza),
            cell(System::Pthread),
            cell(System::Tokio),
            cell(System::Go),
            anchor.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        for (c, cell) in line.iter().enumerate() {
            if c == 5 {
                out.push_str(cell);
            } else if c == 0 {
                let _ = write!(out, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(out, "{cell:>w$}", w = widths[c]);
            }
            out.push_str(if c == 5 { "\n" } else { "  " });
        }
        if i == 0 {
            let total = widths.iter().sum::<usize>() + 2 * 5;
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    let _ = writeln!(
        out,
        "median ns/op over {} samples of {} ops, CPU {}",
        report.meta.samples, report.meta.iters, report.meta.core
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
) -> anyhow::Result<Option<T>> {
    std::thread::Builder::new()
        .name("threadops".into())
        .spawn(move || {
            affinity::pin_current_thread(core).with_context(|| format!("pinning to CPU {core}"))?;
            f()
        })
        .context("spawning the measuring thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the measurement panicked"))?
        .map(Some)
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
        // Go is left out (it builds and runs a Go program); Ginza, pthreads
        // and Tokio are measured, with counts small enough for a debug build.
        let report = measure(params, &[System::Go], allowed.len());
        let v: serde_json::Value = serde_json::to_value(&report).unwrap();
        let top = v.as_object().unwrap();
        let mut keys: Vec<&str> = top.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["meta", "ops"]);
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
            assert_eq!(systems, ["ginza", "go", "pthread", "tokio"], "{name}");
            assert!(row["go"].is_null(), "{name}: skipped → null");
            for s in ["ginza", "pthread", "tokio"] {
                let ns = row[s]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{name}.{s} is {}, not a number", row[s]));
                // Every operation takes time: a zero would mean nothing ran.
                assert!(ns.is_finite() && ns > 0.0, "{name}.{s} = {ns}");
            }
        }
        // The serialized text parses back as one object.
        let text = serde_json::to_string(&report).unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(&text)
            .unwrap()
            .is_object());
        assert!(render_table(&report).contains("spawn_join"));
    }

    #[test]
    fn go_output_parses_into_medians() {
        let line =
            r#"{"condvar_pingpong":157.2,"mutex":5.2,"spawn_join":417.9,"yield_pingpong":78.3}"#;
        let m: Medians = serde_json::from_str(line).unwrap();
        assert_eq!(m.spawn_join, 417.9);
        assert_eq!(m.mutex, 5.2);
    }
}
