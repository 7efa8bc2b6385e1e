//! The C test suite: every program in `tests/c/*.c` compiled with the
//! system `cc` and run three ways:
//!
//! * `plain`: on Linux alone, which checks the C test itself;
//! * `standalone`: `ginza run --kthreads 2 -- PROGRAM`;
//! * `iokernel`: the same under a `ginza iokernel` of its own (software
//!   NIC, a temporary socket), with `--iokernel=SOCKET`.
//!
//! A program exits 0 and prints `ok NAME` when all its checks hold; else
//! it prints `FAIL file:line: ...` on stderr and exits non-zero. Tests are
//! named `PROGRAM::MODE`, e.g. `cargo test -p ginza-preload --test c_suite
//! -- sleep_accuracy::standalone`.
//!
//! The binaries are compiled into `<target>/c-suite/` (kept, so a failing
//! one can be rerun by hand), and `ginza` and `libginza_preload.so` are
//! built once per test process with `$CARGO build`. Every run holds one
//! lock: iokerneld spins on a core, the timing checks need the CPUs, and
//! the machine may have only two. A run is killed after 60 s.
//!
//! Without `cc` the tests say so and pass, except under `CI=true` as root,
//! where a test that cannot run fails (the project's rule).

mod common;

use common::*;
use std::io::Read;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long one program may run.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Held by every run (see the module docs).
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a program is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Standalone,
    Iokernel,
}

/// What one program needs besides being run.
#[derive(Clone, Copy)]
struct Spec {
    name: &'static str,
    args: &'static [&'static str],
    /// Printed on stdout by a run that got to its end.
    marker: &'static str,
    /// Once the program prints `READY`, send it SIGTERM.
    sigterm_when_ready: bool,
}

/// A program with no needs: named by `suite!`, run without arguments,
/// `ok NAME` as its marker.
const BASE: Spec = Spec {
    name: "",
    args: &[],
    marker: "",
    sigterm_when_ready: false,
};

fn c_dir() -> PathBuf {
    manifest_dir().join("tests/c")
}

/// The program of `tests/c/<name>.c`, compiled once per process.
fn program(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let bin =
        compile(&c_dir().join(format!("{name}.c")), name, &[]).unwrap_or_else(|e| panic!("{e}"));
    built.push((name.to_string(), bin.clone()));
    bin
}

/// A small program from source text (for the tests of `ginza run` itself).
fn program_from_source(name: &str, source: &str, flags: &[&str]) -> Result<PathBuf, String> {
    let dir = c_out_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let src = dir.join(format!("{name}.{}.c", std::process::id()));
    std::fs::write(&src, source).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let bin = compile(&src, name, flags);
    let _ = std::fs::remove_file(&src);
    bin
}

// ---------------------------------------------------------------------------
// iokerneld.

// ---------------------------------------------------------------------------
// Running.

/// What a finished run gave.
struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Outcome {
    fn describe(&self, what: &str) -> String {
        format!(
            "{what}: {} after {:.2} s\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            self.took.as_secs_f64(),
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }

    /// Lines the preload library printed about calls it does not serve.
    fn unsupported_calls(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("ginza:"))
            .collect()
    }
}

/// Sends `sig` to process `pid`.
fn send_signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) takes plain integers; `pid` is our own child, not yet
    // reaped (the caller still holds its Child), so it names no other process.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Kills `child` and every process of its group (it leads one: see
/// `process_group(0)` where it is started), so a stuck grandchild cannot
/// keep the output pipes open; then reaps it.
fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) takes plain integers; the group is led by our
        // child, not yet reaped, so it names no one else's processes.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads a pipe to its end into a buffer shared with the caller.
fn collect(
    mut from: impl Read + Send + 'static,
) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = Arc::clone(&buf);
    let h = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match from.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
    });
    (buf, h)
}

/// What a run left: its status (`None`: killed after [`TIMEOUT`]), the
/// bytes it wrote to stdout and stderr, and how long it took.
struct Raw {
    status: Option<ExitStatus>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    took: Duration,
}

