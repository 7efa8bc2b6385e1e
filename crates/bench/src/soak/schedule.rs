//! The soak's fault schedule, drawn in advance from a seeded RNG: the same
//! seed and duration give the same events at the same offsets. Frame
//! faults run all along at a low rate ([`BACKGROUND`]) with storms
//! ([`STORM`]) on top; kills come in shuffled rounds of every kind, so a
//! short run sees each at least once.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// iokerneld's rule between storms (`seed` appended).
pub(crate) const BACKGROUND: &str =
    "drop=0.5%,duplicate=0.5%,reorder=1%,corrupt=0.2%,proto=tcp,port=trunk";
/// Its rule during a storm.
pub(crate) const STORM: &str =
    "drop=3%,duplicate=2%,reorder=4%,corrupt=1%,gap=3,proto=tcp,port=trunk";

/// What happens at a point of the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Event {
    /// Frame faults at the storm's rates for `Duration`.
    Storm(Duration),
    KillBatch,
    KillVictim,
    KillNetstack,
}

const KINDS: usize = 4;

/// Events of a run of `duration`: none in its first 10 % (the servers
/// settle) and none in its last 15 % (storms over and processes back
/// before the final read of every key). The gap between events is about
/// `duration / 16`, between 1 s and 20 s.
pub(crate) fn plan(duration: Duration, seed: u64) -> Vec<(Duration, Event)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let gap = (duration / 16).clamp(Duration::from_secs(1), Duration::from_secs(20));
    let (first, last) = (duration.mul_f64(0.10), duration.mul_f64(0.85));
    let mut events = Vec::new();
    let mut at = first;
    let mut round: Vec<usize> = Vec::new();
    while at < last {
        if round.is_empty() {
            round = (0..KINDS).collect();
            round.shuffle(&mut rng);
        }
        let event = match round.pop().expect("refilled above") {
            0 => Event::Storm((gap / 2).min(last - at)),
            1 => Event::KillBatch,
            2 => Event::KillVictim,
            _ => Event::KillNetstack,
        };
        events.push((at, event));
        at += gap.mul_f64(rng.random_range(0.5..1.5));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_sees_every_kind_inside_its_middle() {
        let d = Duration::from_secs(30);
        let events = plan(d, 7);
        for kind in [Event::KillBatch, Event::KillVictim, Event::KillNetstack] {
            assert!(
                events.iter().any(|(_, e)| *e == kind),
                "{kind:?} in {events:?}"
            );
        }
        assert!(events.iter().any(|(_, e)| matches!(e, Event::Storm(_))));
        for (at, e) in &events {
            assert!(*at >= d.mul_f64(0.1) && *at < d.mul_f64(0.85), "{at:?}");
            if let Event::Storm(len) = e {
                assert!(*at + *len <= d.mul_f64(0.85));
            }
        }
        assert_eq!(events, plan(d, 7), "a seed repeats its schedule");
        assert_ne!(events, plan(d, 8));
    }

    #[test]
    fn the_rules_parse() {
        for rule in [BACKGROUND, STORM] {
            let r: Result<ginza_iokernel::FaultRule, _> = format!("{rule},seed=3").parse();
            assert!(r.is_ok(), "{rule}: {r:?}");
        }
    }
}
