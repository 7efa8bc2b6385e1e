//! Where a Ginza UDP round trip's time goes, hop by hop, from the TSC
//! stamps of [`ginza_sys::hops`] (docs/results.md, "Dataplane").
//!
//! Each round trip gives one stamp per hop it passed; a span is the time
//! between two consecutive hops. A round's figure for a span is its median
//! over the round trips that have both ends (a hop can be missed, e.g. a
//! reply that never came); the spans' medians need not add up to the
//! round trip's median.

use ginza_sys::hops::{Hop, Stamps};
use serde::Serialize;

use crate::harness::figures::median;

/// Medians of one round's round trips, µs, one per span in path order.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Spans {
    /// Client `send` → iokerneld takes the frame off the NIC ring (the
    /// client's send, the veth, the XDP redirect, until iokerneld polls).
    pub client_to_nic_rx: f64,
    /// iokerneld: NIC ring → a kthread's ingress ring (copies, switch,
    /// steering).
    pub nic_rx_to_ingress: f64,
    /// Ingress ring → the kthread takes the frame (its wake if it parked).
    pub ingress_to_app: f64,
    /// The runtime and the application: the frame taken → the reply on the
    /// egress ring.
    pub app_to_reply: f64,
    /// Egress ring → iokerneld takes the reply.
    pub reply_to_iokernel: f64,
    /// iokerneld: the reply taken → the NIC's transmit call (switch,
    /// copies into the UMEM).
    pub iokernel_to_kick: f64,
    /// The transmit call → the client has the answer: on a veth with
    /// AF_XDP the `sendto` kick runs the kernel's transmit, the peer's
    /// receive and the client's wake; then the client must get its CPU.
    pub kick_to_client: f64,
    /// The transmit call itself (call → return), over the round trips
    /// where it returned before the client had the answer (not when the
    /// client shares iokerneld's CPU: it then runs before the call
    /// returns).
    pub kick_call: f64,
    /// Client `send` → the answer, over the same round trips.
    pub total: f64,
    /// Round trips with every hop stamped.
    pub complete: usize,
}

/// Consecutive hops and the span between them.
const PAIRS: [(Hop, Hop); 7] = [
    (Hop::ClientSend, Hop::NicRx),
    (Hop::NicRx, Hop::Delivered),
    (Hop::Delivered, Hop::Picked),
    (Hop::Picked, Hop::Replied),
    (Hop::Replied, Hop::Egress),
    (Hop::Egress, Hop::Kick),
    (Hop::Kick, Hop::ClientRecv),
];

impl Spans {
    /// One round's spans from each round trip's stamps (TSC ticks, 0 for a
    /// hop not passed) and the TSC's rate; `None` if no round trip had any
    /// of Ginza's hops (e.g. a Linux server).
    pub(crate) fn of_round(stamps: &[Stamps], ticks_per_us: f64) -> Option<Spans> {
        let span = |s: &Stamps, (from, to): (Hop, Hop)| {
            let (a, b) = (s[from as usize], s[to as usize]);
            (a != 0 && b >= a).then(|| (b - a) as f64 / ticks_per_us)
        };
        let per_pair: Vec<Vec<f64>> = PAIRS
            .iter()
            .map(|&pair| stamps.iter().filter_map(|s| span(s, pair)).collect())
            .collect();
        if per_pair[1..PAIRS.len() - 1].iter().all(Vec::is_empty) {
            return None;
        }
        let m = |i: usize| median(&per_pair[i]).unwrap_or(f64::NAN);
        let totals: Vec<f64> = stamps
            .iter()
            .filter_map(|s| span(s, (Hop::ClientSend, Hop::ClientRecv)))
            .collect();
        let calls: Vec<f64> = stamps
            .iter()
            .filter(|s| s[Hop::Kicked as usize] <= s[Hop::ClientRecv as usize])
            .filter_map(|s| span(s, (Hop::Kick, Hop::Kicked)))
            .collect();
        Some(Spans {
            client_to_nic_rx: m(0),
            nic_rx_to_ingress: m(1),
            ingress_to_app: m(2),
            app_to_reply: m(3),
            reply_to_iokernel: m(4),
            iokernel_to_kick: m(5),
            kick_to_client: m(6),
            kick_call: median(&calls).unwrap_or(f64::NAN),
            total: median(&totals).unwrap_or(f64::NAN),
            complete: stamps
                .iter()
                .filter(|s| Hop::UDP_ECHO.iter().all(|&h| s[h as usize] != 0))
                .count(),
        })
    }

    /// [`of_round`](Self::of_round) over the slowest `percent` % of the
    /// round trips (by client send → answer; at least one): where the
    /// tail's time went.
    pub(crate) fn of_slowest(stamps: &[Stamps], ticks_per_us: f64, percent: f64) -> Option<Spans> {
        let total = |s: &Stamps| {
            let (a, b) = (s[Hop::ClientSend as usize], s[Hop::ClientRecv as usize]);
            (a != 0 && b >= a).then(|| b - a)
        };
        let mut answered: Vec<&Stamps> = stamps.iter().filter(|s| total(s).is_some()).collect();
        answered.sort_by_key(|s| std::cmp::Reverse(total(s)));
        let keep = ((answered.len() as f64 * percent / 100.0).ceil() as usize).max(1);
        let slowest: Vec<Stamps> = answered.into_iter().take(keep).copied().collect();
        Spans::of_round(&slowest, ticks_per_us)
    }

