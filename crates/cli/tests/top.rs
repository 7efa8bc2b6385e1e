//! `ginza top` against a real iokerneld, started as `ginza iokernel` (so
//! this also checks that the subcommand runs the daemon).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ginza_proto::client;
use ginza_proto::messages::{Class, Registration};
use ginza_shm::{Region, RegionConfig};

const GINZA: &str = env!("CARGO_BIN_EXE_ginza");

/// The daemon and its temporary directory; killed and removed on drop, so
/// a failed assertion does not leave an iokerneld behind.
struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    fn start(name: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("ginza-top-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("s.sock");
        // One CPU this process may use (the machine may have only two);
        // `--no-pin` and `--idle-sleep` keep the daemon from hogging it.
        let core = ginza_sys::affinity::allowed_cpus().unwrap()[0].to_string();
        let child = Command::new(GINZA)
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

fn top(socket: &Path, extra: &[&str]) -> Output {
    Command::new(GINZA)
        .args(["top", "--once"])
        .args(extra)
        .arg("--socket")
        .arg(socket)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn top_shows_a_registered_application() {
    let d = Daemon::start("app");
    let region = Region::create("top-test", &RegionConfig::new(2)).unwrap();
    let efds = [
        ginza_sys::eventfd::new().unwrap(),
        ginza_sys::eventfd::new().unwrap(),
    ];
    let reg = Registration {
        name: "top-test".into(),
        class: Class::LatencyCritical,
        guaranteed: 1,
        max_cores: 2,
        kthreads: 2,
        net: None,
        steering: None,
        dispatch: None,
        wake_page: false,
        bell: false,
    };
    let conn = client::register_region(&d.socket, &reg, &region, &efds).unwrap();

    let out = top(&d.socket, &[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("policy shenango"), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("top-test"))
        .unwrap_or_else(|| panic!("no row for the application:\n{stdout}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], std::process::id().to_string(), "pid: {row}");
    assert_eq!(cols[2], "latency-critical", "{row}");
    assert_eq!(cols[4], "1/2", "guaranteed/max: {row}");
    assert_eq!(cols[7], "2/2", "parked/kthreads: {row}");

    let out = top(&d.socket, &["--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["stats"]["apps"][0]["name"], "top-test", "{stdout}");
    assert_eq!(v["rates"][0]["app_id"], conn.app_id(), "{stdout}");
    assert!(v["window_ns"].as_u64().is_some_and(|w| w > 0), "{stdout}");
    drop(conn);
}

#[test]
fn top_without_iokerneld_names_the_socket() {
    let out = top(Path::new("/nonexistent"), &[]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stderr.contains("cannot reach iokerneld at /nonexistent"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
