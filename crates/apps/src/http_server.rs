//! `http-server`: HTTP/1.1 with keep-alive and pipelining, static responses
//! — the application of DLibOS's webserver experiment (docs/design.md,
//! "Applications, load and experiments").
//!
//! Resources:
//!
//! * `GET /`: a small fixed text body ([`ROOT_BODY`]).
//! * `GET /bytes/N`: a body of exactly `N` bytes (`x`), `N` ≤
//!   [`MAX_BYTES_BODY`] (16 MiB); a larger or non-decimal `N` is a 400.
//! * `HEAD` of either: the same headers (the same `Content-Length`), no body.
//!
//! Errors: a malformed request (httparse's error, a bad `Content-Length`, an
//! HTTP/1.1 request without `Host`) gets 400 and the connection is closed;
//! a request head longer than [`MAX_HEAD_BYTES`] or with more than
//! [`MAX_HEADERS`] header fields gets 431 and is closed; an unknown path
//! 404; a method other than GET and HEAD on a known path 405 with
//! `Allow: GET, HEAD`; a request with `Transfer-Encoding` (chunked bodies)
//! 501 and the connection is closed, since its body could not be skipped
//! without decoding it; a request body longer than [`MAX_REQUEST_BODY`] 413
//! and closed. A request body announced by `Content-Length` (on any method)
//! is read and discarded.
//!
//! Responses carry `Date` ([`http_date`]).
//!
//! A request whose head or body is still arriving [`Options::request_timeout`]
//! (30 s) after its first byte gets 408 and is closed.
//!
//! Connections: HTTP/1.1 stays open unless the request says
//! `Connection: close`; HTTP/1.0 closes unless it says
//! `Connection: keep-alive`. Requests may be pipelined: the responses go out
//! in order, and after one that closes, the rest of the input is ignored.
//!
//! The protocol is [`Session`], which turns the bytes of one connection into
//! [`Response`]s with no sockets involved (unit-tested without a runtime);
//! [`serve`] runs it on a uthread per connection of a
//! `ginza_runtime::net::TcpListener`.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ginza_runtime::metrics::RequestTimer;
use ginza_runtime::net::TcpStream;

use crate::serve::{is_timeout, STOP_POLL};

/// The body of `GET /`.
pub const ROOT_BODY: &[u8] = b"Hello from Ginza's http-server\n";
/// The largest `N` of `/bytes/N`.
pub const MAX_BYTES_BODY: u64 = 16 << 20;
/// The longest request head (request line and header fields) accepted.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// The most header fields a request may have.
pub const MAX_HEADERS: usize = 64;
/// The longest request body read and discarded.
pub const MAX_REQUEST_BODY: u64 = 16 << 20;
/// The methods the resources allow (the `Allow` header of a 405).
pub const ALLOWED_METHODS: &str = "GET, HEAD";

/// What a response's body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body (HEAD).
    None,
    /// Fixed bytes.
    Static(&'static [u8]),
    /// `n` filler bytes (`x`), produced as they are written.
    Filler(u64),
}

impl Body {
    fn len(self) -> u64 {
        match self {
            Body::None => 0,
            Body::Static(b) => b.len() as u64,
            Body::Filler(n) => n,
        }
    }
}

/// One response: its status line and headers, and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The status line and header fields, ending with the empty line.
    pub head: Vec<u8>,
    pub body: Body,
    /// The connection closes after this response.
    pub close: bool,
}

impl Response {
    /// A response with `status` whose entity is `body` (`head_only`: HEAD,
    /// so the headers describe `body` but it is not sent).
    fn new(status: u16, body: Body, head_only: bool, close: bool, allow: bool) -> Response {
        let mut head = format!(
            "HTTP/1.1 {status} {}\r\nServer: ginza-http\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n",
            reason(status),
            body.len()
        );
        if allow {
            head.push_str("Allow: ");
            head.push_str(ALLOWED_METHODS);
            head.push_str("\r\n");
        }
        head.push_str(if close {
            "Connection: close\r\n\r\n"
        } else {
            "Connection: keep-alive\r\n\r\n"
        });
        Response {
            status,
            head: head.into_bytes(),
            body: if head_only { Body::None } else { body },
            close,
        }
    }

