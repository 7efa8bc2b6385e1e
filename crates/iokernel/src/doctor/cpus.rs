//! CPUs: how many, which ones this process (and so iokerneld started
//! from here) may use, what the kernel isolated, and the cores iokerneld
//! would take: one for itself, the rest to manage.

use std::io;

use ginza_sys::{affinity, cpulist, topology};
use serde_json::json;

use super::{Check, Verdict};

const CPU_DIR: &str = "/sys/devices/system/cpu";

/// What the machine says about its CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuFacts {
    pub online: Vec<usize>,
    /// This process's affinity mask: iokerneld refuses cores outside it.
    pub allowed: Vec<usize>,
    /// `isolcpus=` (`/sys/devices/system/cpu/isolated`).
    pub isolated: Vec<usize>,
    /// `nohz_full=` (`/sys/devices/system/cpu/nohz_full`; absent on
    /// kernels built without it).
    pub nohz_full: Vec<usize>,
}

impl CpuFacts {
    pub fn of_this_machine() -> io::Result<CpuFacts> {
        Ok(CpuFacts {
            online: topology::online_cpus()?,
            allowed: affinity::allowed_cpus()?,
            isolated: optional_list("isolated")?,
            nohz_full: optional_list("nohz_full")?,
        })
    }
}

/// A CPU list file that may be absent or empty (no such CPUs).
fn optional_list(file: &str) -> io::Result<Vec<usize>> {
    let path = format!("{CPU_DIR}/{file}");
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() || text.trim() == "(null)" => Ok(Vec::new()),
        Ok(text) => cpulist::parse(text.trim())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// iokerneld's own core and the cores it would manage, from what this
/// process may use: an isolated CPU for the busy-polling loop if there is
/// one (nothing else is scheduled there), else the first; the others
/// managed. `None` without any CPU.
pub fn proposal(facts: &CpuFacts) -> Option<(usize, Vec<usize>)> {
    let own = facts
        .allowed
        .iter()
        .copied()
        .find(|c| facts.isolated.contains(c))
        .or_else(|| facts.allowed.first().copied())?;
    let managed = facts
        .allowed
        .iter()
        .copied()
        .filter(|&c| c != own)
        .collect();
    Some((own, managed))
}

fn list(cpus: &[usize]) -> String {
    if cpus.is_empty() {
        "none".into()
    } else {
        cpulist::format(cpus)
    }
}

pub fn check() -> Check {
    match CpuFacts::of_this_machine() {
        Ok(facts) => judge(&facts),
        Err(e) => Check::new("cpus", Verdict::Fail, format!("cannot read the CPUs: {e}"))
            .fix("mount /sys and /proc (iokerneld reads both)"),
    }
}

/// The verdict on `facts`.
pub fn judge(facts: &CpuFacts) -> Check {
    let parallelism = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut found = format!(
        "{} CPUs online ({}), this process may use {} ({}; available_parallelism {parallelism}); isolated: {}; nohz_full: {}",
        facts.online.len(),
        list(&facts.online),
        facts.allowed.len(),
        list(&facts.allowed),
        list(&facts.isolated),
        list(&facts.nohz_full),
    );
    let outside: Vec<usize> = facts
        .isolated
        .iter()
        .copied()
        .filter(|c| !facts.allowed.contains(c))
        .collect();
    let proposal = proposal(facts);
    let data = json!({
        "online": facts.online,
        "allowed": facts.allowed,
        "isolated": facts.isolated,
        "nohz_full": facts.nohz_full,
        "available_parallelism": parallelism,
        "iokerneld_core": proposal.as_ref().map(|p| p.0),
        "managed": proposal.as_ref().map(|p| &p.1),
    });
    let Some((own, managed)) = proposal else {
        return Check::new("cpus", Verdict::Fail, found)
            .fix("this process may use no CPU: check its affinity (taskset -p $$)")
            .data(data);
    };
    let check = if managed.is_empty() {
        found.push_str(&format!(
            "; with one CPU iokerneld shares cpu {own} with the applications"
        ));
        Check::new("cpus", Verdict::Warn, found).fix(format!(
            "run `ginza iokernel --no-pin --idle-sleep 1ms --cores {own}` here; a dedicated core needs 2 CPUs or more"
        ))
    } else {
        found.push_str(&format!(
            "; iokerneld would take cpu {own} for itself and manage {} ({} of them)",
            list(&managed),
            managed.len()
        ));
        let flags = format!("--core {own} --cores {}", cpulist::format(&managed));
        if outside.is_empty() {
            Check::new("cpus", Verdict::Pass, format!("{found}: {flags}"))
        } else {
            Check::new("cpus", Verdict::Warn, format!("{found}: {flags}")).fix(format!(
                "isolated CPUs {} are outside this process's affinity mask, and iokerneld refuses cores it may not use: start it with `taskset -c {}`",
                list(&outside),
                list(&facts.online)
            ))
        }
    };
    check.data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(allowed: &[usize], isolated: &[usize]) -> CpuFacts {
        CpuFacts {
            online: (0..4).collect(),
            allowed: allowed.to_vec(),
            isolated: isolated.to_vec(),
            nohz_full: Vec::new(),
        }
    }

    #[test]
    fn an_isolated_cpu_hosts_iokerneld() {
        assert_eq!(
            proposal(&facts(&[0, 1, 2, 3], &[])),
            Some((0, vec![1, 2, 3]))
        );
        assert_eq!(
            proposal(&facts(&[0, 1, 2, 3], &[2, 3])),
            Some((2, vec![0, 1, 3]))
        );
        assert_eq!(proposal(&facts(&[], &[])), None);
    }

    #[test]
    fn verdicts() {
        let c = judge(&facts(&[0, 1, 2, 3], &[]));
        assert_eq!(c.verdict, Verdict::Pass, "{c:?}");
        assert!(c.found.ends_with("--core 0 --cores 1-3"), "{c:?}");
        let c = judge(&facts(&[1], &[]));
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(c.fix.unwrap().contains("--no-pin"));
        // isolcpus takes CPUs out of the default affinity mask.
        let c = judge(&facts(&[0, 1], &[2, 3]));
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(c.fix.unwrap().contains("taskset -c 0-3"));
        assert_eq!(judge(&facts(&[], &[])).verdict, Verdict::Fail);
    }
}
