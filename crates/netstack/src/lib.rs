//! Ginza's protected-mode netstack (docs/protected.md; docs/design.md,
//! "Protected mode (DLibOS)"): the TCP/IP stack of the applications that
//! choose protected mode, in a process of its own, behind DLibOS's
//! command/event rings.
//!
//! * [`engine`]: [`Netstack`], the heart without threads or sockets:
//!   attached applications, connections (the sans-IO
//!   `ginza_net::tcp::Connection`), listeners, frames in and out, commands
//!   in and events out, and the faults (refusals, cut-offs, detach).
//! * [`slab`]: generation-checked connection and listener ids.
//! * [`server`]: the attach socket (the handshake of
//!   `ginza_proto::netstack`).
//! * [`daemon`]: `netstackd`: registers with iokerneld as an application,
//!   and runs the engine on its kthreads.
//! * [`cli`]: the flags of `netstackd` and `ginza netstack`.
//! * [`metrics`]: its counters for Prometheus (`--metrics`).

#![forbid(unsafe_code)]

pub mod cli;
pub mod daemon;
pub mod engine;
pub mod metrics;
pub mod server;
pub mod slab;

pub use engine::{Attachment, Granted, Netstack, NetstackConfig, NetstackStats, OutFrame};
