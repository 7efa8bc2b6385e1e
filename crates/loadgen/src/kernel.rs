//! The Linux-socket backend: a few OS threads (pinned with `--cpus`), each
//! driving its share of the connections (thousands in all) as
//! non-blocking sockets on one epoll instance.
//!
//! A worker walks its part of the planned schedule: it sends every request
//! that is due (a bounded burst at a time, so answers are read even when it
//! falls behind), then waits for answers until the next send — blocking in
//! `epoll_wait` with a timerfd armed for the next send when that is far, or
//! polling without blocking when it is within `spin` (a halted CPU wakes
//! tens of µs late, which would show up as send lag). TCP answers come in
//! order per connection; UDP answers are matched by the id they carry.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::num::NonZeroU64;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Barrier;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rand::{rngs::SmallRng, SeedableRng};
use rustix::event::epoll;
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
};

use crate::clock::{now_ns, thread_cpu_ns, timespec};
use crate::protocol::{Parsed, Pending, Transport, Workload};
use crate::record::Recorder;
use crate::report::Report;
use crate::RunConfig;

/// Requests a worker sends before it looks at answers again.
const BURST: usize = 32;
/// The epoll data of a worker's timerfd (connections use their index).
const TIMER: u64 = u64::MAX;
/// Delay between the end of setup and the schedule's start.
const START_DELAY_NS: u64 = 20_000_000;

enum Sock {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

impl Sock {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Sock::Tcp(s) => s.as_fd(),
            Sock::Udp(s) => s.as_fd(),
        }
    }
}

struct Conn {
    /// `None` once the connection failed.
    sock: Option<Sock>,
    /// Bytes received and not yet parsed (TCP).
    rx: Vec<u8>,
    /// Bytes to send that the socket did not take yet (TCP).
    tx: Vec<u8>,
    /// Requests sent and unanswered, oldest first (TCP).
    fifo: VecDeque<Pending>,
    /// Whether epoll watches for writability.
    want_write: bool,
}

/// Raises this process's soft limit on open descriptors to its hard one,
/// as Go's runtime does at start: the usual soft default (1,024) is below
/// what a run of thousands of connections needs, and the hard one is what
/// the administrator allows.
fn allow_all_descriptors() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    // `None` is unlimited, and the soft limit is never above the hard.
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            log::warn!(
                "raising the open-descriptor limit to {:?}: {e}",
                limit.maximum
            );
        }
    }
}

/// Opens the connections (TCP: connected, no Nagle; UDP: a socket
/// connected to the target each), non-blocking.
fn open(cfg: &RunConfig) -> anyhow::Result<Vec<Sock>> {
    allow_all_descriptors();
    let mut socks = Vec::with_capacity(cfg.connections);
    for i in 0..cfg.connections {
        let s = match cfg.transport {
            Transport::Tcp => {
                let s = TcpStream::connect_timeout(&cfg.target, cfg.connect_timeout).with_context(
                    || {
                        format!(
                            "TCP connection {i} of {} to {}",
                            cfg.connections, cfg.target
                        )
                    },
                )?;
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                Sock::Tcp(s)
            }
            Transport::Udp => {
                let any: SocketAddr = match cfg.target {
                    SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("address"),
                    SocketAddr::V6(_) => "[::]:0".parse().expect("address"),
                };
                let s = UdpSocket::bind(any)
                    .with_context(|| format!("UDP socket {i} of {}", cfg.connections))?;
                s.connect(cfg.target)
                    .with_context(|| format!("UDP socket {i}: connecting to {}", cfg.target))?;
                s.set_nonblocking(true)?;
                Sock::Udp(s)
            }
        };
        socks.push(s);
    }
    Ok(socks)
}

/// Sets the key population of a memcached workload over a blocking TCP
/// connection.
fn preload(cfg: &RunConfig) -> anyhow::Result<()> {
    if let Some(m) = cfg.workload.preload() {
        let s = TcpStream::connect_timeout(&cfg.target, cfg.connect_timeout)
            .with_context(|| format!("connecting to {} to set the keys", cfg.target))?;
        s.set_read_timeout(Some(cfg.timeout.max(Duration::from_secs(1))))?;
        let stored = m
            .preload_on(&s, 256)
            .with_context(|| format!("setting {} keys on {}", m.keys, cfg.target))?;
        if stored != m.keys {
            bail!(
                "{} of {} keys were stored on {} (is it a memcached server with room for them?)",
                stored,
                m.keys,
                cfg.target
            );
        }
    }
    Ok(())
}

