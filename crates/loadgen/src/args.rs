//! The command line of `ginza loadgen` and of the `loadgen` binary (the
//! same flags), and what they turn into: a [`RunConfig`] and a backend.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use ginza_proto::parse_duration;
use ginza_runtime::net::{Ipv4Addr, MacAddr};

use crate::protocol::{echo::Echo, http::Http, memcached, spin, Transport, Workload};
use crate::report::Report;
use crate::schedule::{parse_rate, parse_steps, Arrivals, Process, Step};
use crate::RunConfig;

/// Where the generator's sockets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Linux sockets (any host: the test namespace, another machine).
    Kernel,
    /// The Ginza runtime under iokerneld, through its software switch.
    Ginza,
}

/// The request protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProtocolName {
    /// RFC 862 echo; each request starts with its sequence number.
    Echo,
    /// spin-server's request header with the service time (`--service`).
    Spin,
    /// memcached text protocol, the `--mix` of get and set over `--keys`.
    Memcached,
    /// HTTP/1.1 `GET --path` with keep-alive.
    Http,
}

/// Open-loop load: requests at times planned in advance (Poisson, constant
/// or load steps), latency measured from each request's scheduled send
/// time, HDR percentiles per request class. The run is marked
/// `generator_saturated` when the generator could not keep its schedule.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadgenArgs {
    /// The server, HOST:PORT (required unless --calibrate).
    #[arg(long, short = 't')]
    pub target: Option<String>,
    /// The request protocol (what requests and answers look like).
    #[arg(long, value_enum, default_value = "echo")]
    pub protocol: ProtocolName,
    /// The transport: UDP datagrams or TCP connections.
    #[arg(long, value_enum, default_value = "udp")]
    pub transport: Transport,
    /// Linux sockets or the Ginza runtime.
    #[arg(long, value_enum, default_value = "kernel")]
    pub backend: Backend,
    /// Offered load, requests/s (e.g. 20000, 50k, 1M).
    #[arg(long, value_parser = parse_rate, default_value = "10k", conflicts_with = "steps")]
    pub rate: f64,
    /// How long to offer it (e.g. 5s, 500ms).
    #[arg(long, value_parser = parse_duration, default_value = "5s", conflicts_with = "steps")]
    pub duration: Duration,
    /// Load steps instead of --rate/--duration: RATE:DURATION,... (e.g.
    /// 10k:2s,50k:2s,100k:2s).
    #[arg(long, value_parser = parse_steps)]
    pub steps: Option<Vec<Step>>,
    /// How arrivals are spaced.
    #[arg(long, value_enum, default_value = "poisson")]
    pub arrivals: Process,
    /// The start of the schedule that is sent but not measured.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub warmup: Duration,
    /// Connections (TCP) or sockets (UDP); requests go round-robin over them.
    #[arg(long, short = 'c', default_value_t = 1)]
    pub connections: usize,
    /// Kernel backend: worker threads, each driving a share of the
    /// connections with epoll. Ginza backend: kthreads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// CPUs to pin the kernel backend's workers to, e.g. 0,1 (round-robin).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Bytes per request (echo, spin).
    #[arg(long, default_value_t = 32)]
    pub size: usize,
    /// spin: service time of each request: fixed:10us, exp:10us or
    /// bimodal:P:SHORT:LONG (e.g. bimodal:0.995:5us:500us; two classes).
    #[arg(long, value_parser = spin::ServiceTime::parse, default_value = "exp:10us")]
    pub service: spin::ServiceTime,
    /// memcached: the request mix (usr: 99.8 % get, 20-byte keys, 2-byte
    /// values; etc: 96.8 % get, larger keys and values).
    #[arg(long, value_enum, default_value = "usr")]
    pub mix: memcached::Mix,
    /// memcached: keys in the population (drawn uniformly).
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// memcached: do not set every key before the run (gets then miss).
    #[arg(long)]
    pub no_preload: bool,
    /// http: the path to GET.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// A request unanswered this long after its scheduled send times out.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub timeout: Duration,
    /// The p99 send lag (how late requests go out against the schedule)
    /// beyond which the run is reported as generator-saturated.
    #[arg(long, value_parser = parse_duration, default_value = "100us")]
    pub max_lag: Duration,
    /// Busy-poll (kernel backend) or yield (Ginza backend) instead of
    /// sleeping when the next send is this close.
    #[arg(long, value_parser = parse_duration, default_value = "50us")]
    pub spin: Duration,
    /// Seed of the arrival times and of the request mix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How long a TCP connection may take to open.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub connect_timeout: Duration,
    /// Print the report as one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Measure the generator's own capacity (requests/s per core) against
    /// a local UDP echo thread for --duration, and report it.
    #[arg(long)]
    pub calibrate: bool,
    /// Ginza backend: the generator's MAC on iokerneld's switch.
    #[arg(long, default_value = "02:47:5a:00:0f:01")]
    pub ginza_mac: MacAddr,
    /// Ginza backend: the generator's IPv4 address.
    #[arg(long, default_value = "10.47.15.1")]
    pub ginza_ip: Ipv4Addr,
    /// Ginza backend: iokerneld's control socket [default: its default path].
    #[arg(long)]
    pub ginza_socket: Option<PathBuf>,
    /// Ginza backend: the name at iokerneld.
    #[arg(long, default_value = "loadgen")]
    pub ginza_name: String,
}

