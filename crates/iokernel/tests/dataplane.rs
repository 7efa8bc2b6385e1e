//! iokerneld's dataplane end to end: an in-process iokerneld (recording
//! actuator: grants are bookkeeping, no thread is woken), applications
//! played by the test through real memfd regions and ingress pools.
//!
//! Tests hold `LOCK`: iokerneld's loop spins while anything holds a core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::{LoadReport, LoadRun, RecordingActuator, GENERATOR_MAC};
use ginza_net::{Endpoint, Interface, Ipv4Addr, MacAddr, Packet};
use ginza_policy::steer::SteeringKind;
use ginza_proto::client::ClientError;
use ginza_shm::RegionConfig;

mod common;
use common::{lock, Daemon};

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0, last]),
        ip: Ipv4Addr::new(10, 9, 0, last),
    }
}

fn register(
    d: &Daemon,
    name: &str,
    interface: Interface,
    kthreads: u32,
) -> Result<RawApp, ClientError> {
    let app = RawApp::register(&d.socket, name, interface, kthreads)?;
    assert_eq!(app.pool.count(), RegionConfig::new(kthreads).done_capacity);
    Ok(app)
}

/// The first frame on kthread 0's ingress ring, waiting at most 5 s.
fn recv_within_5s(app: &mut RawApp) -> (Vec<u8>, ginza_shm::PacketDesc) {
    let t0 = Instant::now();
    loop {
        if let Some(x) = app.recv(0) {
            return x;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nothing received");
        std::thread::yield_now();
    }
}

/// Echoes until `stop`; returns the count.
fn echo_until(app: &mut RawApp, stop: &AtomicBool) -> u64 {
    let mut echoed = 0;
    while !stop.load(Ordering::Acquire) {
        match app.echo_waiting() {
            0 => std::hint::spin_loop(),
            n => echoed += n,
        }
    }
    echoed
}

/// Runs `run` from the generator while a thread echoes for `app`; the
/// generator's report, how many requests `app` echoed, and `app` (still
/// registered, for the stats the caller reads next).
fn echo_during(d: &Daemon, mut app: RawApp, run: LoadRun) -> (LoadReport, u64, RawApp) {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let echo = std::thread::spawn(move || {
        let n = echo_until(&mut app, &stop2);
        (n, app)
    });
    let report = d
        .generator
        .run(run, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}: {:#?}", d.stats()));
    stop.store(true, Ordering::Release);
    let (echoed, app) = echo.join().unwrap();
    (report, echoed, app)
}

/// Requests whose replies are not awaited. The drain still matters: a
/// generator that fell behind its schedule (iokerneld's loop held off its
/// CPU) injects the arrivals it owes until the drain ends, and with no
/// replies coming the run lasts all of it.
fn load(target: Interface, rate: f64, ms: u64) -> LoadRun {
    let mut run = LoadRun::poisson(
        target,
        7,
        rate,
        ServiceTime::Constant { ns: 1_000 },
        Duration::from_millis(ms),
    );
    run.drain = Duration::from_secs(2);
    run
}

/// An echo load that the receiving kthread's ingress ring holds whole:
/// about 400 requests, fewer than the ring's 512 slots (and the switch
/// port's). However late the echo thread runs, none can be dropped, so
/// every one must come back: what is checked is the path, not whether the
/// test's threads kept pace with the generator (the arrival count is fixed
/// by the generator's seed).
fn echo_load(target: Interface) -> LoadRun {
    let mut run = load(target, 4_000.0, 100);
    // A deadline, not a wait: the run ends as soon as every reply is in,
    // and on a loaded machine the echo thread can be held off its CPU for
    // seconds.
    run.drain = Duration::from_secs(20);
    run
}

/// Checks that `sent` fits in one ingress ring (see [`echo_load`]).
fn assert_fits_one_ring(sent: u64) {
    let ring = u64::from(RegionConfig::new(1).ingress_capacity);
    assert!(
        300 < sent && sent < ring,
        "{sent} requests: the echo loads are sized to fit one ingress ring of {ring}"
    );
}

#[test]
fn generator_requests_are_steered_to_the_app_and_its_echoes_come_back() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let app = register(&d, "echo", iface(1), 2).unwrap();
    let (report, echoed, _app) = echo_during(&d, app, echo_load(iface(1)));
    let st = report.stats;
    assert_fits_one_ring(st.sent);
    assert_eq!(st.replies, st.sent, "every request answered: {st:?}");
    assert_eq!(echoed, st.sent);
    assert_eq!(report.latency.len(), st.replies);
    let s = d.stats();
    let net = s.apps[0].net.unwrap();
    assert_eq!((net.rx, net.tx), (st.sent, st.sent));
    assert_eq!((net.drop_ingress, net.drop_egress), (0, 0));
    // The first packet found no core: it went to a parked kthread and an
    // allocation pass granted one.
    assert!(net.to_parked >= 1, "{net:?}");
    assert!(s.apps[0].grants >= 1);
    assert_eq!(s.dataplane.generator_runs, 1);
    assert_eq!(s.dataplane.nic, "software");
}

#[test]
fn a_registration_gets_the_steering_policy_it_asks_for() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let app = RawApp::register_steered(&d.socket, "ind", iface(1), 4, Some("indirection")).unwrap();
    let _plain = register(&d, "plain", iface(2), 1).unwrap();
    match RawApp::register_steered(&d.socket, "odd", iface(3), 1, Some("random")) {
        Err(ClientError::Refused { reason }) => {
            assert!(reason.contains("unknown steering policy"), "{reason}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    }
    let (report, echoed, _app) = echo_during(&d, app, echo_load(iface(1)));
    assert!(echoed > 0 && echoed <= report.stats.sent, "{echoed}");
    let s = d.stats();
    assert_eq!(s.apps.len(), 2);
    let ind = s.apps[0].net.unwrap();
    assert_eq!(ind.steering(), Some(SteeringKind::Indirection), "{ind:?}");
    assert_eq!(ind.tb, 512 * 12, "{ind:?}");
    assert_eq!(ind.ev, 0);
    assert!(ind.rx >= echoed, "{ind:?}");
    let plain = s.apps[1].net.unwrap();
    assert_eq!(plain.steering(), Some(SteeringKind::RssMod), "{plain:?}");
    assert_eq!(plain.tb, 0);
}

#[test]
fn the_configured_steering_and_sizes_reach_every_application() {
    let _g = lock();
    let d = Daemon::start_with(RecordingActuator::new(), |c| {
        c.steering = SteeringKind::FlowAffinity;
        c.steering_options.flow_table_capacity = 1000;
        c.steering_options.buckets = 64;
    });
    let _fa = register(&d, "fa", iface(1), 2).unwrap();
    let _ind =
        RawApp::register_steered(&d.socket, "ind", iface(2), 2, Some("indirection")).unwrap();
    let s = d.stats();
    let fa = s.apps[0].net.unwrap();
    assert_eq!(fa.steering(), Some(SteeringKind::FlowAffinity));
    assert_eq!(fa.tb, 1024 * 24, "1000 flows round up to 1024");
    let ind = s.apps[1].net.unwrap();
    assert_eq!(ind.steering(), Some(SteeringKind::Indirection));
    assert_eq!(ind.tb, 64 * 12);
}

#[test]
fn two_apps_talk_through_the_switch_and_cannot_spoof() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let mut a = register(&d, "a", iface(1), 1).unwrap();
    let mut b = register(&d, "b", iface(2), 1).unwrap();
    let to_b = Endpoint {
        ip: b.interface.ip,
        port: 9,
    };
    let b_mac = b.interface.mac;
    assert!(a.send_udp(0, b_mac, to_b, 1234, b"hello b"));
    // a's kthread holds no core: iokerneld drains its egress ring once
    // after it reports Parked.
    a.report_parked(0);
    let got = recv_within_5s(&mut b);
    match ginza_net::parse(&got.0, &b.interface) {
        Ok(Packet::Udp(u)) => {
            assert_eq!(u.payload, b"hello b");
            assert_eq!(u.src.ip, a.interface.ip);
        }
        other => panic!("b got {other:?}"),
    }
    b.give_back(0, got.1.buf);
    // a sends as b (b's MAC as source): the switch drops it.
    let spoofer = a.interface;
    a.interface.mac = b_mac;
    assert!(a.send_udp(0, b_mac, to_b, 1234, b"forged"));
    a.interface = spoofer;
    a.report_parked(0);
    let s = d.wait_for("the spoofed frame dropped", |s| {
        s.apps
            .iter()
            .any(|x| x.name == "a" && x.net.unwrap().drop_egress == 1)
    });
    assert_eq!(
        s.apps
            .iter()
            .find(|x| x.name == "b")
            .unwrap()
            .net
            .unwrap()
            .rx,
        1
    );
    assert!(b.recv(0).is_none());
}

#[test]
fn a_buffer_given_back_twice_disconnects_only_its_app() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let mut bad = register(&d, "bad", iface(1), 1).unwrap();
    let _good = register(&d, "good", iface(2), 1).unwrap();
    bad.give_back(0, 3);
    let s = d.wait_for("bad removed", |s| s.apps.len() == 1);
    assert_eq!(s.apps[0].name, "good");
    let r = s.recent_removals.last().unwrap();
    assert_eq!(r.name, "bad");
    assert!(
        r.reason.contains("kthread 0 gave back an ingress buffer wrongly: buffer 3 was given back but is not lent"),
        "{}",
        r.reason
    );
}

#[test]
fn bad_and_duplicate_addresses_are_refused() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let _a = register(&d, "a", iface(1), 1).unwrap();
    let why = |r: Result<RawApp, ClientError>| match r {
        Err(ClientError::Refused { reason }) => reason,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    };
    let mut same_ip = iface(2);
    same_ip.ip = iface(1).ip;
    assert_eq!(
        why(register(&d, "b", same_ip, 1)),
        "IP 10.9.0.1 is already the address of application \"a\""
    );
    let mut same_mac = iface(2);
    same_mac.mac = iface(1).mac;
    assert!(why(register(&d, "c", same_mac, 1)).contains("is already the address of another port"));
    let mut group = iface(3);
    group.mac = MacAddr([0x01, 0, 0x5e, 0, 0, 1]);
    assert!(why(register(&d, "d", group, 1)).contains("is not a unicast address"));
    let mut generator = iface(4);
    generator.mac = GENERATOR_MAC;
    assert!(why(register(&d, "e", generator, 1)).contains("already the address of another port"));
    assert_eq!(d.stats().apps.len(), 1);
}