    /// An error response with a one-line body.
    fn error(status: u16, head_only: bool, close: bool) -> Response {
        let body = match status {
            400 => b"bad request\n" as &'static [u8],
            404 => b"not found\n",
            405 => b"method not allowed\n",
            408 => b"request timeout\n",
            413 => b"request body too large\n",
            431 => b"request header fields too large\n",
            501 => b"transfer-encoding not implemented\n",
            _ => b"error\n",
        };
        Response::new(status, Body::Static(body), head_only, close, status == 405)
    }

    /// The response's bytes on the wire (for tests; servers use
    /// [`write_responses`], which does not build large bodies in memory).
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut flushed, mut out) = (Vec::new(), Vec::new());
        write_responses(std::slice::from_ref(self), &mut out, |b| {
            flushed.extend_from_slice(b);
            Ok(())
        })
        .expect("writing to memory");
        flushed.extend_from_slice(&out);
        flushed
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        _ => "Error",
    }
}

/// Filler bytes of `/bytes/N` bodies, a chunk at a time.
static FILLER: [u8; 64 * 1024] = [b'x'; 64 * 1024];
/// Responses are gathered into writes of about this size.
const WRITE_CHUNK: usize = 64 * 1024;

/// Appends `responses` to `out`, handing `out` to `flush` (which must
/// consume it, e.g. write it to a socket) whenever it reaches
/// [`WRITE_CHUNK`], so that pipelined small responses go out in one write
/// and a 16 MiB body never sits in memory. `out` may hold less than a chunk
/// when it returns; the caller flushes the rest.
pub fn write_responses(
    responses: &[Response],
    out: &mut Vec<u8>,
    mut flush: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut flush_full = |out: &mut Vec<u8>| -> io::Result<()> {
        if out.len() >= WRITE_CHUNK {
            flush(out)?;
            out.clear();
        }
        Ok(())
    };
    for r in responses {
        out.extend_from_slice(&r.head);
        match r.body {
            Body::None => {}
            Body::Static(b) => out.extend_from_slice(b),
            Body::Filler(n) => {
                let mut left = n;
                while left > 0 {
                    flush_full(out)?;
                    let room = WRITE_CHUNK.saturating_sub(out.len()).max(1);
                    let take = left.min(room as u64).min(FILLER.len() as u64) as usize;
                    out.extend_from_slice(&FILLER[..take]);
                    left -= take as u64;
                }
            }
        }
        flush_full(out)?;
    }
    Ok(())
}

/// The HTTP side of one connection: bytes in, responses out.
#[derive(Debug, Default)]
pub struct Session {
    /// Received bytes not yet part of a handled request.
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no end of the head.
    scanned: usize,
    /// Request-body bytes still to discard.
    discard: u64,
    /// A response that closes the connection has been produced.
    closed: bool,
    /// The `Date` header field's line, if the caller gave the time
    /// ([`Session::set_date`]), and the second it shows.
    date: Option<(u64, String)>,
}

/// The parts of a request head that decide the response.
struct Head<'a> {
    method: &'a str,
    path: &'a str,
    version: u8,
    host: bool,
    close: bool,
    keep_alive: bool,
    transfer_encoding: bool,
    content_length: Result<u64, ()>,
}

impl Session {
    pub fn new() -> Session {
        Session::default()
    }

    /// True once a response that closes the connection has been produced:
    /// nothing more will be read.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Responses from now on carry `now` as their `Date` (RFC 9110
    /// §6.6.1); without it they carry none (the unit tests' responses do
    /// not depend on the clock). Cheap when the second has not changed.
    pub fn set_date(&mut self, now: SystemTime) {
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.date.as_ref().is_none_or(|(at, _)| *at != secs) {
            self.date = Some((secs, format!("Date: {}\r\n", http_date(secs))));
        }
    }

