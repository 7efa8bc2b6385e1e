//! Experiments as files: `ginza bench run FILE…`, `ginza bench list`,
//! `ginza bench all` (docs/experiments.md). One sweep engine: a file names
//! the applications, the system under test and its baselines, and the load;
//! the engine runs every (round, load, system) point with the systems
//! interleaved within each round, behind a progress bar, and writes CSV,
//! JSON and one PNG per plotted metric under `results/<experiment>/`.

pub mod linux_spin;
pub mod row;
pub mod runners;
pub mod spec;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_sim::plot::{line_chart, Chart, Series};
use serde::Serialize;

use row::Row;
use runners::{Runner, Settings};
use spec::{Generator, Loaded, SystemKind};

/// Arguments of `ginza bench run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Experiment files (`bench/experiments/*.toml`).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    common: CommonArgs,
}

/// Arguments of `ginza bench all`.
#[derive(clap::Args, Debug)]
pub struct AllArgs {
    /// Where the experiment files are [default: bench/experiments].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print what would run and the estimated time of each experiment and
    /// of the whole set (from durations × points × rounds), run nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    common: CommonArgs,
}

/// Arguments of `ginza bench list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Where the experiment files are [default: bench/experiments].
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct CommonArgs {
    /// A tiny version: two load points, one round, a few ms per point
    /// (the tests run every file this way; the figures mean nothing).
    #[arg(long)]
    tiny: bool,
    /// Output root: each experiment writes under `<out>/<name>/`.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Print one JSON object per experiment on stdout (tables go to stderr).
    #[arg(long)]
    json: bool,
}

/// The experiments folder: `bench/experiments` here, else the one of the
/// source tree this binary was built from.
fn default_dir() -> PathBuf {
    let here = PathBuf::from("bench/experiments");
    if here.is_dir() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/experiments")
}

/// The `*.toml` files of `dir`, sorted.
fn files_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    Ok(v)
}

/// A file with a runner chosen for each of its systems.
pub struct Plan {
    pub loaded: Loaded,
    /// The system under test first, then the baselines.
    pub systems: Vec<(spec::System, Runner)>,
    pub settings: Settings,
    /// The load points.
    pub offered: Vec<f64>,
    pub rounds: u64,
}

impl Plan {
    /// Checks `loaded` and picks runners; `tiny` shrinks the run.
    pub fn new(loaded: Loaded, tiny: bool) -> anyhow::Result<Plan> {
        let spec = &loaded.spec;
        let mut systems = Vec::new();
        let mut labels = Vec::new();
        for sys in std::iter::once(&spec.system).chain(&spec.baselines) {
            if labels.contains(&sys.label()) {
                return Err(loaded.error_at(
                    sys.label.span().start,
                    "label",
                    &format!("two systems are labelled {:?}", sys.label()),
                ));
            }
            labels.push(sys.label());
            systems.push((sys.clone(), runners::choose(&loaded, sys)?));
        }
        let load = &spec.load;
        let mut offered: Vec<f64> = load.offered.iter().map(|p| p.0).collect();
        if !load.steps.is_empty() {
            if !offered.is_empty() {
                return Err(loaded.error_at(
                    loaded.text.find("offered").unwrap_or(0),
                    "offered",
                    "give either offered = [...] (a sweep) or steps (a time series), not both",
                ));
            }
            // One point per system and round: the steps run back to back.
            offered = vec![load.steps[0].offered.0];
        }
        if offered.is_empty() {
            return Err(loaded.error_at(
                loaded.text.find("[load]").unwrap_or(0),
                "offered",
                "[load] needs offered = [...] (or steps)",
            ));
        }
        let default_duration = match load.generator {
            Generator::Simulated | Generator::InProcess => Duration::from_millis(100),
            _ => Duration::from_millis(300),
        };
        let mut settings = Settings {
            duration: load.duration.map_or(default_duration, |d| d.0),
            warmup: load.warmup.map_or(Duration::ZERO, |d| d.0),
            requests: load.requests.map_or(100_000, |r| r.0),
            seed: load.seed,
            tiny,
        };
        let mut rounds = spec.experiment.rounds.0;
        if tiny {
            offered.truncate(2);
            rounds = 1;
            settings.duration = settings.duration.min(Duration::from_millis(20));
            settings.warmup = settings.warmup.min(Duration::from_millis(5));
            settings.requests = settings.requests.min(2_000);
        }
        Ok(Plan {
            loaded,
            systems,
            settings,
            offered,
            rounds,
        })
    }

