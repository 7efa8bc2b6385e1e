//! `http-server` through the in-process iokerneld's software switch, with
//! a Ginza TCP client: keep-alive (several requests, pipelined ones too, on
//! one connection), `/bytes/N` bodies of exactly N bytes, a bad request
//! answered with 400 and the connection closed. Every test starts
//! iokerneld and holds the test lock.

mod http_scan_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_apps::http_server::{self, HttpStats, Options, ROOT_BODY};
use ginza_runtime::net::TcpStream;
use http_scan_common::{connect, iface, lock, Switch};

const SERVER: u8 = 1;
const CLIENT: u8 = 2;
const PORT: u16 = 80;

fn server_addr() -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(iface(SERVER).1, PORT))
}

/// A response as the client read it.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A client connection that reads responses (httparse's response parser)
/// and keeps what arrived after one for the next.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect() -> Client {
        let stream = connect(server_addr());
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, request: &str) {
        self.stream.write_all(request.as_bytes()).unwrap();
    }

    /// Reads more; false at the end of the stream.
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).expect("reading a response");
        self.buf.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// The next response (`head`: to a HEAD request, so no body).
    fn reply(&mut self, head: bool) -> Reply {
        let (status, headers, head_len) = loop {
            let mut fields = [httparse::EMPTY_HEADER; 32];
            let mut r = httparse::Response::new(&mut fields);
            match r.parse(&self.buf).expect("a well-formed response") {
                httparse::Status::Complete(n) => {
                    let headers = r
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8(h.value.to_vec()).unwrap(),
                            )
                        })
                        .collect::<Vec<_>>();
                    break (r.code.unwrap(), headers, n);
                }
                httparse::Status::Partial => {
                    assert!(self.fill(), "the stream ended inside a response head")
                }
            }
        };
        self.buf.drain(..head_len);
        let mut reply = Reply {
            status,
            headers,
            body: Vec::new(),
        };
        let length: usize = reply
            .header("content-length")
            .expect("Content-Length")
            .parse()
            .unwrap();
        let length = if head { 0 } else { length };
        while self.buf.len() < length {
            assert!(self.fill(), "the stream ended inside a body");
        }
        reply.body = self.buf.drain(..length).collect();
        reply
    }

    /// True if the server closed the connection with nothing more sent.
    fn closed_by_server(&mut self) -> bool {
        self.buf.is_empty() && !self.fill()
    }
}

/// http-server on the switch; runs `client` on a Ginza runtime, then stops
/// the server and returns its counters.
fn with_server(client: impl FnOnce() + Send + 'static) -> Arc<HttpStats> {
    with_server_options(Options::default(), client)
}

/// [`with_server`] with `options`.
fn with_server_options(options: Options, client: impl FnOnce() + Send + 'static) -> Arc<HttpStats> {
    let switch = Switch::start();
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(HttpStats::default());
    let (s2, st2) = (stop.clone(), stats.clone());
    let server = switch.start_app("http-server", SERVER, 1, move || {
        http_server::serve_with(PORT, options, s2, st2)
    });
    switch.run_client(CLIENT, client);
    stop.store(true, Relaxed);
    server.join(Duration::from_secs(10)).expect("http-server");
    stats
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let _lock = lock();
    let stats = with_server(|| {
        let mut c = Client::connect();
        for _ in 0..3 {
            c.send("GET / HTTP/1.1\r\nHost: ginza\r\n\r\n");
            let r = c.reply(false);
            assert_eq!(r.status, 200);
            assert_eq!(r.body, ROOT_BODY);
            assert_eq!(r.header("connection"), Some("keep-alive"));
            assert!(
                r.header("date").is_some_and(|d| d.ends_with(" GMT")),
                "{r:?}"
            );
        }
        c.send("HEAD /bytes/777 HTTP/1.1\r\nHost: ginza\r\n\r\n");
        let r = c.reply(true);
        assert_eq!((r.status, r.header("content-length")), (200, Some("777")));
        c.send("GET /missing HTTP/1.1\r\nHost: ginza\r\n\r\n");
        assert_eq!(c.reply(false).status, 404);
        c.send("DELETE / HTTP/1.1\r\nHost: ginza\r\n\r\n");
        let r = c.reply(false);
        assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
        // Pipelined: three requests in one write, answered in order.
        c.send(
            "GET /bytes/5 HTTP/1.1\r\nHost: g\r\n\r\nGET /nope HTTP/1.1\r\nHost: g\r\n\r\nGET /bytes/70000 HTTP/1.1\r\nHost: g\r\n\r\n",
        );
        let statuses: Vec<_> = (0..3)
            .map(|_| {
                let r = c.reply(false);
                (r.status, r.body.len())
            })
            .collect();
        assert_eq!(statuses, [(200, 5), (404, 10), (200, 70_000)]);
        // A request whose head arrives in pieces.
        for piece in ["GET /by", "tes/3 HTTP/1.1\r", "\nHost: g\r\n", "\r\n"] {
            c.send(piece);
            ginza_runtime::yield_now();
        }
        assert_eq!(c.reply(false).body, b"xxx");
        // Connection: close is honoured.
        c.send("GET / HTTP/1.1\r\nHost: ginza\r\nConnection: close\r\n\r\n");
        let r = c.reply(false);
        assert_eq!((r.status, r.header("connection")), (200, Some("close")));
        assert!(c.closed_by_server());
    });
    assert_eq!(stats.accepted.load(Relaxed), 1, "one connection");
    assert_eq!(stats.ok.load(Relaxed), 8);
    assert_eq!(stats.client_errors.load(Relaxed), 3);
}

