//! The kernel's CPU-list text, as in sysfs (`thread_siblings_list`,
//! `online`) and in `--cores` flags: comma-separated CPUs and inclusive
//! ranges, e.g. `0-3,8,10-11`.

/// Longest range accepted (`a-b` with `b - a` above it is refused), so a
/// typo such as `0-4000000000` is an error, not an allocation of gigabytes.
pub const MAX_RANGE: usize = 4096;

/// Why a CPU list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    #[error("{part:?} is not a core or a range a-b")]
    NotACpu { part: String },
    #[error("range {part:?} is empty or too long (a-b with a <= b, at most {MAX_RANGE} apart)")]
    BadRange { part: String },
}

/// Parses a CPU list, keeping the order written (duplicates too). Spaces
/// around items and a trailing newline are allowed; empty items are
/// skipped, so `""` is the empty list.
pub fn parse(text: &str) -> Result<Vec<usize>, CpuListError> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let not_a_cpu = || CpuListError::NotACpu {
            part: part.to_string(),
        };
        match part.split_once('-') {
            Some((lo, hi)) => {
                let lo: usize = lo.trim().parse().map_err(|_| not_a_cpu())?;
                let hi: usize = hi.trim().parse().map_err(|_| not_a_cpu())?;
                if lo > hi || hi - lo > MAX_RANGE {
                    return Err(CpuListError::BadRange {
                        part: part.to_string(),
                    });
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(part.parse().map_err(|_| not_a_cpu())?),
        }
    }
    Ok(cpus)
}

/// Writes `cpus` as a sorted CPU list with ranges: `[5, 1, 2, 3, 7]` is
/// `1-3,5,7`.
pub fn format(cpus: &[usize]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_lists_parse_in_the_order_written() {
        assert_eq!(parse("0-3,8,10-11\n"), Ok(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse("5"), Ok(vec![5]));
        assert_eq!(parse("1,3-5, 7"), Ok(vec![1, 3, 4, 5, 7]));
        assert_eq!(parse(" 2 - 3 ,1"), Ok(vec![2, 3, 1]));
        assert_eq!(parse("4-4"), Ok(vec![4]));
        assert_eq!(parse(""), Ok(vec![]));
        assert_eq!(parse(",\n"), Ok(vec![]));
        assert_eq!(parse("0-4096").map(|v| v.len()), Ok(4097));
    }

    #[test]
    fn bad_lists_say_which_item_is_wrong() {
        let msg = |s: &str| parse(s).unwrap_err().to_string();
        assert_eq!(parse("a"), Err(CpuListError::NotACpu { part: "a".into() }));
        assert_eq!(msg("1,x"), "\"x\" is not a core or a range a-b");
        assert_eq!(msg("1-"), "\"1-\" is not a core or a range a-b");
        assert_eq!(msg("-1"), "\"-1\" is not a core or a range a-b");
        assert_eq!(msg("1-2-3"), "\"1-2-3\" is not a core or a range a-b");
        assert_eq!(
            parse("3-1"),
            Err(CpuListError::BadRange { part: "3-1".into() })
        );
        assert!(
            msg("0-4097").contains("at most 4096 apart"),
            "{}",
            msg("0-4097")
        );
    }

    #[test]
    fn format_sorts_dedups_and_joins_ranges() {
        assert_eq!(format(&[5, 1, 2, 3, 7]), "1-3,5,7");
        assert_eq!(format(&[0, 0, 1]), "0-1");
        assert_eq!(format(&[]), "");
        for cpus in [vec![0, 1, 2, 3, 8, 10, 11], vec![4], vec![1, 3, 5]] {
            assert_eq!(parse(&format(&cpus)), Ok(cpus));
        }
    }
}
