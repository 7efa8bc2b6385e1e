//! `http-server` against real HTTP clients over a veth pair: iokerneld
//! drives the host end (AF_XDP), http-server runs on a Ginza runtime behind
//! it, and from the network namespace at the other end `curl` and `wrk`
//! (Debian packages) talk to it.
//!
//! Needs root, `ip`, `ethtool`, `curl` and `wrk` (CI installs them);
//! elsewhere each test prints `skipped: …` (under CI as root it fails
//! instead).

mod common;

use std::net::Ipv4Addr;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use ginza_apps::http_server::{self, HttpStats, ROOT_BODY};
use ginza_iokernel::netns::NetNs;
use ginza_net::MacAddr;

const HTTP_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0e, 0x80]);
const PORT: u16 = 80;

/// True if `tool` runs (`tool --version`); otherwise skips the test.
fn have(tool: &str, package: &str) -> bool {
    let ok = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok();
    if !ok {
        ginza_iokernel::testing::skip(format!("`{tool}` is missing (Debian package {package})"));
    }
    ok
}

/// http-server behind iokerneld on the veth; runs `check` with the
/// server's IP, then stops it and returns its counters.
fn with_http_server(ns: &NetNs, check: impl FnOnce(Ipv4Addr)) -> Arc<HttpStats> {
    let daemon = Daemon::on(ns, "af_xdp", |_| {});
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(HttpStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let app = daemon.start_app("http-veth", HTTP_MAC, ns.peer_ip, 1, move || {
        http_server::serve(PORT, s2, st2)
    });
    check(ns.peer_ip);
    stop.store(true, Relaxed);
    app.join(Duration::from_secs(10)).expect("http-server");
    stats
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `curl` in the namespace with `args`; its stdout and stderr.
fn curl(ns: &NetNs, args: &[&str]) -> (String, String) {
    let mut all = vec!["curl", "--silent", "--show-error", "--max-time", "20"];
    all.extend_from_slice(args);
    let out = ns.exec(&all).expect("running curl");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "curl {args:?}: {stderr}");
    (stdout, stderr)
}

#[test]
fn curl_gets_bodies_errors_and_reuses_its_connection() {
    if !have("curl", "curl") {
        return;
    }
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let stats = with_http_server(&ns, |ip| {
        let base = format!("http://{ip}");
        let (body, _) = curl(&ns, &[&format!("{base}/")]);
        assert_eq!(body.as_bytes(), ROOT_BODY);
        let (out, _) = curl(
            &ns,
            &[
                "--output",
                "/dev/null",
                "--write-out",
                "%{http_code} %{size_download}",
                &format!("{base}/bytes/100000"),
            ],
        );
        assert_eq!(out, "200 100000");
        let (out, _) = curl(
            &ns,
            &[
                "--output",
                "/dev/null",
                "--write-out",
                "%{http_code}",
                &format!("{base}/nope"),
            ],
        );
        assert_eq!(out, "404");
        let (out, _) = curl(
            &ns,
            &[
                "--request",
                "POST",
                "--data",
                "ignored",
                "--output",
                "/dev/null",
                "--write-out",
                "%{http_code}",
                &format!("{base}/"),
            ],
        );
        assert_eq!(out, "405");
        // Two URLs in one command: the second request reuses the connection.
        let (out, log) = curl(
            &ns,
            &[
                "--verbose",
                "--output",
                "/dev/null",
                "--output",
                "/dev/null",
                "--write-out",
                "%{http_code} %{size_download}\\n",
                &format!("{base}/bytes/10"),
                &format!("{base}/bytes/20"),
            ],
        );
        assert_eq!(out, "200 10\n200 20\n");
        assert!(log.contains("Re-using existing connection"), "{log}");
    });
    // One connection per curl command: 5, though 6 requests.
    assert_eq!(stats.accepted.load(Relaxed), 5);
    assert_eq!(stats.ok.load(Relaxed), 4);
    assert_eq!(stats.client_errors.load(Relaxed), 2);
}

#[test]
fn wrk_runs_two_seconds_without_errors() {
    if !have("wrk", "wrk") {
        return;
    }
    let _lock = common::lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let stats = with_http_server(&ns, |ip| {
        let out = ns
            .exec(&[
                "wrk",
                "--threads",
                "1",
                "--connections",
                "4",
                "--duration",
                "2s",
                "--timeout",
                "5s",
                &format!("http://{ip}/"),
            ])
            .expect("running wrk");
        let (report, errors) = text(&out);
        assert!(out.status.success(), "wrk: {errors}\n{report}");
        println!("{report}");
        let requests: u64 = report
            .lines()
            .find_map(|l| l.trim().split_once(" requests in "))
            .and_then(|(n, _)| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no request count in wrk's report:\n{report}"));
        assert!(requests > 0, "{report}");
        assert!(!report.contains("Socket errors"), "{report}");
        assert!(!report.contains("Non-2xx"), "{report}");
    });
    assert!(stats.ok.load(Relaxed) > 0);
    assert_eq!(stats.client_errors.load(Relaxed), 0);
    assert_eq!(stats.server_errors.load(Relaxed), 0);
}
