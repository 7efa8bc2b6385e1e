//! `kv-server`: registers with iokerneld with its own MAC and IP and
//! serves memcached's text and binary protocols on one port over TCP, and
//! over UDP with memcached's frame header (see `ginza_apps::kv`). Stops on
//! SIGINT/SIGTERM or after `--run-for`.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use anyhow::{ensure, Context as _};
use clap::{CommandFactory, FromArgMatches, Parser};
use ginza_apps::app_args::AppArgs;
use ginza_apps::echo_server::Protocols;
use ginza_apps::kv::server::serve;
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::Kv;

#[derive(Parser, Debug)]
#[command(
    about = "A memcached-compatible key-value server (text and binary protocols, TCP and UDP)"
)]
struct Args {
    /// Port to serve (TCP and UDP).
    #[arg(long, default_value_t = 11211)]
    port: u16,
    /// Item memory in MiB (memcached's -m); least recently used items are
    /// evicted beyond it.
    #[arg(long, default_value_t = 64)]
    memory_limit: usize,
    /// Largest item in bytes, header included (memcached's -I).
    #[arg(long, default_value_t = 1 << 20)]
    item_size_max: usize,
    /// Serve UDP only.
    #[arg(long, conflicts_with = "tcp_only")]
    udp_only: bool,
    /// Serve TCP only.
    #[arg(long)]
    tcp_only: bool,
    #[command(flatten)]
    app: AppArgs,
}

fn main() -> anyhow::Result<()> {
    ginza_runtime::init_logging("info").expect("the process's first logger");
    // Its own default address, so that it and the other applications
    // started with defaults do not share one.
    let command = AppArgs::with_defaults(Args::command(), "02:47:5a:00:0b:01", "10.47.11.1");
    let args = Args::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    ensure!(
        (1024..=1 << 30).contains(&args.item_size_max),
        "--item-size-max must be between 1 KiB and 1 GiB (memcached's bounds)"
    );
    let memory_limit = args
        .memory_limit
        .checked_mul(1 << 20)
        .filter(|&m| m >= args.item_size_max)
        .context("--memory-limit (MiB) must hold at least one largest item")?;
    let protocols = Protocols {
        udp: !args.tcp_only && args.app.serve_udp(args.udp_only)?,
        tcp: !args.udp_only,
    };
    let stop = args.app.stop_flag()?;
    let name = args.app.name_or("kv-server");
    let config = args.app.runtime_config(&name);
    let store = Store::new(
        StoreConfig::new(memory_limit, args.item_size_max),
        Arc::new(SystemClock),
    );
    let mut kv = Kv::new(store);
    kv.threads = args.app.kthreads;
    let stats = kv.stats.clone();
    let port = args.port;
    log::info!(
        "{name}: memcached protocols on {}:{port} ({}; {} MiB, items up to {} bytes; {} kthreads)",
        args.app.ip,
        match (protocols.udp, protocols.tcp) {
            (true, true) => "TCP and UDP",
            (false, true) => "TCP",
            _ => "UDP",
        },
        args.memory_limit,
        args.item_size_max,
        args.app.kthreads
    );
    ginza_runtime::run(config, move || serve(port, protocols, kv, stop))
        .context("starting the runtime")?
        .with_context(|| format!("serving on port {port}"))?;
    println!(
        "{} TCP connections, {} gets ({} hits), {} sets, {} UDP requests",
        stats.total_connections.load(Relaxed),
        stats.cmd_get.load(Relaxed),
        stats.get_hits.load(Relaxed),
        stats.cmd_set.load(Relaxed),
        stats.udp_requests.load(Relaxed),
    );
    Ok(())
}
