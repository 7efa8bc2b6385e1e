//! AF_XDP sockets: a UMEM (the frames' memory), the four rings shared with
//! the kernel, and the bind to one queue of one interface. Both iokerneld
//! (its switch-path socket, `ginza_iokernel::nic::af_xdp`) and a runtime
//! (an application's own socket on the direct path, docs/direct-path.md)
//! open them here, so the runtime never depends on the daemon.
//!
//! * [`Umem`]: `chunks` chunks of `chunk_size` bytes, private anonymous
//!   memory (one socket's, the isolated case) or a shared mapping of a
//!   memfd (the opt-in: another process maps the same frames).
//! * [`Xsk::open`]: registers the UMEM (or shares another socket's with
//!   `XDP_SHARED_UMEM`), creates and maps the rings, binds. The rings are
//!   public ([`Rings`]): their owner decides what goes on them.
//! * [`Xsk::kick`]: in copy mode the kernel transmits only inside a system
//!   call (`sendto`), at most 32 frames per call.
//!
//! Needs `CAP_NET_RAW` (the socket) and, for the bind, a queue no other
//! socket holds.

pub mod ring;

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ring::Mapping;
pub use ring::{Ring, RingIndices};

/// A descriptor on the rx and tx rings: a UMEM address and a length.
pub type Desc = libc::xdp_desc;

/// How long [`Xsk::open`] retries a queue still held by a socket closed
/// just before: the kernel frees it later, in a work item, which a loaded
/// machine runs late (more than the 1 s this once was, seen in the
/// workspace's tests beside an hour-long soak).
const BIND_RETRY: Duration = Duration::from_secs(5);

/// A failed step of opening a socket: which, and the kernel's error.
#[derive(Debug)]
pub struct XskError {
    pub step: &'static str,
    pub error: io::Error,
}

impl std::fmt::Display for XskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.error)
    }
}

impl std::error::Error for XskError {}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> XskError {
    move |error| XskError { step, error }
}

/// The memory frames live in, registered with the kernel.
pub struct Umem {
    map: Mapping,
    chunk_size: usize,
}

impl Umem {
    /// `chunks` chunks of `chunk_size` bytes (a power of two, 2048 to
    /// 4096) of this process's private memory: no other process can see
    /// them.
    pub fn private(chunks: usize, chunk_size: usize) -> io::Result<Umem> {
        let len = check_size(chunks, chunk_size)?;
        Ok(Umem {
            map: Mapping::anonymous(len)?,
            chunk_size,
        })
    }

    /// The same, over the first bytes of `memfd`, mapped shared: a process
    /// given the memfd maps the same frames (a shared UMEM, the opt-in of
    /// applications that trust each other).
    pub fn shared(memfd: BorrowedFd<'_>, chunks: usize, chunk_size: usize) -> io::Result<Umem> {
        let len = check_size(chunks, chunk_size)?;
        Ok(Umem {
            map: Mapping::shared(memfd, len, 0)?,
            chunk_size,
        })
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Chunks in the UMEM.
    pub fn chunks(&self) -> usize {
        self.map.len() / self.chunk_size
    }

    /// The UMEM address of chunk `index`.
    pub fn chunk_addr(&self, index: usize) -> u64 {
        (index * self.chunk_size) as u64
    }

    /// The chunk an address lies in (the kernel may hand back an address
    /// with an offset into its chunk).
    pub fn chunk_of(&self, addr: u64) -> u64 {
        addr - addr % self.chunk_size as u64
    }

    /// The `len` bytes at `addr`, or `None` if they are not all inside one
    /// chunk of the UMEM (a descriptor from the kernel never is; one from
    /// anyone else is untrusted).
    pub fn bytes(&self, addr: u64, len: u32) -> Option<&[u8]> {
        let (start, end) = self.span(addr, len)?;
        // SAFETY: `start..end` lies inside the mapping, alive as long as
        // `self`. The kernel writes only chunks on the fill ring, which the
        // owner does not read until the rx ring hands them back.
        Some(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(start), end - start) })
    }

    /// The same, writable, through a shared reference: for a UMEM several
    /// threads use, each writing only chunks it owns.
    ///
    /// # Safety
    /// The chunk is on no ring (the kernel neither reads nor writes it) and
    /// no other reference to these bytes is alive while the slice is.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_unshared(&self, addr: u64, len: u32) -> Option<&mut [u8]> {
        let (start, end) = self.span(addr, len)?;
        // SAFETY: `start..end` lies inside the mapping, alive as long as
        // `self`; the caller's contract makes this slice the only access.
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(start), end - start) })
    }

    /// The same, writable (a frame built for the tx ring).
    pub fn bytes_mut(&mut self, addr: u64, len: u32) -> Option<&mut [u8]> {
        let (start, end) = self.span(addr, len)?;
        // SAFETY: as in `bytes`, and `&mut self` makes this the only slice;
        // the owner writes only chunks that are on no ring.
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(start), end - start) })
    }

    fn span(&self, addr: u64, len: u32) -> Option<(usize, usize)> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len as usize)?;
        let chunk_end = (start / self.chunk_size + 1) * self.chunk_size;
        (end <= chunk_end && end <= self.map.len()).then_some((start, end))
    }
}

