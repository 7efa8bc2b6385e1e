//! A [`Nic`] on a real Linux interface through an AF_XDP socket in copy mode
//! (docs/design.md, "NIC backends").
//!
//! * **XDP program** ([`super::bpf`]): only frames for a Ginza application
//!   come to the socket — IPv4 to an address in the program's address map,
//!   ARP whose target is one — and every other frame goes to the Linux
//!   stack, so the host keeps using the interface. [`AfXdp::claim_address`]
//!   and [`AfXdp::release_address`] (the [`Nic`] calls the dataplane makes
//!   as applications attach and leave) fill the map. The program is
//!   attached in generic (SKB) mode with `BPF_LINK_CREATE`; the link is a
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
//!   ring), frames to send from pool buffers into a free chunk. A copy of a
//!   frame costs far less than the system call copy mode needs anyway, and
//!   it keeps the pool the one owner of the frames iokerneld handles.
//! * **Rings.** Our own single-producer/single-consumer accessors over the
//!   mapped rings (the layout is the kernel's; `libc` has its structs):
//!   acquire loads of the kernel's index, release stores of ours. In copy
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

use std::io;
use std::mem::{size_of, zeroed};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::af_packet::promiscuous_socket;
pub use super::bpf::XdpMode;
use super::bpf::{StepError, XdpSteering};
use super::linux_link::{
    check_pool_and_ifindex, get_socket_option, io_error, set_socket_option, LinkStats, NicError,
    ETHERNET_HEADER_LEN,
};
use super::{BufferPool, Frame, Nic};
use ginza_sys::hops::{self, Hop};

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
/// How long `open` retries a queue still held by a socket closed just before.
const BIND_RETRY: Duration = Duration::from_secs(1);

/// An AF_XDP socket on queue 0 of one interface, its XDP program, its UMEM
/// and the pool frames are copied into and out of.
///
/// Fields are dropped in order: the program is detached first, the socket
/// closed before the memory it uses is unmapped.
pub struct AfXdp {
    /// Detaches the program when closed.
    _link: OwnedFd,
    /// The program and its maps (the addresses claimed).
    steering: XdpSteering,
    _promiscuous: OwnedFd,
    socket: OwnedFd,
    fill: Ring<u64>,
    completion: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    umem: Mapping,
    /// UMEM chunks (their offsets) free for transmission.
    tx_free: Vec<u64>,
    /// Receive chunks read off the rx ring that the fill ring had no room
    /// for yet: the kernel may hand a frame to the rx ring before it
    /// publishes that it took the chunk from the fill ring. Returned first
    /// at the next burst (never lost, or the link would run dry).
    fill_backlog: Vec<u64>,
    /// Descriptors of the current burst, kept to avoid an allocation per
    /// burst.
    scratch: Vec<libc::xdp_desc>,
    ifname: String,
    ifindex: u32,
    mtu: usize,
    pool: BufferPool,
    stats: LinkStats,
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
        let ifindex = check_pool_and_ifindex(ifname, pool_buffers, buffer_size)?;
        let io_error = io_error(BACKEND, CAPABILITIES, ifname);
        let promiscuous =
            promiscuous_socket(ifindex).map_err(|e| io_error("promiscuous packet socket", e))?;
        let mtu = interface_mtu(&promiscuous, ifname).map_err(|e| io_error("SIOCGIFMTU", e))?;

