//! Command messages carried by the per-kthread command rings, and typed
//! sending/receiving ends over [`Producer`]/[`Consumer`] of [`RawMsg`].
//!
//! On the ring every message is a [`RawMsg`]: a 16-byte `#[repr(C)]` record
//! with an explicit tag. Decoding checks the tag and every enumerated field;
//! anything unknown is a [`DecodeError`], never undefined behaviour.

use std::marker::PhantomData;

use crate::ring::{Consumer, Pod, Producer, PushError, RingCorrupt};

/// A message as stored in a ring slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawMsg {
    pub tag: u32,
    pub arg32: u32,
    pub arg64: u64,
}

// SAFETY: three integers, no padding; every bit pattern is valid.
unsafe impl Pod for RawMsg {}

const _: () = assert!(std::mem::size_of::<RawMsg>() == 16);

/// `arg64` of a `Parked` message without a pending timer.
pub const NO_DEADLINE: u64 = u64::MAX;

/// A message that has a wire form.
pub trait Message: Copy {
    fn encode(self) -> RawMsg;
    fn decode(raw: RawMsg) -> Result<Self, DecodeError>;
}

/// A message that could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown {dir} message tag {tag}")]
    UnknownTag { dir: &'static str, tag: u32 },
    #[error("unknown preemption reason {0}")]
    UnknownReason(u32),
    #[error("unknown hand-back kind {0}")]
    UnknownHandBack(u32),
    #[error("grant number {0} is out of range")]
    BadGrant(u32),
}

/// The grant number of a `Parked`/`Yielded` from a client that does not
/// number its parks: it answers whatever grant is current (no staleness
/// check). The runtime always numbers them.
pub const UNNUMBERED_GRANT: u16 = u16::MAX;

/// The grant number after `grant` (iokerneld numbers each `Wake` it puts
/// on a kthread's ring; [`UNNUMBERED_GRANT`] is skipped).
pub fn next_grant(grant: u16) -> u16 {
    match grant.wrapping_add(1) {
        UNNUMBERED_GRANT => 0,
        g => g,
    }
}

/// kthread → iokerneld.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToIokernel {
    /// The kthread runs and reports its Linux thread id (for affinity and
    /// signals).
    Started { tid: u32 },
    /// Out of work: it gave up its core and blocks on its eventfd.
    /// `next_deadline_ns` (CLOCK_MONOTONIC) is its earliest timer, if any;
    /// iokerneld wakes it then. `grant`: the number of the last
    /// [`ToKthread::Wake`] it read — the grant this park answers; iokerneld
    /// ignores (and counts) a park that answers a grant it has already
    /// seen answered, such as one sent after a wake-up that was no grant
    /// ([`UNNUMBERED_GRANT`]: no check).
    Parked {
        next_deadline_ns: Option<u64>,
        grant: u16,
    },
    /// It gave its core back in answer to [`ToKthread::Preempt`] and blocks
    /// on its eventfd; `next_deadline_ns` and `grant` as for `Parked` (a
    /// preempted kthread may hold the application's only pending timers).
    Yielded {
        next_deadline_ns: Option<u64>,
        grant: u16,
    },
    /// The parked kthread woke itself for a frame on its application's
    /// own socket (`LineFlags::SELF_WOKEN`, docs/direct-path.md, "The
    /// self-woken kthread") and runs on the CPU iokerneld last pinned it
    /// to. `grant`: the number of the last [`ToKthread::Wake`] it read, as
    /// in its park before; iokerneld takes the wake as a grant of that
    /// CPU's core (its next `Parked`/`Yielded` answers it), or revokes it.
    SelfWoken { grant: u16 },
    /// Dispatch by iokerneld (docs/colocate.md): the request iokerneld ran
    /// on this kthread ([`ToKthread::Run`]) completed, or was preempted
    /// (its context stays in the application, resumable by `request`).
    /// Sent before `Yielded` when the core is revoked mid-request.
    HandBack { request: u64, completed: bool },
    /// Dispatch by iokerneld: a new request refused unrun (the application
    /// holds as many requests as it allows); it is done, as a completed one.
    Refused { request: u64 },
}