    /// `r` with the `Date` line after its status line, if there is one.
    fn stamp(&self, mut r: Response) -> Response {
        if let Some((_, line)) = &self.date {
            let after_status = r
                .head
                .windows(2)
                .position(|w| w == b"\r\n")
                .map_or(r.head.len(), |i| i + 2);
            r.head.splice(after_status..after_status, line.bytes());
        }
        r
    }

    /// True while part of a request (its head, or a body being skipped)
    /// has arrived and the rest has not.
    pub fn is_mid_request(&self) -> bool {
        !self.closed && (!self.pending.is_empty() || self.discard > 0)
    }

    /// The response when the rest of a request took too long: 408, and the
    /// connection closes.
    pub fn timed_out(&mut self) -> Response {
        self.closed = true;
        self.pending = Vec::new();
        self.stamp(Response::error(408, false, true))
    }

    /// Takes the next bytes the client sent; returns the responses to the
    /// requests they complete, in order. A request split across calls waits
    /// for the rest.
    pub fn feed(&mut self, input: &[u8]) -> Vec<Response> {
        let mut responses = Vec::new();
        if self.closed {
            return responses;
        }
        let mut input = input;
        // A body being discarded consumes input before it is buffered.
        if self.discard > 0 && self.pending.is_empty() {
            let skip = self.discard.min(input.len() as u64) as usize;
            self.discard -= skip as u64;
            input = &input[skip..];
        }
        self.pending.extend_from_slice(input);
        while !self.closed {
            if self.discard > 0 {
                let skip = self.discard.min(self.pending.len() as u64) as usize;
                self.discard -= skip as u64;
                self.consume(skip);
                if self.discard > 0 {
                    break;
                }
            }
            match self.next_request() {
                Some(r) => {
                    self.closed = r.close;
                    responses.push(self.stamp(r));
                }
                None => break,
            }
        }
        if self.closed {
            self.pending = Vec::new();
        }
        responses
    }

    fn consume(&mut self, n: usize) {
        self.pending.drain(..n);
        self.scanned = 0;
    }

    /// The response to the request at the start of `pending`, if its head
    /// is complete (or it is already known to be bad).
    fn next_request(&mut self) -> Option<Response> {
        // Empty lines before a request line are ignored (RFC 9112 §2.2).
        let blank = self
            .pending
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        if blank > 0 {
            self.consume(blank);
        }
        let Some(head_len) = self.head_end() else {
            if self.pending.len() > MAX_HEAD_BYTES {
                return Some(Response::error(431, false, true));
            }
            return None;
        };
        if head_len > MAX_HEAD_BYTES {
            return Some(Response::error(431, false, true));
        }
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut fields);
        let parsed = match request.parse(&self.pending[..head_len]) {
            Ok(httparse::Status::Complete(n)) => n,
            // The head ends where we found its empty line, so httparse
            // cannot want more: a partial parse means a malformed head.
            Ok(httparse::Status::Partial) => return Some(Response::error(400, false, true)),
            Err(httparse::Error::TooManyHeaders) => return Some(Response::error(431, false, true)),
            Err(_) => return Some(Response::error(400, false, true)),
        };
        let head = match Head::of(&request) {
            Some(h) => h,
            None => return Some(Response::error(400, false, true)),
        };
        let response = head.respond();
        // (A bad Content-Length is a 400, which closes.)
        let body = head.content_length.unwrap_or(0);
        self.consume(parsed);
        if !response.close {
            self.discard = body;
        }
        Some(response)
    }

    /// The length of the head at the start of `pending` (through its
    /// empty line), if it has all arrived. Searches only bytes not searched
    /// before, so a head arriving a byte at a time costs linear time.
    fn head_end(&mut self) -> Option<usize> {
        let from = self.scanned.saturating_sub(3);
        let found = self.pending[from..]
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|i| from + i + 2);
        let found_crlf = self.pending[from..]
            .windows(3)
            .position(|w| w == b"\n\r\n")
            .map(|i| from + i + 3);
        let end = match (found, found_crlf) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if end.is_none() {
            self.scanned = self.pending.len();
        }
        end
    }
}

