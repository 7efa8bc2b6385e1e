//! A parsed request of the text protocol, classic ([`Command`]) or meta
//! ([`Meta`]), and the parser's result for one line ([`Line`]): the types
//! the text and meta parsers both build, kept apart from either so that
//! neither imports the other's internals.

use super::store::StoreMode;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// get/gets (`cas`), gat/gats (`touch` is the new exptime).
    Get {
        keys: Vec<&'a [u8]>,
        cas: bool,
        touch: Option<i64>,
    },
    Store {
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        data: &'a [u8],
        noreply: bool,
    },
    /// A storage command whose data is over the item-size limit: reply,
    /// drop a set's old item, and swallow `swallow` bytes of data.
    TooLarge {
        key: &'a [u8],
        set: bool,
        noreply: bool,
        swallow: usize,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Delta {
        key: &'a [u8],
        incr: bool,
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    Version,
    /// `stats` with its arguments.
    Stats(Vec<&'a [u8]>),
    Verbosity {
        noreply: bool,
    },
    Quit,
    /// `mn`.
    MetaNoop,
    /// `mg`, `ms`, `md`, `ma`.
    Meta(Meta<'a>),
    /// Reply `line` (always), remove `unlink`'s item, and swallow
    /// `swallow` bytes of data (a refused `ms`).
    Swallow {
        line: &'static str,
        swallow: usize,
        unlink: Option<&'a [u8]>,
    },
    /// A fixed reply line (errors), not sent under noreply.
    Reply {
        line: &'static str,
        noreply: bool,
    },
    /// Close the connection without a reply.
    Close,
}

/// One meta request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meta<'a> {
    Get {
        key: &'a [u8],
        /// The flag tokens, in order.
        flags: Vec<&'a [u8]>,
        value: bool,
        quiet: bool,
        ttl: Option<i64>,
        /// N: on a miss, create an empty item with this TTL.
        vivify: Option<i64>,
        /// R: win the right to recache an item expiring within this.
        recache: Option<i64>,
    },
    Set {
        key: &'a [u8],
        flags: Vec<&'a [u8]>,
        data: &'a [u8],
        mode: StoreMode,
        client_flags: u32,
        exptime: i64,
        quiet: bool,
    },
    Delete {
        key: &'a [u8],
        flags: Vec<&'a [u8]>,
        cas: Option<u64>,
        quiet: bool,
    },
    Arithmetic {
        key: &'a [u8],
        flags: Vec<&'a [u8]>,
        incr: bool,
        delta: u64,
        /// N: create a missing item with this TTL, holding `initial`.
        vivify: Option<i64>,
        initial: u64,
        ttl: Option<i64>,
        cas: Option<u64>,
        value: bool,
        quiet: bool,
    },
}

pub(super) enum Line<'a> {
    Done(Command<'a>),
    /// A storage command with its data block (`data_len` bytes with the
    /// "\r\n").
    Data {
        cmd: Command<'a>,
        data_len: usize,
    },
    /// A storage command whose data block (this many bytes) is not all here.
    NeedData(usize),
}
