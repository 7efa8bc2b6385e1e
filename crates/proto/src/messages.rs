//! The control protocol between a runtime (or a stats reader) and
//! iokerneld, over a unix SOCK_SEQPACKET socket.
//!
//! SOCK_SEQPACKET keeps message boundaries and is connection-oriented: one
//! `sendmsg` is one message (no framing code), descriptors travel with it by
//! `SCM_RIGHTS`, and the peer's exit is a hang-up iokerneld sees at once.
//!
//! Messages are JSON (serde_json), at most [`MAX_REQUEST`] bytes from a
//! client. Why JSON rather than a fixed binary record: registration happens
//! once per application, off the fast path, so its cost does not matter;
//! JSON is self-describing, so iokerneld can read the `protocol` field of a
//! message whose other fields have changed shape and refuse it with a
//! precise reason ("protocol 3, iokerneld speaks 2") instead of a decode
//! error; and a human can read it in `strace`. The fast path (queue lines,
//! command rings) is binary shared memory, not this socket.
//!
//! A connection's first message is an [`Envelope`]: `Register` (the
//! connection then stands for the application; closing it deregisters),
//! `Stats` or `ResetStats` (answered; more such requests may follow).

use serde::{Deserialize, Serialize};

/// Version of this protocol; a peer speaking another is refused.
pub const PROTOCOL_VERSION: u32 = 2;

/// Largest request iokerneld reads; a longer one is refused.
pub const MAX_REQUEST: usize = 4096;
/// Largest reply iokerneld sends: the stats of [`MAX_APPS`] applications
/// with every number at its largest fit (a unit test builds that report,
/// [`largest_stats_report`]), with room for fields to come. iokerneld sizes
/// each connection's send buffer for it (one SOCK_SEQPACKET message must
/// fit in the sender's buffer; the default, `net.core.wmem_default`, is
/// 208 KiB).
pub const REPLY_LIMIT: usize = 400 * 1024;
/// Largest reply a client reads.
pub const MAX_REPLY: usize = 512 * 1024;
const _: () = assert!(REPLY_LIMIT < MAX_REPLY);
/// Longest application name.
pub const MAX_NAME: usize = 64;
/// Most `--faults` rules of iokerneld (so that their counters, one
/// [`FaultStats`] each, fit in a stats reply beside [`MAX_APPS`]
/// applications).
pub const MAX_FAULT_RULES: usize = 4;
/// Most applications registered at once (so that a stats reply about all
/// of them fits in [`MAX_REPLY`]).
pub const MAX_APPS: usize = 256;

/// Application class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// May take bursting cores of others.
    LatencyCritical,
    /// Best effort.
    Batch,
}

impl From<Class> for ginza_policy::alloc::AppClass {
    fn from(c: Class) -> Self {
        match c {
            Class::LatencyCritical => ginza_policy::alloc::AppClass::LatencyCritical,
            Class::Batch => ginza_policy::alloc::AppClass::Batch,
        }
    }
}

/// What a runtime declares when it registers. Sent with the memfd of its
/// region and one eventfd per kthread (in kthread order) attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    pub name: String,
    pub class: Class,
    /// Cores never taken away (the sum over applications never exceeds the
    /// managed cores).
    pub guaranteed: u32,
    /// Most cores it may hold.
    pub max_cores: u32,
    /// Kthreads (= eventfds sent = kthreads of the region).
    pub kthreads: u32,
    /// The application's own MAC and IPv4 address, if it sends and
    /// receives packets: iokerneld steers frames for them to its kthreads
    /// and answers with an ingress pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<ginza_net::Interface>,
    /// The packet steering policy it asks for (a
    /// `ginza_policy::steer::SteeringKind` name: `rss-mod`, `flow-affinity`,
    /// `indirection`); none: iokerneld's configured one. Left out of the
    /// message when none, so older registrations read the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering: Option<String>,
    /// Dispatch by iokerneld (docs/colocate.md): a Shinjuku-mode
    /// application whose request queues iokerneld keeps. Left out when
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<DispatchSpec>,
    /// Its kthreads sleep for grants on iokerneld's wake page and answer
    /// local-wake doorbells from it (docs/runtime.md, "Local wakes"):
    /// iokerneld answers with a block of the page and its memfd. Left out
    /// when false, so older registrations read the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wake_page: bool,
    /// It sends its bell (`ginza_shm::IokernelBell`), an eventfd attached
    /// after the kthreads' eventfds, and rings it when it gives a sleeping
    /// iokerneld work (docs/iokernel-idle.md). iokerneld sleeps only while
    /// every application registered has one. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bell: bool,
}

impl Registration {
    /// `kthreads` kthreads that may all hold a core, none guaranteed; no
    /// address, dispatch or wake page (set the fields for those).
    pub fn new(name: impl Into<String>, class: Class, kthreads: u32) -> Self {
        Registration {
            name: name.into(),
            class,
            guaranteed: 0,
            max_cores: kthreads,
            kthreads,
            net: None,
            steering: None,
            dispatch: None,
            wake_page: false,
            bell: false,
        }
    }
}

