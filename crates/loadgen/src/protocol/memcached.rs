//! memcached's text protocol: `get` and `set` over a key population, in
//! the mixes of the papers, and a parser of the answers that copes with
//! partial reads. Over UDP each request and answer carries memcached's
//! 8-byte frame header (request id, sequence number, datagram count,
//! reserved); the request id identifies the answer.
//!
//! * USR (Shenango §6, after Facebook's USR pool): 99.8 % `get`, 20-byte
//!   keys, 2-byte values.
//! * ETC-like (Facebook's ETC pool, simplified): about 30 `get`s per
//!   `set` (96.8 % `get`), keys of 20–44 bytes, values from 1 byte to
//!   1 KiB, most of them small (log-uniform).
//!
//! Keys are drawn uniformly from the population; with `preload`, every
//! key is `set` before the run so that `get`s hit.

use std::io::{self, Read, Write};

use rand::rngs::SmallRng;
use rand::Rng;

use super::{Parsed, Transport};

/// Bytes of memcached's UDP frame header.
pub const UDP_HEADER_LEN: usize = 8;

/// The longest response line the parser waits for before calling the
/// stream broken.
const MAX_LINE: usize = 4096;

/// The request mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mix {
    /// 99.8 % get, 20-byte keys, 2-byte values.
    Usr,
    /// 96.8 % get, 20–44-byte keys, values up to 1 KiB.
    Etc,
}

impl Mix {
    /// The probability that a request is a `get`.
    pub fn get_ratio(self) -> f64 {
        match self {
            Mix::Usr => 0.998,
            Mix::Etc => 30.0 / 31.0,
        }
    }
}

/// The memcached workload.
#[derive(Debug, Clone)]
pub struct Memcached {
    pub mix: Mix,
    /// Keys in the population.
    pub keys: u64,
    /// Set every key before the run.
    pub preload: bool,
}

/// Class indices (see [`super::Workload::classes`]).
pub const GET: u8 = 0;
pub const SET: u8 = 1;

impl Memcached {
    pub fn check(&self, _transport: Transport) -> Result<(), String> {
        if self.keys == 0 {
            return Err("the key population is empty (--keys at least 1)".into());
        }
        Ok(())
    }

    /// The key of index `i`: `usr:` or `etc:` and the index, padded to the
    /// mix's key length (ETC keys vary in length, but always the same for
    /// the same index).
    pub fn key(&self, i: u64) -> String {
        match self.mix {
            Mix::Usr => format!("usr:{i:016}"),
            Mix::Etc => {
                let len = 20 + (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59) as usize % 25;
                let mut k = format!("etc:{i:016}");
                while k.len() < len {
                    k.push('x');
                }
                k
            }
        }
    }

    /// A value's length for a `set`.
    fn value_len(&self, rng: &mut SmallRng) -> usize {
        match self.mix {
            Mix::Usr => 2,
            // Log-uniform over 1..=1024 bytes: most values small.
            Mix::Etc => (2f64.powf(rng.random_range(0.0..10.0))) as usize,
        }
    }

    /// Appends a request; gives its class and id (over UDP the frame
    /// header's request id, `seq` mod 2^16).
    pub fn encode(
        &self,
        transport: Transport,
        seq: u64,
        rng: &mut SmallRng,
        out: &mut Vec<u8>,
    ) -> (u8, u64) {
        let id = if transport == Transport::Udp {
            let id = seq & 0xffff;
            out.extend_from_slice(&(id as u16).to_be_bytes());
            out.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
            id
        } else {
            seq
        };
        let key = self.key(rng.random_range(0..self.keys));
        if rng.random_bool(self.mix.get_ratio()) {
            encode_get(&key, out);
            (GET, id)
        } else {
            let len = self.value_len(rng);
            encode_set(&key, &value(len, seq), out);
            (SET, id)
        }
    }

    /// Parses an answer: over UDP one datagram with its frame header.
    pub fn parse(&self, transport: Transport, buf: &[u8]) -> Parsed {
        match transport {
            Transport::Tcp => parse_response(buf),
            Transport::Udp => {
                if buf.len() < UDP_HEADER_LEN {
                    return Parsed::Invalid("a datagram shorter than the frame header".into());
                }
                let total = u16::from_be_bytes([buf[4], buf[5]]);
                if total != 1 {
                    // Answers over several datagrams are not reassembled.
                    return Parsed::Done {
                        consumed: buf.len(),
                        ok: false,
                    };
                }
                match parse_response(&buf[UDP_HEADER_LEN..]) {
                    Parsed::Done { ok, .. } => Parsed::Done {
                        consumed: buf.len(),
                        ok,
                    },
                    Parsed::Incomplete => Parsed::Invalid("a truncated answer datagram".into()),
                    invalid => invalid,
                }
            }
        }
    }

