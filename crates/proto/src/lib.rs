//! The runtime ⇄ iokerneld protocol (docs/design.md, "Processes", "Layout"):
//! what an application links to talk to iokerneld, without the daemon.
//!
//! * [`messages`]: the messages on the control socket (JSON over
//!   SOCK_SEQPACKET, descriptors by SCM_RIGHTS), application [`Class`]es,
//!   the stats report.
//! * [`client`]: registering an application ([`Connection`]), reading and
//!   resetting iokerneld's stats, the [default socket
//!   path](default_socket_path).
//! * [`request`]: the [`RequestHeader`] of the synthetic workload that the
//!   traffic generator sends and spin-server answers.
//! * [`content`]: the reproducible bytes of bulk transfers, their hash and
//!   a sink's receipt (the TCP tests and benchmark).
//! * [`duration`]: durations as every Ginza command line writes them.
//! * [`netstack`]: protected mode's commands and events (DLibOS Table 1),
//!   their slot encoding, and the attach handshake with the netstack.
//!
//! The fast path (queue lines, command and packet rings) is shared memory,
//! in `ginza_shm`; the OS calls are `ginza_sys`'s. This crate has no
//! `unsafe` code.

#![forbid(unsafe_code)]

pub mod client;
pub mod content;
pub mod duration;
pub mod messages;
pub mod netstack;
pub mod request;

pub use client::{
    default_socket_path, user_socket_path, ClientError, Connection, SYSTEM_SOCKET_PATH,
};
pub use duration::parse_duration;
pub use messages::{
    AppStats, Class, IdleStats, Registration, Removal, StatsReport, PROTOCOL_VERSION,
};
pub use request::{RequestHeader, REQUEST_HEADER_LEN};
