//! Ginza policies: pure code, no I/O (see docs/design.md, "The core allocator").
//!
//! Everything here is a plain function of its inputs (queue snapshots,
//! topology, time, an injected seed) so that iokerneld, the runtime and the
//! simulator run the very same decisions.
//!
//! Time is a `u64` in any monotonic unit chosen by the caller (iokerneld uses
//! nanoseconds, the simulator picoseconds); intervals, quanta and SLOs passed
//! to a policy must be in the same unit.
#![forbid(unsafe_code)]

pub mod alloc;
pub mod rng;
pub mod sched;
pub mod steer;

/// A point in time or a duration, in the caller's unit (see crate docs).
pub type Time = u64;
