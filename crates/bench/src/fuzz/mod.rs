//! `ginza fuzz`: every parser and state machine that reads untrusted
//! bytes, driven by structure-aware random inputs on stable Rust
//! (docs/fuzzing.md).
//!
//! A case is a seed: its bytes come from a seeded RNG, `arbitrary` shapes
//! them into the target's input (a frame, a TCP connection's state and the
//! segments it is fed, netstack command slots, a memcached or HTTP byte
//! stream, an experiment file), and the target checks its invariants on
//! it. A panic (an invariant broken, or a bug) is caught per case and
//! reported with the case's seed: `ginza fuzz TARGET --seed SEED --cases 1`
//! runs that case again, and the report prints its input.
//!
//! One file per target; this one holds the runner.

mod experiment;
mod frames;
mod http;
mod kv;
mod netstack;
mod tcp;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// `ginza fuzz`'s arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct FuzzArgs {
    /// What to fuzz (or `--all`).
    #[arg(value_enum, required_unless_present = "all", conflicts_with = "all")]
    pub target: Option<Target>,
    /// Every target, one after the other.
    #[arg(long)]
    pub all: bool,
    /// Cases per target.
    #[arg(long, default_value_t = 100_000)]
    pub cases: u64,
    /// The first case's seed; case `i` uses `seed + i`, so a failing case
    /// runs again alone with `--seed <its seed> --cases 1`.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop each target after this many seconds, with the cases run so far
    /// (reported as such), if `--cases` are not done by then.
    #[arg(long)]
    pub max_seconds: Option<f64>,
}

/// The fuzz targets.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Ethernet, ARP, IPv4, ICMP, UDP and TCP frames into `ginza_net::parse`.
    Frames,
    /// Segments, timers and calls into a TCP connection in every state.
    Tcp,
    /// Command slots (and peer frames) into the protected netstack.
    Netstack,
    /// memcached text and binary protocol streams into kv-server's sessions.
    Kv,
    /// HTTP/1.1 request streams into http-server's session.
    Http,
    /// Experiment files (TOML) into the experiment loader and planner.
    Experiment,
}

impl Target {
    pub const ALL: [Target; 6] = [
        Target::Frames,
        Target::Tcp,
        Target::Netstack,
        Target::Kv,
        Target::Http,
        Target::Experiment,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Frames => "frames",
            Target::Tcp => "tcp",
            Target::Netstack => "netstack",
            Target::Kv => "kv",
            Target::Http => "http",
            Target::Experiment => "experiment",
        }
    }

    /// Most random bytes one case draws from (its input is shaped from a
    /// prefix of them; `arbitrary` pads with zeros when they run out).
    fn max_bytes(self) -> usize {
        match self {
            Target::Frames => 1700,
            Target::Tcp => 4096,
            Target::Netstack => 4096,
            Target::Kv | Target::Http => 2048,
            Target::Experiment => 1024,
        }
    }

    /// Shapes `u` into an input and checks it; panics when an invariant
    /// breaks. `describe` gets the input's `Debug` (for the report).
    fn case(self, u: &mut Unstructured<'_>, describe: &mut Option<String>) -> Outcome {
        match self {
            Target::Frames => frames::case(u, describe),
            Target::Tcp => tcp::case(u, describe),
            Target::Netstack => netstack::case(u, describe),
            Target::Kv => kv::case(u, describe),
            Target::Http => http::case(u, describe),
            Target::Experiment => experiment::case(u, describe),
        }
    }
}

/// What a case came to, counted per label: the distinct outcomes tell
/// whether the inputs reach past the first checks.
pub type Outcome = std::borrow::Cow<'static, str>;

/// Keeps the input's `Debug` only when asked (the replay of a failure).
pub(crate) fn describe<T: std::fmt::Debug>(out: &mut Option<String>, input: &T) {
    if let Some(s) = out {
        let _ = write!(s, "{input:#?}");
    }
}

/// A list whose length `arbitrary` draws from the bytes left (its own
/// `Vec` stops each element with a coin toss: one element on average).
pub(crate) struct List<T>(pub Vec<T>);

