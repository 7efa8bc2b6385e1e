//! Test hooks: a fake netstack that speaks the backend's [`Wire`] in
//! process, so the protected sockets and the asynchronous API can be
//! tested without a netstack process. A test makes a [`FakeNetstack`] for
//! a socket path, runs a runtime with `Config::protected` naming that path
//! (the attach finds the fake instead of connecting), and plays the
//! network: connections come in ([`FakeNetstack::connect_in`]), bytes are
//! delivered into the real read-only receive pool ([`FakePeer::deliver`]),
//! what the application sends is read from its tx pool memfd the way the
//! netstack reads it — through the file, never writing it — and
//! acknowledged at once.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::net::SocketAddrV4;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ginza_proto::netstack::{ConnId, ListenId};
use ginza_shm::netstack::{RxPool, RxPoolView, RX_CHUNK};

use super::wire::{Command, Event, PushError, Range, Ranges, Reason, Wire};

/// Receive chunks in the fake's pool.
const RX_BUFFERS: u32 = 1024;

fn registry() -> &'static Mutex<HashMap<PathBuf, Arc<FakeState>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Arc<FakeState>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// A connection as the fake network sees it.
#[derive(Default)]
struct PeerConn {
    /// What the application sent, in order.
    received: Vec<u8>,
    /// The application shut down writing or closed.
    app_shut: bool,
    app_closed: bool,
    /// Receive ranges lent with `NewData`.
    lent: Vec<Range>,
    accepted: bool,
}

struct State {
    commands: Vec<VecDeque<Command>>,
    events: Vec<VecDeque<Event>>,
    rx_pool: RxPool,
    free_rx: Vec<u32>,
    conns: HashMap<u32, PeerConn>,
    /// (port, listener id, the pair that sent `Listen`).
    listening: Vec<(u16, u32, usize)>,
    next_id: u32,
    /// The application's tx pool, read through the file.
    tx: Option<File>,
    /// Commands the fake refused (bad offsets, unknown ids), with why.
    refused: Vec<String>,
    /// Outgoing connects: id, the pair that asked, the destination.
    connects: Vec<(u32, usize, SocketAddrV4)>,
    refuse_connects: bool,
    /// `DataAcked` events held back (the peer does not acknowledge yet).
    hold_acks: bool,
    held: Vec<(usize, Event)>,
}

/// The fake's state, shared between the test and the application's wire.
pub(crate) struct FakeState {
    state: Mutex<State>,
    changed: Condvar,
    gone: AtomicBool,
    ring_capacity: usize,
    rings: usize,
    /// Pushes refused because a command ring was full.
    full: AtomicU64,
}

/// A fake netstack registered for a socket path.
pub struct FakeNetstack {
    path: PathBuf,
    shared: Arc<FakeState>,
    service: Option<std::thread::JoinHandle<()>>,
}

/// One connection of the fake network.
pub struct FakePeer {
    shared: Arc<FakeState>,
    pub id: u32,
    pub ring: usize,
}

impl FakeNetstack {
    /// A fake for runtimes of `rings` kthreads (one ring pair each) whose
    /// command rings hold `ring_capacity` commands, for runtimes configured
    /// with `path`.
    pub fn new(path: impl AsRef<Path>, rings: usize, ring_capacity: usize) -> FakeNetstack {
        let rx_pool = RxPool::create("ginza-fake-netstack-rx", RX_BUFFERS)
            .expect("creating the fake's receive pool");
        let shared = Arc::new(FakeState {
            state: Mutex::new(State {
                commands: (0..rings).map(|_| VecDeque::new()).collect(),
                events: (0..rings).map(|_| VecDeque::new()).collect(),
                rx_pool,
                free_rx: (0..RX_BUFFERS).rev().collect(),
                conns: HashMap::new(),
                listening: Vec::new(),
                next_id: 1,
                tx: None,
                refused: Vec::new(),
                connects: Vec::new(),
                refuse_connects: false,
                hold_acks: false,
                held: Vec::new(),
            }),
            changed: Condvar::new(),
            gone: AtomicBool::new(false),
            ring_capacity,
            rings,
            full: AtomicU64::new(0),
        });
        let path = path.as_ref().to_path_buf();
        registry()
            .lock()
            .unwrap()
            .insert(path.clone(), Arc::clone(&shared));
        let s = Arc::clone(&shared);
        let service = std::thread::spawn(move || serve(&s));
        FakeNetstack {
            path,
            shared,
            service: Some(service),
        }
    }

    /// Waits (up to 10 s, else panics) until `cond` holds of the fake's
    /// state, re-checked at every change.
    fn wait(&self, what: &str, mut cond: impl FnMut(&State) -> bool) {
        wait_for(&self.shared, what, |s| cond(s));
    }

