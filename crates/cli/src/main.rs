//! The `ginza` command.
mod bench;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ginza",
    version,
    about = "Ginza: microsecond-scale scheduling without wasted cores"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a benchmark and print its figures next to its peers'.
    Bench(bench::BenchArgs),
    /// Run the discrete-event simulator.
    Sim(ginza_sim::cli::SimArgs),
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Sim(args) => ginza_sim::cli::run(args),
    }
}
