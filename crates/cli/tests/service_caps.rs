//! iokerneld as its service runs it (packaging/systemd): as an ordinary
//! user holding only the unit's `AmbientCapabilities`, on AF_XDP over a
//! veth pair, with two applications of another user (root) competing for
//! its one managed core. It grants and preempts them with no refusal; the
//! same run without CAP_SYS_NICE and CAP_KILL is refused both (EPERM),
//! which is why the unit holds them.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ginza_iokernel::netns::NetNs;
use ginza_proto::client;

/// `nobody`: an unprivileged uid other than the applications' (root).
const SERVICE_UID: u32 = 65534;

/// The unit's capabilities as setpriv writes them: `+net_admin,+kill`.
fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../packaging/systemd/ginza-iokerneld.service"),
    )
    .unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("AmbientCapabilities= in the unit");
    line.split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect()
}

/// Killed on drop, so a failed assertion leaves nothing running.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs iokerneld as `SERVICE_UID` with `caps`, two loadgens against it
/// until both were granted and preempted (or a deadline), and returns
/// iokerneld's log and whether both were.
fn run_with(caps: &[String], ns: &NetNs, dir: &Path, cpus: &[usize]) -> (String, bool) {
    let run = dir.join(caps.len().to_string());
    std::fs::create_dir_all(&run).unwrap();
    std::os::unix::fs::chown(&run, Some(SERVICE_UID), Some(SERVICE_UID)).unwrap();
    let socket = run.join("iokerneld.sock");
    let log = run.join("log");
    let caps = format!("-all,{}", caps.join(","));
    let ginza = env!("CARGO_BIN_EXE_ginza");
    let iokerneld = Command::new("setpriv")
        .args([
            &format!("--reuid={SERVICE_UID}"),
            &format!("--regid={SERVICE_UID}"),
            "--clear-groups",
            &format!("--inh-caps={caps}"),
            &format!("--ambient-caps={caps}"),
            ginza,
            "iokernel",
            "--nic",
            &format!("af_xdp:{}", ns.host_if),
            "--core",
            &cpus[0].to_string(),
            "--cores",
            &cpus[1].to_string(),
        ])
        .arg("--socket")
        .arg(&socket)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut iokerneld = Killed(iokerneld);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client::stats(&socket).is_err() {
        if let Some(status) = iokerneld.0.try_wait().unwrap() {
            panic!(
                "iokerneld exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        assert!(Instant::now() < deadline, "iokerneld did not come up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let apps: Vec<Killed> = (1..=2)
        .map(|n| {
            Killed(
                Command::new(ginza)
                    .args(["loadgen", "--backend", "ginza", "--ginza-socket"])
                    .arg(&socket)
                    .args([
                        "--ginza-name",
                        &format!("lg{n}"),
                        "--ginza-ip",
                        &format!("10.47.15.{n}"),
                        "--ginza-mac",
                        &format!("02:47:5a:00:0f:0{n}"),
                        "--target",
                        "10.47.15.99:7",
                        "--rate",
                        "20k",
                        "--duration",
                        "5s",
                        "--timeout",
                        "10ms",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    // Until both applications were granted the core and preempted.
    let served = loop {
        let both = client::stats(&socket).is_ok_and(|s| {
            s.apps.len() == 2 && s.apps.iter().all(|a| a.grants > 0 && a.preemptions > 0)
        });
        if both || Instant::now() > deadline + Duration::from_secs(5) {
            break both;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(apps);
    drop(iokerneld);
    (std::fs::read_to_string(&log).unwrap(), served)
}

#[test]
fn the_units_capabilities_let_an_unprivileged_iokerneld_serve_other_users() {
    if !common::two_cpus("an iokerneld on its own core and a managed one") {
        return;
    }
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    if Command::new("setpriv").arg("--version").output().is_err() {
        ginza_iokernel::testing::skip("setpriv (util-linux) is not installed");
        return;
    }
    let cpus = ginza_sys::affinity::allowed_cpus().unwrap();
    let dir: PathBuf = common::out_dir("service-caps");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();

    let caps = unit_capabilities();
    let (log, served) = run_with(&caps, &ns, &dir, &cpus);
    assert!(
        served,
        "the applications were not both granted and preempted: {log}"
    );
    assert!(!log.contains("Operation not permitted"), "{log}");

    let fewer: Vec<String> = caps
        .iter()
        .filter(|c| *c != "+sys_nice" && *c != "+kill")
        .cloned()
        .collect();
    assert_eq!(fewer.len(), caps.len() - 2, "{caps:?}");
    let (log, _) = run_with(&fewer, &ns, &dir, &cpus);
    for refused in ["grant of cpu", "preempting app"] {
        assert!(
            log.lines()
                .any(|l| l.contains(refused) && l.contains("Operation not permitted")),
            "no refused {refused:?} without CAP_SYS_NICE and CAP_KILL: {log}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
