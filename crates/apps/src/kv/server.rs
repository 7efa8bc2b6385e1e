//! The serving loops of `kv-server` on `ginza_runtime::net`:
//!
//! * TCP: an acceptor uthread gives each connection its own uthread, which
//!   reads into a buffer and runs every whole request in it; the first
//!   byte picks the protocol (0x80: binary, else text), as memcached
//!   negotiates. A request not yet whole leaves the uthread blocked in
//!   `read`, so a client sending byte by byte holds no kthread.
//! * UDP: one receiver uthread; each datagram is one request behind
//!   memcached's frame header ([`super::udp`]), answered in as many
//!   datagrams as the reply needs.
//!
//! Both stop when the stop flag is set (checked at least every
//! [`STOP_POLL`]).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ginza_runtime::metrics::RequestTimer;
use ginza_runtime::net::{TcpStream, UdpSocket};

use super::binary::BinarySession;
use super::text::{Flow, TextSession};
use super::{udp, Kv};
use crate::serve::{is_timeout, Protocols};

/// How often a uthread waiting for data checks the stop flag.
pub const STOP_POLL: Duration = Duration::from_millis(10);
/// Bytes asked of one `read`.
const READ_CHUNK: usize = 2 * 1024;

/// One connection's protocol, picked by its first byte.
#[derive(Debug)]
pub enum Session {
    Text(TextSession),
    Binary(BinarySession),
}

impl Session {
    /// The protocol a connection whose first byte is `first` speaks.
    pub fn for_first_byte(first: u8) -> Session {
        if first == super::binary::REQUEST_MAGIC {
            Session::Binary(BinarySession::new())
        } else {
            Session::Text(TextSession::new())
        }
    }

    /// As [`TextSession::process`].
    pub fn process(&mut self, input: &[u8], kv: &Kv, out: &mut Vec<u8>) -> (usize, usize, Flow) {
        match self {
            Session::Text(s) => s.process(input, kv, out),
            Session::Binary(s) => s.process(input, kv, out),
        }
    }
}

/// Serves `port` over `protocols` until `stop` is set. Must run on a
/// uthread of a runtime with networking. The first error of either
/// protocol ends both.
pub fn serve(port: u16, protocols: Protocols, kv: Kv, stop: Arc<AtomicBool>) -> io::Result<()> {
    // Bound here, so that a port in use is this call's error.
    let udp_socket = if protocols.udp {
        Some(UdpSocket::bind(port)?)
    } else {
        None
    };
    let (udp_kv, udp_stop) = (kv.clone(), stop.clone());
    crate::serve::udp_beside_tcp(
        "kv-server",
        udp_socket.map(|socket| move || serve_udp_socket(&socket, &udp_kv, &udp_stop)),
        protocols.tcp.then_some(|| serve_tcp(port, kv, &stop)),
        &stop,
    )
}

/// Serves TCP `port` until `stop` (see [`crate::serve::accept_until_stopped`]).
pub fn serve_tcp(port: u16, kv: Kv, stop: &Arc<AtomicBool>) -> io::Result<()> {
    let conn_stop = stop.clone();
    crate::serve::accept_until_stopped(port, stop, move |stream| {
        kv.stats.curr_connections.fetch_add(1, Relaxed);
        kv.stats.total_connections.fetch_add(1, Relaxed);
        if let Err(e) = serve_connection(&stream, &kv, &conn_stop) {
            log::debug!("kv-server: a connection ended: {e}");
        }
        kv.stats.curr_connections.fetch_sub(1, Relaxed);
    })
}

