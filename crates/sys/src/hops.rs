//! Hop stamps: where one message's time goes on its way through Ginza,
//! for the breakdowns of `ginza bench forward` (a UDP echo through
//! iokerneld and a runtime; docs/results.md, "Dataplane") and `ginza bench
//! oneway` (the protected path; docs/protected.md, "Where the one-way time
//! goes").
//!
//! A benchmark that runs every party as threads of one process turns
//! stamping on, calls [`begin`] before each request, and [`current`] or
//! [`end`] once its answer is read; the parties stamp their [`Hop`]s in
//! between. Each hop keeps only its *first* stamp after `begin` (a later
//! pure ACK or a second event does not move it). Off (the default), a stamp
//! is one relaxed load. One request at a time: a ping-pong, not a load.
//!
//! Stamps are TSC ticks where the kernel's clocksource is the TSC
//! (synchronised across CPUs), CLOCK_MONOTONIC ns otherwise;
//! [`ticks_per_us`] converts either way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// The points a request passes. A path uses some of them, in the order of
/// [`Hop::UDP_ECHO`] or [`Hop::PROTECTED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Hop {
    /// The client is about to write the request.
    ClientSend,
    /// iokerneld took the frame off the NIC's receive ring.
    NicRx,
    /// iokerneld published it on a kthread's ingress ring.
    Delivered,
    /// A kthread of the runtime took it off its ingress ring.
    Picked,
    /// The runtime's stack processed that frame (for TCP: the segment went
    /// through its connection's input, the data queued for the reader).
    FrameProcessed,
    /// The runtime's TCP settled the connections the poll's frames touched
    /// (segments owed now, timers re-armed) and woke their waiters.
    Settled,
    /// A uthread that waited on a socket runs again.
    WaiterRuns,
    /// The application's reply is on its egress ring.
    Replied,
    /// iokerneld took the reply off the egress ring.
    Egress,
    /// iokerneld calls the NIC's transmit (AF_XDP: the `sendto` kick);
    /// on the direct path the runtime kicks its own socket's tx ring.
    Kick,
    /// That call returned (on a veth it runs the peer's receive, and the
    /// client's wake, inside it).
    Kicked,
    /// A netstack kthread took the request's frame off its ingress ring.
    NetstackFrameIn,
    /// The netstack pushed the `new_data` event on the server's ring.
    NetstackEventOut,
    /// The server's runtime took that event off the ring.
    AppEventIn,
    /// The server's `read` returned the bytes (a protected server's, or
    /// the TCP echo servers' of `ginza bench tcp`, Ginza's and Linux's).
    AppRead,
    /// The server pushed its `send` command.
    AppSendOut,
    /// The netstack took that command off the ring.
    NetstackCommandIn,
    /// The netstack put the answer's frame on its egress ring.
    NetstackFrameOut,
    /// iokerneld's `ppoll` returned: it had slept while idle
    /// (docs/iokernel-idle.md).
    IokernelWoke,
    /// iokerneld granted a kthread a core (before its wake goes out).
    Granted,
    /// A parked kthread runs again after its grant (its wait returned).
    KthreadRuns,
    /// A TCP echo server (Ginza's or Linux's) calls `write` with the
    /// answer.
    ServerWrite,
    /// The client has the answer.
    ClientRecv,
}

/// How many hops there are.
pub const HOPS: usize = Hop::ClientRecv as usize + 1;

impl Hop {
    /// A UDP echo through iokerneld's NIC and a runtime, in path order.
    pub const UDP_ECHO: [Hop; 9] = [
        Hop::ClientSend,
        Hop::NicRx,
        Hop::Delivered,
        Hop::Picked,
        Hop::Replied,
        Hop::Egress,
        Hop::Kick,
        Hop::Kicked,
        Hop::ClientRecv,
    ];

    /// The first UDP echo after a quiet spell, in path order: iokerneld
    /// may have slept and the server's kthread parked, so its path
    /// passes their wakes too (`ginza bench idle`).
    pub const FIRST_REQUEST: [Hop; 12] = [
        Hop::ClientSend,
        Hop::IokernelWoke,
        Hop::NicRx,
        Hop::Delivered,
        Hop::Granted,
        Hop::KthreadRuns,
        Hop::Picked,
        Hop::Replied,
        Hop::Egress,
        Hop::Kick,
        Hop::Kicked,
        Hop::ClientRecv,
    ];

    /// A TCP echo over a NIC, in path order, every path's hops together:
    /// through iokerneld (`NicRx` … `Egress`, `Kick`), on the direct path
    /// (the runtime takes the frame off its own socket and kicks it out
    /// itself: no `NicRx`, `Delivered` or `Egress`), or to a Linux server
    /// (`AppRead` and `ServerWrite` only). A parked kthread's wake
    /// (`Granted`, `KthreadRuns`) comes in when it happened. `Replied`: the
    /// runtime's TCP put the answer's segment on its egress ring or its
    /// own socket's tx ring. Between `Picked` and `AppRead`, the runtime's
    /// share of a request: its TCP input (`FrameProcessed`), the settling
    /// and the reader's wake (`Settled`), the switch to the reader
    /// (`WaiterRuns`).
    pub const TCP_ECHO: [Hop; 15] = [
        Hop::ClientSend,
        Hop::NicRx,
        Hop::Delivered,
        Hop::Granted,
        Hop::KthreadRuns,
        Hop::Picked,
        Hop::FrameProcessed,
        Hop::Settled,
        Hop::WaiterRuns,
        Hop::AppRead,
        Hop::ServerWrite,
        Hop::Replied,
        Hop::Egress,
        Hop::Kick,
        Hop::ClientRecv,
    ];

