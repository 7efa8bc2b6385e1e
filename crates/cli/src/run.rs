//! `ginza run [OPTIONS] -- PROGRAM [ARGS…]`: runs an unmodified, dynamically
//! linked program as a Ginza application (docs/preload.md). It checks the
//! program, puts the preload library in `LD_PRELOAD` and the options in
//! `GINZA_*` variables, and execs the program: its exit status and the
//! signals sent to it are the program's own.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Kthreads: the most cores the program uses at once [default: the CPUs it may run on].
    #[arg(long)]
    kthreads: Option<usize>,
    /// Cores iokerneld never takes away (with --iokernel).
    #[arg(long)]
    guaranteed: Option<u32>,
    /// Out of work, one kthread keeps its core and polls this long with no
    /// arrival while no other application wants it; 0: park at once
    /// (docs/idle-poll.md) [default: 2s for class lc, 0 for batch].
    #[arg(long, value_name = "DURATION")]
    poll_while_idle: Option<String>,
    /// The program's class at iokerneld.
    #[arg(long, value_parser = ["lc", "batch"])]
    class: Option<String>,
    /// Register with iokerneld at this socket [default path when given no
    /// value]; without it the program runs standalone on --kthreads cores.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, require_equals = true)]
    iokernel: Option<Option<PathBuf>>,
    /// The application's IPv4 address on iokerneld's switch.
    #[arg(long)]
    ip: Option<String>,
    /// The application's MAC address on iokerneld's switch.
    #[arg(long)]
    mac: Option<String>,
    /// The direct path (docs/direct-path.md): the program's own AF_XDP
    /// socket on receive queue QUEUE of iokerneld's interface IF (iokerneld
    /// opened with `nic = "af_xdp:IF,direct"`), e.g. `eth0:1`; with --ip.
    #[arg(long, value_name = "IF:QUEUE")]
    direct: Option<String>,
    /// Protected mode: TCP through the netstack at this socket [default path].
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true)]
    protected: Option<Option<PathBuf>>,
    /// The name at iokerneld and in `ginza top` [default: the program's name].
    #[arg(long)]
    name: Option<String>,
    /// The preload library [default: $GINZA_PRELOAD, else libginza_preload.so next to this executable].
    #[arg(long)]
    library: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<OsString>,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let program = resolve(&args.program[0])?;
    check_dynamic(&program)?;
    let library = match &args.library {
        Some(p) => p.clone(),
        None => find_library()?,
    };
    let library = library
        .canonicalize()
        .with_context(|| format!("the preload library {}", library.display()))?;
    let mut cmd = std::process::Command::new(&args.program[0]);
    cmd.args(&args.program[1..]);
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = library.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => library.into_os_string(),
    };
    cmd.env("LD_PRELOAD", preload);
    let mut set = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            cmd.env(name, v);
        }
    };
    set("GINZA_KTHREADS", args.kthreads.map(|k| k.to_string()));
    set("GINZA_GUARANTEED", args.guaranteed.map(|g| g.to_string()));
    set("GINZA_CLASS", args.class.clone());
    set("GINZA_POLL_WHILE_IDLE", args.poll_while_idle.clone());
    set("GINZA_IP", args.ip.clone());
    set("GINZA_MAC", args.mac.clone());
    set("GINZA_DIRECT", args.direct.clone());
    set("GINZA_NAME", args.name.clone());
    let path_or_empty = |p: &Option<PathBuf>| {
        p.as_ref()
            .map_or(String::new(), |p| p.display().to_string())
    };
    set("GINZA_IOKERNEL", args.iokernel.as_ref().map(path_or_empty));
    set(
        "GINZA_PROTECTED",
        args.protected.as_ref().map(path_or_empty),
    );
    let err = cmd.exec();
    bail!("cannot start {}: {err}", program.display())
}

/// The file `program` names: a path, or a name looked up in PATH.
fn resolve(program: &OsString) -> anyhow::Result<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
        .with_context(|| format!("{}: not found in PATH", p.display()))
}

/// Refuses what LD_PRELOAD cannot enter: a statically linked executable
/// has no dynamic loader to load the library (no PT_INTERP header).
fn check_dynamic(program: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(program).with_context(|| format!("reading {}", program.display()))?;
    if bytes.get(..4) == Some(b"#!".as_slice()) || bytes.get(..2) == Some(b"#!".as_slice()) {
        // A script: its interpreter is what runs, and is checked by exec.
        return Ok(());
    }
    if bytes.get(..4) != Some(b"\x7fELF".as_slice()) {
        bail!("{}: not an ELF executable", program.display());
    }
    if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        bail!(
            "{}: not a 64-bit little-endian ELF (x86-64 only)",
            program.display()
        );
    }
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        bail!("{}: truncated ELF header", program.display());
    };
    const PT_INTERP: u32 = 3;
    let has_interp = (0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            == Some(PT_INTERP)
    });
    if !has_interp {
        bail!(
            "{} is statically linked: it loads no shared libraries, so the preload library \
             (LD_PRELOAD) cannot run its threads on Ginza; link it dynamically",
            program.display()
        );
    }
    Ok(())
}

/// `$GINZA_PRELOAD`, else `libginza_preload.so` next to this executable
/// (a cargo build puts both in target/<profile>/), or in ../lib/ginza/.
fn find_library() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("GINZA_PRELOAD") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the ginza executable")?;
    let dir = exe
        .parent()
        .context("the ginza executable has no directory")?;
    let candidates = [
        dir.join("libginza_preload.so"),
        dir.join("../lib/ginza/libginza_preload.so"),
    ];
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .with_context(|| {
            format!(
            "libginza_preload.so not found next to {} (build it: cargo build -p ginza-preload, \
             same profile) nor in ../lib/ginza/; or set GINZA_PRELOAD",
            exe.display()
        )
        })
}
