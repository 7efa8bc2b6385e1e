//! `scan-server`: GET (microseconds) and range SCAN (hundreds of
//! microseconds) over an in-memory ordered map — the RocksDB-style mix of
//! Shinjuku's evaluation (§5; docs/design.md, "Applications, load and
//! experiments") — over UDP and TCP.
//!
//! # The map
//!
//! A `BTreeMap<u64, u64>` of `keys` pairs generated from a seed
//! ([`Store::generate`]): the `i`-th key is [`key_at`]`(seed, i)` (so a
//! client with the seed can ask for keys that exist), its value
//! [`value_of`]`(seed, key)`. It is read-only while served.
//!
//! Costs (an optimised build on the development VM, 100,000 keys): a GET
//! looks its key up in about 0.25 µs; a SCAN walks about 5–8 ns a key, so
//! 50,000 keys take about 340 µs — the client picks a SCAN's length (a SCAN
//! from key 0 walks the first keys in order, so it walks its full length
//! whenever the map has that many keys).
//!
//! # Wire format
//!
//! Every integer is big-endian. A **request** is [`REQUEST_LEN`] = 24 bytes:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | request id (echoed in the response) |
//! | 8 | op: 1 = GET, 2 = SCAN |
//! | 9..12 | zero |
//! | 12..16 | SCAN: keys to walk, 1..=[`MAX_SCAN`]; GET: 0 |
//! | 16..24 | key (GET: the key; SCAN: walk from the first key ≥ it) |
//!
//! A **response** is [`RESPONSE_LEN`] = 24 bytes:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | the request's id (0 if a datagram was too short to hold one) |
//! | 8 | status: 0 = OK, 1 = NOT_FOUND (GET of a missing key), 2 = BAD_REQUEST |
//! | 9..12 | zero |
//! | 12..16 | pairs read (GET: 1 or 0; SCAN: fewer than asked at the map's end) |
//! | 16..24 | checksum of the pairs read, in key order ([`checksum`]) |
//!
//! Over UDP each datagram carries one request (a datagram of another
//! length is a BAD_REQUEST); over TCP requests follow each other on the
//! stream and responses come back in order (a bad request is answered with
//! BAD_REQUEST and the connection goes on: the framing is fixed-size).
//!
//! # Modes
//!
//! * Run to completion ([`serve`]): like spin-server, a UDP receiver
//!   uthread spawns a uthread per request; TCP gets a uthread per
//!   connection.
//! * Shinjuku mode over UDP ([`run_shinjuku`]), so long SCANs are
//!   preempted (a SCAN reaches a preemption point every 64 keys). Shinjuku
//!   mode's workers run without networking (`shinjuku::serve` starts its own
//!   kthreads, with no iokerneld), so requests cross from a networked
//!   *front* runtime: its UDP receiver hands each request to the
//!   dispatcher's [`Source`] through a channel, the handler (on a worker)
//!   hands the response back through another, and a front uthread sends
//!   it. The classifier puts GET and SCAN in different classes (c-PRE-MQ's
//!   queues). TCP, if asked for, is served by the front runtime, run to
//!   completion.
//! * Shinjuku mode dispatched by iokerneld over UDP ([`run_dispatched`];
//!   docs/colocate.md): the dispatch step runs on iokerneld's core, which
//!   classifies each request by its op byte ([`OP_OFFSET`]: class `k` is
//!   op `k`, see [`dispatch_spec`]), and the application's kthreads are
//!   the workers, granted and revoked by the core allocator like any
//!   others. UDP only.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ginza_proto::messages::{DispatchClass, DispatchSpec};
use ginza_runtime::net::{TcpStream, UdpSocket, MAX_UDP_PAYLOAD};
use ginza_runtime::shinjuku::dispatched::{self, DispatchedConfig, DispatchedReport};
use ginza_runtime::shinjuku::{
    self, Arrival, ClassConfig, Placement, SchedPolicy, ShinjukuConfig, Source,
};
use ginza_runtime::{Config, RuntimeError};

use crate::serve::{is_timeout, Protocols, STOP_POLL};

