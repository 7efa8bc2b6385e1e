//! A connection's segments out: whole frames, or, zero-touch, headers and
//! a gather list naming the payload in the application's tx pool (which
//! iokerneld copies); segments are cut where one gather list ends.

use std::collections::VecDeque;

use ginza_net::tcp::Seq;
use ginza_net::{tx, Interface, MAX_FRAME_LEN};
use ginza_proto::netstack::Range;
use ginza_shm::netstack::{GatherList, MAX_GATHER};
use log::warn;

use super::{Conn, Netstack, OutFrame, PendingSend};

impl Netstack {
    /// Sends the connection's segments.
    pub(super) fn transmit(
        &mut self,
        iface: &Interface,
        conn: &mut Conn,
        now: ginza_net::tcp::Instant,
        zero_touch: Option<u64>,
    ) {
        let mac = conn
            .peer_mac
            .or_else(|| self.arp.get(&conn.key.remote.ip).copied());
        let (iss, _) = conn.tcb.initial_sequence_numbers();
        let (sends, written) = (&conn.sends, conn.written);
        // Zero-touch: a segment ends where one gather list's pieces end.
        let limit = |seq: Seq| match zero_touch {
            Some(_) => gather_reach(sends, stream_pos(written, iss, seq)) as usize,
            None => usize::MAX,
        };
        while let Some(seg) = conn.tcb.poll_transmit_within(now, limit) {
            let Some(mac) = mac else {
                self.stats.no_route += 1;
                let ip = conn.key.remote.ip;
                self.build(|b| tx::arp_request(b, iface, ip));
                continue;
            };
            if seg.flags.rst {
                self.stats.resets_sent += 1;
            }
            let (port, remote) = (conn.key.local.port, conn.key.remote);
            let mut buf = vec![0u8; MAX_FRAME_LEN];
            let n = match tx::tcp_segment(&mut buf, iface, mac, port, remote, &seg) {
                Ok(n) => n,
                Err(e) => {
                    warn!("cannot build a TCP segment: {e}");
                    continue;
                }
            };
            buf.truncate(n);
            self.stats.frames_out += 1;
            let payload = seg.payload.len();
            let frame = match zero_touch {
                // The payload the TCB holds is zeros (see `pump_send`):
                // the real bytes are named in the tx pool, for iokerneld.
                Some(link) if payload > 0 => {
                    let pos = stream_pos(written, iss, seg.seq);
                    let Some(g) = gather_of(sends, link, pos, payload as u64) else {
                        // `limit` keeps every segment within one list.
                        warn!(
                            "{}: {payload} payload bytes at stream position {pos} \
                             not named by one gather list: frame dropped",
                            conn.key.remote
                        );
                        self.stats.tx_frames_unnamed += 1;
                        continue;
                    };
                    buf.truncate(n - payload);
                    self.stats.tx_bytes_zero_touch += payload as u64;
                    OutFrame {
                        bytes: buf,
                        gather: Some(g),
                        fill_checksum: true,
                    }
                }
                _ => OutFrame::whole(buf),
            };
            self.frames.push_back(frame);
        }
    }
}

/// The pieces of the tx pool holding stream bytes `[pos, pos + len)`.
fn pieces(sends: &VecDeque<PendingSend>, pos: u64, len: u64) -> impl Iterator<Item = Range> + '_ {
    let end = pos + len;
    sends.iter().filter_map(move |s| {
        let start = s.end - u64::from(s.range.len);
        let (from, to) = (start.max(pos), s.end.min(end));
        (from < to).then(|| Range::new(s.range.offset + (from - start) as u32, (to - from) as u32))
    })
}

/// A gather list for stream bytes `[pos, pos + len)`, if they are all
/// still held and fit one list.
fn gather_of(sends: &VecDeque<PendingSend>, link: u64, pos: u64, len: u64) -> Option<GatherList> {
    let mut g = GatherList {
        link,
        ..Default::default()
    };
    for r in pieces(sends, pos, len) {
        if !g.push(r) {
            return None;
        }
    }
    (g.len() as u64 == len).then_some(g)
}

/// Stream bytes from `pos` on that one gather list can name: those of the
/// first `MAX_GATHER` send ranges still held from there.
fn gather_reach(sends: &VecDeque<PendingSend>, pos: u64) -> u64 {
    pieces(sends, pos, u64::MAX - pos)
        .take(MAX_GATHER)
        .map(|r| u64::from(r.len))
        .sum()
}

/// The stream position (bytes since the first `send`) of sequence number
/// `seq`, the nearest to `written` (positions are 64-bit, sequence numbers
/// wrap at 32).
fn stream_pos(written: u64, iss: Seq, seq: Seq) -> u64 {
    let pos32 = seq.0.wrapping_sub(iss.0.wrapping_add(1));
    written.wrapping_sub(u64::from((written as u32).wrapping_sub(pos32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(ranges: &[(u32, u32)]) -> VecDeque<PendingSend> {
        let mut end = 0;
        ranges
            .iter()
            .map(|&(o, l)| {
                end += u64::from(l);
                PendingSend {
                    range: Range::new(o, l),
                    end,
                }
            })
            .collect()
    }

    #[test]
    fn stream_positions_follow_sequence_numbers_across_the_wrap() {
        let iss = Seq(u32::MAX - 10);
        let at = |pos: u32| Seq(iss.0.wrapping_add(1).wrapping_add(pos));
        assert_eq!(stream_pos(0, iss, at(0)), 0);
        assert_eq!(stream_pos(100, iss, at(50)), 50, "sequence numbers wrapped");
        let written = (1u64 << 32) + 100;
        assert_eq!(stream_pos(written, iss, at(90)), (1 << 32) + 90);
        assert_eq!(stream_pos(written, iss, at(100)), written);
        assert_eq!(
            gather_reach(&sends(&[(0, 4); 10]), 2),
            2 + 4 * 7,
            "eight pieces"
        );
    }

    #[test]
    fn stream_bytes_map_to_tx_pool_pieces() {
        let s = sends(&[(1000, 10), (5000, 5)]);
        let g = gather_of(&s, 9, 8, 5).unwrap();
        assert_eq!(g.link, 9);
        assert_eq!(g.pieces(), &[Range::new(1008, 2), Range::new(5000, 3)]);
        // Bytes no longer held (acked and returned) give no list.
        assert_eq!(gather_of(&s, 9, 12, 10), None);
        // More pieces than a list holds: none (the netstack copies).
        let tiny = sends(&[(0, 1); 9]);
        assert_eq!(gather_of(&tiny, 1, 0, 9), None);
        assert!(gather_of(&tiny, 1, 0, 8).is_some());
    }
}
