//! `spin-server`: a UDP server whose requests carry their own service time
//! (the request header of iokerneld's traffic generator, or of any client
//! that writes one): it spins for that long and echoes the payload back.
//! The synthetic server of Shenango's and Shinjuku's evaluations.
//!
//! One receiver uthread per socket spawns one uthread per request, so that
//! a backlog waits on runqueues, where iokerneld's congestion detection
//! sees it (a backlog in a socket queue would be invisible to it), and
//! idle kthreads steal requests from busy ones.

use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_proto::RequestHeader;
use ginza_runtime::metrics::RequestTimer;
use ginza_runtime::net::UdpSocket;

use crate::request_trace::{RequestStamps, RequestTrace};
use crate::serve::is_timeout;

/// The longest service time a request may ask for; longer requests are
/// answered at once and counted (a client cannot make the server spin for
/// minutes).
pub const MAX_SERVICE: Duration = Duration::from_millis(100);

/// How often a receiver waiting for a request checks the stop flag.
const STOP_POLL: Duration = Duration::from_millis(10);

/// Counts of one server run.
#[derive(Debug, Default)]
pub struct SpinStats {
    /// Requests answered.
    pub served: AtomicU64,
    /// Service time spent, ns.
    pub busy_ns: AtomicU64,
    /// Datagrams too short to carry a request header (answered at once).
    pub malformed: AtomicU64,
    /// Requests that asked for more than [`MAX_SERVICE`] (answered at once).
    pub too_long: AtomicU64,
    /// Replies that could not be sent.
    pub send_errors: AtomicU64,
    /// Per-request stamps, when given a capacity (`ginza demo`'s phase
    /// breakdown); a traced reply carries its own posting time in the
    /// header's `send_ns` (the generator keeps its own send time).
    pub trace: RequestTrace,
}

/// Spins (wall clock) for `d`: the request's work. Long requests reach
/// preemption points through the runtime's signal; nothing to do here.
pub fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Serves `port` until `stop` is set (checked at least every 10 ms).
/// Must run on a uthread of a runtime with networking.
pub fn serve(port: u16, stop: Arc<AtomicBool>, stats: Arc<SpinStats>) -> io::Result<()> {
    let socket = Arc::new(UdpSocket::bind(port)?);
    crate::serve::datagrams_until_stopped(&socket, &stop, |request, from| {
        let timer = RequestTimer::start();
        let stamps = stats.trace.enabled().then(|| picked(request));
        let request = request.to_vec();
        let (socket, stats) = (socket.clone(), stats.clone());
        ginza_runtime::spawn(move || answer(&socket, request, from, &stats, stamps, timer));
    })
}

/// The stamps of a request the receiver has just taken: its injection and
/// the grant its kthread last ran after.
fn picked(request: &[u8]) -> RequestStamps {
    let picked_ns = ginza_sys::clock::monotonic_ns();
    let wake = ginza_runtime::last_wake();
    RequestStamps {
        inject_ns: RequestHeader::decode(request).map_or(0, |h| h.send_ns),
        decided_ns: wake.map_or(0, |w| w.decided_ns),
        running_ns: wake.map_or(0, |w| w.running_ns),
        picked_ns,
        ..Default::default()
    }
}

/// Spins for `d` at preemption points: a request of a Shinjuku-mode
/// server yields there when asked (its quantum is spent, or its core is
/// being revoked; docs/colocate.md).
pub fn spin_preemptible(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        ginza_runtime::preempt_point();
    }
}

/// The request handler of the Shinjuku-mode server (dispatch by
/// iokerneld): spins for the request's service time at preemption points,
/// then echoes it.
pub fn answer_preemptible(request: &[u8], stats: &SpinStats) -> Vec<u8> {
    work_with(request, stats, spin_preemptible);
    stats.served.fetch_add(1, Relaxed);
    request.to_vec()
}

/// Spins for the service time `request` asks for (none for a malformed or
/// too long one, counted).
fn work(request: &[u8], stats: &SpinStats) {
    work_with(request, stats, spin_for)
}

/// `work` with the spin loop given: a plain one, or one that passes
/// preemption points.
fn work_with(request: &[u8], stats: &SpinStats, spin: fn(Duration)) {
    match RequestHeader::decode(request) {
        None => {
            stats.malformed.fetch_add(1, Relaxed);
        }
        Some(h) if h.service_ns > MAX_SERVICE.as_nanos() as u64 => {
            stats.too_long.fetch_add(1, Relaxed);
        }
        Some(h) => {
            spin(Duration::from_nanos(h.service_ns));
            stats.busy_ns.fetch_add(h.service_ns, Relaxed);
        }
    }
}

fn answer(
    socket: &UdpSocket,
    mut request: Vec<u8>,
    from: SocketAddrV4,
    stats: &SpinStats,
    stamps: Option<RequestStamps>,
    timer: RequestTimer,
) {
    let started_ns = stamps.map(|_| ginza_sys::clock::monotonic_ns());
    work(&request, stats);
    if let (Some(mut s), Some(started_ns)) = (stamps, started_ns) {
        s.started_ns = started_ns;
        s.reply_ns = ginza_sys::clock::monotonic_ns();
        if let Some(mut h) = RequestHeader::decode(&request) {
            s.service_ns = h.service_ns;
            h.send_ns = s.reply_ns;
            h.encode(&mut request);
        }
        stats.trace.record(&s);
    }
    match socket.send_to(&request, from) {
        Ok(_) => {
            timer.finish();
            stats.served.fetch_add(1, Relaxed);
        }
        Err(_) => {
            stats.send_errors.fetch_add(1, Relaxed);
        }
    }
}

/// spin-server's Linux peer (docs/experiments.md, the `linux` system of
/// `shenango-fig4-spin`): the same requests on a kernel UDP socket, served
/// by the calling OS thread one at a time until `stop` is set (checked at
/// least every 10 ms). Several threads may serve clones of one socket; the
/// caller pins them.
pub fn serve_linux(
    socket: &std::net::UdpSocket,
    stop: &AtomicBool,
    stats: &SpinStats,
) -> io::Result<()> {
    socket.set_read_timeout(Some(STOP_POLL))?;
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            // A signal to this thread (EINTR) is no reason to stop serving.
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        work(&buf[..n], stats);
        match socket.send_to(&buf[..n], from) {
            Ok(_) => stats.served.fetch_add(1, Relaxed),
            Err(_) => stats.send_errors.fetch_add(1, Relaxed),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ginza_proto::REQUEST_HEADER_LEN;

    #[test]
    fn the_linux_peer_spins_and_echoes() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SpinStats::default());
        let (s2, st2) = (stop.clone(), stats.clone());
        let t = std::thread::spawn(move || serve_linux(&server, &s2, &st2));
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut req = vec![0u8; REQUEST_HEADER_LEN];
        RequestHeader {
            seq: 7,
            send_ns: 1,
            service_ns: 20_000,
        }
        .encode(&mut req);
        client.send_to(&req, addr).unwrap();
        let mut buf = [0u8; 128];
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &req[..], "echoed");
        // A datagram without a header is answered at once and counted.
        client.send_to(&[1, 2], addr).unwrap();
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[1, 2]);
        stop.store(true, Relaxed);
        t.join().unwrap().unwrap();
        assert_eq!(stats.served.load(Relaxed), 2);
        assert_eq!(stats.busy_ns.load(Relaxed), 20_000);
        assert_eq!(stats.malformed.load(Relaxed), 1);
    }
}
