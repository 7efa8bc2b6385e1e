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
use ginza_runtime::net::{UdpSocket, MAX_UDP_PAYLOAD};

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
    socket.set_read_timeout(Some(STOP_POLL))?;
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD];
    while !stop.load(Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        let request = buf[..n].to_vec();
        let (socket, stats) = (socket.clone(), stats.clone());
        ginza_runtime::spawn(move || answer(&socket, &request, from, &stats));
    }
    Ok(())
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
    match RequestHeader::decode(request) {
        None => {
            stats.malformed.fetch_add(1, Relaxed);
        }
        Some(h) if h.service_ns > MAX_SERVICE.as_nanos() as u64 => {
            stats.too_long.fetch_add(1, Relaxed);
        }
        Some(h) => {
            spin_preemptible(Duration::from_nanos(h.service_ns));
            stats.busy_ns.fetch_add(h.service_ns, Relaxed);
        }
    }
    stats.served.fetch_add(1, Relaxed);
    request.to_vec()
}

fn answer(socket: &UdpSocket, request: &[u8], from: SocketAddrV4, stats: &SpinStats) {
    match RequestHeader::decode(request) {
        None => {
            stats.malformed.fetch_add(1, Relaxed);
        }
        Some(h) if h.service_ns > MAX_SERVICE.as_nanos() as u64 => {
            stats.too_long.fetch_add(1, Relaxed);
        }
        Some(h) => {
            spin_for(Duration::from_nanos(h.service_ns));
            stats.busy_ns.fetch_add(h.service_ns, Relaxed);
        }
    }
    match socket.send_to(request, from) {
        Ok(_) => {
            stats.served.fetch_add(1, Relaxed);
        }
        Err(_) => {
            stats.send_errors.fetch_add(1, Relaxed);
        }
    }
}
