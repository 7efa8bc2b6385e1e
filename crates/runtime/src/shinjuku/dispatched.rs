//! Shinjuku mode under iokerneld, with the dispatch step on iokerneld's
//! core (docs/colocate.md): the application's worker side.
//!
//! iokerneld keeps the request queues and decides; each worker kthread,
//! while it holds a core, takes the `Run` commands on its command ring: a
//! new request (its packet named in the command: the worker parses it and
//! starts a request context), or a preempted one (its context, kept here
//! by request id, resumed on whichever kthread iokerneld picked). The
//! worker runs it until it completes (the reply is sent, `HandBack`
//! completed) or yields — its quantum spent ([`ginza_shm::LineFlags::YIELD_REQUEST`],
//! seen at preemption points) or its core revoked (the flag or the signal)
//! — and then `HandBack` preempted, its context parked here. A revoked
//! worker hands its request back before it gives the core up (`Yielded`).
//! A request asked to yield that reaches no preemption point is
//! interrupted by iokerneld's backstop signal (`DispatchSpec::backstop_ns`),
//! whose handler yields it while the flag stands.
//!
//! With pre-assignment (`DispatchSpec::pre_assign`), iokerneld may send a
//! busy worker the next request ahead (`RunNext`): the worker starts it as
//! soon as it hands its own request back completed, and drops it when it
//! hands its request back preempted (iokerneld takes it back then).
//!
//! Requests in flight (running or preempted) are bounded: a new request
//! over the bound is refused at once, counted, and never maps a stack.

use std::collections::HashMap;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_deque::Steal;
use ginza_net::rx::{parse, Packet};
use ginza_net::{Endpoint, MacAddr};
use ginza_proto::messages::DispatchSpec;
use ginza_shm::{LineFlags, PacketDesc, RunPacket, ToIokernel};

use crate::config::{Config, IokernelConfig};
use crate::error::{ConfigError, RuntimeError};
use crate::iokernel::park_with_iokernel;
use crate::link::KLink;
use crate::sched::{self, KthreadBody, Owner, Stopped, URef};
use crate::spinlock::SpinLock;
use crate::task::{unqueued, JoinHandle};

/// The request handler: a request's UDP payload in, the reply's out.
pub type Handler = dyn Fn(&[u8]) -> Vec<u8> + Send + Sync;

/// Configuration of a dispatched Shinjuku-mode server.
#[derive(Clone, Debug)]
pub struct DispatchedConfig {
    /// Worker kthreads (iokerneld grants each a core when it has work).
    pub workers: usize,
    /// The registration; `net` must be set. Its `dispatch` is replaced by
    /// [`DispatchedConfig::dispatch`].
    pub iokernel: IokernelConfig,
    pub dispatch: DispatchSpec,
    /// The UDP port served; datagrams to other ports are dropped (counted).
    pub port: u16,
    /// Usable bytes of each request's stack.
    pub stack_size: usize,
    /// How long an idle worker looks for a `Run` before it parks
    /// ([`DispatchedConfig::idle_spin_for`] by default).
    pub idle_spin: Duration,
    /// Most requests running or preempted at once; more are refused.
    pub max_in_flight: usize,
}

impl DispatchedConfig {
    pub fn new(iokernel: IokernelConfig, dispatch: DispatchSpec, port: u16) -> Self {
        DispatchedConfig {
            workers: 1,
            iokernel,
            dispatch,
            port,
            stack_size: 64 * 1024,
            idle_spin: Self::idle_spin_for(1),
            max_in_flight: 4096,
        }
    }

    /// `workers` worker kthreads, spinning as long as suits that many.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self.idle_spin = Self::idle_spin_for(workers);
        self
    }

    /// The default idle spin: 5 µs, whatever the number of workers. It
    /// counts from when iokerneld has read the worker's last hand-back,
    /// and of several idle workers iokerneld gives the next request to the
    /// one idle the shortest (docs/colocate.md, "Several workers"). Without
    /// both, three workers needed 50 µs: with 5 µs a third of the `Run`s
    /// crossed their worker's `Parked` and requests queued for milliseconds
    /// (docs/results.md, on a 16-core machine). A longer spin takes batch's
    /// share of the cores.
    pub fn idle_spin_for(workers: usize) -> Duration {
        let _ = workers;
        Duration::from_micros(5)
    }
}

