//! Payload between the pools and the connections: queued `send` ranges
//! into the TCB (copied, or zeros in their place when zero-touch) and
//! acknowledged ones back with `data_acked`; received bytes into rx chunks
//! lent to the application with `new_data`, and `remote_closed` after the
//! peer's FIN.

use ginza_net::tcp::State;
use ginza_proto::netstack::{ConnId, Event, Range, Ranges};
use ginza_shm::netstack::{RxPool, RX_CHUNK};

use super::{App, Conn, PendingSend};

/// Copies queued `send` ranges into the TCB while it has room, and returns
/// acknowledged ranges with `data_acked`. Returns the bytes copied.
pub(super) fn pump_send(
    app: &mut App,
    conn: &mut Conn,
    c: u32,
    events: &mut Vec<(u32, Event)>,
) -> u64 {
    let Some(id) = ConnId::new(c) else { return 0 };
    let mut copied = 0u64;
    let mut buf = [0u8; 4096];
    // The range holding stream position `written`.
    'fill: while conn.tcb.send_capacity() > 0 {
        let start_of = |s: &PendingSend| s.end - u64::from(s.range.len);
        let Some(s) = conn
            .sends
            .iter()
            .find(|s| start_of(s) <= conn.written && conn.written < s.end)
        else {
            break;
        };
        let skip = (conn.written - start_of(s)) as u32;
        let len = (s.range.len - skip).min(buf.len() as u32);
        let r = Range::new(s.range.offset + skip, len);
        let n = if app.zero_touch {
            // Zero-touch: the TCB holds zeros in the payload's place (it
            // needs lengths and sequence numbers, never the bytes); frames
            // name the tx pool instead (`Netstack::transmit`).
            buf[..len as usize].fill(0);
            len as usize
        } else {
            match app.tx.copy_out(r, &mut buf) {
                Ok(n) => n,
                Err(_) => break, // checked at `send`; the pool cannot shrink
            }
        };
        match conn.tcb.send(&buf[..n]) {
            Ok(k) => {
                conn.written += k as u64;
                if !app.zero_touch {
                    copied += k as u64;
                }
                if k < n {
                    break 'fill;
                }
            }
            Err(_) => break,
        }
    }
    if conn.sends.is_empty() || conn.written == conn.named {
        if conn.close_requested && conn.tcb.state() != State::Closed {
            conn.tcb.close();
        } else if conn.shutdown_requested {
            conn.tcb.shutdown();
        }
    }
    let acked = conn.acked();
    let pair = conn.pair;
    let sends = &mut conn.sends;
    let done = std::iter::from_fn(|| {
        if sends.front()?.end <= acked {
            sends.pop_front().map(|s| s.range)
        } else {
            None
        }
    });
    push_data_acked(pair, id, done, events);
    copied
}

/// `data_acked` events for `ranges`, in order, as many ranges to an event
/// as it holds.
pub(super) fn push_data_acked(
    pair: u32,
    conn: ConnId,
    ranges: impl Iterator<Item = Range>,
    events: &mut Vec<(u32, Event)>,
) {
    let mut rs = Ranges::default();
    for r in ranges {
        if !rs.push(r) {
            events.push((pair, Event::DataAcked { conn, ranges: rs }));
            rs = Ranges::default();
            rs.push(r);
        }
    }
    if !rs.is_empty() {
        events.push((pair, Event::DataAcked { conn, ranges: rs }));
    }
}

/// Moves received bytes from the TCB into rx chunks (while the
/// application holds less than a receive buffer and chunks are free) and
/// announces them with `new_data`; `remote_closed` after the FIN. Returns
/// the bytes delivered.
pub(super) fn pump_recv(
    app: &mut App,
    conn: &mut Conn,
    c: u32,
    events: &mut Vec<(u32, Event)>,
) -> u64 {
    let Some(id) = ConnId::new(c) else { return 0 };
    let limit = conn_recv_limit();
    let mut delivered = 0u64;
    let mut rs = Ranges::default();
    while conn.tcb.recv_available() > 0 && conn.rx_held < limit {
        let Some(chunk) = app.ledger.lend() else {
            break;
        };
        let Some(buf) = app.rx.chunk_mut(chunk) else {
            break;
        };
        let n = match conn.tcb.recv(buf) {
            Ok(n) if n > 0 => n as u32,
            _ => {
                let _ = app.ledger.give_back(chunk);
                break;
            }
        };
        app.lent[chunk as usize] = Some((c, n));
        conn.rx_held += u64::from(n);
        delivered += u64::from(n);
        let r = RxPool::chunk_range(chunk, n);
        if !rs.push(r) {
            events.push((
                conn.pair,
                Event::NewData {
                    conn: id,
                    ranges: rs,
                },
            ));
            rs = Ranges::default();
            rs.push(r);
        }
    }
    if !rs.is_empty() {
        events.push((
            conn.pair,
            Event::NewData {
                conn: id,
                ranges: rs,
            },
        ));
    }
    if conn.tcb.recv_available() == 0
        && !conn.remote_closed_sent
        && matches!(conn.tcb.recv(&mut []), Ok(0))
        && matches!(
            conn.tcb.state(),
            State::CloseWait | State::LastAck | State::Closing | State::TimeWait
        )
    {
        conn.remote_closed_sent = true;
        events.push((conn.pair, Event::RemoteClosed { conn: id }));
    }
    delivered
}

/// Bytes of received data one connection may have lent out at once (then
/// the TCB's own buffer fills and its window closes: flow control).
fn conn_recv_limit() -> u64 {
    256 * 1024
}

const _: () = assert!(RX_CHUNK as usize <= 4096);

#[cfg(test)]
mod tests {
    use super::*;
    use ginza_proto::netstack::MAX_RANGES;

    #[test]
    fn data_acked_events_hold_as_many_ranges_as_fit_in_order() {
        let conn = ConnId::new(7).unwrap();
        let ranges: Vec<Range> = (0..=MAX_RANGES as u32)
            .map(|i| Range::new(i * 100, 10))
            .collect();
        let mut events = Vec::new();
        push_data_acked(3, conn, ranges.iter().copied(), &mut events);
        assert_eq!(events.len(), 2);
        let mut got = Vec::new();
        for (pair, e) in &events {
            assert_eq!(*pair, 3);
            let Event::DataAcked { conn: c, ranges } = e else {
                panic!("{e:?}");
            };
            assert_eq!(*c, conn);
            got.extend_from_slice(ranges.as_slice());
        }
        assert_eq!(got, ranges);
        events.clear();
        push_data_acked(3, conn, std::iter::empty(), &mut events);
        assert!(events.is_empty(), "nothing acknowledged, no event");
    }
}
