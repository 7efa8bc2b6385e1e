//! `spin-server`: registers with iokerneld with its own MAC and IP and
//! answers UDP requests that carry their service time (see
//! `ginza_apps::spin_server`). Stops on SIGINT/SIGTERM or after `--run-for`.
//! `--mode shinjuku`: requests are scheduled preemptively, the dispatch
//! step on iokerneld's core (docs/colocate.md). `--linux`: the Linux peer,
//! no Ginza runtime: `--kthreads` OS threads on a kernel UDP socket bound
//! to `--listen` (pin them with `taskset`; docs/experiments.md).
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use ginza_apps::app_args::AppArgs;
use ginza_apps::spin_server::{answer_preemptible, serve, serve_linux, SpinStats};
use ginza_proto::messages::DispatchSpec;
use ginza_proto::parse_duration;
use ginza_runtime::shinjuku::dispatched::{self, DispatchedConfig};

/// How requests are scheduled.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Run to completion, one uthread per request (work stealing).
    Shenango,
    /// Shinjuku: preemptive, dispatched by iokerneld (docs/colocate.md).
    Shinjuku,
}

#[derive(Parser, Debug)]
#[command(about = "UDP server whose requests carry their service time (spins, then echoes)")]
struct Args {
    /// UDP port to serve.
    #[arg(long, default_value_t = 7)]
    port: u16,
    /// Request scheduling.
    #[arg(long, value_enum, default_value_t = Mode::Shenango)]
    mode: Mode,
    /// With `--mode shinjuku`: c-fcfs, c-pre-sq or c-pre-mq.
    #[arg(long, default_value = "c-pre-sq")]
    policy: String,
    /// With `--mode shinjuku`: the preemption quantum.
    #[arg(long, value_parser = parse_duration, default_value = "5us")]
    quantum: std::time::Duration,
    /// With `--mode shinjuku`: a request asked to yield that has not this
    /// long after is interrupted by a signal (`0`: never).
    #[arg(long, value_parser = parse_duration, default_value = "50us")]
    backstop: std::time::Duration,
    /// With `--mode shinjuku`: iokerneld pre-assigns the next request to a
    /// busy worker (`true`/`false`; default: iokerneld's).
    #[arg(long)]
    pre_assign: Option<bool>,
    /// The Linux peer: kernel sockets and OS threads instead of a Ginza
    /// runtime (the baseline of Shenango's Fig. 4).
    #[arg(long, conflicts_with = "mode")]
    linux: bool,
    /// With `--linux`: the address to bind (the port is `--port`).
    #[arg(long, default_value = "0.0.0.0", requires = "linux")]
    listen: std::net::Ipv4Addr,
    #[command(flatten)]
    app: AppArgs,
}

fn main() -> anyhow::Result<()> {
    ginza_runtime::init_logging("info").expect("the process's first logger");
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
    if args.linux {
        log::info!(
            "{name}: serving UDP {}:{port} on {} Linux thread(s)",
            args.listen,
            args.app.kthreads.max(1)
        );
    } else {
        log::info!(
            "{name}: serving UDP {}:{port} ({} kthreads)",
            args.app.ip,
            args.app.kthreads
        );
    }
    match args.mode {
        _ if args.linux => {
            let socket = std::net::UdpSocket::bind((args.listen, port))
                .with_context(|| format!("binding UDP {}:{port}", args.listen))?;
            let threads: Vec<_> = (0..args.app.kthreads.max(1))
                .map(|_| {
                    let (socket, stop, stats) = (socket.try_clone()?, stop.clone(), s2.clone());
                    Ok(std::thread::spawn(move || {
                        serve_linux(&socket, &stop, &stats)
                    }))
                })
                .collect::<std::io::Result<_>>()
                .context("cloning the socket")?;
            for t in threads {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a server thread panicked"))?
                    .context("serving")?;
            }
        }
        Mode::Shenango => ginza_runtime::run(config, move || serve(port, stop, s2))
            .context("starting the runtime")?
            .with_context(|| format!("serving UDP port {port}"))?,
        Mode::Shinjuku => {
            let spec = DispatchSpec {
                policy: args.policy.clone(),
                quantum_ns: args.quantum.as_nanos().try_into().unwrap_or(u64::MAX),
                head: false,
                classes: Vec::new(),
                class_offset: 0,
                backstop_ns: (!args.backstop.is_zero())
                    .then(|| args.backstop.as_nanos().try_into().unwrap_or(u64::MAX)),
                pre_assign: args.pre_assign,
            };
            let io = config
                .iokernel
                .context("shinjuku mode runs under iokerneld")?;
            let cfg = DispatchedConfig::new(io, spec, port).with_workers(args.app.kthreads);
            let report = dispatched::serve(cfg, move |r| answer_preemptible(r, &s2), &stop)
                .context("serving in shinjuku mode")?;
            log::info!("{name}: {report:?}");
        }
    }
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
