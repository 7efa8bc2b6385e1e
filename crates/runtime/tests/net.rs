//! The runtime's network stack.
//!
//! * Unit level: the stack driven directly ([`Harness`]), the test playing
//!   iokerneld on the other end of a heap region and an ingress pool.
//! * End to end: runtimes under an in-process iokerneld with its dataplane
//!   (tests that start iokerneld hold `LOCK`).

mod common;

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::{LoadRun, GENERATOR_IP, GENERATOR_MAC};
use ginza_net::{tx, ArpOperation, DropKind, Endpoint, Interface, Ipv4Addr, MacAddr, Packet};
use ginza_proto::{client, RequestHeader};
use ginza_runtime::net::testing::{Harness, SendOutcome};
use ginza_runtime::net::{NetConfig, NetStats, UdpSocket};
use ginza_runtime::{Class, Config, Handle, IokernelConfig};
use ginza_shm::{
    BufferLedger, IngressPool, IokernelEnd, PacketDesc, Region, RegionConfig, PKT_BUFFER_SIZE,
};

// ---- unit level ------------------------------------------------------------

const APP: Interface = Interface {
    mac: MacAddr([0x02, 0, 0, 0, 0, 0x01]),
    ip: Ipv4Addr::new(10, 0, 0, 1),
};
const PEER: Interface = Interface {
    mac: MacAddr([0x02, 0, 0, 0, 0, 0x02]),
    ip: Ipv4Addr::new(10, 0, 0, 2),
};
const POOL: u32 = 64;

/// The test as iokerneld: the other ends of the rings, the writable pool
/// and its ledger.
struct FakeIokerneld {
    ends: Vec<IokernelEnd>,
    pool: IngressPool,
    ledger: BufferLedger,
}

fn setup(kthreads: u32, cfg: NetConfig) -> (Harness, FakeIokerneld) {
    let region = Region::create_heap(&RegionConfig {
        ingress_capacity: 64,
        done_capacity: 64,
        egress_capacity: 8,
        ..RegionConfig::new(kthreads)
    })
    .unwrap();
    let pool = IngressPool::create("ginza-net-test", POOL).unwrap();
    let ro = IngressPool::map_read_only(pool.fd().try_clone_to_owned().unwrap(), POOL).unwrap();
    let h = Harness::new(&cfg, &region, ro).unwrap();
    let ends = (0..kthreads)
        .map(|k| region.iokernel_end(k).unwrap())
        .collect();
    let io = FakeIokerneld {
        ends,
        pool,
        ledger: BufferLedger::new(POOL),
    };
    (h, io)
}

impl FakeIokerneld {
    /// Copies `frame` into a lent buffer and puts it on kthread `k`'s ring.
    fn deliver(&mut self, k: usize, frame: &[u8]) -> u32 {
        let buf = self.ledger.lend().expect("a free ingress buffer");
        let len = self.pool.write(buf, frame).unwrap() as u32;
        self.ends[k]
            .ingress
            .push(PacketDesc {
                buf,
                len,
                hash: 0,
                reserved: 0,
            })
            .unwrap();
        buf
    }

    /// Buffers given back on every done ring (checked against the ledger).
    fn take_done(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        for end in &mut self.ends {
            while let Some(b) = end.done.pop().unwrap() {
                self.ledger.give_back(b).expect("a buffer given back once");
                out.push(b);
            }
        }
        out.sort();
        out
    }

    /// Frames on kthread `k`'s egress ring.
    fn take_egress(&mut self, k: usize) -> Vec<Vec<u8>> {
        let end = &mut self.ends[k];
        let mut out = Vec::new();
        while let Some((seq, d)) = end.egress.peek().unwrap() {
            let mut f = vec![0u8; PKT_BUFFER_SIZE as usize];
            let n = end.egress_buffers.read(seq, d.len, &mut f);
            f.truncate(n);
            end.egress.release();
            out.push(f);
        }
        out
    }
}

fn frame(build: impl FnOnce(&mut [u8]) -> Result<usize, ginza_net::BuildError>) -> Vec<u8> {
    let mut b = vec![0u8; 2048];
    let n = build(&mut b).unwrap();
    b.truncate(n);
    b
}

fn udp_from_peer(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    frame(|b| {
        tx::udp_datagram(
            b,
            &PEER,
            APP.mac,
            src_port,
            Endpoint::new(APP.ip, dst_port),
            payload,
        )
    })
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMP echo request from the peer (ginza-net builds only replies).
fn echo_request(ident: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&APP.mac.0);
    f.extend_from_slice(&PEER.mac.0);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 1, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&PEER.ip.octets());
    ip.extend_from_slice(&APP.ip.octets());
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut icmp = vec![8, 0, 0, 0];
    icmp.extend_from_slice(&ident.to_be_bytes());
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(payload);
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    f.extend(ip);
    f.extend(icmp);
    f
}

fn cfg() -> NetConfig {
    NetConfig::new(APP.mac, APP.ip)
}

fn addr(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(APP.ip, port)
}