impl<'a, T: Arbitrary<'a>> Arbitrary<'a> for List<T> {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let n = u.arbitrary_len::<T>()?;
        (0..n)
            .map(|_| T::arbitrary(u))
            .collect::<Result<_, _>>()
            .map(List)
    }
}

impl<T> std::ops::Deref for List<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<'l, T> IntoIterator for &'l List<T> {
    type Item = &'l T;
    type IntoIter = std::slice::Iter<'l, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for List<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One failing case.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    /// The panic's message and where it was raised.
    pub message: String,
    /// The input, as `Debug` prints it (truncated).
    pub input: String,
}

/// One target's run.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: Target,
    pub cases: u64,
    pub elapsed: Duration,
    pub outcomes: BTreeMap<Outcome, u64>,
    pub failures: Vec<Failure>,
}

/// Failures kept per run (the count goes on).
const KEEP_FAILURES: usize = 10;
/// The longest input description printed.
const MAX_DESCRIPTION: usize = 16 * 1024;

/// The bytes of case `seed`.
fn case_bytes(target: Target, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Short inputs often: most interesting inputs are small, and a short
    // byte string leaves `arbitrary`'s lengths short too.
    let max = match rng.random_range(0..4) {
        0 => 64,
        1 => 256,
        _ => target.max_bytes(),
    };
    let len = rng.random_range(0..=max);
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes[..]);
    bytes
}

/// Runs case `seed` of `target` once, catching a panic.
fn run_case(target: Target, seed: u64) -> Result<Outcome, String> {
    let bytes = case_bytes(target, seed);
    capture::catching(|| {
        let mut u = Unstructured::new(&bytes);
        target.case(&mut u, &mut None)
    })
}

/// The input of case `seed`, described (the case is run once more; a
/// second panic is expected and ignored).
fn describe_case(target: Target, seed: u64) -> String {
    let bytes = case_bytes(target, seed);
    let mut text = Some(String::new());
    let _ = capture::catching(|| {
        let mut u = Unstructured::new(&bytes);
        target.case(&mut u, &mut text)
    });
    let mut text = text.unwrap_or_default();
    if text.len() > MAX_DESCRIPTION {
        let mut cut = MAX_DESCRIPTION;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n… (truncated)");
    }
    text
}

/// Runs `cases` cases of `target` from `seed`; `progress` is called now
/// and then with the cases done so far, and stops the run when it returns
/// false.
pub fn fuzz(
    target: Target,
    cases: u64,
    seed: u64,
    mut progress: impl FnMut(u64) -> bool,
) -> Report {
    let started = Instant::now();
    let mut run = cases;
    let mut outcomes: BTreeMap<Outcome, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut failed = 0u64;
    for i in 0..cases {
        let case_seed = seed.wrapping_add(i);
        match run_case(target, case_seed) {
            Ok(outcome) => *outcomes.entry(outcome).or_default() += 1,
            Err(message) => {
                failed += 1;
                *outcomes.entry("FAILED".into()).or_default() += 1;
                if failures.len() < KEEP_FAILURES {
                    failures.push(Failure {
                        seed: case_seed,
                        message,
                        input: describe_case(target, case_seed),
                    });
                }
            }
        }
        if i % 4096 == 4095 && !progress(i + 1) {
            run = i + 1;
            break;
        }
    }
    debug_assert!(failed >= failures.len() as u64);
    Report {
        target,
        cases: run,
        elapsed: started.elapsed(),
        outcomes,
        failures,
    }
}

impl Report {
    pub fn failed(&self) -> u64 {
        self.outcomes.get("FAILED").copied().unwrap_or(0)
    }

