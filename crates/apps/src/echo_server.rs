//! `echo-server`: the Echo protocol (RFC 862) on one port, over UDP and TCP.
//!
//! * UDP: every datagram is sent back to its sender as it came, by one
//!   receiver uthread (an echo costs less than spawning a uthread for it).
//! * TCP: one uthread per connection reads and writes back until the peer
//!   closes its side, then closes ours; any number of connections at once.
//!
//! Both stop when the stop flag is set (checked at least every
//! [`STOP_POLL`]). Counters in [`EchoStats`].

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use ginza_runtime::net::UdpSocket;

use crate::serve::is_timeout;
pub use crate::serve::{Protocols, STOP_POLL};

/// Counts of one server run.
#[derive(Debug, Default)]
pub struct EchoStats {
    /// Datagrams echoed.
    pub udp_echoed: AtomicU64,
    /// Datagrams whose echo could not be sent.
    pub udp_send_errors: AtomicU64,
    /// TCP connections accepted.
    pub tcp_accepted: AtomicU64,
    /// TCP connections being served now.
    pub tcp_open: AtomicU64,
    /// Bytes echoed over TCP.
    pub tcp_bytes: AtomicU64,
    /// TCP connections that ended with an error (reset, timed out) rather
    /// than the peer's close.
    pub tcp_errors: AtomicU64,
}

/// Serves `port` over `protocols` until `stop` is set. Must run on a
/// uthread of a runtime with networking. The first error of either
/// protocol ends both.
pub fn serve(
    port: u16,
    protocols: Protocols,
    stop: Arc<AtomicBool>,
    stats: Arc<EchoStats>,
) -> io::Result<()> {
    // Bound here, so that a port in use is this call's error.
    let udp_socket = if protocols.udp {
        Some(UdpSocket::bind(port)?)
    } else {
        None
    };
    let (udp_stop, udp_stats) = (stop.clone(), stats.clone());
    crate::serve::udp_beside_tcp(
        "echo-server",
        udp_socket.map(|socket| move || echo_udp(&socket, &udp_stop, &udp_stats)),
        protocols.tcp.then_some(|| tcp::serve(port, &stop, &stats)),
        &stop,
    )
}

/// Serves UDP `port` until `stop` is set.
pub fn serve_udp(port: u16, stop: Arc<AtomicBool>, stats: Arc<EchoStats>) -> io::Result<()> {
    let socket = UdpSocket::bind(port)?;
    echo_udp(&socket, &stop, &stats)
}

fn echo_udp(socket: &UdpSocket, stop: &AtomicBool, stats: &EchoStats) -> io::Result<()> {
    crate::serve::datagrams_until_stopped(socket, stop, |datagram, from| {
        match socket.send_to(datagram, from) {
            Ok(_) => stats.udp_echoed.fetch_add(1, Relaxed),
            Err(_) => stats.udp_send_errors.fetch_add(1, Relaxed),
        };
    })
}

/// A TCP sink on `port` until `stop`: reads each connection to its end,
/// then answers with a receipt (count and content hash,
/// [`ginza_proto::content::receipt`]) and closes. Not part of RFC 862: the
/// receiving end of one-way transfers in tests and `ginza bench tcp`.
pub fn serve_sink(port: u16, stop: Arc<AtomicBool>, stats: Arc<EchoStats>) -> io::Result<()> {
    tcp::sink(port, &stop, &stats)
}

/// Serves TCP echo on `port` until `stop` is set.
pub fn serve_tcp(port: u16, stop: Arc<AtomicBool>, stats: Arc<EchoStats>) -> io::Result<()> {
    tcp::serve(port, &stop, &stats)
}

mod tcp {
    use super::*;
    use std::io::{Read, Write};
    use std::net::Shutdown;

    use ginza_proto::content::{receipt, ContentHash};
    use ginza_runtime::net::TcpStream;

    /// What a connection's uthread does with it.
    type Handler = fn(TcpStream, &AtomicBool, &EchoStats) -> io::Result<()>;

    /// Echo (RFC 862) on `port` until `stop`.
    pub(super) fn serve(
        port: u16,
        stop: &Arc<AtomicBool>,
        stats: &Arc<EchoStats>,
    ) -> io::Result<()> {
        listen(port, stop, stats, echo_one)
    }

    /// The sink on `port` until `stop`.
    pub(super) fn sink(
        port: u16,
        stop: &Arc<AtomicBool>,
        stats: &Arc<EchoStats>,
    ) -> io::Result<()> {
        listen(port, stop, stats, sink_one)
    }

    /// Serves `port` until `stop`, each connection on its own uthread
    /// running `handler` ([`crate::serve::accept_until_stopped`]).
    fn listen(
        port: u16,
        stop: &Arc<AtomicBool>,
        stats: &Arc<EchoStats>,
        handler: Handler,
    ) -> io::Result<()> {
        let (conn_stop, stats) = (stop.clone(), stats.clone());
        crate::serve::accept_until_stopped(port, stop, move |stream| {
            stats.tcp_accepted.fetch_add(1, Relaxed);
            stats.tcp_open.fetch_add(1, Relaxed);
            if handler(stream, &conn_stop, &stats).is_err() {
                stats.tcp_errors.fetch_add(1, Relaxed);
            }
            stats.tcp_open.fetch_sub(1, Relaxed);
        })
    }

    /// Reads until the peer's FIN, writing everything back; then closes.
    fn echo_one(stream: TcpStream, stop: &AtomicBool, stats: &EchoStats) -> io::Result<()> {
        stream.set_read_timeout(Some(STOP_POLL))?;
        let mut buf = vec![0u8; 64 * 1024];
        while !stop.load(Relaxed) {
            match (&stream).read(&mut buf) {
                Ok(0) => return stream.shutdown(Shutdown::Write),
                Ok(n) => {
                    // Hop stamps, when `ginza bench tcp` turned them on.
                    ginza_sys::hops::stamp(ginza_sys::hops::Hop::AppRead);
                    ginza_sys::hops::stamp(ginza_sys::hops::Hop::ServerWrite);
                    (&stream).write_all(&buf[..n])?;
                    stats.tcp_bytes.fetch_add(n as u64, Relaxed);
                }
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads until the peer's FIN, hashing; then sends the receipt and
    /// closes.
    fn sink_one(stream: TcpStream, stop: &AtomicBool, stats: &EchoStats) -> io::Result<()> {
        stream.set_read_timeout(Some(STOP_POLL))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut hash = ContentHash::new();
        while !stop.load(Relaxed) {
            match (&stream).read(&mut buf) {
                Ok(0) => {
                    (&stream).write_all(&receipt(&hash))?;
                    return stream.shutdown(Shutdown::Write);
                }
                Ok(n) => {
                    hash.update(&buf[..n]);
                    stats.tcp_bytes.fetch_add(n as u64, Relaxed);
                }
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
