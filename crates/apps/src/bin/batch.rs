//! `batch`: Monte Carlo pricing on every kthread; prints paths per second
//! each second and the price at the end. Standalone, or under iokerneld as
//! a batch application with `--iokernel`.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use ginza_apps::batch::price_until_stopped;
use ginza_proto::parse_duration;
use ginza_runtime::{Class, Config, IokernelConfig};

#[derive(Parser, Debug)]
#[command(about = "Monte Carlo option pricing: paths (operations) per second")]
struct Args {
    /// Kthreads, one pricing uthread each.
    #[arg(long, default_value_t = 2)]
    kthreads: usize,
    /// Register with iokerneld (batch class) instead of running on fixed
    /// cores.
    #[arg(long)]
    iokernel: bool,
    /// iokerneld's control socket [default: its default path].
    #[arg(long)]
    socket: Option<std::path::PathBuf>,
    #[arg(long, default_value = "batch")]
    name: String,
    /// How long to run.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    run_for: Duration,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> anyhow::Result<()> {
    ginza_runtime::init_logging("info").expect("the process's first logger");
    let args = Args::parse();
    let mut config = Config::with_kthreads(args.kthreads);
    if args.iokernel {
        let mut io = IokernelConfig::new(args.name.clone(), Class::Batch);
        io.socket = args.socket.clone();
        config.iokernel = Some(io);
    }
    let paths = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (p, s, n, seed) = (paths.clone(), stop.clone(), args.kthreads, args.seed);
    let runner = std::thread::spawn(move || {
        ginza_runtime::run(config, move || price_until_stopped(n, p, s, seed))
    });
    let start = Instant::now();
    let mut last = (start, 0u64);
    while start.elapsed() < args.run_for && !runner.is_finished() {
        std::thread::sleep(
            Duration::from_secs(1).min(args.run_for.saturating_sub(start.elapsed())),
        );
        let (now, done) = (Instant::now(), paths.load(Relaxed));
        println!(
            "{:.0} paths/s",
            (done - last.1) as f64 / (now - last.0).as_secs_f64()
        );
        last = (now, done);
    }
    stop.store(true, Relaxed);
    let price = runner
        .join()
        .map_err(|_| anyhow::anyhow!("the runtime thread panicked"))?
        .context("running the runtime")?;
    let total = paths.load(Relaxed);
    println!(
        "{total} paths in {:.1} s ({:.0} paths/s); call price {price:.4} (Black-Scholes 8.0214)",
        start.elapsed().as_secs_f64(),
        total as f64 / start.elapsed().as_secs_f64()
    );
    Ok(())
}
