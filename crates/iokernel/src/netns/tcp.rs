//! Linux TCP peers for tests and benchmarks: echo servers (a thread per
//! connection blocked in `read`, or one thread busy-polling non-blocking
//! sockets on a pinned CPU, the strongest kernel peer), a sink that answers
//! a one-way transfer with a receipt, and the clients that measure round
//! trips and move bulk data.
//!
//! Every function works in the network namespace of the thread that calls
//! it, and threads it starts inherit that namespace: run them inside a
//! [`NetNs`](super::NetNs) with [`NetNs::run_in`](super::NetNs::run_in), or
//! in the root namespace on an address of the veth's host end
//! ([`NetNs::add_host_address`](super::NetNs::add_host_address)).
//!
//! The sink's receipt: when the sender has shut down its side, the sink
//! sends back 16 bytes, the count of bytes it received and their
//! [`ContentHash`] ([`ginza_proto::content::receipt`]), and closes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ginza_sys::hops::{self, Hop};
use hdrhistogram::Histogram;

use super::NetNs;
pub use ginza_proto::content::Transfer;
use ginza_proto::content::{parse_receipt, receipt, send_pattern, ContentHash, RECEIPT_LEN};

/// How often blocked server threads look at their stop flag.
const STOP_POLL: Duration = Duration::from_millis(10);

/// How a Linux echo server waits for data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EchoMode {
    /// A thread per connection, blocked in `read` (the common server).
    Blocking,
    /// One thread, pinned to `cpu` when given, spinning over non-blocking
    /// sockets (and asking the kernel to busy-poll the device for them,
    /// `SO_BUSY_POLL`): no sleep or wake-up on the server's side.
    BusyPoll { cpu: Option<usize> },
}

/// A running Linux server; [`LinuxServer::stop`] (or drop) ends it.
#[derive(Debug)]
pub struct LinuxServer {
    addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    bytes: Arc<AtomicU64>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl LinuxServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// Bytes received so far over all connections.
    pub fn bytes_received(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    /// Stops the server and its connections; its error, if it failed.
    pub fn stop(mut self) -> io::Result<u64> {
        self.finish()?;
        Ok(self.bytes.load(Relaxed))
    }

    fn finish(&mut self) -> io::Result<()> {
        self.stop.store(true, Relaxed);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| io::Error::other("a Linux server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for LinuxServer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// A Linux TCP echo server (RFC 862) on `bind` (port 0: any), in the
/// calling thread's namespace.
pub fn echo_server(bind: SocketAddrV4, mode: EchoMode) -> io::Result<LinuxServer> {
    let listener = TcpListener::bind(bind)?;
    let addr = v4(listener.local_addr()?)?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let (s, b) = (stop.clone(), bytes.clone());
    let thread = std::thread::Builder::new()
        .name("linux-echo".into())
        .spawn(move || match mode {
            EchoMode::Blocking => accept_loop(&listener, &s, |stream| {
                let (s, b) = (s.clone(), b.clone());
                std::thread::spawn(move || echo_blocking(stream, &s, &b))
            }),
            EchoMode::BusyPoll { cpu } => {
                if let Some(cpu) = cpu {
                    ginza_sys::affinity::pin_current_thread(cpu)?;
                }
                echo_busy_poll(&listener, &s, &b)
            }
        })?;
    Ok(LinuxServer {
        addr,
        stop,
        bytes,
        thread: Some(thread),
    })
}

/// A Linux TCP sink on `bind`: reads each connection to its end, then
/// answers with the receipt (count and hash) and closes.
pub fn sink_server(bind: SocketAddrV4) -> io::Result<LinuxServer> {
    let listener = TcpListener::bind(bind)?;
    let addr = v4(listener.local_addr()?)?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let (s, b) = (stop.clone(), bytes.clone());
    let thread = std::thread::Builder::new()
        .name("linux-sink".into())
        .spawn(move || {
            accept_loop(&listener, &s, |stream| {
                let (s, b) = (s.clone(), b.clone());
                std::thread::spawn(move || sink_one(stream, &s, &b))
            })
        })?;
    Ok(LinuxServer {
        addr,
        stop,
        bytes,
        thread: Some(thread),
    })
}

fn v4(addr: SocketAddr) -> io::Result<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(a) => Err(io::Error::other(format!("{a}: not IPv4"))),
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Accepts until `stop`, handing each connection to `serve`; joins the
/// connection threads at the end. The listener is non-blocking: accepting
/// polls, with a short pause, so that `stop` is seen.
fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    mut serve: impl FnMut(TcpStream) -> JoinHandle<io::Result<()>>,
) -> io::Result<()> {
    let mut connections = Vec::new();
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(STOP_POLL))?;
                stream.set_write_timeout(Some(STOP_POLL))?;
                connections.push(serve(stream));
            }
            // Nothing to accept: wait a little (a server, not a test).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(200))
            }
            Err(e) => return Err(e),
        }
    }
    // A connection's own error (its peer reset it) ends that connection
    // only.
    for c in connections {
        let _ = c.join();
    }
    Ok(())
}

