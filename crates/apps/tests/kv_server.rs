//! kv-server through the in-process iokerneld's software switch, with
//! Ginza clients (`ginza_runtime::net`) in a second runtime:
//!
//! * the scripted session of `kv_script` gets the same replies over TCP as
//!   the protocol engine gives in-process (which the differential test
//!   holds to memcached's);
//! * cas under contention: many uthreads, each on its own connection, add
//!   1 to one counter by gets/cas retry loops; it ends at exactly the
//!   number of increments. The same with `incr`.
//! * a client sending a request byte by byte does not hold the server's
//!   only kthread: another client is served meanwhile;
//! * the binary protocol over TCP, and UDP with memcached's frame header;
//! * clients that vanish mid-request (FIN, RST) leave nothing behind;
//! * the `kv-server` binary with its flags: LRU eviction under
//!   `--memory-limit`, refusal over `--item-size-max`; and its resident
//!   memory with 10,000 idle connections (under 200 MiB).
//!
//! Every test starts iokerneld and holds the test lock.

mod common;
mod kv_script;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_apps::echo_server::Protocols;
use ginza_apps::kv::binary::{self, op, Header};
use ginza_apps::kv::server::{serve, Session};
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::text::Flow;
use ginza_apps::kv::Kv;
use ginza_iokernel::{Config as IokConfig, InProcess};
use ginza_net::{Ipv4Addr, MacAddr};
use ginza_runtime::net::{NetConfig, TcpStream, UdpSocket};
use ginza_runtime::{Class, Config, IokernelConfig};
use kv_script::{run_script, script};

const PORT: u16 = 11211;
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const WAIT: Duration = Duration::from_secs(20);

fn server_addr() -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(SERVER_IP, PORT))
}

/// iokerneld with only its software switch.
struct Switch {
    io: Option<InProcess>,
    dir: std::path::PathBuf,
}

impl Switch {
    fn start() -> Switch {
        let dir = std::env::temp_dir().join(format!("ginza-apps-kv-{}", std::process::id()));
        let mut cores = ginza_sys::affinity::allowed_cpus().unwrap();
        cores.truncate(2);
        let mut cfg = IokConfig::new(cores);
        cfg.socket = dir.join("iokerneld.sock");
        cfg.idle_sleep = Some(Duration::from_millis(1));
        Switch {
            io: Some(InProcess::start(cfg).expect("iokerneld")),
            dir,
        }
    }

    fn app(&self, name: &str, last: u8, ip: Ipv4Addr, kthreads: usize) -> Config {
        let mut io = IokernelConfig::new(name, Class::LatencyCritical);
        io.socket = Some(self.io.as_ref().unwrap().socket().to_path_buf());
        io.net = Some(NetConfig::new(
            MacAddr([0x02, 0x4b, 0x56, 0x00, 0x00, last]),
            ip,
        ));
        Config {
            iokernel: Some(io),
            ..Config::with_kthreads(kthreads)
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        drop(self.io.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// kv-server (TCP and UDP) in its own runtime on a thread; stopped on drop.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    kv: Kv,
}

impl Server {
    fn start(switch: &Switch, kthreads: usize) -> Server {
        let kv = Kv::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = switch.app("kv-server", 1, SERVER_IP, kthreads);
        let (s2, kv2) = (stop.clone(), kv.clone());
        let thread = std::thread::spawn(move || {
            ginza_runtime::run(cfg, move || serve(PORT, Protocols::BOTH, kv2, s2))
                .expect("the server's runtime")
                .expect("kv-server");
        });
        Server {
            stop,
            thread: Some(thread),
            kv,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            if !std::thread::panicking() {
                t.join().expect("the server thread");
            }
        }
    }
}

/// Runs `body` in a client runtime.
fn client<T: Send + 'static>(
    switch: &Switch,
    kthreads: usize,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    ginza_runtime::run(switch.app("kv-client", 2, CLIENT_IP, kthreads), body)
        .expect("the client's runtime")
}

/// A connection to the server, retried while it is not listening yet.
fn connect() -> TcpStream {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(server_addr()) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                return s;
            }
            Err(e) if t0.elapsed() < WAIT => {
                let _ = e;
                ginza_runtime::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("connecting to kv-server: {e}"),
        }
    }
}

/// Reads until `reply` ends with `end`.
fn read_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    let t0 = Instant::now();
    while !reply.ends_with(end) {
        assert!(
            t0.elapsed() < WAIT,
            "no reply ending in {end:?}: {:?}",
            String::from_utf8_lossy(&reply)
        );
        match s.read(&mut buf) {
            Ok(0) => panic!("closed; got {:?}", String::from_utf8_lossy(&reply)),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("{e}"),
        }
    }
    reply
}

