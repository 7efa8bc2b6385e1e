//! The CPUs of this machine, from sysfs.

use std::io;

use crate::cpulist;

const CPU_DIR: &str = "/sys/devices/system/cpu";

fn read_list(path: &str) -> io::Result<Vec<usize>> {
    let text = std::fs::read_to_string(path)?;
    cpulist::parse(&text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

/// The hyperthread siblings of `cpu`, itself included
/// (`cpuN/topology/thread_siblings_list`).
pub fn thread_siblings(cpu: usize) -> io::Result<Vec<usize>> {
    read_list(&format!("{CPU_DIR}/cpu{cpu}/topology/thread_siblings_list"))
}

/// The CPUs that are online (`online`), whether or not this process may
/// use them (see [`crate::affinity::allowed_cpus`]).
pub fn online_cpus() -> io::Result<Vec<usize>> {
    read_list(&format!("{CPU_DIR}/online"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowed_cpu_is_online_and_its_own_sibling() {
        let online = online_cpus().unwrap();
        let cpu = crate::affinity::allowed_cpus().unwrap()[0];
        assert!(online.contains(&cpu), "{online:?} lacks {cpu}");
        let sibs = thread_siblings(cpu).unwrap();
        assert!(sibs.contains(&cpu), "{sibs:?} lacks {cpu}");
    }

    #[test]
    fn an_absent_cpu_is_an_error() {
        assert!(thread_siblings(usize::MAX).is_err());
    }
}
