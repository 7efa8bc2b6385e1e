//! The Go peer: `bench/peers/threadops.go`, built with `go build` when `go` is
//! on PATH and cached next to the ginza binary, run with GOMAXPROCS=1 and its
//! CPU mask set to the benchmark CPU.
//!
//! The mask is set before exec (`peer.rs`), so every OS thread the Go runtime
//! later starts inherits it. The Go program does not
//! call `runtime.LockOSThread` by default: a locked goroutine hands its P to
//! another OS thread whenever it blocks or yields, so every switch becomes an
//! OS-thread switch (measured here at ~3 µs per yield instead of ~80 ns), which
//! would not measure goroutines (`-lockosthread` shows that effect).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use anyhow::Context as _;

use super::{peer, Medians, Params};

const SOURCE: &str = "threadops.go";

/// One run of the Go peer built by [`build`].
pub(super) fn measure(p: Params, bin: &Path) -> anyhow::Result<Medians> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "-iters",
        &p.iters.to_string(),
        "-samples",
        &p.samples.to_string(),
    ])
    .env("GOMAXPROCS", "1");
    peer::run(cmd, p.core, "the Go peer")
}

/// Builds the Go peer unless a binary newer than its sources exists; `None`
/// (after a message) when there is no `go` or the build fails.
pub(super) fn build() -> anyhow::Result<Option<PathBuf>> {
    let dir = peers_dir()?;
    let bin = binary_path();
    if is_fresh(&bin, &[dir.join(SOURCE), dir.join("go.mod")]) {
        return Ok(Some(bin));
    }
    if let Some(parent) = bin.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    eprintln!("threadops: go: building {}", bin.display());
    let status = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg(".")
        .current_dir(&dir)
        // Never fetch another toolchain: the program needs only the standard library.
        .env("GOTOOLCHAIN", "local")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status();
    match status {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("go not found: skipping Go peer");
            Ok(None)
        }
        Err(e) => {
            eprintln!("threadops: go: cannot run `go build` ({e}): skipping Go peer");
            Ok(None)
        }
        Ok(s) if !s.success() => {
            eprintln!(
                "threadops: go: `go build` in {} failed ({s}): skipping Go peer",
                dir.display()
            );
            Ok(None)
        }
        Ok(_) => Ok(Some(bin)),
    }
}

/// `bench/peers` of this repository: next to the crate it was built from, else
/// relative to the current directory.
fn peers_dir() -> anyhow::Result<PathBuf> {
    let from_crate = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers");
    let from_cwd = PathBuf::from("bench/peers");
    for dir in [&from_crate, &from_cwd] {
        if dir.join(SOURCE).is_file() {
            return Ok(dir.canonicalize().unwrap_or_else(|_| dir.clone()));
        }
    }
    anyhow::bail!(
        "cannot find the Go peer's source {SOURCE}: looked in {} and {} \
         (run from the root of the Ginza repository)",
        from_crate.display(),
        from_cwd.display()
    )
}

/// `<target dir>/peers/threadops-go`, the target dir being the one above the
/// running binary's profile dir (`target/release/ginza` → `target/peers/`).
fn binary_path() -> PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf))
        .unwrap_or_else(std::env::temp_dir);
    target.join("peers").join("threadops-go")
}

fn is_fresh(bin: &Path, sources: &[PathBuf]) -> bool {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = mtime(bin) else {
        return false;
    };
    sources
        .iter()
        .all(|s| mtime(s).unwrap_or(SystemTime::UNIX_EPOCH) <= built)
}
