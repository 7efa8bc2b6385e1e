//! iokerneld's XDP program (`nic/bpf`): the kernel's verifier loads it,
//! `BPF_PROG_TEST_RUN` checks its verdict on crafted frames, and on a veth
//! the host keeps its own address on the interface iokerneld drives —
//! while iokerneld runs, and after it stops or is killed (the program is
//! detached with its process).
//!
//! Needs root (`CAP_BPF`, `CAP_NET_ADMIN`), `ip`, `ethtool` and `ping`;
//! skipped otherwise (failed under CI as root, see
//! `ginza_iokernel::testing`). The tests that drive the veth take the
//! lock of `common` (one iokerneld at a time).

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_iokernel::netns::NetNs;
use ginza_iokernel::nic::af_xdp::AfXdp;
use ginza_iokernel::nic::bpf::{Verdict, XdpSteering};
use ginza_iokernel::nic::Nic;
use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::testing::{running_as_root, skip};
use ginza_iokernel::RecordingActuator;
use ginza_net::{tx, ArpOperation, Endpoint, Interface, Ipv4Addr, MacAddr, Packet};

mod common;
use common::{lock, test_cores, Daemon};

const OURS: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
const OTHER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 3);
const APP_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0d, 0x01]);
const SENDER: Interface = Interface {
    mac: MacAddr([0x02, 0, 0, 0, 0, 0x09]),
    ip: Ipv4Addr::new(10, 99, 0, 1),
};

/// Whether this process may load BPF programs; skips the test if not.
fn can_load_bpf() -> bool {
    if !running_as_root() {
        skip("loading a BPF program needs root (CAP_BPF)");
        return false;
    }
    true
}

fn udp_to(ip: Ipv4Addr) -> Vec<u8> {
    let mut buf = vec![0u8; 128];
    let n = tx::udp_datagram(
        &mut buf,
        &SENDER,
        APP_MAC,
        4000,
        Endpoint { ip, port: 7 },
        b"ping",
    )
    .unwrap();
    buf.truncate(n);
    buf
}

fn arp_request_for(ip: Ipv4Addr) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let n = tx::arp_request(&mut buf, &SENDER, ip).unwrap();
    buf.truncate(n);
    buf
}

/// Every crafted frame with the verdict the program owes it while `OURS`
/// is claimed (`redirect`: what a frame for a Ginza application gets).
fn crafted_frames(redirect: Verdict) -> Vec<(&'static str, Vec<u8>, Verdict)> {
    let ours = udp_to(OURS);
    let mut arp_reply = arp_request_for(OURS);
    arp_reply[21] = 2; // operation: reply
    let mut ipv6 = ours.clone();
    ipv6[12..14].copy_from_slice(&[0x86, 0xdd]);
    let mut vlan = ours[..12].to_vec();
    vlan.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    vlan.extend_from_slice(&ours[12..]);
    let mut version6 = ours.clone();
    version6[14] = 0x65;
    let mut short_ihl = ours.clone();
    short_ihl[14] = 0x44;
    let mut arp_ipv6 = arp_request_for(OURS);
    arp_ipv6[16..18].copy_from_slice(&[0x86, 0xdd]);
    let mut arp_hlen = arp_request_for(OURS);
    arp_hlen[18] = 8;
    let mut lldp = ours.clone();
    lldp[12..14].copy_from_slice(&[0x88, 0xcc]);
    let mut icmp = ours.clone();
    icmp[23] = 1; // protocol ICMP: the program looks at addresses only
    vec![
        ("UDP to ours", ours.clone(), redirect),
        ("ICMP to ours", icmp, redirect),
        ("UDP to another address", udp_to(OTHER), Verdict::Pass),
        ("ARP request for ours", arp_request_for(OURS), redirect),
        ("ARP reply to ours", arp_reply, redirect),
        (
            "ARP request for another address",
            arp_request_for(OTHER),
            Verdict::Pass,
        ),
        ("ARP for ours, IPv6 protocol", arp_ipv6, Verdict::Pass),
        ("ARP for ours, hardware length 8", arp_hlen, Verdict::Pass),
        (
            "ARP for ours, truncated to 41 bytes",
            arp_request_for(OURS)[..41].to_vec(),
            Verdict::Pass,
        ),
        ("IPv6 ethertype", ipv6, Verdict::Pass),
        ("VLAN-tagged IPv4 to ours", vlan, Verdict::Pass),
        ("LLDP ethertype", lldp, Verdict::Pass),
        ("IPv4 version 6", version6, Verdict::Pass),
        ("IPv4 header length 4 words", short_ihl, Verdict::Pass),
        (
            "IPv4 to ours, truncated to 33 bytes",
            ours[..33].to_vec(),
            Verdict::Pass,
        ),
        ("Ethernet header only", ours[..14].to_vec(), Verdict::Pass),
    ]
}

