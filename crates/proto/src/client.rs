//! The runtime's side of registration, and a stats reader.
//!
//! ```no_run
//! use ginza_proto::client;
//! use ginza_proto::messages::{Class, Registration};
//! use ginza_shm::{Region, RegionConfig};
//! use ginza_sys::eventfd;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let region = Region::create("app", &RegionConfig::new(2))?;
//! let efds = [eventfd::new()?, eventfd::new()?];
//! let reg = Registration { name: "app".into(), class: Class::Batch, guaranteed: 0, max_cores: 2, kthreads: 2, net: None, steering: None, dispatch: None, wake_page: false, bell: false };
//! let conn = client::register_region("/tmp/ginza-1000/iokerneld.sock".as_ref(), &reg, &region, &efds)?;
//! println!("registered as app {}", conn.app_id());
//! drop(conn); // deregisters
//! # Ok(()) }
//! ```

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ginza_shm::{IngressPool, Region, WakePage};
use ginza_sys::poll::{poll_one, PollFlags};
use ginza_sys::{process, socket};

use crate::messages::{
    encode, Envelope, KthreadView, Registration, Request, Response, SojournBand, StatsReport,
    MAX_REPLY, PROTOCOL_VERSION,
};

/// Where a system-wide iokerneld listens: the one the systemd unit of
/// `packaging/` starts (its `RuntimeDirectory` is `/run/ginza`).
pub const SYSTEM_SOCKET_PATH: &str = "/run/ginza/iokerneld.sock";

/// The per-user control socket, where iokerneld listens unless told
/// otherwise: `$XDG_RUNTIME_DIR/ginza/iokerneld.sock`, else
/// `/tmp/ginza-<uid>/iokerneld.sock`.
pub fn user_socket_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Path::new(&d).join("ginza").join("iokerneld.sock"),
        None => PathBuf::from(format!("/tmp/ginza-{}", process::getuid())).join("iokerneld.sock"),
    }
}

/// The socket a client (an application, `ginza top`, `ginza doctor`)
/// connects to unless told otherwise: the per-user socket
/// ([`user_socket_path`]) if one exists, else the system-wide one
/// ([`SYSTEM_SOCKET_PATH`]) if that exists, else the per-user path (a
/// failed connect then names it). A user's own iokerneld thus wins over
/// the service.
pub fn default_socket_path() -> PathBuf {
    choose_socket(user_socket_path(), Path::new(SYSTEM_SOCKET_PATH))
}

fn choose_socket(user: PathBuf, system: &Path) -> PathBuf {
    if !user.exists() && system.exists() {
        system.to_path_buf()
    } else {
        user
    }
}

