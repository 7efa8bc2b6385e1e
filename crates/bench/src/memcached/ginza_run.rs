//! The third system of `ginza bench memcached`: the same Debian memcached
//! binary as the Linux peer, with the same flags, under `ginza run` (its
//! pthreads are uthreads, its sockets Ginza sockets through the preload
//! library, docs/preload.md), registered with the bench's iokerneld as a
//! latency-critical application with one kthread.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context as _;
use ginza_net::MacAddr;

use super::Started;
use crate::harness::autogroup::spawn_in_own_session;

/// memcached's name at iokerneld.
pub(super) const MEMCACHED: &str = "memcached";

/// What `ginza run` needs: the `ginza` executable and the preload library.
#[derive(Clone, Debug)]
pub struct GinzaRun {
    pub ginza: PathBuf,
    pub library: PathBuf,
}

/// Finds both as `ginza run` does: `ginza` is this executable (the bench
/// is one of its subcommands), the library `$GINZA_PRELOAD`, else
/// `libginza_preload.so` next to it or in `../lib/ginza/`. The error says
/// how to build what is missing.
pub fn locate() -> anyhow::Result<GinzaRun> {
    let exe = std::env::current_exe().context("locating this executable")?;
    anyhow::ensure!(
        exe.file_name().is_some_and(|n| n == "ginza"),
        "memcached under `ginza run` needs the `ginza` executable, and this bench runs in {}",
        exe.display()
    );
    if let Some(p) = std::env::var_os("GINZA_PRELOAD") {
        let library = PathBuf::from(p);
        anyhow::ensure!(
            library.is_file(),
            "GINZA_PRELOAD names {}, which is not a file (build the library with \
             `cargo build --release -p ginza-preload`)",
            library.display()
        );
        return Ok(GinzaRun {
            ginza: exe,
            library,
        });
    }
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join("libginza_preload.so"),
        dir.join("../lib/ginza/libginza_preload.so"),
    ];
    let library = candidates.iter().find(|c| c.is_file()).with_context(|| {
        format!(
            "libginza_preload.so is neither next to {} nor in ../lib/ginza/: build it with \
             `cargo build --release -p ginza-preload` (the profile of this ginza), or set \
             GINZA_PRELOAD",
            exe.display()
        )
    })?;
    Ok(GinzaRun {
        ginza: exe,
        library: library.clone(),
    })
}

/// How a program under `ginza run` is reached: its address, and on the
/// direct path its own socket's `IF:QUEUE`, with the file its network
/// counters go to when it exits (`GINZA_NET_STATS`, read by
/// [`Started::net_stats`](super::Started)).
#[derive(Clone, Copy)]
pub(super) struct Placement<'a> {
    pub(super) mac: MacAddr,
    pub(super) ip: Ipv4Addr,
    pub(super) direct: Option<&'a str>,
    pub(super) net_stats: Option<&'a Path>,
}

/// `ginza run --iokernel=SOCKET --ip IP --mac MAC -- PROGRAM ARGS`, named
/// `name` at iokerneld, with one kthread and no guaranteed core (kv-server's terms
/// under the shenango allocator), its stderr kept for a failure's message;
/// with `direct` (`IF:QUEUE`), on the direct path (`--direct`).
pub(super) fn command(
    run: &GinzaRun,
    socket: &Path,
    at: Placement<'_>,
    name: &str,
    (program, args): (&Path, &[String]),
) -> Command {
    let Placement {
        mac,
        ip,
        direct,
        net_stats,
    } = at;
    let mut cmd = Command::new(&run.ginza);
    cmd.arg("run")
        .arg(format!("--iokernel={}", socket.display()))
        .args(["--ip", &ip.to_string(), "--mac", &mac.to_string()]);
    if let Some(direct) = direct {
        cmd.args(["--direct", direct]);
    }
    cmd.args(["--name", name, "--kthreads", "1", "--guaranteed", "0"])
        .args(["--class", "lc"])
        .arg("--library")
        .arg(&run.library)
        .arg("--")
        .arg(program)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(path) = net_stats {
        cmd.env("GINZA_NET_STATS", path);
    }
    cmd
}

/// The counters a program under `ginza run` wrote at exit
/// (`GINZA_NET_STATS`: one `name value` line each).
pub(super) fn read_net_stats(path: &Path) -> anyhow::Result<BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (the network counters the program under ginza run writes at exit)",
            path.display()
        )
    })?;
    let mut counters = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let parsed = line
            .split_once(' ')
            .and_then(|(name, value)| Some((name.to_string(), value.parse::<u64>().ok()?)));
        let (name, value) = parsed.with_context(|| {
            format!(
                "{} line {}: {line:?} is not `name value`",
                path.display(),
                i + 1
            )
        })?;
        counters.insert(name, value);
    }
    anyhow::ensure!(
        !counters.contains_key("unavailable"),
        "{}: the program's runtime had no network counters at exit",
        path.display()
    );
    Ok(counters)
}

/// Starts `program` under `ginza run` as application `name` placed as
/// `at` says; returns once
/// iokerneld lists it (it listens shortly after: a
/// client's first connection retries a refusal). The address is the one
/// its native peer in the same run has, MAC included: the namespace's
/// neighbour cache then stays right from one point to the next.
pub(super) fn start(
    run: &GinzaRun,
    iokerneld: &ginza_iokernel::InProcess,
    at: Placement<'_>,
    name: &str,
    (program, args): (&Path, &[String]),
) -> anyhow::Result<Started> {
    let mut child = Started(
        spawn_in_own_session(&mut command(
            run,
            iokerneld.socket(),
            at,
            name,
            (program, args),
        ))
        .with_context(|| format!("starting {} run … {name}", run.ginza.display()))?,
    );
    let t0 = std::time::Instant::now();
    while !iokerneld
        .stats()
        .is_ok_and(|s| s.apps.iter().any(|a| a.name == name))
    {
        if let Some(status) = child.0.try_wait()? {
            anyhow::bail!(
                "{name} under ginza run exited ({status}) before it registered: {}",
                child.stderr()
            );
        }
        anyhow::ensure!(
            t0.elapsed() < super::START_TIMEOUT,
            "{name} under ginza run did not register with iokerneld within {:?}",
            super::START_TIMEOUT
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Ok(child)
}