/// Runs `cfg` on Linux sockets.
pub fn run(cfg: &RunConfig) -> anyhow::Result<Report> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    preload(cfg)?;
    let workers = cfg.threads.min(cfg.connections);
    let socks = open(cfg)?;
    let mut per_worker: Vec<Vec<Sock>> = (0..workers).map(|_| Vec::new()).collect();
    for (c, s) in socks.into_iter().enumerate() {
        per_worker[c % workers].push(s);
    }
    let plans = cfg.plan_by_worker(workers);
    let barrier = Barrier::new(workers + 1);
    let start = std::sync::OnceLock::new();
    let results: Vec<anyhow::Result<(Recorder, u64, u64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_worker
            .into_iter()
            .zip(plans)
            .enumerate()
            .map(|(w, (socks, plan))| {
                let (barrier, start) = (&barrier, &start);
                std::thread::Builder::new()
                    .name(format!("loadgen-{w}"))
                    .spawn_scoped(scope, move || {
                        let pinned = match cfg.cpus.get(w % cfg.cpus.len().max(1)) {
                            Some(&cpu) => {
                                let mut set = rustix::thread::CpuSet::new();
                                if cpu < rustix::thread::CpuSet::MAX_CPU {
                                    set.set(cpu);
                                }
                                rustix::thread::sched_setaffinity(None, &set)
                                    .with_context(|| format!("pinning worker {w} to CPU {cpu}"))
                            }
                            None => Ok(()),
                        };
                        // Timers fire when asked, not up to 50 µs later.
                        let _ = rustix::thread::set_current_timer_slack(NonZeroU64::new(1));
                        let worker = Worker::new(cfg, w as u64, socks);
                        // Every worker reaches the barrier, even one that
                        // failed, so that none waits for it forever.
                        barrier.wait();
                        let start_ns: u64 = *start.get().expect("set before the barrier");
                        pinned?;
                        let mut worker = worker?;
                        let cpu0 = thread_cpu_ns();
                        worker.run(start_ns, &plan)?;
                        let wall = now_ns().saturating_sub(start_ns);
                        Ok((worker.rec, thread_cpu_ns() - cpu0, wall))
                    })
                    .expect("spawning a worker thread")
            })
            .collect();
        start.set(now_ns() + START_DELAY_NS).expect("set once");
        barrier.wait();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a worker thread panicked"))
            })
            .collect()
    });
    let start_ns = *start.get().expect("set");
    let classes = cfg.workload.classes();
    let mut rec = Recorder::new(classes.len(), 0);
    rec.set_window(
        start_ns + cfg.warmup.as_nanos() as u64,
        cfg.step_ends_ns(start_ns),
    );
    let (mut cpu, mut wall) = (0, 0);
    for r in results {
        let (r, c, w) = r?;
        rec.merge(&r);
        cpu += c;
        wall = wall.max(w);
    }
    let mut facts = cfg.facts("kernel", workers);
    facts.cpu_ns = cpu;
    facts.wall_ns = wall;
    Ok(Report::new(facts, &rec, &classes))
}

struct Worker<'a> {
    cfg: &'a RunConfig,
    workload: &'a Workload,
    transport: Transport,
    conns: Vec<Conn>,
    epoll: OwnedFd,
    timer: OwnedFd,
    /// The deadline the timer is armed for (0: not armed).
    armed_ns: u64,
    rec: Recorder,
    rng: SmallRng,
    /// UDP requests unanswered, by (connection, id).
    udp_pending: HashMap<(u32, u64), Pending>,
    /// TCP requests unanswered, over all connections.
    tcp_pending: usize,
    seq: u64,
    scratch: Vec<u8>,
    out: Vec<u8>,
}

