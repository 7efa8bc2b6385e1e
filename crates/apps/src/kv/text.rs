//! memcached's text protocol: [`parse`] reads one request from the front
//! of a byte buffer (pure, incremental: a request not yet whole asks for
//! more bytes), [`execute`] runs it against a [`Kv`] and writes the reply,
//! and [`TextSession`] strings them together over a connection's bytes.
//!
//! Malformed input gets memcached's own reply line, byte for byte (its
//! tokenizer splits on spaces only, at most 24 tokens; numbers are read as
//! C's `strtol`/`strtoull` read them; `noreply` silences errors too), and
//! the connection goes on, except where memcached closes it: a line over
//! 2048 bytes that is not a get, an HTTP request, `quit`.

use std::io::Write as _;

use super::command::Line;
use super::meta;
use super::number::{strtol32, strtoul32, strtoull};
use super::store::{DeleteOutcome, DeltaOutcome, StoreMode, StoreOutcome, KEY_MAX_LENGTH};
use super::{Kv, KvStats, VERSION};

pub use super::command::Command;

/// A line without its newline longer than this closes the connection,
/// unless it is a get (memcached's rule).
pub const LINE_MAX_WITHOUT_NEWLINE: usize = 2048;
/// The longest get line this server buffers (memcached's is unbounded).
pub const GET_LINE_MAX: usize = 1 << 20;
/// memcached's tokenizer keeps at most this many tokens, the terminal
/// (empty) one included.
const MAX_TOKENS: usize = 24;

/// What [`parse`] found at the front of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// Not a whole request yet: call again once the buffer holds at least
    /// this many bytes.
    Need(usize),
    /// A request and the bytes it took.
    Request(Command<'a>, usize),
}

/// memcached's tokens of a line: split on spaces; after 23 tokens the rest
/// is one unread remainder. Returns all tokens (a get reads them all) and
/// memcached's `ntokens` (tokens kept plus the terminal one).
fn tokenize(line: &[u8]) -> (Vec<&[u8]>, usize) {
    let tokens: Vec<&[u8]> = line
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect();
    let ntokens = tokens.len().min(MAX_TOKENS - 1) + 1;
    (tokens, ntokens)
}

/// Parses the request at the front of `buf`; `item_size_max` decides
/// which storage commands are too large to read.
pub fn parse(buf: &[u8], item_size_max: usize) -> Parsed<'_> {
    let Some(newline) = memchr(b'\n', buf) else {
        if buf.len() > LINE_MAX_WITHOUT_NEWLINE {
            let spaces = buf.iter().take_while(|&&b| b == b' ').count();
            let rest = &buf[spaces..];
            let is_get = rest.starts_with(b"get ") || rest.starts_with(b"gets ");
            if spaces > 100 || !is_get || buf.len() > GET_LINE_MAX {
                return Parsed::Request(Command::Close, buf.len());
            }
        }
        return Parsed::Need(buf.len() + 1);
    };
    let consumed = newline + 1;
    let mut line = &buf[..newline];
    if line.len() > 1 && line[line.len() - 1] == b'\r' {
        line = &line[..line.len() - 1];
    }
    // memcached reads the line as a C string.
    if let Some(nul) = memchr(0, line) {
        line = &line[..nul];
    }
    match command(line, &buf[consumed..], item_size_max) {
        Line::Done(cmd) => Parsed::Request(cmd, consumed),
        Line::Data { cmd, data_len } => Parsed::Request(cmd, consumed + data_len),
        Line::NeedData(n) => Parsed::Need(consumed + n),
    }
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

