//! The runtime's end of the shared region with iokerneld (docs/design.md,
//! "Shared memory between iokerneld and a runtime"): registration, each
//! kthread's queue line and command rings ([`KLink`]), the grant latencies
//! it observes, and its packet rings ([`KNet`], used through [`TxSide`]).
//! Below the scheduler (a `KThread` holds its `KLink`): it imports neither
//! `sched` nor `net`; parking under iokerneld is `iokernel.rs`, the packet
//! stack `net/`, which the scheduler polls through [`PacketStack`].

use std::any::Any;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use ginza_net::DropCounters;
use ginza_proto::client::{self, Connection};
use ginza_proto::messages::Registration;
use ginza_shm::{
    CmdRx, CmdTx, Consumer, EgressBuffers, IngressPool, IokernelBell, LatencyRef, LineFlags,
    LineRef, PacketDesc, Producer, Region, RegionConfig, RuntimeEnd, ToIokernel, ToKthread,
    WakePage,
};

use crate::config::{IokernelConfig, NetConfig};
use crate::own_socket::OwnSocket;
use crate::spinlock::SpinLock;

/// Frames one poll of one ring processes at most: bounds the time a kthread
/// spends in its scheduler before looking at its runqueue again.
pub(crate) const POLL_BATCH: usize = 32;

/// The packet stack as the scheduler sees it: `net::Stack` implements it,
/// so `sched` polls packet rings without importing `net` (which parks and
/// wakes uthreads, above the scheduler).
pub(crate) trait PacketStack: Any + Send + Sync {
    /// Processes up to `budget` frames of `ring`'s ingress ring as the
    /// kthread whose transmit side is `me` (nothing if another kthread is
    /// processing it); the frames taken.
    fn poll(&self, me: &mut TxSide<'_>, ring: &KNet, budget: usize) -> usize;
    /// The earliest deadline the stack's polls must keep (TCP's timers),
    /// if any: a kthread about to sleep wakes for it.
    fn next_deadline(&self) -> Option<std::time::Instant>;
}

/// The protected backend's event rings as the scheduler sees them
/// (`net::protected::Protected` implements it): polled where ingress rings
/// are, so uthreads blocked on a protected socket wake without a thread of
/// their own.
pub(crate) trait EventSource: Any + Send + Sync {
    /// Processes up to `budget` events per ring; the events taken.
    fn poll(&self, budget: usize) -> usize;
    /// Whether events wait (a cheap look, before parking).
    fn pending(&self) -> bool;
}

/// Samples kept per kthread and kind of grant (a bench reads them).
const MAX_SAMPLES: usize = 1 << 20;

/// Decision → running latencies of the grants one kthread received.
#[derive(Default)]
pub(crate) struct GrantSamples {
    /// The kthread was blocked on its eventfd.
    pub(crate) from_blocked: Vec<u32>,
    /// The kthread was still lingering after `Parked`.
    pub(crate) while_lingering: Vec<u32>,
}

/// One kthread's end of the shared region.
pub(crate) struct KLink {
    pub(crate) line: LineRef,
    /// Its request-latency histogram: written by the uthreads it runs,
    /// with preemption deferred (`crate::metrics`).
    pub(crate) latency: LatencyRef,
    /// Owner kthread only.
    tx: UnsafeCell<CmdTx<ToIokernel>>,
    /// Owner kthread only.
    rx: UnsafeCell<CmdRx<ToKthread>>,
    pub(crate) samples: Mutex<GrantSamples>,
    /// The packet rings, with networking.
    pub(crate) net: Option<KNet>,
    /// Owner kthread only. Dispatch by iokerneld (docs/colocate.md): the
    /// `Run`s read since the last `Wake` (those read before it are stale),
    /// each with whether it was pre-assigned (`RunNext`).
    runs: UnsafeCell<std::collections::VecDeque<(Run, bool)>>,
    /// Owner kthread only: the kthread handed a request back preempted,
    /// and has read no plain `Run` since: a `RunNext` read now was
    /// pre-assigned behind that request, and iokerneld takes it back when
    /// it reads the hand-back (docs/colocate.md, "Pre-assignment").
    drop_pre_assigned: UnsafeCell<bool>,
    /// The last grant this kthread ran after: iokerneld's decision and the
    /// kthread running, CLOCK_MONOTONIC ns (0: none yet). Written by the
    /// owner kthread, read by the uthreads it runs ([`crate::last_wake`]).
    pub(crate) last_wake: [AtomicU64; 2],
    /// Owner kthread only: the kthread gave its core back (or never had
    /// one) and has read no `Wake` since: every `Run` read now crossed its
    /// `Parked`/`Yielded` and iokerneld has queued it again.
    awaiting_wake: UnsafeCell<bool>,
    /// The kthread sleeps on its slot of the wake page (so
    /// `Shared::wake_page_sleepers` must wake it there).
    pub(crate) sleeping_on_page: AtomicBool,
    /// Owner kthread only: the number of the last `Wake` read — the grant
    /// the kthread runs under, which its next `Parked`/`Yielded` answers
    /// (0 before the first: iokerneld's first grant is 1).
    grant: UnsafeCell<u16>,
    /// The application's bell: rung after work made visible to iokerneld
    /// while its line says it sleeps (docs/iokernel-idle.md).
    bell: Arc<IokernelBell>,
}

/// A request iokerneld runs on a kthread (dispatch by iokerneld,
/// docs/colocate.md): its id, and its packet when it is new.
pub(crate) type Run = (u64, Option<ginza_shm::RunPacket>);

// SAFETY: `tx`/`rx` are used only by the owning kthread's thread (callers'
// contract on every method that touches them); the line is atomics.
unsafe impl Sync for KLink {}

impl KLink {
    /// Sends a command to iokerneld. A full or corrupt ring is reported;
    /// iokerneld disconnects a runtime whose ring is corrupt, and the
    /// watcher then falls back to standalone mode.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn send(&self, m: ToIokernel) {
        // SAFETY: owner-only (caller's contract).
        if let Err(e) = unsafe { &mut *self.tx.get() }.send(m) {
            log::warn!("command {m:?} to iokerneld not sent: {e}");
        }
        self.wake_iokernel();
    }

