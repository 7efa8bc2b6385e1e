//! `spin-server`: registers with iokerneld with its own MAC and IP and
//! answers UDP requests that carry their service time (see
//! `ginza_apps::spin_server`). Stops on SIGINT/SIGTERM or after `--run-for`.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use ginza_apps::spin_server::{serve, SpinStats};
use ginza_proto::parse_duration;
use ginza_runtime::net::{Ipv4Addr, MacAddr, NetConfig};
use ginza_runtime::{Class, Config, IokernelConfig};

#[derive(Parser, Debug)]
#[command(about = "UDP server whose requests carry their service time (spins, then echoes)")]
struct Args {
    /// The application's MAC address on iokerneld's switch.
    #[arg(long, default_value = "02:47:5a:00:01:01")]
    mac: MacAddr,
    /// The application's IPv4 address.
    #[arg(long, default_value = "10.47.1.1")]
    ip: Ipv4Addr,
    /// UDP port to serve.
    #[arg(long, default_value_t = 7)]
    port: u16,
    /// Kthreads (cores it may use at most).
    #[arg(long, default_value_t = 2)]
    kthreads: usize,
    /// Cores iokerneld never takes away.
    #[arg(long, default_value_t = 0)]
    guaranteed: u32,
    /// Name at iokerneld.
    #[arg(long, default_value = "spin-server")]
    name: String,
    /// iokerneld's control socket [default: its default path].
    #[arg(long)]
    socket: Option<std::path::PathBuf>,
    /// Static ARP entries `IP=MAC` (peers that do not answer ARP).
    #[arg(long = "static-arp", value_parser = parse_arp)]
    static_arp: Vec<(Ipv4Addr, MacAddr)>,
    /// Stop after this long (e.g. 10s) [default: run until SIGINT/SIGTERM].
    #[arg(long, value_parser = parse_duration)]
    run_for: Option<Duration>,
}

fn parse_arp(s: &str) -> Result<(Ipv4Addr, MacAddr), String> {
    let (ip, mac) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected IP=MAC"))?;
    let ip = ip.parse().map_err(|e| format!("{ip:?}: {e}"))?;
    let mac = mac.parse().map_err(|e| format!("{mac:?}: {e}"))?;
    Ok((ip, mac))
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    let stop = Arc::new(AtomicBool::new(false));
    let on_signal = stop.clone();
    ctrlc::set_handler(move || on_signal.store(true, Relaxed))
        .context("installing the SIGINT/SIGTERM handler")?;
    if let Some(d) = args.run_for {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            stop.store(true, Relaxed);
        });
    }
    let mut net = NetConfig::new(args.mac, args.ip);
    for &(ip, mac) in &args.static_arp {
        net = net.with_static_arp(ip, mac);
    }
    let mut io = IokernelConfig::new(args.name.clone(), Class::LatencyCritical);
    io.socket = args.socket.clone();
    io.guaranteed = args.guaranteed;
    io.net = Some(net);
    let config = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(args.kthreads)
    };
    let stats = Arc::new(SpinStats::default());
    let started = Instant::now();
    let (port, s2) = (args.port, stats.clone());
    log::info!(
        "{}: serving UDP {}:{} ({} kthreads)",
        args.name,
        args.ip,
        port,
        args.kthreads
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
