//! An open-loop traffic generator: Poisson arrivals of UDP requests that
//! carry their own service time, latency measured from injection to reply.
//!
//! Open loop means arrivals follow the schedule whatever the replies do: a
//! slow server gets a queue, not fewer requests (a closed-loop client would
//! hide its latency by waiting). The generator has no thread and never
//! sleeps: [`TrafficGenerator::poll`] takes the caller's clock reading,
//! collects replies and injects every request whose scheduled time has
//! passed. An arrival that could not be injected (no buffer, link refused it)
//! is counted and not retried, as a late retry would distort the schedule.
//!
//! Requests belong to `flows` flows (each request's flow drawn uniformly,
//! up to [`MAX_FLOWS`]) and each flow numbers its requests (the number also
//! travels in the payload after the header, where it fits). A reply to a flow's request that comes back after a reply to a
//! later request of the same flow counts as reordered: the observable proxy
//! for packets processed out of order within a flow (docs/design.md,
//! "Packet steering").
//!
//! A flow is a source (address, port) pair: with `ports = 65536 - src_port`
//! source ports per address, flow `f` sends from port `src_port + f % ports`
//! of address `interface.ip + f / ports`, so up to `ports` flows use the
//! generator's own address and more take the next addresses in turn (from
//! port 40000, iokerneld's: 25,536 flows per address, 4 addresses for
//! 100,000 flows, 42 for [`MAX_FLOWS`]). Replies to any of those addresses
//! (at the generator's MAC) are its own; the addresses must not wrap past
//! 255.255.255.255 nor, when there are several, include the target's.

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};

use ginza_net::{
    tx, Endpoint, Interface, Ipv4Addr, MacAddr, Packet, UdpDatagram, MAX_UDP_PAYLOAD,
    UDP_PAYLOAD_OFFSET,
};
use ginza_proto::request::{RequestHeader, REQUEST_HEADER_LEN};

use super::{Frame, Nic};

/// Histograms cover 1 ns..60 s at 3 significant digits; longer values count
/// as 60 s.
const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// Flows a generator can send (its per-flow counters take 8 bytes a flow).
pub const MAX_FLOWS: u32 = 1 << 20;

/// Replies taken from the link per `rx_burst` call.
const RX_BURST: usize = 64;

/// How long the server should work on a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServiceTime {
    Constant {
        ns: u64,
    },
    Exponential {
        mean_ns: f64,
    },
    /// `a_ns` with probability `p`, else `b_ns` (e.g. 90 % 5 µs, 10 % 55 µs:
    /// `p: 0.9, a_ns: 5_000, b_ns: 55_000`).
    Bimodal {
        p: f64,
        a_ns: u64,
        b_ns: u64,
    },
}

impl ServiceTime {
    /// The distribution's mean in ns.
    pub fn mean_ns(&self) -> f64 {
        match *self {
            ServiceTime::Constant { ns } => ns as f64,
            ServiceTime::Exponential { mean_ns } => mean_ns,
            ServiceTime::Bimodal { p, a_ns, b_ns } => p * a_ns as f64 + (1.0 - p) * b_ns as f64,
        }
    }

    /// One service time, rounded to the nearest ns.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        match *self {
            ServiceTime::Constant { ns } => ns,
            ServiceTime::Exponential { mean_ns } => {
                // Validated positive and finite by `check`.
                let exp = Exp::new(1.0 / mean_ns).expect("valid exponential mean");
                exp.sample(rng).round() as u64
            }
            ServiceTime::Bimodal { p, a_ns, b_ns } => {
                if rng.random::<f64>() < p {
                    a_ns
                } else {
                    b_ns
                }
            }
        }
    }

    fn check(&self) -> Result<(), GeneratorConfigError> {
        match *self {
            ServiceTime::Constant { .. } => Ok(()),
            ServiceTime::Exponential { mean_ns } if mean_ns.is_finite() && mean_ns > 0.0 => Ok(()),
            ServiceTime::Bimodal { p, .. } if (0.0..=1.0).contains(&p) => Ok(()),
            other => Err(GeneratorConfigError::ServiceTime(other)),
        }
    }
}

