//! Keeps the load generator's CPU from halting while a point runs: a
//! thread pinned there at SCHED_IDLE that spins, so it runs only when
//! nothing else on that CPU wants to.
//!
//! Why: on a VM a wake of a thread whose vCPU has halted waits for the
//! hypervisor to run that vCPU again. On the project's nested 2-vCPU VM
//! an eventfd wake of a thread on an idle vCPU from the other took p50
//! 45–170 µs and up to 16 ms, against 20–31 µs and 0.5–3.3 ms with the
//! vCPU kept busy (`bench/perf/vcpu_wake.c`; docs/results.md, "Session
//! 24"). A generator that sleeps between sends on an idle CPU then misses
//! its schedule by milliseconds and the point is thrown away as
//! generator-saturated, while the same generator beside iokerneld's
//! spinning loop does not: the figures would compare the generator's CPU,
//! not the systems. So Linux's points get a keeper; Ginza's need none
//! (iokerneld's loop keeps that CPU awake, and a keeper there took the
//! turns its idle yields gave away).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context as _;

/// The keeper thread's name (never one the CPU split counts).
const KEEPER_THREAD: &str = "cpu-keeper";

/// A spinning SCHED_IDLE thread on one CPU, stopped when dropped.
pub(crate) struct CpuKeeper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CpuKeeper {
    /// Starts the keeper on `cpu`. An error (and no keeper) if it cannot
    /// be pinned or put at SCHED_IDLE: a spinner at any other policy
    /// would take CPU time from what is measured.
    pub(crate) fn start(cpu: usize) -> anyhow::Result<CpuKeeper> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let spin_until = stop.clone();
        let thread = std::thread::Builder::new()
            .name(KEEPER_THREAD.into())
            .spawn(move || {
                let ready = ginza_sys::affinity::pin_current_thread(cpu)
                    .map_err(|e| anyhow::anyhow!("pinning the CPU keeper to CPU {cpu}: {e}"))
                    .and_then(|()| {
                        ginza_sys::sched_class::set_current_idle().map_err(|e| {
                            anyhow::anyhow!("putting the CPU keeper at SCHED_IDLE: {e}")
                        })
                    });
                let spin = ready.is_ok();
                let _ = ready_tx.send(ready);
                // Spin only at SCHED_IDLE.
                while spin && !spin_until.load(Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .context("starting the CPU keeper thread")?;
        let mut keeper = CpuKeeper {
            stop,
            thread: Some(thread),
        };
        let ready = ready_rx.recv().context("the CPU keeper thread");
        if let Err(e) = ready.and_then(|r| r) {
            keeper.stop_and_join();
            return Err(e);
        }
        Ok(keeper)
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for CpuKeeper {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As root the keeper runs at SCHED_IDLE on the CPU it was given and
    /// stops when dropped; elsewhere it refuses with a reason.
    #[test]
    fn the_keeper_spins_at_sched_idle_on_its_cpu_until_dropped() {
        let keeper = match CpuKeeper::start(0) {
            Ok(k) => k,
            Err(e) => {
                let as_root = rustix::process::geteuid().is_root();
                assert!(!as_root, "as root the keeper must start: {e:#}");
                assert!(format!("{e:#}").contains("SCHED_IDLE"), "{e:#}");
                return;
            }
        };
        let pid = std::process::id();
        let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|t| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm"))
                    .is_ok_and(|c| c.trim() == KEEPER_THREAD)
            })
            .expect("the keeper thread is listed");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
        // Field 41 is the policy (after the comm in parentheses).
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        assert_eq!(fields[41 - 3], "5", "policy SCHED_IDLE (5): {stat}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
        assert!(
            status
                .lines()
                .any(|l| l.starts_with("Cpus_allowed_list:") && l.ends_with("\t0")),
            "pinned to CPU 0: {status}"
        );
        // It spins: its run time grows while this thread waits for it.
        let run_ns = || -> u64 {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while run_ns() < 1_000_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the keeper ran {} ns in 30 s",
                run_ns()
            );
            std::thread::yield_now();
        }
        drop(keeper);
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists(),
            "the keeper thread has exited"
        );
    }
}
