//! Discrete-event simulator over `ginza-policy`: arrivals, queues and cores
//! driving the very policy objects iokerneld and the runtime use.
//!
//! Simulated time is a `u64` in picoseconds (`PS_PER_US` per µs), so
//! sub-nanosecond service times stay exact enough and the policy crate gets
//! integer time as it does in iokerneld.
#![forbid(unsafe_code)]

pub mod allocsim;
pub mod calisto;
pub mod cli;
pub mod colocate;
pub mod dist;
pub mod figs;
pub mod plot;
pub mod reqsim;
pub mod rss;
pub mod scenario;
pub mod stats;
pub mod steering;
pub mod theory;
pub mod validate;

/// Picoseconds per microsecond.
pub const PS_PER_US: f64 = 1e6;

/// Microseconds (f64) to simulated picoseconds.
pub fn us_to_ps(us: f64) -> u64 {
    (us * PS_PER_US).round().max(0.0) as u64
}

/// Simulated picoseconds to microseconds.
pub fn ps_to_us(ps: u64) -> f64 {
    ps as f64 / PS_PER_US
}
