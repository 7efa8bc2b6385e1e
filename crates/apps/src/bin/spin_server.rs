//! `spin-server`: registers with iokerneld with its own MAC and IP and
//! answers UDP requests that carry their service time (see
//! `ginza_apps::spin_server`). Stops on SIGINT/SIGTERM or after `--run-for`.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use ginza_apps::app_args::AppArgs;
use ginza_apps::spin_server::{serve, SpinStats};

#[derive(Parser, Debug)]
#[command(about = "UDP server whose requests carry their service time (spins, then echoes)")]
struct Args {
    /// UDP port to serve.
    #[arg(long, default_value_t = 7)]
    port: u16,
    #[command(flatten)]
    app: AppArgs,
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    if args.app.serve_udp(true).is_err() {
        anyhow::bail!("--protected: spin-server speaks UDP only, the netstack TCP only");
    }
    let stop = args.app.stop_flag()?;
    let name = args.app.name_or("spin-server");
    let config = args.app.runtime_config(&name);
    let stats = Arc::new(SpinStats::default());
    let started = Instant::now();
    let (port, s2) = (args.port, stats.clone());
    log::info!(
        "{name}: serving UDP {}:{port} ({} kthreads)",
        args.app.ip,
        args.app.kthreads
    );
    ginza_runtime::run(config, move || serve(port, stop, s2))
        .context("starting the runtime")?
        .with_context(|| format!("serving UDP port {port}"))?;
    let secs = started.elapsed().as_secs_f64();
    let served = stats.served.load(Relaxed);
    println!(
        "served {served} requests in {secs:.1} s ({:.0}/s), {:.1} ms of service; malformed {}, too long {}, send errors {}",
        served as f64 / secs,
        stats.busy_ns.load(Relaxed) as f64 / 1e6,
        stats.malformed.load(Relaxed),
        stats.too_long.load(Relaxed),
        stats.send_errors.load(Relaxed),
    );
    Ok(())
}
