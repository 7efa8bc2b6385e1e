//! The bytes that bulk transfers carry, and how both ends compare them
//! (Ginza's and Linux's peers in the TCP tests and `ginza bench tcp`).
//!
//! [`Pattern`] makes a reproducible byte stream from a seed (a sender and a
//! checker agree on it without sharing a buffer), and [`ContentHash`] hashes
//! a stream however it is cut into reads and writes, so that a receiver can
//! hash as bytes arrive and compare with the sender's hash at the end.
//!
//! The hash is not cryptographic (no SHA-2 or BLAKE3 crate is in the
//! workspace, and no one here forges a transfer): a 64-bit multiply–xorshift
//! over little-endian words, sensitive to the order of words, so a lost,
//! duplicated, reordered or corrupted segment changes it except with
//! probability about 2⁻⁶⁴ per transfer. It processes 8 bytes per step, so
//! that hashing 64 MiB stays well under a second in a debug build.

/// The receipt a sink sends once its sender has shut down its side: the
/// count of bytes it received and their [`ContentHash`], both
/// little-endian `u64`.
pub const RECEIPT_LEN: usize = 16;

/// The sink's receipt for what `hash` has seen.
pub fn receipt(hash: &ContentHash) -> [u8; RECEIPT_LEN] {
    let mut r = [0u8; RECEIPT_LEN];
    r[..8].copy_from_slice(&hash.len().to_le_bytes());
    r[8..].copy_from_slice(&hash.finish().to_le_bytes());
    r
}

/// Count and hash from a receipt.
pub fn parse_receipt(r: &[u8; RECEIPT_LEN]) -> (u64, u64) {
    let word = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().expect("8 bytes"));
    (word(0), word(8))
}

/// What a bulk transfer moved and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes sent.
    pub sent: u64,
    /// Hash of what was sent.
    pub sent_hash: u64,
    /// Bytes received back (the echo, or the sink's count).
    pub received: u64,
    /// Hash of what was received (the echo's, or the sink's).
    pub received_hash: u64,
    /// From connecting to the last byte (or the receipt).
    pub elapsed: std::time::Duration,
}

impl Transfer {
    /// Everything sent came back whole, in order.
    pub fn intact(&self) -> bool {
        self.sent == self.received && self.sent_hash == self.received_hash
    }

    /// Bytes sent per second, in Mbit/s.
    pub fn mbps(&self) -> f64 {
        self.sent as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }
}

