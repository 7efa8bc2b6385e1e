//! What the generator sends and how it reads the answers: one module per
//! protocol, each an encoder of requests and a parser of responses that
//! copes with partial reads (TCP) and whole datagrams (UDP).
//!
//! * [`echo`]: RFC 862; the request's sequence number in its first bytes.
//! * [`spin`]: `ginza_proto::RequestHeader` carrying the service time, as
//!   spin-server expects (UDP; over TCP, to any server that echoes it).
//! * [`memcached`]: the text protocol, the USR and ETC-like mixes; over
//!   UDP with memcached's frame header.
//! * [`http`]: `GET` with keep-alive, responses by `Content-Length`.

pub mod echo;
pub mod http;
pub mod memcached;
pub mod spin;

use rand::rngs::SmallRng;

/// Whether requests travel as datagrams or on a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Udp,
    Tcp,
}

/// What the generator remembers of a request until its answer comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// Scheduled send time (ns on the generator's clock): latency counts
    /// from here.
    pub scheduled_ns: u64,
    /// Index into [`Workload::classes`].
    pub class: u8,
    /// The id the answer carries (UDP matching; echo checks).
    pub id: u64,
    /// Bytes of the expected answer, where the protocol fixes it (echo).
    pub expect_len: u32,
}

/// The outcome of parsing the bytes received so far against the oldest
/// pending request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole response yet.
    Incomplete,
    /// A whole response of `consumed` bytes; `ok` false for a protocol
    /// error answer (e.g. `SERVER_ERROR`, HTTP 5xx) or a wrong echo.
    Done { consumed: usize, ok: bool },
    /// Bytes no valid response starts with: the stream cannot be trusted
    /// any more.
    Invalid(String),
}

/// The request mix and its parameters.
#[derive(Debug, Clone)]
pub enum Workload {
    Echo(echo::Echo),
    Spin(spin::Spin),
    Memcached(memcached::Memcached),
    Http(http::Http),
}

impl Workload {
    /// The request classes, by index (per-class latency is reported).
    pub fn classes(&self) -> Vec<&'static str> {
        match self {
            Workload::Echo(_) => vec!["echo"],
            Workload::Spin(s) => s.classes(),
            Workload::Memcached(_) => vec!["get", "set"],
            Workload::Http(_) => vec!["get"],
        }
    }

    /// Refuses combinations that cannot work (HTTP over UDP, payloads too
    /// small for the id).
    pub fn check(&self, transport: Transport) -> Result<(), String> {
        match self {
            Workload::Echo(e) => e.check(transport),
            Workload::Spin(s) => s.check(transport),
            Workload::Memcached(m) => m.check(transport),
            Workload::Http(_) if transport == Transport::Udp => {
                Err("the http protocol runs over TCP only".into())
            }
            Workload::Http(_) => Ok(()),
        }
    }

    /// Appends request `seq` (scheduled at `scheduled_ns`) to `out`.
    pub fn encode(
        &self,
        transport: Transport,
        seq: u64,
        scheduled_ns: u64,
        rng: &mut SmallRng,
        out: &mut Vec<u8>,
    ) -> Pending {
        let start = out.len();
        let (class, id) = match self {
            Workload::Echo(e) => (0, e.encode(seq, out)),
            Workload::Spin(s) => s.encode(seq, scheduled_ns, rng, out),
            Workload::Memcached(m) => m.encode(transport, seq, rng, out),
            Workload::Http(h) => (0, h.encode(seq, out)),
        };
        Pending {
            scheduled_ns,
            class,
            id,
            expect_len: (out.len() - start) as u32,
        }
    }

    /// Parses the start of `buf` as the answer to `pending`. For UDP,
    /// `buf` is one whole datagram.
    pub fn parse(&self, transport: Transport, pending: &Pending, buf: &[u8]) -> Parsed {
        match self {
            Workload::Echo(_) | Workload::Spin(_) => echo::parse(pending, buf),
            Workload::Memcached(m) => m.parse(transport, buf),
            Workload::Http(_) => http::parse_response(buf),
        }
    }

    /// The id of the request a datagram answers, `None` if it carries none.
    pub fn udp_id(&self, datagram: &[u8]) -> Option<u64> {
        match self {
            Workload::Echo(_) | Workload::Spin(_) => echo::id_of(datagram),
            Workload::Memcached(_) => memcached::udp_id(datagram),
            Workload::Http(_) => None,
        }
    }

    /// Requests to send before the run (memcached: the key population).
    pub fn preload(&self) -> Option<&memcached::Memcached> {
        match self {
            Workload::Memcached(m) if m.preload => Some(m),
            _ => None,
        }
    }
}