/// Length of a request on the wire.
pub const REQUEST_LEN: usize = 24;
/// Length of a response on the wire.
pub const RESPONSE_LEN: usize = 24;
/// The most keys one SCAN may walk.
pub const MAX_SCAN: u32 = 1_000_000;
/// A SCAN reaches a preemption point every this many keys.
const PREEMPT_EVERY: usize = 64;

const OP_GET: u8 = 1;
const OP_SCAN: u8 = 2;
/// Offset of the op byte in a request: iokerneld's c-PRE-MQ classifier
/// reads it in dispatched mode.
pub const OP_OFFSET: u16 = 8;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The value of one key.
    Get,
    /// Walk `count` keys from the first key ≥ the request's key.
    Scan { count: u32 },
}

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub op: Op,
    pub key: u64,
}

/// The request class of GETs (c-PRE-MQ queue 0).
pub const CLASS_GET: usize = 0;
/// The request class of SCANs (c-PRE-MQ queue 1).
pub const CLASS_SCAN: usize = 1;

impl Request {
    pub fn get(id: u64, key: u64) -> Request {
        Request {
            id,
            op: Op::Get,
            key,
        }
    }

    pub fn scan(id: u64, key: u64, count: u32) -> Request {
        Request {
            id,
            op: Op::Scan { count },
            key,
        }
    }

    /// The request's bytes on the wire.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..8].copy_from_slice(&self.id.to_be_bytes());
        let (op, count) = match self.op {
            Op::Get => (OP_GET, 0),
            Op::Scan { count } => (OP_SCAN, count),
        };
        b[8] = op;
        b[12..16].copy_from_slice(&count.to_be_bytes());
        b[16..24].copy_from_slice(&self.key.to_be_bytes());
        b
    }

    /// Parses a request; a malformed one gives the response it gets.
    pub fn decode(b: &[u8]) -> Result<Request, Response> {
        let id = b
            .get(0..8)
            .map_or(0, |id| u64::from_be_bytes(id.try_into().expect("8 bytes")));
        let bad = Err(Response::bad_request(id));
        if b.len() != REQUEST_LEN || b[9..12] != [0, 0, 0] {
            return bad;
        }
        let count = u32::from_be_bytes(b[12..16].try_into().expect("4 bytes"));
        let key = u64::from_be_bytes(b[16..24].try_into().expect("8 bytes"));
        let op = match (b[8], count) {
            (OP_GET, 0) => Op::Get,
            (OP_SCAN, 1..=MAX_SCAN) => Op::Scan { count },
            _ => return bad,
        };
        Ok(Request { id, op, key })
    }

    /// Its class under c-PRE-MQ: [`CLASS_GET`] or [`CLASS_SCAN`].
    pub fn class(&self) -> usize {
        match self.op {
            Op::Get => CLASS_GET,
            Op::Scan { .. } => CLASS_SCAN,
        }
    }
}

/// A response's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadRequest = 2,
}

/// One response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub id: u64,
    pub status: Status,
    /// Pairs read.
    pub count: u32,
    /// [`checksum`] of the pairs read.
    pub checksum: u64,
}

impl Response {
    pub fn bad_request(id: u64) -> Response {
        Response {
            id,
            status: Status::BadRequest,
            count: 0,
            checksum: 0,
        }
    }

    /// The response's bytes on the wire.
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..8].copy_from_slice(&self.id.to_be_bytes());
        b[8] = self.status as u8;
        b[12..16].copy_from_slice(&self.count.to_be_bytes());
        b[16..24].copy_from_slice(&self.checksum.to_be_bytes());
        b
    }

    /// Parses a response (for clients); `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<Response> {
        if b.len() != RESPONSE_LEN || b[9..12] != [0, 0, 0] {
            return None;
        }
        let status = match b[8] {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::BadRequest,
            _ => return None,
        };
        Some(Response {
            id: u64::from_be_bytes(b[0..8].try_into().ok()?),
            status,
            count: u32::from_be_bytes(b[12..16].try_into().ok()?),
            checksum: u64::from_be_bytes(b[16..24].try_into().ok()?),
        })
    }
}

/// SplitMix64's finalizer: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`-th key of the map generated from `seed` (distinct for distinct
/// `i`: a bijection of `i`).
pub fn key_at(seed: u64, i: u64) -> u64 {
    mix(i.wrapping_add(mix(seed)))
}

