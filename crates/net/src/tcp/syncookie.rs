//! SYN cookies (RFC 4987 §3.6): when a listener's half-open set is full, a
//! SYN is answered with a SYN-ACK whose initial sequence number carries
//! what the connection needs later, and nothing is kept. The peer's ACK
//! returns it (SEG.ACK − 1), and the connection is made then if the cookie
//! checks.
//!
//! The layout follows Linux's: with `h1`, `h2` keyed hashes of the
//! 4-tuple, the peer's ISN `isn`, `t` a counter of [`TICK`]s and `m` the
//! peer's MSS as a 2-bit index into [`MSS_TABLE`] (the largest entry not
//! above it),
//!
//! ```text
//! cookie = h1 + isn + (t << 24) + (m << 22) + (h2(t, isn, m) mod 2²²)
//! ```
//!
//! Subtracting `h1 + isn` gives `t` back in the top 8 bits (modulo 256),
//! so a cookie older than [`MAX_AGE`] ticks is refused; then `m`, and the
//! low 22 bits must be `h2` of them: a forged cookie passes with a chance
//! of one in 2²² (Linux's sum `h2 + m` in 24 bits has the same odds, but
//! there a cookie one off names the next MSS and still passes; here the
//! hash covers `m` and the ISN). Nothing else of the SYN survives: see
//! docs/tcp.md ("SYN cookies") for the options left out.

use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};
use std::time::Duration;

use super::table::FourTuple;
use super::{Instant, Seq};

/// The time counter's period: a cookie is good for one to two of them.
pub const TICK: Duration = Duration::from_secs(64);
/// Ticks a cookie may be old (0: made in the current one) and still pass.
pub const MAX_AGE: u32 = 1;
/// The MSS values a cookie can carry (Linux's table): common Ethernet
/// ones, and RFC 9293's 536 as the least.
pub const MSS_TABLE: [u16; 4] = [536, 1300, 1440, 1460];

const COUNTER_SHIFT: u32 = 24;
const MSS_SHIFT: u32 = 22;
const HASH_MASK: u32 = (1 << MSS_SHIFT) - 1;

/// Why a returning ACK's cookie was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CookieError {
    /// Made more than [`MAX_AGE`] ticks ago (or, with a wrong time field,
    /// never made by us).
    #[error("the SYN cookie has expired")]
    Expired,
    /// Not made by us for this 4-tuple and initial sequence number.
    #[error("the SYN cookie does not check")]
    Invalid,
}

/// Makes and checks SYN cookies; one per stack, with a secret key.
#[derive(Debug, Clone)]
pub struct SynCookies {
    key: (u64, u64),
}

impl SynCookies {
    /// Cookies with a random key (std's per-process random hasher keys are
    /// the entropy source, as for [`IsnGenerator`](super::IsnGenerator)).
    pub fn new() -> SynCookies {
        let random = RandomState::new();
        SynCookies {
            key: (random.hash_one(0x4987u32), random.hash_one(0xc00c1e5u32)),
        }
    }

    /// Cookies with a fixed key (deterministic tests).
    pub fn with_key(key: (u64, u64)) -> SynCookies {
        SynCookies { key }
    }

    /// The cookie for a SYN on `key` whose sequence number is `peer_isn`
    /// and MSS option `peer_mss` (`None`: RFC 9293's 536), made at `now`;
    /// our ISN for the SYN-ACK. The MSS the cookie carries is
    /// [`mss_index`]'s entry.
    pub fn make(&self, key: FourTuple, peer_isn: Seq, peer_mss: Option<u16>, now: Instant) -> Seq {
        let t = counter(now);
        let index = mss_index(peer_mss.unwrap_or(MSS_TABLE[0])) as u32;
        let low = (index << MSS_SHIFT) | (self.hash(key, 2, [t, peer_isn.0, index]) & HASH_MASK);
        Seq(self
            .hash(key, 1, [0; 3])
            .wrapping_add(peer_isn.0)
            .wrapping_add((t << COUNTER_SHIFT).wrapping_add(low)))
    }