    pub fn name(&self) -> &str {
        &self.loaded.spec.experiment.name.0
    }

    /// Systems that can run here.
    fn runnable(&self) -> impl Iterator<Item = &(spec::System, Runner)> {
        self.systems.iter().filter(|(_, r)| r.available())
    }

    /// Roughly how long one point of `r` takes (a guide for the ETA,
    /// `bench list` and `bench all`, not a promise).
    fn point_estimate(&self, r: &Runner) -> Duration {
        let s = &self.settings;
        match r {
            Runner::Unavailable(_) => Duration::ZERO,
            // (a loaded debug build took about 1.1 s for 0.4 s points).
            Runner::SpinBatch { .. } => s.warmup + s.duration + Duration::from_millis(600),
            Runner::SpinBatchSteps { .. } => {
                let steps: Duration = self
                    .loaded
                    .spec
                    .load
                    .steps
                    .iter()
                    .map(|st| {
                        if s.tiny {
                            st.duration.0.min(Duration::from_millis(20))
                        } else {
                            st.duration.0
                        }
                    })
                    .sum();
                s.warmup + steps + Duration::from_millis(400)
            }
            Runner::Steering { .. } => s.duration + Duration::from_millis(200),
            // Preloading the keys, starting the server (and iokerneld).
            Runner::Memcached { .. } => s.warmup + s.duration + Duration::from_millis(500),
            // Registration and a settling time of 200 ms.
            Runner::Colocate { .. } => s.duration + Duration::from_millis(400),
            Runner::ScanShinjuku { .. } => Duration::from_millis(300) + s.duration,
            // iokerneld (and netstackd) started and stopped, warm-up
            // round trips.
            // (a loaded debug build took 2.6 s for a 1 s point).
            Runner::Oneway { .. } => s.duration + Duration::from_millis(1000),
            // iokerneld (and netstackd), the server and loadgen's
            // connections started and stopped.
            Runner::Http { .. } => s.warmup + s.duration + Duration::from_millis(1000),
            Runner::LinuxSpin => s.warmup + s.duration + Duration::from_millis(100),
            Runner::SimRequests { .. } => Duration::from_secs_f64(s.requests as f64 * 2e-6),
            Runner::SimSteering { .. } => Duration::from_secs_f64(s.duration.as_secs_f64() * 2.0),
            Runner::SimAllocator { .. } | Runner::SimSlowBound => {
                Duration::from_millis(if s.tiny { 200 } else { 1500 })
            }
        }
    }

    /// Roughly how long the run takes: every point of every system, every
    /// round.
    /// Saturating: a file may ask for absurd rounds or durations (rounds
    /// up to 2⁶⁴ − 1, durations up to 10⁹ s each), and the estimate then
    /// says "about forever" instead of overflowing.
    pub fn estimate(&self) -> Duration {
        let points = u32::try_from(self.offered.len()).unwrap_or(u32::MAX);
        let one_round = self
            .systems
            .iter()
            .map(|(_, r)| self.point_estimate(r).saturating_mul(points))
            .fold(Duration::ZERO, Duration::saturating_add);
        one_round.saturating_mul(u32::try_from(self.rounds).unwrap_or(u32::MAX))
    }

    /// `runnable`, `partly runnable` or `not available yet`.
    pub fn status(&self) -> &'static str {
        let n = self.runnable().count();
        if n == self.systems.len() {
            "runnable"
        } else if n > 0 {
            "partly runnable"
        } else {
            "not available yet"
        }
    }
}

/// A system left out, and why.
#[derive(Serialize)]
struct Unavailable {
    system: String,
    reason: String,
}

/// The JSON written beside the CSV (and printed with `--json`).
#[derive(Serialize)]
struct Report<'a> {
    experiment: &'a str,
    reproduces: &'a str,
    description: &'a str,
    file: String,
    tiny: bool,
    /// Figures of a debug build are not the system's real cost.
    debug_build: bool,
    rounds: u64,
    offered: &'a [f64],
    unit: &'static str,
    systems: Vec<&'a str>,
    unavailable: Vec<Unavailable>,
    elapsed_s: f64,
    /// What `bench list` / `bench all --dry-run` estimated beforehand (to
    /// check the estimate against `elapsed_s`).
    estimated_s: f64,
    /// /proc/loadavg before and after the run: figures from a machine
    /// others were loading are not a quiet machine's.
    loadavg_before: String,
    loadavg_after: String,
    columns: &'static [&'static str],
    /// Every point of every round.
    rows: &'a [Row],
    /// Per system and load: the median over rounds.
    medians: &'a [Row],
    csv: String,
    png: Vec<String>,
}