fn request(s: &mut TcpStream, req: &str, end: &str) -> String {
    s.write_all(req.as_bytes()).unwrap();
    String::from_utf8(read_until(s, end.as_bytes())).unwrap()
}

/// kv-server's engine behind an in-memory connection (the reference).
struct Engine {
    kv: Kv,
    session: Session,
    input: Vec<u8>,
    output: Vec<u8>,
    closed: bool,
}

impl Write for Engine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.input.extend_from_slice(buf);
        let (used, _, flow) = self
            .session
            .process(&self.input, &self.kv, &mut self.output);
        self.input.drain(..used);
        self.closed |= flow == Flow::Close;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Engine {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.output.is_empty() {
            return if self.closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(self.output.len());
        buf[..n].copy_from_slice(&self.output[..n]);
        self.output.drain(..n);
        Ok(n)
    }
}

#[test]
fn the_scripted_session_over_tcp_gets_the_engines_replies() {
    let _lock = common::lock();
    let switch = Switch::start();
    let _server = Server::start(&switch, 2);
    let script = script();
    let s2 = script.clone();
    let ours = client(&switch, 1, move || run_script(&s2, connect));
    let kv = Kv::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
    let reference = run_script(&script, || Engine {
        kv: kv.clone(),
        session: Session::for_first_byte(b's'),
        input: Vec::new(),
        output: Vec::new(),
        closed: false,
    });
    assert_eq!(ours[0][0], b"STORED\r\n");
    kv_script::assert_same(&script, &ours, &reference);
}

