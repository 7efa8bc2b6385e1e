//! Per-request latency for iokerneld's metrics (docs/metrics.md): an
//! application says how long each request took, from its arrival (the
//! packet's or the read's) to its reply's send, and the runtime adds it to
//! the histogram of the kthread running the caller, in the shared region,
//! where iokerneld reads it and exports `ginza_app_request_latency_seconds`
//! labelled with the application's name.
//!
//! A sample is a bucket search and two plain stores, with preemption
//! deferred so that the kthread stays the histogram's only writer. Outside
//! iokerneld (standalone runtimes, threads that are no kthread) nothing is
//! recorded: there is no one to read it.
//!
//! ```no_run
//! # fn answer(_: &[u8]) {}
//! let timer = ginza_runtime::metrics::RequestTimer::start(); // the request was read
//! answer(b"request");
//! timer.finish(); // the reply was sent
//! ```

use std::time::Duration;

use crate::deferral;
use crate::sched::current_kthread_ref;

/// Records one request that took `latency`.
pub fn record_request(latency: Duration) {
    record_request_ns(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
}

/// Records one request that took `ns` nanoseconds.
#[inline]
pub fn record_request_ns(ns: u64) {
    let _deferred = deferral::Guard::new();
    if let Some(io) = current_kthread_ref().and_then(|k| k.io.as_ref()) {
        io.latency.record(ns);
    }
}

/// Times one request, from its arrival to its reply's send, on
/// CLOCK_MONOTONIC (cheap to carry across uthreads: a number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a request timer records nothing until `finish`"]
pub struct RequestTimer {
    arrived_ns: u64,
}

impl RequestTimer {
    /// The request arrives now.
    pub fn start() -> RequestTimer {
        RequestTimer {
            arrived_ns: ginza_sys::clock::monotonic_ns(),
        }
    }

    /// The request arrived at `arrived_ns` (CLOCK_MONOTONIC), e.g. the
    /// stamp of its packet.
    pub fn since(arrived_ns: u64) -> RequestTimer {
        RequestTimer { arrived_ns }
    }

    /// When the request arrived (CLOCK_MONOTONIC ns).
    pub fn arrived_ns(&self) -> u64 {
        self.arrived_ns
    }

    /// The reply has been sent: records the request's latency and returns
    /// it.
    pub fn finish(self) -> Duration {
        self.finish_n(1)
    }

    /// The replies to `n` requests that arrived together (one read) have
    /// been sent: records `n` samples of the same latency and returns it.
    pub fn finish_n(self, n: usize) -> Duration {
        let ns = ginza_sys::clock::monotonic_ns().saturating_sub(self.arrived_ns);
        for _ in 0..n {
            record_request_ns(ns);
        }
        Duration::from_nanos(ns)
    }
}
