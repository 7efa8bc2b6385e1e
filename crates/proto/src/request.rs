//! The header a request of the synthetic workload carries: the traffic
//! generator writes it, spin-server and the tests' echo servers read it.

/// Bytes of [`RequestHeader`] at the start of a request's UDP payload.
pub const REQUEST_HEADER_LEN: usize = 24;

/// What a request carries, in network byte order at the start of its UDP
/// payload. A server answers by echoing the payload; `service_ns` tells it
/// how long to work on the request first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub seq: u64,
    /// CLOCK_MONOTONIC ns of the injection.
    pub send_ns: u64,
    pub service_ns: u64,
}

impl RequestHeader {
    /// Writes the header into the first [`REQUEST_HEADER_LEN`] bytes of
    /// `payload` (panics if shorter).
    pub fn encode(&self, payload: &mut [u8]) {
        payload[0..8].copy_from_slice(&self.seq.to_be_bytes());
        payload[8..16].copy_from_slice(&self.send_ns.to_be_bytes());
        payload[16..24].copy_from_slice(&self.service_ns.to_be_bytes());
    }

    /// `None` if `payload` is too short to hold a header.
    pub fn decode(payload: &[u8]) -> Option<RequestHeader> {
        let field = |at: usize| {
            Some(u64::from_be_bytes(
                payload.get(at..at + 8)?.try_into().ok()?,
            ))
        };
        Some(RequestHeader {
            seq: field(0)?,
            send_ns: field(8)?,
            service_ns: field(16)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_short_payload_is_refused() {
        let header = RequestHeader {
            seq: 7,
            send_ns: u64::MAX - 1,
            service_ns: 5_000,
        };
        let mut payload = [0u8; REQUEST_HEADER_LEN];
        header.encode(&mut payload);
        assert_eq!(RequestHeader::decode(&payload), Some(header));
        assert_eq!(RequestHeader::decode(&payload[..23]), None);
    }
}
