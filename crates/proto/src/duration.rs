//! Durations as the command lines of iokerneld, the applications and the
//! `ginza` tool all write them (`--interval 5us`, `--duration 2s`).

use std::time::Duration;

/// Parses `5us`, `5µs`, `1.5ms`, `200ns`, `2s` (a bare number is ns).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 5us, 1ms)"))?;
    let scale = match unit.trim() {
        "" | "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        u => return Err(format!("unknown unit {u:?} in {s:?} (ns, us, ms, s, m, h)")),
    };
    let secs = v * scale;
    if !secs.is_finite() || secs > 1e9 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_units() {
        assert_eq!(parse_duration("5us"), Ok(Duration::from_micros(5)));
        assert_eq!(parse_duration("60m"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("5µs"), Ok(Duration::from_micros(5)));
        assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("200"), Ok(Duration::from_nanos(200)));
        assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
        assert!(parse_duration("5 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1e400s").is_err());
    }
}
