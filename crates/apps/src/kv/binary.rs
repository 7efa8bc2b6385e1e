//! memcached's binary protocol: 24-byte request and response headers
//! (magic, opcode, key length, extras length, data type, vbucket/status,
//! body length, opaque, cas; big-endian), extras, key and value after.
//!
//! The commands memcached 1.6 serves in binary: get/getq/getk/getkq,
//! set/add/replace (a cas in the header makes them a cas), append/prepend,
//! delete, incr/decr (with an initial value, created unless the expiration
//! is 0xffffffff), quit, flush, noop, version, stat, touch, gat/gatq/gatk/
//! gatkq, and the quiet (`…Q`) forms, which reply only on errors (and
//! getq/getkq only on hits). Errors carry memcached's message as the body.
//! A header whose lengths do not add up, or a key over 250 bytes, is
//! answered with an error and the connection closed, as memcached does; an
//! unknown opcode is answered and its body skipped.

use super::store::{DeleteOutcome, DeltaOutcome, StoreMode, StoreOutcome, KEY_MAX_LENGTH};
use super::text::Flow;
use super::{Kv, KvStats, VERSION};

pub const REQUEST_MAGIC: u8 = 0x80;
pub const RESPONSE_MAGIC: u8 = 0x81;
pub const HEADER_LEN: usize = 24;

/// Opcodes.
pub mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// Response statuses.
pub mod status {
    pub const OK: u16 = 0x00;
    pub const KEY_ENOENT: u16 = 0x01;
    pub const KEY_EEXISTS: u16 = 0x02;
    pub const E2BIG: u16 = 0x03;
    pub const EINVAL: u16 = 0x04;
    pub const NOT_STORED: u16 = 0x05;
    pub const DELTA_BADVAL: u16 = 0x06;
    pub const UNKNOWN_COMMAND: u16 = 0x81;
    pub const ENOMEM: u16 = 0x82;
}

/// memcached's message for an error status.
pub fn message(status: u16) -> &'static str {
    match status {
        status::KEY_ENOENT => "Not found",
        status::KEY_EEXISTS => "Data exists for key.",
        status::E2BIG => "Too large.",
        status::EINVAL => "Invalid arguments",
        status::NOT_STORED => "Not stored.",
        status::DELTA_BADVAL => "Non-numeric server-side value for incr or decr",
        status::ENOMEM => "Out of memory",
        _ => "Unknown command",
    }
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub magic: u8,
    pub opcode: u8,
    pub key_len: u16,
    pub extras_len: u8,
    pub data_type: u8,
    /// vbucket in requests, status in responses.
    pub vbucket_or_status: u16,
    pub body_len: u32,
    pub opaque: u32,
    pub cas: u64,
}

