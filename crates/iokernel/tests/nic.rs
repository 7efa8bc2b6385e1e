//! The software NIC backend end to end: ports exchanging frames through the
//! switch, the traffic generator against an echo server, drops by reason.
//! Every clock here is synthetic, so each test is deterministic for its seeds.

use ginza_iokernel::nic::generator::MAX_FLOWS;
use ginza_iokernel::nic::{
    BufferPool, Frame, GeneratorConfig, GeneratorConfigError, GeneratorStats, Nic, PoolError,
    PortConfig, PortId, ServiceTime, SoftwareSwitch, TrafficGenerator,
};
use ginza_net::{tx, Endpoint, Interface, Ipv4Addr, MacAddr, Packet};
use ginza_proto::RequestHeader;

const GENERATOR: Interface = Interface {
    mac: MacAddr([2, 0, 0, 0, 0, 1]),
    ip: Ipv4Addr::new(10, 0, 0, 1),
};
const SERVER: Interface = Interface {
    mac: MacAddr([2, 0, 0, 0, 0, 2]),
    ip: Ipv4Addr::new(10, 0, 0, 2),
};
const SERVER_PORT: u16 = 7;

fn generator_config(rate_per_sec: f64, duration_ns: u64, seed: u64) -> GeneratorConfig {
    GeneratorConfig {
        interface: GENERATOR,
        src_port: 40_000,
        target_mac: SERVER.mac,
        target: Endpoint::new(SERVER.ip, SERVER_PORT),
        flows: 1,
        rate_per_sec,
        service: ServiceTime::Bimodal {
            p: 0.9,
            a_ns: 5_000,
            b_ns: 55_000,
        },
        payload_len: 64,
        start_ns: 1_000_000,
        duration_ns,
        max_outstanding: 4096,
        max_burst: 64,
        seed,
    }
}

/// A generator port and a server port on a fresh switch.
fn two_port_switch() -> (SoftwareSwitch, PortId, PortId) {
    let mut switch = SoftwareSwitch::new();
    let generator = switch.add_port(PortConfig::new(GENERATOR.mac)).unwrap();
    let server = switch.add_port(PortConfig::new(SERVER.mac)).unwrap();
    (switch, generator, server)
}

/// What the echo server saw.
#[derive(Default)]
struct EchoLog {
    requests: u64,
    service_ns_sum: f64,
}

/// Answers each UDP request waiting at `port` with its payload, except those
/// `drop_request` picks; returns how many it answered.
fn echo(nic: &mut impl Nic, log: &mut EchoLog, drop_request: impl Fn(u64) -> bool) -> usize {
    let mut received = Vec::new();
    let mut replies = Vec::new();
    nic.rx_burst(&mut received, usize::MAX);
    for request in received {
        let mut reply_buffer = [0u8; 2048];
        let reply_len = match ginza_net::parse(nic.pool().bytes(&request), &SERVER) {
            Ok(Packet::Udp(datagram)) => {
                let header = RequestHeader::decode(datagram.payload).expect("a request header");
                log.requests += 1;
                log.service_ns_sum += header.service_ns as f64;
                (!drop_request(header.seq)).then(|| {
                    tx::udp_datagram(
                        &mut reply_buffer,
                        &SERVER,
                        datagram.src_mac,
                        datagram.dst.port,
                        datagram.src,
                        datagram.payload,
                    )
                    .unwrap()
                })
            }
            other => panic!("the server got {other:?}"),
        };
        nic.pool_mut().free(request).unwrap();
        if let Some(len) = reply_len {
            replies.push(nic.pool_mut().alloc_copy(&reply_buffer[..len]).unwrap());
        }
    }
    let answered = replies.len();
    assert_eq!(nic.tx_burst(&mut replies), answered);
    answered
}

