//! How a grant reaches a parked kthread (docs/runtime.md, "Grants without a
//! system call"): one word in its queue line that says whether the kthread
//! is still lingering (polling this word after it gave its core back) or
//! asleep on its eventfd.
//!
//! iokerneld grants by swapping the word to `GRANTED`; only if the word was
//! not `LINGERING` does it also write the kthread's eventfd. The kthread
//! polls for `GRANTED` while it lingers and, before it blocks, moves the
//! word from `LINGERING` to `SLEEPING` with a compare-and-swap. Both sides
//! change the word by read-modify-write operations on one location, which
//! the hardware orders totally, so exactly one of two things happens: the
//! kthread's swap to `SLEEPING` comes first, and iokerneld sees `SLEEPING`
//! and writes the eventfd; or iokerneld's `GRANTED` comes first, and the
//! kthread's swap fails and it takes the grant from the word. A grant is
//! never lost and never costs a system call while the kthread lingers (the
//! loom model below checks every interleaving).
//!
//! The word is in memory the runtime can write, so iokerneld treats any
//! value but `LINGERING` as "wake it": a broken runtime, or a client that
//! only waits on its eventfd, gets every wake it would have had without
//! this word.
//!
//! "Wake it" is an eventfd write, or, for a kthread that sleeps on the wake
//! page (`wake_page`), a bump and a futex wake of its word there; that
//! kthread then takes the grant from this word, as a lingering one does.
//! An eventfd holds a grant made while its kthread ran, the page does not:
//! under the page a grant must follow the kthread's `begin_park`, as
//! iokerneld's do (it grants only kthreads whose `Started`, `Parked` or
//! `Yielded` it has read, each sent after a `begin_park`).

use crate::sync::{AtomicU32, Ordering};

/// The kthread runs, or iokerneld knows nothing better (the word's value
/// in a new region): a grant needs the eventfd.
const AWAKE: u32 = 0;
/// Parked and polling this word: a grant needs no system call.
const LINGERING: u32 = 1;
/// Blocked (or about to block) on its eventfd: a grant must write it.
const SLEEPING: u32 = 2;
/// iokerneld granted a core; the kthread has not taken the grant yet.
const GRANTED: u32 = 3;

/// How iokerneld must deliver a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantDelivery {
    /// The kthread lingers and will find the grant in the word.
    Word,
    /// The kthread sleeps (or its state is unknown): wake it with a system
    /// call (its eventfd, or its word of the wake page).
    Eventfd,
    /// The kthread sleeps on the wake page, and the kthread on the core it
    /// is granted was asked to wake it (`QueueLine::ring_doorbell`).
    Doorbell,
}

/// What a kthread that stops lingering must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeforeSleep {
    /// The grant came in the word: run.
    Granted,
    /// Block (on the eventfd or the wake page): iokerneld will wake it for
    /// the next grant.
    Sleep,
}

/// The grant word (see the module doc).
#[repr(transparent)]
pub struct WakeWord(AtomicU32);

impl std::fmt::Debug for WakeWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0.load(Ordering::Relaxed);
        let name = match v {
            AWAKE => "awake",
            LINGERING => "lingering",
            SLEEPING => "sleeping",
            GRANTED => "granted",
            _ => "(foreign value)",
        };
        write!(f, "WakeWord({name})")
    }
}

impl Default for WakeWord {
    fn default() -> Self {
        Self::new()
    }
}

