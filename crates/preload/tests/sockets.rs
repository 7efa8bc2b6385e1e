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

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddrV4, TcpStream};
use std::time::Duration;

use common::veth::{run_client, run_plain_client, wait_for, Veth};
use ginza_iokernel::netns::tcp::EchoMode;

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
            .map_err(|e| format!("reading connection {i}'s echo: {e}\n{}", client_side(s)))?;
        if back != message(i, len) {
            return Err(format!("connection {i}: the echo differs"));
        }
    }
    Ok(())
}

/// What Linux's side of `s` says of it (`ss -tnoi`), run from the
/// namespace: whether the server's bytes came, and whether ours were
/// acknowledged.
fn client_side(s: &TcpStream) -> String {
    let Ok(local) = s.local_addr() else {
        return String::new();
    };
    let filter = format!("sport = :{}", local.port());
    match std::process::Command::new("ss")
        .args(["-tnoi", "state", "all", &filter])
        .output()
    {
        Ok(o) => format!(
            "Linux's side of it:\n{}",
            String::from_utf8_lossy(&o.stdout)
        ),
        Err(e) => format!("(ss: {e})"),
    }
}

fn serves_concurrent_connections(program: &str, args: &[&str]) {
    let Some(veth) = Veth::start() else { return };
    let mut server = veth.server(program, args);
    let to = veth.addr(7000);
    let r = veth.in_ns(move || concurrent_echo(to, 1000, 2000));
    server.check_alive();
    if let Err(e) = r {
        panic!(
            "{e}\niokerneld's view: {}\n{program}'s threads:\n{}{}\n{program}'s stderr: {}",
            daemon_view(&veth),
            threads_view(server.pid()),
            stacks_view(server.pid()),
            server.stop()
        );
    }
}

/// Where each thread of process `pid` is (name, state, kernel wait
/// channel, system call), for a failure's report: whether its kthreads
/// wait in the kernel.
fn threads_view(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(no /proc entry)".into();
    };
    let mut out = String::new();
    for t in tasks.flatten() {
        let p = t.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        let syscall = read("syscall");
        let syscall = syscall.split_whitespace().next().unwrap_or("?");
        out += &format!(
            "{} {} {} wchan={} syscall={}\n",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            state,
            read("wchan"),
            syscall
        );
    }
    out
}

/// The stacks of process `pid`'s threads (`gdb -batch`), for a failure's
/// report; empty without gdb.
fn stacks_view(pid: u32) -> String {
    std::process::Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt 12",
        ])
        .output()
        .map_or_else(
            |e| format!("(gdb: {e})"),
            |o| String::from_utf8_lossy(&o.stdout).into_owned(),
        )
}

/// iokerneld's stats now (`ginza top --once --json`), for a failure's
/// report.
fn daemon_view(veth: &Veth) -> String {
    std::process::Command::new(&common::bins().ginza)
        .args(["top", "--once", "--json", "--socket"])
        .arg(&veth.daemon.socket)
        .output()
        .map_or_else(
            |e| format!("(ginza top: {e})"),
            |o| String::from_utf8_lossy(&o.stdout).into_owned(),
        )
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

/// CPU time (user + system, in clock ticks) process `pid` has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // utime and stime: fields 14 and 15 of stat(5), 12 and 13 after ')'.
    let at = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    at(11) + at(12)
}

/// Workers waiting in epoll on their pipe and their idle connections (a
/// kernel descriptor and Ginza sockets together) hold no CPU: each wait
/// parks until something happens. (A kernel watch's late wake-up used to
/// end each next wait at once, so idle workers spun through waits.)
#[test]
fn idle_workers_waiting_on_a_pipe_and_sockets_use_no_cpu() {
    let Some(veth) = Veth::start() else { return };
    let mut cmd = veth.ginza_run("echo_workers", &["7000".into(), "4".into()]);
    // Out of work, a kthread polls for a while by design (docs/idle-poll.md),
    // which would hide a wait that spins: here every wait must park.
    cmd.env("GINZA_POLL_WHILE_IDLE", "0");
    let mut server = veth.server_from(cmd, "echo_workers");
    let to = veth.addr(7000);
    // Two connections per worker, each echoed once (so every worker has
    // added its own to its set), then left open and idle.
    let open = veth.in_ns(move || -> Result<Vec<TcpStream>, String> {
        (0..8)
            .map(|i| {
                let mut s = TcpStream::connect_timeout(&to.into(), Duration::from_secs(10))
                    .map_err(|e| format!("connection {i}: {e}"))?;
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let msg = message(i, 10);
                s.write_all(&msg)
                    .map_err(|e| format!("connection {i}: {e}"))?;
                let mut back = [0u8; 10];
                s.read_exact(&mut back)
                    .map_err(|e| format!("connection {i}'s echo: {e}"))?;
                Ok(s)
            })
            .collect()
    });
    let open = open.unwrap_or_else(|e| panic!("{e}\nstderr: {}", server.stop()));
    let pid = server.pid();
    let hz = 100; // USER_HZ on Linux
    let before = cpu_ticks(pid);
    // A measurement window, not a wait for a condition.
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    server.check_alive();
    drop(open);
    eprintln!("idle echo_workers: {} ms of CPU in 2 s", used * 1000 / hz);
    assert!(
        used * 1000 / hz < 400,
        "idle workers used {} ms of CPU in 2 s\nthreads:\n{}",
        used * 1000 / hz,
        threads_view(pid)
    );
}