/// Longest class list of a [`DispatchSpec`].
pub const MAX_DISPATCH_CLASSES: usize = 16;

/// How iokerneld dispatches an application's requests (docs/colocate.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchSpec {
    /// `c-fcfs`, `c-pre-sq` or `c-pre-mq`.
    pub policy: String,
    /// Preemption quantum (c-PRE), ns.
    #[serde(default)]
    pub quantum_ns: u64,
    /// c-PRE-SQ: a preempted request goes back to the head of the queue
    /// (else the tail).
    #[serde(default)]
    pub head: bool,
    /// c-PRE-MQ: one entry per request class.
    #[serde(default)]
    pub classes: Vec<DispatchClass>,
    /// c-PRE-MQ's classifier: the request's class is the byte at this
    /// offset of its UDP payload (a missing byte, or one naming no class,
    /// means class 0).
    #[serde(default)]
    pub class_offset: u16,
    /// A request asked to yield (its quantum spent) that still runs this
    /// long after the ask gets a signal (it reached no preemption point);
    /// none: never signalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backstop_ns: Option<u64>,
    /// Pre-assignment (docs/colocate.md, "Pre-assignment"): iokerneld
    /// sends a busy worker its next request ahead (`RunNext`) while
    /// requests wait; preemptive policies only. None:
    /// [`DispatchSpec::PRE_ASSIGN_DEFAULT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_assign: Option<bool>,
}

/// One c-PRE-MQ class of a [`DispatchSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchClass {
    pub slo_ns: u64,
    #[serde(default)]
    pub head: bool,
}

impl DispatchSpec {
    /// Whether iokerneld pre-assigns when the spec does not say: yes,
    /// chosen by measurement (docs/results.md, pre-assignment in the
    /// dispatched path).
    pub const PRE_ASSIGN_DEFAULT: bool = true;

    /// Whether iokerneld pre-assigns this application's requests.
    pub fn pre_assigns(&self) -> bool {
        self.pre_assign.unwrap_or(Self::PRE_ASSIGN_DEFAULT)
    }

    /// The policy it names, or why it names none.
    pub fn sched_policy(&self) -> Result<ginza_policy::sched::SchedPolicy, String> {
        use ginza_policy::sched::{ClassConfig, Placement, SchedPolicy};
        let placement = |head: bool| {
            if head {
                Placement::Head
            } else {
                Placement::Tail
            }
        };
        let quantum = || {
            if self.quantum_ns == 0 {
                Err(format!("{} needs a quantum > 0 ns", self.policy))
            } else {
                Ok(self.quantum_ns)
            }
        };
        match self.policy.as_str() {
            "c-fcfs" => Ok(SchedPolicy::CFcfs),
            "c-pre-sq" => Ok(SchedPolicy::CPreSq {
                quantum: quantum()?,
                placement: placement(self.head),
            }),
            "c-pre-mq" => {
                if self.classes.is_empty() || self.classes.len() > MAX_DISPATCH_CLASSES {
                    return Err(format!(
                        "c-pre-mq needs 1 to {MAX_DISPATCH_CLASSES} classes, not {}",
                        self.classes.len()
                    ));
                }
                if let Some(i) = self.classes.iter().position(|c| c.slo_ns == 0) {
                    return Err(format!("c-pre-mq class {i} has an SLO of 0 ns"));
                }
                Ok(SchedPolicy::CPreMq {
                    quantum: quantum()?,
                    classes: self
                        .classes
                        .iter()
                        .map(|c| ClassConfig {
                            slo: c.slo_ns,
                            placement: placement(c.head),
                        })
                        .collect(),
                })
            }
            other => Err(format!(
                "unknown dispatch policy {other:?} (c-fcfs, c-pre-sq, c-pre-mq)"
            )),
        }
    }
}

/// A request to iokerneld.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    Register(Registration),
    Stats,
    /// Answered like `Stats` (the window that ends now), then the
    /// [`AllocStats`] window starts again: a benchmark resets after its
    /// warm-up and reads its measurement window alone.
    ResetStats,
    /// From the protected-mode netstack, on its own registration socket,
    /// with a channel memfd attached (`ginza_shm::netstack::Channel`):
    /// iokerneld reads that channel's rings in its allocation pass, so that
    /// commands waiting on pair `p` count as queued work of the netstack's
    /// kthread `p % kthreads`, and events waiting on pair `k` as queued
    /// work of kthread `k` of the application with pid `app_pid` — and,
    /// when several registered applications share that pid (one process
    /// running iokerneld, the netstack and applications as threads), the
    /// one registered as `app_name` (docs/protected.md, "Wake-ups"). With `interface`, iokerneld also
    /// steers that address's frames to the netstack and lets it send from
    /// it ("Addresses"). A second descriptor, if attached, is the
    /// application's tx pool: iokerneld then assembles zero-touch frames
    /// from it ("Transmit"). Answered `Accepted`.
    Protect {
        app_pid: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app_name: Option<String>,
        link: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interface: Option<ginza_net::Interface>,
    },
    /// The netstack forgets the channel of `Protect { link }`.
    Unprotect {
        link: u64,
    },
    /// Where the time of the requests of application `name` went
    /// (dispatch by iokerneld, docs/colocate.md). Answered
    /// `DispatchBreakdown`.
    DispatchBreakdown {
        name: String,
    },
    /// Each kthread of application `name` as iokerneld sees it now: what
    /// a test prints when an application holds a core it should not (a
    /// stuck grant, a hand-over that never completes). Answered
    /// `Kthreads`.
    Kthreads {
        name: String,
    },
    /// From a registered application with a network interface, on its
    /// connection, with its own AF_XDP socket attached, bound to receive
    /// queue `queue` of iokerneld's interface (the direct path,
    /// docs/direct-path.md): iokerneld steers the application's frames
    /// that arrive on that queue to the socket instead of its own, and
    /// watches the socket's rx ring for queued work. Answered `Accepted`.
    DirectSocket {
        queue: u32,
    },
}

