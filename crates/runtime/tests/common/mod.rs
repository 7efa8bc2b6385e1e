//! What several test binaries share.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A child process running one test of the current test binary, killed
/// and reaped on drop.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Re-executes this test binary as a child that runs only `test`, with
/// `env_key` set to iokerneld's socket.
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
