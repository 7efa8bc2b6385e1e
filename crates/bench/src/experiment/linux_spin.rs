//! The Linux peer of spin-server beside batch (`shenango-fig4-spin`'s
//! `linux` system): the same spin requests served by OS threads on a kernel
//! UDP socket (`ginza_apps::spin_server::serve_linux`), one thread pinned
//! to each CPU Ginza manages, with the same batch work on a thread per such
//! CPU at `SCHED_IDLE` (`bench memcached`'s Linux batch): Linux's best way
//! to run background work under a latency-critical server. iokerneld's
//! generator reaches only applications on its switch, so the load comes
//! from `ginza loadgen`'s kernel backend (Poisson, the same service-time
//! distribution) over loopback, pinned to the CPU iokerneld takes in the
//! Ginza runs.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use ginza_apps::spin_server::{serve_linux, SpinStats};
use ginza_loadgen::protocol::spin::{ServiceTime, Spin};
use ginza_loadgen::protocol::{Transport, Workload};
use ginza_loadgen::schedule::{Arrivals, Process};
use ginza_loadgen::RunConfig;

use super::spec::ServiceDist;
use crate::harness::figures::allowed_cpus;

/// loadgen's service-time distribution for `d`, if it has one.
pub fn loadgen_service(d: &ServiceDist) -> Option<ServiceTime> {
    Some(match d {
        ServiceDist::Exponential { mean } => ServiceTime::Exponential(mean.0),
        ServiceDist::Constant { value } => ServiceTime::Fixed(value.0),
        ServiceDist::Bimodal { p, short, long } => ServiceTime::Bimodal {
            p: p.0,
            short: short.0,
            long: long.0,
        },
        ServiceDist::Lognormal { .. } => return None,
    })
}

/// What one point measured.
pub struct Point {
    /// Answers per second over the measured part, as a fraction of the
    /// server CPUs' capacity.
    pub achieved_load: f64,
    /// Latency from each request's scheduled send; `None` when the
    /// generator fell behind (its latencies would be the generator's).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub batch_ops_per_s: f64,
    pub sent: u64,
    pub answered: u64,
    pub note: String,
}

/// Runs one point: `load` of the server CPUs' capacity (1 / mean service
/// time per CPU) for `warmup + duration`.
pub fn run_point(
    service: &ServiceDist,
    load: f64,
    warmup: Duration,
    duration: Duration,
    sockets: usize,
    seed: u64,
) -> anyhow::Result<Point> {
    let allowed = allowed_cpus()?;
    let (&generator_cpu, server_cpus) = allowed
        .split_first()
        .context("no CPU this process may use")?;
    anyhow::ensure!(
        !server_cpus.is_empty(),
        "the Linux spin server needs a CPU beside the generator's, this process may use \
         {allowed:?}"
    );
    let dist = loadgen_service(service).context("loadgen has no such service distribution")?;
    let rate = load * server_cpus.len() as f64 / (service.mean_us() * 1e-6);
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).context("binding the spin socket")?;
    let target = socket.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(SpinStats::default());
    let paths = Arc::new(AtomicU64::new(0));
    let mut servers = Vec::new();
    let mut batches = Vec::new();
    let mut priority = String::new();
    let started = (|| -> anyhow::Result<()> {
        for (i, &cpu) in server_cpus.iter().enumerate() {
            let (sock, s2, stats) = (socket.try_clone()?, stop.clone(), stats.clone());
            servers.push(std::thread::spawn(move || -> anyhow::Result<()> {
                ginza_sys::affinity::pin_current_thread(cpu)
                    .with_context(|| format!("pinning the spin server to CPU {cpu}"))?;
                serve_linux(&sock, &s2, &stats).context("the Linux spin server")
            }));
            let (batch, prio) = crate::harness::linux_batch::linux_batch(
                cpu,
                paths.clone(),
                stop.clone(),
                seed.wrapping_add(i as u64),
            )?;
            batches.push(batch);
            priority = prio;
        }
        Ok(())
    })();
    let measured = started.and_then(|()| {
        measure(
            target,
            dist,
            rate,
            warmup,
            duration,
            sockets,
            seed,
            generator_cpu,
            &paths,
        )
    });
    stop.store(true, Relaxed);
    for s in servers {
        s.join()
            .map_err(|_| anyhow!("a spin server thread panicked"))??;
    }
    for b in batches {
        let price = b.join().map_err(|_| anyhow!("a batch thread panicked"))?;
        anyhow::ensure!(
            price == 0.0 || (price - 8.0214).abs() < 1.0,
            "batch priced the call at {price}: its work was not real"
        );
    }
    let (report, batch) = measured?;
    let latency = |v: f64| (!report.generator_saturated && report.completed > 0).then_some(v);
    let mut note = vec![format!(
        "Linux: {} pinned thread(s) on a kernel UDP socket, batch at {priority}; loadgen \
         (kernel sockets, loopback) on CPU {generator_cpu}",
        server_cpus.len()
    )];
    if let Some(why) = &report.saturation_reason {
        note.push(format!("generator saturated: {why}"));
    }
    if report.timeouts > 0 || report.errors > 0 {
        note.push(format!(
            "{} timeouts, {} errors",
            report.timeouts, report.errors
        ));
    }
    Ok(Point {
        achieved_load: report.achieved_rps * service.mean_us() * 1e-6 / server_cpus.len() as f64,
        p50_us: latency(report.latency.p50_us),
        p99_us: latency(report.latency.p99_us),
        p999_us: latency(report.latency.p999_us),
        batch_ops_per_s: batch,
        sent: report.sent,
        answered: report.completed,
        note: note.join("; "),
    })
}

/// Offers the load while counting the batch work of the measured part.
#[allow(clippy::too_many_arguments)]
fn measure(
    target: SocketAddr,
    service: ServiceTime,
    rate: f64,
    warmup: Duration,
    duration: Duration,
    sockets: usize,
    seed: u64,
    cpu: usize,
    paths: &Arc<AtomicU64>,
) -> anyhow::Result<(ginza_loadgen::report::Report, f64)> {
    let cfg = RunConfig {
        target,
        transport: Transport::Udp,
        workload: Workload::Spin(Spin {
            service,
            size: ginza_proto::REQUEST_HEADER_LEN,
        }),
        arrivals: Arrivals::steady(Process::Poisson, rate, warmup + duration),
        warmup,
        connections: sockets.max(1),
        threads: 1,
        timeout: Duration::from_secs(1),
        max_lag: Duration::from_micros(500),
        spin: Duration::ZERO,
        seed,
        cpus: vec![cpu],
        connect_timeout: Duration::from_secs(5),
    };
    cfg.validate().map_err(|e| anyhow!("the load: {e}"))?;
    let paths = paths.clone();
    let start = Instant::now();
    let counter = std::thread::spawn(move || {
        std::thread::sleep(warmup);
        let (t0, n0) = (Instant::now(), paths.load(Relaxed));
        std::thread::sleep(duration);
        let (t1, n1) = (Instant::now(), paths.load(Relaxed));
        (n1 - n0) as f64 / (t1 - t0).as_secs_f64()
    });
    let report = ginza_loadgen::kernel::run(&cfg).context("loadgen against the Linux server");
    let batch = counter
        .join()
        .map_err(|_| anyhow!("the batch counter panicked"))?;
    let report = report?;
    anyhow::ensure!(
        start.elapsed() >= warmup + duration,
        "the generator returned before its schedule was over"
    );
    Ok((report, batch))
}
