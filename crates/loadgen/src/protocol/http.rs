//! HTTP/1.1 `GET` with keep-alive; answers framed by `Content-Length`
//! (parsed with `httparse`). A 2xx or 3xx status is a good answer; 4xx and
//! 5xx are answers with `ok` false.

use super::Parsed;

/// The most header lines an answer may have.
const MAX_HEADERS: usize = 32;
/// The longest header block the parser waits for.
const MAX_HEAD: usize = 16 * 1024;

/// `GET path` with `Host: host`.
#[derive(Debug, Clone)]
pub struct Http {
    pub path: String,
    pub host: String,
}

impl Http {
    /// Refuses paths that would break the request line.
    pub fn new(path: &str, host: &str) -> Result<Http, String> {
        if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(format!(
                "{path:?} is not a request path (it starts with / and has no spaces or control characters)"
            ));
        }
        Ok(Http {
            path: path.to_string(),
            host: host.to_string(),
        })
    }

    /// Appends a request; its id is `seq` (answers come in order).
    pub fn encode(&self, seq: u64, out: &mut Vec<u8>) -> u64 {
        out.extend_from_slice(b"GET ");
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        out.extend_from_slice(self.host.as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        seq
    }
}

/// Parses one whole answer at the start of `buf`.
pub fn parse_response(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Parsed::Invalid(format!(
                "no end of the header block within {MAX_HEAD} bytes"
            ))
        }
        Ok(httparse::Status::Partial) => return Parsed::Incomplete,
        Err(e) => return Parsed::Invalid(format!("not an HTTP answer: {e}")),
    };
    let status = response.code.unwrap_or(0);
    let mut length = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
            match v {
                Some(v) => length = Some(v),
                None => return Parsed::Invalid("a malformed Content-Length".into()),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Parsed::Invalid(
                "chunked answers are not supported (Content-Length only)".into(),
            );
        }
    }
    // 1xx, 204 and 304 have no body; any other answer must say its length
    // (the connection is kept alive).
    let length = match (status, length) {
        (100..=199 | 204 | 304, _) => 0,
        (_, Some(n)) => n,
        (_, None) => return Parsed::Invalid(format!("a {status} answer without Content-Length")),
    };
    if buf.len() < head + length {
        return Parsed::Incomplete;
    }
    Parsed::Done {
        consumed: head + length,
        ok: (200..400).contains(&status),
    }
}
