//! Registration and control: the control socket, connections that have
//! not registered yet, the checks a registration passes (its descriptors
//! by SCM_RIGHTS, the region, the address) and their refusals, stats
//! requests, hang-ups and the removal of an application.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use ginza_shm::{IokernelEnd, Region, WakePage};
use log::{debug, info, warn};

use super::{
    App, DaemonError, Iokerneld, Kthread, Pending, MAX_KTHREADS, MAX_PENDING, PENDING_TIMEOUT,
    RECENT_REMOVALS,
};
use crate::actuator::CoreActuator;
use crate::dataplane::AppNet;
use ginza_policy::steer::SteeringKind;
use ginza_proto::messages::{
    decode_request, encode, Registration, Removal, Request, Response, MAX_APPS, MAX_NAME,
    MAX_REQUEST, REPLY_LIMIT,
};
use ginza_sys::task_group::{task_group_of, TaskGroup};
use ginza_sys::{clock, cpulist, eventfd, poll, process, socket};

/// What [`Iokerneld::admit`] accepted: the region, iokerneld's ends of
/// it, the kthreads' eventfds and the application's bell, if it sent one.
type Admitted = (Region, Vec<IokernelEnd>, Vec<OwnedFd>, Option<OwnedFd>);

fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "application name must be 1 to {MAX_NAME} bytes, got {}",
            name.len()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    {
        return Err(format!(
            "application name {name:?} may only use ASCII letters, digits and - _ . :"
        ));
    }
    Ok(())
}

pub(super) fn bind(path: &std::path::Path) -> Result<OwnedFd, DaemonError> {
    let err = |op, source| DaemonError::Socket {
        op,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| err("create directory for", e))?;
        }
    }
    if path.exists() {
        // A live iokerneld answers a connect; a stale socket file does not.
        if socket::connect_seqpacket(path).is_ok() {
            return Err(DaemonError::AlreadyRunning(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(|e| err("remove stale socket", e))?;
    }
    socket::listen_seqpacket(path, 64).map_err(|e| err("listen on", e))
}

/// Sizes a connection's send buffer for the longest reply
/// ([`REPLY_LIMIT`]): one SOCK_SEQPACKET message must fit in it, and the
/// default (`net.core.wmem_default`, 208 KiB) is about what the largest
/// stats reply needs. Says so, once, where the system caps it lower.
pub(super) fn size_for_replies(sock: &OwnedFd) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    // A message carries some 32 bytes of the kernel's own beside the data.
    let short = match socket::set_send_buffer(sock.as_fd(), REPLY_LIMIT) {
        Ok(got) if got >= REPLY_LIMIT + 64 => return,
        Ok(got) => format!("its send buffer is {got} bytes"),
        Err(e) => format!("its send buffer could not be sized: {e}"),
    };
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        warn!(
            "a stats reply of many applications may not fit a connection ({short}, want {}; raise net.core.wmem_max)",
            REPLY_LIMIT + 64
        );
    }
}

