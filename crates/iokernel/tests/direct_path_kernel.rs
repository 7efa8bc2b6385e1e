//! What the kernel allows the direct path (docs/direct-path.md, "What the
//! kernel allows"), measured on a veth pair with several queues: on which
//! receive queue a frame from the peer lands, whether AF_XDP sockets with
//! separate UMEMs on separate queues each get only their queue's frames,
//! what a redirect to a socket bound to another queue does, and whether a
//! UMEM can be shared with another process (`XDP_SHARED_UMEM`).
//!
//! Each test prints what it saw (`cargo test ... -- --nocapture`) and
//! asserts the facts docs/direct-path.md records, so a kernel that behaves
//! otherwise fails here. Needs root, `ip` and `ethtool`; skipped otherwise
//! (failed under CI as root).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ginza_iokernel::netns::NetNs;
use ginza_iokernel::nic::bpf::{XdpMode, XdpSteering};
use ginza_sys::xsk::{BindMode, Umem, UmemOwner, Xsk};

/// Queues on each end of the veth pair.
const QUEUES: u32 = 4;
/// Chunks per UMEM, and entries per ring: every frame sent fits on a
/// socket's rx ring even when it is read only after the sending.
const CHUNKS: usize = 512;
const CHUNK: usize = 2048;
const RING: u32 = 256;
/// Flows sent (one source port each) and datagrams per flow.
const FLOWS: u16 = 48;
const PER_FLOW: usize = 3;
const FIRST_PORT: u16 = 41000;
const DST_PORT: u16 = 7;

fn ifindex(ifname: &str) -> u32 {
    let text = std::fs::read_to_string(format!("/sys/class/net/{ifname}/ifindex")).unwrap();
    text.trim().parse().unwrap()
}

fn mac_of(ifname: &str) -> String {
    let text = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address")).unwrap();
    text.trim().to_string()
}

/// A receive-only socket on `queue` with a private UMEM, every chunk lent
/// to the kernel.
fn rx_socket(ifindex: u32, queue: u32) -> Xsk {
    let umem = Umem::private(CHUNKS, CHUNK).unwrap();
    let mut xsk = Xsk::open(ifindex, queue, umem, UmemOwner::Own, RING, BindMode::Copy)
        .unwrap_or_else(|e| panic!("an AF_XDP socket on queue {queue}: {e}"));
    lend(&mut xsk, 0..RING as usize);
    xsk
}

fn lend(xsk: &mut Xsk, chunks: std::ops::Range<usize>) {
    let (rings, umem) = xsk.split();
    let addrs: Vec<u64> = chunks.map(|c| umem.chunk_addr(c)).collect();
    assert_eq!(rings.fill.produce(addrs.iter().copied()), addrs.len());
}

/// Takes every frame off the socket's rx ring (its bytes, and where they
/// lay in the UMEM), lending each chunk back.
fn drain(xsk: &mut Xsk) -> Vec<(u64, Vec<u8>)> {
    let (rings, umem) = xsk.split();
    let mut frames = Vec::new();
    rings.rx.consume(usize::MAX, |d| {
        let bytes = umem
            .bytes(d.addr, d.len)
            .expect("a descriptor inside the UMEM");
        frames.push((d.addr, bytes.to_vec()));
    });
    let back: Vec<u64> = frames.iter().map(|(a, _)| umem.chunk_of(*a)).collect();
    assert_eq!(rings.fill.produce(back.into_iter()), frames.len());
    frames
}

/// The UDP source port of an Ethernet/IPv4/UDP frame to `dst` port 7.
fn flow_of(frame: &[u8], dst: Ipv4Addr) -> Option<u16> {
    let ours = frame.len() >= 42
        && frame[12..14] == [0x08, 0x00]
        && frame[14] == 0x45
        && frame[23] == 17
        && frame[30..34] == dst.octets()
        && frame[36..38] == DST_PORT.to_be_bytes();
    ours.then(|| u16::from_be_bytes([frame[34], frame[35]]))
}

