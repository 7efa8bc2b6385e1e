//! Runtime configuration, its validation, and the CPU topology it is checked against.

use std::collections::BTreeSet;
use std::time::Duration;

use ginza_sys::{affinity, cpulist, topology};

use crate::error::ConfigError;

/// How an application's runtime is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of kthreads (one pthread each).
    pub kthreads: usize,
    /// CPUs the kthreads are pinned to, kthread `i` on `cores[i % len]`;
    /// `None` means every CPU this process may run on.
    pub cores: Option<Vec<usize>>,
    /// Usable bytes of each uthread stack (a guard page is added below).
    pub stack_size: usize,
    /// How long an idle kthread keeps looking for work before it parks.
    pub spin_before_park: Duration,
    /// Register with iokerneld, which then decides which kthreads hold a
    /// core (`cores` is ignored: iokerneld pins granted kthreads).
    /// `None`: standalone.
    pub iokernel: Option<crate::iokernel::IokernelConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kthreads: 1,
            cores: None,
            stack_size: 256 * 1024,
            spin_before_park: Duration::from_micros(2),
            iokernel: None,
        }
    }
}

impl Config {
    /// The default configuration with `n` kthreads.
    pub fn with_kthreads(n: usize) -> Self {
        Config {
            kthreads: n,
            ..Config::default()
        }
    }
}

pub(crate) const MAX_KTHREADS: usize = 1024;
pub(crate) const MIN_STACK: usize = 16 * 1024;
pub(crate) const MAX_STACK: usize = 1 << 30;
pub(crate) const MAX_SPIN: Duration = Duration::from_secs(1);

/// A configuration checked against this machine.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Core of each kthread.
    pub(crate) cores: Vec<usize>,
    /// For each kthread, the kthreads on hyperthread siblings of its core.
    pub(crate) siblings: Vec<Vec<usize>>,
    pub(crate) stack_size: usize,
    pub(crate) spin_before_park: Duration,
    /// More kthreads than distinct cores: Linux will multiplex them.
    pub(crate) oversubscribed: bool,
}

impl Config {
    pub(crate) fn plan(&self) -> Result<Plan, ConfigError> {
        let allowed = allowed_cpus()?;
        self.plan_for(&allowed, &|cpu| read_siblings(cpu))
    }

    /// Validation against a given CPU set, so tests can describe any machine.
    pub(crate) fn plan_for(
        &self,
        allowed: &BTreeSet<usize>,
        siblings_of: &dyn Fn(usize) -> Vec<usize>,
    ) -> Result<Plan, ConfigError> {
        if self.kthreads == 0 {
            return Err(ConfigError::NoKthreads);
        }
        if self.kthreads > MAX_KTHREADS {
            return Err(ConfigError::TooManyKthreads {
                requested: self.kthreads,
                max: MAX_KTHREADS,
            });
        }
        if !(MIN_STACK..=MAX_STACK).contains(&self.stack_size) {
            return Err(ConfigError::StackSize {
                requested: self.stack_size,
                min: MIN_STACK,
                max: MAX_STACK,
            });
        }
        if self.spin_before_park > MAX_SPIN {
            return Err(ConfigError::SpinTooLong(self.spin_before_park));
        }
        let pool: Vec<usize> = match &self.cores {
            None => allowed.iter().copied().collect(),
            Some(list) if list.is_empty() => return Err(ConfigError::EmptyCoreList),
            Some(list) => {
                let mut seen = BTreeSet::new();
                for &core in list {
                    if !allowed.contains(&core) {
                        return Err(ConfigError::UnknownCore {
                            core,
                            allowed: cpulist::format(&allowed.iter().copied().collect::<Vec<_>>()),
                        });
                    }
                    if !seen.insert(core) {
                        return Err(ConfigError::DuplicateCore(core));
                    }
                }
                list.clone()
            }
        };
        if pool.is_empty() {
            return Err(ConfigError::NoAllowedCpus);
        }
        let cores: Vec<usize> = (0..self.kthreads).map(|i| pool[i % pool.len()]).collect();
        let siblings = cores
            .iter()
            .enumerate()
            .map(|(me, &core)| {
                let sib = siblings_of(core);
                (0..cores.len())
                    .filter(|&k| k != me && cores[k] != core && sib.contains(&cores[k]))
                    .collect()
            })
            .collect();
        Ok(Plan {
            cores,
            siblings,
            stack_size: self.stack_size,
            spin_before_park: self.spin_before_park,
            oversubscribed: self.kthreads > pool.len(),
        })
    }
}

/// CPUs this process may run on (its affinity mask).
pub(crate) fn allowed_cpus() -> Result<BTreeSet<usize>, ConfigError> {
    let cpus = affinity::allowed_cpus().map_err(|e| ConfigError::Affinity(e.to_string()))?;
    Ok(cpus.into_iter().collect())
}

/// Hyperthread siblings of `cpu` (including itself) from sysfs; empty if unknown.
fn read_siblings(cpu: usize) -> Vec<usize> {
    topology::thread_siblings(cpu).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: usize) -> BTreeSet<usize> {
        (0..n).collect()
    }

    #[test]
    fn bad_configs_are_clear_errors() {
        let none = |_| vec![];
        let err = |c: Config| c.plan_for(&cpus(2), &none).unwrap_err().to_string();
        assert!(err(Config::with_kthreads(0)).contains("at least one kthread"));
        assert!(err(Config::with_kthreads(100_000)).contains("at most 1024"));
        let c = Config {
            cores: Some(vec![7]),
            ..Config::default()
        };
        assert!(
            err(c).contains("core 7 does not exist"),
            "{}",
            err(Config {
                cores: Some(vec![7]),
                ..Config::default()
            })
        );
        let c = Config {
            cores: Some(vec![]),
            ..Config::default()
        };
        assert!(err(c).contains("empty"));
        let c = Config {
            cores: Some(vec![1, 1]),
            ..Config::default()
        };
        assert!(err(c).contains("twice"));
        let c = Config {
            stack_size: 10,
            ..Config::default()
        };
        assert!(err(c).contains("stack size"));
        let c = Config {
            spin_before_park: Duration::from_secs(5),
            ..Config::default()
        };
        assert!(err(c).contains("spin"));
    }

    #[test]
    fn kthreads_wrap_around_cores_and_find_siblings() {
        // Two physical cores with two hyperthreads each: {0,2} and {1,3}.
        let sib = |c: usize| {
            if c.is_multiple_of(2) {
                vec![0, 2]
            } else {
                vec![1, 3]
            }
        };
        let plan = Config::with_kthreads(6).plan_for(&cpus(4), &sib).unwrap();
        assert_eq!(plan.cores, vec![0, 1, 2, 3, 0, 1]);
        assert_eq!(plan.siblings[0], vec![2]);
        assert_eq!(plan.siblings[1], vec![3]);
        assert_eq!(plan.siblings[2], vec![0, 4]);
        assert!(plan.oversubscribed);
        let plan = Config::with_kthreads(2).plan_for(&cpus(4), &sib).unwrap();
        assert!(!plan.oversubscribed);
        assert!(plan.siblings[0].is_empty());
    }
}
