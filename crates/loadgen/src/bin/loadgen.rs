//! `loadgen`: the same as `ginza loadgen` (see `--help`).
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "loadgen",
    version,
    about = "Open-loop load generator: arrivals planned in advance, latency from each request's scheduled send"
)]
struct Cli {
    #[command(flatten)]
    args: ginza_loadgen::args::LoadgenArgs,
}

fn main() -> anyhow::Result<()> {
    // Each log call with preemption deferred: see `ginza_runtime::PreemptSafeLog`.
    let logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).build();
    let max_level = logger.filter();
    ginza_runtime::install_logger(logger, max_level).expect("the process's first logger");
    ginza_loadgen::args::run(Cli::parse().args)
}
