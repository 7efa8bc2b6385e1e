//! `ginza top` against a real iokerneld, started as `ginza iokernel` (so
//! this also checks that the subcommand runs the daemon).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::daemon::Daemon;
use ginza_proto::client;
use ginza_proto::messages::{Class, Registration};
use ginza_shm::{Region, RegionConfig};

const GINZA: &str = env!("CARGO_BIN_EXE_ginza");

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

/// 100 applications registered for real, from this process, each with one
/// kthread (as many as a small server may host): the table shows the rows
/// asked for and counts the rest; `--json` lists every one.
#[test]
fn top_keeps_a_hundred_applications_readable() {
    const APPS: usize = 100;
    let d = Daemon::start("hundred");
    let mut held = Vec::with_capacity(APPS);
    for i in 0..APPS {
        let name = format!("app-{i:03}");
        let region = Region::create(&name, &RegionConfig::new(1)).unwrap();
        let efds = [ginza_sys::eventfd::new().unwrap()];
        let reg = Registration {
            name,
            class: Class::Batch,
            guaranteed: 0,
            max_cores: 1,
            kthreads: 1,
            net: None,
            steering: None,
            dispatch: None,
            wake_page: false,
            bell: false,
        };
        let conn = client::register_region(&d.socket, &reg, &region, &efds)
            .unwrap_or_else(|e| panic!("registering application {i}: {e}"));
        held.push((conn, region, efds));
    }
    let rows = |stdout: &str| stdout.lines().filter(|l| l.starts_with("app-")).count();

    let out = top(&d.socket, &["--limit", "10", "--sort", "name"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(&format!("apps {APPS} ")), "{stdout}");
    let names: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("app-"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        (0..10).map(|i| format!("app-{i:03}")).collect::<Vec<_>>()
    );
    assert!(
        stdout.contains("... 90 more applications not shown (sorted by name;"),
        "{stdout}"
    );

    // Not a terminal and no --limit: every row.
    let out = top(&d.socket, &[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(rows(&stdout), APPS, "{stdout}");
    assert!(!stdout.contains("more applications"), "{stdout}");

    let out = top(&d.socket, &["--json", "--limit", "3"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    let mut listed: Vec<String> = v["stats"]["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        (0..APPS).map(|i| format!("app-{i:03}")).collect::<Vec<_>>()
    );
    assert_eq!(v["rates"].as_array().unwrap().len(), APPS, "{stdout}");
    drop(held);
}
