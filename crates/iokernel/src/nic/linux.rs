//! Opening a NIC backend on a real Linux interface from a spec string
//! ([`af_packet`](super::af_packet) or [`af_xdp`](super::af_xdp); what the
//! two share is in `linux_link.rs`).
//!
//! A spec is `software`, `af_packet:IFNAME`, `af_xdp:IFNAME` or
//! `af_xdp:IFNAME,direct` (ready for applications' own sockets, the direct
//! path: docs/direct-path.md). The software
//! switch is iokerneld's own (ports borrow the switch), so [`open`] opens
//! only the two Linux links; [`NicSpec::parse`] tells the caller which one it
//! has.

use std::fmt;

use super::af_packet::AfPacket;
use super::af_xdp::AfXdp;
use super::linux_link::check_ifname;
pub use super::linux_link::{LinkDrops, LinkStats, NicError, MIN_BUFFER_SIZE};
use super::{BufferPool, Frame, Nic};

/// Which backend a spec string names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicSpec {
    Software,
    AfPacket { ifname: String },
    AfXdp { ifname: String, direct_path: bool },
}

impl NicSpec {
    pub fn parse(spec: &str) -> Result<NicSpec, NicError> {
        let (backend, name) = match spec.split_once(':') {
            Some((backend, name)) => (backend, Some(name)),
            None => (spec, None),
        };
        let ifname = |backend: &'static str| match name {
            None | Some("") => Err(NicError::MissingInterface { backend }),
            Some(name) => check_ifname(name).map(|()| name.to_string()),
        };
        match backend {
            "software" if name.is_none() => Ok(NicSpec::Software),
            "af_packet" => Ok(NicSpec::AfPacket {
                ifname: ifname("af_packet")?,
            }),
            "af_xdp" => {
                let (name, direct_path) = match name.and_then(|n| n.strip_suffix(",direct")) {
                    Some(bare) => (Some(bare), true),
                    None => (name, false),
                };
                let ifname = match name {
                    None | Some("") => Err(NicError::MissingInterface { backend: "af_xdp" }),
                    Some(name) => check_ifname(name).map(|()| name.to_string()),
                }?;
                Ok(NicSpec::AfXdp {
                    ifname,
                    direct_path,
                })
            }
            _ => Err(NicError::UnknownBackend(spec.to_string())),
        }
    }
}

impl fmt::Display for NicSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicSpec::Software => write!(f, "software"),
            NicSpec::AfPacket { ifname } => write!(f, "af_packet:{ifname}"),
            NicSpec::AfXdp {
                ifname,
                direct_path,
            } => {
                let direct = if *direct_path { ",direct" } else { "" };
                write!(f, "af_xdp:{ifname}{direct}")
            }
        }
    }
}

/// Opens the Linux link a spec names, with a pool of `pool_buffers` buffers
/// of `buffer_size` bytes for its frames.
pub fn open(
    spec: &str,
    pool_buffers: usize,
    buffer_size: usize,
) -> Result<Box<dyn Nic + Send>, NicError> {
    Ok(Box::new(open_link(spec, pool_buffers, buffer_size)?))
}

/// [`open`], keeping the concrete link (for its [`stats`](LinuxNic::stats)).
pub fn open_link(
    spec: &str,
    pool_buffers: usize,
    buffer_size: usize,
) -> Result<LinuxNic, NicError> {
    match NicSpec::parse(spec)? {
        NicSpec::Software => Err(NicError::NotALink),
        NicSpec::AfPacket { ifname } => Ok(LinuxNic::AfPacket(AfPacket::open(
            &ifname,
            pool_buffers,
            buffer_size,
        )?)),
        NicSpec::AfXdp {
            ifname,
            direct_path,
        } => {
            let link = AfXdp::open_with(&ifname, pool_buffers, buffer_size, direct_path)?;
            Ok(LinuxNic::AfXdp(link))
        }
    }
}

/// Either Linux backend.
// One per iokerneld, made once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum LinuxNic {
    AfPacket(AfPacket),
    AfXdp(AfXdp),
}

impl LinuxNic {
    pub fn stats(&self) -> LinkStats {
        match self {
            LinuxNic::AfPacket(link) => link.stats(),
            LinuxNic::AfXdp(link) => link.stats(),
        }
    }
}

