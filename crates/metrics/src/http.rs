//! One HTTP/1.x request in, one response out: the whole protocol of the
//! metrics endpoint, with no socket in sight so that tests can feed it any
//! bytes. `GET` and `HEAD` of `/metrics` (a query string is ignored) are
//! answered 200; other paths 404; other methods 405; anything that does
//! not parse 400, a request head over [`MAX_HEAD`] bytes 431, a body over
//! [`MAX_BODY`] 413. After an error the connection is closed; otherwise it
//! stays open as HTTP/1.1 (unless `Connection: close`) or HTTP/1.0 (only
//! with `Connection: keep-alive`) ask.

/// The content type of the exposition (`prometheus-client` writes
/// OpenMetrics 1.0 text, which Prometheus scrapes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Longest request head (request line and headers) read.
pub const MAX_HEAD: usize = 8 * 1024;

/// Longest request body skipped (a `GET` may carry one; it is ignored).
pub const MAX_BODY: usize = 64 * 1024;

/// Most headers in a request.
const MAX_HEADERS: usize = 32;

/// What the bytes read so far call for.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The request is not complete yet: read more.
    More,
    /// Send `response`; the request's head was `consumed` bytes, and a body
    /// of `body` bytes follows it, to be skipped. Then read the next
    /// request if `keep_alive`, else close.
    Answer {
        response: Vec<u8>,
        consumed: usize,
        body: usize,
        keep_alive: bool,
    },
}

/// The answer to the request at the start of `buf`. `render` makes the
/// metrics text (called for `GET` and `HEAD` of `/metrics` only).
pub fn step(buf: &[u8], render: &dyn Fn() -> Result<String, String>) -> Step {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let consumed = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Step::More,
        Ok(httparse::Status::Partial) => {
            return refuse(
                431,
                &format!("request head over {MAX_HEAD} bytes\n"),
                buf.len(),
            )
        }
        Err(e) => return refuse(400, &format!("bad request: {e}\n"), buf.len()),
    };
    if consumed > MAX_HEAD {
        return refuse(
            431,
            &format!("request head over {MAX_HEAD} bytes\n"),
            consumed,
        );
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return refuse(400, "bad request: incomplete request line\n", consumed);
    };
    let mut close = false;
    let mut keep_alive = false;
    let mut body: Option<usize> = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(h.value);
            for token in v.split(',').map(str::trim) {
                close |= token.eq_ignore_ascii_case("close");
                keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<usize>().ok());
            match (n, body) {
                (None, _) => return refuse(400, "bad request: bad Content-Length\n", consumed),
                (Some(n), Some(m)) if n != m => {
                    return refuse(400, "bad request: conflicting Content-Length\n", consumed)
                }
                (Some(n), _) => body = Some(n),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return refuse(
                400,
                "bad request: a body in Transfer-Encoding is not accepted\n",
                consumed,
            );
        }
    }
    let body = body.unwrap_or(0);
    if body > MAX_BODY {
        return refuse(
            413,
            &format!("request body over {MAX_BODY} bytes\n"),
            consumed,
        );
    }
    let keep_alive = match version {
        1 => !close,
        _ => keep_alive && !close,
    };
    let path = target.split('?').next().unwrap_or(target);
    let (status, content_type, text, allow) = match method {
        "GET" | "HEAD" if path == "/metrics" => match render() {
            Ok(text) => (200, CONTENT_TYPE, text, false),
            Err(e) => (500, "text/plain; charset=utf-8", format!("{e}\n"), false),
        },
        "GET" | "HEAD" => (
            404,
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_string(),
            false,
        ),
        _ => (
            405,
            "text/plain; charset=utf-8",
            format!("method {method} not allowed: GET or HEAD\n"),
            true,
        ),
    };
    let mut response = head(status, content_type, text.len(), keep_alive, allow);
    if method != "HEAD" {
        response.extend_from_slice(text.as_bytes());
    }
    Step::Answer {
        response,
        consumed,
        body,
        keep_alive,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

fn head(status: u16, content_type: &str, len: usize, keep_alive: bool, allow: bool) -> Vec<u8> {
    let mut h = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\nConnection: {}\r\n",
        reason(status),
        if keep_alive { "keep-alive" } else { "close" }
    );
    if allow {
        h.push_str("Allow: GET, HEAD\r\n");
    }
    h.push_str("\r\n");
    h.into_bytes()
}