fn reply(line: &'static str) -> Line<'static> {
    Line::Done(Command::Reply {
        line,
        noreply: false,
    })
}

const ERROR: &str = "ERROR";
const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
const BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";

/// memcached's `set_noreply_maybe`: the last token is "noreply".
fn noreply(tokens: &[&[u8]], ntokens: usize) -> bool {
    tokens.get(ntokens - 2) == Some(&&b"noreply"[..])
}

fn command<'a>(line: &'a [u8], after: &'a [u8], item_size_max: usize) -> Line<'a> {
    let (tokens, ntokens) = tokenize(line);
    if ntokens < 2 || tokens[0].len() < 2 {
        return reply(ERROR);
    }
    let name = tokens[0];
    let want = |ok: bool, then: &dyn Fn() -> Line<'a>| if ok { then() } else { reply(ERROR) };
    match name {
        b"mn" => Line::Done(Command::MetaNoop),
        b"mg" | b"ms" | b"md" | b"ma" => {
            meta::parse(name[1], &tokens, ntokens, after, item_size_max)
        }
        _ if name.len() == 2 && name[0] == b'm' => reply(ERROR),
        b"get" | b"gets" | b"gat" | b"gats" | b"bget" => {
            if ntokens < 3 {
                return reply(ERROR);
            }
            get(name, &tokens)
        }
        b"set" | b"add" | b"append" | b"replace" | b"prepend" => {
            let mode = match name {
                b"set" => StoreMode::Set,
                b"add" => StoreMode::Add,
                b"append" => StoreMode::Append,
                b"replace" => StoreMode::Replace,
                _ => StoreMode::Prepend,
            };
            want(ntokens == 6 || ntokens == 7, &|| {
                update(mode, &tokens, ntokens, after, item_size_max)
            })
        }
        b"cas" => want(ntokens == 7 || ntokens == 8, &|| {
            update(StoreMode::Cas(0), &tokens, ntokens, after, item_size_max)
        }),
        b"incr" | b"decr" => want(ntokens == 4 || ntokens == 5, &|| {
            let noreply = noreply(&tokens, ntokens);
            let key = tokens[1];
            if key.len() > KEY_MAX_LENGTH {
                return silenced(BAD_FORMAT, noreply);
            }
            match strtoull(tokens[2]) {
                Some(delta) => Line::Done(Command::Delta {
                    key,
                    incr: name == b"incr",
                    delta,
                    noreply,
                }),
                None => silenced("CLIENT_ERROR invalid numeric delta argument", noreply),
            }
        }),
        b"delete" => want((3..=5).contains(&ntokens), &|| delete(&tokens, ntokens)),
        b"touch" => want(ntokens == 4 || ntokens == 5, &|| {
            let noreply = noreply(&tokens, ntokens);
            let key = tokens[1];
            if key.len() > KEY_MAX_LENGTH {
                return silenced(BAD_FORMAT, noreply);
            }
            match strtol32(tokens[2]) {
                Some(exptime) => Line::Done(Command::Touch {
                    key,
                    exptime: exptime.into(),
                    noreply,
                }),
                None => silenced(BAD_EXPTIME, noreply),
            }
        }),
        b"stats" => Line::Done(Command::Stats(tokens[1..].to_vec())),
        b"flush_all" => want((2..=4).contains(&ntokens), &|| {
            let noreply = noreply(&tokens, ntokens);
            let mut delay = 0;
            if ntokens != if noreply { 3 } else { 2 } {
                match strtol32(tokens[1]) {
                    Some(d) => delay = d.into(),
                    None => return silenced(BAD_EXPTIME, noreply),
                }
            }
            Line::Done(Command::FlushAll { delay, noreply })
        }),
        b"version" => Line::Done(Command::Version),
        b"quit" => Line::Done(Command::Quit),
        b"verbosity" => want(ntokens == 3 || ntokens == 4, &|| {
            let noreply = noreply(&tokens, ntokens);
            match strtoul32(tokens[1]) {
                Some(_) => Line::Done(Command::Verbosity { noreply }),
                None => silenced(BAD_FORMAT, noreply),
            }
        }),
        b"shutdown" => reply("ERROR: shutdown not enabled"),
        // memcached answers other names under these first letters with
        // ERROR before it looks for HTTP.
        _ if b"gsacidt".contains(&name[0]) => reply(ERROR),
        _ => {
            if tokens[ntokens - 2].starts_with(b"HTTP/") {
                Line::Done(Command::Close)
            } else {
                reply(ERROR)
            }
        }
    }
}

fn silenced(line: &'static str, noreply: bool) -> Line<'static> {
    Line::Done(Command::Reply { line, noreply })
}

fn get<'a>(name: &[u8], tokens: &[&'a [u8]]) -> Line<'a> {
    let cas = name == b"gets" || name == b"gats";
    let mut keys = &tokens[1..];
    let mut touch = None;
    if name == b"gat" || name == b"gats" {
        match strtol32(tokens[1]) {
            Some(exptime) => touch = Some(i64::from(exptime)),
            None => return reply(BAD_EXPTIME),
        }
        keys = &tokens[2..];
    }
    if keys.iter().any(|k| k.len() > KEY_MAX_LENGTH) {
        return reply(BAD_FORMAT);
    }
    Line::Done(Command::Get {
        keys: keys.to_vec(),
        cas,
        touch,
    })
}

