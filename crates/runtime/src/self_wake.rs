//! The self-woken kthread (docs/direct-path.md, "The self-woken kthread";
//! `IokernelConfig::self_wake`): a parked kthread 0 of an application with
//! its own AF_XDP socket sleeps in `poll` on its eventfd and that socket,
//! not on the wake page, so a frame wakes it through the kernel as it
//! wakes a blocked Linux server thread. It then runs at once on the CPU
//! iokerneld last pinned it to (ahead of a `SCHED_IDLE` kthread there)
//! and tells iokerneld (`SelfWoken`), which counts the core granted or
//! revokes it.
//!
//! Only where iokerneld allows it (`LineFlags::SELF_WAKE_ALLOWED`, read as
//! the kthread parks and again as a frame wakes it). A grant of
//! iokerneld's and a self-wake exclude each other by one atomic step on
//! each side: iokerneld sets `GRANTING` and reads `SELF_WOKEN`, the kthread
//! sets `SELF_WOKEN` and reads `GRANTING`; whichever comes second sees the
//! other and stands back (the kthread then waits for the grant on its
//! eventfd alone).

use std::os::fd::AsRawFd;

use ginza_shm::{LineFlags, QueueLine};

use crate::link::KLink;
use crate::own_socket::OwnSocket;
use crate::sched::{KThread, Owner};

/// The kthread that sleeps on the own socket: the one whose queued work
/// iokerneld counts the socket's frames as.
const SELF_WAKING_KTHREAD: usize = 0;

/// How a sleep of an armed kthread ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// iokerneld's grant is in the word: run, as after any grant.
    Granted,
    /// A frame woke it and it took its core itself: it must send
    /// `SelfWoken` before it runs anything.
    ByFrame,
    /// Neither: the runtime stops or lost iokerneld, or a wake that was no
    /// grant (look again).
    Nothing,
}

/// How long kthread `k` spins for work before it parks (`rt_spin`, the
/// runtime's `spin_before_park`), or zero where it would sleep armed on its
/// own socket: parked so, the kernel wakes it for the next frame as it wakes
/// a blocked Linux server, so a spin saves a wake only for a frame that comes
/// within the spin, and costs the core's other kthread (a `SCHED_IDLE` batch
/// kthread, which the kernel runs the moment this one sleeps) the whole spin
/// after every request (docs/direct-path.md, "The self-woken server's cost").
pub(crate) fn spin_before_park(k: &KThread, rt_spin: std::time::Duration) -> std::time::Duration {
    if rt_spin.is_zero() || !would_arm(k) {
        return rt_spin;
    }
    std::time::Duration::ZERO
}

/// Whether `k` would arm if it parked now (`arm`'s rule, read-only).
fn would_arm(k: &KThread) -> bool {
    let Some(io) = k.io.as_ref() else {
        return false;
    };
    k.id == SELF_WAKING_KTHREAD
        && k.rt().link.as_ref().is_some_and(|l| l.cfg.self_wake)
        && k.knet().is_some_and(|n| n.own_socket.get().is_some())
        && io.line.flags().contains(LineFlags::SELF_WAKE_ALLOWED)
}

/// The own socket kthread `k` sleeps on while parked, if it may: called
/// as it parks, before its `Parked`/`Yielded` goes out, so that iokerneld
/// reads `SELF_WAKE_ARMED` before it can grant (and delivers the grant by
/// the eventfd, not the wake page). Clears what the last park left.
pub(crate) fn arm<'a>(k: &'a KThread, io: &KLink) -> Option<&'a OwnSocket> {
    if k.id != SELF_WAKING_KTHREAD {
        return None;
    }
    let cfg = &k.rt().link.as_ref()?.cfg;
    let own = k.knet()?.own_socket.get()?;
    if !cfg.self_wake {
        return None;
    }
    let was = io
        .line
        .remove_flags(LineFlags::SELF_WAKE_ARMED | LineFlags::SELF_WOKEN | LineFlags::GRANTING);
    if !was.contains(LineFlags::SELF_WAKE_ALLOWED) {
        return None;
    }
    io.line.insert_flags(LineFlags::SELF_WAKE_ARMED);
    Some(own)
}

