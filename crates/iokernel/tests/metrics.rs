//! iokerneld's Prometheus endpoint (docs/metrics.md) end to end: an
//! in-process iokerneld serving `--metrics`, an application played by the
//! test, traffic from the software NIC's generator; every scrape is read
//! by the reference parser (the Python `prometheus_client` package) and
//! its figures must move as the traffic flows.
//!
//! Tests hold `LOCK`: iokerneld's loop spins while anything holds a core.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_iokernel::metrics::exposition::Collector;
use ginza_iokernel::metrics::{AppFigures, ChannelFigures, DispatchFigures, Snapshot};
use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::testing::scrape::{reference_samples, sample, scrape_until};
use ginza_iokernel::{Config, DaemonError, Iokerneld, LoadRun, RecordingActuator};
use ginza_metrics::prometheus_client::registry::Registry;
use ginza_metrics::testing::{exchange, scrape, value, Sample};
use ginza_metrics::Slot;
use ginza_net::{Interface, Ipv4Addr, MacAddr};
use ginza_proto::messages::NetStats;

mod common;
use common::{lock, test_cores, Daemon};

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0x34, last]),
        ip: Ipv4Addr::new(10, 34, 0, last),
    }
}

fn with_metrics() -> Daemon {
    Daemon::start_with(RecordingActuator::new(), |c| {
        c.metrics = Some("127.0.0.1:0".parse().unwrap());
    })
}

#[test]
fn a_scrape_parses_and_its_counters_move_as_traffic_flows() {
    let _g = lock();
    let d = with_metrics();
    let addr = d.metrics.expect("metrics served");
    let mut app = RawApp::register(&d.socket, "echo", iface(1), 2).unwrap();
    let echo = [("app", "echo")];
    let Some(before) = scrape_until(addr, "the application in the figures", |s| {
        value(s, "ginza_app_kthreads", &echo) == Some(2.0)
    }) else {
        return;
    };
    assert_eq!(sample(&before, "ginza_iokernel_up", &[]), 1.0);
    assert_eq!(sample(&before, "ginza_iokernel_applications", &[]), 1.0);
    assert_eq!(
        sample(
            &before,
            "ginza_app_info",
            &[("app", "echo"), ("class", "latency-critical")]
        ),
        1.0
    );
    let rx0 = sample(&before, "ginza_app_rx_packets_total", &echo);
    let grants0 = sample(&before, "ginza_app_grants_total", &echo);
    let passes0 = sample(&before, "ginza_iokernel_passes_total", &[]);
    let cpu0 = sample(&before, "ginza_iokernel_loop_cpu_seconds_total", &[]);
    let lat0 = sample(&before, "ginza_iokernel_grant_latency_seconds_count", &[]);

    // An echo load the receiving ring holds whole (dataplane.rs,
    // `echo_load`): every request reaches the application.
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let echoer = std::thread::spawn(move || {
        while !stop2.load(Ordering::Acquire) {
            if app.echo_waiting() == 0 {
                std::hint::spin_loop();
            }
        }
        app
    });
    let mut run = LoadRun::poisson(
        iface(1),
        7,
        4_000.0,
        ServiceTime::Constant { ns: 1_000 },
        Duration::from_millis(100),
    );
    run.drain = Duration::from_secs(20);
    let report = d.generator.run(run, Duration::from_secs(5)).unwrap();
    stop.store(true, Ordering::Release);
    let _app = echoer.join().unwrap();
    let sent = report.stats.sent as f64;
    assert!(sent > 100.0, "{:?}", report.stats);

    let Some(after) = scrape_until(addr, "the requests in the figures", |s| {
        value(s, "ginza_app_tx_packets_total", &echo) >= Some(sent)
    }) else {
        return;
    };
    assert_eq!(
        sample(&after, "ginza_app_rx_packets_total", &echo) - rx0,
        sent
    );
    assert_eq!(
        sample(&after, "ginza_app_rx_dropped_packets_total", &echo),
        0.0
    );
    assert!(sample(&after, "ginza_app_grants_total", &echo) > grants0);
    assert!(sample(&after, "ginza_iokernel_grants_total", &[]) >= 1.0);
    assert!(sample(&after, "ginza_iokernel_passes_total", &[]) > passes0);
    assert!(sample(&after, "ginza_iokernel_loop_cpu_seconds_total", &[]) > cpu0);
    assert!(sample(&after, "ginza_iokernel_grant_latency_seconds_count", &[]) > lat0);
    // The histogram is whole: its +Inf bucket holds every sample.
    assert_eq!(
        sample(
            &after,
            "ginza_iokernel_grant_latency_seconds_bucket",
            &[("le", "+Inf")]
        ),
        sample(&after, "ginza_iokernel_grant_latency_seconds_count", &[])
    );
    assert!(
        sample(
            &after,
            "ginza_iokernel_metrics_publish_duration_seconds_count",
            &[]
        ) >= 1.0
    );
    // The same figures as the stats socket's (no more traffic since).
    let st = d.stats();
    let net = st.apps[0].net.unwrap();
    assert_eq!(
        sample(&after, "ginza_app_rx_packets_total", &echo),
        net.rx as f64
    );
    assert_eq!(
        sample(&after, "ginza_app_tx_packets_total", &echo),
        net.tx as f64
    );
    assert_eq!(
        sample(&after, "ginza_app_grants_total", &echo),
        st.apps[0].grants as f64
    );
    assert_eq!(
        sample(&after, "ginza_nic_rx_frames_total", &[("nic", "software")]),
        0.0
    );
}