/// What the generator sends, to whom, and how fast.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorConfig {
    /// The generator's own addresses (its switch port's MAC); replies must be
    /// sent to them.
    pub interface: Interface,
    pub src_port: u16,
    pub target_mac: MacAddr,
    pub target: Endpoint,
    /// Flows, 1..=[`MAX_FLOWS`]: source ports from `src_port` on, then
    /// the same ports of the next addresses after `interface.ip` (module
    /// documentation).
    pub flows: u32,
    /// Mean arrivals per second of the Poisson process.
    pub rate_per_sec: f64,
    pub service: ServiceTime,
    /// UDP payload bytes per request, at least [`REQUEST_HEADER_LEN`]; the
    /// rest is zeros.
    pub payload_len: usize,
    /// CLOCK_MONOTONIC ns of the start; the first arrival is one random gap
    /// later.
    pub start_ns: u64,
    /// No arrival is scheduled at or after `start_ns + duration_ns`.
    pub duration_ns: u64,
    /// Requests awaiting a reply that the generator remembers; an older one
    /// still unanswered when its slot is needed again counts as lost.
    /// Rounded up to a power of two.
    pub max_outstanding: usize,
    /// Arrivals processed (injected or dropped) per `poll` at most, to bound
    /// one call's time; the rest wait for the next `poll` (and show as lag).
    pub max_burst: usize,
    pub seed: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GeneratorConfigError {
    #[error("rate {0}/s must be positive and finite")]
    Rate(f64),
    #[error("service time {0:?}: means must be positive and finite, p in 0..=1")]
    ServiceTime(ServiceTime),
    #[error("payload of {len} bytes: must be {REQUEST_HEADER_LEN}..={MAX_UDP_PAYLOAD}")]
    PayloadLen { len: usize },
    #[error("max_outstanding and max_burst must be at least 1")]
    ZeroLimit,
    #[error("{flows} flows: must be 1..={MAX_FLOWS}")]
    Flows { flows: u32 },
    #[error(
        "{flows} flows from {first} port {src_port} need source addresses {first}..={last}, \
         which must not wrap past 255.255.255.255 nor include the target {target}"
    )]
    FlowAddresses {
        flows: u32,
        src_port: u16,
        first: Ipv4Addr,
        last: Ipv4Addr,
        target: Ipv4Addr,
    },
}

/// Counts of a generator. Every scheduled arrival ends up in exactly one of
/// `sent`, `no_buffer`, `tx_refused`, `too_large`; every sent request in
/// `replies`, `evicted` or `outstanding`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GeneratorStats {
    /// Arrivals whose scheduled time has come and that were processed.
    pub scheduled: u64,
    pub sent: u64,
    /// The link's pool had no buffer for the request.
    pub no_buffer: u64,
    /// The link did not accept the request.
    pub tx_refused: u64,
    /// The request does not fit the link's buffers.
    pub too_large: u64,
    /// Replies matched to an outstanding request.
    pub replies: u64,
    /// Replies with a sequence number not outstanding: duplicates, replies
    /// to requests already counted lost, or made-up ones.
    pub unmatched_replies: u64,
    /// Frames received that are not a reply to us (not UDP to one of our
    /// flows' addresses and ports, or too short).
    pub malformed_replies: u64,
    /// Requests unanswered when their slot was reused: lost.
    pub evicted: u64,
    /// Requests sent and not answered yet.
    pub outstanding: u64,
    /// Replies (of `replies`) that came back after the reply to a later
    /// request of their flow.
    pub reordered: u64,
}

impl GeneratorStats {
    /// Requests never answered: evicted ones plus those still outstanding
    /// (meaningful as losses once the run is over and replies had time).
    pub fn lost(&self) -> u64 {
        self.evicted + self.outstanding
    }
}

/// See the module documentation.
pub struct TrafficGenerator {
    config: GeneratorConfig,
    rng: SmallRng,
    inter_arrival: Exp<f64>,
    /// Scheduled time of the next arrival; f64 so that the sum of gaps does
    /// not drift by rounding each to a whole ns.
    next_arrival_ns: f64,
    end_ns: f64,
    next_seq: u64,
    /// Outstanding requests, at `seq & slot_mask`.
    outstanding: Vec<Option<Outstanding>>,
    /// Per flow: the number its next request gets.
    flow_next: Vec<u32>,
    /// Per flow: 1 + the highest request number answered (0: none yet).
    flow_answered: Vec<u32>,
    /// Flows' source addresses (`interface.ip` + 0..addresses, as u32)
    /// and ports per address (module documentation).
    first_ip: u32,
    addresses: u32,
    ports: u32,
    slot_mask: u64,
    latency: Histogram<u64>,
    lag: Histogram<u64>,
    /// Reply seen − the posting time a server wrote into the reply's
    /// `send_ns` (a traced spin-server does; others echo ours back, which
    /// is not counted here).
    reply_transit: Histogram<u64>,
    stats: GeneratorStats,
    rx_scratch: Vec<Frame>,
    tx_scratch: Vec<Frame>,
    /// Per frame of `tx_scratch`: its seq, flow and number in the flow.
    tx_seqs: Vec<(u64, u32, u32)>,
}

