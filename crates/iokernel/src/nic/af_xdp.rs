//! A [`Nic`] on a real Linux interface through an AF_XDP socket in copy mode
//! (docs/design.md, "NIC backends").
//!
//! * **XDP program** ([`super::bpf`]): only frames for a Ginza application
//!   come to the socket — IPv4 to an address in the program's address map,
//!   ARP whose target is one — and every other frame goes to the Linux
//!   stack, so the host keeps using the interface. [`AfXdp::claim_address`]
//!   and [`AfXdp::release_address`] (the [`Nic`] calls the dataplane makes
//!   as applications attach and leave) fill the map. The program is
//!   attached in generic (SKB) mode with `BPF_LINK_CREATE` (driver mode
//!   with the direct path; on a veth, driver mode measured slower for
//!   the switch path's TCP stream, docs/xdp.md); the link is a
//!   file descriptor, so the program is detached when the backend is dropped
//!   or the process dies, never left behind on the interface.
//! * **Socket.** Bound to queue 0 in copy mode (`XDP_COPY`): zero copy is
//!   refused on veth, and copy mode works on any driver. Only queue 0 is
//!   served: on a multi-queue NIC, frames of other queues go to the Linux
//!   stack (set `ethtool -L IF combined 1`, or steer with `ethtool -N`).
//! * **UMEM and the pool.** The UMEM is an anonymous mapping of
//!   [`UMEM_FRAMES`] chunks of [`CHUNK_SIZE`] bytes, half of them lent to the
//!   kernel on the fill ring for reception, half kept for transmission.
//!   Frames are *copied* between the UMEM and the [`BufferPool`]: received
//!   frames into pool buffers (the chunk goes straight back to the fill
//!   ring), frames to send from pool buffers into a free chunk. iokerneld's
//!   dataplane receives with [`Nic::rx_burst_with`] instead, which hands it
//!   the frame in the UMEM to copy into its switch once. A copy of a
//!   frame costs far less than the system call copy mode needs anyway, and
//!   it keeps the pool the one owner of the frames iokerneld handles.
//! * **Socket, UMEM and rings** are `ginza_sys::xsk`'s, shared with the
//!   runtime's direct path (docs/direct-path.md). In copy
//!   mode the kernel transmits only inside `sendto`, so every `tx_burst`
//!   that submits (or finds descriptors still pending) kicks with one.
//! * Frames longer than a pool buffer are dropped and counted, like frames
//!   longer than the MTU given to `tx_burst` (the kernel would drop those
//!   silently further on); the kernel's own drops (rx ring full, no fill
//!   entry) come from `XDP_STATISTICS`.
//! * Promiscuous, like [`af_packet`](super::af_packet): a packet socket
//!   that receives nothing holds a `PACKET_MR_PROMISC` membership.
//!
//! * [`probe_attach`] loads the same program and attaches it in driver
//!   (native) or generic mode and detaches it at once: `ginza doctor` asks
//!   what an interface offers without keeping anything on it.
//!
//! As with `af_packet`, a veth peer must have its transmit offloads off
//! (`ethtool -K IF tx off`), or frames carry partial checksums.
//!
//! Needs `CAP_NET_ADMIN`, `CAP_BPF` (or `CAP_SYS_ADMIN`) and `CAP_NET_RAW`,
//! and a kernel with `BPF_LINK_CREATE` for XDP (5.9).

use std::collections::HashMap;
use std::io;
use std::mem::zeroed;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::af_packet::promiscuous_socket;
pub use super::bpf::XdpMode;
use super::bpf::{StepError, XdpSteering, OWN_SOCKET_SLOTS};
use super::linux_link::{
    check_pool_and_ifindex, io_error, LinkStats, NicError, ETHERNET_HEADER_LEN,
};
use super::{BufferPool, Frame, Nic};
use ginza_sys::hops::{self, Hop};
use ginza_sys::xsk::{BindMode, Desc, Umem, UmemOwner, Xsk, XskError};

const BACKEND: &str = "af_xdp";
/// What the backend's system calls need (named in a refusal).
const CAPABILITIES: &str = "CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW";

