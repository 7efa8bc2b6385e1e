//! `ginza doctor` run as a user runs it, each line checked against what
//! this machine really has: the CPUs against `available_parallelism` and
//! the affinity mask, memlock against `getrlimit`, the capabilities
//! against this process's `CapEff`, a running iokerneld, and AF_XDP on a
//! veth pair (root); the exit status follows the failures.

mod common;

use std::process::{Command, Output};

use common::daemon::Daemon;
use ginza_iokernel::netns::NetNs;
use serde_json::Value;

/// `ginza doctor ARGS` (a short wake measurement), through `wrap` (a
/// command that runs the rest, e.g. `prlimit ...`) if any.
fn doctor(wrap: &[&str], args: &[&str]) -> Output {
    let ginza = env!("CARGO_BIN_EXE_ginza");
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(ginza);
            c
        }
        None => Command::new(ginza),
    };
    cmd.args(["doctor", "--wake-rounds", "20"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

/// The `--json` report and the exit status.
fn report(wrap: &[&str], args: &[&str]) -> (Value, Option<i32>) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = doctor(wrap, &all);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out.status.code())
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check: {report}"))
}

fn verdict(report: &Value, name: &str) -> String {
    check(report, name)["verdict"].as_str().unwrap().to_string()
}

/// A socket nobody listens on, so the result does not depend on an
/// iokerneld that happens to run here.
fn no_socket() -> String {
    std::env::temp_dir()
        .join(format!("ginza-doctor-none-{}.sock", std::process::id()))
        .display()
        .to_string()
}

fn cap_eff() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap();
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

const CAP_IPC_LOCK: u64 = 1 << 14;

#[test]
fn every_line_says_what_this_machine_has() {
    let socket = no_socket();
    let (r, status) = report(&[], &["--socket", &socket]);

    let cpus = &check(&r, "cpus")["data"];
    let parallelism = std::thread::available_parallelism().unwrap().get();
    assert_eq!(cpus["available_parallelism"], parallelism, "{cpus}");
    let allowed = ginza_sys::affinity::allowed_cpus().unwrap();
    assert_eq!(cpus["allowed"], serde_json::json!(allowed), "{cpus}");
    assert_eq!(
        cpus["online"],
        serde_json::json!(ginza_sys::topology::online_cpus().unwrap())
    );
    // One CPU for iokerneld (an isolated one if any), the others managed.
    let isolated: Vec<usize> = serde_json::from_value(cpus["isolated"].clone()).unwrap();
    let own = allowed
        .iter()
        .find(|c| isolated.contains(c))
        .unwrap_or(&allowed[0]);
    assert_eq!(cpus["iokerneld_core"], *own, "{cpus}");
    assert_eq!(cpus["managed"].as_array().unwrap().len(), allowed.len() - 1);
    let isolated_outside = isolated.iter().any(|c| !allowed.contains(c));
    let cpu_verdict = if allowed.len() >= 2 && !isolated_outside {
        "pass"
    } else {
        "warn"
    };
    assert_eq!(verdict(&r, "cpus"), cpu_verdict, "{cpus}");

    let memlock = &check(&r, "memlock")["data"];
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    assert_eq!(
        memlock["soft"],
        serde_json::json!(limit.current),
        "{memlock}"
    );
    assert_eq!(
        memlock["hard"],
        serde_json::json!(limit.maximum),
        "{memlock}"
    );
    let ipc_lock = cap_eff() & CAP_IPC_LOCK != 0;
    assert_eq!(memlock["cap_ipc_lock"], ipc_lock);
    let enough = ipc_lock || limit.current.is_none_or(|s| s >= 4 << 20);
    // No interface named: a low limit only warns.
    assert_eq!(
        verdict(&r, "memlock"),
        if enough { "pass" } else { "warn" },
        "{memlock}"
    );

    let caps = &check(&r, "caps")["data"];
    assert_eq!(caps["effective"], format!("{:016x}", cap_eff()), "{caps}");

    let reach = check(&r, "iokerneld");
    assert_eq!(reach["verdict"], "warn", "{reach}");
    assert_eq!(reach["data"]["running"], false);
    assert!(
        reach["found"].as_str().unwrap().contains(&socket),
        "{reach}"
    );

    let xdp = check(&r, "xdp");
    assert_eq!(xdp["verdict"], "warn", "{xdp}");
    assert!(xdp["found"].as_str().unwrap().starts_with("not checked"));

    let wake = &check(&r, "wake")["data"];
    assert_eq!(wake["rounds"], 20, "{wake}");
    let median = wake["median_ns"].as_u64().unwrap();
    assert!(median > 0, "{wake}");
    let expected = if median < 5_000 { "pass" } else { "warn" };
    assert_eq!(verdict(&r, "wake"), expected, "{wake}");

    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(check(&r, "kernel")["data"]["release"], release.trim());
    #[cfg(target_arch = "x86_64")]
    {
        let fsgsbase = rustix::param::linux_hwcap().1 & 2 != 0;
        assert_eq!(check(&r, "fsgsbase")["data"]["fsgsbase"], fsgsbase);
    }

    let failed = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["verdict"] == "fail");
    assert_eq!(r["iokerneld_can_run"], !failed);
    assert_eq!(status, Some(i32::from(failed)), "{r}");

    // The text: one line per check, each opening with its verdict, and
    // the summary.
    let out = doctor(&[], &["--socket", &socket]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 9, "{stdout}");
    for (line, c) in lines.iter().zip(r["checks"].as_array().unwrap()) {
        let label = c["verdict"].as_str().unwrap().to_uppercase();
        assert!(
            line.starts_with(&format!("{label}  {}", c["name"].as_str().unwrap())),
            "{line} vs {c}"
        );
    }
    assert!(lines[8].contains("failed: iokerneld"), "{stdout}");
}