impl<'a> Worker<'a> {
    fn new(cfg: &'a RunConfig, index: u64, socks: Vec<Sock>) -> anyhow::Result<Worker<'a>> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).context("epoll_create")?;
        let timer = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )
        .context("timerfd_create")?;
        epoll::add(
            &epoll,
            &timer,
            epoll::EventData::new_u64(TIMER),
            epoll::EventFlags::IN,
        )?;
        let mut conns = Vec::with_capacity(socks.len());
        for (i, s) in socks.into_iter().enumerate() {
            epoll::add(
                &epoll,
                s.fd(),
                epoll::EventData::new_u64(i as u64),
                epoll::EventFlags::IN,
            )
            .context("epoll_ctl")?;
            conns.push(Conn {
                sock: Some(s),
                rx: Vec::new(),
                tx: Vec::new(),
                fifo: VecDeque::new(),
                want_write: false,
            });
        }
        Ok(Worker {
            cfg,
            workload: &cfg.workload,
            transport: cfg.transport,
            conns,
            epoll,
            timer,
            armed_ns: 0,
            rec: Recorder::new(cfg.workload.classes().len(), 0),
            rng: SmallRng::seed_from_u64(
                cfg.seed ^ (index + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            udp_pending: HashMap::new(),
            tcp_pending: 0,
            seq: 0,
            scratch: vec![0u8; 64 * 1024],
            out: Vec::with_capacity(2048),
        })
    }

    fn outstanding(&self) -> usize {
        self.udp_pending.len() + self.tcp_pending
    }

    fn run(&mut self, start_ns: u64, plan: &[(u64, u32)]) -> anyhow::Result<()> {
        self.rec.set_window(
            start_ns + self.cfg.warmup.as_nanos() as u64,
            self.cfg.step_ends_ns(start_ns),
        );
        let timeout_ns = self.cfg.timeout.as_nanos() as u64;
        let spin_ns = self.cfg.spin.as_nanos() as u64;
        let sweep_every = (timeout_ns / 4).clamp(1_000_000, 100_000_000);
        let end_ns = start_ns + self.cfg.arrivals.duration().as_nanos() as u64;
        let mut next_sweep = start_ns + sweep_every;
        let mut events = Vec::with_capacity(1024);
        let mut idx = 0;
        loop {
            let mut now = now_ns();
            if idx < plan.len() && now >= end_ns + timeout_ns {
                // Still behind when the run's time is up: the rest is
                // never sent (and the run is reported saturated).
                self.rec
                    .unsent(plan[idx..].iter().map(|&(t, _)| start_ns + t));
                idx = plan.len();
            }
            let mut burst = 0;
            while idx < plan.len() && start_ns + plan[idx].0 <= now && burst < BURST {
                let (offset, conn) = plan[idx];
                self.send(conn as usize, start_ns + offset, now);
                idx += 1;
                burst += 1;
                if burst % 8 == 0 {
                    now = now_ns();
                }
            }
            if now >= next_sweep {
                self.sweep(now, timeout_ns);
                next_sweep = now + sweep_every;
            }
            let drain_until = end_ns + timeout_ns;
            if idx >= plan.len() && (self.outstanding() == 0 || now >= drain_until) {
                break;
            }
            // Wait for answers until the next send (or sweep, or the end
            // of the drain).
            let mut wake = next_sweep.min(drain_until);
            let mut poll_only = false;
            if idx < plan.len() {
                let due = start_ns + plan[idx].0;
                if due <= now + spin_ns {
                    poll_only = true;
                } else {
                    wake = wake.min(due - spin_ns);
                }
            }
            events.clear();
            if poll_only {
                let zero = timespec(0);
                wait(&self.epoll, &mut events, Some(&zero))?;
            } else {
                self.arm(wake)?;
                wait(&self.epoll, &mut events, None)?;
            }
            for e in &events {
                let data = e.data;
                let key = data.u64();
                if key == TIMER {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&self.timer, &mut b);
                    self.armed_ns = 0;
                    continue;
                }
                let c = key as usize;
                let flags = e.flags;
                if flags.contains(epoll::EventFlags::OUT) {
                    self.flush(c);
                }
                if flags.intersects(
                    epoll::EventFlags::IN | epoll::EventFlags::ERR | epoll::EventFlags::HUP,
                ) {
                    self.receive(c);
                }
            }
        }
        // Whatever is still unanswered timed out.
        for (_, p) in self.udp_pending.drain() {
            self.rec.timed_out(&p);
        }
        for c in &mut self.conns {
            for p in c.fifo.drain(..) {
                self.rec.timed_out(&p);
            }
        }
        Ok(())
    }

    /// Arms the timerfd for `at_ns` unless it already is.
    fn arm(&mut self, at_ns: u64) -> anyhow::Result<()> {
        if self.armed_ns == at_ns {
            return Ok(());
        }
        timerfd_settime(
            &self.timer,
            TimerfdTimerFlags::ABSTIME,
            &Itimerspec {
                it_interval: timespec(0),
                // Zero would disarm: a deadline already past fires at once.
                it_value: timespec(at_ns.max(1)),
            },
        )
        .context("timerfd_settime")?;
        self.armed_ns = at_ns;
        Ok(())
    }

    /// Sends the next request on connection `c`, scheduled at `sched_ns`.
    fn send(&mut self, c: usize, sched_ns: u64, now: u64) {
        self.out.clear();
        self.seq += 1;
        let p = self.workload.encode(
            self.transport,
            self.seq,
            sched_ns,
            &mut self.rng,
            &mut self.out,
        );
        let conn = &mut self.conns[c];
        let failure = match &conn.sock {
            None => {
                self.rec.failed(&p);
                return;
            }
            Some(Sock::Udp(s)) => {
                match s.send(&self.out) {
                    Ok(_) => {
                        self.rec.sent(&p, now);
                        if let Some(old) = self.udp_pending.insert((c as u32, p.id), p) {
                            // An id reused while its request is still
                            // unanswered (memcached's 16-bit ids): the old
                            // one is given up.
                            self.rec.timed_out(&old);
                        }
                    }
                    Err(e) => {
                        self.rec.failed(&p);
                        self.rec.error_kind(format!("UDP send: {}", e.kind()));
                    }
                }
                return;
            }
            Some(Sock::Tcp(s)) => {
                self.rec.sent(&p, now);
                conn.fifo.push_back(p);
                self.tcp_pending += 1;
                let mut written = 0;
                let mut failure = None;
                if conn.tx.is_empty() {
                    match (&*s).write(&self.out) {
                        Ok(n) => written = n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => failure = Some(format!("TCP send: {}", e.kind())),
                    }
                }
                if failure.is_none() && written < self.out.len() {
                    conn.tx.extend_from_slice(&self.out[written..]);
                    if !conn.want_write {
                        conn.want_write = true;
                        let _ = epoll::modify(
                            &self.epoll,
                            s.as_fd(),
                            epoll::EventData::new_u64(c as u64),
                            epoll::EventFlags::IN | epoll::EventFlags::OUT,
                        );
                    }
                }
                failure
            }
        };
        if let Some(why) = failure {
            self.fail(c, why);
        }
    }

    /// Writes what connection `c` still owes the server.
    fn flush(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        let Some(Sock::Tcp(s)) = &conn.sock else {
            return;
        };
        let mut done = 0;
        let result = loop {
            if done == conn.tx.len() {
                break Ok(());
            }
            match (&*s).write(&conn.tx[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        conn.tx.drain(..done);
        if result.is_ok() && conn.tx.is_empty() && conn.want_write {
            conn.want_write = false;
            let _ = epoll::modify(
                &self.epoll,
                s.as_fd(),
                epoll::EventData::new_u64(c as u64),
                epoll::EventFlags::IN,
            );
        }
        if let Err(e) = result {
            self.fail(c, format!("TCP send: {}", e.kind()));
        }
    }

    /// Reads what connection `c` has and records the answers in it.
    fn receive(&mut self, c: usize) {
        match self.conns[c].sock {
            Some(Sock::Udp(_)) => self.receive_udp(c),
            Some(Sock::Tcp(_)) => self.receive_tcp(c),
            None => {}
        }
    }

    fn receive_udp(&mut self, c: usize) {
        loop {
            let Some(Sock::Udp(s)) = &self.conns[c].sock else {
                return;
            };
            let n = match s.recv(&mut self.scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // An ICMP error for an earlier datagram (port
                    // unreachable): noted, the socket goes on.
                    self.rec.error_kind(format!("UDP receive: {}", e.kind()));
                    continue;
                }
            };
            let now = now_ns();
            let datagram = &self.scratch[..n];
            let Some(id) = self.workload.udp_id(datagram) else {
                self.rec.unmatched += 1;
                continue;
            };
            let Some(p) = self.udp_pending.remove(&(c as u32, id)) else {
                self.rec.unmatched += 1;
                continue;
            };
            match self.workload.parse(self.transport, &p, datagram) {
                Parsed::Done { ok, .. } => self.rec.answered(&p, now, ok),
                Parsed::Incomplete | Parsed::Invalid(_) => self.rec.answered(&p, now, false),
            }
        }
    }

    fn receive_tcp(&mut self, c: usize) {
        let mut closed = None;
        let conn = &mut self.conns[c];
        let Some(Sock::Tcp(s)) = &conn.sock else {
            return;
        };
        loop {
            match (&*s).read(&mut self.scratch) {
                Ok(0) => {
                    closed = Some("the server closed the connection".to_string());
                    break;
                }
                Ok(n) => {
                    conn.rx.extend_from_slice(&self.scratch[..n]);
                    if n < self.scratch.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    closed = Some(format!("TCP receive: {}", e.kind()));
                    break;
                }
            }
        }
        let now = now_ns();
        let conn = &mut self.conns[c];
        let mut pos = 0;
        while let Some(p) = conn.fifo.front().copied() {
            match self.workload.parse(self.transport, &p, &conn.rx[pos..]) {
                Parsed::Incomplete => break,
                Parsed::Done { consumed, ok } => {
                    pos += consumed;
                    conn.fifo.pop_front();
                    self.tcp_pending -= 1;
                    self.rec.answered(&p, now, ok);
                }
                Parsed::Invalid(why) => {
                    closed = Some(format!("unparsable answer: {why}"));
                    break;
                }
            }
        }
        conn.rx.drain(..pos);
        if closed.is_none() && conn.fifo.is_empty() && !conn.rx.is_empty() {
            self.rec.unmatched += 1;
            conn.rx.clear();
        }
        if let Some(why) = closed {
            self.fail(c, why);
        }
    }

    /// Closes connection `c` after an error: its unanswered requests are
    /// lost, and so are the requests the schedule still puts on it.
    fn fail(&mut self, c: usize, why: String) {
        let conn = &mut self.conns[c];
        if let Some(s) = conn.sock.take() {
            let _ = epoll::delete(&self.epoll, s.fd());
        }
        for p in conn.fifo.drain(..) {
            self.tcp_pending -= 1;
            self.rec.failed(&p);
        }
        conn.rx.clear();
        conn.tx.clear();
        self.rec.error_kind(why);
    }

    /// Gives up on requests older than the timeout: UDP ones one by one;
    /// a TCP connection whose oldest request timed out is closed (its later
    /// answers could not be told apart), all its requests timed out.
    fn sweep(&mut self, now: u64, timeout_ns: u64) {
        let rec = &mut self.rec;
        self.udp_pending.retain(|_, p| {
            let keep = p.scheduled_ns + timeout_ns > now;
            if !keep {
                rec.timed_out(p);
            }
            keep
        });
        for c in 0..self.conns.len() {
            let conn = &mut self.conns[c];
            if conn
                .fifo
                .front()
                .is_some_and(|p| p.scheduled_ns + timeout_ns <= now)
            {
                for p in conn.fifo.drain(..) {
                    self.tcp_pending -= 1;
                    self.rec.timed_out(&p);
                }
                self.fail(c, "an answer timed out; connection closed".into());
            }
        }
    }
}

/// `epoll_wait` into `events`' spare capacity, retrying on EINTR.
fn wait(
    epoll: &OwnedFd,
    events: &mut Vec<epoll::Event>,
    timeout: Option<&rustix::time::Timespec>,
) -> anyhow::Result<()> {
    loop {
        match epoll::wait(epoll, rustix::buffer::spare_capacity(&mut *events), timeout) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e).context("epoll_wait"),
        }
    }
}
