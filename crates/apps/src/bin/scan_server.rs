//! `scan-server`: registers with iokerneld with its own MAC and IP and
//! answers GET and range SCAN requests over an in-memory ordered map (see
//! `ginza_apps::scan_server`, which documents the wire format) over UDP and
//! TCP; with `--shinjuku`, UDP requests run in Shinjuku mode (long SCANs
//! preempted); with `--dispatched`, in Shinjuku mode dispatched by
//! iokerneld (UDP only). Stops on SIGINT/SIGTERM or after `--run-for`.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use ginza_apps::app_args::AppArgs;
use ginza_apps::echo_server::Protocols;
use ginza_apps::scan_server::{
    dispatch_spec, mq_policy, run_dispatched, run_shinjuku, serve, ScanStats, Store,
};
use ginza_proto::parse_duration;
use ginza_runtime::shinjuku::dispatched::DispatchedConfig;
use ginza_runtime::shinjuku::{Placement, SchedPolicy, ShinjukuConfig};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Policy {
    /// c-PRE-MQ: GETs and SCANs in their own queues, each with its SLO.
    Mq,
    /// c-PRE-SQ: one queue, preempted requests at its tail.
    Sq,
    /// c-FCFS: one queue, run to completion.
    Fcfs,
}

#[derive(Parser, Debug)]
#[command(about = "GET and range SCAN over an in-memory ordered map, over UDP and TCP")]
struct Args {
    /// Port to serve (UDP and TCP).
    #[arg(long, default_value_t = 9090)]
    port: u16,
    /// Keys in the map.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Seed of the keys and values (clients need it to ask for keys that exist).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Serve UDP only.
    #[arg(long, conflicts_with = "tcp_only")]
    udp_only: bool,
    /// Serve TCP only (run to completion; not with --shinjuku).
    #[arg(long, conflicts_with = "shinjuku")]
    tcp_only: bool,
    /// Run UDP requests in Shinjuku mode (TCP stays run to completion).
    #[arg(long)]
    shinjuku: bool,
    /// Run UDP requests in Shinjuku mode dispatched by iokerneld: the
    /// dispatch step on iokerneld's core, c-PRE-MQ classes from the op
    /// byte, this application's kthreads (`--kthreads`) the workers,
    /// granted and revoked by the core allocator (docs/colocate.md).
    /// UDP only: give `--udp-only`.
    #[arg(long, conflicts_with = "shinjuku", requires = "udp_only")]
    dispatched: bool,
    /// Dispatched mode: a request asked to yield that has not this long
    /// after is interrupted by a signal (`0`: never).
    #[arg(long, value_parser = parse_duration, default_value = "50us")]
    backstop: Duration,
    /// Shinjuku mode: worker kthreads.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Shinjuku mode: the dispatcher's core [default: unpinned].
    #[arg(long)]
    dispatcher_core: Option<usize>,
    /// Shinjuku mode: the queueing policy.
    #[arg(long, value_enum, default_value_t = Policy::Mq)]
    policy: Policy,
    /// Shinjuku and dispatched modes: the quantum (e.g. 10us).
    #[arg(long, value_parser = parse_duration, default_value = "10us")]
    quantum: Duration,
    /// Shinjuku mode, c-PRE-MQ: the GET class's SLO.
    #[arg(long, value_parser = parse_duration, default_value = "50us")]
    get_slo: Duration,
    /// Shinjuku mode, c-PRE-MQ: the SCAN class's SLO.
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    scan_slo: Duration,
    #[command(flatten)]
    app: AppArgs,
}

fn main() -> anyhow::Result<()> {
    ginza_runtime::init_logging("info").expect("the process's first logger");
    // Its own default address, so that it and the other applications
    // started with defaults do not share one.
    let command = AppArgs::with_defaults(Args::command(), "02:47:5a:00:05:01", "10.47.5.1");
    let args = Args::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let protocols = Protocols {
        udp: !args.tcp_only && args.app.serve_udp(args.udp_only)?,
        tcp: !args.udp_only,
    };
    let stop = args.app.stop_flag()?;
    let name = args.app.name_or("scan-server");
    let config = args.app.runtime_config(&name);
    let t0 = Instant::now();
    let store = Arc::new(Store::generate(args.seed, args.keys));
    log::info!(
        "{name}: {} keys (seed {}) in {:.2} s; serving {}:{} ({}{}{}; {} kthreads)",
        store.len(),
        args.seed,
        t0.elapsed().as_secs_f64(),
        args.app.ip,
        args.port,
        if protocols.udp { "UDP" } else { "" },
        if protocols.udp && protocols.tcp {
            " and "
        } else {
            ""
        },
        if protocols.tcp { "TCP" } else { "" },
        args.app.kthreads,
    );
    let stats = Arc::new(ScanStats::default());
    let started = Instant::now();
    let port = args.port;
    if args.dispatched {
        let policy = match args.policy {
            Policy::Mq => "c-pre-mq",
            Policy::Sq => "c-pre-sq",
            Policy::Fcfs => "c-fcfs",
        };
        let spec = dispatch_spec(
            policy,
            args.quantum,
            args.get_slo,
            args.scan_slo,
            (!args.backstop.is_zero()).then_some(args.backstop),
        );
        let io = config
            .iokernel
            .context("dispatched mode runs under iokerneld")?;
        let cfg = DispatchedConfig::new(io, spec, port).with_workers(args.app.kthreads);
        log::info!(
            "{name}: UDP dispatched by iokerneld, {policy}, {} worker(s)",
            cfg.workers
        );
        let report = run_dispatched(cfg, store, &stop, stats.clone())
            .context("serving in dispatched mode")?;
        println!(
            "dispatched mode: {} requests served, {} preemptions ({} while a core was revoked), {} refused over the in-flight bound",
            report.served, report.preempted, report.revoked_mid_request, report.rejected
        );
    } else if args.shinjuku {
        let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        let policy = match args.policy {
            Policy::Mq => mq_policy(args.quantum, args.get_slo, args.scan_slo),
            Policy::Sq => SchedPolicy::CPreSq {
                quantum: ns(args.quantum),
                placement: Placement::Tail,
            },
            Policy::Fcfs => SchedPolicy::CFcfs,
        };
        log::info!(
            "{name}: UDP in Shinjuku mode, {} worker(s), {policy:?}",
            args.workers
        );
        let shinjuku = ShinjukuConfig {
            workers: args.workers,
            dispatcher_core: args.dispatcher_core,
            policy,
            ..ShinjukuConfig::default()
        };
        let summary = run_shinjuku(
            config,
            shinjuku,
            port,
            protocols.tcp,
            store,
            stop,
            stats.clone(),
        )?;
        println!(
            "Shinjuku mode: {} requests served, {} preempted ({} preemptions at preemption points, {} by signal)",
            summary.served,
            summary.preempted_requests,
            summary.coop_preemptions,
            summary.signal_preemptions
        );
    } else {
        let s2 = stats.clone();
        ginza_runtime::run(config, move || serve(port, protocols, store, stop, s2))
            .context("starting the runtime")?
            .with_context(|| format!("serving port {port}"))?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{secs:.1} s: {} GETs, {} SCANs ({} keys), {} bad requests, {} send errors; {} TCP connections ({} ended in an error)",
        stats.gets.load(Relaxed),
        stats.scans.load(Relaxed),
        stats.keys_scanned.load(Relaxed),
        stats.bad_requests.load(Relaxed),
        stats.send_errors.load(Relaxed),
        stats.tcp_accepted.load(Relaxed),
        stats.tcp_errors.load(Relaxed),
    );
    Ok(())
}
