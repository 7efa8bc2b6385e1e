//! The differential test: the same scripted sequence of raw text-protocol
//! requests, malformed ones included (`kv_script`), sent to kv-server and
//! to Debian's `memcached`, must get byte-identical replies, except what
//! legitimately differs (masked, see `kv_script::mask`): the cas unique
//! numbers of `gets`/`gats` lines and the `version` string. `stats` is left
//! out of the script: its values differ by nature.
//!
//! * Against kv-server's protocol engine in-process (no network): needs
//!   only `memcached` (on loopback). The same for the binary protocol: a
//!   sequence of binary requests (malformed ones included) gets the same
//!   responses, cas fields aside.
//! * Against kv-server under iokerneld on a veth, from a Linux client in
//!   the network namespace, with memcached on the namespace's loopback:
//!   needs root, `ip`, `ethtool` and `memcached`.
//!
//! Without them each test prints `skipped: …` (under CI as root it fails).

mod common;
mod kv_script;

use std::io::{self, Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use ginza_apps::echo_server::Protocols;
use ginza_apps::kv::binary::{self, op, Header};
use ginza_apps::kv::server::{serve, Session};
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::text::Flow;
use ginza_apps::kv::Kv;
use ginza_iokernel::netns::NetNs;
use ginza_iokernel::testing::skip;
use ginza_net::Ipv4Addr;
use ginza_net::MacAddr;
use kv_script::{
    assert_same, memcached_args, memcached_binary, run_script, script, start_memcached,
    start_memcached_on_loopback,
};

const KV_MAC: MacAddr = MacAddr([0x02, 0x47, 0x5a, 0x00, 0x0b, 0x09]);
const PORT: u16 = 11211;

/// kv-server's engine behind an in-memory connection.
struct Engine {
    kv: Kv,
    session: Option<Session>,
    input: Vec<u8>,
    output: Vec<u8>,
    closed: bool,
}

impl Engine {
    fn new(kv: Kv) -> Engine {
        Engine {
            kv,
            session: None,
            input: Vec::new(),
            output: Vec::new(),
            closed: false,
        }
    }
}

impl Write for Engine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        self.input.extend_from_slice(buf);
        let session = self
            .session
            .get_or_insert_with(|| Session::for_first_byte(buf[0]));
        let (used, _, flow) = session.process(&self.input, &self.kv, &mut self.output);
        self.input.drain(..used);
        self.closed = flow == Flow::Close;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Engine {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.output.is_empty() {
            return if self.closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(self.output.len());
        buf[..n].copy_from_slice(&self.output[..n]);
        self.output.drain(..n);
        Ok(n)
    }
}

fn kv() -> Kv {
    Kv::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)))
}

fn connect_std(addr: SocketAddrV4) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    s
}

#[test]
fn kv_servers_engine_answers_the_script_as_memcached_does() {
    let Some(binary) = memcached_binary() else {
        skip("memcached is not installed (apt-get install memcached)");
        return;
    };
    let (_memcached, addr) = start_memcached_on_loopback(binary);
    let script = script();
    let theirs = run_script(&script, || connect_std(addr));
    // The script reaches memcached (a comparison of nothing proves nothing).
    assert_eq!(theirs[0][1], b"VALUE a 0 1\r\n1\r\nEND\r\n");
    let kv = kv();
    let ours = run_script(&script, || Engine::new(kv.clone()));
    assert_same(&script, &ours, &theirs);
}