/// What a dispatched server did (totals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchedReport {
    /// Requests run to completion (replied to, or their handler panicked).
    pub served: u64,
    /// Times a request yielded its worker (quantum or revocation).
    pub preempted: u64,
    /// Of those, while the worker's core was being revoked.
    pub revoked_mid_request: u64,
    /// New requests refused: `max_in_flight` were in flight.
    pub rejected: u64,
    /// Requests that were not a UDP datagram to the served port.
    pub not_for_us: u64,
    /// `Run`s for a preempted request this application does not hold
    /// (iokerneld's mistake, or a stale command): answered completed.
    pub unknown_resumes: u64,
    /// Handlers that panicked (no reply).
    pub panicked: u64,
    /// Replies not sent (egress ring full or the ARP table refused).
    pub send_errors: u64,
}

#[derive(Default)]
struct Counters {
    served: AtomicU64,
    preempted: AtomicU64,
    revoked_mid_request: AtomicU64,
    rejected: AtomicU64,
    not_for_us: AtomicU64,
    unknown_resumes: AtomicU64,
    panicked: AtomicU64,
    send_errors: AtomicU64,
}

/// Where a request's reply goes.
#[derive(Clone, Copy)]
struct ReplyTo {
    mac: MacAddr,
    to: Endpoint,
    /// When the worker opened the request's packet (CLOCK_MONOTONIC ns):
    /// its latency, reported to iokerneld's metrics, counts from here.
    arrived_ns: u64,
}

/// A request context that yielded, waiting for iokerneld to run it again.
struct Waiting {
    uthread: URef,
    handle: JoinHandle<Vec<u8>>,
    reply: ReplyTo,
}

/// What the workers share.
struct Serving {
    handler: Arc<Handler>,
    port: u16,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    waiting: SpinLock<HashMap<u64, Waiting>>,
    counters: Counters,
}

