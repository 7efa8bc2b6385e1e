//! What several test binaries share: an in-process iokerneld (tests that
//! start one hold `lock()`: its loop spins while anything holds a core)
//! and child applications. Tests that run a standalone runtime only hold
//! `share()`: they may run beside each other, never beside a `lock()` test,
//! whose load and timing checks need the CPUs.

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_proto::{client, StatsReport};
use ginza_runtime::net::NetConfig;
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

pub use ginza_iokernel::testing::test_cores as cores;

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

    /// A latency-critical runtime with `net`, registered with this
    /// iokerneld, no core guaranteed.
    #[allow(dead_code)] // not every test binary needs it
    pub fn net_app(&self, name: &str, kthreads: usize, net: NetConfig) -> Config {
        let mut cfg = self.app(name, Class::LatencyCritical, 0, kthreads);
        if let Some(io) = cfg.iokernel.as_mut() {
            io.net = Some(net);
        }
        cfg
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

/// The host numbered `last` on the software switch of a test's iokerneld
/// (each test has a daemon, and so a network, of its own).
#[allow(dead_code)] // not every test binary needs it
pub fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x47, 0x00, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 9, 0, last),
    }
}

/// The hosts the TCP tests' server and client applications are.
#[allow(dead_code)] // not every test binary needs it
pub const SERVER: u8 = 1;
#[allow(dead_code)] // not every test binary needs it
pub const CLIENT: u8 = 2;

/// The server's `port`.
#[allow(dead_code)] // not every test binary needs it
pub fn server_addr(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(iface(SERVER).ip, port)
}

/// Host `last`'s networking, with timers short enough that a lost segment
/// is sent again within milliseconds and buffers small enough (64 KiB)
/// that a writer fills its send buffer quickly.
#[allow(dead_code)] // not every test binary needs it
pub fn quick_net(last: u8) -> NetConfig {
    let me = iface(last);
    let mut n = NetConfig::new(me.mac, me.ip);
    n.tcp.rto_initial = Duration::from_millis(100);
    n.tcp.rto_min = Duration::from_millis(20);
    n.tcp.rto_max = Duration::from_millis(200);
    n.tcp.time_wait = Duration::from_millis(200);
    n.tcp.send_buffer = 64 * 1024;
    n.tcp.recv_buffer = 64 * 1024;
    n.tcp.reassembly_limit = 64 * 1024;
    n
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