/// What a client sends: the protocol version, then the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub protocol: u32,
    pub request: Request,
}

/// iokerneld's answer.
// One per request, off the fast path: its size does not matter, and
// boxing the report would only complicate matching on it.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// With `ingress_buffers > 0` (an application with `net`), the memfd
    /// of its ingress pool is attached: that many buffers of
    /// `ginza_shm::PKT_BUFFER_SIZE` bytes, to be mapped read-only. With
    /// `wake_slots` (asked by `Registration::wake_page`), the wake page's
    /// memfd follows: kthread `k` sleeps on slot `wake_slots + k`.
    Accepted {
        app_id: u64,
        #[serde(default)]
        ingress_buffers: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wake_slots: Option<u32>,
        /// To a registration: whether iokerneld's allocator reads the
        /// kthreads' busy time (`QueueLine::add_busy_ns`), which a runtime
        /// otherwise need not keep. `None` (an iokerneld from before it
        /// said so, or the answer to another request): keep it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        busy_time: Option<bool>,
    },
    Refused {
        reason: String,
    },
    Stats(StatsReport),
    /// The completed requests of a dispatched application by sojourn band
    /// (the non-empty bands, shortest first).
    DispatchBreakdown {
        bands: Vec<SojournBand>,
    },
    Kthreads {
        kthreads: Vec<KthreadView>,
    },
}

/// One kthread as iokerneld sees it (`Request::Kthreads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KthreadView {
    /// The CPU it holds (granted and not given back), if any.
    pub cpu: Option<u32>,
    /// Parked: iokerneld read its `Parked`/`Yielded` and has not granted
    /// it a core since.
    pub parked: bool,
    /// Asked to give its core back; no answer yet.
    pub preempting: bool,
    /// Moved off its core after missing the preemption deadline.
    pub evicted: bool,
    /// Granted a core that a preempted kthread still holds: not woken yet.
    pub awaiting_handover: bool,
    /// Its last grant's number, and whether no `Parked`/`Yielded` has
    /// answered it yet.
    pub grant: u16,
    pub grant_open: bool,
    /// Items queued on its runqueue, its ingress ring and the channel
    /// rings counted as its work, as the last allocation pass saw them.
    pub queued: u32,
    /// Its queue line's flags (`ginza_shm::LineFlags` bits) now.
    pub flags: u32,
    /// The timer it reported when it last parked, from now (ns; negative:
    /// overdue).
    pub timer_in_ns: Option<i64>,
    /// The busy time its runtime has published on its line (ns): 0 where
    /// the allocator does not read it (`Response::Accepted::busy_time`).
    #[serde(default)]
    pub busy_ns: u64,
}

/// The completed requests of a dispatched application whose sojourn in
/// iokerneld (packet held → completed hand-back) fell in one band (from
/// `from_ns` to twice that; the first band from 0, the last one
/// unbounded), with the sums of where their time went (docs/colocate.md):
/// in a queue (of that, while none of the application's workers held a
/// core), `Run` sent → the worker seen running it, seen running → handed
/// back (preempted or completed; a run that ended before iokerneld saw it
/// start counts whole here), and the runs (one more than its preemptions
/// and `Run`s taken back).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SojournBand {
    pub from_ns: u64,
    pub count: u64,
    pub sojourn_ns: u64,
    pub queued_ns: u64,
    pub no_core_ns: u64,
    pub pickup_ns: u64,
    pub on_core_ns: u64,
    pub runs: u64,
}