/// Runs `cmd` in a process group of its own with stdout and stderr
/// captured, calling `tick(pid, stdout so far)` while it runs; kills the
/// group after [`TIMEOUT`].
fn run_raw(mut cmd: Command, what: &str, mut tick: impl FnMut(u32, &[u8])) -> Raw {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let (out, out_h) = collect(child.stdout.take().unwrap());
    let (err, err_h) = collect(child.stderr.take().unwrap());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        tick(child.id(), &out.lock().unwrap());
        if start.elapsed() > TIMEOUT {
            kill_group(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = start.elapsed();
    // A grandchild that keeps the pipes open (it should not) would block
    // these joins: they are bounded by the same kill.
    let _ = out_h.join();
    let _ = err_h.join();
    let take = |b: &Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *b.lock().unwrap());
    Raw {
        status,
        stdout: take(&out),
        stderr: take(&err),
        took,
    }
}

/// Runs `cmd` to its end with stdout and stderr captured, killing it after
/// [`TIMEOUT`] (then panics with what it printed). With `sigterm_when_ready`
/// it gets SIGTERM once its stdout holds a line `READY`.
fn run_captured(cmd: Command, what: &str, sigterm_when_ready: bool) -> Outcome {
    let mut signalled = false;
    let raw = run_raw(cmd, what, |pid, out| {
        if sigterm_when_ready
            && !signalled
            && String::from_utf8_lossy(out).lines().any(|l| l == "READY")
        {
            send_signal(pid, libc::SIGTERM);
            signalled = true;
        }
    });
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (stdout, stderr) = (text(&raw.stdout), text(&raw.stderr));
    let Some(status) = raw.status else {
        panic!(
            "{what}: killed after {} s without finishing\n--- stdout ---\n{}\n--- stderr ---\n{}",
            TIMEOUT.as_secs(),
            stdout.trim_end(),
            stderr.trim_end()
        );
    };
    if sigterm_when_ready {
        assert!(
            signalled || !status.success(),
            "{what}: exited before printing READY\n{stdout}\n{stderr}"
        );
    }
    Outcome {
        status,
        stdout,
        stderr,
        took: raw.took,
    }
}

/// `ginza run --kthreads 2 [--iokernel=SOCKET --name NAME] -- PROGRAM ARGS`.
fn ginza_run(bins: &Bins, iokernel: Option<&Path>, name: &str, program: &Path) -> Command {
    let mut cmd = Command::new(&bins.ginza);
    cmd.args(["run", "--kthreads", "2"]);
    if let Some(socket) = iokernel {
        cmd.arg(format!("--iokernel={}", socket.display()));
        cmd.args(["--name", name]);
    }
    cmd.arg("--").arg(program);
    cmd.env("GINZA_EXPECT_RUNTIME", "1")
        .env("RUST_BACKTRACE", "1");
    if iokernel.is_some() {
        cmd.env("GINZA_EXPECT_IOKERNEL", "1");
    }
    cmd
}

/// Runs one program of the suite in one mode and checks its outcome.
fn run_suite_program(spec: Spec, mode: Mode) {
    if !have_cc() {
        return;
    }
    let bin = program(spec.name);
    let _g = lock();
    let what = format!("{} ({mode:?})", spec.name);
    let (outcome, daemon) = match mode {
        Mode::Plain => {
            let mut cmd = Command::new(&bin);
            cmd.args(spec.args);
            // Make sure nothing of Ginza is loaded by accident.
            cmd.env_remove("LD_PRELOAD")
                .env_remove("GINZA_EXPECT_RUNTIME");
            (run_captured(cmd, &what, spec.sigterm_when_ready), None)
        }
        Mode::Standalone => {
            let mut cmd = ginza_run(bins(), None, spec.name, &bin);
            cmd.args(spec.args);
            (run_captured(cmd, &what, spec.sigterm_when_ready), None)
        }
        Mode::Iokernel => {
            let bins = bins();
            let mut d = Daemon::start(&bins.ginza, "software");
            let name = format!("c-{}", spec.name);
            let mut cmd = ginza_run(bins, Some(&d.socket), &name, &bin);
            cmd.args(spec.args);
            let o = run_captured(cmd, &what, spec.sigterm_when_ready);
            d.check_alive(&what);
            (o, Some(d))
        }
    };
    drop(daemon);
    let report = outcome.describe(&what);
    assert!(outcome.status.success(), "{report}");
    let marker = if spec.marker.is_empty() {
        format!("ok {}", spec.name)
    } else {
        spec.marker.to_string()
    };
    assert!(
        outcome.stdout.contains(&marker),
        "{what} exited 0 without printing {marker:?}: {report}"
    );
    let unsupported = outcome.unsupported_calls();
    if !unsupported.is_empty() {
        eprintln!("{what}: the library reported {unsupported:#?}");
    }
    println!(
        "{what}: ok in {:.2} s\n{}",
        outcome.took.as_secs_f64(),
        outcome.stderr.trim_end()
    );
}

// ---------------------------------------------------------------------------
// The suite.

macro_rules! suite {
    ($($name:ident => $spec:expr;)*) => {
        /// Every program of the suite, as listed here.
        const SUITE: &[&str] = &[$(stringify!($name)),*];
        $(
            mod $name {
                use super::*;
                fn spec() -> Spec {
                    Spec { name: stringify!($name), ..$spec }
                }
                #[test]
                fn plain() {
                    run_suite_program(spec(), Mode::Plain);
                }
                #[test]
                fn standalone() {
                    run_suite_program(spec(), Mode::Standalone);
                }
                #[test]
                fn iokernel() {
                    run_suite_program(spec(), Mode::Iokernel);
                }
            }
        )*
    };
}

suite! {
    thread_storm => BASE;
    thread_detach => BASE;
    thread_once_key => BASE;
    thread_stack => BASE;
    mutex_kinds => BASE;
    mutex_contended => BASE;
    cond_prodcons => BASE;
    cond_timedwait => BASE;
    cond_broadcast => BASE;
    rwlock => BASE;
    barrier => BASE;
    dl_lock => BASE;
    spinlock => BASE;
    sem => BASE;
    tls_errno => BASE;
    preempt_spin => BASE;
    preempt_libc => BASE;
    malloc_storm => BASE;
    malloc_own => BASE;
    sleep_accuracy => BASE;
    fork_child => BASE;
    fork_exec => Spec { marker: "ok fork_exec (after exec)", ..BASE };
    sigterm => Spec { args: &["external"], sigterm_when_ready: true, ..BASE };
    signal_thread => BASE;
    pipe_read => BASE;
    pipe_burst => BASE;
    glibc_thread => BASE;
    ginza_api => BASE;
    fault_handler => BASE;
    altstack => BASE;
}

/// A new `tests/c/*.c` is not forgotten: every one is in [`SUITE`].
#[test]
fn every_c_program_is_in_the_suite() {
    let mut on_disk: Vec<String> = std::fs::read_dir(c_dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".c").map(str::to_string)
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = SUITE.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "tests/c/*.c and the suite! list differ");
}

