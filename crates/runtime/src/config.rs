//! Runtime configuration (the runtime's, iokerneld registration's, the
//! network's), its validation, and the CPU topology it is checked against.
//! A leaf: it imports nothing of the crate but the error types.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use ginza_net::tcp::{ListenConfig, TcpConfig};
use ginza_net::{ArpConfig, Interface, Ipv4Addr, MacAddr, StaticArpEntry};
pub use ginza_proto::messages::Class;
use ginza_sys::{affinity, cpulist, topology};

use crate::error::ConfigError;

/// How an application's runtime is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of kthreads (one pthread each).
    pub kthreads: usize,
    /// CPUs the kthreads are pinned to, kthread `i` on `cores[i % len]`;
    /// `None` means every CPU this process may run on.
    pub cores: Option<Vec<usize>>,
    /// Usable bytes of each uthread stack (a guard page is added below).
    pub stack_size: usize,
    /// How long an idle kthread keeps looking for work before it parks.
    pub spin_before_park: Duration,
    /// Register with iokerneld, which then decides which kthreads hold a
    /// core (`cores` is ignored: iokerneld pins granted kthreads).
    /// `None`: standalone.
    pub iokernel: Option<IokernelConfig>,
    /// Protected mode (DLibOS): `TcpListener`/`TcpStream` go through the
    /// netstack process at this socket rather than an in-process stack
    /// (leave `IokernelConfig::net` unset then). `None`: in-process.
    pub protected: Option<ProtectedConfig>,
    /// Preempt a uthread that has run this long while others wait
    /// (`slicer.rs`). `None`: run to completion, as Shenango.
    pub time_slice: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kthreads: 1,
            cores: None,
            stack_size: 256 * 1024,
            spin_before_park: Duration::from_micros(2),
            iokernel: None,
            protected: None,
            time_slice: None,
        }
    }
}

impl Config {
    /// The default configuration with `n` kthreads.
    pub fn with_kthreads(n: usize) -> Self {
        Config {
            kthreads: n,
            ..Config::default()
        }
    }
}

pub(crate) const MAX_KTHREADS: usize = 1024;
pub(crate) const MIN_STACK: usize = 16 * 1024;
pub(crate) const MAX_STACK: usize = 1 << 30;
pub(crate) const MAX_SPIN: Duration = Duration::from_secs(1);

/// A configuration checked against this machine.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Core of each kthread.
    pub(crate) cores: Vec<usize>,
    /// For each kthread, the kthreads on hyperthread siblings of its core.
    pub(crate) siblings: Vec<Vec<usize>>,
    pub(crate) stack_size: usize,
    pub(crate) spin_before_park: Duration,
    /// More kthreads than distinct cores: Linux will multiplex them.
    pub(crate) oversubscribed: bool,
}

impl Config {
    pub(crate) fn plan(&self) -> Result<Plan, ConfigError> {
        let allowed = allowed_cpus()?;
        self.plan_for(&allowed, &|cpu| read_siblings(cpu))
    }