    /// Sets every key of the population on `stream` (a blocking TCP
    /// connection to the server), `batch` requests at a time; gives the
    /// number stored.
    pub fn preload_on<S: Read + Write>(&self, mut stream: S, batch: usize) -> io::Result<u64> {
        let mut rng = <SmallRng as rand::SeedableRng>::seed_from_u64(self.keys);
        let mut out = Vec::new();
        let mut buf = Vec::new();
        let mut stored = 0;
        let mut next = 0;
        while next < self.keys {
            out.clear();
            let n = batch.max(1).min((self.keys - next) as usize);
            for i in next..next + n as u64 {
                let len = self.value_len(&mut rng);
                encode_set(&self.key(i), &value(len, i), &mut out);
            }
            stream.write_all(&out)?;
            let mut answered = 0;
            let mut chunk = [0u8; 16 * 1024];
            while answered < n {
                match parse_response(&buf) {
                    Parsed::Done { consumed, ok } => {
                        buf.drain(..consumed);
                        answered += 1;
                        if ok {
                            stored += 1;
                        }
                    }
                    Parsed::Incomplete => {
                        let got = stream.read(&mut chunk)?;
                        if got == 0 {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "the server closed the connection while keys were being set",
                            ));
                        }
                        buf.extend_from_slice(&chunk[..got]);
                    }
                    Parsed::Invalid(why) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("setting the keys: {why}"),
                        ))
                    }
                }
            }
            next += n as u64;
        }
        Ok(stored)
    }
}

/// A value of `len` printable bytes.
fn value(len: usize, salt: u64) -> Vec<u8> {
    (0..len)
        .map(|i| b'a' + ((i as u64 + salt) % 26) as u8)
        .collect()
}

pub fn encode_get(key: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(b"get ");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\r\n");
}

pub fn encode_set(key: &str, value: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The request id of an answer datagram.
pub fn udp_id(datagram: &[u8]) -> Option<u64> {
    Some(u16::from_be_bytes(datagram.get(..2)?.try_into().ok()?) as u64)
}

/// The first line of `buf` (without CRLF), or `None` if it has not all
/// come.
fn line(buf: &[u8]) -> Option<&[u8]> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    Some(&buf[..end])
}

/// Parses one whole answer of the text protocol at the start of `buf`: the
/// `VALUE … END` of a `get` (a miss is a bare `END`), or a one-line answer.
/// `ERROR`, `CLIENT_ERROR …` and `SERVER_ERROR …` are answers with `ok`
/// false.
pub fn parse_response(buf: &[u8]) -> Parsed {
    let mut pos = 0;
    loop {
        let Some(l) = line(&buf[pos..]) else {
            return if buf.len() - pos > MAX_LINE {
                Parsed::Invalid(format!("no line end within {MAX_LINE} bytes"))
            } else {
                Parsed::Incomplete
            };
        };
        let after = pos + l.len() + 2;
        if let Some(rest) = l.strip_prefix(b"VALUE ") {
            // VALUE <key> <flags> <bytes> [<cas>]
            let fields: Vec<&[u8]> = rest.split(|&b| b == b' ').collect();
            let bytes = fields
                .get(2)
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|b| b.parse::<usize>().ok());
            let Some(bytes) = bytes.filter(|_| fields.len() <= 4) else {
                return Parsed::Invalid(format!(
                    "a malformed VALUE line: {:?}",
                    String::from_utf8_lossy(l)
                ));
            };
            let data_end = after + bytes;
            if buf.len() < data_end + 2 {
                return Parsed::Incomplete;
            }
            if &buf[data_end..data_end + 2] != b"\r\n" {
                return Parsed::Invalid("a value not followed by CRLF".into());
            }
            pos = data_end + 2;
            continue;
        }
        let ok = match l {
            b"END" | b"STORED" | b"NOT_STORED" | b"EXISTS" | b"NOT_FOUND" | b"DELETED"
            | b"TOUCHED" | b"OK" => true,
            _ if pos > 0 => {
                return Parsed::Invalid(format!(
                    "{:?} after VALUE blocks (END expected)",
                    String::from_utf8_lossy(l)
                ))
            }
            b"ERROR" => false,
            _ if l.starts_with(b"CLIENT_ERROR") || l.starts_with(b"SERVER_ERROR") => false,
            // incr/decr answer with the number.
            _ if !l.is_empty() && l.iter().all(u8::is_ascii_digit) => true,
            _ => {
                return Parsed::Invalid(format!(
                    "not a memcached answer: {:?}",
                    String::from_utf8_lossy(&l[..l.len().min(80)])
                ))
            }
        };
        return Parsed::Done {
            consumed: after,
            ok,
        };
    }
}
