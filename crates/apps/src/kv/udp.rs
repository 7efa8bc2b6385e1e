//! memcached's UDP frame header: every datagram starts with 8 bytes, four big-endian u16s: the request ID
//! (echoed back), the sequence number of this datagram in its message, the
//! message's datagram count, and 0. A request must fit one datagram; a
//! reply is cut into as many datagrams as it needs.

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 8;
/// Reply bytes per datagram after the header (memcached's
/// `UDP_MAX_PAYLOAD_SIZE` less the header).
pub const REPLY_CHUNK: usize = 1400 - HEADER_LEN;

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub request_id: u16,
    pub sequence: u16,
    pub total: u16,
}

/// Why a datagram is not a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Shorter than the header: dropped without a reply.
    Truncated,
    /// Not datagram 0 of a 1-datagram message (memcached replies with an
    /// error to the request ID).
    MultiPacket(u16),
}

/// The header and the request after it.
pub fn parse(datagram: &[u8]) -> Result<(Frame, &[u8]), FrameError> {
    if datagram.len() < HEADER_LEN {
        return Err(FrameError::Truncated);
    }
    let field = |i: usize| u16::from_be_bytes([datagram[i], datagram[i + 1]]);
    let frame = Frame {
        request_id: field(0),
        sequence: field(2),
        total: field(4),
    };
    if frame.sequence != 0 || frame.total != 1 {
        return Err(FrameError::MultiPacket(frame.request_id));
    }
    Ok((frame, &datagram[HEADER_LEN..]))
}

/// `reply` cut into datagrams for `request_id`, each with its header. An
/// empty reply (noreply) is no datagram at all. None if it needs more than
/// 65535 datagrams.
pub fn frames(request_id: u16, reply: &[u8]) -> Option<Vec<Vec<u8>>> {
    if reply.is_empty() {
        return Some(Vec::new());
    }
    let total = u16::try_from(reply.len().div_ceil(REPLY_CHUNK)).ok()?;
    Some(
        reply
            .chunks(REPLY_CHUNK)
            .enumerate()
            .map(|(i, chunk)| {
                let mut d = Vec::with_capacity(HEADER_LEN + chunk.len());
                d.extend_from_slice(&request_id.to_be_bytes());
                d.extend_from_slice(&(i as u16).to_be_bytes());
                d.extend_from_slice(&total.to_be_bytes());
                d.extend_from_slice(&[0, 0]);
                d.extend_from_slice(chunk);
                d
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let d = [0x12, 0x34, 0, 0, 0, 1, 0, 0, b'g', b'e', b't'];
        let (f, rest) = parse(&d).unwrap();
        assert_eq!(f.request_id, 0x1234);
        assert_eq!(rest, b"get");
        assert_eq!(parse(&d[..7]), Err(FrameError::Truncated));
        let multi = [0, 9, 0, 1, 0, 2, 0, 0];
        assert_eq!(parse(&multi), Err(FrameError::MultiPacket(9)));
    }

    #[test]
    fn long_replies_span_datagrams() {
        let reply = vec![7u8; REPLY_CHUNK * 2 + 5];
        let f = frames(3, &reply).unwrap();
        assert_eq!(f.len(), 3);
        for (i, d) in f.iter().enumerate() {
            assert_eq!(&d[..8], &[0, 3, 0, i as u8, 0, 3, 0, 0]);
        }
        assert_eq!(f[2].len(), HEADER_LEN + 5);
        let joined: Vec<u8> = f.iter().flat_map(|d| d[8..].to_vec()).collect();
        assert_eq!(joined, reply);
        assert!(frames(1, b"").unwrap().is_empty());
    }
}