// SAFETY: through `&self` the UMEM is only read (`bytes`) or written under
// the contract of `bytes_unshared`, which rules out a data race; the
// mapping is plain memory, usable from any thread.
unsafe impl Sync for Umem {}

fn check_size(chunks: usize, chunk_size: usize) -> io::Result<usize> {
    if !chunk_size.is_power_of_two() || !(2048..=4096).contains(&chunk_size) || chunks == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a UMEM of {chunks} chunks of {chunk_size} bytes: chunks must be 2048 or 4096 bytes, at least one"),
        ));
    }
    chunks
        .checked_mul(chunk_size)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "UMEM size overflows"))
}

/// Whose UMEM a socket uses.
#[derive(Clone, Copy, Debug)]
pub enum UmemOwner<'a> {
    /// Its own: registered on this socket (`XDP_UMEM_REG`).
    Own,
    /// That of `socket`, an AF_XDP socket bound to another queue (or
    /// device): `XDP_SHARED_UMEM`. This socket has fill and completion
    /// rings of its own and the owner's bind mode; the [`Umem`] given to
    /// [`Xsk::open`] must map the same memory (the kernel cannot check a
    /// view).
    SharedWith(BorrowedFd<'a>),
}

/// How the kernel moves frames between the device and the UMEM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindMode {
    /// Copies (`XDP_COPY`): any driver, veth included.
    Copy,
    /// The kernel's choice: zero copy where the driver has it.
    Any,
}

/// The four rings of a socket.
pub struct Rings {
    /// Chunks lent to the kernel for reception.
    pub fill: Ring<u64>,
    /// Chunks the kernel has finished sending.
    pub completion: Ring<u64>,
    /// Frames received.
    pub rx: Ring<Desc>,
    /// Frames to send.
    pub tx: Ring<Desc>,
}

