//! Linux peers on 127.0.0.1 for the kernel-backend tests: echo servers on
//! plain std threads (one of them dropping every other request), a tiny
//! memcached stand-in, and closed-loop ping-pong clients to compare the
//! generator's latency with.
#![allow(dead_code)] // each test binary uses a part

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A UDP echo thread; with `drop_even`, requests whose sequence number
/// (first 8 bytes) is even are dropped.
pub struct UdpEcho {
    pub addr: SocketAddr,
    pub echoed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UdpEcho {
    pub fn start(drop_even: bool) -> UdpEcho {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let addr = s.local_addr().unwrap();
        let (stop, echoed) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (stop2, echoed2) = (stop.clone(), echoed.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop2.load(Relaxed) {
                let Ok((n, from)) = s.recv_from(&mut buf) else {
                    continue;
                };
                if drop_even && n >= 8 && u64::from_be_bytes(buf[..8].try_into().unwrap()) % 2 == 0
                {
                    continue;
                }
                if s.send_to(&buf[..n], from).is_ok() {
                    echoed2.fetch_add(1, Relaxed);
                }
            }
        });
        UdpEcho {
            addr,
            echoed,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP server on 127.0.0.1: a thread per connection (small stacks, so
/// thousands are cheap) running `serve`. The accepting thread stays
/// blocked in `accept` after the test; connection threads end when the
/// client closes.
pub struct TcpServer {
    pub addr: SocketAddr,
    /// Connections accepted.
    pub accepted: Arc<AtomicU64>,
    /// Connections on which at least one request came.
    pub used: Arc<AtomicU64>,
}

impl TcpServer {
    pub fn start(serve: fn(TcpStream, &AtomicU64)) -> TcpServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (accepted, used) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (a2, u2) = (accepted.clone(), used.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                a2.fetch_add(1, Relaxed);
                let used = u2.clone();
                std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || serve(s, &used))
                    .unwrap();
            }
        });
        TcpServer {
            addr,
            accepted,
            used,
        }
    }

    /// An echo server.
    pub fn echo() -> TcpServer {
        TcpServer::start(echo_connection)
    }
}

fn echo_connection(mut s: TcpStream, used: &AtomicU64) {
    let _ = s.set_nodelay(true);
    let mut buf = [0u8; 4096];
    let mut first = true;
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if first {
                    used.fetch_add(1, Relaxed);
                    first = false;
                }
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// A stand-in for memcached: `get KEY` and `set KEY FLAGS EXPTIME BYTES`
/// of the text protocol over a shared map; anything else gets `ERROR`.
pub fn memcached_connection(s: TcpStream, used: &AtomicU64) {
    static STORE: Mutex<Option<HashMap<String, Vec<u8>>>> = Mutex::new(None);
    let _ = s.set_nodelay(true);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let mut first = true;
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if first {
            used.fetch_add(1, Relaxed);
            first = false;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["get", key] => {
                let store = STORE.lock().unwrap();
                match store.as_ref().and_then(|m| m.get(*key)) {
                    Some(v) => {
                        let mut a = format!("VALUE {key} 0 {}\r\n", v.len()).into_bytes();
                        a.extend_from_slice(v);
                        a.extend_from_slice(b"\r\nEND\r\n");
                        a
                    }
                    None => b"END\r\n".to_vec(),
                }
            }
            ["set", key, _, _, bytes] => {
                let n: usize = bytes.parse().unwrap();
                let mut v = vec![0u8; n + 2];
                if r.read_exact(&mut v).is_err() {
                    return;
                }
                v.truncate(n);
                STORE
                    .lock()
                    .unwrap()
                    .get_or_insert_with(HashMap::new)
                    .insert(key.to_string(), v);
                b"STORED\r\n".to_vec()
            }
            _ => b"ERROR\r\n".to_vec(),
        };
        if w.write_all(&answer).is_err() {
            return;
        }
    }
}

/// Median of closed-loop round trips of `size`-byte requests over UDP,
/// `gap` apart (so that both ends idle between requests as they do under
/// the generator's low load).
pub fn udp_ping_pong_p50(target: SocketAddr, size: usize, n: usize, gap: Duration) -> Duration {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(target).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut req = vec![0u8; size];
    let mut buf = vec![0u8; size];
    let mut rtts = Vec::with_capacity(n);
    for i in 0..n as u64 + 100 {
        // The same id scheme as the generator (odd: never dropped).
        req[..8].copy_from_slice(&(2 * i + 1).to_be_bytes());
        let t = Instant::now();
        s.send(&req).unwrap();
        s.recv(&mut buf).unwrap();
        if i >= 100 {
            rtts.push(t.elapsed());
        }
        // Pacing, not synchronisation: the next request waits for nothing.
        std::thread::sleep(gap);
    }
    rtts.sort();
    rtts[n / 2]
}

/// Median of closed-loop round trips of `size`-byte requests over TCP,
/// `gap` apart.
pub fn tcp_ping_pong_p50(target: SocketAddr, size: usize, n: usize, gap: Duration) -> Duration {
    let mut s = TcpStream::connect(target).unwrap();
    s.set_nodelay(true).unwrap();
    let req = vec![7u8; size];
    let mut buf = vec![0u8; size];
    let mut rtts = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let t = Instant::now();
        s.write_all(&req).unwrap();
        s.read_exact(&mut buf).unwrap();
        if i >= 100 {
            rtts.push(t.elapsed());
        }
        // Pacing, not synchronisation: the next request waits for nothing.
        std::thread::sleep(gap);
    }
    rtts.sort();
    rtts[n / 2]
}

/// A keep-alive HTTP/1.1 server answering every request (up to its blank
/// line) with `200 OK` and a 5-byte body, or `404` for paths other than `/`.
pub fn http_connection(s: TcpStream, used: &AtomicU64) {
    let _ = s.set_nodelay(true);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut first = true;
    loop {
        let mut request_line = String::new();
        match r.read_line(&mut request_line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        loop {
            let mut header = String::new();
            match r.read_line(&mut header) {
                Ok(0) | Err(_) => return,
                Ok(_) if header == "\r\n" => break,
                Ok(_) => {}
            }
        }
        if first {
            used.fetch_add(1, Relaxed);
            first = false;
        }
        let answer: &[u8] = if request_line.starts_with("GET / ") {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
        } else {
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        };
        if w.write_all(answer).is_err() {
            return;
        }
    }
}

/// memcached over UDP, as far as the generator needs: each datagram's
/// frame header comes back with a miss (`END`) or `STORED`.
pub struct MemcachedUdp {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MemcachedUdp {
    pub fn start() -> MemcachedUdp {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let addr = s.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop2.load(Relaxed) {
                let Ok((n, from)) = s.recv_from(&mut buf) else {
                    continue;
                };
                if n < 8 {
                    continue;
                }
                let mut answer = buf[..8].to_vec();
                answer.extend_from_slice(if buf[8..n].starts_with(b"get ") {
                    b"END\r\n"
                } else {
                    b"STORED\r\n"
                });
                let _ = s.send_to(&answer, from);
            }
        });
        MemcachedUdp {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for MemcachedUdp {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP server that reads requests and never answers.
pub fn silent_connection(mut s: TcpStream, used: &AtomicU64) {
    let mut buf = [0u8; 4096];
    let mut first = true;
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            return;
        }
        if first {
            used.fetch_add(1, Relaxed);
            first = false;
        }
    }
}
