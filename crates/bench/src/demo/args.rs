//! `ginza demo`'s command line: its arguments and their parsers, and the
//! allocation policies and service-time distributions they name.

use std::path::PathBuf;
use std::time::Duration;

use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::PolicyKind;
use ginza_proto::parse_duration;
use ginza_sys::cpulist;

/// Arguments of `ginza demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Managed cores, e.g. `1-3` [default: every CPU this process may use
    /// but iokerneld's].
    #[arg(long, value_parser = parse_core_list)]
    pub(super) cores: Option<CoreList>,
    /// iokerneld's own CPU [default: the first allowed CPU that is not
    /// managed].
    #[arg(long)]
    pub(super) iokernel_core: Option<usize>,
    /// Offered loads, as fractions of the managed cores' capacity.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.1, 0.3, 0.5, 0.7, 0.9],
          value_parser = parse_load)]
    pub(super) points: Vec<f64>,
    /// Measured time per point (e.g. 1s, 500ms).
    #[arg(long, default_value = "300ms", value_parser = parse_window)]
    pub(super) duration: Duration,
    /// Warm-up per point, before the measured time.
    #[arg(long, default_value = "100ms", value_parser = parse_warmup)]
    pub(super) warmup: Duration,
    /// Service-time distributions of the requests (mean 10 µs each):
    /// exponential, constant, bimodal (90 % 5 µs, 10 % 55 µs).
    #[arg(long, value_delimiter = ',', default_values_t = vec![Service::Exponential, Service::Constant, Service::Bimodal],
          value_parser = parse_service)]
    pub(super) services: Vec<Service>,
    /// Directory for demo.csv and demo.png.
    #[arg(long, default_value = "results/demo")]
    pub(super) out: PathBuf,
    /// Core allocators to compare, in this order: shenango, slow, static.
    #[arg(long, value_delimiter = ',', default_values_t = vec![Policy::Shenango, Policy::Slow, Policy::Static],
          value_parser = parse_policy)]
    pub(super) policies: Vec<Policy>,
    /// Seed of the arrivals, service times and iokerneld's victim choice.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Also print the rows as one JSON object on stdout (the table then
    /// goes to stderr).
    #[arg(long)]
    pub(super) json: bool,
    /// The park/wake mechanisms before `SCHED_IDLE` batch kthreads: batch
    /// at Linux's default class, no lingering, every hand-over waits for
    /// the preempted kthread, no local wakes (to compare with the default
    /// in one binary).
    #[arg(long)]
    pub(super) classic: bool,
    /// `lc`'s spin for work before it parks [default: the runtime's
    /// `spin_before_park`].
    #[arg(long, value_parser = parse_tuning)]
    pub(super) lc_spin: Option<Duration>,
    /// How long `lc` polls for a grant after parking [default: the
    /// runtime's, zero for a latency-critical application].
    #[arg(long, value_parser = parse_tuning)]
    pub(super) lc_linger: Option<Duration>,
    /// How long `batch` polls for a grant after giving its core back
    /// [default: the runtime's `BATCH_LINGER`; zero with --classic].
    #[arg(long, value_parser = parse_tuning)]
    pub(super) batch_linger: Option<Duration>,
    /// How long iokerneld waits before signalling a SCHED_IDLE batch
    /// kthread whose core went to lc; if lc gives the core back first,
    /// the preemption is withdrawn [default: iokerneld's; 0: signal at once,
    /// the mechanism before].
    #[arg(long, value_parser = parse_tuning)]
    pub(super) idle_victim_grace: Option<Duration>,
    /// Local wakes: batch's kthread on the core wakes lc there (a wake on
    /// the same CPU, no inter-processor interrupt), taking iokerneld's
    /// doorbell at its preemption points; iokerneld wakes lc itself if the
    /// doorbell is still there after this wait [default: 5us; 0: off, as
    /// with --classic] (docs/runtime.md, "Local wakes").
    #[arg(long, value_parser = parse_tuning)]
    pub(super) local_wake: Option<Duration>,
}

fn parse_tuning(s: &str) -> Result<Duration, String> {
    parse_bounded(s, Duration::ZERO, Duration::from_millis(10))
}

/// A `--cores` value (a newtype: clap takes a bare `Vec` for a repeated flag).
#[derive(Clone, Debug)]
pub(super) struct CoreList(pub(super) Vec<usize>);

fn parse_core_list(s: &str) -> Result<CoreList, String> {
    let v = cpulist::parse(s).map_err(|e| e.to_string())?;
    if v.is_empty() {
        return Err("no cores listed".into());
    }
    Ok(CoreList(v))
}

fn parse_load(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    // Past 2× capacity the point only measures how fast the backlog grows.
    if !(v > 0.0 && v <= 2.0) {
        return Err(format!("offered load {v} is out of range (0, 2]"));
    }
    Ok(v)
}

fn parse_bounded(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(min..=max).contains(&d) {
        return Err(format!("{s:?} is out of range {min:?}..={max:?}"));
    }
    Ok(d)
}

