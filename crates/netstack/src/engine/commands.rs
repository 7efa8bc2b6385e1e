//! An application's commands, taken from its rings within a budget (and
//! not while its events cannot go out): listen, accept, connect, send,
//! recv_done, shutdown and close, each checked (ownership, ranges, state)
//! and refused with a reason, or an application cut off for garbage.

use std::net::SocketAddrV4;

use ginza_net::tcp::{Connection, FourTuple, ListenConfig, Listener};
use ginza_net::Endpoint;
use ginza_proto::netstack::{Command, ConnId, Event, ListenId, Ranges, Reason, MAX_RANGES};
use ginza_shm::netstack::RxPool;
use ginza_shm::RingCorrupt;
use log::{debug, warn};

use super::{Conn, ListenerEntry, Netstack, PendingSend, Phase};

impl Netstack {
    pub(super) fn take_commands(&mut self, id: u64, p: u32) {
        for _ in 0..self.cfg.command_budget {
            let Some(app) = self.apps.get_mut(&id) else {
                return;
            };
            if app.doomed.is_some() {
                return;
            }
            // Back-pressure: while this pair's events cannot all go out,
            // its commands (which make more events) wait.
            if !app.waiting[p as usize].is_empty() && !self.flush_pair(id, p as usize) {
                return;
            }
            let Some(app) = self.apps.get_mut(&id) else {
                return;
            };
            let slot = match app.pairs[p as usize].commands.pop() {
                Ok(Some(s)) => s,
                Ok(None) => return,
                Err(RingCorrupt { head, tail, .. }) => {
                    return self.cut_off(
                        id,
                        p,
                        Reason::RingCorrupt,
                        format!("command ring {p} corrupt (head {head}, tail {tail})"),
                    );
                }
            };
            self.stats.commands += 1;
            match Command::decode(&slot) {
                Ok(cmd) => {
                    if matches!(cmd, Command::Send { .. }) {
                        ginza_sys::hops::stamp(ginza_sys::hops::Hop::NetstackCommandIn);
                    }
                    self.on_command(id, p, cmd)
                }
                Err(e) => {
                    return self.cut_off(
                        id,
                        p,
                        Reason::BadCommand,
                        format!("undecodable command on ring {p}: {e}"),
                    );
                }
            }
        }
    }

    /// Cuts an application off: `disconnected` as its last event, then the
    /// daemon detaches it ([`Self::take_doomed`]).
    fn cut_off(&mut self, id: u64, p: u32, reason: Reason, why: String) {
        warn!("cutting off app {id}: {why}");
        if let Some(app) = self.apps.get_mut(&id) {
            let _ = app.pairs[p as usize]
                .events
                .push(Event::Disconnected { reason }.encode());
            app.doomed.get_or_insert(why);
        }
    }

    fn refuse(
        &mut self,
        id: u64,
        p: u32,
        conn: Option<ConnId>,
        cookie: u32,
        cmd: &Command,
        reason: Reason,
    ) {
        self.stats.refused += 1;
        debug!("app {id}: {cmd:?} refused: {reason}");
        self.emit(
            id,
            p,
            Event::Refused {
                conn,
                cookie,
                command: cmd.tag(),
                reason,
            },
        );
    }

    /// The connection `conn` names, if application `id` owns it.
    fn owned(&self, id: u64, conn: ConnId) -> Result<u32, Reason> {
        match self.conns.get(conn.get()) {
            None => Err(Reason::NoSuchConnection),
            Some(k) if k.app != id => Err(Reason::NotOwner),
            Some(k) if k.released => Err(Reason::NoSuchConnection),
            Some(_) => Ok(conn.get()),
        }
    }

    pub(super) fn on_command(&mut self, id: u64, p: u32, cmd: Command) {
        match cmd {
            Command::Listen {
                cookie,
                port,
                backlog,
            } => self.listen(id, p, &cmd, cookie, port, backlog),
            Command::Unlisten { listener } => self.unlisten(id, p, &cmd, listener),
            Command::Accept { conn, listener } => self.accept(id, p, &cmd, conn, listener),
            Command::Connect { cookie, remote } => self.connect(id, p, &cmd, cookie, remote),
            Command::Send { conn, ranges, .. } => self.send(id, p, &cmd, conn, ranges),
            Command::RecvDone { conn, ranges } => self.recv_done(id, p, &cmd, conn, ranges),
            Command::Shutdown { conn } | Command::Close { conn } => {
                self.shutdown_or_close(id, p, &cmd, conn)
            }
        }
    }