#[test]
fn cas_and_incr_under_contention_lose_no_update() {
    let _lock = common::lock();
    let switch = Switch::start();
    let server = Server::start(&switch, 2);
    const WORKERS: u64 = 16;
    const EACH: u64 = 20;
    let (value, incr, retries) = client(&switch, 2, || {
        let mut s = connect();
        assert_eq!(
            request(
                &mut s,
                "set counter 0 0 1\r\n0\r\nset hits 0 0 1\r\n0\r\n",
                "STORED\r\nSTORED\r\n"
            ),
            "STORED\r\nSTORED\r\n"
        );
        let retries = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let retries = retries.clone();
                ginza_runtime::spawn(move || {
                    let mut s = connect();
                    for _ in 0..EACH {
                        loop {
                            let reply = request(&mut s, "gets counter\r\n", "END\r\n");
                            // VALUE counter 0 <len> <cas>\r\n<n>\r\nEND\r\n
                            let mut lines = reply.split("\r\n");
                            let header: Vec<&str> = lines.next().unwrap().split(' ').collect();
                            let cas: u64 = header[4].parse().unwrap();
                            let n: u64 = lines.next().unwrap().trim().parse().unwrap();
                            let next = (n + 1).to_string();
                            let store =
                                format!("cas counter 0 0 {} {cas}\r\n{next}\r\n", next.len());
                            let answer = request(&mut s, &store, "\r\n");
                            match answer.as_str() {
                                "STORED\r\n" => break,
                                "EXISTS\r\n" => {
                                    retries.fetch_add(1, Relaxed);
                                }
                                other => panic!("cas: {other:?}"),
                            }
                        }
                        let r = request(&mut s, "incr hits 1\r\n", "\r\n");
                        assert!(r.trim().parse::<u64>().is_ok(), "{r:?}");
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let value = request(&mut s, "get counter\r\n", "END\r\n");
        let incr = request(&mut s, "get hits\r\n", "END\r\n");
        (value, incr, retries.load(Relaxed))
    });
    let n = WORKERS * EACH;
    let expect = |key: &str| format!("VALUE {key} 0 {}\r\n{n}\r\nEND\r\n", n.to_string().len());
    assert_eq!(value, expect("counter"));
    assert_eq!(incr, expect("hits"));
    println!("{n} cas increments, {retries} retries after EXISTS");
    assert_eq!(server.kv.stats.cas_hits.load(Relaxed), n);
}

#[test]
fn a_byte_by_byte_client_does_not_hold_the_only_kthread() {
    let _lock = common::lock();
    let switch = Switch::start();
    let _server = Server::start(&switch, 1);
    let (slow, fast_rounds) = client(&switch, 1, || {
        let slow_done = Arc::new(AtomicBool::new(false));
        let done2 = slow_done.clone();
        let slow = ginza_runtime::spawn(move || {
            let mut s = connect();
            let req = b"set slow 0 0 10\r\n0123456789\r\n";
            for &b in req.iter() {
                s.write_all(&[b]).unwrap();
                ginza_runtime::sleep(Duration::from_millis(5));
            }
            let r = read_until(&mut s, b"\r\n");
            done2.store(true, Relaxed);
            r
        });
        // Meanwhile another connection is served, many times over.
        let mut s = connect();
        let mut rounds = 0;
        while !slow_done.load(Relaxed) {
            assert_eq!(request(&mut s, "get nothing\r\n", "END\r\n"), "END\r\n");
            rounds += 1;
        }
        (slow.join().unwrap(), rounds)
    });
    assert_eq!(slow, b"STORED\r\n");
    assert!(
        fast_rounds >= 10,
        "only {fast_rounds} requests served while the slow one trickled in"
    );
}

fn bin_request(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
    binary::encode_request(opcode, extras, key, value, cas, 7)
}

fn bin_response(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut head = [0u8; binary::HEADER_LEN];
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.read_exact(&mut head).unwrap();
    let h = Header::parse(&head).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).unwrap();
    (h, body)
}

#[test]
fn binary_over_tcp_and_text_over_udp() {
    let _lock = common::lock();
    let switch = Switch::start();
    let _server = Server::start(&switch, 1);
    client(&switch, 1, || {
        let mut s = connect();
        s.write_all(&bin_request(
            op::SET,
            &[0, 0, 0, 3, 0, 0, 0, 0],
            b"bk",
            b"value",
            0,
        ))
        .unwrap();
        let (h, _) = bin_response(&mut s);
        assert_eq!(
            (h.magic, h.opcode, h.vbucket_or_status, h.opaque),
            (binary::RESPONSE_MAGIC, op::SET, 0, 7)
        );
        s.write_all(&bin_request(op::GET, &[], b"bk", &[], 0))
            .unwrap();
        let (h, body) = bin_response(&mut s);
        assert_eq!(h.vbucket_or_status, 0);
        assert_eq!(body, b"\0\0\0\x03value");
        s.write_all(&bin_request(op::GET, &[], b"none", &[], 0))
            .unwrap();
        let (h, body) = bin_response(&mut s);
        assert_eq!(
            (h.vbucket_or_status, body.as_slice()),
            (binary::status::KEY_ENOENT, &b"Not found"[..])
        );

        // UDP: the same item, through the frame header.
        let udp = UdpSocket::bind(0).unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let target = SocketAddrV4::new(SERVER_IP, PORT);
        let mut frame = vec![0x12, 0x34, 0, 0, 0, 1, 0, 0];
        frame.extend_from_slice(b"get bk\r\n");
        let t0 = Instant::now();
        let reply = loop {
            udp.send_to(&frame, target).unwrap();
            let mut buf = [0u8; 2048];
            match udp.recv_from(&mut buf) {
                Ok((n, _)) => break buf[..n].to_vec(),
                Err(_) if t0.elapsed() < WAIT => continue,
                Err(e) => panic!("no UDP reply: {e}"),
            }
        };
        assert_eq!(&reply[..8], &[0x12, 0x34, 0, 0, 0, 1, 0, 0]);
        assert_eq!(&reply[8..], b"VALUE bk 3 5\r\nvalue\r\nEND\r\n");
    });
}

#[test]
fn clients_gone_mid_request_harm_no_one() {
    let _lock = common::lock();
    let switch = Switch::start();
    let server = Server::start(&switch, 1);
    let stats = server.kv.stats.clone();
    client(&switch, 1, move || {
        // Half a set, then a close (FIN).
        let mut s = connect();
        s.write_all(b"set k 0 0 100\r\nabc").unwrap();
        drop(s);
        // A request whose reply is never read, half another, then a close
        // with unread data (RST).
        let mut s = connect();
        s.write_all(b"get k\r\nset j 0 0 5\r\nab").unwrap();
        // Its reply is on the way back once the get is counted.
        let t0 = Instant::now();
        while stats.get_misses.load(Relaxed) == 0 {
            assert!(t0.elapsed() < WAIT, "the get was never served");
            ginza_runtime::sleep(Duration::from_millis(1));
        }
        drop(s);
        let mut s = connect();
        assert_eq!(request(&mut s, "get k j\r\n", "END\r\n"), "END\r\n");
        // The connections' uthreads ended: only this one is open.
        let t0 = Instant::now();
        while stats.curr_connections.load(Relaxed) != 1 {
            assert!(
                t0.elapsed() < WAIT,
                "{} connections still open",
                stats.curr_connections.load(Relaxed)
            );
            ginza_runtime::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            request(&mut s, "set k 0 0 1\r\nv\r\nget k\r\n", "END\r\n"),
            "STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n"
        );
    });
    assert_eq!(server.kv.stats.total_connections.load(Relaxed), 3);
}

/// The `kv-server` binary as a child process registered with `switch`'s
/// iokerneld; killed on drop.
struct Binary(std::process::Child);

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_kv_server_binary_evicts_under_its_memory_limit_and_refuses_large_items() {
    let _lock = common::lock();
    let switch = Switch::start();
    let socket = switch.io.as_ref().unwrap().socket().to_path_buf();
    let mut child = Binary(
        std::process::Command::new(env!("CARGO_BIN_EXE_kv-server"))
            .args(["--mac", "02:4b:56:00:00:01", "--ip", &SERVER_IP.to_string()])
            .args(["--port", &PORT.to_string(), "--kthreads", "1"])
            .args(["--memory-limit", "1", "--item-size-max", "65536"])
            // The server's bound, not the test's: it must outlive a slow
            // client on a loaded machine (dropping `child` kills it).
            .args(["--run-for", "600s", "--socket"])
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("starting kv-server"),
    );
    let (oldest, newest, too_large, stats) = client(&switch, 1, || {
        let mut s = connect();
        let value = "v".repeat(50_000);
        // 40 × 50 KB in 1 MiB: the first ones must go.
        for i in 0..40 {
            let r = request(
                &mut s,
                &format!("set item{i} 0 0 {}\r\n{value}\r\n", value.len()),
                "\r\n",
            );
            assert_eq!(r, "STORED\r\n", "item{i}");
        }
        let oldest = request(&mut s, "get item0\r\n", "END\r\n");
        let newest = request(&mut s, "get item39\r\n", "END\r\n");
        let big = "b".repeat(70_000);
        let too_large = request(
            &mut s,
            &format!("set big 0 0 {}\r\n{big}\r\n", big.len()),
            "\r\n",
        );
        let stats = request(&mut s, "stats\r\n", "END\r\n");
        (oldest, newest, too_large, stats)
    });
    assert_eq!(
        oldest, "END\r\n",
        "the least recently used item was evicted"
    );
    assert!(
        newest.starts_with("VALUE item39 0 50000\r\n"),
        "{}",
        &newest[..40.min(newest.len())]
    );
    assert_eq!(too_large, "SERVER_ERROR object too large for cache\r\n");
    let stat = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
            .unwrap_or_else(|| panic!("no {name} in {stats}"))
            .parse()
            .unwrap()
    };
    assert!(stat("evictions") > 0);
    assert!(stat("bytes") <= 1 << 20);
    assert_eq!(stat("limit_maxbytes"), 1 << 20);
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "kv-server is still serving"
    );
}

