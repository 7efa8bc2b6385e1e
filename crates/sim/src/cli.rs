//! `ginza sim` subcommands.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::figs::{self, FigOpts};
use crate::validate;

/// Run the discrete-event simulator: theory checks, the papers' figures, or
/// a scenario file.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: Option<SimCommand>,
    /// A scenario TOML file (see `crates/sim/scenarios/`).
    pub scenario: Option<PathBuf>,
    /// Output folder for a scenario's CSV/PNG.
    #[arg(long, default_value = "results/sim")]
    pub out: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Compare the simulator with queueing theory (Erlang C, M/G/1-PS).
    Validate {
        /// Print `{"checks": [...]}` as JSON.
        #[arg(long)]
        json: bool,
        /// Multiply sample counts (precision grows like its square root).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Shenango Fig. 1: CPU efficiency vs load, 1 ms bound vs 5 µs allocator.
    ShenangoFig1(FigArgs),
    /// Shinjuku Fig. 1: p99 vs load for d-FCFS / c-FCFS / PS / c-PRE-SQ.
    ShinjukuFig1(FigArgs),
    /// Shinjuku Fig. 2: Bimodal(50-1, 50-100), per-class p99 and slowdown.
    ShinjukuFig2(FigArgs),
    /// Shinjuku Fig. 4: connections RSS needs for balance vs cores.
    RssConnections(FigArgs),
    /// All four reproductions.
    All(FigArgs),
    /// Calisto Figs. 6–7: p99 vs packets/s on 10 cores, ~700,000 flows,
    /// rss-mod / flow-affinity / indirection, before and after warm-up.
    Calisto(CalistoArgs),
}

#[derive(Args, Debug, Clone)]
pub struct CalistoArgs {
    /// Output folder (`calisto/` is created in it).
    #[arg(long, default_value = "results/sim")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Flows the requests come from.
    #[arg(long, default_value_t = 700_000)]
    pub flows: u64,
    /// iokerneld's time per flow-table insertion, µs.
    #[arg(long, default_value_t = 0.5)]
    pub insert_us: f64,
    /// Extra service time of a request run away from its flow's previous
    /// kthread, µs.
    #[arg(long, default_value_t = 1.0)]
    pub migration_us: f64,
    /// Mean (exponential) service time, µs.
    #[arg(long, default_value_t = 10.0)]
    pub service_us: f64,
    /// Simulated time per point, ms.
    #[arg(long, default_value_t = 1000.0)]
    pub duration_ms: f64,
    /// Offered loads, packets/s, comma-separated [default: the paper's
    /// 2000,5000,8000,10000,12000,14000].
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
}

#[derive(Args, Debug, Clone)]
pub struct FigArgs {
    /// Output folder (a subfolder per figure is created).
    #[arg(long, default_value = "results/sim")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fewer samples and points: a quick look, same shapes.
    #[arg(long)]
    pub quick: bool,
}

impl From<&FigArgs> for FigOpts {
    fn from(a: &FigArgs) -> Self {
        FigOpts {
            out: a.out.clone(),
            seed: a.seed,
            quick: a.quick,
        }
    }
}

fn report(name: &str, o: &FigOpts, summary: anyhow::Result<String>) -> anyhow::Result<()> {
    let s = summary?;
    println!(
        "## {name} (written under {})\n\n{s}",
        o.out.join(name).display()
    );
    Ok(())
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    match (&args.command, &args.scenario) {
        (Some(SimCommand::Validate { json, scale, seed }), _) => {
            let checks = validate::run_all(*scale, *seed);
            if *json {
                #[derive(serde::Serialize)]
                struct Out<'a> {
                    checks: &'a [validate::Check],
                }
                println!("{}", serde_json::to_string_pretty(&Out { checks: &checks })?);
            } else {
                println!("{:<48} {:>12} {:>12} {:>8}", "case", "simulated", "theory", "rel_err");
                for c in &checks {
                    println!("{:<48} {:>12.5} {:>12.5} {:>7.2}%", c.case, c.simulated, c.theory, c.rel_err * 100.0);
                }
            }
            Ok(())
        }
        (Some(SimCommand::ShenangoFig1(a)), _) => report("shenango-fig1", &a.into(), figs::shenango_fig1(&a.into())),
        (Some(SimCommand::ShinjukuFig1(a)), _) => report("shinjuku-fig1", &a.into(), figs::shinjuku_fig1(&a.into())),
        (Some(SimCommand::ShinjukuFig2(a)), _) => report("shinjuku-fig2", &a.into(), figs::shinjuku_fig2(&a.into())),
        (Some(SimCommand::RssConnections(a)), _) => report("rss-connections", &a.into(), figs::rss_connections(&a.into())),
        (Some(SimCommand::All(a)), _) => {
            let o: FigOpts = a.into();
            report("shinjuku-fig1", &o, figs::shinjuku_fig1(&o))?;
            report("shinjuku-fig2", &o, figs::shinjuku_fig2(&o))?;
            report("shenango-fig1", &o, figs::shenango_fig1(&o))?;
            report("rss-connections", &o, figs::rss_connections(&o))
        }
        (Some(SimCommand::Calisto(a)), _) => {
            anyhow::ensure!(
                a.insert_us >= 0.0 && a.migration_us >= 0.0 && a.service_us > 0.0 && a.duration_ms > 0.0
                    && a.rates.iter().all(|r| r.is_finite() && *r > 0.0),
                "--insert-us and --migration-us must be >= 0, --service-us, --duration-ms and --rates > 0"
            );
            let paper = crate::calisto::CalistoOpts::paper(a.out.join("calisto"), a.seed);
            let o = crate::calisto::CalistoOpts {
                flows: a.flows,
                table_insert_us: a.insert_us,
                migration_us: a.migration_us,
                service_us: a.service_us,
                duration_us: a.duration_ms * 1000.0,
                rates: if a.rates.is_empty() { paper.rates.clone() } else { a.rates.clone() },
                ..paper
            };
            let (_, summary) = crate::calisto::run(&o)?;
            println!("## calisto (written under {})\n\n{summary}", o.out.display());
            Ok(())
        }
        (None, Some(path)) => {
            let sc = crate::scenario::load(path)?;
            let s = crate::scenario::run(&sc, &args.out)?;
            println!("## {} (written under {})\n\n{s}", sc.name, args.out.join(&sc.name).display());
            Ok(())
        }
        (None, None) => anyhow::bail!(
            "give a subcommand (validate, shenango-fig1, shinjuku-fig1, shinjuku-fig2, rss-connections, all, calisto) or a scenario.toml"
        ),
    }
}
