//! Echo (RFC 862): the answer is the request. Each request starts with its
//! sequence number (8 bytes, big endian), which identifies the answer of a
//! datagram and checks the answer on a stream.

use super::{Parsed, Pending, Transport};

/// Bytes at the start of a request that carry its sequence number.
pub const ID_LEN: usize = 8;

/// Echo requests of `size` bytes.
#[derive(Debug, Clone)]
pub struct Echo {
    pub size: usize,
}

impl Echo {
    pub fn check(&self, transport: Transport) -> Result<(), String> {
        check_size(self.size, ID_LEN, transport)
    }

    /// Appends request `seq`; its id is `seq`.
    pub fn encode(&self, seq: u64, out: &mut Vec<u8>) -> u64 {
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend((ID_LEN..self.size).map(|i| (i as u8) ^ (seq as u8)));
        seq
    }
}

/// Payload sizes: at least `min` (the id), at most a UDP datagram.
pub(crate) fn check_size(size: usize, min: usize, transport: Transport) -> Result<(), String> {
    if size < min {
        return Err(format!(
            "requests of {size} bytes cannot carry the {min}-byte id (--size at least {min})"
        ));
    }
    if transport == Transport::Udp && size > MAX_DATAGRAM {
        return Err(format!(
            "a {size}-byte request does not fit in one datagram (at most {MAX_DATAGRAM})"
        ));
    }
    Ok(())
}

/// The largest UDP payload the generator sends (no fragmentation on a
/// 1500-byte MTU).
pub const MAX_DATAGRAM: usize = 1472;

/// The sequence number a request or its echo starts with.
pub fn id_of(datagram: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(datagram.get(..ID_LEN)?.try_into().ok()?))
}

/// The echo of `pending`: as many bytes as it had, starting with its id.
pub fn parse(pending: &Pending, buf: &[u8]) -> Parsed {
    let len = pending.expect_len as usize;
    if buf.len() < len {
        return Parsed::Incomplete;
    }
    Parsed::Done {
        consumed: len,
        ok: id_of(buf) == Some(pending.id),
    }
}
