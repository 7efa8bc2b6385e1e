//! What several test binaries share: an in-process iokerneld (tests that
//! start one hold `lock()`: its loop spins while anything holds a core)
//! and child applications. Tests that run a standalone runtime only hold
//! `share()`: they may run beside each other, never beside a `lock()` test,
//! whose load and timing checks need the CPUs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_proto::{client, StatsReport};
use ginza_runtime::{Class, Config, IokernelConfig};

static LOCK: RwLock<()> = RwLock::new(());
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// For a test that starts iokerneld: it runs alone.
pub fn lock() -> RwLockWriteGuard<'static, ()> {
    LOCK.write().unwrap_or_else(|e| e.into_inner())
}

/// For a test with a standalone runtime only: it runs beside other such
/// tests, never beside one holding [`lock`].
#[allow(dead_code)] // not every test binary needs it
pub fn share() -> RwLockReadGuard<'static, ()> {
    LOCK.read().unwrap_or_else(|e| e.into_inner())
}

/// Up to two CPUs this process may use: the managed cores.
pub fn cores() -> Vec<usize> {
    let mut c = ginza_sys::affinity::allowed_cpus().unwrap();
    c.truncate(2);
    c
}

/// iokerneld on a thread of the test, with its own socket directory.
pub struct Daemon {
    pub io: Option<InProcess>,
    pub socket: PathBuf,
    pub dir: PathBuf,
}

impl Daemon {
    pub fn start(tweak: impl FnOnce(&mut IokConfig)) -> Daemon {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ginza-rt-iok-{}-{n}", std::process::id()));
        let socket = dir.join("iokerneld.sock");
        let mut cfg = IokConfig::new(cores());
        cfg.socket = socket.clone();
        cfg.idle_sleep = Some(Duration::from_millis(1));
        tweak(&mut cfg);
        cfg.validate(&ginza_sys::affinity::allowed_cpus().unwrap())
            .unwrap();
        Daemon {
            io: Some(InProcess::start(cfg).unwrap()),
            socket,
            dir,
        }
    }

    #[allow(dead_code)] // not every test binary needs it
    pub fn stats(&self) -> StatsReport {
        client::stats(&self.socket).unwrap()
    }

    /// The configuration of a runtime registering with this iokerneld.
    pub fn app(&self, name: &str, class: Class, guaranteed: u32, kthreads: usize) -> Config {
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
        drop(self.io.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child process running one test of the current test binary, killed
/// and reaped on drop.
#[allow(dead_code)] // not every test binary needs it
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Re-executes this test binary as a child that runs only `test`, with
/// `env_key` set to iokerneld's socket.
#[allow(dead_code)] // not every test binary needs it
pub fn spawn_test_child(test: &str, env_key: &str, socket: &Path) -> Reap {
    Reap(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(env_key, socket)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}