/// A publication is copied a few applications per loop turn: with more
/// applications than one turn copies, every one is published, once, and
/// those that leave go.
#[test]
fn many_applications_are_published_over_several_turns_and_leavers_go() {
    let _g = lock();
    let d = with_metrics();
    let addr = d.metrics.unwrap();
    let mut apps: Vec<RawApp> = (0..10)
        .map(|i| RawApp::register(&d.socket, &format!("a{i}"), iface(40 + i), 1).unwrap())
        .collect();
    let shown = |s: &[Sample]| -> Vec<String> {
        let mut v: Vec<String> = s
            .iter()
            .filter(|x| x.name == "ginza_app_kthreads")
            .map(|x| x.labels["app"].clone())
            .collect();
        v.sort();
        v
    };
    let all: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
    let mut want = all.clone();
    want.sort();
    let Some(s) = scrape_until(addr, "ten applications", |s| shown(s) == want) else {
        return;
    };
    assert_eq!(sample(&s, "ginza_iokernel_applications", &[]), 10.0);
    // Three leave (their sockets close): gone from the figures, the rest
    // there once each.
    apps.drain(2..5);
    let mut left: Vec<String> = all
        .into_iter()
        .filter(|n| !["a2", "a3", "a4"].contains(&n.as_str()))
        .collect();
    left.sort();
    scrape_until(addr, "seven applications", |s| shown(s) == left);
}

/// The latency an application's runtime writes into its region's
/// histograms (one per kthread) is read at each publication and
/// exported, summed over the kthreads.
#[test]
fn request_latency_written_in_the_region_is_exported_per_application() {
    let _g = lock();
    let d = with_metrics();
    let addr = d.metrics.unwrap();
    let app = RawApp::register(&d.socket, "timed", iface(60), 2).unwrap();
    let quiet = RawApp::register(&d.socket, "quiet", iface(61), 1).unwrap();
    for _ in 0..5 {
        app.ends[0].latency.record(3_000);
    }
    app.ends[1].latency.record(3_000);
    app.ends[1].latency.record(40_000_000);
    let timed = [("app", "timed")];
    let Some(s) = scrape_until(addr, "seven samples", |s| {
        value(s, "ginza_app_request_latency_seconds_count", &timed) == Some(7.0)
    }) else {
        return;
    };
    let b = |le: &str| {
        sample(
            &s,
            "ginza_app_request_latency_seconds_bucket",
            &[("app", "timed"), ("le", le)],
        )
    };
    assert_eq!(b("0.000002"), 0.0);
    assert_eq!(b("0.000005"), 6.0);
    assert_eq!(b("0.02"), 6.0);
    assert_eq!(b("0.05"), 7.0);
    assert_eq!(b("+Inf"), 7.0);
    let sum = sample(&s, "ginza_app_request_latency_seconds_sum", &timed);
    assert!((sum - (6.0 * 3e-6 + 0.04)).abs() < 1e-9, "{sum}");
    // An application that records nothing has an empty histogram.
    assert_eq!(
        sample(
            &s,
            "ginza_app_request_latency_seconds_count",
            &[("app", "quiet")]
        ),
        0.0
    );
    drop((app, quiet));
}

