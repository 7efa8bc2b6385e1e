//! What the preload library's test binaries share: paths, skipping (a
//! test that cannot run says so, and fails under `CI=true` as root),
//! building `ginza` and the library once per process, and compiling C
//! programs with the system `cc`.
#![allow(dead_code)] // each test binary uses a part

pub mod syn_flood;
pub mod veth;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Paths, tools and skipping.

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn repo_root() -> PathBuf {
    manifest_dir().join("../..")
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_relative() {
                repo_root().join(p)
            } else {
                p
            }
        })
        .unwrap_or_else(|| repo_root().join("target"))
}

pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

pub use ginza_iokernel::testing::skip;

/// Whether the system C compiler runs; if not, skips.
pub fn have_cc() -> bool {
    static CC: OnceLock<bool> = OnceLock::new();
    let ok = *CC.get_or_init(|| {
        Command::new("cc")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !ok {
        skip("the C test suite needs the system C compiler `cc` (Debian: gcc)");
    }
    ok
}

// ---------------------------------------------------------------------------
// Building.

/// `ginza` and `libginza_preload.so` of this profile.
pub struct Bins {
    pub ginza: PathBuf,
    pub preload: PathBuf,
}

/// Builds both once per process with `$CARGO build`; panics with Cargo's
/// output when that fails.
pub fn bins() -> &'static Bins {
    static BINS: OnceLock<Result<Bins, String>> = OnceLock::new();
    let built = BINS.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let target = target_dir();
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "ginza-cli", "-p", "ginza-preload"])
            .arg("--target-dir")
            .arg(&target)
            .current_dir(repo_root())
            .stdin(Stdio::null());
        if cfg!(not(debug_assertions)) {
            cmd.arg("--release");
        }
        let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`cargo build -p ginza-cli -p ginza-preload` failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let dir = target.join(profile());
        let bins = Bins {
            ginza: dir.join("ginza"),
            preload: dir.join("libginza_preload.so"),
        };
        for p in [&bins.ginza, &bins.preload] {
            if !p.is_file() {
                return Err(format!("the build left no {}", p.display()));
            }
        }
        Ok(bins)
    });
    match built {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    }
}

/// Where the compiled programs go.
pub fn c_out_dir() -> PathBuf {
    target_dir().join("c-suite").join(profile())
}

/// Compiles `source` (a path) into `<target>/c-suite/<profile>/<name>`
/// with `flags` added; the compiler's message on failure. The binary is
/// written under another name and renamed, so test processes that compile
/// at the same time never run a half-written file.
pub fn compile(source: &Path, name: &str, flags: &[&str]) -> Result<PathBuf, String> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = c_out_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let bin = dir.join(name);
    let tmp = dir.join(format!(
        ".{name}.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let out = Command::new("cc")
        .args(["-O2", "-g", "-Wall", "-Werror", "-pthread", "-I"])
        .arg(repo_root().join("include"))
        .args(flags)
        .arg("-o")
        .arg(&tmp)
        .arg(source)
        .output()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "cc {} failed ({}):\n{}",
            source.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::rename(&tmp, &bin).map_err(|e| format!("renaming to {}: {e}", bin.display()))?;
    Ok(bin)
}

// ---------------------------------------------------------------------------
// iokerneld.

/// A `ginza iokernel` on `nic` (`software`, or `af_xdp:IFACE`) with a
/// temporary socket; killed on drop.
pub struct Daemon {
    child: Child,
    /// Holds the socket; removed on drop.
    _dir: tempfile::TempDir,
    pub socket: PathBuf,
}

/// Up to two CPUs this process may use, as `--cores` takes them.
pub fn managed_cores() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(str::trim)
        .unwrap_or("0");
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (Ok(lo), Ok(hi)) = (lo.parse::<usize>(), hi.parse::<usize>()) else {
            continue;
        };
        cpus.extend(lo..=hi);
    }
    cpus.truncate(2);
    if cpus.is_empty() {
        cpus.push(0);
    }
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Daemon {
    pub fn start(ginza: &Path, nic: &str) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("ginza-preload-test-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("iokerneld.sock");
        // `--no-pin` and `--idle-sleep` keep the daemon from taking a CPU
        // of a small machine for itself while nothing runs.
        let child = Command::new(ginza)
            .args(["iokernel", "--nic", nic, "--no-pin"])
            .args(["--idle-sleep", "1ms", "--cores", &managed_cores()])
            .arg("--socket")
            .arg(&socket)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} iokernel: {e}", ginza.display()));
        let mut d = Daemon {
            child,
            _dir: dir,
            socket,
        };
        d.wait_ready(ginza);
        d
    }

    /// Until `ginza top --once` gets an answer on the socket.
    pub fn wait_ready(&mut self, ginza: &Path) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.socket.exists() {
                let ok = Command::new(ginza)
                    .args(["top", "--once", "--socket"])
                    .arg(&self.socket)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    return;
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("ginza iokernel exited with {status}: {err}");
            }
            assert!(
                Instant::now() < deadline,
                "ginza iokernel did not answer on {} within 10 s",
                self.socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Panics with the daemon's stderr if it died during the run.
    pub fn check_alive(&mut self, during: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("ginza iokernel exited with {status} during {during}: {err}");
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