    /// The report's text: one summary line, then each kept failure.
    pub fn render(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        let mut s = format!(
            "{}: {} cases in {:.1} s ({:.0}/s), {} failed, {} distinct outcomes\n",
            self.target.name(),
            self.cases,
            secs,
            self.cases as f64 / secs.max(1e-9),
            self.failed(),
            self.outcomes.len(),
        );
        let mut top: Vec<_> = self.outcomes.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        let shown: Vec<String> = top
            .iter()
            .take(8)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(s, "  most common: {}", shown.join(", "));
        for f in &self.failures {
            let _ = writeln!(
                s,
                "  FAILED seed {} (rerun: ginza fuzz {} --seed {} --cases 1)\n  {}\n  input:\n{}",
                f.seed,
                self.target.name(),
                f.seed,
                f.message,
                f.input
            );
        }
        s
    }
}

/// `ginza fuzz`.
pub fn run(args: FuzzArgs) -> anyhow::Result<()> {
    let targets: Vec<Target> = match args.target {
        Some(t) if !args.all => vec![t],
        _ => Target::ALL.to_vec(),
    };
    let mut failed = Vec::new();
    for target in targets {
        let started = Instant::now();
        let mut last = started;
        let report = fuzz(target, args.cases, args.seed, |done| {
            if last.elapsed() >= Duration::from_secs(10) {
                last = Instant::now();
                eprintln!(
                    "{}: {done} of {} cases, {:.0} s",
                    target.name(),
                    args.cases,
                    started.elapsed().as_secs_f64()
                );
            }
            args.max_seconds
                .is_none_or(|max| started.elapsed().as_secs_f64() < max)
        });
        print!("{}", report.render());
        if report.cases < args.cases {
            println!(
                "  stopped by --max-seconds after {} of {} cases",
                report.cases, args.cases
            );
        }
        if report.failed() > 0 {
            failed.push(format!("{} ({} cases)", target.name(), report.failed()));
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("failing cases in {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_with_its_message_and_place() {
        let err = capture::catching(|| -> u32 { panic!("invariant {} broken", 7) }).unwrap_err();
        assert!(err.contains("invariant 7 broken"), "{err}");
        assert!(err.contains("fuzz/mod.rs:"), "{err}");
        assert_eq!(capture::catching(|| 5), Ok(5));
    }

    #[test]
    fn a_failure_is_reported_with_the_seed_that_reruns_it() {
        let report = Report {
            target: Target::Kv,
            cases: 2,
            elapsed: Duration::from_millis(1),
            outcomes: [("FAILED".into(), 1), ("text STORED".into(), 1)].into(),
            failures: vec![Failure {
                seed: 42,
                message: "panicked at x.rs:1: boom".into(),
                input: "Text { .. }".into(),
            }],
        };
        assert_eq!(report.failed(), 1);
        let text = report.render();
        assert!(text.contains("1 failed"), "{text}");
        assert!(text.contains("ginza fuzz kv --seed 42 --cases 1"), "{text}");
        assert!(
            text.contains("boom") && text.contains("Text { .. }"),
            "{text}"
        );
    }
}

/// Catching a case's panic with its message, without the default hook's
/// print for every caught panic (other threads' panics still print).
mod capture {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::sync::Once;

    thread_local! {
        static CATCHING: Cell<bool> = const { Cell::new(false) };
        static MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    fn install_hook() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            let previous = panic::take_hook();
            panic::set_hook(Box::new(move |info| {
                if CATCHING.with(Cell::get) {
                    let at = info
                        .location()
                        .map(|l| format!(" at {}:{}", l.file(), l.line()))
                        .unwrap_or_default();
                    let payload = info
                        .payload()
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| info.payload().downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(a panic without a message)".into());
                    MESSAGE.with(|m| *m.borrow_mut() = Some(format!("panicked{at}: {payload}")));
                } else {
                    previous(info);
                }
            }));
        });
    }

    /// `f()`, or the message of its panic.
    pub(super) fn catching<T>(f: impl FnOnce() -> T) -> Result<T, String> {
        install_hook();
        CATCHING.with(|c| c.set(true));
        let r = panic::catch_unwind(AssertUnwindSafe(f));
        CATCHING.with(|c| c.set(false));
        r.map_err(|_| {
            MESSAGE
                .with(|m| m.borrow_mut().take())
                .unwrap_or_else(|| "panicked".into())
        })
    }
}