/// The value of `key` in the map generated from `seed`.
pub fn value_of(seed: u64, key: u64) -> u64 {
    mix(key ^ seed.rotate_left(32) ^ 0x5ca1_ab1e)
}

const CHECKSUM_START: u64 = 0xcbf2_9ce4_8422_2325;
const CHECKSUM_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Folds one pair into a running checksum (FNV-1a over 64-bit words).
fn fold(c: u64, key: u64, value: u64) -> u64 {
    let c = (c ^ key).wrapping_mul(CHECKSUM_PRIME);
    (c ^ value).wrapping_mul(CHECKSUM_PRIME)
}

/// The checksum a response carries for `pairs`, read in key order.
pub fn checksum(pairs: impl IntoIterator<Item = (u64, u64)>) -> u64 {
    pairs
        .into_iter()
        .fold(CHECKSUM_START, |c, (k, v)| fold(c, k, v))
}

/// The ordered map served.
#[derive(Debug, Clone)]
pub struct Store {
    map: BTreeMap<u64, u64>,
}

impl Store {
    /// `keys` pairs from `seed` (see [`key_at`], [`value_of`]).
    pub fn generate(seed: u64, keys: u64) -> Store {
        let map = (0..keys)
            .map(|i| {
                let k = key_at(seed, i);
                (k, value_of(seed, k))
            })
            .collect();
        Store { map }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The map itself (read-only; for checking answers).
    pub fn map(&self) -> &BTreeMap<u64, u64> {
        &self.map
    }

    /// Executes a request.
    pub fn execute(&self, request: &Request) -> Response {
        match request.op {
            Op::Get => match self.map.get(&request.key) {
                Some(&v) => Response {
                    id: request.id,
                    status: Status::Ok,
                    count: 1,
                    checksum: fold(CHECKSUM_START, request.key, v),
                },
                None => Response {
                    id: request.id,
                    status: Status::NotFound,
                    count: 0,
                    checksum: 0,
                },
            },
            Op::Scan { count } => {
                let mut c = CHECKSUM_START;
                let mut read = 0u32;
                for (&k, &v) in self.map.range(request.key..).take(count as usize) {
                    c = fold(c, k, v);
                    read += 1;
                    if read as usize % PREEMPT_EVERY == 0 {
                        ginza_runtime::preempt_point();
                    }
                }
                Response {
                    id: request.id,
                    status: Status::Ok,
                    count: read,
                    checksum: c,
                }
            }
        }
    }

    /// The response to the request in `bytes` (malformed: BAD_REQUEST).
    pub fn answer(&self, bytes: &[u8]) -> Response {
        match Request::decode(bytes) {
            Ok(r) => self.execute(&r),
            Err(bad) => bad,
        }
    }
}

/// Counts of one server run.
#[derive(Debug, Default)]
pub struct ScanStats {
    /// GETs answered (found or not).
    pub gets: AtomicU64,
    /// SCANs answered.
    pub scans: AtomicU64,
    /// Keys walked by SCANs.
    pub keys_scanned: AtomicU64,
    /// Requests answered BAD_REQUEST.
    pub bad_requests: AtomicU64,
    /// Responses that could not be sent (UDP).
    pub send_errors: AtomicU64,
    /// TCP connections accepted.
    pub tcp_accepted: AtomicU64,
    /// TCP connections that ended with an error rather than the peer's close.
    pub tcp_errors: AtomicU64,
}

impl ScanStats {
    fn count(&self, response: &Response, was_scan: bool) {
        match (response.status, was_scan) {
            (Status::BadRequest, _) => self.bad_requests.fetch_add(1, Relaxed),
            (_, true) => {
                self.keys_scanned
                    .fetch_add(u64::from(response.count), Relaxed);
                self.scans.fetch_add(1, Relaxed)
            }
            (_, false) => self.gets.fetch_add(1, Relaxed),
        };
    }

