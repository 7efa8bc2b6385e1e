//! Target `http`: request streams into http-server's protocol session
//! (`ginza_apps::http_server::Session`): pipelined requests built from
//! methods, paths, versions, header fields (Host, Connection,
//! Content-Length right and wrong, Transfer-Encoding, junk) and bodies,
//! with raw bytes between them, fed in random pieces.
//!
//! Checked: no panic; every response is a whole HTTP/1.1 head with a
//! known status and a `Content-Length` that matches its body (HEAD: the
//! body it would have); only the last response closes, and only if the
//! session says it closed; fed at once or in pieces, the same responses.

use arbitrary::{Arbitrary, Unstructured};
use ginza_apps::http_server::{Body, Response, Session, MAX_BYTES_BODY};

use super::{describe, List, Outcome};

#[derive(Debug, Arbitrary)]
struct Input {
    pieces: List<Piece>,
    /// Sizes of the pieces the stream is fed in.
    cuts: List<u8>,
}

#[derive(Debug, Arbitrary)]
enum Piece {
    Request {
        method: Method,
        path: Path,
        version: Version,
        headers: List<Header>,
        body: List<u8>,
        /// LF alone ends the lines instead of CRLF.
        bare_lf: bool,
    },
    Raw(List<u8>),
}

#[derive(Debug, Arbitrary)]
enum Method {
    Get,
    Head,
    Post,
    Other(String),
}

#[derive(Debug, Arbitrary)]
enum Path {
    Root,
    Bytes(u32),
    BytesText(String),
    Other(String),
}

#[derive(Debug, Arbitrary)]
enum Version {
    Http11,
    Http10,
    Other(u8),
}

#[derive(Debug, Arbitrary)]
enum Header {
    Host,
    Close,
    KeepAlive,
    /// The body's own length plus this.
    ContentLength(i8),
    ContentLengthText(String),
    TransferEncoding,
    Other(String, String),
}

fn request_bytes(piece: &Piece, out: &mut Vec<u8>) {
    let Piece::Request {
        method,
        path,
        version,
        headers,
        body,
        bare_lf,
    } = piece
    else {
        if let Piece::Raw(b) = piece {
            out.extend_from_slice(b);
        }
        return;
    };
    let eol: &[u8] = if *bare_lf { b"\n" } else { b"\r\n" };
    let method = match method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Other(m) => m.as_str(),
    };
    let path = match path {
        Path::Root => "/".to_string(),
        Path::Bytes(n) => format!("/bytes/{}", u64::from(*n) % (MAX_BYTES_BODY + 2)),
        Path::BytesText(t) => format!("/bytes/{t}"),
        Path::Other(p) => p.clone(),
    };
    let version = match version {
        Version::Http11 => "HTTP/1.1".to_string(),
        Version::Http10 => "HTTP/1.0".to_string(),
        Version::Other(v) => format!("HTTP/{}.{}", v / 16, v % 16),
    };
    out.extend_from_slice(format!("{method} {path} {version}").as_bytes());
    out.extend_from_slice(eol);
    for h in headers {
        let line = match h {
            Header::Host => "Host: fuzz".to_string(),
            Header::Close => "Connection: close".to_string(),
            Header::KeepAlive => "Connection: keep-alive".to_string(),
            Header::ContentLength(d) => format!(
                "Content-Length: {}",
                (body.len() as i64 + i64::from(*d)).max(0)
            ),
            Header::ContentLengthText(t) => format!("Content-Length: {t}"),
            Header::TransferEncoding => "Transfer-Encoding: chunked".to_string(),
            Header::Other(k, v) => format!("{k}: {v}"),
        };
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(eol);
    }
    out.extend_from_slice(eol);
    out.extend_from_slice(body);
}

const STATUSES: &[u16] = &[200, 400, 404, 405, 408, 413, 431, 501];

fn check_response(r: &Response) {
    assert!(STATUSES.contains(&r.status), "status {}", r.status);
    let head = std::str::from_utf8(&r.head).expect("a response head is text");
    assert!(head.starts_with(&format!("HTTP/1.1 {} ", r.status)));
    assert!(
        head.ends_with("\r\n\r\n"),
        "a response head without its end"
    );
    let length: u64 = head
        .split("\r\n")
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("every response has a Content-Length")
        .parse()
        .expect("a decimal Content-Length");
    match r.body {
        Body::None => {}
        Body::Static(b) => assert_eq!(length, b.len() as u64, "Content-Length ≠ body"),
        Body::Filler(n) => assert_eq!(length, n, "Content-Length ≠ body"),
    }
    let closes = head.contains("\r\nConnection: close\r\n");
    assert_eq!(closes, r.close, "the Connection header says otherwise");
    if let Body::Static(_) | Body::None = r.body {
        let body = match r.body {
            Body::Static(b) => b.len(),
            _ => 0,
        };
        assert_eq!(r.to_bytes().len(), r.head.len() + body, "bytes on the wire");
    }
}

pub(super) fn case(u: &mut Unstructured<'_>, out: &mut Option<String>) -> Outcome {
    let Ok(input) = Input::arbitrary(u) else {
        return "no-input".into();
    };
    describe(out, &input);
    let mut stream = Vec::new();
    for p in &input.pieces {
        request_bytes(p, &mut stream);
    }
    let mut s = Session::new();
    let mut responses = Vec::new();
    let mut at = 0usize;
    for &cut in input.cuts.iter() {
        let end = (at + usize::from(cut)).min(stream.len());
        responses.extend(s.feed(&stream[at..end]));
        at = end;
    }
    responses.extend(s.feed(&stream[at..]));
    for (i, r) in responses.iter().enumerate() {
        check_response(r);
        assert_eq!(
            r.close,
            i + 1 == responses.len() && s.is_closed(),
            "response {i} of {} closes out of turn",
            responses.len()
        );
    }
    let mut once = Session::new();
    assert_eq!(
        once.feed(&stream),
        responses,
        "responses differ when fed in pieces"
    );
    assert_eq!(once.is_closed(), s.is_closed());
    assert_eq!(once.is_mid_request(), s.is_mid_request());
    let first = responses.first().map_or(0, |r| r.status);
    format!(
        "{} responses, first {first}{}",
        responses.len().min(3),
        if s.is_closed() { ", closed" } else { "" }
    )
    .into()
}