// ---------------------------------------------------------------------------
// `ginza run` itself.

/// `ginza run` refuses a statically linked program (LD_PRELOAD could not
/// reach it) and says why.
#[test]
fn a_statically_linked_program_is_refused() {
    if !have_cc() {
        return;
    }
    let src = "int main(void) { return 0; }\n";
    let bin = match program_from_source("static_prog", src, &["-static"]) {
        Ok(b) => b,
        Err(e) => {
            // glibc's static libraries come with libc6-dev, which `cc`
            // needs anyway: under CI this is a failure.
            skip(format!("cannot link a static program here: {e}"));
            return;
        }
    };
    let bins = bins();
    let _g = lock();
    let mut cmd = Command::new(&bins.ginza);
    cmd.args(["run", "--kthreads", "2", "--"]).arg(&bin);
    let o = run_captured(cmd, "ginza run on a static program", false);
    let report = o.describe("ginza run on a static program");
    assert!(!o.status.success(), "it ran: {report}");
    assert!(
        o.stderr.contains("statically linked"),
        "the refusal does not say \"statically linked\": {report}"
    );
}

/// The program's exit status is `ginza run`'s.
#[test]
fn the_exit_status_passes_through() {
    if !have_cc() {
        return;
    }
    let src = "#include <pthread.h>\n\
               static void *f(void *a) { return a; }\n\
               int main(void) {\n\
               \tpthread_t t; void *r;\n\
               \tpthread_create(&t, 0, f, (void *)42);\n\
               \tpthread_join(t, &r);\n\
               \treturn (int)(long)r;\n\
               }\n";
    let bin = program_from_source("exit42", src, &[]).unwrap_or_else(|e| panic!("{e}"));
    let bins = bins();
    let _g = lock();
    let mut cmd = Command::new(&bins.ginza);
    cmd.args(["run", "--kthreads", "2", "--"]).arg(&bin);
    let o = run_captured(cmd, "ginza run on a program exiting 42", false);
    assert_eq!(
        o.status.code(),
        Some(42),
        "{}",
        o.describe("ginza run on a program exiting 42")
    );
}

