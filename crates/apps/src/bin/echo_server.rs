//! `echo-server`: registers with iokerneld with its own MAC and IP and
//! echoes (RFC 862) on one port over UDP and TCP (see
//! `ginza_apps::echo_server`). Stops on SIGINT/SIGTERM or after `--run-for`.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser};
use ginza_apps::app_args::AppArgs;
use ginza_apps::echo_server::{serve, EchoStats, Protocols};

#[derive(Parser, Debug)]
#[command(about = "Echo (RFC 862) on one port over UDP and TCP")]
struct Args {
    /// Port to serve (UDP and TCP).
    #[arg(long, default_value_t = 7)]
    port: u16,
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
    // Its own default address, so that it and spin-server started with
    // defaults do not share one.
    let command = AppArgs::with_defaults(Args::command(), "02:47:5a:00:07:01", "10.47.7.1");
    let args = Args::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let protocols = Protocols {
        udp: !args.tcp_only && args.app.serve_udp(args.udp_only)?,
        tcp: !args.udp_only,
    };
    let stop = args.app.stop_flag()?;
    let name = args.app.name_or("echo-server");
    let config = args.app.runtime_config(&name);
    let stats = Arc::new(EchoStats::default());
    let started = Instant::now();
    let (port, s2) = (args.port, stats.clone());
    log::info!(
        "{name}: echoing on {}:{port} ({}{}; {} kthreads)",
        args.app.ip,
        if protocols.udp { "UDP" } else { "" },
        match (protocols.udp, protocols.tcp) {
            (true, true) => " and TCP",
            (false, true) => "TCP",
            _ => "",
        },
        args.app.kthreads
    );
    let (served, net) = ginza_runtime::run(config, move || {
        let served = serve(port, protocols, stop, s2);
        (served, ginza_runtime::net::stats())
    })
    .context("starting the runtime")?;
    served.with_context(|| format!("echoing on port {port}"))?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{secs:.1} s: {} datagrams echoed ({} send errors); {} TCP connections, {} bytes echoed, {} ended in an error",
        stats.udp_echoed.load(Relaxed),
        stats.udp_send_errors.load(Relaxed),
        stats.tcp_accepted.load(Relaxed),
        stats.tcp_bytes.load(Relaxed),
        stats.tcp_errors.load(Relaxed),
    );
    if let Some(tcp) = net.map(|n| n.tcp) {
        println!(
            "tcp: {} segments in, {} out, {} retransmitted, {} resets sent; {} half-open evicted, {} SYN cookies sent, {} backlog overflows; {} connections open",
            tcp.segments_in,
            tcp.segments_out,
            tcp.retransmissions,
            tcp.resets_sent,
            tcp.syns_evicted,
            tcp.syn_cookies_sent,
            tcp.listen_overflows,
            tcp.connections_open,
        );
    }
    Ok(())
}