impl<'a> Head<'a> {
    /// The parts of a parsed request; `None` if it is malformed.
    fn of(request: &httparse::Request<'_, 'a>) -> Option<Head<'a>> {
        let mut head = Head {
            method: request.method?,
            path: request.path?,
            version: request.version?,
            host: false,
            close: false,
            keep_alive: false,
            transfer_encoding: false,
            content_length: Ok(0),
        };
        let mut length: Option<u64> = None;
        for field in request.headers.iter() {
            let name = field.name;
            if name.eq_ignore_ascii_case("host") {
                head.host = true;
            } else if name.eq_ignore_ascii_case("connection") {
                let value = std::str::from_utf8(field.value).ok()?;
                for token in value.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        head.close = true;
                    } else if token.eq_ignore_ascii_case("keep-alive") {
                        head.keep_alive = true;
                    }
                }
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                head.transfer_encoding = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                // Several fields (or a list) must all agree (RFC 9110 §8.6).
                let value = std::str::from_utf8(field.value).ok()?;
                for item in value.split(',').map(str::trim) {
                    if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                        head.content_length = Err(());
                        continue;
                    }
                    match item.parse::<u64>() {
                        Ok(n) if length.is_none_or(|l| l == n) => length = Some(n),
                        _ => head.content_length = Err(()),
                    }
                }
            }
        }
        if head.content_length.is_ok() {
            head.content_length = Ok(length.unwrap_or(0));
        }
        Some(head)
    }

    /// The response to this request.
    fn respond(&self) -> Response {
        let head_only = self.method == "HEAD";
        let close = match self.version {
            0 => !self.keep_alive || self.close,
            _ => self.close,
        };
        // RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400.
        if self.content_length.is_err() || (self.version == 1 && !self.host) {
            return Response::error(400, head_only, true);
        }
        if self.transfer_encoding {
            return Response::error(501, head_only, true);
        }
        let body_len = self.content_length.unwrap_or(0);
        if body_len > MAX_REQUEST_BODY {
            return Response::error(413, head_only, true);
        }
        // Absolute form (RFC 9112 §3.2.2): the path after the authority.
        let path = ["http://", "https://"]
            .iter()
            .find_map(|scheme| {
                let rest = self
                    .path
                    .get(..scheme.len())?
                    .eq_ignore_ascii_case(scheme)
                    .then(|| &self.path[scheme.len()..])?;
                Some(rest.find('/').map_or("/", |i| &rest[i..]))
            })
            .unwrap_or(self.path);
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        let entity = if path == "/" {
            Ok(Body::Static(ROOT_BODY))
        } else if let Some(digits) = path.strip_prefix("/bytes/") {
            // Digits only (`parse` would take a leading `+`).
            match digits.parse::<u64>() {
                Ok(n) if n <= MAX_BYTES_BODY && digits.bytes().all(|c| c.is_ascii_digit()) => {
                    Ok(Body::Filler(n))
                }
                _ => Err(400),
            }
        } else {
            Err(404)
        };
        match entity {
            Err(400) => Response::error(400, head_only, true),
            Err(status) => Response::error(status, head_only, close),
            Ok(_) if !matches!(self.method, "GET" | "HEAD") => {
                Response::error(405, head_only, close)
            }
            Ok(body) => Response::new(200, body, head_only, close, false),
        }
    }
}

/// `secs` after the Unix epoch as an HTTP date (IMF-fixdate, RFC 9110
/// §5.6.7): `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn http_date(secs: u64) -> String {
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let of_day = secs % 86_400;
    // The civil date of a day count, with years starting on 1 March so
    // that the leap day ends a year (eras of 400 years, 146,097 days).
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// Counts of one server run.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections being served now.
    pub open: AtomicU64,
    /// Responses sent with a 2xx status.
    pub ok: AtomicU64,
    /// Responses sent with a 4xx status.
    pub client_errors: AtomicU64,
    /// Responses sent with a 5xx status.
    pub server_errors: AtomicU64,
    /// Body bytes sent.
    pub body_bytes: AtomicU64,
    /// Connections that ended with a socket error (reset, timed out).
    pub socket_errors: AtomicU64,
}