/// iokerneld → kthread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToKthread {
    /// It has been granted `core` (affinity already set, below 65,536);
    /// run. `decided_ns` (CLOCK_MONOTONIC) is when iokerneld decided the
    /// grant, so the kthread can measure decision → running. `grant`
    /// numbers the grants of this kthread ([`next_grant`]): its next
    /// `Parked`/`Yielded` carries it back.
    Wake {
        core: u32,
        decided_ns: u64,
        grant: u16,
    },
    /// Give the core back (then answer [`ToIokernel::Yielded`]).
    Preempt { reason: PreemptReason },
    /// Dispatch by iokerneld (docs/colocate.md): run request `request`
    /// (below [`MAX_REQUEST_ID`]) — a new one, whose packet is the ingress
    /// buffer named here (lent like a ring's, given back on the done
    /// ring), or, with no packet, a preempted one the application holds.
    Run {
        request: u64,
        packet: Option<RunPacket>,
    },
    /// Dispatch by iokerneld, pre-assignment (docs/colocate.md): run
    /// `request` (as in `Run`) next, as soon as the request this kthread
    /// runs is handed back completed; a preempted hand-back drops it
    /// (iokerneld takes it back when it reads that hand-back).
    RunNext {
        request: u64,
        packet: Option<RunPacket>,
    },
}

/// The packet of a new request in a [`ToKthread::Run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunPacket {
    /// Ingress pool buffer.
    pub buf: u32,
    pub len: u16,
}

/// Request ids of [`ToKthread::Run`] fit in 48 bits (the packet length
/// shares the word).
pub const MAX_REQUEST_ID: u64 = 1 << 48;

/// `arg32` of a `Run` with no packet.
const NO_PACKET: u32 = u32::MAX;

impl ToKthread {
    /// The core of a `Wake`, `None` for other messages.
    pub fn wake_core(self) -> Option<u32> {
        match self {
            ToKthread::Wake { core, .. } => Some(core),
            ToKthread::Preempt { .. } | ToKthread::Run { .. } | ToKthread::RunNext { .. } => None,
        }
    }
}

/// Why iokerneld takes a core back.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreemptReason {
    /// Another application needs the core (this one is bursting).
    CoreNeeded = 1,
    /// The allocation policy shrinks this application.
    Shrink = 2,
    /// iokerneld is shutting down or disconnecting the application.
    Shutdown = 3,
}

impl PreemptReason {
    fn from_u32(v: u32) -> Result<Self, DecodeError> {
        Ok(match v {
            1 => PreemptReason::CoreNeeded,
            2 => PreemptReason::Shrink,
            3 => PreemptReason::Shutdown,
            _ => return Err(DecodeError::UnknownReason(v)),
        })
    }
}

mod tag {
    pub const STARTED: u32 = 1;
    pub const PARKED: u32 = 2;
    pub const YIELDED: u32 = 3;
    pub const HAND_BACK: u32 = 4;
    pub const SELF_WOKEN: u32 = 5;

    pub const WAKE: u32 = 1;
    pub const PREEMPT: u32 = 2;
    pub const RUN: u32 = 3;
    pub const RUN_NEXT: u32 = 4;

    /// `arg32` of a hand-back.
    pub const COMPLETED: u32 = 1;
    pub const PREEMPTED: u32 = 2;
    pub const REFUSED: u32 = 3;
}