/// Sleeps for a grant, or for a frame on `own` while `watch_socket` (set
/// false here once iokerneld's grant is under way or no longer allowed).
pub(crate) fn sleep(
    owner: &Owner<'_>,
    io: &KLink,
    own: &OwnSocket,
    watch_socket: &mut bool,
) -> Woken {
    let k = owner.kthread();
    let rt = k.rt();
    let word = io.line.wake();
    if word.take_grant() {
        return Woken::Granted;
    }
    if rt.shutdown.load(std::sync::atomic::Ordering::SeqCst) || !rt.managed() {
        return Woken::Nothing;
    }
    let socket_fd = own.with_fd(|fd| fd.as_raw_fd()).filter(|_| *watch_socket);
    let mut fds = [
        libc::pollfd {
            fd: k.eventfd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            // A negative descriptor is ignored by `poll`.
            fd: socket_fd.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // A signal (a preemption, which a parked kthread ignores) ends it early:
    // the caller looks again.
    let _ = ginza_sys::poll::poll_raw(&mut fds, None);
    if fds[0].revents & libc::POLLIN != 0 {
        let _ = ginza_sys::eventfd::read(k.eventfd());
    }
    // iokerneld puts a grant in the word before it writes the eventfd.
    if word.take_grant() {
        return Woken::Granted;
    }
    if socket_fd.is_none() || fds[1].revents & libc::POLLIN == 0 {
        return Woken::Nothing;
    }
    if !owner.commands_half_free() {
        // iokerneld has not read its commands for a while (its loop
        // shares its CPU with a busier thread): a wake and a park more
        // each time would fill the ring. Its grant comes for the frame.
        *watch_socket = false;
        return Woken::Nothing;
    }
    if !claim_core(&io.line) {
        *watch_socket = false;
        return Woken::Nothing;
    }
    Woken::ByFrame
}

/// The kthread's half of the exclusion with a grant (module doc): sets
/// `SELF_WOKEN` and reads `GRANTING`. True: the core is the kthread's.
/// False, with `SELF_WOKEN` taken back: iokerneld grants it now (the grant
/// comes by the eventfd), or the CPU was given to someone iokerneld will
/// not take it from (it stays parked until iokerneld grants a core for the
/// frame). A `SELF_WOKEN` left after a lost claim would make iokerneld
/// believe every later grant crossed a self-wake (should this one be
/// undone before the kthread runs, the core given to another), and the
/// kthread would wait for a grant that never comes.
fn claim_core(line: &QueueLine) -> bool {
    let was = line.insert_flags(LineFlags::SELF_WOKEN);
    if was.contains(LineFlags::GRANTING) || !was.contains(LineFlags::SELF_WAKE_ALLOWED) {
        line.remove_flags(LineFlags::SELF_WOKEN);
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_takes_the_core_only_where_allowed_and_no_grant_is_under_way() {
        let line = QueueLine::new();
        line.insert_flags(LineFlags::SELF_WAKE_ARMED | LineFlags::SELF_WAKE_ALLOWED);
        assert!(claim_core(&line));
        assert!(line.flags().contains(LineFlags::SELF_WOKEN));
    }

    #[test]
    fn a_claim_that_loses_to_a_grant_or_is_not_allowed_leaves_no_self_woken() {
        let granting =
            LineFlags::SELF_WAKE_ARMED | LineFlags::SELF_WAKE_ALLOWED | LineFlags::GRANTING;
        let not_allowed = LineFlags::SELF_WAKE_ARMED;
        for flags in [granting, not_allowed] {
            let line = QueueLine::new();
            line.insert_flags(flags);
            assert!(!claim_core(&line), "{flags:?}");
            assert_eq!(line.flags(), flags, "the claim was not taken back");
        }
    }
}