    /// Whether the command ring to iokerneld has at least half its
    /// capacity free (`self_wake.rs`: a kthread that wakes itself sends a
    /// command per wake and per park, and iokerneld's loop may not run for
    /// a while; past half, it waits for iokerneld's grants instead).
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn commands_half_free(&self) -> bool {
        // SAFETY: owner-only (caller's contract).
        let tx = unsafe { &mut *self.tx.get() }.raw();
        let capacity = tx.capacity();
        tx.free().is_ok_and(|free| free >= capacity / 2)
    }

    /// After making work visible to iokerneld (a command sent, a runqueue
    /// push counted on the line): wakes it if it said it sleeps. While it
    /// is awake, a fence and one load of this kthread's own line.
    #[inline]
    pub(crate) fn wake_iokernel(&self) {
        self.bell.ring_if_asleep(&self.line);
    }

    /// Drains iokerneld's commands; returns the decision time of the last
    /// `Wake`. `Preempt` messages need no action here: the queue line's
    /// `PREEMPT_PENDING` flag (and the signal) carry the request, and a
    /// `Preempt` read while parked is stale.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn drain(&self) -> Option<u64> {
        // SAFETY: owner-only (caller's contract).
        let rx = unsafe { &mut *self.rx.get() };
        // SAFETY: owner-only (caller's contract).
        let runs = unsafe { &mut *self.runs.get() };
        // SAFETY: owner-only (caller's contract).
        let awaiting_wake = unsafe { &mut *self.awaiting_wake.get() };
        // SAFETY: owner-only (caller's contract).
        let drop_pre_assigned = unsafe { &mut *self.drop_pre_assigned.get() };
        let mut decided = None;
        loop {
            match rx.recv() {
                Ok(Some(ToKthread::Wake {
                    decided_ns, grant, ..
                })) => {
                    decided = Some(decided_ns);
                    // SAFETY: owner-only (caller's contract).
                    unsafe { *self.grant.get() = grant };
                    // Runs read before a Wake crossed our Parked/Yielded:
                    // iokerneld has queued them again (docs/colocate.md).
                    runs.clear();
                    *awaiting_wake = false;
                    *drop_pre_assigned = false;
                }
                // Stale: it crossed our Parked/Yielded (even when a wake
                // came with no `Wake` read, as after a full ring).
                Ok(Some(ToKthread::Run { .. } | ToKthread::RunNext { .. })) if *awaiting_wake => {}
                Ok(Some(ToKthread::Run { request, packet })) => {
                    // Sent after iokerneld read our last hand-back.
                    *drop_pre_assigned = false;
                    runs.push_back(((request, packet), false));
                }
                // Pre-assigned behind a request we handed back preempted:
                // taken back.
                Ok(Some(ToKthread::RunNext { .. })) if *drop_pre_assigned => {}
                Ok(Some(ToKthread::RunNext { request, packet })) => {
                    runs.push_back(((request, packet), true));
                }
                Ok(Some(ToKthread::Preempt { .. })) => {}
                Ok(None) => return decided,
                Err(e) => {
                    log::warn!("iokerneld's command ring: {e}");
                    return decided;
                }
            }
        }
    }

    /// Whether iokerneld has read every command this kthread sent (its
    /// last hand-back included): from then on, what it had to send back
    /// (the next `Run`) is on its way. A corrupt ring says yes.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn sent_all_read(&self) -> bool {
        // SAFETY: owner-only (caller's contract).
        let ring = unsafe { &mut *self.tx.get() }.raw();
        let capacity = ring.capacity();
        ring.free().map_or(true, |free| free == capacity)
    }

    /// The number of the last `Wake` read.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn last_grant(&self) -> u16 {
        // SAFETY: owner-only (caller's contract).
        unsafe { *self.grant.get() }
    }

    /// The kthread is about to give its core back (`Parked`/`Yielded`):
    /// `Run`s it has read and not started, and those it reads until its
    /// next `Wake`, are stale (iokerneld queues them again when it reads
    /// the `Parked`/`Yielded`, docs/colocate.md). Returns the grant the
    /// `Parked`/`Yielded` answers (the last `Wake`'s number): iokerneld
    /// ignores one that answers a grant already answered, as after a
    /// wake-up that was no grant.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn expect_wake(&self) -> u16 {
        // SAFETY: owner-only (caller's contract).
        unsafe { &mut *self.runs.get() }.clear();
        // SAFETY: owner-only (caller's contract).
        unsafe { *self.awaiting_wake.get() = true };
        // SAFETY: owner-only (caller's contract).
        unsafe { *self.grant.get() }
    }

    /// The next request iokerneld runs on this kthread (dispatch by
    /// iokerneld), if one has been sent since its last `Wake`.
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn next_run(&self) -> Option<Run> {
        // SAFETY: owner-only (caller's contract).
        let queued = unsafe { &mut *self.runs.get() }.pop_front();
        if let Some((run, _)) = queued {
            return Some(run);
        }
        // SAFETY: owner-only (caller's contract).
        unsafe { self.drain() };
        // SAFETY: owner-only (caller's contract).
        unsafe { &mut *self.runs.get() }
            .pop_front()
            .map(|(run, _)| run)
    }

    /// The kthread is about to hand its request back preempted: a request
    /// pre-assigned behind it (`RunNext`), read or not, is dropped —
    /// iokerneld takes it back when it reads the hand-back, and the
    /// policy chooses again (docs/colocate.md, "Pre-assignment").
    ///
    /// # Safety
    /// Owner kthread only.
    pub(crate) unsafe fn handing_back_preempted(&self) {
        // SAFETY: owner-only (caller's contract).
        unsafe { &mut *self.runs.get() }.retain(|&(_, pre_assigned)| !pre_assigned);
        // SAFETY: owner-only (caller's contract).
        unsafe { *self.drop_pre_assigned.get() = true };
    }

    /// iokerneld asks the running request to yield: its quantum is spent
    /// (dispatch by iokerneld), or the core is being revoked.
    pub(crate) fn yield_asked(&self) -> bool {
        let f = self.line.flags();
        f.contains(LineFlags::YIELD_REQUEST) || f.contains(LineFlags::PREEMPT_PENDING)
    }

    pub(crate) fn preempt_pending(&self) -> bool {
        self.line.flags().contains(LineFlags::PREEMPT_PENDING)
    }

    pub(crate) fn record(&self, latency_ns: u64, lingering: bool) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let v = if lingering {
            &mut s.while_lingering
        } else {
            &mut s.from_blocked
        };
        if v.len() < MAX_SAMPLES {
            v.push(latency_ns.min(u32::MAX as u64) as u32);
        }
    }
}

