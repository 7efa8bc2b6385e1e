//! Was the machine quiet during a point? The demo's figures are only a
//! result when nothing else competed for the CPUs it uses (docs/results.md,
//! "ginza demo"): another process on a managed core takes time the
//! applications would have had, and the latency table then measures that
//! process, not the allocator.
//!
//! Read from the kernel's per-CPU counters (`/proc/stat`, in clock ticks)
//! before and after the measured run, over the CPUs the demo uses (the
//! managed cores and iokerneld's): their busy time less this process's own
//! CPU time (`/proc/self/stat`; every thread of the demo — iokerneld, both
//! applications, the sampler — is this process) is time other processes
//! (or the kernel on their behalf) ran there; steal time is what the
//! hypervisor gave to other guests.

use std::collections::BTreeMap;

use serde::Serialize;

/// Above this share of the CPUs' time, foreign or stolen, a point is not
/// quiet. Ticks are 10 ms (USER_HZ 100): over 300 ms on 2 CPUs, one tick is
/// 1.7 %, so small shares are noise.
pub(crate) const NOT_QUIET_PCT: f64 = 10.0;

/// One CPU's counters from `/proc/stat`, in ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuTicks {
    /// user + nice + system + irq + softirq (guest time is within user).
    pub(crate) busy: u64,
    /// idle + iowait.
    pub(crate) idle: u64,
    pub(crate) steal: u64,
}

/// A reading of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Per CPU number.
    pub(crate) cpus: BTreeMap<usize, CpuTicks>,
    /// This process's user + system time, ticks.
    pub(crate) own: u64,
}

/// The per-CPU lines of `/proc/stat` (`cpuN user nice system idle iowait
/// irq softirq steal …`); the total line and malformed lines are skipped.
pub(crate) fn parse_proc_stat(text: &str) -> BTreeMap<usize, CpuTicks> {
    let mut cpus = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(cpu) = f
            .next()
            .and_then(|n| n.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let v: Vec<u64> = f.map_while(|x| x.parse().ok()).collect();
        if v.len() < 4 {
            continue;
        }
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        cpus.insert(
            cpu,
            CpuTicks {
                busy: at(0) + at(1) + at(2) + at(5) + at(6),
                idle: at(3) + at(4),
                steal: at(7),
            },
        );
    }
    cpus
}

/// utime + stime of `/proc/<pid>/stat`, ticks (fields 14 and 15; the
/// command name before them may hold spaces and parentheses).
pub(crate) fn parse_process_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (the state).
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Reads the counters now (`None` where `/proc` cannot be read).
pub(crate) fn snapshot() -> Option<Snapshot> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let own = parse_process_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(Snapshot {
        cpus: parse_proc_stat(&stat),
        own,
    })
}

/// What others did on the demo's CPUs between two snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Quiet {
    /// Busy time on those CPUs not spent by this process, % of their time.
    pub(crate) foreign_cpu_pct: f64,
    /// Steal time on those CPUs, % of their time.
    pub(crate) steal_pct: f64,
}

impl Quiet {
    /// Whether the point's figures can stand as a result.
    pub(crate) fn is_quiet(&self) -> bool {
        self.foreign_cpu_pct <= NOT_QUIET_PCT && self.steal_pct <= NOT_QUIET_PCT
    }

    /// The warning for a point that was not quiet.
    pub(crate) fn warning(&self) -> Option<String> {
        (!self.is_quiet()).then(|| {
            format!(
                "NOT QUIET: other processes ran {:.0} % and the hypervisor stole {:.0} % of the demo's CPUs' time during this point; its latencies measure that competition, not the allocator (rerun on a quiet machine)",
                self.foreign_cpu_pct, self.steal_pct
            )
        })
    }
}

