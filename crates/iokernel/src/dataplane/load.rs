//! The traffic generator's load runs (docs/design.md, "NIC backends"): a
//! [`GeneratorHandle`] asks iokerneld's loop for a [`LoadRun`], the loop
//! starts it on the generator's switch port, drives it each iteration and
//! posts its [`LoadReport`] back.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::loop_waker::LoopWaker;

use ginza_net::Interface;
use hdrhistogram::Histogram;

use super::{Dataplane, GENERATOR_MAC};
use crate::nic::{GeneratorConfig, GeneratorStats, TrafficGenerator};

/// A load run for the traffic generator: what a [`GeneratorHandle`] asks
/// iokerneld's loop to do.
#[derive(Clone, Debug)]
pub struct LoadRun {
    /// `interface.mac` must be [`GENERATOR_MAC`]; `start_ns` is set by the
    /// loop when it picks the run up.
    pub config: GeneratorConfig,
    /// After the last arrival, how long to wait for outstanding replies.
    pub drain: Duration,
}

/// The generator's default IP on the switch (applications that answer it
/// need a static ARP entry: the generator answers no ARP).
pub const GENERATOR_IP: ginza_net::Ipv4Addr = ginza_net::Ipv4Addr::new(10, 47, 0, 254);

impl LoadRun {
    /// Poisson requests at `rate_per_sec` for `duration` to `target`:`port`,
    /// from [`GENERATOR_MAC`]/[`GENERATOR_IP`] port 40000, 32-byte payloads,
    /// up to 65,536 outstanding, 64 per loop iteration, seed 7, 100 ms of
    /// drain. Adjust the fields for anything else.
    pub fn poisson(
        target: Interface,
        port: u16,
        rate_per_sec: f64,
        service: crate::nic::ServiceTime,
        duration: Duration,
    ) -> LoadRun {
        LoadRun {
            config: GeneratorConfig {
                interface: Interface {
                    mac: GENERATOR_MAC,
                    ip: GENERATOR_IP,
                },
                src_port: 40_000,
                target_mac: target.mac,
                target: ginza_net::Endpoint {
                    ip: target.ip,
                    port,
                },
                flows: 1,
                rate_per_sec,
                service,
                payload_len: 32,
                start_ns: 0,
                duration_ns: duration.as_nanos() as u64,
                max_outstanding: 1 << 16,
                max_burst: 64,
                seed: 7,
            },
            drain: Duration::from_millis(100),
        }
    }
}

/// What a load run measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub stats: GeneratorStats,
    /// Injection → reply seen by iokerneld's loop, ns.
    pub latency: Histogram<u64>,
    /// Injection − scheduled arrival, ns (how far the loop lagged its
    /// schedule).
    pub lag: Histogram<u64>,
    /// Reply posted by the server → seen, ns, for servers that stamp their
    /// replies (`TrafficGenerator::reply_transit`).
    pub reply_transit: Histogram<u64>,
}

#[derive(Default)]
struct GeneratorSlot {
    request: Option<LoadRun>,
    result: Option<Result<LoadReport, String>>,
}

/// Runs loads on the generator of an iokerneld running in this process
/// ([`crate::InProcess::generator`]). The waiting caller sleeps on a
/// condition variable that iokerneld's loop signals once, with the report:
/// on a machine with few CPUs a caller that polled would take a spinning
/// thread's CPU hundreds of times a second while the load runs.
#[derive(Clone, Default)]
pub struct GeneratorHandle(Arc<Mutex<GeneratorSlot>>, Arc<Condvar>, LoopWaker);

impl GeneratorHandle {
    /// A handle that wakes the loop through `waker`.
    pub(super) fn new(waker: LoopWaker) -> GeneratorHandle {
        GeneratorHandle(Arc::default(), Arc::default(), waker)
    }

