//! memcached's meta commands `mg` (get), `ms` (set), `md` (delete) and
//! `ma` (arithmetic) of
//! the text protocol (`mn` is in [`super::text`]): a key, then one-letter
//! flags, some with a token (`T30`, `Oopaque`), echoed in the reply in the
//! order given.
//!
//! Supported flags: mg `v c f k O q s t T u N R b` (and `h l`, answered as never
//! fetched / accessed now); ms `c C F I k O q T M` (modes E A P R S); md
//! `C k O q`; ma `N J D T M C q t c v k O`. Not supported (memcached
//! 1.6's stale-while-revalidate): `I` as "mark stale" (md deletes, and no
//! item is ever stale: no `X` flag). mg's `N` (vivify on miss) and `R`
//! (recache) hand out the `W`/`Z` flags as memcached does. `b` (the key token
//! is base64) is supported on all four; unlike memcached, an item stored
//! under a base64 key does not remember it (memcached then answers a plain
//! `mg KEY k` with the key in base64 and `b`).

use std::borrow::Cow;
use std::io::Write as _;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use super::command::{Command, Line};
use super::number::{strtol32, strtoul32, strtoull};
use super::store::{DeleteOutcome, DeltaOutcome, Recache, StoreMode, StoreOutcome, KEY_MAX_LENGTH};
use super::{Kv, KvStats};

pub use super::command::Meta;

/// memcached's limit on the tokens of a meta command (`ntokens`).
const MAX_OPT_TOKENS: usize = 20;
/// The longest opaque token.
const MAX_OPAQUE: usize = 32;

/// What the flags of one command say.
#[derive(Debug, Default)]
struct Flags {
    value: bool,
    quiet: bool,
    ttl: Option<i64>,
    vivify: Option<i64>,
    recache: Option<i64>,
    client_flags: u32,
    cas: Option<u64>,
    mode: Option<u8>,
    initial: Option<u64>,
    delta: Option<u64>,
}