/// Runs the generator against the echo server in `step_ns` steps until the
/// run is over and `drain_steps` more steps have passed.
fn run_echo(
    generator: &mut TrafficGenerator,
    switch: &mut SoftwareSwitch,
    ports: (PortId, PortId),
    step_ns: u64,
    log: &mut EchoLog,
    drop_request: impl Fn(u64) -> bool + Copy,
) {
    let mut now = generator.config().start_ns;
    let mut drain_steps = 3;
    while drain_steps > 0 {
        generator.poll(now, &mut switch.port(ports.0).unwrap());
        echo(&mut switch.port(ports.1).unwrap(), log, drop_request);
        if generator.finished_sending() {
            drain_steps -= 1;
        }
        now += step_ns;
    }
}

#[test]
fn generator_and_echo_server_exchange_frames_through_the_switch() {
    let (mut switch, generator_port, server_port) = two_port_switch();
    let mut generator = TrafficGenerator::new(generator_config(200_000.0, 20_000_000, 1)).unwrap();
    let mut log = EchoLog::default();
    let step_ns = 1_000;
    run_echo(
        &mut generator,
        &mut switch,
        (generator_port, server_port),
        step_ns,
        &mut log,
        |_| false,
    );

    let stats = generator.stats();
    assert!(stats.sent > 3_000, "{stats:?}");
    assert_eq!(stats.scheduled, stats.sent);
    assert_eq!(log.requests, stats.sent);
    assert_eq!(stats.replies, stats.sent);
    assert_eq!(generator.latency().len(), stats.replies);
    assert_eq!(stats.lost(), 0);
    assert_eq!((stats.unmatched_replies, stats.malformed_replies), (0, 0));
    // The server answers within the step of the injection; the generator sees
    // the reply at its next poll, one step later.
    let latency = generator.latency();
    assert!(
        latency.equivalent(latency.min(), step_ns),
        "{}",
        latency.min()
    );
    assert!(
        latency.equivalent(latency.max(), step_ns),
        "{}",
        latency.max()
    );
    // A 1 µs loop is never more than a step late.
    assert!(generator.lag().max() <= step_ns);

    // The bimodal service times (mean 10 µs, sd 15 µs) travelled in the requests.
    let mean = log.service_ns_sum / log.requests as f64;
    let standard_error = 15_000.0 / (log.requests as f64).sqrt();
    assert!(
        (mean - 10_000.0).abs() < 5.0 * standard_error,
        "mean {mean}"
    );

    for port in [generator_port, server_port] {
        assert_eq!(switch.counters(port).unwrap().drops.total(), 0);
        assert_eq!(switch.pool(port).unwrap().in_use(), 0, "leaked buffers");
    }
    let server = switch.counters(server_port).unwrap();
    assert_eq!(
        (server.rx_frames, server.tx_frames),
        (stats.sent, stats.sent)
    );
}

#[test]
fn unanswered_requests_are_lost_and_duplicates_unmatched() {
    let (mut switch, generator_port, server_port) = two_port_switch();
    let mut generator = TrafficGenerator::new(generator_config(100_000.0, 10_000_000, 2)).unwrap();
    let mut log = EchoLog::default();
    run_echo(
        &mut generator,
        &mut switch,
        (generator_port, server_port),
        2_000,
        &mut log,
        |seq| seq % 10 == 3,
    );
    let stats = generator.stats();
    let unanswered = (stats.sent + 6) / 10;
    assert_eq!(stats.lost(), unanswered);
    assert_eq!(stats.replies + unanswered, stats.sent);
    assert_eq!(generator.latency().len(), stats.replies);

    // A reply to seq 0 again (answered already) is unmatched; garbage is
    // malformed.
    let mut server = switch.port(server_port).unwrap();
    let mut payload = [0u8; 24];
    RequestHeader {
        seq: 0,
        send_ns: 0,
        service_ns: 0,
    }
    .encode(&mut payload);
    let mut buffer = [0u8; 128];
    let len = tx::udp_datagram(
        &mut buffer,
        &SERVER,
        GENERATOR.mac,
        SERVER_PORT,
        Endpoint::new(GENERATOR.ip, 40_000),
        &payload,
    )
    .unwrap();
    let duplicate = server.pool_mut().alloc_copy(&buffer[..len]).unwrap();
    let mut garbage = buffer;
    garbage[20] ^= 0xff; // inside the IPv4 header: bad checksum
    let garbage = server.pool_mut().alloc_copy(&garbage[..len]).unwrap();
    server.tx_burst(&mut vec![duplicate, garbage]);
    let end = generator.config().start_ns + generator.config().duration_ns + 1_000_000;
    generator.poll(end, &mut switch.port(generator_port).unwrap());
    let after = generator.stats();
    assert_eq!((after.unmatched_replies, after.malformed_replies), (1, 1));
    assert_eq!(after.replies, stats.replies);
}

