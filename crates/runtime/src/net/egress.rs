//! A kthread's egress: a frame built in place in its next egress buffer and
//! pushed on its egress ring — or, on the direct path, built in a chunk of
//! the application's own AF_XDP socket and sent there (docs/direct-path.md).
//! The stack's replies and datagrams and TCP's segments all leave this way,
//! so TCP needs nothing of the stack to send.

use std::sync::atomic::Ordering::Relaxed;

use ginza_net::BuildError;
use ginza_shm::PacketDesc;

use crate::link::{KNet, TxSide};
use crate::own_socket::OwnTxFail;

/// Why a frame was not sent.
pub(super) enum TxFail {
    RingFull,
    Corrupt,
    Build(BuildError),
}

/// Builds a frame in `me`'s next egress buffer and pushes it.
pub(super) fn transmit(
    me: &mut TxSide<'_>,
    build: impl FnOnce(&mut [u8]) -> Result<usize, BuildError>,
) -> Result<(), TxFail> {
    if let Some(own) = me.own_socket.get() {
        own.transmit(build).map_err(|f| match f {
            OwnTxFail::Full => TxFail::RingFull,
            OwnTxFail::Build(e) => TxFail::Build(e),
        })?;
        let sent = &me.counters.tx_packets;
        sent.store(sent.load(Relaxed) + 1, Relaxed);
        return Ok(());
    }
    let tx = me.tx();
    match tx.egress.free() {
        Ok(0) => return Err(TxFail::RingFull),
        Ok(_) => {}
        Err(e) => {
            if !std::mem::replace(&mut tx.corrupt_said, true) {
                log::error!("an egress ring is corrupt; nothing more is sent on it: {e}");
            }
            return Err(TxFail::Corrupt);
        }
    }
    let seq = tx.egress.next_seq();
    let len = build(tx.buffers.buffer_mut(seq)).map_err(TxFail::Build)?;
    let desc = PacketDesc {
        len: len as u32,
        ..Default::default()
    };
    // A free slot was seen above and only we push.
    tx.egress.push(desc).map_err(|_| TxFail::Corrupt)?;
    // Owner-only counter (readers may be elsewhere): no locked instruction.
    let sent = &me.counters.tx_packets;
    sent.store(sent.load(Relaxed) + 1, Relaxed);
    Ok(())
}

/// Counts or reports a frame `transmit` did not send.
pub(super) fn failed(me: &KNet, f: TxFail, what: &str) {
    match f {
        TxFail::RingFull => {
            let full = &me.counters.tx_ring_full;
            full.store(full.load(Relaxed) + 1, Relaxed);
        }
        TxFail::Corrupt => {}
        TxFail::Build(e) => log::warn!("{what} not sent: {e}"),
    }
}
