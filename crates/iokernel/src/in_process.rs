//! iokerneld on a thread of the calling process, with the Linux actuator:
//! for the demo, benchmarks and tests, which need a real iokerneld next to
//! the applications they start.

use std::io;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use ginza_proto::client::{self, ClientError};
use ginza_proto::StatsReport;

use crate::dataplane::{FaultsHandle, GeneratorHandle};
use crate::{Config, DaemonError, Iokerneld, LinuxActuator, StopHandle};

/// A running in-process iokerneld; stopped (and joined) on drop.
pub struct InProcess {
    stop: StopHandle,
    generator: GeneratorHandle,
    faults: FaultsHandle,
    thread: Option<JoinHandle<Result<StatsReport, DaemonError>>>,
    socket: PathBuf,
    metrics: Option<std::net::SocketAddr>,
}

impl InProcess {
    /// Binds `cfg.socket` and runs the loop on a new thread (pinned to
    /// `cfg.own_core` by the loop itself). `cfg` must be validated.
    pub fn start(cfg: Config) -> Result<InProcess, DaemonError> {
        let socket = cfg.socket.clone();
        let actuator = LinuxActuator::for_config(&cfg).map_err(|source| DaemonError::Socket {
            op: "reading this process's CPU affinity for",
            path: socket.clone(),
            source,
        })?;
        let d = Iokerneld::bind(cfg, actuator)?;
        let stop = d.stop_handle();
        let generator = d.generator();
        let faults = d.faults_handle();
        let metrics = d.metrics_addr();
        let thread = std::thread::Builder::new()
            .name("iokerneld".into())
            .spawn(move || d.run())
            .map_err(|source| DaemonError::Socket {
                op: "starting the iokerneld thread for",
                path: socket.clone(),
                source,
            })?;
        Ok(InProcess {
            stop,
            generator,
            faults,
            thread: Some(thread),
            socket,
            metrics,
        })
    }

    /// Stops the loop from anywhere (the thread is joined on drop).
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The software NIC's traffic generator.
    pub fn generator(&self) -> &GeneratorHandle {
        &self.generator
    }

    /// Changes fault injection while it runs (`cfg.faults` sets it from
    /// the start): `d.faults().set_specs(&["drop=5%,port=trunk"])`.
    pub fn faults(&self) -> &FaultsHandle {
        &self.faults
    }

    /// Where its metrics are served (`cfg.metrics`; port 0 resolved).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn stats(&self) -> Result<StatsReport, ClientError> {
        client::stats(&self.socket)
    }

    /// Stops the loop; its final stats.
    pub fn stop(mut self) -> Result<StatsReport, DaemonError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<StatsReport, DaemonError> {
        self.stop.stop();
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(DaemonError::Poll(io::Error::other("iokerneld panicked")))),
            None => Err(DaemonError::Poll(io::Error::other("already stopped"))),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop_and_join();
        }
    }
}
