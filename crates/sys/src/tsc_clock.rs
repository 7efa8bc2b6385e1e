//! A cheap reading of CLOCK_MONOTONIC for a spinning loop: the CPU's time
//! stamp counter scaled to ns (docs/results.md, "Dataplane").
//!
//! In this project's VM a vDSO `clock_gettime(CLOCK_MONOTONIC)` costs about
//! 150 ns (an ordered TSC read plus the vDSO's sequence lock and scaling),
//! and iokerneld's loop read it every turn: 9–19 % of a spinning loop's
//! samples. A bare `rdtsc` costs less than half of that, and the scaling is
//! one multiply. The coarse clock (`CLOCK_MONOTONIC_COARSE`) is cheaper
//! still but ticks every 4 ms here: useless for 5 µs deadlines.
//!
//! The TSC is used only where the kernel itself trusts it (its clocksource
//! is `tsc`: invariant, synchronized across CPUs); anywhere else each
//! reading is a plain `clock_gettime`. Readings stay on CLOCK_MONOTONIC's
//! time line (runtimes' timer deadlines are in it): the clock re-anchors to
//! `clock_gettime` every [`REANCHOR_TICKS`] and refines its rate from the
//! whole span since it started, and it never goes back.

use crate::clock::monotonic_ns;

/// TSC ticks between two re-anchorings (about 2 ms at 2 GHz).
pub const REANCHOR_TICKS: u64 = 1 << 22;

/// How long the first calibration spins, ns.
const CALIBRATION_NS: u64 = 200_000;

/// Fixed-point shift of the ns-per-tick rate.
const SHIFT: u32 = 32;

/// CLOCK_MONOTONIC in ns from the TSC where the kernel trusts it (see the
/// module's text). One per thread: `now_ns` takes `&mut self`.
#[derive(Debug, Clone)]
pub struct TscClock {
    /// `None`: no usable TSC, every reading is a `clock_gettime`.
    tsc: Option<Scale>,
    /// The last reading returned (readings never go back).
    last_ns: u64,
}

#[derive(Debug, Clone, Copy)]
struct Scale {
    /// The first anchor: the rate is refined over the span since then.
    first_tsc: u64,
    first_ns: u64,
    /// The latest anchor: readings extrapolate from here.
    anchor_tsc: u64,
    anchor_ns: u64,
    /// ns per tick, times 2^SHIFT.
    rate: u64,
}

impl TscClock {
    /// Calibrates against CLOCK_MONOTONIC (spins about 0.2 ms) where the
    /// kernel's clocksource is the TSC; elsewhere a plain `clock_gettime`
    /// clock.
    pub fn new() -> TscClock {
        let tsc = tsc_trusted().then(calibrate).flatten();
        TscClock { tsc, last_ns: 0 }
    }

    /// A clock that always asks `clock_gettime` (to compare against).
    pub fn system() -> TscClock {
        TscClock {
            tsc: None,
            last_ns: 0,
        }
    }

    /// Whether readings come from the TSC.
    pub fn uses_tsc(&self) -> bool {
        self.tsc.is_some()
    }

    /// CLOCK_MONOTONIC now, ns, never less than the last reading.
    pub fn now_ns(&mut self) -> u64 {
        let ns = match &mut self.tsc {
            None => monotonic_ns(),
            Some(s) => {
                let tsc = read_tsc();
                let ticks = tsc.wrapping_sub(s.anchor_tsc);
                if ticks >= REANCHOR_TICKS {
                    s.reanchor(tsc)
                } else {
                    s.anchor_ns + ((u128::from(ticks) * u128::from(s.rate)) >> SHIFT) as u64
                }
            }
        };
        self.last_ns = self.last_ns.max(ns);
        self.last_ns
    }
}

impl Default for TscClock {
    fn default() -> Self {
        TscClock::new()
    }
}

impl Scale {
    /// A fresh anchor on CLOCK_MONOTONIC, and the rate over the span since
    /// the first one; returns the clock's reading.
    fn reanchor(&mut self, tsc_hint: u64) -> u64 {
        let (tsc, ns) = pair().unwrap_or((tsc_hint, monotonic_ns()));
        if let Some(rate) = rate_of(tsc.wrapping_sub(self.first_tsc), ns - self.first_ns) {
            self.rate = rate;
        }
        self.anchor_tsc = tsc;
        self.anchor_ns = ns;
        ns
    }
}

/// ns per tick times 2^SHIFT, if the span is long enough to say.
fn rate_of(ticks: u64, ns: u64) -> Option<u64> {
    (ticks > 0 && ns > 0).then(|| ((u128::from(ns) << SHIFT) / u128::from(ticks)) as u64)
}

/// A TSC reading and a CLOCK_MONOTONIC reading taken together: the pair
/// whose two TSC reads around the clock read are closest, of a few tries
/// (a pair interrupted in between is useless).
fn pair() -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..5 {
        let before = read_tsc();
        let ns = monotonic_ns();
        let after = read_tsc();
        let width = after.wrapping_sub(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, before + width / 2, ns));
        }
    }
    best.map(|(_, tsc, ns)| (tsc, ns))
}

fn calibrate() -> Option<Scale> {
    let (first_tsc, first_ns) = pair()?;
    while monotonic_ns() < first_ns + CALIBRATION_NS {
        std::hint::spin_loop();
    }
    let (tsc, ns) = pair()?;
    let rate = rate_of(tsc.wrapping_sub(first_tsc), ns - first_ns)?;
    Some(Scale {
        first_tsc,
        first_ns,
        anchor_tsc: tsc,
        anchor_ns: ns,
        rate,
    })
}

/// A raw reading of the time stamp counter (on a CPU without one,
/// CLOCK_MONOTONIC in ns): for short spans measured where a
/// `clock_gettime` would cost more than the span (scale them with two
/// `(ticks(), monotonic_ns())` pairs taken far apart).
#[inline]
pub fn ticks() -> u64 {
    read_tsc()
}

/// The kernel keeps CLOCK_MONOTONIC on the TSC only when it found it
/// invariant and synchronized across CPUs.
fn tsc_trusted() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

/// Whether the TSC can be read as a clock here (cached `tsc_trusted`).
pub(crate) fn tsc_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(tsc_trusted)
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn read_tsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter; it has no memory effects and every
    // x86_64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn read_tsc() -> u64 {
    // Never called: `tsc_trusted` is false off x86_64.
    monotonic_ns()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_never_go_back_and_follow_the_monotonic_clock() {
        let mut clock = TscClock::new();
        let mut last = 0;
        let start = monotonic_ns();
        // Past several re-anchorings.
        while monotonic_ns() < start + 20_000_000 {
            let before = monotonic_ns();
            let now = clock.now_ns();
            let after = monotonic_ns();
            assert!(now >= last, "went back: {now} < {last}");
            // Within 50 µs of the system clock read around it (a rate off
            // by 1 % would be 20 µs off after one re-anchor span).
            assert!(
                now + 50_000 >= before && now <= after + 50_000,
                "{now} not near [{before}, {after}] (tsc: {})",
                clock.uses_tsc()
            );
            last = now;
        }
    }

    #[test]
    fn the_system_clock_is_clock_gettime() {
        let mut clock = TscClock::system();
        assert!(!clock.uses_tsc());
        let before = monotonic_ns();
        let now = clock.now_ns();
        assert!(now >= before && now <= monotonic_ns());
    }
}
