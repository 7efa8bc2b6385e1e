//! The service unit under a real systemd (docs/operations.md, "Under a
//! real systemd"). This machine's PID 1 need not be systemd: the test
//! boots one as PID 1 of a throw-away container (`unshare` + a private
//! root, `packaging/test/boot-systemd`), where `packaging/install-service`
//! installs the `ginza` binary of this build, the unit, the user and the
//! configuration as on a real host. Then, through systemd itself:
//!
//! * `systemctl start ginza-iokerneld` brings iokerneld up as the user
//!   `ginza`, with exactly the unit's capabilities (effective, permitted,
//!   ambient and bounding sets) and its socket at `/run/ginza`;
//! * an application (`ginza loadgen --backend ginza`, as root, with no
//!   socket named) registers through the default socket path;
//! * `kill -9` of iokerneld makes systemd restart it (`Restart=on-failure`):
//!   a new main process, `NRestarts=1`, a socket that answers again.
//!
//! Skips (and fails under `CI=true` as root) where the container cannot
//! be made: not root, no systemd, `unshare`, `nsenter` or `setpriv`
//! missing. iokerneld busy-polls a core: run it under the heavy-test lock.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ginza_iokernel::testing::{running_as_root, skip};
use ginza_proto::client;

const BOOT_WAIT: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(30);
const UNIT: &str = "ginza-iokerneld";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The unit's capabilities as a capability mask (`AmbientCapabilities=`).
fn unit_capability_mask() -> u64 {
    let unit =
        std::fs::read_to_string(repo().join("packaging/systemd/ginza-iokerneld.service")).unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("AmbientCapabilities= in the unit");
    line.split_whitespace()
        .map(|c| match c {
            "CAP_KILL" => 5,
            "CAP_NET_ADMIN" => 12,
            "CAP_NET_RAW" => 13,
            "CAP_IPC_LOCK" => 14,
            "CAP_SYS_NICE" => 23,
            "CAP_BPF" => 39,
            other => panic!("the test does not know {other}'s number"),
        })
        .fold(0, |m, bit| m | 1 << bit)
}