impl Header {
    pub fn parse(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_LEN {
            return None;
        }
        Some(Header {
            magic: b[0],
            opcode: b[1],
            key_len: u16::from_be_bytes([b[2], b[3]]),
            extras_len: b[4],
            data_type: b[5],
            vbucket_or_status: u16::from_be_bytes([b[6], b[7]]),
            body_len: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            opaque: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            cas: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(self.magic);
        out.push(self.opcode);
        out.extend_from_slice(&self.key_len.to_be_bytes());
        out.push(self.extras_len);
        out.push(self.data_type);
        out.extend_from_slice(&self.vbucket_or_status.to_be_bytes());
        out.extend_from_slice(&self.body_len.to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
    }
}

/// A request as a client sends it: the header, then extras, key and
/// value (the server echoes `opaque` in its response).
pub fn encode_request(
    opcode: u8,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    cas: u64,
    opaque: u32,
) -> Vec<u8> {
    let mut out = Vec::new();
    Header {
        magic: REQUEST_MAGIC,
        opcode,
        key_len: key.len() as u16,
        extras_len: extras.len() as u8,
        data_type: 0,
        vbucket_or_status: 0,
        body_len: (extras.len() + key.len() + value.len()) as u32,
        opaque,
        cas,
    }
    .write(&mut out);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out
}

/// Writes a response to `req` with `status`, `cas`, extras, key, value.
fn respond(
    out: &mut Vec<u8>,
    req: &Header,
    status: u16,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    Header {
        magic: RESPONSE_MAGIC,
        opcode: req.opcode,
        key_len: key.len() as u16,
        extras_len: extras.len() as u8,
        data_type: 0,
        vbucket_or_status: status,
        body_len: (extras.len() + key.len() + value.len()) as u32,
        opaque: req.opaque,
        cas,
    }
    .write(out);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

fn error(out: &mut Vec<u8>, req: &Header, status: u16) {
    respond(out, req, status, 0, &[], &[], message(status).as_bytes());
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The binary protocol over one connection's bytes.
#[derive(Debug, Default)]
pub struct BinarySession {
    /// Bytes of a refused body still to drop.
    swallow: usize,
}

/// Whether the lengths of a request fit its opcode (memcached's checks).
fn well_formed(h: &Header) -> Option<bool> {
    let (k, e, b) = (h.key_len as u32, h.extras_len as u32, h.body_len);
    Some(match h.opcode {
        op::VERSION | op::NOOP | op::QUIT | op::QUITQ => e == 0 && k == 0 && b == 0,
        op::FLUSH | op::FLUSHQ => k == 0 && b == e && (e == 0 || e == 4),
        op::SET | op::SETQ | op::ADD | op::ADDQ | op::REPLACE | op::REPLACEQ => {
            e == 8 && k != 0 && b >= k + 8
        }
        op::GET | op::GETQ | op::GETK | op::GETKQ => e == 0 && b == k && k > 0,
        op::DELETE | op::DELETEQ => k > 0 && e == 0 && b == k,
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            k > 0 && e == 20 && b == k + e
        }
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ => k > 0 && e == 0,
        op::STAT => e == 0,
        op::TOUCH | op::GAT | op::GATQ | op::GATK | op::GATKQ => e == 4 && k != 0,
        _ => return None,
    })
}

impl BinarySession {
    pub fn new() -> BinarySession {
        BinarySession::default()
    }

    /// As [`super::text::TextSession::process`].
    pub fn process(&mut self, input: &[u8], kv: &Kv, out: &mut Vec<u8>) -> (usize, usize, Flow) {
        let mut at = 0;
        loop {
            if self.swallow > 0 {
                let n = self.swallow.min(input.len() - at);
                self.swallow -= n;
                at += n;
                if self.swallow > 0 {
                    return (at, at + 1, Flow::Continue);
                }
            }
            let rest = &input[at..];
            let Some(h) = Header::parse(rest) else {
                return (at, at + HEADER_LEN, Flow::Continue);
            };
            if h.magic != REQUEST_MAGIC {
                return (input.len(), input.len() + 1, Flow::Close);
            }
            let (k, e, b) = (
                h.key_len as usize,
                h.extras_len as usize,
                h.body_len as usize,
            );
            if k + e > b {
                error(out, &h, status::UNKNOWN_COMMAND);
                return (input.len(), input.len() + 1, Flow::Close);
            }
            if k > KEY_MAX_LENGTH {
                error(out, &h, status::EINVAL);
                return (input.len(), input.len() + 1, Flow::Close);
            }
            let Some(ok) = well_formed(&h) else {
                // Unknown opcode: answer, then skip its body — as memcached
                // does, the whole body length after the extras and key it
                // has already read (so a request with extras or a key eats
                // that many bytes of the next).
                if rest.len() < HEADER_LEN + e + k {
                    return (at, at + HEADER_LEN + e + k, Flow::Continue);
                }
                error(out, &h, status::UNKNOWN_COMMAND);
                at += HEADER_LEN + e + k;
                self.swallow = b;
                continue;
            };
            if !ok {
                error(out, &h, status::EINVAL);
                return (input.len(), input.len() + 1, Flow::Close);
            }
            if rest.len() < HEADER_LEN + e + k {
                return (at, at + HEADER_LEN + e + k, Flow::Continue);
            }
            let storage = matches!(
                h.opcode,
                op::SET
                    | op::SETQ
                    | op::ADD
                    | op::ADDQ
                    | op::REPLACE
                    | op::REPLACEQ
                    | op::APPEND
                    | op::APPENDQ
                    | op::PREPEND
                    | op::PREPENDQ
            );
            // No other request carries a value; one that says it does
            // would only make us buffer it.
            if !storage && b > e + k + kv.store.config().item_size_max {
                error(out, &h, status::EINVAL);
                return (input.len(), input.len() + 1, Flow::Close);
            }
            // A storage command over the item-size limit is refused before
            // its value is read, as memcached does.
            if storage {
                let value_len = b - e - k;
                let flags = if e == 8 { be32(&rest[HEADER_LEN..]) } else { 0 };
                if kv.store.too_large(k, value_len, flags) {
                    let key = &rest[HEADER_LEN + e..HEADER_LEN + e + k];
                    if matches!(h.opcode, op::SET | op::SETQ) {
                        kv.store.delete(key, 0);
                    }
                    KvStats::bump(&kv.stats.store_too_large);
                    error(out, &h, status::E2BIG);
                    at += HEADER_LEN + e + k;
                    self.swallow = value_len;
                    continue;
                }
            }
            if rest.len() < HEADER_LEN + b {
                return (at, at + HEADER_LEN + b, Flow::Continue);
            }
            let body = &rest[HEADER_LEN..HEADER_LEN + b];
            at += HEADER_LEN + b;
            let extras = &body[..e];
            let key = &body[e..e + k];
            let value = &body[e + k..];
            if execute(&h, extras, key, value, kv, out) == Flow::Close {
                return (at, at + 1, Flow::Close);
            }
        }
    }
}

/// Runs one well-formed request.
fn execute(
    h: &Header,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    kv: &Kv,
    out: &mut Vec<u8>,
) -> Flow {
    let store = &kv.store;
    let stats = &kv.stats;
    let quiet = matches!(
        h.opcode,
        op::GETQ
            | op::GETKQ
            | op::SETQ
            | op::ADDQ
            | op::REPLACEQ
            | op::DELETEQ
            | op::INCREMENTQ
            | op::DECREMENTQ
            | op::QUITQ
            | op::FLUSHQ
            | op::APPENDQ
            | op::PREPENDQ
            | op::GATQ
            | op::GATKQ
    );
    match h.opcode {
        op::GET
        | op::GETQ
        | op::GETK
        | op::GETKQ
        | op::TOUCH
        | op::GAT
        | op::GATQ
        | op::GATK
        | op::GATKQ => {
            get(h, extras, key, kv, out, quiet);
        }
        op::SET
        | op::SETQ
        | op::ADD
        | op::ADDQ
        | op::REPLACE
        | op::REPLACEQ
        | op::APPEND
        | op::APPENDQ
        | op::PREPEND
        | op::PREPENDQ => {
            return store_item(h, extras, key, value, kv, out, quiet);
        }
        op::DELETE | op::DELETEQ => match store.delete(key, h.cas) {
            DeleteOutcome::Deleted => {
                KvStats::bump(&stats.delete_hits);
                ok(out, h, quiet, 0, &[]);
            }
            DeleteOutcome::NotFound => {
                KvStats::bump(&stats.delete_misses);
                error(out, h, status::KEY_ENOENT);
            }
            DeleteOutcome::Exists => error(out, h, status::KEY_EEXISTS),
        },
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            delta(h, extras, key, kv, out, quiet);
        }
        op::QUIT | op::QUITQ => {
            ok(out, h, quiet, 0, &[]);
            return Flow::Close;
        }
        op::FLUSH | op::FLUSHQ => {
            KvStats::bump(&stats.cmd_flush);
            let delay = if extras.len() == 4 {
                i64::from(be32(extras))
            } else {
                0
            };
            store.flush_all(delay);
            ok(out, h, quiet, 0, &[]);
        }
        op::NOOP => ok(out, h, quiet, 0, &[]),
        op::VERSION => ok(out, h, quiet, 0, VERSION.as_bytes()),
        op::STAT => {
            if key.is_empty() {
                for (name, value) in kv.general_stats() {
                    respond(
                        out,
                        h,
                        status::OK,
                        0,
                        &[],
                        name.as_bytes(),
                        value.as_bytes(),
                    );
                }
                respond(out, h, status::OK, 0, &[], &[], &[]);
            } else if key == b"reset" {
                respond(out, h, status::OK, 0, &[], &[], &[]);
            } else {
                error(out, h, status::KEY_ENOENT);
            }
        }
        _ => error(out, h, status::UNKNOWN_COMMAND),
    }
    Flow::Continue
}

/// The OK reply with `value` (no extras, no key), unless `quiet`.
fn ok(out: &mut Vec<u8>, h: &Header, quiet: bool, cas: u64, value: &[u8]) {
    if !quiet {
        respond(out, h, status::OK, cas, &[], &[], value);
    }
}

/// get, getk, touch, gat, gatk and their quiet forms.
fn get(h: &Header, extras: &[u8], key: &[u8], kv: &Kv, out: &mut Vec<u8>, quiet: bool) {
    let (store, stats) = (&kv.store, &kv.stats);
    let touch = matches!(
        h.opcode,
        op::TOUCH | op::GAT | op::GATQ | op::GATK | op::GATKQ
    );
    let with_key = matches!(h.opcode, op::GETK | op::GETKQ | op::GATK | op::GATKQ);
    let item = if touch {
        KvStats::bump(&stats.cmd_touch);
        // The binary expiration is unsigned.
        store.get_and_touch(key, i64::from(be32(extras)))
    } else {
        KvStats::bump(&stats.cmd_get);
        store.get(key)
    };
    match item {
        Some(item) => {
            KvStats::bump(if touch {
                &stats.touch_hits
            } else {
                &stats.get_hits
            });
            let flags = item.flags.to_be_bytes();
            let v: &[u8] = if h.opcode == op::TOUCH {
                &[]
            } else {
                &item.value
            };
            // Hits are answered even by the quiet gets.
            respond(
                out,
                h,
                status::OK,
                item.cas,
                &flags,
                if with_key { key } else { &[] },
                v,
            );
        }
        None => {
            KvStats::bump(if touch {
                &stats.touch_misses
            } else {
                &stats.get_misses
            });
            if !quiet {
                if with_key {
                    respond(out, h, status::KEY_ENOENT, 0, &[], key, &[]);
                } else {
                    error(out, h, status::KEY_ENOENT);
                }
            }
        }
    }
}

/// set, add, replace, append, prepend and their quiet forms.
fn store_item(
    h: &Header,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    kv: &Kv,
    out: &mut Vec<u8>,
    quiet: bool,
) -> Flow {
    let (store, stats) = (&kv.store, &kv.stats);
    KvStats::bump(&stats.cmd_set);
    let (flags, exptime) = if extras.len() == 8 {
        (be32(extras), i64::from(be32(&extras[4..])))
    } else {
        (0, 0)
    };
    let base = match h.opcode {
        op::SET | op::SETQ => StoreMode::Set,
        op::ADD | op::ADDQ => StoreMode::Add,
        op::REPLACE | op::REPLACEQ => StoreMode::Replace,
        op::APPEND | op::APPENDQ => StoreMode::Append,
        _ => StoreMode::Prepend,
    };
    let appending = matches!(base, StoreMode::Append | StoreMode::Prepend);
    let mode = if h.cas != 0 && !appending {
        StoreMode::Cas(h.cas)
    } else {
        base
    };
    if appending && h.cas != 0 {
        // append/prepend honour a cas: check it first.
        match store.get(key) {
            Some(item) if item.cas != h.cas => {
                error(out, h, status::KEY_EEXISTS);
                return Flow::Continue;
            }
            _ => {}
        }
    }
    match store.store(mode, key, value, flags, exptime) {
        StoreOutcome::Stored(cas) => ok(out, h, quiet, cas, &[]),
        StoreOutcome::NotStored => error(
            out,
            h,
            match base {
                StoreMode::Add => status::KEY_EEXISTS,
                StoreMode::Replace => status::KEY_ENOENT,
                _ => status::NOT_STORED,
            },
        ),
        StoreOutcome::Exists => error(out, h, status::KEY_EEXISTS),
        StoreOutcome::NotFound => error(out, h, status::KEY_ENOENT),
        StoreOutcome::TooLarge => error(out, h, status::E2BIG),
        StoreOutcome::OutOfMemory => error(out, h, status::ENOMEM),
    }
    Flow::Continue
}

/// increment and decrement and their quiet forms.
fn delta(h: &Header, extras: &[u8], key: &[u8], kv: &Kv, out: &mut Vec<u8>, quiet: bool) {
    let (store, stats) = (&kv.store, &kv.stats);
    let incr = matches!(h.opcode, op::INCREMENT | op::INCREMENTQ);
    let delta = be64(extras);
    let initial = be64(&extras[8..]);
    let expiration = be32(&extras[16..]);
    match store.delta(key, incr, delta, h.cas) {
        DeltaOutcome::Value(v, cas) => {
            KvStats::bump(if incr {
                &stats.incr_hits
            } else {
                &stats.decr_hits
            });
            ok(out, h, quiet, cas, &v.to_be_bytes());
        }
        DeltaOutcome::NotFound if expiration != 0xffff_ffff && h.cas == 0 => {
            KvStats::bump(if incr {
                &stats.incr_misses
            } else {
                &stats.decr_misses
            });
            let digits = initial.to_string();
            match store.store(
                StoreMode::Add,
                key,
                digits.as_bytes(),
                0,
                i64::from(expiration),
            ) {
                StoreOutcome::Stored(cas) => ok(out, h, quiet, cas, &initial.to_be_bytes()),
                _ => error(out, h, status::NOT_STORED),
            }
        }
        DeltaOutcome::NotFound => {
            KvStats::bump(if incr {
                &stats.incr_misses
            } else {
                &stats.decr_misses
            });
            error(out, h, status::KEY_ENOENT);
        }
        DeltaOutcome::NonNumeric => error(out, h, status::DELTA_BADVAL),
        DeltaOutcome::Exists => error(out, h, status::KEY_EEXISTS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::store::{ManualClock, Store, StoreConfig};

    fn kv() -> Kv {
        Kv::new(Store::new(
            StoreConfig::default(),
            ManualClock::new(1_700_000_000),
        ))
    }

    fn request(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
        encode_request(opcode, extras, key, value, cas, 0xabcd)
    }

    /// Responses: (header, body).
    fn responses(mut b: &[u8]) -> Vec<(Header, Vec<u8>)> {
        let mut all = Vec::new();
        while let Some(h) = Header::parse(b) {
            let n = HEADER_LEN + h.body_len as usize;
            all.push((h, b[HEADER_LEN..n].to_vec()));
            b = &b[n..];
        }
        all
    }

    fn run(kv: &Kv, input: &[u8]) -> (Vec<(Header, Vec<u8>)>, Flow) {
        let mut s = BinarySession::new();
        let mut out = Vec::new();
        let (used, _, flow) = s.process(input, kv, &mut out);
        if flow == Flow::Continue {
            assert_eq!(used, input.len());
        }
        (responses(&out), flow)
    }

    fn set_extras(flags: u32, exp: u32) -> Vec<u8> {
        let mut e = flags.to_be_bytes().to_vec();
        e.extend_from_slice(&exp.to_be_bytes());
        e
    }

    #[test]
    fn set_get_delete_incr() {
        let kv = kv();
        let (r, _) = run(&kv, &request(op::SET, &set_extras(5, 0), b"k", b"hello", 0));
        assert_eq!(r[0].0.vbucket_or_status, status::OK);
        assert_eq!(r[0].0.opaque, 0xabcd);
        let cas = r[0].0.cas;
        let (r, _) = run(&kv, &request(op::GETK, &[], b"k", &[], 0));
        assert_eq!(r[0].0.cas, cas);
        assert_eq!(r[0].1, b"\0\0\0\x05khello");
        let (r, _) = run(&kv, &request(op::GET, &[], b"nope", &[], 0));
        assert_eq!(r[0].0.vbucket_or_status, status::KEY_ENOENT);
        assert_eq!(r[0].1, b"Not found");
        // Quiet get: nothing on a miss; noop answers.
        let mut both = request(op::GETQ, &[], b"nope", &[], 0);
        both.extend(request(op::NOOP, &[], &[], &[], 0));
        let (r, _) = run(&kv, &both);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0.opcode, op::NOOP);
        // cas mismatch, add on existing.
        let (r, _) = run(
            &kv,
            &request(op::SET, &set_extras(0, 0), b"k", b"x", cas + 99),
        );
        assert_eq!(r[0].0.vbucket_or_status, status::KEY_EEXISTS);
        let (r, _) = run(&kv, &request(op::ADD, &set_extras(0, 0), b"k", b"x", 0));
        assert_eq!(r[0].0.vbucket_or_status, status::KEY_EEXISTS);
        // incr creates with the initial value, then adds.
        let mut e = 5u64.to_be_bytes().to_vec();
        e.extend_from_slice(&10u64.to_be_bytes());
        e.extend_from_slice(&0u32.to_be_bytes());
        let (r, _) = run(&kv, &request(op::INCREMENT, &e, b"n", &[], 0));
        assert_eq!(r[0].1, 10u64.to_be_bytes());
        let (r, _) = run(&kv, &request(op::INCREMENT, &e, b"n", &[], 0));
        assert_eq!(r[0].1, 15u64.to_be_bytes());
        let (r, _) = run(&kv, &request(op::INCREMENT, &e, b"k", &[], 0));
        assert_eq!(r[0].0.vbucket_or_status, status::DELTA_BADVAL);
        let (r, _) = run(&kv, &request(op::DELETE, &[], b"k", &[], 0));
        assert_eq!(r[0].0.vbucket_or_status, status::OK);
        let (r, _) = run(&kv, &request(op::VERSION, &[], &[], &[], 0));
        assert_eq!(r[0].1, VERSION.as_bytes());
        let (r, flow) = run(&kv, &request(op::QUIT, &[], &[], &[], 0));
        assert_eq!((r.len(), flow), (1, Flow::Close));
    }

    #[test]
    fn malformed_headers_close_and_unknown_opcodes_are_skipped() {
        let kv = kv();
        let mut bad = request(op::GET, &[], b"k", &[], 0);
        bad[11] = 0; // body length 0 < key length
        let (r, flow) = run(&kv, &bad);
        assert_eq!(r[0].0.vbucket_or_status, status::UNKNOWN_COMMAND);
        assert_eq!(flow, Flow::Close);
        let (r, flow) = run(&kv, &request(op::GET, &[1, 2], b"k", &[], 0));
        assert_eq!(
            (r[0].0.vbucket_or_status, flow),
            (status::EINVAL, Flow::Close)
        );
        let mut two = request(0x55, &[], &[], b"zz", 0);
        two.extend(request(op::NOOP, &[], &[], &[], 0));
        let (r, flow) = run(&kv, &two);
        assert_eq!(flow, Flow::Continue);
        assert_eq!(r[0].0.vbucket_or_status, status::UNKNOWN_COMMAND);
        assert_eq!(r[1].0.opcode, op::NOOP);
    }

    #[test]
    fn partial_requests_wait() {
        let kv = kv();
        let whole = request(op::SET, &set_extras(0, 0), b"k", b"v", 0);
        let mut s = BinarySession::new();
        for cut in 0..whole.len() {
            let mut out = Vec::new();
            let (used, need, _) = s.process(&whole[..cut], &kv, &mut out);
            assert_eq!(used, 0);
            assert!(need > cut);
            assert!(out.is_empty());
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..300)) {
            let kv = kv();
            let mut input = vec![REQUEST_MAGIC];
            input.extend(bytes);
            let mut s = BinarySession::new();
            let mut out = Vec::new();
            let _ = s.process(&input, &kv, &mut out);
        }
    }
}
