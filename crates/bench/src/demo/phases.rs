//! Where a request's time goes (docs/results.md, "Where a request's time
//! goes"): the spin-server's per-request stamps
//! (`ginza_apps::request_trace`) and the generator's reply transit, turned
//! into per-phase medians and p99s for one point.
//!
//! Phases, CLOCK_MONOTONIC on both sides (one process):
//! * `inject_to_decided`: the generator's injection → iokerneld's decision
//!   to grant `lc` a core (iokerneld steering the packet, its congestion
//!   or work-arrived pass) — only requests that found `lc` parked, and
//!   of those only the ones injected before the decision (one that came
//!   while a wake was already under way has no such span);
//! * `decided_to_running`: → `lc`'s kthread running (the grant word or
//!   the eventfd write, and the kernel's wake-up of the thread on a CPU
//!   running `batch`);
//! * `running_to_picked`: → the receiver uthread has the datagram (the
//!   runtime after the wake: its scheduler loop, the ingress ring, the
//!   switch to the receiver);
//! * `inject_to_picked`: the three together, or, for a request that found
//!   `lc` running, all of its way in;
//! * `picked_to_started`: → the request's own uthread runs (spawn, and
//!   the requests queued before it);
//! * `started_to_reply`: its service (spinning, wall clock, so time the
//!   kthread lost its CPU shows here) up to posting the reply;
//! * `reply_to_seen`: → iokerneld's generator sees the reply (egress ring,
//!   iokerneld's next turn).

use ginza_apps::request_trace::RequestStamps;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::harness::figures::round3;

/// p50 and p99 of one phase, µs, over `n` requests (0 and 0 when `n` is 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Span {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) n: usize,
}

impl Span {
    fn of(mut ns: Vec<u64>) -> Span {
        if ns.is_empty() {
            return Span::default();
        }
        ns.sort_unstable();
        let at = |q: f64| {
            let i = ((ns.len() as f64 * q).ceil() as usize).clamp(1, ns.len()) - 1;
            round3(ns[i] as f64 / 1e3)
        };
        Span {
            p50_us: at(0.50),
            p99_us: at(0.99),
            n: ns.len(),
        }
    }

    fn of_histogram(h: &Histogram<u64>) -> Span {
        if h.is_empty() {
            return Span::default();
        }
        let at = |q: f64| round3(h.value_at_quantile(q) as f64 / 1e3);
        Span {
            p50_us: at(0.50),
            p99_us: at(0.99),
            n: h.len() as usize,
        }
    }
}

/// The way in of the requests that found `lc`'s kthread parked.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct WokenPhases {
    pub(crate) inject_to_decided: Span,
    pub(crate) decided_to_running: Span,
    pub(crate) running_to_picked: Span,
    pub(crate) inject_to_picked: Span,
}

/// One point's breakdown (module documentation).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Phases {
    /// Requests traced (injected in the measured window and answered).
    pub(crate) requests: usize,
    /// Requests past the trace's capacity (not in the figures).
    pub(crate) untraced: usize,
    /// Of the traced requests, the share that found `lc` parked.
    pub(crate) waited_for_wake_share: f64,
    /// Those requests' way in.
    pub(crate) woken: WokenPhases,
    /// The way in of the requests that found `lc` running.
    pub(crate) found_running_inject_to_picked: Span,
    /// Every traced request.
    pub(crate) inject_to_picked: Span,
    pub(crate) picked_to_started: Span,
    pub(crate) started_to_reply: Span,
    pub(crate) reply_to_seen: Span,
}

