//! AF_XDP on a named interface, with iokerneld's own NIC code: the XDP
//! program attached in driver and then generic mode (detached at once;
//! some drivers reset their queues, and so the link, when a program is
//! attached in driver mode: `try_driver` false skips that trial),
//! then the AF_XDP link opened as `nic = "af_xdp:IF"` opens it, and
//! closed; if that fails, the `af_packet` fallback (named in the line, but
//! the check fails: iokerneld could not serve the interface as asked).

use serde_json::json;

use super::{Check, Verdict};
use crate::nic::af_packet::AfPacket;
use crate::nic::af_xdp::{self, AfXdp, XdpMode};
use crate::nic::linux::NicError;
use crate::nic::DEFAULT_BUFFER_SIZE;

/// Pool buffers of the trial links (nothing is received).
const TRIAL_BUFFERS: usize = 64;

pub fn check(interface: Option<&str>, try_driver: bool) -> Check {
    let Some(ifname) = interface else {
        return Check::new(
            "xdp",
            Verdict::Warn,
            "not checked (no --interface): iokerneld's default software switch needs no NIC",
        )
        .fix("pass --interface IFACE to check AF_XDP on the interface iokerneld would serve");
    };
    let driver = try_driver.then(|| af_xdp::probe_attach(ifname, XdpMode::Driver));
    let generic = af_xdp::probe_attach(ifname, XdpMode::Generic);
    for probe in driver.iter().chain([&generic]) {
        if let Err(e @ (NicError::NoSuchInterface(_) | NicError::BadInterfaceName(_))) = probe {
            return Check::new("xdp", Verdict::Fail, e.to_string())
                .fix("name an existing interface (`ip -br link` lists them)")
                .data(json!({ "interface": ifname, "exists": false }));
        }
    }
    let link = AfXdp::open(ifname, TRIAL_BUFFERS, DEFAULT_BUFFER_SIZE).map(drop);
    let fallback = link
        .is_err()
        .then(|| AfPacket::open(ifname, TRIAL_BUFFERS, DEFAULT_BUFFER_SIZE).map(drop));
    let mode = |r: &Result<(), NicError>| match r {
        Ok(()) => "yes".to_string(),
        Err(e) => format!("no ({e})"),
    };
    let modes = format!(
        "XDP driver mode {}, generic mode {}",
        driver
            .as_ref()
            .map_or_else(|| "not tried (--skip-driver-mode)".to_string(), mode),
        mode(&generic)
    );
    let data = json!({
        "interface": ifname,
        "exists": true,
        "driver_mode": driver.as_ref().map(Result::is_ok),
        "generic_mode": generic.is_ok(),
        "af_xdp": link.is_ok(),
        "af_packet": fallback.as_ref().map(Result::is_ok),
    });
    let busy = driver
        .iter()
        .chain([&generic, &link])
        .any(|r| matches!(r, Err(e) if is_busy(e)));
    let needs_root = driver
        .iter()
        .chain([&generic, &link])
        .any(|r| matches!(r, Err(NicError::NeedsRoot { .. })));
    let check = match (&link, &fallback) {
        (Ok(()), _) => Check::new(
            "xdp",
            Verdict::Pass,
            format!(
                "AF_XDP works on {ifname} (copy mode, queue 0, generic XDP: as iokerneld opens it); {modes}: nic = \"af_xdp:{ifname}\""
            ),
        ),
        (Err(e), _) if busy => Check::new(
            "xdp",
            Verdict::Warn,
            format!("{ifname} is in use by another XDP program or AF_XDP socket ({e}); {modes}"),
        )
        .fix(format!(
            "if it is a running iokerneld, nothing; else detach the stale program: `ip link set dev {ifname} xdp off`"
        )),
        (Err(e), other) => {
            let packet = match other {
                Some(Ok(())) => format!("; af_packet works (nic = \"af_packet:{ifname}\", slower)"),
                Some(Err(p)) => format!("; af_packet failed too ({p})"),
                None => String::new(),
            };
            let fix = if needs_root {
                "run iokerneld as root or with CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (the unit in packaging/systemd does)".to_string()
            } else if is_errno(e, libc::ENOBUFS) {
                "the UMEM is over RLIMIT_MEMLOCK: raise it (see the memlock line) or grant CAP_IPC_LOCK".to_string()
            } else {
                format!("check {ifname} is up and supports XDP (Linux 5.9+ for XDP links)")
            };
            Check::new(
                "xdp",
                Verdict::Fail,
                format!("AF_XDP failed on {ifname} ({e}){packet}; {modes}"),
            )
            .fix(fix)
        }
    };
    check.data(data)
}

fn is_busy(e: &NicError) -> bool {
    is_errno(e, libc::EBUSY)
}

fn is_errno(e: &NicError, errno: i32) -> bool {
    matches!(e, NicError::Io { source, .. } if source.raw_os_error() == Some(errno))
}
