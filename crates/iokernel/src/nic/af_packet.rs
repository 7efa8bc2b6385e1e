//! A [`Nic`] on a real Linux interface through an `AF_PACKET` raw socket
//! (docs/design.md, "NIC backends"): the portable fallback to [`af_xdp`](super::af_xdp).
//!
//! * One `SOCK_RAW` socket for `ETH_P_ALL`, bound to the interface by index,
//!   non-blocking. Plain `recvfrom`/`send` per frame, straight into and out
//!   of the [`BufferPool`]'s buffers: one system call per frame, but no ring
//!   to size and no block timeout (TPACKET_V3 would add a 1 ms tail).
//! * Promiscuous (`PACKET_MR_PROMISC` membership, undone by the kernel when
//!   the socket closes): iokerneld answers for application MACs that are not
//!   the interface's own.
//! * Frames we send come back to a packet socket as `PACKET_OUTGOING`; they
//!   are refused with `PACKET_IGNORE_OUTGOING` and, on kernels before 4.20
//!   where that option fails, skipped by their packet type.
//! * `recvfrom` is called with `MSG_TRUNC`, which makes it return the frame's
//!   real length: a frame longer than a buffer is dropped and counted
//!   ([`LinkDrops::rx_oversized`]), never delivered truncated.
//! * When the pool is empty `rx_burst` stops reading: frames wait in the
//!   socket's buffer and, when that overflows, the kernel drops them
//!   ([`LinkDrops::rx_kernel`], from `PACKET_STATISTICS`).
//!
//! The checksums of frames a local stack sends through a veth pair may be
//! left for an offload that never happens (`CHECKSUM_PARTIAL`): turn
//! transmit offloads off on the sending end (`ethtool -K IF tx off`).
//!
//! [`LinkDrops::rx_oversized`]: super::linux::LinkDrops::rx_oversized
//! [`LinkDrops::rx_kernel`]: super::linux::LinkDrops::rx_kernel

use std::cell::Cell;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::linux_link::{
    check_pool_and_ifindex, get_socket_option, io_error, set_socket_option, LinkStats, NicError,
    ETHERNET_HEADER_LEN,
};
use super::{BufferPool, Frame, Nic};
use ginza_sys::hops::{self, Hop};

const BACKEND: &str = "af_packet";

/// An `AF_PACKET` socket on one interface and the pool its frames live in.
#[derive(Debug)]
pub struct AfPacket {
    fd: OwnedFd,
    ifname: String,
    ifindex: u32,
    pool: BufferPool,
    stats: LinkStats,
    /// `PACKET_STATISTICS` resets on each read, so its drops are summed
    /// here; a `Cell` lets [`stats`](AfPacket::stats) take `&self`.
    kernel_drops: Cell<u64>,
}

impl AfPacket {
    /// Opens `ifname` with a pool of `pool_buffers` buffers of `buffer_size`
    /// bytes. Needs `CAP_NET_RAW`.
    pub fn open(
        ifname: &str,
        pool_buffers: usize,
        buffer_size: usize,
    ) -> Result<AfPacket, NicError> {
        let ifindex = check_pool_and_ifindex(ifname, pool_buffers, buffer_size)?;
        let io_error = io_error(BACKEND, "CAP_NET_RAW", ifname);
        let fd =
            promiscuous_socket(ifindex).map_err(|e| io_error("promiscuous packet socket", e))?;
        // Best effort: the kernel may predate the option (4.20); rx_burst
        // skips outgoing frames by their type anyway.
        let _ = set_option(&fd, libc::PACKET_IGNORE_OUTGOING, &1 as &libc::c_int);

        // SAFETY: `sockaddr_ll` is plain integers; all zero is valid.
        let mut address: libc::sockaddr_ll = unsafe { zeroed() };
        address.sll_family = libc::AF_PACKET as libc::c_ushort;
        address.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        address.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `address` is a valid sockaddr_ll and the length is its size.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&address as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(io_error("bind", io::Error::last_os_error()));
        }
        Ok(AfPacket {
            fd,
            ifname: ifname.to_string(),
            ifindex,
            pool: BufferPool::new(pool_buffers, buffer_size),
            stats: LinkStats::default(),
            kernel_drops: Cell::new(0),
        })
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The counters so far, including the kernel's drops on this socket.
    pub fn stats(&self) -> LinkStats {
        // SAFETY: `tpacket_stats` is plain integers.
        let read = unsafe {
            get_socket_option::<libc::tpacket_stats>(
                &self.fd,
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
            )
        };
        // The kernel resets its counters on each read: keep the sum.
        if let Ok(kernel) = read {
            self.kernel_drops
                .set(self.kernel_drops.get() + u64::from(kernel.tp_drops));
        }
        let mut stats = self.stats;
        stats.drops.rx_kernel = self.kernel_drops.get();
        stats
    }

