//! The verifying client's side of memcached's text protocol: one request,
//! one answer, on a blocking Linux socket with a deadline. An answer that
//! does not parse is the server's fault ([`Answer::Unexpected`]); an I/O
//! error or timeout leaves the request's fate unknown ([`Failed`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The request got no answer (I/O error, timeout, connection closed).
#[derive(Debug)]
pub(crate) struct Failed(pub(crate) String);

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Failed {
        Failed(e.kind().to_string())
    }
}

/// What the server answered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Stored,
    Exists,
    NotFound,
    Deleted,
    /// `get`: the value (none: END alone); `gets` adds the cas unique.
    Value(Option<(Vec<u8>, Option<u64>)>),
    Number(u64),
    /// Anything else, as read (an ERROR line, a malformed answer).
    Unexpected(String),
}

/// One connection to a kv-server.
pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> Result<Conn, Failed> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            reader: BufReader::with_capacity(4096, s),
        })
    }

    /// Closes with a reset (SO_LINGER 0): nothing sent before can reach the
    /// server later from this socket.
    pub(crate) fn abort(self) {
        let _ =
            rustix::net::sockopt::set_socket_linger(self.reader.get_ref(), Some(Duration::ZERO));
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), Failed> {
        self.reader.get_mut().write_all(bytes)?;
        Ok(())
    }

    fn line(&mut self) -> Result<String, Failed> {
        let mut line = Vec::new();
        let n = (&mut self.reader).take(512).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(Failed("the server closed the connection".into()));
        }
        if !line.ends_with(b"\r\n") {
            return Err(Failed(format!(
                "an answer line without CRLF: {:?}",
                String::from_utf8_lossy(&line)
            )));
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    pub(crate) fn set(&mut self, key: &str, value: &[u8]) -> Result<Answer, Failed> {
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.send(&req)?;
        self.simple()
    }

    pub(crate) fn cas(&mut self, key: &str, value: &[u8], unique: u64) -> Result<Answer, Failed> {
        let mut req = format!("cas {key} 0 0 {} {unique}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.send(&req)?;
        self.simple()
    }

    pub(crate) fn delete(&mut self, key: &str) -> Result<Answer, Failed> {
        self.send(format!("delete {key}\r\n").as_bytes())?;
        self.simple()
    }

    pub(crate) fn incr(&mut self, key: &str, delta: u64) -> Result<Answer, Failed> {
        self.send(format!("incr {key} {delta}\r\n").as_bytes())?;
        self.simple()
    }

    /// `get` (or `gets` with `with_cas`) of one key.
    pub(crate) fn get(&mut self, key: &str, with_cas: bool) -> Result<Answer, Failed> {
        let verb = if with_cas { "gets" } else { "get" };
        self.send(format!("{verb} {key}\r\n").as_bytes())?;
        let line = self.line()?;
        if line == "END" {
            return Ok(Answer::Value(None));
        }
        let tokens: Vec<&str> = line.split(' ').collect();
        let header_ok =
            tokens.len() == 4 + usize::from(with_cas) && tokens[0] == "VALUE" && tokens[1] == key;
        let len = tokens.get(3).and_then(|t| t.parse::<usize>().ok());
        let unique = if with_cas {
            tokens.get(4).and_then(|t| t.parse::<u64>().ok())
        } else {
            None
        };
        let (true, Some(len)) = (header_ok, len) else {
            return Ok(Answer::Unexpected(line));
        };
        if len > 1 << 20 || (with_cas && unique.is_none()) {
            return Ok(Answer::Unexpected(line));
        }
        let mut data = vec![0; len + 2];
        self.reader.read_exact(&mut data)?;
        if !data.ends_with(b"\r\n") {
            return Ok(Answer::Unexpected(format!(
                "{line}: data not ended by CRLF"
            )));
        }
        data.truncate(len);
        let end = self.line()?;
        if end != "END" {
            return Ok(Answer::Unexpected(format!("{line}: then {end:?}, not END")));
        }
        Ok(Answer::Value(Some((data, unique))))
    }

    fn simple(&mut self) -> Result<Answer, Failed> {
        let line = self.line()?;
        Ok(match line.as_str() {
            "STORED" => Answer::Stored,
            "EXISTS" => Answer::Exists,
            "NOT_FOUND" => Answer::NotFound,
            "DELETED" => Answer::Deleted,
            other => match other.parse::<u64>() {
                Ok(n) => Answer::Number(n),
                Err(_) => Answer::Unexpected(line),
            },
        })
    }
}

/// Sends the first half of a `set` and resets the connection (SO_LINGER
/// 0): a request cut off mid-way, which the server must never apply.
pub(crate) fn half_request_then_reset(
    addr: SocketAddr,
    key: &str,
    timeout: Duration,
) -> Result<(), Failed> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_write_timeout(Some(timeout))?;
    let value = [b'r'; 64];
    let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(&value[..32]);
    s.write_all(&req)?;
    rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO))
        .map_err(|e| Failed(format!("SO_LINGER: {e}")))?;
    drop(s);
    Ok(())
}