fn delete<'a>(tokens: &[&'a [u8]], ntokens: usize) -> Line<'a> {
    let mut noreply_set = false;
    if ntokens > 3 {
        let hold_is_zero = tokens[2] == b"0";
        noreply_set = noreply(tokens, ntokens);
        let valid = (ntokens == 4 && (hold_is_zero || noreply_set))
            || (ntokens == 5 && hold_is_zero && noreply_set);
        if !valid {
            return silenced(
                "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
                noreply_set,
            );
        }
    }
    let key = tokens[1];
    if key.len() > KEY_MAX_LENGTH {
        return silenced(BAD_FORMAT, noreply_set);
    }
    Line::Done(Command::Delete {
        key,
        noreply: noreply_set,
    })
}

/// set/add/replace/append/prepend/cas: the line, then the data block.
fn update<'a>(
    mode: StoreMode,
    tokens: &[&'a [u8]],
    ntokens: usize,
    after: &'a [u8],
    item_size_max: usize,
) -> Line<'a> {
    let noreply = noreply(tokens, ntokens);
    let key = tokens[1];
    if key.len() > KEY_MAX_LENGTH {
        return silenced(BAD_FORMAT, noreply);
    }
    let (Some(flags), Some(exptime), Some(vlen)) = (
        strtoul32(tokens[2]),
        strtol32(tokens[3]),
        strtol32(tokens[4]),
    ) else {
        return silenced(BAD_FORMAT, noreply);
    };
    let mode = if let StoreMode::Cas(_) = mode {
        match strtoull(tokens[5]) {
            Some(unique) => StoreMode::Cas(unique),
            None => return silenced(BAD_FORMAT, noreply),
        }
    } else {
        mode
    };
    if !(0..=i32::MAX - 2).contains(&vlen) {
        return silenced(BAD_FORMAT, noreply);
    }
    let data_len = vlen as usize + 2;
    // memcached's item_size_ok, with the value's "\r\n".
    let size =
        super::store::ITEM_HEADER - 2 + key.len() + data_len + if flags != 0 { 4 } else { 0 };
    if size > item_size_max {
        return Line::Done(Command::TooLarge {
            key,
            set: mode == StoreMode::Set,
            noreply,
            swallow: data_len,
        });
    }
    if after.len() < data_len {
        return Line::NeedData(data_len);
    }
    let block = &after[..data_len];
    if &block[vlen as usize..] != b"\r\n" {
        return Line::Data {
            cmd: Command::Reply {
                line: "CLIENT_ERROR bad data chunk",
                noreply,
            },
            data_len,
        };
    }
    Line::Data {
        cmd: Command::Store {
            mode,
            key,
            flags,
            exptime: exptime.into(),
            data: &block[..vlen as usize],
            noreply,
        },
        data_len,
    }
}

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Send what is written, then close.
    Close,
}