    /// Waits until the application listens on `port`.
    pub fn wait_listening(&self, port: u16) {
        self.wait("the application to listen", |s| {
            s.listening.iter().any(|l| l.0 == port)
        });
    }

    /// A connection from `remote` to the application's `port`.
    pub fn connect_in(&self, port: u16, remote: SocketAddrV4) -> FakePeer {
        let mut s = self.shared.state.lock().unwrap();
        let id = s.next_id;
        s.next_id += 1;
        let &(_, listener, ring) = s
            .listening
            .iter()
            .find(|l| l.0 == port)
            .expect("connect_in to a port the application listens on");
        s.conns.insert(id, PeerConn::default());
        s.events[ring].push_back(Event::NewConn {
            conn: conn_id(id),
            listener: ListenId::new(listener).expect("non-zero"),
            remote,
        });
        drop(s);
        self.shared.changed.notify_all();
        FakePeer {
            shared: Arc::clone(&self.shared),
            id,
            ring,
        }
    }

    /// Waits for the application's next outgoing connect; its peer end.
    pub fn accept_out(&self) -> (FakePeer, SocketAddrV4) {
        let mut got = None;
        self.wait("an outgoing connect", |s| {
            got = s.connects.first().copied();
            got.is_some()
        });
        let (id, ring, to) = got.expect("waited for");
        self.shared.state.lock().unwrap().connects.remove(0);
        let peer = FakePeer {
            shared: Arc::clone(&self.shared),
            id,
            ring,
        };
        (peer, to)
    }

    /// Acknowledgements are held back from now on (`true`), or sent, the
    /// held ones first (`false`).
    pub fn hold_acks(&self, hold: bool) {
        let mut s = self.shared.state.lock().unwrap();
        s.hold_acks = hold;
        if !hold {
            let held = std::mem::take(&mut s.held);
            for (ring, e) in held {
                s.events[ring].push_back(e);
            }
        }
        drop(s);
        self.shared.changed.notify_all();
    }

    /// Connects are refused (`ConnectionRefused`) from now on.
    pub fn refuse_connects(&self) {
        self.shared.state.lock().unwrap().refuse_connects = true;
    }

    /// The netstack dies: every push fails, the watcher notices.
    pub fn kill(&self) {
        self.shared.gone.store(true, SeqCst);
        self.shared.changed.notify_all();
    }

    /// Pushes refused because a command ring was full (back-pressure).
    pub fn full_pushes(&self) -> u64 {
        self.shared.full.load(SeqCst)
    }

    /// Commands the fake refused, with why.
    pub fn refused(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().refused.clone()
    }

    /// Receive chunks lent to the application now.
    pub fn rx_lent(&self) -> usize {
        let s = self.shared.state.lock().unwrap();
        RX_BUFFERS as usize - s.free_rx.len()
    }

    /// Waits until every receive chunk is given back (`recv_done`).
    pub fn wait_rx_returned(&self) {
        self.wait("every receive buffer back", |s| {
            s.free_rx.len() == RX_BUFFERS as usize
        });
    }
}

impl Drop for FakeNetstack {
    fn drop(&mut self) {
        registry().lock().unwrap().remove(&self.path);
        self.kill();
        if let Some(t) = self.service.take() {
            let _ = t.join();
        }
    }
}

fn wait_for(shared: &FakeState, what: &str, mut cond: impl FnMut(&State) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = shared.state.lock().unwrap();
    while !cond(&s) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "fake netstack: timed out waiting for {what}"
        );
        s = shared.changed.wait_timeout(s, left).unwrap().0;
    }
}

impl FakePeer {
    /// Delivers `data` to the application (`NewData` ranges of at most
    /// one receive chunk each, up to six per event).
    pub fn deliver(&self, data: &[u8]) {
        for part in data.chunks(RX_CHUNK as usize * 6) {
            let mut ranges = Ranges::default();
            for piece in part.chunks(RX_CHUNK as usize) {
                wait_for(&self.shared, "a free receive chunk", |s| {
                    !s.free_rx.is_empty()
                });
                let mut s = self.shared.state.lock().unwrap();
                let chunk = s.free_rx.pop().expect("waited for");
                s.rx_pool.chunk_mut(chunk).expect("a chunk of the pool")[..piece.len()]
                    .copy_from_slice(piece);
                let r = RxPool::chunk_range(chunk, piece.len() as u32);
                s.conns
                    .get_mut(&self.id)
                    .expect("a peer's connection")
                    .lent
                    .push(r);
                ranges.push(r);
            }
            let mut s = self.shared.state.lock().unwrap();
            s.events[self.ring].push_back(Event::NewData {
                conn: conn_id(self.id),
                ranges,
            });
            drop(s);
            self.shared.changed.notify_all();
        }
    }