    /// Validation against a given CPU set, so tests can describe any machine.
    pub(crate) fn plan_for(
        &self,
        allowed: &BTreeSet<usize>,
        siblings_of: &dyn Fn(usize) -> Vec<usize>,
    ) -> Result<Plan, ConfigError> {
        if self.kthreads == 0 {
            return Err(ConfigError::NoKthreads);
        }
        if self.kthreads > MAX_KTHREADS {
            return Err(ConfigError::TooManyKthreads {
                requested: self.kthreads,
                max: MAX_KTHREADS,
            });
        }
        if !(MIN_STACK..=MAX_STACK).contains(&self.stack_size) {
            return Err(ConfigError::StackSize {
                requested: self.stack_size,
                min: MIN_STACK,
                max: MAX_STACK,
            });
        }
        if self.spin_before_park > MAX_SPIN {
            return Err(ConfigError::SpinTooLong(self.spin_before_park));
        }
        let pool: Vec<usize> = match &self.cores {
            None => allowed.iter().copied().collect(),
            Some(list) if list.is_empty() => return Err(ConfigError::EmptyCoreList),
            Some(list) => {
                let mut seen = BTreeSet::new();
                for &core in list {
                    if !allowed.contains(&core) {
                        return Err(ConfigError::UnknownCore {
                            core,
                            allowed: cpulist::format(&allowed.iter().copied().collect::<Vec<_>>()),
                        });
                    }
                    if !seen.insert(core) {
                        return Err(ConfigError::DuplicateCore(core));
                    }
                }
                list.clone()
            }
        };
        if pool.is_empty() {
            return Err(ConfigError::NoAllowedCpus);
        }
        let cores: Vec<usize> = (0..self.kthreads).map(|i| pool[i % pool.len()]).collect();
        let siblings = cores
            .iter()
            .enumerate()
            .map(|(me, &core)| {
                let sib = siblings_of(core);
                (0..cores.len())
                    .filter(|&k| k != me && cores[k] != core && sib.contains(&cores[k]))
                    .collect()
            })
            .collect();
        Ok(Plan {
            cores,
            siblings,
            stack_size: self.stack_size,
            spin_before_park: self.spin_before_park,
            oversubscribed: self.kthreads > pool.len(),
        })
    }
}

/// CPUs this process may run on (its affinity mask).
pub(crate) fn allowed_cpus() -> Result<BTreeSet<usize>, ConfigError> {
    let cpus = affinity::allowed_cpus().map_err(|e| ConfigError::Affinity(e.to_string()))?;
    Ok(cpus.into_iter().collect())
}

/// Hyperthread siblings of `cpu` (including itself) from sysfs; empty if unknown.
fn read_siblings(cpu: usize) -> Vec<usize> {
    topology::thread_siblings(cpu).unwrap_or_default()
}

/// How long a batch kthread polls for its next grant after it gave its core
/// back (`IokernelConfig::linger_after_park` of `Class::Batch`). Under
/// `SCHED_IDLE` the polling costs a latency-critical kthread on the core
/// nothing, and it keeps the vCPU out of halt (a wake from halt costs
/// about 28 µs on the development VM, docs/design.md "Numbers to beat"):
/// long enough to outlast a latency-critical burst of a few requests,
/// after which iokerneld gives the core back (docs/runtime.md, "Batch
/// kthreads run SCHED_IDLE").
pub const BATCH_LINGER: Duration = Duration::from_micros(200);

/// How long a latency-critical application's idle kthread keeps polling
/// with no arrival before it parks (`IokernelConfig::poll_while_idle`):
/// twice the quiet second after which docs/idle-poll.md asks the first
/// request to be answered within 100 µs. A host with no traffic gets the
/// core back to halt after this; a server that hears from a client (or a
/// health check) more often never parks.
pub const POLL_WHILE_IDLE: Duration = Duration::from_secs(2);