    /// Reads one frame into `frame`'s buffer: `Ok(Some(length))` (the real
    /// length, which may exceed the buffer), `Ok(None)` for a frame of
    /// ours coming back, `Err` for would-block and errors.
    fn receive_into(&mut self, frame: &mut Frame) -> io::Result<Option<usize>> {
        let buffer = self.pool.buffer_mut(frame);
        // SAFETY: `sockaddr_ll` is plain integers; all zero is valid.
        let mut from: libc::sockaddr_ll = unsafe { zeroed() };
        let mut from_len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `buffer` is valid for writes of its length; `from` and
        // `from_len` are valid for writes and `from_len` holds its size.
        let received = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut from_len,
            )
        };
        if received < 0 {
            return Err(io::Error::last_os_error());
        }
        if from.sll_pkttype == libc::PACKET_OUTGOING {
            return Ok(None);
        }
        Ok(Some(received as usize))
    }
}

impl Nic for AfPacket {
    fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The packet socket: readable while a frame waits in it.
    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(&self.fd))
    }

    fn pool_mut(&mut self) -> &mut BufferPool {
        &mut self.pool
    }

    /// Reads at most `max` frames from the socket (frames skipped or dropped
    /// count towards `max`, which bounds the call under a flood).
    fn rx_burst(&mut self, out: &mut Vec<Frame>, max: usize) -> usize {
        let mut delivered = 0;
        for _ in 0..max {
            // No buffer: frames wait in the socket (not a drop, so not
            // counted as the pool's exhaustion either).
            if self.pool.available() == 0 {
                break;
            }
            let mut frame = self.pool.alloc().expect("a buffer is free");
            let result = self.receive_into(&mut frame);
            match result {
                Ok(Some(len)) if len <= self.pool.buffer_size() => {
                    self.pool
                        .set_len(&mut frame, len)
                        .expect("checked against the buffer size");
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += len as u64;
                    hops::stamp(Hop::NicRx);
                    out.push(frame);
                    delivered += 1;
                    continue;
                }
                Ok(Some(_)) => self.stats.drops.rx_oversized += 1,
                Ok(None) => {}
                Err(error) => {
                    let would_block = error.kind() == io::ErrorKind::WouldBlock
                        || error.kind() == io::ErrorKind::Interrupted;
                    if !would_block {
                        self.stats.drops.rx_errors += 1;
                    }
                    free(&mut self.pool, frame);
                    break;
                }
            }
            free(&mut self.pool, frame);
        }
        delivered
    }

    /// Sends frames from the front of `frames` until one is of another pool
    /// or the socket is full (that one and the rest stay with the caller).
    /// A frame the kernel refuses for good (too long, interface down) is
    /// taken, counted and freed.
    fn tx_burst(&mut self, frames: &mut Vec<Frame>) -> usize {
        let mut taken = 0;
        for frame in frames.iter() {
            if !self.pool.owns(frame) {
                break;
            }
            let bytes = self.pool.bytes(frame);
            taken += 1;
            if bytes.len() < ETHERNET_HEADER_LEN {
                self.stats.drops.tx_runt += 1;
                continue;
            }
            hops::stamp(Hop::Kick);
            // SAFETY: `bytes` is valid for reads of its length; the socket
            // is bound, so send() needs no address.
            let sent = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            hops::stamp(Hop::Kicked);
            if sent >= 0 {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += bytes.len() as u64;
            } else {
                match io::Error::last_os_error().raw_os_error() {
                    // Full for now: the caller keeps this frame and retries.
                    Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) => {
                        taken -= 1;
                        break;
                    }
                    Some(libc::EMSGSIZE) => self.stats.drops.tx_oversized += 1,
                    _ => self.stats.drops.tx_errors += 1,
                }
            }
        }
        for frame in frames.drain(..taken) {
            free(&mut self.pool, frame);
        }
        taken
    }
}

fn free(pool: &mut BufferPool, frame: Frame) {
    pool.free(frame)
        .expect("frames handled here come from this pool");
}

fn set_option<T>(fd: &OwnedFd, option: libc::c_int, value: &T) -> io::Result<()> {
    set_socket_option(fd, libc::SOL_PACKET, option, value)
}

/// A non-blocking packet socket that receives nothing yet (protocol 0) and
/// holds the interface in promiscuous mode for as long as it is open.
pub(crate) fn promiscuous_socket(ifindex: u32) -> io::Result<OwnedFd> {
    // Protocol 0 receives nothing until a bind names one, so no frame of
    // another interface slips in before the socket is bound.
    // SAFETY: plain syscall with integer arguments.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just returned by socket() and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `packet_mreq` is plain integers; all zero is valid.
    let mut membership: libc::packet_mreq = unsafe { zeroed() };
    membership.mr_ifindex = ifindex as libc::c_int;
    membership.mr_type = libc::PACKET_MR_PROMISC as libc::c_ushort;
    set_option(&fd, libc::PACKET_ADD_MEMBERSHIP, &membership)?;
    Ok(fd)
}
