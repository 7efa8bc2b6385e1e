//! The Linux NIC backends (`af_packet`, `af_xdp`) against a real Linux stack:
//! the backend opens the root-namespace end of a veth pair and the test
//! answers, through `ginza_net`, for an address (`peer_ip`) that programs in
//! the namespace (a UDP socket, `ping`) talk to.
//!
//! Needs root, `ip` and `ethtool`; skipped otherwise (failed under CI as
//! root, see `ginza_iokernel::testing`). The tests share a
//! mutex: they run one at a time, and every loop is bounded in time.

use std::net::{SocketAddrV4, UdpSocket};
use std::process::Child;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ginza_iokernel::netns::{self, NetNs};
use ginza_iokernel::nic::linux::{open_link, LinuxNic};
use ginza_iokernel::nic::{Frame, Nic};
use ginza_net::tx::{self, BuildError};
use ginza_net::{parse, ArpOperation, Interface, MacAddr, Packet};

static SERIAL: Mutex<()> = Mutex::new(());

const BACKENDS: [&str; 2] = ["af_packet", "af_xdp"];
/// The MAC the test answers with: not the interface's own, as iokerneld's
/// application MACs are not.
const MAC: MacAddr = MacAddr([0x02, 0, 0, 0x77, 0, 0x01]);
const UDP_PORT: u16 = 7777;
/// Datagrams to this port are echoed verbatim (for `udp_rtt_probe`).
const ECHO_PORT: u16 = 7;

fn serial() -> MutexGuard<'static, ()> {
    // A test that failed while holding the lock poisons it; the others
    // still run.
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The test's side of the link: answers ARP and ping for `iface`, replies
/// `reply:<payload>` to UDP datagrams to `UDP_PORT` and keeps their payloads,
/// echoes datagrams to `ECHO_PORT`.
struct Responder {
    nic: LinuxNic,
    iface: Interface,
    udp_payloads: Vec<Vec<u8>>,
    echo_requests: u64,
}

impl Responder {
    fn open(backend: &str, ns: &NetNs, buffer_size: usize) -> Responder {
        let spec = format!("{backend}:{}", ns.host_if);
        let mut nic = open_link(&spec, 256, buffer_size)
            .unwrap_or_else(|error| panic!("opening {spec}: {error}"));
        // AF_XDP: frames for `peer_ip` come to the link, the rest to Linux.
        nic.claim_address(ns.peer_ip).unwrap();
        Responder {
            nic,
            iface: Interface {
                mac: MAC,
                ip: ns.peer_ip,
            },
            udp_payloads: Vec::new(),
            echo_requests: 0,
        }
    }

    /// One receive burst and the replies to it; returns how many frames
    /// came in.
    fn poll(&mut self) -> usize {
        let mut received = Vec::new();
        let count = self.nic.rx_burst(&mut received, 32);
        let mut replies = Vec::new();
        for frame in received {
            if let Some(reply) = self.answer(&frame) {
                replies.push(reply);
            }
            self.nic.pool_mut().free(frame).unwrap();
        }
        self.send(replies);
        count
    }

    fn answer(&mut self, frame: &Frame) -> Option<Frame> {
        // Copied so the reply can be built in the same pool.
        let bytes = self.nic.pool().bytes(frame).to_vec();
        let iface = self.iface;
        match parse(&bytes, &iface) {
            Ok(Packet::Arp(request)) if request.operation == ArpOperation::Request => {
                self.build(|buffer| tx::arp_reply(buffer, &iface, &request))
            }
            Ok(Packet::IcmpEchoRequest(request)) => {
                self.echo_requests += 1;
                self.build(|buffer| tx::icmp_echo_reply(buffer, &iface, &request))
            }
            Ok(Packet::Udp(datagram)) if datagram.dst.port == ECHO_PORT => self.build(|buffer| {
                tx::udp_datagram(
                    buffer,
                    &iface,
                    datagram.src_mac,
                    ECHO_PORT,
                    datagram.src,
                    datagram.payload,
                )
            }),
            Ok(Packet::Udp(datagram)) if datagram.dst.port == UDP_PORT => {
                self.udp_payloads.push(datagram.payload.to_vec());
                let reply = [b"reply:".as_slice(), datagram.payload].concat();
                self.build(|buffer| {
                    tx::udp_datagram(
                        buffer,
                        &iface,
                        datagram.src_mac,
                        UDP_PORT,
                        datagram.src,
                        &reply,
                    )
                })
            }
            // Other traffic of the namespace, or frames not for us.
            _ => None,
        }
    }

