//! Debian's own servers, unmodified, under `ginza run` over a veth pair
//! (issue 31): `memcached` with 1, 2 and 4 threads against memccapable
//! (text and binary), pymemcache, libmemcached-tools and kv-server's
//! differential script (the same answers as memcached on Linux); and
//! `redis-server` against `redis-cli` and `redis-benchmark`, pipelined too.
//!
//! Needs root, `ip`, `ethtool`, `cc`, and the Debian packages `memcached`,
//! `libmemcached-tools`, `redis-server` and `redis-tools`, and pymemcache
//! from PyPI (.ci/run installs them); without them a test says
//! "skipped" (and fails under `CI=true` as root).

mod common;
#[path = "../../apps/tests/kv_script/mod.rs"]
mod kv_script;
#[path = "../../apps/tests/memcached_clients/mod.rs"]
mod memcached_clients;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::skip;
use common::veth::{Server, Veth};
use kv_script::{assert_same, memcached_args, run_script, script, start_memcached};

const PORT: u16 = 11211;

/// `args` run in the namespace (a Linux client), to completion.
fn in_ns_output(veth: &Veth, args: &[&str]) -> Output {
    veth.ns
        .command(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"))
}

fn installed(path: &str, package: &str) -> bool {
    if Path::new(path).exists() {
        return true;
    }
    skip(format!(
        "{path} is not installed (apt-get install {package})"
    ));
    false
}

/// Debian's memcached on Ginza with `threads` threads, TCP only.
fn memcached(veth: &Veth, threads: u32) -> Server {
    let args: Vec<String> = [
        "-p",
        "11211",
        "-U",
        "0",
        "-t",
        &threads.to_string(),
        "-u",
        "root",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    veth.server_binary("memcached", Path::new("/usr/bin/memcached"), &args, PORT)
}

/// memcached on Ginza with `threads` threads against every client: its
/// answers to kv-server's differential script are memcached-on-Linux's
/// (in the namespace, on loopback), byte for byte.
fn memcached_passes_every_client(threads: u32) {
    if !installed("/usr/bin/memcached", "memcached")
        || !installed("/usr/bin/memccapable", "libmemcached-tools")
    {
        return;
    }
    let Some(tools) = memcached_clients::libmemcached_tools() else {
        skip("libmemcached-tools is not installed (apt-get install libmemcached-tools)");
        return;
    };
    if !memcached_clients::have_pymemcache() {
        skip("python3 with pymemcache is not installed (pip install pymemcache)");
        return;
    }
    let Some(veth) = Veth::start() else { return };
    let mut server = memcached(&veth, threads);
    let addr = veth.addr(PORT);
    for protocol in ["-a", "-b"] {
        memcached_clients::memccapable(&veth.ns, addr, Some(protocol));
        server.check_alive();
    }
    memcached_clients::pymemcache_session(&veth.ns, addr);
    memcached_clients::libmemcached_session(&veth.ns, addr, tools, "ginza-debian-memcached");
    server.check_alive();
    // memcached on Linux, in the namespace, on loopback: the reference.
    let linux = SocketAddrV4::new(Ipv4Addr::LOCALHOST, PORT);
    let mut args = vec!["/usr/bin/memcached".to_string()];
    args.extend(memcached_args("127.0.0.1", PORT));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ns_name = veth.ns.name.clone();
    let _reference = start_memcached(veth.ns.command(&args), linux, || {
        std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns_name,
                "bash",
                "-c",
                "exec 3<>/dev/tcp/127.0.0.1/11211",
            ])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    let script = script();
    let s2 = script.clone();
    let connect = |to: SocketAddrV4| {
        let s = std::net::TcpStream::connect(to).expect("connecting");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    };
    let (ours, theirs) = veth.in_ns(move || {
        let ours = run_script(&s2, || connect(addr));
        let theirs = run_script(&s2, || connect(linux));
        (ours, theirs)
    });
    server.check_alive();
    assert_same(&script, &ours, &theirs);
}

#[test]
fn memcached_with_1_thread_passes_every_client() {
    memcached_passes_every_client(1);
}

#[test]
fn memcached_with_2_threads_passes_every_client() {
    memcached_passes_every_client(2);
}

#[test]
fn memcached_with_4_threads_passes_every_client() {
    memcached_passes_every_client(4);
}

/// Debian's redis-server on Ginza: no persistence, IPv4 only.
fn redis(veth: &Veth) -> Server {
    let args: Vec<String> = [
        "--port",
        "6379",
        "--bind",
        "0.0.0.0",
        "--protected-mode",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
        // Its log (a crash report included) where the test shows it.
        "--logfile",
        "/dev/stderr",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    veth.server_binary(
        "redis-server",
        Path::new("/usr/bin/redis-server"),
        &args,
        6379,
    )
}

/// 2,000 commands written at once on one connection (INCR and GET of a
/// new key, alternating): the answers come back in order, each the
/// expected one.
fn pipelined_commands_get_their_answers(veth: &Veth) {
    use std::io::{Read, Write};
    let addr = veth.addr(6379);
    let (got, want) = veth.in_ns(move || {
        let mut requests = Vec::new();
        let mut want = Vec::new();
        for i in 1..=1000 {
            requests.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$4\r\npipe\r\n");
            requests.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$4\r\npipe\r\n");
            let n = i.to_string();
            want.extend_from_slice(format!(":{n}\r\n${}\r\n{n}\r\n", n.len()).as_bytes());
        }
        let mut s = std::net::TcpStream::connect(addr).expect("connecting to redis");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(&requests).expect("writing the pipeline");
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got)
            .expect("reading the pipeline's answers");
        (got, want)
    });
    assert!(
        got == want,
        "pipelined answers differ: got {:?}…",
        String::from_utf8_lossy(&got[..got.len().min(200)])
    );
}

/// Redis turns on jemalloc's background threads, which jemalloc makes with
/// glibc's own `pthread_create` (`tests/c/glibc_thread.c` checks those).
#[test]
fn redis_server_answers_redis_cli_and_redis_benchmark() {
    if !installed("/usr/bin/redis-server", "redis-server")
        || !installed("/usr/bin/redis-cli", "redis-tools")
        || !installed("/usr/bin/redis-benchmark", "redis-tools")
    {
        return;
    }
    let Some(veth) = Veth::start() else { return };
    let mut server = redis(&veth);
    let ip = veth.ns.peer_ip.to_string();
    let cli = |args: &[&str]| -> String {
        let mut argv = vec!["timeout", "60", "redis-cli", "-h", &ip, "-p", "6379"];
        argv.extend_from_slice(args);
        let out = in_ns_output(&veth, &argv);
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(cli(&["ping"]), "PONG");
    assert_eq!(cli(&["set", "greeting", "hello"]), "OK");
    assert_eq!(cli(&["get", "greeting"]), "hello");
    assert_eq!(cli(&["incrby", "counter", "41"]), "41");
    assert_eq!(cli(&["incr", "counter"]), "42");
    assert_eq!(cli(&["rpush", "list", "a", "b", "c"]), "3");
    assert_eq!(cli(&["lrange", "list", "0", "-1"]), "a\nb\nc");
    assert_eq!(cli(&["hset", "h", "f", "v"]), "1");
    assert_eq!(cli(&["hget", "h", "f"]), "v");
    assert_eq!(cli(&["lpush", "stack", "x", "y"]), "2");
    assert_eq!(cli(&["lrange", "stack", "0", "-1"]), "y\nx");
    assert_eq!(cli(&["del", "stack", "nothing"]), "1");
    assert_eq!(cli(&["exists", "stack"]), "0");
    // A 200 kB value, from stdin (`-x`): many segments each way.
    let mut set_big = veth
        .ns
        .command(&["redis-cli", "-h", &ip, "-p", "6379", "-x", "set", "big"]);
    set_big
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = set_big.spawn().expect("redis-cli -x");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &[b'x'; 200_000]).unwrap();
    let out = child.wait_with_output().unwrap();
    if String::from_utf8_lossy(&out.stdout).trim() != "OK" {
        let err = server.stop();
        panic!(
            "redis-cli -x set big: {} {:?}\nredis-server: {err}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(cli(&["strlen", "big"]), "200000");
    assert!(
        cli(&["get", "big"]) == "x".repeat(200_000),
        "GET big did not give the 200,000 bytes SET"
    );
    assert_eq!(cli(&["dbsize"]), "5");
    pipelined_commands_get_their_answers(&veth);
    server.check_alive();
    for pipeline in ["1", "16"] {
        let argv = [
            "timeout",
            "300",
            "redis-benchmark",
            "-h",
            &ip,
            "-p",
            "6379",
            "-q",
            "-n",
            "100000",
            "-c",
            "50",
            "-P",
            pipeline,
            "-t",
            "set,get,incr,lpush,lpop",
        ];
        let out = in_ns_output(&veth, &argv);
        server.check_alive();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let rates = text.matches("requests per second").count();
        assert!(
            out.status.success() && rates == 5 && !text.to_lowercase().contains("error"),
            "redis-benchmark -P {pipeline}: {}\n{text}",
            out.status
        );
        // Its last line per test (the progress lines end in \r).
        let summary: Vec<&str> = text
            .split(['\r', '\n'])
            .filter(|l| l.contains("requests per second"))
            .map(str::trim)
            .collect();
        println!(
            "redis-benchmark -P {pipeline} on Ginza:\n{}",
            summary.join("\n")
        );
    }
}
