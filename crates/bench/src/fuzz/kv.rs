//! Target `kv`: byte streams into kv-server's protocol sessions
//! (`ginza_apps::kv`): memcached text commands (storage with data blocks,
//! retrieval, arithmetic, meta commands, junk) or binary requests (every
//! opcode, with fitting or random extras and lengths), or one UDP
//! datagram, against a small store so that eviction and the size limits
//! are reached.
//!
//! Checked: no panic; `process` consumes no more than it was given and
//! asks for more than it consumed; fed at once or in the pieces a
//! connection's reads make (the serving loop's buffering), the replies are
//! the same, byte for byte; text replies end in CRLF, binary replies are a
//! sequence of whole response packets; UDP replies carry the request's id.

use arbitrary::{Arbitrary, Unstructured};
use ginza_apps::kv::binary::{self, REQUEST_MAGIC, RESPONSE_MAGIC};
use ginza_apps::kv::server::{answer_datagram, Session};
use ginza_apps::kv::store::{ManualClock, Store, StoreConfig};
use ginza_apps::kv::text::Flow;
use ginza_apps::kv::Kv;

use super::{describe, List, Outcome};

#[derive(Debug, Arbitrary)]
enum Input {
    Text {
        pieces: List<TextPiece>,
        cuts: List<u8>,
    },
    Binary {
        requests: List<BinPiece>,
        cuts: List<u8>,
    },
    Udp {
        request_id: u16,
        sequence: u16,
        total: u16,
        pieces: List<TextPiece>,
    },
}

#[derive(Debug, Arbitrary)]
enum TextPiece {
    /// A storage command with its data block; `len_delta` makes the
    /// announced length wrong now and then.
    Store {
        verb: StoreVerb,
        key: Key,
        flags: u32,
        exptime: i8,
        cas: u8,
        value: List<u8>,
        len_delta: i8,
        noreply: bool,
    },
    /// Any command line, from words that mean something to the parser.
    Line(List<Word>),
    Raw(List<u8>),
}

#[derive(Debug, Arbitrary)]
enum StoreVerb {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Ms,
}

/// A key from a handful (so commands meet the same items), or any bytes.
#[derive(Debug, Arbitrary)]
enum Key {
    Few(u8),
    Any(List<u8>),
}

