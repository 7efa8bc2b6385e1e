//! `RLIMIT_MEMLOCK` against what iokerneld pins: the AF_XDP UMEM is
//! charged to it unless the process has `CAP_IPC_LOCK`.

use rustix::process::{getrlimit, Resource};
use serde_json::json;

use super::caps::{Capabilities, CAP_IPC_LOCK};
use super::{fmt_bytes, Check, Verdict};
use crate::nic::af_xdp::{CHUNK_SIZE, UMEM_FRAMES};

/// Bytes an AF_XDP link pins.
pub const UMEM_BYTES: u64 = (UMEM_FRAMES * CHUNK_SIZE) as u64;

/// `None`: unlimited.
fn show(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".into(), fmt_bytes)
}

/// `nic_asked`: an interface was named, so the UMEM will be needed.
pub fn check(caps: &Capabilities, nic_asked: bool) -> Check {
    let limit = getrlimit(Resource::Memlock);
    judge(
        limit.current,
        limit.maximum,
        caps.has(CAP_IPC_LOCK),
        nic_asked,
    )
}

/// The verdict for a soft and hard limit (`None`: unlimited).
pub fn judge(soft: Option<u64>, hard: Option<u64>, ipc_lock: bool, nic_asked: bool) -> Check {
    let found = format!(
        "RLIMIT_MEMLOCK soft {}, hard {}; an AF_XDP link pins {} of UMEM{}",
        show(soft),
        show(hard),
        fmt_bytes(UMEM_BYTES),
        if ipc_lock {
            " (CAP_IPC_LOCK: not charged)"
        } else {
            ""
        }
    );
    let data = json!({
        "soft": soft,
        "hard": hard,
        "umem_bytes": UMEM_BYTES,
        "cap_ipc_lock": ipc_lock,
    });
    let enough = ipc_lock || soft.is_none_or(|s| s >= UMEM_BYTES);
    let check = if enough {
        Check::new("memlock", Verdict::Pass, found)
    } else {
        let verdict = if nic_asked {
            Verdict::Fail
        } else {
            Verdict::Warn
        };
        Check::new("memlock", verdict, format!("{found}: too low for AF_XDP"))
            .fix("LimitMEMLOCK=infinity in the unit (packaging/systemd), `ulimit -l unlimited` in the shell, or CAP_IPC_LOCK")
    };
    check.data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_must_hold_the_umem_unless_ipc_lock() {
        assert_eq!(judge(None, None, false, true).verdict, Verdict::Pass);
        assert_eq!(
            judge(Some(UMEM_BYTES), Some(UMEM_BYTES), false, true).verdict,
            Verdict::Pass
        );
        let low = judge(Some(64 << 10), Some(64 << 10), false, true);
        assert_eq!(low.verdict, Verdict::Fail);
        assert!(low.found.contains("soft 64 KiB"), "{low:?}");
        assert_eq!(
            judge(Some(64 << 10), None, false, false).verdict,
            Verdict::Warn
        );
        assert_eq!(
            judge(Some(64 << 10), None, true, true).verdict,
            Verdict::Pass
        );
    }
}
