//! The protected application ⇄ netstack interface (docs/protected.md):
//! DLibOS's Table 1 of commands and events, their fixed-size encoding in
//! the [`Slot`]s of the channel rings (`ginza_shm::netstack`), and the
//! attach handshake on the netstack's unix socket.
//!
//! * [`Command`] (application → netstack): `listen`, `accept`, `connect`,
//!   `send` (scatter/gather {offset, len} into the application's tx pool),
//!   `recv_done` (rx-pool ranges given back), `shutdown`, `close`,
//!   `unlisten`.
//! * [`Event`] (netstack → application): `listening`, `new_conn`,
//!   `connected`, `new_data` ({offset, len} in the rx pool), `data_acked`
//!   (tx-pool ranges given back), `remote_closed`, `cleanup`, `refused`
//!   (a command or connection failed, with a [`Reason`]) and
//!   `disconnected` (the application is cut off, with a reason).
//!
//! # Slot encoding
//!
//! A slot is 16 little words (`u32`): word 0 is `tag | n << 8 | flags << 16`
//! (tag of the message, number of ranges, flags), word 1 a connection id
//! (0: none), words 2–3 arguments, words 4–15 up to [`MAX_RANGES`]
//! `{offset, len}` pairs — or, for messages without ranges, word 4 one more
//! argument. Every word a message does not use must be zero: the decoder
//! rejects anything else with a precise [`CodecError`], never panics.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::num::NonZeroU32;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ginza_net::Interface;
pub use ginza_shm::netstack::{Range, Slot, SLOT_WORDS};
use ginza_sys::{poll, socket};
use serde::{Deserialize, Serialize};

/// Most ranges one slot carries.
pub const MAX_RANGES: usize = 6;

/// A connection: a handle the netstack assigns (slot and generation), valid
/// only for the application that owns it; the netstack checks ownership of
/// every id it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub NonZeroU32);

/// A listening port, as [`ConnId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenId(pub NonZeroU32);

impl ConnId {
    pub fn new(v: u32) -> Option<ConnId> {
        NonZeroU32::new(v).map(ConnId)
    }
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

impl ListenId {
    pub fn new(v: u32) -> Option<ListenId> {
        NonZeroU32::new(v).map(ListenId)
    }
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

/// Up to [`MAX_RANGES`] non-empty ranges.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Ranges {
    n: u8,
    items: [Range; MAX_RANGES],
}

impl std::fmt::Debug for Ranges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Ranges {
    /// The ranges of `rs`; `None` if there are more than [`MAX_RANGES`] or
    /// one is empty.
    pub fn from_slice(rs: &[Range]) -> Option<Ranges> {
        if rs.len() > MAX_RANGES || rs.iter().any(|r| r.len == 0) {
            return None;
        }
        let mut items = [Range::default(); MAX_RANGES];
        items[..rs.len()].copy_from_slice(rs);
        Some(Ranges {
            n: rs.len() as u8,
            items,
        })
    }

    /// One range.
    pub fn one(r: Range) -> Option<Ranges> {
        Self::from_slice(&[r])
    }

    /// Appends `r`; false if full or `r` is empty.
    pub fn push(&mut self, r: Range) -> bool {
        if usize::from(self.n) == MAX_RANGES || r.len == 0 {
            return false;
        }
        self.items[usize::from(self.n)] = r;
        self.n += 1;
        true
    }

    pub fn as_slice(&self) -> &[Range] {
        &self.items[..usize::from(self.n)]
    }

    pub fn len(&self) -> usize {
        usize::from(self.n)
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn is_full(&self) -> bool {
        usize::from(self.n) == MAX_RANGES
    }

    /// Total bytes.
    pub fn bytes(&self) -> u64 {
        self.as_slice().iter().map(|r| u64::from(r.len)).sum()
    }
}

/// Flags of a `send`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags {
    /// More data follows at once (the netstack may wait for it before
    /// building a short segment).
    pub more: bool,
}

const SEND_MORE: u16 = 1;

/// Application → netstack (DLibOS Table 1, plus `listen`/`unlisten`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Listen on `port` of the application's address with an accept
    /// backlog of `backlog`; answered by `Listening { cookie, .. }` or
    /// `Refused { cookie, .. }`.
    Listen {
        cookie: u32,
        port: u16,
        backlog: u16,
    },
    /// Take connection `conn` announced by `new_conn` on `listener`: from
    /// now on its events come on the ring pair this command came on.
    Accept { conn: ConnId, listener: ListenId },
    /// Open a connection to `remote`; answered by `Connected { cookie, .. }`
    /// or `Refused { cookie, .. }`.
    Connect { cookie: u32, remote: SocketAddrV4 },
    /// Send the bytes of `ranges` of the tx pool, in order. The ranges stay
    /// the netstack's (not to be written) until `data_acked` returns them.
    Send {
        conn: ConnId,
        ranges: Ranges,
        flags: SendFlags,
    },
    /// Give back rx-pool ranges, exactly as `new_data` named them (credits
    /// the receive window).
    RecvDone { conn: ConnId, ranges: Ranges },
    /// No more data to send (FIN after what is queued).
    Shutdown { conn: ConnId },
    /// Close and free the connection (RST if data is still unread);
    /// answered by `Cleanup`.
    Close { conn: ConnId },
    /// Stop listening; connections already accepted stay.
    Unlisten { listener: ListenId },
}

