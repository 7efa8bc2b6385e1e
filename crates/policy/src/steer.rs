//! Packet steering helpers: RSS-style `hash % n` and flow hashing.

/// A flow identifier (the 5-tuple, already packed by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src_ip: u32,
    pub dst_ip: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
}

/// Mixes a flow key into a well-spread 64-bit hash. NIC RSS uses a Toeplitz
/// hash; any hash with good avalanche gives the same balance statistics,
/// which is all `hash % n` steering depends on.
pub fn flow_hash(key: &FlowKey) -> u64 {
    let a = (u64::from(key.src_ip) << 32) | u64::from(key.dst_ip);
    let b = (u64::from(key.src_port) << 24) | (u64::from(key.dst_port) << 8) | u64::from(key.proto);
    mix64(a ^ mix64(b))
}

/// A strong 64-bit finalizer (the SplitMix64 one).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Shenango/IX steering: queue index `hash % n` (`n > 0`).
pub fn rss_queue(hash: u64, n: usize) -> usize {
    assert!(n > 0, "rss_queue over zero queues");
    (hash % n as u64) as usize
}

/// Load imbalance of a queue-occupancy vector: how far the busiest queue is
/// above the mean, relative to the mean (0.1 = 10 % above). Zero for an
/// empty vector or no load.
pub fn imbalance(loads: &[u64]) -> f64 {
    if loads.is_empty() {
        return 0.0;
    }
    let total: u64 = loads.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let mean = total as f64 / loads.len() as f64;
    let max = *loads.iter().max().unwrap_or(&0) as f64;
    max / mean - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_in_range_and_stable() {
        let k = FlowKey {
            src_ip: 1,
            dst_ip: 2,
            src_port: 3,
            dst_port: 4,
            proto: 17,
        };
        let h = flow_hash(&k);
        assert_eq!(h, flow_hash(&k));
        for n in 1..40 {
            assert!(rss_queue(h, n) < n);
        }
    }

    #[test]
    fn imbalance_basic() {
        assert_eq!(imbalance(&[]), 0.0);
        assert_eq!(imbalance(&[5, 5, 5]), 0.0);
        assert!((imbalance(&[10, 5, 0, 5]) - 1.0).abs() < 1e-12);
    }
}