/// The namespace reaches `ip` at the host end's MAC without asking ARP.
fn static_neighbour(ns: &NetNs, ip: Ipv4Addr) {
    let mac = mac_of(&ns.host_if);
    ns.exec_ok(&[
        "ip",
        "neigh",
        "replace",
        &ip.to_string(),
        "lladdr",
        &mac,
        "dev",
        &ns.ns_if,
        "nud",
        "permanent",
    ])
    .unwrap();
}

/// `PER_FLOW` datagrams of each of `FLOWS` flows (one source port each)
/// from the namespace to `dst`:7.
fn send_flows(ns: &NetNs, dst: Ipv4Addr) {
    let src = ns.ns_ip;
    ns.run_in(move || {
        for port in FIRST_PORT..FIRST_PORT + FLOWS {
            let socket = UdpSocket::bind(SocketAddrV4::new(src, port)).unwrap();
            for _ in 0..PER_FLOW {
                socket
                    .send_to(&port.to_be_bytes(), SocketAddrV4::new(dst, DST_PORT))
                    .unwrap();
            }
        }
    })
    .unwrap();
}

/// Polls `sockets` until `want` frames to `dst` arrived or 5 s passed;
/// the queue(s) each flow was seen on.
fn collect(sockets: &mut [(u32, Xsk)], dst: Ipv4Addr, want: usize) -> BTreeMap<u16, BTreeSet<u32>> {
    let mut seen: BTreeMap<u16, BTreeSet<u32>> = BTreeMap::new();
    let mut frames = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while frames < want && Instant::now() < deadline {
        for (queue, xsk) in sockets.iter_mut() {
            for (_, bytes) in drain(xsk) {
                if let Some(flow) = flow_of(&bytes, dst) {
                    frames += 1;
                    seen.entry(flow).or_default().insert(*queue);
                }
            }
        }
        std::thread::yield_now();
    }
    seen
}

/// Frames per queue, from the flows' queues (each flow on one queue).
fn per_queue(seen: &BTreeMap<u16, BTreeSet<u32>>) -> BTreeMap<u32, usize> {
    let mut count = BTreeMap::new();
    for queues in seen.values() {
        for q in queues {
            *count.entry(*q).or_insert(0) += 1;
        }
    }
    count
}

/// (a) and (b): a veth with four queues; a socket with its own UMEM on
/// each queue, each in the socket map under its queue. In driver mode a
/// frame lands on the queue the peer transmitted it on (a hash of its
/// flow), so flows spread over the queues. In generic mode (the mode
/// iokerneld's switch path attaches in) the program sees a frame the peer
/// sent on queue t ≥ 1 on queue t - 1, and one sent on queue 0 on queue
/// 0: never on the last queue. Each flow stays on one queue; every socket
/// gets its queue's frames only, in its own UMEM; a queue takes one UMEM.
#[test]
fn each_flow_lands_on_one_queue_and_each_socket_gets_its_queue_only() {
    let Some(ns) = NetNs::create_with_queues_or_skip(QUEUES) else {
        return;
    };
    let rx_queues = std::fs::read_dir(format!("/sys/class/net/{}/queues", ns.host_if))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        })
        .count();
    assert_eq!(rx_queues, QUEUES as usize, "receive queues of the host end");
    static_neighbour(&ns, ns.peer_ip);
    let index = ifindex(&ns.host_if);
    let mut by_mode = BTreeMap::new();
    for mode in [XdpMode::Driver, XdpMode::Generic] {
        let mut sockets: Vec<(u32, Xsk)> = (0..QUEUES).map(|q| (q, rx_socket(index, q))).collect();
        let mut steering = XdpSteering::load(QUEUES).unwrap();
        for (q, xsk) in &sockets {
            steering.set_socket(*q, xsk.fd().as_raw_fd()).unwrap();
        }
        steering.claim(ns.peer_ip).unwrap();
        let link = steering.attach(index, mode).unwrap();
        send_flows(&ns, ns.peer_ip);
        let seen = collect(&mut sockets, ns.peer_ip, FLOWS as usize * PER_FLOW);
        drop(link);
        println!(
            "{} mode: flows per queue {:?} ({} flows seen)",
            mode.name(),
            per_queue(&seen),
            seen.len()
        );
        assert_eq!(
            seen.len(),
            FLOWS as usize,
            "{}: every flow arrived",
            mode.name()
        );
        for (flow, queues) in &seen {
            assert_eq!(
                queues.len(),
                1,
                "{}: flow {flow} on queues {queues:?}",
                mode.name()
            );
        }
        let queue_of: BTreeMap<u16, u32> = seen
            .iter()
            .map(|(flow, queues)| (*flow, *queues.first().unwrap()))
            .collect();
        by_mode.insert(mode.name(), queue_of);
    }
    // A queue takes one UMEM: a second socket with a UMEM of its own on a
    // queue already bound is refused.
    let first = rx_socket(index, 2);
    let busy = Xsk::open(
        index,
        2,
        Umem::private(CHUNKS, CHUNK).unwrap(),
        UmemOwner::Own,
        RING,
        BindMode::Copy,
    )
    .unwrap_err();
    println!("a second UMEM on queue 2: {busy}");
    assert_eq!(busy.error.raw_os_error(), Some(libc::EBUSY), "{busy}");
    drop(first);
    let driver = &by_mode["driver"];
    let used: BTreeSet<u32> = driver.values().copied().collect();
    assert!(
        used.len() > 1,
        "driver mode: the flows spread over the queues"
    );
    for (flow, generic) in &by_mode["generic"] {
        let sent_on = driver[flow];
        assert_eq!(
            *generic,
            sent_on.saturating_sub(1),
            "flow {flow}: driver mode queue {sent_on}, generic mode queue {generic}"
        );
    }
}

