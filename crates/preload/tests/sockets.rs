//! `ginza run`'s sockets (issue 31): C programs in `tests/c_net/` run under
//! `ginza run --iokernel --ip` with iokerneld driving one end of a veth
//! pair (AF_XDP), and ordinary Linux programs in the namespace on the other
//! end as their peers. Servers are checked byte for byte with 1,000
//! concurrent Linux connections; the clients against Linux servers; bad
//! peers (resets mid-request, half-closes, clients that never read) and
//! 100,000 connections against the epoll server, whose descriptors and
//! memory must stay bounded.
//!
//! Needs root, `ip`, `ethtool` and `cc`; without them the tests say
//! "skipped" (and fail under `CI=true` as root). One test at a time:
//! iokerneld busy-polls a core.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddrV4, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use ginza_iokernel::netns::tcp::EchoMode;
use ginza_iokernel::netns::NetNs;

static LOCK: Mutex<()> = Mutex::new(());

/// A C program of `tests/c_net/`, compiled once per process.
fn net_program(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let source = manifest_dir().join(format!("tests/c_net/{name}.c"));
    let bin = compile(&source, &format!("net-{name}"), &[]).unwrap_or_else(|e| panic!("{e}"));
    built.push((name.to_string(), bin.clone()));
    bin
}

/// iokerneld on a veth pair's host end; programs get the namespace's
/// unowned address (`peer_ip`) as their Ginza address.
struct Veth {
    // Dropped first: iokerneld lets go of the interface before it goes.
    daemon: Daemon,
    ns: NetNs,
    _lock: MutexGuard<'static, ()>,
}

impl Veth {
    fn start() -> Option<Veth> {
        let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if !have_cc() {
            return None;
        }
        let ns = NetNs::create_or_skip()?;
        let daemon = Daemon::start(&bins().ginza, &format!("af_xdp:{}", ns.host_if));
        Some(Veth {
            daemon,
            ns,
            _lock: lock,
        })
    }

    /// `ginza run --iokernel=SOCKET --ip PEER_IP -- PROGRAM ARGS`.
    fn ginza_run(&self, program: &str, args: &[String]) -> Command {
        let b = bins();
        let mut cmd = Command::new(&b.ginza);
        cmd.arg("run")
            .arg("--kthreads")
            .arg("2")
            .arg(format!("--iokernel={}", self.daemon.socket.display()))
            .arg("--ip")
            .arg(self.ns.peer_ip.to_string())
            .arg("--name")
            .arg(program)
            .arg("--library")
            .arg(&b.preload)
            .arg("--")
            .arg(net_program(program))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// A server program under `ginza run`, once it printed `ready`.
    fn server(&self, program: &str, args: &[&str]) -> Server {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut child = self
            .ginza_run(program, &args)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            name: program.to_string(),
        };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line == "ready" => {}
            other => panic!("{program} did not say ready ({other:?}): {}", server.stop()),
        }
        server
    }

    fn addr(&self, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(self.ns.peer_ip, port)
    }

    /// Runs `f` on a thread in the namespace (Linux's side) and waits.
    fn in_ns<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        self.ns
            .spawn_in(f)
            .expect("a thread in the namespace")
            .join()
            .expect("the namespace thread panicked")
    }
}

/// A server under `ginza run`; killed on drop.
struct Server {
    child: Child,
    name: String,
}

impl Server {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with its stderr if it is no longer running.
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let err = self.stderr();
            panic!("{} exited with {status}: {err}", self.name);
        }
    }

    fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }

    /// Kills it; what it printed on stderr.
    fn stop(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr()
    }

    /// Descriptors it holds now.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }

    /// Resident memory now, in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bytes connection `i` sends: distinct per connection.
fn message(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| b'a' + ((i * 7 + k) % 26) as u8).collect()
}

