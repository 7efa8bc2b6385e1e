//! The send buffer: bytes the application queued that the peer has not
//! acknowledged yet, from SND.UNA's first data byte on (RFC 9293 §3.3.1).

use crate::tcp::Seq;
use std::collections::VecDeque;

#[derive(Debug)]
pub(super) struct SendBuffer {
    bytes: VecDeque<u8>,
    capacity: usize,
    /// The sequence number of `bytes[0]`.
    start: Seq,
}

impl SendBuffer {
    pub(super) fn new(capacity: usize, start: Seq) -> SendBuffer {
        SendBuffer {
            bytes: VecDeque::new(),
            capacity,
            start,
        }
    }

    /// The sequence number after the last queued byte.
    pub(super) fn end(&self) -> Seq {
        self.start + self.bytes.len()
    }

    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(super) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.bytes.len())
    }

    /// Queues as much of `data` as fits; returns how much did.
    pub(super) fn push(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.room());
        self.bytes.extend(&data[..n]);
        n
    }

    /// Forgets bytes before `ack` (a cumulative acknowledgement); returns
    /// how many were freed.
    pub(super) fn acknowledge(&mut self, ack: Seq) -> usize {
        if ack.le(self.start) {
            return 0;
        }
        let n = (ack.distance_from(self.start) as usize).min(self.bytes.len());
        self.bytes.drain(..n);
        self.start += n;
        n
    }

    /// Bytes queued from `seq` on (0 when `seq` is past the end).
    pub(super) fn available_from(&self, seq: Seq) -> usize {
        if seq.lt(self.start) || seq.ge(self.end()) {
            return 0;
        }
        self.end().distance_from(seq) as usize
    }

    /// `len` bytes starting at `seq`, as one slice (the deque is made
    /// contiguous when the range straddles its wrap).
    pub(super) fn slice(&mut self, seq: Seq, len: usize) -> &[u8] {
        let offset = seq.distance_from(self.start) as usize;
        let end = offset + len;
        debug_assert!(end <= self.bytes.len());
        if self.bytes.as_slices().0.len() < end {
            self.bytes.make_contiguous();
        }
        &self.bytes.as_slices().0[offset..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_acknowledge_and_slice() {
        let mut buffer = SendBuffer::new(10, Seq(u32::MAX - 2));
        assert_eq!(buffer.push(b"hello world"), 10);
        assert_eq!(buffer.room(), 0);
        assert_eq!(buffer.acknowledge(Seq(u32::MAX - 2) + 4usize), 4);
        assert_eq!(buffer.push(b"abcd"), 4);
        let start = buffer.start;
        assert_eq!(buffer.available_from(start + 2usize), 8);
        assert_eq!(buffer.slice(start + 2usize, 8), b"worlabcd");
        assert_eq!(buffer.acknowledge(start + 100usize), 10);
        assert_eq!(buffer.len(), 0);
    }
}