/// (a) The peer steers by its sending CPU: with XPS (`xps_cpus`) giving
/// every CPU transmit queue 2 in the namespace, every flow lands on receive
/// queue 2 of the host end (driver mode). Destination rules (`tc ...
/// skbedit queue_mapping`, `flower`) are not in this kernel's
/// configuration.
#[test]
fn xps_on_the_peer_steers_every_flow_to_one_queue() {
    let Some(ns) = NetNs::create_with_queues_or_skip(QUEUES) else {
        return;
    };
    static_neighbour(&ns, ns.peer_ip);
    steer_peer_to_queue(&ns, 2);
    let index = ifindex(&ns.host_if);
    let mut sockets: Vec<(u32, Xsk)> = (0..QUEUES).map(|q| (q, rx_socket(index, q))).collect();
    let mut steering = XdpSteering::load(QUEUES).unwrap();
    for (q, xsk) in &sockets {
        steering.set_socket(*q, xsk.fd().as_raw_fd()).unwrap();
    }
    steering.claim(ns.peer_ip).unwrap();
    let link = steering.attach(index, XdpMode::Driver).unwrap();
    send_flows(&ns, ns.peer_ip);
    let seen = collect(&mut sockets, ns.peer_ip, FLOWS as usize * PER_FLOW);
    drop(link);
    let queues = per_queue(&seen);
    println!("XPS to transmit queue 2: flows per receive queue {queues:?}");
    assert_eq!(seen.len(), FLOWS as usize, "every flow arrived");
    assert_eq!(queues.keys().copied().collect::<Vec<_>>(), [2]);
}

/// Every CPU of the namespace's end transmits on `queue` (XPS).
fn steer_peer_to_queue(ns: &NetNs, queue: u32) {
    let cpus = ginza_sys::topology::online_cpus().unwrap();
    assert!(
        cpus.iter().all(|&c| c < 64),
        "a mask of up to 64 CPUs: {cpus:?}"
    );
    let all = format!("{:x}", cpus.iter().fold(0u64, |m, &c| m | 1 << c));
    for q in 0..QUEUES {
        let mask = if q == queue { all.as_str() } else { "0" };
        let path = format!("/sys/class/net/{}/queues/tx-{q}/xps_cpus", ns.ns_if);
        ns.exec_ok(&["sh", "-c", &format!("echo {mask} > {path}")])
            .unwrap();
    }
}