fn peer(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(PEER.ip, port)
}

#[test]
fn arp_request_is_answered_and_its_sender_learned() {
    let _g = share();
    let (h, mut io) = setup(1, cfg());
    let b = io.deliver(0, &frame(|b| tx::arp_request(b, &PEER, APP.ip)));
    assert_eq!(h.poll(0, 0), 1);
    let out = io.take_egress(0);
    assert_eq!(out.len(), 1);
    match ginza_net::parse(&out[0], &PEER).unwrap() {
        Packet::Arp(m) => {
            assert_eq!(m.operation, ArpOperation::Reply);
            assert_eq!((m.sender_mac, m.sender_ip), (APP.mac, APP.ip));
            assert_eq!((m.target_mac, m.target_ip), (PEER.mac, PEER.ip));
        }
        other => panic!("not an ARP reply: {other:?}"),
    }
    assert_eq!(io.take_done(), vec![b]);
    // The sender was learned: a datagram to it goes out without asking.
    let s = h.bind(addr(5000)).unwrap();
    assert_eq!(
        h.send_to(0, &s, b"hello", peer(9)).unwrap(),
        SendOutcome::Sent
    );
    let out = io.take_egress(0);
    match ginza_net::parse(&out[0], &PEER).unwrap() {
        Packet::Udp(d) => {
            assert_eq!(d.src, Endpoint::new(APP.ip, 5000));
            assert_eq!(d.dst.port, 9);
            assert_eq!(d.payload, b"hello");
        }
        other => panic!("not UDP: {other:?}"),
    }
    let st = h.stats();
    assert_eq!((st.arp_replies, st.rx_packets, st.tx_packets), (1, 1, 2));
    assert_eq!(st.arp.learned, 1);
}

#[test]
fn icmp_echo_is_answered() {
    let _g = share();
    let (h, mut io) = setup(1, cfg());
    let b = io.deliver(0, &echo_request(0x1234, 7, b"ping payload"));
    assert_eq!(h.poll(0, 0), 1);
    let out = io.take_egress(0);
    assert_eq!(out.len(), 1, "{:?}", h.stats());
    let r = &out[0];
    assert_eq!(&r[0..6], &PEER.mac.0);
    assert_eq!(&r[6..12], &APP.mac.0);
    assert_eq!(r[23], 1, "IP protocol ICMP");
    assert_eq!(&r[26..30], &APP.ip.octets());
    assert_eq!(&r[30..34], &PEER.ip.octets());
    assert_eq!(checksum(&r[14..34]), 0, "IPv4 checksum");
    let icmp = &r[34..];
    assert_eq!(icmp[0], 0, "echo reply");
    assert_eq!(checksum(icmp), 0, "ICMP checksum");
    assert_eq!(&icmp[4..8], &[0x12, 0x34, 0, 7]);
    assert_eq!(&icmp[8..], b"ping payload");
    assert_eq!(io.take_done(), vec![b]);
    assert_eq!(h.stats().icmp_echo_replies, 1);
}

#[test]
fn udp_goes_to_the_socket_of_its_port_and_holds_its_buffer_until_read() {
    let _g = share();
    let (h, mut io) = setup(1, cfg());
    let s7 = h.bind(addr(7)).unwrap();
    let s8 = h.bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8)).unwrap();
    let b7 = io.deliver(0, &udp_from_peer(1000, 7, b"to seven"));
    let b8 = io.deliver(0, &udp_from_peer(1001, 8, b"to eight"));
    let b9 = io.deliver(0, &udp_from_peer(1002, 9, b"nobody"));
    assert_eq!(h.poll(0, 0), 3);
    // Port 9 has no socket: counted, its buffer back at once. The others
    // are held (zero-copy) until read.
    assert_eq!(io.take_done(), vec![b9]);
    let st = h.stats();
    assert_eq!(
        (st.udp_no_socket, st.udp_delivered, st.buffers_held),
        (1, 2, 2)
    );
    let mut buf = [0u8; 64];
    assert_eq!(h.try_recv(0, &s7, &mut buf), Some((8, peer(1000))));
    assert_eq!(&buf[..8], b"to seven");
    assert_eq!(io.take_done(), vec![b7]);
    // Truncated to the caller's buffer, like std.
    let mut small = [0u8; 3];
    assert_eq!(h.try_recv(0, &s8, &mut small), Some((3, peer(1001))));
    assert_eq!(&small, b"to ");
    assert_eq!(io.take_done(), vec![b8]);
    assert_eq!(h.try_recv(0, &s7, &mut buf), None);
    assert_eq!(h.stats().buffers_held, 0);
}

