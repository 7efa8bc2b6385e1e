//! Where a round trip spends its time, hop by hop along a path of
//! [`Hop`]s: the first request after a quiet spell
//! ([`Hop::FIRST_REQUEST`]: the client's send, iokerneld's wake from its
//! sleep, the frame taken and delivered, the grant, the parked kthread's
//! wake, the reply's way back; `ginza bench idle`), or a TCP echo
//! ([`Hop::TCP_ECHO`]: through iokerneld, on the direct path, or to a
//! Linux server; `ginza bench tcp`).
//!
//! A setup passes only some of the hops (iokerneld that spins never wakes,
//! a server that polls is never granted, a Linux server has no runtime),
//! so each hop's span is the time since the last hop before it *that the
//! round trip passed*. A figure is the median over the round trips that
//! passed the hop.

use ginza_sys::hops::{Hop, Stamps};
use serde::Serialize;

use crate::harness::figures::median;

/// One hop's span: from the hop before it on the path that was stamped.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct HopSpan {
    /// The hop the span ends at (`Hop::name`).
    pub hop: &'static str,
    /// The median span, µs.
    pub us: f64,
    /// How many round trips passed the hop (and the one before).
    pub trips: usize,
}

/// Each stamped hop's span in one round trip along `path`, µs, path order; `None`
/// for a hop not passed, or stamped before the hop preceding it (a stamp
/// left from another event, e.g. a kthread's timer grant).
pub(crate) fn trip_spans(path: &[Hop], stamps: &Stamps, ticks_per_us: f64) -> Vec<Option<f64>> {
    let mut last = None;
    path.iter()
        .map(|&hop| {
            let at = stamps[hop as usize];
            if at == 0 {
                return None;
            }
            let span = match last {
                Some(before) if at >= before => Some((at - before) as f64 / ticks_per_us),
                Some(_) => return None,
                None => None,
            };
            last = Some(at);
            span
        })
        .collect()
}

/// The medians of each hop's span over `trips` (hops no trip passed are
/// left out; the client's send, the first, has no span).
pub(crate) fn median_spans(path: &[Hop], trips: &[Stamps], ticks_per_us: f64) -> Vec<HopSpan> {
    let per_trip: Vec<Vec<Option<f64>>> = trips
        .iter()
        .map(|s| trip_spans(path, s, ticks_per_us))
        .collect();
    path.iter()
        .enumerate()
        .filter_map(|(i, hop)| {
            let spans: Vec<f64> = per_trip.iter().filter_map(|t| t[i]).collect();
            median(&spans).map(|us| HopSpan {
                hop: hop.name(),
                us,
                trips: spans.len(),
            })
        })
        .collect()
}

/// One line: `→hop us (trips)` in path order.
pub(crate) fn line(spans: &[HopSpan]) -> String {
    spans
        .iter()
        .map(|s| format!("→{} {:.1} ({})", s.hop, s.us, s.trips))
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(hops: &[(Hop, u64)]) -> Stamps {
        let mut s = [0; ginza_sys::hops::HOPS];
        for &(h, t) in hops {
            s[h as usize] = t;
        }
        s
    }

    #[test]
    fn a_span_runs_from_the_last_hop_passed() {
        // A polling server: no wake of iokerneld, no grant.
        let s = stamped(&[
            (Hop::ClientSend, 1000),
            (Hop::NicRx, 3000),
            (Hop::Picked, 4000),
            (Hop::ClientRecv, 9000),
        ]);
        let spans = trip_spans(&Hop::FIRST_REQUEST, &s, 1000.0);
        let at = |h: Hop| spans[Hop::FIRST_REQUEST.iter().position(|&x| x == h).unwrap()];
        assert_eq!(at(Hop::ClientSend), None);
        assert_eq!(at(Hop::IokernelWoke), None);
        assert_eq!(at(Hop::NicRx), Some(2.0));
        assert_eq!(at(Hop::Picked), Some(1.0));
        assert_eq!(at(Hop::ClientRecv), Some(5.0));
    }

    #[test]
    fn a_stamp_out_of_order_is_left_out() {
        // A grant stamped before the frame came (a timer's grant).
        let s = stamped(&[
            (Hop::ClientSend, 1000),
            (Hop::NicRx, 3000),
            (Hop::Granted, 2000),
            (Hop::KthreadRuns, 5000),
        ]);
        let spans = trip_spans(&Hop::FIRST_REQUEST, &s, 1000.0);
        let at = |h: Hop| spans[Hop::FIRST_REQUEST.iter().position(|&x| x == h).unwrap()];
        assert_eq!(at(Hop::Granted), None);
        // The run counts from the frame, the last hop in order.
        assert_eq!(at(Hop::KthreadRuns), Some(2.0));
    }

    #[test]
    fn a_linux_echo_passes_its_read_and_write_only() {
        // `ginza bench tcp`'s Linux servers stamp their read and write; the
        // runtime's hops are not on their path.
        let s = stamped(&[
            (Hop::ClientSend, 1000),
            (Hop::AppRead, 9000),
            (Hop::ServerWrite, 9500),
            (Hop::ClientRecv, 16_000),
        ]);
        let spans = trip_spans(&Hop::TCP_ECHO, &s, 1000.0);
        let at = |h: Hop| spans[Hop::TCP_ECHO.iter().position(|&x| x == h).unwrap()];
        assert_eq!(at(Hop::Picked), None);
        assert_eq!(at(Hop::AppRead), Some(8.0));
        assert_eq!(at(Hop::ServerWrite), Some(0.5));
        assert_eq!(at(Hop::ClientRecv), Some(6.5));
    }

    #[test]
    fn medians_per_hop_over_the_trips_that_passed_it() {
        let woke = |t: u64| {
            stamped(&[
                (Hop::ClientSend, 1000),
                (Hop::IokernelWoke, 1000 + t),
                (Hop::NicRx, 2000 + t),
            ])
        };
        let awake = stamped(&[(Hop::ClientSend, 1000), (Hop::NicRx, 1500)]);
        let spans = median_spans(
            &Hop::FIRST_REQUEST,
            &[woke(10_000), woke(30_000), woke(20_000), awake],
            1000.0,
        );
        assert_eq!(
            spans,
            vec![
                HopSpan {
                    hop: "iokernel_woke",
                    us: 20.0,
                    trips: 3
                },
                HopSpan {
                    hop: "nic_rx",
                    us: 1.0,
                    trips: 4
                },
            ]
        );
        assert!(line(&spans).starts_with("→iokernel_woke 20.0 (3)"));
    }
}