fn port_config(mac_last: u8, buffers: usize, rx_ring_capacity: usize) -> PortConfig {
    PortConfig {
        buffers,
        rx_ring_capacity,
        ..PortConfig::new(MacAddr([2, 0, 0, 0, 1, mac_last]))
    }
}

fn ethernet_frame(dst: MacAddr, src: MacAddr, body: u8) -> Vec<u8> {
    let mut bytes = Vec::from(dst.0);
    bytes.extend_from_slice(&src.0);
    bytes.extend_from_slice(&[0x88, 0xb5]); // local experimental ethertype
    bytes.extend_from_slice(&[body; 46]);
    bytes
}

/// Sends one frame per body from `from` to `dst`.
fn send(
    switch: &mut SoftwareSwitch,
    from: PortId,
    dst: MacAddr,
    bodies: impl IntoIterator<Item = u8>,
) {
    let mut port = switch.port(from).unwrap();
    let src = port.mac();
    let mut burst: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            port.pool_mut()
                .alloc_copy(&ethernet_frame(dst, src, body))
                .unwrap()
        })
        .collect();
    let count = burst.len();
    assert_eq!(port.tx_burst(&mut burst), count);
}

/// The bodies of the frames waiting at `at`, freed.
fn received_bodies(switch: &mut SoftwareSwitch, at: PortId) -> Vec<u8> {
    let mut port = switch.port(at).unwrap();
    let mut frames = Vec::new();
    port.rx_burst(&mut frames, usize::MAX);
    frames
        .into_iter()
        .map(|frame| {
            let body = port.pool().bytes(&frame)[14];
            port.pool_mut().free(frame).unwrap();
            body
        })
        .collect()
}

#[test]
fn broadcast_reaches_every_other_port_and_unknown_macs_are_counted() {
    let mut switch = SoftwareSwitch::new();
    let ports: Vec<PortId> = (1..=4)
        .map(|last| switch.add_port(port_config(last, 16, 16)).unwrap())
        .collect();
    send(&mut switch, ports[0], MacAddr::BROADCAST, [1, 2]);
    assert!(received_bodies(&mut switch, ports[0]).is_empty());
    for &port in &ports[1..] {
        assert_eq!(received_bodies(&mut switch, port), vec![1, 2]);
    }
    send(
        &mut switch,
        ports[1],
        MacAddr([2, 0, 0, 0, 9, 9]),
        [3, 4, 5],
    );
    // A multicast group nobody joined is unknown too.
    send(&mut switch, ports[1], MacAddr([1, 0, 0x5e, 0, 0, 1]), [6]);
    let counters = switch.counters(ports[1]).unwrap();
    assert_eq!(counters.drops.unknown_destination, 4);
    assert_eq!(counters.tx_frames, 4);
    for &port in &ports {
        assert!(received_bodies(&mut switch, port).is_empty());
        assert_eq!(switch.pool(port).unwrap().in_use(), 0);
    }
}