/// How an application registers with iokerneld.
#[derive(Clone, Debug)]
pub struct IokernelConfig {
    /// iokerneld's control socket; `None`: `ginza_proto::default_socket_path` (the
    /// per-user socket if it exists, else the service's).
    pub socket: Option<PathBuf>,
    /// Unique among registered applications: 1..64 of `[A-Za-z0-9-_.:]`.
    pub name: String,
    pub class: Class,
    /// Cores iokerneld never takes away while the application wants them.
    pub guaranteed: u32,
    /// Most cores at once; `None`: one per kthread.
    pub max_cores: Option<u32>,
    /// After telling iokerneld it parks, a kthread keeps polling its
    /// eventfd this long before it blocks: a grant that comes within the
    /// window costs no wake-up from halt. The core is iokerneld's during
    /// the window (another application may be granted it), so keep it to a
    /// few µs; zero blocks at once. A kthread under `SCHED_IDLE`
    /// (`sched_idle`) may linger longer: the kernel runs any other
    /// application's kthread woken on the core before it. `new` gives
    /// batch applications [`BATCH_LINGER`], others zero.
    pub linger_after_park: Duration,
    /// Run the kthreads under Linux's `SCHED_IDLE` class (docs/runtime.md,
    /// "Batch kthreads run SCHED_IDLE"): on a core shared with a
    /// latency-critical kthread, the kernel runs that one the moment it is
    /// woken instead of time-sharing the core, and iokerneld wakes it
    /// without waiting for this application's kthread to give the core
    /// back. `new` turns it on for `Class::Batch`.
    pub sched_idle: bool,
    /// Never park when idle: keep every granted core and spin on it (the
    /// ZygOS-like `static` baseline, where cores are provisioned, not
    /// shared). Preemptions are still honoured.
    pub keep_cores_when_idle: bool,
    /// Out of work, one kthread of the application keeps its core and polls
    /// rather than park, while no other application wants the core: iokerneld
    /// takes it back at once for anyone who does (docs/idle-poll.md). It
    /// parks after this long with no arrival (packets, work pushed from
    /// outside); zero: never polls. `new` gives latency-critical
    /// applications [`POLL_WHILE_IDLE`], batch zero.
    pub poll_while_idle: Duration,
    /// On the direct path (`NetConfig::direct`), once `poll_while_idle` is
    /// over (at once where it is zero), the idle kthread that would park
    /// keeps its core and blocks in `poll` on the application's own AF_XDP
    /// socket instead: a frame wakes it through the kernel, with no grant
    /// and no iokerneld on the way, and it costs no CPU while it waits
    /// (docs/idle-poll.md, "Blocked on the own socket"). iokerneld takes
    /// the core back as a poller's. Without an own socket it changes
    /// nothing.
    pub block_while_idle: bool,
    /// On the direct path, a parked kthread 0 sleeps in `poll` on its
    /// eventfd and the application's own AF_XDP socket, and a frame there
    /// wakes it through the kernel: it runs at once on the CPU iokerneld
    /// last pinned it to and tells iokerneld, which counts the core
    /// granted or revokes it (docs/direct-path.md, "The self-woken
    /// kthread"). Only where iokerneld allows it (its `Config::self_wake`,
    /// and the CPU free or lent to a `SCHED_IDLE` kthread); on by default,
    /// so iokerneld's setting decides. Without an own socket it changes
    /// nothing.
    pub self_wake: bool,
    /// Send and receive packets (`crate::net`): iokerneld steers frames
    /// for this MAC/IP to the kthreads' ingress rings.
    pub net: Option<NetConfig>,
    /// The packet steering policy to ask iokerneld for (None: its
    /// configured default).
    pub steering: Option<ginza_policy::steer::SteeringKind>,
    /// Dispatch by iokerneld (docs/colocate.md): set by
    /// `shinjuku::dispatched::serve`, which runs the workers that read it.
    pub dispatch: Option<ginza_proto::messages::DispatchSpec>,
    /// Sleep for grants on iokerneld's wake page instead of the eventfds,
    /// and answer its local-wake doorbells (docs/runtime.md, "Local
    /// wakes"; iokerneld's `Config::local_wake_wait`): at its preemption
    /// points and between uthreads, a kthread asked to wake another
    /// application's kthread on its CPU does so, from any process. On by
    /// default; an iokerneld without a page wakes the eventfds.
    pub wake_page: bool,
}

impl IokernelConfig {
    pub fn new(name: impl Into<String>, class: Class) -> Self {
        IokernelConfig {
            socket: None,
            name: name.into(),
            class,
            guaranteed: 0,
            max_cores: None,
            linger_after_park: if class == Class::Batch {
                BATCH_LINGER
            } else {
                Duration::ZERO
            },
            sched_idle: class == Class::Batch,
            keep_cores_when_idle: false,
            // A latency-critical application polls while nobody wants its
            // core (docs/idle-poll.md, "The default").
            poll_while_idle: if class == Class::LatencyCritical {
                POLL_WHILE_IDLE
            } else {
                Duration::ZERO
            },
            block_while_idle: false,
            self_wake: true,
            net: None,
            steering: None,
            dispatch: None,
            wake_page: true,
        }
    }
}

