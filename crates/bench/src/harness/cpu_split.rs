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
//!
//! A component added with [`Meter::add_split`] is also split into its time
//! in user space and in the kernel, by the shares of its threads' `utime`
//! and `stime` (`/proc/PID/task/TID/stat`). Those come from the scheduler
//! tick (250 a second here), which charges each tick to where the CPU was,
//! so the split is a sample: a few per cent over a second or more of run
//! time. It tells apart a system whose server works in the kernel (Linux's
//! TCP) from one that works in user space (Ginza's runtime), for the same
//! request.

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
    /// Per component: whether its user and kernel time are reported too.
    split: Vec<bool>,
    resolved: Option<Vec<Vec<(i32, i32)>>>,
    cpus: Vec<usize>,
}

/// One reading: ns run per component, and the softirq and idle ns of
/// each CPU.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reading {
    run_ns: Vec<u64>,
    /// Per component: its threads' user and kernel ticks (zero where not
    /// split).
    ticks: Vec<Ticks>,
    softirq_ns: Vec<u64>,
    idle_ns: Vec<u64>,
}

impl Meter {
    /// `cpus`: the CPUs whose softirq time is read too.
    pub(crate) fn new(cpus: &[usize]) -> Meter {
        Meter {
            components: Vec::new(),
            split: Vec::new(),
            resolved: None,
            cpus: cpus.to_vec(),
        }
    }

    pub(crate) fn add(&mut self, name: &str, select: Select) {
        self.components.push((name.to_string(), select));
        self.split.push(false);
    }

    /// As [`Meter::add`], and the component's time in user space and in
    /// the kernel is reported beside its total (module doc).
    pub(crate) fn add_split(&mut self, name: &str, select: Select) {
        self.add(name, select);
        *self.split.last_mut().expect("just added") = true;
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
            ticks: resolved
                .iter()
                .zip(&self.split)
                .map(|(ts, &split)| {
                    let of = |&(p, t): &(i32, i32)| split.then(|| ticks(p, t)).flatten();
                    ts.iter().filter_map(of).fold(Ticks::default(), Ticks::add)
                })
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
            let run_us = b.saturating_sub(*a) as f64 / 1e3 / requests;
            out.insert(name.clone(), run_us);
            if let (true, Some(t0), Some(t1)) = (self.split[i], from.ticks.get(i), to.ticks.get(i))
            {
                if let Some(user_share) = t1.since(t0).user_share() {
                    out.insert(format!("{name}: in user space"), run_us * user_share);
                    out.insert(
                        format!("{name}: in the kernel"),
                        run_us * (1.0 - user_share),
                    );
                }
            }
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

/// A thread's (or a sum of threads') scheduler ticks in user space and in
/// the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Ticks {
    user: u64,
    kernel: u64,
}

impl Ticks {
    fn add(self, o: Ticks) -> Ticks {
        Ticks {
            user: self.user + o.user,
            kernel: self.kernel + o.kernel,
        }
    }

    fn since(self, earlier: &Ticks) -> Ticks {
        Ticks {
            user: self.user.saturating_sub(earlier.user),
            kernel: self.kernel.saturating_sub(earlier.kernel),
        }
    }

    /// The user share of the ticks (None without any).
    fn user_share(self) -> Option<f64> {
        let all = self.user + self.kernel;
        (all > 0).then(|| self.user as f64 / all as f64)
    }
}

/// Thread `tid`'s user and kernel ticks (`utime`, `stime`: the 14th and
/// 15th fields of its `stat`, counted after the `)` that ends its name,
/// which may hold spaces).
fn ticks(pid: i32, tid: i32) -> Option<Ticks> {
    ticks_of(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

/// The user and kernel ticks of a `stat` line.
fn ticks_of(stat: &str) -> Option<Ticks> {
    let mut after_name = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    // Fields 3 (state) to 13 come first.
    let user = after_name.nth(11)?.parse().ok()?;
    let kernel = after_name.next()?.parse().ok()?;
    Some(Ticks { user, kernel })
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

    /// A thread that spins in user space, and one that copies from
    /// `/dev/zero` (the kernel clears its buffer), until each has run
    /// `enough_ns`; their user and kernel shares, as the meter splits them.
    fn shares_of_a_spinner_and_a_reader(enough_ns: u64) -> BTreeMap<String, f64> {
        use std::io::Read as _;
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let workers: Vec<_> = [false, true]
            .into_iter()
            .map(|reads| {
                let (stop, tx) = (stop.clone(), tx.clone());
                std::thread::spawn(move || {
                    tx.send((reads, my_tid())).unwrap();
                    let mut zero = std::fs::File::open("/dev/zero").unwrap();
                    let mut buf = vec![1u8; 1 << 20];
                    let mut x = 0u64;
                    while !stop.load(Relaxed) {
                        if reads {
                            zero.read_exact(&mut buf).unwrap();
                        } else {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                        }
                    }
                })
            })
            .collect();
        let mut tids: Vec<(bool, i32)> = (0..2).map(|_| rx.recv().unwrap()).collect();
        tids.sort();
        let mut m = Meter::new(&[0]);
        m.add_split("spinner", Select::Tids(vec![tids[0].1]));
        m.add_split("reader", Select::Tids(vec![tids[1].1]));
        let a = m.read();
        let t0 = std::time::Instant::now();
        let b = loop {
            let b = m.read();
            if (0..2).all(|i| b.run_ns[i] - a.run_ns[i] >= enough_ns) {
                break b;
            }
            assert!(
                t0.elapsed().as_secs() < 60,
                "the workers never ran {enough_ns} ns each"
            );
            std::thread::yield_now();
        };
        stop.store(true, Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        m.per_request(&a, &b, 1.0)
    }

    #[test]
    fn a_split_component_is_told_apart_in_user_space_and_in_the_kernel() {
        // 400 ms each: about 100 scheduler ticks at 250 a second.
        let split = shares_of_a_spinner_and_a_reader(400_000_000);
        let share = |name: &str, part: &str| split[&format!("{name}: {part}")] / split[name];
        assert!(share("spinner", "in user space") > 0.8, "{split:?}");
        assert!(share("reader", "in the kernel") > 0.5, "{split:?}");
        for name in ["spinner", "reader"] {
            let sum =
                split[&format!("{name}: in user space")] + split[&format!("{name}: in the kernel")];
            assert!((sum - split[name]).abs() < 1e-6 * split[name], "{split:?}");
        }
    }

    #[test]
    fn ticks_are_read_after_a_name_with_spaces_and_parentheses() {
        let line = "4242 (a) b (c) S 1 2 3 4 0 4194560 10 0 0 0 77 88 0 0 20 0 1 0 5 0 0";
        assert_eq!(
            ticks_of(line),
            Some(Ticks {
                user: 77,
                kernel: 88
            })
        );
        assert_eq!(ticks_of("4242 (cut"), None);
        assert_eq!(ticks_of("4242 (short) S 1 2"), None);
        let me = std::process::id() as i32;
        assert!(ticks(me, my_tid()).is_some(), "this thread's own stat");
    }
}