/// The runtime-wide part: the region and the registration.
pub(crate) struct Link {
    pub(crate) cfg: IokernelConfig,
    pub(crate) region: Region,
    /// CLOCK_MONOTONIC ns at the runtime's epoch (timers are kept relative
    /// to the epoch; iokerneld speaks CLOCK_MONOTONIC).
    pub(crate) monotonic_at_epoch: u64,
    pub(crate) conn: Mutex<Option<Connection>>,
    /// The network stack, once iokerneld has sent the ingress pool.
    pub(crate) net: OnceLock<Box<dyn PacketStack>>,
    /// The application's own AF_XDP socket, on the direct path
    /// (`NetConfig::direct`), once iokerneld has taken it.
    pub(crate) own_socket: OnceLock<Arc<OwnSocket>>,
    /// iokerneld's wake page and kthread 0's slot, once registered with
    /// `IokernelConfig::wake_page` (docs/runtime.md, "Local wakes").
    wake: OnceLock<(WakePage, u32)>,
    /// The bell every kthread's link rings (sent at registration).
    bell: Arc<IokernelBell>,
    /// Whether iokerneld's allocator reads the kthreads' busy time
    /// (`KThread::publish_busy`); kept until registration says otherwise.
    pub(crate) busy_time: AtomicBool,
}