fn line(out: &mut Vec<u8>, text: &[u8]) {
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

/// Runs `cmd` against `kv`, appending its reply to `out`. A too-large
/// storage command's swallowing is the caller's ([`TextSession`]).
pub fn execute(cmd: &Command<'_>, kv: &Kv, out: &mut Vec<u8>) -> Flow {
    let stats = &kv.stats;
    let store = &kv.store;
    let mut say = |text: &str, noreply: bool| {
        if !noreply {
            line(out, text.as_bytes());
        }
    };
    match *cmd {
        Command::Get {
            ref keys,
            cas,
            touch,
        } => {
            for key in keys {
                let item = match touch {
                    Some(exptime) => {
                        KvStats::bump(&stats.cmd_touch);
                        store.get_and_touch(key, exptime)
                    }
                    None => {
                        KvStats::bump(&stats.cmd_get);
                        store.get(key)
                    }
                };
                let Some(item) = item else {
                    KvStats::bump(if touch.is_some() {
                        &stats.touch_misses
                    } else {
                        &stats.get_misses
                    });
                    continue;
                };
                KvStats::bump(if touch.is_some() {
                    &stats.touch_hits
                } else {
                    &stats.get_hits
                });
                out.extend_from_slice(b"VALUE ");
                out.extend_from_slice(key);
                let _ = write!(out, " {} {}", item.flags, item.value.len());
                if cas {
                    let _ = write!(out, " {}", item.cas);
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&item.value);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"END\r\n");
        }
        Command::Store {
            mode,
            key,
            flags,
            exptime,
            data,
            noreply,
        } => {
            KvStats::bump(&stats.cmd_set);
            let outcome = store.store(mode, key, data, flags, exptime);
            let is_cas = matches!(mode, StoreMode::Cas(_));
            let text = match outcome {
                StoreOutcome::Stored(_) => {
                    if is_cas {
                        KvStats::bump(&stats.cas_hits);
                    }
                    "STORED"
                }
                StoreOutcome::NotStored => "NOT_STORED",
                StoreOutcome::Exists => {
                    KvStats::bump(&stats.cas_badval);
                    "EXISTS"
                }
                StoreOutcome::NotFound => {
                    KvStats::bump(&stats.cas_misses);
                    "NOT_FOUND"
                }
                StoreOutcome::TooLarge => {
                    KvStats::bump(&stats.store_too_large);
                    "SERVER_ERROR object too large for cache"
                }
                StoreOutcome::OutOfMemory => {
                    KvStats::bump(&stats.store_no_memory);
                    "SERVER_ERROR out of memory storing object"
                }
            };
            say(text, noreply);
        }
        Command::TooLarge {
            key, set, noreply, ..
        } => {
            KvStats::bump(&stats.store_too_large);
            if set {
                store.delete(key, 0);
            }
            say("SERVER_ERROR object too large for cache", noreply);
        }
        Command::Delete { key, noreply } => {
            let text = match store.delete(key, 0) {
                DeleteOutcome::Deleted => {
                    KvStats::bump(&stats.delete_hits);
                    "DELETED"
                }
                _ => {
                    KvStats::bump(&stats.delete_misses);
                    "NOT_FOUND"
                }
            };
            say(text, noreply);
        }
        Command::Delta {
            key,
            incr,
            delta,
            noreply,
        } => {
            let (hits, misses) = if incr {
                (&stats.incr_hits, &stats.incr_misses)
            } else {
                (&stats.decr_hits, &stats.decr_misses)
            };
            match store.delta(key, incr, delta, 0) {
                DeltaOutcome::Value(v, _) => {
                    KvStats::bump(hits);
                    say(&v.to_string(), noreply);
                }
                DeltaOutcome::NonNumeric => say(
                    "CLIENT_ERROR cannot increment or decrement non-numeric value",
                    noreply,
                ),
                DeltaOutcome::NotFound | DeltaOutcome::Exists => {
                    KvStats::bump(misses);
                    say("NOT_FOUND", noreply);
                }
            }
        }
        Command::Touch {
            key,
            exptime,
            noreply,
        } => {
            KvStats::bump(&stats.cmd_touch);
            if store.touch(key, exptime) {
                KvStats::bump(&stats.touch_hits);
                say("TOUCHED", noreply);
            } else {
                KvStats::bump(&stats.touch_misses);
                say("NOT_FOUND", noreply);
            }
        }
        Command::FlushAll { delay, noreply } => {
            KvStats::bump(&stats.cmd_flush);
            store.flush_all(delay);
            say("OK", noreply);
        }
        Command::Version => say(&format!("VERSION {VERSION}"), false),
        Command::Stats(ref args) => match args.first().map(|a| &a[..]) {
            None => {
                for (name, value) in kv.general_stats() {
                    let _ = write!(out, "STAT {name} {value}\r\n");
                }
                out.extend_from_slice(b"END\r\n");
            }
            Some(b"reset") => say("RESET", false),
            Some(b"settings") => {
                let c = store.config();
                let _ = write!(
                    out,
                    "STAT maxbytes {}\r\nSTAT item_size_max {}\r\nSTAT evictions on\r\nSTAT cas_enabled yes\r\nEND\r\n",
                    c.memory_limit, c.item_size_max
                );
            }
            Some(_) => say(ERROR, false),
        },
        Command::Verbosity { noreply } => say("OK", noreply),
        Command::Quit => return Flow::Close,
        Command::MetaNoop => say("MN", false),
        Command::Meta(ref m) => meta::execute(m, kv, out),
        Command::Swallow { line, unlink, .. } => {
            if let Some(key) = unlink {
                store.delete(key, 0);
            }
            say(line, false);
        }
        Command::Reply { line, noreply } => say(line, noreply),
        Command::Close => return Flow::Close,
    }
    Flow::Continue
}

/// The text protocol over one connection's bytes.
#[derive(Debug, Default)]
pub struct TextSession {
    /// Bytes of a too-large data block still to drop.
    swallow: usize,
}

impl TextSession {
    pub fn new() -> TextSession {
        TextSession::default()
    }

    /// Runs every whole request at the front of `input`, appending replies
    /// to `out`. Returns the bytes consumed, how many bytes `input` must
    /// hold before the next call can make progress (its length + 1 when any
    /// byte helps), and whether to close.
    pub fn process(&mut self, input: &[u8], kv: &Kv, out: &mut Vec<u8>) -> (usize, usize, Flow) {
        let item_size_max = kv.store.config().item_size_max;
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
            if at == input.len() {
                return (at, at + 1, Flow::Continue);
            }
            match parse(&input[at..], item_size_max) {
                Parsed::Need(n) => return (at, at + n, Flow::Continue),
                Parsed::Request(cmd, used) => {
                    at += used;
                    if let Command::TooLarge { swallow, .. } | Command::Swallow { swallow, .. } =
                        cmd
                    {
                        self.swallow = swallow;
                    }
                    if execute(&cmd, kv, out) == Flow::Close {
                        return (at, at + 1, Flow::Close);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::store::{ManualClock, Store, StoreConfig};

    const MAX: usize = 1 << 20;

    fn kv() -> Kv {
        Kv::new(Store::new(
            StoreConfig::default(),
            ManualClock::new(1_700_000_000),
        ))
    }

    /// Feeds `input` in one piece; the replies.
    fn run(kv: &Kv, input: &str) -> String {
        let mut s = TextSession::new();
        let mut out = Vec::new();
        let (used, _, _) = s.process(input.as_bytes(), kv, &mut out);
        assert_eq!(used, input.len(), "all of {input:?} consumed");
        String::from_utf8(out).unwrap()
    }

    fn cmd(input: &str) -> Command<'_> {
        match parse(input.as_bytes(), MAX) {
            Parsed::Request(c, n) => {
                assert_eq!(n, input.len());
                c
            }
            other => panic!("{input:?}: {other:?}"),
        }
    }

    fn err(input: &str) -> &'static str {
        match cmd(input) {
            Command::Reply { line, .. } => line,
            other => panic!("{input:?}: {other:?}"),
        }
    }

    #[test]
    fn every_command_parses() {
        assert_eq!(
            cmd("get a bb ccc\r\n"),
            Command::Get {
                keys: vec![b"a", b"bb", b"ccc"],
                cas: false,
                touch: None
            }
        );
        assert!(matches!(cmd("gets a\r\n"), Command::Get { cas: true, .. }));
        assert!(matches!(
            cmd("gat 10 a b\r\n"),
            Command::Get {
                cas: false,
                touch: Some(10),
                ..
            }
        ));
        assert!(matches!(
            cmd("gats -1 a\r\n"),
            Command::Get {
                cas: true,
                touch: Some(-1),
                ..
            }
        ));
        assert_eq!(
            cmd("set k 5 100 3\r\nabc\r\n"),
            Command::Store {
                mode: StoreMode::Set,
                key: b"k",
                flags: 5,
                exptime: 100,
                data: b"abc",
                noreply: false
            }
        );
        for (name, mode) in [
            ("add", StoreMode::Add),
            ("replace", StoreMode::Replace),
            ("append", StoreMode::Append),
            ("prepend", StoreMode::Prepend),
        ] {
            let input = format!("{name} k 0 0 1 noreply\r\nx\r\n");
            assert!(
                matches!(cmd(&input), Command::Store { mode: m, noreply: true, .. } if m == mode)
            );
        }
        assert!(matches!(
            cmd("cas k 0 0 1 77\r\nx\r\n"),
            Command::Store {
                mode: StoreMode::Cas(77),
                ..
            }
        ));
        assert_eq!(
            cmd("delete k\r\n"),
            Command::Delete {
                key: b"k",
                noreply: false
            }
        );
        assert_eq!(
            cmd("delete k 0 noreply\r\n"),
            Command::Delete {
                key: b"k",
                noreply: true
            }
        );
        assert!(matches!(
            cmd("incr k 5\r\n"),
            Command::Delta {
                incr: true,
                delta: 5,
                ..
            }
        ));
        assert!(matches!(
            cmd("decr k 5 noreply\r\n"),
            Command::Delta {
                incr: false,
                noreply: true,
                ..
            }
        ));
        assert!(matches!(
            cmd("touch k 10\r\n"),
            Command::Touch { exptime: 10, .. }
        ));
        assert_eq!(
            cmd("flush_all\r\n"),
            Command::FlushAll {
                delay: 0,
                noreply: false
            }
        );
        assert_eq!(
            cmd("flush_all 30 noreply\r\n"),
            Command::FlushAll {
                delay: 30,
                noreply: true
            }
        );
        assert_eq!(
            cmd("flush_all noreply\r\n"),
            Command::FlushAll {
                delay: 0,
                noreply: true
            }
        );
        assert_eq!(cmd("version\r\n"), Command::Version);
        assert_eq!(cmd("stats\r\n"), Command::Stats(vec![]));
        assert_eq!(
            cmd("verbosity 1\r\n"),
            Command::Verbosity { noreply: false }
        );
        assert_eq!(cmd("quit\r\n"), Command::Quit);
        assert_eq!(cmd("mn\r\n"), Command::MetaNoop);
        // A bare "\n" ends a line too.
        assert_eq!(cmd("version\n"), Command::Version);
    }

    #[test]
    fn malformed_lines_get_memcacheds_errors() {
        assert_eq!(err("\r\n"), "ERROR");
        assert_eq!(err("bogus\r\n"), "ERROR");
        assert_eq!(err("GET a\r\n"), "ERROR", "names are case-sensitive");
        assert_eq!(err("get\r\n"), "ERROR");
        assert_eq!(err("set k 0 0\r\n"), "ERROR");
        assert_eq!(
            err("set k x 0 1\r\n"),
            "CLIENT_ERROR bad command line format"
        );
        assert_eq!(
            err("set k 0 0 -1\r\n"),
            "CLIENT_ERROR bad command line format"
        );
        assert_eq!(
            err("set k -1 0 1\r\n"),
            "CLIENT_ERROR bad command line format"
        );
        let long = "k".repeat(251);
        assert_eq!(
            err(&format!("set {long} 0 0 1\r\n")),
            "CLIENT_ERROR bad command line format"
        );
        assert_eq!(
            err(&format!("get a {long}\r\n")),
            "CLIENT_ERROR bad command line format"
        );
        assert_eq!(
            err("incr k x\r\n"),
            "CLIENT_ERROR invalid numeric delta argument"
        );
        assert_eq!(
            err("incr k -1\r\n"),
            "CLIENT_ERROR invalid numeric delta argument"
        );
        assert_eq!(
            err("touch k x\r\n"),
            "CLIENT_ERROR invalid exptime argument"
        );
        assert_eq!(err("gat x k\r\n"), "CLIENT_ERROR invalid exptime argument");
        assert_eq!(
            err("flush_all x\r\n"),
            "CLIENT_ERROR invalid exptime argument"
        );
        assert_eq!(
            err("delete k 1\r\n"),
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
        );
        assert_eq!(
            err("verbosity x\r\n"),
            "CLIENT_ERROR bad command line format"
        );
        assert_eq!(err("me k\r\n"), "ERROR");
        assert_eq!(err("mg\r\n"), "ERROR");
        assert_eq!(err("mg k v v\r\n"), "CLIENT_ERROR duplicate flag");
        assert_eq!(err("mg k !\r\n"), "CLIENT_ERROR invalid flag");
        assert_eq!(
            err("mg k Tx\r\n"),
            "CLIENT_ERROR bad token in command line format"
        );
        assert_eq!(err("md k zz\r\n"), "CLIENT_ERROR invalid or duplicate flag");
        assert_eq!(
            cmd("set k 0 0 3\r\nabcde"),
            Command::Reply {
                line: "CLIENT_ERROR bad data chunk",
                noreply: false
            }
        );
        assert_eq!(cmd("GET / HTTP/1.1\r\n"), Command::Close);
        let mut many = String::from("set");
        for _ in 0..30 {
            many.push_str(" x");
        }
        many.push_str("\r\n");
        assert_eq!(err(&many), "ERROR", "too many tokens");
    }

    #[test]
    fn partial_input_waits_for_more() {
        let whole = b"set k 0 0 5\r\nhello\r\n";
        for cut in 0..whole.len() {
            match parse(&whole[..cut], MAX) {
                Parsed::Need(n) => assert!(n > cut && n <= whole.len(), "cut {cut}: need {n}"),
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        assert!(matches!(
            parse(whole, MAX),
            Parsed::Request(Command::Store { .. }, 20)
        ));
        // Byte by byte through a session.
        let kv = kv();
        let mut s = TextSession::new();
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for &b in b"set k 0 0 5\r\nhello\r\nget k\r\n" {
            buf.push(b);
            let (used, _, _) = s.process(&buf, &kv, &mut out);
            buf.drain(..used);
        }
        assert_eq!(out, b"STORED\r\nVALUE k 0 5\r\nhello\r\nEND\r\n");
        assert!(buf.is_empty());
    }

    #[test]
    fn a_long_line_without_newline_closes_unless_a_get() {
        let junk = vec![b'x'; LINE_MAX_WITHOUT_NEWLINE + 1];
        assert!(matches!(
            parse(&junk, MAX),
            Parsed::Request(Command::Close, _)
        ));
        let mut get = b"get ".to_vec();
        get.extend(std::iter::repeat_n(b'k', LINE_MAX_WITHOUT_NEWLINE));
        assert!(matches!(parse(&get, MAX), Parsed::Need(_)));
    }

    #[test]
    fn a_session_of_every_command() {
        let kv = kv();
        assert_eq!(run(&kv, "set a 1 0 1\r\n1\r\n"), "STORED\r\n");
        assert_eq!(run(&kv, "get a b\r\n"), "VALUE a 1 1\r\n1\r\nEND\r\n");
        assert_eq!(run(&kv, "add a 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
        assert_eq!(run(&kv, "replace b 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
        assert_eq!(run(&kv, "append a 0 0 2\r\n23\r\n"), "STORED\r\n");
        assert_eq!(run(&kv, "prepend a 0 0 1\r\n0\r\n"), "STORED\r\n");
        assert_eq!(run(&kv, "incr a 1\r\n"), "124\r\n");
        assert_eq!(run(&kv, "decr a 200\r\n"), "0\r\n");
        assert_eq!(run(&kv, "get a\r\n"), "VALUE a 1 4\r\n0   \r\nEND\r\n");
        let cas = kv.store.get(b"a").unwrap().cas;
        assert_eq!(
            run(&kv, "gets a\r\n"),
            format!("VALUE a 1 4 {cas}\r\n0   \r\nEND\r\n")
        );
        assert_eq!(
            run(&kv, &format!("cas a 0 0 1 {}\r\nz\r\n", cas + 1)),
            "EXISTS\r\n"
        );
        assert_eq!(
            run(&kv, &format!("cas a 0 0 1 {cas}\r\nz\r\n")),
            "STORED\r\n"
        );
        assert_eq!(run(&kv, "cas q 0 0 1 1\r\nz\r\n"), "NOT_FOUND\r\n");
        assert_eq!(
            run(&kv, "incr a 1\r\n"),
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
        );
        assert_eq!(run(&kv, "touch a 100\r\n"), "TOUCHED\r\n");
        assert_eq!(run(&kv, "touch q 100\r\n"), "NOT_FOUND\r\n");
        assert_eq!(run(&kv, "gat 100 a q\r\n"), "VALUE a 0 1\r\nz\r\nEND\r\n");
        assert_eq!(run(&kv, "delete a\r\n"), "DELETED\r\n");
        assert_eq!(run(&kv, "delete a\r\n"), "NOT_FOUND\r\n");
        assert_eq!(
            run(&kv, "set a 0 0 1 noreply\r\n1\r\nget a\r\n"),
            "VALUE a 0 1\r\n1\r\nEND\r\n"
        );
        assert_eq!(run(&kv, "flush_all\r\nget a\r\n"), "OK\r\nEND\r\n");
        assert_eq!(run(&kv, "verbosity 1\r\nverbosity 1 noreply\r\n"), "OK\r\n");
        assert_eq!(run(&kv, "version\r\n"), format!("VERSION {VERSION}\r\n"));
        assert!(run(&kv, "stats\r\n").ends_with("END\r\n"));
        assert_eq!(run(&kv, "mn\r\n"), "MN\r\n");
        // noreply silences errors too; the data line is then a command.
        assert_eq!(run(&kv, "set k 0 0 x noreply\r\nhi\r\n"), "ERROR\r\n");
        // A bad data chunk: the bytes after it are read as the next line.
        assert_eq!(
            run(&kv, "set k 0 0 3\r\nabcde\r\n"),
            "CLIENT_ERROR bad data chunk\r\nERROR\r\n"
        );
        let mut s = TextSession::new();
        let mut out = Vec::new();
        assert_eq!(
            s.process(b"quit\r\nget a\r\n", &kv, &mut out),
            (6, 7, Flow::Close)
        );
    }

    #[test]
    fn a_too_large_value_is_swallowed_and_a_set_removes_the_old_one() {
        let kv = kv();
        run(&kv, "set k 0 0 1\r\nx\r\n");
        let big = "y".repeat(MAX);
        let input = format!("set k 0 0 {}\r\n{big}\r\nget k\r\n", big.len());
        assert_eq!(
            run(&kv, &input),
            "SERVER_ERROR object too large for cache\r\nEND\r\n"
        );
        // Swallowing across calls.
        let mut s = TextSession::new();
        let mut out = Vec::new();
        let head = format!("set k 0 0 {}\r\n", big.len());
        let (used, _, _) = s.process(head.as_bytes(), &kv, &mut out);
        assert_eq!(used, head.len());
        let (used, _, _) = s.process(big.as_bytes(), &kv, &mut out);
        assert_eq!(used, big.len());
        let (used, _, _) = s.process(b"\r\nmn\r\n", &kv, &mut out);
        assert_eq!(used, 6);
        assert_eq!(out, b"SERVER_ERROR object too large for cache\r\nMN\r\n");
    }

    proptest::proptest! {
        #[test]
        fn the_parser_never_panics(bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..600)) {
            let _ = parse(&bytes, 300);
            let kv = kv();
            let mut s = TextSession::new();
            let mut out = Vec::new();
            let _ = s.process(&bytes, &kv, &mut out);
        }

        #[test]
        fn the_parser_never_panics_on_command_like_input(
            words in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("set".to_string()), proptest::strategy::Just("get".to_string()),
                    proptest::strategy::Just("cas".to_string()), proptest::strategy::Just("incr".to_string()),
                    proptest::strategy::Just("delete".to_string()), proptest::strategy::Just("noreply".to_string()),
                    proptest::strategy::Just("gat".to_string()), proptest::strategy::Just("flush_all".to_string()),
                    proptest::strategy::Just("\r\n".to_string()), "-?[0-9]{1,12}", "[a-z]{1,3}",
                ], 0..12)
        ) {
            let input = words.join(" ");
            let kv = kv();
            let mut s = TextSession::new();
            let mut out = Vec::new();
            let (used, need, _) = s.process(input.as_bytes(), &kv, &mut out);
            proptest::prop_assert!(used <= input.len() && need > used);
        }
    }
}