/// What iokerneld did with one application's packets (totals since it
/// registered). Short names: 256 applications' worth must fit in one stats
/// reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetStats {
    /// Frames put on its ingress rings.
    pub rx: u64,
    /// Frames taken from its egress rings and handed to the switch.
    pub tx: u64,
    /// Frames for it dropped: the chosen ingress ring was full, every
    /// ingress buffer was lent, or its switch port's ring or pool was full.
    pub drop_ingress: u64,
    /// Frames it sent that were dropped: length 0 or above a buffer, or
    /// refused by the switch (unknown destination, spoofed source, runt).
    pub drop_egress: u64,
    /// Frames that went to a parked kthread because none was active.
    pub to_parked: u64,
    /// Its packet steering policy: `ginza_policy::steer::SteeringKind`'s
    /// code (0 `rss-mod`, 1 `flow-affinity`, 2 `indirection`).
    #[serde(default)]
    pub st: u8,
    /// Flows its steering policy moved from one kthread to another: the
    /// flows each change of the active set remapped (among the flows
    /// iokerneld tracks, `ginza_policy::steer::TRACKED_FLOWS`), plus moves
    /// made at a flow's next packet (docs/simulator.md, "Steering
    /// measurements").
    #[serde(default)]
    pub mv: u64,
    /// Flows evicted from its steering policy's flow table.
    #[serde(default)]
    pub ev: u64,
    /// Bytes of its steering policy's table(s) (fixed when it registered).
    #[serde(default)]
    pub tb: u32,
}

impl NetStats {
    /// The steering policy [`NetStats::st`] names (`None`: a code this
    /// build does not know).
    pub fn steering(&self) -> Option<ginza_policy::steer::SteeringKind> {
        ginza_policy::steer::SteeringKind::from_code(self.st)
    }

    /// Its name (`?` for a code this build does not know).
    pub fn steering_name(&self) -> &'static str {
        self.steering().map_or("?", |k| k.name())
    }
}

/// One steering policy's measurements, summed over the applications that
/// use it now (in [`DataplaneStats::steering`]: per policy, not per
/// application, so that it fits in a stats reply whatever the number of
/// applications). Short names, as in [`NetStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteeringStats {
    /// The policy: `ginza_policy::steer::SteeringKind`'s code.
    pub st: u8,
    /// Applications using it.
    pub apps: u32,
    /// Changes of their active sets (a kthread gained or lost its core).
    pub ch: u64,
    /// Flows the policy moved from one kthread to another (as
    /// [`NetStats::mv`]: remapped by changes of the active set, or at a
    /// flow's next packet).
    pub mv: u64,
    /// Moves seen: packets that went to another kthread than their flow's
    /// previous packet (a flow with no packet while its kthread was away is
    /// not seen moving: what `mv` counted before remaps were tracked).
    #[serde(default)]
    pub ms: u64,
    /// Steering decisions timed, and iokerneld's ns spent on them (flow key
    /// and policy pick of a burst timed together, two clock reads per
    /// burst; a burst that took over 50 µs, preempted, is left out).
    pub sd: u64,
    pub sn: u64,
    /// Bytes of the policy's tables.
    pub tb: u64,
    /// Steals of their kthreads ([`AppStats::steals`]).
    #[serde(default)]
    pub sl: u64,
}

impl SteeringStats {
    /// The policy's name (`?` for a code this build does not know).
    pub fn steering_name(&self) -> &'static str {
        ginza_policy::steer::SteeringKind::from_code(self.st).map_or("?", |k| k.name())
    }

    /// Flows moved per change of the active set (`None` before a change).
    pub fn moved_per_change(&self) -> Option<f64> {
        (self.ch > 0).then(|| self.mv as f64 / self.ch as f64)
    }

    /// Moves seen ([`SteeringStats::ms`]) per change of the active set.
    pub fn seen_moving_per_change(&self) -> Option<f64> {
        (self.ch > 0).then(|| self.ms as f64 / self.ch as f64)
    }

    /// iokerneld's mean ns per steering decision (`None` before one).
    pub fn ns_per_decision(&self) -> Option<f64> {
        (self.sd > 0).then(|| self.sn as f64 / self.sd as f64)
    }
}

/// Dataplane totals, in [`StatsReport`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DataplaneStats {
    /// `software` or the real interface's spec.
    pub nic: String,
    pub nic_rx_frames: u64,
    pub nic_tx_frames: u64,
    /// Frames for the NIC it did not accept (its ring or pool full). A frame
    /// from the NIC is copied straight to its receiver's port, whose own
    /// counters show a drop there.
    pub nic_drops: u64,
    /// Generator runs completed.
    pub generator_runs: u64,
    /// Replies the generator matched, over every run (the one running
    /// included).
    #[serde(default, rename = "gr")]
    pub generator_replies: u64,
    /// Of those, replies that came back out of order within their flow
    /// (after a later request of the same flow was answered): the
    /// observable proxy for packets processed out of order within a flow.
    #[serde(default, rename = "go")]
    pub generator_reordered: u64,
    /// Per steering policy in use, its measurements (at most one entry per
    /// policy).
    #[serde(default, rename = "st", skip_serializing_if = "Vec::is_empty")]
    pub steering: Vec<SteeringStats>,
    /// Fault injection in the switch: one entry per `--faults` rule, in
    /// the order given (none without rules). Totals since iokerneld
    /// started, over every port the rule applied to (ports removed since
    /// included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultStats>,
}