    /// A listening endpoint on the application's address.
    fn listen(&mut self, id: u64, p: u32, cmd: &Command, cookie: u32, port: u16, backlog: u16) {
        let Some(iface) = self.apps.get(&id).map(|a| a.interface) else {
            return;
        };
        let local = Endpoint::new(iface.ip, port);
        if self.table.is_listening(&local) {
            return self.refuse(id, p, None, cookie, cmd, Reason::PortInUse);
        }
        let backlog = usize::from(backlog.clamp(1, self.cfg.max_backlog));
        let entry = ListenerEntry {
            app: id,
            pair: p,
            local,
            backlog: Listener::new(ListenConfig {
                half_open: backlog.max(64),
                backlog,
                syn_cookies: true,
            }),
        };
        let Some(l) = self.listeners.insert(entry) else {
            return self.refuse(id, p, None, cookie, cmd, Reason::TooManyConnections);
        };
        let _ = self.table.listen(local, l);
        if let Some(a) = self.apps.get_mut(&id) {
            a.listeners.push(l);
        }
        if let Some(listener) = ListenId::new(l) {
            self.emit(id, p, Event::Listening { cookie, listener });
        }
    }

    /// The listener closes (its half-open connections are reset as they
    /// settle).
    fn unlisten(&mut self, id: u64, p: u32, cmd: &Command, listener: ListenId) {
        match self.listeners.get(listener.get()) {
            None => return self.refuse(id, p, None, 0, cmd, Reason::NoSuchConnection),
            Some(l) if l.app != id => return self.refuse(id, p, None, 0, cmd, Reason::NotOwner),
            Some(_) => {}
        }
        if let Some(l) = self.listeners.remove(listener.get()) {
            self.table.unlisten(&l.local, |&x| x == listener.get());
            if let Some(a) = self.apps.get_mut(&id) {
                a.listeners.retain(|x| *x != listener.get());
            }
        }
    }

    /// The application takes a connection `new_conn` announced.
    fn accept(&mut self, id: u64, p: u32, cmd: &Command, conn: ConnId, listener: ListenId) {
        let now = self.now();
        let c = match self.owned(id, conn) {
            Ok(c) => c,
            Err(r) => return self.refuse(id, p, Some(conn), 0, cmd, r),
        };
        let ok = matches!(
            self.conns.get(c).map(|k| k.phase),
            Some(Phase::Announced { listener: l }) if l == listener.get()
        );
        if !ok {
            return self.refuse(id, p, Some(conn), 0, cmd, Reason::InvalidState);
        }
        let remote = self.conns.get(c).map(|k| k.key.remote);
        if let (Some(l), Some(remote)) = (self.listeners.get_mut(listener.get()), remote) {
            l.backlog.forget(remote);
        }
        if let Some(k) = self.conns.get_mut(c) {
            k.phase = Phase::Open;
            k.pair = p;
        }
        self.settle(c, now);
    }

    /// An active open from an ephemeral port.
    fn connect(&mut self, id: u64, p: u32, cmd: &Command, cookie: u32, remote: SocketAddrV4) {
        let now = self.now();
        let Some(iface) = self.apps.get(&id).map(|a| a.interface) else {
            return;
        };
        let remote = Endpoint::new(*remote.ip(), remote.port());
        let Some(port) = self.table.ephemeral_port(iface.ip, remote) else {
            return self.refuse(id, p, None, cookie, cmd, Reason::TooManyConnections);
        };
        let key = FourTuple::new(Endpoint::new(iface.ip, port), remote);
        let iss = self.isn.isn(key.local, key.remote, now);
        let tcb = Connection::connect(&self.cfg.tcp, key.local, key.remote, iss, now);
        let mac = self.arp.get(&remote.ip).copied();
        let conn = Conn::new(id, p, key, mac, tcb, Phase::Connecting { cookie });
        let Some(c) = self.conns.insert(conn) else {
            return self.refuse(id, p, None, cookie, cmd, Reason::TooManyConnections);
        };
        self.table.insert(key, c);
        if let Some(a) = self.apps.get_mut(&id) {
            a.conns.push(c);
        }
        self.settle(c, now);
    }

    /// Ranges of the tx pool queued for sending.
    fn send(&mut self, id: u64, p: u32, cmd: &Command, conn: ConnId, ranges: Ranges) {
        let now = self.now();
        let c = match self.owned(id, conn) {
            Ok(c) => c,
            Err(r) => return self.refuse(id, p, Some(conn), 0, cmd, r),
        };
        let Some(app) = self.apps.get(&id) else {
            return;
        };
        if ranges.as_slice().iter().any(|r| app.tx.check(*r).is_err()) {
            return self.refuse(id, p, Some(conn), 0, cmd, Reason::OutsideTxPool);
        }
        let limit = self.cfg.send_queue_bytes;
        let Some(k) = self.conns.get_mut(c) else {
            return;
        };
        if k.phase != Phase::Open || k.shutdown_requested || k.close_requested {
            return self.refuse(id, p, Some(conn), 0, cmd, Reason::InvalidState);
        }
        if k.named - k.acked() + ranges.bytes() > limit {
            return self.refuse(id, p, Some(conn), 0, cmd, Reason::SendQueueFull);
        }
        for r in ranges.as_slice() {
            k.named += u64::from(r.len);
            k.sends.push_back(PendingSend {
                range: *r,
                end: k.named,
            });
        }
        self.settle(c, now);
    }