impl Link {
    /// Creates the shared region for `n` kthreads and each kthread's end.
    pub(crate) fn new(
        cfg: &IokernelConfig,
        n: usize,
        epoch: Instant,
    ) -> Result<(Link, Vec<KLink>), String> {
        let n32 = u32::try_from(n).map_err(|_| format!("{n} kthreads are too many"))?;
        if let Some(net) = &cfg.net {
            net.check()?;
        }
        let region = Region::create(&cfg.name, &RegionConfig::new(n32))
            .map_err(|e| format!("cannot create the shared region: {e}"))?;
        let bell = Arc::new(
            IokernelBell::new().map_err(|e| format!("cannot create iokerneld's bell: {e}"))?,
        );
        let mut ends = Vec::with_capacity(n);
        for k in 0..n32 {
            let RuntimeEnd {
                line,
                latency,
                to_iokernel,
                from_iokernel,
                ingress,
                done,
                egress,
                egress_buffers,
            } = region
                .runtime_end(k)
                .map_err(|e| format!("shared region, kthread {k}: {e}"))?;
            line.insert_flags(LineFlags::PARKED);
            ends.push(KLink {
                line,
                latency,
                tx: UnsafeCell::new(to_iokernel),
                rx: UnsafeCell::new(from_iokernel),
                samples: Mutex::new(GrantSamples::default()),
                runs: UnsafeCell::new(std::collections::VecDeque::new()),
                last_wake: [AtomicU64::new(0), AtomicU64::new(0)],
                // Every kthread starts parked: its first grant sends a Wake.
                awaiting_wake: UnsafeCell::new(true),
                drop_pre_assigned: UnsafeCell::new(false),
                grant: UnsafeCell::new(0),
                sleeping_on_page: AtomicBool::new(false),
                bell: Arc::clone(&bell),
                net: cfg
                    .net
                    .is_some()
                    .then(|| KNet::new(ingress, done, egress, egress_buffers)),
            });
        }
        let monotonic_at_epoch =
            ginza_sys::clock::monotonic_ns().saturating_sub(epoch.elapsed().as_nanos() as u64);
        Ok((
            Link {
                cfg: cfg.clone(),
                region,
                monotonic_at_epoch,
                conn: Mutex::new(None),
                net: OnceLock::new(),
                own_socket: OnceLock::new(),
                wake: OnceLock::new(),
                bell,
                busy_time: AtomicBool::new(true),
            },
            ends,
        ))
    }