/// `conns` connections open at once to `to`, each sending its own
/// message of `len` bytes and reading it back; the first difference.
fn concurrent_echo(to: SocketAddrV4, conns: usize, len: usize) -> Result<(), String> {
    let deadline = Some(Duration::from_secs(20));
    let mut streams = Vec::with_capacity(conns);
    for i in 0..conns {
        let s = TcpStream::connect_timeout(&to.into(), Duration::from_secs(10))
            .map_err(|e| format!("connection {i} of {conns}: {e}"))?;
        s.set_read_timeout(deadline).unwrap();
        streams.push(s);
    }
    for (i, s) in streams.iter_mut().enumerate() {
        s.write_all(&message(i, len))
            .map_err(|e| format!("writing on connection {i}: {e}"))?;
    }
    for (i, s) in streams.iter_mut().enumerate() {
        let mut back = vec![0u8; len];
        s.read_exact(&mut back)
            .map_err(|e| format!("reading connection {i}'s echo: {e}"))?;
        if back != message(i, len) {
            return Err(format!("connection {i}: the echo differs"));
        }
    }
    Ok(())
}

fn serves_concurrent_connections(program: &str, args: &[&str]) {
    let Some(veth) = Veth::start() else { return };
    let mut server = veth.server(program, args);
    let to = veth.addr(7000);
    let r = veth.in_ns(move || concurrent_echo(to, 1000, 2000));
    server.check_alive();
    if let Err(e) = r {
        panic!("{e}\n{program}'s stderr: {}", server.stop());
    }
}

#[test]
fn a_blocking_echo_server_serves_1000_concurrent_connections() {
    serves_concurrent_connections("echo_blocking", &["7000"]);
}

#[test]
fn a_level_triggered_epoll_server_serves_1000_concurrent_connections() {
    serves_concurrent_connections("echo_epoll", &["7000", "lt"]);
}

#[test]
fn an_edge_triggered_epoll_server_serves_1000_concurrent_connections() {
    serves_concurrent_connections("echo_epoll", &["7000", "et"]);
}

#[test]
fn workers_fed_through_pipes_serve_1000_concurrent_connections() {
    serves_concurrent_connections("echo_workers", &["7000", "4"]);
}

/// A client program under `ginza run` to completion: its status and output.
fn run_client(veth: &Veth, program: &str, args: &[String]) -> (bool, String) {
    let mut child = veth
        .ginza_run(program, args)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    let mut err = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let ok = status.is_some_and(|s| s.success()) && out.contains(&format!("ok {program}"));
    (
        ok,
        format!("{program}: {status:?}\n--- stdout ---\n{out}--- stderr ---\n{err}"),
    )
}

#[test]
fn a_non_blocking_client_connects_1000_times_and_is_refused_as_on_linux() {
    let Some(veth) = Veth::start() else { return };
    let echo = veth.ns.tcp_echo_server(7100, EchoMode::Blocking).unwrap();
    let args = [
        veth.ns.ns_ip.to_string(),
        echo.addr().port().to_string(),
        "7101".to_string(),
        "1000".to_string(),
    ];
    let (ok, report) = run_client(&veth, "client_nonblocking", &args);
    assert!(ok, "{report}");
}

#[test]
fn the_socket_calls_around_the_data_answer_as_on_linux() {
    let Some(veth) = Veth::start() else { return };
    let echo = veth.ns.tcp_echo_server(7200, EchoMode::Blocking).unwrap();
    let udp = veth
        .ns
        .udp_echo_server(7201, Duration::from_secs(60))
        .unwrap();
    let args = [
        veth.ns.ns_ip.to_string(),
        echo.addr().port().to_string(),
        "7201".to_string(),
    ];
    let (ok, report) = run_client(&veth, "sock_api", &args);
    drop(udp);
    assert!(ok, "{report}");
}