/// The resident memory of process `pid`, in bytes.
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[test]
fn ten_thousand_idle_connections_cost_the_server_less_than_200_mib() {
    let _lock = common::lock();
    let switch = Switch::start();
    let socket = switch.io.as_ref().unwrap().socket().to_path_buf();
    let child = Binary(
        std::process::Command::new(env!("CARGO_BIN_EXE_kv-server"))
            .args(["--mac", "02:4b:56:00:00:01", "--ip", &SERVER_IP.to_string()])
            .args(["--port", &PORT.to_string(), "--kthreads", "1"])
            // A bound on a test that loses its way, not on its time: slow
            // under a loaded machine, the server must outlive the client.
            .args(["--run-for", "600s", "--socket"])
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("starting kv-server"),
    );
    let pid = child.0.id();
    const CONNECTIONS: usize = 10_000;
    let (before, after) = client(&switch, 1, move || {
        let mut first = connect();
        assert_eq!(request(&mut first, "get x\r\n", "END\r\n"), "END\r\n");
        let before = resident(pid);
        let mut open = Vec::with_capacity(CONNECTIONS);
        for _ in 1..CONNECTIONS {
            // A server that has gone answers no SYN: fail within WAIT,
            // not after each connection's two minutes of retries.
            open.push(TcpStream::connect_timeout(&server_addr(), WAIT).expect("connecting"));
        }
        // Every connection is served: one request on the last and the
        // first.
        let mut last = open.pop().unwrap();
        last.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        assert_eq!(request(&mut last, "get x\r\n", "END\r\n"), "END\r\n");
        assert_eq!(request(&mut first, "get x\r\n", "END\r\n"), "END\r\n");
        let after = resident(pid);
        drop(open);
        (before, after)
    });
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "kv-server resident: {:.1} MiB with 1 connection, {:.1} MiB with {CONNECTIONS} ({:.1} KiB each)",
        mib(before),
        mib(after),
        (after - before) as f64 / 1024.0 / CONNECTIONS as f64
    );
    assert!(
        after < 200 << 20,
        "{:.1} MiB resident with {CONNECTIONS} idle connections",
        mib(after)
    );
}
