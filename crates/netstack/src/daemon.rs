//! `netstackd`: the netstack as an application under iokerneld
//! (docs/protected.md). It registers like any runtime (its own region,
//! one eventfd per kthread, its own address), so iokerneld steers its
//! address's frames to its ingress rings and grants its kthreads cores by
//! congestion detection; `ginza top` lists it like any application.
//!
//! Each kthread follows the runtime's protocol with iokerneld (docs/
//! runtime.md): `Started`, wait for a grant on its eventfd, run, answer a
//! preemption with `Yielded`, park with `Parked` (and its next timer) when
//! idle. While running it takes frames off its ingress ring into the
//! engine, polls the engine (commands, timers, payload, events) and puts
//! the engine's frames on its egress ring. The engine is one, behind a
//! lock: whichever kthread runs serves every application.
//!
//! Each attached application's channel is handed to iokerneld
//! (`Request::Protect`), which counts waiting commands as the netstack's
//! queued work and grants it cores for them (docs/protected.md,
//! "Wake-ups"). Until iokerneld has taken one (or if it refuses), a parked
//! kthread asks to be woken every `command_poll` while applications are
//! attached (every 10 ms otherwise) to look at the command rings itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use ginza_net::Interface;
use ginza_proto::client;
use ginza_proto::messages::{Class, Registration};
use ginza_shm::netstack::{EGRESS_FILL_L4_CHECKSUM, EGRESS_GATHER, GATHER_OFFSET};
use ginza_shm::{
    IngressPool, LineFlags, PacketDesc, Region, RegionConfig, RuntimeEnd, ToIokernel, ToKthread,
    PKT_BUFFER_SIZE,
};
use ginza_sys::hops::{self, Hop};
use ginza_sys::{clock, eventfd, process};
use log::{info, warn};

use crate::engine::{Netstack, NetstackConfig, NetstackStats};
use crate::server::{lock, Iokerneld, Server, ServerConfig};

/// How `netstackd` runs.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub iokernel_socket: PathBuf,
    pub attach_socket: PathBuf,
    /// Its name in iokerneld (`ginza top`).
    pub name: String,
    /// Its own address (protected applications share it).
    pub interface: Interface,
    /// Network kthreads (the most cores it may hold).
    pub kthreads: u32,
    /// Cores never taken away.
    pub guaranteed: u32,
    pub netstack: NetstackConfig,
    /// Idle time before a kthread parks.
    pub spin: Duration,
    /// Idle time before a kthread parks while an application owes an
    /// answer (events unread, or received data not yet returned): its
    /// command then comes while the kthread still runs, with no wake in
    /// between (docs/protected.md, "Where the one-way time goes").
    /// iokerneld can still take the core for another application.
    pub reply_spin: Duration,
    /// While applications are attached, how often a parked kthread is
    /// woken to look at the command rings.
    pub command_poll: Duration,
    /// Zero-touch transmit (iokerneld copies payload from the tx pools);
    /// false: the netstack copies it (docs/protected.md, "Transmit").
    pub zero_touch: bool,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (docs/metrics.md).
    pub metrics: Option<std::net::SocketAddr>,
}

impl DaemonConfig {
    pub fn new(interface: Interface) -> DaemonConfig {
        DaemonConfig {
            iokernel_socket: client::default_socket_path(),
            attach_socket: ginza_proto::netstack::default_netstack_socket(),
            name: "netstack".into(),
            interface,
            kthreads: 2,
            guaranteed: 0,
            netstack: NetstackConfig::default(),
            spin: Duration::from_micros(50),
            reply_spin: Duration::from_micros(500),
            command_poll: Duration::from_micros(200),
            zero_touch: true,
            metrics: None,
        }
    }
}

/// A running netstack; stopped on drop.
pub struct Daemon {
    stop: Arc<AtomicBool>,
    engine: Arc<Mutex<Netstack>>,
    threads: Vec<JoinHandle<()>>,
    conn: Option<Arc<Mutex<client::Connection>>>,
    watches_channels: Arc<AtomicBool>,
    /// The metrics listener (`DaemonConfig::metrics`).
    metrics: Option<ginza_metrics::MetricsServer>,
}

