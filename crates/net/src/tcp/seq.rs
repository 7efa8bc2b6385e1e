//! Sequence numbers: 32-bit, compared modulo 2³² (RFC 9293 §3.4).

use std::ops::{Add, AddAssign, Sub};

/// A TCP sequence (or acknowledgement) number.
///
/// Not `Ord`: comparison modulo 2³² is not transitive over the whole space,
/// so callers use [`Seq::lt`] and friends, which are meaningful for numbers
/// less than 2³¹ apart (always true within one window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    pub const fn new(n: u32) -> Seq {
        Seq(n)
    }

    pub const fn wrapping_add(self, n: u32) -> Seq {
        Seq(self.0.wrapping_add(n))
    }

    pub const fn wrapping_sub(self, n: u32) -> Seq {
        Seq(self.0.wrapping_sub(n))
    }

    /// `self - other` as a signed distance (RFC 9293 §3.4: compare modulo 2³²).
    pub const fn diff(self, other: Seq) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// How far `self` lies after `earlier`, modulo 2³² (the caller knows
    /// `earlier ≤ self`).
    pub const fn distance_from(self, earlier: Seq) -> u32 {
        self.0.wrapping_sub(earlier.0)
    }

    pub const fn lt(self, other: Seq) -> bool {
        self.diff(other) < 0
    }

    pub const fn le(self, other: Seq) -> bool {
        self.diff(other) <= 0
    }

    pub const fn gt(self, other: Seq) -> bool {
        self.diff(other) > 0
    }

    pub const fn ge(self, other: Seq) -> bool {
        self.diff(other) >= 0
    }

    /// The later of two numbers (modulo 2³²).
    pub const fn max(self, other: Seq) -> Seq {
        if self.ge(other) {
            self
        } else {
            other
        }
    }

    /// The earlier of two numbers (modulo 2³²).
    pub const fn min(self, other: Seq) -> Seq {
        if self.le(other) {
            self
        } else {
            other
        }
    }

    /// `start ≤ self < end`, modulo 2³².
    pub const fn in_range(self, start: Seq, end: Seq) -> bool {
        self.ge(start) && self.lt(end)
    }
}

/// Lengths are reduced modulo 2³², as the sequence space is.
impl Add<usize> for Seq {
    type Output = Seq;

    fn add(self, n: usize) -> Seq {
        self.wrapping_add(n as u32)
    }
}

impl Add<u32> for Seq {
    type Output = Seq;

    fn add(self, n: u32) -> Seq {
        self.wrapping_add(n)
    }
}

impl AddAssign<usize> for Seq {
    fn add_assign(&mut self, n: usize) {
        *self = *self + n;
    }
}

impl AddAssign<u32> for Seq {
    fn add_assign(&mut self, n: u32) {
        *self = *self + n;
    }
}

impl Sub<usize> for Seq {
    type Output = Seq;

    fn sub(self, n: usize) -> Seq {
        self.wrapping_sub(n as u32)
    }
}

impl Sub<u32> for Seq {
    type Output = Seq;

    fn sub(self, n: u32) -> Seq {
        self.wrapping_sub(n)
    }
}

/// The signed distance `self - other` ([`Seq::diff`]).
impl Sub<Seq> for Seq {
    type Output = i32;

    fn sub(self, other: Seq) -> i32 {
        self.diff(other)
    }
}

impl std::fmt::Display for Seq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::Seq;

    #[test]
    fn compares_across_the_wrap() {
        let a = Seq(u32::MAX - 5);
        let b = a + 10usize;
        assert_eq!(b, Seq(4));
        assert!(a.lt(b) && b.gt(a) && a.le(a) && a.ge(a));
        assert_eq!(b - a, 10);
        assert_eq!(a - b, -10);
        assert_eq!(b.distance_from(a), 10);
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
        assert!(Seq(2).in_range(a, b) && !b.in_range(a, b));
        assert_eq!(b - 10usize, a);
    }
}