#[test]
fn a_full_socket_queue_drops_and_closing_returns_what_it_holds() {
    let _g = share();
    let (h, mut io) = setup(
        1,
        NetConfig {
            udp_queue: 2,
            ..cfg()
        },
    );
    let s = h.bind(addr(7)).unwrap();
    let bufs: Vec<u32> = (0..3)
        .map(|i| io.deliver(0, &udp_from_peer(1000, 7, &[i; 10])))
        .collect();
    assert_eq!(h.poll(0, 0), 3);
    assert_eq!(io.take_done(), vec![bufs[2]]);
    assert_eq!(h.stats().udp_queue_full, 1);
    h.close(0, s);
    assert_eq!(io.take_done(), vec![bufs[0], bufs[1]]);
    // The port is free again; datagrams for it meanwhile were no-socket.
    let b = io.deliver(0, &udp_from_peer(1000, 7, b"late"));
    h.poll(0, 0);
    assert_eq!(io.take_done(), vec![b]);
    assert_eq!(h.stats().udp_no_socket, 1);
    h.bind(addr(7)).unwrap();
}

#[test]
fn malformed_frames_are_counted_by_reason_and_their_buffers_returned() {
    let _g = share();
    let (h, mut io) = setup(1, cfg());
    let _s = h.bind(addr(7)).unwrap();
    let good = udp_from_peer(1000, 7, b"payload!");
    let mut bad_sum = good.clone();
    let last = bad_sum.len() - 1;
    bad_sum[last] ^= 0xff;
    let mut bad_ip_sum = good.clone();
    bad_ip_sum[14 + 8] ^= 0x01; // TTL, covered by the header checksum
    let mut other_mac = good.clone();
    other_mac[0..6].copy_from_slice(&[2, 9, 9, 9, 9, 9]);
    let other_ip = frame(|b| {
        tx::udp_datagram(
            b,
            &PEER,
            APP.mac,
            1,
            Endpoint::new(Ipv4Addr::new(10, 0, 0, 99), 7),
            b"x",
        )
    });
    let cases: Vec<(Vec<u8>, DropKind)> = vec![
        (good[..10].to_vec(), DropKind::TruncatedEthernet),
        (good[..20].to_vec(), DropKind::TruncatedIpv4),
        (
            good[..good.len() - 3].to_vec(),
            DropKind::IpTotalLengthBeyondFrame,
        ),
        (bad_sum, DropKind::BadUdpChecksum),
        (bad_ip_sum, DropKind::BadIpChecksum),
        (other_mac, DropKind::NotOurMac),
        (other_ip, DropKind::NotOurIp),
        (vec![0u8; 1600], DropKind::Oversized),
    ];
    let mut lent = Vec::new();
    for (f, _) in &cases {
        lent.push(io.deliver(0, f));
    }
    assert_eq!(h.poll(0, 0), cases.len());
    lent.sort();
    assert_eq!(io.take_done(), lent);
    let st = h.stats();
    for (_, kind) in &cases {
        assert!(
            st.drops.get(*kind) >= 1,
            "{kind} not counted: {:?}",
            st.drops
        );
    }
    assert_eq!(st.drops.total(), cases.len() as u64);
    assert_eq!(st.udp_delivered, 0);

    // Descriptors that lie: an index out of the pool is not given back (it
    // was never lent), a length beyond the buffer is.
    io.ends[0]
        .ingress
        .push(PacketDesc {
            buf: POOL + 5,
            len: 60,
            hash: 0,
            reserved: 0,
        })
        .unwrap();
    let b = io.ledger.lend().unwrap();
    io.ends[0]
        .ingress
        .push(PacketDesc {
            buf: b,
            len: PKT_BUFFER_SIZE + 1,
            hash: 0,
            reserved: 0,
        })
        .unwrap();
    assert_eq!(h.poll(0, 0), 2);
    assert_eq!(io.take_done(), vec![b]);
    assert_eq!(h.stats().bad_descriptors, 2);
}

/// A frame for the stack to chew on: arbitrary bytes, or a valid UDP
/// datagram to a bound port with a few bytes changed.
fn any_frame() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..1600),
        (
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(flips, payload)| {
                let mut f = udp_from_peer(1000, 7, &payload);
                let n = f.len();
                for (at, x) in flips {
                    f[at % n] ^= x;
                }
                f
            }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(64))]

    /// Whatever arrives, the stack never panics, accounts for every frame
    /// (dropped by reason, queued, answered) and gives every ingress buffer
    /// back exactly once — the ledger refuses a second return — once the
    /// socket holding queued datagrams is closed.
    #[test]
    fn any_frames_leave_no_buffer_behind(frames in proptest::collection::vec(any_frame(), 1..40)) {
        let (h, mut io) = setup(1, cfg());
        let socket = h.bind(addr(7)).unwrap();
        let mut lent: Vec<u32> = frames.iter().map(|f| io.deliver(0, f)).collect();
        let mut polled = 0;
        while polled < frames.len() {
            let n = h.poll(0, 0);
            proptest::prop_assert!(n > 0, "{polled} of {} frames processed", frames.len());
            polled += n;
        }
        let st = h.stats();
        proptest::prop_assert_eq!(st.rx_packets, frames.len() as u64);
        let answered = st.arp_replies + st.icmp_echo_replies;
        let accounted = st.drops.total() + st.udp_delivered + st.udp_no_socket
            + st.udp_queue_full + st.bad_descriptors + answered;
        proptest::prop_assert!(accounted >= frames.len() as u64, "{st:?}");
        h.close(0, socket);
        let mut returned = io.take_done();
        lent.sort();
        returned.sort();
        proptest::prop_assert_eq!(returned, lent);
        proptest::prop_assert_eq!(h.stats().buffers_held, 0);
    }
}

