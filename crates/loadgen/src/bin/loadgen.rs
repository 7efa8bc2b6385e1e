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
    // Each log call with preemption deferred (`ginza_runtime::PreemptSafeLog`).
    ginza_runtime::init_logging("warn").expect("the process's first logger");
    ginza_loadgen::args::run(Cli::parse().args)
}
