//! Fault injection's set-up on the switch (`--faults`,
//! docs/fault-injection.md): which injectors each port gets, rules changed
//! while iokerneld runs (a [`FaultsHandle`]), and the counts per rule.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::loop_waker::LoopWaker;

use ginza_proto::messages::FaultStats;

use super::{Dataplane, GENERATOR_MAC, TRUNK_MAC};
use crate::nic::faults::{
    stream_of, Direction, FaultCounters, FaultInjector, FaultRule, PortIdentity, MAX_FAULT_RULES,
};
use crate::nic::PortId;

#[derive(Default)]
struct FaultsSlot {
    /// Rules asked for, not yet taken by the loop.
    pending: Option<Vec<FaultRule>>,
    /// Requests made, and requests the loop carried out.
    asked: u64,
    applied: u64,
}

/// Changes the fault injection of a running iokerneld
/// ([`crate::InProcess::faults`], [`crate::Iokerneld::faults_handle`]):
/// tests run the same setup clean, then lossy.
#[derive(Clone, Default)]
pub struct FaultsHandle(Arc<Mutex<FaultsSlot>>, LoopWaker);

impl FaultsHandle {
    /// A handle that wakes the loop through `waker`.
    pub(super) fn new(waker: LoopWaker) -> FaultsHandle {
        FaultsHandle(Arc::default(), waker)
    }

    /// Replaces iokerneld's fault rules with `rules` (empty: none) on every
    /// port, and waits (at most 5 s) until its loop did. Counters start
    /// again from zero. Refused: more than [`MAX_FAULT_RULES`] rules, or a
    /// loop that does not answer.
    pub fn set(&self, rules: Vec<FaultRule>) -> Result<(), String> {
        if rules.len() > MAX_FAULT_RULES {
            return Err(format!(
                "{} fault rules: at most {MAX_FAULT_RULES}",
                rules.len()
            ));
        }
        let ticket = {
            let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
            slot.pending = Some(rules);
            slot.asked += 1;
            slot.asked
        };
        self.1.wake();
        let start = std::time::Instant::now();
        loop {
            if self.0.lock().unwrap_or_else(|p| p.into_inner()).applied >= ticket {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(5) {
                return Err(
                    "iokerneld did not take the fault rules within 5 s (is it running?)".into(),
                );
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// [`set`](Self::set) from rules written as for `--faults`
    /// (`["drop=5%,port=trunk"]`); a bad one is refused with its message.
    pub fn set_specs(&self, specs: &[&str]) -> Result<(), String> {
        let rules = specs
            .iter()
            .map(|s| s.parse().map_err(|e| format!("--faults {s}: {e}")))
            .collect::<Result<Vec<FaultRule>, String>>()?;
        self.set(rules)
    }
}

impl Dataplane {
    /// Fault injection by `rules` (validated) on every port, in place of
    /// any before (frames those held are lost; counters start from zero);
    /// applications that attach later get theirs when they do.
    pub fn set_faults(&mut self, rules: Vec<FaultRule>) {
        self.fault_rules = rules;
        let mut ports = vec![(self.generator_port, None, GENERATOR_MAC)];
        if let Some((_, trunk)) = self.nic {
            ports.push((trunk, None, TRUNK_MAC));
        }
        for (port, name, mac) in &self.app_ports {
            ports.push((*port, Some(name.clone()), *mac));
        }
        for (port, name, mac) in ports {
            let identity = match &name {
                Some(name) => PortIdentity::App { name, mac },
                None if port == self.generator_port => PortIdentity::Generator(mac),
                None => PortIdentity::Trunk(mac),
            };
            self.install_faults(port, identity);
        }
        // After the installs: what the replaced injectors did is not
        // counted under the new rules.
        self.retired_faults = vec![FaultCounters::default(); self.fault_rules.len()];
    }

    /// Changes the fault rules of the running loop.
    pub fn faults_handle(&self) -> FaultsHandle {
        self.faults_handle.clone()
    }

    /// Rules asked for through the [`FaultsHandle`], set now.
    pub(super) fn check_faults(&mut self) {
        let Ok(mut slot) = self.faults_handle.0.try_lock() else {
            return;
        };
        if let Some(rules) = slot.pending.take() {
            let applied = slot.asked;
            drop(slot);
            for rule in &rules {
                log::info!("iokerneld: fault injection {rule}");
            }
            if rules.is_empty() {
                log::info!("iokerneld: no fault injection");
            }
            self.set_faults(rules);
            let mut slot = self
                .faults_handle
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            slot.applied = slot.applied.max(applied);
        }
    }

    /// The rules of [`Dataplane::set_faults`].
    pub fn fault_rules(&self) -> &[FaultRule] {
        &self.fault_rules
    }

    /// Gives `port` the injectors of the first rules naming it, one per
    /// direction (or none).
    pub(super) fn install_faults(&mut self, port: PortId, identity: PortIdentity<'_>) {
        self.retire_faults(port);
        let injector = |dir: Direction| {
            self.fault_rules
                .iter()
                .enumerate()
                .find(|(_, r)| r.dir.covers(dir) && r.port.matches(&identity))
                .map(|(i, r)| FaultInjector::new(r, i, stream_of(identity.mac(), dir)))
        };
        let (ingress, egress) = (injector(Direction::In), injector(Direction::Out));
        self.switch.set_faults(port, ingress, egress);
    }

    /// Keeps the counters of `port`'s injectors before they go.
    pub(super) fn retire_faults(&mut self, port: PortId) {
        let (ingress, egress) = self.switch.faults(port);
        for injector in ingress.into_iter().chain(egress) {
            if let Some(total) = self.retired_faults.get_mut(injector.tag()) {
                *total += injector.counters();
            }
        }
    }

    /// Per rule, what its injectors did so far.
    pub fn fault_stats(&self) -> Vec<FaultStats> {
        let mut totals = self.retired_faults.clone();
        for injector in self.switch.injectors() {
            if let Some(total) = totals.get_mut(injector.tag()) {
                *total += injector.counters();
            }
        }
        totals
            .iter()
            .zip(&self.fault_rules)
            .map(|(c, rule)| c.report(rule.port.to_string()))
            .collect()
    }
}