impl<A: CoreActuator> Iokerneld<A> {
    /// Polls the listener and every connection (waiting at most `timeout`)
    /// and handles what is ready; returns whether anything was.
    pub(super) fn control(
        &mut self,
        timeout: Option<Duration>,
        now: u64,
    ) -> Result<bool, DaemonError> {
        let ev = libc::POLLIN;
        self.pollfds.clear();
        self.pollfds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: ev,
            revents: 0,
        });
        for p in &self.pending {
            self.pollfds.push(libc::pollfd {
                fd: p.sock.as_raw_fd(),
                events: ev,
                revents: 0,
            });
        }
        for a in &self.apps {
            self.pollfds.push(libc::pollfd {
                fd: a.sock.as_raw_fd(),
                events: ev,
                revents: 0,
            });
        }
        let n = poll::poll_raw(&mut self.pollfds, timeout).map_err(DaemonError::Poll)?;
        let now = if timeout.is_some_and(|t| !t.is_zero()) {
            clock::monotonic_ns()
        } else {
            now
        };
        if n > 0 {
            let np = self.pending.len();
            let ready: Vec<bool> = self.pollfds.iter().map(|p| p.revents != 0).collect();
            // Apps first (indices stay valid: removal happens after).
            for (i, _) in ready[1 + np..].iter().enumerate().filter(|(_, r)| **r) {
                self.app_readable(i);
            }
            let mut keep = Vec::with_capacity(np);
            let pending = std::mem::take(&mut self.pending);
            for (p, r) in pending.into_iter().zip(&ready[1..1 + np]) {
                if *r {
                    if let Some(p) = self.pending_readable(p, now) {
                        keep.push(p);
                    }
                } else {
                    keep.push(p);
                }
            }
            self.pending = keep;
            if ready[0] {
                self.accept(now);
            }
            self.reap();
            self.complete_handovers();
        }
        // Silent connections do not hold a slot forever.
        let limit = PENDING_TIMEOUT.as_nanos() as u64;
        self.pending.retain(|p| {
            let keep = now.saturating_sub(p.since) < limit;
            if !keep {
                debug!(
                    "closing a connection from pid {} that sent nothing for {PENDING_TIMEOUT:?}",
                    p.pid
                );
            }
            keep
        });
        Ok(n > 0)
    }

    fn accept(&mut self, now: u64) {
        for _ in 0..16 {
            match socket::accept(self.listener.as_fd()) {
                Ok(Some(sock)) => {
                    let pid = socket::peer_pid(sock.as_fd()).unwrap_or(0);
                    size_for_replies(&sock);
                    if self.pending.len() >= MAX_PENDING {
                        warn!("refusing a connection from pid {pid}: {MAX_PENDING} connections already pending");
                        self.refused += 1;
                        continue;
                    }
                    self.pending.push(Pending {
                        sock,
                        pid,
                        since: now,
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    warn!("accept on the control socket: {e}");
                    break;
                }
            }
        }
    }

    /// Sends a reply; false if the peer is gone or not reading.
    fn reply(sock: &OwnedFd, r: &Response) -> bool {
        Self::reply_with_fds(sock, r, &[])
    }

    fn reply_with_fds(sock: &OwnedFd, r: &Response, fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
        match socket::send_with_fds(sock.as_fd(), &encode(r), fds) {
            Ok(()) => true,
            Err(e) => {
                debug!("reply not sent: {e}");
                false
            }
        }
    }

    /// A pending connection is readable: a request, garbage or a hang-up.
    /// Returns the connection if it stays open (a stats reader).
    fn pending_readable(&mut self, p: Pending, now: u64) -> Option<Pending> {
        let mut buf = [0u8; MAX_REQUEST];
        let max_fds = 2 + MAX_KTHREADS as usize;
        let r = match socket::recv_with_fds(p.sock.as_fd(), &mut buf, max_fds, true) {
            Ok(Some(r)) => r,
            Ok(None) => return Some(p),
            Err(e) => {
                debug!("connection from pid {}: {e}", p.pid);
                return None;
            }
        };
        if r.closed {
            return None;
        }
        let refuse = |me: &mut Self, reason: String| {
            warn!("registration from pid {} refused: {reason}", p.pid);
            me.refused += 1;
            Self::reply(&p.sock, &Response::Refused { reason });
            None
        };
        if r.truncated {
            return refuse(self, format!("request longer than {MAX_REQUEST} bytes"));
        }
        if r.fds_truncated {
            return refuse(self, format!("more than {max_fds} descriptors attached"));
        }
        let req = match decode_request(&buf[..r.len]) {
            Ok(req) => req,
            Err(e) => return refuse(self, e.to_string()),
        };
        let (reg, steering) = match req {
            Request::Stats | Request::ResetStats => {
                let rep = self.stats_answer(&req, now);
                return Self::reply(&p.sock, &rep).then_some(p);
            }
            Request::DispatchBreakdown { name } => {
                let rep = self.dispatch_breakdown(&name);
                return Self::reply(&p.sock, &rep).then_some(p);
            }
            Request::Kthreads { name } => {
                let rep = self.kthread_views(&name, now);
                return Self::reply(&p.sock, &rep).then_some(p);
            }
            Request::Protect { .. } | Request::Unprotect { .. } => {
                return refuse(
                    self,
                    "protect: send it on the netstack's registration socket".into(),
                );
            }
            Request::DirectSocket { .. } => {
                return refuse(
                    self,
                    "direct socket: send it on a registered application's connection".into(),
                );
            }
            Request::Register(reg) => match reg.steering.as_deref().map(str::parse::<SteeringKind>)
            {
                None => (reg, self.cfg.steering),
                Some(Ok(kind)) => (reg, kind),
                Some(Err(reason)) => return refuse(self, reason),
            },
        };
        let dispatch = match &reg.dispatch {
            None => None,
            Some(_) if reg.net.is_none() => {
                return refuse(
                    self,
                    "dispatch by iokerneld needs a network interface".into(),
                )
            }
            Some(spec) => match spec.sched_policy() {
                Ok(policy) => Some(super::dispatch::AppDispatch::new(
                    policy,
                    reg.kthreads as usize,
                    spec.class_offset,
                    spec.backstop_ns,
                    spec.pre_assigns(),
                )),
                Err(reason) => return refuse(self, reason),
            },
        };
        match self.admit(&reg, r.fds, p.pid) {
            Ok((region, ends, eventfds, bell)) => {
                let id = self.next_id;
                let net = match reg
                    .net
                    .map(|iface| self.attach_net(&reg.name, iface, &region, steering))
                {
                    None => None,
                    Some(Ok(mut net)) => {
                        if dispatch.is_some() {
                            net.held = Some(Vec::new());
                        }
                        Some(net)
                    }
                    Some(Err(reason)) => return refuse(self, reason),
                };
                let wake = reg.wake_page.then(|| self.free_wake_slots()).flatten();
                let accepted = Response::Accepted {
                    app_id: id,
                    ingress_buffers: net.as_ref().map_or(0, |n| n.pool().count()),
                    wake_slots: wake.as_ref().map(|w| w.1),
                    busy_time: Some(self.alloc.reads_busy_time()),
                };
                let mut fds: Vec<_> = net.iter().map(|n| n.pool().fd()).collect();
                fds.extend(wake.as_ref().map(|w| w.0.fd()));
                let sent = Self::reply_with_fds(&p.sock, &accepted, &fds);
                if !sent {
                    if let Some(net) = &net {
                        self.dp.detach(net);
                    }
                    info!(
                        "app {:?} from pid {} left before its acceptance",
                        reg.name, p.pid
                    );
                    return None;
                }
                self.next_id += 1;
                info!(
                        "app {:?} registered: id {id}, pid {}, {:?}, {} kthreads, guaranteed {}, max {}, steering {steering}",
                        reg.name, p.pid, reg.class, reg.kthreads, reg.guaranteed, reg.max_cores
                    );
                warn_if_sharing_task_group(&reg.name, p.pid);
                let n = reg.kthreads as usize;
                self.apps.push(App {
                    id,
                    name: reg.name,
                    class: reg.class,
                    guaranteed: reg.guaranteed,
                    max_cores: reg.max_cores,
                    pid: p.pid,
                    sock: p.sock,
                    _region: region,
                    ends,
                    eventfds,
                    bell,
                    wake,
                    kt: vec![
                        Kthread {
                            parked: true,
                            parked_since: now,
                            steals: super::stats::StealCount::new(now),
                            latency: ginza_shm::LatencyTally::new(now),
                            ..Default::default()
                        };
                        n
                    ],
                    last_yielded_core: None,
                    last_granted_ns: None,
                    grants: 0,
                    preemptions: 0,
                    congestion: 0,
                    parks: 0,
                    ring_full: 0,
                    preempt_overdue: 0,
                    stale_parks: 0,
                    doomed: None,
                    net,
                    protects: Vec::new(),
                    dispatch,
                });
                // It may be a protected application its netstack named.
                self.rebuild_protected();
                None
            }
            Err(reason) => refuse(self, reason),
        }
    }

    /// Checks a registration and its descriptors; on success the attached
    /// region, iokerneld's ends of it, the eventfds and the bell.
    fn admit(&self, reg: &Registration, fds: Vec<OwnedFd>, pid: i32) -> Result<Admitted, String> {
        valid_name(&reg.name)?;
        if self.apps.len() >= MAX_APPS {
            return Err(format!("{MAX_APPS} applications are already registered"));
        }
        if self.apps.iter().any(|a| a.name == reg.name) {
            return Err(format!(
                "an application named {:?} is already registered",
                reg.name
            ));
        }
        if reg.kthreads == 0 || reg.kthreads > MAX_KTHREADS {
            return Err(format!(
                "kthread count {} is not in 1..={MAX_KTHREADS}",
                reg.kthreads
            ));
        }
        if reg.max_cores == 0 || reg.guaranteed > reg.max_cores || reg.max_cores > reg.kthreads {
            return Err(format!(
                "need 0 <= guaranteed ({}) <= max_cores ({}) <= kthreads ({}) and max_cores >= 1",
                reg.guaranteed, reg.max_cores, reg.kthreads
            ));
        }
        let managed = self.cfg.cores.len() as u64;
        let taken: u64 = self.apps.iter().map(|a| u64::from(a.guaranteed)).sum();
        if taken + u64::from(reg.guaranteed) > managed {
            return Err(format!(
                "guaranteed cores oversubscribed: {} asked, {taken} of the {managed} managed cores already guaranteed",
                reg.guaranteed
            ));
        }
        let want = 1 + reg.kthreads as usize + usize::from(reg.bell);
        if fds.len() != want {
            return Err(format!(
                "expected {want} descriptors (the region memfd and {} eventfds{}), got {}",
                reg.kthreads,
                if reg.bell { ", then the bell" } else { "" },
                fds.len()
            ));
        }
        let mut fds = fds.into_iter();
        let memfd = fds.next().ok_or("no region memfd")?;
        let mut eventfds: Vec<OwnedFd> = fds.collect();
        let bell = if reg.bell { eventfds.pop() } else { None };
        if let Some(b) = &bell {
            if !eventfd::is_eventfd(b.as_fd()) {
                let what = process::fd_target(b.as_fd())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|e| e.to_string());
                return Err(format!(
                    "descriptor {} (the bell) is not an eventfd but {what}",
                    want - 1
                ));
            }
        }
        for (k, e) in eventfds.iter().enumerate() {
            if !eventfd::is_eventfd(e.as_fd()) {
                let what = process::fd_target(e.as_fd())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|e| e.to_string());
                return Err(format!(
                    "descriptor {} (kthread {k}'s eventfd) is not an eventfd but {what}",
                    k + 1
                ));
            }
        }
        let region =
            Region::attach(memfd).map_err(|e| format!("descriptor 0 (the region memfd): {e}"))?;
        if region.n_kthreads() != reg.kthreads {
            return Err(format!(
                "the region has {} kthreads, the registration says {}",
                region.n_kthreads(),
                reg.kthreads
            ));
        }
        let ends = (0..reg.kthreads)
            .map(|k| region.iokernel_end(k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        if pid <= 0 {
            return Err("cannot tell the peer's pid (SO_PEERCRED)".into());
        }
        Ok((region, ends, eventfds, bell))
    }

    // Every application can have a block.
    const _EVERY_APP_HAS_A_WAKE_BLOCK: () = assert!(MAX_APPS as u32 <= ginza_shm::WAKE_PAGE_BLOCKS);

    /// The wake page and a block of it no registered application holds
    /// (there are as many blocks as applications may register), if there
    /// is a page. A block freed by an application that left may still be
    /// woken by its kthreads' leftovers: the new owner's kthreads then find
    /// no grant and sleep again.
    fn free_wake_slots(&self) -> Option<(Arc<WakePage>, u32)> {
        let page = self.wake_page.as_ref()?;
        let taken: Vec<u32> = self
            .apps
            .iter()
            .filter_map(|a| a.wake.as_ref().map(|w| w.1))
            .collect();
        (0..ginza_shm::WAKE_PAGE_BLOCKS)
            .filter_map(WakePage::block_start)
            .find(|first| !taken.contains(first))
            .map(|first| (Arc::clone(page), first))
    }

    /// A port and an ingress pool for an application that registered an
    /// address; its IP must be unique (the switch checks the MAC).
    fn attach_net(
        &mut self,
        name: &str,
        iface: ginza_net::Interface,
        region: &Region,
        steering: SteeringKind,
    ) -> Result<AppNet, String> {
        if let Some(other) = self.apps.iter().find(|a| {
            a.net.as_ref().is_some_and(|n| {
                n.interface.ip == iface.ip || n.aliases.iter().any(|x| x.ip == iface.ip)
            })
        }) {
            return Err(format!(
                "IP {} is already the address of application {:?}",
                iface.ip, other.name
            ));
        }
        self.dp
            .attach(
                name,
                iface,
                region.layout().done.capacity,
                region.n_kthreads() as usize,
                steering,
            )
            .map_err(|e| format!("network interface {} / {}: {e}", iface.mac, iface.ip))
    }

    /// A registered application's socket is readable: normally a hang-up.
    fn app_readable(&mut self, i: usize) {
        let now = clock::monotonic_ns();
        let mut buf = [0u8; MAX_REQUEST];
        let app = &mut self.apps[i];
        match socket::recv_with_fds(app.sock.as_fd(), &mut buf, 2, true) {
            Ok(None) => {}
            Ok(Some(r)) if r.closed => app.doom("connection closed".into()),
            Ok(Some(r)) => match decode_request(&buf[..r.len.min(MAX_REQUEST)]) {
                Ok(req @ (Request::Protect { .. } | Request::Unprotect { .. })) => {
                    let rep = self.protect_request(i, &req, r.fds);
                    let app = &mut self.apps[i];
                    if !Self::reply(&app.sock, &rep) {
                        app.doom("protect reply could not be sent".into());
                    }
                }
                Ok(req @ (Request::Stats | Request::ResetStats)) => {
                    let rep = self.stats_answer(&req, now);
                    let app = &mut self.apps[i];
                    if !Self::reply(&app.sock, &rep) {
                        app.doom("stats reply could not be sent".into());
                    }
                }
                Ok(Request::DirectSocket { queue }) => {
                    let rep = self.own_socket_request(i, queue, r.fds);
                    let app = &mut self.apps[i];
                    if !Self::reply(&app.sock, &rep) {
                        app.doom("direct socket reply could not be sent".into());
                    }
                }
                Ok(Request::DispatchBreakdown { name }) => {
                    let rep = self.dispatch_breakdown(&name);
                    let app = &mut self.apps[i];
                    if !Self::reply(&app.sock, &rep) {
                        app.doom("dispatch breakdown reply could not be sent".into());
                    }
                }
                Ok(Request::Kthreads { name }) => {
                    let rep = self.kthread_views(&name, now);
                    let app = &mut self.apps[i];
                    if !Self::reply(&app.sock, &rep) {
                        app.doom("kthreads reply could not be sent".into());
                    }
                }
                Ok(Request::Register(_)) => {
                    let reason = format!("already registered as app {}", app.id);
                    Self::reply(&app.sock, &Response::Refused { reason });
                }
                Err(e) => {
                    let reason = e.to_string();
                    Self::reply(
                        &app.sock,
                        &Response::Refused {
                            reason: reason.clone(),
                        },
                    );
                    warn!(
                        "app {:?}: bad request on its connection: {reason}",
                        app.name
                    );
                }
            },
            Err(e) => app.doom(format!("connection error: {e}")),
        }
    }

    /// Removes every doomed application.
    pub(super) fn reap(&mut self) {
        while let Some(i) = self.apps.iter().position(|a| a.doomed.is_some()) {
            let id = self.apps[i].id;
            let reason = self.apps[i].doomed.take().unwrap_or_default();
            self.remove(id, reason);
        }
    }

    pub(super) fn remove(&mut self, id: u64, reason: String) {
        let Some(i) = self.apps.iter().position(|a| a.id == id) else {
            return;
        };
        self.forget_doorbells_of(id);
        let app = self.apps.remove(i);
        if let Some(net) = &app.net {
            self.dp.detach(net);
        }
        // It may have been a protected application, or a netstack.
        self.rebuild_protected();
        // Cores it was still giving back are free now.
        self.ready.extend(app.kt.iter().filter_map(|k| k.handover));
        let cores: Vec<usize> = app.cores().iter().map(|&c| self.cfg.cores[c]).collect();
        info!(
            "app {:?} (id {}, pid {}) removed: {reason}; cores reclaimed: [{}]",
            app.name,
            app.id,
            app.pid,
            cpulist::format(&cores)
        );
        if let Some(d) = &app.dispatch {
            info!("app {:?}: dispatch by iokerneld: {}", app.name, d.summary());
        }
        self.disconnected += 1;
        self.actuator.app_removed(app.id, &app.name);
        if self.removals.len() == RECENT_REMOVALS {
            self.removals.pop_front();
        }
        self.removals.push_back(Removal {
            app_id: app.id,
            name: app.name,
            reason,
        });
        // Dropping `app` closes its socket and eventfds, unmaps the region
        // and frees its block of the wake page.
    }
}

/// Warns when an application of another process is in iokerneld's own
/// task group (a session's autogroup, or a cgroup): with iokerneld busy on
/// its core, that group's threads running and parking on a managed core
/// can starve everything else there, the kernel's threads included
/// (`ginza_sys::task_group`). An application in iokerneld's process (tests,
/// the demo) is left alone.
fn warn_if_sharing_task_group(name: &str, pid: i32) {
    let ours = std::process::id();
    if u32::try_from(pid).map_or(true, |pid| pid == ours) {
        return;
    }
    let (Ok(group), Ok(theirs)) = (task_group_of(ours), task_group_of(pid as u32)) else {
        return;
    };
    if let Some(warning) = sharing_warning(name, pid, &group, &theirs) {
        warn!("{warning}");
    }
}

/// The warning for an application in task group `theirs` when iokerneld
/// is in `ours`; none for different groups, or for the root group, which
/// the kernel's threads share and no session or cgroup setting changes.
fn sharing_warning(name: &str, pid: i32, ours: &TaskGroup, theirs: &TaskGroup) -> Option<String> {
    (ours == theirs && *ours != TaskGroup::Root).then(|| {
        format!(
            "app {name:?} (pid {pid}) shares {ours} with iokerneld: Linux may starve other \
             threads, the kernel's included, on the cores they share; start it in a session \
             (setsid) or cgroup of its own (docs/runtime.md, \"Task groups\")"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ginza_proto::messages::{largest_stats_report, StatsReport, MAX_REPLY};

    /// Which groups get the warning; whose group a process is in (a
    /// child in its parent's, one in a session of its own in another) is
    /// `ginza_sys::task_group`'s tests'.
    #[test]
    fn an_application_in_iokernelds_task_group_is_warned_of_and_one_elsewhere_is_not() {
        let (ours, theirs) = (TaskGroup::Autogroup(7), TaskGroup::Autogroup(8));
        let warning =
            sharing_warning("kv", 42, &ours, &ours).expect("a warning for the group shared");
        assert!(
            warning.contains("\"kv\" (pid 42)")
                && warning.contains("autogroup-7")
                && warning.contains("Task groups"),
            "{warning}"
        );
        let cgroup = TaskGroup::Cgroup("/lc".into());
        assert!(sharing_warning("kv", 42, &cgroup, &cgroup).is_some());
        assert_eq!(sharing_warning("kv", 42, &ours, &theirs), None);
        assert_eq!(sharing_warning("kv", 42, &cgroup, &ours), None);
        // The root group (a runner in no session, as CI's): nothing to change.
        let root = TaskGroup::Root;
        assert_eq!(sharing_warning("kv", 42, &root, &root), None);
    }

    /// The largest stats reply iokerneld can send (every application slot
    /// taken, the largest numbers) goes through a connection sized as
    /// iokerneld sizes them, and a client reads it whole.
    #[test]
    fn the_largest_stats_reply_goes_through_a_connection() {
        let path =
            std::env::temp_dir().join(format!("ginza-iok-reply-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = socket::listen_seqpacket(&path, 4).unwrap();
        let client = socket::connect_seqpacket(&path).unwrap();
        let server = loop {
            if let Some(s) = socket::accept(listener.as_fd()).unwrap() {
                break s;
            }
        };
        std::fs::remove_file(&path).unwrap();
        size_for_replies(&server);
        let report = largest_stats_report();
        let bytes = encode(&Response::Stats(report.clone()));
        assert!(bytes.len() < REPLY_LIMIT, "{} bytes", bytes.len());
        assert!(Iokerneld::<crate::RecordingActuator>::reply(
            &server,
            &Response::Stats(report.clone())
        ));
        let mut buf = vec![0u8; MAX_REPLY];
        let r = socket::recv_with_fds(client.as_fd(), &mut buf, 0, false)
            .unwrap()
            .unwrap();
        assert!(!r.truncated);
        assert_eq!(r.len, bytes.len());
        let back: Response = serde_json::from_slice(&buf[..r.len]).unwrap();
        let Response::Stats(back) = back else {
            panic!("not stats")
        };
        let back: StatsReport = back;
        assert_eq!(back.apps.len(), ginza_proto::messages::MAX_APPS);
        assert_eq!(back, report);
        // And any reply up to the limit: the room promised to new fields.
        let longest = vec![b' '; REPLY_LIMIT];
        socket::send_with_fds(server.as_fd(), &longest, &[]).unwrap();
        let r = socket::recv_with_fds(client.as_fd(), &mut buf, 0, false)
            .unwrap()
            .unwrap();
        assert_eq!((r.len, r.truncated), (REPLY_LIMIT, false));
        eprintln!("largest stats reply: {} bytes", bytes.len());
    }
}
