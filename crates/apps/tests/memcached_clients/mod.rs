//! Unmodified memcached clients, as checks any memcached-speaking server
//! must pass: `pymemcache` (PyPI) and Debian's `libmemcached-tools`
//! (`memccp`, `memccat`, `memcrm`, `memcslap`, `memcaslap`,
//! `memccapable`), run in a network namespace against a server's address.
//! kv-server's tests (`kv_clients.rs`) and Debian's memcached under
//! `ginza run` (crates/preload/tests/debian_servers.rs) share them.
#![allow(dead_code)] // each test binary uses a part

use std::net::SocketAddrV4;
use std::process::Output;

use ginza_iokernel::netns::NetNs;

/// The first of `names` on the PATH (Debian renamed libmemcached's tools
/// from memcp to memccp and so on).
pub fn tool(names: &[&'static str]) -> Option<&'static str> {
    names.iter().copied().find(|name| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs `args` in the namespace under `timeout`; panics with its output if
/// it fails.
pub fn run_ok(ns: &NetNs, args: &[&str]) -> Output {
    let mut full = vec!["timeout", "120"];
    full.extend_from_slice(args);
    let out = ns.exec(&full).expect("running a client");
    assert!(
        out.status.success(),
        "{args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub const PYMEMCACHE_SESSION: &str = r#"
import sys
from pymemcache.client.base import Client
c = Client((sys.argv[1], int(sys.argv[2])), connect_timeout=10, timeout=10, default_noreply=False)
assert c.set('a', b'1') is True
assert c.get('a') == b'1'
value, cas = c.gets('a')
assert value == b'1', value
assert c.cas('a', b'2', cas) is True
assert c.cas('a', b'3', cas) is False, 'a stale cas unique'
assert c.get('a') == b'2'
assert c.incr('a', 5) == 7
assert c.decr('a', 10) == 0
assert c.incr('missing', 1) is None
assert c.add('a', b'x') is False
assert c.add('b', b'x', expire=100) is True
assert c.replace('b', b'y') is True
assert c.append('b', b'z') is True
assert c.prepend('b', b'w') is True
assert c.get('b') == b'wyz'
assert c.touch('b', 50) is True
assert c.touch('missing', 50) is False
assert c.set_many({'x': b'1', 'y': b'2' * 100000}) == []
assert c.get_many(['x', 'y', 'nope']) == {'x': b'1', 'y': b'2' * 100000}
assert c.delete('x') is True
assert c.delete('x') is False
assert c.get('x') is None
assert c.set('expired', b'v', expire=-1) is True
assert c.get('expired') is None
stats = c.stats()
assert b'curr_items' in stats or 'curr_items' in stats, stats
assert c.version()
assert c.flush_all() is True
assert c.get('a') is None
for i in range(200):
    c.set('k%d' % i, str(i).encode())
assert c.get_many(['k%d' % i for i in range(200)]) == {'k%d' % i: str(i).encode() for i in range(200)}
print('pymemcache: ok')
"#;

/// Whether python3 can import pymemcache.
pub fn have_pymemcache() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import pymemcache"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// pymemcache's session against `addr`; panics with its output if a step fails.
pub fn pymemcache_session(ns: &NetNs, addr: SocketAddrV4) {
    let (ip, port) = (addr.ip().to_string(), addr.port().to_string());
    let out = run_ok(ns, &["python3", "-c", PYMEMCACHE_SESSION, &ip, &port]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("pymemcache: ok"));
}

/// memccp/memccat/memcrm (whose names Debian changed) of this machine,
/// if installed.
pub fn libmemcached_tools() -> Option<(&'static str, &'static str, &'static str)> {
    Some((
        tool(&["memccp", "memcp"])?,
        tool(&["memccat", "memcat"])?,
        tool(&["memcrm", "memrm"])?,
    ))
}

/// Files copied in and out with memccp/memccat/memcrm over the text and
/// binary protocols, then memcslap and memcaslap, against `addr`; panics
/// with a tool's output when it fails. `tools` from [`libmemcached_tools`].
pub fn libmemcached_session(
    ns: &NetNs,
    addr: SocketAddrV4,
    tools: (&str, &str, &str),
    scratch: &str,
) {
    let (cp, cat, rm) = tools;
    let dir = std::env::temp_dir().join(format!("{scratch}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let servers = format!("--servers={addr}");
    for (protocol, flag) in [("text", None), ("binary", Some("--binary"))] {
        let with = |args: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = vec![servers.clone()];
            v.extend(flag.map(String::from));
            v.extend(args.iter().map(|s| s.to_string()));
            v
        };
        for (i, size) in [1usize, 1000, 200_000].into_iter().enumerate() {
            let name = format!("file-{protocol}-{i}");
            let path = dir.join(&name);
            let content: Vec<u8> = (0..size).map(|j| b'a' + (j % 26) as u8).collect();
            std::fs::write(&path, &content).unwrap();
            let path = path.to_string_lossy().to_string();
            let args = with(&[&path]);
            let mut argv = vec![cp];
            argv.extend(args.iter().map(String::as_str));
            run_ok(ns, &argv);
            let args = with(&[&name]);
            let mut argv = vec![cat];
            argv.extend(args.iter().map(String::as_str));
            let out = run_ok(ns, &argv);
            // memccat ends what it prints with a newline.
            let mut printed = content.clone();
            printed.push(b'\n');
            assert!(
                out.stdout == printed,
                "{protocol}: {cat} {name} gave back other bytes"
            );
            let mut argv = vec![rm];
            argv.extend(args.iter().map(String::as_str));
            run_ok(ns, &argv);
            let mut argv = vec!["timeout", "60", cat];
            argv.extend(args.iter().map(String::as_str));
            let gone = ns.exec(&argv).unwrap();
            assert!(
                !gone.status.success() && gone.stdout.is_empty(),
                "{protocol}: {name} after {rm}"
            );
        }
    }
    if let Some(slap) = tool(&["memcslap", "memslap"]) {
        for flag in [None, Some("--binary")] {
            for test in ["set", "get", "mget"] {
                let mut argv = vec![slap, &servers, "--concurrency=4", "--execute-number=200"];
                let t = format!("--test={test}");
                argv.push(&t);
                argv.extend(flag);
                let out = run_ok(ns, &argv);
                println!("{argv:?}: {}", String::from_utf8_lossy(&out.stdout).trim());
            }
        }
    }
    if let Some(aslap) = tool(&["memcaslap", "memaslap"]) {
        let s = format!("--servers={addr}");
        let out = run_ok(
            ns,
            &[
                aslap,
                &s,
                "--threads=1",
                "--concurrency=4",
                "--execute_number=2000",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{aslap}: {text}");
        assert!(!text.contains("error"), "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// memccapable against `addr` (both protocols, or `-a`/`-b`); panics with
/// its output unless every test passes.
pub fn memccapable(ns: &NetNs, addr: SocketAddrV4, protocol: Option<&str>) {
    let capable = tool(&["memccapable", "memcapable"]).expect("memccapable is installed");
    let (ip, port) = (addr.ip().to_string(), addr.port().to_string());
    let mut argv = vec![capable, "-h", &ip, "-p", &port, "-t", "5"];
    argv.extend(protocol);
    let out = run_ok(ns, &argv);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("FAIL") && text.contains("[pass]") && text.contains("All tests passed"),
        "{argv:?}:\n{text}"
    );
}