/// What one fault-injection rule did (iokerneld's `--faults`,
/// docs/fault-injection.md). Short names, as in [`NetStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultStats {
    /// The rule's ports as written in it: `all`, `trunk`, `generator`, a
    /// MAC or `app:NAME`.
    pub port: String,
    /// Frames the rule looked at (those its `proto` selects).
    #[serde(rename = "n")]
    pub frames: u64,
    /// Dropped at random (`drop=`).
    #[serde(rename = "dr")]
    pub dropped: u64,
    /// Sent twice.
    #[serde(rename = "du")]
    pub duplicated: u64,
    /// Held back until later frames passed them.
    #[serde(rename = "ro")]
    pub reordered: u64,
    /// Held for `delay=`.
    #[serde(rename = "de")]
    pub delayed: u64,
    /// With one byte flipped.
    #[serde(rename = "co")]
    pub corrupted: u64,
    /// Dropped because the port's holding queue was full (`hold=`).
    #[serde(rename = "ov")]
    pub held_overflow: u64,
}

impl FaultStats {
    /// Frames the rule lost: dropped at random or for want of room.
    pub fn lost(&self) -> u64 {
        self.dropped + self.held_overflow
    }
}

/// Counters of one registered application. Totals since registration; a
/// reader derives rates from two reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppStats {
    pub app_id: u64,
    pub name: String,
    pub pid: i32,
    pub class: Class,
    /// Cores held now.
    pub cores_now: u32,
    pub guaranteed: u32,
    pub max_cores: u32,
    pub kthreads: u32,
    pub parked_kthreads: u32,
    pub grants: u64,
    pub preemptions: u64,
    /// Passes at which an item waited since the previous pass.
    pub congestion_events: u64,
    /// Wake/preempt commands dropped because the kthread's command ring
    /// was full.
    pub ring_full: u64,
    /// Preempted kthreads that did not give their core back in time (moved
    /// off the core).
    pub preempt_overdue: u64,
    /// Times its kthreads took work queued for another of its kthreads, as
    /// its runtime counts them in the queue lines (untrusted: iokerneld
    /// believes no count that goes backwards or grows absurdly fast).
    #[serde(default)]
    pub steals: u64,
    /// Packets, for an application registered with `net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetStats>,
    /// Its requests, when iokerneld dispatches them (docs/colocate.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<DispatchStats>,
}

/// What iokerneld's dispatch step did with one application's requests
/// (totals since it registered; docs/colocate.md). Short names: 256
/// applications' worth must fit in one stats reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchStats {
    /// Requests arrived (queued).
    pub ar: u64,
    /// `Run` commands sent: new requests and resumed preempted ones.
    pub ru: u64,
    /// Requests completed (hand-backs).
    pub co: u64,
    /// Preempted hand-backs (quantum spent, or the core revoked).
    pub pe: u64,
    /// Of those, handed back by a worker whose core was being revoked.
    pub rv: u64,
    /// Preemptions asked (the yield flag set).
    pub ak: u64,
    /// Backstop signals sent to workers that had not yielded in time.
    pub bs: u64,
    /// Requests the application refused unrun (over its in-flight bound).
    pub rf: u64,
    /// `Run`s taken back unrun and queued again as they were: they
    /// crossed their worker's `Parked`/`Yielded`, or were pre-assigned
    /// behind a request handed back preempted (docs/colocate.md,
    /// "Pre-assignment").
    pub tb: u64,
    /// Hand-backs refused (they named a request the worker did not hold).
    pub li: u64,
    /// Requests queued now.
    pub qu: u64,
    /// `Parked`s read while requests were queued (a worker gave its core
    /// back with work waiting for it, which then waits for a grant;
    /// docs/colocate.md, "Several workers"). Absent from older replies.
    #[serde(default)]
    pub pq: u64,
    /// Requests pre-assigned to busy workers (`RunNext`, counted in `ru`
    /// too; those taken back unrun are in `tb`; docs/colocate.md,
    /// "Pre-assignment"). Absent from older replies.
    #[serde(default)]
    pub pa: u64,
}

/// Summary of a histogram of durations, in ns. All zero when `count` is 0.
/// Percentiles and the maximum are the upper ends of their histogram
/// buckets (at most 0.1 % above the recorded value, never below it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
}