#[test]
fn a_protected_epoll_server_serves_through_the_netstack() {
    let Some(veth) = Veth::start() else { return };
    let (mut netstack, attach) = veth.netstack();
    let mut server = veth.protected_server(&attach, "echo_epoll", &["7000", "et"]);
    let to = veth.addr(7000);
    let r = veth.in_ns(move || concurrent_echo(to, 200, 2000));
    server.check_alive();
    netstack.check_alive();
    if let Err(e) = r {
        panic!("{e}\nstderr: {}", server.stop());
    }
}

/// Where a C test program runs: under `ginza run`, or on Linux itself
/// (which checks the test).
#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    Ginza,
    Linux,
}

fn client(veth: &Veth, on: On, program: &str, args: &[String]) -> (bool, String) {
    match on {
        On::Ginza => run_client(veth, program, args),
        On::Linux => run_plain_client(veth, program, args),
    }
}

fn non_blocking_client(on: On) {
    let Some(veth) = Veth::start() else { return };
    let echo = veth.ns.tcp_echo_server(7100, EchoMode::Blocking).unwrap();
    let args = [
        veth.ns.ns_ip.to_string(),
        echo.addr().port().to_string(),
        "7101".to_string(),
        "1000".to_string(),
    ];
    let (ok, report) = client(&veth, on, "client_nonblocking", &args);
    assert!(ok, "{report}");
}

#[test]
fn a_non_blocking_client_connects_1000_times_and_is_refused_as_on_linux() {
    non_blocking_client(On::Ginza);
}

#[test]
fn the_non_blocking_client_passes_on_linux_itself() {
    non_blocking_client(On::Linux);
}

fn socket_calls(on: On) {
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
    let (ok, report) = client(&veth, on, "sock_api", &args);
    drop(udp);
    assert!(ok, "{report}");
}

#[test]
fn the_socket_calls_around_the_data_answer_as_on_linux() {
    socket_calls(On::Ginza);
}

#[test]
fn the_socket_calls_program_passes_on_linux_itself() {
    socket_calls(On::Linux);
}

fn quiet_pipe_in_an_epoll_set(on: On) {
    let Some(veth) = Veth::start() else { return };
    let echo = veth.ns.tcp_echo_server(7300, EchoMode::Blocking).unwrap();
    let args = [
        veth.ns.ns_ip.to_string(),
        echo.addr().port().to_string(),
        "500".to_string(),
    ];
    let (ok, report) = client(&veth, on, "epoll_quiet_pipe", &args);
    assert!(ok, "{report}");
}

/// memcached's wait (a quiet notify pipe beside its sockets in one epoll
/// set), 500 times: each wait wakes for the right descriptor, the pipe's
/// too, and no wait hands a watch of the pipe to the blocking pool.
#[test]
fn an_epoll_set_with_a_quiet_pipe_wakes_on_either_without_the_blocking_pool() {
    quiet_pipe_in_an_epoll_set(On::Ginza);
}

#[test]
fn the_quiet_pipe_program_passes_on_linux_itself() {
    quiet_pipe_in_an_epoll_set(On::Linux);
}