/// Why the netstack refused a command or ended a connection or attachment.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No connection (or listener) with that id exists.
    NoSuchConnection = 1,
    /// The id exists but belongs to another application.
    NotOwner = 2,
    /// A `send` range lies outside the application's tx pool.
    OutsideTxPool = 3,
    /// A `recv_done` names a range the netstack never gave (or gave back
    /// already).
    NotDelivered = 4,
    /// A slot of the command ring did not decode.
    BadCommand = 5,
    /// The port is already listened on.
    PortInUse = 6,
    /// The peer refused the connection (RST to our SYN).
    ConnectionRefused = 7,
    /// The peer reset the connection.
    ConnectionReset = 8,
    /// The peer stopped answering.
    TimedOut = 9,
    /// The netstack's limit of connections (or listeners) is reached.
    TooManyConnections = 10,
    /// The command does not fit the connection's state (send after
    /// shutdown, accept twice …).
    InvalidState = 11,
    /// The application corrupted a ring's indices.
    RingCorrupt = 12,
    /// The netstack is shutting down.
    Shutdown = 13,
    /// A `send` that would queue more than the netstack holds per
    /// connection.
    SendQueueFull = 14,
}

impl Reason {
    fn from_u16(v: u16) -> Option<Reason> {
        use Reason::*;
        Some(match v {
            1 => NoSuchConnection,
            2 => NotOwner,
            3 => OutsideTxPool,
            4 => NotDelivered,
            5 => BadCommand,
            6 => PortInUse,
            7 => ConnectionRefused,
            8 => ConnectionReset,
            9 => TimedOut,
            10 => TooManyConnections,
            11 => InvalidState,
            12 => RingCorrupt,
            13 => Shutdown,
            14 => SendQueueFull,
            _ => return None,
        })
    }

    /// Words for humans.
    pub fn describe(self) -> &'static str {
        use Reason::*;
        match self {
            NoSuchConnection => "no such connection",
            NotOwner => "the connection belongs to another application",
            OutsideTxPool => "send range outside the application's tx pool",
            NotDelivered => "recv_done for data never delivered",
            BadCommand => "undecodable command",
            PortInUse => "port in use",
            ConnectionRefused => "connection refused",
            ConnectionReset => "connection reset by peer",
            TimedOut => "connection timed out",
            TooManyConnections => "too many connections",
            InvalidState => "command invalid in the connection's state",
            RingCorrupt => "ring corrupt",
            Shutdown => "netstack shutting down",
            SendQueueFull => "send queue full",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Netstack → application (DLibOS Table 1, plus `listening`, `connected`,
/// `refused`, `disconnected`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Listening {
        cookie: u32,
        listener: ListenId,
    },
    /// A connection arrived on `listener` (established); the application
    /// answers `accept` (or `close`). Data may already be queued.
    NewConn {
        conn: ConnId,
        listener: ListenId,
        remote: SocketAddrV4,
    },
    /// The connection `connect { cookie }` asked for is established.
    Connected {
        cookie: u32,
        conn: ConnId,
        local_port: u16,
    },
    /// Received bytes, in order, in the rx pool; give them back with
    /// `recv_done`.
    NewData {
        conn: ConnId,
        ranges: Ranges,
    },
    /// The peer acknowledged these tx-pool ranges (exactly as `send` named
    /// them): the application may reuse them.
    DataAcked {
        conn: ConnId,
        ranges: Ranges,
    },
    /// The peer sent FIN: no more data will come.
    RemoteClosed {
        conn: ConnId,
    },
    /// The connection is gone and its id free; every range it held is
    /// returned (tx ranges not acked come back in `data_acked` before).
    Cleanup {
        conn: ConnId,
    },
    /// A command (`command`: its tag) or a connection failed. `conn` is
    /// set when a connection is concerned (it is closed unless the reason
    /// says the command alone was refused), `cookie` for `listen` and
    /// `connect`.
    Refused {
        conn: Option<ConnId>,
        cookie: u32,
        command: u8,
        reason: Reason,
    },
    /// The netstack cut the application off (its last event).
    Disconnected {
        reason: Reason,
    },
}

mod tag {
    pub const LISTEN: u8 = 1;
    pub const ACCEPT: u8 = 2;
    pub const CONNECT: u8 = 3;
    pub const SEND: u8 = 4;
    pub const RECV_DONE: u8 = 5;
    pub const SHUTDOWN: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const UNLISTEN: u8 = 8;

    pub const LISTENING: u8 = 1;
    pub const NEW_CONN: u8 = 2;
    pub const CONNECTED: u8 = 3;
    pub const NEW_DATA: u8 = 4;
    pub const DATA_ACKED: u8 = 5;
    pub const REMOTE_CLOSED: u8 = 6;
    pub const CLEANUP: u8 = 7;
    pub const REFUSED: u8 = 8;
    pub const DISCONNECTED: u8 = 9;
}

/// The tag a command carries on the wire (what `Refused::command` names).
impl Command {
    /// `Refused::command` of a failed `connect`.
    pub const CONNECT_TAG: u8 = tag::CONNECT;

