//! How much CPU Linux gave a thread, and how long it kept it waiting: the
//! kernel's per-thread scheduler statistics (`/proc/self/task/<tid>/schedstat`
//! and the context-switch counts of `.../status`).
//!
//! A spinning thread (a dispatcher, a worker) that another program shares
//! a CPU with runs only part of the wall time; these say how much, so a
//! benchmark can tell the runtime's delays from the machine's.

use std::io;

/// A thread's scheduler counters since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time it ran on a CPU, ns.
    pub on_cpu_ns: u64,
    /// Time it was runnable but waited on a run queue for a CPU, ns.
    pub runnable_waiting_ns: u64,
    /// Times Linux took the CPU from it while it could still run.
    pub involuntary_switches: u64,
}

impl SchedStat {
    /// Counters of thread `tid` of this process.
    pub fn of_thread(tid: i32) -> io::Result<SchedStat> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))?;
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))?;
        parse(&stat, &status)
    }

    /// Counters of the calling thread.
    pub fn of_current() -> io::Result<SchedStat> {
        SchedStat::of_thread(crate::process::gettid())
    }

    /// What happened between `earlier` and `self` (counters of one thread).
    pub fn since(&self, earlier: &SchedStat) -> SchedStat {
        SchedStat {
            on_cpu_ns: self.on_cpu_ns.saturating_sub(earlier.on_cpu_ns),
            runnable_waiting_ns: self
                .runnable_waiting_ns
                .saturating_sub(earlier.runnable_waiting_ns),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(earlier.involuntary_switches),
        }
    }
}

/// Times Linux took the CPU from the calling thread while it could still
/// run (`getrusage(RUSAGE_THREAD)`'s `ru_nivcsw`): one system call.
pub fn involuntary_switches_of_current() -> io::Result<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `usage` is valid for writes of a `rusage`, which the call
    // fills in whole when it returns 0.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call succeeded, so it initialised `usage`.
    let usage = unsafe { usage.assume_init() };
    Ok(usage.ru_nivcsw as u64)
}

