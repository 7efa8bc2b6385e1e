//! The wake cost of this machine: an eventfd ping-pong between two
//! threads pinned to two CPUs, each blocked in `read` when the other
//! writes — what a grant to a parked kthread costs. Half the median round
//! trip is one wake.
//!
//! Each round starts after a short spin so that the partner is surely
//! asleep again (a partner still returning from its write would be woken
//! without sleeping, and the figure would flatter the machine).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use ginza_sys::{affinity, eventfd};
use serde_json::json;

use super::{Check, Verdict};

/// Wakes at or above this are what a VM's halted vCPU costs (bare metal
/// wakes a thread on another core in 1–3 µs).
pub const SLOW_WAKE: Duration = Duration::from_micros(5);
/// Round trips before the measured ones (caches, frequency).
const WARM_UP: usize = 20;
/// Pause before each round: the partner is back in `read` by then.
const SETTLE: Duration = Duration::from_micros(30);

/// A measured wake cost.
#[derive(Clone, Debug, PartialEq)]
pub struct WakeCost {
    /// Median of half the round trips.
    pub median: Duration,
    pub rounds: usize,
    /// The two CPUs (the same one twice when only one may be used).
    pub cpus: (usize, usize),
}

/// Measures `rounds` round trips (at least 1).
pub fn measure(rounds: usize) -> io::Result<WakeCost> {
    let rounds = rounds.max(1);
    let allowed = affinity::allowed_cpus()?;
    let first = *allowed
        .first()
        .ok_or_else(|| io::Error::other("this process may use no CPU"))?;
    let second = allowed.get(1).copied().unwrap_or(first);
    let ping = eventfd::new_blocking()?;
    let pong = eventfd::new_blocking()?;
    std::thread::scope(|s| {
        let partner = s.spawn(|| echo(&ping, &pong, second, WARM_UP + rounds));
        let measured = s
            .spawn(|| serve(&ping, &pong, first, rounds))
            .join()
            .map_err(|_| io::Error::other("the measuring thread panicked"))?;
        partner
            .join()
            .map_err(|_| io::Error::other("the echo thread panicked"))??;
        let mut halves = measured?;
        halves.sort_unstable();
        Ok(WakeCost {
            median: halves[halves.len() / 2],
            rounds,
            cpus: (first, second),
        })
    })
}

/// The partner: waits for a ping, answers with a pong, `n` times. A
/// failed pin is reported after the rounds, not before them: the other
/// thread would wait for a pong forever.
fn echo(ping: &OwnedFd, pong: &OwnedFd, cpu: usize, n: usize) -> io::Result<()> {
    let pinned = affinity::pin_current_thread(cpu);
    for _ in 0..n {
        eventfd::read(ping.as_fd())?;
        eventfd::write(pong.as_fd(), 1)?;
    }
    pinned
}

/// The measuring side: half of each round trip, warm-up dropped. Like
/// [`echo`], it runs every round even if its pin failed (the partner
/// waits for them).
fn serve(ping: &OwnedFd, pong: &OwnedFd, cpu: usize, rounds: usize) -> io::Result<Vec<Duration>> {
    let pinned = affinity::pin_current_thread(cpu);
    let mut halves = Vec::with_capacity(rounds);
    for i in 0..WARM_UP + rounds {
        let settle = Instant::now();
        while settle.elapsed() < SETTLE {
            std::hint::spin_loop();
        }
        let start = Instant::now();
        eventfd::write(ping.as_fd(), 1)?;
        eventfd::read(pong.as_fd())?;
        if i >= WARM_UP {
            halves.push(start.elapsed() / 2);
        }
    }
    pinned.map(|()| halves)
}

pub fn check(rounds: usize) -> Check {
    match measure(rounds) {
        Ok(cost) => judge(&cost),
        Err(e) => Check::new("wake", Verdict::Warn, format!("not measured: {e}")),
    }
}

/// What a wake cost means.
pub fn judge(cost: &WakeCost) -> Check {
    let us = cost.median.as_secs_f64() * 1e6;
    let (a, b) = cost.cpus;
    let place = if a == b {
        format!("both threads on cpu {a}, the only one this process may use")
    } else {
        format!("cpus {a} and {b}")
    };
    let found = format!(
        "an eventfd wake of a blocked thread takes {us:.1} µs (median of {} round trips, {place})",
        cost.rounds
    );
    let data = json!({
        "median_ns": u64::try_from(cost.median.as_nanos()).unwrap_or(u64::MAX),
        "rounds": cost.rounds,
        "cpus": [a, b],
        "slow_threshold_ns": SLOW_WAKE.as_nanos() as u64,
    });
    let check = if cost.median < SLOW_WAKE {
        Check::new(
            "wake",
            Verdict::Pass,
            format!("{found}: parking idle kthreads costs a request little"),
        )
    } else {
        Check::new(
            "wake",
            Verdict::Warn,
            format!(
                "{found}: slow (a VM's halted vCPU?); a request that finds its kthread parked waits {us:.0} µs more, each time a core is granted"
            ),
        )
        .fix("keep latency-critical kthreads spinning: guaranteed cores, a longer `spin_before_park`, or `keep_cores_when_idle` (runtime Config)")
    };
    check.data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_is_made_and_judged_by_its_threshold() {
        let cost = measure(5).unwrap();
        assert_eq!(cost.rounds, 5);
        assert!(cost.median > Duration::ZERO, "{cost:?}");
        let c = judge(&cost);
        let expected = if cost.median < SLOW_WAKE {
            Verdict::Pass
        } else {
            Verdict::Warn
        };
        assert_eq!(c.verdict, expected, "{c:?}");
        let slow = judge(&WakeCost {
            median: Duration::from_micros(7),
            rounds: 9,
            cpus: (0, 1),
        });
        assert_eq!(slow.verdict, Verdict::Warn);
        assert!(
            slow.found
                .contains("7.0 µs (median of 9 round trips, cpus 0 and 1)"),
            "{slow:?}"
        );
        assert!(slow.found.contains("waits 7 µs more"), "{slow:?}");
    }
}