    /// A TCP echo through a protected server's netstack, in path order.
    pub const PROTECTED: [Hop; 9] = [
        Hop::ClientSend,
        Hop::NetstackFrameIn,
        Hop::NetstackEventOut,
        Hop::AppEventIn,
        Hop::AppRead,
        Hop::AppSendOut,
        Hop::NetstackCommandIn,
        Hop::NetstackFrameOut,
        Hop::ClientRecv,
    ];

    /// A name for reports (JSON keys).
    pub fn name(self) -> &'static str {
        match self {
            Hop::ClientSend => "client_send",
            Hop::NicRx => "nic_rx",
            Hop::Delivered => "delivered",
            Hop::Picked => "picked",
            Hop::FrameProcessed => "frame_processed",
            Hop::Settled => "settled",
            Hop::WaiterRuns => "waiter_runs",
            Hop::Replied => "replied",
            Hop::Egress => "egress",
            Hop::Kick => "kick",
            Hop::Kicked => "kicked",
            Hop::NetstackFrameIn => "netstack_frame_in",
            Hop::NetstackEventOut => "netstack_event_out",
            Hop::AppEventIn => "app_event_in",
            Hop::AppRead => "app_read",
            Hop::AppSendOut => "app_send_out",
            Hop::NetstackCommandIn => "netstack_command_in",
            Hop::NetstackFrameOut => "netstack_frame_out",
            Hop::IokernelWoke => "iokernel_woke",
            Hop::Granted => "granted",
            Hop::KthreadRuns => "kthread_runs",
            Hop::ServerWrite => "server_write",
            Hop::ClientRecv => "client_recv",
        }
    }
}

/// One round trip's stamps, by [`Hop`] (0: the hop was not seen).
pub type Stamps = [u64; HOPS];

/// Most round trips kept until [`take`].
const MAX_KEPT: usize = 1 << 20;

static ON: AtomicBool = AtomicBool::new(false);
static STAMPS: [AtomicU64; HOPS] = [const { AtomicU64::new(0) }; HOPS];
static KEPT: Mutex<Vec<Stamps>> = Mutex::new(Vec::new());

/// Turns stamping on or off (process-wide); on forgets what was kept.
pub fn enable(on: bool) {
    if on {
        KEPT.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
    ON.store(on, Relaxed);
}

pub fn enabled() -> bool {
    ON.load(Relaxed)
}

/// A stamp now (see the module's text for the unit).
pub fn now() -> u64 {
    if crate::tsc_clock::tsc_usable() {
        crate::tsc_clock::read_tsc()
    } else {
        crate::clock::monotonic_ns()
    }
}

/// Stamps `hop` unless it already has a stamp in this round trip.
#[inline]
pub fn stamp(hop: Hop) {
    if !ON.load(Relaxed) {
        return;
    }
    let s = &STAMPS[hop as usize];
    if s.load(Relaxed) == 0 {
        let _ = s.compare_exchange(0, now().max(1), Relaxed, Relaxed);
    }
}

/// A new round trip: forgets the last one's stamps, stamps the send.
pub fn begin() {
    if !ON.load(Relaxed) {
        return;
    }
    for s in &STAMPS[1..] {
        s.store(0, Relaxed);
    }
    STAMPS[Hop::ClientSend as usize].store(now().max(1), Relaxed);
}

/// This round trip's stamps so far (0 for a hop not passed; all 0 while
/// stamping is off, rather than the last stamped round trip's).
pub fn current() -> Stamps {
    if !ON.load(Relaxed) {
        return [0; HOPS];
    }
    std::array::from_fn(|i| STAMPS[i].load(Relaxed))
}

/// The round trip is over: stamps the receive and keeps its stamps.
pub fn end() {
    if !ON.load(Relaxed) {
        return;
    }
    stamp(Hop::ClientRecv);
    let stamps = current();
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() < MAX_KEPT {
        kept.push(stamps);
    }
}

/// The round trips kept since stamping was turned on (or last taken).
pub fn take() -> Vec<Stamps> {
    std::mem::take(&mut *KEPT.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Stamp units per µs, measured over `span` of CLOCK_MONOTONIC (spins).
pub fn ticks_per_us(span: std::time::Duration) -> f64 {
    let (t0, n0) = (now(), crate::clock::monotonic_ns());
    while crate::clock::monotonic_ns() < n0 + span.as_nanos() as u64 {
        std::hint::spin_loop();
    }
    let (t1, n1) = (now(), crate::clock::monotonic_ns());
    (t1.saturating_sub(t0)) as f64 * 1e3 / (n1 - n0).max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_keeps_the_first_stamp_of_each_hop_in_order() {
        enable(true);
        begin();
        stamp(Hop::NetstackFrameIn);
        let first = STAMPS[Hop::NetstackFrameIn as usize].load(Relaxed);
        stamp(Hop::NetstackFrameIn);
        assert_eq!(STAMPS[Hop::NetstackFrameIn as usize].load(Relaxed), first);
        stamp(Hop::AppRead);
        end();
        let kept = take();
        enable(false);
        assert_eq!(
            current(),
            [0; HOPS],
            "off, the last round trip's stamps are not handed out again"
        );
        assert_eq!(kept.len(), 1);
        let s = kept[0];
        assert!(s[Hop::ClientSend as usize] > 0);
        assert!(s[Hop::NetstackFrameIn as usize] >= s[Hop::ClientSend as usize]);
        assert!(s[Hop::AppRead as usize] >= s[Hop::NetstackFrameIn as usize]);
        assert!(s[Hop::ClientRecv as usize] >= s[Hop::AppRead as usize]);
        assert_eq!(s[Hop::AppSendOut as usize], 0, "a hop not passed stays 0");
        assert!(ticks_per_us(std::time::Duration::from_millis(2)) > 0.0);
    }
}
