//! What the veth tests share: iokerneld driving the host end of a
//! [`NetNs`]'s veth pair, and Ginza applications behind it.
#![allow(dead_code)] // each test binary uses a part

mod app;
pub mod raw_tcp;

pub use app::App;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ginza_iokernel::netns::NetNs;
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::{Ipv4Addr, MacAddr};
use ginza_runtime::net::NetConfig;
use ginza_runtime::{Class, Config, IokernelConfig};

/// iokerneld spins while it drives a NIC: one at a time per test binary.
pub fn lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Application `name`'s entry in iokerneld's stats.
pub fn app_stats<'a>(s: &'a ginza_proto::StatsReport, name: &str) -> &'a ginza_proto::AppStats {
    s.apps
        .iter()
        .find(|a| a.name == name)
        .unwrap_or_else(|| panic!("{name} is registered"))
}

/// Whether every thread of this process named `name` sleeps in a system
/// call (`S` in `/proc/self/task/*/stat`), and there is one.
pub fn asleep(name: &str) -> bool {
    let mut seen = false;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The state follows the parenthesised name.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state != Some('S') {
            return false;
        }
        seen = true;
    }
    seen
}

/// iokerneld on `backend:host_if` (af_xdp, af_packet); `tweak` adjusts its
/// configuration first (fault injection). Removes its directory on drop.
pub struct Daemon {
    pub iokerneld: Option<InProcess>,
    dir: PathBuf,
}

impl Daemon {
    pub fn on(ns: &NetNs, backend: &str, tweak: impl FnOnce(&mut IokConfig)) -> Daemon {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "ginza-apps-veth-{}-{backend}-{n}",
            std::process::id()
        ));
        let mut cores = ginza_sys::affinity::allowed_cpus().unwrap();
        cores.truncate(2);
        let mut cfg = IokConfig::new(cores);
        cfg.socket = dir.join("iokerneld.sock");
        cfg.idle_sleep = Some(Duration::from_millis(1));
        cfg.nic = format!("{backend}:{}", ns.host_if);
        tweak(&mut cfg);
        cfg.validate(&ginza_sys::affinity::allowed_cpus().unwrap())
            .unwrap();
        let iokerneld = InProcess::start(cfg.clone())
            .unwrap_or_else(|e| panic!("iokerneld on {}: {e}", cfg.nic));
        Daemon {
            iokerneld: Some(iokerneld),
            dir,
        }
    }

    /// iokerneld open for applications' own sockets on the namespace's
    /// host end (`af_xdp:IF,direct`, docs/direct-path.md).
    pub fn direct(ns: &NetNs) -> Daemon {
        let host_if = ns.host_if.clone();
        Daemon::on(ns, "af_xdp", |cfg| {
            cfg.nic = format!("af_xdp:{host_if},direct");
        })
    }

    pub fn get(&self) -> &InProcess {
        self.iokerneld.as_ref().expect("running")
    }

    /// Starts a Ginza runtime at `ip`/`mac` running `main` and waits until
    /// it has registered as `name`.
    pub fn start_app<T, F>(
        &self,
        name: &str,
        mac: MacAddr,
        ip: Ipv4Addr,
        kthreads: usize,
        main: F,
    ) -> App<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.start_app_with(name, NetConfig::new(mac, ip), kthreads, main)
    }

    /// [`Daemon::start_app`] with a network configuration of its own (TCP
    /// tunables, static ARP entries).
    pub fn start_app_with<T, F>(
        &self,
        name: &str,
        net: NetConfig,
        kthreads: usize,
        main: F,
    ) -> App<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.start_app_tuned(name, Some(net), kthreads, |_| {}, main)
    }

    /// [`Daemon::start_app_with`] with `tune` adjusting the registration
    /// first (class, idle behaviour); `net` may be `None` (no network).
    pub fn start_app_tuned<T, F>(
        &self,
        name: &str,
        net: Option<NetConfig>,
        kthreads: usize,
        tune: impl FnOnce(&mut IokernelConfig),
        main: F,
    ) -> App<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut io = IokernelConfig::new(name, Class::LatencyCritical);
        io.socket = Some(self.get().socket().to_path_buf());
        io.net = net;
        tune(&mut io);
        let config = Config {
            iokernel: Some(io),
            ..Config::with_kthreads(kthreads)
        };
        let app = App::spawn(config, main);
        let t0 = Instant::now();
        while !self
            .get()
            .stats()
            .is_ok_and(|s| s.apps.iter().any(|a| a.name == name))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(10) && !app.is_finished(),
                "{name} did not register"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        app
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        drop(self.iokerneld.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