#[test]
fn exhausted_pool_and_full_ring_are_counted_at_the_receiver_only() {
    let mut switch = SoftwareSwitch::new();
    let sender = switch.add_port(port_config(1, 64, 64)).unwrap();
    let few_buffers = switch.add_port(port_config(2, 2, 8)).unwrap();
    let short_ring = switch.add_port(port_config(3, 8, 2)).unwrap();
    let bystander = switch.add_port(port_config(4, 8, 8)).unwrap();
    let mac_of = |last| MacAddr([2, 0, 0, 0, 1, last]);

    send(&mut switch, sender, mac_of(2), 0..5);
    send(&mut switch, sender, mac_of(3), 0..3);
    send(&mut switch, sender, mac_of(4), [9]);

    let drops = switch.counters(few_buffers).unwrap().drops;
    assert_eq!((drops.no_buffer, drops.total()), (3, 3));
    assert_eq!(switch.pool(few_buffers).unwrap().stats().exhausted, 3);
    let drops = switch.counters(short_ring).unwrap().drops;
    assert_eq!((drops.rx_ring_full, drops.total()), (1, 1));
    assert_eq!(switch.counters(sender).unwrap().drops.total(), 0);
    assert_eq!(switch.counters(bystander).unwrap().drops.total(), 0);
    assert_eq!(received_bodies(&mut switch, few_buffers), vec![0, 1]);
    assert_eq!(received_bodies(&mut switch, short_ring), vec![0, 1]);
    assert_eq!(received_bodies(&mut switch, bystander), vec![9]);

    // Room again once the receiver freed its frames.
    send(&mut switch, sender, mac_of(2), [7]);
    assert_eq!(received_bodies(&mut switch, few_buffers), vec![7]);
}

#[test]
fn generator_counts_arrivals_it_has_no_buffer_for() {
    let mut switch = SoftwareSwitch::new();
    let generator_port = switch
        .add_port(PortConfig {
            buffers: 4,
            ..PortConfig::new(GENERATOR.mac)
        })
        .unwrap();
    let server_port = switch.add_port(PortConfig::new(SERVER.mac)).unwrap();
    let mut generator = TrafficGenerator::new(generator_config(1_000_000.0, 1_000_000, 3)).unwrap();
    // One poll at the end: about 1000 arrivals due, at most 64 per poll, and
    // 4 buffers to build them in.
    let end = generator.config().start_ns + 1_000_000;
    generator.poll(end, &mut switch.port(generator_port).unwrap());
    let stats = generator.stats();
    assert_eq!(stats.scheduled, 64);
    assert_eq!((stats.sent, stats.no_buffer), (4, 60));
    assert_eq!(switch.pool(generator_port).unwrap().in_use(), 0);
    assert_eq!(switch.counters(server_port).unwrap().rx_frames, 4);
    // The frames that went out were about 1 ms late (the first arrival's
    // gap is random).
    assert!(generator.lag().max() > 900_000, "{}", generator.lag().max());
}

#[test]
fn arrivals_over_an_interval_match_rate_times_time() {
    // Poisson arrivals: the count over T is Poisson(rate × T), standard
    // deviation sqrt(rate × T). Each seed must land within 5 of them (chance
    // of a miss about 6e-7 per seed), and the sum over seeds too.
    let rate_per_sec = 500_000.0;
    let duration_ns = 10_000_000;
    let expected = rate_per_sec * duration_ns as f64 / 1e9; // 5000
    let seeds = 8;
    let mut total = 0;
    for seed in 0..seeds {
        let mut switch = SoftwareSwitch::new();
        let generator_port = switch.add_port(PortConfig::new(GENERATOR.mac)).unwrap();
        let sink = switch.add_port(PortConfig::new(SERVER.mac)).unwrap();
        let mut generator =
            TrafficGenerator::new(generator_config(rate_per_sec, duration_ns, seed)).unwrap();
        let mut now = generator.config().start_ns;
        let mut requests = Vec::new();
        while !generator.finished_sending() {
            now += 20_000;
            generator.poll(now, &mut switch.port(generator_port).unwrap());
            let mut sink = switch.port(sink).unwrap();
            sink.rx_burst(&mut requests, usize::MAX);
            for frame in requests.drain(..) {
                sink.pool_mut().free(frame).unwrap();
            }
        }
        let stats = generator.stats();
        assert_eq!(stats.sent, stats.scheduled);
        assert_eq!(switch.counters(sink).unwrap().rx_frames, stats.sent);
        let deviation = (stats.sent as f64 - expected).abs();
        assert!(
            deviation < 5.0 * expected.sqrt(),
            "seed {seed}: {} arrivals",
            stats.sent
        );
        total += stats.sent;
    }
    let expected_total = expected * seeds as f64;
    assert!(
        (total as f64 - expected_total).abs() < 5.0 * expected_total.sqrt(),
        "{total} arrivals"
    );
}

