//! Applications attach (their channel, rx pool and address) and detach
//! (hung up, killed or cut off: their connections reset, their listeners
//! closed, their pools freed); what the daemon asks about them.

use std::collections::VecDeque;

use ginza_net::Interface;
use ginza_shm::netstack::{Channel, ChannelConfig, RxPool};
use ginza_shm::BufferLedger;
use log::info;

use super::{App, Attachment, Granted, Netstack};

impl Netstack {
    /// Attaches an application: its channel, its rx pool, its address.
    pub fn attach(&mut self, a: Attachment) -> Result<Granted, String> {
        if a.kthreads == 0 || a.kthreads > self.cfg.max_pairs {
            return Err(format!(
                "{} kthreads: must be 1..={}",
                a.kthreads, self.cfg.max_pairs
            ));
        }
        if !a.doorbells.is_empty() && a.doorbells.len() != a.kthreads as usize {
            return Err(format!(
                "{} doorbells for {} kthreads",
                a.doorbells.len(),
                a.kthreads
            ));
        }
        if let Some((iface, _)) = self.addresses.get(&a.interface.ip) {
            if iface.mac != a.interface.mac {
                return Err(format!(
                    "address {} is served with MAC {}, not {}",
                    a.interface.ip, iface.mac, a.interface.mac
                ));
            }
        }
        let id = self.next_app;
        let channel = Channel::create(
            &format!("ginza-netstack-chan-{id}"),
            &ChannelConfig {
                pairs: a.kthreads,
                capacity: self.cfg.ring_capacity,
            },
        )
        .map_err(|e| format!("cannot create the channel: {e}"))?;
        let rx = RxPool::create(&format!("ginza-netstack-rx-{id}"), self.cfg.rx_chunks)
            .map_err(|e| format!("cannot create the rx pool: {e}"))?;
        let pairs = (0..a.kthreads)
            .map(|p| channel.net_pair(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let channel_fd = channel
            .fd()
            .try_clone_to_owned()
            .map_err(|e| format!("dup channel: {e}"))?;
        let rx_fd = rx.app_fd().map_err(|e| e.to_string())?;
        let tx_fd = a
            .tx_pool
            .fd()
            .try_clone_to_owned()
            .map_err(|e| format!("dup tx pool: {e}"))?;
        let granted = Granted {
            app_id: id,
            pairs: a.kthreads,
            ring_capacity: self.cfg.ring_capacity,
            rx_pool_bytes: rx.len(),
            send_queue_bytes: self.cfg.send_queue_bytes,
            channel: channel_fd,
            rx_pool: rx_fd,
            channel_handle: channel.clone(),
            tx_pool: tx_fd,
        };
        self.next_app += 1;
        self.addresses
            .entry(a.interface.ip)
            .or_insert((a.interface, 0))
            .1 += 1;
        let chunks = self.cfg.rx_chunks;
        info!(
            "attached {} (pid {}, app {id}) at {} with {} ring pairs",
            a.name, a.pid, a.interface.ip, a.kthreads
        );
        self.apps.insert(
            id,
            App {
                id,
                name: a.name,
                pid: a.pid,
                interface: a.interface,
                channel,
                waiting: (0..a.kthreads).map(|_| VecDeque::new()).collect(),
                pairs,
                doorbells: a.doorbells,
                rx,
                ledger: BufferLedger::new(chunks),
                lent: vec![None; chunks as usize],
                tx: a.tx_pool,
                zero_touch: false,
                conns: Vec::new(),
                listeners: Vec::new(),
                doomed: None,
            },
        );
        Ok(granted)
    }

    /// From now on application `id`'s payload goes zero-touch: iokerneld
    /// maps its tx pool and assembles the frames (call before the
    /// application's first command).
    pub fn set_zero_touch(&mut self, id: u64) {
        if let Some(a) = self.apps.get_mut(&id) {
            a.zero_touch = true;
        }
    }

    /// Answers for `iface` for good (the netstack's own address, which
    /// applications may share).
    pub fn add_address(&mut self, iface: Interface) {
        self.addresses.entry(iface.ip).or_insert((iface, 0)).1 += 1;
    }

    /// Applications the netstack cut off since the last call, and why (the
    /// daemon closes their sockets; they are detached already).
    pub fn take_doomed(&mut self) -> Vec<(u64, String)> {
        let ids: Vec<u64> = self
            .apps
            .values()
            .filter(|a| a.doomed.is_some())
            .map(|a| a.id)
            .collect();
        let mut out = Vec::new();
        for id in ids {
            let why = self.apps.get_mut(&id).and_then(|a| a.doomed.take());
            self.detach(id);
            out.push((id, why.unwrap_or_default()));
        }
        out
    }

    /// Detaches an application (it hung up, was killed, or was cut off):
    /// every connection of it is reset, its listeners closed, its pools and
    /// ledgers freed. Other applications notice nothing.
    pub fn detach(&mut self, id: u64) {
        let Some(app) = self.apps.remove(&id) else {
            return;
        };
        let now = self.now();
        for &l in &app.listeners {
            if let Some(entry) = self.listeners.remove(l) {
                self.table.unlisten(&entry.local, |&x| x == l);
            }
        }
        let n = app.conns.len();
        for c in app.conns.iter().copied() {
            let Some(mut conn) = self.conns.remove(c) else {
                continue;
            };
            self.table.remove(&conn.key);
            conn.tcb.abort();
            self.transmit(&app.interface, &mut conn, now, None);
        }
        if let Some(e) = self.addresses.get_mut(&app.interface.ip) {
            e.1 -= 1;
            if e.1 == 0 {
                self.addresses.remove(&app.interface.ip);
            }
        }
        self.stats.apps_disconnected += 1;
        info!(
            "detached {} (app {id}, pid {}): {n} connections reset",
            app.name, app.pid
        );
    }

    /// The application's channel (iokerneld maps it to see pending work).
    pub fn channel(&self, id: u64) -> Option<&Channel> {
        self.apps.get(&id).map(|a| &a.channel)
    }

    /// Attached application ids.
    pub fn app_ids(&self) -> Vec<u64> {
        self.apps.keys().copied().collect()
    }

    /// Whether some attached application is answering now: it took every
    /// event it was given (so it runs, or ran) and still holds received
    /// data (a `recv_done`, most likely with a reply, is due). The daemon
    /// keeps its core a while longer then (`DaemonConfig::reply_spin`), so
    /// that the command is taken at once rather than after a wake of its
    /// own. An application with events still unread is not running: it
    /// may need this very core (docs/protected.md, "Where the one-way time
    /// goes").
    pub fn reply_due(&self) -> bool {
        self.apps.values().any(|a| {
            a.doomed.is_none()
                && a.ledger.lent() > 0
                && a.waiting.iter().all(|q| q.is_empty())
                && (0..a.pairs.len() as u32)
                    .all(|p| a.channel.pending(p).is_ok_and(|(_, ev)| ev == 0))
        })
    }

    /// Rx chunks lent to application `id` now (tests check that a reset
    /// frees them).
    pub fn rx_lent(&self, id: u64) -> Option<usize> {
        self.apps.get(&id).map(|a| a.ledger.lent())
    }
}

#[cfg(test)]
mod tests {
    use ginza_net::tcp::Instant;
    use ginza_net::{Interface, MacAddr};

    use super::super::testing::{attachment, client, deliver, sent, App, US};
    use super::super::{Netstack, NetstackConfig};

    #[test]
    fn attach_refuses_a_bad_request() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let (none, _tx) = attachment("attach-none", US, 0);
        assert!(ns.attach(none).is_err(), "no kthreads");
        let (many, _tx) = attachment("attach-many", US, 65);
        assert!(ns.attach(many).is_err(), "beyond max_pairs");
        let _app = App::attach(&mut ns, "attach-first");
        let other_mac = Interface {
            mac: MacAddr([2, 0, 0, 0, 0, 3]),
            ..US
        };
        let (clash, _tx) = attachment("attach-clash", other_mac, 1);
        let e = ns.attach(clash).err().unwrap();
        assert!(e.contains("is served with MAC"), "{e}");
        assert_eq!(ns.stats().apps, 1);
    }

    #[test]
    fn detach_resets_every_connection_and_frees_the_address() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let app = App::attach(&mut ns, "attach-detach");
        app.listen_on_80(&mut ns, 4);
        let mut c = client(40000, 80);
        deliver(&mut ns, &mut c);
        for (_, s) in sent(&mut ns).0 {
            c.on_segment(&s, Instant(0));
        }
        deliver(&mut ns, &mut c);
        let _ = sent(&mut ns);
        assert_eq!(ns.stats().connections, 1);
        ns.detach(app.id);
        let (segs, _) = sent(&mut ns);
        assert!(
            segs.iter().any(|(to, s)| to.port == 40000 && s.flags.rst),
            "{segs:?}"
        );
        let s = ns.stats();
        assert_eq!((s.apps, s.connections, s.apps_disconnected), (0, 0, 1));
        assert!(ns.table.is_empty());
        // Its address is no longer served: a SYN is not ours.
        deliver(&mut ns, &mut client(40001, 80));
        assert_eq!(ns.frames_waiting(), 0);
        assert_eq!(ns.stats().frames_not_ours, 1);
    }
}
