//! The one path every change to a connection takes: payload moved both
//! ways, segments out, the handshake handed to its listener (the backlog
//! step), phase changes and errors told to the application, and the
//! connection freed once nobody needs it.

use std::net::SocketAddrV4;

use ginza_net::tcp::{Backlog, State, TcpError};
use ginza_proto::netstack::{Command, ConnId, Event, ListenId, Reason};

use super::pumps::{pump_recv, pump_send, push_data_acked};
use super::{Conn, Netstack, Phase};
use crate::slab::Slab;

impl Netstack {
    /// After any change to connection `c`: payload moved both ways,
    /// segments out, phase changes and errors told to the application, and
    /// the connection freed once nobody needs it.
    pub(super) fn settle(&mut self, c: u32, now: ginza_net::tcp::Instant) {
        let Some(mut conn) = self.conns.remove_for_settle(c) else {
            return;
        };
        let app_id = conn.app;
        let mut events: Vec<(u32, Event)> = Vec::new();
        let mut keep = true;
        let iface = self.apps.get(&app_id).map(|a| a.interface);
        let zero_touch = self
            .apps
            .get(&app_id)
            .and_then(|a| a.zero_touch.then_some(a.id));
        if let Some(app) = self.apps.get_mut(&app_id) {
            if conn.phase == Phase::Open && !conn.released {
                self.stats.tx_bytes_copied += pump_send(app, &mut conn, c, &mut events);
                self.stats.rx_bytes_delivered += pump_recv(app, &mut conn, c, &mut events);
            }
        }
        if let Some(iface) = iface {
            self.transmit(&iface, &mut conn, now, zero_touch);
        }
        let _ = conn.tcb.take_events();
        let id = ConnId::new(c);
        let synchronized = !matches!(
            conn.tcb.state(),
            State::SynSent | State::SynReceived | State::Closed
        );
        match conn.phase {
            Phase::Connecting { cookie } => {
                if synchronized {
                    conn.phase = Phase::Open;
                    if let Some(id) = id {
                        events.push((
                            conn.pair,
                            Event::Connected {
                                cookie,
                                conn: id,
                                local_port: conn.key.local.port,
                            },
                        ));
                    }
                } else if conn.tcb.error().is_some() || conn.tcb.state() == State::Closed {
                    events.push((
                        conn.pair,
                        Event::Refused {
                            conn: None,
                            cookie,
                            command: Command::CONNECT_TAG,
                            reason: conn
                                .tcb
                                .error()
                                .map_or(Reason::ConnectionRefused, reason_of),
                        },
                    ));
                    keep = false;
                }
            }
            Phase::HalfOpen { listener } => {
                match self.listeners.get_mut(listener) {
                    None => {
                        conn.tcb.abort();
                        keep = false;
                    }
                    Some(l) => match l.backlog.step(conn.key.remote, &mut conn.tcb, false) {
                        Backlog::Waiting => {}
                        // Ended, or refused by a full backlog (a reset).
                        Backlog::Ended | Backlog::Refused => keep = false,
                        Backlog::Queued => {
                            conn.phase = Phase::Announced { listener };
                            conn.pair = l.pair;
                            if let (Some(id), Some(lid)) = (id, ListenId::new(listener)) {
                                events.push((
                                    l.pair,
                                    Event::NewConn {
                                        conn: id,
                                        listener: lid,
                                        remote: SocketAddrV4::new(
                                            conn.key.remote.ip,
                                            conn.key.remote.port,
                                        ),
                                    },
                                ));
                            }
                        }
                    },
                }
                if !keep {
                    if let Some(iface) = iface {
                        self.transmit(&iface, &mut conn, now, zero_touch);
                    }
                }
            }
            Phase::Announced { listener } => {
                // One that ended before `accept` leaves the backlog.
                if let Some(l) = self.listeners.get_mut(listener) {
                    let _ = l.backlog.step(conn.key.remote, &mut conn.tcb, true);
                }
            }
            Phase::Open => {}
        }
        if keep && matches!(conn.phase, Phase::Announced { .. } | Phase::Open) && !conn.released {
            if let (Some(e), false) = (conn.tcb.error(), conn.error_sent) {
                conn.error_sent = true;
                events.push((
                    conn.pair,
                    Event::Refused {
                        conn: id,
                        cookie: 0,
                        command: 0,
                        reason: reason_of(e),
                    },
                ));
            }
            // Cleanup: the application closed it (or it died) and the TCB
            // needs nobody any more.
            let done = conn.tcb.is_finished() || conn.tcb.state() == State::TimeWait;
            let dead = conn.tcb.error().is_some() || conn.tcb.state() == State::Closed;
            if (conn.close_requested && done) || dead {
                self.release(app_id, &mut conn, c, &mut events);
            }
        }
        if conn.released && conn.tcb.is_finished() {
            keep = false;
        }
        if keep {
            if let Some(d) = conn.tcb.next_deadline() {
                self.earliest = self.earliest.min(d.as_nanos());
            }
            if conn.phase == Phase::Open
                && !conn.released
                && conn.tcb.recv_available() > 0
                && !self.starved.contains(&c)
            {
                self.starved.push(c);
            }
            self.conns.put_back(c, conn);
        } else {
            self.table.remove(&conn.key);
            if let Some(a) = self.apps.get_mut(&app_id) {
                a.conns.retain(|x| *x != c);
            }
            self.conns.free(c);
        }
        for (pair, ev) in events {
            self.emit(app_id, pair, ev);
        }
    }

