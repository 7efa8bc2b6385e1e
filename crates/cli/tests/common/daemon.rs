//! An iokerneld for a test, started as `ginza iokernel` (so the tests
//! also check that the subcommand runs the daemon), on one CPU with
//! `--no-pin` and `--idle-sleep` so that it does not hog it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ginza_proto::client;

/// The daemon and its temporary directory; killed and removed on drop, so
/// a failed assertion does not leave an iokerneld behind.
pub struct Daemon {
    child: Child,
    dir: PathBuf,
    pub socket: PathBuf,
}

impl Daemon {
    pub fn start(name: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("ginza-daemon-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("s.sock");
        // One CPU this process may use (the machine may have only two);
        // `--no-pin` and `--idle-sleep` keep the daemon from hogging it.
        let core = ginza_sys::affinity::allowed_cpus().unwrap()[0].to_string();
        let child = Command::new(env!("CARGO_BIN_EXE_ginza"))
            .args([
                "iokernel",
                "--idle-sleep",
                "1ms",
                "--no-pin",
                "--cores",
                &core,
            ])
            .arg("--socket")
            .arg(&socket)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut d = Daemon { child, dir, socket };
        d.wait_ready();
        d
    }

    /// Until the socket answers a stats request (or the daemon died).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if client::stats(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                panic!("ginza iokernel exited with {status}: {err}");
            }
            assert!(Instant::now() < deadline, "iokerneld did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
