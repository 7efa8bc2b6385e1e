//! `http-server`: registers with iokerneld with its own MAC and IP and
//! serves HTTP/1.1 (`GET /`, `GET /bytes/N`; see `ginza_apps::http_server`)
//! on one TCP port. Stops on SIGINT/SIGTERM or after `--run-for`.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser};
use ginza_apps::app_args::AppArgs;
use ginza_apps::http_async::serve_async;
use ginza_apps::http_server::{serve, HttpStats};

#[derive(Parser, Debug)]
#[command(about = "HTTP/1.1 with keep-alive: GET / and GET /bytes/N")]
struct Args {
    /// TCP port to serve (Ginza's own stack: no privilege needed for 80).
    #[arg(long, default_value_t = 80)]
    port: u16,
    /// With `--protected`: one event loop over the netstack's raw events
    /// and commands instead of a uthread per connection.
    #[arg(long, requires = "protected")]
    protected_async: bool,
    #[command(flatten)]
    app: AppArgs,
}

fn main() -> anyhow::Result<()> {
    ginza_runtime::init_logging("info").expect("the process's first logger");
    // Its own default address, so that it and the other applications
    // started with defaults do not share one.
    let command = AppArgs::with_defaults(Args::command(), "02:47:5a:00:08:01", "10.47.8.1");
    let args = Args::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let stop = args.app.stop_flag()?;
    let name = args.app.name_or("http-server");
    let config = args.app.runtime_config(&name);
    let stats = Arc::new(HttpStats::default());
    let started = Instant::now();
    let (port, s2) = (args.port, stats.clone());
    log::info!(
        "{name}: serving HTTP on {}:{port} ({} kthreads)",
        args.app.ip,
        args.app.kthreads
    );
    let protected_async = args.protected_async;
    ginza_runtime::run(config, move || {
        if protected_async {
            serve_async(port, stop, s2)
        } else {
            serve(port, stop, s2)
        }
    })
    .context("starting the runtime")?
    .with_context(|| format!("serving HTTP on port {port}"))?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{secs:.1} s: {} connections; responses: {} 2xx, {} 4xx, {} 5xx; {} body bytes; {} connections ended in a socket error",
        stats.accepted.load(Relaxed),
        stats.ok.load(Relaxed),
        stats.client_errors.load(Relaxed),
        stats.server_errors.load(Relaxed),
        stats.body_bytes.load(Relaxed),
        stats.socket_errors.load(Relaxed),
    );
    Ok(())
}
