//! The processor and kernel features Ginza relies on: FSGSBASE (`ginza
//! run` switches a program's thread pointer at every uthread switch) and
//! the kernel version (XDP links since 5.9).

use serde_json::json;

use super::{Check, Verdict};

/// `HWCAP2_FSGSBASE` in the auxiliary vector (x86-64): the kernel lets
/// user space use `rdfsbase`/`wrfsbase`.
const HWCAP2_FSGSBASE: usize = 1 << 1;

/// The oldest kernel with everything iokerneld uses (`BPF_LINK_CREATE`
/// for XDP, FSGSBASE enabled for user space): 5.9.
pub const MIN_KERNEL: (u32, u32) = (5, 9);

pub fn fsgsbase() -> Check {
    if !cfg!(target_arch = "x86_64") {
        return Check::new(
            "fsgsbase",
            Verdict::Pass,
            "not an x86-64 machine: `ginza run` uses no FSGSBASE here",
        );
    }
    let (_, hwcap2) = rustix::param::linux_hwcap();
    let on = hwcap2 & HWCAP2_FSGSBASE != 0;
    let data = json!({ "fsgsbase": on });
    if on {
        Check::new(
            "fsgsbase",
            Verdict::Pass,
            "FSGSBASE is enabled: `ginza run` switches thread pointers without a system call",
        )
        .data(data)
    } else {
        Check::new(
            "fsgsbase",
            Verdict::Warn,
            "FSGSBASE is not enabled: `ginza run` pays an arch_prctl system call per uthread switch",
        )
        .fix("Linux 5.9+ on a processor with FSGSBASE (and no `nofsgsbase` on the kernel command line)")
        .data(data)
    }
}

/// `6.1.0-13-amd64` → (6, 1).
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

pub fn kernel() -> Check {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    let data = json!({ "release": release });
    let check = match parse_release(release) {
        Some(v) if v >= MIN_KERNEL => Check::new(
            "kernel",
            Verdict::Pass,
            format!("Linux {release}: XDP links, AF_XDP and FSGSBASE available"),
        ),
        Some(_) => Check::new(
            "kernel",
            Verdict::Warn,
            format!(
                "Linux {release} is older than {}.{}: no XDP links (use af_packet), no FSGSBASE",
                MIN_KERNEL.0, MIN_KERNEL.1
            ),
        )
        .fix("Linux 5.9 or later"),
        None => Check::new(
            "kernel",
            Verdict::Warn,
            format!("cannot tell the kernel version from {release:?}"),
        ),
    };
    check.data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse() {
        assert_eq!(parse_release("6.1.0-13-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.9.0"), Some((5, 9)));
        assert_eq!(parse_release("6.18.44-fc-v657\n"), Some((6, 18)));
        assert_eq!(parse_release("nonsense"), None);
        assert!((5, 10) >= MIN_KERNEL && (4, 19) < MIN_KERNEL);
    }
}