impl Daemon {
    /// Registers with iokerneld, binds the attach socket and starts the
    /// kthreads and the attach thread.
    pub fn start(cfg: DaemonConfig) -> anyhow::Result<Daemon> {
        let n = cfg.kthreads;
        if n == 0 {
            return Err(anyhow!("netstack needs at least one kthread"));
        }
        // Bound first: an address in use stops the netstack before it
        // registers with iokerneld.
        let metrics_listener = cfg
            .metrics
            .map(|addr| {
                std::net::TcpListener::bind(addr)
                    .with_context(|| format!("cannot serve metrics on {addr}"))
            })
            .transpose()?;
        let region = Region::create(&cfg.name, &RegionConfig::new(n))
            .context("creating the shared region")?;
        let eventfds = (0..n)
            .map(|_| eventfd::new())
            .collect::<Result<Vec<_>, _>>()
            .context("creating eventfds")?;
        let reg = Registration {
            name: cfg.name.clone(),
            class: Class::LatencyCritical,
            guaranteed: cfg.guaranteed,
            max_cores: n,
            kthreads: n,
            net: Some(cfg.interface),
            steering: None,
            dispatch: None,
            // Its kthreads are its own loop's, which waits on eventfds.
            wake_page: false,
            bell: false,
        };
        let mut conn = client::register_region(&cfg.iokernel_socket, &reg, &region, &eventfds)
            .with_context(|| {
                format!(
                    "registering with iokerneld at {}",
                    cfg.iokernel_socket.display()
                )
            })?;
        let pool =
            Arc::new(conn.take_ingress_pool().ok_or_else(|| {
                anyhow!("iokerneld accepted the netstack without an ingress pool")
            })?);
        let mut engine = Netstack::new(cfg.netstack.clone());
        engine.add_address(cfg.interface);
        let engine = Arc::new(Mutex::new(engine));
        let metrics = metrics_listener
            .map(|l| {
                crate::metrics::serve(l, &cfg.name, Arc::clone(&engine))
                    .context("starting the metrics thread")
            })
            .transpose()?;
        if let Some(m) = &metrics {
            info!("netstack: metrics at http://{}/metrics", m.local_addr());
        }
        // An iokerneld that knows `Unprotect` (a no-op for an unknown link)
        // watches channels: the kthreads need not poll, even before the
        // first application attaches.
        let watches_channels = Arc::new(AtomicBool::new(conn.unprotect(0).is_ok()));
        let conn = Arc::new(Mutex::new(conn));
        let mut server = Server::bind(ServerConfig {
            path: cfg.attach_socket.clone(),
            interface: cfg.interface,
            other_addresses: false,
        })
        .with_context(|| format!("binding {}", cfg.attach_socket.display()))?
        .with_iokerneld(Iokerneld {
            conn: Arc::clone(&conn),
            watches_channels: Arc::clone(&watches_channels),
            zero_touch: cfg.zero_touch,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (k, efd) in eventfds.into_iter().enumerate() {
            let end = region
                .runtime_end(k as u32)
                .map_err(|e| anyhow!("kthread {k}: {e}"))?;
            let kt = Kthread {
                end,
                eventfd: efd,
                pool: Arc::clone(&pool),
                engine: Arc::clone(&engine),
                stop: Arc::clone(&stop),
                spin: cfg.spin,
                reply_spin: cfg.reply_spin.max(cfg.spin),
                command_poll: cfg.command_poll,
                watches_channels: Arc::clone(&watches_channels),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("netstack-k{k}"))
                    .spawn(move || kt.run())
                    .context("starting a kthread")?,
            );
        }
        let (e2, s2) = (Arc::clone(&engine), Arc::clone(&stop));
        threads.push(
            std::thread::Builder::new()
                .name("netstack-attach".into())
                .spawn(move || {
                    while !s2.load(Ordering::Relaxed) {
                        server.poll(&e2, Duration::from_millis(20));
                    }
                    let _ = std::fs::remove_file(server.path());
                })
                .context("starting the attach thread")?,
        );
        info!(
            "netstack {} at {} ({} kthreads), attach socket {}",
            cfg.name,
            cfg.interface.ip,
            n,
            cfg.attach_socket.display()
        );
        Ok(Daemon {
            stop,
            engine,
            threads,
            conn: Some(conn),
            watches_channels,
            metrics,
        })
    }

    /// Where its metrics are served (the port the kernel chose for port
    /// 0), if they are.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|m| m.local_addr())
    }

