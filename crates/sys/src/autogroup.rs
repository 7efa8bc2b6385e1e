//! Putting the session's autogroup niceness back when the process is
//! ended by a signal.
//!
//! A bench that sets its autogroup's niceness (`sched_class::set_autogroup_nice`)
//! sets it for its whole session, the shell that started it included, and
//! puts it back when it ends. Ended by Ctrl-C, `timeout` or a closed
//! terminal, it used to leave the shell at that niceness, and everything
//! started from it later ran ahead of the kernel's own threads (a soak test
//! failed that way in session 29). While an [`OnSignal`] lives, SIGINT,
//! SIGTERM and SIGHUP first write the old niceness back, then do what they
//! did before: the handler that was installed runs, or the process ends by
//! the signal as it would have. SIGKILL cannot be caught.
//!
//! The handler only stores bytes prepared in advance to a descriptor opened
//! in advance (`write(2)` is async-signal-safe), so it allocates nothing.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicUsize, Ordering::SeqCst};

/// The signals that put the niceness back.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// `/proc/self/autogroup`, open for writing while a guard lives (-1: none;
/// taken by a compare-and-swap, so one guard at a time).
static FD: AtomicI32 = AtomicI32::new(-1);
/// The niceness to write back, as text.
static TEXT: [AtomicU8; 8] = [const { AtomicU8::new(0) }; 8];
static TEXT_LEN: AtomicUsize = AtomicUsize::new(0);
/// Per signal of [`SIGNALS`], the action it had before (`sa_sigaction`
/// and `sa_flags`), for the handler to hand over to.
static PREVIOUS: [(AtomicUsize, AtomicI32); 3] =
    [const { (AtomicUsize::new(libc::SIG_DFL), AtomicI32::new(0)) }; 3];

/// While it lives, SIGINT, SIGTERM and SIGHUP put the autogroup's niceness
/// back to the value given to [`OnSignal::install`] before they act.
#[derive(Debug)]
pub struct OnSignal {
    _file: OwnedFd,
}

impl OnSignal {
    /// Arms the handlers for `nice`, the niceness to put back. Fails where
    /// `/proc/self/autogroup` cannot be opened for writing (no autogroups),
    /// for a niceness outside -20..=19, or while another guard lives. A
    /// signal the process ignores stays ignored.
    pub fn install(nice: i32) -> io::Result<OnSignal> {
        // Checked before the descriptor is published: a panic after it
        // would leave `FD` naming a closed descriptor.
        if !(-20..=19).contains(&nice) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("niceness {nice} is outside Linux's -20..=19"),
            ));
        }
        let file: OwnedFd = std::fs::OpenOptions::new()
            .write(true)
            .open("/proc/self/autogroup")?
            .into();
        if FD
            .compare_exchange(-1, file.as_raw_fd(), SeqCst, SeqCst)
            .is_err()
        {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the autogroup's niceness is already put back on signals",
            ));
        }
        let text = nice.to_string();
        for (slot, b) in TEXT.iter().zip(text.bytes()) {
            slot.store(b, SeqCst);
        }
        TEXT_LEN.store(text.len(), SeqCst);
        // From here a failure drops the guard, which puts back the actions
        // already replaced, then lets the descriptor close.
        let guard = OnSignal { _file: file };
        for (i, &sig) in SIGNALS.iter().enumerate() {
            let old = query(sig)?;
            if old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            PREVIOUS[i].0.store(old.sa_sigaction, SeqCst);
            PREVIOUS[i].1.store(old.sa_flags, SeqCst);
            // SAFETY: `sigaction` is plain data; all zero is an empty
            // action with an empty mask.
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            set(sig, &sa)?;
        }
        Ok(guard)
    }
}

impl Drop for OnSignal {
    fn drop(&mut self) {
        for (i, &sig) in SIGNALS.iter().enumerate() {
            // Only where the action is still ours: one installed after us
            // (a stop flag's) stays.
            let Ok(now) = query(sig) else { continue };
            if now.sa_sigaction != on_signal as *const () as usize {
                continue;
            }
            // SAFETY: as in `install`.
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            sa.sa_sigaction = PREVIOUS[i].0.load(SeqCst);
            sa.sa_flags = PREVIOUS[i].1.load(SeqCst);
            let _ = set(sig, &sa);
        }
        // Before the descriptor closes with `_file`.
        FD.store(-1, SeqCst);
    }
}

