//! The differential test: the same scripted sequence of raw text-protocol
//! requests, malformed ones included (`kv_script`), sent to kv-server and
//! to Debian's `memcached`, must get byte-identical replies, except what
//! legitimately differs (masked, see `kv_script::mask`): the cas unique
//! numbers of `gets`/`gats` lines and the `version` string. `stats` is left
//! out of the script: its values differ by nature.
//!
//! * Against kv-server's protocol engine in-process (no network): needs
//!   only `memcached` (on loopback).
//! * Against kv-server under iokerneld on a veth, from a Linux client in
//!   the network namespace, with memcached on the namespace's loopback:
//!   needs root, `ip`, `ethtool` and `memcached`.
//!
//! Without them each test prints `skipped: …` (under CI as root it fails).

mod common;
mod kv_script;

use std::io::{self, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use ginza_apps::echo_server::Protocols;
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
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
    let port = free_port();
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let mut command = std::process::Command::new(binary);
    command.args(memcached_args("127.0.0.1", port));
    let _memcached = start_memcached(command, addr, || std::net::TcpStream::connect(addr).is_ok());
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
