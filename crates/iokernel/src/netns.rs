//! A network namespace joined to the root namespace by a veth pair, for tests
//! and benches that put an ordinary Linux stack (ping, UDP sockets) on the
//! far end of a Ginza NIC backend.
//!
//! ```text
//!  root namespace                 | namespace `name`
//!  host_if (up, no address)  <--veth-->  ns_if  ns_ip/24 (10.77.N.1)
//!  a Ginza backend opens it       |  Linux programs live here
//! ```
//!
//! `peer_ip` (10.77.N.2) belongs to nobody: the test answers ARP for it.
//! These addresses exist only inside the namespace this fixture creates,
//! except a Linux peer's on the host end ([`NetNs::add_host_address`]): so
//! N is held across processes for the fixture's life (`subnet.rs`).
//!
//! Names carry the pid and a counter, so concurrent test processes never
//! collide; namespaces left by a killed test process (its pid gone) are
//! removed by the next fixture. `Drop` removes the pair and the namespace,
//! also when the test panics. IPv6 is off on both ends (no router
//! solicitations or DAD frames to wade through) and transmit offloads are
//! off on `ns_if`, so frames from the namespace carry full checksums.
//!
//! Needs root, `ip` (iproute2) and `ethtool`; without them
//! [`NetNs::create_or_skip`] skips the test ([`crate::testing::skip`]: prints
//! `skipped: <reason>`, or fails under CI as root) and returns `None`, and
//! [`NetNs::create`] says what is missing (benchmarks).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod subnet;
pub mod tcp;

const PREFIX: &str = "gzt";

static COUNTER: AtomicU32 = AtomicU32::new(0);

#[derive(Debug)]
pub struct NetNs {
    /// The namespace's name (under /run/netns).
    pub name: String,
    /// The veth end in the root namespace: up, no address.
    pub host_if: String,
    /// The veth end in the namespace, with `ns_ip`/24.
    pub ns_if: String,
    pub ns_mac: [u8; 6],
    pub ns_ip: Ipv4Addr,
    /// An address on the namespace's subnet that nobody there owns.
    pub peer_ip: Ipv4Addr,
    /// The subnet, held until the fixture is dropped.
    _subnet: subnet::Subnet,
}

impl NetNs {
    /// A fresh namespace and veth pair, or `None` after skipping the test
    /// ([`crate::testing::skip`]) when this host cannot make one (not root,
    /// `ip` or `ethtool` missing). Any other failure panics: it is a real
    /// error.
    #[track_caller]
    pub fn create_or_skip() -> Option<NetNs> {
        if let Some(reason) = missing_prerequisite() {
            crate::testing::skip(reason);
            return None;
        }
        Some(NetNs::create().expect("creating a network namespace and veth pair"))
    }

    /// A fresh namespace and veth pair; the error says what is missing or
    /// what failed.
    pub fn create() -> io::Result<NetNs> {
        NetNs::create_with_queues(1)
    }

    /// [`NetNs::create_or_skip`] with `queues` receive and transmit queues
    /// on each end of the pair (the direct path's experiments,
    /// docs/direct-path.md).
    #[track_caller]
    pub fn create_with_queues_or_skip(queues: u32) -> Option<NetNs> {
        if let Some(reason) = missing_prerequisite() {
            crate::testing::skip(reason);
            return None;
        }
        Some(NetNs::create_with_queues(queues).expect("creating a network namespace and veth pair"))
    }

