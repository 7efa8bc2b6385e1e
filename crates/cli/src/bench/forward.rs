//! `ginza bench forward`: iokerneld's dataplane.
//!
//! * `rtt_us`: UDP round trips (32-byte payload, one at a time, 2000 after
//!   200 of warm-up) from an ordinary Linux socket in a network namespace,
//!   over a veth pair, to an echo server at the root namespace's end: first
//!   the kernel's (a thread blocked in `recv_from` on the veth end, given
//!   an address for the run), then `spin-server` on a Ginza runtime behind
//!   iokerneld driving that same veth end with AF_XDP (copy mode; AF_PACKET
//!   if AF_XDP cannot be opened). Both in one run, on the same pair. Needs
//!   root, `ip` and `ethtool`; without them `rtt_us` is null and
//!   `rtt_skipped` says why.
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
use std::net::SocketAddrV4;

use ginza_apps::spin_server::{self, SpinStats};
use ginza_iokernel::netns::{self, NetNs};
use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::{Config as IokConfig, InProcess, Iokerneld, RecordingActuator};
use ginza_net::{tx, Endpoint, Interface, Ipv4Addr, MacAddr};
use ginza_proto::{client, StatsReport};
use ginza_runtime::net::NetConfig;
use ginza_runtime::{Class, Config as RtConfig, IokernelConfig};
use serde::Serialize;

use super::common::{allowed_cpus, emit, median, percentile};

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
    /// UDP round trips over the veth, µs; null when skipped.
    rtt_us: Option<RttPair>,
    /// The NIC backend the Ginza round trips went through.
    rtt_backend: Option<String>,
    /// Why `rtt_us` is null.
    rtt_skipped: Option<String>,
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
        let _ = ginza_sys::affinity::pin_current_thread(iok_cpu);
        daemon.run()
    });
    let result = measure(&args, &socket, app_cpu);
    stop.stop();
    let _ = loop_thread.join();
    let _ = std::fs::remove_dir_all(&dir);
    let mut report = result?;
    match NetNs::create() {
        Err(e) => report.rtt_skipped = Some(e.to_string()),
        Ok(ns) => {
            let linux = linux_rtt(&ns).context("the Linux UDP echo over veth")?;
            let (backend, ginza) =
                ginza_rtt(&ns, iok_cpu, app_cpu).context("the Ginza UDP echo over veth")?;
            report.rtt_us = Some(RttPair { ginza, linux });
            report.rtt_backend = Some(backend);
        }
    }
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
        let _ = ginza_sys::affinity::pin_current_thread(app_cpu);
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
    // Each reset ends iokerneld's window: its length and loop CPU time are
    // iokerneld's own.
    let mut before = client::reset_stats(socket)?;
    for _ in 0..args.windows {
        std::thread::sleep(Duration::from_millis(args.window_ms));
        let after = client::reset_stats(socket)?;
        let packets = received(&after).saturating_sub(received(&before));
        rates.push(packets as f64 / after.alloc.window_ns.max(1) as f64 * 1e3);
        if packets > 0 {
            cpu_per_packet.push(after.alloc.window_cpu_ns as f64 / packets as f64);
        }
        before = after;
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
        rtt_us: None,
        rtt_backend: None,
        rtt_skipped: None,
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
    match (&r.rtt_us, &r.rtt_backend) {
        (Some(p), Some(backend)) => {
            let _ = writeln!(
                s,
                "UDP round trip, Linux socket in a namespace → veth → echo server, \
                 {RTT_PAYLOAD}-byte payload, µs:"
            );
            let rows = [
                (format!("ginza ({backend})"), p.ginza),
                ("linux sockets".to_string(), p.linux),
            ];
            for (name, x) in rows {
                let _ = writeln!(
                    s,
                    "  {name:<18} p50 {:>7.1}  p99 {:>7.1}  lost {}",
                    x.p50, x.p99, x.lost
                );
            }
            let _ = writeln!(
                s,
                "  p50 ratio ginza/linux {:.2} (DLibOS: 6 µs one way vs 31 µs for Linux)",
                p.ginza.p50 / p.linux.p50
            );
        }
        _ => {
            let _ = writeln!(
                s,
                "UDP round trips skipped: {}",
                r.rtt_skipped.as_deref().unwrap_or("unknown reason")
            );
        }
    }
    s
}

/// Round trips measured over the veth pair.
const RTT_ROUNDS: usize = 2000;
const RTT_WARMUP: usize = 200;
const RTT_PAYLOAD: usize = 32;
const RTT_TIMEOUT: Duration = Duration::from_millis(100);
const ECHO_PORT: u16 = 7;
const GINZA_ECHO_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x02]);

#[derive(Serialize, Clone, Copy)]
struct Rtt {
    p50: f64,
    p99: f64,
    /// Round trips without an answer within 100 ms.
    lost: usize,
}