/// A Linux server in the namespace on `port` that, for each of `conns`
/// connections, reads "port N\n" and answers "seen P\n" with the peer port
/// it saw; the (told, seen) pairs.
fn port_witness(veth: &Veth, port: u16, conns: usize) -> std::thread::JoinHandle<Vec<(u16, u16)>> {
    let ip = veth.ns.ns_ip;
    let l = veth
        .in_ns(move || std::net::TcpListener::bind((ip, port)))
        .expect("a listener in the namespace");
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..conns {
            let (mut s, peer) = l.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while !line.ends_with(b"\n") {
                match s.read(&mut b) {
                    Ok(1) => line.push(b[0]),
                    _ => break,
                }
            }
            let told = std::str::from_utf8(&line)
                .ok()
                .and_then(|l| l.trim().strip_prefix("port "))
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let _ = s.write_all(format!("seen {}\n", peer.port()).as_bytes());
            seen.push((told, peer.port()));
        }
        seen
    })
}

fn bound_then_connected(on: On) {
    let Some(veth) = Veth::start() else { return };
    let witness = port_witness(&veth, 7300, 2);
    let args = [
        veth.ns.ns_ip.to_string(),
        "7300".to_string(),
        "41234".to_string(),
    ];
    let (ok, report) = client(&veth, on, "bound_connect", &args);
    assert!(ok, "{report}");
    let seen = witness.join().expect("the witness thread");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], (41234, 41234), "the blocking connect's port");
    assert_eq!(
        seen[1].0, seen[1].1,
        "the non-blocking connect's port (told, seen)"
    );
}

#[test]
fn a_socket_bound_then_connected_keeps_its_port() {
    bound_then_connected(On::Ginza);
}

#[test]
fn the_bound_connect_program_passes_on_linux_itself() {
    bound_then_connected(On::Linux);
}

fn signal_masks(on: On) {
    let Some(veth) = Veth::start() else { return };
    let (ok, report) = client(&veth, on, "sig_mask", &["7400".to_string()]);
    assert!(ok, "{report}");
}

#[test]
fn ppoll_pselect_and_epoll_pwait_apply_their_signal_mask() {
    signal_masks(On::Ginza);
}

#[test]
fn the_signal_mask_program_passes_on_linux_itself() {
    signal_masks(On::Linux);
}

/// One connection to `to` that echoes `msg` back.
fn echo_once(to: SocketAddrV4, msg: &[u8]) -> Result<(), String> {
    echo_once_negotiating(to, msg).map(|_| ())
}

/// `echo_once`; whether the handshake negotiated any of window scale,
/// SACK and timestamps (Linux's client offers all three; Ginza answers
/// them unless it answered with a SYN cookie, which carries none).
fn echo_once_negotiating(to: SocketAddrV4, msg: &[u8]) -> Result<bool, String> {
    let mut s = TcpStream::connect_timeout(&to.into(), Duration::from_secs(10))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let negotiated = tcp_options(&s).map_err(|e| format!("TCP_INFO: {e}"))? != 0;
    s.write_all(msg).map_err(|e| format!("write: {e}"))?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).map_err(|e| format!("echo: {e}"))?;
    if back != msg {
        return Err("the echo differs".into());
    }
    Ok(negotiated)
}

/// The options a Linux socket's handshake negotiated (`tcpi_options`:
/// timestamps 1, SACK 2, window scale 4, as `linux/tcp.h` numbers them).
fn tcp_options(s: &TcpStream) -> std::io::Result<u8> {
    use std::os::fd::AsRawFd;
    // SAFETY: zeroed is a valid tcp_info (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: our socket, and a buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.tcpi_options & 0b111)
}

#[test]
fn a_syn_flood_leaves_the_server_bounded_and_serving() {
    syn_flood_against_echo_epoll(false);
}

/// Before SYN cookies a genuine client was reset now and then during the
/// flood: its half-open entry was evicted by newer SYNs before its ACK was
/// read. Now, with the half-open set full, its SYN is answered with a
/// cookie and its ACK makes the connection however late it comes.
#[test]
fn real_clients_are_served_during_a_syn_flood() {
    syn_flood_against_echo_epoll(true);
}