    /// A fresh namespace and a veth pair with `queues` receive and transmit
    /// queues on each end.
    pub fn create_with_queues(queues: u32) -> io::Result<NetNs> {
        if let Some(reason) = missing_prerequisite() {
            return Err(io::Error::other(reason));
        }
        remove_stale();
        let pid = std::process::id();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        // IFNAMSIZ: 3 + 7 (pid_max is 2^22) + 1 + at most 4 digits = 15.
        let n = n % 10_000;
        // Processes start their search at different subnets (fewer tries).
        let subnet = subnet::reserve(std::path::Path::new(subnet::DIR), pid.wrapping_add(n))?;
        let octet = subnet.octet;
        let mut ns = NetNs {
            name: format!("{PREFIX}{pid}n{n}"),
            host_if: format!("{PREFIX}{pid}h{n}"),
            ns_if: format!("{PREFIX}{pid}p{n}"),
            ns_mac: [0; 6],
            ns_ip: Ipv4Addr::new(10, 77, octet, 1),
            peer_ip: Ipv4Addr::new(10, 77, octet, 2),
            _subnet: subnet,
        };
        // From here on, Drop cleans up whatever was made.
        ip(&["netns", "add", &ns.name])?;
        let queues = queues.max(1).to_string();
        let queues = ["numtxqueues", &queues, "numrxqueues", &queues];
        let mut add = vec!["link", "add", &ns.host_if];
        add.extend(queues);
        add.extend(["type", "veth", "peer", "name", &ns.ns_if]);
        add.extend(queues);
        add.extend(["netns", &ns.name]);
        ip(&add)?;
        let _ = std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", ns.host_if),
            "1",
        );
        let ns_sysctl = format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", ns.ns_if);
        // /proc/sys/net shows the namespace of the thread that opens it.
        ns.run_in(move || {
            let _ = std::fs::write(ns_sysctl, "1");
        })?;
        ns.exec_ok(&["ethtool", "-K", &ns.ns_if, "tx", "off"])?;
        let address = format!("{}/24", ns.ns_ip);
        ip(&["-n", &ns.name, "addr", "add", &address, "dev", &ns.ns_if])?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        ip(&["-n", &ns.name, "link", "set", &ns.ns_if, "up"])?;
        ip(&["link", "set", &ns.host_if, "up"])?;
        ns.ns_mac = ns.read_ns_mac()?;
        Ok(ns)
    }

    /// `ip netns exec NAME args...`, not yet run (to spawn it and poll).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).args(args);
        command.stdin(Stdio::null());
        command
    }

    /// Runs `args` in the namespace to completion.
    pub fn exec(&self, args: &[&str]) -> io::Result<Output> {
        self.command(args).output()
    }

    /// Runs `args` in the namespace; an error if it fails.
    pub fn exec_ok(&self, args: &[&str]) -> io::Result<Output> {
        checked(args, self.exec(args)?)
    }

    /// Every CPU of the namespace's end transmits on `queue` of its
    /// `queues` (XPS). A veth delivers a frame on the receive queue
    /// numbered as the transmit queue it was sent on (in driver-mode XDP),
    /// so this steers the namespace's frames to `queue` of `host_if`:
    /// how the direct path's tests and benches reach an application's own
    /// socket (docs/direct-path.md).
    pub fn steer_transmit_to_queue(&self, queues: u32, queue: u32) -> io::Result<()> {
        let cpus = ginza_sys::topology::online_cpus()?;
        if let Some(c) = cpus.iter().find(|&&c| c >= 64) {
            return Err(io::Error::other(format!(
                "XPS masks of up to 64 CPUs are written here; CPU {c} is online"
            )));
        }
        let all = format!("{:x}", cpus.iter().fold(0u64, |m, &c| m | 1 << c));
        for q in 0..queues {
            let mask = if q == queue { all.as_str() } else { "0" };
            let path = format!("/sys/class/net/{}/queues/tx-{q}/xps_cpus", self.ns_if);
            self.exec_ok(&["sh", "-c", &format!("echo {mask} > {path}")])?;
        }
        Ok(())
    }

    /// The host end's interface index.
    pub fn host_ifindex(&self) -> io::Result<u32> {
        let path = format!("/sys/class/net/{}/ifindex", self.host_if);
        let text = std::fs::read_to_string(&path)?;
        text.trim()
            .parse()
            .map_err(|e| io::Error::other(format!("{path}: {text:?}: {e}")))
    }

    /// An AF_XDP socket on `queue` of the host end, as an application on
    /// the direct path holds one (docs/direct-path.md): copy mode, a UMEM
    /// of its own of 64 chunks of 2 KiB, rings of `ring` entries.
    pub fn own_socket(&self, queue: u32, ring: u32) -> io::Result<ginza_sys::xsk::Xsk> {
        use ginza_sys::xsk::{BindMode, Umem, UmemOwner, Xsk};
        let umem = Umem::private(64, 2048)?;
        Xsk::open(
            self.host_ifindex()?,
            queue,
            umem,
            UmemOwner::Own,
            ring,
            BindMode::Copy,
        )
        .map_err(|e| io::Error::new(e.error.kind(), e.to_string()))
    }

    /// Runs `f` on a new thread that has joined the namespace (sockets it
    /// opens live there) and returns its handle.
    pub fn spawn_in<F, R>(&self, f: F) -> io::Result<JoinHandle<R>>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let namespace = File::open(format!("/run/netns/{}", self.name))?;
        let (joined_tx, joined_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            // SAFETY: `namespace` is an open namespace file; setns changes
            // only this thread's network namespace, which it keeps until it
            // exits.
            let result = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
            let joined = if result == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            };
            let ok = joined.is_ok();
            joined_tx.send(joined).expect("the spawner waits");
            assert!(ok, "setns failed");
            f()
        });
        joined_rx.recv().expect("the thread reports")?;
        Ok(handle)
    }

    /// Runs `f` inside the namespace and waits for it.
    pub fn run_in<F, R>(&self, f: F) -> io::Result<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let handle = self.spawn_in(f)?;
        Ok(handle
            .join()
            .expect("the closure run in the namespace panicked"))
    }

    /// A UDP echo server on `ns_ip:port` in the namespace: it sends every
    /// datagram back to its sender until `duration` has passed, then returns
    /// how many it echoed. Bounded: it never outlives `duration` by more
    /// than its 10 ms read timeout.
    pub fn udp_echo_server(&self, port: u16, duration: Duration) -> io::Result<JoinHandle<u64>> {
        let bind = SocketAddrV4::new(self.ns_ip, port);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = self.spawn_in(move || {
            let socket = UdpSocket::bind(bind);
            let socket = match socket {
                Ok(socket) => {
                    ready_tx.send(Ok(())).expect("the spawner waits");
                    socket
                }
                Err(error) => {
                    ready_tx.send(Err(error)).expect("the spawner waits");
                    return 0;
                }
            };
            socket
                .set_read_timeout(Some(Duration::from_millis(10)))
                .expect("a read timeout");
            let deadline = Instant::now() + duration;
            let mut buffer = [0u8; 2048];
            let mut echoed = 0;
            while Instant::now() < deadline {
                if let Ok((len, from)) = socket.recv_from(&mut buffer) {
                    if socket.send_to(&buffer[..len], from).is_ok() {
                        echoed += 1;
                    }
                }
            }
            echoed
        })?;
        ready_rx.recv().expect("the server reports")?;
        Ok(handle)
    }

    fn read_ns_mac(&self) -> io::Result<[u8; 6]> {
        let output = checked(
            &["ip", "link", "show"],
            Command::new("ip")
                .args(["-n", &self.name, "-o", "link", "show", "dev", &self.ns_if])
                .output()?,
        )?;
        let text = String::from_utf8_lossy(&output.stdout);
        let mac = text
            .split_whitespace()
            .skip_while(|word| *word != "link/ether")
            .nth(1)
            .and_then(parse_mac)
            .ok_or_else(|| io::Error::other(format!("no MAC in `ip link show`: {text}")))?;
        Ok(mac)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting one end deletes the pair at once; deleting the namespace
        // alone would destroy its end later, asynchronously.
        let _ = quiet_ip(&["link", "del", &self.host_if]);
        let _ = quiet_ip(&["netns", "del", &self.name]);
    }
}

