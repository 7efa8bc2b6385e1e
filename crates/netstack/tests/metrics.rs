//! The netstack's Prometheus endpoint (`--metrics`, docs/metrics.md) end
//! to end: a netstack under an in-process iokerneld serves its counters; a
//! Ginza TCP client talks to a protected echo application through it; the
//! reference parser (the Python `prometheus_client` package) reads every
//! scrape, and the counters move by what was sent. The test holds the
//! lock: iokerneld's loop busy-polls a core while anything holds one.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::under_iokerneld::{
    client_config, iface, netstack_config, protected_echo, short_timers, SHARED,
};
use ginza_iokernel::testing::scrape::{reference_samples, sample, scrape_until};
use ginza_iokernel::testing::{in_process, skip, test_cores};
use ginza_metrics::testing::{exchange, scrape, value};
use ginza_netstack::daemon::{Daemon, DaemonConfig};
use ginza_runtime::net::TcpStream;

static LOCK: Mutex<()> = Mutex::new(());

#[test]
fn the_netstack_serves_its_counters_and_they_move_with_a_tcp_exchange() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if test_cores().len() < 2 {
        return skip("needs two CPUs (iokerneld busy-polls one)");
    }
    let dir = tempfile::tempdir().unwrap();
    let (io, socket) = in_process(dir.path(), |_| {});
    let mut cfg = netstack_config(dir.path(), &socket, 1);
    short_timers(&mut cfg.netstack.tcp);
    cfg.metrics = Some("127.0.0.1:0".parse().unwrap());
    let ns = Daemon::start(cfg.clone()).unwrap();
    let addr = ns.metrics_addr().expect("metrics served");

    let Some(before) = scrape_until(addr, "a first scrape", |_| true) else {
        return;
    };
    assert_eq!(
        value(&before, "ginza_netstack_info", &[("name", "netstack")]),
        Some(1.0)
    );
    assert_eq!(sample(&before, "ginza_netstack_applications", &[]), 0.0);
    // Every family is documented, and every documented one served.
    let served: BTreeSet<String> = before.iter().map(|x| x.name.clone()).collect();
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("ginza_netstack"))
        .map(|n| n.split('{').next().unwrap_or(n).to_string())
        .collect();
    assert_eq!(
        served, documented,
        "docs/metrics.md's netstack table and the scrape"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let app = protected_echo(cfg.attach_socket.clone(), SHARED, 7, Arc::clone(&stop));
    let Some(listening) = scrape_until(addr, "the application's listen", |s| {
        value(s, "ginza_netstack_applications", &[]) == Some(1.0)
            && value(s, "ginza_netstack_events_total", &[]) >= Some(1.0)
    }) else {
        return;
    };

    let message: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let m2 = message.clone();
    let got = ginza_runtime::run(client_config(&socket, 2, 1, short_timers), move || {
        let mut s = TcpStream::connect(SocketAddrV4::new(iface(1).ip, 7)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let w = {
            let (m3, mut w) = (m2.clone(), s.try_clone().unwrap());
            ginza_runtime::spawn(move || w.write_all(&m3).unwrap())
        };
        let mut back = vec![0u8; m2.len()];
        s.read_exact(&mut back).unwrap();
        w.join().unwrap();
        back
    })
    .unwrap();
    assert_eq!(got, message);
    let len = message.len() as f64;
    let Some(after) = scrape_until(addr, "the echo in the counters", |s| {
        value(s, "ginza_netstack_rx_delivered_bytes_total", &[]) >= Some(len)
    }) else {
        return;
    };
    let moved = |name: &str| sample(&after, name, &[]) - sample(&listening, name, &[]);
    assert_eq!(moved("ginza_netstack_rx_delivered_bytes_total"), len);
    assert!(moved("ginza_netstack_tx_zero_touch_bytes_total") >= len);
    assert!(moved("ginza_netstack_rx_frames_total") > 0.0);
    assert!(moved("ginza_netstack_tx_frames_total") > 0.0);
    assert!(moved("ginza_netstack_rx_segments_total") > 0.0);
    assert!(
        moved("ginza_netstack_commands_total") >= 2.0,
        "accept, send, recv_done"
    );
    assert!(
        moved("ginza_netstack_events_total") >= 2.0,
        "new_conn, new_data"
    );
    assert_eq!(
        sample(&after, "ginza_netstack_tx_copied_bytes_total", &[]),
        0.0
    );
    // The same figures as the engine's (scraped once more: the counters
    // may have moved since, never back).
    let st = ns.stats();
    let last = reference_samples(&scrape(addr).unwrap()).unwrap();
    assert_eq!(
        sample(&last, "ginza_netstack_rx_delivered_bytes_total", &[]),
        st.rx_bytes_delivered as f64
    );
    assert!(sample(&last, "ginza_netstack_rx_frames_total", &[]) >= st.frames_in as f64);

    // A bad request is answered 400 on the netstack's listener too.
    let r = String::from_utf8(exchange(addr, b"\x16\x03\x01 not http\r\n\r\n").unwrap()).unwrap();
    assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");

    stop.store(true, Ordering::Relaxed);
    app.join().unwrap();
    drop(ns);
    drop(io);
}

/// An address in use stops the netstack before it registers: its error
/// names the address.
#[test]
fn a_metrics_address_in_use_is_refused_before_registering() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = DaemonConfig::new(iface(9));
    // No iokerneld there: registering would fail with another error.
    cfg.iokernel_socket = dir.path().join("no-iokerneld.sock");
    cfg.attach_socket = dir.path().join("netstack.sock");
    cfg.metrics = Some(addr);
    let e = match Daemon::start(cfg) {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("started with its metrics address in use"),
    };
    assert!(
        e.starts_with(&format!("cannot serve metrics on {addr}")),
        "{e}"
    );
}
