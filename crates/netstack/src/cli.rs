//! The body of `netstackd`, shared by the `netstackd` binary and
//! `ginza netstack` (same flags, [`NetstackArgs`]).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use ginza_net::{Interface, Ipv4Addr, MacAddr};

use crate::daemon::{Daemon, DaemonConfig};

/// Run the protected-mode netstack (DLibOS) under iokerneld.
#[derive(clap::Args, Debug, Clone)]
pub struct NetstackArgs {
    /// The netstack's IPv4 address (protected applications share it).
    #[arg(long)]
    pub ip: Ipv4Addr,
    /// The netstack's MAC address.
    #[arg(long)]
    pub mac: MacAddr,
    /// Network kthreads: the most cores the netstack may hold.
    #[arg(long, default_value_t = 2)]
    pub kthreads: u32,
    /// Cores never taken away from the netstack.
    #[arg(long, default_value_t = 0)]
    pub guaranteed: u32,
    /// iokerneld's socket (default: ginza's usual path).
    #[arg(long)]
    pub iokernel_socket: Option<PathBuf>,
    /// The attach socket protected applications connect to (default:
    /// netstack.sock next to iokerneld's socket).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Name in iokerneld and `ginza top`.
    #[arg(long, default_value = "netstack")]
    pub name: String,
    /// Receive-pool chunks (2 KiB) per protected application.
    #[arg(long, default_value_t = 4096)]
    pub rx_chunks: u32,
    /// Idle time before a network kthread parks while an application owes
    /// an answer (docs/protected.md, "Where the one-way time goes").
    #[arg(long, default_value = "500us", value_parser = ginza_proto::parse_duration)]
    pub reply_spin: Duration,
    /// Stop after this long (default: until iokerneld goes away).
    #[arg(long, value_parser = ginza_proto::parse_duration)]
    pub run_for: Option<Duration>,
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR/metrics, e.g.
    /// 127.0.0.1:9465 (docs/metrics.md).
    #[arg(long, value_name = "ADDR", value_parser = ginza_metrics::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,
}

/// Runs the netstack until iokerneld goes away (or `--run-for`), then
/// prints its counters as one JSON object.
pub fn run(args: NetstackArgs) -> anyhow::Result<()> {
    // Other processes of the same user must not read the applications' receive
    // pools through /proc/<pid>/fd (docs/protected.md, "Memory partitioning").
    ginza_sys::process::set_non_dumpable()
        .map_err(|e| anyhow::anyhow!("netstack: cannot make the process non-dumpable: {e}"))?;
    let mut cfg = DaemonConfig::new(Interface {
        mac: args.mac,
        ip: args.ip,
    });
    if let Some(s) = args.iokernel_socket {
        cfg.attach_socket = s.with_file_name("netstack.sock");
        cfg.iokernel_socket = s;
    }
    if let Some(s) = args.socket {
        cfg.attach_socket = s;
    }
    cfg.kthreads = args.kthreads;
    cfg.guaranteed = args.guaranteed;
    cfg.name = args.name;
    cfg.netstack.rx_chunks = args.rx_chunks;
    cfg.reply_spin = args.reply_spin;
    cfg.metrics = args.metrics;
    let d = Daemon::start(cfg).context("starting the netstack")?;
    let stop = AtomicBool::new(false);
    match args.run_for {
        Some(t) => {
            let t0 = std::time::Instant::now();
            while t0.elapsed() < t && !d.iokerneld_gone() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        None => d.wait(&stop),
    }
    let st = d.stats();
    println!(
        "{}",
        serde_json::json!({
            "apps": st.apps, "connections": st.connections,
            "frames_in": st.frames_in, "frames_out": st.frames_out,
            "commands": st.commands, "events": st.events, "refused": st.refused,
            "apps_disconnected": st.apps_disconnected,
            "event_ring_full": st.event_ring_full,
            "tx_bytes_copied": st.tx_bytes_copied,
            "tx_bytes_zero_touch": st.tx_bytes_zero_touch,
            "tx_frames_unnamed": st.tx_frames_unnamed,
            "rx_bytes_delivered": st.rx_bytes_delivered,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        args: super::NetstackArgs,
    }

    #[test]
    fn the_metrics_address_is_parsed_and_a_bad_one_named() {
        let parse = |m: &str| {
            Flags::try_parse_from([
                "netstackd",
                "--ip",
                "10.0.0.1",
                "--mac",
                "02:00:00:00:00:01",
                "--metrics",
                m,
            ])
        };
        let ok = parse("127.0.0.1:9465").unwrap();
        assert_eq!(ok.args.metrics, Some("127.0.0.1:9465".parse().unwrap()));
        let e = parse("nonsense").err().unwrap().to_string();
        assert!(
            e.contains("--metrics") && e.contains("\"nonsense\" is not an address to listen on"),
            "{e}"
        );
    }
}