/// What the core allocator did and what it cost iokerneld, over a window:
/// since iokerneld started, or since the last `ResetStats`. Unlike the
/// per-application totals, this survives applications that leave.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocStats {
    /// Length of the window (CLOCK_MONOTONIC).
    pub window_ns: u64,
    /// CPU time of iokerneld's loop thread in the window.
    pub window_cpu_ns: u64,
    /// Grant decisions carried out in iokerneld's bookkeeping (the kthread
    /// holds the core from then on), hand-overs still waiting included.
    pub grants: u64,
    /// Kthreads asked to give their core back.
    pub preemptions: u64,
    /// Grants of a core whose previous holder was another application (a
    /// core moved between applications, Shenango's "core reallocation").
    /// A core's first grant since iokerneld started is not one; a core
    /// granted again to the application that last held it is not one.
    pub reallocations: u64,
    /// Hand-overs completed: the receiving kthread was woken after the
    /// preempted victim gave the core back, missed its deadline or went
    /// away.
    pub handovers: u64,
    /// Hand-overs dropped because the receiver lost the core (preempted)
    /// or went away before the victim gave it back.
    pub handovers_abandoned: u64,
    /// Preemptions of `SCHED_IDLE` kthreads withdrawn before they were
    /// signalled: the core came back first, and they kept it (counted in
    /// `reallocations` too; `Config::idle_victim_grace` of iokerneld).
    #[serde(default)]
    pub preemptions_withdrawn: u64,
    /// Local wakes (`Config::local_wake_wait` of iokerneld): kthreads woken
    /// by the `SCHED_IDLE` kthread on their core, and those iokerneld
    /// woke itself because nobody took the doorbell in time.
    #[serde(default)]
    pub local_wakes: u64,
    #[serde(default)]
    pub local_wakes_by_iokernel: u64,
    /// Self-wakes (`Config::self_wake` of iokerneld, docs/direct-path.md):
    /// parked kthreads that woke themselves for a frame on their own
    /// socket, taken as grants of the core they woke on, and of those the
    /// ones revoked (iokerneld would not have granted that core).
    #[serde(default)]
    pub self_wakes: u64,
    #[serde(default)]
    pub self_wakes_revoked: u64,
    /// iokerneld's time per wake of a kthread on its granted core: for a
    /// grant carried out at once, its bookkeeping + the `Wake` on the
    /// command ring + `CoreActuator::grant` (`LinuxActuator`:
    /// `sched_setaffinity` + eventfd write); for a hand-over, the wake
    /// only (its bookkeeping was in the deciding pass). One sample per
    /// grant once no hand-over is pending or abandoned.
    pub grant_cost: Latency,
    /// `grant_cost` of the grants delivered through the kthread's grant
    /// word alone (it was lingering: no eventfd write).
    #[serde(default)]
    pub grant_cost_by_word: Latency,
    /// `grant_cost` of the grants that wrote the kthread's eventfd (it
    /// slept, or had not parked yet).
    #[serde(default)]
    pub grant_cost_by_eventfd: Latency,
    /// Wall time of each allocation pass in which the policy made a
    /// decision or iokerneld woke, preempted or evicted a kthread.
    pub pass_cost_with_decisions: Latency,
    /// Wall time of each other pass (drain the rings, read the queue lines,
    /// run the policy, nothing to do): the fixed cost of a pass. The two
    /// counts add up to the passes of the window.
    pub pass_cost_idle: Latency,
    /// Per completed hand-over: from just before iokerneld signals the
    /// victim to just after the receiving kthread's wake (its eventfd
    /// write) returns.
    pub handover: Latency,
}

/// The whole stats answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    pub policy: String,
    pub managed_cores: Vec<usize>,
    pub interval_ns: u64,
    pub uptime_ns: u64,
    /// CPU time of iokerneld's loop thread so far (what `--idle-sleep`
    /// saves; per-grant cost for benchmarks).
    pub loop_cpu_ns: u64,
    pub passes: u64,
    pub registrations_refused: u64,
    pub apps_disconnected: u64,
    /// `Parked`/`Yielded` iokerneld ignored because they answered a grant
    /// already answered (sent after a wake-up that was no grant;
    /// docs/colocate.md, "Grant numbers"), by the applications registered
    /// now. One total, not one per application: a stats reply about
    /// [`MAX_APPS`] applications must fit. Absent from older replies.
    #[serde(default)]
    pub stale_parks: u64,
    pub apps: Vec<AppStats>,
    /// The last few applications removed, oldest first.
    pub recent_removals: Vec<Removal>,
    /// Counts and costs of the core allocator over the current window.
    /// Missing in a report from an older iokerneld: all zero.
    #[serde(default)]
    pub alloc: AllocStats,
    /// The links: NIC and generator totals.
    #[serde(default)]
    pub dataplane: DataplaneStats,
    /// iokerneld's sleeps while idle and what woke it (docs/iokernel-idle.md),
    /// since it started. Absent from older replies: all zero.
    #[serde(default)]
    pub idle: IdleStats,
}

/// iokerneld's sleeps while idle, since it started (docs/iokernel-idle.md).
/// A wake counts every cause found ready when `poll` returned, so the
/// causes may add up to more than `wakes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleStats {
    /// Whether it may sleep at all (not `--spin`).
    pub enabled: bool,
    /// Sleeps begun, and the time spent in them.
    pub sleeps: u64,
    pub slept_ns: u64,
    /// Sleeps abandoned after announcing them: the last look found work.
    pub sleeps_abandoned: u64,
    /// Wakes by cause: a frame on the NIC's socket, an application's bell,
    /// the control socket or a connection, the earliest deadline iokerneld
    /// owes (a parked kthread's timer, a pending connection's time-out,
    /// `run_for`), an in-process handle (stop, generator, faults).
    pub wakes_nic: u64,
    pub wakes_app: u64,
    pub wakes_control: u64,
    pub wakes_timer: u64,
    pub wakes_handle: u64,
    /// Idle passes kept from sleeping, by the first reason found: an
    /// application registered without a bell, a protected-mode channel, a
    /// load run or frames held by fault injection.
    pub kept_awake_no_bell: u64,
    pub kept_awake_protected: u64,
    pub kept_awake_dataplane: u64,
}

