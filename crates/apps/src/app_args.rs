//! The command-line flags every networked application binary shares (its
//! address on iokerneld's switch, its kthreads and guaranteed cores,
//! iokerneld's socket, when to stop), and what they turn into: the runtime's
//! [`Config`] and a stop flag set by SIGINT/SIGTERM or `--run-for`.
//!
//! A binary flattens [`AppArgs`] into its own `clap::Parser` next to its own
//! flags; one that wants other default addresses (so that two applications
//! started with defaults do not share a MAC) overrides them with
//! [`AppArgs::with_defaults`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ginza_proto::netstack::default_netstack_socket;
use ginza_proto::parse_duration;
use ginza_runtime::net::protected::ProtectedConfig;
use ginza_runtime::net::{Interface, Ipv4Addr, MacAddr, NetConfig};
use ginza_runtime::{Class, Config, IokernelConfig};

/// Flags shared by the networked applications.
#[derive(clap::Args, Debug, Clone)]
pub struct AppArgs {
    /// The application's MAC address on iokerneld's switch.
    #[arg(long, default_value = "02:47:5a:00:01:01")]
    pub mac: MacAddr,
    /// The application's IPv4 address.
    #[arg(long, default_value = "10.47.1.1")]
    pub ip: Ipv4Addr,
    /// Kthreads (cores it may use at most).
    #[arg(long, default_value_t = 2)]
    pub kthreads: usize,
    /// Cores iokerneld never takes away.
    #[arg(long, default_value_t = 0)]
    pub guaranteed: u32,
    /// Out of work, one kthread keeps its core and polls this long with no
    /// arrival while no other application wants the core; 0: park at once
    /// (docs/idle-poll.md) [default: 2s].
    #[arg(long, value_parser = parse_duration)]
    pub poll_while_idle: Option<Duration>,
    /// Name at iokerneld [default: the program's name].
    #[arg(long)]
    pub name: Option<String>,
    /// iokerneld's control socket [default: its default path].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Static ARP entries `IP=MAC` (peers that do not answer ARP).
    #[arg(long = "static-arp", value_parser = parse_arp)]
    pub static_arp: Vec<(Ipv4Addr, MacAddr)>,
    /// Stop after this long (e.g. 10s) [default: run until SIGINT/SIGTERM].
    #[arg(long, value_parser = parse_duration)]
    pub run_for: Option<Duration>,
    /// Protected mode (DLibOS): TCP through the netstack process at this
    /// socket [default: netstack.sock next to iokerneld's] instead of the
    /// in-process stack; `--mac`/`--ip` become the netstack's for this
    /// application. UDP is not available then.
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true)]
    pub protected: Option<Option<PathBuf>>,
    /// With `--protected`: run standalone (no iokerneld; fixed cores).
    #[arg(long, requires = "protected")]
    pub standalone: bool,
}

impl AppArgs {
    /// `command` with the defaults of `--mac` and `--ip` replaced (call it
    /// on `Parser::command()` before `get_matches`).
    pub fn with_defaults(
        command: clap::Command,
        mac: &'static str,
        ip: &'static str,
    ) -> clap::Command {
        command
            .mut_arg("mac", |a| a.default_value(mac))
            .mut_arg("ip", |a| a.default_value(ip))
    }

    /// The name at iokerneld: `--name`, else `program`.
    pub fn name_or(&self, program: &str) -> String {
        self.name.clone().unwrap_or_else(|| program.to_string())
    }

    /// A latency-critical runtime with networking at `--mac`/`--ip`,
    /// registered as `name`: the in-process stack, or with `--protected`
    /// the netstack (registered with iokerneld for cores only, or
    /// standalone with `--standalone`).
    pub fn runtime_config(&self, name: &str) -> Config {
        let mut io = IokernelConfig::new(name, Class::LatencyCritical);
        io.socket = self.socket.clone();
        io.guaranteed = self.guaranteed;
        if let Some(d) = self.poll_while_idle {
            io.poll_while_idle = d;
        }
        if let Some(path) = &self.protected {
            let socket = path.clone().unwrap_or_else(default_netstack_socket);
            let me = Interface {
                mac: self.mac,
                ip: self.ip,
            };
            return Config {
                iokernel: (!self.standalone).then_some(io),
                protected: Some(ProtectedConfig::new(socket, name, me)),
                ..Config::with_kthreads(self.kthreads)
            };
        }
        let mut net = NetConfig::new(self.mac, self.ip);
        for &(ip, mac) in &self.static_arp {
            net = net.with_static_arp(ip, mac);
        }
        io.net = Some(net);
        Config {
            iokernel: Some(io),
            ..Config::with_kthreads(self.kthreads)
        }
    }

    /// Whether the application runs protected (`--protected`).
    pub fn is_protected(&self) -> bool {
        self.protected.is_some()
    }

