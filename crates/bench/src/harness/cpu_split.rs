//! CPU time per component of a benchmark (iokerneld's loop, the server's
//! threads, batch, the generator), from the kernel's own accounting of
//! each thread: the first field of `/proc/PID/task/TID/schedstat`, the
//! nanoseconds the thread has run. Over a measured part, divided by the
//! requests answered in it, it says where a request's CPU goes, for Ginza
//! and Linux alike. Interrupt and softirq work is charged to whatever
//! thread the CPU was running (the veth's receive runs inside the sender's
//! `sendto`), so it is inside these figures, not beside them; the per-CPU
//! softirq and idle time of `/proc/stat` is read too, for the two CPUs,
//! but it is the whole machine's on that CPU. Idle time is what no thread
//! used: on a VM, spans in which the vCPU halted.

use std::collections::BTreeMap;

/// Which threads make a component.
#[derive(Clone, Debug)]
pub(crate) enum Select {
    /// The threads of process `pid` named `name` (a trailing `*`: whose
    /// name starts with what precedes it; `"*"`: all of them), as they are
    /// at the first reading.
    Named { pid: i32, name: &'static str },
    /// These threads of this process.
    Tids(Vec<i32>),
}

/// Components, resolved to threads at the first reading.
#[derive(Debug)]
pub(crate) struct Meter {
    components: Vec<(String, Select)>,
    resolved: Option<Vec<Vec<(i32, i32)>>>,
    cpus: Vec<usize>,
}

/// One reading: ns run per component, and the softirq and idle ns of
/// each CPU.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reading {
    run_ns: Vec<u64>,
    softirq_ns: Vec<u64>,
    idle_ns: Vec<u64>,
}

impl Meter {
    /// `cpus`: the CPUs whose softirq time is read too.
    pub(crate) fn new(cpus: &[usize]) -> Meter {
        Meter {
            components: Vec::new(),
            resolved: None,
            cpus: cpus.to_vec(),
        }
    }

    pub(crate) fn add(&mut self, name: &str, select: Select) {
        self.components.push((name.to_string(), select));
    }

    /// Reads every component's threads (resolving them the first time).
    pub(crate) fn read(&mut self) -> Reading {
        let comps = &self.components;
        let resolved = self
            .resolved
            .get_or_insert_with(|| comps.iter().map(|(_, s)| threads(s)).collect());
        Reading {
            run_ns: resolved
                .iter()
                .map(|ts| ts.iter().filter_map(|&(p, t)| run_ns(p, t)).sum())
                .collect(),
            softirq_ns: cpu_stat_ns(&self.cpus, CpuStat::Softirq),
            idle_ns: cpu_stat_ns(&self.cpus, CpuStat::Idle),
        }
    }

    /// Per component, µs of CPU per request between two readings
    /// (`requests` answered in between); then each CPU's softirq and idle
    /// µs per request. [`Meter::threads`] says how many threads each had.
    pub(crate) fn per_request(
        &self,
        from: &Reading,
        to: &Reading,
        requests: f64,
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        if requests <= 0.0 {
            return out;
        }
        for (i, (name, _)) in self.components.iter().enumerate() {
            let (Some(a), Some(b)) = (from.run_ns.get(i), to.run_ns.get(i)) else {
                continue;
            };
            out.insert(name.clone(), b.saturating_sub(*a) as f64 / 1e3 / requests);
        }
        for (i, cpu) in self.cpus.iter().enumerate() {
            for (what, from, to) in [
                ("softirq", &from.softirq_ns, &to.softirq_ns),
                ("idle", &from.idle_ns, &to.idle_ns),
            ] {
                if let (Some(a), Some(b)) = (from.get(i), to.get(i)) {
                    out.insert(
                        format!("{what} on CPU {cpu}, whole machine"),
                        b.saturating_sub(*a) as f64 / 1e3 / requests,
                    );
                }
            }
        }
        out
    }
}