/// An application iokerneld removed, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    pub app_id: u64,
    pub name: String,
    pub reason: String,
}

/// Why a request could not be read. Its text is sent back in `Refused`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("request is not JSON: {0}")]
    NotJson(String),
    #[error("request has no numeric `protocol` field")]
    NoVersion,
    #[error("protocol version {got}, iokerneld speaks {PROTOCOL_VERSION}")]
    Version { got: u64 },
    #[error("malformed request: {0}")]
    Malformed(String),
}

/// Reads a request, judging the version before anything else.
pub fn decode_request(bytes: &[u8]) -> Result<Request, DecodeError> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    let got = v
        .get("protocol")
        .and_then(serde_json::Value::as_u64)
        .ok_or(DecodeError::NoVersion)?;
    if got != u64::from(PROTOCOL_VERSION) {
        return Err(DecodeError::Version { got });
    }
    let e: Envelope =
        serde_json::from_value(v).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    Ok(e.request)
}

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these plain structs to a Vec cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// The largest stats report iokerneld can send: every application slot
/// taken ([`MAX_APPS`], each with the longest name; the report holds no
/// per-kthread entries, so the number of kthreads does not matter), every
/// removal remembered with a long reason, every fault rule, every steering
/// policy, the largest numbers. For the size tests here and in iokerneld.
#[doc(hidden)]
pub fn largest_stats_report() -> StatsReport {
    let big = Latency {
        count: u64::MAX,
        p50_ns: u64::MAX,
        p99_ns: u64::MAX,
        max_ns: u64::MAX,
        mean_ns: u64::MAX,
    };
    let name = "n".repeat(MAX_NAME);
    StatsReport {
        policy: "shenango".into(),
        managed_cores: (0..1024).map(|c| c + 10_000).collect(),
        interval_ns: u64::MAX,
        uptime_ns: u64::MAX,
        loop_cpu_ns: u64::MAX,
        passes: u64::MAX,
        registrations_refused: u64::MAX,
        apps_disconnected: u64::MAX,
        stale_parks: u64::MAX,
        idle: IdleStats {
            enabled: true,
            sleeps: u64::MAX,
            slept_ns: u64::MAX,
            sleeps_abandoned: u64::MAX,
            wakes_nic: u64::MAX,
            wakes_app: u64::MAX,
            wakes_control: u64::MAX,
            wakes_timer: u64::MAX,
            wakes_handle: u64::MAX,
            kept_awake_no_bell: u64::MAX,
            kept_awake_protected: u64::MAX,
            kept_awake_dataplane: u64::MAX,
        },
        apps: (0..MAX_APPS)
            .map(|_| AppStats {
                app_id: u64::MAX,
                name: name.clone(),
                pid: i32::MIN,
                class: Class::LatencyCritical,
                cores_now: u32::MAX,
                guaranteed: u32::MAX,
                max_cores: u32::MAX,
                kthreads: u32::MAX,
                parked_kthreads: u32::MAX,
                grants: u64::MAX,
                preemptions: u64::MAX,
                congestion_events: u64::MAX,
                ring_full: u64::MAX,
                preempt_overdue: u64::MAX,
                steals: u64::MAX,
                net: Some(NetStats {
                    rx: u64::MAX,
                    tx: u64::MAX,
                    drop_ingress: u64::MAX,
                    drop_egress: u64::MAX,
                    to_parked: u64::MAX,
                    st: u8::MAX,
                    mv: u64::MAX,
                    ev: u64::MAX,
                    tb: u32::MAX,
                }),
                dispatch: Some(DispatchStats {
                    ar: u64::MAX,
                    ru: u64::MAX,
                    co: u64::MAX,
                    pe: u64::MAX,
                    rv: u64::MAX,
                    ak: u64::MAX,
                    bs: u64::MAX,
                    rf: u64::MAX,
                    tb: u64::MAX,
                    li: u64::MAX,
                    qu: u64::MAX,
                    pq: u64::MAX,
                    pa: u64::MAX,
                }),
            })
            .collect(),
        recent_removals: (0..16)
            .map(|_| Removal {
                app_id: u64::MAX,
                name: name.clone(),
                reason: "r".repeat(1024),
            })
            .collect(),
        alloc: AllocStats {
            window_ns: u64::MAX,
            window_cpu_ns: u64::MAX,
            grants: u64::MAX,
            preemptions: u64::MAX,
            reallocations: u64::MAX,
            handovers: u64::MAX,
            handovers_abandoned: u64::MAX,
            preemptions_withdrawn: u64::MAX,
            local_wakes: u64::MAX,
            local_wakes_by_iokernel: u64::MAX,
            self_wakes: u64::MAX,
            self_wakes_revoked: u64::MAX,
            grant_cost: big,
            grant_cost_by_word: big,
            grant_cost_by_eventfd: big,
            pass_cost_with_decisions: big,
            pass_cost_idle: big,
            handover: big,
        },
        dataplane: DataplaneStats {
            nic: "af_xdp:".to_string() + &"i".repeat(15),
            nic_rx_frames: u64::MAX,
            nic_tx_frames: u64::MAX,
            nic_drops: u64::MAX,
            generator_runs: u64::MAX,
            generator_replies: u64::MAX,
            generator_reordered: u64::MAX,
            steering: (0..3)
                .map(|_| SteeringStats {
                    st: u8::MAX,
                    apps: u32::MAX,
                    ch: u64::MAX,
                    mv: u64::MAX,
                    ms: u64::MAX,
                    sd: u64::MAX,
                    sn: u64::MAX,
                    tb: u64::MAX,
                    sl: u64::MAX,
                })
                .collect(),
            faults: (0..MAX_FAULT_RULES)
                .map(|_| FaultStats {
                    port: format!("app:{name}"),
                    frames: u64::MAX,
                    dropped: u64::MAX,
                    duplicated: u64::MAX,
                    reordered: u64::MAX,
                    delayed: u64::MAX,
                    corrupted: u64::MAX,
                    held_overflow: u64::MAX,
                })
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_judged_first() {
        let reg = Registration {
            name: "a".into(),
            class: Class::Batch,
            guaranteed: 0,
            max_cores: 1,
            kthreads: 1,
            net: None,
            steering: None,
            dispatch: None,
            wake_page: false,
            bell: false,
        };
        let ok = encode(&Envelope {
            protocol: PROTOCOL_VERSION,
            request: Request::Register(reg.clone()),
        });
        assert_eq!(decode_request(&ok), Ok(Request::Register(reg)));
        let e = decode_request(br#"{"protocol": 7, "request": {"totally": "different"}}"#);
        assert_eq!(e, Err(DecodeError::Version { got: 7 }));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("protocol version 7, iokerneld speaks 2"));
        assert_eq!(
            decode_request(br#"{"request": "stats"}"#),
            Err(DecodeError::NoVersion)
        );
        assert!(matches!(
            decode_request(b"\xff\x00"),
            Err(DecodeError::NotJson(_))
        ));
        assert!(matches!(
            decode_request(br#"{"protocol": 2, "request": {"register": {"name": 5}}}"#),
            Err(DecodeError::Malformed(_))
        ));
        assert_eq!(
            decode_request(br#"{"protocol": 2, "request": "stats"}"#),
            Ok(Request::Stats)
        );
        assert_eq!(
            decode_request(br#"{"protocol": 2, "request": "reset_stats"}"#),
            Ok(Request::ResetStats)
        );
    }

    /// The largest report iokerneld can send fits in [`REPLY_LIMIT`] with
    /// room to spare (crates/iokernel/README.md: iokerneld's own test sends it over a
    /// connection).
    #[test]
    fn the_largest_stats_reply_fits() {
        let len = encode(&Response::Stats(largest_stats_report())).len();
        // About 218 KB; a quarter of the limit left for new fields.
        assert!(len < REPLY_LIMIT * 3 / 4, "{len} bytes");
    }

    /// An acceptance from an iokerneld that does not say whether it reads
    /// busy time decodes with `None` (the runtime then keeps it), and a
    /// `false` is written out.
    #[test]
    fn busy_time_in_an_acceptance_is_optional() {
        let old: Response = serde_json::from_str(r#"{"accepted":{"app_id":7}}"#).unwrap();
        assert!(matches!(
            old,
            Response::Accepted {
                app_id: 7,
                busy_time: None,
                ..
            }
        ));
        let said = Response::Accepted {
            app_id: 7,
            ingress_buffers: 0,
            wake_slots: None,
            busy_time: Some(false),
        };
        let back: Response = serde_json::from_slice(&encode(&said)).unwrap();
        assert_eq!(back, said);
    }

    /// The kthreads of the largest application (256, as many as a region
    /// holds), every field at its longest, fit in one reply too.
    #[test]
    fn the_largest_kthreads_reply_fits() {
        let view = KthreadView {
            cpu: Some(u32::MAX),
            parked: true,
            preempting: true,
            evicted: true,
            awaiting_handover: true,
            grant: u16::MAX,
            grant_open: true,
            queued: u32::MAX,
            flags: u32::MAX,
            timer_in_ns: Some(i64::MIN),
            busy_ns: u64::MAX,
        };
        let len = encode(&Response::Kthreads {
            kthreads: vec![view; 256],
        })
        .len();
        assert!(len < REPLY_LIMIT / 4, "{len} bytes");
    }
}