    pub fn stats(&self) -> NetstackStats {
        lock(&self.engine).stats()
    }

    /// iokerneld took a channel: it wakes the netstack for commands.
    pub fn iokerneld_watches_channels(&self) -> bool {
        self.watches_channels.load(Ordering::Relaxed)
    }

    pub fn engine(&self) -> &Arc<Mutex<Netstack>> {
        &self.engine
    }

    /// iokerneld went away (its socket closed).
    pub fn iokerneld_gone(&self) -> bool {
        self.conn.as_ref().is_none_or(|c| {
            c.lock()
                .unwrap_or_else(|p| p.into_inner())
                .closed_by_iokerneld()
        })
    }

    /// Runs until iokerneld goes away or `stop` is set.
    pub fn wait(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) && !self.iokerneld_gone() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.conn = None;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often a parked kthread looks for work while no application is
/// attached.
const IDLE_LOOK: Duration = Duration::from_millis(10);

struct Kthread {
    end: RuntimeEnd,
    eventfd: std::os::fd::OwnedFd,
    pool: Arc<IngressPool>,
    engine: Arc<Mutex<Netstack>>,
    stop: Arc<AtomicBool>,
    spin: Duration,
    reply_spin: Duration,
    command_poll: Duration,
    watches_channels: Arc<AtomicBool>,
}

enum Outcome {
    Park,
    Yield,
    Stop,
}

impl Kthread {
    fn run(mut self) {
        let tid = process::gettid() as u32;
        if self.send(ToIokernel::Started { tid }).is_err() {
            return;
        }
        // Parked from the start, with a timer: iokerneld wakes it to look
        // for attached applications' commands (see `next_deadline_ns`).
        let first = self.next_deadline_ns();
        if self
            .send(ToIokernel::Parked {
                next_deadline_ns: first,
                grant: ginza_shm::UNNUMBERED_GRANT,
            })
            .is_err()
        {
            return;
        }
        loop {
            if !self.wait_for_grant() {
                return;
            }
            let outcome = self.serve();
            let deadline = self.next_deadline_ns();
            let msg = match outcome {
                Outcome::Stop => return,
                Outcome::Park => ToIokernel::Parked {
                    next_deadline_ns: deadline,
                    grant: ginza_shm::UNNUMBERED_GRANT,
                },
                Outcome::Yield => ToIokernel::Yielded {
                    next_deadline_ns: deadline,
                    grant: ginza_shm::UNNUMBERED_GRANT,
                },
            };
            self.end.line.insert_flags(LineFlags::PARKED);
            if self.send(msg).is_err() {
                return;
            }
        }
    }