impl Message for ToIokernel {
    fn encode(self) -> RawMsg {
        match self {
            ToIokernel::Started { tid } => RawMsg {
                tag: tag::STARTED,
                arg32: tid,
                arg64: 0,
            },
            ToIokernel::Parked {
                next_deadline_ns,
                grant,
            } => RawMsg {
                tag: tag::PARKED,
                arg32: grant.into(),
                arg64: next_deadline_ns.unwrap_or(NO_DEADLINE),
            },
            ToIokernel::Yielded {
                next_deadline_ns,
                grant,
            } => RawMsg {
                tag: tag::YIELDED,
                arg32: grant.into(),
                arg64: next_deadline_ns.unwrap_or(NO_DEADLINE),
            },
            ToIokernel::SelfWoken { grant } => RawMsg {
                tag: tag::SELF_WOKEN,
                arg32: grant.into(),
                arg64: 0,
            },
            ToIokernel::HandBack { request, completed } => RawMsg {
                tag: tag::HAND_BACK,
                arg32: if completed {
                    tag::COMPLETED
                } else {
                    tag::PREEMPTED
                },
                arg64: request,
            },
            ToIokernel::Refused { request } => RawMsg {
                tag: tag::HAND_BACK,
                arg32: tag::REFUSED,
                arg64: request,
            },
        }
    }

    fn decode(raw: RawMsg) -> Result<Self, DecodeError> {
        Ok(match raw.tag {
            tag::STARTED => ToIokernel::Started { tid: raw.arg32 },
            tag::PARKED => ToIokernel::Parked {
                next_deadline_ns: Some(raw.arg64).filter(|&d| d != NO_DEADLINE),
                grant: u16::try_from(raw.arg32).map_err(|_| DecodeError::BadGrant(raw.arg32))?,
            },
            tag::YIELDED => ToIokernel::Yielded {
                next_deadline_ns: Some(raw.arg64).filter(|&d| d != NO_DEADLINE),
                grant: u16::try_from(raw.arg32).map_err(|_| DecodeError::BadGrant(raw.arg32))?,
            },
            tag::SELF_WOKEN => ToIokernel::SelfWoken {
                grant: u16::try_from(raw.arg32).map_err(|_| DecodeError::BadGrant(raw.arg32))?,
            },
            tag::HAND_BACK => match raw.arg32 {
                tag::COMPLETED | tag::PREEMPTED => ToIokernel::HandBack {
                    request: raw.arg64,
                    completed: raw.arg32 == tag::COMPLETED,
                },
                tag::REFUSED => ToIokernel::Refused { request: raw.arg64 },
                other => return Err(DecodeError::UnknownHandBack(other)),
            },
            tag => {
                return Err(DecodeError::UnknownTag {
                    dir: "kthread→iokerneld",
                    tag,
                })
            }
        })
    }
}

impl Message for ToKthread {
    fn encode(self) -> RawMsg {
        match self {
            ToKthread::Wake {
                core,
                decided_ns,
                grant,
            } => RawMsg {
                tag: tag::WAKE,
                arg32: (core & 0xffff) | u32::from(grant) << 16,
                arg64: decided_ns,
            },
            ToKthread::Preempt { reason } => RawMsg {
                tag: tag::PREEMPT,
                arg32: reason as u32,
                arg64: 0,
            },
            ToKthread::Run { request, packet } => encode_run(tag::RUN, request, packet),
            ToKthread::RunNext { request, packet } => encode_run(tag::RUN_NEXT, request, packet),
        }
    }

    fn decode(raw: RawMsg) -> Result<Self, DecodeError> {
        Ok(match raw.tag {
            tag::WAKE => ToKthread::Wake {
                core: raw.arg32 & 0xffff,
                decided_ns: raw.arg64,
                grant: (raw.arg32 >> 16) as u16,
            },
            tag::PREEMPT => ToKthread::Preempt {
                reason: PreemptReason::from_u32(raw.arg32)?,
            },
            tag::RUN => {
                let (request, packet) = decode_run(raw);
                ToKthread::Run { request, packet }
            }
            tag::RUN_NEXT => {
                let (request, packet) = decode_run(raw);
                ToKthread::RunNext { request, packet }
            }
            tag => {
                return Err(DecodeError::UnknownTag {
                    dir: "iokerneld→kthread",
                    tag,
                })
            }
        })
    }
}