/// (b) A redirect to a socket bound to another queue: only the socket of
/// queue 1 is in the map, under every queue's key. Frames that land on
/// queue 1 reach it; the others are dropped by the kernel (not passed to
/// Linux: a Linux socket on the same address gets none of them).
#[test]
fn a_redirect_to_a_socket_of_another_queue_drops_the_frame() {
    let Some(ns) = NetNs::create_with_queues_or_skip(QUEUES) else {
        return;
    };
    let host = ns.add_host_address(3).unwrap();
    static_neighbour(&ns, host.ip);
    let linux = UdpSocket::bind(SocketAddrV4::new(host.ip, DST_PORT)).unwrap();
    linux.set_nonblocking(true).unwrap();
    let index = ifindex(&ns.host_if);
    let mut sockets = vec![(1, rx_socket(index, 1))];
    let mut steering = XdpSteering::load(QUEUES).unwrap();
    for q in 0..QUEUES {
        steering
            .set_socket(q, sockets[0].1.fd().as_raw_fd())
            .unwrap();
    }
    steering.claim(host.ip).unwrap();
    let link = steering.attach(index, XdpMode::Driver).unwrap();
    send_flows(&ns, host.ip);
    let seen = collect(&mut sockets, host.ip, FLOWS as usize * PER_FLOW);
    // Whatever Linux was passed is on its socket by now: the frames were
    // all handled before the sockets above saw the last of queue 1's (or
    // 5 s passed).
    let mut passed = 0;
    let mut buf = [0u8; 64];
    while linux.recv(&mut buf).is_ok() {
        passed += 1;
    }
    drop(link);
    let to_socket = seen.len();
    println!(
        "driver mode, one socket (queue 1) under every key: {to_socket} of {FLOWS} flows reached it, \
         {passed} datagrams passed to Linux, the rest dropped"
    );
    assert!(to_socket > 0, "the flows of queue 1 reach its socket");
    assert!(to_socket < FLOWS as usize, "other queues' flows do not");
    assert_eq!(passed, 0, "frames of other queues are dropped, not passed");
}

/// The child's end of `a_umem_is_shared_with_another_process`: run only
/// when the parent starts this binary with `GINZA_SHARED_UMEM_CHILD`.
const CHILD_ENV: &str = "GINZA_SHARED_UMEM_CHILD";
/// Descriptors the child inherits: the parent's socket, the memfd, and a
/// unix socket to the parent.
const CHILD_SOCKET_FD: i32 = 100;
const CHILD_MEMFD_FD: i32 = 101;
const CHILD_CHANNEL_FD: i32 = 102;

#[test]
#[ignore = "the child of a_umem_is_shared_with_another_process"]
fn shared_umem_child() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (ifindex, queue) = args.split_once(',').unwrap();
    let (ifindex, queue): (u32, u32) = (ifindex.parse().unwrap(), queue.parse().unwrap());
    // SAFETY: the parent placed these descriptors at these numbers for
    // this process, and nothing else here owns them.
    let (other, memfd, channel) = unsafe {
        (
            OwnedFd::from_raw_fd(CHILD_SOCKET_FD),
            OwnedFd::from_raw_fd(CHILD_MEMFD_FD),
            OwnedFd::from_raw_fd(CHILD_CHANNEL_FD),
        )
    };
    let umem = Umem::shared(memfd.as_fd(), CHUNKS, CHUNK).unwrap();
    let opened = Xsk::open(
        ifindex,
        queue,
        umem,
        UmemOwner::SharedWith(other.as_fd()),
        RING,
        BindMode::Copy,
    );
    let mut xsk = match opened {
        Ok(xsk) => xsk,
        Err(e) => {
            ginza_sys::socket::send_with_fds(
                channel.as_fd(),
                format!("refused: {e}").as_bytes(),
                &[],
            )
            .unwrap();
            return;
        }
    };
    // The second half of the UMEM is this socket's to lend.
    lend(&mut xsk, CHUNKS / 2..CHUNKS / 2 + RING as usize / 2);
    ginza_sys::socket::send_with_fds(channel.as_fd(), b"bound", &[xsk.fd()]).unwrap();
    // Hand frames back to the kernel until the parent says stop.
    let mut buf = [0u8; 16];
    loop {
        drain(&mut xsk);
        match ginza_sys::socket::recv_with_fds(channel.as_fd(), &mut buf, 0, true).unwrap() {
            None => std::thread::sleep(Duration::from_millis(1)),
            Some(_) => break,
        }
    }
}