    /// Waits until the application has sent `n` bytes in all; they.
    pub fn expect_bytes(&self, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        wait_for(&self.shared, "bytes from the application", |s| {
            let c = &s.conns[&self.id];
            if c.received.len() >= n {
                out = c.received.clone();
                true
            } else {
                false
            }
        });
        out
    }

    /// The peer closes (FIN).
    pub fn close(&self) {
        let mut s = self.shared.state.lock().unwrap();
        s.events[self.ring].push_back(Event::RemoteClosed {
            conn: conn_id(self.id),
        });
        drop(s);
        self.shared.changed.notify_all();
    }

    /// The peer resets the connection.
    pub fn reset(&self) {
        let mut s = self.shared.state.lock().unwrap();
        s.events[self.ring].push_back(Event::Refused {
            conn: Some(conn_id(self.id)),
            cookie: 0,
            command: 0,
            reason: Reason::ConnectionReset,
        });
        s.events[self.ring].push_back(Event::Cleanup {
            conn: conn_id(self.id),
        });
        drop(s);
        self.shared.changed.notify_all();
    }

    /// Waits until the application has shut down writing (or closed).
    pub fn wait_app_shut(&self) {
        wait_for(&self.shared, "the application's FIN", |s| {
            s.conns
                .get(&self.id)
                .is_none_or(|c| c.app_shut || c.app_closed)
        });
    }

    /// Waits until the application has closed the connection.
    pub fn wait_app_closed(&self) {
        wait_for(&self.shared, "the application's close", |s| {
            s.conns.get(&self.id).is_none_or(|c| c.app_closed)
        });
    }

    /// Whether the application accepted it.
    pub fn accepted(&self) -> bool {
        self.shared.state.lock().unwrap().conns[&self.id].accepted
    }
}

/// The fake's network kthread: takes commands and answers them.
fn serve(shared: &FakeState) {
    let mut s = shared.state.lock().unwrap();
    loop {
        if shared.gone.load(SeqCst) {
            return;
        }
        let mut did = false;
        for ring in 0..shared.rings {
            while let Some(cmd) = s.commands[ring].pop_front() {
                did = true;
                execute(&mut s, ring, cmd);
            }
        }
        if did {
            shared.changed.notify_all();
        }
        s = shared
            .changed
            .wait_timeout(s, Duration::from_millis(5))
            .unwrap()
            .0;
    }
}

fn conn_id(id: u32) -> ConnId {
    ConnId::new(id).expect("the fake's ids start at 1")
}

fn execute(s: &mut State, ring: usize, cmd: Command) {
    let refuse = |s: &mut State, conn: Option<ConnId>, cookie: u32, reason: Reason| {
        s.refused.push(format!("{cmd:?}: {reason}"));
        s.events[ring].push_back(Event::Refused {
            conn,
            cookie,
            command: cmd.tag(),
            reason,
        });
    };
    let known = |s: &State, conn: ConnId| s.conns.contains_key(&conn.get());
    if let Some(conn) = cmd.conn() {
        if !known(s, conn) {
            return refuse(s, Some(conn), 0, Reason::NoSuchConnection);
        }
    }
    match cmd {
        Command::Listen { cookie, port, .. } => {
            if s.listening.iter().any(|l| l.0 == port) {
                // Not an application error: a normal answer.
                s.events[ring].push_back(Event::Refused {
                    conn: None,
                    cookie,
                    command: cmd.tag(),
                    reason: Reason::PortInUse,
                });
                return;
            }
            let id = s.next_id;
            s.next_id += 1;
            s.listening.push((port, id, ring));
            s.events[ring].push_back(Event::Listening {
                cookie,
                listener: ListenId::new(id).expect("non-zero"),
            });
        }
        Command::Unlisten { listener } => s.listening.retain(|l| l.1 != listener.get()),
        Command::Accept { conn, .. } => {
            s.conns.get_mut(&conn.get()).expect("known").accepted = true;
        }
        Command::Connect { cookie, remote } => {
            if s.refuse_connects {
                s.events[ring].push_back(Event::Refused {
                    conn: None,
                    cookie,
                    command: cmd.tag(),
                    reason: Reason::ConnectionRefused,
                });
                return;
            }
            let id = s.next_id;
            s.next_id += 1;
            s.conns.insert(
                id,
                PeerConn {
                    accepted: true,
                    ..PeerConn::default()
                },
            );
            s.connects.push((id, ring, remote));
            s.events[ring].push_back(Event::Connected {
                cookie,
                conn: conn_id(id),
                local_port: 49152 + (id as u16 % 16000),
            });
        }
        Command::Send { conn, ranges, .. } => {
            let Some(tx) = s.tx.as_ref() else {
                return refuse(s, Some(conn), 0, Reason::OutsideTxPool);
            };
            let len = tx.metadata().map(|m| m.len()).unwrap_or(0);
            let mut bytes = Vec::new();
            for r in ranges.as_slice() {
                if r.check(len).is_err() {
                    return refuse(s, Some(conn), 0, Reason::OutsideTxPool);
                }
                let at = bytes.len();
                bytes.resize(at + r.len as usize, 0);
                tx.read_exact_at(&mut bytes[at..], u64::from(r.offset))
                    .expect("reading the tx pool");
            }
            let c = s.conns.get_mut(&conn.get()).expect("known");
            c.received.extend_from_slice(&bytes);
            let ack = Event::DataAcked { conn, ranges };
            if s.hold_acks {
                s.held.push((ring, ack));
            } else {
                s.events[ring].push_back(ack);
            }
        }
        Command::RecvDone { conn, ranges } => {
            for r in ranges.as_slice() {
                let c = s.conns.get_mut(&conn.get()).expect("known");
                let Some(i) = c.lent.iter().position(|x| x == r) else {
                    return refuse(s, Some(conn), 0, Reason::NotDelivered);
                };
                c.lent.remove(i);
                s.free_rx.push(r.offset / RX_CHUNK);
            }
        }
        Command::Shutdown { conn } => {
            s.conns.get_mut(&conn.get()).expect("known").app_shut = true;
        }
        Command::Close { conn } => {
            let c = s.conns.get_mut(&conn.get()).expect("known");
            c.app_closed = true;
            let lent: Vec<u32> = c.lent.drain(..).map(|r| r.offset / RX_CHUNK).collect();
            s.free_rx.extend(lent);
            s.events[ring].push_back(Event::Cleanup { conn });
        }
    }
}