    pub fn tag(&self) -> u8 {
        match self {
            Command::Listen { .. } => tag::LISTEN,
            Command::Accept { .. } => tag::ACCEPT,
            Command::Connect { .. } => tag::CONNECT,
            Command::Send { .. } => tag::SEND,
            Command::RecvDone { .. } => tag::RECV_DONE,
            Command::Shutdown { .. } => tag::SHUTDOWN,
            Command::Close { .. } => tag::CLOSE,
            Command::Unlisten { .. } => tag::UNLISTEN,
        }
    }

    /// The connection the command is about, if any.
    pub fn conn(&self) -> Option<ConnId> {
        match *self {
            Command::Accept { conn, .. }
            | Command::Send { conn, .. }
            | Command::RecvDone { conn, .. }
            | Command::Shutdown { conn }
            | Command::Close { conn } => Some(conn),
            _ => None,
        }
    }
}

/// Which way a slot travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Command,
    Event,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::Command => "command",
            Direction::Event => "event",
        })
    }
}

/// A slot that is not a valid message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("unknown {dir} tag {tag}")]
    UnknownTag { dir: Direction, tag: u8 },
    #[error("{dir} tag {tag}: {n} ranges, at most {MAX_RANGES}")]
    TooManyRanges { dir: Direction, tag: u8, n: u8 },
    #[error("{dir} tag {tag}: no range")]
    NoRanges { dir: Direction, tag: u8 },
    #[error("{dir} tag {tag}: range {index} is empty")]
    EmptyRange { dir: Direction, tag: u8, index: u8 },
    #[error("{dir} tag {tag}: word {word} must be 0, is {value:#x}")]
    NonZeroWord {
        dir: Direction,
        tag: u8,
        word: u8,
        value: u32,
    },
    #[error("{dir} tag {tag}: unknown flags {flags:#x}")]
    UnknownFlags { dir: Direction, tag: u8, flags: u16 },
    #[error("{dir} tag {tag}: connection id 0")]
    ZeroConnection { dir: Direction, tag: u8 },
    #[error("{dir} tag {tag}: listener id 0")]
    ZeroListener { dir: Direction, tag: u8 },
    #[error("{dir} tag {tag}: value {value} does not fit its field")]
    FieldRange { dir: Direction, tag: u8, value: u32 },
    #[error("{dir} tag {tag}: port 0")]
    ZeroPort { dir: Direction, tag: u8 },
    #[error("unknown reason code {0}")]
    UnknownReason(u16),
}

fn head(tag: u8, n: usize, flags: u16) -> u32 {
    u32::from(tag) | (n as u32) << 8 | u32::from(flags) << 16
}

fn put_ranges(w: &mut [u32; SLOT_WORDS], rs: &Ranges) {
    for (i, r) in rs.as_slice().iter().enumerate() {
        w[4 + 2 * i] = r.offset;
        w[5 + 2 * i] = r.len;
    }
}

/// A slot being decoded: tracks which words the message used, so that
/// every other word can be required to be zero.
struct Reader {
    w: [u32; SLOT_WORDS],
    dir: Direction,
    tag: u8,
    n: u8,
    flags: u16,
    used: u16,
}

impl Reader {
    fn new(slot: &Slot, dir: Direction) -> Reader {
        let w = slot.words;
        Reader {
            w,
            dir,
            tag: (w[0] & 0xff) as u8,
            n: ((w[0] >> 8) & 0xff) as u8,
            flags: (w[0] >> 16) as u16,
            used: 1,
        }
    }

    fn word(&mut self, i: usize) -> u32 {
        self.used |= 1 << i;
        self.w[i]
    }

    fn conn(&mut self) -> Result<ConnId, CodecError> {
        ConnId::new(self.word(1)).ok_or(CodecError::ZeroConnection {
            dir: self.dir,
            tag: self.tag,
        })
    }

    fn opt_conn(&mut self) -> Option<ConnId> {
        ConnId::new(self.word(1))
    }

    fn listener(&mut self, i: usize) -> Result<ListenId, CodecError> {
        ListenId::new(self.word(i)).ok_or(CodecError::ZeroListener {
            dir: self.dir,
            tag: self.tag,
        })
    }

    fn port(&mut self, i: usize) -> Result<u16, CodecError> {
        let v = self.word(i);
        let p = u16::try_from(v).map_err(|_| CodecError::FieldRange {
            dir: self.dir,
            tag: self.tag,
            value: v,
        })?;
        if p == 0 {
            return Err(CodecError::ZeroPort {
                dir: self.dir,
                tag: self.tag,
            });
        }
        Ok(p)
    }

    fn addr(&mut self, ip: usize, port: usize) -> Result<SocketAddrV4, CodecError> {
        let ip = Ipv4Addr::from(self.word(ip));
        Ok(SocketAddrV4::new(ip, self.port(port)?))
    }

