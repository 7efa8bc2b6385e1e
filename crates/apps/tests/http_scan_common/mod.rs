//! What the http-server and scan-server tests share: an in-process
//! iokerneld with no NIC (its software switch only), Ginza applications
//! registered with it, and a Ginza TCP connect that waits for the server
//! to listen.
#![allow(dead_code)] // each test binary uses a part

#[path = "../common/app.rs"]
mod app;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::{Ipv4Addr, MacAddr};
use ginza_runtime::net::{NetConfig, TcpStream};
use ginza_runtime::{Class, Config, IokernelConfig};

pub use app::App;

/// iokerneld spins while it runs: one test at a time per test binary.
pub fn lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// An address on the switch: `10.13.0.last`.
pub fn iface(last: u8) -> (MacAddr, Ipv4Addr) {
    (
        MacAddr([0x02, 0x13, 0x00, 0x00, 0x00, last]),
        Ipv4Addr::new(10, 13, 0, last),
    )
}

/// iokerneld on a thread of the test, its software switch only.
pub struct Switch {
    iokerneld: Option<InProcess>,
    socket: PathBuf,
    dir: PathBuf,
}

impl Switch {
    pub fn start() -> Switch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ginza-http-scan-{}-{n}", std::process::id()));
        let mut cores = ginza_sys::affinity::allowed_cpus().unwrap();
        cores.truncate(2);
        let mut cfg = IokConfig::new(cores);
        cfg.socket = dir.join("iokerneld.sock");
        cfg.idle_sleep = Some(Duration::from_millis(1));
        cfg.validate(&ginza_sys::affinity::allowed_cpus().unwrap())
            .unwrap();
        let socket = cfg.socket.clone();
        Switch {
            iokerneld: Some(InProcess::start(cfg).expect("iokerneld")),
            socket,
            dir,
        }
    }

    pub fn get(&self) -> &InProcess {
        self.iokerneld.as_ref().expect("running")
    }

    /// A latency-critical runtime at `iface(last)` registered as `name`.
    pub fn config(&self, name: &str, last: u8, kthreads: usize) -> Config {
        let (mac, ip) = iface(last);
        let mut io = IokernelConfig::new(name, Class::LatencyCritical);
        io.socket = Some(self.socket.clone());
        io.net = Some(NetConfig::new(mac, ip));
        Config {
            iokernel: Some(io),
            ..Config::with_kthreads(kthreads)
        }
    }

    /// Starts a runtime at `iface(last)` running `main` on its own thread
    /// and waits until it has registered as `name`.
    pub fn start_app<T, F>(&self, name: &str, last: u8, kthreads: usize, main: F) -> App<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let config = self.config(name, last, kthreads);
        let app = App::spawn(config, main);
        self.wait_registered(name, || app.is_finished());
        app
    }

    /// Waits (at most 10 s, and while `gone()` is false) until an
    /// application has registered as `name`.
    pub fn wait_registered(&self, name: &str, gone: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !self
            .get()
            .stats()
            .is_ok_and(|s| s.apps.iter().any(|a| a.name == name))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(10) && !gone(),
                "{name} did not register"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs `body` on a runtime at `iface(last)` on this thread.
    pub fn run_client<T, F>(&self, last: u8, body: F) -> T
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        ginza_runtime::run(self.config("client", last, 1), body).expect("the client runtime")
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        drop(self.iokerneld.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects (from a uthread) to `addr`, trying again while the server has
/// registered but not yet listens (a refused connection), for at most 10 s.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                assert!(t0.elapsed() < Duration::from_secs(10), "{addr}: {e}");
                ginza_runtime::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("connecting to {addr}: {e}"),
        }
    }
}
