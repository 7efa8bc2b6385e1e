//! What the Linux backends ([`af_packet`](super::af_packet),
//! [`af_xdp`](super::af_xdp)) share: errors, counters, socket options,
//! interface look-up. Apart from [`linux`](super::linux), which opens
//! either backend, so that the backends do not import their opener.

use std::ffi::CString;
use std::io;

/// The smallest buffer that holds a minimum Ethernet frame (60 bytes without
/// FCS): smaller buffers would drop everything as oversized.
pub const MIN_BUFFER_SIZE: usize = 64;

/// An Ethernet header: destination, source, EtherType.
pub(crate) const ETHERNET_HEADER_LEN: usize = 14;

#[derive(Debug, thiserror::Error)]
pub enum NicError {
    #[error("unknown NIC backend \"{0}\": expected software, af_packet:IFNAME or af_xdp:IFNAME")]
    UnknownBackend(String),
    #[error("{backend} needs an interface: {backend}:IFNAME")]
    MissingInterface { backend: &'static str },
    #[error("\"{0}\" is not an interface name (1 to 15 bytes, no '/', ':', NUL or white space)")]
    BadInterfaceName(String),
    #[error("interface \"{0}\" does not exist")]
    NoSuchInterface(String),
    #[error("{backend} needs root ({capabilities})")]
    NeedsRoot {
        backend: &'static str,
        capabilities: &'static str,
    },
    #[error("the software backend is iokerneld's built-in switch, not a link to open")]
    NotALink,
    #[error("a pool of {buffers} buffers of {buffer_size} bytes: need at least one buffer of at least {MIN_BUFFER_SIZE} bytes")]
    BadPool { buffers: usize, buffer_size: usize },
    #[error("{backend} on \"{ifname}\": {what}: {source}")]
    Io {
        backend: &'static str,
        ifname: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Counters of a Linux link, the same for both backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames handed to the caller by `rx_burst`, and their bytes.
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames the kernel accepted for transmission, and their bytes.
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub drops: LinkDrops,
}

/// Frames lost, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkDrops {
    /// Received frames longer than a pool buffer: dropped whole, never
    /// truncated.
    pub rx_oversized: u64,
    /// Frames the kernel dropped before we read them (socket buffer or rx
    /// ring full, no fill-ring entry), as the kernel reports them.
    pub rx_kernel: u64,
    /// Receive calls that failed with an unexpected error.
    pub rx_errors: u64,
    /// Frames taken by `tx_burst` that the interface refused as too long
    /// (EMSGSIZE: longer than its MTU plus the Ethernet header).
    pub tx_oversized: u64,
    /// Frames taken by `tx_burst` shorter than an Ethernet header.
    pub tx_runt: u64,
    /// Frames taken by `tx_burst` that the kernel refused otherwise
    /// (interface down, ...).
    pub tx_errors: u64,
}

impl LinkDrops {
    pub fn total(&self) -> u64 {
        self.rx_oversized
            + self.rx_kernel
            + self.rx_errors
            + self.tx_oversized
            + self.tx_runt
            + self.tx_errors
    }
}

/// Checks a backend's pool size and resolves `ifname`: what both Linux
/// backends do first.
pub(crate) fn check_pool_and_ifindex(
    ifname: &str,
    pool_buffers: usize,
    buffer_size: usize,
) -> Result<u32, NicError> {
    if pool_buffers == 0 || buffer_size < MIN_BUFFER_SIZE || buffer_size > u32::MAX as usize {
        return Err(NicError::BadPool {
            buffers: pool_buffers,
            buffer_size,
        });
    }
    ifindex(ifname)
}

/// Turns a failed system call of `backend` on `ifname` into its error:
/// `EPERM` names the capabilities it needs.
pub(crate) fn io_error<'a>(
    backend: &'static str,
    capabilities: &'static str,
    ifname: &'a str,
) -> impl Fn(&'static str, io::Error) -> NicError + 'a {
    move |what, source| {
        if source.raw_os_error() == Some(libc::EPERM) {
            NicError::NeedsRoot {
                backend,
                capabilities,
            }
        } else {
            NicError::Io {
                backend,
                ifname: ifname.to_string(),
                what,
                source,
            }
        }
    }
}

/// `setsockopt(fd, level, option)` with a `T` (`ginza_sys::socket`).
pub(crate) fn set_socket_option<T>(
    fd: &std::os::fd::OwnedFd,
    level: libc::c_int,
    option: libc::c_int,
    value: &T,
) -> io::Result<()> {
    use std::os::fd::AsFd;
    ginza_sys::socket::set_option(fd.as_fd(), level, option, value)
}

/// `getsockopt(fd, level, option)` into a `T` (`ginza_sys::socket`).
///
/// # Safety
/// As `ginza_sys::socket::get_option`: `T` is the option's C struct of
/// plain integers.
pub(crate) unsafe fn get_socket_option<T>(
    fd: &std::os::fd::OwnedFd,
    level: libc::c_int,
    option: libc::c_int,
) -> io::Result<T> {
    use std::os::fd::AsFd;
    // SAFETY: the caller's contract.
    unsafe { ginza_sys::socket::get_option(fd.as_fd(), level, option) }
}

pub(crate) fn check_ifname(name: &str) -> Result<(), NicError> {
    let ok = !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace());
    if ok {
        Ok(())
    } else {
        Err(NicError::BadInterfaceName(name.to_string()))
    }
}

/// The interface's index, or [`NicError::NoSuchInterface`].
pub(crate) fn ifindex(ifname: &str) -> Result<u32, NicError> {
    check_ifname(ifname)?;
    let c_name = CString::new(ifname).expect("checked: no NUL");
    // SAFETY: `c_name` is a valid NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        return Err(NicError::NoSuchInterface(ifname.to_string()));
    }
    Ok(index)
}