/// Serves UDP requests on `config.port` with `handler`, each in its own
/// request context, dispatched by iokerneld, until `stop` is set (checked
/// every millisecond) or iokerneld goes away.
pub fn serve<H>(
    config: DispatchedConfig,
    handler: H,
    stop: &AtomicBool,
) -> Result<DispatchedReport, RuntimeError>
where
    H: Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static,
{
    if config.iokernel.net.is_none() {
        return Err(ConfigError::Policy(
            "dispatch by iokerneld needs a network interface (IokernelConfig::net)".into(),
        )
        .into());
    }
    if config.max_in_flight == 0 {
        return Err(ConfigError::Policy("max_in_flight must be > 0".into()).into());
    }
    let mut iokernel = config.iokernel.clone();
    iokernel.dispatch = Some(config.dispatch.clone());
    let plan = Config {
        kthreads: config.workers,
        cores: None,
        stack_size: config.stack_size,
        spin_before_park: config.idle_spin,
        iokernel: Some(iokernel.clone()),
        protected: None,
        time_slice: None,
    }
    .plan()?;
    let serving = Arc::new(Serving {
        handler: Arc::new(handler),
        port: config.port,
        max_in_flight: config.max_in_flight,
        in_flight: AtomicUsize::new(0),
        waiting: SpinLock::new(HashMap::new()),
        counters: Counters::default(),
    });
    let body: KthreadBody = {
        let serving = Arc::clone(&serving);
        Arc::new(move |owner: &mut Owner<'_>| run(owner, &serving))
    };
    let started = crate::runtime::start(
        &plan,
        sched::Mode::Worker,
        "ginza-dw",
        Some(&iokernel),
        body,
    )?;
    started.rt.keep_spare_stacks(config.max_in_flight);
    while !stop.load(Acquire) && started.rt.managed() {
        std::thread::sleep(STOP_POLL);
    }
    started.stop();
    let c = &serving.counters;
    Ok(DispatchedReport {
        served: c.served.load(Relaxed),
        preempted: c.preempted.load(Relaxed),
        revoked_mid_request: c.revoked_mid_request.load(Relaxed),
        rejected: c.rejected.load(Relaxed),
        not_for_us: c.not_for_us.load(Relaxed),
        unknown_resumes: c.unknown_resumes.load(Relaxed),
        panicked: c.panicked.load(Relaxed),
        send_errors: c.send_errors.load(Relaxed),
    })
}

/// How often [`serve`]'s caller looks at its stop flag. Each look wakes a
/// thread that, on a machine with few CPUs, takes a spinning worker's or
/// iokerneld's CPU for a moment: rarely, then.
const STOP_POLL: Duration = Duration::from_millis(10);

/// The longest an idle worker waits for iokerneld to read its last
/// hand-back before its idle spin starts anyway (iokerneld is
/// descheduled: its loop reads every dispatched worker's ring each turn).
const MAX_UNREAD_WAIT: Duration = Duration::from_millis(1);

/// A worker kthread's body: runs what iokerneld sends, parks when idle,
/// gives its core back when revoked.
fn run(owner: &mut Owner<'_>, serving: &Serving) {
    let k = owner.kthread();
    let rt = k.rt();
    let Some(io) = &k.io else {
        return; // iokerneld went away before the first grant
    };
    let mut idle_since: Option<Instant> = None;
    // Since when the worker has waited for iokerneld to read its last
    // hand-back (idle, its idle spin not started yet).
    let mut unread_since: Option<Instant> = None;
    while !rt.shutdown.load(Acquire) && rt.managed() {
        if k.revoke_requested.load(Acquire) || io.preempt_pending() {
            // Revoked with no request on us: the core goes back.
            park_with_iokernel(owner, io, true);
            idle_since = None;
            unread_since = None;
            continue;
        }
        // SAFETY: this is the kthread's own body (its owner thread).
        match unsafe { io.next_run() } {
            Some((request, packet)) => {
                idle_since = None;
                unread_since = None;
                serve_one(owner, io, serving, request, packet);
            }
            None => {
                // Frames that are no request (ARP) are the stack's.
                sched::poll_net(owner, k);
                // The idle spin counts from when iokerneld has read our
                // last hand-back: only then could it send the next
                // request. Counted from the hand-back, a spin shorter than
                // iokerneld's round trip parked a worker with requests
                // queued for it, and each then waited for a grant
                // (docs/colocate.md, "Several workers"). A ring left
                // unread for `MAX_UNREAD_WAIT` (iokerneld descheduled)
                // starts the spin anyway.
                if idle_since.is_none() {
                    let waited = *unread_since.get_or_insert_with(Instant::now);
                    // SAFETY: this is the kthread's own body.
                    if !unsafe { io.sent_all_read() } && waited.elapsed() < MAX_UNREAD_WAIT {
                        std::hint::spin_loop();
                        continue;
                    }
                    unread_since = None;
                }
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= rt.spin {
                    // A `Run` sent after our look crosses our `Parked`:
                    // iokerneld queues it again (docs/colocate.md).
                    park_with_iokernel(owner, io, false);
                    idle_since = None;
                    unread_since = None;
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

fn hand_back(owner: &Owner<'_>, request: u64, completed: bool) {
    owner.send_to_iokernel(ToIokernel::HandBack { request, completed });
}

/// A new request's payload and where its reply goes; the packet's buffer
/// is given back. `None` (counted) if it is not for us.
fn open_packet(
    owner: &mut Owner<'_>,
    serving: &Serving,
    p: RunPacket,
) -> Option<(Vec<u8>, ReplyTo)> {
    let rt = owner.kthread().rt();
    let stack = crate::net::stack_of(rt)?;
    let desc = PacketDesc {
        buf: p.buf,
        len: p.len.into(),
        ..Default::default()
    };
    let parsed = stack
        .lent_frame(desc)
        .and_then(|frame| match parse(frame, &stack.iface) {
            Ok(Packet::Udp(d)) if d.dst.port == serving.port => Some((
                d.payload.to_vec(),
                ReplyTo {
                    mac: d.src_mac,
                    to: d.src,
                    arrived_ns: ginza_sys::clock::monotonic_ns(),
                },
            )),
            _ => None,
        });
    if let Some(mut me) = owner.tx_side() {
        stack.give_back(&mut me, p.buf);
    } else {
        stack.give_back_later(p.buf);
    }
    if parsed.is_none() {
        serving.counters.not_for_us.fetch_add(1, Relaxed);
    }
    parsed
}

/// Runs request `request` (new with `packet`, else preempted and held
/// here) until it completes or yields, and hands it back.
fn serve_one(
    owner: &mut Owner<'_>,
    io: &KLink,
    serving: &Serving,
    request: u64,
    packet: Option<RunPacket>,
) {
    let c = &serving.counters;
    let rt_ptr: *const sched::Shared = owner.kthread().rt();
    let (mut uthread, handle, reply) = match packet {
        Some(p) => {
            let Some((payload, reply)) = open_packet(owner, serving, p) else {
                return hand_back(owner, request, true);
            };
            if serving.in_flight.load(Relaxed) >= serving.max_in_flight {
                c.rejected.fetch_add(1, Relaxed);
                // Counted by iokerneld too (its stats reply).
                return owner.send_to_iokernel(ToIokernel::Refused { request });
            }
            serving.in_flight.fetch_add(1, Relaxed);
            let handler = Arc::clone(&serving.handler);
            let (u, h) = unqueued(rt_ptr, move || handler(&payload));
            (u, h, reply)
        }
        None => match serving.waiting.lock().remove(&request) {
            Some(w) => (w.uthread, w.handle, w.reply),
            None => {
                c.unknown_resumes.fetch_add(1, Relaxed);
                return hand_back(owner, request, true);
            }
        },
    };
    loop {
        // Its quantum counts from here (docs/colocate.md).
        io.line.set_running_request(Some(request));
        let stopped = sched::run_on_worker(owner, uthread);
        io.line.set_running_request(None);
        match stopped {
            Stopped::Exited => {
                // An ask for this request that came as it completed must
                // not stop the one pre-assigned behind it, which starts
                // next without iokerneld clearing the flag first.
                if io.line.flags().contains(LineFlags::YIELD_REQUEST) {
                    io.line.remove_flags(LineFlags::YIELD_REQUEST);
                }
                serving.in_flight.fetch_sub(1, Relaxed);
                match handle.join() {
                    Ok(bytes) => {
                        if send_reply(owner, serving, reply, &bytes) {
                            // The kthread's own body: its histogram's
                            // only writer.
                            let now = ginza_sys::clock::monotonic_ns();
                            io.latency.record(now.saturating_sub(reply.arrived_ns));
                        }
                    }
                    Err(_) => {
                        c.panicked.fetch_add(1, Relaxed);
                    }
                }
                c.served.fetch_add(1, Relaxed);
                return hand_back(owner, request, true);
            }
            Stopped::Yielded => {
                let revoked = io.preempt_pending();
                io.line.remove_flags(LineFlags::YIELD_REQUEST);
                c.preempted.fetch_add(1, Relaxed);
                if revoked {
                    c.revoked_mid_request.fetch_add(1, Relaxed);
                }
                serving.waiting.lock().insert(
                    request,
                    Waiting {
                        uthread,
                        handle,
                        reply,
                    },
                );
                // A request pre-assigned behind this one is taken back
                // by iokerneld as it reads the hand-back.
                // SAFETY: this is the kthread's own body.
                unsafe { io.handing_back_preempted() };
                // Handed back before the core goes (the loop parks next).
                return hand_back(owner, request, false);
            }
            Stopped::Blocked => {
                // The request waits (a lock, a sleep): it stays this
                // worker's until it is woken (iokerneld sees it running).
                uthread = wait_until_woken(owner, uthread);
            }
        }
    }
}

/// Waits for a blocked request context to be woken (its waker or its
/// timer puts it on the runtime's shared queue) and returns it.
fn wait_until_woken(owner: &Owner<'_>, u: URef) -> URef {
    let k = owner.kthread();
    let rt = k.rt();
    let want = u.ptr();
    loop {
        for other in rt.kthreads.iter() {
            sched::fire_timers_to_dispatcher(other);
        }
        match rt.injector.steal() {
            Steal::Success(x) if x.ptr() == want => return x,
            // Another worker's request: left for it.
            Steal::Success(x) => rt.injector.push(x),
            Steal::Empty | Steal::Retry => std::hint::spin_loop(),
        }
    }
}

/// Sends a request's reply; whether it went.
fn send_reply(owner: &mut Owner<'_>, serving: &Serving, reply: ReplyTo, bytes: &[u8]) -> bool {
    let rt = owner.kthread().rt();
    let sent = match (crate::net::stack_of(rt), owner.tx_side()) {
        (Some(stack), Some(mut me)) => stack
            .send_udp_to(&mut me, reply.mac, serving.port, reply.to, bytes)
            .is_ok_and(|s| matches!(s, crate::net::Sent::Now)),
        _ => false,
    };
    if !sent {
        serving.counters.send_errors.fetch_add(1, Relaxed);
    }
    sent
}
