//! Which CPUs a thread may run on.

use std::io;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet, Pid};

/// A thread id as `sched_setaffinity` takes it: 0 is the calling thread.
fn pid(tid: i32) -> Option<Pid> {
    Pid::from_raw(tid)
}

fn cpu_set(cpus: &[usize]) -> io::Result<CpuSet> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        if cpu >= CpuSet::MAX_CPU {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {cpu} out of range"),
            ));
        }
        set.set(cpu);
    }
    Ok(set)
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    pin_thread(0, cpu)
}

/// Pins thread `tid` (0: the calling thread) to `cpu`.
pub fn pin_thread(tid: i32, cpu: usize) -> io::Result<()> {
    set_thread_affinity(tid, &[cpu])
}

/// Lets thread `tid` (0: the calling thread) run on any of `cpus`.
pub fn set_thread_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    Ok(sched_setaffinity(pid(tid), &cpu_set(cpus)?)?)
}

/// The CPUs the calling thread may run on, ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_a_thread_shows_in_its_allowed_cpus() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let last = *allowed.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![last]);
        })
        .join()
        .unwrap();
        // Only the spawned thread was pinned.
        assert_eq!(allowed_cpus().unwrap(), allowed);
    }

    #[test]
    fn a_cpu_beyond_the_set_is_an_error() {
        let e = pin_thread(0, CpuSet::MAX_CPU).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("out of range"), "{e}");
    }
}
