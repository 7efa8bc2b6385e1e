//! The direct path's part of the dataplane (docs/direct-path.md): an
//! application's own AF_XDP socket, handed over at its request, goes into
//! the NIC's XDP maps ([`Nic::attach_own_socket`](crate::nic::Nic)), and
//! iokerneld keeps the socket and a read-only view of its rx ring's
//! indices: frames waiting there are the application's queued work, like
//! frames on its ingress rings.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ginza_sys::xsk::{self, RingIndices};

use super::{AppNet, Dataplane};

/// An application's own socket, as iokerneld holds it.
pub struct OwnSocket {
    /// The receive queue it is bound to (as the application said; a socket
    /// bound elsewhere gets nothing: the kernel drops what the program
    /// redirects to it from another queue).
    pub queue: u32,
    socket: OwnedFd,
    rx: RingIndices,
}

impl OwnSocket {
    /// Frames waiting on its rx ring, as two free-running indices
    /// (producer, consumer): what congestion detection reads.
    pub fn rx_indices(&self) -> (u32, u32) {
        self.rx.load()
    }

    /// The socket: readable while its rx ring holds a frame (a sleeping
    /// iokerneld waits on it).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Dataplane {
    /// Steers `net`'s frames that arrive on `queue` to `socket`, the
    /// application's own AF_XDP socket (untrusted: checked to be one).
    pub fn attach_own_socket(
        &mut self,
        net: &mut AppNet,
        queue: u32,
        socket: OwnedFd,
    ) -> Result<(), String> {
        if net.own_socket.is_some() {
            return Err("the application has an own socket already".into());
        }
        if !xsk::is_xsk(socket.as_fd()) {
            return Err("the descriptor attached is not an AF_XDP socket".into());
        }
        let Some((nic, _)) = &mut self.nic else {
            return Err("iokerneld drives no real NIC (nic = \"af_xdp:IF,direct\")".into());
        };
        let rx = xsk::rx_indices(socket.as_fd()).map_err(|e| e.to_string())?;
        nic.attach_own_socket(net.interface.ip, queue, socket.as_fd())?;
        net.own_socket = Some(OwnSocket { queue, socket, rx });
        Ok(())
    }

    /// Undoes [`attach_own_socket`](Self::attach_own_socket), if there was
    /// one (an application leaving).
    pub(super) fn detach_own_socket(&mut self, net: &AppNet) {
        if net.own_socket.is_some() {
            if let Some((nic, _)) = &mut self.nic {
                nic.detach_own_socket(net.interface.ip);
            }
        }
    }
}
