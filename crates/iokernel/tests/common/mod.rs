//! An in-process iokerneld for the integration tests: on a thread of the
//! test, with `idle_sleep` so that it sleeps when idle, and a lock that
//! serializes the tests that start one (its loop spins while anything holds
//! a core).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ginza_iokernel::{Config, CoreActuator, FaultsHandle, GeneratorHandle, Iokerneld, StopHandle};
use ginza_proto::{client, StatsReport};

static LOCK: Mutex<()> = Mutex::new(());
static COUNTER: AtomicU32 = AtomicU32::new(0);

pub fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub use ginza_iokernel::testing::test_cores;

pub struct Daemon {
    stop: StopHandle,
    thread: Option<JoinHandle<StatsReport>>,
    pub socket: PathBuf,
    #[allow(dead_code)] // not every test binary needs it
    pub generator: GeneratorHandle,
    #[allow(dead_code)] // not every test binary needs it
    pub faults: FaultsHandle,
    /// Where its metrics are served, if `Config::metrics` was set.
    #[allow(dead_code)] // not every test binary needs it
    pub metrics: Option<std::net::SocketAddr>,
    dir: PathBuf,
}

impl Daemon {
    #[allow(dead_code)] // not every test binary needs it
    pub fn start<A: CoreActuator + Send + 'static>(actuator: A) -> Daemon {
        Self::start_with(actuator, |_| {})
    }

    pub fn start_with<A: CoreActuator + Send + 'static>(
        actuator: A,
        tweak: impl FnOnce(&mut Config),
    ) -> Daemon {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ginza-iok-{}-{n}", std::process::id()));
        let socket = dir.join("iokerneld.sock");
        let mut cfg = Config::new(test_cores());
        cfg.socket = socket.clone();
        cfg.idle_sleep = Some(Duration::from_millis(1));
        tweak(&mut cfg);
        cfg.validate(&ginza_sys::affinity::allowed_cpus().unwrap())
            .unwrap();
        let d = Iokerneld::bind(cfg, actuator).unwrap();
        let stop = d.stop_handle();
        let generator = d.generator();
        let faults = d.faults_handle();
        let metrics = d.metrics_addr();
        let thread = std::thread::spawn(move || d.run().unwrap());
        Daemon {
            stop,
            thread: Some(thread),
            socket,
            generator,
            faults,
            metrics,
            dir,
        }
    }

    pub fn stats(&self) -> StatsReport {
        client::stats(&self.socket).unwrap()
    }

    /// Polls the stats until `f` holds (20 s at most: a deadline that only
    /// a broken iokerneld reaches, even on a loaded 2-CPU machine).
    pub fn wait_for(&self, what: &str, f: impl Fn(&StatsReport) -> bool) -> StatsReport {
        let t0 = Instant::now();
        loop {
            let s = self.stats();
            if f(&s) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}; stats: {s:#?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until iokerneld has run `n` more allocation passes than when
    /// asked, and returns its stats then. Its loop answers the stats request,
    /// then polls the dataplane and runs a pass, one after the other on one
    /// thread: whatever the test did before calling this has been through
    /// at least `n - 1` whole iterations (packets steered, commands read,
    /// allocation decided). So "nothing happened" is checked after counted
    /// passes, not after a guessed sleep.
    #[allow(dead_code)] // not every test binary needs it
    pub fn wait_passes(&self, n: u64) -> StatsReport {
        let from = self.stats().passes;
        self.wait_for(&format!("{n} allocation passes after pass {from}"), |s| {
            s.passes >= from + n
        })
    }

    /// Stops iokerneld; its final stats.
    #[allow(dead_code)] // not every test binary needs it
    pub fn finish(mut self) -> StatsReport {
        self.stop.stop();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