    /// Whether to serve UDP beside TCP: not in protected mode (the netstack
    /// speaks TCP only), where asking for UDP alone (`udp_only`) is an error.
    pub fn serve_udp(&self, udp_only: bool) -> anyhow::Result<bool> {
        match (self.is_protected(), udp_only) {
            (false, _) => Ok(true),
            (true, true) => anyhow::bail!(
                "--protected: the netstack speaks TCP only, and --udp-only asks for UDP alone"
            ),
            (true, false) => {
                log::info!("protected mode: TCP only (the netstack does not carry UDP)");
                Ok(false)
            }
        }
    }

    /// A flag set on SIGINT/SIGTERM and after `--run-for`.
    pub fn stop_flag(&self) -> anyhow::Result<Arc<AtomicBool>> {
        let stop = Arc::new(AtomicBool::new(false));
        let on_signal = stop.clone();
        ctrlc::set_handler(move || on_signal.store(true, Relaxed))
            .context("installing the SIGINT/SIGTERM handler")?;
        if let Some(d) = self.run_for {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(d);
                stop.store(true, Relaxed);
            });
        }
        Ok(stop)
    }
}

/// Parses a static ARP entry, `IP=MAC`.
pub fn parse_arp(s: &str) -> Result<(Ipv4Addr, MacAddr), String> {
    let (ip, mac) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected IP=MAC"))?;
    let ip = ip.parse().map_err(|e| format!("{ip:?}: {e}"))?;
    let mac = mac.parse().map_err(|e| format!("{mac:?}: {e}"))?;
    Ok((ip, mac))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        app: AppArgs,
    }

    #[test]
    fn defaults_can_be_replaced_per_program() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.app.ip, Ipv4Addr::new(10, 47, 1, 1));
        let command = AppArgs::with_defaults(Cli::command(), "02:47:5a:00:07:01", "10.47.7.1");
        let matches = command.try_get_matches_from(["x"]).unwrap();
        let cli = Cli::from_arg_matches(&matches).unwrap();
        assert_eq!(cli.app.ip, Ipv4Addr::new(10, 47, 7, 1));
        assert_eq!(cli.app.mac.to_string(), "02:47:5a:00:07:01");
        assert_eq!(cli.app.name_or("echo-server"), "echo-server");
    }

    #[test]
    fn polling_while_idle_is_a_flag() {
        let io = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            cli.app
                .runtime_config("x")
                .iokernel
                .unwrap()
                .poll_while_idle
        };
        assert_eq!(io(&["x"]), ginza_runtime::POLL_WHILE_IDLE);
        assert_eq!(
            io(&["x", "--poll-while-idle", "2s"]),
            ginza_runtime::POLL_WHILE_IDLE
        );
        assert_eq!(io(&["x", "--poll-while-idle", "0s"]), Duration::ZERO);
        assert_eq!(
            io(&["x", "--poll-while-idle", "50ms"]),
            Duration::from_millis(50)
        );
        assert!(Cli::try_parse_from(["x", "--poll-while-idle", "soon"]).is_err());
    }

    #[test]
    fn a_bad_static_arp_entry_says_why() {
        assert!(parse_arp("10.0.0.1")
            .unwrap_err()
            .contains("expected IP=MAC"));
        assert!(parse_arp("10.0.0.x=02:00:00:00:00:01")
            .unwrap_err()
            .contains("10.0.0.x"));
        let (ip, _) = parse_arp("10.0.0.1=02:00:00:00:00:01").unwrap();
        assert_eq!(ip, Ipv4Addr::new(10, 0, 0, 1));
        let err = Cli::try_parse_from(["x", "--kthreads", "many"]).unwrap_err();
        assert!(err.to_string().contains("many"), "{err}");
    }

    #[test]
    fn protected_is_configuration() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        let c = cli.app.runtime_config("a");
        assert!(c.protected.is_none());
        assert!(c.iokernel.unwrap().net.is_some());

        let cli = Cli::try_parse_from(["x", "--protected"]).unwrap();
        let c = cli.app.runtime_config("a");
        let p = c.protected.unwrap();
        assert_eq!(p.socket, default_netstack_socket());
        assert_eq!(p.interface.ip, Ipv4Addr::new(10, 47, 1, 1));
        assert_eq!(p.name, "a");
        // Cores from iokerneld, frames to the netstack: no `net`.
        assert!(c.iokernel.unwrap().net.is_none());

        let cli = Cli::try_parse_from(["x", "--protected=/tmp/ns.sock", "--standalone"]).unwrap();
        let c = cli.app.runtime_config("a");
        assert_eq!(c.protected.unwrap().socket, PathBuf::from("/tmp/ns.sock"));
        assert!(c.iokernel.is_none());
        assert!(Cli::try_parse_from(["x", "--standalone"]).is_err());
    }
}