    /// Registers with iokerneld, passing the region and the eventfds; with
    /// networking, `make_stack` builds the stack on the ingress pool
    /// iokerneld sends (`net::Stack`, from above this module), and on the
    /// direct path the application's own socket, handed to iokerneld first.
    pub(crate) fn register<F: AsFd>(
        &self,
        eventfds: &[F],
        make_stack: impl FnOnce(&NetConfig, IngressPool, Option<Arc<OwnSocket>>) -> Box<dyn PacketStack>,
    ) -> Result<u64, String> {
        let socket = match &self.cfg.socket {
            Some(p) => p.clone(),
            None => client::default_socket_path(),
        };
        let n = eventfds.len() as u32;
        let mut fds: Vec<_> = eventfds.iter().map(|e| e.as_fd()).collect();
        fds.push(self.bell.as_fd());
        let reg = Registration {
            name: self.cfg.name.clone(),
            class: self.cfg.class,
            guaranteed: self.cfg.guaranteed,
            max_cores: self.cfg.max_cores.unwrap_or(n),
            kthreads: n,
            net: self.cfg.net.as_ref().map(|c| c.interface),
            steering: self.cfg.steering.map(|s| s.name().to_string()),
            dispatch: self.cfg.dispatch.clone(),
            wake_page: self.cfg.wake_page,
            bell: true,
        };
        let mut conn = client::register_region(&socket, &reg, &self.region, &fds)
            .map_err(|e| e.to_string())?;
        let id = conn.app_id();
        self.busy_time.store(conn.reads_busy_time(), Relaxed);
        if let Some(net) = &self.cfg.net {
            let pool = conn.take_ingress_pool().ok_or_else(|| {
                format!(
                    "iokerneld at {} accepted {:?} with networking ({} {}) but sent no ingress pool \
                     (an iokerneld without a dataplane?)",
                    socket.display(),
                    self.cfg.name,
                    net.interface.mac,
                    net.interface.ip
                )
            })?;
            let own = match &net.direct {
                None => None,
                Some(direct) => {
                    let own = OwnSocket::open(direct)?;
                    own.with_fd(|fd| conn.attach_direct_socket(direct.queue, fd))
                        .expect("a socket just opened")
                        .map_err(|e| format!("direct path: {e}"))?;
                    let own = Arc::new(own);
                    // Set once: `register` runs once per runtime.
                    let _ = self.own_socket.set(Arc::clone(&own));
                    Some(own)
                }
            };
            // Set once: `register` runs once per runtime.
            let _ = self.net.set(make_stack(net, pool, own));
        }
        if let Some(wake) = conn.take_wake_page() {
            let _ = self.wake.set(wake);
        }
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
        Ok(id)
    }

    /// The wake page and kthread `k`'s slot on it, if iokerneld sent one.
    pub(crate) fn wake_slot(&self, k: usize) -> Option<(&WakePage, u32)> {
        self.wake
            .get()
            .map(|(page, first)| (page, first + k as u32))
    }

    /// A second descriptor of the connection to iokerneld, to wait for its
    /// hang-up on (`None` once deregistered).
    pub(crate) fn connection_fd(&self) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        self.conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.socket_clone())
    }

    /// Deregisters (closing the socket gives the cores back) and closes
    /// the own socket, which frees its queue for the next application
    /// even if a uthread left blocked keeps this runtime alive. Once no
    /// kthread runs.
    pub(crate) fn deregister(&self) {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(own) = self.own_socket.get() {
            own.retire();
        }
    }

    /// A deadline relative to the epoch, in iokerneld's clock.
    pub(crate) fn to_monotonic(&self, since_epoch_ns: u64) -> Option<u64> {
        (since_epoch_ns != u64::MAX).then(|| self.monotonic_at_epoch.saturating_add(since_epoch_ns))
    }
}

