//! Numbers as memcached reads them: C's `strtoull`/`strtol` with
//! memcached's checks (`safe_strtoull`, `safe_strtoul`, `safe_strtol`).
//! Shared by the text and meta protocols and the store's `incr`/`decr`.

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The digits of a C number: leading white space, a sign, digits; the
/// value's magnitude (None on overflow of u64), whether it was negative,
/// and where it stopped; None if there were no digits.
fn c_number(s: &[u8]) -> Option<(Option<u64>, bool, usize)> {
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let negative = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits_start = i;
    let mut value: Option<u64> = Some(0);
    while i < s.len() && s[i].is_ascii_digit() {
        value = value
            .and_then(|v| v.checked_mul(10))
            .and_then(|v| v.checked_add(u64::from(s[i] - b'0')));
        i += 1;
    }
    if i == digits_start {
        return None;
    }
    Some((value, negative, i))
}

/// What may follow a number: white space, a NUL or the end.
fn ends_number(s: &[u8], at: usize) -> bool {
    match s.get(at) {
        None | Some(0) => true,
        Some(&b) => is_c_space(b),
    }
}

/// memcached's `safe_strtoull`.
pub fn strtoull(s: &[u8]) -> Option<u64> {
    let (magnitude, negative, end) = c_number(s)?;
    let magnitude = magnitude?; // ERANGE
    if !ends_number(s, end) {
        return None;
    }
    let value = if negative {
        magnitude.wrapping_neg()
    } else {
        magnitude
    };
    // A minus sign is refused only where the result looks negative.
    let upto_nul = s.split(|&b| b == 0).next().unwrap_or(&[]);
    if (value as i64) < 0 && upto_nul.contains(&b'-') {
        return None;
    }
    Some(value)
}

/// memcached's `safe_strtoul`: `strtoull`'s checks, then the value cut to
/// 32 bits as C's assignment cuts it.
pub fn strtoul32(s: &[u8]) -> Option<u32> {
    strtoull(s).map(|v| v as u32)
}

/// memcached's `safe_strtol`: a 64-bit `strtol`, then cut to 32 bits.
pub fn strtol32(s: &[u8]) -> Option<i32> {
    let (magnitude, negative, end) = c_number(s)?;
    let magnitude = magnitude?;
    let value: i64 = if negative {
        if magnitude > 1 << 63 {
            return None;
        }
        (magnitude as i64).wrapping_neg()
    } else {
        i64::try_from(magnitude).ok()?
    };
    if !ends_number(s, end) {
        return None;
    }
    Some(value as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_c_reads_them() {
        assert_eq!(strtoull(b"42"), Some(42));
        assert_eq!(strtoull(b"+42"), Some(42));
        assert_eq!(strtoull(b" 42 "), Some(42));
        assert_eq!(strtoull(b"-0"), Some(0));
        assert_eq!(strtoull(b"-1"), None);
        assert_eq!(strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(strtoull(b"18446744073709551616"), None);
        assert_eq!(strtoull(b"12ab"), None);
        assert_eq!(strtoull(b"12\r\n"), Some(12));
        assert_eq!(strtoull(b""), None);
        assert_eq!(strtol32(b"-5"), Some(-5));
        assert_eq!(strtol32(b"4294967297"), Some(1), "cut to 32 bits");
        assert_eq!(strtol32(b"x"), None);
        assert_eq!(strtoul32(b"4294967296"), Some(0));
        assert_eq!(strtoul32(b"-1"), None);
    }
}
