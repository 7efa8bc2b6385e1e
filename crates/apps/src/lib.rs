//! Ginza's applications (docs/design.md, "Applications, load and experiments"),
//! each a library module that runs inside a Ginza runtime and a binary that
//! starts one:
//!
//! * [`spin_server`]: UDP requests that carry their own service time.
//! * [`batch`]: Monte Carlo option pricing, best effort, paths per second.
#![forbid(unsafe_code)]

pub mod batch;
pub mod spin_server;