// ---- a kthread's packet rings ----------------------------------------------

/// One kthread's counters, written only by that kthread.
#[derive(Default)]
pub(crate) struct KNetCounters {
    pub(crate) rx_packets: AtomicU64,
    pub(crate) rx_stolen: AtomicU64,
    pub(crate) tx_packets: AtomicU64,
    pub(crate) tx_ring_full: AtomicU64,
    pub(crate) udp_delivered: AtomicU64,
    pub(crate) udp_no_socket: AtomicU64,
    pub(crate) udp_queue_full: AtomicU64,
    pub(crate) bad_descriptors: AtomicU64,
    pub(crate) arp_replies: AtomicU64,
    pub(crate) icmp_echo_replies: AtomicU64,
}

/// The owner-only transmit side of a kthread.
pub(crate) struct KTx {
    pub(crate) done: Producer<u32>,
    pub(crate) egress: Producer<PacketDesc>,
    pub(crate) buffers: EgressBuffers,
    /// A corrupt ring was reported once already.
    pub(crate) corrupt_said: bool,
}

/// One kthread's packet rings.
pub(crate) struct KNet {
    /// Received frames; try-locked by whoever processes them.
    pub(crate) ingress: SpinLock<Consumer<PacketDesc>>,
    pub(crate) ingress_corrupt_said: AtomicBool,
    /// Owner kthread only, preemption deferred (see [`KNet::tx`]).
    tx: UnsafeCell<KTx>,
    pub(crate) counters: KNetCounters,
    /// Written by the owner only; locked by readers of the stats.
    pub(crate) drops: SpinLock<DropCounters>,
    /// The application's own socket (the direct path): frames this
    /// kthread sends leave there instead of on its egress ring.
    pub(crate) own_socket: OnceLock<Arc<OwnSocket>>,
}

// SAFETY: `tx` is reached only through a `TxSide`, whose constructor's
// contract gives one context at a time exclusive use (the owner kthread,
// with preemption deferred); everything else is atomics or behind locks.
unsafe impl Sync for KNet {}

/// Exclusive use of one kthread's transmit side (its done and egress
/// producers) for as long as it lives. Made by the kthread's owner token
/// (`sched::Owner::tx_side`) or by a single-threaded test harness; the
/// stack's receive and transmit code takes one, so it is safe code.
/// `!Send`: it stays in the context that made it.
pub(crate) struct TxSide<'a> {
    knet: &'a KNet,
    _this_thread_only: PhantomData<*const ()>,
}

impl<'a> TxSide<'a> {
    /// # Safety
    /// While the value lives no other context and no other `TxSide` uses
    /// `knet`'s transmit side: the caller is its kthread's owner with
    /// preemption deferred, or the only thread using `knet`.
    pub(crate) unsafe fn new(knet: &'a KNet) -> TxSide<'a> {
        TxSide {
            knet,
            _this_thread_only: PhantomData,
        }
    }

    pub(crate) fn tx(&mut self) -> &mut KTx {
        // SAFETY: exclusive per `new`'s contract; `&mut self` makes this
        // the only borrow of it at a time.
        unsafe { &mut *self.knet.tx.get() }
    }
}

impl std::ops::Deref for TxSide<'_> {
    type Target = KNet;
    fn deref(&self) -> &KNet {
        self.knet
    }
}

impl KNet {
    pub(crate) fn new(
        ingress: Consumer<PacketDesc>,
        done: Producer<u32>,
        egress: Producer<PacketDesc>,
        buffers: EgressBuffers,
    ) -> KNet {
        KNet {
            ingress: SpinLock::new(ingress),
            ingress_corrupt_said: AtomicBool::new(false),
            tx: UnsafeCell::new(KTx {
                done,
                egress,
                buffers,
                corrupt_said: false,
            }),
            counters: KNetCounters::default(),
            drops: SpinLock::new(DropCounters::default()),
            own_socket: OnceLock::new(),
        }
    }

