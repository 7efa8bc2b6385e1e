//! The metrics listener: a thread that accepts connections on a TCP
//! address and a thread per connection (at most [`MAX_CONNECTIONS`]) that
//! answers its requests with [`crate::http::step`]. Prometheus keeps its
//! connection open between scrapes, so one connection must not hold up
//! another. Nothing here touches the daemon's loop: the answers come from
//! `render`, which reads the snapshot the loop published.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ginza_sys::poll::{poll_one, PollFlags};
use log::warn;

use crate::http::{self, Step};

/// Makes the metrics text of one scrape.
pub type Render = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Connections served at once; one more is answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 16;

/// A connection with no request for this long is closed (Prometheus
/// scrapes every 15 s by default, and opens a new one if it must).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the threads look at the stop flag while they wait.
const TICK: Duration = Duration::from_millis(100);

/// A response must be taken by the client within this long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A running metrics listener; stopped when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MetricsServer {
    /// Listens on `addr` and serves `render`'s text at `/metrics`.
    pub fn bind(addr: SocketAddr, render: Render) -> io::Result<MetricsServer> {
        Self::start(TcpListener::bind(addr)?, render)
    }

    /// Serves on a listener already bound.
    pub fn start(listener: TcpListener, render: Render) -> io::Result<MetricsServer> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ginza-metrics".into())
            .spawn(move || accept_loop(&listener, &render, &s))?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, render: &Render, stop: &Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match poll_one(listener.as_fd(), PollFlags::IN, Some(TICK)) {
            Ok(ready) if ready.is_empty() => continue,
            Ok(_) => {}
            Err(e) => {
                warn!("metrics: polling the listener: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors, say: wait a little rather than spin
                // on a listener that stays readable.
                warn!("metrics: accept: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.set_write_timeout(Some(TICK));
            let _ = (&stream).write_all(&http::error_response(
                503,
                &format!("{MAX_CONNECTIONS} connections open already\n"),
            ));
            continue;
        }
        let (render, stop, done) = (Arc::clone(render), Arc::clone(stop), Arc::clone(&open));
        let spawned = std::thread::Builder::new()
            .name("ginza-metrics-conn".into())
            .spawn(move || {
                serve(stream, &*render, &stop);
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            open.fetch_sub(1, Ordering::AcqRel);
            warn!("metrics: cannot start a connection thread: {e}");
        }
    }
}

/// Answers the requests of one connection until it closes, errs, idles
/// past [`IDLE_TIMEOUT`], asks to close, or the server stops.
fn serve(mut stream: TcpStream, render: &dyn Fn() -> Result<String, String>, stop: &AtomicBool) {
    if stream.set_read_timeout(Some(TICK)).is_err()
        || stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_err()
    {
        return;
    }
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    // Bytes of a request body still to skip.
    let mut skip = 0usize;
    let mut last = Instant::now();
    let mut fresh = false;
    loop {
        if skip > 0 {
            let n = skip.min(buf.len());
            buf.drain(..n);
            skip -= n;
        }
        if skip == 0 && fresh && !buf.is_empty() {
            match http::step(&buf, render) {
                Step::More => fresh = false,
                Step::Answer {
                    response,
                    consumed,
                    body,
                    keep_alive,
                } => {
                    if stream.write_all(&response).is_err() {
                        return;
                    }
                    if !keep_alive {
                        let _ = stream.shutdown(Shutdown::Both);
                        return;
                    }
                    buf.drain(..consumed.min(buf.len()));
                    skip = body;
                    last = Instant::now();
                    // A pipelined request may be in `buf` already.
                    continue;
                }
            }
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                fresh = true;
                last = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if last.elapsed() >= IDLE_TIMEOUT {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::exchange;

    fn server() -> MetricsServer {
        let n = Arc::new(AtomicUsize::new(0));
        MetricsServer::bind(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(move || {
                let i = n.fetch_add(1, Ordering::Relaxed);
                Ok(format!("# TYPE x counter\nx_total {i}\n# EOF\n"))
            }),
        )
        .unwrap()
    }

    #[test]
    fn requests_on_one_connection_pipelined_and_closed() {
        let s = server();
        let r = exchange(
            s.local_addr(),
            b"GET /metrics HTTP/1.1\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\nGET /nothing HTTP/1.1\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let r = String::from_utf8(r).unwrap();
        assert_eq!(r.matches("HTTP/1.1 200 OK").count(), 2, "{r}");
        assert!(r.contains("x_total 0\n"));
        assert!(r.contains("HTTP/1.1 404 Not Found"));
        // The server closed after the third answer: `exchange` returned.
        assert!(
            r.ends_with("not found: the metrics are at /metrics\n"),
            "{r}"
        );
    }

    #[test]
    fn a_bad_request_gets_400_and_the_connection_closes() {
        let s = server();
        let r = exchange(
            s.local_addr(),
            b"NOT HTTP AT ALL\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n",
        )
        .unwrap();
        let r = String::from_utf8(r).unwrap();
        assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");
        assert!(!r.contains("200 OK"), "nothing after a 400: {r}");
        // The listener still serves.
        let r = exchange(s.local_addr(), b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        assert!(String::from_utf8(r).unwrap().starts_with("HTTP/1.1 200 OK"));
    }

    #[test]
    fn a_request_body_is_skipped_not_taken_for_the_next_request() {
        let s = server();
        let r = exchange(
            s.local_addr(),
            b"GET /metrics HTTP/1.1\r\nContent-Length: 9\r\n\r\nGET / BAD\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let r = String::from_utf8(r).unwrap();
        assert_eq!(r.matches("HTTP/1.1 200 OK").count(), 2, "{r}");
    }

    #[test]
    fn stopping_closes_the_listener() {
        let s = server();
        let addr = s.local_addr();
        drop(s);
        assert!(TcpStream::connect(addr).is_err());
    }
}