    /// Checks `cookie` (the returning ACK's SEG.ACK − 1) for `key` and
    /// `peer_isn` (its SEG.SEQ − 1) at `now`: the peer's MSS it carries.
    pub fn check(
        &self,
        key: FourTuple,
        peer_isn: Seq,
        cookie: Seq,
        now: Instant,
    ) -> Result<u16, CookieError> {
        let rest = cookie
            .0
            .wrapping_sub(self.hash(key, 1, [0; 3]))
            .wrapping_sub(peer_isn.0);
        let now_t = counter(now);
        let age = now_t.wrapping_sub(rest >> COUNTER_SHIFT) & (u32::MAX >> COUNTER_SHIFT);
        if age > MAX_AGE {
            return Err(CookieError::Expired);
        }
        let t = now_t.wrapping_sub(age);
        let index = (rest >> MSS_SHIFT) & 0b11;
        if rest & HASH_MASK != self.hash(key, 2, [t, peer_isn.0, index]) & HASH_MASK {
            return Err(CookieError::Invalid);
        }
        Ok(MSS_TABLE[index as usize])
    }

    /// A keyed hash of the 4-tuple, `which` of the two, with `more`.
    fn hash(&self, key: FourTuple, which: u8, more: [u32; 3]) -> u32 {
        let mut hasher = DefaultHasher::new();
        self.key.hash(&mut hasher);
        which.hash(&mut hasher);
        key.local.ip.octets().hash(&mut hasher);
        key.local.port.hash(&mut hasher);
        key.remote.ip.octets().hash(&mut hasher);
        key.remote.port.hash(&mut hasher);
        more.hash(&mut hasher);
        hasher.finish() as u32
    }
}

impl Default for SynCookies {
    fn default() -> Self {
        Self::new()
    }
}

/// The time counter at `now`: [`TICK`]s since the driver's epoch.
fn counter(now: Instant) -> u32 {
    (now.as_nanos() / TICK.as_nanos() as u64) as u32
}