    /// Rx chunks given back, all or nothing.
    fn recv_done(&mut self, id: u64, p: u32, cmd: &Command, conn: ConnId, ranges: Ranges) {
        let now = self.now();
        let c = match self.owned(id, conn) {
            Ok(c) => c,
            Err(r) => return self.refuse(id, p, Some(conn), 0, cmd, r),
        };
        let Some(app) = self.apps.get_mut(&id) else {
            return;
        };
        // All or nothing: every range must be a chunk lent to this
        // connection with exactly this length.
        let mut chunks = Vec::with_capacity(MAX_RANGES);
        for r in ranges.as_slice() {
            let chunk = RxPool::chunk_of(r.offset);
            let ok = chunk.is_some_and(|ch| {
                app.lent.get(ch as usize).copied().flatten() == Some((c, r.len))
                    && !chunks.contains(&ch)
            });
            if !ok {
                return self.refuse(id, p, Some(conn), 0, cmd, Reason::NotDelivered);
            }
            chunks.extend(chunk);
        }
        let mut freed = 0u64;
        for (ch, r) in chunks.iter().zip(ranges.as_slice()) {
            app.lent[*ch as usize] = None;
            let _ = app.ledger.give_back(*ch);
            freed += u64::from(r.len);
        }
        if let Some(k) = self.conns.get_mut(c) {
            k.rx_held = k.rx_held.saturating_sub(freed);
        }
        self.chunks_freed = true;
        self.settle(c, now);
    }

    /// `shutdown` (FIN once the queued sends are out) or `close`.
    fn shutdown_or_close(&mut self, id: u64, p: u32, cmd: &Command, conn: ConnId) {
        let now = self.now();
        let c = match self.owned(id, conn) {
            Ok(c) => c,
            Err(r) => return self.refuse(id, p, Some(conn), 0, cmd, r),
        };
        let close = matches!(cmd, Command::Close { .. });
        if let Some(k) = self.conns.get_mut(c) {
            if close {
                k.close_requested = true;
                if k.phase != Phase::Open {
                    // Never accepted: nothing of the application's
                    // to send first, and its place in the listener's
                    // backlog is free again.
                    if let Phase::HalfOpen { listener } | Phase::Announced { listener } = k.phase {
                        if let Some(l) = self.listeners.get_mut(listener) {
                            l.backlog.forget(k.key.remote);
                        }
                    }
                    k.tcb.abort();
                    k.phase = Phase::Open;
                }
            } else {
                k.shutdown_requested = true;
            }
            if k.sends.is_empty() || k.tcb.error().is_some() {
                if close {
                    k.tcb.close();
                } else {
                    k.tcb.shutdown();
                }
            }
        }
        self.settle(c, now);
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddrV4;

    use ginza_net::tcp::EPHEMERAL_FIRST;
    use ginza_proto::netstack::{Command, ConnId, Event, Reason};

    use super::super::testing::{App, PEER};
    use super::super::{Netstack, NetstackConfig, Phase};

    fn refusals(events: &[Event]) -> Vec<(u32, Reason)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Refused { cookie, reason, .. } => Some((*cookie, *reason)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_port_listens_once_and_a_connection_answers_to_its_owner_only() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let mut a = App::attach(&mut ns, "commands-a");
        let mut b = App::attach(&mut ns, "commands-b");
        let listen = |cookie| Command::Listen {
            cookie,
            port: 80,
            backlog: 4,
        };
        ns.on_command(a.id, 0, listen(1));
        ns.on_command(b.id, 0, listen(2));
        let remote = SocketAddrV4::new(PEER.ip, 7);
        ns.on_command(a.id, 0, Command::Connect { cookie: 3, remote });
        let handle = ns.conns.handles()[0];
        let conn = ns.conns.get(handle).unwrap();
        assert_eq!(conn.phase, Phase::Connecting { cookie: 3 });
        assert_eq!(conn.key.local.port, EPHEMERAL_FIRST);
        assert_eq!(ns.stats().no_route, 1, "no MAC for the peer: ARP asked");
        let id = ConnId::new(handle).unwrap();
        ns.on_command(b.id, 0, Command::Close { conn: id });
        let invented = ConnId::new(handle + 1).unwrap();
        ns.on_command(a.id, 0, Command::Close { conn: invented });
        ns.flush_events();
        let (ea, eb) = (a.events(), b.events());
        assert!(
            matches!(ea[0], Event::Listening { cookie: 1, .. }),
            "{ea:?}"
        );
        assert_eq!(refusals(&ea), [(0, Reason::NoSuchConnection)]);
        assert_eq!(
            refusals(&eb),
            [(2, Reason::PortInUse), (0, Reason::NotOwner)]
        );
        assert_eq!(ns.stats().refused, 3);
    }
}
