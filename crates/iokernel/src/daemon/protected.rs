//! Protected mode in iokerneld (docs/protected.md, "Wake-ups"): the
//! netstack hands iokerneld each protected application's channel
//! (`Request::Protect` on its registration socket), and the allocation
//! pass counts what waits on those rings as queued work — commands as the
//! netstack's (pair `p` → its kthread `p % kthreads`), events as the
//! protected application's (pair `k` → its kthread `k`). A parked
//! application with events, or a parked netstack with commands, is
//! congested and gets a core; so network cores follow the load.

use std::os::fd::OwnedFd;

use ginza_policy::alloc::QueueCounters;
use ginza_proto::messages::{Request, Response};
use ginza_shm::netstack::{Channel, TxPoolView};
use log::info;

use super::Iokerneld;
use crate::actuator::CoreActuator;

/// Most channels one netstack may hand over.
const MAX_LINKS: usize = 1024;

/// One protected application's channel, as its netstack handed it over.
pub(super) struct ProtectLink {
    link: u64,
    app_pid: i32,
    /// The application's name at the netstack, if the netstack said it.
    app_name: Option<String>,
    channel: Channel,
    /// The address steered to the netstack for this application, if any.
    alias: Option<ginza_net::Ipv4Addr>,
}

impl<A: CoreActuator> Iokerneld<A> {
    /// `Protect` or `Unprotect` from registered application `i`.
    pub(super) fn protect_request(
        &mut self,
        i: usize,
        req: &Request,
        fds: Vec<OwnedFd>,
    ) -> Response {
        let refuse = |reason: String| Response::Refused { reason };
        let app = &mut self.apps[i];
        match *req {
            Request::Protect {
                app_pid,
                ref app_name,
                link,
                interface,
            } => {
                let mut fds = fds.into_iter();
                let Some(fd) = fds.next() else {
                    return refuse("protect: no channel memfd attached".into());
                };
                // The application's tx pool, for zero-touch frames.
                let tx_pool = match fds.next().map(TxPoolView::map) {
                    None => None,
                    Some(Ok(p)) => Some(p),
                    Some(Err(e)) => return refuse(format!("protect: tx pool: {e}")),
                };
                if app.protects.len() >= MAX_LINKS {
                    return refuse(format!("protect: {MAX_LINKS} channels already"));
                }
                let channel = match Channel::attach(fd) {
                    Ok(c) => c,
                    Err(e) => return refuse(format!("protect: {e}")),
                };
                let alias = match interface {
                    None => None,
                    Some(iface) => {
                        let taken = self.apps.iter().any(|a| {
                            a.net.as_ref().is_some_and(|n| {
                                n.interface.ip == iface.ip
                                    || n.aliases.iter().any(|x| x.ip == iface.ip)
                            })
                        });
                        if taken {
                            return refuse(format!("protect: {} is already steered", iface.ip));
                        }
                        let app = &mut self.apps[i];
                        let Some(net) = app.net.as_mut() else {
                            return refuse("protect: the netstack registered without net".into());
                        };
                        if let Err(e) = self.dp.add_alias(net, iface) {
                            return refuse(format!("protect: {e}"));
                        }
                        Some(iface.ip)
                    }
                };
                let app = &mut self.apps[i];
                if let Some(old) = app.protects.iter().position(|l| l.link == link) {
                    let old = app.protects.remove(old);
                    if let (Some(ip), Some(net)) = (old.alias, app.net.as_mut()) {
                        self.dp.remove_alias(net, ip);
                    }
                }
                if let Some(net) = app.net.as_mut() {
                    net.tx_pools.retain(|(l, _)| *l != link);
                    if let Some(p) = tx_pool {
                        net.tx_pools.push((link, p));
                    }
                }
                app.protects.push(ProtectLink {
                    link,
                    app_pid,
                    app_name: app_name.clone(),
                    channel,
                    alias,
                });
                info!(
                    "netstack {:?} protects pid {app_pid} (link {link}{})",
                    app.name,
                    alias.map_or(String::new(), |ip| format!(", address {ip}"))
                );
            }
            Request::Unprotect { link } => {
                if let Some(old) = app.protects.iter().position(|l| l.link == link) {
                    let old = app.protects.remove(old);
                    if let (Some(ip), Some(net)) = (old.alias, app.net.as_mut()) {
                        self.dp.remove_alias(net, ip);
                    }
                }
                if let Some(net) = app.net.as_mut() {
                    net.tx_pools.retain(|(l, _)| *l != link);
                }
            }
            _ => return refuse("not a protect request".into()),
        }
        let app = &self.apps[i];
        let id = app.id;
        self.rebuild_protected();
        Response::Accepted {
            app_id: id,
            ingress_buffers: 0,
            wake_slots: None,
            busy_time: None,
        }
    }

    /// Recomputes the channels by protected application (after any
    /// change to the channels or to the registered applications).
    pub(super) fn rebuild_protected(&mut self) {
        let apps = &self.apps;
        self.protected_pids = apps
            .iter()
            .flat_map(|a| a.protects.iter().map(move |l| (a.id, l)))
            .map(|(netstack, l)| {
                // Threads of one process share its pid (iokerneld, the
                // netstack and applications in one process: `ginza bench`,
                // tests): the name picks the application out of them, so
                // that the events are nobody else's work. A name no
                // registered application of that pid has picks nothing
                // out: every application of the pid counts them.
                let name = l
                    .app_name
                    .clone()
                    .filter(|n| apps.iter().any(|a| a.pid == l.app_pid && a.name == *n));
                ProtectedApp {
                    pid: l.app_pid,
                    name,
                    channel: l.channel.clone(),
                    netstack,
                }
            })
            .collect();
    }
}