    /// Starts `run` on iokerneld's loop and waits for its report, at most
    /// the run's duration + drain + `slack`.
    pub fn run(&self, run: LoadRun, slack: Duration) -> Result<LoadReport, String> {
        let limit = Duration::from_nanos(run.config.duration_ns) + run.drain + slack;
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.request.is_some() {
            return Err("a load run is already waiting to start".into());
        }
        slot.result = None;
        slot.request = Some(run);
        self.2.wake();
        let start = std::time::Instant::now();
        loop {
            if let Some(r) = slot.result.take() {
                return r;
            }
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                slot.request = None;
                return Err(format!(
                    "the load run did not finish within {limit:?} (is iokerneld running?)"
                ));
            }
            slot = self
                .1
                .wait_timeout(slot, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// iokerneld's loop: the report (or why there is none) for the caller
    /// of [`GeneratorHandle::run`], which is woken.
    fn post(&self, slot: &mut GeneratorSlot, result: Result<LoadReport, String>) {
        slot.result = Some(result);
        self.1.notify_all();
    }
}

/// A load run under way on the generator's port.
pub(super) struct RunningLoad {
    generator: TrafficGenerator,
    send_end_ns: u64,
    drain_ns: u64,
}

impl Dataplane {
    pub fn generator_handle(&self) -> GeneratorHandle {
        self.handle.clone()
    }

    /// What the load under way has counted so far, if one is.
    pub(super) fn running_load_stats(&self) -> Option<GeneratorStats> {
        self.load.as_ref().map(|l| l.generator.stats())
    }

    /// The running load's generator: replies in, due requests out; the
    /// run ends once its replies are in or its drain is over.
    pub(super) fn poll_load(&mut self, now: u64) {
        let Some(load) = &mut self.load else {
            return;
        };
        let mut port = self
            .switch
            .port(self.generator_port)
            .expect("the generator's port is never removed");
        load.generator.poll(now, &mut port);
        let stats = load.generator.stats();
        // Every reply in ends the run early, but only once every
        // arrival is out: a generator behind its schedule (the loop
        // held off its CPU) still owes some.
        let all_answered = load.generator.finished_sending() && stats.outstanding == 0;
        let done =
            now >= load.send_end_ns && (all_answered || now >= load.send_end_ns + load.drain_ns);
        if done {
            self.finish_load();
        }
    }

    /// A load run asked for by the [`GeneratorHandle`], started now.
    pub(super) fn check_load(&mut self, now: u64) {
        if self.load.is_some() {
            return;
        }
        let Ok(mut slot) = self.handle.0.try_lock() else {
            return;
        };
        let Some(run) = slot.request.take() else {
            return;
        };
        if run.config.interface.mac != GENERATOR_MAC {
            let why = format!(
                "the generator sends from MAC {GENERATOR_MAC}, not {}",
                run.config.interface.mac
            );
            self.handle.post(&mut slot, Err(why));
            return;
        }
        let mut config = run.config;
        config.start_ns = now;
        let send_end_ns = now + config.duration_ns;
        match TrafficGenerator::new(config) {
            Ok(generator) => {
                self.load = Some(RunningLoad {
                    generator,
                    send_end_ns,
                    drain_ns: run.drain.as_nanos() as u64,
                });
            }
            Err(e) => self
                .handle
                .post(&mut slot, Err(format!("bad load run: {e}"))),
        }
    }

    fn finish_load(&mut self) {
        let Some(load) = self.load.take() else {
            return;
        };
        let report = LoadReport {
            stats: load.generator.stats(),
            latency: load.generator.latency().clone(),
            lag: load.generator.lag().clone(),
            reply_transit: load.generator.reply_transit().clone(),
        };
        self.stats.generator_runs += 1;
        self.stats.generator_replies += report.stats.replies;
        self.stats.generator_reordered += report.stats.reordered;
        // Blocking here is fine: the handle holds the lock for a moment.
        let mut slot = self.handle.0.lock().unwrap_or_else(|p| p.into_inner());
        self.handle.post(&mut slot, Ok(report));
    }
}
