//! Sequence numbers: 32-bit, compared modulo 2³² (RFC 9293 §3.4).

/// A TCP sequence (or acknowledgement) number.
///
/// Not `Ord`: comparison modulo 2³² is not transitive over the whole space,
/// so callers use [`Seq::lt`] and friends, which are meaningful for numbers
/// less than 2³¹ apart (always true within one window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);
