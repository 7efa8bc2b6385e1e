//! RFC 6528 initial sequence numbers: a 4 µs clock plus a keyed hash of the
//! 4-tuple, so an off-path attacker cannot guess a connection's sequence
//! space and a reincarnated 4-tuple starts above its predecessor.

use super::{Instant, Seq};
use crate::Endpoint;
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};

/// Chooses initial sequence numbers; one per stack, with a secret key.
#[derive(Debug, Clone)]
pub struct IsnGenerator {
    key: (u64, u64),
}

impl IsnGenerator {
    /// A generator with a random key (std's per-process random hasher keys
    /// are the entropy source).
    pub fn new() -> IsnGenerator {
        let random = RandomState::new();
        IsnGenerator {
            key: (random.hash_one(0x6528u32), random.hash_one(0x9293u32)),
        }
    }

    /// A generator with a fixed key (deterministic tests).
    pub fn with_key(key: (u64, u64)) -> IsnGenerator {
        IsnGenerator { key }
    }

    /// RFC 6528 §3: ISN = M + F(localip, localport, remoteip, remoteport,
    /// secretkey), M a timer ticking every 4 µs, F a keyed pseudorandom
    /// function (SipHash over the secret key and the 4-tuple).
    pub fn isn(&self, local: Endpoint, remote: Endpoint, now: Instant) -> Seq {
        let mut hasher = DefaultHasher::new();
        self.key.hash(&mut hasher);
        local.ip.octets().hash(&mut hasher);
        local.port.hash(&mut hasher);
        remote.ip.octets().hash(&mut hasher);
        remote.port.hash(&mut hasher);
        let offset = hasher.finish() as u32;
        let ticks = (now.as_nanos() / 4_000) as u32;
        Seq(ticks.wrapping_add(offset))
    }
}

impl Default for IsnGenerator {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn keyed_per_tuple_and_advancing_with_the_clock() {
        let a = Endpoint::new(Ipv4Addr::new(10, 0, 0, 1), 1000);
        let b = Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), 80);
        let c = Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), 81);
        let generator = IsnGenerator::with_key((1, 2));
        let t0 = Instant::from_nanos(1_000_000);
        let first = generator.isn(a, b, t0);
        assert_eq!(first, generator.isn(a, b, t0), "deterministic for a key");
        assert_ne!(first, generator.isn(a, c, t0), "depends on the tuple");
        assert_ne!(first, IsnGenerator::with_key((3, 4)).isn(a, b, t0));
        // 4 µs ticks: 1 ms later the ISN moved by 250.
        let later = generator.isn(a, b, Instant::from_nanos(2_000_000));
        assert_eq!(later.distance_from(first), 250);
        assert_ne!(IsnGenerator::new().key, IsnGenerator::new().key);
    }
}