/// 100,000 spoofed SYNs at 25,000/s (after an unpaced warm-up burst)
/// against `echo_epoll`: the SYNs reach it (SYN-ACKs counted), it stays
/// up, serves clients after, its descriptors come back and its memory
/// stays bounded; with `clients_during`, real clients are served during
/// the flood too.
fn syn_flood_against_echo_epoll(clients_during: bool) {
    use common::syn_flood::{count_syn_acks, flood};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let Some(veth) = Veth::start() else { return };
    let mut server = veth.server("echo_epoll", &["7000", "lt"]);
    let to = veth.addr(7000);
    // Warm up: a first flood, as fast as one raw socket sends, fills the
    // listener's half-open set to its bound and brings the ingress buffers
    // into memory, so what is measured is growth with the number of SYNs.
    // From then on SYNs are answered with SYN cookies (docs/tcp.md).
    let sent = veth
        .in_ns(move || flood(to, 50_000, None, 1))
        .expect("a raw socket");
    assert!(sent > 0, "no SYN of the warm-up flood was sent");
    veth.in_ns(move || echo_once(to, b"after the warm-up"))
        .unwrap_or_else(|e| panic!("{e}\nstderr: {}", server.stop()));
    let (fds, rss) = (server.fds(), server.rss_kib());

    let stop = Arc::new(AtomicBool::new(false));
    let flooding = Arc::new(AtomicBool::new(true));
    let ifname = veth.ns.ns_if.clone();
    let counter = {
        let stop = Arc::clone(&stop);
        veth.ns
            .spawn_in(move || count_syn_acks(&ifname, to, stop))
            .expect("a thread in the namespace")
    };
    let flooder = {
        let flooding = Arc::clone(&flooding);
        veth.ns
            .spawn_in(move || {
                // 25,000 SYNs a second: the half-open set's 1,024 entries
                // turn over every 41 ms, far longer than a handshake.
                let t0 = std::time::Instant::now();
                let r = flood(to, 100_000, Some(25_000), 2);
                flooding.store(false, Ordering::SeqCst);
                r.map(|sent| (sent, t0.elapsed()))
            })
            .expect("a thread in the namespace")
    };
    // Real clients while it floods: every one is served; those answered
    // with a SYN cookie (no option negotiated) are counted.
    let clients = {
        let flooding = Arc::clone(&flooding);
        veth.in_ns(move || -> Result<(usize, usize), String> {
            let (mut served, mut by_cookie) = (0, 0);
            while clients_during && (flooding.load(Ordering::SeqCst) || served < 5) {
                let negotiated = echo_once_negotiating(to, &message(served, 100))
                    .map_err(|e| format!("client {served} during the flood: {e}"))?;
                served += 1;
                by_cookie += usize::from(!negotiated);
            }
            Ok((served, by_cookie))
        })
    };
    let (sent, took) = flooder
        .join()
        .expect("the flood thread")
        .expect("a raw socket");
    stop.store(true, Ordering::SeqCst);
    let (answered, others) = counter
        .join()
        .expect("the counting thread")
        .expect("a packet socket");
    server.check_alive();
    let (served, by_cookie) = clients.unwrap_or_else(|e| {
        panic!(
            "{e}\niokerneld's view: {}\nthe server's threads:\n{}stderr: {}",
            daemon_view(&veth),
            threads_view(server.pid()),
            server.stop()
        )
    });
    eprintln!(
        "SYN flood: {sent} SYNs sent, {answered} SYN-ACKs seen, {served} real clients served \
         ({by_cookie} through a SYN cookie)"
    );
    assert!(
        !clients_during || by_cookie > 0,
        "none of the {served} clients during the flood was answered with a SYN cookie: \
         the half-open set was never full"
    );
    if answered < 1000 {
        panic!(
            "only {answered} SYN-ACKs to the {sent} spoofed SYNs (sent over {took:?}; {others} \
             other segments from the server to them): the flood did not reach the server\n\
             iokerneld's view: {}\nthe server's threads:\n{}stderr: {}",
            daemon_view(&veth),
            threads_view(server.pid()),
            server.stop()
        );
    }
    veth.in_ns(move || -> Result<(), String> {
        for i in 0..20 {
            echo_once(to, &message(i, 100))
                .map_err(|e| format!("client {i} after the flood: {e}"))?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}\nstderr: {}", server.stop()));
    wait_for("the server's descriptors to come back", || {
        server.fds() <= fds
    });
    let grown = server.rss_kib().saturating_sub(rss);
    assert!(
        grown < 16 << 10,
        "resident memory grew by {grown} KiB over 100,000 spoofed SYNs (from {rss} KiB)"
    );
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
            return Err(format!(
                "half-close: {} of {} bytes back",
                back.len(),
                msg.len()
            ));
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

fn peer_errors(on: On) {
    let Some(veth) = Veth::start() else { return };
    let (mut server, to) = match on {
        On::Ginza => (veth.server("peer_errors", &["7000"]), veth.addr(7000)),
        On::Linux => (
            veth.plain_server("peer_errors", &["7000"]),
            SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 7000),
        ),
    };
    // 1. A reset mid-request.
    veth.in_ns(move || {
        let mut s = TcpStream::connect(to).unwrap();
        s.write_all(b"hello").unwrap();
        socket2_linger_zero(&s);
    });
    assert_eq!(server.next_line(), "reset");
    // 2. A half-close: its bytes, then ours come back.
    let back = veth.in_ns(move || {
        let mut s = TcpStream::connect(to).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"abc").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back)
            .map(|_| back)
            .map_err(|e| e.to_string())
    });
    assert_eq!(back.as_deref(), Ok(&b"xyz"[..]));
    assert_eq!(server.next_line(), "half-close");
    // 3. A client that never reads, held open until the server is full.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let holder = veth.ns.spawn_in(move || {
        let s = TcpStream::connect(to).unwrap();
        let _ = rx.recv();
        drop(s);
    });
    let full = server.next_line();
    assert!(full.starts_with("full after "), "{full}");
    tx.send(()).unwrap();
    holder.unwrap().join().unwrap();
    assert_eq!(server.next_line(), "ok peer_errors");
    assert!(server.wait_success(), "peer_errors: {}", server.stop());
}