    fn ranges(&mut self) -> Result<Ranges, CodecError> {
        let (dir, tag, n) = (self.dir, self.tag, self.n);
        if usize::from(n) > MAX_RANGES {
            return Err(CodecError::TooManyRanges { dir, tag, n });
        }
        if n == 0 {
            return Err(CodecError::NoRanges { dir, tag });
        }
        let mut rs = Ranges::default();
        for i in 0..usize::from(n) {
            let r = Range::new(self.word(4 + 2 * i), self.word(5 + 2 * i));
            if r.len == 0 {
                return Err(CodecError::EmptyRange {
                    dir,
                    tag,
                    index: i as u8,
                });
            }
            rs.push(r);
        }
        Ok(rs)
    }

    fn flags(&mut self, known: u16) -> Result<u16, CodecError> {
        let f = self.flags;
        if f & !known != 0 {
            return Err(CodecError::UnknownFlags {
                dir: self.dir,
                tag: self.tag,
                flags: f,
            });
        }
        self.flags = 0;
        Ok(f)
    }

    /// The message is complete: no range count, flags or word left that it
    /// did not use.
    fn finish<T>(self, v: T) -> Result<T, CodecError> {
        let (dir, tag) = (self.dir, self.tag);
        if self.flags != 0 {
            return Err(CodecError::UnknownFlags {
                dir,
                tag,
                flags: self.flags,
            });
        }
        for i in 1..SLOT_WORDS {
            if self.used & (1 << i) == 0 && self.w[i] != 0 {
                // A range count on a message without ranges shows as the
                // head word's bits; report it as too many ranges.
                return Err(CodecError::NonZeroWord {
                    dir,
                    tag,
                    word: i as u8,
                    value: self.w[i],
                });
            }
        }
        Ok(v)
    }

    fn no_ranges(&self) -> Result<(), CodecError> {
        if self.n != 0 {
            return Err(CodecError::TooManyRanges {
                dir: self.dir,
                tag: self.tag,
                n: self.n,
            });
        }
        Ok(())
    }
}

impl Command {
    /// The command's slot.
    pub fn encode(&self) -> Slot {
        let mut w = [0u32; SLOT_WORDS];
        match *self {
            Command::Listen {
                cookie,
                port,
                backlog,
            } => {
                w[0] = head(tag::LISTEN, 0, 0);
                w[2] = cookie;
                w[3] = u32::from(port);
                w[4] = u32::from(backlog);
            }
            Command::Accept { conn, listener } => {
                w[0] = head(tag::ACCEPT, 0, 0);
                w[1] = conn.get();
                w[2] = listener.get();
            }
            Command::Connect { cookie, remote } => {
                w[0] = head(tag::CONNECT, 0, 0);
                w[2] = cookie;
                w[3] = u32::from(*remote.ip());
                w[4] = u32::from(remote.port());
            }
            Command::Send {
                conn,
                ranges,
                flags,
            } => {
                let f = if flags.more { SEND_MORE } else { 0 };
                w[0] = head(tag::SEND, ranges.len(), f);
                w[1] = conn.get();
                put_ranges(&mut w, &ranges);
            }
            Command::RecvDone { conn, ranges } => {
                w[0] = head(tag::RECV_DONE, ranges.len(), 0);
                w[1] = conn.get();
                put_ranges(&mut w, &ranges);
            }
            Command::Shutdown { conn } => {
                w[0] = head(tag::SHUTDOWN, 0, 0);
                w[1] = conn.get();
            }
            Command::Close { conn } => {
                w[0] = head(tag::CLOSE, 0, 0);
                w[1] = conn.get();
            }
            Command::Unlisten { listener } => {
                w[0] = head(tag::UNLISTEN, 0, 0);
                w[2] = listener.get();
            }
        }
        Slot { words: w }
    }

    /// The command in `slot`, or why it is none.
    pub fn decode(slot: &Slot) -> Result<Command, CodecError> {
        let mut r = Reader::new(slot, Direction::Command);
        let cmd = match r.tag {
            tag::LISTEN => {
                r.no_ranges()?;
                let cookie = r.word(2);
                let port = r.port(3)?;
                let b = r.word(4);
                let backlog = u16::try_from(b).map_err(|_| CodecError::FieldRange {
                    dir: r.dir,
                    tag: r.tag,
                    value: b,
                })?;
                Command::Listen {
                    cookie,
                    port,
                    backlog,
                }
            }
            tag::ACCEPT => {
                r.no_ranges()?;
                Command::Accept {
                    conn: r.conn()?,
                    listener: r.listener(2)?,
                }
            }
            tag::CONNECT => {
                r.no_ranges()?;
                let cookie = r.word(2);
                Command::Connect {
                    cookie,
                    remote: r.addr(3, 4)?,
                }
            }
            tag::SEND => {
                let conn = r.conn()?;
                let ranges = r.ranges()?;
                let f = r.flags(SEND_MORE)?;
                Command::Send {
                    conn,
                    ranges,
                    flags: SendFlags {
                        more: f & SEND_MORE != 0,
                    },
                }
            }
            tag::RECV_DONE => Command::RecvDone {
                conn: r.conn()?,
                ranges: r.ranges()?,
            },
            tag::SHUTDOWN => {
                r.no_ranges()?;
                Command::Shutdown { conn: r.conn()? }
            }
            tag::CLOSE => {
                r.no_ranges()?;
                Command::Close { conn: r.conn()? }
            }
            tag::UNLISTEN => {
                r.no_ranges()?;
                Command::Unlisten {
                    listener: r.listener(2)?,
                }
            }
            t => {
                return Err(CodecError::UnknownTag {
                    dir: Direction::Command,
                    tag: t,
                })
            }
        };
        r.finish(cmd)
    }
}

