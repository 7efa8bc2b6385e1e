//! TSC stamps of one datagram's hops through iokerneld and a runtime, for
//! `ginza bench forward`'s round-trip breakdown (docs/results.md,
//! "Dataplane").
//!
//! The bench sends one datagram at a time, so one slot per hop is enough:
//! the client clears the slots ([`clear`]) before it sends, each hop on
//! the way stores the TSC in its slot the *first* time it is passed
//! ([`stamp`]), and the client reads them all ([`take`]) once the answer
//! is in. Off by default: a hop then costs one relaxed load. The slots are
//! this process's, so only a bench that runs iokerneld, the runtime and the
//! client in one process (as `bench forward` does) sees the whole path.
//! Readings compare across CPUs only where the TSC is synchronized (the
//! kernel's clocksource is `tsc`; [`ticks_per_us`] says `None` elsewhere).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::clock::monotonic_ns;

/// A point on a UDP round trip through Ginza, in path order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Hop {
    /// The client is about to send.
    ClientSend,
    /// iokerneld took the frame off the NIC's receive ring.
    NicRx,
    /// iokerneld published it on a kthread's ingress ring.
    Delivered,
    /// A kthread of the runtime took it off its ingress ring.
    Picked,
    /// The application's reply is on its egress ring.
    Replied,
    /// iokerneld took the reply off the egress ring.
    Egress,
    /// iokerneld calls the NIC's transmit (AF_XDP: the `sendto` kick).
    Kick,
    /// That call returned (on a veth it runs the peer's receive, and the
    /// client's wake, inside it).
    Kicked,
    /// The client has the answer.
    ClientRecv,
}

/// How many hops there are.
pub const HOPS: usize = Hop::ClientRecv as usize + 1;

static ENABLED: AtomicBool = AtomicBool::new(false);
static SLOTS: [AtomicU64; HOPS] = [const { AtomicU64::new(0) }; HOPS];

/// Turns stamping on or off (for the whole process).
pub fn enable(on: bool) {
    ENABLED.store(on, Relaxed);
}

/// Whether stamping is on.
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// Records `hop` now, unless it was already recorded since the last
/// [`clear`].
#[inline]
pub fn stamp(hop: Hop) {
    if ENABLED.load(Relaxed) {
        let _ = SLOTS[hop as usize].compare_exchange(0, read_tsc().max(1), Relaxed, Relaxed);
    }
}

/// Forgets every hop's stamp.
pub fn clear() {
    for slot in &SLOTS {
        slot.store(0, Relaxed);
    }
}

/// Every hop's stamp (TSC ticks; 0 where the hop was not passed) since the
/// last [`clear`], in [`Hop`] order.
pub fn take() -> [u64; HOPS] {
    std::array::from_fn(|i| SLOTS[i].load(Relaxed))
}

/// The TSC now.
pub fn now() -> u64 {
    read_tsc()
}

/// TSC ticks per µs, measured against CLOCK_MONOTONIC over `over`; `None`
/// where the TSC is not the kernel's clocksource (stamps taken on two
/// CPUs could not be compared).
pub fn ticks_per_us(over: std::time::Duration) -> Option<f64> {
    let trusted = cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc");
    if !trusted {
        return None;
    }
    let (ns0, tsc0) = (monotonic_ns(), read_tsc());
    std::thread::sleep(over);
    let (ns1, tsc1) = (monotonic_ns(), read_tsc());
    let ns = ns1.saturating_sub(ns0);
    (ns > 0).then(|| tsc1.wrapping_sub(tsc0) as f64 * 1e3 / ns as f64)
}

#[cfg(target_arch = "x86_64")]
fn read_tsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter; it has no memory effects and every
    // x86_64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_tsc() -> u64 {
    // Off x86_64 `ticks_per_us` is `None`: readings are never compared.
    monotonic_ns()
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the slots are the process's, and tests run in parallel.
    #[test]
    fn stamps_only_when_enabled_and_keep_the_first() {
        clear();
        stamp(Hop::NicRx);
        assert_eq!(take()[Hop::NicRx as usize], 0, "off by default");
        enable(true);
        stamp(Hop::NicRx);
        let first = take()[Hop::NicRx as usize];
        assert_ne!(first, 0);
        stamp(Hop::NicRx);
        assert_eq!(take()[Hop::NicRx as usize], first, "the first pass is kept");
        assert_eq!(take()[Hop::Kicked as usize], 0);
        clear();
        assert!(take().iter().all(|&t| t == 0));
        enable(false);
    }
}
