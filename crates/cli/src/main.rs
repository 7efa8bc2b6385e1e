//! The `ginza` command.
mod doctor;
mod run;
mod top;

#[cfg(feature = "bench")]
use ginza_bench::{self as bench, demo};

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
    /// Start iokerneld, a latency-critical and a batch application here and
    /// sweep offered load under the 5 µs, slow (1 ms) and static allocators.
    #[cfg(feature = "bench")]
    Demo(demo::DemoArgs),
    /// Run a benchmark and print its figures next to its peers'.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Run the discrete-event simulator.
    #[cfg(feature = "bench")]
    Sim(ginza_sim::cli::SimArgs),
    /// Fuzz a parser or state machine with structure-aware random inputs
    /// (frames, tcp, netstack, kv, http, experiment; docs/fuzzing.md).
    #[cfg(feature = "bench")]
    Fuzz(bench::fuzz::FuzzArgs),
    /// Run iokerneld, the core allocator daemon (same flags as `iokerneld`).
    Iokernel(ginza_iokernel::Cli),
    /// Show iokerneld's applications, cores and rates, live.
    Top(top::TopArgs),
    /// Check this machine for iokerneld: CPUs, AF_XDP on an interface,
    /// memlock, capabilities, a running iokerneld, the wake cost. Exits
    /// non-zero when iokerneld could not run here.
    Doctor(doctor::DoctorArgs),
    /// Open-loop load generator: Poisson, constant or stepped arrivals
    /// planned in advance, latency from each request's scheduled send
    /// (echo, spin, memcached, http over UDP or TCP; Linux sockets or the
    /// Ginza runtime).
    Loadgen(ginza_loadgen::args::LoadgenArgs),
    /// Run the protected-mode netstack (DLibOS) under iokerneld (same
    /// flags as `netstackd`; docs/protected.md).
    Netstack(ginza_netstack::cli::NetstackArgs),
    /// Run an unmodified, dynamically linked program on Ginza: its threads
    /// become uthreads, standalone or under iokerneld (docs/preload.md).
    Run(run::RunArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The daemon reports registrations and removals at info, as `iokerneld` does.
    let level = match cli.command {
        Command::Iokernel(_) | Command::Netstack(_) => "info",
        // The demo reports iokerneld's overdue preemptions in its table
        // instead of one warning line per event under the progress bar.
        #[cfg(feature = "bench")]
        Command::Demo(_) => "warn,ginza_iokernel=error",
        #[cfg(feature = "bench")]
        Command::Bench(ref b) if b.runs_experiments() => "warn,ginza_iokernel=error",
        // The netstack warns of every application it cuts off: most cases.
        #[cfg(feature = "bench")]
        Command::Fuzz(_) => "error",
        _ => "warn",
    };
    // Each log call with preemption deferred (`ginza_runtime::PreemptSafeLog`).
    ginza_runtime::init_logging(level).expect("the process's first logger");
    match cli.command {
        #[cfg(feature = "bench")]
        Command::Demo(args) => demo::run(args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(args),
        #[cfg(feature = "bench")]
        Command::Sim(args) => ginza_sim::cli::run(args),
        #[cfg(feature = "bench")]
        Command::Fuzz(args) => bench::fuzz::run(args),
        // Exit with iokerneld's own status (2: bad configuration), which an
        // `anyhow::Result` could not carry.
        Command::Iokernel(args) => std::process::exit(ginza_iokernel::cli::run(&args).into()),
        Command::Top(args) => top::run(args),
        Command::Doctor(args) => match doctor::run(args)? {
            0 => Ok(()),
            status => std::process::exit(status.into()),
        },
        Command::Loadgen(args) => ginza_loadgen::args::run(args),
        Command::Netstack(args) => ginza_netstack::cli::run(args),
        Command::Run(args) => run::run(args),
    }
}