impl Meter {
    /// How many threads each component was resolved to (none before the
    /// first reading).
    pub(crate) fn threads(&self) -> BTreeMap<String, usize> {
        let counts = self.resolved.as_deref().unwrap_or_default();
        self.components
            .iter()
            .zip(counts)
            .map(|((name, _), ts)| (name.clone(), ts.len()))
            .collect()
    }
}

fn threads(s: &Select) -> Vec<(i32, i32)> {
    match s {
        Select::Tids(tids) => {
            let me = std::process::id() as i32;
            tids.iter().map(|&t| (me, t)).collect()
        }
        Select::Named { pid, name } => {
            let matches = |comm: &str| match name.strip_suffix('*') {
                Some(prefix) => comm.starts_with(prefix),
                None => comm == *name,
            };
            let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return Vec::new();
            };
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .filter(|tid| {
                    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                        .is_ok_and(|c| matches(c.trim_end()))
                })
                .map(|tid| (*pid, tid))
                .collect()
        }
    }
}

/// The ns thread `tid` of `pid` has run (None once it is gone).
fn run_ns(pid: i32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// A column of a CPU's line in `/proc/stat`.
#[derive(Clone, Copy)]
enum CpuStat {
    Idle,
    Softirq,
}

/// Column `what` of each CPU in `cpus`, ns (`/proc/stat` counts ticks of
/// USER_HZ, 100 a second on Linux: 10 ms each).
fn cpu_stat_ns(cpus: &[usize], what: CpuStat) -> Vec<u64> {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return Vec::new();
    };
    // cpuN user nice system idle iowait irq softirq ...
    let column = match what {
        CpuStat::Idle => 4,
        CpuStat::Softirq => 7,
    };
    cpus.iter()
        .filter_map(|cpu| {
            let line = stat
                .lines()
                .find(|l| l.split_whitespace().next() == Some(&format!("cpu{cpu}")))?;
            let ticks: u64 = line.split_whitespace().nth(column)?.parse().ok()?;
            Some(ticks * 10_000_000)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn my_tid() -> i32 {
        ginza_sys::process::gettid()
    }

    #[test]
    fn a_spinning_thread_is_charged_its_cpu_and_an_idle_one_nothing() {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let spinner = std::thread::spawn(move || {
            tx.send(my_tid()).unwrap();
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let spin_tid = rx.recv().unwrap();
        let (itx, irx) = std::sync::mpsc::channel::<()>();
        let (ttx, trx) = std::sync::mpsc::channel();
        let idle = std::thread::spawn(move || {
            ttx.send(my_tid()).unwrap();
            let _ = irx.recv();
        });
        let idle_tid = trx.recv().unwrap();
        let mut m = Meter::new(&[0]);
        m.add("spinner", Select::Tids(vec![spin_tid]));
        m.add("idle", Select::Tids(vec![idle_tid]));
        let a = m.read();
        // Until the spinner has run 20 ms of CPU (a deadline, no sleep as
        // the measure).
        let t0 = std::time::Instant::now();
        let b = loop {
            let b = m.read();
            if b.run_ns[0] - a.run_ns[0] >= 20_000_000 {
                break b;
            }
            assert!(
                t0.elapsed().as_secs() < 30,
                "the spinner never got 20 ms of CPU"
            );
            std::thread::yield_now();
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(itx);
        spinner.join().unwrap();
        idle.join().unwrap();
        let split = m.per_request(&a, &b, 1000.0);
        let spin = split["spinner"];
        assert!(
            spin >= 20.0,
            "20 ms over 1000 requests is ≥ 20 µs each: {split:?}"
        );
        assert!(split["idle"] < 1.0, "{split:?}");
        assert!(split.contains_key("softirq on CPU 0, whole machine"));
        assert!(split.contains_key("idle on CPU 0, whole machine"));
        assert_eq!(m.threads()["spinner"], 1);
    }
}