/// An application's network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConfig {
    /// The application's own MAC and IPv4 address: iokerneld steers frames
    /// for them to its kthreads.
    pub interface: Interface,
    /// Fixed IPv4 → MAC mappings (peers that do not answer ARP, such as
    /// iokerneld's traffic generator).
    pub static_arp: Vec<StaticArpEntry>,
    pub arp: ArpConfig,
    /// Datagrams one socket holds before it drops more (counted in
    /// [`NetStats::udp_queue_full`](crate::net::NetStats::udp_queue_full)). Each holds an ingress buffer until
    /// the application reads it, and the pool is shared by all sockets.
    pub udp_queue: usize,
    /// Every TCP connection's tunables (buffers, MSS, timers);
    /// `TcpConfig::default()`'s datacenter values unless changed.
    pub tcp: TcpConfig,
    /// Every listener's bounds: half-open connections and accept backlog,
    /// and whether a full half-open set answers with SYN cookies.
    pub tcp_listen: ListenConfig,
    /// The direct path (docs/direct-path.md): receive and send on an
    /// AF_XDP socket of the application's own. Off (`None`) by default.
    pub direct: Option<DirectPathConfig>,
}

/// Where the application's own AF_XDP socket is bound: a receive queue of
/// the interface iokerneld drives (`nic = "af_xdp:IF,direct"`), other than
/// iokerneld's queue 0, that the NIC steers the application's flows to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectPathConfig {
    pub interface: String,
    pub queue: u32,
    /// Kick the tx ring (a `sendto`) once per frame sent, as before
    /// batching, instead of once per burst (when the kthread's scheduler
    /// regains control, after a receive batch, or every 32 frames): for
    /// comparison only.
    pub kick_per_frame: bool,
}

impl NetConfig {
    /// `mac` and `ip`, no static ARP entries, Linux-like ARP timing (learned
    /// entries kept 60 s, requests retried each second, 3 s before a
    /// queued datagram is dropped, 4 datagrams queued per address).
    pub fn new(mac: MacAddr, ip: Ipv4Addr) -> NetConfig {
        NetConfig {
            interface: Interface { mac, ip },
            static_arp: Vec::new(),
            arp: ArpConfig::default(),
            udp_queue: 256,
            tcp: TcpConfig::default(),
            tcp_listen: ListenConfig::default(),
            direct: None,
        }
    }

    /// Turns the direct path on: the application's own socket on `queue`
    /// of `interface`.
    pub fn with_direct_path(mut self, interface: &str, queue: u32) -> NetConfig {
        self.direct = Some(DirectPathConfig {
            interface: interface.to_string(),
            queue,
            kick_per_frame: false,
        });
        self
    }

    /// Adds a static ARP entry.
    pub fn with_static_arp(mut self, ip: Ipv4Addr, mac: MacAddr) -> NetConfig {
        self.static_arp.push(StaticArpEntry { ip, mac });
        self
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        let iface = &self.interface;
        if iface.mac.is_multicast() || iface.mac == MacAddr::ZERO {
            return Err(format!(
                "net: the interface MAC {} must be a unicast, non-zero address",
                iface.mac
            ));
        }
        if iface.ip.is_unspecified() || iface.ip.is_broadcast() || iface.ip.is_multicast() {
            return Err(format!(
                "net: the interface IP {} must be a unicast address",
                iface.ip
            ));
        }
        if !(1..=4096).contains(&self.udp_queue) {
            return Err(format!(
                "net: udp_queue {} must be in 1..=4096",
                self.udp_queue
            ));
        }
        if self.arp.capacity == 0 || self.arp.retry_interval == Duration::ZERO {
            return Err("net: the ARP table needs a capacity and a retry interval".into());
        }
        if let Some(d) = &self.direct {
            if d.interface.is_empty() || d.interface.len() >= 16 || d.interface.contains('/') {
                return Err(format!(
                    "net: direct path: interface name {:?} must be 1 to 15 bytes, no '/'",
                    d.interface
                ));
            }
            if d.queue == 0 {
                return Err(
                    "net: direct path: queue 0 is iokerneld's; pick another receive queue".into(),
                );
            }
        }
        Ok(())
    }
}