#[test]
fn an_app_that_does_not_read_loses_only_its_own_packets() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    // `sink` never reads its ingress ring: its ring and port fill up.
    let _sink = register(&d, "sink", iface(1), 1).unwrap();
    let report = d
        .generator
        .run(load(iface(1), 200_000.0, 20), Duration::from_secs(5))
        .unwrap();
    // The last requests may still wait on the sink's switch port: iokerneld
    // moves a burst a turn of its loop.
    let s = d.wait_for("every request delivered or counted dropped", |s| {
        s.apps[0]
            .net
            .is_some_and(|n| n.rx + n.drop_ingress == report.stats.sent)
    });
    let net = s.apps[0].net.unwrap();
    assert_eq!(net.rx, 512, "one ingress ring's worth delivered: {net:?}");
    assert!(net.drop_ingress > 0, "{net:?}");
    assert_eq!(net.rx + net.drop_ingress, report.stats.sent);
    assert_eq!(report.stats.replies, 0);
    // iokerneld is still serving: a second app gets its packets.
    let echo = register(&d, "echo", iface(2), 1).unwrap();
    let (report, _, _echo) = echo_during(&d, echo, echo_load(iface(2)));
    assert!(report.stats.sent > 0);
    assert_eq!(report.stats.replies, report.stats.sent);
}

