//! The CPU cost per frame of iokerneld's forwarding path and of the copy
//! floor, on one thread (docs/results.md, "Dataplane"): a burst of 32
//! 64-byte frames is put on a sender's egress ring, moved by
//! `Dataplane::transmit` + `deliver` + `take_back` (or `CopyFloor::pass`),
//! and the receiver's ingress ring is emptied; only the move is timed.
//! Single-threaded, so neither a driver that lost its CPU nor a loop
//! spinning with nothing to do counts: what is left is the path's own
//! work (without the cross-CPU cache misses of the real two-thread bench,
//! and without the daemon loop around it). Median of many bursts, rounds
//! interleaved.
//!
//! `cargo run --release -p ginza-iokernel --example forward_path [FLOWS [KTHREADS]]`
//!
//! By default every frame is of one flow and the receiver has one kthread
//! (as in `ginza bench forward`); with `FLOWS` each burst cycles through
//! that many flows (source ports), steered over `KTHREADS` active kthreads
//! of the receiver: the path without the shortcuts a burst of one flow to
//! one kthread takes (one hash per burst's repeats, one ring).

use std::time::Instant;

use ginza_iokernel::dataplane::copy_floor::CopyFloor;
use ginza_iokernel::dataplane::{AppNet, Dataplane, Peers};
use ginza_iokernel::nic::PortId;
use ginza_iokernel::raw_app;
use ginza_net::{tx, Endpoint, Interface, Ipv4Addr, MacAddr};
use ginza_policy::steer::SteeringKind;
use ginza_shm::{IokernelEnd, PacketDesc, Region, RegionConfig, RuntimeEnd};

const BURST: usize = 32;
const BURSTS: usize = 20_000;
const ROUNDS: usize = 5;

fn iface(last: u8) -> Interface {
    Interface {
        mac: MacAddr([0x02, 0x47, 0x5a, 0x00, 0x00, last]),
        ip: Ipv4Addr::new(10, 47, 0, last),
    }
}

/// The receiver, as the daemon's loop shows it to the direct path.
struct Receiver<'a> {
    net: &'a mut AppNet,
    ends: &'a mut [IokernelEnd],
}

