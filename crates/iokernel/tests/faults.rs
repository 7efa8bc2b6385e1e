//! Fault injection end to end (docs/fault-injection.md): an in-process
//! iokerneld whose switch drops or reorders frames towards one
//! application, two applications played by the test (`RawApp`), and the
//! counters in iokerneld's stats checked against what arrived.
//!
//! Tests hold `lock()`: iokerneld's loop spins while anything holds a core.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::{FaultRule, RecordingActuator};
use ginza_net::{Endpoint, Interface, Ipv4Addr, MacAddr, Packet};
use ginza_proto::messages::FaultStats;
use ginza_proto::StatsReport;

mod common;
use common::{lock, Daemon};

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0, last]),
        ip: Ipv4Addr::new(10, 9, 0, last),
    }
}

fn rule(text: &str) -> FaultRule {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Two busy applications, `a` and `b`, on `d`.
fn pair(d: &Daemon) -> (RawApp, RawApp) {
    let a = RawApp::register(&d.socket, "a", iface(1), 1).unwrap();
    let b = RawApp::register(&d.socket, "b", iface(2), 1).unwrap();
    a.stay_busy(0);
    b.stay_busy(0);
    (a, b)
}

/// The UDP payloads (sequence numbers) `b` has received so far, appended
/// to `got` in arrival order.
fn receive(b: &mut RawApp, got: &mut Vec<u32>) {
    while let Some((bytes, desc)) = b.recv(0) {
        if let Ok(Packet::Udp(u)) = ginza_net::parse(&bytes, &b.interface) {
            if let Ok(n) = <[u8; 4]>::try_from(u.payload) {
                got.push(u32::from_be_bytes(n));
            }
        }
        b.give_back(0, desc.buf);
    }
}

/// `a` sends datagrams 0..n to `b` (bursts of at most 16, `b` reading
/// between them); returns what `b` received by the time the rule's
/// counters and `b`'s own account for all `n`.
fn stream(d: &Daemon, a: &mut RawApp, b: &mut RawApp, n: u32) -> (Vec<u32>, StatsReport) {
    let to_b = Endpoint {
        ip: b.interface.ip,
        port: 9,
    };
    let b_mac = b.interface.mac;
    let mut got = Vec::new();
    let mut next = 0;
    let t0 = Instant::now();
    while next < n {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "sent {next} of {n}: {:#?}",
            d.stats().dataplane
        );
        let end = next + (n - next).min(16);
        while next < end && a.send_udp(0, b_mac, to_b, 1234, &next.to_be_bytes()) {
            next += 1;
        }
        receive(b, &mut got);
    }
    // Everything sent is accounted for: received (or still on its way to
    // b's ring), dropped by the rule, or dropped by b's port.
    loop {
        receive(b, &mut got);
        let s = d.stats();
        let faults = &s.dataplane.faults[0];
        let net = s.apps.iter().find(|x| x.name == "b").unwrap().net.unwrap();
        let held_back = faults.reordered + faults.delayed;
        if faults.frames == u64::from(n)
            && got.len() as u64 + faults.lost() + net.drop_ingress == u64::from(n)
        {
            return (got, s);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} of {n} received, faults {faults:?} ({held_back} held back), b's port {net:?}",
            got.len()
        );
        std::thread::yield_now();
    }
}

#[test]
fn dropped_frames_are_the_missing_datagrams_and_are_counted() {
    let _g = lock();
    let d = Daemon::start_with(RecordingActuator::new(), |c| {
        c.faults = vec![rule("drop=10%,port=app:b,seed=3")];
    });
    let (mut a, mut b) = pair(&d);
    const N: u32 = 3_000;
    let (got, s) = stream(&d, &mut a, &mut b, N);
    let faults: &FaultStats = &s.dataplane.faults[0];
    assert_eq!(faults.port, "app:b");
    let unique: HashSet<u32> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "no datagram twice");
    let b_net = s.apps.iter().find(|x| x.name == "b").unwrap().net.unwrap();
    assert_eq!(b_net.drop_ingress, 0, "the port itself dropped nothing");
    assert_eq!(
        got.len() as u64,
        u64::from(N) - faults.dropped,
        "missing = dropped: {faults:?}"
    );
    // 10 % of 3,000: 300 ± 5 standard deviations (16.4).
    assert!((218..=382).contains(&faults.dropped), "{faults:?}");
    assert_eq!(
        (faults.duplicated, faults.reordered, faults.held_overflow),
        (0, 0, 0)
    );
    // a's frames were not subject to the rule on their way out: a's port
    // sent them all.
    let a_net = s.apps.iter().find(|x| x.name == "a").unwrap().net.unwrap();
    assert_eq!((a_net.tx, a_net.drop_egress), (u64::from(N), 0));
}

