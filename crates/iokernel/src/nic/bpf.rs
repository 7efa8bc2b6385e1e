//! iokerneld's XDP program and its maps: which frames of an interface are
//! Ginza's (redirected to iokerneld's AF_XDP socket) and which stay with
//! Linux (`XDP_PASS`), so that the host keeps using the interface
//! iokerneld drives (docs/design.md, "NIC backends").
//!
//! * **Maps.** `ginza_addrs`, a hash map from an IPv4 address (4 bytes, as
//!   on the wire) to a 4-byte value, holds the addresses of the
//!   applications attached to the dataplane (and their aliases): iokerneld
//!   claims one as an application registers and releases it as it leaves
//!   ([`XdpSteering::claim`], counted, so an address two parties claim
//!   stays until both release it). The value 0 means "iokerneld's socket
//!   on the queue the frame came in on"; a value `s + 1` names slot `s` of
//!   `ginza_own`, the XSKMAP of applications' own sockets (the direct path,
//!   docs/direct-path.md), keyed `s × queues + receive queue`
//!   ([`XdpSteering::set_own_socket`]). `ginza_xsks` is the XSKMAP of
//!   iokerneld's sockets, by receive queue.
//! * **Program** (`program.rs`, written with the assembler of `asm.rs`):
//!   IPv4 frames to a claimed address and ARP frames (requests and replies)
//!   whose target is one go to the socket of their queue; everything else
//!   — other addresses, other ARP targets, IPv6, VLAN-tagged and other
//!   ethertypes, truncated or malformed headers — is passed to Linux.
//! * **Attachment** is a BPF link (`BPF_LINK_CREATE`, kernel 5.9): the
//!   program stays on the interface only while the link's descriptor is
//!   open, so a stopped or killed iokerneld leaves nothing behind.
//!
//! The program is ours and small (about 50 instructions), so a small
//! assembler with named instructions and labels, unit-tested against the
//! encodings, checked by the kernel's verifier and by `BPF_PROG_TEST_RUN`
//! in the tests, costs less than a BPF toolchain: `aya`'s program side
//! needs a nightly compiler and `bpf-linker`, and its loader alone would
//! add a large dependency for the five `bpf(2)` commands of `sys.rs`.

pub mod asm;
mod program;
mod sys;

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Addresses the map holds at most (applications and their aliases).
pub const MAX_ADDRESSES: u32 = 1024;
/// The value of a claimed address: iokerneld's socket on the frame's queue.
const TO_IOKERNELD: [u8; 4] = [0; 4];
/// Applications that may have sockets of their own (slots of `ginza_own`).
pub const OWN_SOCKET_SLOTS: u32 = 64;

/// How an XDP program runs on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver, before the kernel allocates a socket buffer (the
    /// driver must support it; veth does).
    Driver,
    /// After the socket buffer is built: any interface, slower.
    Generic,
}

impl XdpMode {
    pub fn name(self) -> &'static str {
        match self {
            XdpMode::Driver => "driver",
            XdpMode::Generic => "generic",
        }
    }

    /// The attach step, for an error.
    pub fn link_create(self) -> &'static str {
        match self {
            XdpMode::Driver => "BPF_LINK_CREATE (XDP, driver mode)",
            XdpMode::Generic => "BPF_LINK_CREATE (XDP, generic mode)",
        }
    }

    fn flags(self) -> u32 {
        match self {
            XdpMode::Driver => sys::XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => sys::XDP_FLAGS_SKB_MODE,
        }
    }
}

/// An XDP program's return value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Aborted,
    Drop,
    /// To the Linux stack.
    Pass,
    Tx,
    /// To the socket the map names.
    Redirect,
    Other(u32),
}

impl Verdict {
    fn from_code(code: u32) -> Verdict {
        match code {
            0 => Verdict::Aborted,
            1 => Verdict::Drop,
            2 => Verdict::Pass,
            3 => Verdict::Tx,
            4 => Verdict::Redirect,
            other => Verdict::Other(other),
        }
    }
}

