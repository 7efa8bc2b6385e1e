//! The C columns: `bench/c/threadops.c`, compiled with the system `cc` into a
//! temporary directory when the bench starts, then run two ways from the same
//! binary:
//!
//! * `c-glibc`: plainly, so its pthread calls are glibc's;
//! * `c-ginza`: under `ginza run --kthreads K` (K = [`GINZA_KTHREADS`], what
//!   the native Ginza column uses), so the preload library turns its pthreads
//!   into uthreads and serves the same calls.
//!
//! Both get the benchmark CPU as their mask before exec (`peer.rs`); for
//! `c-ginza` it is `ginza run` that gets it, and the program it execs keeps
//! it. The difference `c-ginza` − `ginza` is what the C ABI (interposition,
//! pthread objects mapped onto runtime ones) adds to the native Rust API.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context as _;

use super::{peer, Medians, Params, GINZA_KTHREADS};

const SOURCE: &str = "threadops.c";

/// The compiled program; its temporary directory goes when this is dropped.
pub(super) struct Program {
    dir: PathBuf,
    bin: PathBuf,
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Compiles the C program (`cc -O2 -pthread`); `None` (after a message) when
/// there is no `cc`, no source, or the compile fails, so the bench runs on
/// without the C columns, as it does without `go`.
pub(super) fn compile() -> Option<Program> {
    let source = match source() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("threadops: c: {e:#}: skipping the C columns");
            return None;
        }
    };
    // The process id keeps concurrent benches (tests run in parallel) apart.
    let dir = std::env::temp_dir().join(format!("ginza-threadops-c-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "threadops: c: cannot create {} ({e}): skipping the C columns",
            dir.display()
        );
        return None;
    }
    let program = Program {
        bin: dir.join("threadops-c"),
        dir,
    };
    let status = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&program.bin)
        .arg(&source)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status();
    match status {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("cc not found: skipping the C columns (c-glibc, c-ginza)");
            None
        }
        Err(e) => {
            eprintln!("threadops: c: cannot run `cc` ({e}): skipping the C columns");
            None
        }
        Ok(s) if !s.success() => {
            eprintln!(
                "threadops: c: `cc -O2 -pthread {}` failed ({s}): skipping the C columns",
                source.display()
            );
            None
        }
        Ok(_) => Some(program),
    }
}

/// `c-glibc`: the program alone.
pub(super) fn measure_glibc(p: Params, program: &Program) -> anyhow::Result<Medians> {
    let mut cmd = Command::new(&program.bin);
    cmd.args(args(p));
    peer::run(cmd, p.core, "the C program")
}

/// `c-ginza`: the same binary under `ginza run`, `ginza` being this
/// executable; `ginza run` finds the preload library next to it (or in
/// `$GINZA_PRELOAD`) and says so when it cannot.
pub(super) fn measure_ginza(p: Params, program: &Program) -> anyhow::Result<Medians> {
    let ginza = ginza_binary()?;
    let mut cmd = Command::new(&ginza);
    cmd.args(["run", "--kthreads", &GINZA_KTHREADS.to_string(), "--"])
        .arg(&program.bin)
        .args(args(p));
    peer::run(cmd, p.core, "the C program under `ginza run`")
}

fn args(p: Params) -> [String; 4] {
    [
        "-iters".into(),
        p.iters.to_string(),
        "-samples".into(),
        p.samples.to_string(),
    ]
}

/// This executable when it is `ginza` (the bench is a subcommand of it); a
/// test binary cannot stand in for `ginza run`.
fn ginza_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    anyhow::ensure!(
        exe.file_name().is_some_and(|n| n == "ginza"),
        "c-ginza needs `ginza run`, and this bench runs in {} rather than in `ginza`",
        exe.display()
    );
    Ok(exe)
}

/// `bench/c/threadops.c` of this repository: next to the crate it was built
/// from, else relative to the current directory.
fn source() -> anyhow::Result<PathBuf> {
    let from_crate = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/c");
    let from_cwd = PathBuf::from("bench/c");
    for dir in [&from_crate, &from_cwd] {
        let file = dir.join(SOURCE);
        if file.is_file() {
            return Ok(file.canonicalize().unwrap_or(file));
        }
    }
    anyhow::bail!(
        "cannot find the C program {SOURCE}: looked in {} and {} \
         (run from the root of the Ginza repository)",
        from_crate.display(),
        from_cwd.display()
    )
}
