//! Clients of echo servers and sinks on a Ginza runtime: a request/response
//! round-trip series on one persistent TCP connection, and bulk transfers
//! whose content both ends hash ([`ginza_proto::content`]). They serve the
//! TCP tests and `ginza bench tcp`; the Linux peers' counterparts are in
//! `ginza_iokernel::netns::tcp`. Must run on a uthread of a runtime with
//! networking.

use std::io;
use std::net::SocketAddrV4;
use std::time::Duration;

use ginza_proto::content::Transfer;

fn unavailable() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "TCP is not available in this runtime yet",
    )
}

/// Round trips (ns, in the order measured) of `payload_len`-byte requests
/// to the echo server at `target` on one connection: `warmup` unmeasured,
/// then for `duration`. An echo that differs or does not come within
/// `timeout` is an error.
pub fn rtt_for(
    _target: SocketAddrV4,
    _warmup: usize,
    _duration: Duration,
    _payload_len: usize,
    _timeout: Duration,
) -> io::Result<Vec<u64>> {
    Err(unavailable())
}

/// Sends `bytes` of the pattern of `seed` to the echo server at `target`
/// while another uthread reads the echo back and hashes it.
pub fn echo_transfer(
    _target: SocketAddrV4,
    _bytes: u64,
    _seed: u64,
    _timeout: Duration,
) -> io::Result<Transfer> {
    Err(unavailable())
}