/// The application's end of the fake.
pub(crate) struct FakeWire {
    shared: Arc<FakeState>,
    /// The receive pool mapped read-only from an `O_RDONLY` descriptor, as
    /// the netstack's is.
    rx: RxPoolView,
}

/// The fake registered for `path`, attached with the application's tx
/// pool; `None` if no fake is registered there.
pub(crate) fn attach(path: &Path, tx_pool: BorrowedFd<'_>) -> Option<Result<FakeWire, String>> {
    let shared = registry().lock().unwrap().get(path).cloned()?;
    let r = (|| {
        let mut s = shared.state.lock().unwrap();
        let fd = s.rx_pool.app_fd().map_err(|e| e.to_string())?;
        let rx = RxPoolView::map(fd, s.rx_pool.len()).map_err(|e| e.to_string())?;
        s.tx = Some(File::from(
            tx_pool.try_clone_to_owned().map_err(|e| e.to_string())?,
        ));
        drop(s);
        Ok(FakeWire {
            shared: Arc::clone(&shared),
            rx,
        })
    })();
    Some(r)
}

impl Wire for FakeWire {
    fn pairs(&self) -> usize {
        self.shared.rings
    }

    fn push(&self, ring: usize, cmd: &Command) -> Result<(), PushError> {
        if self.shared.gone.load(SeqCst) {
            return Err(PushError::Gone("the fake netstack was killed".into()));
        }
        let mut s = self.shared.state.lock().unwrap();
        if s.commands[ring].len() >= self.shared.ring_capacity {
            self.shared.full.fetch_add(1, SeqCst);
            return Err(PushError::Full);
        }
        s.commands[ring].push_back(*cmd);
        drop(s);
        self.shared.changed.notify_all();
        Ok(())
    }

    fn pop(&self, ring: usize, max: usize, out: &mut Vec<Event>) -> Result<usize, String> {
        let Ok(mut s) = self.shared.state.try_lock() else {
            return Ok(0);
        };
        let q = &mut s.events[ring];
        let n = q.len().min(max);
        out.extend(q.drain(..n));
        drop(s);
        if n > 0 {
            self.shared.changed.notify_all();
        }
        Ok(n)
    }

    fn pending(&self) -> bool {
        match self.shared.state.try_lock() {
            Ok(s) => s.events.iter().any(|q| !q.is_empty()),
            Err(_) => true,
        }
    }

    fn rx(&self, r: Range) -> Option<&[u8]> {
        self.rx.get(r).ok()
    }

    fn send_queue_bytes(&self) -> u64 {
        1 << 20
    }

    fn wait_gone(&self, timeout: Duration) -> Option<String> {
        let s = self.shared.state.lock().unwrap();
        let _ = self
            .shared
            .changed
            .wait_timeout_while(s, timeout, |_| !self.shared.gone.load(SeqCst))
            .unwrap();
        self.shared
            .gone
            .load(SeqCst)
            .then(|| "the fake netstack was killed".to_string())
    }
}