    /// Executes `bytes` against `store` and counts it.
    fn answer(&self, store: &Store, bytes: &[u8]) -> Response {
        let request = Request::decode(bytes);
        let was_scan = matches!(
            request,
            Ok(Request {
                op: Op::Scan { .. },
                ..
            })
        );
        let response = match request {
            Ok(r) => store.execute(&r),
            Err(bad) => bad,
        };
        self.count(&response, was_scan);
        response
    }
}

/// Serves `store` on `port` over `protocols`, run to completion, until
/// `stop` is set. Must run on a uthread of a runtime with networking.
pub fn serve(
    port: u16,
    protocols: Protocols,
    store: Arc<Store>,
    stop: Arc<AtomicBool>,
    stats: Arc<ScanStats>,
) -> io::Result<()> {
    // Bound here, so that a port in use is this call's error.
    let udp_socket = if protocols.udp {
        Some(Arc::new(UdpSocket::bind(port)?))
    } else {
        None
    };
    let (udp_store, udp_stop, udp_stats) = (store.clone(), stop.clone(), stats.clone());
    crate::serve::udp_beside_tcp(
        "scan-server",
        udp_socket.map(|socket| move || serve_udp(socket, udp_store, &udp_stop, udp_stats)),
        protocols
            .tcp
            .then_some(|| serve_tcp(port, store, &stop, stats)),
        &stop,
    )
}

/// UDP, run to completion: a uthread per request (as spin-server does, so
/// that a backlog waits on runqueues where iokerneld sees it).
fn serve_udp(
    socket: Arc<UdpSocket>,
    store: Arc<Store>,
    stop: &AtomicBool,
    stats: Arc<ScanStats>,
) -> io::Result<()> {
    crate::serve::datagrams_until_stopped(&socket, stop, |datagram, from| {
        let mut request = [0u8; REQUEST_LEN + 1];
        let len = datagram.len().min(request.len());
        request[..len].copy_from_slice(&datagram[..len]);
        let (socket, store, stats) = (socket.clone(), store.clone(), stats.clone());
        ginza_runtime::spawn(move || {
            let response = stats.answer(&store, &request[..len]);
            if socket.send_to(&response.encode(), from).is_err() {
                stats.send_errors.fetch_add(1, Relaxed);
            }
        });
    })
}

/// TCP, run to completion: an acceptor uthread gives each connection a
/// uthread; returns when `stop` is set (the acceptor stays blocked in
/// `accept` and goes with the runtime).
fn serve_tcp(
    port: u16,
    store: Arc<Store>,
    stop: &Arc<AtomicBool>,
    stats: Arc<ScanStats>,
) -> io::Result<()> {
    let conn_stop = stop.clone();
    crate::serve::accept_until_stopped(port, stop, move |stream| {
        stats.tcp_accepted.fetch_add(1, Relaxed);
        if serve_connection(&stream, &store, &conn_stop, &stats).is_err() {
            stats.tcp_errors.fetch_add(1, Relaxed);
        }
    })
}

/// Answers the requests of one connection in order until the peer closes.
fn serve_connection(
    stream: &TcpStream,
    store: &Store,
    stop: &AtomicBool,
    stats: &ScanStats,
) -> io::Result<()> {
    stream.set_read_timeout(Some(STOP_POLL))?;
    let mut buf = vec![0u8; 256 * REQUEST_LEN];
    // Bytes of an incomplete request at the start of `buf`.
    let mut held = 0;
    let mut out = Vec::new();
    while !stop.load(Relaxed) {
        let n = match (&*stream).read(&mut buf[held..]) {
            Ok(0) => return stream.shutdown(std::net::Shutdown::Write),
            Ok(n) => n,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => return Err(e),
        };
        let filled = held + n;
        let whole = filled / REQUEST_LEN * REQUEST_LEN;
        for request in buf[..whole].chunks_exact(REQUEST_LEN) {
            out.extend_from_slice(&stats.answer(store, request).encode());
        }
        buf.copy_within(whole..filled, 0);
        held = filled - whole;
        (&*stream).write_all(&out)?;
        out.clear();
    }
    Ok(())
}

/// The c-PRE-MQ policy of scan-server: GETs (class 0) with `get_slo`,
/// SCANs (class 1) with `scan_slo`, preempted requests at their queue's
/// tail.
pub fn mq_policy(quantum: Duration, get_slo: Duration, scan_slo: Duration) -> SchedPolicy {
    let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
    SchedPolicy::CPreMq {
        quantum: ns(quantum),
        classes: vec![
            ClassConfig {
                slo: ns(get_slo).max(1),
                placement: Placement::Tail,
            },
            ClassConfig {
                slo: ns(scan_slo).max(1),
                placement: Placement::Tail,
            },
        ],
    }
}

/// The class a request gets under `policy`: its own ([`Request::class`])
/// when the policy has a queue per class (c-PRE-MQ with two classes or
/// more), else 0 (c-PRE-SQ and c-FCFS have one queue).
pub fn class_under(policy: &SchedPolicy, request: &Request) -> usize {
    match policy {
        SchedPolicy::CPreMq { classes, .. } if classes.len() > CLASS_SCAN => request.class(),
        _ => 0,
    }
}

/// The dispatch step iokerneld runs for scan-server (dispatched mode):
/// `policy` is `c-fcfs`, `c-pre-sq` or `c-pre-mq`; under c-PRE-MQ
/// iokerneld reads a request's class from its op byte, so the classes are
/// indexed by op: GETs get `get_slo`, SCANs `scan_slo`, and class 0 (a
/// datagram naming no op: answered BAD_REQUEST at once by the worker)
/// `get_slo`. A request asked to yield that runs on for `backstop` gets a
/// signal.
pub fn dispatch_spec(
    policy: &str,
    quantum: Duration,
    get_slo: Duration,
    scan_slo: Duration,
    backstop: Option<Duration>,
) -> DispatchSpec {
    let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
    let mq = policy == "c-pre-mq";
    let mut classes = Vec::new();
    if mq {
        let class = |slo| DispatchClass {
            slo_ns: ns(slo).max(1),
            head: false,
        };
        classes = vec![class(get_slo); usize::from(OP_SCAN) + 1];
        classes[usize::from(OP_SCAN)] = class(scan_slo);
    }
    DispatchSpec {
        policy: policy.into(),
        quantum_ns: ns(quantum),
        head: false,
        classes,
        class_offset: if mq { OP_OFFSET } else { 0 },
        backstop_ns: backstop.map(ns),
        pre_assign: None,
    }
}

/// Serves `store` over UDP on `config.port` in Shinjuku mode dispatched by
/// iokerneld (`config.dispatch`, e.g. from [`dispatch_spec`]) until `stop`
/// is set: each request runs on a worker kthread (a SCAN yields at its
/// preemption points when asked). Blocks the calling thread (not a
/// uthread).
pub fn run_dispatched(
    config: DispatchedConfig,
    store: Arc<Store>,
    stop: &AtomicBool,
    stats: Arc<ScanStats>,
) -> Result<DispatchedReport, RuntimeError> {
    dispatched::serve(
        config,
        move |datagram| stats.answer(&store, datagram).encode().to_vec(),
        stop,
    )
}

/// A request on its way from the front runtime to a worker.
type Inbound = (Request, SocketAddrV4);
/// A response on its way back to the front runtime.
type Outbound = ([u8; RESPONSE_LEN], SocketAddrV4);

/// The dispatcher's source: requests the front runtime received.
struct FromFront {
    requests: mpsc::Receiver<Inbound>,
    done: bool,
}

impl Source<Inbound> for FromFront {
    fn poll(&mut self, now_ns: u64) -> Option<Arrival<Inbound>> {
        match self.requests.try_recv() {
            Ok(payload) => Some(Arrival {
                class: 0,
                at_ns: now_ns,
                payload,
            }),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => {
                self.done = true;
                None
            }
        }
    }
    fn is_done(&self) -> bool {
        self.done
    }
}

/// What a Shinjuku-mode run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShinjukuSummary {
    /// Requests the workers served.
    pub served: u64,
    /// Requests preempted at least once.
    pub preempted_requests: u64,
    /// Preemptions at preemption points.
    pub coop_preemptions: u64,
    /// Preemptions by signal.
    pub signal_preemptions: u64,
}