fn check_verdicts(steering: &XdpSteering, redirect: Verdict) {
    for (what, frame, expected) in crafted_frames(redirect) {
        let got = steering
            .verdict(&frame)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got, expected, "{what}");
    }
}

/// The verifier accepts the program, the address map follows claims and
/// releases (counted), and with no socket in the socket map even a frame
/// to a claimed address goes to Linux (the redirect's fallback).
#[test]
fn the_verifier_loads_the_program_and_claims_fill_the_map() {
    if !can_load_bpf() {
        return;
    }
    let mut steering = XdpSteering::load(1).expect("the verifier accepts the program");
    assert!(!steering.map_holds(OURS).unwrap());
    steering.claim(OURS).unwrap();
    steering.claim(OURS).unwrap();
    assert!(steering.map_holds(OURS).unwrap());
    assert!(!steering.map_holds(OTHER).unwrap());
    check_verdicts(&steering, Verdict::Pass);
    steering.release(OURS).unwrap();
    assert!(
        steering.map_holds(OURS).unwrap(),
        "claimed twice, released once"
    );
    steering.release(OURS).unwrap();
    assert!(!steering.map_holds(OURS).unwrap());
    steering.release(OURS).unwrap();
    // Too short for an Ethernet header: the kernel refuses to run it.
    let error = steering.verdict(&[0u8; 13]).unwrap_err();
    assert!(
        error.to_string().starts_with("BPF_PROG_TEST_RUN"),
        "{error}"
    );
}

/// With iokerneld's socket in the map (an AF_XDP link on a veth), frames
/// for a claimed address are redirected, every other one passed.
#[test]
fn verdicts_on_crafted_frames() {
    let _g = lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let mut link = AfXdp::open(&ns.host_if, 64, 2048).unwrap();
    link.claim_address(OURS).unwrap();
    check_verdicts(link.steering(), Verdict::Redirect);
    link.release_address(OURS);
    for (what, frame, _) in crafted_frames(Verdict::Redirect) {
        assert_eq!(
            link.steering().verdict(&frame).unwrap(),
            Verdict::Pass,
            "{what}, after the release"
        );
    }
}

/// The direct path's entries (docs/direct-path.md): an address whose value
/// names an own socket's slot is redirected through the own sockets' map,
/// even with no socket of iokerneld's in the map; cleared, it goes back to
/// iokerneld's (none here: passed). Refusals name what was wrong.
#[test]
fn an_own_socket_in_the_map_takes_its_address() {
    use std::os::fd::AsRawFd;

    let _g = lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let own = ns.own_socket(0, 64).unwrap();
    let fd = own.fd().as_raw_fd();
    let mut steering = XdpSteering::load(1).unwrap();
    let unclaimed = steering.set_own_socket(OURS, 3, 0, fd).unwrap_err();
    assert!(unclaimed.to_string().contains("not claimed"), "{unclaimed}");
    steering.claim(OURS).unwrap();
    let bad_queue = steering.set_own_socket(OURS, 3, 1, fd).unwrap_err();
    assert!(bad_queue.to_string().contains("queue 1"), "{bad_queue}");
    steering.set_own_socket(OURS, 3, 0, fd).unwrap();
    assert_eq!(steering.map_value(OURS).unwrap(), Some(4));
    check_verdicts(&steering, Verdict::Redirect);
    steering.clear_own_socket(OURS, 3, 0).unwrap();
    assert_eq!(steering.map_value(OURS).unwrap(), Some(0));
    check_verdicts(&steering, Verdict::Pass);
}

/// An application's own socket (the direct path) is refused with the
/// reason: by an iokerneld whose interface was not opened for it, when the
/// descriptor is not an AF_XDP socket, on iokerneld's queue 0, and a second
/// time; and accepted otherwise.
#[test]
fn own_sockets_are_refused_with_the_reason() {
    use std::os::fd::AsFd;

    let _g = lock();
    let Some(ns) = NetNs::create_with_queues_or_skip(2) else {
        return;
    };
    let own = ns.own_socket(1, 64).unwrap();
    let iface = Interface {
        mac: APP_MAC,
        ip: ns.peer_ip,
    };
    let refusal = |r: Result<(), ginza_proto::client::ClientError>| r.unwrap_err().to_string();

    let switch_only = format!("af_xdp:{}", ns.host_if);
    let d = Daemon::start_with(RecordingActuator::new(), |c| c.nic = switch_only);
    let app = RawApp::register(&d.socket, "own-refused", iface, 1).unwrap();
    let e = refusal(app.conn.attach_direct_socket(1, own.fd()));
    assert!(e.contains("without the direct path"), "{e}");
    drop(app);
    drop(d);

    let direct = format!("af_xdp:{},direct", ns.host_if);
    let d = Daemon::start_with(RecordingActuator::new(), |c| c.nic = direct);
    let app = RawApp::register(&d.socket, "own-accepted", iface, 1).unwrap();
    let not_a_socket = ginza_sys::eventfd::new().unwrap();
    let e = refusal(app.conn.attach_direct_socket(1, not_a_socket.as_fd()));
    assert!(e.contains("not an AF_XDP socket"), "{e}");
    let e = refusal(app.conn.attach_direct_socket(0, own.fd()));
    assert!(e.contains("queue 0 is iokerneld's"), "{e}");
    app.conn.attach_direct_socket(1, own.fd()).unwrap();
    let e = refusal(app.conn.attach_direct_socket(1, own.fd()));
    assert!(e.contains("own socket already"), "{e}");
}

