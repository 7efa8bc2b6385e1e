//! The runtime under a real iokerneld (in-process, on a thread, with the
//! Linux actuator: affinity, eventfds, preemption signals).
//!
//! Tests hold `LOCK`: iokerneld spins while anything holds a core, and this
//! machine may have only two.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ginza_iokernel::{
    client, Config as IokConfig, Iokerneld, LinuxActuator, StatsReport, StopHandle,
};
use ginza_runtime::{Class, Config, Handle, IokernelConfig};

static LOCK: Mutex<()> = Mutex::new(());
static COUNTER: AtomicU32 = AtomicU32::new(0);

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Up to two CPUs this process may use: the managed cores.
fn cores() -> Vec<usize> {
    let mut c = ginza_iokernel::util::allowed_cpus().unwrap();
    c.truncate(2);
    c
}

struct Daemon {
    stop: StopHandle,
    thread: Option<JoinHandle<StatsReport>>,
    socket: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    fn start(tweak: impl FnOnce(&mut IokConfig)) -> Daemon {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ginza-rt-iok-{}-{n}", std::process::id()));
        let socket = dir.join("iokerneld.sock");
        let mut cfg = IokConfig::new(cores());
        cfg.socket = socket.clone();
        cfg.idle_sleep = Some(Duration::from_millis(1));
        tweak(&mut cfg);
        cfg.validate(&ginza_iokernel::util::allowed_cpus().unwrap())
            .unwrap();
        let actuator = LinuxActuator::for_config(&cfg).unwrap();
        let d = Iokerneld::bind(cfg, actuator).unwrap();
        let stop = d.stop_handle();
        let thread = std::thread::spawn(move || d.run().unwrap());
        Daemon {
            stop,
            thread: Some(thread),
            socket,
            dir,
        }
    }

    fn stats(&self) -> StatsReport {
        client::stats(&self.socket).unwrap()
    }

    fn app(&self, name: &str, class: Class, guaranteed: u32, kthreads: usize) -> Config {
        let mut io = IokernelConfig::new(name, class);
        io.socket = Some(self.socket.clone());
        io.guaranteed = guaranteed;
        Config {
            iokernel: Some(io),
            ..Config::with_kthreads(kthreads)
        }
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

fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[test]
fn a_registered_runtime_runs_its_uthreads_on_granted_cores() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let cfg = d.app("sum", Class::LatencyCritical, 0, 2);
    let socket = d.socket.clone();
    let (sum, stats) = ginza_runtime::run(cfg, move || {
        let h = Handle::current().unwrap();
        assert!(h.managed());
        let st = client::stats(&socket).unwrap();
        let me = st
            .apps
            .iter()
            .find(|a| a.name == "sum")
            .expect("registered");
        assert!(
            me.cores_now >= 1,
            "the main uthread runs on a granted core: {me:?}"
        );
        let hs: Vec<_> = (0..200u64)
            .map(|i| {
                ginza_runtime::spawn(move || {
                    spin_for(Duration::from_micros(20));
                    i
                })
            })
            .collect();
        let sum: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        (sum, h.stats())
    })
    .unwrap();
    assert_eq!(sum, 199 * 200 / 2);
    let grants: u64 = stats.iter().map(|k| k.grants).sum();
    assert!(grants >= 1, "{stats:?}");
    // Deregistered on exit.
    let st = d.stats();
    assert!(st.apps.iter().all(|a| a.name != "sum"), "{st:?}");
}