#[test]
fn bytes_n_bodies_have_exactly_n_bytes() {
    let _lock = lock();
    let stats = with_server(|| {
        let mut c = Client::connect();
        for n in [0usize, 1, 1460, 65_536, 100_000, 1 << 20, 3 << 20] {
            c.send(&format!("GET /bytes/{n} HTTP/1.1\r\nHost: g\r\n\r\n"));
            let r = c.reply(false);
            assert_eq!(r.status, 200);
            assert_eq!(r.header("content-length"), Some(&*n.to_string()));
            assert_eq!(r.body.len(), n);
            assert!(r.body.iter().all(|&b| b == b'x'));
        }
        // Nothing beyond the bodies: the next response starts cleanly.
        c.send("GET / HTTP/1.1\r\nHost: g\r\n\r\n");
        assert_eq!(c.reply(false).body, ROOT_BODY);
    });
    assert_eq!(
        stats.body_bytes.load(Relaxed) as usize,
        1 + 1460 + 65_536 + 100_000 + (1 << 20) + (3 << 20) + ROOT_BODY.len()
    );
}

#[test]
fn a_bad_request_gets_400_and_the_connection_is_closed() {
    let _lock = lock();
    let stats = with_server(|| {
        let mut c = Client::connect();
        c.send("GET / HTTP/1.1\r\nHost: g\r\n\r\n");
        assert_eq!(c.reply(false).status, 200);
        c.send("this is not http\r\n\r\nGET / HTTP/1.1\r\nHost: g\r\n\r\n");
        let r = c.reply(false);
        assert_eq!((r.status, r.header("connection")), (400, Some("close")));
        assert!(c.closed_by_server(), "the connection stayed open");
        // HTTP/1.0 without keep-alive closes too.
        let mut c = Client::connect();
        c.send("GET /bytes/10 HTTP/1.0\r\n\r\n");
        assert_eq!(c.reply(false).body.len(), 10);
        assert!(c.closed_by_server());
        // A chunked request: 501, closed.
        let mut c = Client::connect();
        c.send(
            "POST / HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        );
        assert_eq!(c.reply(false).status, 501);
        assert!(c.closed_by_server());
    });
    assert_eq!(stats.accepted.load(Relaxed), 3);
    assert_eq!(stats.client_errors.load(Relaxed), 1);
    assert_eq!(stats.server_errors.load(Relaxed), 1);
}

#[test]
fn a_slow_client_holds_no_kthread_and_times_out_with_408() {
    let _lock = lock();
    let timeout = Duration::from_millis(300);
    let stats = with_server_options(
        Options {
            request_timeout: timeout,
        },
        move || {
            // A client sending its request a byte at a time, slowly.
            let slow = ginza_runtime::spawn(move || {
                let mut c = Client::connect();
                let t0 = Instant::now();
                for b in "GET / HTTP/1.1\r\nHost: slow\r\n\r\n".bytes() {
                    if c.stream.write_all(&[b]).is_err() {
                        break; // closed by the server
                    }
                    ginza_runtime::sleep(Duration::from_millis(20));
                    if t0.elapsed() > 3 * timeout {
                        break;
                    }
                }
                let r = c.reply(false);
                (r.status, t0.elapsed(), c.closed_by_server())
            });
            // Meanwhile the server (one kthread) answers others at once.
            for _ in 0..5 {
                let mut c = Client::connect();
                c.send("GET /bytes/100 HTTP/1.1\r\nHost: g\r\n\r\n");
                assert_eq!(c.reply(false).body.len(), 100);
            }
            let (status, took, closed) = slow.join().unwrap();
            assert_eq!(status, 408);
            assert!(took >= timeout, "408 after {took:?}");
            assert!(closed);
        },
    );
    assert_eq!(stats.ok.load(Relaxed), 5);
    assert_eq!(stats.client_errors.load(Relaxed), 1);
}