/// Width of the time bins of a load-steps experiment's medians, ms.
const STEP_BIN_MS: f64 = 10.0;

/// What one experiment produced.
pub struct Outcome {
    pub medians: Vec<Row>,
    pub dir: PathBuf,
    pub json: serde_json::Value,
}

/// Runs a plan's points and writes its outputs under `out/<name>/`.
pub fn execute(plan: &Plan, out: &Path) -> anyhow::Result<Outcome> {
    let spec = &plan.loaded.spec;
    let unavailable: Vec<Unavailable> = plan
        .systems
        .iter()
        .filter_map(|(s, r)| match r {
            Runner::Unavailable(why) => Some(Unavailable {
                system: s.label().to_string(),
                reason: why.clone(),
            }),
            _ => None,
        })
        .collect();
    if plan.runnable().next().is_none() {
        let why: Vec<String> = unavailable
            .iter()
            .map(|u| format!("  {}: {}", u.system, u.reason))
            .collect();
        anyhow::bail!(
            "{}: nothing in this experiment can run on this branch yet:\n{}",
            plan.loaded.path.display(),
            why.join("\n")
        );
    }
    for u in &unavailable {
        eprintln!("{}: skipping {}: {}", plan.name(), u.system, u.reason);
    }
    let dir = out.join(plan.name());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let unit = spec.load.unit.name();
    let runnable: Vec<&(spec::System, Runner)> = plan.runnable().collect();
    // Rounds outermost, systems innermost: Ginza, peer, Ginza, peer …
    let mut points = Vec::new();
    for round in 0..plan.rounds {
        for (i, &x) in plan.offered.iter().enumerate() {
            for s in 0..runnable.len() {
                points.push((round, i, x, s));
            }
        }
    }
    let loadavg_before = crate::harness::figures::loadavg().unwrap_or_default();
    let started = Instant::now();
    let mut ctx = runners::Context::default();
    let rows = crate::harness::sweep::sweep_weighted(
        &points,
        |&(round, _, x, s)| format!("{} @ {x} (round {round})", runnable[s].0.label()),
        |&(_, _, _, s)| plan.point_estimate(&runnable[s].1).as_millis() as u64,
        |_, &(round, i, x, s)| {
            let (sys, runner) = runnable[s];
            let row = Row {
                experiment: plan.name().to_string(),
                system: sys.label().to_string(),
                kind: match sys.kind {
                    SystemKind::Ginza => "ginza",
                    SystemKind::Linux => "linux",
                    SystemKind::Simulator => "simulator",
                },
                round,
                offered: x,
                unit,
                ..Row::default()
            };
            runners::run_point(
                &mut ctx,
                &plan.loaded,
                runner,
                &plan.settings,
                x,
                i,
                round,
                row,
            )
        },
    )
    .map_err(|e| e.context(format!("{}, offered load in {unit}", plan.name())))?;
    let rows: Vec<Row> = rows.into_iter().flatten().collect();
    let steps = !spec.load.steps.is_empty();
    let elapsed = started.elapsed();

    // Medians over rounds per system and load (per system and 10 ms of
    // time for load steps: a sampler on a busy machine reads late, so
    // samples of different rounds fall at different times).
    let mut medians = Vec::new();
    for (sys, _) in &runnable {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.system == sys.label()).collect();
        if steps {
            let bin = |r: &Row| r.t_ms.map_or(0, |t| (t / STEP_BIN_MS).floor() as u64);
            let mut bins: Vec<u64> = mine.iter().map(|r| bin(r)).collect();
            bins.sort_unstable();
            bins.dedup();
            for b in bins {
                let same: Vec<&Row> = mine.iter().filter(|r| bin(r) == b).copied().collect();
                if let Some(mut m) = Row::median_of(&same) {
                    m.t_ms = Some(b as f64 * STEP_BIN_MS);
                    medians.push(m);
                }
            }
        } else {
            for &x in &plan.offered {
                let same: Vec<&Row> = mine.iter().filter(|r| r.offered == x).copied().collect();
                if let Some(m) = Row::median_of(&same) {
                    medians.push(m);
                }
            }
        }
    }

    let csv = dir.join(format!("{}.csv", plan.name()));
    write_csv(&csv, &rows)?;
    let mut pngs = Vec::new();
    for metric in &spec.plot.y {
        let series: Vec<Series> = runnable
            .iter()
            .map(|(sys, _)| Series {
                name: if sys.kind == SystemKind::Simulator {
                    format!("{} (simulated)", sys.label())
                } else {
                    sys.label().to_string()
                },
                points: medians
                    .iter()
                    .filter(|r| r.system == sys.label())
                    .filter_map(|r| {
                        let x = if steps { r.t_ms? } else { r.offered };
                        r.metric(&metric.0).map(|v| (x, v))
                    })
                    .collect(),
            })
            .collect();
        if series.iter().all(|s| s.points.is_empty()) {
            continue;
        }
        let png = dir.join(format!("{}-{}.png", plan.name(), metric.0));
        // The figure's name ("Shenango Fig. 1"), without the description
        // that follows it: the title must fit the plot.
        let figure = spec
            .experiment
            .reproduces
            .split(" (")
            .next()
            .unwrap_or_default();
        let title = format!("{}: {} (cf. {figure})", plan.name(), metric.0);
        line_chart(
            &png,
            &Chart {
                title: &title,
                x_label: &if steps {
                    "time since the first load step (ms)".to_string()
                } else {
                    format!("offered load ({unit})")
                },
                y_label: &metric.0,
                series: &series,
                log_y: spec.plot.log_y,
                y_max: spec.plot.y_max,
                legend_lower_right: false,
            },
        )?;
        pngs.push(png.display().to_string());
    }
    let report = Report {
        experiment: plan.name(),
        reproduces: &spec.experiment.reproduces,
        description: &spec.experiment.description,
        file: plan.loaded.path.display().to_string(),
        tiny: plan.settings.tiny,
        debug_build: cfg!(debug_assertions),
        rounds: plan.rounds,
        offered: &plan.offered,
        unit,
        systems: runnable.iter().map(|(s, _)| s.label()).collect(),
        unavailable,
        elapsed_s: elapsed.as_secs_f64(),
        estimated_s: plan.estimate().as_secs_f64(),
        loadavg_before,
        loadavg_after: crate::harness::figures::loadavg().unwrap_or_default(),
        columns: &row::COLUMNS,
        rows: &rows,
        medians: &medians,
        csv: csv.display().to_string(),
        png: pngs,
    };
    let json = serde_json::to_value(&report)?;
    let json_path = dir.join(format!("{}.json", plan.name()));
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    Ok(Outcome { medians, dir, json })
}