fn parse_window(s: &str) -> Result<Duration, String> {
    // Under 50 ms a 1 ms allocator gets a few dozen periods: no measurement.
    parse_bounded(s, Duration::from_millis(50), Duration::from_secs(600))
}

fn parse_warmup(s: &str) -> Result<Duration, String> {
    parse_bounded(s, Duration::ZERO, Duration::from_secs(60))
}

/// A core allocator under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    Shenango,
    Slow,
    Static,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    match s.trim() {
        "shenango" => Ok(Policy::Shenango),
        "slow" => Ok(Policy::Slow),
        "static" => Ok(Policy::Static),
        other => Err(format!("unknown policy {other:?} (shenango, slow, static)")),
    }
}

/// A service-time distribution of the latency-critical requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Service {
    Exponential,
    Constant,
    Bimodal,
}

/// Mean service time of every distribution.
pub(super) const MEAN_SERVICE: Duration = Duration::from_micros(10);

impl Service {
    pub(super) fn name(self) -> &'static str {
        match self {
            Service::Exponential => "exponential",
            Service::Constant => "constant",
            Service::Bimodal => "bimodal",
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Service::Exponential => "exponential service times, mean 10 µs",
            Service::Constant => "constant service times, 10 µs",
            Service::Bimodal => "bimodal service times: 90 % 5 µs, 10 % 55 µs (mean 10 µs)",
        }
    }

    pub(crate) fn distribution(self) -> ServiceTime {
        match self {
            Service::Exponential => ServiceTime::Exponential {
                mean_ns: MEAN_SERVICE.as_nanos() as f64,
            },
            Service::Constant => ServiceTime::Constant {
                ns: MEAN_SERVICE.as_nanos() as u64,
            },
            Service::Bimodal => ServiceTime::Bimodal {
                p: 0.9,
                a_ns: 5_000,
                b_ns: 55_000,
            },
        }
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A service-time distribution with its name (the CSV's `service`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workload {
    pub(crate) name: &'static str,
    pub(crate) dist: ServiceTime,
}

impl From<Service> for Workload {
    fn from(s: Service) -> Workload {
        Workload {
            name: s.name(),
            dist: s.distribution(),
        }
    }
}

fn parse_service(s: &str) -> Result<Service, String> {
    match s.trim() {
        "exponential" | "exp" => Ok(Service::Exponential),
        "constant" => Ok(Service::Constant),
        "bimodal" => Ok(Service::Bimodal),
        other => Err(format!(
            "unknown service distribution {other:?}: expected exponential, constant or bimodal"
        )),
    }
}

/// Shenango's allocation interval.
pub(super) const INTERVAL: Duration = Duration::from_micros(5);

/// Period of the `slow` allocator.
const SLOW_PERIOD: Duration = Duration::from_millis(1);

impl Policy {
    pub(super) fn name(self) -> &'static str {
        match self {
            Policy::Shenango => "shenango",
            Policy::Slow => "slow",
            Policy::Static => "static",
        }
    }

    pub(super) fn kind(self) -> PolicyKind {
        match self {
            Policy::Shenango => PolicyKind::Shenango,
            Policy::Slow => PolicyKind::Slow {
                period: SLOW_PERIOD,
            },
            Policy::Static => PolicyKind::Static,
        }
    }

    pub(super) fn describe(self, n: usize) -> String {
        match self {
            Policy::Shenango => {
                "Shenango allocator: congestion detection every 5 µs, cores move on demand".into()
            }
            Policy::Slow => "slow allocator: cores from utilization every 1 ms; in between \
                 each application keeps and spins on the cores it holds (Arachne-like)"
                .into(),
            Policy::Static => format!(
                "static: lc is provisioned all {n} managed core(s) and spins on them (ZygOS-like); \
                 batch gets none"
            ),
        }
    }

    /// Under `static` and `slow` an application keeps the cores it holds
    /// while idle (spinning): only the allocator takes them back. Under
    /// `shenango` an idle kthread gives its core back within microseconds.
    pub(super) fn keeps_cores(self) -> bool {
        self != Policy::Shenango
    }

    /// `static` provisions the latency-critical application for its peak:
    /// every managed core guaranteed, kept while idle.
    pub(super) fn lc_guaranteed(self, n: usize) -> u32 {
        match self {
            Policy::Static => u32::try_from(n).unwrap_or(u32::MAX),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_parsers_refuse_nonsense() {
        assert_eq!(parse_load("0.5"), Ok(0.5));
        assert!(parse_load("0").is_err());
        assert!(parse_load("nan").is_err());
        assert!(parse_load("3").is_err());
        assert_eq!(parse_policy("slow"), Ok(Policy::Slow));
        assert_eq!(parse_service("bimodal"), Ok(Service::Bimodal));
        assert!(parse_service("uniform")
            .unwrap_err()
            .contains("expected exponential"));
        assert_eq!(Service::Bimodal.distribution().mean_ns(), 10_000.0);
        assert!(parse_policy("fast").is_err());
        assert!(parse_window("10ms").is_err());
        assert_eq!(parse_window("200ms"), Ok(Duration::from_millis(200)));
        assert!(parse_core_list("").is_err());
        assert!(parse_core_list("1-").is_err());
    }
}