#[test]
fn reordered_frames_arrive_out_of_order_and_none_is_lost() {
    let _g = lock();
    let d = Daemon::start_with(RecordingActuator::new(), |c| {
        c.faults = vec![rule("reorder=10%,gap=2,port=02:00:00:00:00:02,seed=9")];
    });
    let (mut a, mut b) = pair(&d);
    const N: u32 = 2_000;
    let (got, s) = stream(&d, &mut a, &mut b, N);
    let faults = &s.dataplane.faults[0];
    assert_eq!(faults.port, "02:00:00:00:00:02");
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..N).collect::<Vec<_>>(), "all arrived, once");
    let late = got.windows(2).filter(|w| w[1] < w[0]).count() as u64;
    assert!(faults.reordered > 100, "{faults:?}");
    assert!(
        late > 0 && late <= faults.reordered,
        "{late} arrivals out of order, {faults:?}"
    );
}

#[test]
fn faults_set_while_running_apply_at_once_and_can_be_lifted() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let (mut a, mut b) = pair(&d);
    assert!(
        d.stats().dataplane.faults.is_empty(),
        "no rule, no fault stats"
    );
    d.faults.set_specs(&["drop=100%,port=app:b"]).unwrap();
    let (got, s) = stream(&d, &mut a, &mut b, 50);
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(s.dataplane.faults[0].dropped, 50);
    // Lifted: the next datagrams arrive, and the counters are gone.
    d.faults.set(Vec::new()).unwrap();
    assert!(d.stats().dataplane.faults.is_empty());
    let to_b = Endpoint {
        ip: b.interface.ip,
        port: 9,
    };
    assert!(a.send_udp(0, b.interface.mac, to_b, 1234, &7u32.to_be_bytes()));
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(5), "nothing arrived");
        receive(&mut b, &mut got);
    }
    assert_eq!(got, [7]);
    // Bad rules are refused before they reach the loop.
    let e = d.faults.set_specs(&["drop=150%"]).unwrap_err();
    assert!(
        e.contains("drop=150%: a probability must be between 0 % and 100 %"),
        "{e}"
    );
    let five = vec![rule("drop=1%"); 5];
    assert!(d.faults.set(five).unwrap_err().contains("at most 4"));
}

/// The generator's replies lost and doubled on their way back
/// (`port=generator,dir=in`): its own accounting agrees with the rule's.
#[test]
fn the_generator_sees_the_losses_and_duplicates_the_rule_counts() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use ginza_iokernel::nic::ServiceTime;
    use ginza_iokernel::LoadRun;

    let _g = lock();
    let d = Daemon::start_with(RecordingActuator::new(), |c| {
        c.faults = vec![rule("drop=5%,duplicate=5%,port=generator,dir=in,seed=5")];
    });
    let mut app = RawApp::register(&d.socket, "echo", iface(1), 1).unwrap();
    // Holding a core: its egress ring is polled all along.
    app.stay_busy(0);
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if app.echo_waiting() == 0 {
                    std::hint::spin_loop();
                }
            }
        })
    };
    // About 400 requests (the count is fixed by the seed): fewer than the
    // echo kthread's ingress ring holds, so that none is dropped there
    // however late the echo thread runs, and every loss is the rule's.
    let mut run = LoadRun::poisson(
        iface(1),
        7,
        4_000.0,
        ServiceTime::Constant { ns: 1_000 },
        Duration::from_millis(100),
    );
    // Every reply not dropped must be in before the counts are compared.
    // The rule's losses keep the run waiting for all of this drain (a reply
    // never comes), so it is a fixed wait: long enough for the echo thread
    // to be given a few ms of CPU on a loaded 2-CPU machine.
    run.drain = Duration::from_secs(3);
    let report = d.generator.run(run, Duration::from_secs(10)).unwrap();
    // Read while the echo application is still registered.
    let s = d.stats();
    stop.store(true, Ordering::Release);
    echo.join().unwrap();
    let st = report.stats;
    let faults = &s.dataplane.faults[0];
    assert_eq!(faults.port, "generator");
    let ring = u64::from(ginza_shm::RegionConfig::new(1).ingress_capacity);
    assert!(300 < st.sent && st.sent < ring, "{st:?}");
    let net = s.apps[0].net.unwrap();
    assert_eq!((net.drop_ingress, net.drop_egress), (0, 0), "{net:?}");
    // Requests went out untouched (the rule is on the way in); every reply
    // came through the rule.
    assert_eq!(faults.frames, st.sent, "{faults:?} {st:?}");
    assert_eq!(st.lost(), faults.dropped, "{faults:?} {st:?}");
    assert_eq!(st.unmatched_replies, faults.duplicated, "{faults:?} {st:?}");
    assert_eq!(st.replies, st.sent - faults.dropped);
    assert!(faults.dropped > 0 && faults.duplicated > 0, "{faults:?}");
}