    /// The median of each span over rounds.
    pub(crate) fn median_of(rounds: &[Spans]) -> Option<Spans> {
        if rounds.is_empty() {
            return None;
        }
        let m = |f: fn(&Spans) -> f64| {
            median(
                &rounds
                    .iter()
                    .map(f)
                    .filter(|x| !x.is_nan())
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(f64::NAN)
        };
        Some(Spans {
            client_to_nic_rx: m(|s| s.client_to_nic_rx),
            nic_rx_to_ingress: m(|s| s.nic_rx_to_ingress),
            ingress_to_app: m(|s| s.ingress_to_app),
            app_to_reply: m(|s| s.app_to_reply),
            reply_to_iokernel: m(|s| s.reply_to_iokernel),
            iokernel_to_kick: m(|s| s.iokernel_to_kick),
            kick_to_client: m(|s| s.kick_to_client),
            kick_call: m(|s| s.kick_call),
            total: m(|s| s.total),
            complete: rounds.iter().map(|s| s.complete).sum(),
        })
    }

    /// One line: the spans in path order.
    pub(crate) fn line(&self) -> String {
        format!(
            "client→nic {:.1} | →ingress {:.1} | →app {:.1} | →reply {:.1} | →iokerneld {:.1} | →kick {:.1} | →client {:.1} (total {:.1}; the kick call {:.1})",
            self.client_to_nic_rx,
            self.nic_rx_to_ingress,
            self.ingress_to_app,
            self.app_to_reply,
            self.reply_to_iokernel,
            self.iokernel_to_kick,
            self.kick_to_client,
            self.total,
            self.kick_call
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The UDP echo's hop `i` stamped at `(i + 1) * step`, the others 0.
    fn trip(step: u64) -> Stamps {
        let mut s = [0; ginza_sys::hops::HOPS];
        for (i, h) in Hop::UDP_ECHO.into_iter().enumerate() {
            s[h as usize] = (i as u64 + 1) * step;
        }
        s
    }

    #[test]
    fn spans_are_medians_of_consecutive_hops() {
        let stamps = [trip(1000), trip(3000), trip(2000)];
        let s = Spans::of_round(&stamps, 1000.0).expect("Ginza's hops are there");
        assert_eq!(s.client_to_nic_rx, 2.0);
        // Kick → ClientRecv passes Kicked.
        assert_eq!(s.kick_to_client, 4.0);
        assert_eq!(s.kick_call, 2.0);
        assert_eq!(s.total, 16.0);
        assert_eq!(s.complete, 3);
    }

    #[test]
    fn missing_or_backward_hops_are_left_out() {
        let mut partial = trip(1000);
        partial[Hop::Picked as usize] = 0;
        let mut backward = trip(1000);
        backward[Hop::Egress as usize] = 1;
        let s = Spans::of_round(&[partial, backward, trip(5000)], 1000.0).unwrap();
        // Delivered → Picked: not the partial trip's (1 and 5 µs).
        assert_eq!(s.ingress_to_app, 3.0);
        // Replied → Egress: not the backward trip's (1 and 5 µs).
        assert_eq!(s.reply_to_iokernel, 3.0);
        // Egress → Kick: 1 µs, 5 µs and the backward trip's 6,999 ticks.
        assert_eq!(s.iokernel_to_kick, 5.0);
        assert_eq!(s.complete, 2);
    }

    #[test]
    fn a_linux_round_has_no_spans() {
        let mut client_only = [0u64; ginza_sys::hops::HOPS];
        client_only[Hop::ClientSend as usize] = 10;
        client_only[Hop::ClientRecv as usize] = 50;
        assert_eq!(Spans::of_round(&[client_only], 1.0), None);
    }

    #[test]
    fn the_slowest_trips_alone() {
        let trips: Vec<Stamps> = (1..=100).map(|i| trip(i * 10)).collect();
        let s = Spans::of_slowest(&trips, 1.0, 2.0).unwrap();
        // Trips 100 and 99: steps of 1000 and 990 ticks.
        assert_eq!(s.client_to_nic_rx, 995.0);
        assert_eq!(s.complete, 2);
        assert_eq!(Spans::of_slowest(&[], 1.0, 1.0), None);
    }

    #[test]
    fn median_over_rounds() {
        let a = Spans {
            total: 10.0,
            complete: 1,
            ..Spans::default()
        };
        let b = Spans {
            total: 30.0,
            complete: 2,
            ..a
        };
        let c = Spans {
            total: f64::NAN,
            complete: 0,
            ..a
        };
        let m = Spans::median_of(&[a, b, c]).unwrap();
        assert_eq!(m.total, 20.0);
        assert_eq!(m.complete, 3);
        assert_eq!(Spans::median_of(&[]), None);
    }
}