/// An AF_XDP socket bound to one queue of one interface, with its rings
/// and its view of the UMEM.
///
/// Fields are dropped in order: the socket is closed before the memory it
/// uses is unmapped.
pub struct Xsk {
    socket: OwnedFd,
    rings: Rings,
    umem: Umem,
    ifindex: u32,
    queue: u32,
}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk")
            .field("fd", &self.socket.as_raw_fd())
            .field("ifindex", &self.ifindex)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl Xsk {
    /// A socket on `queue` of `ifindex` over `umem`, every ring of
    /// `ring_size` entries (a power of two). The fill ring starts empty:
    /// the caller lends chunks to it.
    pub fn open(
        ifindex: u32,
        queue: u32,
        umem: Umem,
        owner: UmemOwner<'_>,
        ring_size: u32,
        mode: BindMode,
    ) -> Result<Xsk, XskError> {
        if !ring_size.is_power_of_two() {
            return Err(XskError {
                step: "ring size",
                error: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{ring_size} entries: not a power of two"),
                ),
            });
        }
        // SAFETY: plain syscall with integer arguments.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(step("socket(AF_XDP)")(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by socket() and nothing else owns it.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        if let UmemOwner::Own = owner {
            let registration = libc::xdp_umem_reg {
                addr: umem.map.as_ptr() as u64,
                len: umem.map.len() as u64,
                chunk_size: umem.chunk_size as u32,
                headroom: 0,
                flags: 0,
                tx_metadata_len: 0,
            };
            set_option(socket.as_fd(), libc::XDP_UMEM_REG, &registration)
                .map_err(step("XDP_UMEM_REG"))?;
        }
        for (option, what) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
            (libc::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            set_option(socket.as_fd(), option, &ring_size).map_err(step(what))?;
        }
        // SAFETY: `xdp_mmap_offsets` is plain integers.
        let offsets =
            unsafe { get_option::<libc::xdp_mmap_offsets>(socket.as_fd(), libc::XDP_MMAP_OFFSETS) }
                .map_err(step("XDP_MMAP_OFFSETS"))?;
        let fd = socket.as_fd();
        let rings = Rings {
            fill: Ring::map(fd, &offsets.fr, libc::XDP_UMEM_PGOFF_FILL_RING, ring_size)
                .map_err(step("mmap of the fill ring"))?,
            completion: Ring::map(
                fd,
                &offsets.cr,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING,
                ring_size,
            )
            .map_err(step("mmap of the completion ring"))?,
            rx: Ring::map(fd, &offsets.rx, libc::XDP_PGOFF_RX_RING as u64, ring_size)
                .map_err(step("mmap of the rx ring"))?,
            tx: Ring::map(fd, &offsets.tx, libc::XDP_PGOFF_TX_RING as u64, ring_size)
                .map_err(step("mmap of the tx ring"))?,
        };
        bind(&socket, ifindex, queue, owner, mode)?;
        Ok(Xsk {
            socket,
            rings,
            umem,
            ifindex,
            queue,
        })
    }

    /// The socket (to put in an XSKMAP, to poll, to pass to another
    /// process).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    pub fn queue(&self) -> u32 {
        self.queue
    }

    pub fn rings(&mut self) -> &mut Rings {
        &mut self.rings
    }

    /// Read access to the rings' indices (`&self`).
    pub fn rings_ref(&self) -> &Rings {
        &self.rings
    }

    pub fn umem(&self) -> &Umem {
        &self.umem
    }

    /// The rings and the UMEM at once (a burst reads descriptors off one
    /// and bytes out of the other).
    pub fn split(&mut self) -> (&mut Rings, &mut Umem) {
        (&mut self.rings, &mut self.umem)
    }

    /// The socket, its rings and its UMEM apart, for owners that lock the
    /// receive and the transmit rings separately. Any order of dropping
    /// them is sound: the kernel holds its own references to the rings'
    /// and the UMEM's pages while the socket lives.
    pub fn into_parts(self) -> (OwnedFd, Rings, Umem) {
        (self.socket, self.rings, self.umem)
    }

    /// The kernel's counters for this socket (`XDP_STATISTICS`).
    pub fn statistics(&self) -> io::Result<libc::xdp_statistics> {
        // SAFETY: `xdp_statistics` is plain integers.
        unsafe { get_option(self.socket.as_fd(), libc::XDP_STATISTICS) }
    }

    /// Makes the kernel transmit what is on the tx ring: one zero-length
    /// `sendto`. In copy mode that sends at most 32 frames; `EAGAIN`,
    /// `EBUSY` and `ENOBUFS` mean "try again".
    pub fn kick(&self) -> io::Result<()> {
        kick(self.socket.as_fd())
    }
}

