//! The transport to a netstack process: the attach handshake on its unix
//! socket, then the shared rings and pools of `ginza_shm::netstack`,
//! encoded by `ginza_proto::netstack`. Pending the netstack's interface:
//! until it lands, attaching reports that plainly.

use std::path::Path;

use super::tx_pool::TxPool;
use super::Wire;

pub(crate) fn attach(socket: &Path, _tx: &TxPool) -> Result<Box<dyn Wire>, String> {
    match std::os::unix::net::UnixStream::connect(socket) {
        Err(e) => Err(format!("no netstack answers at {}: {e}", socket.display())),
        Ok(_) => Err(format!(
            "the netstack at {} answered, but this runtime does not speak its attach protocol yet",
            socket.display()
        )),
    }
}