/// The action of `sig` now.
fn query(sig: libc::c_int) -> io::Result<libc::sigaction> {
    // SAFETY: as in `install`.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: no new action; `old` is a valid place for the current one.
    let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

fn set(sig: libc::c_int, sa: &libc::sigaction) -> io::Result<()> {
    // SAFETY: `sa` is a valid action: its handler is SIG_DFL, SIG_IGN, a
    // previous action's (restored as it was), or `on_signal`, whose
    // signature matches `SA_SIGINFO`.
    let r = unsafe { libc::sigaction(sig, sa, std::ptr::null_mut()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let fd = FD.load(SeqCst);
    if fd >= 0 {
        let mut text = [0u8; 8];
        let len = TEXT_LEN.load(SeqCst).min(text.len());
        for (b, slot) in text.iter_mut().zip(&TEXT) {
            *b = slot.load(SeqCst);
        }
        // SAFETY: `write(2)` is async-signal-safe; `text[..len]` is valid
        // for reads. A failure is ignored: there is no one to tell.
        let _ = unsafe { libc::write(fd, text.as_ptr().cast(), len) };
    }
    let Some(i) = SIGNALS.iter().position(|&s| s == sig) else {
        return;
    };
    let previous = PREVIOUS[i].0.load(SeqCst);
    match previous {
        libc::SIG_DFL => {
            // Ended by the signal, as before: its default action restored
            // and the signal raised again (delivered when this returns).
            // SAFETY: `signal` and `raise` are async-signal-safe.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }
        libc::SIG_IGN => {}
        handler if PREVIOUS[i].1.load(SeqCst) & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous action was installed with SA_SIGINFO,
            // so its handler has this signature; it gets this delivery's
            // arguments.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            f(sig, info, ctx);
        }
        handler => {
            // SAFETY: without SA_SIGINFO a handler takes the signal alone.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            f(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched_class::{
        autogroup_nice, autogroup_nice_of, autogroups_enabled, set_autogroup_nice,
    };
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    /// The child of the test below, in a session of its own: starts a
    /// witness that shares its autogroup and outlives it, sets the
    /// session's niceness, arms the guard for the old one, says so with
    /// the witness's pid and waits to be killed.
    fn child() {
        let before = autogroup_nice().expect("a session of its own has an autogroup");
        // This process never returns: it ends by the test's SIGTERM, and
        // the witness, orphaned, is killed by the test and reaped by init.
        #[expect(clippy::zombie_processes)]
        let witness = Command::new("sleep")
            .arg("60")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the witness");
        set_autogroup_nice(before + 1).expect("raising the niceness");
        let _guard = OnSignal::install(before).expect("arming the guard");
        println!("armed {} {before}", witness.id());
        loop {
            std::thread::park();
        }
    }

    #[test]
    fn one_guard_at_a_time_and_its_drop_puts_the_actions_back() {
        if std::fs::metadata("/proc/self/autogroup").is_err() {
            return crate::testing::skip("no /proc/self/autogroup on this kernel");
        }
        // A process in no session (under a runner that is pid 1) has no
        // autogroup's niceness to read; the guard only opens the file.
        let before = autogroup_nice().unwrap_or(0);
        let action = || query(libc::SIGHUP).unwrap().sa_sigaction;
        let original = action();
        let guard = OnSignal::install(before).expect("the first guard");
        assert_eq!(action(), on_signal as *const () as usize);
        let second = OnSignal::install(before).expect_err("a second guard");
        assert_eq!(second.kind(), io::ErrorKind::AlreadyExists, "{second}");
        drop(guard);
        assert_eq!(action(), original, "SIGHUP's action as it was");
        drop(OnSignal::install(before).expect("a guard again once the first is gone"));
    }

    #[test]
    fn a_process_ended_by_sigterm_puts_its_sessions_niceness_back() {
        if std::env::var_os("GINZA_AUTOGROUP_CHILD").is_some() {
            return child();
        }
        if !autogroups_enabled() {
            return crate::testing::skip("autogroups are off (kernel.sched_autogroup_enabled)");
        }
        // The child begins a session of its own, so the test does not
        // depend on (or renice) the session it runs in.
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "autogroup::tests::a_process_ended_by_sigterm_puts_its_sessions_niceness_back",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("GINZA_AUTOGROUP_CHILD", "1")
            .stdout(Stdio::piped());
        crate::task_group::start_own_session(&mut command);
        let mut child = command.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        // libtest may have begun the line ("test NAME ... ").
        while !line.contains("armed ") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the child ended before it armed the guard"
            );
        }
        let mut words = line
            .split_ascii_whitespace()
            .skip_while(|w| *w != "armed")
            .skip(1);
        let witness: u32 = words.next().unwrap().parse().unwrap();
        let before: i32 = words.next().unwrap().parse().unwrap();
        let during = autogroup_nice_of(witness);
        crate::signal::tgkill(child.id() as i32, child.id() as i32, libc::SIGTERM).unwrap();
        let status = child.wait().unwrap();
        let after = autogroup_nice_of(witness);
        crate::signal::tgkill(witness as i32, witness as i32, libc::SIGKILL).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(during, Some(before + 1), "the session's niceness, raised");
        assert_eq!(
            status.signal(),
            Some(libc::SIGTERM),
            "ended by the signal, as before"
        );
        assert_eq!(after, Some(before), "the niceness put back");
    }
}
