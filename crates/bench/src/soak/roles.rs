//! The soak's child processes: each role (a kv-server, the netstack daemon,
//! the batch application) runs in a process of its own, so that it can be
//! SIGKILLed and its memory and descriptors read from /proc. A child is the
//! soak's own executable started again with the role's arguments after a
//! [`Launcher`]'s prefix: `ginza bench soak-role …` from the `ginza`
//! command, the test binary's `soak-role …` from the soak's test.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use ginza_apps::app_args::AppArgs;
use ginza_apps::echo_server::Protocols;
use ginza_apps::kv::server::serve;
use ginza_apps::kv::store::{Store, StoreConfig, SystemClock};
use ginza_apps::kv::Kv;
use ginza_runtime::{Class, Config, IokernelConfig};
use ginza_sys::task_group::{start_own_session, IdleGroup};

use crate::harness::linux_batch::BATCH_CGROUP;

/// How the soak starts a child: this program with these first arguments.
#[derive(Clone, Debug)]
pub struct Launcher {
    pub program: PathBuf,
    pub prefix: Vec<OsString>,
}

impl Launcher {
    /// The running `ginza`: `ginza bench soak-role ROLE …`.
    pub fn ginza() -> anyhow::Result<Launcher> {
        Ok(Launcher {
            program: std::env::current_exe().context("finding the ginza executable")?,
            prefix: vec!["bench".into(), "soak-role".into()],
        })
    }

    /// The running executable with `soak-role ROLE …` (a test binary whose
    /// `main` hands those arguments to [`role_main`]).
    pub fn current_exe() -> anyhow::Result<Launcher> {
        Ok(Launcher {
            program: std::env::current_exe().context("finding the running executable")?,
            prefix: vec!["soak-role".into()],
        })
    }

    /// A child in a session of its own: one session's task group busy on
    /// iokerneld's core and parking and running on the managed one starved
    /// the kernel's threads there (`ginza_sys::task_group`).
    pub(crate) fn command(&self, role_args: &[String]) -> Command {
        let mut c = Command::new(&self.program);
        start_own_session(&mut c).args(&self.prefix).args(role_args);
        c
    }
}

/// A child's role and its flags (`ginza bench soak-role --help`).
#[derive(clap::Args, Debug)]
pub struct RoleArgs {
    #[command(subcommand)]
    role: Role,
}

#[derive(Parser, Debug)]
#[command(name = "soak-role")]
struct RoleCli {
    #[command(subcommand)]
    role: Role,
}

#[derive(clap::Subcommand, Debug)]
enum Role {
    /// A kv-server (TCP only), in-process stack or `--protected`.
    Kv(KvRole),
    /// The netstack daemon (the flags of `ginza netstack`).
    Netstack(ginza_netstack::cli::NetstackArgs),
    /// The batch application, pricing until killed.
    Batch(BatchRole),
    /// One window of loadgen's load on a kv-server; prints its summary as
    /// JSON. A process of its own, so that the generator's allocations,
    /// made anew each window, never stay in the soak's own memory.
    Load(LoadRole),
}

#[derive(clap::Args, Debug)]
struct KvRole {
    #[arg(long, default_value_t = 11211)]
    port: u16,
    /// Item memory, MiB.
    #[arg(long, default_value_t = 64)]
    memory_limit: usize,
    #[command(flatten)]
    app: AppArgs,
}

#[derive(clap::Args, Debug)]
struct LoadRole {
    #[arg(long)]
    target: std::net::SocketAddr,
    /// Requests/s.
    #[arg(long)]
    rate: f64,
    #[arg(long, value_parser = ginza_proto::parse_duration)]
    duration: std::time::Duration,
    #[arg(long)]
    seed: u64,
}

#[derive(clap::Args, Debug)]
struct BatchRole {
    /// iokerneld's control socket.
    #[arg(long)]
    socket: PathBuf,
    #[arg(long, default_value = "batch")]
    name: String,
    #[arg(long, default_value_t = 1)]
    kthreads: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs the role named by `args` (what follows `soak-role`) until it ends
/// or is killed.
pub fn role_main(args: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
    let argv = std::iter::once("soak-role".to_string()).chain(args);
    let cli = RoleCli::try_parse_from(argv).unwrap_or_else(|e| e.exit());
    run_role(RoleArgs { role: cli.role })
}

/// Runs a role parsed as a subcommand of `ginza bench`.
pub fn run_role(args: RoleArgs) -> anyhow::Result<()> {
    // The ginza command set its logger up already; a test binary has none.
    let _ = ginza_runtime::init_logging("warn");
    match args.role {
        Role::Kv(kv) => run_kv(kv),
        Role::Netstack(ns) => ginza_netstack::cli::run(ns),
        Role::Batch(b) => run_batch(b),
        Role::Load(l) => run_load(l),
    }
}

fn run_load(args: LoadRole) -> anyhow::Result<()> {
    let cfg = super::load_config(args.target, args.rate, args.duration, args.seed);
    let summary = match ginza_loadgen::kernel::run(&cfg) {
        Ok(report) => super::load_summary(&report),
        Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
    };
    println!("{summary}");
    Ok(())
}

fn run_kv(args: KvRole) -> anyhow::Result<()> {
    let stop = args.app.stop_flag()?;
    let name = args.app.name_or("kv-server");
    let config = args.app.runtime_config(&name);
    let store = Store::new(
        StoreConfig::new(args.memory_limit << 20, 1 << 20),
        Arc::new(SystemClock),
    );
    let mut kv = Kv::new(store);
    kv.threads = args.app.kthreads;
    let port = args.port;
    let protocols = Protocols {
        udp: false,
        tcp: true,
    };
    ginza_runtime::run(config, move || serve(port, protocols, kv, stop))
        .with_context(|| format!("{name}: starting the runtime"))?
        .with_context(|| format!("{name}: serving on port {port}"))
}

fn run_batch(args: BatchRole) -> anyhow::Result<()> {
    // Idle against every other task group where the kernel allows, as
    // the memcached bench's batch (`linux_batch::BATCH_CGROUP`): in a
    // session of its own its SCHED_IDLE would not put it behind the
    // latency-critical applications' groups.
    if let Err(e) = IdleGroup::open(BATCH_CGROUP).and_then(|g| g.add_process(std::process::id())) {
        log::warn!(
            "{}: staying in its own session's task group ({e})",
            args.name
        );
    }
    let mut io = IokernelConfig::new(args.name.clone(), Class::Batch);
    io.socket = Some(args.socket);
    let config = Config {
        iokernel: Some(io),
        ..Config::with_kthreads(args.kthreads)
    };
    let (paths, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let n = args.kthreads;
    ginza_runtime::run(config, move || {
        ginza_apps::batch::price_until_stopped(n, paths, stop, args.seed)
    })
    .with_context(|| format!("{}: starting the runtime", args.name))?;
    anyhow::bail!("{}: the pricing loop returned unasked", args.name)
}
