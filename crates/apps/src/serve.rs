//! The serving skeleton the networked applications share: a UDP receiver
//! on a uthread of its own beside a TCP acceptor, both ending when the
//! stop flag is set (checked at least every [`STOP_POLL`]).
//!
//! * [`udp_beside_tcp`]: runs the two halves an application asks for;
//!   whichever ends first sets the stop flag, so the other ends too.
//! * [`datagrams_until_stopped`]: hands each datagram a UDP socket
//!   receives to the application, until the stop flag is set.
//! * [`accept_until_stopped`]: binds a TCP port and gives each connection
//!   a uthread of its own running the application's per-connection
//!   function, until the stop flag is set.

use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ginza_runtime::net::{TcpListener, TcpStream, UdpSocket, MAX_UDP_PAYLOAD};

/// How often a receiver waiting for data checks the stop flag.
pub const STOP_POLL: Duration = Duration::from_millis(10);

/// The protocols to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocols {
    pub udp: bool,
    pub tcp: bool,
}

impl Protocols {
    pub const BOTH: Protocols = Protocols {
        udp: true,
        tcp: true,
    };
}

/// True for the errors a read with a timeout returns when nothing came.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Runs `udp` (when given) on a uthread of its own and `tcp` (when given)
/// on this one, until both have returned; the first to return sets
/// `stop`. Gives TCP's error, else UDP's. `app` names the application in
/// errors. Must run on a uthread of a runtime.
pub fn udp_beside_tcp<U, T>(
    app: &str,
    udp: Option<U>,
    tcp: Option<T>,
    stop: &Arc<AtomicBool>,
) -> io::Result<()>
where
    U: FnOnce() -> io::Result<()> + Send + 'static,
    T: FnOnce() -> io::Result<()>,
{
    if udp.is_none() && tcp.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{app}: neither UDP nor TCP asked for"),
        ));
    }
    let udp = udp.map(|udp| {
        let stop = stop.clone();
        ginza_runtime::spawn(move || {
            let result = udp();
            stop.store(true, Relaxed);
            result
        })
    });
    let tcp = match tcp {
        Some(tcp) => {
            let result = tcp();
            stop.store(true, Relaxed);
            result
        }
        None => Ok(()),
    };
    let udp = match udp {
        Some(handle) => handle
            .join()
            .map_err(|e| io::Error::other(format!("{app}: the UDP uthread: {e}")))?,
        None => Ok(()),
    };
    tcp.and(udp)
}

/// Receives on `socket` until `stop` is set (checked at least every
/// [`STOP_POLL`]: it sets the socket's read timeout), handing each datagram
/// and its sender to `handle`. Returns with the first receive error other
/// than a timeout.
pub fn datagrams_until_stopped(
    socket: &UdpSocket,
    stop: &AtomicBool,
    mut handle: impl FnMut(&[u8], SocketAddrV4),
) -> io::Result<()> {
    socket.set_read_timeout(Some(STOP_POLL))?;
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD];
    while !stop.load(Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => return Err(e),
        };
        handle(&buf[..n], from);
    }
    Ok(())
}

/// Binds TCP `port` and, until `stop` is set, gives each accepted
/// connection a uthread running `serve_one` on it (the stream is closed
/// when `serve_one` returns and drops it). Returns when `stop` is set, or
/// with the acceptor's error. `accept` cannot be interrupted: the acceptor
/// uthread stays blocked when this returns, and goes with the runtime.
pub fn accept_until_stopped<F>(port: u16, stop: &AtomicBool, serve_one: F) -> io::Result<()>
where
    F: Fn(TcpStream) + Send + Sync + 'static,
{
    // Bound here, so that a port in use is this call's error.
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    let serve_one = Arc::new(serve_one);
    let acceptor = ginza_runtime::spawn(move || -> io::Result<()> {
        loop {
            let (stream, _peer) = listener.accept()?;
            let serve_one = Arc::clone(&serve_one);
            ginza_runtime::spawn(move || serve_one(stream));
        }
    });
    while !stop.load(Relaxed) {
        if acceptor.is_finished() {
            let result = acceptor
                .join()
                .map_err(|e| io::Error::other(format!("the TCP acceptor uthread: {e}")))?;
            return result.map_err(|e| {
                io::Error::new(e.kind(), format!("accepting on TCP port {port}: {e}"))
            });
        }
        ginza_runtime::sleep(STOP_POLL);
    }
    Ok(())
}