/// How long a client waits for iokerneld's answer.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why registration (or a stats query) failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to iokerneld at {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("iokerneld refused the registration: {reason}")]
    Refused { reason: String },
    #[error("sending to iokerneld: {0}")]
    Send(#[source] io::Error),
    #[error("receiving from iokerneld: {0}")]
    Recv(#[source] io::Error),
    #[error("iokerneld did not answer within {0:?}")]
    Timeout(Duration),
    #[error("iokerneld closed the connection without answering")]
    Closed,
    #[error("unexpected answer from iokerneld: {0}")]
    BadReply(String),
    #[error("the region has no memfd (a heap region cannot be shared)")]
    NoMemfd,
    #[error("iokerneld's ingress pool: {0}")]
    IngressPool(String),
    #[error("iokerneld's wake page: {0}")]
    WakePage(String),
    #[error("the application's side: {0}")]
    Local(String),
}

/// A registered application. Keep it alive as long as the application runs:
/// dropping it closes the socket, which deregisters the application and
/// gives its cores back.
#[derive(Debug)]
pub struct Connection {
    sock: OwnedFd,
    app_id: u64,
    ingress: Option<IngressPool>,
    wake: Option<(WakePage, u32)>,
    busy_time: bool,
}

impl Connection {
    /// The id iokerneld gave this application.
    pub fn app_id(&self) -> u64 {
        self.app_id
    }

    /// The ingress pool iokerneld sent (registered with `net`), mapped
    /// read-only; `None` after the first call or without networking.
    pub fn take_ingress_pool(&mut self) -> Option<IngressPool> {
        self.ingress.take()
    }

    /// Whether iokerneld's allocator reads the kthreads' busy time (so the
    /// runtime keeps it); true where iokerneld did not say.
    pub fn reads_busy_time(&self) -> bool {
        self.busy_time
    }

    /// The wake page iokerneld sent (registered with `wake_page`), mapped
    /// read-only, and the slot of kthread 0 (kthread `k` sleeps on the
    /// slot after it by `k`); `None` after the first call, or from an
    /// iokerneld without one.
    pub fn take_wake_page(&mut self) -> Option<(WakePage, u32)> {
        self.wake.take()
    }

    /// A second descriptor of the connection's socket, for a thread that
    /// waits for iokerneld's hang-up (`poll` reports it unasked). It keeps
    /// the socket open: close it before counting on the connection's drop
    /// to deregister.
    pub fn socket_clone(&self) -> std::io::Result<OwnedFd> {
        self.sock.try_clone()
    }

    /// Whether iokerneld closed the connection (it exited, or removed this
    /// application). Does not block.
    pub fn closed_by_iokerneld(&self) -> bool {
        match poll_one(self.sock.as_fd(), PollFlags::IN, Some(Duration::ZERO)) {
            Ok(ready) => ready.intersects(PollFlags::HUP | PollFlags::ERR),
            Err(_) => true,
        }
    }

    /// Protected mode, from the netstack: asks iokerneld to read
    /// `channel`'s rings in its allocation pass (`Request::Protect`);
    /// `app_name` is the application's name at the netstack, which tells
    /// it apart from other applications of the same pid.
    /// With `interface`, iokerneld steers that address to the netstack too;
    /// with `tx_pool` (the application's), it can assemble zero-touch
    /// frames (`ginza_shm::netstack::gather`).
    pub fn protect(
        &self,
        app_pid: i32,
        app_name: &str,
        link: u64,
        channel: BorrowedFd<'_>,
        tx_pool: Option<BorrowedFd<'_>>,
        interface: Option<ginza_net::Interface>,
    ) -> Result<(), ClientError> {
        let mut fds = vec![channel];
        fds.extend(tx_pool);
        self.ask(
            Request::Protect {
                app_pid,
                app_name: Some(app_name.to_string()),
                link,
                interface,
            },
            &fds,
        )
    }

    /// Undoes [`Connection::protect`] for `link`.
    pub fn unprotect(&self, link: u64) -> Result<(), ClientError> {
        self.ask(Request::Unprotect { link }, &[])
    }

    /// The direct path (docs/direct-path.md): hands iokerneld `socket`,
    /// this application's own AF_XDP socket bound to receive queue `queue`
    /// of iokerneld's interface (`Request::DirectSocket`); from the answer
    /// on, its frames that arrive on that queue go to the socket.
    pub fn attach_direct_socket(
        &self,
        queue: u32,
        socket: BorrowedFd<'_>,
    ) -> Result<(), ClientError> {
        self.ask(Request::DirectSocket { queue }, &[socket])
    }

    fn ask(&self, request: Request, fds: &[BorrowedFd<'_>]) -> Result<(), ClientError> {
        let env = Envelope {
            protocol: PROTOCOL_VERSION,
            request,
        };
        send_raw(self.sock.as_fd(), &encode(&env), fds)?;
        match recv_response_with_fds(self.sock.as_fd(), 0)?.0 {
            Response::Accepted { .. } => Ok(()),
            Response::Refused { reason } => Err(ClientError::Refused { reason }),
            other => Err(ClientError::BadReply(format!("{other:?}"))),
        }
    }
}

impl AsFd for Connection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// Sends one envelope with `fds` and waits for the answer; returns the
/// socket (still connected) and the answer.
pub fn request(
    socket: &Path,
    env: &Envelope,
    fds: &[BorrowedFd<'_>],
) -> Result<(OwnedFd, Response), ClientError> {
    request_with_fds(socket, env, fds, 0).map(|(sock, resp, _)| (sock, resp))
}

/// [`request`], accepting up to `max_fds` descriptors with the answer.
fn request_with_fds(
    socket: &Path,
    env: &Envelope,
    fds: &[BorrowedFd<'_>],
    max_fds: usize,
) -> Result<(OwnedFd, Response, Vec<OwnedFd>), ClientError> {
    let sock = connect(socket)?;
    send_raw(sock.as_fd(), &encode(env), fds)?;
    let (resp, fds) = recv_response_with_fds(sock.as_fd(), max_fds)?;
    Ok((sock, resp, fds))
}

/// Sends raw bytes (any bytes: tests send malformed ones) with `fds`.
pub fn send_raw(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), ClientError> {
    socket::send_with_fds(sock, bytes, fds).map_err(ClientError::Send)
}

/// Connects without sending anything (tests send raw bytes with
/// [`send_raw`], then read with [`recv_response`]).
pub fn connect(socket: &Path) -> Result<OwnedFd, ClientError> {
    socket::connect_seqpacket(socket).map_err(|source| ClientError::Connect {
        path: socket.to_path_buf(),
        source,
    })
}

/// Waits (at most [`REPLY_TIMEOUT`]) for one answer.
pub fn recv_response(sock: BorrowedFd<'_>) -> Result<Response, ClientError> {
    recv_response_with_fds(sock, 0).map(|(r, _)| r)
}

/// [`recv_response`], accepting up to `max_fds` attached descriptors.
fn recv_response_with_fds(
    sock: BorrowedFd<'_>,
    max_fds: usize,
) -> Result<(Response, Vec<OwnedFd>), ClientError> {
    let deadline = std::time::Instant::now() + REPLY_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout(REPLY_TIMEOUT));
        }
        if !poll_one(sock, PollFlags::IN, Some(left))
            .map_err(ClientError::Recv)?
            .is_empty()
        {
            break;
        }
    }
    let mut buf = vec![0u8; MAX_REPLY];
    let r = socket::recv_with_fds(sock, &mut buf, max_fds, true)
        .map_err(ClientError::Recv)?
        .ok_or(ClientError::Closed)?;
    if r.closed {
        return Err(ClientError::Closed);
    }
    if r.truncated {
        return Err(ClientError::BadReply(format!(
            "answer longer than {MAX_REPLY} bytes"
        )));
    }
    let resp =
        serde_json::from_slice(&buf[..r.len]).map_err(|e| ClientError::BadReply(e.to_string()))?;
    Ok((resp, r.fds))
}

/// Registers with an explicit envelope and descriptors (the region's memfd
/// first, then one eventfd per kthread). Tests use it to send a wrong
/// version or a wrong number of descriptors.
pub fn register_with(
    socket: &Path,
    env: &Envelope,
    fds: &[BorrowedFd<'_>],
) -> Result<Connection, ClientError> {
    // The acceptance carries the ingress pool's memfd and the wake page's,
    // each if any, in that order.
    let (sock, resp, fds) = request_with_fds(socket, env, fds, 2)?;
    let kthreads = match &env.request {
        Request::Register(r) => r.kthreads,
        _ => 0,
    };
    match resp {
        Response::Accepted {
            app_id,
            ingress_buffers,
            wake_slots,
            busy_time,
        } => {
            let want = usize::from(ingress_buffers > 0) + usize::from(wake_slots.is_some());
            if fds.len() != want {
                return Err(ClientError::BadReply(format!(
                    "accepted with {want} descriptors announced (ingress pool, wake page) but {} attached",
                    fds.len()
                )));
            }
            let mut fds = fds.into_iter();
            let ingress = match ingress_buffers {
                0 => None,
                n => Some(
                    IngressPool::map_read_only(fds.next().expect("counted above"), n)
                        .map_err(|e| ClientError::IngressPool(e.to_string()))?,
                ),
            };
            let wake = match wake_slots {
                None => None,
                Some(first) if !WakePage::holds(first, kthreads) => {
                    return Err(ClientError::WakePage(format!(
                        "slots {first}.. for {kthreads} kthreads are outside the page"
                    )))
                }
                Some(first) => Some((
                    WakePage::map_read_only(fds.next().expect("counted above"))
                        .map_err(|e| ClientError::WakePage(e.to_string()))?,
                    first,
                )),
            };
            Ok(Connection {
                sock,
                app_id,
                ingress,
                wake,
                busy_time: busy_time.unwrap_or(true),
            })
        }
        Response::Refused { reason } => Err(ClientError::Refused { reason }),
        other => Err(ClientError::BadReply(format!("{other:?}"))),
    }
}

/// Registers an application: sends `reg` with the region's memfd and the
/// kthreads' eventfds (in kthread order).
pub fn register<F: AsFd>(
    socket: &Path,
    reg: &Registration,
    region_memfd: BorrowedFd<'_>,
    eventfds: &[F],
) -> Result<Connection, ClientError> {
    let mut fds = vec![region_memfd];
    fds.extend(eventfds.iter().map(AsFd::as_fd));
    let env = Envelope {
        protocol: PROTOCOL_VERSION,
        request: Request::Register(reg.clone()),
    };
    register_with(socket, &env, &fds)
}

/// [`register`] with a [`Region`] created by `Region::create`.
pub fn register_region<F: AsFd>(
    socket: &Path,
    reg: &Registration,
    region: &Region,
    eventfds: &[F],
) -> Result<Connection, ClientError> {
    let fd = region.fd().ok_or(ClientError::NoMemfd)?;
    register(socket, reg, fd, eventfds)
}

/// Asks iokerneld for its stats.
pub fn stats(socket: &Path) -> Result<StatsReport, ClientError> {
    stats_request(socket, Request::Stats)
}

/// Ends iokerneld's stats window ([`StatsReport::alloc`]) and starts a new
/// one (a benchmark calls it after its warm-up). Returns the stats of the
/// window that ended.
pub fn reset_stats(socket: &Path) -> Result<StatsReport, ClientError> {
    stats_request(socket, Request::ResetStats)
}

/// Where the time of the requests of the dispatched application `name`
/// went, by sojourn band (docs/colocate.md).
pub fn dispatch_breakdown(socket: &Path, name: &str) -> Result<Vec<SojournBand>, ClientError> {
    let env = Envelope {
        protocol: PROTOCOL_VERSION,
        request: Request::DispatchBreakdown { name: name.into() },
    };
    match request(socket, &env, &[])?.1 {
        Response::DispatchBreakdown { bands } => Ok(bands),
        Response::Refused { reason } => Err(ClientError::Refused { reason }),
        other => Err(ClientError::BadReply(format!("{other:?}"))),
    }
}

/// Each kthread of application `name` as iokerneld sees it now.
pub fn kthreads(socket: &Path, name: &str) -> Result<Vec<KthreadView>, ClientError> {
    let env = Envelope {
        protocol: PROTOCOL_VERSION,
        request: Request::Kthreads { name: name.into() },
    };
    match request(socket, &env, &[])?.1 {
        Response::Kthreads { kthreads } => Ok(kthreads),
        Response::Refused { reason } => Err(ClientError::Refused { reason }),
        other => Err(ClientError::BadReply(format!("{other:?}"))),
    }
}

fn stats_request(socket: &Path, req: Request) -> Result<StatsReport, ClientError> {
    let env = Envelope {
        protocol: PROTOCOL_VERSION,
        request: req,
    };
    match request(socket, &env, &[])?.1 {
        Response::Stats(s) => Ok(s),
        Response::Refused { reason } => Err(ClientError::Refused { reason }),
        other => Err(ClientError::BadReply(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_socket_wins_over_the_system_one_when_it_exists() {
        let dir = std::env::temp_dir().join(format!("ginza-socket-choice-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let user = dir.join("user.sock");
        let system = dir.join("system.sock");
        // Neither exists: the per-user path, which a failed connect names.
        assert_eq!(choose_socket(user.clone(), &system), user);
        std::fs::write(&system, b"").unwrap();
        assert_eq!(choose_socket(user.clone(), &system), system);
        std::fs::write(&user, b"").unwrap();
        assert_eq!(choose_socket(user.clone(), &system), user);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