/// Waits until `cond` holds (polling), or panics with `what` after 10 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn bad_peers_get_linux_errors_and_leave_the_server_serving() {
    let Some(veth) = Veth::start() else { return };
    let mut server = veth.server("echo_epoll", &["7000", "et"]);
    let to = veth.addr(7000);
    let before = server.fds();
    let r = veth.in_ns(move || -> Result<(), String> {
        // Half-close: everything sent comes back, then the end of stream.
        let mut s = TcpStream::connect(to).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let msg = message(1, 50_000);
        s.write_all(&msg).map_err(|e| e.to_string())?;
        s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
        let mut back = Vec::new();
        s.read_to_end(&mut back)
            .map_err(|e| format!("half-closed read: {e}"))?;
        if back != msg {
            return Err(format!("half-close: {} of {} bytes back", back.len(), msg.len()));
        }
        // Resets mid-request: SO_LINGER 0 makes close send RST.
        for i in 0..50 {
            let s = TcpStream::connect(to).map_err(|e| e.to_string())?;
            socket2_linger_zero(&s);
            let _ = (&s).write_all(&message(i, 3000));
            drop(s);
        }
        // A client that never reads: the server keeps its bytes, and
        // others are served meanwhile.
        let mut stuck = TcpStream::connect(to).map_err(|e| e.to_string())?;
        stuck
            .set_write_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let big = message(2, 1 << 16);
        let mut sent = 0usize;
        while sent < 8 << 20 {
            match stuck.write(&big) {
                Ok(n) => sent += n,
                Err(_) => break, // Linux's send buffer and the server's are full
            }
        }
        concurrent_echo(to, 20, 1000).map_err(|e| format!("while one never reads: {e}"))?;
        drop(stuck);
        concurrent_echo(to, 20, 1000).map_err(|e| format!("after the bad peers: {e}"))
    });
    server.check_alive();
    if let Err(e) = r {
        panic!("{e}\nstderr: {}", server.stop());
    }
    // Every bad peer's connection is closed in the end.
    wait_for("the server to close its bad peers' sockets", || {
        server.fds() <= before
    });
}

/// `SO_LINGER` {on, 0}: `close` resets the connection.
fn socket2_linger_zero(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and option buffer.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lg as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_LINGER");
}

/// Connections, one after another from a few threads, each echoing once.
fn sequential_connections(to: SocketAddrV4, count: usize) -> Result<(), String> {
    let threads = 4;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || -> Result<(), String> {
                for i in (t..count).step_by(threads) {
                    let mut s = TcpStream::connect(to).map_err(|e| format!("connection {i}: {e}"))?;
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let msg = message(i, 64);
                    s.write_all(&msg).map_err(|e| format!("connection {i}: {e}"))?;
                    let mut back = [0u8; 64];
                    s.read_exact(&mut back)
                        .map_err(|e| format!("connection {i}'s echo: {e}"))?;
                    if back[..] != msg[..] {
                        return Err(format!("connection {i}: the echo differs"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect()
}

#[test]
fn descriptors_and_memory_stay_bounded_over_100000_connections() {
    let Some(veth) = Veth::start() else { return };
    // The clients close first, so their side keeps TIME-WAIT for a minute:
    // 100,000 connections need more ports than Linux's default range, and
    // its reuse of TIME-WAIT ports (with timestamps, which Ginza sends).
    veth.in_ns(|| {
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "1024 65535")
            .and_then(|()| std::fs::write("/proc/sys/net/ipv4/tcp_tw_reuse", "1"))
    })
    .expect("the namespace's port range and TIME-WAIT reuse");
    let mut server = veth.server("echo_epoll", &["7000", "lt"]);
    let to = veth.addr(7000);
    // Warm up (allocator arenas, stacks, tables), then measure.
    let r = veth.in_ns(move || sequential_connections(to, 10_000));
    server.check_alive();
    r.unwrap_or_else(|e| panic!("{e}\nstderr: {}", server.stop()));
    let (fds, rss) = (server.fds(), server.rss_kib());
    let r = veth.in_ns(move || sequential_connections(to, 90_000));
    server.check_alive();
    r.unwrap_or_else(|e| panic!("{e}\nstderr: {}", server.stop()));
    wait_for("the server's descriptors to come back", || server.fds() <= fds);
    let grown = server.rss_kib().saturating_sub(rss);
    assert!(
        grown < 16 << 10,
        "resident memory grew by {grown} KiB over 90,000 connections (from {rss} KiB)"
    );
}