/// What the generator remembers of a request until its reply.
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    seq: u64,
    send_ns: u64,
    flow: u32,
    flow_seq: u32,
}

impl TrafficGenerator {
    pub fn new(config: GeneratorConfig) -> Result<TrafficGenerator, GeneratorConfigError> {
        if !(config.rate_per_sec.is_finite() && config.rate_per_sec > 0.0) {
            return Err(GeneratorConfigError::Rate(config.rate_per_sec));
        }
        config.service.check()?;
        if !(REQUEST_HEADER_LEN..=MAX_UDP_PAYLOAD).contains(&config.payload_len) {
            return Err(GeneratorConfigError::PayloadLen {
                len: config.payload_len,
            });
        }
        if config.max_outstanding == 0 || config.max_burst == 0 {
            return Err(GeneratorConfigError::ZeroLimit);
        }
        if !(1..=MAX_FLOWS).contains(&config.flows) {
            return Err(GeneratorConfigError::Flows {
                flows: config.flows,
            });
        }
        let ports = 65_536 - u32::from(config.src_port);
        let addresses = config.flows.div_ceil(ports);
        let first_ip = u32::from(config.interface.ip);
        let last_ip = first_ip.checked_add(addresses - 1);
        let target_ip = u32::from(config.target.ip);
        // A source address equal to the target's would make the requests
        // look like the target's own traffic.
        let target_among = addresses > 1 && target_ip.wrapping_sub(first_ip) < addresses;
        if last_ip.is_none() || target_among {
            return Err(GeneratorConfigError::FlowAddresses {
                flows: config.flows,
                src_port: config.src_port,
                first: config.interface.ip,
                last: Ipv4Addr::from(first_ip.wrapping_add(addresses - 1)),
                target: config.target.ip,
            });
        }
        let slots = config.max_outstanding.next_power_of_two();
        let rate_per_ns = config.rate_per_sec / 1e9;
        let mut rng = SmallRng::seed_from_u64(config.seed);
        let inter_arrival =
            Exp::new(rate_per_ns).map_err(|_| GeneratorConfigError::Rate(config.rate_per_sec))?;
        let next_arrival_ns = config.start_ns as f64 + inter_arrival.sample(&mut rng);
        let histogram =
            || Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3).expect("valid histogram bounds");
        Ok(TrafficGenerator {
            end_ns: config.start_ns as f64 + config.duration_ns as f64,
            rng,
            inter_arrival,
            next_arrival_ns,
            next_seq: 0,
            outstanding: vec![None; slots],
            flow_next: vec![0; config.flows as usize],
            flow_answered: vec![0; config.flows as usize],
            first_ip,
            addresses,
            ports,
            slot_mask: slots as u64 - 1,
            latency: histogram(),
            lag: histogram(),
            reply_transit: histogram(),
            stats: GeneratorStats::default(),
            rx_scratch: Vec::with_capacity(RX_BURST),
            tx_scratch: Vec::with_capacity(config.max_burst),
            tx_seqs: Vec::with_capacity(config.max_burst),
            config,
        })
    }

    pub fn config(&self) -> &GeneratorConfig {
        &self.config
    }

    pub fn stats(&self) -> GeneratorStats {
        self.stats
    }

    /// Reply latency (reply seen by `poll` − injection), ns.
    pub fn latency(&self) -> &Histogram<u64> {
        &self.latency
    }

    /// Per injected request: how long after its scheduled time it went out, ns.
    pub fn lag(&self) -> &Histogram<u64> {
        &self.lag
    }

    /// Reply posted by the server → seen by `poll`, ns, for replies whose
    /// server stamped its posting time into the header's `send_ns` (after
    /// our own send time, not after now); empty for a plain echo.
    pub fn reply_transit(&self) -> &Histogram<u64> {
        &self.reply_transit
    }

    /// Whether every arrival of the run has been scheduled.
    pub fn finished_sending(&self) -> bool {
        self.next_arrival_ns >= self.end_ns
    }

    /// Collects replies waiting on `nic`, then injects the requests due by
    /// `now_ns` (at most `max_burst`). Call it each iteration of the loop
    /// with that iteration's clock reading.
    pub fn poll<N: Nic + ?Sized>(&mut self, now_ns: u64, nic: &mut N) {
        self.collect_replies(now_ns, nic);
        self.inject_due(now_ns, nic);
    }

    fn collect_replies<N: Nic + ?Sized>(&mut self, now_ns: u64, nic: &mut N) {
        // Taken out of `self` for the loop, which needs `self` mutably.
        let mut received = std::mem::take(&mut self.rx_scratch);
        while nic.rx_burst(&mut received, RX_BURST) > 0 {
            for frame in received.drain(..) {
                let reply = match self.parse_reply(nic.pool().bytes(&frame)) {
                    Some(Packet::Udp(datagram)) if self.flow_of(&datagram).is_some() => {
                        RequestHeader::decode(datagram.payload)
                    }
                    _ => None,
                };
                // The frame came from this link's pool.
                nic.pool_mut()
                    .free(frame)
                    .expect("a received frame is of the link's pool");
                match reply {
                    Some(header) => self.match_reply(&header, now_ns),
                    None => self.stats.malformed_replies += 1,
                }
            }
        }
        self.rx_scratch = received;
    }

    /// The frame parsed as sent to the generator: to its MAC and one of its
    /// flows' addresses (a reply to a flow of another address than
    /// `interface.ip` is parsed again as that address's).
    fn parse_reply<'a>(&self, frame: &'a [u8]) -> Option<Packet<'a>> {
        match ginza_net::parse(frame, &self.config.interface) {
            Ok(packet) => Some(packet),
            Err(ginza_net::Drop::NotOurIp { dst })
                if u32::from(dst).wrapping_sub(self.first_ip) < self.addresses =>
            {
                let flow_address = Interface {
                    mac: self.config.interface.mac,
                    ip: dst,
                };
                ginza_net::parse(frame, &flow_address).ok()
            }
            Err(_) => None,
        }
    }

    /// The flow a datagram to the generator is addressed to (`None`: an
    /// address and port of no flow).
    fn flow_of(&self, datagram: &UdpDatagram<'_>) -> Option<u32> {
        let address = u32::from(datagram.dst.ip).wrapping_sub(self.first_ip);
        // A port below `src_port` wraps to at least `ports`.
        let port = u32::from(datagram.dst.port.wrapping_sub(self.config.src_port));
        let flow = u64::from(address) * u64::from(self.ports) + u64::from(port);
        (address < self.addresses && port < self.ports && flow < u64::from(self.config.flows))
            .then_some(flow as u32)
    }

    /// The source (address, port) of flow `flow` (module documentation).
    fn flow_source(&self, flow: u32) -> (Ipv4Addr, u16) {
        let ip = Ipv4Addr::from(self.first_ip + flow / self.ports);
        let port = u32::from(self.config.src_port) + flow % self.ports;
        (ip, port as u16)
    }

    /// Latency from our own record of the send time: the copy echoed in the
    /// reply is the server's word, and only the sequence number is needed.
    fn match_reply(&mut self, header: &RequestHeader, now_ns: u64) {
        let seq = header.seq;
        let slot = &mut self.outstanding[(seq & self.slot_mask) as usize];
        match *slot {
            Some(o) if o.seq == seq => {
                *slot = None;
                self.stats.outstanding -= 1;
                self.stats.replies += 1;
                self.latency
                    .saturating_record(now_ns.saturating_sub(o.send_ns));
                // The server's stamp is its word: counted only if it is
                // between our send and now.
                if header.send_ns > o.send_ns && header.send_ns <= now_ns {
                    self.reply_transit
                        .saturating_record(now_ns - header.send_ns);
                }
                let answered = &mut self.flow_answered[o.flow as usize];
                if o.flow_seq < *answered {
                    self.stats.reordered += 1;
                } else {
                    *answered = o.flow_seq + 1;
                }
            }
            _ => self.stats.unmatched_replies += 1,
        }
    }

    fn inject_due<N: Nic + ?Sized>(&mut self, now_ns: u64, nic: &mut N) {
        let now = now_ns as f64;
        let mut processed = 0;
        while self.next_arrival_ns <= now
            && self.next_arrival_ns < self.end_ns
            && processed < self.config.max_burst
        {
            processed += 1;
            let scheduled_ns = self.next_arrival_ns;
            self.next_arrival_ns += self.inter_arrival.sample(&mut self.rng);
            self.stats.scheduled += 1;
            let flow = if self.config.flows == 1 {
                0
            } else {
                self.rng.random_range(0..self.config.flows)
            };
            let flow_seq = self.flow_next[flow as usize];
            let header = RequestHeader {
                seq: self.next_seq,
                send_ns: now_ns,
                service_ns: self.config.service.sample(&mut self.rng),
            };
            let Some(mut frame) = nic.pool_mut().alloc() else {
                self.stats.no_buffer += 1;
                continue;
            };
            let source = self.flow_source(flow);
            let pool = nic.pool_mut();
            match build_request(
                pool.buffer_mut(&mut frame),
                &self.config,
                source,
                &header,
                flow_seq,
            ) {
                Ok(len) => {
                    pool.set_len(&mut frame, len)
                        .expect("built within the buffer");
                    self.tx_scratch.push(frame);
                    self.tx_seqs.push((header.seq, flow, flow_seq));
                    self.next_seq += 1;
                    self.flow_next[flow as usize] = flow_seq.wrapping_add(1);
                    self.lag
                        .saturating_record((now - scheduled_ns).max(0.0) as u64);
                }
                Err(_) => {
                    self.stats.too_large += 1;
                    pool.free(frame).expect("allocated from this pool");
                }
            }
        }
        if self.tx_scratch.is_empty() {
            return;
        }
        let accepted = nic.tx_burst(&mut self.tx_scratch);
        for index in 0..accepted {
            let (seq, flow, flow_seq) = self.tx_seqs[index];
            self.remember(Outstanding {
                seq,
                send_ns: now_ns,
                flow,
                flow_seq,
            });
        }
        self.stats.sent += accepted as u64;
        self.stats.tx_refused += self.tx_scratch.len() as u64;
        for frame in self.tx_scratch.drain(..) {
            nic.pool_mut()
                .free(frame)
                .expect("allocated from this pool");
        }
        self.tx_seqs.clear();
    }

    fn remember(&mut self, request: Outstanding) {
        let slot = &mut self.outstanding[(request.seq & self.slot_mask) as usize];
        if slot.is_some() {
            self.stats.evicted += 1;
        } else {
            self.stats.outstanding += 1;
        }
        *slot = Some(request);
    }
}

