//! The receive side's buffers: bytes in order for the reader and a bounded
//! set of out-of-order pieces (RFC 9293 §3.10.7.4, seventh step: segments
//! beyond RCV.NXT are held, not dropped, so losses cost one retransmission
//! and segments processed out of order by different kthreads are
//! resequenced here).

use crate::tcp::Seq;
use std::collections::VecDeque;

#[derive(Debug)]
pub(super) struct ReceiveBuffer {
    /// In-order bytes not read yet.
    ready: VecDeque<u8>,
    /// Out-of-order pieces: sorted, non-overlapping, all after RCV.NXT.
    pieces: Vec<(Seq, Vec<u8>)>,
    held: usize,
    limit: usize,
    /// The sequence number of a FIN that arrived out of order.
    fin: Option<Seq>,
}

impl ReceiveBuffer {
    pub(super) fn new(limit: usize) -> ReceiveBuffer {
        ReceiveBuffer {
            ready: VecDeque::new(),
            pieces: Vec::new(),
            held: 0,
            limit,
            fin: None,
        }
    }

    pub(super) fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Out-of-order bytes held.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Copies the first bytes into `buf` without consuming them.
    pub(super) fn peek(&self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.ready.len());
        let (front, back) = self.ready.as_slices();
        let from_front = n.min(front.len());
        buf[..from_front].copy_from_slice(&front[..from_front]);
        buf[from_front..n].copy_from_slice(&back[..n - from_front]);
        n
    }

    pub(super) fn read(&mut self, buf: &mut [u8]) -> usize {
        let n = self.peek(buf);
        self.ready.drain(..n);
        n
    }

    /// Appends in-order bytes (their first is RCV.NXT).
    pub(super) fn push_in_order(&mut self, data: &[u8]) {
        self.ready.extend(data);
    }

    /// Holds bytes that start after RCV.NXT (`rcv_nxt`); the parts already
    /// held are not stored twice, and what exceeds the limit is dropped.
    /// Returns whether any new byte was kept.
    pub(super) fn insert_out_of_order(&mut self, rcv_nxt: Seq, start: Seq, data: &[u8]) -> bool {
        let offset = |seq: Seq| seq.distance_from(rcv_nxt) as usize;
        let base = offset(start);
        let (mut from, to) = (base, base + data.len());
        // The parts of [from, to) no held piece covers.
        let mut gaps = Vec::new();
        for (piece_start, piece) in &self.pieces {
            let (s, e) = (offset(*piece_start), offset(*piece_start) + piece.len());
            if e <= from {
                continue;
            }
            if s >= to {
                break;
            }
            if s > from {
                gaps.push((from, s));
            }
            from = from.max(e);
        }
        if from < to {
            gaps.push((from, to));
        }
        let mut kept = false;
        for (s, e) in gaps {
            let room = self.limit.saturating_sub(self.held);
            let e = e.min(s + room);
            if e <= s {
                break;
            }
            let bytes = data[s - base..e - base].to_vec();
            let at = self
                .pieces
                .partition_point(|(piece_start, _)| offset(*piece_start) < s);
            self.held += bytes.len();
            self.pieces.insert(at, (rcv_nxt + s, bytes));
            kept = true;
        }
        kept
    }

    /// The out-of-order bytes held, as merged `[start, end)` ranges in
    /// order (pieces are stored apart even when adjacent).
    pub(super) fn held_ranges(&self) -> Vec<(Seq, Seq)> {
        let mut ranges: Vec<(Seq, Seq)> = Vec::new();
        for (start, piece) in &self.pieces {
            let end = *start + piece.len();
            match ranges.last_mut() {
                Some((_, last_end)) if *last_end == *start => *last_end = end,
                _ => ranges.push((*start, end)),
            }
        }
        ranges
    }

    /// Notes a FIN seen out of order at `seq`.
    pub(super) fn set_fin(&mut self, seq: Seq) {
        self.fin = Some(seq);
    }

    /// Moves held pieces that now continue the in-order bytes; returns the
    /// new RCV.NXT and whether the FIN is now in order (it consumes one
    /// number, which the caller adds).
    pub(super) fn advance(&mut self, mut rcv_nxt: Seq) -> (Seq, bool) {
        while let Some((start, _)) = self.pieces.first() {
            if start.gt(rcv_nxt) {
                break;
            }
            let (start, piece) = self.pieces.remove(0);
            self.held -= piece.len();
            let skip = rcv_nxt.distance_from(start) as usize;
            if skip < piece.len() {
                self.ready.extend(&piece[skip..]);
                rcv_nxt += piece.len() - skip;
            }
        }
        let fin = self.fin == Some(rcv_nxt);
        if fin {
            self.fin = None;
        }
        (rcv_nxt, fin)
    }

    /// Drops everything (an abort: nobody will read it).
    pub(super) fn clear(&mut self) {
        self.ready.clear();
        self.pieces.clear();
        self.held = 0;
        self.fin = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resequences_and_bounds() {
        let mut rx = ReceiveBuffer::new(6);
        let nxt = Seq(u32::MAX - 1);
        assert!(rx.insert_out_of_order(nxt, nxt + 4usize, b"efg"));
        assert!(rx.insert_out_of_order(nxt, nxt + 2usize, b"cdefgh"));
        assert_eq!(rx.held(), 6, "efg stored once; cd and h fill the gaps");
        assert_eq!(rx.held_ranges(), vec![(nxt + 2usize, nxt + 8usize)]);
        assert!(
            !rx.insert_out_of_order(nxt, nxt + 9usize, b"j"),
            "over the limit"
        );
        rx.push_in_order(b"abc");
        let (nxt, fin) = rx.advance(nxt + 3usize);
        assert!(!fin);
        assert_eq!(nxt, Seq(u32::MAX - 1) + 8usize);
        let mut out = [0; 16];
        assert_eq!(rx.read(&mut out), 8);
        assert_eq!(&out[..8], b"abcdefgh");
        assert_eq!(rx.held(), 0);
        rx.set_fin(nxt + 1usize);
        rx.push_in_order(b"i");
        assert_eq!(rx.advance(nxt + 1usize), (nxt + 1usize, true));
    }
}
