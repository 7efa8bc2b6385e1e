//! The copy floor of `ginza bench forward` (docs/results.md, "Dataplane"):
//! the least a loop that moves frames from one application's egress ring to
//! another's ingress ring can do per frame. Same rings (those of a shared
//! region), same ingress pool and ledger, same bursts of [`BURST`], and one
//! copy per frame, straight from the egress buffer into an ingress buffer;
//! no switch, no steering, no daemon loop around it. The benchmark runs it
//! on iokerneld's core, rounds interleaved with the forwarding ones, so
//! that `forward_mpps` is read against what that core can do at all.

use ginza_shm::{BufferLedger, IngressPool, IokernelEnd, PacketDesc, PKT_BUFFER_SIZE};

use super::BURST;

/// An ingress pool with its ledger, and what moved through it.
pub struct CopyFloor {
    pool: IngressPool,
    ledger: BufferLedger,
    staged: Vec<PacketDesc>,
    returned: Vec<u32>,
    moved: u64,
    /// Frames taken off the egress ring but not delivered: a bad length,
    /// no free buffer, a full ingress ring.
    dropped: u64,
}

impl CopyFloor {
    /// A floor whose frames land in a new pool of `buffers` buffers.
    pub fn new(name: &str, buffers: u32) -> Result<CopyFloor, String> {
        let pool = IngressPool::create(&format!("ginza-floor-{name}"), buffers)
            .map_err(|e| format!("cannot create the ingress pool: {e}"))?;
        Ok(CopyFloor {
            pool,
            ledger: BufferLedger::new(buffers),
            staged: Vec::with_capacity(BURST),
            returned: Vec::with_capacity(4 * BURST),
            moved: 0,
            dropped: 0,
        })
    }

    /// The pool the delivered descriptors name (the receiver reads it).
    pub fn pool(&self) -> &IngressPool {
        &self.pool
    }

    /// Frames delivered so far.
    pub fn moved(&self) -> u64 {
        self.moved
    }

    /// Frames taken but not delivered so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// One pass: up to [`BURST`] frames from `from`'s egress ring into
    /// ingress buffers, published on `to`'s ingress ring with one index
    /// store, then the buffers `to` gave back. Returns the frames
    /// delivered; an error names a corrupt ring or a buffer given back
    /// that was not lent.
    pub fn pass(&mut self, from: &mut IokernelEnd, to: &mut IokernelEnd) -> Result<usize, String> {
        let waiting = from
            .egress
            .len()
            .map_err(|e| format!("the egress ring is corrupt: {e}"))?
            .min(BURST as u32);
        let mut taken = 0;
        while taken < waiting {
            let Some((seq, desc)) = from.egress.peek_nth(taken) else {
                break;
            };
            if desc.len == 0 || desc.len > PKT_BUFFER_SIZE {
                self.dropped += 1;
                taken += 1;
                continue;
            }
            // No buffer free: the rest waits on the ring.
            let Some(buf) = self.ledger.lend() else { break };
            let dst = self
                .pool
                .buffer_mut(buf)
                .expect("a lent buffer is in the pool");
            let len = from.egress_buffers.read(seq, desc.len, dst);
            self.staged.push(PacketDesc {
                buf,
                len: len as u32,
                hash: 0,
                reserved: 0,
            });
            taken += 1;
        }
        from.egress.release_n(taken);
        let pushed = to
            .ingress
            .push_slice(&self.staged)
            .map_err(|e| format!("the ingress ring is corrupt: {e}"))?;
        self.moved += pushed as u64;
        for d in self.staged.drain(..).skip(pushed) {
            self.dropped += 1;
            self.ledger.give_back(d.buf).expect("lent just now");
        }
        loop {
            self.returned.clear();
            match to.done.pop_into(&mut self.returned, 4 * BURST) {
                Ok(0) => break,
                Ok(_) => {
                    for &buf in &self.returned {
                        self.ledger
                            .give_back(buf)
                            .map_err(|e| format!("an ingress buffer given back wrongly: {e}"))?;
                    }
                }
                Err(e) => return Err(format!("the ingress-done ring is corrupt: {e}")),
            }
        }
        Ok(pushed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ginza_shm::{Region, RegionConfig};

    #[test]
    fn every_frame_arrives_once_in_order() {
        let (a, b) = (
            Region::create_heap(&RegionConfig::new(1)).unwrap(),
            Region::create_heap(&RegionConfig::new(1)).unwrap(),
        );
        let (mut sender, mut from) = (a.runtime_end(0).unwrap(), a.iokernel_end(0).unwrap());
        let (mut receiver, mut to) = (b.runtime_end(0).unwrap(), b.iokernel_end(0).unwrap());
        let mut floor = CopyFloor::new("test", 64).unwrap();
        let total = 5_000u32;
        let (mut sent, mut got) = (0u32, Vec::new());
        let mut descs = Vec::new();
        while got.len() < total as usize {
            // Frames of several lengths, numbered.
            while sent < total && sender.egress.free().unwrap() > 0 {
                let len = 60 + (sent % 7) as usize;
                let seq = sender.egress.next_seq();
                let buf = sender.egress_buffers.buffer_mut(seq);
                buf[..4].copy_from_slice(&sent.to_le_bytes());
                buf[4..len].fill(sent as u8);
                sender
                    .egress
                    .push(PacketDesc {
                        len: len as u32,
                        ..Default::default()
                    })
                    .unwrap();
                sent += 1;
            }
            floor.pass(&mut from, &mut to).unwrap();
            descs.clear();
            receiver.ingress.pop_into(&mut descs, 17).unwrap();
            for d in &descs {
                let bytes = floor.pool().frame(*d).unwrap();
                let n = u32::from_le_bytes(bytes[..4].try_into().unwrap());
                assert_eq!(bytes.len(), 60 + (n % 7) as usize);
                assert!(bytes[4..].iter().all(|&x| x == n as u8));
                got.push(n);
                receiver.done.push(d.buf).unwrap();
            }
        }
        assert_eq!(got, (0..total).collect::<Vec<_>>());
        assert_eq!((floor.moved(), floor.dropped()), (u64::from(total), 0));
    }

    #[test]
    fn a_buffer_given_back_twice_is_refused() {
        let (a, b) = (
            Region::create_heap(&RegionConfig::new(1)).unwrap(),
            Region::create_heap(&RegionConfig::new(1)).unwrap(),
        );
        let (mut from, mut to) = (a.iokernel_end(0).unwrap(), b.iokernel_end(0).unwrap());
        let mut receiver = b.runtime_end(0).unwrap();
        let mut floor = CopyFloor::new("test-twice", 8).unwrap();
        receiver.done.push(3).unwrap();
        assert!(floor.pass(&mut from, &mut to).is_err());
    }
}