/// [`Xsk::kick`] on a socket taken apart with [`Xsk::into_parts`].
pub fn kick(socket: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a zero-length send with no address on a valid socket.
    let sent = unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null(),
            0,
        )
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn bind(
    socket: &OwnedFd,
    ifindex: u32,
    queue: u32,
    owner: UmemOwner<'_>,
    mode: BindMode,
) -> Result<(), XskError> {
    // SAFETY: `sockaddr_xdp` is plain integers; all zero is valid.
    let mut address: libc::sockaddr_xdp = unsafe { zeroed() };
    address.sxdp_family = libc::AF_XDP as u16;
    address.sxdp_flags = match mode {
        BindMode::Copy => libc::XDP_COPY,
        BindMode::Any => 0,
    };
    address.sxdp_ifindex = ifindex;
    address.sxdp_queue_id = queue;
    if let UmemOwner::SharedWith(other) = owner {
        // No mode flag beside it: the mode is the UMEM owner's.
        address.sxdp_flags = libc::XDP_SHARED_UMEM;
        address.sxdp_shared_umem_fd = other.as_raw_fd() as u32;
    }
    // A socket closed on this queue frees it only later, in a kernel work
    // item: "busy" right after a close (a restart, a test reopening the
    // link) is retried for up to a second.
    let deadline = Instant::now() + BIND_RETRY;
    loop {
        // SAFETY: `address` is a valid sockaddr_xdp and the length is its
        // size.
        let bound = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&address as *const libc::sockaddr_xdp).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if bound == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= deadline {
            return Err(XskError {
                step: "bind (AF_XDP)",
                error,
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `setsockopt(SOL_XDP, option)` with a `T`.
fn set_option<T>(socket: BorrowedFd<'_>, option: libc::c_int, value: &T) -> io::Result<()> {
    crate::socket::set_option(socket, libc::SOL_XDP, option, value)
}

/// `getsockopt(SOL_XDP, option)` into a `T`.
///
/// # Safety
/// As [`crate::socket::get_option`].
unsafe fn get_option<T>(socket: BorrowedFd<'_>, option: libc::c_int) -> io::Result<T> {
    // SAFETY: the caller's contract.
    unsafe { crate::socket::get_option(socket, libc::SOL_XDP, option) }
}

/// The indices of the rx ring of `socket`, an AF_XDP socket another
/// process made and bound, mapped read-only: the frames waiting on it
/// (iokerneld's congestion detection for an application's own socket).
pub fn rx_indices(socket: BorrowedFd<'_>) -> Result<RingIndices, XskError> {
    // SAFETY: `xdp_mmap_offsets` is plain integers.
    let offsets = unsafe { get_option::<libc::xdp_mmap_offsets>(socket, libc::XDP_MMAP_OFFSETS) }
        .map_err(step("XDP_MMAP_OFFSETS"))?;
    RingIndices::map(socket, &offsets.rx, libc::XDP_PGOFF_RX_RING as u64)
        .map_err(step("mmap of the rx ring (read-only)"))
}

/// Whether `fd` is an AF_XDP socket (`SO_DOMAIN`): what iokerneld checks
/// of a descriptor an application hands it as its own socket.
pub fn is_xsk(fd: BorrowedFd<'_>) -> bool {
    let mut domain: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `domain` and `len` are valid for writes; `len` holds its size.
    let result = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut domain as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    result == 0 && domain == libc::AF_XDP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn umem_spans_stay_inside_one_chunk() {
        let mut umem = Umem::private(4, 2048).unwrap();
        assert_eq!(umem.chunks(), 4);
        assert_eq!(umem.chunk_addr(3), 6144);
        assert_eq!(umem.chunk_of(6144 + 300), 6144);
        assert_eq!(umem.bytes(2048, 2048).map(<[u8]>::len), Some(2048));
        assert!(umem.bytes(2047, 2).is_none(), "across two chunks");
        assert!(umem.bytes(8192, 1).is_none(), "past the end");
        assert!(umem.bytes(u64::MAX, 1).is_none());
        umem.bytes_mut(4096, 3).unwrap().copy_from_slice(b"abc");
        assert_eq!(umem.bytes(4096, 3).unwrap(), b"abc");
    }

    #[test]
    fn bad_umem_sizes_are_refused_with_the_reason() {
        for (chunks, size) in [(4, 1000), (4, 8192), (0, 2048)] {
            let e = Umem::private(chunks, size).err().unwrap();
            assert!(e.to_string().contains("chunks must be"), "{e}");
        }
    }
}