    /// Whether frames wait on this kthread's ingress ring. A ring someone
    /// is processing right now counts as non-empty: its holder may leave
    /// part of it, and an idle kthread must look again rather than park.
    pub(crate) fn ingress_pending(&self) -> bool {
        let own = self.own_socket.get().is_some_and(|o| o.rx_pending());
        own || match self.ingress.try_lock() {
            Some(mut c) => c.len().is_ok_and(|n| n > 0),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use ginza_shm::{RunPacket, ToIokernel, ToKthread};

    use super::Link;
    use crate::config::{Class, IokernelConfig};

    fn run(request: u64) -> ToKthread {
        ToKthread::Run {
            request,
            packet: Some(RunPacket { buf: 1, len: 60 }),
        }
    }

    fn wake(grant: u16) -> ToKthread {
        ToKthread::Wake {
            core: 0,
            decided_ns: 1,
            grant,
        }
    }

    /// Dispatch by iokerneld (docs/colocate.md, "The worker state
    /// machine"): `Run`s read between the kthread's `Parked` and its next
    /// `Wake` crossed the park and are dropped, even when the wake comes
    /// with no `Wake` read; those after the `Wake` are kept.
    #[test]
    fn runs_before_the_next_wake_are_stale() {
        let cfg = IokernelConfig::new("klink-runs-test", Class::LatencyCritical);
        let (link, ks) = Link::new(&cfg, 1, Instant::now()).unwrap();
        let k = &ks[0];
        let mut io = link.region.iokernel_end(0).unwrap();
        // A new kthread waits for its first grant: a Run before it is stale.
        io.to_kthread.send(run(1)).unwrap();
        io.to_kthread.send(wake(1)).unwrap();
        io.to_kthread.send(run(2)).unwrap();
        // SAFETY: the test is the only user of this kthread's end.
        unsafe {
            assert_eq!(k.next_run().map(|r| r.0), Some(2));
            assert_eq!(k.next_run(), None);
            // Running: Runs are kept.
            io.to_kthread.send(run(3)).unwrap();
            assert_eq!(k.next_run().map(|r| r.0), Some(3));
            // It parks; a Run crosses the Parked; it wakes with no Wake
            // read (its grant's Wake did not fit the ring).
            io.to_kthread.send(run(4)).unwrap();
            assert_eq!(k.expect_wake(), 1, "the park answers grant 1");
            assert_eq!(k.next_run(), None, "crossed its park");
            io.to_kthread.send(run(5)).unwrap();
            assert_eq!(k.next_run(), None, "still no Wake");
            io.to_kthread.send(wake(2)).unwrap();
            io.to_kthread.send(run(6)).unwrap();
            assert_eq!(k.next_run().map(|r| r.0), Some(6));
            assert_eq!(k.expect_wake(), 2, "the next park answers grant 2");
        }
    }

    /// An idle worker's spin starts when iokerneld has read its last
    /// hand-back (docs/colocate.md, "Several workers").
    #[test]
    fn the_kthread_sees_when_iokerneld_has_read_its_commands() {
        let cfg = IokernelConfig::new("klink-read-test", Class::LatencyCritical);
        let (link, ks) = Link::new(&cfg, 1, Instant::now()).unwrap();
        let k = &ks[0];
        let mut io = link.region.iokernel_end(0).unwrap();
        // SAFETY: the test is the only user of this kthread's end.
        unsafe {
            assert!(k.sent_all_read());
            k.send(ToIokernel::HandBack {
                request: 7,
                completed: true,
            });
            assert!(!k.sent_all_read());
        }
        assert!(matches!(
            io.from_kthread.recv(),
            Ok(Some(ToIokernel::HandBack { request: 7, .. }))
        ));
        // SAFETY: as above.
        assert!(unsafe { k.sent_all_read() });
    }
}
