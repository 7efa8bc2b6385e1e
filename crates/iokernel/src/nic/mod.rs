//! The NIC abstraction of iokerneld (docs/design.md, "NIC backends", "Packet
//! steering") and its default backend, as pure in-process code.
//!
//! # Design
//!
//! * [`Nic`] is the whole contract between iokerneld's loop and a link:
//!   receive a burst, transmit a burst, and the [`BufferPool`] the link's
//!   frames live in. Bursts amortize the per-call cost the way DPDK and
//!   AF_XDP rings do; nothing blocks: an empty link returns 0 frames, a full
//!   one refuses frames, which stay with the caller.
//! * Buffer ownership is explicit. A [`Frame`] is a move-only handle on one
//!   fixed-size buffer of a pool plus a length: `rx_burst` gives frames to the
//!   caller, `tx_burst` takes the ones it accepts, and
//!   [`BufferPool::free`] consumes the handle, so a buffer is returned at most
//!   once by construction. Where a buffer must travel as plain numbers (a
//!   ring to another process), [`BufferPool::lend`] turns it into a
//!   [`BufferDescriptor`] and [`BufferPool::reclaim`] checks the descriptor
//!   against the pool's records, refusing a second return at run time.
//!   Pool exhaustion is a counted drop ([`PoolStats::exhausted`]), never a
//!   block or a panic.
//! * [`software`] is the embedded default (no root, no NIC): an in-memory
//!   Ethernet switch with one [`SwitchPort`](software::SwitchPort) per
//!   application, looked up by registered MAC, with broadcast and counted
//!   drops per port and per reason (unknown destination, receive ring full,
//!   no buffer, spoofed source, runt). Each port has its own pool and the
//!   switch copies a frame into the destination's pool, so a port that
//!   floods or hoards buffers exhausts only itself and the port it floods —
//!   and later, when those pools move into shared memory, a runtime sees only
//!   its own packets.
//! * [`faults`]: seeded fault injection (drop, duplicate, reorder, delay,
//!   corrupt) that the switch applies per port and direction (iokerneld's
//!   `--faults`, docs/fault-injection.md); pure decision logic, no clock.
//! * [`generator`] is an open-loop load generator that sits on a port:
//!   Poisson arrivals, each request a UDP datagram carrying a sequence number,
//!   its send time and a service time drawn from a [`ServiceTime`]
//!   distribution; replies are matched by sequence number and their latency
//!   recorded in an HDR histogram, along with losses and the generator's own
//!   lag behind its schedule. Its owner drives it with
//!   [`TrafficGenerator::poll`] from iokerneld's loop, with the loop's clock
//!   reading; tests pass a synthetic clock, which makes them deterministic
//!   for a seed.
//!
//! # Left
//!
//! * [`af_packet`] and [`af_xdp`] (opened by [`linux::open`]) work on a real
//!   interface; left: a UMEM that *is* the [`BufferPool`] (today frames are
//!   copied between them), queues other than 0 on the switch path; `dpdk`
//!   behind a feature.
//! * Steering measurements in iokerneld itself (in [`crate::dataplane`]):
//!   packets out of order per flow and ns per steering decision (the
//!   policies, `rss-mod`, `flow-affinity` and `indirection`, are there).
//! * Zero-copy switching (a frame handed between pools instead of copied)
//!   where both ends trust each other, e.g. the generator.

pub mod af_packet;
pub mod af_xdp;
pub mod bpf;
pub mod buffer;
pub mod faults;
pub mod generator;
pub mod linux;
mod linux_link;
pub mod software;

pub use buffer::{BufferDescriptor, BufferPool, Frame, PoolError, PoolStats, DEFAULT_BUFFER_SIZE};
pub use generator::{
    GeneratorConfig, GeneratorConfigError, GeneratorStats, ServiceTime, TrafficGenerator,
};
pub use software::{
    PortConfig, PortCounters, PortDrops, PortId, SoftwareSwitch, SwitchError, SwitchPort,
};

/// A link iokerneld sends and receives Ethernet frames on.
pub trait Nic {
    /// The pool received frames come from and transmitted frames must come
    /// from: free received frames here, allocate frames to send here.
    fn pool(&self) -> &BufferPool;

    fn pool_mut(&mut self) -> &mut BufferPool;

    /// Moves up to `max` received frames to the end of `out`, oldest first,
    /// and returns how many. The caller owns them and frees them to
    /// [`pool_mut`](Nic::pool_mut) when done.
    fn rx_burst(&mut self, out: &mut Vec<Frame>, max: usize) -> usize;

    /// Hands the bytes of up to `max` received frames to `take`, oldest
    /// first, and returns how many: for a caller that copies each frame on
    /// anyway (iokerneld, into its switch). A backend whose frames arrive
    /// in memory of its own (`af_xdp`'s UMEM) hands them from there, which
    /// spares the copy into the [`pool`](Nic::pool); the default receives
    /// into the pool with [`rx_burst`](Nic::rx_burst), using `scratch`
    /// (left empty), and frees each frame after `take`.
    fn rx_burst_with(
        &mut self,
        scratch: &mut Vec<Frame>,
        max: usize,
        take: &mut dyn FnMut(&[u8]),
    ) -> usize {
        scratch.clear();
        let n = self.rx_burst(scratch, max);
        for frame in scratch.drain(..) {
            take(self.pool().bytes(&frame));
            self.pool_mut()
                .free(frame)
                .expect("a received frame is of the NIC's pool");
        }
        n
    }

    /// Takes frames from the front of `frames` for transmission and returns
    /// how many it took; the ones it did not accept stay in `frames`, in
    /// order, still owned by the caller. A frame taken may still be dropped
    /// further on (counted by the backend), never handed back.
    fn tx_burst(&mut self, frames: &mut Vec<Frame>) -> usize;

    /// A descriptor that `poll` reports readable (`POLLIN`) when a frame
    /// waits to be received, for a loop that sleeps while idle
    /// (docs/iokernel-idle.md); `None` (the default): the link cannot be
    /// waited on, and the loop never sleeps while it is attached.
    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Whether the link has nothing left to do until a new frame arrives
    /// or one is given to it (no transmission still pending): the loop may
    /// sleep on [`wait_fd`](Nic::wait_fd).
    fn settled(&self) -> bool {
        true
    }

    /// Frames for `ip` are a Ginza application's from now on: a link that
    /// shares its interface with the Linux stack (`af_xdp`) steers them to
    /// iokerneld instead of to Linux. Claims are counted: `ip` stays
    /// iokerneld's until each claim is released. The default (a link that
    /// sees every frame) does nothing.
    fn claim_address(&mut self, _ip: std::net::Ipv4Addr) -> Result<(), String> {
        Ok(())
    }

    /// Undoes one [`claim_address`](Nic::claim_address).
    fn release_address(&mut self, _ip: std::net::Ipv4Addr) {}

    /// The direct path (docs/direct-path.md): frames for `ip` (claimed)
    /// that arrive on receive `queue` go to `socket`, the application's own
    /// AF_XDP socket bound to that queue, not to iokerneld. Only an AF_XDP
    /// link opened for it (`af_xdp:IF,direct`) can.
    fn attach_own_socket(
        &mut self,
        _ip: std::net::Ipv4Addr,
        _queue: u32,
        _socket: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), String> {
        Err("this NIC has no direct path (it needs nic = \"af_xdp:IF,direct\")".into())
    }

    /// Undoes [`attach_own_socket`](Nic::attach_own_socket) for `ip`.
    fn detach_own_socket(&mut self, _ip: std::net::Ipv4Addr) {}
}