/// What keeps the test from booting a container here, if anything.
fn missing_prerequisite() -> Option<String> {
    if !running_as_root() {
        return Some("booting systemd in a container needs root".into());
    }
    if !Path::new("/lib/systemd/systemd").exists() {
        return Some("systemd is not installed (/lib/systemd/systemd)".into());
    }
    for tool in [
        "unshare",
        "nsenter",
        "setpriv",
        "chroot",
        "systemd-sysusers",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// The booted container: systemd's pid on the host, killed (and with it
/// everything in the container's PID namespace) on drop.
struct Container {
    unshare: Child,
    systemd: u32,
    dir: PathBuf,
}

impl Container {
    fn boot(ginza: &Path) -> Container {
        let dir = std::env::temp_dir().join(format!("ginza-systemd-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let log = std::fs::File::create(dir.join("boot.log")).unwrap();
        let unshare = Command::new("unshare")
            .args(["--pid", "--fork", "--mount", "--net", "--uts", "--ipc"])
            .arg(repo().join("packaging/test/boot-systemd"))
            .arg(&root)
            .arg(ginza)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("unshare");
        let mut c = Container {
            systemd: 0,
            unshare,
            dir,
        };
        // The forked child becomes systemd once the script execs it.
        let children = format!("/proc/{0}/task/{0}/children", c.unshare.id());
        let t0 = Instant::now();
        loop {
            let child = std::fs::read_to_string(&children)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok());
            if let Some(pid) = child {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.trim() == "systemd" {
                    c.systemd = pid;
                    break;
                }
            }
            if let Ok(Some(status)) = c.unshare.try_wait() {
                panic!("the container did not boot ({status}):\n{}", c.log());
            }
            assert!(
                t0.elapsed() < BOOT_WAIT,
                "systemd did not start:\n{}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("boot.log")).unwrap_or_default()
    }

    /// A command run inside the container (its namespaces and root).
    fn run(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.systemd.to_string()])
            .args(["-m", "-p", "-n", "-u", "-i", "-r", "-w", "--"])
            .args(args)
            .output()
            .expect("nsenter")
    }

    fn stdout(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.run(args).stdout)
            .trim()
            .to_string()
    }

    /// `systemctl show -p NAME --value` of the unit.
    fn property(&self, name: &str) -> String {
        self.stdout(&["systemctl", "show", "-p", name, "--value", UNIT])
    }

    /// A path inside the container, from the host.
    fn path(&self, p: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{p}", self.systemd))
    }

    fn main_pid(&self) -> u32 {
        self.property("MainPID").parse().unwrap_or(0)
    }

    /// Waits until the unit runs a main process other than `not` whose
    /// socket answers; its pid (in the container).
    fn wait_until_serving(&self, not: u32) -> u32 {
        let socket = self.path("/run/ginza/iokerneld.sock");
        let t0 = Instant::now();
        loop {
            let pid = self.main_pid();
            if pid != 0
                && pid != not
                && self.property("ActiveState") == "active"
                && client::stats(&socket).is_ok()
            {
                return pid;
            }
            assert!(
                t0.elapsed() < WAIT,
                "iokerneld is not serving (MainPID {pid}):\n{}",
                self.stdout(&["journalctl", "-u", UNIT, "--no-pager", "-n", "40"])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.systemd != 0 {
            // PID 1 of the namespace: its death ends every process in it
            // and, with the mount namespace, the container's mounts.
            let _ = Command::new("kill")
                .args(["-9", &self.systemd.to_string()])
                .status();
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `Name:\t...` of a `/proc/PID/status` text.
fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
        .trim()
}

#[test]
fn the_unit_runs_under_systemd_with_its_capabilities_and_is_restarted() {
    if let Some(why) = missing_prerequisite() {
        skip(why);
        return;
    }
    let c = Container::boot(Path::new(env!("CARGO_BIN_EXE_ginza")));
    // The boot ends running (or degraded: some unit of the copy of /etc
    // failed; the service does not depend on it).
    let t0 = Instant::now();
    let state = loop {
        let s = c.stdout(&["systemctl", "is-system-running"]);
        if s == "running" || s == "degraded" {
            break s;
        }
        assert!(
            t0.elapsed() < BOOT_WAIT,
            "systemd did not finish booting ({s}):\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("systemd booted: {state}");
    let start = c.run(&["systemctl", "start", UNIT]);
    assert!(
        start.status.success(),
        "systemctl start: {}",
        String::from_utf8_lossy(&start.stderr)
    );
    let first = c.wait_until_serving(0);

    // The unit's user and exactly its capabilities.
    let status = std::fs::read_to_string(c.path(&format!("/proc/{first}/status"))).unwrap();
    let passwd = std::fs::read_to_string(c.path("/etc/passwd")).unwrap();
    let ginza_uid = passwd
        .lines()
        .find_map(|l| l.strip_prefix("ginza:x:")?.split(':').next())
        .expect("the user ginza made by systemd-sysusers");
    assert_ne!(ginza_uid, "0");
    assert!(
        status_field(&status, "Uid")
            .split_whitespace()
            .all(|u| u == ginza_uid),
        "{status}"
    );
    let mask = unit_capability_mask();
    for set in ["CapEff", "CapPrm", "CapAmb", "CapBnd"] {
        let v = u64::from_str_radix(status_field(&status, set), 16).unwrap();
        assert_eq!(v, mask, "{set} {v:#x}, the unit grants {mask:#x}");
    }
    let run_dir = c.path("/run/ginza");
    let meta = std::fs::metadata(&run_dir).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o750
    );

    // An application of root finds it at the default path.
    let mut app = Command::new("nsenter")
        .args(["-t", &c.systemd.to_string()])
        .args(["-m", "-p", "-n", "-u", "-i", "-r", "-w", "--"])
        .args(["/usr/local/bin/ginza", "loadgen", "--backend", "ginza"])
        .args(["--ginza-name", "via-service", "--ginza-ip", "10.47.16.1"])
        .args([
            "--ginza-mac",
            "02:47:5a:00:10:01",
            "--target",
            "10.47.16.99:7",
        ])
        .args(["--rate", "1k", "--duration", "20s", "--timeout", "10ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let socket = c.path("/run/ginza/iokerneld.sock");
    let t0 = Instant::now();
    while !client::stats(&socket).is_ok_and(|s| s.apps.iter().any(|a| a.name == "via-service")) {
        if let Ok(Some(st)) = app.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(app.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the application ended ({st}) without registering: {err}");
        }
        assert!(t0.elapsed() < WAIT, "the application did not register");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = app.kill();
    let _ = app.wait();

    // kill -9: systemd restarts it.
    let killed_at = Instant::now();
    let kill = c.run(&["kill", "-9", &first.to_string()]);
    assert!(kill.status.success());
    let second = c.wait_until_serving(first);
    let back_after = killed_at.elapsed();
    assert_ne!(second, first);
    assert_eq!(c.property("NRestarts"), "1");
    let after = client::stats(&socket).unwrap();
    assert!(
        after.apps.is_empty(),
        "a new iokerneld starts with no application"
    );
    println!(
        "iokerneld pid {first} killed; systemd restarted it as pid {second}, serving again after {:.2} s (RestartSec=1s)",
        back_after.as_secs_f64()
    );
}