/// The loaded program and its two maps, not yet attached anywhere.
#[derive(Debug)]
pub struct XdpSteering {
    program: OwnedFd,
    addresses: OwnedFd,
    xsks: OwnedFd,
    /// Applications' own sockets: [`OWN_SOCKET_SLOTS`] × `queues`.
    own: OwnedFd,
    queues: u32,
    /// Claims per address (the map holds each claimed address once).
    claims: HashMap<Ipv4Addr, u32>,
}

/// A failed step of [`XdpSteering`]: which, and the kernel's error.
#[derive(Debug)]
pub struct StepError {
    pub step: &'static str,
    pub error: io::Error,
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.error)
    }
}

impl std::error::Error for StepError {}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> StepError {
    move |error| StepError { step, error }
}

impl XdpSteering {
    /// Creates the maps (`queues` receive queues: socket slots per queue)
    /// and loads the program through the verifier.
    pub fn load(queues: u32) -> Result<XdpSteering, StepError> {
        let xsks = sys::map_create(sys::BPF_MAP_TYPE_XSKMAP, queues, "ginza_xsks")
            .map_err(step("BPF_MAP_CREATE (XSKMAP)"))?;
        let own_entries = OWN_SOCKET_SLOTS.checked_mul(queues).ok_or(StepError {
            step: "BPF_MAP_CREATE (own sockets' XSKMAP)",
            error: io::Error::other(format!("{queues} queues are too many")),
        })?;
        let own = sys::map_create(sys::BPF_MAP_TYPE_XSKMAP, own_entries, "ginza_own")
            .map_err(step("BPF_MAP_CREATE (own sockets' XSKMAP)"))?;
        let addresses = sys::map_create(sys::BPF_MAP_TYPE_HASH, MAX_ADDRESSES, "ginza_addrs")
            .map_err(step("BPF_MAP_CREATE (address hash map)"))?;
        let insns = program::ginza_frames(
            addresses.as_raw_fd(),
            xsks.as_raw_fd(),
            own.as_raw_fd(),
            queues,
        )
        .expect("the program's labels are all placed once, jumps short");
        let program =
            sys::load_xdp_program(&insns, "ginza_steer").map_err(step("BPF_PROG_LOAD"))?;
        Ok(XdpSteering {
            program,
            addresses,
            xsks,
            own,
            queues,
            claims: HashMap::new(),
        })
    }

    /// Receive queues the maps were made for.
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// The direct path: frames for `ip` (claimed) that arrive on `queue`
    /// go to `socket`, an application's own AF_XDP socket bound to that
    /// queue, under slot `slot` of the own sockets' map. Frames of `ip` on
    /// other queues still go to iokerneld's socket of their queue.
    pub fn set_own_socket(
        &self,
        ip: Ipv4Addr,
        slot: u32,
        queue: u32,
        socket: RawFd,
    ) -> Result<(), StepError> {
        const STEP: &str = "the direct path's socket";
        let invalid = |why: String| StepError {
            step: STEP,
            error: io::Error::new(io::ErrorKind::InvalidInput, why),
        };
        if !self.claims.contains_key(&ip) {
            return Err(invalid(format!("{ip} is not claimed")));
        }
        if slot >= OWN_SOCKET_SLOTS {
            return Err(invalid(format!("slot {slot} of {OWN_SOCKET_SLOTS}")));
        }
        if queue >= self.queues {
            return Err(invalid(format!(
                "queue {queue}: the program serves {} receive queues",
                self.queues
            )));
        }
        let key = slot * self.queues + queue;
        sys::map_update(&self.own, key.to_ne_bytes(), socket.to_ne_bytes()).map_err(step(
            "BPF_MAP_UPDATE_ELEM (socket into the own sockets' XSKMAP)",
        ))?;
        sys::map_update(&self.addresses, ip.octets(), (slot + 1).to_ne_bytes())
            .map_err(step("BPF_MAP_UPDATE_ELEM (address map)"))
    }