/// Serves one connection until the peer closes it, a request closes it,
/// or `stop`.
pub fn serve_connection(stream: &TcpStream, kv: &Kv, stop: &AtomicBool) -> io::Result<()> {
    stream.set_read_timeout(Some(STOP_POLL))?;
    let mut io = stream;
    // An idle connection holds no buffer: bytes are read into `chunk` on
    // the uthread's stack and kept in `buf` only while a request is not
    // whole (docs/design.md: 10,000 idle connections must stay cheap).
    let mut chunk = [0u8; READ_CHUNK];
    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut session: Option<Session> = None;
    // Bytes `buf` must hold before the session can make progress.
    let mut need: usize = 1;
    while !stop.load(Relaxed) {
        let start = buf.len();
        // A large value is read straight into its place.
        let direct = need > start + READ_CHUNK;
        if direct {
            buf.resize(need, 0);
        }
        let read = if direct {
            io.read(&mut buf[start..])
        } else {
            io.read(&mut chunk)
        };
        let n = match read {
            Ok(n) => n,
            Err(e) => {
                buf.truncate(start);
                if is_timeout(&e) {
                    continue;
                }
                return Err(e);
            }
        };
        if direct {
            buf.truncate(start + n);
        } else {
            buf.extend_from_slice(&chunk[..n]);
        }
        if n == 0 {
            return Ok(());
        }
        kv.stats.bytes_read.fetch_add(n as u64, Relaxed);
        // The requests this read completes arrived now.
        let timer = RequestTimer::start();
        if buf.len() < need {
            continue;
        }
        let session = session.get_or_insert_with(|| Session::for_first_byte(buf[0]));
        let (used, next_need, flow) = session.process(&buf, kv, &mut out);
        buf.drain(..used);
        need = next_need - used;
        if !out.is_empty() {
            io.write_all(&out)?;
            // One sample per write of replies: per request for a client
            // that waits for each reply, per batch for a pipelining one.
            timer.finish();
            kv.stats.bytes_written.fetch_add(out.len() as u64, Relaxed);
            out.clear();
        }
        if flow == Flow::Close {
            return stream.shutdown(Shutdown::Write);
        }
        if buf.is_empty() {
            buf = Vec::new();
        }
        if out.capacity() > 4 * READ_CHUNK {
            out = Vec::new();
        }
    }
    Ok(())
}

/// Serves UDP `port` until `stop`.
pub fn serve_udp(port: u16, kv: Kv, stop: Arc<AtomicBool>) -> io::Result<()> {
    let socket = UdpSocket::bind(port)?;
    serve_udp_socket(&socket, &kv, &stop)
}

/// The reply to one UDP datagram, framed; empty when nothing is to be
/// sent.
pub fn answer_datagram(datagram: &[u8], kv: &Kv) -> Vec<Vec<u8>> {
    let (frame, request) = match udp::parse(datagram) {
        Ok(r) => r,
        Err(udp::FrameError::Truncated) => return Vec::new(),
        Err(udp::FrameError::MultiPacket(id)) => {
            return udp::frames(id, b"SERVER_ERROR multi-packet request not supported\r\n")
                .unwrap_or_default();
        }
    };
    if request.is_empty() {
        return Vec::new();
    }
    let mut session = Session::for_first_byte(request[0]);
    let mut out = Vec::new();
    // One datagram, one request stream: run what is whole, ignore a tail.
    let _ = session.process(request, kv, &mut out);
    udp::frames(frame.request_id, &out).unwrap_or_else(|| {
        udp::frames(
            frame.request_id,
            b"SERVER_ERROR out of memory writing get response\r\n",
        )
        .unwrap_or_default()
    })
}

fn serve_udp_socket(socket: &UdpSocket, kv: &Kv, stop: &AtomicBool) -> io::Result<()> {
    crate::serve::datagrams_until_stopped(socket, stop, |request, from| {
        let timer = RequestTimer::start();
        kv.stats.udp_requests.fetch_add(1, Relaxed);
        let mut sent = false;
        for datagram in answer_datagram(request, kv) {
            if socket.send_to(&datagram, from).is_err() {
                kv.stats.udp_errors.fetch_add(1, Relaxed);
            } else {
                sent = true;
            }
        }
        if sent {
            timer.finish();
        }
    })
}