/// An error answer, after which the connection closes.
fn refuse(status: u16, text: &str, consumed: usize) -> Step {
    Step::Answer {
        response: error_response(status, text),
        consumed,
        body: 0,
        keep_alive: false,
    }
}

/// A complete error response that closes the connection.
pub fn error_response(status: u16, text: &str) -> Vec<u8> {
    let mut r = head(
        status,
        "text/plain; charset=utf-8",
        text.len(),
        false,
        false,
    );
    r.extend_from_slice(text.as_bytes());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render() -> Result<String, String> {
        Ok("# EOF\n".into())
    }

    fn answer(req: &str) -> (String, usize, usize, bool) {
        match step(req.as_bytes(), &render) {
            Step::Answer {
                response,
                consumed,
                body,
                keep_alive,
            } => (
                String::from_utf8(response).unwrap(),
                consumed,
                body,
                keep_alive,
            ),
            Step::More => panic!("incomplete: {req:?}"),
        }
    }

    #[test]
    fn get_and_head_of_metrics() {
        let (r, n, _, keep) = answer("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains(CONTENT_TYPE));
        assert!(r.contains("Content-Length: 6\r\n"));
        assert!(r.ends_with("\r\n\r\n# EOF\n"));
        assert_eq!(n, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".len());
        assert!(keep);
        let (r, _, _, _) = answer("HEAD /metrics?x=1 HTTP/1.1\r\n\r\n");
        assert!(r.contains("Content-Length: 6\r\n"));
        assert!(r.ends_with("\r\n\r\n"), "no body: {r}");
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_header() {
        assert!(!answer("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n").3);
        assert!(!answer("GET /metrics HTTP/1.0\r\n\r\n").3);
        let (r, _, _, keep) = answer("GET /metrics HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(keep && r.contains("Connection: keep-alive\r\n"));
    }

    #[test]
    fn other_paths_methods_and_garbage() {
        assert!(answer("GET / HTTP/1.1\r\n\r\n")
            .0
            .starts_with("HTTP/1.1 404 "));
        let (r, _, _, keep) = answer("POST /metrics HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405 ") && r.contains("Allow: GET, HEAD\r\n"));
        assert!(
            keep,
            "a well-formed request that is refused keeps the connection"
        );
        for bad in [
            "GARBAGE\r\n\r\n",
            "GET /metrics HTTP/9.9\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "\x00\x01\x02\r\n\r\n",
        ] {
            let (r, _, _, keep) = answer(bad);
            assert!(
                r.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{bad:?}: {r}"
            );
            assert!(!keep, "{bad:?}");
        }
    }

    #[test]
    fn partial_requests_wait_for_more_and_huge_ones_are_refused() {
        assert_eq!(step(b"GET /metr", &render), Step::More);
        assert_eq!(
            step(b"GET /metrics HTTP/1.1\r\nHost: x\r\n", &render),
            Step::More
        );
        let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD));
        assert!(answer(&huge).0.starts_with("HTTP/1.1 431 "));
        let big_body = format!(
            "GET /metrics HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert!(answer(&big_body).0.starts_with("HTTP/1.1 413 "));
        let (_, _, body, keep) = answer("GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!((body, keep), (5, true));
    }

    proptest::proptest! {
        /// Any bytes get an answer or a request for more, never a panic;
        /// what is consumed is within what was read.
        #[test]
        fn any_bytes_are_answered_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            prefix in 0usize..4,
        ) {
            let heads: [&[u8]; 4] = [b"", b"GET /metrics HTTP/1.1\r\n", b"GET ", b"HEAD /x HTTP/1.0\r\nA: b\r\n"];
            let buf = [heads[prefix], &bytes].concat();
            if let Step::Answer { response, consumed, .. } = step(&buf, &render) {
                proptest::prop_assert!(consumed <= buf.len());
                proptest::prop_assert!(response.starts_with(b"HTTP/1.1 "));
            }
        }
    }

    #[test]
    fn a_render_failure_is_a_500() {
        let fail = || Err("no snapshot".to_string());
        let Step::Answer { response, .. } = step(b"GET /metrics HTTP/1.1\r\n\r\n", &fail) else {
            panic!()
        };
        assert!(String::from_utf8(response)
            .unwrap()
            .starts_with("HTTP/1.1 500 "));
    }
}
