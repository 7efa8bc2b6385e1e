//! [`Segment`](super::Segment) to and from the TCP header, through
//! `smoltcp::wire` (parsing, options, checksums).
