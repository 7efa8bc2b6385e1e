//! `ginza bench forward`: iokerneld's dataplane.
//!
//! * `forward_mpps`: packets per second that iokerneld, spinning on one
//!   CPU, moves from one application's egress ring to another's ingress
//!   ring through the software switch: 64-byte frames (a 22-byte UDP
//!   payload), egress ring → the sender's switch port → the receiver's port
//!   → an ingress-pool buffer and an ingress ring, three copies per frame.
//!   The two applications are [`RawApp`]s driven by one thread on the other
//!   CPU, which only fills egress slots with a prebuilt frame and gives
//!   ingress buffers straight back, so that iokerneld is the bottleneck.
//!   iokerneld runs with the recording actuator (grants are bookkeeping:
//!   no thread is pinned or woken) and manages both CPUs, so both
//!   applications hold a core and iokerneld polls their rings. The figure
//!   is the median over `--windows` windows of the receiver's delivered
//!   packets (iokerneld's own count) per second. Shenango's IOKernel
//!   forwards 6.5 M packets/s from a NIC to runtimes (its paper, §6); that
//!   is a different path (NIC rings, no switch, one copy), on a dedicated
//!   physical core, so the two figures are neighbours, not a ratio.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::{client, Config as IokConfig, Iokerneld, RecordingActuator, StatsReport};
use ginza_net::{tx, Endpoint, Interface, Ipv4Addr, MacAddr};
use serde::Serialize;

use super::common::{allowed_cpus, emit, median};

/// Arguments of `ginza bench forward`.
#[derive(clap::Args, Debug)]
pub struct ForwardArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Measurement windows for `forward_mpps`.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    windows: u32,
    /// Length of one window, in ms.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..))]
    window_ms: u64,
}

#[derive(Serialize)]
struct Report {
    forward_mpps: f64,
    /// Each window's rate, M packets/s.
    forward_windows_mpps: Vec<f64>,
    /// iokerneld's loop CPU time per forwarded packet, ns (median window).
    iokernel_ns_per_packet: f64,
    /// Bursts of 64 the sender could not queue whole because its egress
    /// ring was full (the driver outran iokerneld), over the whole run.
    sender_ring_full: u64,
    frame_bytes: usize,
}

const SENDER: u8 = 1;
const RECEIVER: u8 = 2;

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x47, 0x5a, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 47, 0, last),
    }
}

pub fn run(args: ForwardArgs) -> anyhow::Result<()> {
    let cpus = allowed_cpus()?;
    anyhow::ensure!(
        cpus.len() >= 2,
        "ginza bench forward needs two CPUs (iokerneld and the applications), this process may use {cpus:?}"
    );
    let (iok_cpu, app_cpu) = (cpus[0], cpus[1]);
    let dir = std::env::temp_dir().join(format!("ginza-forward-{}", std::process::id()));
    let mut cfg = IokConfig::new(vec![iok_cpu, app_cpu]);
    cfg.socket = dir.join("iokerneld.sock");
    cfg.validate(&cpus).map_err(|e| anyhow::anyhow!("{e}"))?;
    let socket = cfg.socket.clone();
    let daemon = Iokerneld::bind(cfg, RecordingActuator::new())?;
    let stop = daemon.stop_handle();
    let loop_thread = std::thread::spawn(move || {
        // Pinned here rather than by `own_core`: iokerneld's CPU is also a
        // managed core, which only the recording actuator makes harmless.
        let _ = ginza_iokernel::util::pin_current_thread(iok_cpu);
        daemon.run()
    });
    let result = measure(&args, &socket, app_cpu);
    stop.stop();
    let _ = loop_thread.join();
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    emit(args.json, &render(&report), &report)
}

fn measure(args: &ForwardArgs, socket: &std::path::Path, app_cpu: usize) -> anyhow::Result<Report> {
    let mut sender = RawApp::register(socket, "fwd-sender", iface(SENDER), 1)
        .context("registering the sender")?;
    let mut receiver = RawApp::register(socket, "fwd-receiver", iface(RECEIVER), 1)
        .context("registering the receiver")?;
    sender.stay_busy(0);
    receiver.stay_busy(0);
    let mut frame = vec![0u8; 2048];
    let to = Endpoint {
        ip: iface(RECEIVER).ip,
        port: 9,
    };
    let len = tx::udp_datagram(
        &mut frame,
        &iface(SENDER),
        iface(RECEIVER).mac,
        9,
        to,
        &[0u8; 22],
    )?;
    frame.truncate(len);

    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let driver = std::thread::spawn(move || {
        let _ = ginza_iokernel::util::pin_current_thread(app_cpu);
        let mut ring_full = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            if sender.send_frames(0, &frame, 64) < 64 {
                ring_full += 1;
            }
            receiver.drop_received(0, 256);
        }
        ring_full
    });
    let received = |s: &StatsReport| {
        s.apps
            .iter()
            .find(|a| a.name == "fwd-receiver")
            .and_then(|a| a.net)
            .map_or(0, |n| n.rx)
    };
    std::thread::sleep(Duration::from_millis(200)); // warm-up
    let mut rates = Vec::new();
    let mut cpu_per_packet = Vec::new();
    let mut before = client::reset_stats(socket)?;
    let mut t0 = Instant::now();
    for _ in 0..args.windows {
        std::thread::sleep(Duration::from_millis(args.window_ms));
        let after = client::reset_stats(socket)?;
        let t1 = Instant::now();
        let packets = received(&after).saturating_sub(received(&before));
        let secs = (t1 - t0).as_secs_f64();
        rates.push(packets as f64 / secs / 1e6);
        if packets > 0 {
            cpu_per_packet.push(after.alloc.window_cpu_ns as f64 / packets as f64);
        }
        before = after;
        t0 = t1;
    }
    stop.store(true, Ordering::Relaxed);
    let ring_full = driver
        .join()
        .map_err(|_| anyhow::anyhow!("the driver thread panicked"))?;
    let forward_mpps = median(&rates).unwrap_or(0.0);
    anyhow::ensure!(forward_mpps > 0.0, "no packet was forwarded: {before:#?}");
    Ok(Report {
        forward_mpps,
        forward_windows_mpps: rates,
        iokernel_ns_per_packet: median(&cpu_per_packet).unwrap_or(0.0),
        sender_ring_full: ring_full,
        frame_bytes: len,
    })
}

fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "iokerneld forwarding, app → software switch → app, {}-byte frames, one spinning CPU:",
        r.frame_bytes
    );
    let _ = writeln!(
        s,
        "  forward_mpps          {:>8.2}  (median of {} windows: {})",
        r.forward_mpps,
        r.forward_windows_mpps.len(),
        r.forward_windows_mpps
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        s,
        "  iokerneld ns/packet   {:>8.0}  (loop CPU time / packets forwarded)",
        r.iokernel_ns_per_packet
    );
    let _ = writeln!(
        s,
        "  Shenango's IOKernel (paper): 6.50 M packets/s NIC → runtimes"
    );
    s
}
