//! Dispatch by iokerneld (docs/colocate.md): the Shinjuku dispatch step of
//! the applications that ask for it, run on iokerneld's own core.
//!
//! iokerneld already steers every request packet and sees every kthread,
//! so it keeps such an application's request queues (the policy crate's
//! [`ColocatedDispatcher`], which the simulator runs too): a UDP request
//! for the application is held, not put on an ingress ring; an idle worker
//! kthread that holds a core gets it by [`ToKthread::Run`] on its command
//! ring (the packet's buffer named in the command), or gets a preempted
//! request back by its id alone — the request contexts stay in the
//! application, where any of its kthreads can resume them. A request past
//! its quantum while others wait is asked to yield through the worker's
//! queue line ([`LineFlags::YIELD_REQUEST`]); workers hand requests back
//! with [`ginza_shm::ToIokernel::HandBack`].
//!
//! A request asked to yield that has not `backstop_ns` later (it reached
//! no preemption point, or its worker lost the CPU before it read the
//! flag) gets a signal, as a revocation's ([`Action::Signal`], counted);
//! the runtime's handler yields it while the flag stands.
//!
//! Hand-backs are untrusted: one that names a request the kthread does not
//! run is refused and counted; an application that keeps lying is
//! disconnected.
//!
//! With pre-assignment ([`ColocatedDispatcher::with_pre_assign`]) a busy
//! worker may also get the next request ahead ([`ToKthread::RunNext`]),
//! which it starts as soon as it hands its request back completed; a
//! preempted hand-back takes it back (the worker drops it), and so does
//! the worker's `Parked`/`Yielded`, as for a `Run`.
//!
//! A `Run` can cross the kthread's `Parked`/`Yielded` on the rings (the
//! kthread found its command ring empty, then iokerneld sent the `Run`).
//! The kthread reads nothing more until its next `Wake`, so such a `Run`
//! is unread: iokerneld queues the request again exactly as it was (its
//! packet, or its preempted context), and the kthread drops every `Run`
//! it reads before that `Wake` (stale by this rule). A revocation thus
//! never strands a request nor runs one twice.

use ginza_policy::sched::colocated::{Action, ColocatedDispatcher, HandBack};
use ginza_policy::sched::{Request, SchedPolicy};
use ginza_proto::messages::{DispatchStats, SojournBand};
use ginza_shm::{
    IokernelEnd, LineFlags, PacketDesc, RunPacket, SendError, ToKthread, MAX_REQUEST_ID,
};

use crate::request_frame::udp_payload;

/// Refused hand-backs an application may send before it is disconnected.
pub(super) const MAX_LIES: u64 = 16;

/// A queued request as iokerneld holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Held {
    /// Not run yet: its packet, in a buffer of the application's ingress
    /// pool lent to nobody yet. `None`: preempted, its context waits in the
    /// application.
    packet: Option<PacketDesc>,
    t: Timing,
}

/// Where a request's time has gone so far, as iokerneld sees it (the
/// breakdown of `ginza bench colocate`, docs/colocate.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Timing {
    arrived_at: u64,
    /// When it was last queued (arrival, hand-back, a `Run` taken back).
    queued_at: u64,
    /// The application's time with no core at `queued_at`.
    no_core_at: u64,
    /// When its last `Run` was sent.
    sent_at: u64,
    /// When its worker was seen running it (0: not yet).
    started_at: u64,
    /// Totals: in a queue; of that, while none of the application's
    /// workers held a core; `Run` sent → seen running; seen running →
    /// handed back (a run that ended before iokerneld saw it start counts
    /// whole here).
    queued: u64,
    no_core: u64,
    pickup: u64,
    on_core: u64,
    runs: u32,
}

/// Sojourn bands of the breakdown: band `i > 0` holds sojourns in
/// [2^i, 2^(i+1)) µs, band 0 those below 2 µs, the last one the rest.
const BANDS: usize = 28;