fn encode_run(tag: u32, request: u64, packet: Option<RunPacket>) -> RawMsg {
    RawMsg {
        tag,
        arg32: packet.map_or(NO_PACKET, |p| p.buf),
        arg64: (request % MAX_REQUEST_ID) << 16 | u64::from(packet.map_or(0, |p| p.len)),
    }
}

fn decode_run(raw: RawMsg) -> (u64, Option<RunPacket>) {
    let packet = (raw.arg32 != NO_PACKET).then_some(RunPacket {
        buf: raw.arg32,
        len: raw.arg64 as u16,
    });
    (raw.arg64 >> 16, packet)
}

/// Why a send failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("command ring full")]
    Full,
    #[error(transparent)]
    Corrupt(#[from] RingCorrupt),
}

/// Why a receive failed. Either way the peer is broken: disconnect it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    #[error(transparent)]
    Corrupt(#[from] RingCorrupt),
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// Sending end of a command ring carrying `M`.
pub struct CmdTx<M> {
    ring: Producer<RawMsg>,
    _m: PhantomData<fn(M)>,
}

/// Receiving end of a command ring carrying `M`.
pub struct CmdRx<M> {
    ring: Consumer<RawMsg>,
    _m: PhantomData<fn() -> M>,
}

impl<M: Message> CmdTx<M> {
    pub fn new(ring: Producer<RawMsg>) -> Self {
        CmdTx {
            ring,
            _m: PhantomData,
        }
    }

    pub fn send(&mut self, m: M) -> Result<(), SendError> {
        self.ring.push(m.encode()).map_err(|e| match e {
            PushError::Full(_) => SendError::Full,
            PushError::Corrupt(c) => SendError::Corrupt(c),
        })
    }

    /// The raw ring, e.g. to send hand-made (or deliberately bad) messages.
    pub fn raw(&mut self) -> &mut Producer<RawMsg> {
        &mut self.ring
    }
}

impl<M: Message> CmdRx<M> {
    pub fn new(ring: Consumer<RawMsg>) -> Self {
        CmdRx {
            ring,
            _m: PhantomData,
        }
    }

    /// The next message, `Ok(None)` if none is waiting. A message that does
    /// not decode is consumed and reported.
    pub fn recv(&mut self) -> Result<Option<M>, RecvError> {
        match self.ring.pop()? {
            None => Ok(None),
            Some(raw) => Ok(Some(M::decode(raw)?)),
        }
    }

    pub fn raw(&mut self) -> &mut Consumer<RawMsg> {
        &mut self.ring
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ring::heap_ring;

    #[test]
    fn round_trip() {
        let ups = [
            ToIokernel::Started { tid: 1234 },
            ToIokernel::SelfWoken { grant: 7 },
            ToIokernel::Parked {
                next_deadline_ns: None,
                grant: 0,
            },
            ToIokernel::Parked {
                next_deadline_ns: Some(5_000_000),
                grant: UNNUMBERED_GRANT,
            },
            ToIokernel::Yielded {
                next_deadline_ns: None,
                grant: 65_534,
            },
            ToIokernel::Yielded {
                next_deadline_ns: Some(7),
                grant: 3,
            },
            ToIokernel::HandBack {
                request: u64::MAX - 1,
                completed: true,
            },
            ToIokernel::HandBack {
                request: 0,
                completed: false,
            },
            ToIokernel::Refused { request: 9 },
        ];
        for m in ups {
            assert_eq!(ToIokernel::decode(m.encode()), Ok(m));
        }
        let downs = [
            ToKthread::Wake {
                core: 3,
                decided_ns: 99,
                grant: 0,
            },
            ToKthread::Wake {
                core: 65_535,
                decided_ns: u64::MAX,
                grant: 65_534,
            },
            ToKthread::Preempt {
                reason: PreemptReason::CoreNeeded,
            },
            ToKthread::Preempt {
                reason: PreemptReason::Shrink,
            },
            ToKthread::Preempt {
                reason: PreemptReason::Shutdown,
            },
            ToKthread::Run {
                request: MAX_REQUEST_ID - 1,
                packet: Some(RunPacket { buf: 7, len: 1500 }),
            },
            ToKthread::Run {
                request: 43,
                packet: None,
            },
            ToKthread::RunNext {
                request: 44,
                packet: Some(RunPacket { buf: 8, len: 60 }),
            },
            ToKthread::RunNext {
                request: 45,
                packet: None,
            },
        ];
        for m in downs {
            assert_eq!(ToKthread::decode(m.encode()), Ok(m));
        }
    }

    #[test]
    fn grant_numbers_skip_the_unnumbered_value_and_wrap() {
        assert_eq!(next_grant(0), 1);
        assert_eq!(next_grant(UNNUMBERED_GRANT - 1), 0);
        assert_eq!(next_grant(UNNUMBERED_GRANT), 0);
        let raw = RawMsg {
            tag: tag::PARKED,
            arg32: 1 << 16,
            arg64: NO_DEADLINE,
        };
        assert_eq!(ToIokernel::decode(raw), Err(DecodeError::BadGrant(1 << 16)));
    }

    #[test]
    fn an_unknown_hand_back_kind_is_an_error() {
        let raw = RawMsg {
            tag: tag::HAND_BACK,
            arg32: 7,
            arg64: 1,
        };
        assert_eq!(
            ToIokernel::decode(raw),
            Err(DecodeError::UnknownHandBack(7))
        );
    }

    #[test]
    fn unknown_tags_are_errors() {
        let e = ToIokernel::decode(RawMsg {
            tag: 99,
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "unknown kthread→iokerneld message tag 99");
        assert!(ToIokernel::decode(RawMsg::default()).is_err());
        let e = ToKthread::decode(RawMsg {
            tag: tag::PREEMPT,
            arg32: 7,
            arg64: 0,
        })
        .unwrap_err();
        assert_eq!(e, DecodeError::UnknownReason(7));
    }

    #[test]
    fn typed_ends() {
        let (p, c) = heap_ring::<RawMsg>(2).unwrap();
        let (mut tx, mut rx) = (CmdTx::<ToIokernel>::new(p), CmdRx::<ToIokernel>::new(c));
        tx.send(ToIokernel::Yielded {
            next_deadline_ns: None,
            grant: 1,
        })
        .unwrap();
        tx.raw()
            .push(RawMsg {
                tag: 42,
                arg32: 0,
                arg64: 0,
            })
            .unwrap();
        assert_eq!(
            tx.send(ToIokernel::Yielded {
                next_deadline_ns: None,
                grant: 1,
            }),
            Err(SendError::Full)
        );
        assert_eq!(
            rx.recv(),
            Ok(Some(ToIokernel::Yielded {
                next_deadline_ns: None,
                grant: 1,
            }))
        );
        assert!(matches!(
            rx.recv(),
            Err(RecvError::Decode(DecodeError::UnknownTag { tag: 42, .. }))
        ));
        assert_eq!(rx.recv(), Ok(None));
    }

    proptest! {
        #![proptest_config(crate::test_config(1024, 16))]

        #[test]
        fn decode_any_bits(tag in any::<u32>(), arg32 in any::<u32>(), arg64 in any::<u64>()) {
            let raw = RawMsg { tag, arg32, arg64 };
            if let Ok(m) = ToIokernel::decode(raw) {
                prop_assert_eq!(ToIokernel::decode(m.encode()), Ok(m));
            }
            if let Ok(m) = ToKthread::decode(raw) {
                prop_assert_eq!(ToKthread::decode(m.encode()), Ok(m));
            }
        }
    }
}