        let socket = socket(libc::AF_XDP, libc::SOCK_RAW).map_err(|e| io_error("socket", e))?;
        let umem = Mapping::anonymous(UMEM_FRAMES * CHUNK_SIZE)
            .map_err(|e| io_error("mmap of the UMEM", e))?;
        let registration = libc::xdp_umem_reg {
            addr: umem.ptr.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: CHUNK_SIZE as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        set_xdp_option(&socket, libc::XDP_UMEM_REG, &registration)
            .map_err(|e| io_error("XDP_UMEM_REG", e))?;
        for (option, what) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
            (libc::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            set_xdp_option(&socket, option, &RING_SIZE).map_err(|e| io_error(what, e))?;
        }
        // SAFETY: `xdp_mmap_offsets` is plain integers.
        let offsets = unsafe {
            get_socket_option::<libc::xdp_mmap_offsets>(
                &socket,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
            )
        }
        .map_err(|e| io_error("XDP_MMAP_OFFSETS", e))?;
        let mut fill = Ring::map(&socket, &offsets.fr, libc::XDP_UMEM_PGOFF_FILL_RING)
            .map_err(|e| io_error("mmap of the fill ring", e))?;
        let completion = Ring::map(&socket, &offsets.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING)
            .map_err(|e| io_error("mmap of the completion ring", e))?;
        let rx = Ring::map(&socket, &offsets.rx, libc::XDP_PGOFF_RX_RING as u64)
            .map_err(|e| io_error("mmap of the rx ring", e))?;
        let tx = Ring::map(&socket, &offsets.tx, libc::XDP_PGOFF_TX_RING as u64)
            .map_err(|e| io_error("mmap of the tx ring", e))?;

        // Chunks [0, RING_SIZE) receive, the rest transmit.
        let rx_chunks = (0..RING_SIZE as u64).map(|chunk| chunk * CHUNK_SIZE as u64);
        let filled = fill.produce(rx_chunks);
        debug_assert_eq!(filled, RING_SIZE as usize);
        let tx_free = (RING_SIZE as u64..UMEM_FRAMES as u64)
            .rev()
            .map(|chunk| chunk * CHUNK_SIZE as u64)
            .collect();

        // SAFETY: `sockaddr_xdp` is plain integers; all zero is valid.
        let mut address: libc::sockaddr_xdp = unsafe { zeroed() };
        address.sxdp_family = libc::AF_XDP as u16;
        address.sxdp_flags = libc::XDP_COPY;
        address.sxdp_ifindex = ifindex;
        address.sxdp_queue_id = QUEUE;
        // A socket closed on this queue frees it only later, in a kernel
        // work item: "busy" right after a close (a restart, a test reopening
        // the link) is retried for up to a second.
        let deadline = Instant::now() + BIND_RETRY;
        loop {
            // SAFETY: `address` is a valid sockaddr_xdp and the length is
            // its size.
            let bound = unsafe {
                libc::bind(
                    socket.as_raw_fd(),
                    (&address as *const libc::sockaddr_xdp).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if bound == 0 {
                break;
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= deadline {
                return Err(io_error("bind (copy mode, queue 0)", error));
            }
            std::thread::sleep(Duration::from_millis(5));
        }

        let step_error = |e: StepError| io_error(e.step, e.error);
        let steering = XdpSteering::load(QUEUE + 1).map_err(step_error)?;
        steering
            .set_socket(QUEUE, socket.as_raw_fd())
            .map_err(step_error)?;
        let link = steering
            .attach(ifindex, XdpMode::Generic)
            .map_err(step_error)?;

        Ok(AfXdp {
            _link: link,
            steering,
            _promiscuous: promiscuous,
            socket,
            fill,
            completion,
            rx,
            tx,
            umem,
            tx_free,
            fill_backlog: Vec::with_capacity(RING_SIZE as usize),
            scratch: Vec::with_capacity(RING_SIZE as usize),
            ifname: ifname.to_string(),
            ifindex,
            mtu,
            pool: BufferPool::new(pool_buffers, buffer_size),
            stats: LinkStats::default(),
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
        // SAFETY: `xdp_statistics` is plain integers.
        let read = unsafe {
            get_socket_option::<libc::xdp_statistics>(
                &self.socket,
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
            )
        };
        if let Ok(kernel) = read {
            stats.drops.rx_kernel = kernel.rx_dropped + kernel.rx_ring_full;
            stats.drops.tx_errors += kernel.tx_invalid_descs;
        }
        stats
    }

    /// Takes back the chunks the kernel has finished sending.
    fn reclaim_completed(&mut self) {
        let tx_free = &mut self.tx_free;
        self.completion
            .consume(usize::MAX, |addr| tx_free.push(chunk_of(addr)));
    }

    /// Gives the fill ring as many backlogged receive chunks as it has
    /// room for, oldest first.
    fn return_fill_backlog(&mut self) {
        if self.fill_backlog.is_empty() {
            return;
        }
        let returned = self.fill.produce(self.fill_backlog.iter().copied());
        self.fill_backlog.drain(..returned);
    }

    /// Makes the kernel transmit what is on the tx ring. Copy mode sends
    /// only inside this call, at most 32 frames per call (the kernel's
    /// batch): it is repeated while that makes progress. "Busy" and "no
    /// buffers" mean try again at the next burst.
    fn kick(&mut self) {
        for _ in 0..RING_SIZE / 32 {
            let pending = self.tx.pending();
            if pending == 0 {
                return;
            }
            hops::stamp(Hop::Kick);
            // SAFETY: a zero-length send with no address on a valid socket.
            let sent = unsafe {
                libc::sendto(
                    self.socket.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            hops::stamp(Hop::Kicked);
            if sent < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EAGAIN) if self.tx.pending() < pending => continue,
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
        Some(std::os::fd::AsFd::as_fd(&self.socket))
    }

    /// Not while descriptors wait on the tx ring for a kick.
    fn settled(&self) -> bool {
        self.tx.pending() == 0
    }

    fn claim_address(&mut self, ip: Ipv4Addr) -> Result<(), String> {
        self.steering.claim(ip).map_err(|e| e.to_string())
    }

    fn release_address(&mut self, ip: Ipv4Addr) {
        if let Err(e) = self.steering.release(ip) {
            log::warn!("af_xdp on {}: releasing {ip}: {e}", self.ifname);
        }
    }

    fn pool_mut(&mut self) -> &mut BufferPool {
        &mut self.pool
    }

    /// Copies up to `max` received frames into pool buffers; each chunk goes
    /// back to the fill ring at once. Stops when the pool is empty (frames
    /// wait on the rx ring, and the kernel drops when it is full).
    fn rx_burst(&mut self, out: &mut Vec<Frame>, max: usize) -> usize {
        // Frames left on the tx ring by the last burst go out now, even if
        // the caller has nothing more to send.
        self.kick();
        self.return_fill_backlog();
        let mut descriptors = std::mem::take(&mut self.scratch);
        descriptors.clear();
        let want = max.min(self.pool.available()).min(RING_SIZE as usize);
        if self
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
            let Some(bytes) = umem_bytes(&self.umem, descriptor.addr, descriptor.len) else {
                self.stats.drops.rx_errors += 1;
                continue;
            };
            let frame = self
                .pool
                .alloc_copy(bytes)
                .expect("`want` is at most the pool's free buffers");
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += len as u64;
            out.push(frame);
            delivered += 1;
        }
        self.fill_backlog
            .extend(descriptors.iter().map(|d| chunk_of(d.addr)));
        self.return_fill_backlog();
        self.scratch = descriptors;
        delivered
    }

    /// Copies frames from the front of `frames` into free UMEM chunks on the
    /// tx ring until one is of another pool or there is no chunk or ring
    /// slot left (that one and the rest stay with the caller).
    fn tx_burst(&mut self, frames: &mut Vec<Frame>) -> usize {
        self.reclaim_completed();
        let mut descriptors = std::mem::take(&mut self.scratch);
        descriptors.clear();
        let mut taken = 0;
        let room = (self.tx.free_slots()).min(self.tx_free.len());
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
            let start = addr as usize;
            self.umem.bytes_mut()[start..start + bytes.len()].copy_from_slice(bytes);
            descriptors.push(libc::xdp_desc {
                addr,
                len: bytes.len() as u32,
                options: 0,
            });
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += bytes.len() as u64;
        }
        let submitted = self.tx.produce(descriptors.iter().copied());
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

/// The bytes of a descriptor the kernel gave us, or `None` if it points
/// outside the UMEM (it never should).
fn umem_bytes(umem: &Mapping, addr: u64, len: u32) -> Option<&[u8]> {
    let start = usize::try_from(addr).ok()?;
    let end = start.checked_add(len as usize)?;
    umem.bytes().get(start..end)
}

/// The chunk an address lies in (the kernel may hand back an address with
/// an offset into its chunk).
fn chunk_of(addr: u64) -> u64 {
    addr & !(CHUNK_SIZE as u64 - 1)
}

fn socket(domain: libc::c_int, kind: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket() and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_xdp_option<T>(socket: &OwnedFd, option: libc::c_int, value: &T) -> io::Result<()> {
    set_socket_option(socket, libc::SOL_XDP, option, value)
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

/// A memory mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by one `AfXdp` and touched only through it
// (`&self`/`&mut self`); no thread-local state is involved.
unsafe impl Send for Mapping {}

impl Mapping {
    fn anonymous(len: usize) -> io::Result<Mapping> {
        Mapping::new(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    }

    fn new(len: usize, flags: libc::c_int, fd: RawFd, offset: u64) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel (no address hint), so
        // no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags | libc::MAP_POPULATE,
                fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap does not return null on success"),
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes for as long as `self`
        // lives. The kernel writes only chunks that are on the fill ring,
        // which we do not read until the rx ring hands them back.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only slice;
        // we write only chunks that are on no ring.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference into
        // it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One of the four rings shared with the kernel: a power-of-two array of
/// `T` with a producer and a consumer index, each written by one side only.
struct Ring<T> {
    map: Mapping,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    entries: NonNull<T>,
}

// SAFETY: the ring's memory is owned by its mapping and used through `&mut
// self` only; the kernel is the other party, whatever thread we are on.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps the ring whose offsets the kernel gave for `page_offset`.
    fn map(
        socket: &OwnedFd,
        offsets: &libc::xdp_ring_offset,
        page_offset: u64,
    ) -> io::Result<Ring<T>> {
        let len = offsets.desc as usize + RING_SIZE as usize * size_of::<T>();
        let map = Mapping::new(len, libc::MAP_SHARED, socket.as_raw_fd(), page_offset)?;
        let at = |offset: u64| {
            // SAFETY: the kernel's offsets lie inside the mapping, which is
            // page aligned, and each field is aligned for its type.
            unsafe { NonNull::new_unchecked(map.ptr.as_ptr().add(offset as usize)) }
        };
        Ok(Ring {
            producer: at(offsets.producer).cast(),
            consumer: at(offsets.consumer).cast(),
            entries: at(offsets.desc).cast(),
            map,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into `self.map`, alive as long as `self`; the
        // kernel accesses the index atomically too.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.consumer.as_ref() }
    }

    fn slot(&self, index: u32) -> *mut T {
        debug_assert!(self.map.len >= size_of::<T>() * RING_SIZE as usize);
        // SAFETY: `index & (RING_SIZE - 1)` is within the ring's entries.
        unsafe {
            self.entries
                .as_ptr()
                .add((index & (RING_SIZE - 1)) as usize)
        }
    }

    /// Free entries, on a ring we produce to (fill, tx).
    fn free_slots(&self) -> usize {
        let ours = self.producer().load(Ordering::Relaxed);
        let theirs = self.consumer().load(Ordering::Acquire);
        (RING_SIZE - ours.wrapping_sub(theirs)) as usize
    }

    /// Entries produced and not yet consumed by the kernel, on a ring we
    /// produce to.
    fn pending(&self) -> usize {
        RING_SIZE as usize - self.free_slots()
    }

    /// Entries ready for us, on a ring we consume from (rx, completion).
    fn available(&self) -> usize {
        let theirs = self.producer().load(Ordering::Acquire);
        let ours = self.consumer().load(Ordering::Relaxed);
        theirs.wrapping_sub(ours) as usize
    }

    /// Writes entries while there is room; returns how many.
    fn produce(&mut self, entries: impl Iterator<Item = T>) -> usize {
        let start = self.producer().load(Ordering::Relaxed);
        let room = self.free_slots();
        let mut count = 0;
        for entry in entries.take(room) {
            // SAFETY: the slot is free: the kernel consumed it (acquire
            // load in `free_slots`) and will not read it before the
            // release store below.
            unsafe { self.slot(start.wrapping_add(count)).write(entry) };
            count += 1;
        }
        self.producer()
            .store(start.wrapping_add(count), Ordering::Release);
        count as usize
    }

    /// Reads up to `max` entries; returns how many.
    fn consume(&mut self, max: usize, mut each: impl FnMut(T)) -> usize {
        let start = self.consumer().load(Ordering::Relaxed);
        let count = self.available().min(max);
        for i in 0..count as u32 {
            // SAFETY: the kernel produced this slot (acquire load in
            // `available`) and will not reuse it before the release store
            // below.
            each(unsafe { self.slot(start.wrapping_add(i)).read() });
        }
        self.consumer()
            .store(start.wrapping_add(count as u32), Ordering::Release);
        count
    }
}