/// Bytes per UMEM chunk: a page, the largest aligned chunk; the kernel keeps
/// 256 bytes of it as XDP headroom, which leaves 3840 for a frame.
pub const CHUNK_SIZE: usize = 4096;
/// Chunks in the UMEM: half for reception, half for transmission.
pub const UMEM_FRAMES: usize = 2 * RING_SIZE as usize;
/// Entries in each of the four rings (a power of two).
const RING_SIZE: u32 = 512;
/// The queue the socket serves.
const QUEUE: u32 = 0;

/// An AF_XDP socket on queue 0 of one interface, its XDP program, its UMEM
/// and the pool frames are copied into and out of.
///
/// Fields are dropped in order: the program is detached before the socket
/// it redirects to is closed.
pub struct AfXdp {
    /// Detaches the program when closed.
    _link: OwnedFd,
    /// The program and its maps (the addresses claimed).
    steering: XdpSteering,
    _promiscuous: OwnedFd,
    /// The socket, its rings and its UMEM (`ginza_sys::xsk`).
    xsk: Xsk,
    /// UMEM chunks (their offsets) free for transmission.
    tx_free: Vec<u64>,
    /// Receive chunks read off the rx ring that the fill ring had no room
    /// for yet: the kernel may hand a frame to the rx ring before it
    /// publishes that it took the chunk from the fill ring. Returned first
    /// at the next burst (never lost, or the link would run dry).
    fill_backlog: Vec<u64>,
    /// Descriptors of the current burst, kept to avoid an allocation per
    /// burst.
    scratch: Vec<Desc>,
    ifname: String,
    ifindex: u32,
    mtu: usize,
    pool: BufferPool,
    stats: LinkStats,
    /// Opened for applications' own sockets ([`AfXdp::open_with`]).
    direct_path: bool,
    /// Applications' own sockets: address → (slot, queue).
    own_sockets: HashMap<Ipv4Addr, (u32, u32)>,
}