/// Apps "a" and "b", one kthread each, both holding their core.
fn two_busy_apps(d: &Daemon) -> (RawApp, RawApp) {
    let a = register(d, "a", iface(1), 1).unwrap();
    let b = register(d, "b", iface(2), 1).unwrap();
    a.stay_busy(0);
    b.stay_busy(0);
    (a, b)
}

#[test]
fn bursts_between_two_busy_apps_all_arrive() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let (mut a, mut b) = two_busy_apps(&d);
    let mut frame = vec![0u8; 128];
    let to_b = Endpoint {
        ip: b.interface.ip,
        port: 9,
    };
    let n =
        ginza_net::tx::udp_datagram(&mut frame, &a.interface, b.interface.mac, 9, to_b, &[1; 22])
            .unwrap();
    frame.truncate(n);
    const TOTAL: usize = 20_000;
    let (mut sent, mut got) = (0, 0);
    let t0 = Instant::now();
    while got < TOTAL {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{got} of {sent} sent arrived: {:#?}",
            d.stats().apps
        );
        if sent < TOTAL {
            sent += a.send_frames(0, &frame, (TOTAL - sent).min(64));
        }
        got += b.drop_received(0, 256);
    }
    let s = d.wait_for("counts settle", |s| {
        s.apps
            .iter()
            .any(|x| x.name == "b" && x.net.unwrap().rx == TOTAL as u64)
    });
    let a_net = s.apps.iter().find(|x| x.name == "a").unwrap().net.unwrap();
    assert_eq!(a_net.tx, TOTAL as u64);
}