fn echo_blocking(mut stream: TcpStream, stop: &AtomicBool, bytes: &AtomicU64) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => {
                let _ = stream.shutdown(Shutdown::Write);
                return Ok(());
            }
            Ok(n) => {
                bytes.fetch_add(n as u64, Relaxed);
                // Hop stamps, when `ginza bench tcp` turned them on.
                hops::stamp(Hop::AppRead);
                hops::stamp(Hop::ServerWrite);
                write_all_until_stopped(&mut stream, &buf[..n], stop)?;
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf`, or gives up once `stop` is set: a peer that stopped
/// reading (its stack gone without a reset) must not hold the connection's
/// thread, and with it the server's `stop`, for ever.
fn write_all_until_stopped(
    stream: &mut TcpStream,
    mut buf: &[u8],
    stop: &AtomicBool,
) -> io::Result<()> {
    while !buf.is_empty() {
        match stream.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                if stop.load(Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn sink_one(mut stream: TcpStream, stop: &AtomicBool, bytes: &AtomicU64) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut hash = ContentHash::new();
    while !stop.load(Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => {
                write_all_until_stopped(&mut stream, &receipt(&hash), stop)?;
                return stream.shutdown(Shutdown::Write);
            }
            Ok(n) => {
                bytes.fetch_add(n as u64, Relaxed);
                hash.update(&buf[..n]);
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Asks the kernel to busy-poll the device queue for up to `us` µs when
/// this socket has nothing (`SO_BUSY_POLL`); best effort (a kernel or
/// device without it just does not).
fn busy_poll(fd: &impl AsRawFd, us: libc::c_int) {
    // SAFETY: `fd` is an open socket and the option value is a c_int that
    // lives across the call.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BUSY_POLL,
            (&us as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// One connection of the busy-polling server: bytes read but not yet
/// written back wait in `pending`.
struct Polled {
    stream: TcpStream,
    pending: Vec<u8>,
    done: bool,
}

fn echo_busy_poll(listener: &TcpListener, stop: &AtomicBool, bytes: &AtomicU64) -> io::Result<()> {
    let mut connections: Vec<Polled> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(true)?;
                stream.set_nodelay(true)?;
                busy_poll(&stream, 50);
                connections.push(Polled {
                    stream,
                    pending: Vec::new(),
                    done: false,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        for c in &mut connections {
            // Write back what is pending before reading more: the echo
            // never holds more than one read's worth per connection.
            if !c.pending.is_empty() {
                match c.stream.write(&c.pending) {
                    Ok(n) => {
                        c.pending.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(_) => {
                        c.done = true;
                        continue;
                    }
                }
                if !c.pending.is_empty() {
                    continue;
                }
            }
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    let _ = c.stream.shutdown(Shutdown::Write);
                    c.done = true;
                }
                Ok(n) => {
                    bytes.fetch_add(n as u64, Relaxed);
                    hops::stamp(Hop::AppRead);
                    hops::stamp(Hop::ServerWrite);
                    match c.stream.write(&buf[..n]) {
                        Ok(w) => c.pending.extend_from_slice(&buf[w..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            c.pending.extend_from_slice(&buf[..n])
                        }
                        Err(_) => c.done = true,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => c.done = true,
            }
        }
        connections.retain(|c| !c.done);
        std::hint::spin_loop();
    }
    Ok(())
}

impl NetNs {
    /// A Linux TCP echo server on `ns_ip:port` inside the namespace.
    pub fn tcp_echo_server(&self, port: u16, mode: EchoMode) -> io::Result<LinuxServer> {
        let bind = SocketAddrV4::new(self.ns_ip, port);
        self.run_in(move || echo_server(bind, mode))?
    }

    /// A Linux TCP sink on `ns_ip:port` inside the namespace.
    pub fn tcp_sink_server(&self, port: u16) -> io::Result<LinuxServer> {
        let bind = SocketAddrV4::new(self.ns_ip, port);
        self.run_in(move || sink_server(bind))?
    }

    /// Takes the namespace's end of the veth down (`up == false`): from
    /// then on the Linux peers there neither send nor receive, as if the
    /// host had vanished; `true` brings it back.
    pub fn set_link_up(&self, up: bool) -> io::Result<()> {
        let state = if up { "up" } else { "down" };
        self.exec_ok(&["ip", "link", "set", &self.ns_if, state])
            .map(drop)
    }

    /// Gives the veth's host end the address `.last` of the namespace's
    /// subnet for as long as the guard lives, so that Linux programs in
    /// the root namespace are reached from the namespace over the veth
    /// (the kernel's side of a Linux-versus-Ginza comparison). While
    /// iokerneld drives the interface, the kernel still gets the frames for
    /// this address: AF_XDP takes only Ginza's (docs/xdp.md).
    pub fn add_host_address(&self, last: u8) -> io::Result<HostAddress> {
        let [a, b, c, _] = self.ns_ip.octets();
        let ip = std::net::Ipv4Addr::new(a, b, c, last);
        if ip == self.ns_ip || ip == self.peer_ip {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{ip} is already the namespace's or the peer's"),
            ));
        }
        let cidr = format!("{ip}/24");
        super::ip(&["addr", "add", &cidr, "dev", &self.host_if])?;
        Ok(HostAddress {
            ip,
            cidr,
            dev: self.host_if.clone(),
        })
    }
}

/// An address on the veth's host end, removed on drop.
#[derive(Debug)]
pub struct HostAddress {
    pub ip: std::net::Ipv4Addr,
    cidr: String,
    dev: String,
}

impl Drop for HostAddress {
    fn drop(&mut self) {
        let _ = super::quiet_ip(&["addr", "del", &self.cidr, "dev", &self.dev]);
    }
}

/// Round trips of a request/response client on one persistent connection.
#[derive(Debug, Clone)]
pub struct RttReport {
    /// Round trips in ns (the measured ones, not the warm-up).
    pub histogram: Histogram<u64>,
}

impl RttReport {
    /// The `q` quantile (0..=1) in µs.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.histogram.value_at_quantile(q) as f64 / 1e3
    }
}

/// A histogram of round trips in ns, 1 ns to 10 s, 3 significant digits.
pub fn rtt_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid histogram bounds")
}

/// Connects to `target`, sends `warmup` then `count` requests of
/// `payload_len` bytes, one at a time, each answered by its echo before the
/// next, and records the measured round trips. An echo that differs from
/// its request, or does not come within `timeout`, is an error (TCP does
/// not lose).
pub fn rtt_probe(
    target: SocketAddrV4,
    warmup: usize,
    count: usize,
    payload_len: usize,
    timeout: Duration,
) -> io::Result<RttReport> {
    rtt_series(
        target,
        warmup,
        payload_len,
        timeout,
        ClientWait::Blocking,
        |n, _| n >= count as u64,
    )
}

/// As [`rtt_probe`], measuring for `duration` (after the warm-up) instead
/// of a count, the client waiting for each echo as `wait` says.
pub fn rtt_probe_for(
    target: SocketAddrV4,
    warmup: usize,
    duration: Duration,
    payload_len: usize,
    timeout: Duration,
    wait: ClientWait,
) -> io::Result<RttReport> {
    rtt_series(target, warmup, payload_len, timeout, wait, |_, t| {
        t >= duration
    })
}

/// How a probe's client waits for each echo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientWait {
    /// In `read`, with the timeout as the socket's read timeout.
    Blocking,
    /// Polling a non-blocking socket until the echo is in or the timeout
    /// has passed (the busy-polling peer: no sleep or wake-up on the
    /// client's side either; pin the calling thread first).
    Spinning,
}

/// Reads exactly `buf.len()` bytes from a non-blocking `stream`, spinning,
/// within `timeout`.
fn read_exact_spinning(
    stream: &mut TcpStream,
    buf: &mut [u8],
    timeout: Duration,
) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut at = 0;
    while at < buf.len() {
        match stream.read(&mut buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Ping-pong until `done(measured, time measuring)`.
fn rtt_series(
    target: SocketAddrV4,
    warmup: usize,
    payload_len: usize,
    timeout: Duration,
    wait: ClientWait,
    done: impl Fn(u64, Duration) -> bool,
) -> io::Result<RttReport> {
    let mut stream = TcpStream::connect_timeout(&target.into(), timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    if wait == ClientWait::Spinning {
        // 64-byte requests, one at a time: a write never finds the send
        // buffer full, so only reads spin.
        stream.set_nonblocking(true)?;
        busy_poll(&stream, 50);
    }
    let mut request = vec![0u8; payload_len.max(8)];
    let mut reply = vec![0u8; request.len()];
    let mut histogram = rtt_histogram();
    let mut measuring_since = None;
    for sequence in 0u64.. {
        if sequence == warmup as u64 {
            measuring_since = Some(Instant::now());
        }
        if let Some(since) = measuring_since {
            if done(histogram.len(), since.elapsed()) {
                break;
            }
        }
        request[..8].copy_from_slice(&sequence.to_le_bytes());
        let start = Instant::now();
        // Hop stamps, when a benchmark turned them on (`ginza bench tcp`).
        hops::begin();
        stream.write_all(&request)?;
        match wait {
            ClientWait::Blocking => stream.read_exact(&mut reply),
            ClientWait::Spinning => read_exact_spinning(&mut stream, &mut reply, timeout),
        }
        .map_err(|e| io::Error::new(e.kind(), format!("round trip {sequence} to {target}: {e}")))?;
        hops::end();
        let rtt = start.elapsed();
        if reply != request {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("round trip {sequence} to {target}: the echo differs from the request"),
            ));
        }
        if measuring_since.is_some() {
            histogram.saturating_record(rtt.as_nanos() as u64);
        }
    }
    Ok(RttReport { histogram })
}

/// Sends `bytes` of [`Pattern`] `seed` to the echo server at `target` on
/// one connection while a second thread reads the echo back and hashes it;
/// then shuts down our side and reads to the end. `timeout`: the longest
/// wait for one read or write.
pub fn echo_transfer(
    target: SocketAddrV4,
    bytes: u64,
    seed: u64,
    timeout: Duration,
) -> io::Result<Transfer> {
    let start = Instant::now();
    let mut stream = TcpStream::connect_timeout(&target.into(), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut reader = stream.try_clone()?;
    let receiving = std::thread::spawn(move || -> io::Result<ContentHash> {
        let mut hash = ContentHash::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf)? {
                0 => return Ok(hash),
                n => hash.update(&buf[..n]),
            }
        }
    });
    let sent_hash = send_pattern(bytes, seed, |b| stream.write_all(b));
    let shut = stream.shutdown(Shutdown::Write);
    let received = receiving
        .join()
        .map_err(|_| io::Error::other("the receiving thread panicked"))?;
    let sent_hash = sent_hash?;
    shut?;
    let received = received?;
    Ok(Transfer {
        sent: bytes,
        sent_hash,
        received: received.len(),
        received_hash: received.finish(),
        elapsed: start.elapsed(),
    })
}

/// Sends `bytes` of [`Pattern`] `seed` to the sink at `target`, shuts down
/// our side and waits for the receipt.
pub fn sink_transfer(
    target: SocketAddrV4,
    bytes: u64,
    seed: u64,
    timeout: Duration,
) -> io::Result<Transfer> {
    let start = Instant::now();
    let mut stream = TcpStream::connect_timeout(&target.into(), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut written = 0u64;
    let sent_hash = send_pattern(bytes, seed, |b| {
        stream.write_all(b)?;
        written += b.len() as u64;
        Ok::<(), io::Error>(())
    })
    .map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "sending to the sink at {target}: {e} after {written} of {bytes} bytes, {:.1} s",
                start.elapsed().as_secs_f64()
            ),
        )
    })?;
    stream.shutdown(Shutdown::Write)?;
    let mut r = [0u8; RECEIPT_LEN];
    stream.read_exact(&mut r).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("the receipt from the sink at {target}: {e}"),
        )
    })?;
    let (received, received_hash) = parse_receipt(&r);
    Ok(Transfer {
        sent: bytes,
        sent_hash,
        received,
        received_hash,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ginza_proto::content::Pattern;
    use std::net::Ipv4Addr;

    const LOCAL: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn both_echo_servers_answer_round_trips_and_bulk() {
        for mode in [EchoMode::Blocking, EchoMode::BusyPoll { cpu: None }] {
            let server = echo_server(LOCAL, mode).unwrap();
            let rtt = rtt_probe(server.addr(), 10, 100, 64, WAIT).unwrap();
            assert_eq!(rtt.histogram.len(), 100, "{mode:?}");
            assert!(rtt.quantile_us(0.5) > 0.0);
            let probe = |wait| {
                rtt_probe_for(server.addr(), 0, Duration::from_millis(20), 64, WAIT, wait).unwrap()
            };
            let timed = probe(ClientWait::Blocking);
            assert!(!timed.histogram.is_empty());
            let spun = probe(ClientWait::Spinning);
            assert!(!spun.histogram.is_empty(), "{mode:?}");
            let t = echo_transfer(server.addr(), 3_000_001, 5, WAIT).unwrap();
            assert!(t.intact(), "{mode:?}: {t:?}");
            assert_eq!(t.sent_hash, Pattern::hash_of(5, 3_000_001));
            let received = server.stop().unwrap();
            let round_trips = 110 + timed.histogram.len() + spun.histogram.len();
            assert!(received >= 3_000_001 + round_trips * 64, "{mode:?}");
        }
    }

    #[test]
    fn the_sink_answers_with_a_receipt() {
        let server = sink_server(LOCAL).unwrap();
        let t = sink_transfer(server.addr(), 1_000_003, 8, WAIT).unwrap();
        assert!(t.intact(), "{t:?}");
        assert!(t.mbps() > 0.0);
        assert_eq!(server.stop().unwrap(), 1_000_003);
    }

    #[test]
    fn an_absent_server_is_a_clear_error() {
        let port = {
            let l = TcpListener::bind(LOCAL).unwrap();
            v4(l.local_addr().unwrap()).unwrap()
        };
        let e = rtt_probe(port, 0, 1, 64, WAIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }
}