/// memcached's `_meta_flag_preparse`.
fn preparse(tokens: &[&[u8]], default_error: &'static str) -> Result<Flags, &'static str> {
    let mut seen = [false; 128];
    let mut f = Flags::default();
    let mut error: Option<&'static str> = None;
    for t in tokens {
        let o = t[0];
        if o >= 127 || seen[o as usize] {
            return Err("CLIENT_ERROR duplicate flag");
        }
        seen[o as usize] = true;
        let arg = &t[1..];
        match o {
            b'N' => match strtol32(arg) {
                Some(v) => f.vivify = Some(v.into()),
                None => error = Some("CLIENT_ERROR bad token in command line format"),
            },
            b'R' => match strtol32(arg) {
                Some(v) => f.recache = Some(v.into()),
                None => error = Some("CLIENT_ERROR bad token in command line format"),
            },
            b'T' => match strtol32(arg) {
                Some(v) => f.ttl = Some(v.into()),
                None => error = Some("CLIENT_ERROR bad token in command line format"),
            },
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' | b'u' | b'I'
            | b'b' => {}
            b'v' => f.value = true,
            b'q' => f.quiet = true,
            b'F' => match strtoul32(arg) {
                Some(v) => f.client_flags = v,
                None => error = Some(error.unwrap_or(default_error)),
            },
            b'C' => match strtoull(arg) {
                Some(v) => f.cas = Some(v),
                None => error = Some("CLIENT_ERROR bad token in command line format"),
            },
            b'M' => {
                if t.len() != 2 {
                    error = Some("CLIENT_ERROR incorrect length for M token");
                } else {
                    f.mode = Some(t[1]);
                }
            }
            b'J' => match strtoull(arg) {
                Some(v) => f.initial = Some(v),
                None => error = Some("CLIENT_ERROR invalid numeric initial value"),
            },
            b'D' => match strtoull(arg) {
                Some(v) => f.delta = Some(v),
                None => error = Some("CLIENT_ERROR invalid numeric delta value"),
            },
            _ => return Err("CLIENT_ERROR invalid flag"),
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(f),
    }
}

fn err(line: &'static str) -> Line<'static> {
    Line::Done(Command::Reply {
        line,
        noreply: false,
    })
}

const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";

/// Parses mg/ms/md (`name`) from its tokens; `after` is what follows the
/// line (ms's data block).
pub(super) fn parse<'a>(
    name: u8,
    tokens: &[&'a [u8]],
    ntokens: usize,
    after: &'a [u8],
    item_size_max: usize,
) -> Line<'a> {
    if ntokens < 3 {
        return err("ERROR");
    }
    let key = tokens[1];
    // Only the tokens memcached's tokenizer kept.
    let kept = &tokens[..(ntokens - 1).min(tokens.len())];
    match name {
        b'g' => {
            if key.len() > KEY_MAX_LENGTH {
                return err(BAD_FORMAT);
            }
            if ntokens > MAX_OPT_TOKENS {
                return err("CLIENT_ERROR options flags are too long");
            }
            let f = match preparse(&kept[2..], BAD_FORMAT) {
                Ok(f) => f,
                Err(e) => return err(e),
            };
            Line::Done(Command::Meta(Meta::Get {
                key,
                flags: kept[2..].to_vec(),
                value: f.value,
                quiet: f.quiet,
                ttl: f.ttl,
                vivify: f.vivify,
                recache: f.recache,
            }))
        }
        b's' => {
            if key.len() > KEY_MAX_LENGTH || ntokens == 3 {
                return err(BAD_FORMAT);
            }
            if ntokens > MAX_OPT_TOKENS {
                return err("CLIENT_ERROR options flags too long");
            }
            let vlen = match strtol32(tokens[2]) {
                Some(v) if (0..=i32::MAX - 2).contains(&v) => v as usize,
                _ => return err(BAD_FORMAT),
            };
            let data_len = vlen + 2;
            // Errors from here on swallow the data block.
            let refuse = |line: &'static str| {
                Line::Done(Command::Swallow {
                    line,
                    swallow: data_len,
                    unlink: None,
                })
            };
            let f = match preparse(&kept[3..], BAD_FORMAT) {
                Ok(f) => f,
                Err(e) => return refuse(e),
            };
            if kept[3..]
                .iter()
                .any(|t| t[0] == b'O' && t.len() > MAX_OPAQUE)
            {
                return refuse("CLIENT_ERROR opaque token too long");
            }
            let base = match f.mode {
                None | Some(b'S') => StoreMode::Set,
                Some(b'E') => StoreMode::Add,
                Some(b'A') => StoreMode::Append,
                Some(b'P') => StoreMode::Prepend,
                Some(b'R') => StoreMode::Replace,
                Some(_) => return refuse("CLIENT_ERROR invalid mode for ms M token"),
            };
            let mode = match (f.cas, base) {
                (Some(c), StoreMode::Set | StoreMode::Replace) => StoreMode::Cas(c),
                _ => base,
            };
            let size = super::store::ITEM_HEADER - 2
                + key.len()
                + data_len
                + if f.client_flags != 0 { 4 } else { 0 };
            if size > item_size_max {
                return Line::Done(Command::Swallow {
                    line: "SERVER_ERROR object too large for cache",
                    swallow: data_len,
                    unlink: Some(key),
                });
            }
            if after.len() < data_len {
                return Line::NeedData(data_len);
            }
            let block = &after[..data_len];
            if &block[vlen..] != b"\r\n" {
                // Meta commands always report errors.
                return Line::Data {
                    cmd: Command::Reply {
                        line: "CLIENT_ERROR bad data chunk",
                        noreply: false,
                    },
                    data_len,
                };
            }
            Line::Data {
                cmd: Command::Meta(Meta::Set {
                    key,
                    flags: kept[3..].to_vec(),
                    data: &block[..vlen],
                    mode,
                    client_flags: f.client_flags,
                    exptime: f.ttl.unwrap_or(0),
                    quiet: f.quiet,
                }),
                data_len,
            }
        }
        b'a' => {
            if key.len() > KEY_MAX_LENGTH {
                return err(BAD_FORMAT);
            }
            if ntokens > MAX_OPT_TOKENS {
                return err("CLIENT_ERROR options flags too long");
            }
            let f = match preparse(&kept[2..], BAD_FORMAT) {
                Ok(f) => f,
                Err(_) => return err("CLIENT_ERROR invalid or duplicate flag"),
            };
            let incr = match f.mode {
                None | Some(b'I') | Some(b'+') => true,
                Some(b'D') | Some(b'-') => false,
                Some(_) => return err("CLIENT_ERROR invalid mode for ma M token"),
            };
            if kept[2..]
                .iter()
                .any(|t| t[0] == b'O' && t.len() > MAX_OPAQUE)
            {
                return err("CLIENT_ERROR opaque token too long");
            }
            Line::Done(Command::Meta(Meta::Arithmetic {
                key,
                flags: kept[2..].to_vec(),
                incr,
                delta: f.delta.unwrap_or(1),
                vivify: f.vivify,
                initial: f.initial.unwrap_or(0),
                ttl: f.ttl,
                cas: f.cas,
                value: f.value,
                quiet: f.quiet,
            }))
        }
        _ => {
            if key.len() > KEY_MAX_LENGTH {
                return err(BAD_FORMAT);
            }
            if ntokens > MAX_OPT_TOKENS {
                return err("CLIENT_ERROR options flags too long");
            }
            let f = match preparse(&kept[2..], BAD_FORMAT) {
                Ok(f) => f,
                Err(_) => return err("CLIENT_ERROR invalid or duplicate flag"),
            };
            if kept[2..]
                .iter()
                .any(|t| t[0] == b'O' && t.len() > MAX_OPAQUE)
            {
                return err("CLIENT_ERROR opaque token too long");
            }
            Line::Done(Command::Meta(Meta::Delete {
                key,
                flags: kept[2..].to_vec(),
                cas: f.cas,
                quiet: f.quiet,
            }))
        }
    }
}

/// Appends the `k` flag's return value: the key, base64-encoded and
/// followed by the `b` flag when the request's key was (memcached's order).
fn write_key(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    out.extend_from_slice(b" k");
    if binary {
        out.extend_from_slice(BASE64.encode(key).as_bytes());
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// The key a request names: with the `b` flag its token is base64
/// (strict: canonical padding, as memcached decodes), else the token.
fn request_key<'k>(token: &'k [u8], flags: &[&[u8]]) -> Option<(Cow<'k, [u8]>, bool)> {
    if flags.iter().any(|t| t[0] == b'b') {
        let decoded = BASE64.decode(token).ok().filter(|k| !k.is_empty())?;
        Some((Cow::Owned(decoded), true))
    } else {
        Some((Cow::Borrowed(token), false))
    }
}

/// Appends the `O` and `k` flags' return values.
fn opaque_and_key(out: &mut Vec<u8>, flags: &[&[u8]], key: &[u8], binary: bool) {
    for t in flags {
        match t[0] {
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(t);
            }
            b'k' => write_key(out, key, binary),
            _ => {}
        }
    }
}

/// Runs one meta command, appending its reply to `out`.
pub(super) fn execute(m: &Meta<'_>, kv: &Kv, out: &mut Vec<u8>) {
    let (token, flags) = match m {
        Meta::Get { key, flags, .. }
        | Meta::Set { key, flags, .. }
        | Meta::Delete { key, flags, .. }
        | Meta::Arithmetic { key, flags, .. } => (*key, flags),
    };
    let Some((key, binary)) = request_key(token, flags) else {
        out.extend_from_slice(b"CLIENT_ERROR error decoding key\r\n");
        return;
    };
    execute_on(m, &key, binary, kv, out);
}

/// [`execute`] on the key the request names (`binary`: given in base64).
fn execute_on(m: &Meta<'_>, key: &[u8], binary: bool, kv: &Kv, out: &mut Vec<u8>) {
    match *m {
        Meta::Get { .. } => get(m, key, binary, kv, out),
        Meta::Set { .. } => set(m, key, binary, kv, out),
        Meta::Arithmetic { .. } => arithmetic(m, key, binary, kv, out),
        Meta::Delete { .. } => delete(m, key, binary, kv, out),
    }
}

/// `mg`: the item's value and the flags asked for, or a miss.
fn get(m: &Meta<'_>, key: &[u8], binary: bool, kv: &Kv, out: &mut Vec<u8>) {
    let Meta::Get {
        key: _,
        ref flags,
        value,
        quiet,
        ttl,
        vivify,
        recache,
    } = *m
    else {
        unreachable!("called for a Get request");
    };
    let store = &kv.store;
    if flags.iter().any(|t| t[0] == b'O' && t.len() > MAX_OPAQUE) {
        out.extend_from_slice(b"CLIENT_ERROR opaque token too long\r\n");
        return;
    }
    KvStats::bump(&kv.stats.cmd_get);
    let Some((item, token)) = store.meta_get(key, ttl, vivify, recache) else {
        KvStats::bump(&kv.stats.get_misses);
        if !quiet {
            out.extend_from_slice(b"EN");
            opaque_and_key(out, flags, key, binary);
            out.extend_from_slice(b"\r\n");
        }
        return;
    };
    KvStats::bump(&kv.stats.get_hits);
    if value {
        let _ = write!(out, "VA {}", item.value.len());
    } else {
        out.extend_from_slice(b"HD");
    }
    let now = store.now();
    for t in flags {
        match t[0] {
            b's' => {
                let _ = write!(out, " s{}", item.value.len());
            }
            b't' => {
                if item.expires == 0 {
                    out.extend_from_slice(b" t-1");
                } else {
                    let _ = write!(out, " t{}", item.expires.saturating_sub(now));
                }
            }
            b'c' => {
                let _ = write!(out, " c{}", item.cas);
            }
            b'f' => {
                let _ = write!(out, " f{}", item.flags);
            }
            b'l' => out.extend_from_slice(b" l0"),
            b'h' => out.extend_from_slice(b" h0"),
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(t);
            }
            b'k' => write_key(out, key, binary),
            _ => {}
        }
    }
    match token {
        Recache::Win => out.extend_from_slice(b" W"),
        Recache::Won => out.extend_from_slice(b" Z"),
        Recache::None => {}
    }
    out.extend_from_slice(b"\r\n");
    if value {
        out.extend_from_slice(&item.value);
        out.extend_from_slice(b"\r\n");
    }
}