#[test]
fn sending_to_an_unknown_peer_asks_arp_and_sends_on_the_reply() {
    let _g = share();
    let (h, mut io) = setup(2, cfg());
    let s = h.bind(addr(5000)).unwrap();
    assert_eq!(
        h.send_to(0, &s, b"first", peer(9)).unwrap(),
        SendOutcome::QueuedForArp
    );
    assert_eq!(
        h.send_to(0, &s, b"second", peer(9)).unwrap(),
        SendOutcome::QueuedForArp
    );
    let out = io.take_egress(0);
    assert_eq!(out.len(), 1, "one ARP request for both datagrams");
    assert_eq!(&out[0][0..6], &MacAddr::BROADCAST.0);
    // The request, as the peer sees it (a broadcast ARP request for its IP).
    match ginza_net::parse(&out[0], &PEER).unwrap() {
        Packet::Arp(m) => {
            assert_eq!(m.operation, ArpOperation::Request);
            assert_eq!((m.sender_ip, m.target_ip), (APP.ip, PEER.ip));
        }
        other => panic!("{other:?}"),
    }
    // The reply arrives on kthread 1's ring; kthread 1 sends the queue.
    let request = ginza_net::ArpMessage {
        operation: ArpOperation::Request,
        sender_mac: APP.mac,
        sender_ip: APP.ip,
        target_mac: MacAddr::ZERO,
        target_ip: PEER.ip,
    };
    let reply = frame(|b| tx::arp_reply(b, &PEER, &request));
    io.deliver(1, &reply);
    assert_eq!(h.poll(1, 1), 1);
    let out = io.take_egress(1);
    let payloads: Vec<Vec<u8>> = out
        .iter()
        .map(|f| match ginza_net::parse(f, &PEER).unwrap() {
            Packet::Udp(d) => d.payload.to_vec(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(payloads, vec![b"first".to_vec(), b"second".to_vec()]);
    assert_eq!(io.take_done().len(), 1);
    // Static entries need no ARP at all.
    let (h, mut io) = setup(1, cfg().with_static_arp(PEER.ip, PEER.mac));
    let s = h.bind(addr(0)).unwrap();
    assert_eq!(h.send_to(0, &s, b"x", peer(9)).unwrap(), SendOutcome::Sent);
    assert_eq!(io.take_egress(0).len(), 1);
}

#[test]
fn a_full_egress_ring_is_reported_not_overwritten() {
    let _g = share();
    let (h, mut io) = setup(1, cfg().with_static_arp(PEER.ip, PEER.mac));
    let s = h.bind(addr(5000)).unwrap();
    for i in 0..8u8 {
        assert_eq!(h.send_to(0, &s, &[i], peer(9)).unwrap(), SendOutcome::Sent);
    }
    assert_eq!(
        h.send_to(0, &s, b"one too many", peer(9)).unwrap(),
        SendOutcome::RingFull
    );
    let out = io.take_egress(0);
    assert_eq!(out.len(), 8);
    for (i, f) in out.iter().enumerate() {
        match ginza_net::parse(f, &PEER).unwrap() {
            Packet::Udp(d) => assert_eq!(d.payload, &[i as u8]),
            other => panic!("{other:?}"),
        }
    }
    // A reply that finds the ring full is dropped and counted.
    for _ in 0..8 {
        h.send_to(0, &s, b"fill", peer(9)).unwrap();
    }
    io.deliver(0, &echo_request(1, 1, b"x"));
    h.poll(0, 0);
    assert_eq!(h.stats().tx_ring_full, 1);
    assert_eq!(io.take_done().len(), 1);
    // Too large a payload is an error: EMSGSIZE, as Linux gives.
    let e = h.send_to(0, &s, &[0u8; 1473], peer(9)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE), "{e}");
}

#[test]
fn another_kthread_steals_packet_processing() {
    let _g = share();
    let (h, mut io) = setup(2, cfg());
    let s = h.bind(addr(7)).unwrap();
    for i in 0..40u8 {
        io.deliver(0, &udp_from_peer(1000, 7, &[i]));
    }
    // Kthread 1 takes a batch off kthread 0's ring, kthread 0 the rest.
    assert_eq!(h.poll(1, 0), 32);
    assert!(h.ingress_pending(0));
    assert_eq!(h.poll(0, 0), 8);
    assert!(!h.ingress_pending(0));
    let st = h.stats();
    assert_eq!(st.kthreads[0].rx_packets, 8);
    assert_eq!(st.kthreads[0].rx_stolen, 0);
    assert_eq!(st.kthreads[1].rx_packets, 32);
    assert_eq!(st.kthreads[1].rx_stolen, 32);
    // In order, whoever processed them.
    let mut buf = [0u8; 4];
    for i in 0..40u8 {
        assert_eq!(h.try_recv(1, &s, &mut buf), Some((1, peer(1000))));
        assert_eq!(buf[0], i);
    }
    assert_eq!(io.take_done().len(), 40);
}

#[test]
fn binding_errors_say_what_was_wrong() {
    let _g = share();
    let (h, _io) = setup(1, cfg());
    let _a = h.bind(addr(7)).unwrap();
    let e = h.bind(addr(7)).err().unwrap();
    // The errno Linux gives (what a C program behind the preload library
    // sees); the text saying why goes to the debug log.
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE));
    let e = h
        .bind(SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 8))
        .err()
        .unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrNotAvailable);
    assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL));
    let eph: Vec<u16> = (0..3)
        .map(|_| h.bind(addr(0)).unwrap().local_addr().port())
        .collect();
    assert!(eph.iter().all(|&p| p >= 49152), "{eph:?}");
    assert!(eph[0] != eph[1] && eph[1] != eph[2], "{eph:?}");
    let bad = Harness::new(
        &NetConfig::new(MacAddr::BROADCAST, APP.ip),
        &Region::create_heap(&RegionConfig::new(1)).unwrap(),
        IngressPool::map_read_only(
            IngressPool::create("x", 1)
                .unwrap()
                .fd()
                .try_clone_to_owned()
                .unwrap(),
            1,
        )
        .unwrap(),
    )
    .err()
    .unwrap();
    assert!(bad.contains("unicast"), "{bad}");
}