#[test]
fn a_server_sees_resets_half_closes_and_full_buffers_as_on_linux() {
    peer_errors(On::Ginza);
}

#[test]
fn the_peer_errors_program_passes_on_linux_itself() {
    peer_errors(On::Linux);
}

#[test]
fn keep_alive_set_through_socket_options_ends_a_connection_whose_peer_vanished() {
    let Some(veth) = Veth::start() else { return };
    let echo = veth.ns.tcp_echo_server(7300, EchoMode::Blocking).unwrap();
    let (host, port) = (veth.ns.ns_ip.to_string(), echo.addr().port().to_string());
    let mut client = veth.server("keepalive", &[&host, &port]);
    // The peer vanishes: its link goes down, so probes go unanswered.
    veth.ns.set_link_up(false).unwrap();
    let line = client.next_line();
    assert!(line.starts_with("timed out after "), "{line}");
    assert_eq!(client.next_line(), "ok keepalive");
    assert!(client.wait_success(), "keepalive: {}", client.stop());
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
                    let mut s =
                        TcpStream::connect(to).map_err(|e| format!("connection {i}: {e}"))?;
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let msg = message(i, 64);
                    s.write_all(&msg)
                        .map_err(|e| format!("connection {i}: {e}"))?;
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
        .try_for_each(|h| h.join().expect("client thread"))
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
    wait_for("the server's descriptors to come back", || {
        server.fds() <= fds
    });
    let grown = server.rss_kib().saturating_sub(rss);
    assert!(
        grown < 16 << 10,
        "resident memory grew by {grown} KiB over 90,000 connections (from {rss} KiB)"
    );
}

/// A Linux sink in the namespace on `port`: accepts one connection and
/// reads it to the end; the bytes, whether they were the pattern
/// `send_close_exit` writes, and whether the end came (not the timeout).
fn sink(veth: &Veth, port: u16) -> std::thread::JoinHandle<(usize, bool, bool)> {
    let ip = veth.ns.ns_ip;
    let l = veth
        .in_ns(move || std::net::TcpListener::bind((ip, port)))
        .expect("a listener in the namespace");
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut all = Vec::new();
        let ended = s.read_to_end(&mut all).is_ok();
        let pattern = all.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8);
        (all.len(), pattern, ended)
    })
}

fn send_close_exit(on: On) {
    const LEN: usize = 4 << 20;
    let Some(veth) = Veth::start() else { return };
    let got = sink(&veth, 7400);
    let args = [
        veth.ns.ns_ip.to_string(),
        "7400".to_string(),
        LEN.to_string(),
    ];
    let (ok, report) = client(&veth, on, "send_close_exit", &args);
    assert!(ok, "{report}");
    let (len, pattern, ended) = got.join().expect("the sink thread");
    assert_eq!(
        (len, pattern, ended),
        (LEN, true, true),
        "(bytes, in order, then the end) the sink read; {report}"
    );
}

/// A client that writes 4 MiB, closes and returns from `main` at once: the
/// server still reads every byte and the end of the stream (`exit` lingers
/// for the closed connection: docs/preload.md, "Exit").
#[test]
fn a_client_that_closes_and_exits_at_once_delivers_everything() {
    send_close_exit(On::Ginza);
}

#[test]
fn the_send_close_exit_program_passes_on_linux_itself() {
    send_close_exit(On::Linux);
}