/// `ms`: stores the value, answers with the flags asked for.
fn set(m: &Meta<'_>, key: &[u8], binary: bool, kv: &Kv, out: &mut Vec<u8>) {
    let Meta::Set {
        key: _,
        ref flags,
        data,
        mode,
        client_flags,
        exptime,
        quiet,
    } = *m
    else {
        unreachable!("called for a Set request");
    };
    let store = &kv.store;
    KvStats::bump(&kv.stats.cmd_set);
    let outcome = store.store(mode, key, data, client_flags, exptime);
    let (code, cas) = match outcome {
        StoreOutcome::Stored(cas) => {
            if quiet {
                return;
            }
            ("HD", cas)
        }
        StoreOutcome::Exists => ("EX", 0),
        StoreOutcome::NotFound => ("NF", 0),
        StoreOutcome::NotStored => ("NS", 0),
        StoreOutcome::TooLarge => {
            out.extend_from_slice(b"SERVER_ERROR object too large for cache\r\n");
            return;
        }
        StoreOutcome::OutOfMemory => {
            out.extend_from_slice(b"SERVER_ERROR out of memory storing object\r\n");
            return;
        }
    };
    out.extend_from_slice(code.as_bytes());
    for t in flags {
        match t[0] {
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(t);
            }
            b'k' => write_key(out, key, binary),
            b'c' => {
                let _ = write!(out, " c{cas}");
            }
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// `ma`: increments or decrements (creating the item with `N`).
fn arithmetic(m: &Meta<'_>, key: &[u8], binary: bool, kv: &Kv, out: &mut Vec<u8>) {
    let Meta::Arithmetic {
        key: _,
        ref flags,
        incr,
        delta,
        vivify,
        initial,
        ttl,
        cas,
        value,
        quiet,
    } = *m
    else {
        unreachable!("called for a Arithmetic request");
    };
    let store = &kv.store;
    let (number, new_cas) = match store.delta(key, incr, delta, cas.unwrap_or(0)) {
        DeltaOutcome::Value(v, c) => {
            KvStats::bump(if incr {
                &kv.stats.incr_hits
            } else {
                &kv.stats.decr_hits
            });
            if quiet {
                if let Some(t) = ttl {
                    store.touch(key, t);
                }
                return;
            }
            (v, c)
        }
        DeltaOutcome::NonNumeric => {
            out.extend_from_slice(
                b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
            );
            return;
        }
        DeltaOutcome::NotFound if vivify.is_some() => {
            let digits = initial.to_string();
            let exptime = vivify.unwrap_or(0);
            match store.store(StoreMode::Add, key, digits.as_bytes(), 0, exptime) {
                StoreOutcome::Stored(c) => (initial, c),
                _ => {
                    out.extend_from_slice(b"NS");
                    opaque_and_key(out, flags, key, binary);
                    out.extend_from_slice(b"\r\n");
                    return;
                }
            }
        }
        DeltaOutcome::NotFound => {
            KvStats::bump(if incr {
                &kv.stats.incr_misses
            } else {
                &kv.stats.decr_misses
            });
            out.extend_from_slice(b"NF");
            opaque_and_key(out, flags, key, binary);
            out.extend_from_slice(b"\r\n");
            return;
        }
        DeltaOutcome::Exists => {
            out.extend_from_slice(b"EX");
            opaque_and_key(out, flags, key, binary);
            out.extend_from_slice(b"\r\n");
            return;
        }
    };
    if let Some(t) = ttl {
        store.touch(key, t);
    }
    let digits = number.to_string();
    if value {
        let _ = write!(out, "VA {}", digits.len());
    } else {
        out.extend_from_slice(b"HD");
    }
    for t in flags {
        match t[0] {
            b'c' => {
                let _ = write!(out, " c{new_cas}");
            }
            b't' => {
                let expires = store.get(key).map_or(0, |i| i.expires);
                if expires == 0 {
                    out.extend_from_slice(b" t-1");
                } else {
                    let _ = write!(out, " t{}", expires.saturating_sub(store.now()));
                }
            }
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(t);
            }
            b'k' => write_key(out, key, binary),
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
    if value {
        out.extend_from_slice(digits.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// `md`: deletes the item (if its cas matches).
fn delete(m: &Meta<'_>, key: &[u8], binary: bool, kv: &Kv, out: &mut Vec<u8>) {
    let Meta::Delete {
        key: _,
        ref flags,
        cas,
        quiet,
    } = *m
    else {
        unreachable!("called for a Delete request");
    };
    let store = &kv.store;
    let code = match store.delete(key, cas.unwrap_or(0)) {
        DeleteOutcome::Deleted => {
            KvStats::bump(&kv.stats.delete_hits);
            if quiet {
                return;
            }
            "HD"
        }
        DeleteOutcome::NotFound => {
            KvStats::bump(&kv.stats.delete_misses);
            "NF"
        }
        DeleteOutcome::Exists => "EX",
    };
    out.extend_from_slice(code.as_bytes());
    opaque_and_key(out, flags, key, binary);
    out.extend_from_slice(b"\r\n");
}