// ---- end to end ------------------------------------------------------------

use common::{iface, lock, share, Daemon};

#[test]
fn sockets_need_networking_and_a_runtime() {
    let _g = share();
    let e = UdpSocket::bind(7u16).unwrap_err().to_string();
    assert!(e.contains("must be called from a Ginza uthread"), "{e}");
    let e = ginza_runtime::run(Config::default(), || {
        UdpSocket::bind(7u16).unwrap_err().to_string()
    })
    .unwrap();
    assert!(
        e.contains("networking needs Config::iokernel with net set"),
        "{e}"
    );
    assert!(ginza_runtime::net::stats().is_none());
}

/// A UDP echo server on port 7: `n` uthreads share the socket, each
/// spinning for the request's service time before echoing. Returns when
/// `stop` is set (checked at every read timeout).
/// Echoes datagrams to port 7 on `n` uthreads until `stop`; sets `bound`
/// once the socket is bound, so senders know their first datagram finds it.
fn echo_server(n: usize, stop: Arc<AtomicBool>, served: Arc<AtomicU64>, bound: &AtomicBool) {
    let sock = Arc::new(UdpSocket::bind(7u16).unwrap());
    bound.store(true, Ordering::Release);
    sock.set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    let hs: Vec<_> = (0..n)
        .map(|_| {
            let sock = Arc::clone(&sock);
            let stop = Arc::clone(&stop);
            let served = Arc::clone(&served);
            ginza_runtime::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    match sock.recv_from(&mut buf) {
                        Ok((len, from)) => {
                            if let Some(h) = RequestHeader::decode(&buf[..len]) {
                                let t = Instant::now();
                                while t.elapsed() < Duration::from_nanos(h.service_ns) {
                                    std::hint::spin_loop();
                                }
                            }
                            sock.send_to(&buf[..len], from).unwrap();
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("recv_from: {e}"),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

fn load(target: Interface, rate: f64, service_ns: u64, ms: u64) -> LoadRun {
    LoadRun::poisson(
        target,
        7,
        rate,
        ServiceTime::Constant { ns: service_ns },
        Duration::from_millis(ms),
    )
}

/// One run of the generator's echo load against a fresh two-kthread echo
/// application `name` at `me`; every reply and frame count checked; the
/// runtime's net stats.
fn generator_echo_run(d: &Daemon, name: &str, me: Interface) -> NetStats {
    let net = NetConfig::new(me.mac, me.ip).with_static_arp(GENERATOR_IP, GENERATOR_MAC);
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let (s2, v2) = (Arc::clone(&stop), Arc::clone(&served));
    let bound = Arc::new(AtomicBool::new(false));
    let b2 = Arc::clone(&bound);
    let cfg = d.net_app(name, 2, net);
    let server = std::thread::spawn(move || {
        ginza_runtime::run(cfg, move || {
            echo_server(4, s2, v2, &b2);
            Handle::current().unwrap().net_stats().unwrap()
        })
        .unwrap()
    });
    // Wait until the socket is bound (the first request would be no-socket)
    // and the application has settled: both kthreads parked, start-up over,
    // so the load meets an idle application, as it would in service.
    wait_bound(&bound, name, &server);
    let t0 = Instant::now();
    while !client::stats(&d.socket).is_ok_and(|s| {
        s.apps
            .iter()
            .any(|a| a.name == name && a.parked_kthreads == 2)
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{name} never went idle: {:#?}",
            client::stats(&d.socket).map(|s| s
                .apps
                .into_iter()
                .filter(|a| a.name == name)
                .collect::<Vec<_>>())
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    // One flow (one source port): every request hashes to one kthread's
    // ring. 200 µs of work per request at 1,500/s, with bursts (Poisson),
    // keeps the ring's kthread busy at times while another is idle: that
    // one takes packets off the busy one's ring. About 450 requests, fewer
    // than the ring holds: however late the application runs on a loaded
    // machine, iokerneld drops none of them. The drain is a deadline: the
    // run ends once every reply is in.
    let mut run = load(me, 1_500.0, 200_000, 300);
    run.drain = Duration::from_secs(20);
    let report =
        d.io.as_ref()
            .unwrap()
            .generator()
            .run(run, Duration::from_secs(5))
            .unwrap();
    let iok = client::stats(&d.socket).unwrap();
    stop.store(true, Ordering::Relaxed);
    let stats = server.join().unwrap();
    let app = iok.apps.iter().find(|a| a.name == name).unwrap();
    eprintln!(
        "generator: {:?}\niokerneld: {app:?}\nruntime: {stats:?}",
        report.stats
    );
    assert!(report.stats.sent > 300, "{:?}", report.stats);
    assert!(
        report.stats.replies as f64 >= 0.9 * report.stats.sent as f64,
        "{:?}",
        report.stats
    );
    assert_eq!(stats.udp_no_socket, 0);
    // Which kthread gets the core when frames wait on a parked one's ring
    // is the allocator's choice (the one that last ran there): in about
    // one run in four here the stealer took every frame and the ring's
    // owner none. So the kthreads' own counts are checked against what
    // came from outside the runtime: every reply answers a frame some
    // kthread took off a ring (its own or, stolen, another's), and no
    // kthread took a frame the generator did not send (static ARP: nothing
    // else comes). Once every reply is in, every frame iokerneld put on
    // the rings was taken.
    let taken = stats.rx_packets;
    assert!(
        taken >= report.stats.replies && taken <= report.stats.sent,
        "{taken} frames taken for {:?}: {stats:#?}",
        report.stats
    );
    if report.stats.replies == report.stats.sent {
        let delivered = app.net.expect("the application's net stats").rx;
        assert_eq!(taken, delivered, "{stats:#?}");
    }
    stats
}

/// Whether the idle kthread is running while the busy one's ring holds
/// frames is the allocator's and Linux's timing: a clean-clone CI run saw
/// one run in which kthread 1 was never granted while kthread 0 worked
/// (0 frames stolen, every other count right). So up to three runs, each
/// checked in full; frames must be stolen in one of them.
#[test]
fn the_generator_load_is_echoed_and_stolen_packet_processing_shows() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let mut runs = Vec::new();
    for attempt in 0..3u8 {
        let stats = generator_echo_run(&d, &format!("echo{attempt}"), iface(1 + attempt));
        if stats.kthreads.iter().any(|k| k.rx_stolen > 0) {
            return;
        }
        runs.push(stats);
    }
    panic!("no frame stolen in {} runs: {runs:#?}", runs.len());
}

/// Runs the echo server app `name` on `me` (2 kthreads, 2 uthreads) on a
/// thread until `stop`; its thread returns the runtime's net stats.
fn start_server(
    d: &Daemon,
    name: &str,
    me: Interface,
    guaranteed: u32,
    stop: &Arc<AtomicBool>,
    served: &Arc<AtomicU64>,
) -> std::thread::JoinHandle<ginza_runtime::net::NetStats> {
    let (s2, v2) = (Arc::clone(stop), Arc::clone(served));
    let bound = Arc::new(AtomicBool::new(false));
    let b2 = Arc::clone(&bound);
    let mut cfg = d.net_app(name, 2, NetConfig::new(me.mac, me.ip));
    cfg.iokernel.as_mut().expect("registered").guaranteed = guaranteed;
    let h = std::thread::spawn(move || {
        ginza_runtime::run(cfg, move || {
            echo_server(2, s2, v2, &b2);
            ginza_runtime::net::stats().unwrap()
        })
        .unwrap()
    });
    // So the first datagram finds the socket.
    wait_bound(&bound, name, &h);
    h
}

/// Waits until the echo server of application `name` has bound its socket
/// (5 s at most, and not after its thread ended).
fn wait_bound<T>(bound: &AtomicBool, name: &str, server: &std::thread::JoinHandle<T>) {
    let t0 = Instant::now();
    while !bound.load(Ordering::Acquire) {
        assert!(
            t0.elapsed() < Duration::from_secs(5) && !server.is_finished(),
            "{name} never bound its socket"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Ping-pong from a client socket to `server`:7 for `dur`, for at least
/// `min_rounds` round trips and while `tick` asks for more (30 s at most,
/// then the test fails), an echo not back within `answer_within` counted
/// lost; calls `tick` after each round trip with the time since the start.
/// Returns (round trips, timeouts).
fn ping_pong(
    server: Ipv4Addr,
    dur: Duration,
    min_rounds: u64,
    answer_within: Duration,
    mut tick: impl FnMut(Duration) -> bool,
) -> (u64, u64) {
    let sock = UdpSocket::bind(0u16).unwrap();
    sock.set_read_timeout(Some(answer_within)).unwrap();
    let dst = SocketAddrV4::new(server, 7);
    let (mut ok, mut lost) = (0u64, 0u64);
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let mut seq = 0u64;
    let mut more = true;
    while t0.elapsed() < dur || ok < min_rounds || more {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{ok} round trips ({lost} lost) in 30 s"
        );
        seq += 1;
        sock.send_to(&seq.to_le_bytes(), dst).unwrap();
        loop {
            match sock.recv_from(&mut buf) {
                Ok((8, from)) if from == dst => {
                    let got = u64::from_le_bytes(buf[..8].try_into().unwrap());
                    if got == seq {
                        ok += 1;
                        break;
                    }
                    // A late echo of an earlier (timed-out) request.
                }
                Ok(other) => panic!("unexpected datagram {other:?}"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    lost += 1;
                    break;
                }
                Err(e) => panic!("recv_from: {e}"),
            }
        }
        more = tick(t0.elapsed());
    }
    (ok, lost)
}

/// iokerneld that cannot sleep until an event (`spin`) naps in `ppoll`
/// with `idle_sleep`, and a kthread polling while idle rings no bell for a
/// nap: a datagram its timer sends waited out the nap (on `ginza bench
/// oneway`'s 1 ms nap, the p99 round trip was 550–610 µs, p50 7–11). So the
/// loop does not nap while a kthread polls. Each round trip here follows a
/// pause, sent by the client's own timer while both applications poll.
#[test]
fn a_polling_application_is_not_left_waiting_for_iokernelds_nap() {
    const NAP: Duration = Duration::from_secs(1);
    let _g = lock();
    let d = Daemon::start(|c| {
        c.spin = true;
        c.idle_sleep = Some(NAP);
    });
    let (srv, cli) = (iface(1), iface(2));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let server = start_server(&d, "server", srv, 0, &stop, &served);
    let client_cfg = d.net_app("client", 1, NetConfig::new(cli.mac, cli.ip));
    let slowest = ginza_runtime::run(client_cfg, move || {
        let sock = UdpSocket::bind(9u16).unwrap();
        sock.connect(SocketAddrV4::new(srv.ip, 7)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        // The first exchange resolves the server's MAC.
        sock.send(b"first").unwrap();
        assert_eq!(sock.recv(&mut buf).unwrap(), 5);
        (0..10u8)
            .map(|i| {
                // Long enough for both kthreads to poll and the loop to
                // see it (a pass every few microseconds).
                ginza_runtime::sleep(Duration::from_millis(5));
                let t0 = Instant::now();
                sock.send(&[i]).unwrap();
                let n = sock.recv(&mut buf).unwrap();
                assert_eq!((n, buf[0]), (1, i), "round trip {i}");
                t0.elapsed()
            })
            .max()
            .unwrap()
    })
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    // Waiting for a nap is most of a second; a busy 2-CPU machine may hold
    // a thread off its CPU for tens of milliseconds.
    assert!(
        slowest < NAP / 4,
        "the slowest of 10 round trips took {slowest:?} (iokerneld naps {NAP:?})"
    );
}

#[test]
fn two_applications_echo_through_iokerneld_resolving_each_other_by_arp() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let (srv, cli) = (iface(1), iface(2));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let server = start_server(&d, "server", srv, 0, &stop, &served);
    let client_cfg = d.net_app("client", 1, NetConfig::new(cli.mac, cli.ip));
    let (rounds, lost, timeout_took, stats) = ginza_runtime::run(client_cfg, move || {
        // Binding: a taken port is refused (EADDRINUSE), so is another
        // host's address (EADDRNOTAVAIL); a dropped socket frees its port.
        let a = UdpSocket::bind(SocketAddrV4::new(cli.ip, 9)).unwrap();
        let e = UdpSocket::bind(9u16).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE), "{e}");
        let e = UdpSocket::bind(SocketAddrV4::new(srv.ip, 10)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL), "{e}");
        drop(a);
        let a = UdpSocket::bind(9u16).unwrap();
        // The read timeout runs on the runtime's timers.
        a.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let t = Instant::now();
        let e = a.recv_from(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        let timeout_took = t.elapsed();
        // Connected sockets.
        a.connect(SocketAddrV4::new(srv.ip, 7)).unwrap();
        a.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        a.send(b"connected").unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(a.recv(&mut buf).unwrap(), 9);
        assert_eq!(&buf[..9], b"connected");
        // A count, not a rate: on a loaded machine the server can be held
        // off its CPU for tens of ms, so an echo has a second to come back.
        let (rounds, lost) = ping_pong(
            srv.ip,
            Duration::from_millis(200),
            51,
            Duration::from_secs(1),
            |_| false,
        );
        (
            rounds,
            lost,
            timeout_took,
            ginza_runtime::net::stats().unwrap(),
        )
    })
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    let server_stats = server.join().unwrap();
    eprintln!("client: {rounds} round trips, {lost} lost; {stats:?}\nserver: {server_stats:?}");
    assert!(
        timeout_took >= Duration::from_millis(10) && timeout_took < Duration::from_secs(1),
        "{timeout_took:?}"
    );
    assert!(rounds > 50, "{rounds} round trips");
    assert_eq!(lost, 0);
    // Each side asked for the other's MAC once (or answered the other's
    // request and learned from it).
    assert!(stats.arp.learned >= 1, "{stats:?}");
    assert!(server_stats.arp.learned >= 1, "{server_stats:?}");
    assert!(
        stats.arp_replies + server_stats.arp_replies >= 1,
        "{stats:?} {server_stats:?}"
    );
    assert_eq!(stats.buffers_held, 0);
}

const VICTIM: Interface = Interface {
    mac: MacAddr([0x02, 0x47, 0x00, 0x00, 0x00, 3]),
    ip: Ipv4Addr::new(10, 9, 0, 3),
};

/// Body of the child process of
/// `an_application_killed_mid_traffic_does_not_disturb_another` (a no-op in
/// a normal test run): sends to the server as fast as its kthread allows.
#[test]
fn net_child_app_body() {
    let Ok(socket) = std::env::var("GINZA_TEST_NET_CHILD_SOCKET") else {
        return;
    };
    let mut io = IokernelConfig::new("victim", Class::Batch);
    io.socket = Some(socket.into());
    io.net = Some(NetConfig::new(VICTIM.mac, VICTIM.ip));
    // At Linux's default class: under SCHED_IDLE another process on the
    // CPU (a build beside the tests) can starve it for longer than the
    // test's deadlines; what is tested is the kill.
    io.sched_idle = false;
    let cfg = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(2)
    };
    ginza_runtime::run(cfg, || {
        let sock = Arc::new(UdpSocket::bind(0u16).unwrap());
        let s2 = Arc::clone(&sock);
        // Reads its echoes, so its buffers come and go while it is killed.
        ginza_runtime::spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                let _ = s2.recv_from(&mut buf);
            }
        });
        println!("child running");
        let dst = SocketAddrV4::new(iface(1).ip, 7);
        loop {
            sock.send_to(b"victim traffic", dst).unwrap();
            ginza_runtime::sleep(Duration::from_micros(100));
        }
    })
    .unwrap();
}

#[test]
fn an_application_killed_mid_traffic_does_not_disturb_another() {
    let _g = lock();
    let d = Daemon::start(|_| {});
    let srv = iface(1);
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    // No guarantees: three applications on the managed cores preempt each
    // other's kthreads, including ones granted a core whose hand-over is
    // still pending (iokerneld then gives the hand-over to the next grant;
    // before that fix a kthread could be left neither parked nor woken).
    let server = start_server(&d, "server", srv, 0, &stop, &served);
    let mut child = common::spawn_test_child(
        "net_child_app_body",
        "GINZA_TEST_NET_CHILD_SOCKET",
        &d.socket,
    );
    // The victim's traffic is being served.
    let t0 = Instant::now();
    while served.load(Ordering::Relaxed) < 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the victim's traffic never reached the server: {}",
            served.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let cli = iface(2);
    let client_cfg = d.net_app("client", 1, NetConfig::new(cli.mac, cli.ip));
    let mut killed_at = None;
    let (rounds, lost, after) = ginza_runtime::run(client_cfg, move || {
        let mut after = 0u64;
        // Counts, not rates: on a loaded machine the server can be held
        // off its CPU for tens of ms, so an echo has 200 ms to come back,
        // and the round trips after the kill go on until there are 21.
        let (rounds, lost) = ping_pong(
            srv.ip,
            Duration::from_millis(300),
            0,
            Duration::from_millis(200),
            |t| {
                if t >= Duration::from_millis(100) {
                    if killed_at.is_none() {
                        child.0.kill().unwrap(); // SIGKILL, mid-traffic
                        child.0.wait().unwrap();
                        killed_at = Some(t);
                    } else {
                        after += 1;
                    }
                }
                after <= 20
            },
        );
        (rounds, lost, after)
    })
    .unwrap();
    let st = client::stats(&d.socket).unwrap();
    stop.store(true, Ordering::Relaxed);
    let server_stats = server.join().unwrap();
    eprintln!(
        "client: {rounds} round trips ({after} after the kill), {lost} lost\nserver: {server_stats:?}"
    );
    assert!(
        st.apps.iter().all(|a| a.name != "victim"),
        "the killed application is still registered: {st:?}"
    );
    assert!(
        st.recent_removals.iter().any(|r| r.name == "victim"),
        "{:?}",
        st.recent_removals
    );
    assert!(after > 20, "only {after} round trips after the kill");
    assert!(lost <= 2, "{lost} round trips lost");
    assert_eq!(server_stats.buffers_held, 0);
}