/// Whose work a channel's events are: the application with pid `pid`
/// (and name `name`, when it tells it apart from others of that pid).
pub(super) struct ProtectedApp {
    pid: i32,
    name: Option<String>,
    channel: Channel,
    /// The netstack's application id.
    netstack: u64,
}

impl ProtectedApp {
    fn is(&self, pid: i32, name: &str) -> bool {
        self.pid == pid && self.name.as_deref().is_none_or(|n| n == name)
    }
}

/// The id of the netstack that runs `app`'s stack, if `app` is a
/// protected application it named when it attached (the allocator keeps
/// that netstack from preempting it: `AppSnap::netstack`, docs/protected.md,
/// "A protected application beside batch"). Unnamed channels pair nobody:
/// they may be any application of the pid's, batch included.
pub(super) fn netstack_of(by_pid: &[ProtectedApp], app: &super::App) -> Option<u64> {
    by_pid
        .iter()
        .find(|p| p.name.is_some() && p.is(app.pid, &app.name) && p.netstack != app.id)
        .map(|p| p.netstack)
}

/// The back-pressure on `app`'s channels to its netstacks, if it has any:
/// the full-ring counts of their pair lines, summed (for the metrics).
pub(super) fn back_pressure(
    by_pid: &[ProtectedApp],
    app: &super::App,
) -> Option<crate::metrics::ChannelFigures> {
    let mut f: Option<crate::metrics::ChannelFigures> = None;
    for p in by_pid
        .iter()
        .filter(|p| p.is(app.pid, &app.name) && p.netstack != app.id)
    {
        let f = f.get_or_insert_with(Default::default);
        f.channels += 1;
        for pair in 0..p.channel.pairs() {
            if let Ok(line) = p.channel.line_handle(pair) {
                let (cmd, ev) = line.full_counts();
                f.command_ring_full = f.command_ring_full.wrapping_add(cmd);
                f.event_ring_full = f.event_ring_full.wrapping_add(ev);
            }
        }
    }
    f
}

/// Adds a ring's (head, tail) to the runqueue counters: sequence numbers
/// summed in wrapping arithmetic keep "items queued" and "an item queued
/// at the previous pass is still queued" meaning what they mean for one
/// ring.
fn add(c: &mut QueueCounters, (head, tail): (u32, u32)) {
    c.rq_head = c.rq_head.wrapping_add(head);
    c.rq_tail = c.rq_tail.wrapping_add(tail);
}

/// Folds the channel rings that are kthread `k`'s work into its counters:
/// the command rings of a netstack's channels (`links`), and the event
/// ring `k` of channels whose protected application is the one with pid
/// `pid` and name `name`.
pub(super) fn fold(
    links: &[ProtectLink],
    kthreads: usize,
    (pid, name): (i32, &str),
    by_pid: &[ProtectedApp],
    k: usize,
    c: &mut QueueCounters,
) {
    for l in links {
        let pairs = l.channel.pairs() as usize;
        for p in (k..pairs).step_by(kthreads.max(1)) {
            if let Ok([cmd, _]) = l.channel.indices(p as u32) {
                add(c, cmd);
            }
        }
    }
    for p in by_pid.iter().filter(|p| p.is(pid, name)) {
        if let Ok([_, ev]) = p.channel.indices(k as u32) {
            add(c, ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_commands_and_events_show_as_work() {
        let ch = Channel::create("t", &ginza_shm::netstack::ChannelConfig::new(3)).unwrap();
        let mut app = ch.app_pair(2).unwrap();
        let mut net = ch.net_pair(1).unwrap();
        app.commands.push(Default::default()).unwrap();
        net.events.push(Default::default()).unwrap();
        let links = vec![ProtectLink {
            link: 1,
            app_pid: 77,
            app_name: None,
            channel: ch.clone(),
            alias: None,
        }];
        let by_pid = vec![ProtectedApp {
            pid: 77,
            name: None,
            channel: ch.clone(),
            netstack: 5,
        }];
        // Netstack with 2 kthreads: pair 2 is kthread 0's.
        let mut c = QueueCounters::default();
        fold(&links, 2, (5, "n"), &[], 0, &mut c);
        assert!(c.has_items());
        let mut c = QueueCounters::default();
        fold(&links, 2, (5, "n"), &[], 1, &mut c);
        assert!(!c.has_items());
        // The protected app (pid 77): kthread 1 has an event waiting.
        let mut c = QueueCounters::default();
        fold(&[], 1, (77, "a"), &by_pid, 1, &mut c);
        assert!(c.has_items());
        let mut c = QueueCounters::default();
        fold(&[], 1, (77, "a"), &by_pid, 0, &mut c);
        assert!(!c.has_items());
        let mut c = QueueCounters::default();
        fold(&[], 1, (78, "a"), &by_pid, 1, &mut c);
        assert!(!c.has_items());
        // Named: of the applications of pid 77, only "a" has the events.
        let by_name = vec![ProtectedApp {
            pid: 77,
            name: Some("a".into()),
            channel: ch.clone(),
            netstack: 5,
        }];
        let mut c = QueueCounters::default();
        fold(&[], 1, (77, "a"), &by_name, 1, &mut c);
        assert!(c.has_items());
        let mut c = QueueCounters::default();
        fold(&[], 1, (77, "batch"), &by_name, 1, &mut c);
        assert!(!c.has_items());
    }
}
