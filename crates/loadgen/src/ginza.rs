//! The Ginza-runtime backend: the generator is itself a Ginza application
//! (registered with iokerneld, its packets through iokerneld's software
//! switch; no root needed), its sockets `ginza_runtime::net`'s.
//!
//! One sender uthread walks the planned schedule: it sleeps until each
//! send is due, or until `RunConfig::spin` before it and yields (letting
//! the receivers run) for that last stretch. Each connection has a receiver uthread that reads answers and
//! matches them with the requests the sender left in the connection's
//! pending list (in order for TCP, by id for UDP). Requests the schedule
//! puts on a failed connection are counted as errors.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use ginza_runtime::net::{Ipv4Addr, MacAddr, NetConfig, TcpStream, UdpSocket, MAX_UDP_PAYLOAD};
use ginza_runtime::{Class, Config, IokernelConfig, Mutex};
use rand::{rngs::SmallRng, SeedableRng};

use crate::clock::now_ns;
use crate::protocol::{Parsed, Pending, Transport, Workload};
use crate::record::Recorder;
use crate::report::Report;
use crate::RunConfig;

/// The generator as a Ginza application.
#[derive(Debug, Clone)]
pub struct GinzaConfig {
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    /// iokerneld's control socket (`None`: its default path).
    pub socket: Option<PathBuf>,
    pub name: String,
}

/// How often a receiver waiting for an answer looks at timeouts and the
/// end of the run: a quarter of the timeout, within these bounds (each
/// wake-up is a timer; thousands of receivers waking every few ms would
/// keep the kthreads busy with nothing).
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);

fn poll_interval(cfg: &RunConfig) -> Duration {
    (cfg.timeout / 4).clamp(POLL_MIN, POLL_MAX)
}
/// Delay between the end of setup and the schedule's start.
const START_DELAY_NS: u64 = 20_000_000;

enum Sock {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

/// What the sender and a connection's receiver share.
struct Connection {
    sock: Sock,
    pending: Mutex<PendingSet>,
}

#[derive(Default)]
struct PendingSet {
    /// TCP: in order.
    fifo: VecDeque<Pending>,
    /// UDP: by id.
    by_id: HashMap<u64, Pending>,
    /// The connection failed: no more sends on it.
    dead: bool,
}

impl PendingSet {
    fn len(&self) -> usize {
        self.fifo.len() + self.by_id.len()
    }
}

/// Runs `cfg` as a Ginza application described by `g`. Blocks the calling
/// OS thread until the run ends.
pub fn run(cfg: &RunConfig, g: &GinzaConfig) -> anyhow::Result<Report> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let SocketAddr::V4(target) = cfg.target else {
        bail!("the Ginza backend speaks IPv4 only ({} is not)", cfg.target);
    };
    let mut io = IokernelConfig::new(&g.name, Class::LatencyCritical);
    io.socket = g.socket.clone();
    io.net = Some(NetConfig::new(g.mac, g.ip));
    let config = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(cfg.threads)
    };
    let cfg2 = cfg.clone();
    let result = ginza_runtime::run(config, move || run_on_uthread(&cfg2, target))
        .map_err(|e| anyhow::anyhow!("the Ginza runtime: {e}"))?;
    let (rec, _start_ns, wall_ns) = result?;
    let classes = cfg.workload.classes();
    let mut facts = cfg.facts("ginza", cfg.threads);
    facts.wall_ns = wall_ns;
    Ok(Report::new(facts, &rec, &classes))
}

fn open(cfg: &RunConfig, target: SocketAddrV4) -> anyhow::Result<Vec<Arc<Connection>>> {
    let mut conns = Vec::with_capacity(cfg.connections);
    for i in 0..cfg.connections {
        let sock = match cfg.transport {
            Transport::Tcp => {
                let s = TcpStream::connect_timeout(&target.into(), cfg.connect_timeout)
                    .with_context(|| {
                        format!("TCP connection {i} of {} to {target}", cfg.connections)
                    })?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(poll_interval(cfg)))?;
                Sock::Tcp(s)
            }
            Transport::Udp => {
                let s = UdpSocket::bind(0u16)
                    .with_context(|| format!("UDP socket {i} of {}", cfg.connections))?;
                s.connect(target)?;
                s.set_read_timeout(Some(poll_interval(cfg)))?;
                Sock::Udp(s)
            }
        };
        conns.push(Arc::new(Connection {
            sock,
            pending: Mutex::new(PendingSet::default()),
        }));
    }
    Ok(conns)
}

