//! Ginza's applications (docs/design.md, "Applications, load and experiments"),
//! each a library module that runs inside a Ginza runtime and a binary that
//! starts one (the flags they share: [`app_args`]):
//!
//! * [`spin_server`]: UDP requests that carry their own service time.
//! * [`request_trace`]: per-request stamps of the spin-server (where a
//!   request's time goes, for `ginza demo`).
//! * [`echo_server`]: echo (RFC 862) over UDP and TCP, many connections.
//! * [`echo_client`]: round trips and bulk transfers to echo servers and sinks.
//! * [`http_server`]: HTTP/1.1 with keep-alive, `GET /` and `GET /bytes/N`;
//!   [`http_async`]: the same over the protected netstack's event loop.
//! * [`scan_server`]: GET and range SCAN over an ordered map (UDP, TCP; Shinjuku mode).
//! * [`kv`]: a memcached-compatible key-value server (text and binary
//!   protocols over TCP, UDP frames).
//! * [`serve`]: the serving skeleton they share (a UDP uthread beside a TCP
//!   acceptor, a stop flag).
//! * [`batch`]: Monte Carlo option pricing, best effort, paths per second.
#![forbid(unsafe_code)]

pub mod app_args;
pub mod batch;
pub mod echo_client;
pub mod echo_server;
pub mod http_async;
pub mod http_server;
pub mod kv;
pub mod request_trace;
pub mod scan_server;
pub mod serve;
pub mod spin_server;