    /// Gives everything of the connection back to the application (unacked
    /// tx ranges with `data_acked`, rx chunks taken back) and says `cleanup`.
    fn release(&mut self, app_id: u64, conn: &mut Conn, c: u32, events: &mut Vec<(u32, Event)>) {
        conn.released = true;
        let Some(id) = ConnId::new(c) else { return };
        let pair = conn.pair;
        push_data_acked(pair, id, conn.sends.drain(..).map(|s| s.range), events);
        if let Some(app) = self.apps.get_mut(&app_id) {
            for chunk in 0..app.lent.len() {
                if matches!(app.lent[chunk], Some((owner, _)) if owner == c) {
                    app.lent[chunk] = None;
                    let _ = app.ledger.give_back(chunk as u32);
                }
            }
        }
        conn.rx_held = 0;
        self.chunks_freed = true;
        events.push((conn.pair, Event::Cleanup { conn: id }));
    }
}

fn reason_of(e: TcpError) -> Reason {
    match e {
        TcpError::Refused => Reason::ConnectionRefused,
        TcpError::Reset => Reason::ConnectionReset,
        TcpError::TimedOut => Reason::TimedOut,
        _ => Reason::InvalidState,
    }
}

/// Slab operations for `settle`, which takes a connection out while it
/// works on it (so `self` stays borrowable) and puts it back.
trait SettleSlab {
    fn remove_for_settle(&mut self, c: u32) -> Option<Conn>;
    fn put_back(&mut self, c: u32, conn: Conn);
    fn free(&mut self, c: u32);
}

impl SettleSlab for Slab<Conn> {
    fn remove_for_settle(&mut self, c: u32) -> Option<Conn> {
        self.take(c)
    }
    fn put_back(&mut self, c: u32, conn: Conn) {
        self.restore(c, conn)
    }
    fn free(&mut self, c: u32) {
        self.release(c)
    }
}

#[cfg(test)]
mod tests {
    use ginza_net::tcp::{Connection, Instant, State};
    use ginza_proto::netstack::{Command, Event};

    use super::super::testing::{client, deliver, sent, App};
    use super::super::{Netstack, NetstackConfig, Phase};

    #[test]
    fn a_completed_handshake_is_announced_and_one_past_the_backlog_is_reset() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let mut app = App::attach(&mut ns, "settle-backlog");
        app.listen_on_80(&mut ns, 1);
        let mut clients = [client(40001, 80), client(40002, 80)];
        let mut resets = Vec::new();
        for c in &mut clients {
            deliver(&mut ns, c);
            for (_, s) in sent(&mut ns).0 {
                c.on_segment(&s, Instant(0));
            }
            assert_eq!(c.state(), State::Established);
            deliver(&mut ns, c);
            resets.extend(sent(&mut ns).0.into_iter().filter(|(_, s)| s.flags.rst));
        }
        assert_eq!(resets.len(), 1, "{resets:?}");
        assert_eq!(resets[0].0.port, 40002, "the second found the backlog full");
        assert_eq!(ns.conns.len(), 1, "the refused one is freed");
        let kept = ns.conns.get(ns.conns.handles()[0]).unwrap();
        assert!(matches!(kept.phase, Phase::Announced { .. }));
        ns.flush_events();
        let events = app.events();
        assert!(
            matches!(
                events.as_slice(),
                [Event::Listening { cookie: 1, .. }, Event::NewConn { remote, .. }]
                    if remote.port() == 40001
            ),
            "{events:?}"
        );
    }

    /// Handshakes with `clients` (in turn); the RSTs the netstack sent.
    fn handshakes(ns: &mut Netstack, clients: &mut [Connection]) -> Vec<u16> {
        let mut resets = Vec::new();
        for c in clients {
            deliver(ns, c);
            for (_, s) in sent(ns).0 {
                c.on_segment(&s, Instant(0));
            }
            deliver(ns, c);
            let out = sent(ns).0;
            resets.extend(
                out.iter()
                    .filter(|(_, s)| s.flags.rst)
                    .map(|(to, _)| to.port),
            );
        }
        resets
    }

    fn announced(events: &[Event]) -> Vec<u16> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::NewConn { remote, .. } => Some(remote.port()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_connection_that_ends_before_accept_leaves_the_backlog() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let mut app = App::attach(&mut ns, "settle-ends-unaccepted");
        app.listen_on_80(&mut ns, 1);
        let mut first = [client(40001, 80)];
        assert!(handshakes(&mut ns, &mut first).is_empty());
        // The peer resets it before the application accepts it.
        first[0].abort();
        deliver(&mut ns, &mut first[0]);
        let mut second = [client(40002, 80)];
        assert!(
            handshakes(&mut ns, &mut second).is_empty(),
            "the backlog has room again"
        );
        ns.flush_events();
        assert_eq!(announced(&app.events()), [40001, 40002]);
    }

    #[test]
    fn a_connection_closed_before_accept_leaves_the_backlog() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let mut app = App::attach(&mut ns, "settle-closed-unaccepted");
        app.listen_on_80(&mut ns, 1);
        assert!(handshakes(&mut ns, &mut [client(40001, 80)]).is_empty());
        ns.flush_events();
        let conn = app
            .events()
            .iter()
            .find_map(|e| match e {
                Event::NewConn { conn, .. } => Some(*conn),
                _ => None,
            })
            .unwrap();
        ns.on_command(app.id, 0, Command::Close { conn });
        assert_eq!(sent(&mut ns).0.len(), 1, "its RST");
        assert!(
            handshakes(&mut ns, &mut [client(40002, 80)]).is_empty(),
            "the backlog has room again"
        );
        ns.flush_events();
        assert_eq!(announced(&app.events()), [40002]);
    }
}