/// The use the faults are for: a Linux peer in a network namespace behind
/// a veth, iokerneld on the veth's other end (AF_PACKET, the trunk port),
/// `port=trunk` dropping in both directions. A Linux UDP client sends
/// numbered requests one at a time; an application echoes them; every
/// reply that never came is one frame the rule dropped (a request or its
/// reply), and no other frame is lost.
#[test]
fn a_linux_peer_behind_the_trunk_loses_what_the_rule_drops() {
    use std::net::{SocketAddrV4, UdpSocket};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    let _g = lock();
    let Some(ns) = ginza_iokernel::netns::NetNs::create_or_skip() else {
        return;
    };
    let nic = format!("af_packet:{}", ns.host_if);
    let d = Daemon::start_with(RecordingActuator::new(), |c| {
        c.nic = nic;
        c.faults = vec![rule("drop=10%,port=trunk,proto=udp,seed=11")];
    });
    let server = Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0, 0x77]),
        ip: Ipv4Addr::from(ns.peer_ip.octets()),
    };
    let mut app = RawApp::register(&d.socket, "echo", server, 1).unwrap();
    app.stay_busy(0);
    // The application answers no ARP: a static entry on the Linux side.
    ns.exec_ok(&[
        "ip",
        "neigh",
        "replace",
        &ns.peer_ip.to_string(),
        "lladdr",
        &server.mac.to_string(),
        "dev",
        &ns.ns_if,
    ])
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if app.echo_waiting() == 0 {
                    std::hint::spin_loop();
                }
            }
        })
    };
    const N: u32 = 300;
    let replies = Arc::new(Mutex::new(HashSet::new()));
    let received = Arc::new(AtomicU64::new(0));
    let client_stop = Arc::new(AtomicBool::new(false));
    let bind = SocketAddrV4::new(ns.ns_ip, 0);
    let target = SocketAddrV4::new(ns.peer_ip, 7);
    let client = {
        let (replies, received, client_stop) =
            (replies.clone(), received.clone(), client_stop.clone());
        ns.spawn_in(move || -> std::io::Result<()> {
            let socket = UdpSocket::bind(bind)?;
            // Short: a request whose reply does not come within it was
            // probably dropped; a reply that comes later still counts.
            socket.set_read_timeout(Some(Duration::from_millis(5)))?;
            let mut buffer = [0u8; 64];
            let mut take_replies = |socket: &UdpSocket| {
                while let Ok((4, _)) = socket.recv_from(&mut buffer) {
                    let n = u32::from_be_bytes(buffer[..4].try_into().unwrap());
                    if replies.lock().unwrap().insert(n) {
                        received.fetch_add(1, Ordering::Release);
                    }
                }
            };
            for i in 0..N {
                socket.send_to(&i.to_be_bytes(), target)?;
                take_replies(&socket);
            }
            while !client_stop.load(Ordering::Acquire) {
                take_replies(&socket);
            }
            Ok(())
        })
        .unwrap()
    };
    // Every request answered or dropped (the request or its reply).
    let t0 = Instant::now();
    let faults = loop {
        let s = d.stats();
        let faults = s.dataplane.faults[0].clone();
        let got = received.load(Ordering::Acquire);
        if got + faults.lost() == u64::from(N) {
            break faults;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{got} replies of {N}, {faults:?}, {:?}",
            s.dataplane
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    client_stop.store(true, Ordering::Release);
    client.join().unwrap().unwrap();
    stop.store(true, Ordering::Release);
    echo.join().unwrap();
    let replies = replies.lock().unwrap();
    assert_eq!(replies.len() as u64, u64::from(N) - faults.dropped);
    assert!(replies.iter().all(|&n| n < N));
    // 10 % of the 300 requests and of the ~270 replies: about 57.
    assert!((20..=100).contains(&faults.dropped), "{faults:?}");
    // The rule saw each request, and each reply to a request it let through.
    let requests_dropped = 2 * u64::from(N) - faults.frames;
    assert!(
        requests_dropped > 0 && requests_dropped < faults.dropped,
        "{faults:?}"
    );
    assert_eq!(faults.held_overflow, 0);
}
