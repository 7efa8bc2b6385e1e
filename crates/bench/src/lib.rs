//! Ginza's benchmarks, the demo's runner and the experiment engine: what
//! `ginza bench <experiment>` and `ginza demo` run. Benchmarks print Ginza's
//! figures next to its peers', measured in the same run on the same cores.
//!
//! Each experiment is one subcommand with its own arguments; add new ones
//! (`corealloc`, `forward`, `preempt`, ...) as variants of [`Experiment`].
//! A benchmark uses only the shared harness ([`harness`]), never another
//! benchmark's internals; the experiment engine runs them through their
//! public entry points.

mod batch_work;
mod colocate;
mod corealloc;
pub mod demo;
pub(crate) mod experiment;
mod forward;
pub mod fuzz;
mod harness;
mod hop_spans;
mod idle;
mod memcached;
mod oneway;
mod preempt;
mod rtt_spans;
mod shinjuku;
pub mod soak;
mod steering;
mod tcp;
mod threadops;

/// Run a benchmark and print its figures next to its peers'.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    experiment: Experiment,
}

/// The experiments `ginza bench` can run.
#[derive(clap::Subcommand, Debug)]
enum Experiment {
    /// Thread operations (spawn+join, yield and condvar ping-pong, uncontended
    /// mutex) for Ginza uthreads, pthreads, Tokio tasks and Go goroutines.
    Threadops(threadops::ThreadopsArgs),
    /// Batch's work per CPU-second on a Ginza uthread (preemption points, a
    /// yield every chunk) next to a pthread on the same CPU, the same
    /// pricing function on both, rounds interleaved.
    Batch(batch_work::BatchWorkArgs),
    /// Shinjuku mode: the cost of one preemption (cooperative flag, signal),
    /// the worker's throughput loss at 5/10/15 us quanta, and the
    /// dispatcher's request rate.
    Preempt(preempt::PreemptArgs),
    /// Shinjuku mode: p99 latency and achieved throughput against offered
    /// load for two bimodal workloads under c-FCFS, c-PRE-SQ and c-PRE-MQ,
    /// with the simulator's prediction beside them; CSV and PNG.
    Shinjuku(shinjuku::ShinjukuArgs),
    /// iokerneld: decision → running kthread for grants (blocked and still
    /// spinning kthreads), iokerneld's time per grant, preemption hand-over,
    /// sustained reallocations per second, next to the eventfd wake floor.
    Corealloc(corealloc::CoreallocArgs),
    /// iokerneld's dataplane: packets/s moved between two applications
    /// through the software switch, and the UDP round trip to a Ginza echo
    /// application next to a Linux one over the same veth.
    Forward(forward::ForwardArgs),
    /// TCP: 64-byte round trips from a Linux client over veth to Ginza's
    /// echo-server and to Linux echo servers (blocking, busy-polling), a
    /// one-way stream to each, Ginza ⇄ Ginza through the software switch,
    /// and a transfer through 5 % loss.
    Tcp(tcp::TcpArgs),
    /// Packet steering: rss-mod, flow-affinity and indirection in one run,
    /// rounds interleaved, while an application's cores come and go: replies
    /// out of order within a flow, flows moved per change of the active
    /// set, p50/p99, iokerneld's ns per decision, table memory; CSV and PNG.
    Steering(steering::SteeringArgs),
    /// Shenango's Fig. 3: memcached USR load from the namespace over veth
    /// to kv-server + batch under iokerneld and to Debian's memcached +
    /// SCHED_IDLE batch on the same CPU: latency, achieved rate and batch
    /// throughput against offered load, systems interleaved; CSV and PNG.
    Memcached(memcached::MemcachedArgs),
    /// Shinjuku and Shenango in one system: a Shinjuku-mode spin server
    /// (dispatch on iokerneld's core) beside batch, c-FCFS and c-PRE-SQ
    /// under the 5 us allocator and c-PRE-SQ on static cores, sweeping
    /// load; p50/p99, batch throughput, the server's cores, the simulator's
    /// p99; CSV and PNG.
    Colocate(colocate::ColocateArgs),
    /// DLibOS's Figs. 5-7: one-way latency of 64-byte messages (half the
    /// NetPIPE-style round trip) to echo-server run to completion, to the
    /// same echo-server protected (netstackd under the same iokerneld), and
    /// between Linux sockets over loopback, rounds interleaved.
    Oneway(oneway::OnewayArgs),
    /// iokerneld while nothing happens: its loop's CPU with an application
    /// registered and no traffic, and the UDP round trip of the first
    /// request after a quiet second over veth: sleeping while idle with the
    /// server polling while idle (the default), the same with the server
    /// parking, and `--spin`; on the direct path, the server parking,
    /// polling or blocked on its own socket; Linux's blocking echo; rounds
    /// interleaved.
    Idle(idle::IdleArgs),
    /// A soak under faults (docs/soak.md): kv-servers under iokerneld
    /// (in-process, protected, one killed and restarted) beside batch,
    /// loadgen's load and a client that checks every answer against its
    /// model, while frames are dropped, duplicated, reordered and corrupted
    /// and processes are SIGKILLed; JSON with lost writes, wrong answers,
    /// crashes, memory and descriptor growth, latency per minute.
    Soak(soak::SoakArgs),
    /// A child process of `soak` (not for direct use).
    #[command(hide = true)]
    SoakRole(soak::RoleArgs),
    /// The batch child of `memcached` (not for direct use).
    #[command(hide = true)]
    BatchRole(memcached::BatchRoleArgs),
    /// Run experiment files (`bench/experiments/*.toml`, docs/experiments.md):
    /// a sweep with a progress bar, CSV, JSON and PNG under results/<name>/.
    Run(experiment::RunArgs),
    /// List the experiment files: name, status, estimated time, paper figure.
    List(experiment::ListArgs),
    /// Run every experiment marked `in_all` that can run on this machine.
    All(experiment::AllArgs),
}

impl BenchArgs {
    /// Whether this command runs experiment files: iokerneld's per-event
    /// warnings (late preemptions on a busy machine) then go to the JSON's
    /// notes, not one line each under the progress bar.
    pub fn runs_experiments(&self) -> bool {
        matches!(self.experiment, Experiment::Run(_) | Experiment::All(_))
    }
}

/// Runs the experiment named on the command line.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.experiment {
        Experiment::Threadops(args) => threadops::run(args),
        Experiment::Batch(args) => batch_work::run(args),
        Experiment::Preempt(args) => preempt::run(args),
        Experiment::Shinjuku(args) => shinjuku::run(args),
        Experiment::Corealloc(args) => corealloc::run(args),
        Experiment::Forward(args) => forward::run(args),
        Experiment::Tcp(args) => tcp::run(args),
        Experiment::Steering(args) => steering::run(args),
        Experiment::Memcached(args) => memcached::run(args),
        Experiment::Run(args) => experiment::run(args),
        Experiment::List(args) => experiment::list(args),
        Experiment::All(args) => experiment::all(args),
        Experiment::Colocate(args) => colocate::run(args),
        Experiment::Oneway(args) => oneway::run(args),
        Experiment::Idle(args) => idle::run(args),
        Experiment::Soak(args) => soak::run(args),
        Experiment::SoakRole(args) => soak::run_role(args),
        Experiment::BatchRole(args) => memcached::batch_role_main(args),
    }
}