impl Event {
    /// The event's slot.
    pub fn encode(&self) -> Slot {
        let mut w = [0u32; SLOT_WORDS];
        match *self {
            Event::Listening { cookie, listener } => {
                w[0] = head(tag::LISTENING, 0, 0);
                w[2] = cookie;
                w[3] = listener.get();
            }
            Event::NewConn {
                conn,
                listener,
                remote,
            } => {
                w[0] = head(tag::NEW_CONN, 0, 0);
                w[1] = conn.get();
                w[2] = listener.get();
                w[3] = u32::from(*remote.ip());
                w[4] = u32::from(remote.port());
            }
            Event::Connected {
                cookie,
                conn,
                local_port,
            } => {
                w[0] = head(tag::CONNECTED, 0, 0);
                w[1] = conn.get();
                w[2] = cookie;
                w[3] = u32::from(local_port);
            }
            Event::NewData { conn, ranges } => {
                w[0] = head(tag::NEW_DATA, ranges.len(), 0);
                w[1] = conn.get();
                put_ranges(&mut w, &ranges);
            }
            Event::DataAcked { conn, ranges } => {
                w[0] = head(tag::DATA_ACKED, ranges.len(), 0);
                w[1] = conn.get();
                put_ranges(&mut w, &ranges);
            }
            Event::RemoteClosed { conn } => {
                w[0] = head(tag::REMOTE_CLOSED, 0, 0);
                w[1] = conn.get();
            }
            Event::Cleanup { conn } => {
                w[0] = head(tag::CLEANUP, 0, 0);
                w[1] = conn.get();
            }
            Event::Refused {
                conn,
                cookie,
                command,
                reason,
            } => {
                w[0] = head(tag::REFUSED, 0, 0);
                w[1] = conn.map_or(0, ConnId::get);
                w[2] = cookie;
                w[3] = u32::from(reason as u16) | u32::from(command) << 16;
            }
            Event::Disconnected { reason } => {
                w[0] = head(tag::DISCONNECTED, 0, 0);
                w[3] = u32::from(reason as u16);
            }
        }
        Slot { words: w }
    }

    /// The event in `slot`, or why it is none.
    pub fn decode(slot: &Slot) -> Result<Event, CodecError> {
        let mut r = Reader::new(slot, Direction::Event);
        let reason = |v: u32| {
            let code = (v & 0xffff) as u16;
            Reason::from_u16(code).ok_or(CodecError::UnknownReason(code))
        };
        let ev = match r.tag {
            tag::LISTENING => {
                r.no_ranges()?;
                let cookie = r.word(2);
                Event::Listening {
                    cookie,
                    listener: r.listener(3)?,
                }
            }
            tag::NEW_CONN => {
                r.no_ranges()?;
                Event::NewConn {
                    conn: r.conn()?,
                    listener: r.listener(2)?,
                    remote: r.addr(3, 4)?,
                }
            }
            tag::CONNECTED => {
                r.no_ranges()?;
                let conn = r.conn()?;
                let cookie = r.word(2);
                Event::Connected {
                    cookie,
                    conn,
                    local_port: r.port(3)?,
                }
            }
            tag::NEW_DATA => Event::NewData {
                conn: r.conn()?,
                ranges: r.ranges()?,
            },
            tag::DATA_ACKED => Event::DataAcked {
                conn: r.conn()?,
                ranges: r.ranges()?,
            },
            tag::REMOTE_CLOSED => {
                r.no_ranges()?;
                Event::RemoteClosed { conn: r.conn()? }
            }
            tag::CLEANUP => {
                r.no_ranges()?;
                Event::Cleanup { conn: r.conn()? }
            }
            tag::REFUSED => {
                r.no_ranges()?;
                let conn = r.opt_conn();
                let cookie = r.word(2);
                let w3 = r.word(3);
                let command = (w3 >> 16) as u16;
                let command = u8::try_from(command).map_err(|_| CodecError::FieldRange {
                    dir: r.dir,
                    tag: r.tag,
                    value: w3,
                })?;
                Event::Refused {
                    conn,
                    cookie,
                    command,
                    reason: reason(w3)?,
                }
            }
            tag::DISCONNECTED => {
                r.no_ranges()?;
                let w3 = r.word(3);
                if w3 > 0xffff {
                    return Err(CodecError::FieldRange {
                        dir: r.dir,
                        tag: r.tag,
                        value: w3,
                    });
                }
                Event::Disconnected {
                    reason: reason(w3)?,
                }
            }
            t => {
                return Err(CodecError::UnknownTag {
                    dir: Direction::Event,
                    tag: t,
                })
            }
        };
        r.finish(ev)
    }
}