/// (c) `XDP_SHARED_UMEM` across processes: a child process given the
/// parent's socket and the memfd its UMEM lives in binds a socket of its
/// own on another queue over that UMEM. The kernel allows it with nothing
/// more than the descriptor; the frames the child's socket receives lie
/// in memory the parent reads too: no isolation between the two.
#[test]
fn a_umem_is_shared_with_another_process() {
    use std::os::unix::process::CommandExt;

    let Some(ns) = NetNs::create_with_queues_or_skip(2) else {
        return;
    };
    static_neighbour(&ns, ns.peer_ip);
    let index = ifindex(&ns.host_if);
    let memfd = ginza_sys::memfd::create("shared-umem", (CHUNKS * CHUNK) as u64).unwrap();
    let umem = Umem::shared(memfd.as_fd(), CHUNKS, CHUNK).unwrap();
    let mut parent = Xsk::open(index, 0, umem, UmemOwner::Own, RING, BindMode::Copy).unwrap();
    lend(&mut parent, 0..RING as usize / 2);
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let fds = [
        (parent.fd().as_raw_fd(), CHILD_SOCKET_FD),
        (memfd.as_raw_fd(), CHILD_MEMFD_FD),
        (theirs.as_raw_fd(), CHILD_CHANNEL_FD),
    ];
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "shared_umem_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, format!("{index},1"));
    // SAFETY: between fork and exec the closure only calls dup2, which is
    // async-signal-safe; the descriptors it copies are open in the parent.
    unsafe {
        command.pre_exec(move || {
            for (from, to) in fds {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    drop(theirs);
    let mut buf = [0u8; 256];
    let reply = ginza_sys::socket::recv_with_fds(ours.as_fd(), &mut buf, 1, false)
        .unwrap()
        .expect("a blocking receive returns a message");
    let said = String::from_utf8_lossy(&buf[..reply.len]).into_owned();
    assert_eq!(said, "bound", "the child's bind with XDP_SHARED_UMEM");
    let theirs_xsk = reply.fds.into_iter().next().expect("the child's socket");

    let mut steering = XdpSteering::load(2).unwrap();
    steering.set_socket(0, parent.fd().as_raw_fd()).unwrap();
    steering.set_socket(1, theirs_xsk.as_raw_fd()).unwrap();
    steering.claim(ns.peer_ip).unwrap();
    let link = steering.attach(index, XdpMode::Driver).unwrap();
    send_flows(&ns, ns.peer_ip);
    // The parent's own socket: the flows of queue 0.
    let mut mine = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        for (_, bytes) in drain(&mut parent) {
            mine.extend(flow_of(&bytes, ns.peer_ip));
        }
    }
    // The child's frames, read by the parent in the child's half of the
    // shared UMEM (each chunk holds the last frame the kernel put there).
    let view = Umem::shared(memfd.as_fd(), CHUNKS, CHUNK).unwrap();
    let mut in_their_half = BTreeSet::new();
    for chunk in CHUNKS / 2..CHUNKS {
        let bytes = view.bytes(view.chunk_addr(chunk), CHUNK as u32).unwrap();
        // Copy mode puts the frame after the kernel's 256 bytes of headroom.
        if let Some(flow) = flow_of(&bytes[256..], ns.peer_ip) {
            in_their_half.insert(flow);
        }
    }
    drop(link);
    ginza_sys::socket::send_with_fds(ours.as_fd(), b"stop", &[]).unwrap();
    let status = child.wait().unwrap();
    println!(
        "shared UMEM: parent's socket (queue 0) got {} flows; {} other flows read by the parent \
         in the chunks the child's socket (queue 1) received into",
        mine.len(),
        in_their_half.len()
    );
    assert!(status.success(), "the child: {status}");
    assert!(
        !in_their_half.is_empty(),
        "the parent reads the child's frames"
    );
    assert!(
        in_their_half.is_disjoint(&mine),
        "the child's flows are those of queue 1"
    );
}
