//! The Ginza socket object of the preload library: one open file
//! description, shared by the numbers `dup` made of it (`socket.rs` makes
//! and serves them, `sockio.rs` reads and writes them, `epoll.rs` and
//! `pollset.rs` watch them), and the errno of a runtime error.

use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use ginza_runtime::net::{KeepAlive, PollSource, TcpListener, TcpStream, UdpSocket};
use libc::c_int;

use crate::mode::set_errno;

/// An epoll instance watching sockets (`epoll.rs`), as the socket sees it.
pub(crate) trait Watcher: Send + Sync {
    /// Number `fd`'s socket is now served by the runtime: watch that.
    fn attach(&self, fd: c_int, s: &GSock);
    /// Number `fd`'s socket `s` closed: out of the set, as Linux does
    /// (unless the number names another socket in the set by now).
    fn forget(&self, fd: c_int, s: &GSock);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Stream,
    Datagram,
}

/// What the runtime serves for the socket, once it is decided.
#[derive(Clone)]
pub(crate) enum Served {
    None,
    Listener(Arc<TcpListener>),
    Stream(Arc<TcpStream>),
    Udp(Arc<UdpSocket>),
}

pub(crate) struct State {
    /// What `bind` gave (0.0.0.0 or the Ginza address).
    pub(crate) bound: Option<SocketAddrV4>,
    /// A bound stream's port, held from `bind` (so a port in use fails
    /// there, as on Linux) until `listen` serves it.
    pub(crate) reserved: Option<TcpListener>,
    pub(crate) served: Served,
    /// A non-blocking `connect` has not been reported finished yet.
    pub(crate) connecting: bool,
    /// What the program set; applied to a stream when it exists.
    pub(crate) nodelay: Option<bool>,
    pub(crate) read_timeout: Option<Duration>,
    pub(crate) write_timeout: Option<Duration>,
    /// SO_KEEPALIVE with TCP_KEEPIDLE/KEEPINTVL/KEEPCNT, once the program
    /// set any of them (`Some(None)`: turned off).
    pub(crate) keepalive: Option<Option<KeepAlive>>,
}

/// A Ginza socket: one open file description, shared by the numbers
/// `dup` made of it.
pub(crate) struct GSock {
    pub(crate) kind: Kind,
    /// `O_NONBLOCK` of the description (`fcntl`, `FIONBIO`, `SOCK_NONBLOCK`).
    pub(crate) nonblocking: AtomicBool,
    /// A reset was reported (ECONNRESET): Linux reports it once, then
    /// reads give 0.
    pub(crate) reset_reported: AtomicBool,
    pub(crate) state: Mutex<State>,
    /// Epoll instances it is registered with, and under which number.
    watchers: Mutex<Vec<(Weak<dyn Watcher>, c_int)>>,
}

impl Drop for GSock {
    fn drop(&mut self) {
        // The last number closed: as Linux does, leave every epoll set.
        let watchers = std::mem::take(&mut *lock(&self.watchers));
        for (set, fd) in watchers {
            if let Some(set) = set.upgrade() {
                set.forget(fd, self);
            }
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GSock {
    pub(crate) fn new(kind: Kind, nonblocking: bool, served: Served) -> Arc<GSock> {
        Arc::new(GSock {
            kind,
            nonblocking: AtomicBool::new(nonblocking),
            reset_reported: AtomicBool::new(false),
            state: Mutex::new(State {
                bound: None,
                reserved: None,
                served,
                connecting: false,
                nodelay: None,
                read_timeout: None,
                write_timeout: None,
                keepalive: None,
            }),
            watchers: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn served(&self) -> Served {
        lock(&self.state).served.clone()
    }

    pub(crate) fn is_nonblocking(&self) -> bool {
        self.nonblocking.load(Relaxed)
    }

    pub(crate) fn watched_by(&self, set: Weak<dyn Watcher>, fd: c_int) {
        lock(&self.watchers).push((set, fd));
    }

    pub(crate) fn unwatched_by(&self, set: &dyn Watcher, fd: c_int) {
        let set = set as *const dyn Watcher as *const ();
        lock(&self.watchers).retain(|(s, f)| !(*f == fd && s.as_ptr() as *const () == set));
    }

    /// Now served by the runtime: every epoll set watching it registers
    /// the runtime's socket.
    pub(crate) fn attach(&self, served: Served) {
        lock(&self.state).served = served;
        let watchers = lock(&self.watchers).clone();
        for (set, fd) in watchers {
            if let Some(set) = set.upgrade() {
                set.attach(fd, self);
            }
        }
    }

    /// Whether a non-blocking connect is in flight (for `connect` again).
    pub(crate) fn connecting(&self) -> bool {
        lock(&self.state).connecting
    }

    /// SO_ERROR: a finished non-blocking connect's error, once.
    pub(crate) fn take_error(&self) -> c_int {
        let mut st = lock(&self.state);
        let Served::Stream(s) = st.served.clone() else {
            return 0;
        };
        match s.take_error() {
            Ok(Some(e)) => {
                st.connecting = false;
                errno_of(&e)
            }
            Ok(None) => {
                if st.connecting && s.peer_addr().is_ok() && established(&s) {
                    st.connecting = false;
                }
                0
            }
            Err(e) => errno_of(&e),
        }
    }
}

pub(crate) fn established(s: &TcpStream) -> bool {
    s.readiness().writable
}

/// The errno Linux gives for `e`.
pub(crate) fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock | K::TimedOut => libc::EAGAIN,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionReset => libc::ECONNRESET,
        K::ConnectionAborted => libc::ECONNABORTED,
        K::BrokenPipe => libc::EPIPE,
        K::NotConnected => libc::ENOTCONN,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput => libc::EINVAL,
        K::OutOfMemory => libc::ENOMEM,
        K::Unsupported => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

/// A call's outcome for C: the value, or -1 with errno.
pub(crate) fn to_c(r: Result<c_int, c_int>) -> c_int {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// The runtime object a Ginza socket is served by, as a poll source.
pub(crate) fn with_source<R>(served: &Served, f: impl FnOnce(&dyn PollSource) -> R) -> Option<R> {
    match served {
        Served::Listener(l) => Some(f(&**l)),
        Served::Stream(t) => Some(f(&**t)),
        Served::Udp(u) => Some(f(&**u)),
        Served::None => None,
    }
}