#[test]
fn a_descriptor_cannot_be_reclaimed_twice() {
    // A frame handle is moved into `free`, so freeing it twice does not
    // compile (a compile_fail doctest on `Frame`); a descriptor that came
    // back over a ring is plain numbers and is checked at run time.
    let mut pool = BufferPool::new(4, 2048);
    let frame = pool.alloc_copy(b"request").unwrap();
    let descriptor = pool.lend(frame).unwrap();
    let frame = pool.reclaim(descriptor).unwrap();
    pool.free(frame).unwrap();
    assert_eq!(
        pool.reclaim(descriptor),
        Err(PoolError::NotLent {
            index: descriptor.index
        })
    );
    assert_eq!(pool.available(), 4);
}

/// A link that takes at most one frame per burst and receives nothing, like a
/// NIC whose transmit ring is nearly full.
struct OneSlotLink {
    pool: BufferPool,
    transmitted: usize,
}

impl Nic for OneSlotLink {
    fn pool(&self) -> &BufferPool {
        &self.pool
    }

    fn pool_mut(&mut self) -> &mut BufferPool {
        &mut self.pool
    }

    fn rx_burst(&mut self, _out: &mut Vec<Frame>, _max: usize) -> usize {
        0
    }

    fn tx_burst(&mut self, frames: &mut Vec<Frame>) -> usize {
        if frames.is_empty() {
            return 0;
        }
        self.pool.free(frames.remove(0)).unwrap();
        self.transmitted += 1;
        1
    }
}

#[test]
fn requests_the_link_refuses_are_counted_and_their_buffers_freed() {
    let mut link = OneSlotLink {
        pool: BufferPool::new(64, 2048),
        transmitted: 0,
    };
    let mut generator = TrafficGenerator::new(generator_config(1_000_000.0, 1_000_000, 4)).unwrap();
    let start = generator.config().start_ns;
    // Three polls with several arrivals due each: one goes out per poll.
    for step in 1..=3 {
        generator.poll(start + step * 20_000, &mut link);
    }
    let stats = generator.stats();
    assert_eq!((stats.sent, link.transmitted as u64), (3, 3));
    assert_eq!(stats.outstanding, 3);
    assert!(stats.tx_refused > 20, "{stats:?}");
    assert_eq!(stats.sent + stats.tx_refused, stats.scheduled);
    assert_eq!(link.pool.in_use(), 0);
}

/// Requests of 8 flows, answered a burst at a time in reverse: the
/// generator counts as reordered exactly the replies that come after a
/// later request of their flow was answered (the server works that out from
/// the source port and the number after the header), and echoing in order
/// counts none.
#[test]
fn replies_out_of_order_within_a_flow_are_counted() {
    for reverse in [false, true] {
        let (mut switch, generator_port, server_port) = two_port_switch();
        let mut config = generator_config(500_000.0, 2_000_000, 5);
        config.flows = 8;
        let mut generator = TrafficGenerator::new(config).unwrap();
        let mut answered = std::collections::HashMap::<u16, u64>::new();
        let (mut expected, mut ports_seen) = (0u64, std::collections::HashSet::new());
        let mut now = generator.config().start_ns;
        let mut drain_steps = 3;
        while drain_steps > 0 {
            generator.poll(now, &mut switch.port(generator_port).unwrap());
            let mut nic = switch.port(server_port).unwrap();
            let mut received = Vec::new();
            nic.rx_burst(&mut received, usize::MAX);
            if reverse {
                received.reverse();
            }
            let mut replies = Vec::new();
            for request in received {
                let mut reply = [0u8; 2048];
                let len = match ginza_net::parse(nic.pool().bytes(&request), &SERVER) {
                    Ok(Packet::Udp(d)) => {
                        let number = u64::from_be_bytes(d.payload[24..32].try_into().unwrap());
                        let high = answered.entry(d.src.port).or_insert(0);
                        if number < *high {
                            expected += 1;
                        } else {
                            *high = number + 1;
                        }
                        ports_seen.insert(d.src.port);
                        tx::udp_datagram(
                            &mut reply, &SERVER, d.src_mac, d.dst.port, d.src, d.payload,
                        )
                        .unwrap()
                    }
                    other => panic!("the server got {other:?}"),
                };
                nic.pool_mut().free(request).unwrap();
                replies.push(nic.pool_mut().alloc_copy(&reply[..len]).unwrap());
            }
            let n = replies.len();
            assert_eq!(nic.tx_burst(&mut replies), n);
            if generator.finished_sending() {
                drain_steps -= 1;
            }
            now += 20_000;
        }
        let st = generator.stats();
        assert_eq!(st.replies, st.sent, "{st:?}");
        assert_eq!(ports_seen, (40_000..40_008).collect(), "every flow is used");
        assert_eq!(st.reordered, expected, "{st:?}");
        if reverse {
            assert!(st.reordered > 0, "{st:?}");
        } else {
            assert_eq!(st.reordered, 0, "{st:?}");
        }
    }
}

