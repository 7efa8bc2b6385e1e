//! The direct path (docs/results.md, "Dataplane"): frames from one
//! application to another go around the switch, copied once from the
//! sender's egress buffer into a buffer of the receiver's ingress pool, then
//! steered and published on the receiver's rings as
//! [`Dataplane::deliver`] would have done one switch hop later.
//!
//! A *run* is the frames of one egress burst, back to back, that go to the
//! same application from the same source MAC. What does not change within
//! a run is decided once per run: the route
//! ([`SoftwareSwitch::direct_route`](crate::nic::SoftwareSwitch::direct_route):
//! no fault injector anywhere, a source MAC the sender owns, another
//! application's unicast MAC), the receiver's lookup, the switch's
//! counters, and the publication on the receiver's rings (one index store
//! per ring; a run whose frames all go to one kthread is published as it
//! is). Per frame there is the copy, two checks of its addresses, the flow
//! hash and the steering decision, in three passes over the run: the
//! copies, then the checks and hashes (a copy is read long after its
//! stores, and the hashes of several frames overlap), then the run's
//! steering decisions in one call (`AppSteering::steer_burst`).
//!
//! Everything from shared memory stays untrusted: each frame's addresses
//! are read in place before the copy (a frame for another destination ends
//! the run, and the caller looks at it as the first of the next), and
//! checked again on the copy, where the runtime cannot change them: a copy
//! whose addresses differ (its sender rewrote the buffer meanwhile) is
//! dropped.

use ginza_net::flow::steer_key;
use ginza_net::MacAddr;
use ginza_shm::netstack::{EGRESS_FILL_L4_CHECKSUM, EGRESS_GATHER};
use ginza_shm::{IokernelEnd, PacketDesc, PKT_BUFFER_SIZE};

use super::{publish, AppNet, Dataplane, Peers};

/// Egress flags whose frames always take the switch (gathered and
/// checksum-offload frames are built on the way).
pub(super) const SWITCHED_FLAGS: u32 = EGRESS_GATHER | EGRESS_FILL_L4_CHECKSUM;

/// Destination and source MAC: what a run's frames share.
const ADDRESSES: usize = 12;
/// An Ethernet header.
const ETHERNET_HEADER: usize = 14;