#[test]
fn frames_between_two_apps_arrive_in_order_and_intact() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let (mut a, mut b) = two_busy_apps(&d);
    let to_b = Endpoint {
        ip: b.interface.ip,
        port: 9,
    };
    const TOTAL: u32 = 5_000;
    let (mut sent, mut got) = (0u32, 0u32);
    let t0 = Instant::now();
    while got < TOTAL {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{got} of {sent} sent arrived: {:#?}",
            d.stats().apps
        );
        // Payloads of several lengths, numbered; at most 64 in flight, so
        // that no ring on the way fills (a full ring drops, by design).
        while sent < TOTAL && sent - got < 64 {
            let mut payload = vec![sent as u8; 4 + (sent % 50) as usize];
            payload[..4].copy_from_slice(&sent.to_le_bytes());
            if !a.send_udp(0, b.interface.mac, to_b, 9, &payload) {
                break;
            }
            sent += 1;
        }
        while let Some((bytes, desc)) = b.recv(0) {
            let Ok(Packet::Udp(u)) = ginza_net::parse(&bytes, &b.interface) else {
                panic!("not a UDP datagram: {bytes:?}");
            };
            let n = u32::from_le_bytes(u.payload[..4].try_into().unwrap());
            assert_eq!(n, got, "out of order");
            assert_eq!(u.payload.len(), 4 + (n % 50) as usize);
            assert!(u.payload[4..].iter().all(|&x| x == n as u8), "corrupt");
            got += 1;
            b.give_back(0, desc.buf);
        }
    }
}

#[test]
fn a_broadcast_arp_request_reaches_only_the_app_with_that_ip() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let mut a = register(&d, "a", iface(1), 1).unwrap();
    let mut b = register(&d, "b", iface(2), 1).unwrap();
    let mut c = register(&d, "c", iface(3), 1).unwrap();
    for app in [&a, &b, &c] {
        app.stay_busy(0);
    }
    let mut request = vec![0u8; 64];
    let n = ginza_net::tx::arp_request(&mut request, &a.interface, b.interface.ip).unwrap();
    assert!(a.send_frame(0, &request[..n]));
    let got = recv_within_5s(&mut b);
    assert!(matches!(
        ginza_net::parse(&got.0, &b.interface),
        Ok(Packet::Arp(_))
    ));
    b.give_back(0, got.1.buf);
    // The flood reached c's port too, and stopped there: nothing for c or a
    // after further dataplane polls (one per allocation pass).
    let s = d.wait_passes(10);
    assert!(c.recv(0).is_none());
    assert!(a.recv(0).is_none());
    let rx = |name: &str| {
        s.apps
            .iter()
            .find(|x| x.name == name)
            .unwrap()
            .net
            .unwrap()
            .rx
    };
    assert_eq!((rx("a"), rx("b"), rx("c")), (0, 1, 0));
}

/// Writes `value` at `offset` of an application's region, through its memfd
/// (what a buggy or hostile runtime could do to its own rings).
fn scribble(app: &RawApp, offset: u64, value: u32) {
    use std::os::unix::fs::FileExt;
    let fd = app.region.fd().unwrap().try_clone_to_owned().unwrap();
    std::fs::File::from(fd)
        .write_at(&value.to_le_bytes(), offset)
        .unwrap();
}

#[test]
fn corrupt_packet_rings_disconnect_only_their_app() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let sender = register(&d, "sender", iface(1), 1).unwrap();
    let receiver = register(&d, "receiver", iface(2), 1).unwrap();
    let _bystander = register(&d, "bystander", iface(3), 1).unwrap();
    sender.stay_busy(0);
    // The egress ring's tail (the producer's index, on the ring's second
    // cache line) claims far more packets than the ring holds.
    let egress = sender.region.layout().egress.offset;
    scribble(&sender, egress + 64, 1 << 20);
    // The ingress ring's head (the consumer's index) runs ahead of the tail.
    let ingress = receiver.region.layout().ingress.offset;
    scribble(&receiver, ingress, 1 << 20);
    d.wait_for("sender removed", |s| {
        s.apps.iter().all(|a| a.name != "sender")
    });
    // A request for the receiver makes iokerneld push on its ingress ring.
    let _ = d
        .generator
        .run(load(iface(2), 10_000.0, 5), Duration::from_secs(5));
    let s = d.wait_for("receiver removed", |s| s.apps.len() == 1);
    assert_eq!(s.apps[0].name, "bystander");
    let reason = |name: &str| {
        s.recent_removals
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.reason.clone())
            .unwrap()
    };
    assert!(
        reason("sender").starts_with("kthread 0's egress ring is corrupt"),
        "{}",
        reason("sender")
    );
    assert!(
        reason("receiver").starts_with("kthread 0's ingress ring is corrupt"),
        "{}",
        reason("receiver")
    );
}