#[test]
fn flows_beyond_the_maximum_or_onto_the_target_address_are_refused() {
    let mut config = generator_config(1000.0, 1_000, 1);
    config.flows = 0;
    assert!(TrafficGenerator::new(config.clone()).is_err());
    config.flows = MAX_FLOWS + 1;
    let error = TrafficGenerator::new(config.clone()).err().unwrap();
    assert_eq!(
        error,
        GeneratorConfigError::Flows {
            flows: MAX_FLOWS + 1
        }
    );
    assert!(error.to_string().contains("1..=1048576"), "{error}");
    config.flows = MAX_FLOWS;
    config.target.ip = FAR_SERVER.ip;
    assert!(TrafficGenerator::new(config.clone()).is_ok());
    // 537 flows from port 65000 take two addresses, 10.0.0.1 and the
    // server's 10.0.0.2.
    config.target.ip = SERVER.ip;
    config.src_port = 65_000;
    config.flows = 536;
    assert!(TrafficGenerator::new(config.clone()).is_ok());
    config.flows = 537;
    let error = TrafficGenerator::new(config.clone()).err().unwrap();
    assert!(
        matches!(error, GeneratorConfigError::FlowAddresses { last, .. } if last == SERVER.ip),
        "{error}"
    );
    // Addresses that would wrap past 255.255.255.255.
    config.interface.ip = Ipv4Addr::new(255, 255, 255, 255);
    assert!(matches!(
        TrafficGenerator::new(config),
        Err(GeneratorConfigError::FlowAddresses { .. })
    ));
}

/// A server on the switch at `SERVER`'s MAC but another address, so that
/// many flows' source addresses (from `GENERATOR`'s on) do not reach it.
const FAR_SERVER: Interface = Interface {
    mac: SERVER.mac,
    ip: Ipv4Addr::new(10, 0, 1, 2),
};

/// What [`echo_flows`] saw: per source (address, port), the numbers in the
/// requests' flow in the order they arrived, and how many replies it sent
/// after the reply to a later request of their flow.
struct FlowLog {
    numbers: std::collections::HashMap<(Ipv4Addr, u16), Vec<u64>>,
    expected_reordered: u64,
}