// ---------------------------------------------------------------------
// Attach handshake (docs/protected.md, "Attach").

/// Version of the attach handshake and of the slot encoding.
pub const NETSTACK_PROTOCOL: u32 = 1;

/// Largest attach message.
pub const MAX_ATTACH_MESSAGE: usize = 4096;

/// How long an application waits for the netstack's answer.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);

/// The netstack's attach socket next to iokerneld's (same directory).
pub fn default_netstack_socket() -> PathBuf {
    crate::client::default_socket_path().with_file_name("netstack.sock")
}

/// What an application sends to attach (SOCK_SEQPACKET, JSON), with its tx
/// pool's memfd attached (sealed against resizing) and, if `doorbells`,
/// one eventfd per kthread after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub protocol: u32,
    /// The application's name (for `ginza top` and logs).
    pub name: String,
    /// The address (and MAC) the application is reachable at; the netstack
    /// owns it from now on (iokerneld steers its frames to the netstack).
    pub interface: Interface,
    /// The application's kthreads: one ring pair each.
    pub kthreads: u32,
    /// The application sends one eventfd per kthread that the netstack
    /// writes when it pushes events for a kthread that said it waits
    /// (docs/protected.md, "Wake-ups": the standalone path).
    #[serde(default)]
    pub doorbells: bool,
}

/// The netstack's answer. With `Accepted`, two descriptors are attached:
/// the channel memfd (`ginza_shm::netstack::Channel::attach`) and the rx
/// pool opened O_RDONLY (`RxPoolView::map(fd, rx_pool_bytes)`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachReply {
    Accepted {
        app_id: u64,
        /// Ring pairs in the channel (= the request's kthreads).
        pairs: u32,
        ring_capacity: u32,
        rx_pool_bytes: u64,
        /// Most bytes the netstack keeps queued per connection for `send`
        /// (more is refused with `SendQueueFull`).
        send_queue_bytes: u64,
    },
    Refused {
        reason: String,
    },
}

/// An attached application's descriptors and socket. Dropping the socket
/// detaches: the netstack resets the connections and frees the buffers.
#[derive(Debug)]
pub struct Attached {
    pub app_id: u64,
    pub pairs: u32,
    pub ring_capacity: u32,
    pub rx_pool_bytes: u64,
    pub send_queue_bytes: u64,
    pub channel: OwnedFd,
    pub rx_pool: OwnedFd,
    /// Keep it open while attached.
    pub socket: OwnedFd,
}

/// Why attaching failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("cannot connect to the netstack at {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the netstack: {0}")]
    Io(#[source] std::io::Error),
    #[error("the netstack did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the netstack closed the connection without answering")]
    Closed,
    #[error("the netstack refused: {0}")]
    Refused(String),
    #[error("bad answer from the netstack: {0}")]
    BadReply(String),
}

