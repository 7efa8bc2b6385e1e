//! The packet steering a simulation uses (docs/design.md, "Packet steering"):
//! the very policy objects of `ginza_policy::steer` that iokerneld runs,
//! chosen and sized in a scenario.
//!
//! ```toml
//! [steering]
//! policy = "flow-affinity"   # rss-mod (default) | flow-affinity | indirection
//! flows = 700000             # requests come from this many flows (0: each its own)
//! flow_table_capacity = 1048576
//! prepopulate = false
//! warm_up_us = 0.0           # round-robin for every other new flow until then
//! buckets = 512
//! ```

use ginza_net::flow::mix64;
use ginza_policy::steer::{Steering, SteeringKind, SteeringOptions};
use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::us_to_ps;

/// A scenario's steering: the policy, its sizes, and how many flows the
/// requests come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SteeringSpec {
    #[serde(serialize_with = "to_name", deserialize_with = "from_name")]
    pub policy: SteeringKind,
    /// Requests come from this many flows, picked uniformly; 0: every
    /// request is a flow of its own.
    pub flows: u64,
    /// `flow-affinity`: flows the table holds.
    pub flow_table_capacity: usize,
    /// `flow-affinity`: hash ranges assigned in advance (no warm-up).
    pub prepopulate: bool,
    /// `flow-affinity`: until then (µs of simulated time), every other new
    /// flow goes round-robin without an insertion.
    pub warm_up_us: f64,
    /// `indirection`: buckets.
    pub buckets: usize,
    /// `indirection`: buckets one rebalance moves at most.
    pub max_bucket_moves: usize,
}

impl Default for SteeringSpec {
    fn default() -> Self {
        let o = SteeringOptions::default();
        SteeringSpec {
            policy: SteeringKind::RssMod,
            flows: 0,
            flow_table_capacity: o.flow_table_capacity,
            prepopulate: o.prepopulate,
            warm_up_us: 0.0,
            buckets: o.buckets,
            max_bucket_moves: o.max_bucket_moves,
        }
    }
}

fn to_name<S: Serializer>(kind: &SteeringKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.name())
}

fn from_name<'de, D: Deserializer<'de>>(d: D) -> Result<SteeringKind, D::Error> {
    let name = String::deserialize(d)?;
    name.parse().map_err(serde::de::Error::custom)
}

impl SteeringSpec {
    /// `policy` with default sizes.
    pub fn of(policy: SteeringKind) -> Self {
        SteeringSpec {
            policy,
            ..Default::default()
        }
    }

    /// The policy object for `kthreads` kthreads (simulated time in ps).
    pub fn build(&self, kthreads: usize) -> Box<dyn Steering + Send> {
        let options = SteeringOptions {
            flow_table_capacity: self.flow_table_capacity,
            prepopulate: self.prepopulate,
            warm_up_until: us_to_ps(self.warm_up_us),
            flow_min_idle: 0,
            buckets: self.buckets.max(1),
            max_bucket_moves: self.max_bucket_moves,
        };
        self.policy.build(kthreads, &options)
    }

    /// The flow hash of the next request, drawn as `flows` says.
    pub fn next_flow(&self, rng: &mut impl Rng) -> u64 {
        match self.flows {
            0 => rng.random(),
            n => mix64(rng.random_range(0..n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenario_names_the_policy() {
        let spec: SteeringSpec = toml::from_str("policy = \"indirection\"\nflows = 5\n").unwrap();
        assert_eq!(spec.policy, SteeringKind::Indirection);
        assert_eq!(spec.flows, 5);
        assert_eq!(spec.buckets, 512);
        assert_eq!(spec.build(4).name(), "indirection");
        let spec: SteeringSpec = toml::from_str("").unwrap();
        assert_eq!(spec, SteeringSpec::default());
        assert_eq!(spec.policy, SteeringKind::RssMod);
        let e = toml::from_str::<SteeringSpec>("policy = \"random\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown steering policy"), "{e}");
        let back: SteeringSpec = toml::from_str(
            &toml::to_string(&SteeringSpec::of(SteeringKind::FlowAffinity)).unwrap(),
        )
        .unwrap();
        assert_eq!(back.policy, SteeringKind::FlowAffinity);
    }
}