impl Nic for LinuxNic {
    fn pool(&self) -> &BufferPool {
        match self {
            LinuxNic::AfPacket(link) => link.pool(),
            LinuxNic::AfXdp(link) => link.pool(),
        }
    }

    fn pool_mut(&mut self) -> &mut BufferPool {
        match self {
            LinuxNic::AfPacket(link) => link.pool_mut(),
            LinuxNic::AfXdp(link) => link.pool_mut(),
        }
    }

    fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match self {
            LinuxNic::AfPacket(link) => link.wait_fd(),
            LinuxNic::AfXdp(link) => link.wait_fd(),
        }
    }

    fn settled(&self) -> bool {
        match self {
            LinuxNic::AfPacket(link) => link.settled(),
            LinuxNic::AfXdp(link) => link.settled(),
        }
    }

    fn claim_address(&mut self, ip: std::net::Ipv4Addr) -> Result<(), String> {
        match self {
            LinuxNic::AfPacket(link) => link.claim_address(ip),
            LinuxNic::AfXdp(link) => link.claim_address(ip),
        }
    }

    fn release_address(&mut self, ip: std::net::Ipv4Addr) {
        match self {
            LinuxNic::AfPacket(link) => link.release_address(ip),
            LinuxNic::AfXdp(link) => link.release_address(ip),
        }
    }

    fn attach_own_socket(
        &mut self,
        ip: std::net::Ipv4Addr,
        queue: u32,
        socket: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), String> {
        match self {
            LinuxNic::AfPacket(link) => link.attach_own_socket(ip, queue, socket),
            LinuxNic::AfXdp(link) => link.attach_own_socket(ip, queue, socket),
        }
    }

    fn detach_own_socket(&mut self, ip: std::net::Ipv4Addr) {
        match self {
            LinuxNic::AfPacket(link) => link.detach_own_socket(ip),
            LinuxNic::AfXdp(link) => link.detach_own_socket(ip),
        }
    }

    fn rx_burst(&mut self, out: &mut Vec<Frame>, max: usize) -> usize {
        match self {
            LinuxNic::AfPacket(link) => link.rx_burst(out, max),
            LinuxNic::AfXdp(link) => link.rx_burst(out, max),
        }
    }

    fn tx_burst(&mut self, frames: &mut Vec<Frame>) -> usize {
        match self {
            LinuxNic::AfPacket(link) => link.tx_burst(frames),
            LinuxNic::AfXdp(link) => link.tx_burst(frames),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_or_say_what_is_expected() {
        assert_eq!(NicSpec::parse("software").unwrap(), NicSpec::Software);
        assert_eq!(
            NicSpec::parse("af_packet:veth0").unwrap(),
            NicSpec::AfPacket {
                ifname: "veth0".into()
            }
        );
        assert_eq!(
            NicSpec::parse("af_xdp:eth1").unwrap().to_string(),
            "af_xdp:eth1"
        );
        assert_eq!(
            NicSpec::parse("af_xdp:eth1,direct").unwrap(),
            NicSpec::AfXdp {
                ifname: "eth1".into(),
                direct_path: true
            }
        );
        assert_eq!(
            NicSpec::parse("af_xdp:eth1,direct").unwrap().to_string(),
            "af_xdp:eth1,direct"
        );
        assert!(matches!(
            NicSpec::parse("af_xdp:,direct"),
            Err(NicError::MissingInterface { .. })
        ));
        assert_eq!(
            NicSpec::parse("foo").unwrap_err().to_string(),
            "unknown NIC backend \"foo\": expected software, af_packet:IFNAME or af_xdp:IFNAME"
        );
        assert_eq!(
            NicSpec::parse("af_xdp").unwrap_err().to_string(),
            "af_xdp needs an interface: af_xdp:IFNAME"
        );
        assert!(matches!(
            NicSpec::parse("af_packet:a-name-far-too-long"),
            Err(NicError::BadInterfaceName(_))
        ));
        assert!(matches!(
            NicSpec::parse("software:eth0"),
            Err(NicError::UnknownBackend(_))
        ));
    }

    #[test]
    fn a_missing_interface_is_named() {
        let error = open("af_packet:gznoexist9", 8, 2048).err().unwrap();
        assert_eq!(error.to_string(), "interface \"gznoexist9\" does not exist");
        assert!(matches!(open("software", 8, 2048), Err(NicError::NotALink)));
    }
}