#[derive(Serialize)]
struct RttPair {
    ginza: Rtt,
    linux: Rtt,
}

/// p50/p99 in µs of the answered round trips.
fn summarize(rtts: &[Option<Duration>]) -> Rtt {
    let mut ns: Vec<u64> = rtts.iter().flatten().map(|d| d.as_nanos() as u64).collect();
    ns.sort_unstable();
    let us = |q| percentile(&ns, q).map_or(f64::NAN, |v| v as f64 / 1e3);
    Rtt {
        p50: us(50.0),
        p99: us(99.0),
        lost: rtts.len() - ns.len(),
    }
}

/// Ping-pongs from a Linux UDP socket in the namespace to `target`:
/// warm-up, then the measured rounds.
fn probe(ns: &NetNs, target: Ipv4Addr) -> anyhow::Result<Rtt> {
    let bind = SocketAddrV4::new(ns.ns_ip, 0);
    let target = SocketAddrV4::new(target, ECHO_PORT);
    let rtts = ns.run_in(move || -> std::io::Result<Vec<Option<Duration>>> {
        netns::udp_rtt_probe(bind, target, RTT_WARMUP, RTT_PAYLOAD, RTT_TIMEOUT)?;
        netns::udp_rtt_probe(bind, target, RTT_ROUNDS, RTT_PAYLOAD, RTT_TIMEOUT)
    })??;
    let rtt = summarize(&rtts);
    anyhow::ensure!(
        rtt.lost < RTT_ROUNDS / 2,
        "{} of {RTT_ROUNDS} round trips to {target} unanswered",
        rtt.lost
    );
    Ok(rtt)
}

/// The kernel's UDP echo: a thread blocked in `recv_from` on the root
/// namespace's end of the veth, which gets an address for the run.
fn linux_rtt(ns: &NetNs) -> anyhow::Result<Rtt> {
    let ip = Ipv4Addr::new(
        ns.ns_ip.octets()[0],
        ns.ns_ip.octets()[1],
        ns.ns_ip.octets()[2],
        3,
    );
    let cidr = format!("{ip}/24");
    let status = std::process::Command::new("ip")
        .args(["addr", "add", &cidr, "dev", &ns.host_if])
        .status()?;
    anyhow::ensure!(
        status.success(),
        "ip addr add {cidr} dev {} failed",
        ns.host_if
    );
    let socket = std::net::UdpSocket::bind(SocketAddrV4::new(ip, ECHO_PORT))?;
    socket.set_read_timeout(Some(Duration::from_millis(20)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop2.load(Ordering::Relaxed) {
            if let Ok((n, from)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(&buf[..n], from);
            }
        }
    });
    let rtt = probe(ns, ip);
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    let _ = std::process::Command::new("ip")
        .args(["addr", "del", &cidr, "dev", &ns.host_if])
        .status();
    rtt
}

/// spin-server on a Ginza runtime behind iokerneld driving the same veth
/// end (AF_XDP, else AF_PACKET): returns the backend used and the RTT.
fn ginza_rtt(ns: &NetNs, iok_cpu: usize, app_cpu: usize) -> anyhow::Result<(String, Rtt)> {
    let dir = std::env::temp_dir().join(format!("ginza-rtt-{}", std::process::id()));
    let mut last_error = None;
    for backend in ["af_xdp", "af_packet"] {
        let mut cfg = IokConfig::new(vec![app_cpu]);
        cfg.own_core = Some(iok_cpu);
        cfg.socket = dir.join("iokerneld.sock");
        cfg.nic = format!("{backend}:{}", ns.host_if);
        let iokerneld = match InProcess::start(cfg) {
            Ok(d) => d,
            Err(e) => {
                last_error = Some(anyhow::anyhow!(e));
                continue;
            }
        };
        let mut io = IokernelConfig::new("rtt-echo", Class::LatencyCritical);
        io.socket = Some(iokerneld.socket().to_path_buf());
        io.net = Some(NetConfig::new(GINZA_ECHO_MAC, ns.peer_ip));
        let config = RtConfig {
            iokernel: Some(io),
            ..RtConfig::with_kthreads(1)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stats) = (stop.clone(), Arc::new(SpinStats::default()));
        let server = std::thread::spawn(move || {
            ginza_runtime::run(config, move || spin_server::serve(ECHO_PORT, s2, stats))
        });
        let t0 = Instant::now();
        while !iokerneld
            .stats()
            .is_ok_and(|s| s.apps.iter().any(|a| a.name == "rtt-echo"))
        {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(5) && !server.is_finished(),
                "the Ginza echo application did not register"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let rtt = probe(ns, ns.peer_ip);
        stop.store(true, Ordering::Relaxed);
        let _ = server.join();
        drop(iokerneld);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok((backend.to_string(), rtt?));
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no NIC backend opened")))
}
