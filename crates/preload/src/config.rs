//! What `ginza run` passes to the library, in the environment:
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `GINZA_KTHREADS` | kthreads (cores the program may use at most) | the CPUs it may run on |
//! | `GINZA_IOKERNEL` | register with iokerneld at this socket (empty: its default path) | unset: standalone |
//! | `GINZA_GUARANTEED` | cores iokerneld never takes away | 0 |
//! | `GINZA_CLASS` | `lc` or `batch` | `lc` |
//! | `GINZA_NAME` | the name at iokerneld (`ginza top`) | the program's name (`name-PID` for a program it execs) |
//! | `GINZA_IP`, `GINZA_MAC` | the application's address on iokerneld's switch | none |
//! | `GINZA_DIRECT` | `IF:QUEUE`: the direct path, the program's own AF_XDP socket on receive queue `QUEUE` of iokerneld's interface `IF` (docs/direct-path.md); needs `GINZA_IP` | unset |
//! | `GINZA_PROTECTED` | TCP through the netstack at this socket (empty: its default) | unset |
//! | `GINZA_POLL_WHILE_IDLE` | out of work, one kthread polls this long with no arrival while no other application wants its core (`0`: park at once; docs/idle-poll.md) | `2s` (`lc`), `0` (`batch`) |
//! | `GINZA_TIME_SLICE` | preempt a thread that ran this long while others wait (`0`: never) | `1ms` |
//! | `GINZA_NET_STATS` | a file the program's network counters are written to when it exits (`net_stats_file.rs`) | unset |
//! | `GINZA_STACK_SIZE` | bytes of a thread's stack when its attributes name none | the stack rlimit (8 MiB usually), 2 MiB if unlimited |

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::net::{Interface, Ipv4Addr, MacAddr, NetConfig};
use ginza_runtime::{Class, Config, IokernelConfig};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn number(name: &str) -> Result<Option<usize>, String> {
    var(name)
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .map_err(|e| format!("{name}={v:?}: {e}"))
        })
        .transpose()
}

/// Set in the environment of everything the program runs: a program that
/// starts with it was exec'd by one already on Ginza.
const DESCENDANT: &str = "GINZA_DESCENDANT";

/// The name at iokerneld: `GINZA_NAME`, else the program's file name, cut
/// to the characters and length iokerneld accepts. A program exec'd by one
/// on Ginza inherits the variables but not the name: it registers as
/// `<its file name>-<pid>`, so it never collides with its parent.
fn name(program: &str) -> String {
    let file = std::path::Path::new(program)
        .file_name()
        .map_or_else(|| "program".into(), |n| n.to_string_lossy().into_owned());
    let raw = if var(DESCENDANT).is_some() {
        format!("{file}-{}", std::process::id())
    } else {
        var("GINZA_NAME").unwrap_or(file)
    };
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.:".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if clean.is_empty() {
        "program".into()
    } else {
        clean
    }
}

fn default_stack() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes one rlimit.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) } == 0;
    if ok && lim.rlim_cur != libc::RLIM_INFINITY {
        (lim.rlim_cur as usize).clamp(64 << 10, 64 << 20)
    } else {
        2 << 20
    }
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Variable `name`'s `value` as a duration (`2s`, `500us`, `0`), if set.
fn duration(name: &str, value: Option<String>) -> Result<Option<Duration>, String> {
    value
        .map(|v| ginza_proto::parse_duration(&v).map_err(|e| format!("{name}={v:?}: {e}")))
        .transpose()
}

/// `GINZA_DIRECT`'s `IF:QUEUE`.
fn direct_path(value: &str) -> Result<(&str, u32), String> {
    let bad = |why: &str| format!("GINZA_DIRECT={value:?}: {why} (IF:QUEUE, e.g. eth0:1)");
    let (interface, queue) = value.rsplit_once(':').ok_or_else(|| bad("no ':'"))?;
    if interface.is_empty() {
        return Err(bad("no interface"));
    }
    let queue = queue
        .parse()
        .map_err(|e| bad(&format!("queue {queue:?}: {e}")))?;
    Ok((interface, queue))
}