/// Writes `bytes` of [`Pattern`] `seed` with `write_all`; returns their
/// hash.
pub fn send_pattern<E>(
    bytes: u64,
    seed: u64,
    mut write_all: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<u64, E> {
    let mut pattern = Pattern::new(seed);
    let mut hash = ContentHash::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        pattern.fill(&mut buf[..n]);
        hash.update(&buf[..n]);
        write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(hash.finish())
}

/// The odd constant (2⁶⁴ / golden ratio) that spreads each word.
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// A streaming hash of a byte stream, independent of how it is split.
#[derive(Debug, Clone)]
pub struct ContentHash {
    state: u64,
    /// Bytes of an unfinished word.
    tail: [u8; 8],
    tail_len: usize,
    len: u64,
}

impl Default for ContentHash {
    fn default() -> Self {
        ContentHash::new()
    }
}

impl ContentHash {
    pub fn new() -> ContentHash {
        ContentHash {
            state: 0x243f_6a88_85a3_08d3,
            tail: [0; 8],
            tail_len: 0,
            len: 0,
        }
    }

    fn mix(&mut self, word: u64) {
        let x = (self.state ^ word).wrapping_mul(MIX);
        self.state = x ^ (x >> 29);
    }

    /// Adds `bytes` to the stream.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.tail_len > 0 {
            let take = (8 - self.tail_len).min(bytes.len());
            self.tail[self.tail_len..self.tail_len + take].copy_from_slice(&bytes[..take]);
            self.tail_len += take;
            bytes = &bytes[take..];
            if self.tail_len < 8 {
                return;
            }
            self.mix(u64::from_le_bytes(self.tail));
            self.tail_len = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.mix(u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
        self.tail_len = rest.len();
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The hash of the stream so far (the stream can go on).
    pub fn finish(&self) -> u64 {
        let mut last = self.clone();
        let mut tail = [0u8; 8];
        tail[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        last.mix(u64::from_le_bytes(tail));
        last.mix(self.len);
        last.state
    }
}

/// The hash of `bytes` as one stream.
pub fn content_hash(bytes: &[u8]) -> u64 {
    let mut h = ContentHash::new();
    h.update(bytes);
    h.finish()
}

/// A reproducible byte stream: byte `i` depends only on the seed and `i`,
/// so any split into chunks yields the same stream.
#[derive(Debug, Clone)]
pub struct Pattern {
    seed: u64,
    position: u64,
}

impl Pattern {
    pub fn new(seed: u64) -> Pattern {
        Pattern { seed, position: 0 }
    }

    /// Bytes produced so far.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The 8 bytes of word `index` (splitmix64 of seed and index).
    fn word(&self, index: u64) -> [u8; 8] {
        let mut z = self.seed ^ index.wrapping_mul(MIX);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).to_le_bytes()
    }

    /// Fills `buf` with the next bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut i = 0;
        while i < buf.len() {
            let index = self.position / 8;
            let offset = (self.position % 8) as usize;
            let word = self.word(index);
            let take = (8 - offset).min(buf.len() - i);
            buf[i..i + take].copy_from_slice(&word[offset..offset + take]);
            i += take;
            self.position += take as u64;
        }
    }

    /// The hash of the first `len` bytes of the stream of `seed`.
    pub fn hash_of(seed: u64, len: u64) -> u64 {
        let mut pattern = Pattern::new(seed);
        let mut hash = ContentHash::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            pattern.fill(&mut buf[..n]);
            hash.update(&buf[..n]);
            left -= n as u64;
        }
        hash.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_does_not_depend_on_how_the_stream_is_split() {
        let mut bytes = vec![0u8; 1000];
        Pattern::new(7).fill(&mut bytes);
        let whole = content_hash(&bytes);
        for cut in [1, 3, 7, 8, 9, 13, 999] {
            let mut h = ContentHash::new();
            for piece in bytes.chunks(cut) {
                h.update(piece);
            }
            assert_eq!(h.finish(), whole, "pieces of {cut}");
            assert_eq!(h.len(), 1000);
        }
        assert_eq!(Pattern::hash_of(7, 1000), whole);
    }

    #[test]
    fn the_hash_sees_order_loss_duplication_and_corruption() {
        let mut bytes = vec![0u8; 4096];
        Pattern::new(1).fill(&mut bytes);
        let whole = content_hash(&bytes);
        let mut swapped = bytes.clone();
        swapped[..1024].rotate_left(512);
        assert_ne!(content_hash(&swapped), whole);
        assert_ne!(content_hash(&bytes[..4000]), whole);
        let mut doubled = bytes.clone();
        doubled.extend_from_slice(&bytes[..100]);
        assert_ne!(content_hash(&doubled), whole);
        let mut flipped = bytes.clone();
        flipped[2000] ^= 0x10;
        assert_ne!(content_hash(&flipped), whole);
        // Trailing zeros count (the length is hashed).
        assert_ne!(content_hash(&[0u8; 3]), content_hash(&[0u8; 4]));
    }

    #[test]
    fn a_receipt_round_trips() {
        let mut h = ContentHash::new();
        h.update(b"hello, sink");
        assert_eq!(parse_receipt(&receipt(&h)), (11, h.finish()));
        let mut sent = Vec::new();
        let hash = send_pattern::<()>(100_000, 3, |b| {
            sent.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(sent.len(), 100_000);
        assert_eq!(hash, content_hash(&sent));
        assert_eq!(hash, Pattern::hash_of(3, 100_000));
    }

    #[test]
    fn the_pattern_is_the_same_however_it_is_read() {
        let mut a = vec![0u8; 100];
        Pattern::new(9).fill(&mut a);
        let mut b = vec![0u8; 100];
        let mut p = Pattern::new(9);
        for chunk in b.chunks_mut(7) {
            p.fill(chunk);
        }
        assert_eq!(a, b);
        assert_eq!(p.position(), 100);
        let mut c = vec![0u8; 100];
        Pattern::new(10).fill(&mut c);
        assert_ne!(a, c);
    }
}
