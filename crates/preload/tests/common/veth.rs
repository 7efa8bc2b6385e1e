//! The veth fixture of the socket tests: iokerneld driving one end of a
//! veth pair (AF_XDP), programs under `ginza run` with the namespace's
//! unowned address as their Ginza address, and Linux programs in the
//! namespace as their peers.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::*;
use ginza_iokernel::netns::NetNs;

static LOCK: Mutex<()> = Mutex::new(());

/// A C program of `tests/c_net/`, compiled once per process.
pub fn net_program(name: &str) -> PathBuf {
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
pub struct Veth {
    // Dropped first: iokerneld lets go of the interface before it goes.
    pub daemon: Daemon,
    pub ns: NetNs,
    _lock: MutexGuard<'static, ()>,
}

impl Veth {
    pub fn start() -> Option<Veth> {
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

    /// `ginza run --iokernel=SOCKET --ip PEER_IP -- PROGRAM ARGS` for a
    /// program of `tests/c_net/`.
    pub fn ginza_run(&self, program: &str, args: &[String]) -> Command {
        self.ginza_run_binary(program, &net_program(program), args)
    }

    /// The same for any binary, named `name` at iokerneld.
    pub fn ginza_run_binary(
        &self,
        name: &str,
        binary: &std::path::Path,
        args: &[String],
    ) -> Command {
        let b = bins();
        let mut cmd = Command::new(&b.ginza);
        cmd.arg("run")
            .arg("--kthreads")
            .arg("2")
            .arg(format!("--iokernel={}", self.daemon.socket.display()))
            .arg("--ip")
            .arg(self.ns.peer_ip.to_string())
            .arg("--name")
            .arg(name)
            .arg("--library")
            .arg(&b.preload)
            .arg("--")
            .arg(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// A server program under `ginza run`, once it printed `ready`.
    pub fn server(&self, program: &str, args: &[&str]) -> Server {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        self.server_from(self.ginza_run(program, &args), program)
    }

    /// A program of `tests/c_net/` on plain Linux, in the namespace (the
    /// check of the test itself), once it printed `ready`.
    pub fn plain_server(&self, program: &str, args: &[&str]) -> Server {
        let bin = net_program(program);
        let mut argv = vec![bin.to_str().expect("a UTF-8 path")];
        argv.extend_from_slice(args);
        let mut cmd = self.ns.command(&argv);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        self.server_from(cmd, program)
    }

    /// The netstack daemon (protected mode) at the namespace's unowned
    /// address, under this iokerneld; its attach socket. Killed on drop.
    pub fn netstack(&self) -> (Server, PathBuf) {
        let socket = self.daemon.socket.with_file_name("netstack.sock");
        let child = Command::new(&bins().ginza)
            .args(["netstack", "--ip", &self.ns.peer_ip.to_string()])
            .args(["--mac", "02:47:5a:00:0f:07", "--kthreads", "1"])
            .arg("--iokernel-socket")
            .arg(&self.daemon.socket)
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting ginza netstack");
        let mut server = Server {
            child,
            name: "netstack".into(),
            lines: None,
        };
        wait_for("the netstack's attach socket", || {
            server.check_alive();
            socket.exists()
        });
        (server, socket)
    }

    /// A server program under `ginza run --protected=NETSTACK`, once it
    /// printed `ready`.
    pub fn protected_server(
        &self,
        netstack: &std::path::Path,
        program: &str,
        args: &[&str],
    ) -> Server {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let cmd = self.ginza_run(program, &args);
        // `--protected` goes before the program (`--` ends the options).
        let argv: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_os_string()).collect();
        let split = argv
            .iter()
            .position(|a| a == "--")
            .expect("a -- in ginza run");
        let mut with = Command::new(cmd.get_program());
        with.args(&argv[..split])
            .arg(format!("--protected={}", netstack.display()))
            .args(&argv[split..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.server_from(with, program)
    }

    /// The server `cmd` starts (a `ginza_run` command, changed), once it
    /// printed `ready`.
    pub fn server_from(&self, mut cmd: Command, program: &str) -> Server {
        let mut child = cmd
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
            lines: None,
        };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line == "ready" => {}
            other => panic!("{program} did not say ready ({other:?}): {}", server.stop()),
        }
        server.lines = Some(rx);
        server
    }

    /// A server binary under `ginza run`, once a Linux client in the
    /// namespace can connect to its `port`.
    pub fn server_binary(
        &self,
        name: &str,
        binary: &std::path::Path,
        args: &[String],
        port: u16,
    ) -> Server {
        let mut cmd = self.ginza_run_binary(name, binary, args);
        cmd.stdout(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let mut server = Server {
            child,
            name: name.to_string(),
            lines: None,
        };
        let to = self.addr(port);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.in_ns(move || {
            std::net::TcpStream::connect_timeout(&to.into(), Duration::from_millis(200)).is_ok()
        }) {
            server.check_alive();
            if Instant::now() > deadline {
                panic!("{name} does not accept on {to}: {}", server.stop());
            }
        }
        server
    }

    pub fn addr(&self, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(self.ns.peer_ip, port)
    }

    /// Runs `f` on a thread in the namespace (Linux's side) and waits.
    pub fn in_ns<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        self.ns
            .spawn_in(f)
            .expect("a thread in the namespace")
            .join()
            .expect("the namespace thread panicked")
    }
}

/// A server under `ginza run`; killed on drop.
pub struct Server {
    child: Child,
    name: String,
    /// Its stdout's lines, for a server that prints them.
    lines: Option<mpsc::Receiver<String>>,
}

impl Server {
    /// The next line it prints on stdout (within 30 s), or a panic with
    /// its stderr.
    pub fn next_line(&mut self) -> String {
        let got = self
            .lines
            .as_ref()
            .map(|rx| rx.recv_timeout(Duration::from_secs(30)));
        match got {
            Some(Ok(line)) => line,
            other => {
                let err = self.stop();
                panic!("{}: no line on stdout ({other:?}): {err}", self.name)
            }
        }
    }

    /// Waits (30 s at most) for it to exit; whether it exited 0.
    pub fn wait_success(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with its stderr if it is no longer running.
    pub fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let err = self.stderr();
            panic!("{} exited with {status}: {err}", self.name);
        }
    }

    pub fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }

    /// Kills it; what it printed on stderr.
    pub fn stop(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr()
    }

    /// Descriptors it holds now.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }

    /// Resident memory now, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let alive = std::thread::panicking() && matches!(self.child.try_wait(), Ok(None));
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A test that failed against it: what the server said, and whether
        // it was still running, are the first clues.
        if std::thread::panicking() {
            let state = if alive { "still running" } else { "had exited" };
            let err = self.stderr();
            eprintln!("--- {} ({state}) stderr ---\n{err}", self.name);
        }
    }
}

/// A client program under `ginza run` to completion: its status and output.
pub fn run_client(veth: &Veth, program: &str, args: &[String]) -> (bool, String) {
    run_client_as(veth.ginza_run(program, args), program)
}

/// A client program of `tests/c_net/` on plain Linux, in the namespace.
pub fn run_plain_client(veth: &Veth, program: &str, args: &[String]) -> (bool, String) {
    let bin = net_program(program);
    let mut argv = vec![bin.to_str().expect("a UTF-8 path")];
    argv.extend(args.iter().map(String::as_str));
    let mut cmd = veth.ns.command(&argv);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    run_client_as(cmd, program)
}

fn run_client_as(mut cmd: Command, program: &str) -> (bool, String) {
    let mut child = cmd
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
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let ok = status.is_some_and(|s| s.success()) && out.contains(&format!("ok {program}"));
    (
        ok,
        format!("{program}: {status:?}\n--- stdout ---\n{out}--- stderr ---\n{err}"),
    )
}

/// Waits until `cond` holds (polling), or panics with `what` after 10 s.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