#[test]
fn bad_requests_get_400_other_paths_404_and_connections_follow_http() {
    let _g = lock();
    let d = with_metrics();
    let addr = d.metrics.unwrap();
    let text = |req: &[u8]| String::from_utf8(exchange(addr, req).unwrap()).unwrap();
    let r = text(b"BLAH\x01\x02 nonsense\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");
    assert!(r.contains("Connection: close\r\n"), "{r}");
    let r = text(b"GET /favicon.ico HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
    let r = text(b"DELETE /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(
        r.starts_with("HTTP/1.1 405 ") && r.contains("Allow: GET, HEAD"),
        "{r}"
    );
    // HEAD: the length of the text, no text.
    let r = text(b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.ends_with("\r\n\r\n"), "no body: {r}");
    // Keep-alive: two scrapes on one connection, then it closes as asked.
    let r =
        text(b"GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_eq!(r.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{r}");
    assert_eq!(r.matches("# EOF\n").count(), 2);
    // The loop went on all along.
    d.wait_passes(3);
}

#[test]
fn a_metrics_address_in_use_is_refused_at_start_with_its_address() {
    let _g = lock();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = std::env::temp_dir().join(format!("ginza-iok-metrics-{}", std::process::id()));
    let mut cfg = Config::new(test_cores());
    cfg.socket = dir.join("iokerneld.sock");
    cfg.metrics = Some(addr);
    let e = match Iokerneld::bind(cfg, RecordingActuator::new()) {
        Err(e) => e,
        Ok(_) => panic!("bound metrics on an address in use"),
    };
    assert!(matches!(e, DaemonError::Metrics { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("cannot serve metrics on {addr}")),
        "{msg}"
    );
    assert!(!dir.join("iokerneld.sock").exists(), "no socket file left");
}

#[test]
fn the_binary_refuses_a_bad_metrics_address_in_a_flag_or_its_file() {
    let bin = env!("CARGO_BIN_EXE_iokerneld");
    let c0 = test_cores()[0].to_string();
    let out = Command::new(bin)
        .args(["--cores", &c0, "--metrics", "localhost:http"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--metrics"), "{e}");
    assert!(
        e.contains("not an address to listen on: expected IP:PORT"),
        "{e}"
    );
    let dir = std::env::temp_dir().join(format!("ginza-iok-metrics-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("iokerneld.toml");
    std::fs::write(
        &file,
        format!("cores = \"{c0}\"\nmetrics = \"127.0.0.1:99999\"\n"),
    )
    .unwrap();
    let out = Command::new(bin)
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("metrics: \"127.0.0.1:99999\" is not an address to listen on"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A snapshot with every optional figure present (net, dispatch,
/// channels), rendered and parsed: the exposition is valid however
/// complete, and docs/metrics.md lists exactly the metrics served.
#[test]
fn every_metric_parses_and_is_documented() {
    let mut s = Snapshot {
        published: true,
        policy: "shenango",
        nic: "af_xdp:veth0".into(),
        ..Default::default()
    };
    s.alloc.grant_latency.record(3_000);
    let mut request_latency = AppFigures::default().request_latency;
    request_latency.record(7_000);
    let mut dispatch = DispatchFigures::default();
    dispatch.sojourn.add(4_000, 2, 6_000);
    dispatch.counters.co = 2;
    s.apps = vec![
        AppFigures {
            name: "kv".into(),
            class: "latency-critical",
            net: Some(NetStats::default()),
            dispatch: Some(dispatch),
            channels: Some(ChannelFigures {
                channels: 1,
                command_ring_full: 3,
                event_ring_full: 4,
            }),
            request_latency,
            ..Default::default()
        },
        AppFigures {
            name: "batch\"odd\\name".into(),
            class: "batch",
            ..Default::default()
        },
    ];
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collector::new(Arc::new(Slot::new(s)))));
    let text = ginza_metrics::exposition::render(&registry).unwrap();
    let Some(samples) = reference_samples(&text) else {
        return;
    };
    let kv = [("app", "kv")];
    assert_eq!(
        sample(&samples, "ginza_app_command_ring_full_total", &kv),
        3.0
    );
    assert_eq!(
        sample(&samples, "ginza_app_event_ring_full_total", &kv),
        4.0
    );
    assert_eq!(
        sample(
            &samples,
            "ginza_app_request_sojourn_seconds_bucket",
            &[("app", "kv"), ("le", "0.000004")]
        ),
        2.0
    );
    assert_eq!(
        sample(&samples, "ginza_app_request_sojourn_seconds_sum", &kv),
        6e-6
    );
    assert_eq!(
        sample(
            &samples,
            "ginza_app_request_latency_seconds_bucket",
            &[("app", "kv"), ("le", "0.00001")]
        ),
        1.0
    );
    // Label values are escaped, and read back whole.
    assert_eq!(
        sample(&samples, "ginza_app_cores", &[("app", "batch\"odd\\name")]),
        0.0
    );
    let served: BTreeSet<String> = samples
        .iter()
        .map(|x| {
            if x.kind == "histogram" {
                x.family.clone()
            } else {
                x.name.clone()
            }
        })
        .collect();
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    let documented = documented_names(&doc, "ginza_iokernel")
        .into_iter()
        .chain(documented_names(&doc, "ginza_app"))
        .chain(documented_names(&doc, "ginza_nic"))
        .collect::<BTreeSet<_>>();
    assert_eq!(
        served.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "served but not in docs/metrics.md"
    );
    assert_eq!(
        documented.difference(&served).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "in docs/metrics.md but not served"
    );
}

/// The metric names of docs/metrics.md's tables: the first cell of each
/// row, in backticks, that starts with `prefix`.
fn documented_names(doc: &str, prefix: &str) -> Vec<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with(prefix) && !n.starts_with("ginza_netstack"))
        .map(|n| n.split('{').next().unwrap_or(n).to_string())
        .collect()
}

/// The loop's publications so far by bucket of `ginza_iokernel_metrics_publish_duration_seconds`
/// (upper bound, cumulative count).
fn publish_buckets(addr: SocketAddr) -> Vec<(String, f64)> {
    reference_samples(&scrape(addr).unwrap())
        .unwrap()
        .into_iter()
        .filter(|x| x.name == "ginza_iokernel_metrics_publish_duration_seconds_bucket")
        .map(|x| (x.labels["le"].clone(), x.value))
        .collect()
}

/// What the metrics cost the loop (docs/metrics.md; figures in
/// docs/results.md, "Session 15: metrics"): a spinning iokerneld with 8
/// applications registered, in 1 s windows that alternate between no
/// scrapes and a client scraping back to back; per window the passes per
/// second and the idle pass's p50/p99 from the stats socket (the same
/// windows, `ResetStats`), and per kind of window the loop's time per
/// publication, by bucket (a scrape before and after each window reads
/// it). A benchmark, not a check: run it with
/// `cargo test --release -p ginza-iokernel --test metrics -- --ignored --nocapture what_the_metrics_cost_the_loop`.
#[test]
#[ignore]
fn what_the_metrics_cost_the_loop() {
    let _g = lock();
    let d = Daemon::start_with(RecordingActuator::new(), |c| {
        c.idle_sleep = None;
        c.metrics = Some("127.0.0.1:0".parse().unwrap());
    });
    let addr = d.metrics.unwrap();
    let _apps: Vec<RawApp> = (0..8)
        .map(|i| RawApp::register(&d.socket, &format!("app{i}"), iface(10 + i), 1).unwrap())
        .collect();
    let window = Duration::from_secs(1);
    // Per kind of window: (passes/s, idle p50, idle p99, scrapes) per
    // window, and the publications' buckets summed.
    #[derive(Default)]
    struct Arm {
        windows: Vec<(f64, u64, u64, u64)>,
        buckets: Vec<(String, f64)>,
    }
    let mut arms: [Arm; 2] = Default::default();
    for round in 0..7 {
        for scraped in [round % 2 == 0, round % 2 == 1] {
            let before = publish_buckets(addr);
            ginza_proto::client::reset_stats(&d.socket).unwrap();
            let t0 = Instant::now();
            let mut scrapes = 0u64;
            if scraped {
                while t0.elapsed() < window {
                    scrape(addr).unwrap();
                    scrapes += 1;
                }
            } else {
                // The measurement window itself, not a wait for a condition.
                std::thread::sleep(window);
            }
            let a = ginza_proto::client::reset_stats(&d.socket).unwrap().alloc;
            let after = publish_buckets(addr);
            let passes = a.pass_cost_idle.count + a.pass_cost_with_decisions.count;
            let m = (
                passes as f64 / (a.window_ns as f64 / 1e9),
                a.pass_cost_idle.p50_ns,
                a.pass_cost_idle.p99_ns,
                scrapes,
            );
            println!(
                "round {round} {}: {:.0} passes/s, idle pass p50 {} ns p99 {} ns, {} scrapes",
                if scraped { "scraped" } else { "quiet  " },
                m.0,
                m.1,
                m.2,
                m.3
            );
            let arm = &mut arms[usize::from(scraped)];
            arm.windows.push(m);
            for (i, ((le, b), (_, e))) in before.iter().zip(&after).enumerate() {
                match arm.buckets.get_mut(i) {
                    Some(x) => x.1 += e - b,
                    None => arm.buckets.push((le.clone(), e - b)),
                }
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    for (name, arm) in ["quiet", "scraped"].iter().zip(&arms) {
        let (v, buckets) = (&arm.windows, &arm.buckets);
        println!(
            "median {name}: {:.0} passes/s, idle pass p50 {:.0} ns, p99 {:.0} ns, {:.0} scrapes/s",
            median(v.iter().map(|m| m.0).collect()),
            median(v.iter().map(|m| m.1 as f64).collect()),
            median(v.iter().map(|m| m.2 as f64).collect()),
            median(v.iter().map(|m| m.3 as f64).collect()),
        );
        println!("  {name} windows' publications, cumulative by upper bound (s): {buckets:?}");
    }
}