/// The index of the largest [`MSS_TABLE`] entry not above `mss` (the
/// least entry for an MSS below all of them).
pub fn mss_index(mss: u16) -> usize {
    MSS_TABLE.iter().rposition(|&m| m <= mss).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Endpoint;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    fn tuple(a: u32, ap: u16, b: u32, bp: u16) -> FourTuple {
        FourTuple::new(
            Endpoint::new(Ipv4Addr::from(a), ap),
            Endpoint::new(Ipv4Addr::from(b), bp),
        )
    }

    const T0: Instant = Instant(5 * 60 * 1_000_000_000);

    #[test]
    fn a_cookie_checks_for_its_tuple_and_carries_the_mss() {
        let cookies = SynCookies::with_key((7, 9));
        let key = tuple(0x0a00_0001, 80, 0x0a00_0002, 40000);
        let cookie = cookies.make(key, Seq(1000), Some(1460), T0);
        assert_eq!(cookies.check(key, Seq(1000), cookie, T0), Ok(1460));
        let jumbo = cookies.make(key, Seq(1000), Some(8960), T0);
        assert_eq!(cookies.check(key, Seq(1000), jumbo, T0), Ok(1460));
        let none = cookies.make(key, Seq(1000), None, T0);
        assert_eq!(cookies.check(key, Seq(1000), none, T0), Ok(536));
        let small = cookies.make(key, Seq(1000), Some(1400), T0);
        assert_eq!(cookies.check(key, Seq(1000), small, T0), Ok(1300));
        assert_eq!(
            cookies.check(key, Seq(1001), cookie, T0),
            Err(CookieError::Invalid),
            "another initial sequence number"
        );
        assert!(
            SynCookies::with_key((7, 10))
                .check(key, Seq(1000), cookie, T0)
                .is_err(),
            "another key"
        );
        assert_eq!(
            cookies.check(key, Seq(1000), cookie + 1u32, T0),
            Err(CookieError::Invalid),
            "one off"
        );
        assert_ne!(SynCookies::new().key, SynCookies::new().key);
    }

    #[test]
    fn a_cookie_is_good_for_one_to_two_ticks() {
        let cookies = SynCookies::with_key((1, 2));
        let key = tuple(1, 2, 3, 4);
        let start = Instant(10 * TICK.as_nanos() as u64);
        let cookie = cookies.make(key, Seq(5), Some(1460), start);
        let end_of_next = start + (TICK * 2 - Duration::from_nanos(1));
        assert_eq!(cookies.check(key, Seq(5), cookie, end_of_next), Ok(1460));
        assert_eq!(
            cookies.check(key, Seq(5), cookie, start + TICK * 2),
            Err(CookieError::Expired)
        );
        // A cookie from the future (a clock that went back, or a forgery)
        // is refused too.
        let earlier = Instant(start.0 - TICK.as_nanos() as u64);
        assert!(cookies.check(key, Seq(5), cookie, earlier).is_err());
        // 256 ticks later the counter wraps; the cookie is still refused
        // (its hash was made with the older counter).
        let wrapped = start + TICK * 256;
        assert_eq!(
            cookies.check(key, Seq(5), cookie, wrapped),
            Err(CookieError::Invalid)
        );
    }

    #[test]
    fn the_mss_index_takes_the_largest_entry_not_above() {
        assert_eq!(mss_index(0), 0);
        assert_eq!(mss_index(536), 0);
        assert_eq!(mss_index(1299), 0);
        assert_eq!(mss_index(1300), 1);
        assert_eq!(mss_index(1459), 2);
        assert_eq!(mss_index(u16::MAX), 3);
    }

    fn any_tuple() -> impl Strategy<Value = FourTuple> {
        (any::<u32>(), any::<u16>(), any::<u32>(), any::<u16>())
            .prop_map(|(a, ap, b, bp)| tuple(a, ap, b, bp))
    }

    proptest! {
        #[test]
        fn the_mss_round_trips(
            key in any_tuple(),
            isn in any::<u32>(),
            mss in any::<u16>(),
            secs in 0u64..1_000_000,
            later in 0u64..64,
        ) {
            let cookies = SynCookies::with_key((3, 4));
            let now = Instant(secs * 1_000_000_000);
            let cookie = cookies.make(key, Seq(isn), Some(mss), now);
            // Checked at once, or up to 64 s later: within MAX_AGE.
            let at = now + Duration::from_secs(later);
            prop_assert_eq!(
                cookies.check(key, Seq(isn), cookie, at),
                Ok(MSS_TABLE[mss_index(mss)])
            );
        }

        #[test]
        fn a_cookie_never_checks_for_another_tuple(
            key in any_tuple(),
            other in any_tuple(),
            isn in any::<u32>(),
            secs in 0u64..1_000_000,
        ) {
            prop_assume!(key != other);
            let cookies = SynCookies::with_key((5, 6));
            let now = Instant(secs * 1_000_000_000);
            let cookie = cookies.make(key, Seq(isn), Some(1460), now);
            // A forged cookie passes by chance with odds of 1 in 2^22
            // (after the time field's 2 in 256): rare enough for 256 cases.
            prop_assert!(cookies.check(other, Seq(isn), cookie, now).is_err());
        }

        #[test]
        fn an_old_cookie_expires(
            key in any_tuple(),
            isn in any::<u32>(),
            secs in 0u64..1_000_000,
            ticks_later in 2u64..255,
        ) {
            let cookies = SynCookies::with_key((8, 9));
            let now = Instant(secs * 1_000_000_000);
            let cookie = cookies.make(key, Seq(isn), Some(1460), now);
            let at = now + TICK * ticks_later as u32;
            prop_assert_eq!(
                cookies.check(key, Seq(isn), cookie, at),
                Err(CookieError::Expired)
            );
        }
    }
}