    fn build(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> Result<usize, BuildError>,
    ) -> Option<Frame> {
        let pool = self.nic.pool_mut();
        let mut frame = pool.alloc()?;
        let len = write(pool.buffer_mut(&mut frame)).expect("a reply fits a buffer");
        pool.set_len(&mut frame, len).unwrap();
        Some(frame)
    }

    /// Transmits `frames`, retrying a full link for at most 100 ms.
    fn send(&mut self, mut frames: Vec<Frame>) {
        let deadline = Instant::now() + Duration::from_millis(100);
        while !frames.is_empty() && Instant::now() < deadline {
            if self.nic.tx_burst(&mut frames) == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        for frame in frames {
            self.nic.pool_mut().free(frame).unwrap();
        }
    }

    /// Polls until `done` or `timeout`; returns whether `done` came true.
    fn serve_until(&mut self, timeout: Duration, done: impl FnMut(&Responder) -> bool) -> bool {
        self.serve(timeout, false, done)
    }

    /// `serve_until`, sleeping 50 µs after an empty poll unless `busy`.
    fn serve(
        &mut self,
        timeout: Duration,
        busy: bool,
        mut done: impl FnMut(&Responder) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if done(self) {
                return true;
            }
            if self.poll() == 0 && !busy {
                // Two cores: leave one to the namespace's programs.
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        done(self)
    }

    /// Serves until `child` exits (killed after `timeout`).
    fn serve_while_running(&mut self, child: &mut Child, timeout: Duration) {
        self.serve_until(timeout, |_| false_if_running(child));
        let _ = child.kill();
    }
}

fn false_if_running(child: &mut Child) -> bool {
    !matches!(child.try_wait(), Ok(None))
}

fn udp_roundtrip(backend: &str) {
    let _serial = serial();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let mut responder = Responder::open(backend, &ns, 2048);
    let bind = SocketAddrV4::new(ns.ns_ip, 0);
    let target = SocketAddrV4::new(ns.peer_ip, UDP_PORT);
    // The Linux side resends until answered: its first datagram may wait
    // for ARP, and the kernel retries ARP only once a second.
    let client = ns
        .spawn_in(
            move || -> std::io::Result<Option<(Vec<u8>, std::net::SocketAddr)>> {
                let socket = UdpSocket::bind(bind)?;
                socket.set_read_timeout(Some(Duration::from_millis(50)))?;
                let mut buffer = [0u8; 2048];
                for attempt in 0..60 {
                    socket.send_to(format!("hello {attempt}").as_bytes(), target)?;
                    if let Ok((len, from)) = socket.recv_from(&mut buffer) {
                        return Ok(Some((buffer[..len].to_vec(), from)));
                    }
                }
                Ok(None)
            },
        )
        .unwrap();
    let finished = responder.serve_until(Duration::from_secs(5), |_| client.is_finished());
    assert!(
        finished,
        "{backend}: the Linux UDP client did not finish in 5 s"
    );
    let (reply, from) = client
        .join()
        .unwrap()
        .unwrap()
        .unwrap_or_else(|| panic!("{backend}: no UDP reply reached the Linux socket"));
    let sent = responder
        .udp_payloads
        .first()
        .unwrap_or_else(|| panic!("{backend}: no UDP datagram came out of rx_burst"))
        .clone();
    assert!(sent.starts_with(b"hello "), "{sent:?}");
    assert!(reply.starts_with(b"reply:hello "), "{reply:?}");
    assert_eq!(from, std::net::SocketAddr::V4(target));
    let stats = responder.nic.stats();
    assert!(stats.rx_frames >= 2 && stats.tx_frames >= 2, "{stats:?}");
    assert_eq!(stats.drops.total(), stats.drops.rx_kernel, "{stats:?}");
    assert_eq!(responder.nic.pool().in_use(), 0);
}

fn ping(backend: &str) {
    let _serial = serial();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let mut responder = Responder::open(backend, &ns, 2048);
    let peer = ns.peer_ip.to_string();
    let mut child = ns
        .command(&["ping", "-n", "-c", "3", "-i", "0.2", "-W", "2", &peer])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ping (Debian package iputils-ping)");
    responder.serve_while_running(&mut child, Duration::from_secs(5));
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.contains(" 0% packet loss"),
        "{backend}: ping failed ({}):\n{text}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(responder.echo_requests, 3);
}

fn oversized_and_runt_frames_are_counted(backend: &str) {
    let _serial = serial();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let peer = ns.peer_ip.to_string();
    {
        // 512-byte buffers: ARP fits, a 1042-byte echo request does not.
        let mut responder = Responder::open(backend, &ns, 512);
        let mut child = ns
            .command(&[
                "ping", "-n", "-c", "2", "-i", "0.2", "-W", "1", "-s", "1000", &peer,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ping (Debian package iputils-ping)");
        responder.serve_while_running(&mut child, Duration::from_secs(5));
        let _ = child.wait();
        let stats = responder.nic.stats();
        assert!(stats.drops.rx_oversized >= 1, "{backend}: {stats:?}");
        assert_eq!(responder.echo_requests, 0);
        assert_eq!(responder.nic.pool().in_use(), 0);
    }
    if backend == "af_xdp" {
        // The first link's program went with it.
        let link = std::process::Command::new("ip")
            .args(["link", "show", "dev", &ns.host_if])
            .output()
            .unwrap();
        let link = String::from_utf8_lossy(&link.stdout);
        assert!(!link.contains("xdp"), "{link}");
    }
    let mut responder = Responder::open(backend, &ns, 2048);
    let pool = responder.nic.pool_mut();
    let runt = pool.alloc_copy(&[0xff; 5]).unwrap();
    // Longer than the veth's 1500-byte MTU plus its header.
    let mut jumbo = vec![0xffu8; 2000];
    jumbo[6..12].copy_from_slice(&MAC.0);
    let jumbo = pool.alloc_copy(&jumbo).unwrap();
    let mut frames = vec![runt, jumbo];
    assert_eq!(responder.nic.tx_burst(&mut frames), 2);
    let stats = responder.nic.stats();
    assert_eq!(
        (
            stats.drops.tx_runt,
            stats.drops.tx_oversized,
            stats.tx_frames
        ),
        (1, 1, 0),
        "{backend}: {stats:?}"
    );
    assert_eq!(responder.nic.pool().in_use(), 0);
}

/// A burst larger than the kernel's AF_XDP copy-mode batch (32) all reaches
/// a Linux socket, in order.
fn burst_reaches_linux(backend: &str) {
    const COUNT: u32 = 200;
    const PORT: u16 = 9000;
    let _serial = serial();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let mut responder = Responder::open(backend, &ns, 2048);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let bind = SocketAddrV4::new(ns.ns_ip, PORT);
    let receiver = ns
        .spawn_in(move || -> std::io::Result<Vec<u32>> {
            let socket = UdpSocket::bind(bind)?;
            socket.set_read_timeout(Some(Duration::from_millis(100)))?;
            ready_tx.send(()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut got = Vec::new();
            let mut buffer = [0u8; 64];
            while got.len() < COUNT as usize && Instant::now() < deadline {
                if let Ok(4) = socket.recv(&mut buffer) {
                    got.push(u32::from_le_bytes(buffer[..4].try_into().unwrap()));
                }
            }
            Ok(got)
        })
        .unwrap();
    ready_rx.recv_timeout(Duration::from_secs(2)).unwrap();
    // The namespace's MAC is known: no ARP needed.
    let iface = responder.iface;
    let destination = ginza_net::Endpoint::new(ns.ns_ip, PORT);
    let mut frames = Vec::new();
    for sequence in 0..COUNT {
        let frame = responder.build(|buffer| {
            tx::udp_datagram(
                buffer,
                &iface,
                MacAddr(ns.ns_mac),
                UDP_PORT,
                destination,
                &sequence.to_le_bytes(),
            )
        });
        frames.push(frame.expect("the pool has 256 buffers"));
    }
    responder.send(frames);
    responder.serve_until(Duration::from_secs(4), |_| receiver.is_finished());
    let got = receiver.join().unwrap().unwrap();
    assert_eq!(got, (0..COUNT).collect::<Vec<_>>(), "{backend}");
    assert_eq!(responder.nic.stats().tx_frames, u64::from(COUNT));
    assert_eq!(responder.nic.pool().in_use(), 0);
}

#[test]
fn af_packet_burst_reaches_linux() {
    burst_reaches_linux(BACKENDS[0]);
}

#[test]
fn af_xdp_burst_reaches_linux() {
    burst_reaches_linux(BACKENDS[1]);
}

#[test]
fn af_packet_udp_roundtrip() {
    udp_roundtrip(BACKENDS[0]);
}

#[test]
fn af_packet_ping() {
    ping(BACKENDS[0]);
}

#[test]
fn af_packet_oversized_and_runt_frames_are_counted() {
    oversized_and_runt_frames_are_counted(BACKENDS[0]);
}

#[test]
fn af_xdp_udp_roundtrip() {
    udp_roundtrip(BACKENDS[1]);
}

#[test]
fn af_xdp_ping() {
    ping(BACKENDS[1]);
}

#[test]
fn af_xdp_oversized_and_runt_frames_are_counted() {
    oversized_and_runt_frames_are_counted(BACKENDS[1]);
}

/// Round-trip times of UDP datagrams from a Linux socket in the namespace to
/// the test answering through each backend, busy-polling. A measurement, not
/// a check: `cargo test -p ginza-iokernel --test nic_linux -- --ignored
/// --nocapture`.
#[test]
#[ignore = "a measurement, not a check: run with --ignored --nocapture"]
fn udp_echo_rtt() {
    for backend in BACKENDS {
        let _serial = serial();
        let Some(ns) = NetNs::create_or_skip() else {
            return;
        };
        let mut responder = Responder::open(backend, &ns, 2048);
        let bind = SocketAddrV4::new(ns.ns_ip, 0);
        let target = SocketAddrV4::new(ns.peer_ip, ECHO_PORT);
        let probe = ns
            .spawn_in(move || {
                // Warm-up (ARP), then the measured run.
                netns::udp_rtt_probe(bind, target, 100, 32, Duration::from_millis(100))?;
                netns::udp_rtt_probe(bind, target, 2000, 32, Duration::from_millis(10))
            })
            .unwrap();
        responder.serve(Duration::from_secs(20), true, |_| probe.is_finished());
        let rtts = probe.join().unwrap().unwrap();
        let mut micros: Vec<f64> = rtts
            .iter()
            .flatten()
            .map(|rtt| rtt.as_secs_f64() * 1e6)
            .collect();
        micros.sort_by(f64::total_cmp);
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
        println!(
            "{backend}: {} of {} answered; RTT µs p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
            micros.len(),
            rtts.len(),
            at(0.5),
            at(0.9),
            at(0.99),
            at(1.0)
        );
    }
}

/// The fixture's Linux echo peer (the benchmarks' baseline) answers the
/// fixture's probe, inside the namespace.
#[test]
fn linux_echo_peer_answers_the_probe() {
    let _serial = serial();
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    let server = ns.udp_echo_server(7, Duration::from_millis(500)).unwrap();
    let (bind, target) = (
        SocketAddrV4::new(ns.ns_ip, 0),
        SocketAddrV4::new(ns.ns_ip, 7),
    );
    let rtts = ns
        .run_in(move || netns::udp_rtt_probe(bind, target, 10, 64, Duration::from_millis(100)))
        .unwrap()
        .unwrap();
    assert_eq!(rtts.iter().flatten().count(), 10, "{rtts:?}");
    assert_eq!(server.join().unwrap(), 10);
}

#[test]
fn open_names_missing_interfaces_and_unknown_backends() {
    let error = open_link("af_packet:gznoexist9", 8, 2048).unwrap_err();
    assert_eq!(error.to_string(), "interface \"gznoexist9\" does not exist");
    let error = open_link("af_xdp:gznoexist9", 8, 2048).unwrap_err();
    assert_eq!(error.to_string(), "interface \"gznoexist9\" does not exist");
    if !ginza_iokernel::testing::running_as_root() {
        for (spec, message) in [
            ("af_packet:lo", "af_packet needs root (CAP_NET_RAW)"),
            (
                "af_xdp:lo",
                "af_xdp needs root (CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW)",
            ),
        ] {
            assert_eq!(open_link(spec, 8, 2048).unwrap_err().to_string(), message);
        }
    }
    let error = open_link("dpdk:0000:01:00.0", 8, 2048).unwrap_err();
    assert!(
        error.to_string().starts_with("unknown NIC backend \"dpdk:"),
        "{error}"
    );
}