/// Foreign and stolen time on `cpus` between `before` and `after`; `None`
/// when the CPUs' counters did not advance (nothing to judge by).
pub(crate) fn measure(before: &Snapshot, after: &Snapshot, cpus: &[usize]) -> Option<Quiet> {
    let (mut busy, mut total, mut steal) = (0u64, 0u64, 0u64);
    for c in cpus {
        let (Some(a), Some(b)) = (before.cpus.get(c), after.cpus.get(c)) else {
            continue;
        };
        let d = |x: u64, y: u64| y.saturating_sub(x);
        let (db, di, ds) = (d(a.busy, b.busy), d(a.idle, b.idle), d(a.steal, b.steal));
        busy += db;
        steal += ds;
        total += db + di + ds;
    }
    if total == 0 {
        return None;
    }
    let own = after.own.saturating_sub(before.own);
    let pct = |x: u64| 100.0 * x as f64 / total as f64;
    Some(Quiet {
        foreign_cpu_pct: pct(busy.saturating_sub(own)),
        steal_pct: pct(steal),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_BEFORE: &str = "cpu  900 0 300 5000 10 0 5 0 0 0
cpu0 500 0 100 2000 5 0 2 0 0 0
cpu1 400 0 200 3000 5 0 3 0 0 0
intr 12345
ctxt 999
";

    fn stat(cpu0: [u64; 8], cpu1: [u64; 8]) -> String {
        let line = |n: usize, v: [u64; 8]| {
            format!(
                "cpu{n} {} {} {} {} {} {} {} {} 0 0\n",
                v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
            )
        };
        format!(
            "cpu  1 2 3 4 5 6 7 8 0 0\n{}{}intr 1\n",
            line(0, cpu0),
            line(1, cpu1)
        )
    }

    #[test]
    fn proc_stat_and_process_lines_are_read() {
        let cpus = parse_proc_stat(STAT_BEFORE);
        assert_eq!(cpus.len(), 2);
        assert_eq!(
            cpus[&0],
            CpuTicks {
                busy: 602,
                idle: 2005,
                steal: 0
            }
        );
        // Old kernels without steal, garbage lines: read or skipped.
        let odd = parse_proc_stat("cpu7 1 2 3 4\ncpuX 1 2 3 4\ncpu8 1 2\n");
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[&7].busy, 6);
        let me = "4242 (ginza (demo) x) R 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 12";
        assert_eq!(parse_process_ticks(me), Some(200));
        assert_eq!(parse_process_ticks("4242 (x) R 1"), None);
        assert_eq!(parse_process_ticks("garbage"), None);
    }

    #[test]
    fn a_quiet_point_and_one_with_a_competitor() {
        let before = Snapshot {
            cpus: parse_proc_stat(&stat(
                [100, 0, 0, 100, 0, 0, 0, 0],
                [50, 0, 0, 150, 0, 0, 0, 0],
            )),
            own: 1000,
        };
        // 30 ticks on each CPU; both busy all along (iokerneld spins on
        // cpu0, batch soaks cpu1), all of it ours.
        let quiet = Snapshot {
            cpus: parse_proc_stat(&stat(
                [125, 0, 5, 100, 0, 0, 0, 0],
                [70, 0, 10, 150, 0, 0, 0, 0],
            )),
            own: 1060,
        };
        let q = measure(&before, &quiet, &[0, 1]).unwrap();
        assert_eq!((q.foreign_cpu_pct, q.steal_pct), (0.0, 0.0));
        assert!(q.is_quiet() && q.warning().is_none());
        // A CPU hog took half of cpu1: we got 45 ticks of the 60.
        let hog = Snapshot {
            own: 1045,
            ..quiet.clone()
        };
        let q = measure(&before, &hog, &[0, 1]).unwrap();
        assert_eq!(q.foreign_cpu_pct, 25.0);
        assert!(!q.is_quiet());
        assert!(q.warning().unwrap().contains("other processes ran 25 %"));
        // Only the CPUs asked about count: cpu1 alone, 15 of its 30 ticks
        // foreign (our 45 ticks exceed cpu1's busy time: clamped to none).
        let q = measure(&before, &hog, &[1]).unwrap();
        assert_eq!(q.foreign_cpu_pct, 0.0);
        // Steal: the hypervisor took 12 of cpu0's 30 ticks.
        let stolen = Snapshot {
            cpus: parse_proc_stat(&stat(
                [113, 0, 5, 100, 0, 0, 0, 12],
                [70, 0, 10, 150, 0, 0, 0, 0],
            )),
            own: 1048,
        };
        let q = measure(&before, &stolen, &[0, 1]).unwrap();
        assert_eq!((q.foreign_cpu_pct, q.steal_pct), (0.0, 20.0));
        assert!(!q.is_quiet());
        // Idle CPUs (a light point without batch) are quiet too.
        let idle = Snapshot {
            cpus: parse_proc_stat(&stat(
                [130, 0, 0, 100, 0, 0, 0, 0],
                [51, 0, 0, 179, 0, 0, 0, 0],
            )),
            own: 1031,
        };
        assert!(measure(&before, &idle, &[0, 1]).unwrap().is_quiet());
        // Nothing advanced, or CPUs that do not exist: nothing to judge.
        assert_eq!(measure(&before, &before, &[0, 1]), None);
        assert_eq!(measure(&before, &quiet, &[5]), None);
    }
}
