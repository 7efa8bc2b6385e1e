//! Whether iokerneld answers at its control socket (a stats request).

use std::io;
use std::path::Path;

use ginza_proto::{client, ClientError, SYSTEM_SOCKET_PATH};
use serde_json::json;

use super::{Check, Verdict};

pub fn check(socket: &Path) -> Check {
    let shown = socket.display();
    match client::stats(socket) {
        Ok(s) => Check::new(
            "iokerneld",
            Verdict::Pass,
            format!(
                "answers at {shown}: policy {}, managed cores {}, {} applications registered",
                s.policy,
                ginza_sys::cpulist::format(&s.managed_cores),
                s.apps.len()
            ),
        )
        .data(json!({
            "socket": socket,
            "running": true,
            "apps": s.apps.len(),
            "managed_cores": s.managed_cores,
        })),
        Err(e) => {
            let (what, fix) = match &e {
                ClientError::Connect { source, .. } => match source.kind() {
                    io::ErrorKind::NotFound if service_hidden(socket) => (
                        format!(
                            "not running at {shown} (no socket there); the service's directory {} exists but is closed to this user",
                            service_dir().display()
                        ),
                        "join the group ginza (`usermod -aG ginza USER`, then log in again) to use the service",
                    ),
                    io::ErrorKind::NotFound => (
                        format!("not running at {shown} (no socket there)"),
                        "start it: `systemctl start ginza-iokerneld` (packaging/systemd) or `ginza iokernel --core C --cores LIST`; or pass --socket",
                    ),
                    io::ErrorKind::ConnectionRefused => (
                        format!("not running at {shown} (a stale socket file: nobody listens)"),
                        "start iokerneld (it removes the stale file)",
                    ),
                    io::ErrorKind::PermissionDenied => (
                        format!("{shown} is not open to this user ({source})"),
                        "join the group ginza for the service (`usermod -aG ginza USER`), or run as iokerneld's user",
                    ),
                    _ => (format!("cannot connect to {shown}: {source}"), "check the path"),
                },
                other => (
                    format!("something at {shown} does not answer as iokerneld: {other}"),
                    "check that iokerneld and this ginza are the same version",
                ),
            };
            Check::new("iokerneld", Verdict::Warn, what)
                .fix(fix)
                .data(json!({ "socket": socket, "running": false }))
        }
    }
}

fn service_dir() -> &'static Path {
    Path::new(SYSTEM_SOCKET_PATH)
        .parent()
        .expect("an absolute path with a directory")
}

/// Whether the service's socket directory exists but this user cannot
/// look into it (so `default_socket_path` passed over the service), while
/// another socket was asked.
fn service_hidden(socket: &Path) -> bool {
    socket != Path::new(SYSTEM_SOCKET_PATH)
        && service_dir().is_dir()
        && std::fs::read_dir(service_dir()).is_err()
}
