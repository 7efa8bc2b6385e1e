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
//! per ring). Per frame there is only the copy, the check that the copy's
//! addresses are the run's (12 bytes compared), the flow hash and the
//! steering decision.
//!
//! Everything from shared memory stays untrusted: the run's first header is
//! read out of the egress buffer to choose the receiver, and every frame's
//! addresses are then checked on the copy, where the runtime cannot change
//! them. A copy that does not match ends the run and the frame is looked at
//! again as the first of the next; a run's first frame whose copy differs
//! from the header read just before (its sender rewrote the buffer
//! meanwhile) is dropped, so that every call makes progress.

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