#[test]
fn a_missing_interface_fails_with_its_name() {
    let socket = no_socket();
    let out = doctor(&[], &["--interface", "gzdoctorno0", "--socket", &socket]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("FAIL  xdp"))
        .unwrap_or_else(|| panic!("no failed xdp line: {stdout}"));
    assert!(
        line.contains("interface \"gzdoctorno0\" does not exist"),
        "{line}"
    );
    assert!(stdout.contains("could not run here as asked"), "{stdout}");
}

#[test]
fn a_running_iokerneld_answers() {
    let d = Daemon::start("doctor");
    let (r, _) = report(&[], &["--socket", &d.socket.display().to_string()]);
    let reach = check(&r, "iokerneld");
    assert_eq!(reach["verdict"], "pass", "{reach}");
    assert_eq!(reach["data"]["running"], true);
    assert_eq!(reach["data"]["apps"], 0);
}

/// Root and a veth pair: AF_XDP works with iokerneld's code, in both XDP
/// modes (veth has a native XDP driver); with the memlock limit cut below
/// the UMEM and CAP_IPC_LOCK dropped, the memlock line predicts the real
/// failure the AF_XDP line then sees, and the status is 1.
#[test]
fn af_xdp_on_a_veth_and_a_memlock_limit_too_low_for_it() {
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    for tool in ["prlimit", "setpriv"] {
        if Command::new(tool).arg("--version").output().is_err() {
            ginza_iokernel::testing::skip(format!("{tool} (util-linux) is not installed"));
            return;
        }
    }
    let socket = no_socket();
    let (r, status) = report(&[], &["--interface", &ns.host_if, "--socket", &socket]);
    let xdp = check(&r, "xdp");
    assert_eq!(xdp["verdict"], "pass", "{xdp}");
    assert_eq!(xdp["data"]["af_xdp"], true, "{xdp}");
    assert_eq!(xdp["data"]["generic_mode"], true, "{xdp}");
    assert_eq!(xdp["data"]["driver_mode"], true, "{xdp}");
    assert_eq!(verdict(&r, "caps"), "pass", "{r}");
    assert_eq!(status, Some(0), "{r}");

    // Without the driver-mode trial (it may reset a real NIC's link).
    let (r, status) = report(
        &[],
        &[
            "--interface",
            &ns.host_if,
            "--skip-driver-mode",
            "--socket",
            &socket,
        ],
    );
    let xdp = check(&r, "xdp");
    assert_eq!(xdp["verdict"], "pass", "{xdp}");
    assert!(xdp["data"]["driver_mode"].is_null(), "{xdp}");
    assert!(
        xdp["found"]
            .as_str()
            .unwrap()
            .contains("driver mode not tried"),
        "{xdp}"
    );
    assert_eq!(status, Some(0), "{r}");

    let (r, status) = report(
        &[
            "prlimit",
            "--memlock=65536:65536",
            "setpriv",
            "--bounding-set=-ipc_lock",
        ],
        &["--interface", &ns.host_if, "--socket", &socket],
    );
    let memlock = check(&r, "memlock");
    assert_eq!(memlock["verdict"], "fail", "{memlock}");
    assert_eq!(memlock["data"]["soft"], 65536);
    assert_eq!(memlock["data"]["cap_ipc_lock"], false);
    let xdp = check(&r, "xdp");
    assert_eq!(xdp["verdict"], "fail", "{xdp}");
    assert_eq!(xdp["data"]["af_xdp"], false, "{xdp}");
    assert!(
        xdp["found"].as_str().unwrap().contains("XDP_UMEM_REG"),
        "{xdp}"
    );
    assert_eq!(status, Some(1), "{r}");
}
