//! The capabilities iokerneld uses, read from `CapEff` in
//! `/proc/self/status` (what this process could do; iokerneld started the
//! same way gets the same).

use serde_json::json;

use super::{Check, Verdict};

pub const CAP_KILL: u32 = 5;
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;
pub const CAP_IPC_LOCK: u32 = 14;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SYS_NICE: u32 = 23;
pub const CAP_BPF: u32 = 39;

/// Each capability iokerneld uses, and what for.
const USED: [(u32, &str, &str); 7] = [
    (
        CAP_NET_ADMIN,
        "CAP_NET_ADMIN",
        "attach the XDP program, promiscuous mode",
    ),
    (CAP_NET_RAW, "CAP_NET_RAW", "AF_XDP and packet sockets"),
    (CAP_BPF, "CAP_BPF", "load the XDP program and its map"),
    (
        CAP_SYS_ADMIN,
        "CAP_SYS_ADMIN",
        "stands in for CAP_BPF on kernels before 5.8",
    ),
    (CAP_IPC_LOCK, "CAP_IPC_LOCK", "UMEM beyond RLIMIT_MEMLOCK"),
    (
        CAP_SYS_NICE,
        "CAP_SYS_NICE",
        "pin the kthreads of other users' applications",
    ),
    (
        CAP_KILL,
        "CAP_KILL",
        "preempt (signal) the kthreads of other users' applications",
    ),
];

/// An effective capability set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    pub effective: u64,
}

impl Capabilities {
    /// This process's; none if `/proc/self/status` cannot be read.
    pub fn of_this_process() -> Capabilities {
        let effective = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| parse_cap_eff(&s))
            .unwrap_or(0);
        Capabilities { effective }
    }

    pub fn has(&self, cap: u32) -> bool {
        self.effective & (1 << cap) != 0
    }

    /// What loading an XDP program needs besides CAP_NET_ADMIN.
    fn can_load_bpf(&self) -> bool {
        self.has(CAP_BPF) || self.has(CAP_SYS_ADMIN)
    }
}

/// The `CapEff:` line's hexadecimal mask.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// `nic_asked`: an interface was named, so the NIC capabilities are needed.
pub fn check(caps: &Capabilities, nic_asked: bool) -> Check {
    let have: Vec<&str> = USED
        .iter()
        .filter(|(c, ..)| caps.has(*c))
        .map(|(_, n, _)| *n)
        .collect();
    let mut missing_nic: Vec<&str> = [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_NET_RAW, "CAP_NET_RAW"),
    ]
    .iter()
    .filter(|(c, _)| !caps.has(*c))
    .map(|(_, n)| *n)
    .collect();
    if !caps.can_load_bpf() {
        missing_nic.push("CAP_BPF");
    }
    let missing_other: Vec<&str> = [
        (CAP_SYS_NICE, "CAP_SYS_NICE"),
        (CAP_KILL, "CAP_KILL"),
        (CAP_IPC_LOCK, "CAP_IPC_LOCK"),
    ]
    .iter()
    .filter(|(c, _)| !caps.has(*c))
    .map(|(_, n)| *n)
    .collect();
    let data = json!({
        "effective": format!("{:016x}", caps.effective),
        "have": have,
        "missing_for_nic": missing_nic,
        "missing_other": missing_other,
    });
    let why = |names: &[&str]| -> String {
        names
            .iter()
            .map(|n| {
                let purpose = USED.iter().find(|u| u.1 == *n).map_or("", |u| u.2);
                format!("{n} ({purpose})")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let have_text = if have.is_empty() {
        "none".to_string()
    } else {
        have.join(" ")
    };
    let check = if missing_nic.is_empty() && missing_other.is_empty() {
        Check::new(
            "caps",
            Verdict::Pass,
            format!("effective: {have_text}: everything iokerneld uses"),
        )
    } else if missing_nic.is_empty() {
        Check::new(
            "caps",
            Verdict::Warn,
            format!("effective: {have_text}; missing {}", why(&missing_other)),
        )
        .fix("add those whose purpose matters here (AmbientCapabilities in the unit)")
    } else {
        let verdict = if nic_asked {
            Verdict::Fail
        } else {
            Verdict::Warn
        };
        let mut missing = missing_nic.clone();
        missing.extend(&missing_other);
        Check::new(
            "caps",
            verdict,
            format!(
                "effective: {have_text}; missing {}: the software switch only, no AF_XDP or af_packet",
                why(&missing)
            ),
        )
        .fix("run iokerneld as root or with these capabilities (the unit in packaging/systemd)")
    };
    check.data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_eff_is_read_from_the_status_text() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\nCapBnd:\t0\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }

    #[test]
    fn verdicts_follow_what_is_missing() {
        let all = Capabilities {
            effective: USED.iter().fold(0, |m, (c, ..)| m | 1 << c),
        };
        assert_eq!(check(&all, true).verdict, Verdict::Pass);
        let no_kill = Capabilities {
            effective: all.effective & !(1 << CAP_KILL),
        };
        let c = check(&no_kill, true);
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(c.found.contains("missing CAP_KILL"), "{c:?}");
        // CAP_SYS_ADMIN stands in for CAP_BPF.
        let sys_admin = Capabilities {
            effective: all.effective & !(1 << CAP_BPF),
        };
        assert_eq!(check(&sys_admin, true).verdict, Verdict::Pass);
        let none = Capabilities { effective: 0 };
        assert_eq!(check(&none, true).verdict, Verdict::Fail);
        let c = check(&none, false);
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.found.contains("CAP_NET_RAW (AF_XDP"), "{c:?}");
    }
}
