//! The generator's own capacity on this machine: one worker drives UDP
//! echo requests at a local echo server (a kernel thread on 127.0.0.1)
//! with a schedule far beyond what it can send, so it is always behind and
//! never idle; its answered requests per second of its own CPU time are
//! the requests/s one generator core sustains. A run that asks for more
//! per worker thread than this will be marked saturated.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::protocol::{echo::Echo, Transport, Workload};
use crate::report::Report;
use crate::schedule::{Arrivals, Process};
use crate::RunConfig;

/// The offered rate of the calibration: beyond any single core.
const OVERLOAD_RPS: f64 = 3_000_000.0;

/// A UDP echo server on a kernel thread, on 127.0.0.1 at a free port,
/// until dropped.
pub struct LocalUdpEcho {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LocalUdpEcho {
    pub fn start() -> anyhow::Result<LocalUdpEcho> {
        let socket = UdpSocket::bind("127.0.0.1:0").context("binding the local echo server")?;
        socket.set_read_timeout(Some(Duration::from_millis(20)))?;
        let addr = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("loadgen-echo".into())
            .spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop2.load(Relaxed) {
                    if let Ok((n, from)) = socket.recv_from(&mut buf) {
                        let _ = socket.send_to(&buf[..n], from);
                    }
                }
            })?;
        Ok(LocalUdpEcho {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for LocalUdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Measures one worker's capacity over `duration`; the report of that run
/// with `generator_capacity_rps_per_core` set.
pub fn calibrate(duration: Duration, cpus: Vec<usize>) -> anyhow::Result<Report> {
    let server = LocalUdpEcho::start()?;
    let cfg = RunConfig {
        target: server.addr,
        transport: Transport::Udp,
        workload: Workload::Echo(Echo { size: 32 }),
        arrivals: Arrivals::steady(Process::Constant, OVERLOAD_RPS, duration),
        warmup: Duration::ZERO,
        connections: 16,
        threads: 1,
        timeout: Duration::from_millis(200),
        max_lag: Duration::from_micros(100),
        spin: Duration::ZERO,
        seed: 1,
        cpus,
        connect_timeout: Duration::from_secs(1),
    };
    let mut report = crate::kernel::run(&cfg)?;
    let cpu = report.generator_cpu_s.max(1e-9);
    report.generator_capacity_rps_per_core = Some(report.completed as f64 / cpu);
    Ok(report)
}