    fn send(&mut self, m: ToIokernel) -> Result<(), ()> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.end.to_iokernel.send(m) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline && !self.stop.load(Ordering::Relaxed) => {
                    let _ = e;
                    std::thread::yield_now();
                }
                Err(e) => {
                    warn!("cannot tell iokerneld {m:?}: {e}");
                    return Err(());
                }
            }
        }
    }

    /// Blocks until iokerneld grants a core; false to stop.
    fn wait_for_grant(&mut self) -> bool {
        use std::os::fd::AsFd;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            match eventfd::wait(self.eventfd.as_fd(), Some(Duration::from_millis(20))) {
                Ok(true) => break,
                Ok(false) => continue,
                Err(e) => {
                    warn!("eventfd: {e}");
                    return false;
                }
            }
        }
        let _ = eventfd::read(self.eventfd.as_fd());
        while let Ok(Some(_)) = self.end.from_iokernel.recv() {}
        self.end.line.remove_flags(LineFlags::PARKED);
        true
    }

    /// The earliest TCP timer (or the command poll while applications are
    /// attached), on CLOCK_MONOTONIC.
    fn next_deadline_ns(&self) -> Option<u64> {
        let e = lock(&self.engine);
        // Attached applications' commands are looked at every
        // `command_poll`; without any, a new one is noticed within
        // `IDLE_LOOK` (its `listen` waits that long at most).
        // Once iokerneld watches the channels it wakes us for commands:
        // only the TCP timers then.
        let look = if self.watches_channels.load(Ordering::Relaxed) {
            None
        } else if e.app_ids().is_empty() {
            Some(IDLE_LOOK)
        } else {
            Some(self.command_poll)
        };
        let wait = match (e.next_deadline_in(), look) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        wait.map(|w| clock::monotonic_ns().saturating_add(w.as_nanos() as u64))
    }

    /// Runs while there is work; says why it stopped.
    fn serve(&mut self) -> Outcome {
        let mut idle_since = Instant::now();
        let mut descs: Vec<PacketDesc> = Vec::with_capacity(64);
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Outcome::Stop;
            }
            while let Ok(Some(m)) = self.end.from_iokernel.recv() {
                if let ToKthread::Preempt { .. } = m {
                    return Outcome::Yield;
                }
            }
            if self
                .end
                .line
                .snapshot()
                .flags
                .contains(LineFlags::PREEMPT_PENDING)
            {
                return Outcome::Yield;
            }
            let mut worked = false;
            descs.clear();
            let got = self.end.ingress.pop_into(&mut descs, 64).unwrap_or(0);
            {
                let mut e = lock(&self.engine);
                for d in &descs {
                    if let Some(frame) = self.pool.frame(*d) {
                        e.on_frame(frame);
                    }
                }
                worked |= got > 0;
                worked |= e.poll();
                while self.end.egress.free().unwrap_or(0) > 0 {
                    let Some(f) = e.pop_frame() else { break };
                    let seq = self.end.egress.next_seq();
                    let buf = self.end.egress_buffers.buffer_mut(seq);
                    let max = if f.gather.is_some() {
                        GATHER_OFFSET
                    } else {
                        PKT_BUFFER_SIZE as usize
                    };
                    let n = f.bytes.len().min(max);
                    buf[..n].copy_from_slice(&f.bytes[..n]);
                    let mut flags = 0;
                    if let Some(g) = &f.gather {
                        // Headers only here; the payload stays in the
                        // application's tx pool for iokerneld to copy.
                        let _ = g.encode(&mut buf[GATHER_OFFSET..]);
                        flags |= EGRESS_GATHER;
                    }
                    if f.fill_checksum {
                        flags |= EGRESS_FILL_L4_CHECKSUM;
                    }
                    if f.gather.is_some() {
                        // A segment with payload (zero-touch), not an ACK.
                        hops::stamp(Hop::NetstackFrameOut);
                    }
                    let _ = self.end.egress.push(PacketDesc {
                        len: n as u32,
                        reserved: flags,
                        ..Default::default()
                    });
                    worked = true;
                }
            }
            let bufs: Vec<u32> = descs.iter().map(|d| d.buf).collect();
            let _ = self.end.done.push_slice(&bufs);
            if worked {
                idle_since = Instant::now();
            } else if idle_since.elapsed() >= self.spin
                && (idle_since.elapsed() >= self.reply_spin || !lock(&self.engine).reply_due())
            {
                // A frame that landed after the last look is taken first.
                if self.end.ingress.is_empty().unwrap_or(true) {
                    return Outcome::Park;
                }
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
