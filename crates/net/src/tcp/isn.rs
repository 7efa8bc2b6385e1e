//! RFC 6528 initial sequence numbers: a 4 µs clock plus a keyed hash of the
//! 4-tuple, so an off-path attacker cannot guess a connection's sequence
//! space and a reincarnated 4-tuple starts above its predecessor.

use super::{Instant, Seq};
use crate::Endpoint;

/// Chooses initial sequence numbers; one per stack, with a secret key.
#[derive(Debug, Clone)]
pub struct IsnGenerator {
    key: (u64, u64),
}

impl IsnGenerator {
    /// A generator with a random key.
    pub fn new() -> IsnGenerator {
        todo!()
    }

    /// A generator with a fixed key (deterministic tests).
    pub fn with_key(key: (u64, u64)) -> IsnGenerator {
        IsnGenerator { key }
    }

    pub fn isn(&self, local: Endpoint, remote: Endpoint, now: Instant) -> Seq {
        let _ = (local, remote, now, self.key);
        todo!()
    }
}

impl Default for IsnGenerator {
    fn default() -> Self {
        Self::new()
    }
}