/// The one place a request frame is assembled: header fields and zero padding
/// written in place at the UDP payload offset, then Ethernet/IPv4/UDP headers
/// in front of them (no copy); the request's number in its flow follows the
/// header (big-endian u64) where the payload has room. `source` is the
/// flow's address and port. Returns the frame's length.
fn build_request(
    buffer: &mut [u8],
    config: &GeneratorConfig,
    (src_ip, src_port): (Ipv4Addr, u16),
    header: &RequestHeader,
    flow_seq: u32,
) -> Result<usize, ginza_net::BuildError> {
    let payload_end = UDP_PAYLOAD_OFFSET + config.payload_len;
    if let Some(payload) = buffer.get_mut(UDP_PAYLOAD_OFFSET..payload_end) {
        header.encode(payload);
        payload[REQUEST_HEADER_LEN..].fill(0);
        if let Some(number) = payload.get_mut(REQUEST_HEADER_LEN..REQUEST_HEADER_LEN + 8) {
            number.copy_from_slice(&u64::from(flow_seq).to_be_bytes());
        }
    }
    // Reports a buffer that is too small, whether or not the payload fit.
    let from = Interface {
        mac: config.interface.mac,
        ip: src_ip,
    };
    tx::write_udp_headers(
        buffer,
        &from,
        config.target_mac,
        src_port,
        config.target,
        config.payload_len,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_and_count_of_a(service: ServiceTime, samples: usize, seed: u64) -> (f64, usize) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut sum = 0.0;
        let mut count_of_a = 0;
        for _ in 0..samples {
            let ns = service.sample(&mut rng);
            if let ServiceTime::Bimodal { a_ns, .. } = service {
                count_of_a += usize::from(ns == a_ns);
            }
            sum += ns as f64;
        }
        (sum / samples as f64, count_of_a)
    }

    #[test]
    fn service_time_means_match_within_five_standard_errors() {
        const SAMPLES: usize = 200_000;
        let constant = ServiceTime::Constant { ns: 10_000 };
        assert_eq!(mean_and_count_of_a(constant, 100, 1).0, 10_000.0);

        let exponential = ServiceTime::Exponential { mean_ns: 10_000.0 };
        let (mean, _) = mean_and_count_of_a(exponential, SAMPLES, 2);
        // An exponential's standard deviation is its mean.
        let standard_error = 10_000.0 / (SAMPLES as f64).sqrt();
        assert!(
            (mean - 10_000.0).abs() < 5.0 * standard_error,
            "mean {mean}"
        );

        let bimodal = ServiceTime::Bimodal {
            p: 0.9,
            a_ns: 5_000,
            b_ns: 55_000,
        };
        assert_eq!(bimodal.mean_ns(), 10_000.0);
        let (mean, count_of_a) = mean_and_count_of_a(bimodal, SAMPLES, 3);
        let standard_deviation = 50_000.0 * (0.9f64 * 0.1).sqrt();
        let standard_error = standard_deviation / (SAMPLES as f64).sqrt();
        assert!(
            (mean - 10_000.0).abs() < 5.0 * standard_error,
            "mean {mean}"
        );
        let share = count_of_a as f64 / SAMPLES as f64;
        let share_error = (0.9f64 * 0.1 / SAMPLES as f64).sqrt();
        assert!((share - 0.9).abs() < 5.0 * share_error, "share {share}");
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(ServiceTime::Exponential { mean_ns: 0.0 }.check().is_err());
        assert!(ServiceTime::Bimodal {
            p: 1.5,
            a_ns: 1,
            b_ns: 2
        }
        .check()
        .is_err());
    }

    #[test]
    fn each_flow_has_its_own_source_and_replies_map_back_to_it() {
        let config = GeneratorConfig {
            interface: Interface {
                mac: MacAddr([2, 0, 0, 0, 0, 1]),
                ip: Ipv4Addr::new(10, 0, 0, 254),
            },
            src_port: 40_000,
            target_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            target: Endpoint::new(Ipv4Addr::new(10, 1, 0, 1), 7),
            flows: MAX_FLOWS,
            rate_per_sec: 1000.0,
            service: ServiceTime::Constant { ns: 0 },
            payload_len: REQUEST_HEADER_LEN,
            start_ns: 0,
            duration_ns: 1,
            max_outstanding: 1,
            max_burst: 1,
            seed: 1,
        };
        let generator = TrafficGenerator::new(config).unwrap();
        let reply_to = |(ip, port): (Ipv4Addr, u16)| UdpDatagram {
            src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            src: Endpoint::new(Ipv4Addr::new(10, 1, 0, 1), 7),
            dst: Endpoint::new(ip, port),
            payload: &[],
        };
        let mut sources = std::collections::HashSet::new();
        for flow in (0..MAX_FLOWS)
            .step_by(97)
            .chain([25_535, 25_536, MAX_FLOWS - 1])
        {
            let source = generator.flow_source(flow);
            assert!(sources.insert(source), "flow {flow}: {source:?} reused");
            assert_eq!(generator.flow_of(&reply_to(source)), Some(flow));
        }
        assert_eq!(
            generator.flow_source(25_536),
            (Ipv4Addr::new(10, 0, 0, 255), 40_000)
        );
        // 2^20 flows of 25,536 ports: 42 addresses, the last one's first
        // 1,600 ports.
        let last = Ipv4Addr::new(10, 0, 1, 39);
        assert_eq!(generator.flow_source(MAX_FLOWS - 1), (last, 41_599));
        for stranger in [
            (last, 41_600),
            (Ipv4Addr::new(10, 0, 1, 40), 40_000),
            (Ipv4Addr::new(10, 0, 0, 253), 40_000),
            (Ipv4Addr::new(10, 0, 0, 254), 39_999),
        ] {
            assert_eq!(generator.flow_of(&reply_to(stranger)), None, "{stranger:?}");
        }
    }
}