/// `ip link show dev IF` mentions an XDP program.
fn xdp_attached(ifname: &str) -> bool {
    let out = Command::new("ip")
        .args(["link", "show", "dev", ifname])
        .output()
        .expect("ip (iproute2)");
    assert!(out.status.success(), "ip link show dev {ifname}");
    String::from_utf8_lossy(&out.stdout).contains("xdp")
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `ping -c 3` from the namespace to `ip` succeeds.
fn ping_ok(ns: &NetNs, ip: Ipv4Addr) -> Result<(), String> {
    let out = ns
        .exec(&[
            "ping",
            "-n",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "2",
            &ip.to_string(),
        ])
        .map_err(|e| format!("ping (Debian package iputils-ping): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.contains(" 0% packet loss") {
        Ok(())
    } else {
        Err(format!("ping {ip} failed ({}): {text}", out.status))
    }
}

/// A Linux TCP connection from the namespace to a Linux listener on `ip`
/// in the root namespace carries a request and its echo.
fn tcp_ok(ns: &NetNs, ip: Ipv4Addr) {
    let listener = TcpListener::bind(SocketAddrV4::new(ip, 0)).unwrap();
    let target = match listener.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let server = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf)?;
        conn.write_all(&buf)?;
        Ok(buf.to_vec())
    });
    let client = ns
        .spawn_in(move || -> std::io::Result<Vec<u8>> {
            let mut conn = TcpStream::connect_timeout(&target.into(), Duration::from_secs(5))?;
            conn.set_read_timeout(Some(Duration::from_secs(5)))?;
            conn.write_all(b"hello")?;
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf)?;
            Ok(buf.to_vec())
        })
        .unwrap();
    assert_eq!(client.join().unwrap().expect("the TCP client"), b"hello");
    assert_eq!(server.join().unwrap().expect("the TCP server"), b"hello");
}

/// Plays a Ginza application at `iface`: answers ARP, ping and echoes UDP
/// until `stop`; counts the frames it got that were for `host_ip` (none
/// should reach it).
fn serve_app(
    mut app: RawApp,
    iface: Interface,
    host_ip: Ipv4Addr,
    stop: Arc<AtomicBool>,
    strays: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reply = vec![0u8; 2048];
        while !stop.load(Ordering::Acquire) {
            let Some((bytes, desc)) = app.recv(0) else {
                std::thread::sleep(Duration::from_micros(50));
                continue;
            };
            let host = host_ip.octets();
            let for_host = bytes.len() >= 42
                && ((bytes[12..14] == [0x08, 0x00] && bytes[30..34] == host)
                    || (bytes[12..14] == [0x08, 0x06] && bytes[38..42] == host));
            if for_host {
                strays.fetch_add(1, Ordering::Relaxed);
            }
            let built = match ginza_net::parse(&bytes, &iface) {
                Ok(Packet::Arp(r)) if r.operation == ArpOperation::Request => {
                    tx::arp_reply(&mut reply, &iface, &r).ok()
                }
                Ok(Packet::IcmpEchoRequest(r)) => tx::icmp_echo_reply(&mut reply, &iface, &r).ok(),
                Ok(Packet::Udp(d)) => {
                    tx::udp_datagram(&mut reply, &iface, d.src_mac, d.dst.port, d.src, d.payload)
                        .ok()
                }
                _ => None,
            };
            app.give_back(0, desc.buf);
            if let Some(n) = built {
                while !app.send_frame(0, &reply[..n]) {
                    std::hint::spin_loop();
                }
            }
        }
    })
}