fn write_csv(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let mut s = row::COLUMNS.join(",");
    s.push('\n');
    for r in rows {
        s.push_str(&r.cells().join(","));
        s.push('\n');
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

/// The medians as a table.
fn render(plan: &Plan, o: &Outcome) -> String {
    let spec = &plan.loaded.spec;
    let mut t = format!(
        "## {} — reproduces {}\n{:<24} {:>8} {:>10} {:>10} {:>10} {:>10} {:>12} {:>8}  note\n",
        plan.name(),
        spec.experiment.reproduces,
        "system",
        "t ms",
        "offered",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "batch ops/s",
        "cores"
    );
    let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    for r in &o.medians {
        t.push_str(&format!(
            "{:<24} {:>8} {:>10} {:>10} {:>10} {:>10} {:>12} {:>8}  {}\n",
            r.system,
            r.t_ms.map_or("-".to_string(), |t| format!("{t:.0}")),
            r.offered,
            f(r.p50_us),
            f(r.p99_us),
            f(r.p999_us),
            f(r.batch_ops_per_s),
            f(r.lc_cores),
            r.note
        ));
    }
    t.push_str(&format!("wrote {}\n", o.dir.display()));
    t
}

fn run_files(files: &[PathBuf], common: &CommonArgs, keep_going: bool) -> anyhow::Result<()> {
    // Every file is checked before anything runs: a typo in the last one
    // should not wait for the first one's sweep.
    let mut plans = Vec::new();
    for f in files {
        plans.push(Plan::new(spec::load(f)?, common.tiny)?);
    }
    let mut failed = Vec::new();
    let mut left = plans
        .iter()
        .map(Plan::estimate)
        .fold(Duration::ZERO, Duration::saturating_add);
    for (k, plan) in plans.iter().enumerate() {
        if plans.len() > 1 {
            // The set's ETA; each experiment's bar has its own.
            eprintln!(
                "[{}/{}] {} (about {:.0} s; the set about {:.1} min left)",
                k + 1,
                plans.len(),
                plan.name(),
                plan.estimate().as_secs_f64(),
                left.as_secs_f64() / 60.0
            );
        }
        left = left.saturating_sub(plan.estimate());
        match execute(plan, &common.out) {
            Ok(o) => {
                let table = render(plan, &o);
                if common.json {
                    eprint!("{table}");
                    println!("{}", serde_json::to_string(&o.json)?);
                } else {
                    print!("{table}");
                }
            }
            Err(e) if keep_going => {
                eprintln!("{}: {e:#}", plan.name());
                failed.push(plan.name().to_string());
            }
            Err(e) => return Err(e),
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "experiments that failed: {}",
        failed.join(", ")
    );
    Ok(())
}

/// `ginza bench run FILE…`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    run_files(&args.files, &args.common, false)
}

/// `ginza bench list`.
pub fn list(args: ListArgs) -> anyhow::Result<()> {
    let dir = args.dir.unwrap_or_else(default_dir);
    println!(
        "{:<28} {:<18} {:>9} {:<4} reproduces",
        "name", "status", "≈ time", "all"
    );
    for f in files_in(&dir)? {
        let plan = Plan::new(spec::load(&f)?, false)?;
        let spec = &plan.loaded.spec;
        println!(
            "{:<28} {:<18} {:>8.0}s {:<4} {}",
            plan.name(),
            plan.status(),
            plan.estimate().as_secs_f64(),
            if spec.experiment.in_all { "yes" } else { "no" },
            spec.experiment.reproduces
        );
    }
    Ok(())
}

/// What `ginza bench all` should take: under this on the machine it
/// reproduces the papers on (issue #18).
pub const ALL_BUDGET: Duration = Duration::from_secs(30 * 60);

/// `ginza bench all`: the experiments marked `in_all` that can run here.
pub fn all(args: AllArgs) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(default_dir);
    let mut chosen = Vec::new();
    let mut total = Duration::ZERO;
    for f in files_in(&dir)? {
        let plan = Plan::new(spec::load(&f)?, args.common.tiny)?;
        if !plan.loaded.spec.experiment.in_all {
            continue;
        }
        if plan.runnable().next().is_none() {
            eprintln!("skipping {}: nothing in it can run here", plan.name());
            continue;
        }
        let estimate = plan.estimate();
        total = total.saturating_add(estimate);
        if args.dry_run {
            println!(
                "{:<28} {:>7.0} s  {} point(s) × {} system(s) × {} round(s){}",
                plan.name(),
                estimate.as_secs_f64(),
                plan.offered.len(),
                plan.runnable().count(),
                plan.rounds,
                if plan.status() == "runnable" {
                    String::new()
                } else {
                    format!(" ({})", plan.status())
                }
            );
        }
        chosen.push(f);
    }
    let summary = format!(
        "ginza bench all: {} experiment(s), about {:.1} min (budget {:.0} min)",
        chosen.len(),
        total.as_secs_f64() / 60.0,
        ALL_BUDGET.as_secs_f64() / 60.0
    );
    if args.dry_run {
        println!("{summary}");
        return Ok(());
    }
    eprintln!("{summary}");
    let started = Instant::now();
    let r = run_files(&chosen, &args.common, true);
    eprintln!(
        "ginza bench all took {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans() -> Vec<Plan> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/experiments");
        files_in(&dir)
            .unwrap()
            .iter()
            .map(|f| Plan::new(spec::load(f).unwrap(), false).unwrap())
            .collect()
    }

    #[test]
    fn every_file_plans_and_names_its_figure() {
        let plans = plans();
        assert!(plans.len() >= 10);
        let mut names: Vec<&str> = plans.iter().map(|p| p.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), plans.len(), "experiment names are unique");
        for p in &plans {
            let r = &p.loaded.spec.experiment.reproduces;
            assert!(r.contains("Fig"), "{}: {r}", p.name());
            // Every runnable experiment fits easily in `bench all`'s 30 min.
            assert!(p.estimate() < Duration::from_secs(300), "{}", p.name());
        }
    }

    /// Found by `ginza fuzz experiment` (docs/fuzzing.md): rounds past
    /// 2³² and 10⁹-second points made the estimate overflow, and `bench
    /// list` and `bench all` panicked on such a file instead of printing
    /// an estimate.
    #[test]
    fn absurd_rounds_and_durations_saturate_the_estimate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/experiments");
        let text = std::fs::read_to_string(dir.join("calisto-fig6-7-sim.toml")).unwrap();
        let text = text
            .replace(
                "[experiment]\n",
                "[experiment]\nrounds = 9223372036854775807\n",
            )
            .replace("duration = \"1s\"", "duration = \"999999999s\"");
        let plan = Plan::new(spec::parse(Path::new("absurd.toml"), &text).unwrap(), false).unwrap();
        assert_eq!(plan.rounds, i64::MAX as u64);
        assert_eq!(plan.settings.duration, Duration::from_secs(999_999_999));
        assert_eq!(plan.estimate(), Duration::MAX);
    }

    #[test]
    fn runners_follow_the_files() {
        let plans = plans();
        let runner = |name: &str, label: &str| -> Runner {
            let p = plans.iter().find(|p| p.name() == name).unwrap();
            p.systems
                .iter()
                .find(|(s, _)| s.label() == label)
                .map(|(_, r)| r.clone())
                .unwrap()
        };
        assert!(matches!(
            runner("shenango-fig4-spin", "ginza-static"),
            Runner::SpinBatch {
                allocator: spec::Allocator::Static
            }
        ));
        assert!(matches!(
            runner("shenango-fig4-spin", "linux-spin"),
            Runner::LinuxSpin | Runner::Unavailable(_)
        ));
        assert!(matches!(
            runner("dlibos-fig5", "ginza-protected"),
            Runner::Oneway {
                path: runners::OnewayPath::Protected
            } | Runner::Unavailable(_)
        ));
        assert!(matches!(
            runner("dlibos-fig5", "ginza-rtc"),
            Runner::Oneway {
                path: runners::OnewayPath::Rtc
            } | Runner::Unavailable(_)
        ));
        assert!(matches!(
            runner("shenango-fig5-steps", "ginza-slow-1ms"),
            Runner::SpinBatchSteps { .. }
        ));
        assert!(matches!(
            runner("shenango-fig1", "1ms-bound"),
            Runner::SimSlowBound
        ));
        assert!(matches!(
            runner("shinjuku-scan-mix", "c-PRE-MQ"),
            Runner::ScanShinjuku {
                placement: spec::Placement::Head,
                ..
            }
        ));
        assert!(matches!(
            runner("calisto-steering", "indirection"),
            Runner::Steering { .. }
        ));
        assert!(matches!(
            runner("colocate-shinjuku-shenango", "c-PRE-SQ-static"),
            Runner::Colocate {
                sched: crate::colocate::Sched::CPreSq,
                alloc: crate::colocate::Alloc::Static,
                ..
            }
        ));
        assert!(matches!(
            runner("colocate-shinjuku-shenango", "c-FCFS-shenango-5us"),
            Runner::Colocate {
                sched: crate::colocate::Sched::CFcfs,
                alloc: crate::colocate::Alloc::Shenango,
                ..
            }
        ));
        // Root, a veth pair and memcached decide whether it runs here; when
        // not, the reason says what is missing.
        for label in ["ginza-shenango-5us", "linux-memcached"] {
            match runner("shenango-fig3-memcached", label) {
                Runner::Memcached { .. } => {}
                Runner::Unavailable(why) => assert!(
                    why.contains("veth") || why.contains("memcached") || why.contains("CPU"),
                    "{why}"
                ),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            runner("shenango-fig3-memcached", "ginza-static"),
            Runner::Memcached {
                allocator: spec::Allocator::Static,
                ..
            } | Runner::Unavailable(_)
        ));
        match runner("dlibos-fig7", "ginza-protected") {
            Runner::Memcached {
                system: crate::memcached::System::GinzaProtected,
                ..
            } => {}
            Runner::Unavailable(why) => {
                assert!(why.contains("veth") || why.contains("CPU"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bench_all_fits_its_budget() {
        let total: Duration = plans()
            .iter()
            .filter(|p| p.loaded.spec.experiment.in_all)
            .map(Plan::estimate)
            .sum();
        assert!(total < ALL_BUDGET, "bench all: {total:?}");
    }

    #[test]
    fn tiny_keeps_two_points_and_one_round() {
        for p in plans() {
            let name = p.name().to_string();
            let t = Plan::new(p.loaded, true).unwrap();
            assert!(t.offered.len() <= 2 && t.rounds == 1, "{name}");
            assert!(t.settings.duration <= Duration::from_millis(20), "{name}");
        }
    }
}