fn band_of(sojourn_ns: u64) -> usize {
    ((sojourn_ns / 1000).max(1).ilog2() as usize).min(BANDS - 1)
}

/// Counters of one application's dispatch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct DispatchCounters {
    /// Hand-backs refused (unknown or duplicate request).
    pub lies: u64,
    /// `Run`s that crossed their kthread's `Parked`/`Yielded` (queued again).
    pub stale_runs: u64,
    /// Run commands that did not fit the command ring (tried again).
    pub ring_full: u64,
    /// `Run` commands sent (new and resumed requests).
    pub runs: u64,
    /// New requests the application refused unrun (its in-flight bound).
    pub refused: u64,
    /// Backstop signals that could not be sent (no tid yet, or the thread
    /// is gone).
    pub signal_errors: u64,
    /// `Parked`s read while requests were queued (a `Run` taken back
    /// included).
    pub parked_with_queue: u64,
    /// Pre-assigned requests taken back by a preempted hand-back.
    pub pre_dropped: u64,
}

/// One application's dispatch state.
pub(super) struct AppDispatch {
    queues: ColocatedDispatcher<Held>,
    /// c-PRE-MQ's classifier: the class is this byte of the UDP payload.
    class_offset: usize,
    next_request: u64,
    actions: Vec<Action<Held>>,
    /// Per kthread, the request of the last `Run` sent and what it carried,
    /// until it is handed back.
    sent: Vec<Option<(u64, Held)>>,
    /// Per kthread, the request pre-assigned behind it (`RunNext`) and what
    /// it carried, until it moves to `sent` (a completed hand-back) or is
    /// taken back.
    sent_next: Vec<Option<(u64, Held)>>,
    /// Per kthread: a `Wake` is on its command ring since iokerneld last
    /// read its `Parked`/`Yielded` ([`AppDispatch::woken`]). Only then may
    /// it be sent a `Run`: the kthread drops every `Run` it reads before
    /// its next `Wake` (see the module docs), so a `Run` sent to a kthread
    /// granted a core but not woken yet would be dropped while iokerneld
    /// counts it as running there (docs/colocate.md, "Several workers").
    awake: Vec<bool>,
    /// Workers whose request the last step asked to signal (the caller
    /// sends the signals: [`AppDispatch::take_signals`]).
    signals: Vec<usize>,
    /// The application's time with none of its workers holding a core, up
    /// to `last_step`, and whether one held a core then.
    no_core_ns: u64,
    last_step: u64,
    had_core: bool,
    /// Completed requests' time by sojourn band (sums).
    bands: [SojournBand; BANDS],
    pub counters: DispatchCounters,
}

impl AppDispatch {
    pub fn new(
        policy: SchedPolicy,
        workers: usize,
        class_offset: u16,
        backstop_ns: Option<u64>,
        pre_assign: bool,
    ) -> AppDispatch {
        AppDispatch {
            queues: ColocatedDispatcher::new(policy, workers)
                .with_backstop(backstop_ns)
                .with_pre_assign(pre_assign),
            class_offset: class_offset.into(),
            next_request: 0,
            actions: Vec::new(),
            sent: vec![None; workers],
            sent_next: vec![None; workers],
            awake: vec![false; workers],
            signals: Vec::new(),
            no_core_ns: 0,
            last_step: 0,
            had_core: false,
            bands: std::array::from_fn(|i| SojournBand {
                from_ns: if i == 0 { 0 } else { 1000 << i },
                ..SojournBand::default()
            }),
            counters: DispatchCounters::default(),
        }
    }

    /// Its counters, for the stats reply.
    pub fn stats(&self) -> DispatchStats {
        let q = self.queues.stats();
        let c = &self.counters;
        DispatchStats {
            ar: q.arrived,
            ru: c.runs,
            co: q.completed,
            pe: q.preempted,
            rv: q.revoked_mid_request,
            ak: q.preempt_asked,
            bs: q.backstops,
            rf: c.refused,
            tb: c.stale_runs + c.pre_dropped,
            li: c.lies,
            qu: self.queues.queued() as u64,
            pq: c.parked_with_queue,
            pa: q.pre_assigned,
        }
    }