/// Runs `config`'s generator against an echo server at [`FAR_SERVER`] that
/// answers each burst in order, or in reverse.
fn echo_flows(config: GeneratorConfig, reverse: bool) -> (GeneratorStats, FlowLog) {
    let (mut switch, generator_port, server_port) = two_port_switch();
    let mut generator = TrafficGenerator::new(config).unwrap();
    let mut log = FlowLog {
        numbers: std::collections::HashMap::new(),
        expected_reordered: 0,
    };
    let mut answered = std::collections::HashMap::<(Ipv4Addr, u16), u64>::new();
    let mut now = generator.config().start_ns;
    let mut drain_steps = 3;
    while drain_steps > 0 {
        generator.poll(now, &mut switch.port(generator_port).unwrap());
        let mut nic = switch.port(server_port).unwrap();
        let mut received = Vec::new();
        nic.rx_burst(&mut received, usize::MAX);
        if reverse {
            received.reverse();
        }
        let mut replies = Vec::new();
        for request in received {
            let mut reply = [0u8; 2048];
            let len = match ginza_net::parse(nic.pool().bytes(&request), &FAR_SERVER) {
                Ok(Packet::Udp(d)) => {
                    let number = u64::from_be_bytes(d.payload[24..32].try_into().unwrap());
                    let source = (d.src.ip, d.src.port);
                    log.numbers.entry(source).or_default().push(number);
                    let high = answered.entry(source).or_insert(0);
                    if number < *high {
                        log.expected_reordered += 1;
                    } else {
                        *high = number + 1;
                    }
                    tx::udp_datagram(
                        &mut reply,
                        &FAR_SERVER,
                        d.src_mac,
                        d.dst.port,
                        d.src,
                        d.payload,
                    )
                    .unwrap()
                }
                other => panic!("the server got {other:?}"),
            };
            nic.pool_mut().free(request).unwrap();
            replies.push(nic.pool_mut().alloc_copy(&reply[..len]).unwrap());
        }
        let n = replies.len();
        assert_eq!(nic.tx_burst(&mut replies), n);
        if generator.finished_sending() {
            drain_steps -= 1;
        }
        now += 20_000;
    }
    (generator.stats(), log)
}

/// 100,000 flows from port 40000: 25,536 ports of each of 10.0.0.1..=3 and
/// 23,392 of 10.0.0.4. Every request comes from one of those (address,
/// port) pairs, each pair numbers its requests 0, 1, 2 … (one flow per
/// pair), and every reply, to whichever address, is matched.
#[test]
fn flows_past_one_address_use_the_next_addresses_and_are_answered() {
    let mut config = generator_config(2_000_000.0, 10_000_000, 6);
    config.flows = 100_000;
    config.target.ip = FAR_SERVER.ip;
    let (st, log) = echo_flows(config, false);
    assert!(st.sent > 18_000, "{st:?}");
    assert_eq!(st.replies, st.sent, "{st:?}");
    assert_eq!(st.unmatched_replies + st.malformed_replies, 0, "{st:?}");
    assert_eq!(st.reordered, 0, "{st:?}");
    let mut addresses = std::collections::BTreeSet::new();
    for (&(ip, port), numbers) in &log.numbers {
        let index = u32::from(ip) - u32::from(GENERATOR.ip);
        assert!(index < 4 && port >= 40_000, "{ip}:{port}");
        assert!(index < 3 || port < 40_000 + 23_392, "{ip}:{port}");
        addresses.insert(index);
        let expected: Vec<u64> = (0..numbers.len() as u64).collect();
        assert_eq!(numbers, &expected, "{ip}:{port}: one flow's numbering");
    }
    assert_eq!(addresses.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3]);
    // 20,000 uniform draws of 100,000 flows hit about 18,100 distinct ones.
    assert!(log.numbers.len() > 17_000, "{} flows", log.numbers.len());
    assert_eq!(
        log.numbers.values().map(|n| n.len() as u64).sum::<u64>(),
        st.sent
    );
}

/// Reordering is counted per flow when flows span addresses: 12 flows of 4
/// ports each over 3 addresses, bursts answered in reverse.
#[test]
fn replies_out_of_order_are_counted_per_flow_across_addresses() {
    let mut config = generator_config(500_000.0, 2_000_000, 7);
    config.flows = 12;
    config.src_port = 65_532;
    config.target.ip = FAR_SERVER.ip;
    let (st, log) = echo_flows(config, true);
    assert_eq!(st.replies, st.sent, "{st:?}");
    assert_eq!(log.numbers.len(), 12, "every flow is used");
    assert!(st.reordered > 0, "{st:?}");
    assert_eq!(st.reordered, log.expected_reordered, "{st:?}");
}