/// Attaches to the netstack at `socket`: sends `req` with the tx pool's
/// memfd (and the doorbells, if the request says so), waits for the
/// answer.
pub fn attach(
    socket: &Path,
    req: &AttachRequest,
    tx_pool: BorrowedFd<'_>,
    doorbells: &[BorrowedFd<'_>],
) -> Result<Attached, AttachError> {
    let sock = socket::connect_seqpacket(socket).map_err(|source| AttachError::Connect {
        path: socket.to_path_buf(),
        source,
    })?;
    let body = serde_json::to_vec(req).map_err(|e| AttachError::BadReply(e.to_string()))?;
    let mut fds = vec![tx_pool];
    fds.extend_from_slice(doorbells);
    socket::send_with_fds(sock.as_fd(), &body, &fds).map_err(AttachError::Io)?;
    let ready = poll::poll_one(sock.as_fd(), poll::PollFlags::IN, Some(ATTACH_TIMEOUT))
        .map_err(AttachError::Io)?;
    if ready.is_empty() {
        return Err(AttachError::Timeout(ATTACH_TIMEOUT));
    }
    let mut buf = vec![0u8; MAX_ATTACH_MESSAGE];
    let got = socket::recv_with_fds(sock.as_fd(), &mut buf, 2, false)
        .map_err(AttachError::Io)?
        .ok_or(AttachError::Closed)?;
    if got.closed {
        return Err(AttachError::Closed);
    }
    let reply: AttachReply = serde_json::from_slice(&buf[..got.len])
        .map_err(|e| AttachError::BadReply(e.to_string()))?;
    match reply {
        AttachReply::Refused { reason } => Err(AttachError::Refused(reason)),
        AttachReply::Accepted {
            app_id,
            pairs,
            ring_capacity,
            rx_pool_bytes,
            send_queue_bytes,
        } => {
            let mut fds = got.fds.into_iter();
            let (Some(channel), Some(rx_pool)) = (fds.next(), fds.next()) else {
                return Err(AttachError::BadReply(
                    "accepted without the channel and rx pool descriptors".into(),
                ));
            };
            Ok(Attached {
                app_id,
                pairs,
                ring_capacity,
                rx_pool_bytes,
                send_queue_bytes,
                channel,
                rx_pool,
                socket: sock,
            })
        }
    }
}

/// The pid of the attaching process (the netstack checks who it is).
pub fn peer_pid(sock: BorrowedFd<'_>) -> std::io::Result<i32> {
    socket::peer_pid(sock)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn conn(v: u32) -> ConnId {
        ConnId::new(v).unwrap()
    }

    fn ranges(rs: &[(u32, u32)]) -> Ranges {
        Ranges::from_slice(
            &rs.iter()
                .map(|&(o, l)| Range::new(o, l))
                .collect::<Vec<_>>(),
        )
        .unwrap()
    }

    #[test]
    fn every_command_round_trips() {
        let cmds = [
            Command::Listen {
                cookie: 7,
                port: 8080,
                backlog: 128,
            },
            Command::Accept {
                conn: conn(3),
                listener: ListenId::new(1).unwrap(),
            },
            Command::Connect {
                cookie: u32::MAX,
                remote: "10.0.0.2:11211".parse().unwrap(),
            },
            Command::Send {
                conn: conn(u32::MAX),
                ranges: ranges(&[(0, 1), (4096, 64), (1, 2), (3, 4), (5, 6), (7, 8)]),
                flags: SendFlags { more: true },
            },
            Command::RecvDone {
                conn: conn(2),
                ranges: ranges(&[(2048, 1460)]),
            },
            Command::Shutdown { conn: conn(9) },
            Command::Close { conn: conn(9) },
            Command::Unlisten {
                listener: ListenId::new(4).unwrap(),
            },
        ];
        for c in cmds {
            assert_eq!(Command::decode(&c.encode()), Ok(c), "{c:?}");
            // A command is never an event of the same meaning by accident
            // of tags: at least it decodes without panicking.
            let _ = Event::decode(&c.encode());
        }
    }

    #[test]
    fn every_event_round_trips() {
        let evs = [
            Event::Listening {
                cookie: 1,
                listener: ListenId::new(2).unwrap(),
            },
            Event::NewConn {
                conn: conn(5),
                listener: ListenId::new(2).unwrap(),
                remote: "192.168.1.9:40000".parse().unwrap(),
            },
            Event::Connected {
                cookie: 3,
                conn: conn(6),
                local_port: 49152,
            },
            Event::NewData {
                conn: conn(5),
                ranges: ranges(&[(0, 2048), (2048, 10)]),
            },
            Event::DataAcked {
                conn: conn(5),
                ranges: ranges(&[(100, 1)]),
            },
            Event::RemoteClosed { conn: conn(5) },
            Event::Cleanup { conn: conn(5) },
            Event::Refused {
                conn: Some(conn(5)),
                cookie: 0,
                command: 4,
                reason: Reason::OutsideTxPool,
            },
            Event::Refused {
                conn: None,
                cookie: 77,
                command: 3,
                reason: Reason::ConnectionRefused,
            },
            Event::Disconnected {
                reason: Reason::BadCommand,
            },
        ];
        for e in evs {
            assert_eq!(Event::decode(&e.encode()), Ok(e), "{e:?}");
        }
    }

    #[test]
    fn garbage_is_named_precisely() {
        let mut s = Slot::default();
        assert_eq!(
            Command::decode(&s),
            Err(CodecError::UnknownTag {
                dir: Direction::Command,
                tag: 0
            })
        );
        s = Command::Close { conn: conn(1) }.encode();
        s.words[9] = 5;
        assert_eq!(
            Command::decode(&s).unwrap_err().to_string(),
            "command tag 7: word 9 must be 0, is 0x5"
        );
        s = Command::Close { conn: conn(1) }.encode();
        s.words[1] = 0;
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::ZeroConnection { tag: 7, .. })
        ));
        s = Command::Send {
            conn: conn(1),
            ranges: ranges(&[(0, 1)]),
            flags: SendFlags::default(),
        }
        .encode();
        s.words[0] = head(tag::SEND, 7, 0);
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::TooManyRanges { n: 7, .. })
        ));
        s.words[0] = head(tag::SEND, 0, 0);
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::NoRanges { .. })
        ));
        s.words[0] = head(tag::SEND, 2, 0);
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::EmptyRange { index: 1, .. })
        ));
        s.words[0] = head(tag::SEND, 1, 0x8000);
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::UnknownFlags { flags: 0x8000, .. })
        ));
        s = Command::Shutdown { conn: conn(1) }.encode();
        s.words[0] |= 1 << 16;
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::UnknownFlags { .. })
        ));
        s = Command::Listen {
            cookie: 0,
            port: 80,
            backlog: 1,
        }
        .encode();
        s.words[3] = 0x1_0000;
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::FieldRange {
                value: 0x1_0000,
                ..
            })
        ));
        s.words[3] = 0;
        assert!(matches!(
            Command::decode(&s),
            Err(CodecError::ZeroPort { .. })
        ));
        let mut e = Event::Disconnected {
            reason: Reason::Shutdown,
        }
        .encode();
        e.words[3] = 999;
        assert_eq!(Event::decode(&e), Err(CodecError::UnknownReason(999)));
    }

    #[test]
    fn attach_messages_are_json() {
        let req = AttachRequest {
            protocol: NETSTACK_PROTOCOL,
            name: "kv".into(),
            interface: Interface {
                mac: ginza_net::MacAddr([2, 0, 0, 0, 0, 1]),
                ip: Ipv4Addr::new(10, 0, 0, 5),
            },
            kthreads: 2,
            doorbells: false,
        };
        let b = serde_json::to_vec(&req).unwrap();
        assert_eq!(serde_json::from_slice::<AttachRequest>(&b).unwrap(), req);
        let rep = AttachReply::Accepted {
            app_id: 1,
            pairs: 2,
            ring_capacity: 256,
            rx_pool_bytes: 1 << 20,
            send_queue_bytes: 1 << 20,
        };
        let b = serde_json::to_vec(&rep).unwrap();
        assert_eq!(serde_json::from_slice::<AttachReply>(&b).unwrap(), rep);
        assert!(serde_json::from_slice::<AttachRequest>(br#"{"protocol":1}"#).is_err());
    }

    fn arb_ranges() -> impl Strategy<Value = Ranges> {
        proptest::collection::vec((any::<u32>(), 1u32..), 1..=MAX_RANGES).prop_map(|v| {
            Ranges::from_slice(
                &v.into_iter()
                    .map(|(o, l)| Range::new(o, l))
                    .collect::<Vec<_>>(),
            )
            .unwrap()
        })
    }

    fn arb_conn() -> impl Strategy<Value = ConnId> {
        (1u32..).prop_map(conn)
    }

    fn arb_addr() -> impl Strategy<Value = SocketAddrV4> {
        (any::<u32>(), 1u16..).prop_map(|(ip, p)| SocketAddrV4::new(Ipv4Addr::from(ip), p))
    }

    fn arb_command() -> impl Strategy<Value = Command> {
        prop_oneof![
            (any::<u32>(), 1u16.., any::<u16>()).prop_map(|(cookie, port, backlog)| {
                Command::Listen {
                    cookie,
                    port,
                    backlog,
                }
            }),
            (arb_conn(), 1u32..).prop_map(|(conn, l)| Command::Accept {
                conn,
                listener: ListenId::new(l).unwrap()
            }),
            (any::<u32>(), arb_addr())
                .prop_map(|(cookie, remote)| Command::Connect { cookie, remote }),
            (arb_conn(), arb_ranges(), any::<bool>()).prop_map(|(conn, ranges, more)| {
                Command::Send {
                    conn,
                    ranges,
                    flags: SendFlags { more },
                }
            }),
            (arb_conn(), arb_ranges())
                .prop_map(|(conn, ranges)| Command::RecvDone { conn, ranges }),
            arb_conn().prop_map(|conn| Command::Shutdown { conn }),
            arb_conn().prop_map(|conn| Command::Close { conn }),
            (1u32..).prop_map(|l| Command::Unlisten {
                listener: ListenId::new(l).unwrap()
            }),
        ]
    }

    proptest! {
        #[test]
        fn commands_round_trip(c in arb_command()) {
            prop_assert_eq!(Command::decode(&c.encode()), Ok(c));
        }

        #[test]
        fn events_round_trip(conn in arb_conn(), rs in arb_ranges(), addr in arb_addr(), cookie in any::<u32>(), which in 0u8..4) {
            let e = match which {
                0 => Event::NewData { conn, ranges: rs },
                1 => Event::DataAcked { conn, ranges: rs },
                2 => Event::NewConn { conn, listener: ListenId::new(cookie.max(1)).unwrap(), remote: addr },
                _ => Event::Connected { cookie, conn, local_port: addr.port() },
            };
            prop_assert_eq!(Event::decode(&e.encode()), Ok(e));
        }

        /// Fuzz-style: random slots never panic the decoders, and whatever
        /// decodes re-encodes to the very same slot (no two slots mean the
        /// same message: nothing is silently ignored).
        #[test]
        fn random_slots_never_panic(words in proptest::array::uniform16(any::<u32>()), tag in 0u32..12, n in 0u32..8) {
            for w0 in [words[0], tag | n << 8, tag | n << 8 | (words[0] & 0x0001_0000)] {
                let mut s = Slot { words };
                s.words[0] = w0;
                if let Ok(c) = Command::decode(&s) {
                    prop_assert_eq!(c.encode(), s);
                }
                if let Ok(e) = Event::decode(&s) {
                    prop_assert_eq!(e.encode(), s);
                }
            }
        }

        /// Flipping bits of valid slots: rejected or decoded to a message
        /// that encodes back to the flipped slot.
        #[test]
        fn mutated_commands_are_rejected_or_exact(c in arb_command(), flips in proptest::collection::vec((0usize..SLOT_WORDS, 0u32..32), 1..4)) {
            let mut s = c.encode();
            for (w, b) in flips { s.words[w] ^= 1 << b; }
            if let Ok(d) = Command::decode(&s) {
                prop_assert_eq!(d.encode(), s);
            }
        }
    }
}