impl WakeWord {
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        WakeWord(AtomicU32::new(AWAKE))
    }

    #[cfg(loom)]
    pub fn new() -> Self {
        WakeWord(AtomicU32::new(AWAKE))
    }

    // ---- the kthread's side

    /// About to give the core back (before `Parked`/`Yielded` goes out):
    /// from now on a grant may come in the word. Overwrites a `GRANTED`
    /// left by a grant that also wrote the eventfd (the eventfd still
    /// holds that one).
    pub fn begin_park(&self) {
        // A swap, not a store: both sides then change the word only by
        // read-modify-writes, which are totally ordered on it.
        self.0.swap(LINGERING, Ordering::AcqRel);
    }

    /// While lingering: whether a grant came in the word (then taken).
    pub fn take_grant(&self) -> bool {
        if self.0.load(Ordering::Acquire) == GRANTED {
            // Only the kthread moves the word away from GRANTED.
            self.0.store(AWAKE, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Stops lingering: either the grant is already in the word, or the
    /// word now says `SLEEPING` and the next grant writes the eventfd.
    /// A word that is not `LINGERING` (no `begin_park`) also means sleep:
    /// iokerneld writes the eventfd for such a word.
    pub fn before_sleep(&self) -> BeforeSleep {
        match self
            .0
            .compare_exchange(LINGERING, SLEEPING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => BeforeSleep::Sleep,
            Err(GRANTED) => {
                self.0.store(AWAKE, Ordering::Relaxed);
                BeforeSleep::Granted
            }
            Err(_) => BeforeSleep::Sleep,
        }
    }

    /// Woken by the eventfd (or giving up the wait): running again.
    pub fn awake(&self) {
        self.0.store(AWAKE, Ordering::Release);
    }

    /// Whether the kthread says it lingers (for tests and stats).
    pub fn is_lingering(&self) -> bool {
        self.0.load(Ordering::Acquire) == LINGERING
    }

    // ---- iokerneld's side

    /// Grants: publishes `GRANTED` (after the `Wake` on the command ring,
    /// which the kthread then sees) and says whether the eventfd must be
    /// written too. Only a word that says `LINGERING` spares the write:
    /// a client that knows only its eventfd never writes the word, and
    /// still gets a write for every grant.
    pub fn grant(&self) -> GrantDelivery {
        match self.0.swap(GRANTED, Ordering::AcqRel) {
            LINGERING => GrantDelivery::Word,
            _ => GrantDelivery::Eventfd,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_grant_during_the_linger_is_taken_from_the_word() {
        let w = WakeWord::new();
        w.begin_park();
        assert!(w.is_lingering());
        assert!(!w.take_grant());
        assert_eq!(w.grant(), GrantDelivery::Word);
        assert!(w.take_grant());
        assert!(!w.take_grant(), "taken once");
    }

    #[test]
    fn a_grant_after_the_kthread_went_to_sleep_writes_the_eventfd() {
        let w = WakeWord::new();
        w.begin_park();
        assert_eq!(w.before_sleep(), BeforeSleep::Sleep);
        assert_eq!(w.grant(), GrantDelivery::Eventfd);
        w.awake();
        assert!(!w.take_grant());
    }

    #[test]
    fn a_grant_just_before_the_kthread_sleeps_is_found_in_the_word() {
        let w = WakeWord::new();
        w.begin_park();
        assert_eq!(w.grant(), GrantDelivery::Word);
        assert_eq!(w.before_sleep(), BeforeSleep::Granted);
        // The next park starts clean.
        w.begin_park();
        assert_eq!(w.before_sleep(), BeforeSleep::Sleep);
    }

    #[test]
    fn a_kthread_that_never_parked_is_woken_by_its_eventfd() {
        let w = WakeWord::new();
        assert_eq!(w.grant(), GrantDelivery::Eventfd);
        // Granted while running: the eventfd holds the grant; the word's
        // copy is dropped by the next park, which then sleeps and finds
        // the eventfd readable.
        w.begin_park();
        assert_eq!(w.before_sleep(), BeforeSleep::Sleep);
        let fresh = WakeWord::new();
        assert_eq!(fresh.before_sleep(), BeforeSleep::Sleep);
    }

    #[test]
    fn a_client_that_never_writes_the_word_gets_every_grant_by_eventfd() {
        let w = WakeWord::new();
        for _ in 0..3 {
            assert_eq!(w.grant(), GrantDelivery::Eventfd);
        }
        // A second grant while the first is still in the word of a
        // lingering kthread: the eventfd too (a wake the kthread may find
        // later, as a late eventfd write always was).
        w.begin_park();
        assert_eq!(w.grant(), GrantDelivery::Word);
        assert_eq!(w.grant(), GrantDelivery::Eventfd);
        assert!(w.take_grant());
    }

    #[test]
    fn any_foreign_value_means_the_eventfd() {
        for v in [AWAKE, SLEEPING, GRANTED, 4, 77, u32::MAX] {
            let w = WakeWord(AtomicU32::new(v));
            assert_eq!(w.grant(), GrantDelivery::Eventfd, "{v}");
        }
    }

    /// Two threads, many rounds, the kthread's linger as short as a few
    /// polls so that grants land before, during and just as it goes to
    /// sleep; the eventfd is a counter the kthread spins on. Every grant
    /// must arrive, by exactly one of the two ways.
    #[test]
    fn stress_no_grant_is_lost_or_delivered_twice() {
        use std::sync::atomic::AtomicU64;
        use std::sync::Arc;
        const ROUNDS: u64 = 20_000;
        let w = Arc::new(WakeWord::new());
        let parked = Arc::new(AtomicU64::new(0));
        let eventfd = Arc::new(AtomicU64::new(0));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let iokernel = {
            let (w, parked, eventfd) = (w.clone(), parked.clone(), eventfd.clone());
            std::thread::spawn(move || {
                let mut by_word = 0u64;
                for round in 1..=ROUNDS {
                    while parked.load(Ordering::Acquire) < round {
                        assert!(std::time::Instant::now() < deadline, "no park {round}");
                        std::hint::spin_loop();
                    }
                    // Vary where the grant lands in the kthread's linger.
                    for _ in 0..(round % 7) * 5 {
                        std::hint::spin_loop();
                    }
                    match w.grant() {
                        GrantDelivery::Word => by_word += 1,
                        // `WakeWord::grant` never says `Doorbell` (the
                        // actuator does, for a sleeping kthread).
                        GrantDelivery::Eventfd | GrantDelivery::Doorbell => {
                            eventfd.fetch_add(1, Ordering::Release);
                        }
                    }
                }
                by_word
            })
        };
        let (mut word, mut slept) = (0u64, 0u64);
        let mut taken = 0u64;
        for round in 1..=ROUNDS {
            w.begin_park();
            parked.store(round, Ordering::Release);
            let mut granted = false;
            for _ in 0..(round % 5) * 4 {
                if w.take_grant() {
                    granted = true;
                    break;
                }
                std::hint::spin_loop();
            }
            if !granted && w.before_sleep() == BeforeSleep::Granted {
                granted = true;
            }
            if granted {
                word += 1;
            } else {
                // "Blocked" until the eventfd has one more than we took.
                while eventfd.load(Ordering::Acquire) == taken {
                    assert!(std::time::Instant::now() < deadline, "grant {round} lost");
                    std::hint::spin_loop();
                }
                taken += 1;
                slept += 1;
                w.awake();
            }
        }
        let by_word = iokernel.join().unwrap();
        assert_eq!(word, by_word, "grants taken from the word = sent by it");
        assert_eq!(
            eventfd.load(Ordering::Acquire),
            slept,
            "one write per sleep"
        );
        assert_eq!(word + slept, ROUNDS);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    /// One park and one grant, the kthread lingering for `polls` looks at
    /// the word before it goes to sleep; iokerneld grants once it has seen
    /// the park (or, with `early`, at any moment, even before the kthread
    /// parks). The eventfd is a counter the sleeping kthread waits on.
    /// Checks: the kthread always runs again, taking the grant exactly one
    /// way, and the eventfd is written exactly when it went to sleep (a
    /// grant before the park writes it, and the park then sleeps).
    fn model(polls: usize, early: bool) {
        loom::model(move || {
            let w = Arc::new(WakeWord::new());
            let parked = Arc::new(AtomicBool::new(false));
            let eventfd = Arc::new(AtomicU32::new(0));
            let io = {
                let (w, parked, eventfd) = (w.clone(), parked.clone(), eventfd.clone());
                loom::thread::spawn(move || {
                    while !early && !parked.load(Ordering::Acquire) {
                        loom::thread::yield_now();
                    }
                    let d = w.grant();
                    if d == GrantDelivery::Eventfd {
                        eventfd.fetch_add(1, Ordering::Release);
                    }
                    d
                })
            };
            w.begin_park();
            parked.store(true, Ordering::Release);
            let mut by_word = (0..polls).any(|_| {
                let got = w.take_grant();
                loom::thread::yield_now();
                got
            });
            let mut slept = false;
            if !by_word {
                match w.before_sleep() {
                    BeforeSleep::Granted => by_word = true,
                    BeforeSleep::Sleep => {
                        slept = true;
                        while eventfd.load(Ordering::Acquire) == 0 {
                            loom::thread::yield_now();
                        }
                        w.awake();
                    }
                }
            }
            let d = io.join().unwrap();
            // Exactly one way: the word if the grant found the kthread
            // lingering, else the eventfd, which the kthread slept on.
            assert_eq!(by_word, d == GrantDelivery::Word);
            assert_eq!(slept, d == GrantDelivery::Eventfd);
            assert_eq!(eventfd.load(Ordering::Acquire), u32::from(slept));
        });
    }

    /// Two grants in a row (the second may find the first not taken
    /// yet): the kthread always runs again.
    #[test]
    fn loom_two_grants_wake_the_kthread() {
        loom::model(|| {
            let w = Arc::new(WakeWord::new());
            let parked = Arc::new(AtomicBool::new(false));
            let eventfd = Arc::new(AtomicU32::new(0));
            let io = {
                let (w, parked, eventfd) = (w.clone(), parked.clone(), eventfd.clone());
                loom::thread::spawn(move || {
                    while !parked.load(Ordering::Acquire) {
                        loom::thread::yield_now();
                    }
                    for _ in 0..2 {
                        if w.grant() == GrantDelivery::Eventfd {
                            eventfd.fetch_add(1, Ordering::Release);
                        }
                    }
                })
            };
            w.begin_park();
            parked.store(true, Ordering::Release);
            let by_word = w.take_grant() || w.before_sleep() == BeforeSleep::Granted;
            if !by_word {
                while eventfd.load(Ordering::Acquire) == 0 {
                    loom::thread::yield_now();
                }
                w.awake();
            }
            io.join().unwrap();
            // Woken from the word: the first grant found it lingering, the
            // second wrote the eventfd (a count that wakes a later sleep at
            // once, as a late eventfd write always did). Slept: both wrote
            // it.
            let writes = eventfd.load(Ordering::Acquire);
            assert_eq!(writes, if by_word { 1 } else { 2 });
        });
    }

    #[test]
    fn loom_grant_while_lingering_or_sleeping() {
        model(1, false);
    }

    #[test]
    fn loom_grant_as_the_kthread_goes_to_sleep() {
        model(0, false);
    }

    #[test]
    fn loom_grant_before_the_park() {
        model(1, true);
    }
}