impl Dataplane {
    /// The run that starts at the `first` frame of `end`'s egress ring
    /// (whose length the caller checked) and ends before `waiting`: how
    /// many frames it took (at least the first), or `None` when the first
    /// does not take the direct path (the caller switches it).
    pub(super) fn transmit_direct(
        &mut self,
        net: &mut AppNet,
        end: &IokernelEnd,
        first: u32,
        waiting: u32,
        peers: &mut dyn Peers,
        now: u64,
    ) -> Option<u32> {
        let (seq, desc) = end.egress.peek_nth(first)?;
        if desc.len < ETHERNET_HEADER as u32 {
            return None;
        }
        let addresses: [u8; ADDRESSES] = end.egress_buffers.prefix(seq);
        let mac = |at: usize| {
            let mut m = [0u8; 6];
            m.copy_from_slice(&addresses[at..at + 6]);
            MacAddr(m)
        };
        let to = self.switch.direct_route(net.port, mac(6), mac(0))?;
        let (peer, ends) = peers.peer(to)?;
        if self.staged.len() < ends.len() {
            self.staged.resize_with(ends.len(), Vec::new);
        }
        let (mut frames, mut bytes, mut to_parked) = (0u64, 0u64, false);
        let mut taken = first;
        while taken < waiting {
            let Some((seq, desc)) = end.egress.peek_nth(taken) else {
                break;
            };
            // Read in place: another destination or source, a bad length,
            // a frame that takes the switch end the run (the caller looks
            // at it).
            if desc.len < ETHERNET_HEADER as u32
                || desc.len > PKT_BUFFER_SIZE
                || desc.reserved & SWITCHED_FLAGS != 0
                || (taken != first && end.egress_buffers.prefix(seq) != addresses)
            {
                break;
            }
            taken += 1;
            frames += 1;
            bytes += u64::from(desc.len);
            let Some(buf) = peer.ledger.lend() else {
                peer.stats.drop_ingress += 1;
                continue;
            };
            let copy = peer
                .pool
                .buffer_mut(buf)
                .expect("a lent buffer is in the pool");
            let n = end.egress_buffers.read(seq, desc.len, copy);
            self.copies.push(PacketDesc {
                buf,
                len: n as u32,
                hash: 0,
                reserved: 0,
            });
        }
        // Then the copies' checks and flow hashes, and the steering
        // decisions after all the hashes: a copy is read long after its
        // stores (a load of bytes that two of the copy's vector stores
        // wrote, issued at once, stalls), and the hashes (two dependent
        // SplitMix64 rounds each) overlap instead of each waiting for the
        // previous frame's steering.
        self.hashes.clear();
        let mut copied = 0;
        for i in 0..self.copies.len() {
            let mut desc = self.copies[i];
            let copy = peer
                .pool
                .frame(desc)
                .expect("copied into the pool just now");
            if copy[..ADDRESSES] != addresses {
                // Rewritten by its sender since its header was read: lost.
                net.stats.drop_egress += 1;
                peer.ledger.give_back(desc.buf).expect("lent just now");
                continue;
            }
            let Some(hash) = steer_key(copy, peer.interface.ip)
                .or_else(|| peer.aliases.iter().find_map(|a| steer_key(copy, a.ip)))
            else {
                // An ARP request for another address.
                peer.ledger.give_back(desc.buf).expect("lent just now");
                continue;
            };
            desc.hash = hash;
            self.copies[copied] = desc;
            copied += 1;
            self.hashes.push(u64::from(hash));
        }
        self.copies.truncate(copied);
        if peer
            .steering
            .steer_burst(&self.hashes, now, &mut self.kthreads)
            && copied > 0
        {
            to_parked = true;
            peer.stats.to_parked += copied as u64;
        }
        match self.kthreads.first() {
            // All to one kthread (one active, or one flow): the run's
            // descriptors are that ring's as they are.
            Some(&k)
                if self.staged[k].is_empty() && self.kthreads.iter().all(|&other| other == k) =>
            {
                std::mem::swap(&mut self.staged[k], &mut self.copies);
            }
            _ => {
                for (desc, &k) in self.copies.iter().zip(&self.kthreads) {
                    self.staged[k].push(*desc);
                }
            }
        }
        self.copies.clear();
        // Once per run: the switch's counters, the sender's, and one
        // publication per receiving ring.
        net.stats.tx += frames;
        self.switch.count_direct(net.port, to, frames, bytes);
        let corrupt = publish(&mut self.staged, peer, ends);
        if let Some(reason) = corrupt {
            peers.disconnect(to, reason);
        }
        if to_parked {
            peers.work_for(to);
        }
        Some(taken - first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::PortId;
    use ginza_net::{tx, Endpoint, Interface, Ipv4Addr};
    use ginza_policy::steer::SteeringKind;
    use ginza_shm::{Region, RegionConfig, RuntimeEnd};

    fn iface(last: u8) -> Interface {
        Interface {
            mac: MacAddr([0x02, 0x47, 0x5a, 0x00, 0x00, last]),
            ip: Ipv4Addr::new(10, 47, 0, last),
        }
    }

    /// A UDP frame from 1 to `to`, from source port `n` (the frame's
    /// number, and its flow).
    fn frame(to: u8, n: u16) -> Vec<u8> {
        let mut f = vec![0u8; 128];
        let dst = Endpoint {
            ip: iface(to).ip,
            port: 9,
        };
        let len = tx::udp_datagram(&mut f, &iface(1), iface(to).mac, n, dst, &[7; 22]).unwrap();
        f.truncate(len);
        f
    }

    fn queue(end: &mut RuntimeEnd, bytes: &[u8]) {
        let seq = end.egress.next_seq();
        end.egress_buffers.buffer_mut(seq)[..bytes.len()].copy_from_slice(bytes);
        end.egress
            .push(PacketDesc {
                len: bytes.len() as u32,
                ..Default::default()
            })
            .unwrap();
    }

    /// Two receivers, found by port.
    struct Two<'a> {
        apps: [(&'a mut AppNet, &'a mut [IokernelEnd]); 2],
        work_for: Vec<PortId>,
    }

    impl Peers for Two<'_> {
        fn peer(&mut self, port: PortId) -> Option<(&mut AppNet, &mut [IokernelEnd])> {
            let (net, ends) = self.apps.iter_mut().find(|(n, _)| n.port() == port)?;
            Some((&mut **net, &mut **ends))
        }

        fn work_for(&mut self, port: PortId) {
            self.work_for.push(port);
        }

        fn disconnect(&mut self, _: PortId, reason: String) {
            panic!("{reason}");
        }
    }