impl HttpStats {
    pub(crate) fn count(&self, r: &Response) {
        let counter = match r.status {
            200..=299 => &self.ok,
            400..=499 => &self.client_errors,
            _ => &self.server_errors,
        };
        counter.fetch_add(1, Relaxed);
        self.body_bytes.fetch_add(r.body.len(), Relaxed);
    }
}

/// How long a connection being closed by us still reads (and drops) what
/// the client sends, so that our last response is not destroyed by a reset
/// for unread data.
const LINGER: Duration = Duration::from_secs(1);

/// Settings of a server.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long a request may take to arrive once its first byte has: a
    /// client that sends slower gets 408 and is closed (it costs a uthread,
    /// never a kthread, but should not hold one for ever).
    pub request_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves HTTP on TCP `port` with the default [`Options`] until `stop` is
/// set (see [`serve_with`]).
pub fn serve(port: u16, stop: Arc<AtomicBool>, stats: Arc<HttpStats>) -> io::Result<()> {
    serve_with(port, Options::default(), stop, stats)
}

/// Serves HTTP on TCP `port` until `stop` is set: an acceptor uthread
/// gives each connection its own uthread. Must run on a uthread of a
/// runtime with networking. `accept` cannot be interrupted: the acceptor
/// stays blocked when this returns, and goes with the runtime.
pub fn serve_with(
    port: u16,
    options: Options,
    stop: Arc<AtomicBool>,
    stats: Arc<HttpStats>,
) -> io::Result<()> {
    let (conn_stop, stats) = (stop.clone(), stats.clone());
    crate::serve::accept_until_stopped(port, &stop, move |stream| {
        stats.accepted.fetch_add(1, Relaxed);
        stats.open.fetch_add(1, Relaxed);
        if serve_connection(&stream, options, &conn_stop, &stats).is_err() {
            stats.socket_errors.fetch_add(1, Relaxed);
        }
        stats.open.fetch_sub(1, Relaxed);
    })
}