/// The runtime's configuration for `program`; Err says which variable is
/// wrong and why.
pub(crate) fn from_env(program: &str) -> Result<Config, String> {
    let kthreads = number("GINZA_KTHREADS")?.unwrap_or_else(cpus);
    let name = name(program);
    // SAFETY: before main, on the only thread that runs the program's code.
    unsafe { libc::setenv(c"GINZA_DESCENDANT".as_ptr(), c"1".as_ptr(), 1) };
    let stack_size = number("GINZA_STACK_SIZE")?.unwrap_or_else(default_stack);
    let time_slice = match duration("GINZA_TIME_SLICE", var("GINZA_TIME_SLICE"))? {
        None => Some(Duration::from_millis(1)),
        Some(d) => (!d.is_zero()).then_some(d),
    };
    let mut config = Config {
        stack_size,
        time_slice,
        ..Config::with_kthreads(kthreads)
    };
    let interface = match (var("GINZA_IP"), var("GINZA_MAC")) {
        (Some(ip), mac) => {
            let ip: Ipv4Addr = ip.parse().map_err(|e| format!("GINZA_IP={ip:?}: {e}"))?;
            let mac: MacAddr = mac
                .as_deref()
                .unwrap_or("02:47:5a:00:09:01")
                .parse()
                .map_err(|e| format!("GINZA_MAC: {e}"))?;
            Some(Interface { mac, ip })
        }
        (None, Some(_)) => return Err("GINZA_MAC without GINZA_IP".into()),
        (None, None) => None,
    };
    if let Some(socket) = var("GINZA_IOKERNEL") {
        let class = match var("GINZA_CLASS").as_deref() {
            None | Some("lc") => Class::LatencyCritical,
            Some("batch") => Class::Batch,
            Some(other) => return Err(format!("GINZA_CLASS={other:?}: lc or batch")),
        };
        let mut io = IokernelConfig::new(name.as_str(), class);
        io.socket = (!socket.is_empty()).then(|| PathBuf::from(socket));
        io.guaranteed = number("GINZA_GUARANTEED")?.unwrap_or(0) as u32;
        let poll = duration("GINZA_POLL_WHILE_IDLE", var("GINZA_POLL_WHILE_IDLE"))?;
        io.poll_while_idle = poll.unwrap_or(io.poll_while_idle);
        if var("GINZA_PROTECTED").is_none() {
            io.net = interface.map(|i| NetConfig::new(i.mac, i.ip));
        }
        if let Some(d) = var("GINZA_DIRECT") {
            let (interface, queue) = direct_path(&d)?;
            let net = io.net.take().ok_or_else(|| {
                format!("GINZA_DIRECT={d:?} needs GINZA_IP, and not GINZA_PROTECTED")
            })?;
            io.net = Some(net.with_direct_path(interface, queue));
        }
        config.iokernel = Some(io);
    }
    if config.iokernel.is_none() && var("GINZA_DIRECT").is_some() {
        return Err(
            "GINZA_DIRECT needs GINZA_IOKERNEL: the direct path is on iokerneld's interface".into(),
        );
    }
    let in_process = config
        .iokernel
        .as_ref()
        .and_then(|io| io.net.as_ref())
        .is_some();
    if let Some(path) = var("GINZA_PROTECTED") {
        let socket = if path.is_empty() {
            ginza_proto::netstack::default_netstack_socket()
        } else {
            PathBuf::from(path)
        };
        let interface =
            interface.ok_or("GINZA_PROTECTED needs GINZA_IP (the application's address)")?;
        config.protected = Some(ProtectedConfig::new(socket, &name, interface));
    }
    if let Some(i) = interface.filter(|_| in_process || config.protected.is_some()) {
        let _ = NETWORK.set(Network {
            ip: i.ip,
            udp: in_process,
        });
    }
    Ok(config)
}

/// The program's address on Ginza, when its runtime has a network: its
/// AF_INET sockets on that address (or on 0.0.0.0) are Ginza's
/// (`socket.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Network {
    pub(crate) ip: std::net::Ipv4Addr,
    /// UDP too (the in-process stack); the protected netstack serves TCP only.
    pub(crate) udp: bool,
}

static NETWORK: OnceLock<Network> = OnceLock::new();

pub(crate) fn network() -> Option<Network> {
    NETWORK.get().copied()
}

#[cfg(test)]
mod tests {
    use super::{direct_path, duration};
    use std::time::Duration;

    #[test]
    fn a_duration_variable_is_read_or_refused_by_name() {
        let d = |v: &str| duration("GINZA_POLL_WHILE_IDLE", Some(v.into()));
        assert_eq!(d("2s"), Ok(Some(Duration::from_secs(2))));
        assert_eq!(d("0"), Ok(Some(Duration::ZERO)));
        assert_eq!(duration("GINZA_POLL_WHILE_IDLE", None), Ok(None));
        let e = d("soon").unwrap_err();
        assert!(e.starts_with("GINZA_POLL_WHILE_IDLE=\"soon\""), "{e}");
    }

    #[test]
    fn the_direct_path_is_an_interface_and_a_queue() {
        assert_eq!(direct_path("eth0:1"), Ok(("eth0", 1)));
        assert_eq!(direct_path("veth-a:b:3"), Ok(("veth-a:b", 3)));
        for bad in ["eth0", ":1", "eth0:", "eth0:x", "eth0:-1"] {
            let e = direct_path(bad).unwrap_err();
            assert!(
                e.contains("GINZA_DIRECT") && e.contains("IF:QUEUE"),
                "{bad}: {e}"
            );
        }
    }
}
