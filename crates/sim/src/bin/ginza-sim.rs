//! Stand-alone `ginza-sim` (the same as `ginza sim`), handy while the rest
//! of the workspace is being built.
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Parser)]
#[command(name = "ginza-sim")]
struct Cli {
    #[command(flatten)]
    args: ginza_sim::cli::SimArgs,
}

fn main() -> anyhow::Result<()> {
    ginza_sim::cli::run(Cli::parse().args)
}