/// Runs one connection's [`Session`] until it or the client closes.
fn serve_connection(
    stream: &TcpStream,
    options: Options,
    stop: &AtomicBool,
    stats: &HttpStats,
) -> io::Result<()> {
    stream.set_read_timeout(Some(STOP_POLL))?;
    let mut session = Session::new();
    // One page on the uthread's stack: an idle connection costs little.
    let mut buf = [0u8; 4 * 1024];
    let mut out = Vec::new();
    // When the request now arriving started to.
    let mut request_started: Option<Instant> = None;
    while !stop.load(Relaxed) {
        let n = match (&*stream).read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if is_timeout(&e) => {
                if request_started.is_some_and(|t| t.elapsed() >= options.request_timeout) {
                    session.set_date(SystemTime::now());
                    let r = session.timed_out();
                    (&*stream).write_all(&r.to_bytes())?;
                    stats.count(&r);
                    return linger_close(stream, &mut buf);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        // The requests this read completes arrived now.
        let timer = RequestTimer::start();
        session.set_date(SystemTime::now());
        let responses = session.feed(&buf[..n]);
        write_responses(&responses, &mut out, |b| (&*stream).write_all(b))?;
        if !out.is_empty() {
            (&*stream).write_all(&out)?;
            out.clear();
        }
        timer.finish_n(responses.len());
        if out.capacity() > 16 * 1024 {
            // An idle connection keeps no large buffer.
            out = Vec::new();
        }
        for r in &responses {
            stats.count(r);
        }
        if session.is_closed() {
            return linger_close(stream, &mut buf);
        }
        // A request still arriving keeps its start; a new one starts now.
        request_started = match (session.is_mid_request(), responses.is_empty()) {
            (false, _) => None,
            (true, true) => request_started.or_else(|| Some(Instant::now())),
            (true, false) => Some(Instant::now()),
        };
    }
    Ok(())
}

/// Closes our side, then drops what the client still sends until it
/// closes its side (at most [`LINGER`]).
fn linger_close(stream: &TcpStream, buf: &mut [u8]) -> io::Result<()> {
    stream.shutdown(Shutdown::Write)?;
    let t0 = Instant::now();
    while t0.elapsed() < LINGER {
        match (&*stream).read(buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if is_timeout(&e) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn feed(input: &str) -> (Vec<Response>, Session) {
        let mut s = Session::new();
        let r = s.feed(input.as_bytes());
        (r, s)
    }

    fn one(input: &str) -> Response {
        let (mut r, _) = feed(input);
        assert_eq!(r.len(), 1, "{input:?}: {r:?}");
        r.remove(0)
    }

    fn head(r: &Response) -> String {
        String::from_utf8(r.head.clone()).unwrap()
    }

    fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    const GET_ROOT: &str = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn get_root_is_the_fixed_body_and_keeps_the_connection() {
        let r = one(GET_ROOT);
        let h = head(&r);
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n"), "{h}");
        assert_eq!(
            header(&h, "content-length"),
            Some(&*ROOT_BODY.len().to_string())
        );
        assert_eq!(header(&h, "connection"), Some("keep-alive"));
        assert!(h.ends_with("\r\n\r\n"));
        assert_eq!(r.body, Body::Static(ROOT_BODY));
        assert!(!r.close);
        let bytes = r.to_bytes();
        assert!(bytes.ends_with(ROOT_BODY));
        assert_eq!(bytes.len(), r.head.len() + ROOT_BODY.len());
    }

    #[test]
    fn bytes_n_has_exactly_n_bytes_and_a_matching_content_length() {
        for n in [
            0u64,
            1,
            100,
            65_535,
            65_536,
            100_000,
            1 << 20,
            MAX_BYTES_BODY,
        ] {
            let r = one(&format!("GET /bytes/{n} HTTP/1.1\r\nHost: x\r\n\r\n"));
            assert_eq!(r.status, 200);
            assert_eq!(header(&head(&r), "content-length"), Some(&*n.to_string()));
            let bytes = r.to_bytes();
            assert_eq!(bytes.len() as u64, r.head.len() as u64 + n, "/bytes/{n}");
            assert!(bytes[r.head.len()..].iter().all(|&b| b == b'x'));
        }
    }

    #[test]
    fn bad_byte_counts_are_400_and_close() {
        let too_many = MAX_BYTES_BODY + 1;
        for path in [
            format!("/bytes/{too_many}"),
            "/bytes/abc".into(),
            "/bytes/+5".into(),
            "/bytes/".into(),
            "/bytes/-1".into(),
            "/bytes/99999999999999999999999".into(),
        ] {
            let r = one(&format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"));
            assert_eq!(r.status, 400, "{path}");
            assert!(r.close);
            assert_eq!(header(&head(&r), "connection"), Some("close"));
        }
    }

    #[test]
    fn head_has_the_get_headers_and_no_body() {
        let r = one("HEAD /bytes/1234 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.status, 200);
        assert_eq!(header(&head(&r), "content-length"), Some("1234"));
        assert_eq!(r.body, Body::None);
        assert_eq!(r.to_bytes(), r.head);
        let r = one("GET http://x/bytes/4?q HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.body, Body::Filler(4), "absolute form");
        let r = one("GET HTTP://x HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.body, Body::Static(ROOT_BODY));
        let r = one("HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.status, 404);
        assert_eq!(r.body, Body::None);
    }

    #[test]
    fn unknown_paths_are_404_and_the_connection_goes_on() {
        let (r, s) = feed("GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.iter().map(|r| r.status).collect::<Vec<_>>(), [404, 200]);
        assert!(!s.is_closed());
        assert!(r[0].to_bytes().ends_with(b"not found\n"));
    }

    #[test]
    fn other_methods_are_405_with_allow_and_their_body_is_skipped() {
        let (r, s) = feed(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert_eq!(r.iter().map(|r| r.status).collect::<Vec<_>>(), [405, 200]);
        assert_eq!(header(&head(&r[0]), "allow"), Some(ALLOWED_METHODS));
        assert!(!s.is_closed());
        for m in ["PUT", "DELETE", "OPTIONS", "PATCH", "BREW"] {
            let r = one(&format!("{m} /bytes/3 HTTP/1.1\r\nHost: x\r\n\r\n"));
            assert_eq!(r.status, 405, "{m}");
        }
    }

    #[test]
    fn a_get_body_is_read_and_discarded_even_across_reads() {
        let mut s = Session::new();
        assert!(s
            .feed(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            .iter()
            .all(|r| r.status == 200));
        assert!(s.feed(b"defg").is_empty());
        let r = s.feed(b"hijGET /bytes/2 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].body, Body::Filler(2));
    }

    #[test]
    fn pipelined_requests_are_answered_in_order() {
        let input = "GET /bytes/1 HTTP/1.1\r\nHost: x\r\n\r\nHEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET /bytes/3 HTTP/1.1\r\nHost: x\r\n\r\nGET /x HTTP/1.1\r\nHost: x\r\n\r\n";
        let (r, s) = feed(input);
        assert_eq!(
            r.iter().map(|r| (r.status, r.body)).collect::<Vec<_>>(),
            [
                (200, Body::Filler(1)),
                (200, Body::None),
                (200, Body::Filler(3)),
                (404, Body::Static(b"not found\n")),
            ]
        );
        assert!(!s.is_closed());
    }

    #[test]
    fn a_request_split_across_reads_waits_for_the_rest() {
        let mut s = Session::new();
        let mut responses = Vec::new();
        for b in GET_ROOT.bytes() {
            assert!(responses.is_empty(), "answered before the head ended");
            responses.extend(s.feed(&[b]));
        }
        assert_eq!(responses.len(), 1);
        assert_eq!(responses[0].status, 200);
        // Bare LF line endings are accepted too.
        let r = one("GET / HTTP/1.1\nHost: x\n\n");
        assert_eq!(r.status, 200);
        // Leading empty lines are ignored.
        let r = one("\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.status, 200);
    }

    #[test]
    fn connection_close_and_http_1_0_close_after_the_response() {
        let (r, s) = feed("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.len(), 1, "nothing is answered after a close");
        assert!(r[0].close && s.is_closed());
        assert_eq!(header(&head(&r[0]), "connection"), Some("close"));
        let r = one("GET / HTTP/1.0\r\n\r\n");
        assert_eq!(r.status, 200);
        assert!(r.close, "HTTP/1.0 closes by default");
        let r = one("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(!r.close);
        assert_eq!(header(&head(&r), "connection"), Some("keep-alive"));
        let r = one("GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, CLOSE\r\n\r\n");
        assert!(r.close);
    }

    #[test]
    fn malformed_requests_are_400_and_close() {
        for input in [
            "GARBAGE\r\n\r\n",
            "GET / HTTP/2.0\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.1\r\nbad header\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n", // no Host
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            "G\0T / HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let (r, s) = feed(&format!("{input}GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
            assert_eq!(r.len(), 1, "{input:?}: {r:?}");
            assert_eq!(r[0].status, 400, "{input:?}");
            assert!(r[0].close && s.is_closed(), "{input:?}");
        }
        // Equal repeated lengths are one length.
        let r = one("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0, 0\r\n\r\n");
        assert_eq!(r.status, 200);
    }

    #[test]
    fn oversized_heads_are_431_and_close() {
        let long = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        let r = one(&long);
        assert_eq!((r.status, r.close), (431, true));
        // Too long before its end has even arrived.
        let mut s = Session::new();
        let r = s.feed(format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD_BYTES)).as_bytes());
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].status, 431);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X{i}: y\r\n")).collect();
        let r = one(&format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n"));
        assert_eq!((r.status, r.close), (431, true));
    }

    #[test]
    fn chunked_requests_are_501_and_close_and_huge_bodies_413() {
        let r = one("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        assert_eq!((r.status, r.close), (501, true));
        let r = one(&format!(
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            MAX_REQUEST_BODY + 1
        ));
        assert_eq!((r.status, r.close), (413, true));
    }

    #[test]
    fn a_request_in_flight_is_known_and_can_time_out() {
        let mut s = Session::new();
        assert!(!s.is_mid_request());
        assert!(s.feed(b"GET / HT").is_empty());
        assert!(s.is_mid_request());
        let r = s.timed_out();
        assert_eq!((r.status, r.close), (408, true));
        assert!(s.is_closed() && !s.is_mid_request());
        assert!(s.feed(b"TP/1.1\r\nHost: x\r\n\r\n").is_empty());
        // A body being skipped is a request in flight too.
        let mut s = Session::new();
        s.feed(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab");
        assert!(s.is_mid_request());
        s.feed(b"cd");
        assert!(!s.is_mid_request());
    }

    #[test]
    fn dates_are_imf_fixdates() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(http_date(1_709_251_199), "Thu, 29 Feb 2024 23:59:59 GMT");
        assert_eq!(http_date(4_102_444_800), "Fri, 01 Jan 2100 00:00:00 GMT");
    }

    #[test]
    fn responses_carry_the_date_they_were_given() {
        let mut s = Session::new();
        s.set_date(SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777));
        let r = s.feed(GET_ROOT.as_bytes()).remove(0);
        let h = head(&r);
        assert!(
            h.starts_with("HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"),
            "{h}"
        );
        assert_eq!(
            header(&h, "content-length"),
            Some(&*ROOT_BODY.len().to_string())
        );
        assert!(head(&s.timed_out()).contains("\r\nDate: Sun, 06 Nov 1994"));
    }

    #[test]
    fn nothing_is_answered_after_close() {
        let (_, mut s) = feed("BAD\r\n\r\n");
        assert!(s.is_closed());
        assert!(s.feed(GET_ROOT.as_bytes()).is_empty());
    }

    /// Pieces of requests, valid and not, for the property tests.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(GET_ROOT.as_bytes().to_vec()),
            Just(b"GET /bytes/17 HTTP/1.1\r\nHost: y\r\n\r\n".to_vec()),
            Just(b"HEAD /q HTTP/1.1\r\nHost: y\r\n\r\n".to_vec()),
            Just(b"POST / HTTP/1.1\r\nHost: y\r\nContent-Length: 3\r\n\r\nabc".to_vec()),
            Just(b"Content-Length: 99999999999999999999\r\n".to_vec()),
            Just(b"Transfer-Encoding: chunked\r\n".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"\n".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..40),
        ]
    }

    proptest! {
        #[test]
        fn any_input_in_any_split_never_panics_and_answers_sanely(
            pieces in proptest::collection::vec(piece(), 0..12),
            cuts in proptest::collection::vec(0usize..64, 0..12),
        ) {
            let input: Vec<u8> = pieces.concat();
            let mut s = Session::new();
            let mut at = 0usize;
            let mut responses = Vec::new();
            for cut in cuts.iter().copied().chain(std::iter::once(usize::MAX)) {
                let end = at.saturating_add(cut).min(input.len());
                responses.extend(s.feed(&input[at..end]));
                at = end;
            }
            for (i, r) in responses.iter().enumerate() {
                prop_assert!(r.head.starts_with(b"HTTP/1.1 "));
                prop_assert!(r.head.ends_with(b"\r\n\r\n"));
                prop_assert_eq!(r.close, i + 1 == responses.len() && s.is_closed());
            }
            // Fed at once, the same responses.
            let (all_at_once, _) = {
                let mut s = Session::new();
                (s.feed(&input), ())
            };
            prop_assert_eq!(all_at_once, responses);
        }
    }
}
