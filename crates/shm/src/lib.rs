//! Shared memory between iokerneld and a runtime (see docs/design.md, "Shared
//! memory between iokerneld and a runtime").
//!
//! * [`region`]: the memfd-backed region, its `#[repr(C)]` header and the
//!   validation iokerneld applies before trusting any offset in it.
//! * [`queue_line`]: one cache line per kthread that the runtime writes and
//!   iokerneld samples for congestion detection.
//! * [`wake_word`]: how a grant reaches a parked kthread: a word in its
//!   queue line while it lingers, its eventfd or its word of the wake
//!   page once it sleeps.
//! * [`iokernel_bell`]: how a runtime wakes a sleeping iokerneld (a flag
//!   on its queue lines, an eventfd).
//! * [`request_latency`]: the per-kthread histograms of request latency
//!   that the runtime writes and iokerneld exports, untrusted.
//! * [`wake_page`]: the futex words kthreads sleep on for a grant, which
//!   iokerneld, or the kthread on the granted core, wakes.
//! * [`ring`]: the `#[repr(C)]`, pointer-free SPSC ring both processes map.
//! * [`msg`]: the command messages of the per-kthread command rings.
//! * [`packet`]: packet descriptors, egress buffers, the read-only ingress
//!   pool and iokerneld's ledger of lent buffers.
//! * [`netstack`]: protected mode's channel (command and event rings) and
//!   payload pools (docs/protected.md).
//!
//! The two processes do not trust each other: everything read from the
//! peer's side is copied once and checked; a broken peer yields a typed
//! error, never an out-of-bounds access or a panic.

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(not(loom))]
pub mod iokernel_bell;
pub mod msg;
pub mod netstack;
pub mod packet;
pub mod queue_line;
pub mod region;
pub mod request_latency;
pub mod ring;
mod sync;
#[cfg(not(loom))]
pub mod wake_page;
pub mod wake_word;

#[cfg(not(loom))]
pub use iokernel_bell::IokernelBell;
pub use msg::{
    next_grant, CmdRx, CmdTx, DecodeError, Message, PreemptReason, RawMsg, RecvError, RunPacket,
    SendError, ToIokernel, ToKthread, MAX_REQUEST_ID, UNNUMBERED_GRANT,
};
pub use packet::{
    BufferLedger, EgressBuffers, IngressPool, LedgerError, PacketDesc, PoolMapError,
    MAX_INGRESS_BUFFERS, PKT_BUFFER_SIZE,
};
pub use queue_line::{LineFlags, LineSnap, QueueLine};
pub use region::{
    Header, HeaderError, IokernelEnd, LatencyRef, Layout, LineRef, Region, RegionConfig,
    RegionError, RuntimeEnd,
};
pub use request_latency::{LatencyHistogram, LatencyRead, LatencyTally};
pub use ring::{heap_ring, Consumer, Producer, PushError, RingCorrupt};
#[cfg(not(loom))]
pub use wake_page::{WakePage, WakePageError, WAKE_PAGE_BLOCKS};
pub use wake_word::{BeforeSleep, GrantDelivery, WakeWord};

/// Proptest settings: `cases` normally, `miri_cases` under Miri, where
/// failures are not persisted (Miri's isolation forbids file access).
#[cfg(all(test, not(loom)))]
pub(crate) fn test_config(cases: u32, miri_cases: u32) -> proptest::test_runner::Config {
    let mut c =
        proptest::test_runner::Config::with_cases(if cfg!(miri) { miri_cases } else { cases });
    if cfg!(miri) {
        c.failure_persistence = None;
    }
    c
}