/// Round trips of `count` datagrams of `payload_len` bytes from a fresh
/// socket on `bind` to `target`, one at a time; a datagram unanswered within
/// `timeout` counts as lost (`None`). Run it in the namespace with
/// [`NetNs::spawn_in`].
pub fn udp_rtt_probe(
    bind: SocketAddrV4,
    target: SocketAddrV4,
    count: usize,
    payload_len: usize,
    timeout: Duration,
) -> io::Result<Vec<Option<Duration>>> {
    let socket = UdpSocket::bind(bind)?;
    socket.connect(target)?;
    socket.set_read_timeout(Some(timeout))?;
    let mut payload = vec![0u8; payload_len.max(8)];
    let mut reply = vec![0u8; 2048];
    let mut rtts = Vec::with_capacity(count);
    for sequence in 0..count as u64 {
        payload[..8].copy_from_slice(&sequence.to_le_bytes());
        let start = Instant::now();
        socket.send(&payload)?;
        let deadline = start + timeout;
        let mut rtt = None;
        // Skip late replies to earlier datagrams.
        while Instant::now() < deadline {
            match socket.recv(&mut reply) {
                Ok(len) if len >= 8 && reply[..8] == sequence.to_le_bytes() => {
                    rtt = Some(start.elapsed());
                    break;
                }
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                Err(error) => return Err(error),
            }
        }
        rtts.push(rtt);
    }
    Ok(rtts)
}

/// Why this host cannot make a namespace and veth pair, if it cannot.
pub fn missing_prerequisite() -> Option<String> {
    if !crate::testing::running_as_root() {
        return Some("not root: network namespaces and veth pairs need root".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("ethtool", "ethtool")] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` is missing (Debian package {package})"));
        }
    }
    None
}

/// Removes namespaces (and their veth pairs) of test processes that died
/// without running `Drop`.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('n'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = quiet_ip(&["netns", "del", &name]);
        }
    }
}

fn ip(args: &[&str]) -> io::Result<Output> {
    checked(args, Command::new("ip").args(args).output()?)
}

fn quiet_ip(args: &[&str]) -> io::Result<()> {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|_| ())
}

fn checked(args: &[&str], output: Output) -> io::Result<Output> {
    if output.status.success() {
        Ok(output)
    } else {
        Err(io::Error::other(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}
