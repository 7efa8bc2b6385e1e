//! `ginza doctor`: parses the flags, runs `ginza_iokernel::doctor`, prints
//! its report (lines or JSON) and exits non-zero when iokerneld could not
//! run here.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use ginza_iokernel::doctor::{self, Options};
use ginza_proto::default_socket_path;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The interface iokerneld would serve (`nic = "af_xdp:IFACE"`): AF_XDP
    /// and the XDP modes are tried on it (attached and detached at once).
    #[arg(long, value_name = "IFACE")]
    pub interface: Option<String>,
    /// With --interface: do not try attaching in driver (native) mode,
    /// which some drivers (mlx5, i40e, ixgbe, ...) do by resetting their
    /// queues, so the link drops for a moment. iokerneld itself attaches
    /// in generic mode.
    #[arg(long, requires = "interface")]
    pub skip_driver_mode: bool,
    /// iokerneld's control socket [default: the one applications use: the
    /// per-user socket if it exists, else /run/ginza/iokerneld.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Round trips of the wake measurement.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub wake_rounds: u32,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Prints the report; returns the exit status.
pub fn run(args: DoctorArgs) -> anyhow::Result<u8> {
    let report = doctor::run(&Options {
        interface: args.interface,
        socket: args.socket.unwrap_or_else(default_socket_path),
        try_driver_mode: !args.skip_driver_mode,
        wake_rounds: args.wake_rounds as usize,
    });
    let text = if args.json {
        let mut line = serde_json::to_string(&report).context("encoding the report")?;
        line.push('\n');
        line
    } else {
        report.text()
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")?;
    Ok(report.exit_code())
}