impl std::fmt::Debug for AfXdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfXdp")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("mtu", &self.mtu)
            .field("pool", &self.pool)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl AfXdp {
    /// Opens queue 0 of `ifname` with a pool of `pool_buffers` buffers of
    /// `buffer_size` bytes.
    pub fn open(ifname: &str, pool_buffers: usize, buffer_size: usize) -> Result<AfXdp, NicError> {
        AfXdp::open_with(ifname, pool_buffers, buffer_size, false)
    }

    /// [`AfXdp::open`], and with `direct_path` ready for applications' own
    /// sockets on the interface's other queues (docs/direct-path.md): the
    /// program serves every receive queue and runs in driver mode, where a
    /// frame keeps the queue it arrived on (in generic mode a veth shows
    /// every frame on queue 0).
    pub fn open_with(
        ifname: &str,
        pool_buffers: usize,
        buffer_size: usize,
        direct_path: bool,
    ) -> Result<AfXdp, NicError> {
        let ifindex = check_pool_and_ifindex(ifname, pool_buffers, buffer_size)?;
        let io_error = io_error(BACKEND, CAPABILITIES, ifname);
        let promiscuous =
            promiscuous_socket(ifindex).map_err(|e| io_error("promiscuous packet socket", e))?;
        let mtu = interface_mtu(&promiscuous, ifname).map_err(|e| io_error("SIOCGIFMTU", e))?;

        let umem =
            Umem::private(UMEM_FRAMES, CHUNK_SIZE).map_err(|e| io_error("mmap of the UMEM", e))?;
        let mut xsk = Xsk::open(
            ifindex,
            QUEUE,
            umem,
            UmemOwner::Own,
            RING_SIZE,
            BindMode::Copy,
        )
        .map_err(|e: XskError| io_error(e.step, e.error))?;

        // Chunks [0, RING_SIZE) receive, the rest transmit.
        let rx_chunks = (0..RING_SIZE as u64).map(|chunk| chunk * CHUNK_SIZE as u64);
        let filled = xsk.rings().fill.produce(rx_chunks);
        debug_assert_eq!(filled, RING_SIZE as usize);
        let tx_free = (RING_SIZE as u64..UMEM_FRAMES as u64)
            .rev()
            .map(|chunk| chunk * CHUNK_SIZE as u64)
            .collect();

        let step_error = |e: StepError| io_error(e.step, e.error);
        let (queues, mode) = if direct_path {
            let queues = receive_queues(ifname).map_err(|e| io_error("receive queues", e))?;
            (queues, XdpMode::Driver)
        } else {
            (QUEUE + 1, XdpMode::Generic)
        };
        let steering = XdpSteering::load(queues).map_err(step_error)?;
        steering
            .set_socket(QUEUE, xsk.fd().as_raw_fd())
            .map_err(step_error)?;
        let link = steering.attach(ifindex, mode).map_err(step_error)?;

        Ok(AfXdp {
            _link: link,
            steering,
            _promiscuous: promiscuous,
            xsk,
            tx_free,
            fill_backlog: Vec::with_capacity(RING_SIZE as usize),
            scratch: Vec::with_capacity(RING_SIZE as usize),
            ifname: ifname.to_string(),
            ifindex,
            mtu,
            pool: BufferPool::new(pool_buffers, buffer_size),
            stats: LinkStats::default(),
            direct_path,
            own_sockets: HashMap::new(),
        })
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The XDP program and its maps (tests ask it for verdicts).
    pub fn steering(&self) -> &XdpSteering {
        &self.steering
    }

    /// The counters so far, with the kernel's drops on this socket.
    pub fn stats(&self) -> LinkStats {
        let mut stats = self.stats;
        if let Ok(kernel) = self.xsk.statistics() {
            stats.drops.rx_kernel = kernel.rx_dropped + kernel.rx_ring_full;
            stats.drops.tx_errors += kernel.tx_invalid_descs;
        }
        stats
    }

    /// Takes back the chunks the kernel has finished sending.
    fn reclaim_completed(&mut self) {
        let (rings, umem) = self.xsk.split();
        let tx_free = &mut self.tx_free;
        rings
            .completion
            .consume(usize::MAX, |addr| tx_free.push(umem.chunk_of(addr)));
    }

    /// Gives the fill ring as many backlogged receive chunks as it has
    /// room for, oldest first.
    fn return_fill_backlog(&mut self) {
        if self.fill_backlog.is_empty() {
            return;
        }
        let returned = self
            .xsk
            .rings()
            .fill
            .produce(self.fill_backlog.iter().copied());
        self.fill_backlog.drain(..returned);
    }

    /// Takes up to `max` frames off the rx ring and hands each one's bytes,
    /// in the UMEM, to `take` with the pool; counts them, drops those longer
    /// than a pool buffer or outside the UMEM, and gives every chunk back to
    /// the fill ring. Frames left on the tx ring by the last burst are
    /// kicked out first, even if the caller has nothing more to send.
    fn receive(&mut self, max: usize, mut take: impl FnMut(&mut BufferPool, &[u8])) -> usize {
        self.kick();
        self.return_fill_backlog();
        let mut descriptors = std::mem::take(&mut self.scratch);
        descriptors.clear();
        let want = max.min(RING_SIZE as usize);
        if self
            .xsk
            .rings()
            .rx
            .consume(want, |descriptor| descriptors.push(descriptor))
            > 0
        {
            hops::stamp(Hop::NicRx);
        }
        let mut delivered = 0;
        for descriptor in &descriptors {
            let len = descriptor.len as usize;
            if len > self.pool.buffer_size() {
                self.stats.drops.rx_oversized += 1;
                continue;
            }
            let Some(bytes) = self.xsk.umem().bytes(descriptor.addr, descriptor.len) else {
                self.stats.drops.rx_errors += 1;
                continue;
            };
            take(&mut self.pool, bytes);
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += len as u64;
            delivered += 1;
        }
        let umem = self.xsk.umem();
        self.fill_backlog
            .extend(descriptors.iter().map(|d| umem.chunk_of(d.addr)));
        self.return_fill_backlog();
        self.scratch = descriptors;
        delivered
    }

    /// Makes the kernel transmit what is on the tx ring. Copy mode sends
    /// only inside this call, at most 32 frames per call (the kernel's
    /// batch): it is repeated while that makes progress. "Busy" and "no
    /// buffers" mean try again at the next burst.
    fn kick(&mut self) {
        for _ in 0..RING_SIZE / 32 {
            let pending = self.xsk.rings_ref().tx.pending();
            if pending == 0 {
                return;
            }
            hops::stamp(Hop::Kick);
            let sent = self.xsk.kick();
            hops::stamp(Hop::Kicked);
            if let Err(error) = sent {
                match error.raw_os_error() {
                    Some(libc::EAGAIN) if self.xsk.rings_ref().tx.pending() < pending => continue,
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => {}
                    _ => self.stats.drops.tx_errors += 1,
                }
            }
            return;
        }
    }
}

impl Nic for AfXdp {
    fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The XDP socket: `poll` reports it readable while its rx ring holds
    /// a frame. In copy mode the kernel fills the rx ring from its receive
    /// path and takes fill-ring chunks there, so a sleeping iokerneld owes
    /// it no wakeup for reception (the socket is bound without
    /// `XDP_USE_NEED_WAKEUP`; `tx_burst` kicks every transmit with
    /// `sendto`, and `rx_burst` flushes what is left, before any sleep).
    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.xsk.fd())
    }

    /// Not while descriptors wait on the tx ring for a kick.
    fn settled(&self) -> bool {
        self.xsk.rings_ref().tx.pending() == 0
    }

    fn claim_address(&mut self, ip: Ipv4Addr) -> Result<(), String> {
        self.steering.claim(ip).map_err(|e| e.to_string())
    }

    fn release_address(&mut self, ip: Ipv4Addr) {
        if let Err(e) = self.steering.release(ip) {
            log::warn!("af_xdp on {}: releasing {ip}: {e}", self.ifname);
        }
    }

    fn attach_own_socket(
        &mut self,
        ip: Ipv4Addr,
        queue: u32,
        socket: BorrowedFd<'_>,
    ) -> Result<(), String> {
        if !self.direct_path {
            return Err(format!(
                "iokerneld opened {} without the direct path (nic = \"af_xdp:{},direct\")",
                self.ifname, self.ifname
            ));
        }
        if queue == QUEUE {
            return Err(format!(
                "queue {QUEUE} is iokerneld's; an own socket needs another queue"
            ));
        }
        if self.own_sockets.contains_key(&ip) {
            return Err(format!("{ip} has an own socket already"));
        }
        let slot = (0..OWN_SOCKET_SLOTS)
            .find(|s| self.own_sockets.values().all(|(taken, _)| taken != s))
            .ok_or_else(|| format!("all {OWN_SOCKET_SLOTS} own-socket slots are taken"))?;
        self.steering
            .set_own_socket(ip, slot, queue, socket.as_raw_fd())
            .map_err(|e| e.to_string())?;
        self.own_sockets.insert(ip, (slot, queue));
        Ok(())
    }

    fn detach_own_socket(&mut self, ip: Ipv4Addr) {
        if let Some((slot, queue)) = self.own_sockets.remove(&ip) {
            if let Err(e) = self.steering.clear_own_socket(ip, slot, queue) {
                log::warn!("af_xdp on {}: {ip}'s own socket: {e}", self.ifname);
            }
        }
    }

    fn pool_mut(&mut self) -> &mut BufferPool {
        &mut self.pool
    }

    /// Copies up to `max` received frames into pool buffers; each chunk goes
    /// back to the fill ring at once. Stops when the pool is empty (frames
    /// wait on the rx ring, and the kernel drops when it is full).
    fn rx_burst(&mut self, out: &mut Vec<Frame>, max: usize) -> usize {
        let want = max.min(self.pool.available());
        self.receive(want, |pool, bytes| {
            let frame = pool
                .alloc_copy(bytes)
                .expect("`want` is at most the pool's free buffers");
            out.push(frame);
        })
    }

    /// Hands up to `max` received frames to `take` where they lie, in the
    /// UMEM (no copy into the pool); each chunk goes back to the fill ring
    /// after.
    fn rx_burst_with(
        &mut self,
        _scratch: &mut Vec<Frame>,
        max: usize,
        take: &mut dyn FnMut(&[u8]),
    ) -> usize {
        self.receive(max, |_, bytes| take(bytes))
    }

    /// Copies frames from the front of `frames` into free UMEM chunks on the
    /// tx ring until one is of another pool or there is no chunk or ring
    /// slot left (that one and the rest stay with the caller).
    fn tx_burst(&mut self, frames: &mut Vec<Frame>) -> usize {
        self.reclaim_completed();
        let mut descriptors = std::mem::take(&mut self.scratch);
        descriptors.clear();
        let mut taken = 0;
        let (rings, umem) = self.xsk.split();
        let room = rings.tx.free_slots().min(self.tx_free.len());
        for frame in frames.iter() {
            if !self.pool.owns(frame) || descriptors.len() == room {
                break;
            }
            taken += 1;
            let bytes = self.pool.bytes(frame);
            if bytes.len() < ETHERNET_HEADER_LEN {
                self.stats.drops.tx_runt += 1;
                continue;
            }
            if bytes.len() > self.mtu + ETHERNET_HEADER_LEN || bytes.len() > CHUNK_SIZE {
                self.stats.drops.tx_oversized += 1;
                continue;
            }
            let addr = self.tx_free.pop().expect("bounded by `room`");
            umem.bytes_mut(addr, bytes.len() as u32)
                .expect("a free chunk of the UMEM, the frame no longer than a chunk")
                .copy_from_slice(bytes);
            descriptors.push(Desc {
                addr,
                len: bytes.len() as u32,
                options: 0,
            });
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += bytes.len() as u64;
        }
        let submitted = rings.tx.produce(descriptors.iter().copied());
        debug_assert_eq!(submitted, descriptors.len());
        self.scratch = descriptors;
        for frame in frames.drain(..taken) {
            self.pool
                .free(frame)
                .expect("frames taken here come from this pool");
        }
        self.kick();
        taken
    }
}