/// How often the front runtime's sender looks for responses when it found
/// none (it cannot be woken from the workers' runtime).
const SEND_POLL: Duration = Duration::from_micros(20);

/// Serves `store` in Shinjuku mode until `stop` is set: UDP requests on
/// `port` are received by a networked front runtime (`front`, registered
/// with iokerneld) and executed by Shinjuku workers (`shinjuku`; GETs and
/// SCANs in classes [`CLASS_GET`] and [`CLASS_SCAN`]); with `tcp`, the front
/// runtime also serves TCP on `port`, run to completion. Blocks the calling
/// thread (not a uthread) until both are done.
pub fn run_shinjuku(
    front: Config,
    shinjuku: ShinjukuConfig,
    port: u16,
    tcp: bool,
    store: Arc<Store>,
    stop: Arc<AtomicBool>,
    stats: Arc<ScanStats>,
) -> anyhow::Result<ShinjukuSummary> {
    let mut front = front;
    if let Some(io) = front.iokernel.as_mut() {
        // The workers are threads iokerneld does not see: a front polling
        // while idle (docs/idle-poll.md) would hold the CPU they need.
        io.poll_while_idle = Duration::ZERO;
    }
    let (to_workers, requests) = mpsc::channel::<Inbound>();
    let (to_front, responses) = mpsc::channel::<Outbound>();
    let front_thread = {
        let (store, stop, stats) = (store.clone(), stop.clone(), stats.clone());
        std::thread::Builder::new()
            .name("scan-front".into())
            .spawn(move || {
                ginza_runtime::run(front, move || {
                    front_main(port, tcp, to_workers, responses, store, stop, stats)
                })
            })?
    };
    let handler_stats = stats.clone();
    let policy = shinjuku.policy.clone();
    let served = shinjuku::serve(
        shinjuku,
        shinjuku::classify(
            FromFront {
                requests,
                done: false,
            },
            move |(r, _): &Inbound| class_under(&policy, r),
        ),
        move |(request, from): Inbound| {
            let response = store.execute(&request);
            handler_stats.count(&response, request.class() == CLASS_SCAN);
            // The front runtime is gone only once it is stopping.
            let _ = to_front.send((response.encode(), from));
        },
    );
    if served.is_err() {
        // The workers never ran (a bad configuration): stop the front too.
        stop.store(true, Relaxed);
    }
    // The front ends once the workers' side (holding `to_front`) is gone.
    let front_result = front_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the front runtime's thread panicked"))?;
    let report = served.map_err(|e| anyhow::anyhow!("Shinjuku mode: {e}"))?;
    front_result
        .map_err(|e| anyhow::anyhow!("the front runtime: {e}"))?
        .map_err(|e| anyhow::anyhow!("serving port {port}: {e}"))?;
    Ok(ShinjukuSummary {
        served: report.completions.len() as u64,
        preempted_requests: report
            .completions
            .iter()
            .filter(|c| c.preemptions > 0)
            .count() as u64,
        coop_preemptions: report.coop_preemptions,
        signal_preemptions: report.signal_preemptions,
    })
}