    /// The source ports of the frames on `end`'s ingress rings, in order,
    /// checked against the frames sent.
    fn received(net: &AppNet, end: &mut RuntimeEnd, to: u8) -> Vec<u16> {
        let mut descs = Vec::new();
        end.ingress.pop_into(&mut descs, 1024).unwrap();
        descs
            .iter()
            .map(|d| {
                let bytes = net.pool().frame(*d).unwrap();
                let port = u16::from_be_bytes([bytes[34], bytes[35]]);
                assert_eq!(bytes, &frame(to, port)[..]);
                assert_eq!(Some(d.hash), steer_key(bytes, iface(to).ip));
                end.done.push(d.buf).unwrap();
                port
            })
            .collect()
    }

    /// Runs to two receivers, broken by frames that take the switch or
    /// are dropped: every frame arrives once, in order, at its receiver,
    /// each run counted by the switch, and the bad ones are counted.
    #[test]
    fn runs_to_two_receivers_arrive_in_order_and_are_counted() {
        let regions: Vec<Region> = (0..3)
            .map(|_| Region::create_heap(&RegionConfig::new(1)).unwrap())
            .collect();
        let mut dp = Dataplane::new(None);
        let buffers = regions[1].layout().done.capacity;
        let mut nets: Vec<AppNet> = (1..=3u8)
            .map(|i| {
                let name = format!("direct-{i}");
                dp.attach(&name, iface(i), buffers, 1, SteeringKind::RssMod)
                    .unwrap()
            })
            .collect();
        for net in &mut nets {
            net.steering.sync([true], 0);
        }
        let mut rt: Vec<RuntimeEnd> = regions.iter().map(|r| r.runtime_end(0).unwrap()).collect();
        let mut io: Vec<Vec<IokernelEnd>> = regions
            .iter()
            .map(|r| vec![r.iokernel_end(0).unwrap()])
            .collect();
        // To 2: 0..5, to 3: 5..8, a broadcast (switched), to 2: 8..10, a
        // runt and a bad length (dropped), to 3: 10..12.
        let mut broadcast = frame(2, 100);
        broadcast[..6].fill(0xff);
        let plan: Vec<(u8, u16)> = (0..5)
            .map(|n| (2, n))
            .chain((5..8).map(|n| (3, n)))
            .chain([(0, 100)])
            .chain((8..10).map(|n| (2, n)))
            .chain([(0, 200), (0, 300)])
            .chain((10..12).map(|n| (3, n)))
            .collect();
        for &(to, n) in &plan {
            match n {
                100 => queue(&mut rt[0], &broadcast),
                200 => queue(&mut rt[0], &frame(2, n)[..10]),
                300 => {
                    rt[0]
                        .egress
                        .push(PacketDesc {
                            len: PKT_BUFFER_SIZE + 1,
                            ..Default::default()
                        })
                        .unwrap();
                }
                _ => queue(&mut rt[0], &frame(to, n)),
            }
        }
        let (sender, receivers) = nets.split_first_mut().unwrap();
        let (io_sender, io_receivers) = io.split_first_mut().unwrap();
        let (b, c) = receivers.split_at_mut(1);
        let (ib, ic) = io_receivers.split_at_mut(1);
        let mut peers = Two {
            apps: [(&mut b[0], &mut ib[0][..]), (&mut c[0], &mut ic[0][..])],
            work_for: Vec::new(),
        };
        let taken = dp
            .transmit(sender, &mut io_sender[0], 0, &mut peers, 1)
            .unwrap();
        assert_eq!(taken, plan.len());
        assert!(peers.work_for.is_empty(), "every kthread is active");
        assert_eq!(received(&nets[1], &mut rt[1], 2), [0, 1, 2, 3, 4, 8, 9]);
        assert_eq!(received(&nets[2], &mut rt[2], 3), [5, 6, 7, 10, 11]);
        // The runt took the switch, which refused it; the bad length was
        // dropped before; the broadcast waits on the receivers' ports.
        assert_eq!(nets[0].stats.tx, 12 + 2, "{:?}", nets[0].stats);
        assert_eq!(nets[0].stats.drop_egress, 1, "{:?}", nets[0].stats);
        let counters = |i: usize| dp.switch.counters(nets[i].port()).unwrap();
        assert_eq!(counters(1).rx_frames, 7 + 1);
        assert_eq!(counters(2).rx_frames, 5 + 1);
        assert_eq!(counters(1).rx_bytes, 8 * frame(2, 0).len() as u64);
    }
}