impl LoadgenArgs {
    /// The target address.
    fn target(&self) -> anyhow::Result<SocketAddr> {
        let Some(t) = &self.target else {
            bail!("--target HOST:PORT is required");
        };
        t.to_socket_addrs()
            .with_context(|| format!("--target {t:?}: not HOST:PORT"))?
            .next()
            .with_context(|| format!("--target {t:?}: no address"))
    }

    /// The run the flags describe.
    pub fn run_config(&self) -> anyhow::Result<RunConfig> {
        let target = self.target()?;
        let workload = match self.protocol {
            ProtocolName::Echo => Workload::Echo(Echo { size: self.size }),
            ProtocolName::Spin => Workload::Spin(spin::Spin {
                service: self.service.clone(),
                size: self.size,
            }),
            ProtocolName::Memcached => Workload::Memcached(memcached::Memcached {
                mix: self.mix,
                keys: self.keys,
                preload: !self.no_preload,
            }),
            ProtocolName::Http => Workload::Http(
                Http::new(&self.path, &target.ip().to_string()).map_err(anyhow::Error::msg)?,
            ),
        };
        let arrivals = match &self.steps {
            Some(steps) => Arrivals {
                process: self.arrivals,
                steps: steps.clone(),
            },
            None => {
                if self.duration.is_zero() {
                    bail!("--duration must be positive");
                }
                Arrivals::steady(self.arrivals, self.rate, self.duration)
            }
        };
        let cfg = RunConfig {
            target,
            transport: self.transport,
            workload,
            arrivals,
            warmup: self.warmup,
            connections: self.connections,
            threads: self.threads,
            timeout: self.timeout,
            max_lag: self.max_lag,
            spin: self.spin,
            seed: self.seed,
            cpus: self.cpus.clone(),
            connect_timeout: self.connect_timeout,
        };
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(cfg)
    }

    /// The Ginza backend's settings.
    pub fn ginza(&self) -> crate::ginza::GinzaConfig {
        crate::ginza::GinzaConfig {
            mac: self.ginza_mac,
            ip: self.ginza_ip,
            socket: self.ginza_socket.clone(),
            name: self.ginza_name.clone(),
        }
    }
}

/// Runs what the flags ask and gives the report.
pub fn execute(args: &LoadgenArgs) -> anyhow::Result<Report> {
    if args.calibrate {
        return crate::calibrate::calibrate(args.duration, args.cpus.clone());
    }
    let cfg = args.run_config()?;
    match args.backend {
        Backend::Kernel => crate::kernel::run(&cfg),
        Backend::Ginza => crate::ginza::run(&cfg, &args.ginza()),
    }
}

/// Runs and prints the report (JSON with `--json`).
pub fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    let report = execute(&args)?;
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.summary());
    }
    Ok(())
}
