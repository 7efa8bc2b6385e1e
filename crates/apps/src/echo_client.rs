//! Clients of echo servers and sinks on a Ginza runtime: a request/response
//! round-trip series on one persistent TCP connection, and bulk transfers
//! whose content both ends hash ([`ginza_proto::content`]). They serve the
//! TCP tests and `ginza bench tcp`; the Linux peers' counterparts are in
//! `ginza_iokernel::netns::tcp`. Must run on a uthread of a runtime with
//! networking.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddrV4};
use std::time::{Duration, Instant};

use ginza_proto::content::{parse_receipt, send_pattern, ContentHash, Transfer, RECEIPT_LEN};
use ginza_runtime::net::TcpStream;

fn connect(target: SocketAddrV4, timeout: Duration) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&target.into(), timeout)
        .map_err(|e| io::Error::new(e.kind(), format!("connecting to {target}: {e}")))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// Round trips (ns, in the order measured) of `payload_len`-byte requests
/// to the echo server at `target` on one connection: `warmup` unmeasured,
/// then for `duration`. An echo that differs or does not come within
/// `timeout` is an error.
pub fn rtt_for(
    target: SocketAddrV4,
    warmup: usize,
    duration: Duration,
    payload_len: usize,
    timeout: Duration,
) -> io::Result<Vec<u64>> {
    let stream = connect(target, timeout)?;
    stream.set_nodelay(true)?;
    let mut request = vec![0u8; payload_len.max(8)];
    let mut reply = vec![0u8; request.len()];
    let mut rtts = Vec::new();
    let mut measuring_since = None;
    for sequence in 0u64.. {
        if sequence == warmup as u64 {
            measuring_since = Some(Instant::now());
        }
        if measuring_since.is_some_and(|t| t.elapsed() >= duration) {
            break;
        }
        request[..8].copy_from_slice(&sequence.to_le_bytes());
        let start = Instant::now();
        // Hop stamps, when a benchmark turned them on (docs/protected.md).
        ginza_sys::hops::begin();
        (&stream).write_all(&request)?;
        (&stream).read_exact(&mut reply).map_err(|e| {
            io::Error::new(e.kind(), format!("round trip {sequence} to {target}: {e}"))
        })?;
        ginza_sys::hops::end();
        let rtt = start.elapsed();
        if reply != request {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("round trip {sequence} to {target}: the echo differs from the request"),
            ));
        }
        if measuring_since.is_some() {
            rtts.push(rtt.as_nanos() as u64);
        }
    }
    Ok(rtts)
}

/// Sends `bytes` of the pattern of `seed` to the echo server at `target`
/// while another uthread reads the echo back and hashes it; then shuts down
/// our side and reads to the end.
pub fn echo_transfer(
    target: SocketAddrV4,
    bytes: u64,
    seed: u64,
    timeout: Duration,
) -> io::Result<Transfer> {
    let start = Instant::now();
    let stream = connect(target, timeout)?;
    let reader = stream.try_clone()?;
    let receiving = ginza_runtime::spawn(move || -> io::Result<ContentHash> {
        let mut hash = ContentHash::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match (&reader).read(&mut buf)? {
                0 => return Ok(hash),
                n => hash.update(&buf[..n]),
            }
        }
    });
    let sent_hash = send_pattern(bytes, seed, |b| (&stream).write_all(b));
    let shut = stream.shutdown(Shutdown::Write);
    let received = receiving
        .join()
        .map_err(|e| io::Error::other(format!("the receiving uthread: {e}")))?;
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

/// Sends `bytes` of the pattern of `seed` to the sink at `target`, shuts
/// down our side and waits for the receipt.
pub fn sink_transfer(
    target: SocketAddrV4,
    bytes: u64,
    seed: u64,
    timeout: Duration,
) -> io::Result<Transfer> {
    let start = Instant::now();
    let stream = connect(target, timeout)?;
    let sent_hash = send_pattern(bytes, seed, |b| (&stream).write_all(b))?;
    stream.shutdown(Shutdown::Write)?;
    let mut r = [0u8; RECEIPT_LEN];
    (&stream).read_exact(&mut r).map_err(|e| {
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
