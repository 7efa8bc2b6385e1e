//! The service files of `packaging/` (docs/operations.md): the example
//! configuration loads as iokerneld's own, its socket is where
//! applications look, and the unit passes `systemd-analyze verify`, runs
//! `ginza iokernel` on that configuration and grants the capabilities
//! iokerneld uses and no others.

use std::path::{Path, PathBuf};
use std::process::Command;

use ginza_iokernel::{Cli, Config};
use ginza_proto::SYSTEM_SOCKET_PATH;

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging")
        .join(file)
}

/// The value of `key=` in the unit (the last one, as systemd takes it).
fn unit_value<'a>(unit: &'a str, key: &str) -> &'a str {
    unit.lines()
        .rev()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
}

#[test]
fn the_example_configuration_loads_with_the_system_socket() {
    let path = packaging("ginza/iokerneld.toml");
    // Its cores are an example: this machine's own override them, as a
    // flag overrides the file.
    let cpus = ginza_sys::affinity::allowed_cpus().unwrap();
    let cores = ginza_sys::cpulist::format(&cpus[cpus.len().min(2) - 1..]);
    let mut args = vec![
        "iokerneld".to_string(),
        "--config".into(),
        path.display().to_string(),
    ];
    args.extend(["--cores".into(), cores]);
    if cpus.len() >= 2 {
        args.extend(["--core".into(), cpus[0].to_string()]);
    }
    let cli = <Cli as clap::Parser>::try_parse_from(&args).unwrap();
    let cfg = Config::from_cli(&cli).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(cfg.socket, Path::new(SYSTEM_SOCKET_PATH));
}

#[test]
fn the_unit_runs_iokerneld_with_its_capabilities_and_socket() {
    let unit = std::fs::read_to_string(packaging("systemd/ginza-iokerneld.service")).unwrap();
    assert_eq!(
        unit_value(&unit, "ExecStart"),
        "/usr/local/bin/ginza iokernel --config /etc/ginza/iokerneld.toml"
    );
    // The socket's directory is the unit's runtime directory.
    assert_eq!(
        Path::new("/run").join(unit_value(&unit, "RuntimeDirectory")),
        Path::new(SYSTEM_SOCKET_PATH).parent().unwrap()
    );
    let caps = "CAP_NET_ADMIN CAP_NET_RAW CAP_BPF CAP_SYS_NICE CAP_KILL";
    assert_eq!(unit_value(&unit, "AmbientCapabilities"), caps);
    assert_eq!(unit_value(&unit, "CapabilityBoundingSet"), caps);
    assert_eq!(unit_value(&unit, "LimitMEMLOCK"), "infinity");
    assert_eq!(unit_value(&unit, "Restart"), "on-failure");
    assert_eq!(unit_value(&unit, "User"), "ginza");
    let sysusers = std::fs::read_to_string(packaging("sysusers.d/ginza.conf")).unwrap();
    assert!(
        sysusers.lines().any(|l| l.starts_with("u ginza ")),
        "{sysusers}"
    );

    // systemd's own check. It wants ExecStart's program to exist: the
    // unit is checked with this test's binary in its place.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        ginza_iokernel::testing::skip("systemd-analyze is not installed (package systemd)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ginza-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let me = std::env::current_exe().unwrap();
    let copy = dir.join("ginza-iokerneld.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/ginza", me.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