#[test]
fn kv_server_over_veth_answers_the_script_as_memcached_does() {
    let _lock = common::lock();
    let Some(binary) = memcached_binary() else {
        skip("memcached is not installed (apt-get install memcached)");
        return;
    };
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    // memcached on the namespace's loopback.
    let memcached_addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, PORT);
    let mut args = vec![binary.to_string()];
    args.extend(memcached_args("127.0.0.1", PORT));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let command = ns.command(&args);
    let probe_ns = ns.name.clone();
    let _memcached = start_memcached(command, memcached_addr, || {
        std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &probe_ns,
                "bash",
                "-c",
                "exec 3<>/dev/tcp/127.0.0.1/11211",
            ])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    // kv-server behind iokerneld on the veth.
    let daemon = Daemon::on(&ns, "af_xdp", |_| {});
    let stop = Arc::new(AtomicBool::new(false));
    let (s2, kv) = (stop.clone(), kv());
    let app = daemon.start_app("kv-diff", KV_MAC, ns.peer_ip, 1, move || {
        serve(PORT, Protocols::BOTH, kv, s2)
    });
    let kv_addr = SocketAddrV4::new(ns.peer_ip, PORT);
    let script = script();
    let s2 = script.clone();
    let (ours, theirs) = ns
        .run_in(move || {
            let ours = run_script(&s2, || connect_std(kv_addr));
            let theirs = run_script(&s2, || connect_std(memcached_addr));
            (ours, theirs)
        })
        .unwrap();
    stop.store(true, Relaxed);
    app.join(Duration::from_secs(10)).expect("kv-server");
    assert_eq!(theirs[0][1], b"VALUE a 0 1\r\n1\r\nEND\r\n");
    assert_same(&script, &ours, &theirs);
}

/// One binary request.
fn bin(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
    binary::encode_request(opcode, extras, key, value, cas, 0x0102_0304)
}

fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
    let mut e = flags.to_be_bytes().to_vec();
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

fn delta_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut e = delta.to_be_bytes().to_vec();
    e.extend_from_slice(&initial.to_be_bytes());
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

/// Binary steps: each is sent followed by a noop; the reply is every
/// response before the noop's (or all until the server closes).
fn binary_script() -> Vec<Vec<u8>> {
    let mut bad_lengths = bin(op::GET, &[], b"k", &[], 0);
    bad_lengths[11] = 0; // body shorter than the key
    let mut big = bin(
        op::SET,
        &set_extras(0, 0),
        b"big",
        &vec![b'x'; 2_000_000],
        0,
    );
    big.extend(bin(op::GET, &[], b"big", &[], 0));
    vec![
        bin(op::SET, &set_extras(7, 0), b"a", b"hello", 0),
        bin(op::GET, &[], b"a", &[], 0),
        bin(op::GETK, &[], b"a", &[], 0),
        bin(op::GETQ, &[], b"nokey", &[], 0),
        bin(op::GETKQ, &[], b"a", &[], 0),
        bin(op::GET, &[], b"nokey", &[], 0),
        bin(op::GETK, &[], b"nokey", &[], 0),
        bin(op::ADD, &set_extras(0, 0), b"a", b"x", 0),
        bin(op::ADDQ, &set_extras(0, 0), b"a", b"x", 0),
        bin(op::REPLACE, &set_extras(0, 0), b"nokey", b"x", 0),
        bin(op::SET, &set_extras(0, 0), b"a", b"x", 12345),
        bin(op::SET, &set_extras(0, 0), b"nokey", b"x", 12345),
        bin(op::APPEND, &[], b"a", b"++", 0),
        bin(op::PREPEND, &[], b"a", b"--", 0),
        bin(op::APPEND, &[], b"nokey", b"++", 0),
        bin(op::GET, &[], b"a", &[], 0),
        bin(op::INCREMENT, &delta_extras(1, 5, 0), b"n", &[], 0),
        bin(op::INCREMENT, &delta_extras(10, 5, 0), b"n", &[], 0),
        bin(op::DECREMENT, &delta_extras(100, 5, 0), b"n", &[], 0),
        bin(
            op::INCREMENT,
            &delta_extras(1, 5, 0xffff_ffff),
            b"nokey",
            &[],
            0,
        ),
        bin(op::INCREMENT, &delta_extras(1, 5, 0), b"a", &[], 0),
        bin(op::INCREMENTQ, &delta_extras(1, 5, 0), b"n", &[], 0),
        bin(op::GET, &[], b"n", &[], 0),
        bin(op::TOUCH, &100u32.to_be_bytes(), b"a", &[], 0),
        bin(op::TOUCH, &100u32.to_be_bytes(), b"nokey", &[], 0),
        bin(op::GAT, &100u32.to_be_bytes(), b"a", &[], 0),
        bin(op::GATK, &100u32.to_be_bytes(), b"nokey", &[], 0),
        bin(op::DELETE, &[], b"a", &[], 0),
        bin(op::DELETE, &[], b"a", &[], 0),
        bin(op::DELETEQ, &[], b"n", &[], 0),
        bin(op::SET, &set_extras(0, 0), b"big", b"small", 0),
        big,
        // An unknown opcode (memcached skips its body after its key and
        // extras, so only a body without them keeps the stream in step).
        bin(0x55, &[], &[], b"zz", 0),
        bin(op::FLUSH, &[], &[], &[], 0),
        bin(op::FLUSHQ, &[], &[], &[], 0),
        bin(op::SET, &set_extras(0, 0), b"e", b"e", 0)
            .into_iter()
            .chain(bin(op::SET, &set_extras(0, 0xffff_ffff), b"e", b"e", 0))
            .chain(bin(op::GET, &[], b"e", &[], 0))
            .collect(),
        // These close the connection.
        bin(op::GET, &[1, 2], b"k", &[], 0),
    ]
    .into_iter()
    .chain([bad_lengths, bin(op::QUIT, &[], &[], &[], 0)])
    .collect()
}

