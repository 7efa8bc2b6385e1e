//! The attach socket (docs/protected.md, "Attach"): a unix SOCK_SEQPACKET
//! listener; each connection carries one `AttachRequest` (JSON) with the
//! application's tx pool memfd (and doorbells), answered by an
//! `AttachReply` with the channel memfd and the read-only rx pool. The
//! connection then stays open: its hang-up (the application exited or was
//! killed) detaches the application.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ginza_net::{Interface, Ipv4Addr};
use ginza_proto::netstack::{AttachReply, AttachRequest, MAX_ATTACH_MESSAGE, NETSTACK_PROTOCOL};
use ginza_shm::netstack::TxPoolView;
use ginza_sys::{poll, socket};
use log::{info, warn};

use crate::engine::{Attachment, Netstack};

/// Who may attach and at which address.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub path: PathBuf,
    /// The netstack's own interface: an application asking for address
    /// 0.0.0.0 (or this IP) shares it (ports first come, first served).
    pub interface: Interface,
    /// Serve other addresses too (needs iokerneld to steer them to the
    /// netstack; docs/protected.md, "Addresses").
    pub other_addresses: bool,
}

/// Attached applications' sockets, by app id.
pub struct Server {
    cfg: ServerConfig,
    listener: OwnedFd,
    attached: Vec<(u64, OwnedFd)>,
    iokerneld: Option<Iokerneld>,
}

/// The netstack's registration with iokerneld, to hand it each channel
/// (docs/protected.md, "Wake-ups").
pub struct Iokerneld {
    pub conn: Arc<Mutex<ginza_proto::client::Connection>>,
    /// Set once iokerneld took a channel: it wakes the kthreads for
    /// commands, they need not poll.
    pub watches_channels: Arc<std::sync::atomic::AtomicBool>,
    /// Hand iokerneld the tx pools too and send payload zero-touch.
    pub zero_touch: bool,
}

fn refuse(sock: BorrowedFd<'_>, reason: String) {
    warn!("attach refused: {reason}");
    let body = serde_json::to_vec(&AttachReply::Refused { reason }).unwrap_or_default();
    let _ = socket::send_with_fds(sock, &body, &[]);
}