    /// The workers to signal (the backstop) since the last call; the
    /// caller sends the signals and gives the vector back
    /// ([`AppDispatch::signals_sent`]) so that no step allocates.
    pub fn take_signals(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.signals)
    }

    /// The vector of [`AppDispatch::take_signals`], emptied; `failed`
    /// signals could not be sent.
    pub fn signals_sent(&mut self, mut v: Vec<usize>, failed: u64) {
        v.clear();
        self.signals = v;
        self.counters.signal_errors += failed;
    }

    /// Its counters, for a log line when the application leaves.
    pub fn summary(&self) -> String {
        format!("{:?}, {:?}", self.queues.stats(), self.counters)
    }

    /// Requests waiting in the queues (new and preempted).
    pub fn queued(&self) -> usize {
        self.queues.queued()
    }

    /// The queues as (taken, pushed) free-running counters, for congestion
    /// detection (added to kthread 0's runqueue counters).
    pub fn queue_counters(&self) -> (u32, u32) {
        self.queues.queue_counters()
    }

    /// A request packet has arrived (`frame` is its bytes).
    pub fn arrive(&mut self, desc: PacketDesc, frame: &[u8], now: u64) {
        let class = udp_payload(frame)
            .and_then(|p| p.get(self.class_offset))
            .map_or(0, |&c| usize::from(c))
            .min(self.queues.classes() - 1);
        let id = self.next_request;
        self.next_request = (self.next_request + 1) % MAX_REQUEST_ID;
        self.queues.arrive(
            Request {
                id,
                class,
                arrival: now,
                payload: Held {
                    packet: Some(desc),
                    t: Timing {
                        arrived_at: now,
                        queued_at: now,
                        no_core_at: self.no_core_at(now),
                        ..Timing::default()
                    },
                },
            },
            now,
        );
    }

    /// The application's time with no core, up to `now`.
    fn no_core_at(&self, now: u64) -> u64 {
        let since = now.saturating_sub(self.last_step);
        self.no_core_ns + if self.had_core { 0 } else { since }
    }

    /// `t` goes back to a queue at `now`.
    fn requeued(&self, t: &mut Timing, now: u64) {
        t.queued_at = now;
        t.no_core_at = self.no_core_at(now);
    }

    /// Completed requests' time by sojourn band (the non-empty bands).
    pub fn breakdown(&self) -> Vec<SojournBand> {
        self.bands.iter().filter(|b| b.count > 0).copied().collect()
    }

    /// Completed requests' sojourns into `h` (cleared first), each band
    /// counted at its upper end (the last band's is infinite): the
    /// metrics' request latency histogram, without allocating.
    pub fn sojourn_into(&self, h: &mut ginza_metrics::Buckets) {
        h.clear();
        for (i, b) in self.bands.iter().enumerate() {
            let upper = if i + 1 < BANDS {
                1000 << (i + 1)
            } else {
                u64::MAX
            };
            h.add(upper, b.count, b.sojourn_ns);
        }
    }

    /// Kthread `k` refused its new request unrun (over the application's
    /// in-flight bound): done, as a completed one, and counted.
    pub fn refused(&mut self, k: usize, request: u64, now: u64) -> Result<(), String> {
        let lies = self.counters.lies;
        self.hand_back(k, request, true, now)?;
        if self.counters.lies == lies {
            self.counters.refused += 1;
        }
        Ok(())
    }

    /// Kthread `k` says how its request stopped. `Err` with the reason
    /// when the application has lied too often and must be disconnected.
    pub fn hand_back(
        &mut self,
        k: usize,
        request: u64,
        completed: bool,
        now: u64,
    ) -> Result<(), String> {
        let how = if completed {
            HandBack::Completed
        } else {
            HandBack::Preempted
        };
        if !completed && self.queues.running_on(k) == Some(request) {
            // The worker drops the request pre-assigned behind this one:
            // back to the head of its queue before this one is placed.
            if let Some((_, mut held)) = self.sent_next.get_mut(k).and_then(Option::take) {
                held.t.pickup += now.saturating_sub(held.t.sent_at);
                self.requeued(&mut held.t, now);
                if self.queues.take_back_next(k, held).is_some() {
                    self.counters.pre_dropped += 1;
                }
            }
        }
        let mut t = match self.sent.get(k) {
            Some(Some((id, held))) if *id == request => held.t,
            _ => Timing::default(),
        };
        t.on_core += now.saturating_sub(if t.started_at != 0 {
            t.started_at
        } else {
            t.sent_at
        });
        let mut again = t;
        self.requeued(&mut again, now);
        let payload = Held {
            packet: None,
            t: again,
        };
        match self.queues.hand_back(k, request, how, payload, now) {
            Ok(()) => {
                // The worker has started its pre-assigned request, if any.
                self.sent[k] = self.sent_next[k].take();
                if completed && t.arrived_at != 0 {
                    let sojourn = now.saturating_sub(t.arrived_at);
                    let b = &mut self.bands[band_of(sojourn)];
                    b.count += 1;
                    b.sojourn_ns += sojourn;
                    b.queued_ns += t.queued;
                    b.no_core_ns += t.no_core;
                    b.pickup_ns += t.pickup;
                    b.on_core_ns += t.on_core;
                    b.runs += u64::from(t.runs);
                }
                Ok(())
            }
            Err(e) => {
                self.counters.lies += 1;
                log::debug!("dispatch: hand-back refused: {e}");
                if self.counters.lies >= MAX_LIES {
                    Err(format!(
                        "{} refused hand-backs (the last: {e})",
                        self.counters.lies
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Kthread `k` gave its core back (`parked`, or yielded): a request
    /// still on it was sent by a `Run` it never read (see the module
    /// docs), and is queued again as it was.
    pub fn gave_core_back(&mut self, k: usize, parked: bool, now: u64) {
        self.queues.set_granted(k, false);
        if let Some(a) = self.awake.get_mut(k) {
            *a = false;
        }
        // The pre-assigned request first, so that the running one lands
        // ahead of it at the head of the queue.
        if let Some((_, mut held)) = self.sent_next.get_mut(k).and_then(Option::take) {
            held.t.pickup += now.saturating_sub(held.t.sent_at);
            self.requeued(&mut held.t, now);
            if self.queues.take_back_next(k, held).is_some() {
                self.counters.stale_runs += 1;
            }
        }
        if let Some((_, mut held)) = self.sent.get_mut(k).and_then(Option::take) {
            held.t.pickup += now.saturating_sub(held.t.sent_at);
            self.requeued(&mut held.t, now);
            if self.queues.withdraw(k, held).is_some() {
                self.counters.stale_runs += 1;
            }
        }
        if parked && self.queues.queued() > 0 {
            self.counters.parked_with_queue += 1;
        }
    }

    /// A `Wake` has just been put on kthread `k`'s command ring: `Run`s
    /// sent from now on follow it, and the kthread reads them.
    pub fn woken(&mut self, k: usize) {
        if let Some(a) = self.awake.get_mut(k) {
            *a = true;
        }
    }

    /// One dispatch step: `granted[k]` says whether kthread `k` holds a
    /// core; runs queued requests on idle ones that have been sent their
    /// `Wake` ([`AppDispatch::woken`]), asks overrun requests to yield.
    /// Returns the packets that reached the application.
    pub fn step(
        &mut self,
        now: u64,
        granted: impl Iterator<Item = bool>,
        ends: &mut [IokernelEnd],
    ) -> u64 {
        self.no_core_ns = self.no_core_at(now);
        self.last_step = now;
        self.had_core = false;
        for (k, holds) in granted.enumerate() {
            self.had_core |= holds;
            let g = holds && self.awake.get(k).copied().unwrap_or(false);
            self.queues.set_granted(k, g);
            // Quanta count from when the worker says it switched in.
            if let Some(id) = self.queues.running_on(k) {
                if !self.queues.has_started(k) && ends[k].line.runs_request(id) {
                    self.queues.started(k, now);
                    if let Some(Some((_, held))) = self.sent.get_mut(k) {
                        held.t.started_at = now;
                        held.t.pickup += now.saturating_sub(held.t.sent_at);
                    }
                }
            }
        }
        let mut actions = std::mem::take(&mut self.actions);
        self.queues.step(now, &mut actions);
        let mut delivered = 0;
        for action in actions.drain(..) {
            match action {
                Action::Preempt { worker, request_id } => {
                    // Only while the worker shows that request: one that
                    // stopped meanwhile needs no ask, and the worker may
                    // have started its pre-assigned one.
                    let line = &ends[worker].line;
                    if line.runs_request(request_id) {
                        line.insert_flags(LineFlags::YIELD_REQUEST);
                    }
                }
                Action::Signal { worker, .. } => self.signals.push(worker),
                Action::Run { worker, request } => {
                    delivered += self.send_run(now, worker, request, false, ends);
                }
                Action::PreAssign { worker, request } => {
                    delivered += self.send_run(now, worker, request, true, ends);
                }
            }
        }
        self.actions = actions;
        delivered
    }

    /// Sends `request`'s `Run` (or, `pre_assigned`, its `RunNext`) to
    /// `worker`; a command that does not fit the ring puts it back. The
    /// packets that reached the application (0 or 1).
    fn send_run(
        &mut self,
        now: u64,
        worker: usize,
        mut request: Request<Held>,
        pre_assigned: bool,
        ends: &mut [IokernelEnd],
    ) -> u64 {
        let packet = request.payload.packet.map(|d| RunPacket {
            buf: d.buf,
            len: d.len.min(u32::from(u16::MAX)) as u16,
        });
        let no_core = self.no_core_at(now);
        let t = &mut request.payload.t;
        t.queued += now.saturating_sub(t.queued_at);
        t.no_core += no_core.saturating_sub(t.no_core_at);
        t.sent_at = now;
        t.started_at = 0;
        t.runs += 1;
        let end = &mut ends[worker];
        let command = if pre_assigned {
            // The worker's request still runs: an ask for it stands (the
            // worker clears one left when its request completes).
            ToKthread::RunNext {
                request: request.id,
                packet,
            }
        } else {
            // A stale ask for the previous request must not cut this one
            // short.
            end.line.remove_flags(LineFlags::YIELD_REQUEST);
            ToKthread::Run {
                request: request.id,
                packet,
            }
        };
        match end.to_kthread.send(command) {
            Ok(()) => {
                self.counters.runs += 1;
                let slot = if pre_assigned {
                    &mut self.sent_next[worker]
                } else {
                    &mut self.sent[worker]
                };
                *slot = Some((request.id, request.payload));
                u64::from(packet.is_some())
            }
            Err(SendError::Full | SendError::Corrupt(_)) => {
                // A corrupt ring is found by the command drain.
                self.counters.ring_full += 1;
                request.payload.t.runs -= 1;
                self.requeued(&mut request.payload.t, now);
                self.queues.not_started(worker, request);
                0
            }
        }
    }
}

#[cfg(test)]
mod protocol_tests;

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use ginza_net::{tx, Endpoint, Interface, MacAddr};
    use ginza_policy::sched::Placement;
    use ginza_shm::{Region, RegionConfig, ToIokernel};

    use super::*;

    /// A request of `class` (its payload's byte 24), 32 bytes of payload.
    pub(super) fn frame(class: u8) -> Vec<u8> {
        let from = Interface {
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            ip: Ipv4Addr::new(10, 0, 0, 1),
        };
        let to = Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), 2000);
        let mut payload = vec![0u8; 32];
        payload[24] = class;
        let mut out = vec![0u8; 2048];
        let n = tx::udp_datagram(
            &mut out,
            &from,
            MacAddr([2, 0, 0, 0, 0, 2]),
            1000,
            to,
            &payload,
        )
        .expect("fits");
        out.truncate(n);
        out
    }

    #[test]
    fn the_classifier_reads_the_class_byte_of_the_udp_payload() {
        use crate::request_frame::is_request;
        let f = frame(3);
        assert_eq!(udp_payload(&f).map(|p| p.len()), Some(32));
        assert_eq!(udp_payload(&f).unwrap()[24], 3);
        assert!(!is_request(&f[..20]));
    }

    fn ends(n: u32) -> (Region, Vec<IokernelEnd>, Vec<ginza_shm::RuntimeEnd>) {
        let region = Region::create("dispatch-test", &RegionConfig::new(n)).unwrap();
        let io = (0..n).map(|k| region.iokernel_end(k).unwrap()).collect();
        let rt = (0..n).map(|k| region.runtime_end(k).unwrap()).collect();
        (region, io, rt)
    }

    fn desc(buf: u32) -> PacketDesc {
        PacketDesc {
            buf,
            len: 100,
            hash: 0,
            reserved: 0,
        }
    }

    #[test]
    fn requests_go_to_granted_workers_and_preempted_ones_come_back_by_id() {
        let (_region, mut io, mut rt) = ends(2);
        let policy = SchedPolicy::CPreSq {
            quantum: 5_000,
            placement: Placement::Tail,
        };
        let mut d = AppDispatch::new(policy, 2, 24, None, false);
        let f = frame(0);
        d.arrive(desc(7), &f, 0);
        d.arrive(desc(8), &f, 0);
        d.woken(1);
        assert_eq!(d.step(1, [false, true].into_iter(), &mut io), 1);
        assert_eq!(
            rt[1].from_iokernel.recv().unwrap(),
            Some(ToKthread::Run {
                request: 0,
                packet: Some(RunPacket { buf: 7, len: 100 })
            })
        );
        assert_eq!(d.queue_counters(), (1, 2));
        // Not started yet: no quantum runs, however long it waits.
        d.step(10_000, [false, true].into_iter(), &mut io);
        assert!(!rt[1].line.flags().contains(LineFlags::YIELD_REQUEST));
        rt[1].line.set_running_request(Some(0));
        d.step(10_001, [false, true].into_iter(), &mut io);
        // Past its quantum with request 1 waiting: asked to yield.
        d.step(15_001, [false, true].into_iter(), &mut io);
        assert!(rt[1].line.flags().contains(LineFlags::YIELD_REQUEST));
        d.hand_back(1, 0, false, 10_500).unwrap();
        d.woken(0);
        d.step(10_600, [true, true].into_iter(), &mut io);
        let got: Vec<_> = rt
            .iter_mut()
            .map(|e| e.from_iokernel.recv().unwrap())
            .collect();
        // Tail placement: request 1 (new) first, then request 0 resumed.
        assert_eq!(
            got,
            [
                Some(ToKthread::Run {
                    request: 1,
                    packet: Some(RunPacket { buf: 8, len: 100 })
                }),
                Some(ToKthread::Run {
                    request: 0,
                    packet: None
                }),
            ]
        );
        assert!(!rt[1].line.flags().contains(LineFlags::YIELD_REQUEST));
        let _ = ToIokernel::HandBack {
            request: 0,
            completed: true,
        };
    }

    #[test]
    fn lies_are_counted_then_the_application_is_disconnected() {
        let (_region, mut io, _rt) = ends(1);
        let mut d = AppDispatch::new(SchedPolicy::CFcfs, 1, 0, None, false);
        d.arrive(desc(1), &frame(0), 0);
        d.woken(0);
        d.step(0, [true].into_iter(), &mut io);
        for i in 1..MAX_LIES {
            assert!(
                d.hand_back(0, 1000 + i, true, 1).is_ok(),
                "lie {i} tolerated"
            );
        }
        // The honest hand-back still works.
        d.hand_back(0, 0, true, 1).unwrap();
        assert!(
            d.hand_back(0, 0, true, 1).is_err(),
            "a duplicate: the last straw"
        );
        assert_eq!(d.counters.lies, MAX_LIES);
    }

    #[test]
    fn the_breakdown_splits_a_requests_time_where_it_went() {
        let (_region, mut io, mut rt) = ends(1);
        let policy = SchedPolicy::CPreSq {
            quantum: 5_000,
            placement: Placement::Tail,
        };
        let mut d = AppDispatch::new(policy, 1, 0, None, false);
        d.step(1_000, [false].into_iter(), &mut io);
        d.arrive(desc(1), &frame(0), 1_000);
        // Queued 3 µs with no core; run as soon as a worker has one.
        d.woken(0);
        d.step(4_000, [true].into_iter(), &mut io);
        d.arrive(desc(2), &frame(0), 4_500);
        d.step(6_000, [true].into_iter(), &mut io);
        assert!(rt[0].from_iokernel.recv().unwrap().is_some());
        // Seen running 3 µs after the Run; preempted after 10 µs on core.
        rt[0].line.set_running_request(Some(0));
        d.step(7_000, [true].into_iter(), &mut io);
        d.hand_back(0, 0, false, 17_000).unwrap();
        rt[0].line.set_running_request(None);
        // Request 1 runs and completes; request 0 again: 4 µs queued (with
        // a core), picked up at once, 2 µs on core.
        d.step(17_000, [true].into_iter(), &mut io);
        d.hand_back(0, 1, true, 20_000).unwrap();
        d.step(21_000, [true].into_iter(), &mut io);
        rt[0].line.set_running_request(Some(0));
        d.step(21_000, [true].into_iter(), &mut io);
        d.hand_back(0, 0, true, 23_000).unwrap();
        let bands = d.breakdown();
        let total: u64 = bands.iter().map(|b| b.count).sum();
        assert_eq!(total, 2);
        // Request 0: 22 µs in iokerneld, band [16, 32) µs.
        let b = bands
            .iter()
            .find(|b| b.from_ns == 16_000)
            .expect("its band");
        assert_eq!(
            (
                b.count,
                b.sojourn_ns,
                b.queued_ns,
                b.no_core_ns,
                b.pickup_ns
            ),
            (1, 22_000, 3_000 + 4_000, 3_000, 3_000)
        );
        assert_eq!((b.on_core_ns, b.runs), (10_000 + 2_000, 2));
    }

    #[test]
    fn a_run_that_crossed_its_kthreads_park_is_queued_again_as_it_was() {
        let (_region, mut io, mut rt) = ends(2);
        let policy = SchedPolicy::CPreSq {
            quantum: 5_000,
            placement: Placement::Head,
        };
        let mut d = AppDispatch::new(policy, 2, 0, None, false);
        d.arrive(desc(1), &frame(0), 0);
        d.woken(0);
        d.step(0, [true, false].into_iter(), &mut io);
        // The Run crossed kthread 0's Parked: it is stale, and the request
        // goes to kthread 1 with its packet.
        d.gave_core_back(0, true, 5);
        assert_eq!(d.counters.stale_runs, 1);
        assert_eq!(d.stats().pq, 1, "it parked with a request queued");
        d.woken(1);
        d.step(6, [false, true].into_iter(), &mut io);
        let fresh = Some(ToKthread::Run {
            request: 0,
            packet: Some(RunPacket { buf: 1, len: 100 }),
        });
        assert_eq!(rt[0].from_iokernel.recv().unwrap(), fresh, "the stale one");
        assert_eq!(rt[1].from_iokernel.recv().unwrap(), fresh);
    }
}