/// How a runtime attaches to a netstack (`Config::protected`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProtectedConfig {
    /// The netstack's unix socket
    /// (`ginza_proto::netstack::default_netstack_socket()` by default).
    pub socket: PathBuf,
    /// The application's name at the netstack.
    pub name: String,
    /// The application's MAC and IPv4 address: the netstack owns them for
    /// it (iokerneld steers their frames to the netstack).
    pub interface: Interface,
    /// 2 KiB chunks in the application's tx pool (its
    /// send buffers, shared by all its connections).
    pub tx_chunks: u32,
    /// Bytes one connection may have sent and not yet acknowledged.
    pub tx_per_connection: u64,
}

impl ProtectedConfig {
    /// `name` at `interface`, attached to the netstack at `socket`; 8 MiB
    /// of tx pool, 256 KiB in flight per connection.
    pub fn new(socket: impl Into<PathBuf>, name: &str, interface: Interface) -> ProtectedConfig {
        ProtectedConfig {
            socket: socket.into(),
            name: name.to_string(),
            interface,
            tx_chunks: 4096,
            tx_per_connection: 256 * 1024,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: usize) -> BTreeSet<usize> {
        (0..n).collect()
    }

    #[test]
    fn bad_configs_are_clear_errors() {
        let none = |_| vec![];
        let err = |c: Config| c.plan_for(&cpus(2), &none).unwrap_err().to_string();
        assert!(err(Config::with_kthreads(0)).contains("at least one kthread"));
        assert!(err(Config::with_kthreads(100_000)).contains("at most 1024"));
        let c = Config {
            cores: Some(vec![7]),
            ..Config::default()
        };
        assert!(
            err(c).contains("core 7 does not exist"),
            "{}",
            err(Config {
                cores: Some(vec![7]),
                ..Config::default()
            })
        );
        let c = Config {
            cores: Some(vec![]),
            ..Config::default()
        };
        assert!(err(c).contains("empty"));
        let c = Config {
            cores: Some(vec![1, 1]),
            ..Config::default()
        };
        assert!(err(c).contains("twice"));
        let c = Config {
            stack_size: 10,
            ..Config::default()
        };
        assert!(err(c).contains("stack size"));
        let c = Config {
            spin_before_park: Duration::from_secs(5),
            ..Config::default()
        };
        assert!(err(c).contains("spin"));
    }

    #[test]
    fn kthreads_wrap_around_cores_and_find_siblings() {
        // Two physical cores with two hyperthreads each: {0,2} and {1,3}.
        let sib = |c: usize| {
            if c.is_multiple_of(2) {
                vec![0, 2]
            } else {
                vec![1, 3]
            }
        };
        let plan = Config::with_kthreads(6).plan_for(&cpus(4), &sib).unwrap();
        assert_eq!(plan.cores, vec![0, 1, 2, 3, 0, 1]);
        assert_eq!(plan.siblings[0], vec![2]);
        assert_eq!(plan.siblings[1], vec![3]);
        assert_eq!(plan.siblings[2], vec![0, 4]);
        assert!(plan.oversubscribed);
        let plan = Config::with_kthreads(2).plan_for(&cpus(4), &sib).unwrap();
        assert!(!plan.oversubscribed);
        assert!(plan.siblings[0].is_empty());
    }
}