/// Sends each binary step (plus a noop) on a fresh-or-reused connection
/// and collects the responses, with the cas field zeroed (it differs
/// between servers by nature); a closed connection is reopened.
fn run_binary<S: Read + Write>(steps: &[Vec<u8>], mut connect: impl FnMut() -> S) -> Vec<Vec<u8>> {
    let mut s = connect();
    let noop = bin(op::NOOP, &[], &[], &[], 0);
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let mut send = step.clone();
            send.extend_from_slice(&noop);
            s.write_all(&send).unwrap();
            let mut got = Vec::new();
            let mut replies = Vec::new();
            let mut buf = [0u8; 65536];
            let t0 = std::time::Instant::now();
            loop {
                // Cut whole responses off the front.
                while let Some(h) = Header::parse(&got) {
                    let n = binary::HEADER_LEN + h.body_len as usize;
                    if got.len() < n {
                        break;
                    }
                    let mut r: Vec<u8> = got.drain(..n).collect();
                    r[16..24].fill(0);
                    if h.opcode == op::NOOP {
                        return replies;
                    }
                    replies.extend(r);
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "step {i}: no noop reply; so far {replies:?} and {got:?}"
                );
                match s.read(&mut buf) {
                    Ok(0) => {
                        replies.extend_from_slice(b"<closed>");
                        s = connect();
                        return replies;
                    }
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        replies.extend_from_slice(b"<closed>");
                        s = connect();
                        return replies;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .collect()
}

#[test]
fn kv_servers_binary_protocol_answers_as_memcached_does() {
    let Some(binary) = memcached_binary() else {
        skip("memcached is not installed (apt-get install memcached)");
        return;
    };
    let (_memcached, addr) = start_memcached_on_loopback(binary);
    let steps = binary_script();
    let theirs = run_binary(&steps, || connect_std(addr));
    let kv = kv();
    let ours = run_binary(&steps, || Engine::new(kv.clone()));
    assert_eq!(
        theirs[0].len(),
        binary::HEADER_LEN,
        "memcached answered the first set"
    );
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            a == b,
            "binary step {i} (opcode {:#04x}):\n  kv-server: {:?}\n  memcached: {:?}",
            steps[i][1],
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b)
        );
    }
}