/// iokerneld drives the veth with AF_XDP and serves an application at
/// `peer_ip`; the host's own address on the same interface keeps
/// answering ping and TCP, and none of its frames reach the application.
#[test]
fn the_host_keeps_its_address_while_an_application_is_served() {
    let _g = lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let host = ns.add_host_address(3).unwrap();
    let nic = format!("af_xdp:{}", ns.host_if);
    let d = Daemon::start_with(RecordingActuator::new(), |c| c.nic = nic);
    let iface = Interface {
        mac: APP_MAC,
        ip: ns.peer_ip,
    };
    let app = RawApp::register(&d.socket, "xdp-app", iface, 1).unwrap();
    app.stay_busy(0);
    assert!(xdp_attached(&ns.host_if));
    let stop = Arc::new(AtomicBool::new(false));
    let strays = Arc::new(AtomicU64::new(0));
    let server = serve_app(app, iface, host.ip, stop.clone(), strays.clone());

    // The application: ARP and ping answered by it, UDP echoed.
    ping_ok(&ns, ns.peer_ip).unwrap();
    // Each datagram sent again, like a real client, until echoed: on a
    // loaded 2-CPU machine a turn of the echo loop may come late.
    let target = SocketAddrV4::new(ns.peer_ip, 7);
    let bind = SocketAddrV4::new(ns.ns_ip, 0);
    let echoed = ns
        .run_in(move || -> std::io::Result<u32> {
            let socket = std::net::UdpSocket::bind(bind)?;
            socket.connect(target)?;
            socket.set_read_timeout(Some(Duration::from_millis(200)))?;
            let mut reply = [0u8; 64];
            let mut echoed = 0;
            for sequence in 0..100u32 {
                let deadline = Instant::now() + Duration::from_secs(10);
                'resend: while Instant::now() < deadline {
                    socket.send(&sequence.to_le_bytes())?;
                    while let Ok(n) = socket.recv(&mut reply) {
                        if reply[..n] == sequence.to_le_bytes() {
                            echoed += 1;
                            break 'resend;
                        }
                    }
                }
            }
            Ok(echoed)
        })
        .unwrap()
        .unwrap();
    assert_eq!(echoed, 100, "UDP datagrams echoed by the application");
    // The host, on the same interface at the same time.
    ping_ok(&ns, host.ip).unwrap();
    tcp_ok(&ns, host.ip);
    ping_ok(&ns, ns.peer_ip).unwrap();

    stop.store(true, Ordering::Release);
    server.join().unwrap();
    assert_eq!(
        strays.load(Ordering::Relaxed),
        0,
        "host frames reached the app"
    );
    let s = d.stats();
    assert!(s.dataplane.nic_rx_frames >= 106, "{:?}", s.dataplane);
    drop(d);
    wait_until("the program's detachment", Duration::from_secs(5), || {
        !xdp_attached(&ns.host_if)
    });
}

/// Starts the `iokerneld` binary on `af_xdp:IF` and waits until its
/// program is on the interface.
fn start_iokerneld(ns: &NetNs, socket: &std::path::Path) -> Child {
    let cores = ginza_sys::cpulist::format(&test_cores());
    let mut child = Command::new(env!("CARGO_BIN_EXE_iokerneld"))
        .args(["--cores", &cores, "--idle-sleep", "1ms", "--nic"])
        .arg(format!("af_xdp:{}", ns.host_if))
        .arg("--socket")
        .arg(socket)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_until("iokerneld's XDP program", Duration::from_secs(10), || {
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "iokerneld exited early"
        );
        xdp_attached(&ns.host_if)
    });
    child
}

/// Stopped (SIGTERM) and killed (SIGKILL), iokerneld leaves no program on
/// the interface, and the host's address answers as before.
#[test]
fn stopping_or_killing_iokerneld_detaches_the_program() {
    use rustix::process::{kill_process, Pid, Signal};

    let _g = lock();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let host = ns.add_host_address(3).unwrap();
    let dir = std::env::temp_dir().join(format!("ginza-xdp-{}", std::process::id()));
    for signal in [Signal::TERM, Signal::KILL] {
        let socket = dir.join(format!("iokerneld-{signal:?}.sock"));
        let mut child = start_iokerneld(&ns, &socket);
        ping_ok(&ns, host.ip).unwrap_or_else(|e| panic!("while iokerneld runs: {e}"));
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        kill_process(pid, signal).unwrap();
        let status = child.wait().unwrap();
        if signal == Signal::TERM {
            assert!(status.success(), "a clean stop: {status}");
        } else {
            assert!(!status.success(), "{status}");
        }
        wait_until(
            &format!("the program's detachment after {signal:?}"),
            Duration::from_secs(5),
            || !xdp_attached(&ns.host_if),
        );
        ping_ok(&ns, host.ip).unwrap_or_else(|e| panic!("after {signal:?}: {e}"));
        tcp_ok(&ns, host.ip);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