impl Key {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Key::Few(k) => format!("k{}", k % 4).into_bytes(),
            Key::Any(b) => b.to_vec(),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Word {
    Verb(u8),
    Key(Key),
    Number(i64),
    Small(u8),
    /// A meta-command flag: a letter and maybe a token.
    Flag(u8, Option<u16>),
    Noreply,
}

const VERBS: &[&str] = &[
    "get",
    "gets",
    "gat",
    "gats",
    "touch",
    "delete",
    "incr",
    "decr",
    "flush_all",
    "version",
    "verbosity",
    "stats",
    "quit",
    "mn",
    "mg",
    "ms",
    "md",
    "ma",
    "me",
    "set",
    "cas",
    "shutdown",
    "cache_memlimit",
    "settings",
    "items",
    "detail",
];

#[derive(Debug, Arbitrary)]
enum BinPiece {
    /// A request built by `binary::encode_request`; `fit` gives the
    /// opcode's extras their expected size.
    Request {
        opcode: u8,
        fit: bool,
        extras: List<u8>,
        key: Key,
        value: List<u8>,
        cas: u64,
        opaque: u32,
    },
    /// A header with any lengths, then bytes.
    Header { fields: [u8; 23], body: List<u8> },
}

fn store_line(b: &mut Vec<u8>, piece: &TextPiece) {
    let TextPiece::Store {
        verb,
        key,
        flags,
        exptime,
        cas,
        value,
        len_delta,
        noreply,
    } = piece
    else {
        return;
    };
    let len = (value.len() as i64 + i64::from(*len_delta)).max(0);
    let name = match verb {
        StoreVerb::Set => "set",
        StoreVerb::Add => "add",
        StoreVerb::Replace => "replace",
        StoreVerb::Append => "append",
        StoreVerb::Prepend => "prepend",
        StoreVerb::Cas => "cas",
        StoreVerb::Ms => "ms",
    };
    b.extend_from_slice(name.as_bytes());
    b.push(b' ');
    b.extend_from_slice(&key.bytes());
    if matches!(verb, StoreVerb::Ms) {
        b.extend_from_slice(format!(" {len} F{flags} T{exptime}").as_bytes());
        if *noreply {
            b.extend_from_slice(b" q");
        }
    } else {
        b.extend_from_slice(format!(" {flags} {exptime} {len}").as_bytes());
        if matches!(verb, StoreVerb::Cas) {
            b.extend_from_slice(format!(" {cas}").as_bytes());
        }
        if *noreply {
            b.extend_from_slice(b" noreply");
        }
    }
    b.extend_from_slice(b"\r\n");
    b.extend_from_slice(value);
    b.extend_from_slice(b"\r\n");
}

fn text_bytes(pieces: &[TextPiece]) -> Vec<u8> {
    let mut b = Vec::new();
    for p in pieces {
        match p {
            TextPiece::Store { .. } => store_line(&mut b, p),
            TextPiece::Line(words) => {
                for (i, w) in words.iter().enumerate() {
                    if i > 0 {
                        b.push(b' ');
                    }
                    match w {
                        Word::Verb(v) => {
                            b.extend_from_slice(VERBS[usize::from(*v) % VERBS.len()].as_bytes())
                        }
                        Word::Key(k) => b.extend_from_slice(&k.bytes()),
                        Word::Number(n) => b.extend_from_slice(n.to_string().as_bytes()),
                        Word::Small(n) => b.extend_from_slice(n.to_string().as_bytes()),
                        Word::Flag(letter, token) => {
                            b.push(b'A' + letter % 58);
                            if let Some(t) = token {
                                b.extend_from_slice(t.to_string().as_bytes());
                            }
                        }
                        Word::Noreply => b.extend_from_slice(b"noreply"),
                    }
                }
                b.extend_from_slice(b"\r\n");
            }
            TextPiece::Raw(raw) => b.extend_from_slice(raw),
        }
    }
    b
}

/// The extras an opcode expects, when `fit` (else as given).
fn extras_for(opcode: u8, given: &[u8]) -> Vec<u8> {
    use binary::op;
    let want = match opcode {
        op::SET | op::SETQ | op::ADD | op::ADDQ | op::REPLACE | op::REPLACEQ => 8,
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => 20,
        op::TOUCH | op::GAT | op::GATQ | op::GATK | op::GATKQ | op::FLUSH | op::FLUSHQ => 4,
        _ => 0,
    };
    let mut e: Vec<u8> = given.iter().copied().take(want).collect();
    e.resize(want, 0);
    e
}

fn binary_bytes(requests: &[BinPiece]) -> Vec<u8> {
    let mut b = Vec::new();
    for r in requests {
        match r {
            BinPiece::Request {
                opcode,
                fit,
                extras,
                key,
                value,
                cas,
                opaque,
            } => {
                // Opcodes the server knows, mostly.
                let opcode = if *opcode < 0xe0 {
                    opcode % 0x25
                } else {
                    *opcode
                };
                let extras = if *fit {
                    extras_for(opcode, extras)
                } else {
                    extras.iter().copied().take(255).collect()
                };
                let mut key = key.bytes();
                key.truncate(300);
                let mut value: &[u8] = value;
                if *fit {
                    // The key and value the opcode takes (memcached's checks).
                    use binary::op;
                    match opcode {
                        op::VERSION | op::NOOP | op::QUIT | op::QUITQ | op::FLUSH | op::FLUSHQ => {
                            key.clear();
                            value = &[];
                        }
                        op::GET
                        | op::GETQ
                        | op::GETK
                        | op::GETKQ
                        | op::DELETE
                        | op::DELETEQ
                        | op::INCREMENT
                        | op::INCREMENTQ
                        | op::DECREMENT
                        | op::DECREMENTQ
                        | op::TOUCH
                        | op::GAT
                        | op::GATQ
                        | op::GATK
                        | op::GATKQ => value = &[],
                        _ => {}
                    }
                    if key.is_empty() && !value.is_empty() {
                        key = b"k0".to_vec();
                    }
                }
                b.extend(binary::encode_request(
                    opcode, &extras, &key, value, *cas, *opaque,
                ));
            }
            BinPiece::Header { fields, body } => {
                b.push(REQUEST_MAGIC);
                b.extend_from_slice(fields);
                b.extend_from_slice(body);
            }
        }
    }
    b
}

fn kv() -> Kv {
    // 64 KiB over a few shards, 2 KiB items: a few sets fill it.
    let config = StoreConfig::new(64 << 10, 2 << 10);
    Kv::new(Store::new(config, ManualClock::new(1_700_000_000)))
}

/// Feeds `input` at once: the replies, and whether it closed.
fn at_once(input: &[u8]) -> (Vec<u8>, bool) {
    let kv = kv();
    let mut out = Vec::new();
    if input.is_empty() {
        return (out, false);
    }
    let mut s = Session::for_first_byte(input[0]);
    let (used, need, flow) = s.process(input, &kv, &mut out);
    assert!(used <= input.len(), "consumed {used} of {}", input.len());
    assert!(need > used, "asks for {need} bytes after consuming {used}");
    (out, flow == Flow::Close)
}

/// Feeds `input` as the serving loop does: read by read (`cuts` are the
/// reads' sizes), the buffer handed over once it holds what was asked.
fn piecewise(input: &[u8], cuts: &[u8]) -> (Vec<u8>, bool) {
    let kv = kv();
    let mut out = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut need = 1usize;
    let mut session: Option<Session> = None;
    let mut at = 0;
    let mut reads = cuts
        .iter()
        .map(|&c| usize::from(c) + 1)
        .chain(std::iter::repeat(usize::MAX));
    while at < input.len() {
        let n = reads.next().unwrap_or(usize::MAX).min(input.len() - at);
        buf.extend_from_slice(&input[at..at + n]);
        at += n;
        if buf.len() < need {
            continue;
        }
        let s = session.get_or_insert_with(|| Session::for_first_byte(buf[0]));
        let (used, next, flow) = s.process(&buf, &kv, &mut out);
        assert!(used <= buf.len(), "consumed {used} of {}", buf.len());
        assert!(next > used, "asks for {next} bytes after consuming {used}");
        buf.drain(..used);
        need = next - used;
        if flow == Flow::Close {
            return (out, true);
        }
    }
    (out, false)
}

fn check_text_replies(out: &[u8]) {
    if !out.is_empty() {
        assert!(out.ends_with(b"\r\n"), "a text reply without its CRLF");
    }
}

fn check_binary_replies(mut out: &[u8]) {
    while !out.is_empty() {
        let h = binary::Header::parse(out).expect("a whole response header");
        assert_eq!(h.magic, RESPONSE_MAGIC, "response magic");
        let body = h.body_len as usize;
        assert!(
            usize::from(h.key_len) + usize::from(h.extras_len) <= body,
            "response key and extras beyond its body"
        );
        assert!(
            out.len() >= binary::HEADER_LEN + body,
            "response body cut short"
        );
        out = &out[binary::HEADER_LEN + body..];
    }
}

pub(super) fn case(u: &mut Unstructured<'_>, out: &mut Option<String>) -> Outcome {
    let Ok(input) = Input::arbitrary(u) else {
        return "no-input".into();
    };
    describe(out, &input);
    let (bytes, cuts, text) = match &input {
        Input::Text { pieces, cuts } => (text_bytes(pieces), cuts, true),
        Input::Binary { requests, cuts } => (binary_bytes(requests), cuts, false),
        Input::Udp {
            request_id,
            sequence,
            total,
            pieces,
        } => return udp(*request_id, *sequence, *total, &text_bytes(pieces)),
    };
    let (whole, closed) = at_once(&bytes);
    // A line over 2048 bytes closes the connection only when a read
    // leaves it without its newline (memcached's rule): past that size
    // the two feeds may rightly differ.
    if bytes.len() <= 2048 {
        let (pieces, closed_too) = piecewise(&bytes, cuts);
        assert_eq!(
            String::from_utf8_lossy(&pieces),
            String::from_utf8_lossy(&whole),
            "replies differ when fed in pieces"
        );
        assert_eq!(closed, closed_too, "closes differently in pieces");
    }
    let binary = bytes.first() == Some(&REQUEST_MAGIC);
    if binary {
        check_binary_replies(&whole);
    } else {
        check_text_replies(&whole);
    }
    let kind = match (text, binary) {
        (true, false) => "text",
        (true, true) => "text-as-binary",
        (false, true) => "binary",
        (false, false) => "binary-as-text",
    };
    let head = if binary {
        match binary::Header::parse(&whole) {
            Some(h) => format!("status {:#x}", h.vbucket_or_status),
            None => "no reply".into(),
        }
    } else {
        // The first reply's first word: STORED, VALUE, ERROR, ...
        let line = whole
            .split(|&b| b == b'\r' || b == b'\n')
            .next()
            .unwrap_or(&[]);
        let word = line.split(|&b| b == b' ').next().unwrap_or(&[]);
        String::from_utf8_lossy(&word[..word.len().min(16)]).into_owned()
    };
    format!("{kind} {head}{}", if closed { " closed" } else { "" }).into()
}

fn udp(request_id: u16, sequence: u16, total: u16, request: &[u8]) -> Outcome {
    let mut datagram = Vec::with_capacity(8 + request.len());
    datagram.extend_from_slice(&request_id.to_be_bytes());
    datagram.extend_from_slice(&(sequence % 2).to_be_bytes());
    datagram.extend_from_slice(&(total % 3).to_be_bytes());
    datagram.extend_from_slice(&[0, 0]);
    datagram.extend_from_slice(request);
    let replies = answer_datagram(&datagram, &kv());
    for r in &replies {
        assert!(r.len() >= 8, "a UDP reply shorter than its frame header");
        assert_eq!(
            r[..2],
            request_id.to_be_bytes(),
            "a UDP reply for another request"
        );
        assert!(r.len() <= 1400, "a UDP reply over 1400 bytes");
    }
    if replies.is_empty() {
        "udp silent".into()
    } else {
        "udp reply".into()
    }
}