/// The front runtime's main: receives UDP requests for the workers (a
/// malformed one is answered here), sends their responses, serves TCP.
fn front_main(
    port: u16,
    tcp: bool,
    to_workers: mpsc::Sender<Inbound>,
    responses: mpsc::Receiver<Outbound>,
    store: Arc<Store>,
    stop: Arc<AtomicBool>,
    stats: Arc<ScanStats>,
) -> io::Result<()> {
    let socket = Arc::new(UdpSocket::bind(port)?);
    socket.set_read_timeout(Some(STOP_POLL))?;
    let sender = {
        let (socket, stats) = (socket.clone(), stats.clone());
        ginza_runtime::spawn(move || loop {
            match responses.try_recv() {
                Ok((bytes, to)) => {
                    if socket.send_to(&bytes, to).is_err() {
                        stats.send_errors.fetch_add(1, Relaxed);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => ginza_runtime::sleep(SEND_POLL),
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        })
    };
    let tcp = if tcp {
        let (store, stop, stats) = (store.clone(), stop.clone(), stats.clone());
        Some(ginza_runtime::spawn(move || {
            serve_tcp(port, store, &stop, stats)
        }))
    } else {
        None
    };
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD];
    let mut result = Ok(());
    while !stop.load(Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        match Request::decode(&buf[..n]) {
            Ok(request) => {
                if to_workers.send((request, from)).is_err() {
                    break; // the workers' side failed; its error is reported
                }
            }
            Err(bad) => {
                stats.count(&bad, false);
                if socket.send_to(&bad.encode(), from).is_err() {
                    stats.send_errors.fetch_add(1, Relaxed);
                }
            }
        }
    }
    stop.store(true, Relaxed);
    // The dispatcher finishes what it holds, then drops the handler and
    // with it the responses' sender: the sender uthread sends the rest.
    drop(to_workers);
    sender
        .join()
        .map_err(|e| io::Error::other(format!("the response sender uthread: {e}")))?;
    if let Some(tcp) = tcp {
        tcp.join()
            .map_err(|e| io::Error::other(format!("the TCP uthread: {e}")))??;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn store() -> Store {
        Store::generate(7, 10_000)
    }

    /// iokerneld's classifier reads the byte at `class_offset`: under
    /// c-PRE-MQ a GET lands in a class with the GET SLO and a SCAN in one
    /// with the SCAN SLO; other policies name no classes.
    #[test]
    fn the_dispatch_spec_classifies_by_the_op_byte() {
        let us = Duration::from_micros;
        let spec = dispatch_spec("c-pre-mq", us(10), us(50), us(5_000), None);
        let class_of = |r: Request| {
            let byte = r.encode()[usize::from(spec.class_offset)];
            spec.classes[usize::from(byte)].slo_ns
        };
        assert_eq!(class_of(Request::get(1, 2)), 50_000);
        assert_eq!(class_of(Request::scan(1, 2, 10)), 5_000_000);
        // A datagram naming no op falls to class 0: the GET SLO.
        assert_eq!(spec.classes[0].slo_ns, 50_000);
        assert!(spec.sched_policy().is_ok(), "{spec:?}");
        for policy in ["c-fcfs", "c-pre-sq"] {
            let spec = dispatch_spec(policy, us(10), us(50), us(5_000), Some(us(50)));
            assert!(spec.classes.is_empty() && spec.class_offset == 0);
            assert_eq!(spec.backstop_ns, Some(50_000));
            assert!(spec.sched_policy().is_ok(), "{spec:?}");
        }
    }

    #[test]
    fn requests_and_responses_round_trip() {
        for r in [
            Request::get(1, 42),
            Request::scan(u64::MAX, 0, 1),
            Request::scan(9, u64::MAX, MAX_SCAN),
        ] {
            assert_eq!(Request::decode(&r.encode()), Ok(r));
        }
        let r = Response {
            id: 77,
            status: Status::NotFound,
            count: 3,
            checksum: 0xdead_beef,
        };
        assert_eq!(Response::decode(&r.encode()), Some(r));
        // The documented layout, byte by byte.
        let b = Request::scan(0x0102, 0x0a0b, 5).encode();
        assert_eq!(&b[..8], &[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(&b[8..16], &[2, 0, 0, 0, 0, 0, 0, 5]);
        assert_eq!(&b[16..], &[0, 0, 0, 0, 0, 0, 0x0a, 0x0b]);
    }

    #[test]
    fn malformed_requests_are_bad_requests_with_their_id() {
        let good = Request::scan(0x1234, 5, 10).encode();
        let mut cases: Vec<(Vec<u8>, u64)> = vec![
            (vec![], 0),
            (vec![1, 2, 3], 0),
            (good[..8].to_vec(), 0x1234),
            (good[..23].to_vec(), 0x1234),
            ([&good[..], &[0]].concat(), 0x1234),
        ];
        let mut set = |at: usize, v: u8| {
            let mut b = good;
            b[at] = v;
            cases.push((b.to_vec(), 0x1234));
        };
        set(8, 0); // no such op
        set(8, 3);
        set(10, 1); // padding not zero
        let mut get_with_count = Request::get(0x1234, 1).encode();
        get_with_count[15] = 1;
        cases.push((get_with_count.to_vec(), 0x1234));
        cases.push((Request::scan(0x1234, 1, 0).encode().to_vec(), 0x1234));
        cases.push((
            Request::scan(0x1234, 1, MAX_SCAN + 1).encode().to_vec(),
            0x1234,
        ));
        let s = store();
        for (bytes, id) in cases {
            let r = s.answer(&bytes);
            assert_eq!(r, Response::bad_request(id), "{bytes:?}");
            assert_eq!(Response::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn the_map_has_the_generated_keys() {
        let s = Store::generate(3, 100_000);
        assert_eq!(s.len(), 100_000, "keys are distinct");
        for i in [0, 1, 99_999] {
            let k = key_at(3, i);
            assert_eq!(s.map().get(&k), Some(&value_of(3, k)));
        }
        assert_ne!(key_at(3, 0), key_at(4, 0), "the seed matters");
    }

    #[test]
    fn get_reads_one_pair_or_says_not_found() {
        let s = store();
        let k = key_at(7, 123);
        let r = s.execute(&Request::get(5, k));
        assert_eq!(
            r,
            Response {
                id: 5,
                status: Status::Ok,
                count: 1,
                checksum: checksum([(k, value_of(7, k))]),
            }
        );
        let missing = (0..).find(|k| !s.map().contains_key(k)).unwrap();
        let r = s.execute(&Request::get(6, missing));
        assert_eq!((r.id, r.status, r.count), (6, Status::NotFound, 0));
    }

    #[test]
    fn scan_walks_count_keys_from_the_first_at_or_after_its_key() {
        let s = store();
        let keys: Vec<u64> = s.map().keys().copied().collect();
        for (from, count) in [
            (0u64, 1u32),
            (0, 10_000),
            (keys[500], 300),
            (keys[500] + 1, 300),
            (keys[9_990], 100),
            (u64::MAX, 5),
        ] {
            let expected: Vec<(u64, u64)> = keys
                .iter()
                .filter(|&&k| k >= from)
                .take(count as usize)
                .map(|&k| (k, value_of(7, k)))
                .collect();
            let r = s.execute(&Request::scan(1, from, count));
            assert_eq!(r.status, Status::Ok);
            assert_eq!(
                r.count as usize,
                expected.len(),
                "from {from} count {count}"
            );
            assert_eq!(r.checksum, checksum(expected));
        }
        // The order matters to the checksum.
        assert_ne!(checksum([(1, 2), (3, 4)]), checksum([(3, 4), (1, 2)]));
    }

    #[test]
    fn gets_and_scans_are_classes_under_mq_only() {
        let get = Request::get(1, 2);
        let scan = Request::scan(1, 2, 3);
        let mq = mq_policy(
            Duration::from_micros(10),
            Duration::from_micros(50),
            Duration::from_millis(5),
        );
        assert_eq!(class_under(&mq, &get), CLASS_GET);
        assert_eq!(class_under(&mq, &scan), CLASS_SCAN);
        assert_ne!(CLASS_GET, CLASS_SCAN);
        let sq = SchedPolicy::CPreSq {
            quantum: 10_000,
            placement: Placement::Tail,
        };
        for policy in [sq, SchedPolicy::CFcfs] {
            assert_eq!(class_under(&policy, &scan), 0);
            assert_eq!(class_under(&policy, &get), 0);
        }
    }

    proptest! {
        #[test]
        fn any_bytes_get_an_answer_and_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let s = Store::generate(1, 1_000);
            let r = s.answer(&bytes);
            prop_assert_eq!(Response::decode(&r.encode()), Some(r));
            if bytes.len() != REQUEST_LEN {
                prop_assert_eq!(r.status, Status::BadRequest);
            }
        }

        #[test]
        fn valid_requests_agree_with_the_map(key in any::<u64>(), count in 1u32..3_000, get in any::<bool>()) {
            let s = Store::generate(2, 2_000);
            let request = if get { Request::get(1, key) } else { Request::scan(1, key, count) };
            let r = s.answer(&request.encode());
            if get {
                prop_assert_eq!(r.status == Status::Ok, s.map().contains_key(&key));
            } else {
                let pairs: Vec<_> = s.map().range(key..).take(count as usize).map(|(&k, &v)| (k, v)).collect();
                prop_assert_eq!(r.count as usize, pairs.len());
                prop_assert_eq!(r.checksum, checksum(pairs));
            }
        }
    }
}