impl Server {
    /// Binds the attach socket (a stale socket file is replaced).
    pub fn bind(cfg: ServerConfig) -> std::io::Result<Server> {
        if let Some(dir) = cfg.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        if cfg.path.exists() {
            if socket::connect_seqpacket(&cfg.path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("a netstack already listens on {}", cfg.path.display()),
                ));
            }
            std::fs::remove_file(&cfg.path)?;
        }
        let listener = socket::listen_seqpacket(&cfg.path, 64)?;
        Ok(Server {
            cfg,
            listener,
            attached: Vec::new(),
            iokerneld: None,
        })
    }

    /// Hands every attached application's channel to iokerneld from now on.
    pub fn with_iokerneld(mut self, io: Iokerneld) -> Server {
        self.iokerneld = Some(io);
        self
    }

    fn unprotect(&self, id: u64) {
        if let Some(io) = &self.iokerneld {
            let conn = io.conn.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = conn.unprotect(id) {
                warn!("iokerneld did not forget app {id}'s channel: {e}");
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.cfg.path
    }

    /// Attached applications now.
    pub fn attached(&self) -> usize {
        self.attached.len()
    }

    /// Waits up to `timeout` for attach requests and hang-ups and handles
    /// them; also closes the sockets of applications the engine cut off.
    pub fn poll(&mut self, engine: &Arc<Mutex<Netstack>>, timeout: Duration) {
        let mut fds = vec![libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        fds.extend(self.attached.iter().map(|(_, s)| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        if poll::poll_raw(&mut fds, Some(timeout)).unwrap_or(0) > 0 {
            if fds[0].revents & libc::POLLIN != 0 {
                while let Ok(Some(sock)) = socket::accept(self.listener.as_fd()) {
                    self.admit(engine, sock);
                }
            }
            let gone: Vec<u64> = self
                .attached
                .iter()
                .zip(&fds[1..])
                .filter(|(_, p)| p.revents != 0)
                .map(|((id, _), _)| *id)
                .collect();
            for id in gone {
                info!("app {id} hung up");
                lock(engine).detach(id);
                self.unprotect(id);
                self.attached.retain(|(a, _)| *a != id);
            }
        }
        let doomed = lock(engine).take_doomed();
        for (id, why) in doomed {
            info!("app {id} cut off: {why}");
            self.unprotect(id);
            self.attached.retain(|(a, _)| *a != id);
        }
    }

    fn admit(&mut self, engine: &Arc<Mutex<Netstack>>, sock: OwnedFd) {
        // A client connects and sends at once; one that does not within a
        // moment is refused rather than waited for.
        let ready = poll::poll_one(
            sock.as_fd(),
            poll::PollFlags::IN,
            Some(Duration::from_millis(500)),
        );
        if !ready.is_ok_and(|r| !r.is_empty()) {
            return refuse(sock.as_fd(), "no attach request within 500 ms".into());
        }
        let mut buf = vec![0u8; MAX_ATTACH_MESSAGE];
        let got = match socket::recv_with_fds(sock.as_fd(), &mut buf, 1 + 64, true) {
            Ok(Some(g)) if !g.closed => g,
            _ => return,
        };
        if got.truncated || got.fds_truncated {
            return refuse(sock.as_fd(), "attach request too long".into());
        }
        let req: AttachRequest = match serde_json::from_slice(&buf[..got.len]) {
            Ok(r) => r,
            Err(e) => return refuse(sock.as_fd(), format!("malformed attach request: {e}")),
        };
        if req.protocol != NETSTACK_PROTOCOL {
            return refuse(
                sock.as_fd(),
                format!(
                    "protocol {}, this netstack speaks {NETSTACK_PROTOCOL}",
                    req.protocol
                ),
            );
        }
        let mut fds = got.fds.into_iter();
        let Some(tx_fd) = fds.next() else {
            return refuse(sock.as_fd(), "no tx pool memfd attached".into());
        };
        let doorbells: Vec<OwnedFd> = fds.collect();
        if req.doorbells == doorbells.is_empty() {
            return refuse(
                sock.as_fd(),
                format!(
                    "doorbells {} but {} eventfds attached",
                    req.doorbells,
                    doorbells.len()
                ),
            );
        }
        if doorbells.iter().any(|d| !ginza_sys::eventfd::is_eventfd(d)) {
            return refuse(sock.as_fd(), "a doorbell is not an eventfd".into());
        }
        let own = self.cfg.interface;
        let interface = if req.interface.ip == Ipv4Addr::UNSPECIFIED || req.interface.ip == own.ip {
            own
        } else if self.cfg.other_addresses || self.iokerneld.is_some() {
            req.interface
        } else {
            return refuse(
                sock.as_fd(),
                format!(
                    "address {}: this netstack serves protected applications at its own address {} \
                     (ask for 0.0.0.0 or {}); other addresses need iokerneld to steer them here",
                    req.interface.ip, own.ip, own.ip
                ),
            );
        };
        let tx_pool = match TxPoolView::map(tx_fd) {
            Ok(t) => t,
            Err(e) => return refuse(sock.as_fd(), format!("tx pool refused: {e}")),
        };
        let pid = socket::peer_pid(sock.as_fd()).unwrap_or(0);
        let granted = lock(engine).attach(Attachment {
            name: req.name.clone(),
            pid,
            interface,
            kthreads: req.kthreads,
            tx_pool,
            doorbells,
        });
        let g = match granted {
            Ok(g) => g,
            Err(e) => return refuse(sock.as_fd(), e),
        };
        // iokerneld first: it steers the address (if the application has
        // its own), watches the channel, maps the tx pool for zero-touch.
        if let Some(io) = &self.iokerneld {
            let own_address = interface.ip == own.ip;
            let alias = (!own_address).then_some(interface);
            let r = io.conn.lock().unwrap_or_else(|p| p.into_inner()).protect(
                pid,
                &req.name,
                g.app_id,
                g.channel_handle.fd(),
                io.zero_touch.then(|| g.tx_pool.as_fd()),
                alias,
            );
            match r {
                Ok(()) => {
                    io.watches_channels
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    if io.zero_touch {
                        lock(engine).set_zero_touch(g.app_id);
                    }
                }
                // Its own address cannot reach it without iokerneld.
                Err(e) if !own_address => {
                    lock(engine).detach(g.app_id);
                    return refuse(
                        sock.as_fd(),
                        format!("iokerneld would not steer {} here: {e}", interface.ip),
                    );
                }
                Err(e) => warn!(
                    "iokerneld does not watch {}'s channel ({e}): the netstack polls it",
                    req.name
                ),
            }
        }
        let reply = AttachReply::Accepted {
            app_id: g.app_id,
            pairs: g.pairs,
            ring_capacity: g.ring_capacity,
            rx_pool_bytes: g.rx_pool_bytes,
            send_queue_bytes: g.send_queue_bytes,
        };
        let body = serde_json::to_vec(&reply).unwrap_or_default();
        if let Err(e) =
            socket::send_with_fds(sock.as_fd(), &body, &[g.channel.as_fd(), g.rx_pool.as_fd()])
        {
            warn!("cannot answer {}: {e}", req.name);
            lock(engine).detach(g.app_id);
            self.unprotect(g.app_id);
            return;
        }
        self.attached.push((g.app_id, sock));
    }
}

/// The engine's lock; a panic elsewhere does not stop the netstack.
pub fn lock(engine: &Mutex<Netstack>) -> std::sync::MutexGuard<'_, Netstack> {
    engine.lock().unwrap_or_else(|p| p.into_inner())
}