/// `GINZA_NET_STATS` names a file the library writes the program's network
/// counters to when it exits (its return from `main` or `exit`), and only
/// then; a program with no network (standalone here) says so in it. The
/// counts themselves are checked where a program has a network:
/// `ginza bench memcached`'s memcached-ginza-direct
/// (crates/cli/tests/bench_memcached.rs).
#[test]
fn the_network_counters_are_written_at_exit() {
    if !have_cc() {
        return;
    }
    let src = "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
               int main(int argc, char **argv) {\n\
               \tconst char *path = argv[1];\n\
               \tif (access(path, F_OK) == 0) { fprintf(stderr, \"written before exit\\n\"); return 9; }\n\
               \tif (argc > 2) exit(5);\n\
               \treturn 4;\n\
               }\n";
    let bin = program_from_source("net_stats_at_exit", src, &[]).unwrap_or_else(|e| panic!("{e}"));
    let bins = bins();
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    for (how, extra, code) in [
        ("returns from main", None, 4),
        ("calls exit", Some("exit"), 5),
    ] {
        let path = dir.path().join(format!("stats-{code}"));
        let mut cmd = Command::new(&bins.ginza);
        cmd.args(["run", "--kthreads", "1", "--"])
            .arg(&bin)
            .arg(&path)
            .args(extra)
            .env("GINZA_NET_STATS", &path);
        let what = format!("ginza run on a program that {how}, GINZA_NET_STATS set");
        let o = run_captured(cmd, &what, false);
        assert_eq!(o.status.code(), Some(code), "{}", o.describe(&what));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{what}: no {}: {e}", path.display()));
        assert_eq!(text, "unavailable 1\n", "{what}");
    }
    // Unset: nothing written.
    let path = dir.path().join("unset");
    let mut cmd = Command::new(&bins.ginza);
    cmd.args(["run", "--kthreads", "1", "--"])
        .arg(&bin)
        .arg(&path);
    let o = run_captured(cmd, "ginza run without GINZA_NET_STATS", false);
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        o.describe("without GINZA_NET_STATS")
    );
    assert!(!path.exists());
}

/// A program killed by a signal: `ginza run`'s status shows that signal,
/// both for a SIGKILL it sends itself and for a SIGTERM from outside that
/// it does not handle.
#[test]
fn a_fatal_signal_passes_through() {
    if !have_cc() {
        return;
    }
    let src = "#include <signal.h>\n#include <stdio.h>\n#include <unistd.h>\n\
               #include <string.h>\n\
               int main(int argc, char **argv) {\n\
               \tif (argc > 1 && strcmp(argv[1], \"wait\") == 0) {\n\
               \t\tprintf(\"READY\\n\"); fflush(stdout);\n\
               \t\tfor (int i = 0; i < 3000; i++) usleep(10000);\n\
               \t\treturn 3;\n\
               \t}\n\
               \tkill(getpid(), SIGKILL);\n\
               \treturn 2;\n\
               }\n";
    let bin = program_from_source("killed", src, &[]).unwrap_or_else(|e| panic!("{e}"));
    let bins = bins();
    let _g = lock();
    let mut cmd = Command::new(&bins.ginza);
    cmd.args(["run", "--kthreads", "2", "--"]).arg(&bin);
    let what = "ginza run on a program that SIGKILLs itself";
    run_dying_of(cmd, what, libc::SIGKILL, false);
    let mut cmd = Command::new(&bins.ginza);
    cmd.args(["run", "--kthreads", "2", "--"])
        .arg(&bin)
        .arg("wait");
    run_dying_of(
        cmd,
        "ginza run on a program sent SIGTERM",
        libc::SIGTERM,
        true,
    );
}

/// A run meant to crash leaves no core file behind, whatever the shell's
/// limit.
fn no_core_dump(cmd: &mut Command) {
    // SAFETY: setrlimit is async-signal-safe, as a pre_exec hook must be.
    unsafe {
        cmd.pre_exec(|| {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::setrlimit(libc::RLIMIT_CORE, &none) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Runs `cmd` as [`run_captured`] does and checks that it died of `sig`.
fn run_dying_of(cmd: Command, what: &str, sig: libc::c_int, sigterm_when_ready: bool) -> Outcome {
    let o = run_captured(cmd, what, sigterm_when_ready);
    assert_eq!(o.status.signal(), Some(sig), "{}", o.describe(what));
    o
}

/// A program with a SIGSEGV handler of its own (no alternate stack)
/// whose thread overflows its stack: on Linux the handler cannot run and
/// the kernel kills the process with SIGSEGV, saying nothing; under
/// `ginza run` the runtime's check, kept in front of the program's
/// handler, names the overflow and aborts. A stack size alone is not
/// reported as stack memory the library does not use.
#[test]
fn a_stack_overflow_is_named_though_the_program_handles_sigsegv() {
    if !have_cc() {
        return;
    }
    let bin = program("fault_handler");
    let bins = bins();
    let _g = lock();
    let mut cmd = Command::new(&bin);
    cmd.arg("overflow");
    no_core_dump(&mut cmd);
    run_dying_of(cmd, "fault_handler overflow on Linux", libc::SIGSEGV, false);
    let mut cmd = Command::new(&bins.ginza);
    cmd.args(["run", "--kthreads", "2", "--"])
        .arg(&bin)
        .arg("overflow");
    no_core_dump(&mut cmd);
    let what = "fault_handler overflow under ginza run";
    let o = run_dying_of(cmd, what, libc::SIGABRT, false);
    assert!(
        o.stderr
            .contains("ginza: uthread stack overflow on kthread"),
        "{}",
        o.describe(what)
    );
    assert!(
        !o.stderr.contains("the program's handler ran")
            && !o.stderr.contains("pthread_attr_setstack"),
        "{}",
        o.describe(what)
    );
}

/// The threads of process `pid` named `ginza-k<N>` (its kthreads).
fn kthreads_of(pid: u32) -> Vec<libc::pid_t> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| {
            let task = task.ok()?;
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            comm.trim_end()
                .strip_prefix("ginza-k")?
                .parse::<u32>()
                .ok()?;
            task.file_name().to_str()?.parse().ok()
        })
        .collect()
}

/// Sends the runtime's preemption signal (SIGURG) to every kthread of
/// `pid` without pause until `stop` or the process is gone; how many.
fn flood_kthreads(pid: u32, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let tgid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    let mut sent = 0;
    while !stop.load(Relaxed) {
        // Looked for again and again: the kthreads start after the exec.
        let tids = kthreads_of(pid);
        for _ in 0..1000 {
            for &tid in &tids {
                // SAFETY: tgkill takes plain integers; the kernel checks that
                // `tid` is a thread of `tgid`, our child not yet reaped.
                if unsafe { libc::syscall(libc::SYS_tgkill, tgid, tid, libc::SIGURG) } == 0 {
                    sent += 1;
                }
            }
        }
        if tids.is_empty() {
            std::thread::yield_now();
        }
    }
    sent
}

/// Runs the suite's program `name` `runs` times under `ginza run
/// --kthreads 2` while preemption signals go to its kthreads without
/// pause, far faster than iokerneld or the time slicer would send them;
/// each run must get to its end and exit 0.
fn run_under_a_flood(name: &str, runs: usize) {
    if !have_cc() {
        return;
    }
    let (bins, bin) = (bins(), program(name));
    for run in 0..runs {
        let what = format!("{name} under a flood of SIGURG, run {run}");
        let _g = lock();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut flood = None;
        let raw = run_raw(ginza_run(bins, None, name, &bin), &what, |pid, _| {
            if flood.is_none() {
                let stop = stop.clone();
                flood = Some(std::thread::spawn(move || flood_kthreads(pid, &stop)));
            }
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent = flood.map_or(0, |f| f.join().expect("the flooding thread"));
        eprintln!("{what}: {sent} signals in {:.2} s", raw.took.as_secs_f64());
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let (stdout, stderr) = (text(&raw.stdout), text(&raw.stderr));
        let status = raw.status.map_or_else(
            || format!("killed after {} s", TIMEOUT.as_secs()),
            |s| s.to_string(),
        );
        assert!(
            raw.status.is_some_and(|s| s.success()) && stdout.contains(&format!("ok {name}")),
            "{what}: {status} ({sent} signals sent)\n--- stdout ---\n{}\n--- stderr ---\n{}",
            stdout.trim_end(),
            stderr.trim_end()
        );
    }
}

/// Spinning threads that must be preempted (`preempt_spin`), ten runs
/// under the flood. The faults such a flood found (release and debug
/// builds): a handler nested in another (`SA_NODEFER`) killed the program
/// (SIGSEGV, about one run in three;
/// `contexts_stay_intact_under_a_flood_of_preemption_signals` in the
/// runtime's tests catches it every time); a uthread preempted inside
/// `dlsym` (the first call of an interposed function's glibc definition)
/// left the dynamic linker's lock held by a kthread's tid, so that `exit`
/// waited for it for good (about one run in twenty); and a uthread
/// preempted between finding a thread-local and reading it
/// (`runtime/src/thread_word.rs`) read the other kthread's context and
/// raised its deferral count from the wrong thread (runs hung, about one
/// in 150).
#[test]
fn spinning_threads_run_to_their_end_under_a_flood_of_preemption_signals() {
    run_under_a_flood("preempt_spin", 10);
}

/// Threads waiting on one another through condvars (`cond_prodcons`),
/// twenty runs under the flood. Before the thread-local read became one
/// instruction (`runtime/src/thread_word.rs`), about one run in 140
/// panicked with a deferral count lowered twice (`deferral::enable`,
/// subtract with overflow): the count of a context of the other kthread,
/// raised from this one.
#[test]
fn condvar_waiters_run_to_their_end_under_a_flood_of_preemption_signals() {
    run_under_a_flood("cond_prodcons", 20);
}

/// 20 MB that compress, but not trivially: words of a small vocabulary in
/// an order from a fixed-seed generator, with some random bytes.
fn compressible_data(len: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "ginza ",
        "uthread ",
        "kthread ",
        "core ",
        "grant ",
        "revoke ",
        "park ",
        "steal ",
        "iokerneld ",
        "preempt ",
        "yield ",
        "mutex ",
        "condvar ",
        "barrier ",
        "\n",
        "batch ",
    ];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        let r = next();
        if r % 16 == 0 {
            out.extend_from_slice(&r.to_le_bytes()[..4]);
        } else {
            out.extend_from_slice(WORDS[(r >> 8) as usize % WORDS.len()].as_bytes());
        }
    }
    out.truncate(len);
    out
}

/// A temporary directory with 20 MB of compressible input for xz, or None
/// (said) when xz is not installed.
fn xz_input() -> Option<(tempfile::TempDir, PathBuf)> {
    let xz_ok = Command::new("xz")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !xz_ok {
        skip("this test needs Debian's xz (package xz-utils)");
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("ginza-c-suite-xz-")
        .tempdir()
        .unwrap();
    let input = dir.path().join("input");
    std::fs::write(&input, compressible_data(20 << 20)).unwrap();
    Some((dir, input))
}

/// Debian's xz, unmodified, compresses with 4 threads under `ginza run`
/// and writes the same bytes as without it. The block size is set so the
/// 20 MB split into blocks that the 4 threads really share (one default
/// block would be larger than the input).
#[test]
fn xz_with_four_threads_gives_the_same_bytes() {
    let Some((_dir, input)) = xz_input() else {
        return;
    };
    let xz_args = ["-T4", "-3", "--block-size=2MiB", "-c", "-k"];
    let bins = bins();
    let _g = lock();

    let mut plain = Command::new("xz");
    plain.args(xz_args).arg(&input);
    let plain = run_bytes(plain, "xz -T4 alone");

    let mut under = Command::new(&bins.ginza);
    under
        .args(["run", "--kthreads", "2", "--", "xz"])
        .args(xz_args)
        .arg(&input);
    let under = run_bytes(under, "xz -T4 under ginza run");
    assert!(
        plain.len() > 1000 && plain.len() < 20 << 20,
        "xz's output is {} bytes",
        plain.len()
    );
    assert!(
        under == plain,
        "xz under ginza run wrote {} bytes, differing from xz alone ({} bytes) \
         from byte {}",
        under.len(),
        plain.len(),
        under
            .iter()
            .zip(&plain)
            .position(|(a, b)| a != b)
            .unwrap_or(under.len().min(plain.len()))
    );
}

/// Runs `cmd` (killed after [`TIMEOUT`]) and returns its stdout bytes;
/// panics with its stderr unless it succeeded.
fn run_bytes(cmd: Command, what: &str) -> Vec<u8> {
    let raw = run_raw(cmd, what, |_, _| {});
    let stderr = String::from_utf8_lossy(&raw.stderr);
    match raw.status {
        None => panic!("{what}: killed after {} s: {stderr}", TIMEOUT.as_secs()),
        Some(s) if !s.success() => panic!("{what}: {s}: {stderr}"),
        Some(_) => {
            println!("{what}: {:.2} s", raw.took.as_secs_f64());
            raw.stdout
        }
    }
}

/// Starts `cmd`, sends it SIGTERM after `after`, and returns how it ended
/// (`None`: it had finished before the signal) and how long that took
/// after the signal; killed after [`TIMEOUT`].
fn sigterm_after(mut cmd: Command, after: Duration, what: &str) -> Option<(ExitStatus, Duration)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let (err, err_h) = collect(child.stderr.take().unwrap());
    std::thread::sleep(after);
    if child.try_wait().unwrap().is_some() {
        let _ = child.wait();
        return None;
    }
    send_signal(child.id(), libc::SIGTERM);
    let sent = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if sent.elapsed() > TIMEOUT {
            kill_group(&mut child);
            let _ = err_h.join();
            panic!(
                "{what}: still running {} s after SIGTERM (killed): {}",
                TIMEOUT.as_secs(),
                String::from_utf8_lossy(&err.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = sent.elapsed();
    let _ = err_h.join();
    Some((status, took))
}

/// A SIGTERM sent to xz in the middle of a 4-thread compression under
/// `ginza run` reaches xz's own handler, and xz stops as it does alone:
/// promptly, dying of the signal it re-raises.
#[test]
fn xz_stops_on_sigterm_mid_compression() {
    let Some((_dir, input)) = xz_input() else {
        return;
    };
    // -6 takes seconds for 20 MB here: still busy when the signal comes.
    let xz_args = ["-T4", "-6", "--block-size=1MiB", "-c"];
    let bins = bins();
    let _g = lock();
    let after = Duration::from_millis(500);

    let mut plain = Command::new("xz");
    plain.args(xz_args).arg(&input);
    let Some((status, took)) = sigterm_after(plain, after, "xz alone") else {
        println!("skipped: xz finished within {after:?}, before the signal");
        return;
    };
    println!(
        "xz alone: {status} {:.3} s after SIGTERM",
        took.as_secs_f64()
    );
    let plain_signal = status.signal();

    let mut under = Command::new(&bins.ginza);
    under
        .args(["run", "--kthreads", "2", "--", "xz"])
        .args(xz_args)
        .arg(&input);
    let (status, took) = sigterm_after(under, after, "xz under ginza run")
        .expect("xz under ginza run finished before the signal, though xz alone did not");
    println!(
        "xz under ginza run: {status} {:.3} s after SIGTERM",
        took.as_secs_f64()
    );
    assert_eq!(
        status.signal(),
        plain_signal,
        "xz under ginza run ended with {status}, alone it died of signal {plain_signal:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "xz under ginza run took {:.3} s to stop after SIGTERM",
        took.as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// Beside batch under iokerneld.

/// `batch` of this profile (crates/apps), built once per process.
fn batch_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "ginza-apps", "--bin", "batch"])
                .arg("--target-dir")
                .arg(target_dir())
                .current_dir(repo_root())
                .stdin(Stdio::null());
            if cfg!(not(debug_assertions)) {
                cmd.arg("--release");
            }
            let out = cmd.output().expect("cannot run cargo");
            assert!(
                out.status.success(),
                "building batch failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            target_dir().join(profile()).join("batch")
        })
        .clone()
}

/// `batch --iokernel` for `secs` seconds at `socket`: the child, to wait for.
fn start_batch(socket: &Path, secs: u32) -> Child {
    Command::new(batch_bin())
        .args(["--kthreads", "2", "--iokernel", "--run-for"])
        .arg(format!("{secs}s"))
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start batch")
}

/// Paths per second from batch's report (`N paths in T s (R paths/s); …`).
fn batch_rate(child: Child) -> f64 {
    let out = child.wait_with_output().expect("batch");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "batch: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| {
            let (_, rest) = l.split_once('(')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no rate in batch's output: {text}"))
}

/// A JSON number field of work_sleep's one line.
fn field(json: &str, name: &str) -> f64 {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {json}"))
        + key.len();
    json[at..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} is not a number in {json}"))
}

/// Issue 30's check under iokerneld: a C program whose threads alternate
/// 1 ms of work and 4 ms of sleep gives its cores back at each sleep (its
/// kthreads park), and batch, registered beside it, gets them meanwhile.
/// Batch runs at the kernel's lowest priority, so any other load on the
/// machine (a build) takes its CPU: its rate beside the program is
/// compared with the lower of its rates alone just before and just after.
#[test]
fn a_c_program_that_sleeps_gives_its_cores_to_batch() {
    if !have_cc() {
        return;
    }
    let _guard = lock();
    let bins = bins();
    let source = repo_root().join("bench/c/work_sleep.c");
    let work_sleep = compile(&source, "work_sleep", &[]).unwrap_or_else(|e| panic!("{e}"));
    let mut daemon = Daemon::start(&bins.ginza, "software");
    let alone_before = batch_rate(start_batch(&daemon.socket, 2));
    let batch = start_batch(&daemon.socket, 3);
    let rounds = 300;
    let mut cmd = ginza_run(bins, Some(&daemon.socket), "c-work-sleep", &work_sleep);
    cmd.args(["2", &rounds.to_string(), "1000", "4000"]);
    let run = run_captured(cmd, "work_sleep under iokerneld beside batch", false);
    assert!(run.status.success(), "{}", run.describe("work_sleep"));
    let beside = batch_rate(batch);
    let alone_after = batch_rate(start_batch(&daemon.socket, 2));
    daemon.check_alive("work_sleep beside batch");
    let alone = alone_before.min(alone_after);
    let json = run.stdout.trim();
    let parks = field(json, "parks");
    let grants = field(json, "grants");
    println!(
        "work_sleep: {json}; batch alone {alone_before:.0} and {alone_after:.0} paths/s, \
         beside {beside:.0} ({:.2} of the lower)",
        beside / alone
    );
    assert!(
        parks >= f64::from(rounds) / 2.0,
        "the C program's kthreads parked {parks} times in {rounds} sleeps: they kept their cores ({json})"
    );
    assert!(
        grants >= parks / 2.0,
        "iokerneld gave the cores back {grants} times for {parks} parks ({json})"
    );
    assert!(
        beside >= 0.25 * alone,
        "batch got {beside:.0} paths/s beside the sleeping C program, {alone_before:.0} and \
         {alone_after:.0} alone: it did not get the spare cores"
    );
}

/// The names of iokerneld's registered applications, as `ginza top
/// --once --json` prints them, and that answer.
fn registered(ginza: &Path, socket: &Path) -> (Vec<String>, String) {
    let out = Command::new(ginza)
        .args(["top", "--once", "--json", "--socket"])
        .arg(socket)
        .stdin(Stdio::null())
        .output()
        .expect("ginza top");
    assert!(
        out.status.success(),
        "ginza top: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let json: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or(""))
        .unwrap_or_else(|e| panic!("ginza top --json: {e}: {text}"));
    let names = json["stats"]["apps"]
        .as_array()
        .unwrap_or_else(|| panic!("no stats.apps in {text}"))
        .iter()
        .filter_map(|a| a["name"].as_str().map(str::to_owned))
        .collect();
    (names, text)
}

/// Waits up to 10 s until `name` is (`present`) or is no longer
/// registered; the last answer.
fn wait_registered(ginza: &Path, socket: &Path, name: &str, present: bool) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (names, text) = registered(ginza, socket);
        let there = names.iter().any(|n| n == name);
        if there == present || Instant::now() > deadline {
            return (there, text);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Under iokerneld a program appears in `ginza top` by its own name, and a
/// SIGKILL of it returns its cores: iokerneld drops it, and batch beside
/// it runs to its end.
#[test]
fn a_c_program_shows_by_its_name_and_a_sigkill_returns_its_cores() {
    if !have_cc() {
        return;
    }
    let _guard = lock();
    let bins = bins();
    let source = repo_root().join("bench/c/work_sleep.c");
    let work_sleep = compile(&source, "work_sleep", &[]).unwrap_or_else(|e| panic!("{e}"));
    let mut daemon = Daemon::start(&bins.ginza, "software");
    let batch = start_batch(&daemon.socket, 4);
    // No --name: the program's file name.
    let mut victim = Command::new(&bins.ginza)
        .args(["run", "--kthreads", "2"])
        .arg(format!("--iokernel={}", daemon.socket.display()))
        .arg("--")
        .arg(&work_sleep)
        .args(["2", "100000", "1000", "1000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ginza run work_sleep");
    let (there, top) = wait_registered(&bins.ginza, &daemon.socket, "work_sleep", true);
    assert!(there, "ginza top does not show work_sleep: {top}");
    victim.kill().expect("SIGKILL");
    let _ = victim.wait();
    let (there, top) = wait_registered(&bins.ginza, &daemon.socket, "work_sleep", false);
    assert!(!there, "iokerneld still lists the killed program: {top}");
    let rate = batch_rate(batch);
    assert!(
        rate > 0.0,
        "batch made no progress beside the killed program"
    );
    daemon.check_alive("the SIGKILL of a program under ginza run");
}