/// The run, on the runtime's main uthread: the recorder, the start and
/// the wall time.
fn run_on_uthread(cfg: &RunConfig, target: SocketAddrV4) -> anyhow::Result<(Recorder, u64, u64)> {
    if let Some(m) = cfg.workload.preload() {
        let s = TcpStream::connect_timeout(&target.into(), cfg.connect_timeout)
            .with_context(|| format!("connecting to {target} to set the keys"))?;
        s.set_read_timeout(Some(cfg.timeout.max(Duration::from_secs(1))))?;
        let stored = m
            .preload_on(&s, 256)
            .with_context(|| format!("setting {} keys on {target}", m.keys))?;
        if stored != m.keys {
            bail!("{stored} of {} keys were stored on {target}", m.keys);
        }
    }
    let conns = open(cfg, target)?;
    let start_ns = now_ns() + START_DELAY_NS;
    let measure_from = start_ns + cfg.warmup.as_nanos() as u64;
    let classes = cfg.workload.classes().len();
    let step_ends = cfg.step_ends_ns(start_ns);
    let stop = Arc::new(AtomicBool::new(false));
    let workload = Arc::new(cfg.workload.clone());
    // One recorder per sender, shared with the receivers of its
    // connections (an HDR histogram is a few hundred KiB: not one per
    // connection).
    let workers = cfg.threads.min(cfg.connections);
    let recs: Vec<Arc<Mutex<Recorder>>> = (0..workers)
        .map(|_| {
            let mut rec = Recorder::new(classes, 0);
            rec.set_window(measure_from, step_ends.clone());
            Arc::new(Mutex::new(rec))
        })
        .collect();
    let receivers: Vec<_> = conns
        .iter()
        .enumerate()
        .map(|(c, conn)| {
            let (conn, stop, workload) = (conn.clone(), stop.clone(), workload.clone());
            let rec = recs[c % workers].clone();
            let (transport, timeout_ns) = (cfg.transport, cfg.timeout.as_nanos() as u64);
            ginza_runtime::spawn(move || {
                receive(&conn, &workload, transport, timeout_ns, &stop, &rec)
            })
        })
        .collect();

    // One sender per kthread, each with its share of the schedule and of
    // the connections (the first on this uthread).
    let end_ns = start_ns + cfg.arrivals.duration().as_nanos() as u64;
    let mut plans = cfg.plan_by_worker(workers);
    let first_plan = std::mem::take(&mut plans[0]);
    let sender = |w: usize| Sender {
        cfg: cfg.clone(),
        conns: conns.clone(),
        workload: workload.clone(),
        start_ns,
        rec: recs[w].clone(),
    };
    let senders: Vec<_> = plans
        .into_iter()
        .enumerate()
        .skip(1)
        .map(|(w, plan)| {
            let sender = sender(w);
            ginza_runtime::spawn(move || sender.send(w, workers, &plan))
        })
        .collect();
    sender(0).send(0, workers, &first_plan);
    for s in senders {
        s.join()
            .map_err(|e| anyhow::anyhow!("a sender uthread: {e}"))?;
    }
    // Wait for the last answers (at most the timeout), then stop.
    let drain_until = end_ns + cfg.timeout.as_nanos() as u64;
    while now_ns() < drain_until && conns.iter().any(|c| c.pending.lock().len() > 0) {
        ginza_runtime::sleep(Duration::from_millis(1));
    }
    stop.store(true, Relaxed);
    // Wake the receivers still blocked in a read at once.
    for c in &conns {
        if let Sock::Tcp(s) = &c.sock {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
    for r in receivers {
        r.join()
            .map_err(|e| anyhow::anyhow!("a receiver uthread: {e}"))?;
    }
    let mut rec = Recorder::new(classes, 0);
    rec.set_window(measure_from, step_ends);
    for r in &recs {
        rec.merge(&r.lock());
    }
    for c in &conns {
        let mut set = c.pending.lock();
        let PendingSet { fifo, by_id, .. } = &mut *set;
        for p in fifo.drain(..).chain(by_id.drain().map(|(_, p)| p)) {
            rec.timed_out(&p);
        }
    }
    let wall = now_ns().saturating_sub(start_ns);
    Ok((rec, start_ns, wall))
}

/// A sender uthread's share of the run.
struct Sender {
    cfg: RunConfig,
    conns: Vec<Arc<Connection>>,
    workload: Arc<Workload>,
    start_ns: u64,
    /// Shared with the receivers of this sender's connections.
    rec: Arc<Mutex<Recorder>>,
}

impl Sender {
    /// Sends sender `w`'s (of `workers`) part of the schedule: `plan`
    /// names its connections by their index among its own.
    fn send(self, w: usize, workers: usize, plan: &[(u64, u32)]) {
        let Sender {
            cfg,
            conns,
            workload,
            start_ns,
            rec,
        } = self;
        let mut rng =
            SmallRng::seed_from_u64(cfg.seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut out = Vec::with_capacity(2048);
        let end_ns = start_ns + cfg.arrivals.duration().as_nanos() as u64;
        let give_up_ns = end_ns + cfg.timeout.as_nanos() as u64;
        let spin_ns = cfg.spin.as_nanos() as u64;
        for (seq, &(offset, local)) in plan.iter().enumerate() {
            let due = start_ns + offset;
            wait_until(due, spin_ns);
            let now = now_ns();
            if now >= give_up_ns {
                // Still behind when the run's time is up.
                rec.lock()
                    .unsent(plan[seq..].iter().map(|&(t, _)| start_ns + t));
                break;
            }
            out.clear();
            let p = workload.encode(cfg.transport, seq as u64 + 1, due, &mut rng, &mut out);
            let conn = &conns[w + local as usize * workers];
            {
                let mut set = conn.pending.lock();
                if set.dead {
                    rec.lock().failed(&p);
                    continue;
                }
                match conn.sock {
                    Sock::Tcp(_) => set.fifo.push_back(p),
                    Sock::Udp(_) => {
                        if let Some(old) = set.by_id.insert(p.id, p) {
                            rec.lock().timed_out(&old);
                        }
                    }
                }
            }
            rec.lock().sent(&p, now);
            let sent = match &conn.sock {
                Sock::Tcp(s) => (&*s).write_all(&out),
                Sock::Udp(s) => s.send(&out).map(|_| ()),
            };
            if let Err(e) = sent {
                rec.lock().error_kind(format!("send: {}", e.kind()));
                let mut set = conn.pending.lock();
                match conn.sock {
                    Sock::Tcp(_) => {
                        // The stream is broken: everything on it is lost.
                        set.dead = true;
                        for p in set.fifo.drain(..) {
                            rec.lock().failed(&p);
                        }
                    }
                    Sock::Udp(_) => {
                        if let Some(p) = set.by_id.remove(&p.id) {
                            rec.lock().failed(&p);
                        }
                    }
                }
            }
        }
    }
}

/// Sleeps until `spin_ns` before `due_ns`, then yields until it. The
/// yielding keeps this kthread's core (and iokerneld's loop, which polls
/// while any kthread holds a core) busy: on a machine with fewer CPUs than
/// busy threads that spin is what delays the server, so a benchmark asks
/// for none (docs/protected.md, "Why the throughput was null").
fn wait_until(due_ns: u64, spin_ns: u64) {
    let now = now_ns();
    if due_ns > now + spin_ns {
        ginza_runtime::sleep(Duration::from_nanos(due_ns - now - spin_ns));
    }
    while now_ns() < due_ns {
        ginza_runtime::yield_now();
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A connection's receiver: reads answers until `stop`, recording them.
fn receive(
    conn: &Connection,
    workload: &Workload,
    transport: Transport,
    timeout_ns: u64,
    stop: &AtomicBool,
    rec: &Mutex<Recorder>,
) {
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD.max(64 * 1024)];
    let mut rx: Vec<u8> = Vec::new();
    let sweep_every = (timeout_ns / 4).clamp(1_000_000, 100_000_000);
    let mut next_sweep = now_ns() + sweep_every;
    while !stop.load(Relaxed) {
        let got = match &conn.sock {
            Sock::Tcp(s) => (&*s).read(&mut buf),
            Sock::Udp(s) => s.recv(&mut buf),
        };
        let now = now_ns();
        match got {
            // The end of the run shuts the connections down: not a failure.
            _ if stop.load(Relaxed) => return,
            Ok(0) if matches!(conn.sock, Sock::Tcp(_)) => {
                fail(conn, rec, "the server closed the connection");
                return;
            }
            Ok(n) => match &conn.sock {
                Sock::Udp(_) => {
                    let datagram = &buf[..n];
                    let p = workload
                        .udp_id(datagram)
                        .and_then(|id| conn.pending.lock().by_id.remove(&id));
                    match p {
                        Some(p) => match workload.parse(transport, &p, datagram) {
                            Parsed::Done { ok, .. } => rec.lock().answered(&p, now, ok),
                            _ => rec.lock().answered(&p, now, false),
                        },
                        None => rec.lock().unmatched += 1,
                    }
                }
                Sock::Tcp(_) => {
                    rx.extend_from_slice(&buf[..n]);
                    let mut pos = 0;
                    let mut broken = None;
                    let mut set = conn.pending.lock();
                    while let Some(p) = set.fifo.front().copied() {
                        match workload.parse(transport, &p, &rx[pos..]) {
                            Parsed::Incomplete => break,
                            Parsed::Done { consumed, ok } => {
                                pos += consumed;
                                set.fifo.pop_front();
                                rec.lock().answered(&p, now, ok);
                            }
                            Parsed::Invalid(why) => {
                                broken = Some(format!("unparsable answer: {why}"));
                                break;
                            }
                        }
                    }
                    if broken.is_none() && set.fifo.is_empty() && pos < rx.len() {
                        rec.lock().unmatched += 1;
                        pos = rx.len();
                    }
                    drop(set);
                    rx.drain(..pos);
                    if let Some(why) = broken {
                        fail(conn, rec, &why);
                        return;
                    }
                }
            },
            Err(e) if is_timeout(&e) => {}
            Err(e) => {
                if matches!(conn.sock, Sock::Tcp(_)) {
                    fail(conn, rec, &format!("receive: {}", e.kind()));
                    return;
                }
                rec.lock().error_kind(format!("UDP receive: {}", e.kind()));
            }
        }
        if now < next_sweep {
            continue;
        }
        next_sweep = now + sweep_every;
        let mut set = conn.pending.lock();
        match conn.sock {
            Sock::Udp(_) => set.by_id.retain(|_, p| {
                let keep = p.scheduled_ns + timeout_ns > now;
                if !keep {
                    rec.lock().timed_out(p);
                }
                keep
            }),
            Sock::Tcp(_) => {
                if set
                    .fifo
                    .front()
                    .is_some_and(|p| p.scheduled_ns + timeout_ns <= now)
                {
                    set.dead = true;
                    for p in set.fifo.drain(..) {
                        rec.lock().timed_out(&p);
                    }
                    rec.lock()
                        .error_kind("an answer timed out; connection closed");
                    drop(set);
                    if let Sock::Tcp(s) = &conn.sock {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                    return;
                }
            }
        }
    }
}

/// Marks `conn` failed: its pending requests are lost.
fn fail(conn: &Connection, rec: &Mutex<Recorder>, why: &str) {
    let mut set = conn.pending.lock();
    set.dead = true;
    for p in set.fifo.drain(..) {
        rec.lock().failed(&p);
    }
    rec.lock().error_kind(why);
}