    /// Undoes [`set_own_socket`](Self::set_own_socket): `ip`'s frames go
    /// to iokerneld again (if it is still claimed), and the slot is empty.
    pub fn clear_own_socket(&self, ip: Ipv4Addr, slot: u32, queue: u32) -> Result<(), StepError> {
        if self.claims.contains_key(&ip) {
            sys::map_update(&self.addresses, ip.octets(), TO_IOKERNELD)
                .map_err(step("BPF_MAP_UPDATE_ELEM (address map)"))?;
        }
        let key = slot * self.queues + queue;
        match sys::map_delete(&self.own, key.to_ne_bytes()) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                Err(step("BPF_MAP_DELETE_ELEM (own sockets' XSKMAP)")(e))
            }
            _ => Ok(()),
        }
    }

    /// The value the kernel's address map holds for `ip`: 0 for
    /// iokerneld's socket, `slot + 1` for an own socket's slot.
    pub fn map_value(&self, ip: Ipv4Addr) -> Result<Option<u32>, StepError> {
        sys::map_lookup(&self.addresses, ip.octets())
            .map(|v| v.map(u32::from_ne_bytes))
            .map_err(step("BPF_MAP_LOOKUP_ELEM (address map)"))
    }

    /// Puts the AF_XDP socket `socket` (bound to `queue`) in the socket map.
    pub fn set_socket(&self, queue: u32, socket: RawFd) -> Result<(), StepError> {
        sys::map_update(&self.xsks, queue.to_ne_bytes(), socket.to_ne_bytes())
            .map_err(step("BPF_MAP_UPDATE_ELEM (socket into XSKMAP)"))
    }

    /// Frames for `ip` are Ginza's from now on. Fails when the map is full
    /// ([`MAX_ADDRESSES`]).
    pub fn claim(&mut self, ip: Ipv4Addr) -> Result<(), StepError> {
        let claims = self.claims.get(&ip).copied().unwrap_or(0);
        if claims == 0 {
            sys::map_update(&self.addresses, ip.octets(), TO_IOKERNELD).map_err(|error| {
                let error = if error.raw_os_error() == Some(libc::E2BIG) {
                    io::Error::other(format!(
                        "the XDP address map is full ({MAX_ADDRESSES} addresses)"
                    ))
                } else {
                    error
                };
                StepError {
                    step: "BPF_MAP_UPDATE_ELEM (address map)",
                    error,
                }
            })?;
        }
        self.claims.insert(ip, claims + 1);
        Ok(())
    }

    /// Undoes one [`claim`](Self::claim) of `ip`; its frames go to Linux
    /// again once nobody claims it. Releasing an address not claimed does
    /// nothing.
    pub fn release(&mut self, ip: Ipv4Addr) -> Result<(), StepError> {
        match self.claims.get_mut(&ip) {
            None => Ok(()),
            Some(n) if *n > 1 => {
                *n -= 1;
                Ok(())
            }
            Some(_) => {
                self.claims.remove(&ip);
                match sys::map_delete(&self.addresses, ip.octets()) {
                    Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                        Err(step("BPF_MAP_DELETE_ELEM (address map)")(e))
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// Whether the kernel's map holds `ip` (what the program sees).
    pub fn map_holds(&self, ip: Ipv4Addr) -> Result<bool, StepError> {
        sys::map_lookup(&self.addresses, ip.octets())
            .map(|v| v.is_some())
            .map_err(step("BPF_MAP_LOOKUP_ELEM (address map)"))
    }

    /// Attaches the program to `ifindex` in `mode`; it stays attached while
    /// the returned link is open (and the process alive).
    pub fn attach(&self, ifindex: u32, mode: XdpMode) -> Result<OwnedFd, StepError> {
        sys::link_xdp(&self.program, ifindex, mode.flags()).map_err(step(mode.link_create()))
    }

    /// The program's verdict on `frame` (`BPF_PROG_TEST_RUN`, on the
    /// receive queue 0 of the namespace's loopback device; nothing is
    /// redirected). Frames shorter than 14 bytes are refused by the kernel.
    pub fn verdict(&self, frame: &[u8]) -> Result<Verdict, StepError> {
        sys::test_run(&self.program, frame)
            .map(Verdict::from_code)
            .map_err(step("BPF_PROG_TEST_RUN"))
    }
}