impl Peers for Receiver<'_> {
    fn peer(&mut self, port: PortId) -> Option<(&mut AppNet, &mut [IokernelEnd])> {
        (port == self.net.port()).then_some((&mut *self.net, &mut *self.ends))
    }

    fn work_for(&mut self, _: PortId) {}

    fn disconnect(&mut self, _: PortId, reason: String) {
        panic!("{reason}");
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Queues `n` frames, cycling through `frames` from `next`.
fn send_cycling(end: &mut RuntimeEnd, frames: &[Vec<u8>], next: &mut usize, n: usize) -> usize {
    let mut sent = 0;
    while sent < n && end.egress.free().unwrap_or(0) > 0 {
        let frame = &frames[*next % frames.len()];
        *next += 1;
        let seq = end.egress.next_seq();
        end.egress_buffers.buffer_mut(seq)[..frame.len()].copy_from_slice(frame);
        let desc = PacketDesc {
            len: frame.len() as u32,
            ..Default::default()
        };
        if end.egress.push(desc).is_err() {
            break;
        }
        sent += 1;
    }
    sent
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let flows = args
        .next()
        .map_or(Ok(1), |a| a)
        .expect("FLOWS: a number")
        .max(1);
    let kthreads = args
        .next()
        .map_or(Ok(1), |a| a)
        .expect("KTHREADS: a number")
        .max(1);
    let frames: Vec<Vec<u8>> = (0..flows)
        .map(|i| {
            let mut frame = vec![0u8; 2048];
            let to = Endpoint {
                ip: iface(2).ip,
                port: 9,
            };
            let src_port = 9 + i as u16;
            let len = tx::udp_datagram(
                &mut frame,
                &iface(1),
                iface(2).mac,
                src_port,
                to,
                &[0u8; 22],
            )
            .unwrap();
            frame.truncate(len);
            frame
        })
        .collect();
    let frame = frames[0].clone();

    let (mut forward, mut floor) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        // Forwarding: two applications on the switch.
        let (a, b) = (
            Region::create_heap(&RegionConfig::new(1)).unwrap(),
            Region::create_heap(&RegionConfig::new(kthreads as u32)).unwrap(),
        );
        let mut dp = Dataplane::new(None);
        let buffers = b.layout().done.capacity;
        let mut sender_net = dp
            .attach("s", iface(1), buffers, 1, SteeringKind::RssMod)
            .unwrap();
        let mut receiver_net = dp
            .attach("r", iface(2), buffers, kthreads, SteeringKind::RssMod)
            .unwrap();
        sender_net.steering.sync([true], 0);
        receiver_net.steering.sync(vec![true; kthreads], 0);
        let (mut s_rt, mut s_io) = (a.runtime_end(0).unwrap(), vec![a.iokernel_end(0).unwrap()]);
        let mut r_rt: Vec<RuntimeEnd> = (0..kthreads as u32)
            .map(|k| b.runtime_end(k).unwrap())
            .collect();
        let mut r_io: Vec<IokernelEnd> = (0..kthreads as u32)
            .map(|k| b.iokernel_end(k).unwrap())
            .collect();
        let mut ns = Vec::with_capacity(BURSTS);
        let (mut moved, mut next) = (0, 0);
        for i in 0..BURSTS {
            // One flow: queued as `ginza bench forward`'s driver does.
            let sent = match flows {
                1 => raw_app::send_copies(&mut s_rt, &frame, BURST),
                _ => send_cycling(&mut s_rt, &frames, &mut next, BURST),
            };
            let t0 = Instant::now();
            let mut peers = Receiver {
                net: &mut receiver_net,
                ends: &mut r_io,
            };
            dp.transmit(&mut sender_net, &mut s_io[0], 0, &mut peers, i as u64)
                .unwrap();
            dp.deliver(&mut receiver_net, &mut r_io, i as u64).unwrap();
            for (k, end) in r_io.iter_mut().enumerate() {
                dp.take_back(&mut receiver_net, end, k).unwrap();
            }
            let took = t0.elapsed().as_nanos() as f64;
            let got: usize = r_rt
                .iter_mut()
                .map(|end| raw_app::drop_received(end, 256))
                .sum();
            moved += got;
            if sent == BURST && got == BURST {
                ns.push(took / BURST as f64);
            }
        }
        assert!(moved > 0, "nothing forwarded");
        forward.push(median(ns));

        // The floor: the same rings, one copy.
        let (a, b) = (
            Region::create_heap(&RegionConfig::new(1)).unwrap(),
            Region::create_heap(&RegionConfig::new(1)).unwrap(),
        );
        let mut f = CopyFloor::new("path", b.layout().done.capacity).unwrap();
        let (mut s_rt, mut from) = (a.runtime_end(0).unwrap(), a.iokernel_end(0).unwrap());
        let (mut r_rt, mut to) = (b.runtime_end(0).unwrap(), b.iokernel_end(0).unwrap());
        let mut ns = Vec::with_capacity(BURSTS);
        for _ in 0..BURSTS {
            let sent = raw_app::send_copies(&mut s_rt, &frame, BURST);
            let t0 = Instant::now();
            f.pass(&mut from, &mut to).unwrap();
            let took = t0.elapsed().as_nanos() as f64;
            let got = raw_app::drop_received(&mut r_rt, 256);
            if sent == BURST && got == BURST {
                ns.push(took / BURST as f64);
            }
        }
        floor.push(median(ns));
    }
    let (fw, fl) = (median(forward.clone()), median(floor.clone()));
    println!(
        "{{\"flows\": {flows}, \"kthreads\": {kthreads}, \"path_ns_per_frame\": {fw:.1}, \"floor_ns_per_frame\": {fl:.1}, \"floor_per_path\": {:.3}, \"rounds_path\": {forward:?}, \"rounds_floor\": {floor:?}}}",
        fl / fw
    );
}