/// How long the calling thread has waited, runnable, on a run queue for
/// its CPU since it started, ns (`/proc/thread-self/schedstat`'s second
/// field): time another task of this machine held the CPU it could have
/// run on. A vCPU the hypervisor took is not in it (the thread counts as
/// running then). Read into a buffer on the stack: no allocation, so a
/// scheduler may ask it between its turns.
pub fn runnable_waiting_ns_of_current() -> io::Result<u64> {
    use rustix::fs::{Mode, OFlags};
    let file = rustix::fs::open(
        "/proc/thread-self/schedstat",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut text = [0u8; 96];
    let mut len = 0;
    while len < text.len() {
        match rustix::io::read(&file, &mut text[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            // A signal (a preemption's) is no error of the file's.
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let text = std::str::from_utf8(&text[..len]).map_err(|_| bad("schedstat"))?;
    parse_schedstat(text).map(|(_, runnable_waiting_ns)| runnable_waiting_ns)
}

/// The counters of this process's threads whose name starts with
/// `prefix` (`/proc/self/task/*/comm`), by thread id; a thread that ends
/// while they are read is left out.
pub fn threads_named(prefix: &str) -> io::Result<Vec<(i32, SchedStat)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let named = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .is_ok_and(|name| name.trim_end().starts_with(prefix));
        if !named {
            continue;
        }
        match SchedStat::of_thread(tid) {
            Ok(s) => found.push((tid, s)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("unexpected {what}"))
}

/// `schedstat` is `on_cpu_ns waiting_ns timeslices`; `status` has a line
/// `nonvoluntary_ctxt_switches:\tN`.
fn parse(schedstat: &str, status: &str) -> io::Result<SchedStat> {
    let (on_cpu_ns, runnable_waiting_ns) = parse_schedstat(schedstat)?;
    let involuntary_switches = status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| bad("status (no nonvoluntary_ctxt_switches)"))?;
    Ok(SchedStat {
        on_cpu_ns,
        runnable_waiting_ns,
        involuntary_switches,
    })
}

/// `schedstat`'s first two fields: ns on a CPU, ns waiting for one.
fn parse_schedstat(schedstat: &str) -> io::Result<(u64, u64)> {
    let mut fields = schedstat.split_ascii_whitespace().map(str::parse::<u64>);
    match (fields.next(), fields.next()) {
        (Some(Ok(on_cpu_ns)), Some(Ok(runnable_waiting_ns))) => {
            Ok((on_cpu_ns, runnable_waiting_ns))
        }
        _ => Err(bad("schedstat")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_shares_its_cpu_with_a_busy_one_is_switched_out_and_waits() {
        let cpu = crate::affinity::allowed_cpus().expect("allowed CPUs")[0];
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let rival = std::thread::spawn(move || {
            crate::affinity::pin_current_thread(cpu).expect("pinning the rival");
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        crate::affinity::pin_current_thread(cpu).expect("pinning the test thread");
        let switches = involuntary_switches_of_current().unwrap();
        let waited = runnable_waiting_ns_of_current().unwrap();
        let t0 = std::time::Instant::now();
        let (mut s1, mut w1) = (switches, waited);
        // A millisecond of waiting: more than a wake's, less than a time
        // slice of the rival's.
        while (s1 == switches || w1 < waited + 1_000_000)
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            s1 = involuntary_switches_of_current().unwrap();
            w1 = runnable_waiting_ns_of_current().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        rival.join().unwrap();
        assert!(
            s1 > switches,
            "no involuntary switch in 10 s beside a busy thread"
        );
        assert!(
            w1 >= waited + 1_000_000,
            "waited {} ns in 10 s beside a busy thread",
            w1 - waited
        );
        // The same counter as the whole record's.
        let whole = SchedStat::of_current().unwrap();
        assert!(whole.runnable_waiting_ns >= w1, "{whole:?}, {w1}");
    }

    #[test]
    fn parses_the_kernels_text() {
        let s = parse(
            "107991 6454339 2\n",
            "Name:\tx\nvoluntary_ctxt_switches:\t3\nnonvoluntary_ctxt_switches:\t7\n",
        )
        .unwrap();
        assert_eq!(
            s,
            SchedStat {
                on_cpu_ns: 107_991,
                runnable_waiting_ns: 6_454_339,
                involuntary_switches: 7
            }
        );
        assert!(parse("x y z", "nonvoluntary_ctxt_switches:\t1").is_err());
        assert!(parse("1 2 3", "voluntary_ctxt_switches:\t1").is_err());
    }

    #[test]
    fn threads_are_found_by_their_name() {
        let (named, stop) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let t = std::thread::Builder::new()
            .name("sched-stat-probe".into())
            .spawn(move || {
                named.0.send(crate::process::gettid()).unwrap();
                let _ = stop.1.recv();
            })
            .unwrap();
        let tid = named.1.recv().unwrap();
        // Looks again until the thread shows: once in a CI run the list
        // came back empty, other tests' threads of this binary coming and
        // going (a directory read of /proc/self/task can pass over a
        // thread then; the cause was not established).
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            let found: Vec<i32> = threads_named("sched-stat-pro")
                .unwrap()
                .iter()
                .map(|(t, _)| *t)
                .collect();
            if !found.is_empty() || std::time::Instant::now() > give_up {
                break found;
            }
            std::thread::yield_now();
        };
        assert_eq!(found, vec![tid]);
        assert!(threads_named("no-thread-is-named-so").unwrap().is_empty());
        stop.0.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_spinning_thread_accumulates_cpu_time() {
        let before = SchedStat::of_current().unwrap();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let d = SchedStat::of_current().unwrap().since(&before);
        // Ran or waited for most of the 20 ms (a loaded machine may keep
        // it waiting, but the two add up to the wall time it spun, less
        // the part of a tick the kernel has not accounted yet).
        assert!(d.on_cpu_ns + d.runnable_waiting_ns >= 10_000_000, "{d:?}");
        assert!(d.on_cpu_ns > 0, "{d:?}");
    }
}