/// Loads iokerneld's XDP program and attaches it to `ifname` in `mode`,
/// then detaches it (the link is closed before returning): whether that
/// mode is available here. Fails like [`AfXdp::open`] (no such interface,
/// missing capabilities), and with `EBUSY` when another program is
/// attached (a running iokerneld, for one).
pub fn probe_attach(ifname: &str, mode: XdpMode) -> Result<(), NicError> {
    let ifindex = super::linux_link::ifindex(ifname)?;
    let io_error = io_error(BACKEND, CAPABILITIES, ifname);
    let step_error = |e: StepError| io_error(e.step, e.error);
    let steering = XdpSteering::load(QUEUE + 1).map_err(step_error)?;
    drop(steering.attach(ifindex, mode).map_err(step_error)?);
    Ok(())
}

/// How many receive queues `ifname` has (its `queues/rx-N` in sysfs).
fn receive_queues(ifname: &str) -> io::Result<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues"))?;
    let mut count = 0u32;
    for entry in dir {
        if entry?.file_name().to_string_lossy().starts_with("rx-") {
            count += 1;
        }
    }
    Ok(count.max(1))
}

fn interface_mtu(socket: &OwnedFd, ifname: &str) -> io::Result<usize> {
    // SAFETY: `ifreq` is bytes and a union of plain integers; all zero is
    // valid.
    let mut request: libc::ifreq = unsafe { zeroed() };
    for (d, s) in request.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: `request` is a valid ifreq holding a NUL-terminated name (the
    // name was checked shorter than IFNAMSIZ); SIOCGIFMTU writes its MTU.
    let result = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut request) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU succeeded, so the union holds the MTU.
    Ok(unsafe { request.ifr_ifru.ifru_mtu }.max(0) as usize)
}