/// The breakdown of the requests injected in `[from_ns, to_ns]`.
pub(crate) fn breakdown(
    records: &[RequestStamps],
    (from_ns, to_ns): (u64, u64),
    untraced: usize,
    reply_transit: &Histogram<u64>,
) -> Phases {
    let window: Vec<&RequestStamps> = records
        .iter()
        .filter(|r| (from_ns..=to_ns).contains(&r.inject_ns) && r.reply_ns != 0)
        .collect();
    let span = |f: &dyn Fn(&RequestStamps) -> Option<u64>, woken: Option<bool>| {
        Span::of(
            window
                .iter()
                .filter(|r| woken.is_none_or(|w| r.waited_for_wake() == w))
                .filter_map(|r| f(r))
                .collect(),
        )
    };
    let gap = |a: fn(&RequestStamps) -> u64, b: fn(&RequestStamps) -> u64| {
        move |r: &RequestStamps| b(r).checked_sub(a(r))
    };
    let inject = |r: &RequestStamps| r.inject_ns;
    let decided = |r: &RequestStamps| r.decided_ns;
    let running = |r: &RequestStamps| r.running_ns;
    let picked = |r: &RequestStamps| r.picked_ns;
    let started = |r: &RequestStamps| r.started_ns;
    let reply = |r: &RequestStamps| r.reply_ns;
    let woken = window.iter().filter(|r| r.waited_for_wake()).count();
    Phases {
        requests: window.len(),
        untraced,
        waited_for_wake_share: if window.is_empty() {
            0.0
        } else {
            round3(woken as f64 / window.len() as f64)
        },
        woken: WokenPhases {
            inject_to_decided: span(&gap(inject, decided), Some(true)),
            decided_to_running: span(&gap(decided, running), Some(true)),
            running_to_picked: span(&gap(running, picked), Some(true)),
            inject_to_picked: span(&gap(inject, picked), Some(true)),
        },
        found_running_inject_to_picked: span(&gap(inject, picked), Some(false)),
        inject_to_picked: span(&gap(inject, picked), None),
        picked_to_started: span(&gap(picked, started), None),
        started_to_reply: span(&gap(started, reply), None),
        reply_to_seen: Span::of_histogram(reply_transit),
    }
}

/// One line of the table's breakdown (p50s, µs; `-`: no request took
/// that way).
pub(crate) fn describe(p: &Phases) -> String {
    let us = |s: &Span| {
        if s.n == 0 {
            "-".to_string()
        } else {
            format!("{:.1}", s.p50_us)
        }
    };
    let w = &p.woken;
    format!(
        "{:.0} % found lc parked: injected → decided {}, → running {}, → picked {} \
         (in all {}); found running: injected → picked {}; picked → started {}, \
         → reply {}, → seen {}",
        p.waited_for_wake_share * 100.0,
        us(&w.inject_to_decided),
        us(&w.decided_to_running),
        us(&w.running_to_picked),
        us(&w.inject_to_picked),
        us(&p.found_running_inject_to_picked),
        us(&p.picked_to_started),
        us(&p.started_to_reply),
        us(&p.reply_to_seen),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps(inject: u64, woke: Option<(u64, u64)>, picked: u64) -> RequestStamps {
        let (decided_ns, running_ns) = woke.unwrap_or((10, 20));
        RequestStamps {
            inject_ns: inject,
            decided_ns,
            running_ns,
            picked_ns: picked,
            started_ns: picked + 1_000,
            reply_ns: picked + 11_000,
            service_ns: 10_000,
        }
    }

    #[test]
    fn requests_split_by_whether_they_waited_for_a_wake() {
        let records = vec![
            // Woken: 2 µs to the decision, 5 to running, 3 to picked.
            stamps(100_000, Some((102_000, 107_000)), 110_000),
            stamps(200_000, Some((202_000, 207_000)), 210_000),
            // Found running (its kthread last woke before the injection).
            stamps(300_000, None, 301_000),
            // Outside the window.
            stamps(900_000, None, 901_000),
            // Not answered.
            RequestStamps {
                inject_ns: 400_000,
                ..Default::default()
            },
        ];
        let mut h = Histogram::<u64>::new(3).unwrap();
        h.record(4_000).unwrap();
        let p = breakdown(&records, (0, 500_000), 7, &h);
        assert_eq!(p.requests, 3);
        assert_eq!(p.untraced, 7);
        assert_eq!(p.waited_for_wake_share, 0.667);
        assert_eq!(p.woken.inject_to_decided.p50_us, 2.0);
        assert_eq!(p.woken.decided_to_running.p50_us, 5.0);
        assert_eq!(p.woken.running_to_picked.p50_us, 3.0);
        assert_eq!(p.woken.inject_to_picked.n, 2);
        assert_eq!(p.found_running_inject_to_picked.p50_us, 1.0);
        assert_eq!(p.found_running_inject_to_picked.n, 1);
        assert_eq!(p.inject_to_picked.p99_us, 10.0);
        assert_eq!(p.picked_to_started.p50_us, 1.0);
        assert_eq!(p.started_to_reply.p50_us, 10.0);
        assert_eq!(p.reply_to_seen.n, 1);
        assert!(describe(&p).starts_with("67 % found lc parked: injected → decided 2.0,"));
        let none_woken = breakdown(&records[2..3], (0, 500_000), 0, &h);
        assert!(
            describe(&none_woken).contains("decided -, → running -"),
            "{}",
            describe(&none_woken)
        );
        let empty = breakdown(&[], (0, 1), 0, &Histogram::new(3).unwrap());
        assert_eq!(empty.inject_to_picked, Span::default());
        assert_eq!(empty.waited_for_wake_share, 0.0);
    }
}
