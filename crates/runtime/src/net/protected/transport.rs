//! The transport to a netstack process (docs/protected.md): the attach
//! handshake on its unix socket (`ginza_proto::netstack::attach`, the tx
//! pool's memfd passed by `SCM_RIGHTS`), then the channel's ring pairs and
//! the receive pool mapped read-only (`ginza_shm::netstack`), slots encoded
//! and decoded by `ginza_proto::netstack`.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use ginza_proto::netstack::{self as proto, AttachRequest, NETSTACK_PROTOCOL};
use ginza_shm::netstack::{self as shm, RxPoolView, Slot};
use ginza_shm::{Consumer, Producer, PushError as RingPush};
use ginza_sys::poll::{poll_one, PollFlags};

use super::tx_pool::TxPool;
use super::{Command, Event, PushError, Range, Wire};
use crate::config::ProtectedConfig;
use crate::spinlock::SpinLock;

/// One ring pair's application end.
struct Pair {
    /// Any uthread may push: the lock keeps one producer at a time.
    commands: SpinLock<Producer<Slot>>,
    /// Any idle kthread may poll: a try-lock, as ingress rings.
    events: SpinLock<Consumer<Slot>>,
    line: shm::channel::LineHandle,
}

/// An attachment to a netstack process.
pub(crate) struct Transport {
    channel: shm::Channel,
    pairs: Vec<Pair>,
    rx: RxPoolView,
    send_queue_bytes: u64,
    /// Open while attached; its hang-up says the netstack is gone.
    socket: OwnedFd,
}

pub(crate) fn attach(
    cfg: &ProtectedConfig,
    kthreads: usize,
    tx: &TxPool,
) -> Result<Box<dyn Wire>, String> {
    let socket: &Path = &cfg.socket;
    let req = AttachRequest {
        protocol: NETSTACK_PROTOCOL,
        name: cfg.name.clone(),
        interface: cfg.interface,
        kthreads: kthreads as u32,
        doorbells: false,
    };
    let a = proto::attach(socket, &req, tx.fd(), &[]).map_err(|e| e.to_string())?;
    let channel =
        shm::Channel::attach(a.channel).map_err(|e| format!("the netstack's channel: {e}"))?;
    if channel.pairs() != a.pairs || a.pairs as usize != kthreads {
        return Err(format!(
            "the netstack gave {} ring pairs (its channel has {}) for {kthreads} kthreads",
            a.pairs,
            channel.pairs()
        ));
    }
    let rx = RxPoolView::map(a.rx_pool, a.rx_pool_bytes)
        .map_err(|e| format!("the netstack's receive pool: {e}"))?;
    let mut pairs = Vec::with_capacity(kthreads);
    for k in 0..a.pairs {
        let p = channel
            .app_pair(k)
            .map_err(|e| format!("ring pair {k}: {e}"))?;
        pairs.push(Pair {
            commands: SpinLock::new(p.commands),
            events: SpinLock::new(p.events),
            line: p.line,
        });
    }
    log::info!(
        "attached to the netstack at {} as {:?} (app {}, {} ring pairs of {} slots, {} KiB receive pool)",
        socket.display(),
        cfg.name,
        a.app_id,
        a.pairs,
        a.ring_capacity,
        a.rx_pool_bytes / 1024
    );
    Ok(Box::new(Transport {
        channel,
        pairs,
        rx,
        send_queue_bytes: a.send_queue_bytes,
        socket: a.socket,
    }))
}

impl Wire for Transport {
    fn pairs(&self) -> usize {
        self.pairs.len()
    }

    fn push(&self, pair: usize, cmd: &Command) -> Result<(), PushError> {
        let p = &self.pairs[pair];
        match p.commands.lock().push(cmd.encode()) {
            Ok(()) => Ok(()),
            Err(RingPush::Full(_)) => {
                p.line.count_command_ring_full();
                Err(PushError::Full)
            }
            Err(RingPush::Corrupt(e)) => Err(PushError::Gone(format!(
                "command ring {pair} is corrupt: {e}"
            ))),
        }
    }

    fn pop(&self, pair: usize, max: usize, out: &mut Vec<Event>) -> Result<usize, String> {
        let Some(mut ring) = self.pairs[pair].events.try_lock() else {
            return Ok(0);
        };
        let mut n = 0;
        while n < max {
            match ring.pop() {
                Ok(Some(slot)) => {
                    let ev = Event::decode(&slot)
                        .map_err(|e| format!("event ring {pair}: a slot does not decode: {e}"))?;
                    out.push(ev);
                    n += 1;
                }
                Ok(None) => break,
                Err(e) => return Err(format!("event ring {pair} is corrupt: {e}")),
            }
        }
        Ok(n)
    }

    fn pending(&self) -> bool {
        (0..self.pairs.len() as u32).any(|p| self.channel.pending(p).is_ok_and(|(_, ev)| ev > 0))
    }

    fn rx(&self, r: Range) -> Option<&[u8]> {
        self.rx.get(r).ok()
    }

    fn send_queue_bytes(&self) -> u64 {
        self.send_queue_bytes
    }

    fn wait_gone(&self, timeout: Duration) -> Option<String> {
        // The netstack never writes on the socket after the handshake: any
        // readiness is its end closing (or an error).
        match poll_one(self.socket.as_fd(), PollFlags::IN, Some(timeout)) {
            Ok(f) if f.is_empty() => None,
            Ok(f) => Some(format!("its socket reported {f:?} (closed)")),
            Err(e) => Some(format!("polling its socket: {e}")),
        }
    }
}
